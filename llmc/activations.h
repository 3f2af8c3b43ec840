// The activation buffers of a forward and backward pass: one table for both backends, in the
// spirit of llm.c's ActivationTensors. Each line gives a buffer's name, its element type, which
// backends have it, how many layers it holds (L: one per layer, back to back; 1: one), the shape
// of one layer's worth in the model's letters, and what it holds. Both backends allocate the
// whole table as one block and point the named fields into it. Adding an activation is one line.
//
// Letters: B batch, T sequence, N = B*T token rows, L layers, C d_model, H query heads, Hkv key
// heads, NH = H + Hkv query and key heads, D head width, A = H D the attention width (not always
// C), QKV = (H + 2 Hkv) D, F SwiGLU width, Vp the
// logits' row stride (V on the CPU; V rounded up to 128 on the GPU).
// Types: act_t is float on the CPU and bf16 on the GPU; float is float on both.
#pragma once
#include <cstddef>
#include "config.h"
#include "telemetry_sums.h"  // ATTN_NUM_ROW_STATS

#define ACTIVATION_TABLE(X)                                                                                            \
    /* kept from the forward pass for the backward pass */                                                             \
    X(emb, act_t, BOTH, 1, (N, C), "token embeddings, the input of layer 0")                                           \
    X(ln1, act_t, BOTH, L, (N, C), "rmsnorm(x) * attn_norm")                                                           \
    X(ln1_rstd, float, BOTH, L, (N), "1 / rms(x)")                                                                     \
    X(qkv, act_t, BOTH, L, (N, QKV), "h @ [Wq; Wk; Wv]^T: queries, keys, values before the q/k norms")                 \
    X(qk_rstd, float, BOTH, L, (N, NH), "1 / rms of each query and key head")                                          \
    X(qk_rope, act_t, BOTH, L, (N, NH, D), "queries and keys after the norm, gain and RoPE: what attention uses")      \
    X(att_lse, float, BOTH, L, (B, H, T), "log-sum-exp of each attention row")                                         \
    X(atty, act_t, BOTH, L, (N, A), "attention output, heads side by side")                                            \
    X(res_attn, act_t, BOTH, L, (N, C), "residual stream after the attention block")                                   \
    X(ln2, act_t, BOTH, L, (N, C), "rmsnorm(res_attn) * mlp_norm")                                                     \
    X(ln2_rstd, float, BOTH, L, (N), "1 / rms(res_attn)")                                                              \
    X(fc13, act_t, BOTH, L, (N, 2, F), "h @ [W1; W3]^T: gate (first F) and up (last F)")                               \
    X(swi, act_t, BOTH, L, (N, F), "silu(gate) * up")                                                                  \
    X(res_mlp, act_t, BOTH, L, (N, C), "residual stream after the MLP: the layer's output")                            \
    X(lnf, act_t, BOTH, 1, (N, C), "rmsnorm(last layer's output) * final_norm")                                        \
    X(lnf_rstd, float, BOTH, 1, (N), "1 / rms of the last layer's output")                                             \
    X(logits, act_t, BOTH, 1, (N, Vp), "lnf @ wte^T (lm_head^T untied); made dlogits in place by the backward pass")   \
    X(logit_lse, float, BOTH, 1, (N), "log-sum-exp of each logits row (on the GPU, the vectorised classifier's)")      \
    X(losses, float, BOTH, 1, (N), "cross-entropy of each position")                                                   \
    /* telemetry, one layer at a time, on stats steps */                                                               \
    X(qk_normed, float, BOTH, 1, (N, NH, D), "queries and keys after the norm and gain, before RoPE")                   \
    X(keys_f64, double, BOTH, 1, (Hkv, N, D + 1), "each key head's keys in float64, and a 1 (for the key sums)")   \
    X(row_stats, float, BOTH, 1, (ATTN_NUM_ROW_STATS, B, H, T), "each attention row's statistics (AttentionRowStat)")  \
    /* gradients of activations, one layer at a time */                                                                \
    X(dres, act_t, BOTH, 1, (N, C), "gradient flowing down the residual stream")                                       \
    X(dln, act_t, BOTH, 1, (N, C), "gradient of a norm's output")                                                      \
    X(dqkv, act_t, BOTH, 1, (N, QKV), "gradient of qkv")                                                               \
    X(dqk, act_t, BOTH, 1, (N, NH, D), "gradient of the post-RoPE queries and keys")                                   \
    X(datty, act_t, BOTH, 1, (N, A), "gradient of atty")                                                               \
    X(dfc13, act_t, BOTH, 1, (N, 2, F), "gradient of fc13")                                                            \
    X(dswi, act_t, BOTH, 1, (N, F), "gradient of swi")                                                                 \
    X(att_delta, float, GPU, 1, (B, H, T), "dY . Y of each attention row, for the attention backward kernels")

// Which backends have a buffer.
enum class Where { CPU = 1, GPU = 2, BOTH = 3 };

template <typename act_t>
struct Activations {
#define DECLARE_ACTIVATION(name, type, where, layers, shape, meaning) type* name = nullptr;
    ACTIVATION_TABLE(DECLARE_ACTIVATION)
#undef DECLARE_ACTIVATION
};

// The sizes the letters stand for, for a micro-batch of B x T.
struct ActivationDims {
    size_t B, T, N, L, C, H, Hkv, NH, D, A, QKV, F, Vp;
};

inline ActivationDims activation_dims(const ModelConfig& c, int B, int T, int Vp) {
    size_t H = c.n_head, Hkv = c.n_kv_head;
    return {(size_t)B, (size_t)T, (size_t)B * T, (size_t)c.n_layer, (size_t)c.d_model, H, Hkv, H + Hkv, (size_t)c.head_dim,
            (size_t)c.attn_dim(), (size_t)c.qkv_dim(), (size_t)c.d_ff, (size_t)Vp};
}

// Hands out typed buffers from one block of memory, each 256-byte aligned (cuBLASLt and the
// vectorised kernels want aligned rows). With base == nullptr it only counts: allocate `used`
// bytes, then carve again from the block.
struct Arena {
    char* base = nullptr;
    size_t used = 0;

    template <typename T>
    T* take(size_t count) {
        size_t at = (used + 255) / 256 * 256;
        used = at + count * sizeof(T);
        return base ? (T*)(base + at) : nullptr;
    }
};

#define ACTIVATION_LETTERS(d)                                                                                \
    [[maybe_unused]] size_t B = d.B, T = d.T, N = d.N, L = d.L, C = d.C, H = d.H, Hkv = d.Hkv, NH = d.NH, D = d.D, \
                            A = d.A, QKV = d.QKV, F = d.F, Vp = d.Vp

// Points every buffer of the table that `backend` has into the arena, sized for the dims of the
// largest micro-batch.
template <typename act_t>
inline void carve_activations(Activations<act_t>& a, const ActivationDims& d, Where backend, Arena& arena) {
    ACTIVATION_LETTERS(d);
#define CARVE_ACTIVATION(name, type, where, layers, shape, meaning) \
    if ((int)Where::where & (int)backend) a.name = arena.take<type>((layers) * shape_numel shape);
    ACTIVATION_TABLE(CARVE_ACTIVATION)
#undef CARVE_ACTIVATION
}

// The buffers as layer l sees them in a pass over micro-batches of the dims d (which may be
// smaller than those the buffers were carved for: the layers then lie closer together): every
// per-layer buffer points at layer l's part, the others are as they are.
template <typename act_t>
inline Activations<act_t> layer_activations(const Activations<act_t>& a, const ActivationDims& d, int l) {
    ACTIVATION_LETTERS(d);
    Activations<act_t> at = a;
#define SHIFT_TO_LAYER(name, type, where, layers, shape, meaning) \
    if ((layers) > 1 && at.name) at.name += (size_t)l * shape_numel shape;
    ACTIVATION_TABLE(SHIFT_TO_LAYER)
#undef SHIFT_TO_LAYER
    return at;
}
