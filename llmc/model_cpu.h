// The CPU backend (the contract of backend.h): the whole model of docs/model.md in float32, forward,
// backward and AdamW, over the named buffers of activations.h. Matrix products go through BLAS
// (cblas_sgemm), everything else is plain loops parallelised with OpenMP. The per-element formulas
// come from math.h and are the ones the CUDA kernels use.
//
// Shapes: B batch, T sequence, N = B*T token rows, C model width, H query heads, Hkv key/value
// heads, D head width, A = H D attention width, F SwiGLU width, V vocabulary, QKV = (H + 2 Hkv) D.
#pragma once
#include <cblas.h>
#include <omp.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>
#include "activations.h"
#include "backend.h"
#include "config.h"
#include "distributed.h"
#include "math.h"
#include "memory.h"
#include "telemetry_sums.h"
#include "utils.h"

// glibc ships vectorised versions of expf (libmvec). GCC uses them in `omp simd` loops only when
// told they exist, which -ffast-math does along with much else (it would also break NaN checks);
// this declaration tells it just that. The softmax loops below run 5-10x faster with it.
#if defined(__GLIBC__) && defined(__x86_64__)
#pragma omp declare simd notinbranch
extern "C" float expf(float) noexcept;
#endif

// The model and its buffers (backend.h's ModelShape besides). The activations are those of
// activations.h, in float, in one block.
struct CpuModel : ModelShape {
    std::vector<float> params, grads, adam_m, adam_v;  // flat, in the layout of config.h
    std::vector<float> rope_cos, rope_sin;             // [max_seq_len, D/2]
    Activations<float> acts;
    std::unique_ptr<char[]> act_memory;
    // Data-parallel training (distributed.h): params, grads, adam_m and adam_v hold shard.padded
    // floats, P of them parameters; AdamW updates this process's shard only, with its state there.
    std::vector<ParamSegment> segments;  // what AdamW updates: the unfrozen parameters of the shard
    std::vector<float> grad_scratch;     // a shard, for the reduce-scatter
    std::vector<double> stat_sums;       // a stats step's sums, added into by every forward pass with statistics
    std::vector<double> stat_sums_read;  // their copy model_stats_sums returns, which the next stats step leaves alone
};

inline float* param_ptr(CpuModel& m, int kind, int l = 0) { return m.params.data() + param_offset(m.cfg, kind, l); }
inline float* grad_ptr(CpuModel& m, int kind, int l = 0) { return m.grads.data() + param_offset(m.cfg, kind, l); }

inline void model_freeze(CpuModel& m, uint32_t asked);

// The model for micro-batches up to max_B x max_T, as process dist.rank of dist.world; one that
// does not train (trains false) has neither gradients nor AdamW state.
inline void model_init(CpuModel& m, const ModelConfig& cfg, int max_B, int max_T, const Dist& dist = Dist(),
                       bool trains = true) {
    model_shape_init(m, cfg, max_B, max_T, dist, trains);
    size_t padded = m.shard.padded, training = trains ? padded : 0;
    m.params.assign(padded, 0.0f);
    m.grads.assign(training, 0.0f);
    m.adam_m.assign(training, 0.0f);
    m.adam_v.assign(training, 0.0f);
    m.grad_scratch.assign(dist.world > 1 && trains ? m.shard.size : 0, 0.0f);
    m.stat_sums.assign(m.stats_layout.total, 0.0);
    model_freeze(m, 0);
    m.rope_cos.resize((size_t)cfg.max_seq_len * cfg.head_dim / 2);
    m.rope_sin.resize(m.rope_cos.size());
    rope_tables(cfg, cfg.max_seq_len, m.rope_cos.data(), m.rope_sin.data());
    ActivationDims dims = activation_dims(cfg, max_B, max_T, cfg.vocab_size);
    Arena count;
    carve_activations(m.acts, dims, Where::CPU, count);
    m.act_memory.reset(new char[count.used + 256]());  // zeroed; + 256 to align the start
    Arena block{(char*)(((uintptr_t)m.act_memory.get() + 255) / 256 * 256)};
    carve_activations(m.acts, dims, Where::CPU, block);
}

// Holds the parameter kinds in `asked` (and those the variant leaves unused) fixed from now on.
inline void model_freeze(CpuModel& m, uint32_t asked) {
    m.frozen = frozen_kinds(m.cfg, asked);
    m.segments = shard_segments(adamw_segments(m.cfg, m.frozen, m.decayed), m.shard);
}

// Weight decay on the parameter kinds in `kinds` from now on.
inline void model_decay(CpuModel& m, uint32_t kinds) {
    m.decayed = kinds;
    m.segments = shard_segments(adamw_segments(m.cfg, m.frozen, m.decayed), m.shard);
}

// Memory the model needs (weights, and when it trains their gradients and AdamW state; then the
// activations of a B x T micro-batch), to check before model_init allocates it. (A process of
// several keeps whole arrays of the AdamW state too, of which it updates its shard.)
inline MemoryNeed memory_need(const CpuModel&, const ModelConfig& c, int B, int T, const Dist& = Dist(),
                              bool trains = true) {
    Activations<float> a;
    Arena count;
    carve_activations(a, activation_dims(c, B, T, c.vocab_size), Where::CPU, count);
    double weights = (trains ? 4.0 : 1.0) * sizeof(float) * num_parameters(c);
    return {weights, weights + count.used};
}

// What this process may still allocate (memory.h).
inline MemoryLimit memory_available(const CpuModel&) { return host_memory_limit(); }

// ---------------------------------------------------------------------------------------------
// Building blocks. Each *_backward ADDS into the gradients it produces (parameter gradients
// accumulate over micro-batches; the residual stream's gradient is a sum of branches).

// out[N, OC] = inp[N, IC] @ W[OC, IC]^T
inline void matmul_forward(float* out, const float* inp, const float* W, int N, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, W, IC, 0.0f, out, OC);
}

// dinp[N, IC] (= or +=) dout[N, OC] @ W[OC, IC]; dW[OC, IC] += dout^T @ inp.
inline void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, const float* W,
                            int N, int IC, int OC, bool accumulate_dinp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, W, IC,
                accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dW, IC);
}

// out = x / rms(x) * g over rows of width C (math.h); rstd[n] = 1 / rms of row n.
inline void rmsnorm_forward(float* out, float* rstd, const float* x, const float* g, int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * C;
        float ss = 0.0f;
        for (int i = 0; i < C; i++) ss += xr[i] * xr[i];
        float r = rmsnorm_rstd(ss, C, eps);
        rstd[n] = r;
        float* o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = rmsnorm_out(xr[i], r, g[i]);
    }
}

// Adds the input gradient into dx and the gain gradient into dg (math.h).
inline void rmsnorm_backward(float* dx, float* dg, const float* dy, const float* x, const float* rstd,
                             const float* g, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * C;
        const float* dyr = dy + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int i = 0; i < C; i++) dot += rmsnorm_dot_term(g[i], dyr[i], xr[i], r);
        dot /= C;
        float* dxr = dx + (size_t)n * C;
        for (int i = 0; i < C; i++) dxr[i] += rmsnorm_dx(g[i], dyr[i], xr[i], r, dot);
    }
    // Gain gradient: a column sum. Each thread owns a range of columns and walks the rows in order,
    // so the result does not depend on the number of threads.
#pragma omp parallel for
    for (int i = 0; i < C; i++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += rmsnorm_dgain(dy[(size_t)n * C + i], x[(size_t)n * C + i], rstd[n]);
        dg[i] += acc;
    }
}

// Per-head RMSNorm of the queries and keys with their gains, then RoPE (--qk-norm none: no
// norm, rstd 1; plain: the gains are 1, config.h's hold_unused_gains). Reads the raw
// projections in qkv [N, QKV] (queries, keys, values side by side), writes their RoPE rotations
// qk_rope [N, H+Hkv, D] and the rstds; when qk_normed is not null, also the normalised vectors
// before RoPE (the point the key statistics measure), [N, H+Hkv, D].
inline void qk_norm_rope_forward(float* qk_normed, float* qk_rope, float* qk_rstd, const float* qkv,
                                 const float* g_q, const float* g_k, const float* rope_cos,
                                 const float* rope_sin, int B, int T, const ModelConfig& c) {
    int D = c.head_dim, half = D / 2, NH = c.n_head + c.n_kv_head, QKV = c.qkv_dim();
    bool normalise = qk_norm_normalises(c.qk_norm);
#pragma omp parallel for collapse(2)
    for (int n = 0; n < B * T; n++) {
        for (int h = 0; h < NH; h++) {
            int t = n % T;
            const float* x = qkv + (size_t)n * QKV + (size_t)h * D;  // queries then keys: contiguous
            const float* g = h < c.n_head ? g_q : g_k;
            float ss = 0.0f;
            for (int i = 0; i < D; i++) ss += x[i] * x[i];
            float r = normalise ? rmsnorm_rstd(ss, D, c.norm_eps) : 1.0f;
            qk_rstd[(size_t)n * NH + h] = r;
            float* y = qk_normed ? qk_normed + ((size_t)n * NH + h) * D : nullptr;
            float* z = qk_rope + ((size_t)n * NH + h) * D;
            for (int i = 0; i < half; i++) {
                float y0 = rmsnorm_out(x[i], r, g[i]), y1 = rmsnorm_out(x[i + half], r, g[i + half]);
                if (y) {
                    y[i] = y0;
                    y[i + half] = y1;
                }
                rope_rotate(y0, y1, rope_cos[t * half + i], rope_sin[t * half + i], &z[i], &z[i + half]);
            }
        }
    }
}

// Backward of the above: dqk holds the gradient of the post-RoPE vectors; un-rotates it, goes
// through the norm into the query/key part of dqkv (overwriting it), and adds the gain gradients.
inline void qk_norm_rope_backward(float* dqkv, float* dg_q, float* dg_k, const float* dqk, const float* qkv,
                                  const float* qk_rstd, const float* g_q, const float* g_k,
                                  const float* rope_cos, const float* rope_sin, int B, int T,
                                  const ModelConfig& c) {
    int D = c.head_dim, half = D / 2, NH = c.n_head + c.n_kv_head, QKV = c.qkv_dim();
    int N = B * T;
    bool normalise = qk_norm_normalises(c.qk_norm);
    // dy = gradient before RoPE, kept in a per-thread row; dx through the norm.
#pragma omp parallel
    {
        std::vector<float> dy(D);
#pragma omp for collapse(2)
        for (int n = 0; n < N; n++) {
            for (int h = 0; h < NH; h++) {
                int t = n % T;
                const float* dz = dqk + ((size_t)n * NH + h) * D;
                for (int i = 0; i < half; i++)
                    rope_rotate(dz[i], dz[i + half], rope_cos[t * half + i], -rope_sin[t * half + i], &dy[i], &dy[i + half]);
                const float* x = qkv + (size_t)n * QKV + (size_t)h * D;
                const float* g = h < c.n_head ? g_q : g_k;
                float r = qk_rstd[(size_t)n * NH + h], dot = 0.0f;
                for (int i = 0; i < D; i++) dot += rmsnorm_dot_term(g[i], dy[i], x[i], r);
                dot = normalise ? dot / D : 0.0f;
                float* dx = dqkv + (size_t)n * QKV + (size_t)h * D;
                for (int i = 0; i < D; i++) dx[i] = rmsnorm_dx(g[i], dy[i], x[i], r, dot);
            }
        }
    }
    // Gain gradients: sum over rows and over the heads that share the gain, columns per thread.
#pragma omp parallel for
    for (int i = 0; i < D; i++) {
        float acc_q = 0.0f, acc_k = 0.0f;
        for (int n = 0; n < N; n++) {
            int t = n % T;
            int j = i < half ? i : i - half;
            float cs = rope_cos[t * half + j], sn = rope_sin[t * half + j];
            for (int h = 0; h < NH; h++) {
                const float* dz = dqk + ((size_t)n * NH + h) * D;
                // component i of the un-rotated gradient
                float dyi = i < half ? dz[i] * cs + dz[i + half] * sn : dz[i] * cs - dz[i - half] * sn;
                float dgi = rmsnorm_dgain(dyi, qkv[(size_t)n * QKV + (size_t)h * D + i], qk_rstd[(size_t)n * NH + h]);
                if (h < c.n_head) acc_q += dgi;
                else acc_k += dgi;
            }
        }
        dg_q[i] += acc_q;
        dg_k[i] += acc_k;
    }
}

// The attention that row t of a sequence (its probabilities p) puts on the document starts s <= t
// of the sequence (row_bits, telemetry_sums.h), summed in the order of s.
inline float document_start_mass(const float* p, const uint32_t* row_bits, int t) {
    float mass = 0.0f;
    for (int w = 0; w <= t / 32; w++) {
        uint32_t word = row_bits[w];
        if (w == t / 32) word &= (2u << (t % 32)) - 1u;  // positions up to t only
        for (; word; word &= word - 1) mass += p[32 * w + __builtin_ctz(word)];
    }
    return mass;
}

// Causal attention for one (sequence, head) at a time, as three matrix products through BLAS:
// S = Q K^T / sqrt(D) (a T x T scratch per thread, upper triangle ignored), the causal softmax of
// each row in place, Y = P V. Saves each row's log-sum-exp so that the backward pass can rebuild P.
// Query head h reads key/value head h / (H / Hkv). When row_stats is not null, also keeps each
// row's entropy, mass on position 0, largest probability, largest logit and mass on the document
// starts of doc_bits (telemetry.md; null: none) in it: ATTN_NUM_ROW_STATS arrays [B, H, T], in
// AttentionRowStat order.
inline void attention_forward(float* atty, float* lse, float* row_stats, const uint32_t* doc_bits, const float* qk_rope,
                              const float* qkv, int B, int T, const ModelConfig& c) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv, QKV = c.qkv_dim(), A = c.attn_dim();
    int group = c.group_size();
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        std::vector<float> S((size_t)T * T);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                int kvh = h / group;
                const float* q = qk_rope + ((size_t)b * T * NH + h) * D;
                const float* k = qk_rope + ((size_t)b * T * NH + H + kvh) * D;
                const float* v = qkv + (size_t)b * T * QKV + (size_t)(H + Hkv + kvh) * D;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, NH * D, k, NH * D, 0.0f, S.data(), T);
                for (int t = 0; t < T; t++) {
                    float* row = &S[(size_t)t * T];
                    float m = -INFINITY;
#pragma omp simd reduction(max : m)
                    for (int j = 0; j <= t; j++) m = row[j] > m ? row[j] : m;  // (fmaxf would not vectorise)
                    float l = 0.0f, a = 0.0f;
#pragma omp simd reduction(+ : l, a)
                    for (int j = 0; j <= t; j++) {
                        float e = expf(row[j] - m);
                        l += e;
                        a += e * (row[j] - m);
                        row[j] = e;
                    }
                    float inv_l = 1.0f / l;
                    for (int j = 0; j <= t; j++) row[j] *= inv_l;
                    for (int j = t + 1; j < T; j++) row[j] = 0.0f;
                    size_t r = ((size_t)b * H + h) * T + t;
                    lse[r] = m + logf(l);
                    if (row_stats) {
                        size_t rows = (size_t)B * H * T;
                        row_stats[ATTN_STAT_ENTROPY * rows + r] = softmax_row_entropy(l, a);
                        row_stats[ATTN_STAT_SINK * rows + r] = row[0];
                        row_stats[ATTN_STAT_MAXP * rows + r] = inv_l;  // the largest term is e^(m - m) = 1
                        row_stats[ATTN_STAT_LOGIT_MAX * rows + r] = m;
                        row_stats[ATTN_STAT_DOC_START * rows + r] =
                            doc_bits ? document_start_mass(row, doc_bits + (size_t)b * document_start_words(T), t) : 0.0f;
                    }
                }
                float* y = atty + (size_t)b * T * A + (size_t)h * D;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, S.data(), T, v, QKV, 0.0f, y, A);
            }
        }
    }
}

// Backward of attention, per (sequence, key/value head) so that each task owns the dK and dV it
// accumulates over the query heads of its group (no two threads write the same element; the
// order of the sums is fixed). For each query head, with P rebuilt from the saved log-sum-exp:
//   dP = dY V^T,  dS = P (dP - rowsum(P dP)) / sqrt(D)   (rowsum(P dP) = dY . Y per row),
//   dQ = dS K,    dK += dS^T Q,    dV += P^T dY.
inline void attention_backward(float* dqk, float* dqkv, const float* datty, const float* atty, const float* lse,
                               const float* qk_rope, const float* qkv, int B, int T, const ModelConfig& c) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv, QKV = c.qkv_dim(), A = c.attn_dim();
    int group = c.group_size();
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        std::vector<float> P((size_t)T * T), dS((size_t)T * T);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int kvh = 0; kvh < Hkv; kvh++) {
                const float* k = qk_rope + ((size_t)b * T * NH + H + kvh) * D;
                const float* v = qkv + (size_t)b * T * QKV + (size_t)(H + Hkv + kvh) * D;
                float* dk = dqk + ((size_t)b * T * NH + H + kvh) * D;
                float* dv = dqkv + (size_t)b * T * QKV + (size_t)(H + Hkv + kvh) * D;
                for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                    const float* q = qk_rope + ((size_t)b * T * NH + h) * D;
                    const float* y = atty + (size_t)b * T * A + (size_t)h * D;
                    const float* dy = datty + (size_t)b * T * A + (size_t)h * D;
                    float* dq = dqk + ((size_t)b * T * NH + h) * D;
                    const float* row_lse = lse + ((size_t)b * H + h) * T;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, NH * D, k, NH * D, 0.0f, P.data(), T);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.0f, dy, A, v, QKV, 0.0f, dS.data(), T);
                    for (int t = 0; t < T; t++) {
                        float* p = &P[(size_t)t * T];
                        float* ds = &dS[(size_t)t * T];
                        float dyy = 0.0f;
                        for (int i = 0; i < D; i++) dyy += dy[(size_t)t * A + i] * y[(size_t)t * A + i];
#pragma omp simd
                        for (int j = 0; j <= t; j++) {
                            p[j] = expf(p[j] - row_lse[t]);
                            ds[j] = p[j] * (ds[j] - dyy) * scale;
                        }
                        for (int j = t + 1; j < T; j++) p[j] = ds[j] = 0.0f;
                    }
                    bool first = h == kvh * group;  // the first head of the group sets dK, dV; the others add
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, dS.data(), T, k, NH * D, 0.0f, dq, NH * D);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, dS.data(), T, q, NH * D, first ? 0.0f : 1.0f, dk, NH * D);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, P.data(), T, dy, A, first ? 0.0f : 1.0f, dv, QKV);
                }
            }
        }
    }
}

inline void swiglu_forward_rows(float* swi, const float* fc13, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* gate = fc13 + (size_t)n * 2 * F;
        for (int i = 0; i < F; i++) swi[(size_t)n * F + i] = swiglu_forward(gate[i], gate[F + i]);
    }
}

inline void swiglu_backward_rows(float* dfc13, const float* dswi, const float* fc13, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* gate = fc13 + (size_t)n * 2 * F;
        float* dgate = dfc13 + (size_t)n * 2 * F;
        for (int i = 0; i < F; i++)
            swiglu_backward(gate[i], gate[F + i], dswi[(size_t)n * F + i], &dgate[i], &dgate[F + i]);
    }
}

// Cross-entropy of each row of logits [N, V] against its target; keeps each row's log-sum-exp.
inline void crossentropy_forward(float* losses, float* row_lse, const float* logits, const int* targets, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* z = logits + (size_t)n * V;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int i = 0; i < V; i++) m = z[i] > m ? z[i] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) sum += expf(z[i] - m);
        row_lse[n] = m + logf(sum);
        losses[n] = row_lse[n] - z[targets[n]];
    }
}

// dlogits = (softmax(logits) - onehot(target)) * dloss, written over the logits.
inline void crossentropy_backward_inplace(float* logits, const float* row_lse, const int* targets, int N, int V,
                                          float dloss) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* z = logits + (size_t)n * V;
        float lse = row_lse[n];
#pragma omp simd
        for (int i = 0; i < V; i++) z[i] = expf(z[i] - lse) * dloss;
        z[targets[n]] -= dloss;
    }
}

// ---------------------------------------------------------------------------------------------
// The key sums of one layer (telemetry.h's TelemetrySums) from the post-norm, pre-RoPE keys,
// added into `sums`. The per-key sums run in double precision over the N = B*T keys. The Gram
// matrices come from one float64 BLAS product per head over a float64 copy of the keys with a
// trailing 1 (keys_f64: Hkv x N x (D+1)): products of float32 keys are exact in float64, so only
// the float64 sums round. Heads in parallel.
inline void key_sums(double* sums, const TelemetrySums& lay, int layer, const float* qk_normed, double* keys_f64, int N,
                     const ModelConfig& c) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv, W = D + 1;
#pragma omp parallel for schedule(dynamic)
    for (int kvh = 0; kvh < Hkv; kvh++) {
        const float* keys = qk_normed + (size_t)(H + kvh) * D;  // row n at keys + n * NH * D
        double* aug = keys_f64 + (size_t)kvh * N * W;
        double* rec = sums + lay.key(layer, kvh);
        double sum_norm = 0, sum_maxabs = 0, sum_pr = 0;
        std::vector<double> unit_sum(D, 0.0);
        for (int n = 0; n < N; n++) {
            const float* k = keys + (size_t)n * NH * D;
            double sq = 0, quad = 0, mx = 0;
            for (int i = 0; i < D; i++) {
                double x = k[i], x2 = x * x;
                sq += x2;
                quad += x2 * x2;
                mx = fmax(mx, fabs(x));
                aug[(size_t)n * W + i] = x;
            }
            aug[(size_t)n * W + D] = 1.0;
            double norm = sqrt(sq);
            sum_norm += norm;
            sum_maxabs += mx;
            sum_pr += participation_ratio(sq, quad);
            if (norm > 0)
                for (int i = 0; i < D; i++) unit_sum[i] += k[i] / norm;
        }
        rec[KS_NORM] += sum_norm;
        rec[KS_MAXABS] += sum_maxabs;
        rec[KS_PR] += sum_pr;
        for (int i = 0; i < D; i++) rec[KS_UNIT + i] += unit_sum[i];
        double* gram = sums + lay.gram(layer, kvh);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, W, W, N, 1.0, aug, W, aug, W, 1.0, gram, W);
    }
}

// The query norms and attention rows' sums of one layer, and its largest logits, added into
// `sums`, reduced over (b, t) in a fixed order.
inline void query_attention_sums(double* sums, const TelemetrySums& lay, int layer, const float* qk_normed,
                                 const float* row_stats, int B, int T, const ModelConfig& c) {
    int H = c.n_head, D = c.head_dim, NH = H + c.n_kv_head, N = B * T;
    size_t rows = (size_t)B * H * T;
    for (int h = 0; h < H; h++) {
        double qn = 0, ent = 0, sink = 0, maxp = 0, doc = 0;
        float lmax = -INFINITY;
        for (int n = 0; n < N; n++) {
            const float* q = qk_normed + ((size_t)n * NH + h) * D;
            double sq = 0;
            for (int i = 0; i < D; i++) sq += (double)q[i] * q[i];
            qn += sqrt(sq);
        }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                size_t row = ((size_t)b * H + h) * T + t;
                ent += row_stats[ATTN_STAT_ENTROPY * rows + row];
                sink += row_stats[ATTN_STAT_SINK * rows + row];
                maxp += row_stats[ATTN_STAT_MAXP * rows + row];
                doc += row_stats[ATTN_STAT_DOC_START * rows + row];
                lmax = fmaxf(lmax, row_stats[ATTN_STAT_LOGIT_MAX * rows + row]);
            }
        double* rec = sums + lay.query(layer, h);
        rec[QS_NORM] += qn;
        rec[QS_ENTROPY] += ent;
        rec[QS_SINK] += sink;
        rec[QS_MAXP] += maxp;
        rec[QS_DOC_START] += doc;
        double& mx = sums[lay.max_logit(layer, h)];
        mx = fmax(mx, (double)lmax);
    }
}

// ---------------------------------------------------------------------------------------------
// The model.

// Forward pass over tokens [B, T]. With targets, computes the per-position losses and returns
// their mean; without (targets == nullptr), leaves the logits [B*T, V] for sampling and returns 0.
// With stats, also adds the sums behind every statistic of telemetry.md into m.stat_sums
// (model_stats_begin clears them; telemetry_from_sums finishes them).
inline float model_forward(CpuModel& m, const int* tokens, const int* targets, int B, int T, bool stats) {
    const ModelConfig& c = m.cfg;
    if (B > m.max_B || T > m.max_T) fail("internal: batch %dx%d exceeds the allocated %dx%d", B, T, m.max_B, m.max_T);
    m.B = B;
    m.T = T;
    int N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size, L = c.n_layer, QKV = c.qkv_dim(), A = c.attn_dim();
    Activations<float>& a = m.acts;
    const float* wte = param_ptr(m, P_WTE);
#pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(&a.emb[(size_t)n * C], wte + (size_t)tokens[n] * C, C * sizeof(float));

    double* sums = m.stat_sums.data();
    const TelemetrySums& lay = m.stats_layout;
    std::vector<uint32_t> doc_bits;  // the document starts of the batch (telemetry_sums.h)
    if (stats) {
        sums[lay.count] += N;
        sums[lay.doc_view] += micro_batch_document_starts(doc_bits, tokens, B, T, m.eot_token);
    }
    ActivationDims dims = activation_dims(c, B, T, V);
    for (int l = 0; l < L; l++) {
        Activations<float> la = layer_activations(a, dims, l);  // this layer's part of each buffer
        const float* x = l == 0 ? a.emb : layer_activations(a, dims, l - 1).res_mlp;
        rmsnorm_forward(la.ln1, la.ln1_rstd, x, param_ptr(m, P_ATTN_NORM, l), N, C, c.norm_eps);
        matmul_forward(la.qkv, la.ln1, param_ptr(m, P_WQ, l), N, C, QKV);  // wq, wk, wv are one matrix
        qk_norm_rope_forward(stats ? la.qk_normed : nullptr, la.qk_rope, la.qk_rstd, la.qkv, param_ptr(m, P_Q_GAIN, l),
                             param_ptr(m, P_K_GAIN, l), m.rope_cos.data(), m.rope_sin.data(), B, T, c);
        attention_forward(la.atty, la.att_lse, stats ? la.row_stats : nullptr, doc_bits.data(), la.qk_rope, la.qkv, B, T, c);
        if (stats) {
            key_sums(sums, lay, l, la.qk_normed, a.keys_f64, N, c);
            query_attention_sums(sums, lay, l, la.qk_normed, la.row_stats, B, T, c);
            double* gains = sums + lay.layer_gains(l);
            std::copy_n(param_ptr(m, P_Q_GAIN, l), c.head_dim, gains);
            std::copy_n(param_ptr(m, P_K_GAIN, l), c.head_dim, gains + c.head_dim);
        }
        matmul_forward(la.res_attn, la.atty, param_ptr(m, P_WO, l), N, A, C);
#pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * C; i++) la.res_attn[i] += x[i];

        rmsnorm_forward(la.ln2, la.ln2_rstd, la.res_attn, param_ptr(m, P_MLP_NORM, l), N, C, c.norm_eps);
        matmul_forward(la.fc13, la.ln2, param_ptr(m, P_W1, l), N, C, 2 * F);  // w1, w3 are one matrix
        swiglu_forward_rows(la.swi, la.fc13, N, F);
        matmul_forward(la.res_mlp, la.swi, param_ptr(m, P_W2, l), N, F, C);
#pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * C; i++) la.res_mlp[i] += la.res_attn[i];
    }
    const float* xL = layer_activations(a, dims, L - 1).res_mlp;
    rmsnorm_forward(a.lnf, a.lnf_rstd, xL, param_ptr(m, P_FINAL_NORM), N, C, c.norm_eps);
    matmul_forward(a.logits, a.lnf, param_ptr(m, output_projection(c)), N, C, V);
    if (!targets) return 0.0f;
    crossentropy_forward(a.losses, a.logit_lse, a.logits, targets, N, V);
    double sum = 0;
    for (int n = 0; n < N; n++) sum += a.losses[n];
    return (float)(sum / N);
}

// Backward pass of the last forward pass (which must have had targets). Adds the gradient of
// loss_scale * mean loss to m.grads; loss_scale = 1 / (gradient accumulation steps).
inline void model_backward(CpuModel& m, const int* tokens, const int* targets, float loss_scale) {
    const ModelConfig& c = m.cfg;
    int B = m.B, T = m.T, N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size, L = c.n_layer, QKV = c.qkv_dim();
    int A = c.attn_dim();
    Activations<float>& a = m.acts;
    ActivationDims dims = activation_dims(c, B, T, V);

    // Classifier: dlogits in place, then into the final norm and the output projection.
    crossentropy_backward_inplace(a.logits, a.logit_lse, targets, N, V, loss_scale / N);
    int out = output_projection(c);
    matmul_backward(a.dln, grad_ptr(m, out), a.logits, a.lnf, param_ptr(m, out), N, C, V, false);
    std::fill(a.dres, a.dres + (size_t)N * C, 0.0f);
    rmsnorm_backward(a.dres, grad_ptr(m, P_FINAL_NORM), a.dln, layer_activations(a, dims, L - 1).res_mlp, a.lnf_rstd,
                     param_ptr(m, P_FINAL_NORM), N, C);

    for (int l = L - 1; l >= 0; l--) {
        Activations<float> la = layer_activations(a, dims, l);
        const float* x = l == 0 ? a.emb : layer_activations(a, dims, l - 1).res_mlp;
        // MLP block: res_mlp = res_attn + swi @ W2^T. dres is the gradient of res_mlp and, since
        // the residual passes it through unchanged, also part of the gradient of res_attn.
        matmul_backward(a.dswi, grad_ptr(m, P_W2, l), a.dres, la.swi, param_ptr(m, P_W2, l), N, F, C, false);
        swiglu_backward_rows(a.dfc13, a.dswi, la.fc13, N, F);
        matmul_backward(a.dln, grad_ptr(m, P_W1, l), a.dfc13, la.ln2, param_ptr(m, P_W1, l), N, C, 2 * F, false);
        rmsnorm_backward(a.dres, grad_ptr(m, P_MLP_NORM, l), a.dln, la.res_attn, la.ln2_rstd, param_ptr(m, P_MLP_NORM, l),
                         N, C);
        // Attention block: res_attn = x + atty @ Wo^T.
        matmul_backward(a.datty, grad_ptr(m, P_WO, l), a.dres, la.atty, param_ptr(m, P_WO, l), N, A, C, false);
        attention_backward(a.dqk, a.dqkv, a.datty, la.atty, la.att_lse, la.qk_rope, la.qkv, B, T, c);
        qk_norm_rope_backward(a.dqkv, grad_ptr(m, P_Q_GAIN, l), grad_ptr(m, P_K_GAIN, l), a.dqk, la.qkv, la.qk_rstd,
                              param_ptr(m, P_Q_GAIN, l), param_ptr(m, P_K_GAIN, l), m.rope_cos.data(),
                              m.rope_sin.data(), B, T, c);
        matmul_backward(a.dln, grad_ptr(m, P_WQ, l), a.dqkv, la.ln1, param_ptr(m, P_WQ, l), N, C, QKV, false);
        rmsnorm_backward(a.dres, grad_ptr(m, P_ATTN_NORM, l), a.dln, x, la.ln1_rstd, param_ptr(m, P_ATTN_NORM, l), N, C);
    }
    // Embedding: each position adds its gradient to its token's row, in position order.
    float* dwte = grad_ptr(m, P_WTE);
    for (int n = 0; n < N; n++) {
        float* row = dwte + (size_t)tokens[n] * C;
        const float* d = a.dres + (size_t)n * C;
        for (int i = 0; i < C; i++) row[i] += d[i];
    }
    // Frozen parameters have no gradient: they stay out of the gradient norm.
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (m.frozen & param_kind_bit(kind))
            for (int l = 0; l < param_layers(c, kind); l++)
                std::fill_n(grad_ptr(m, kind, l), param_numel(c, kind), 0.0f);
}

inline void model_zero_grad(CpuModel& m) { std::fill(m.grads.begin(), m.grads.end(), 0.0f); }

// The gradients summed over the processes, into each one's shard (one process: nothing to do).
inline void model_grad_sync(CpuModel& m) { dist_reduce_scatter(m.dist, m.grads.data(), m.grad_scratch.data(), m.shard.size); }

// Global L2 norm of all gradients (after model_grad_sync): each process sums the squares of its
// shard in double, in a fixed order, and the processes' sums are added.
inline float model_grad_norm(CpuModel& m) {
    const float* g = m.grads.data();
    long long begin = (long long)m.shard.begin, end = (long long)m.shard.end;
    const long long chunk = 1 << 16;
    long long nchunks = (end - begin + chunk - 1) / chunk;
    std::vector<double> partial(nchunks);
#pragma omp parallel for
    for (long long k = 0; k < nchunks; k++) {
        double acc = 0;
        for (long long i = begin + k * chunk; i < std::min(end, begin + (k + 1) * chunk); i++) acc += (double)g[i] * g[i];
        partial[k] = acc;
    }
    double total = 0;
    for (double p : partial) total += p;
    dist_sum(m.dist, &total, 1);
    return (float)sqrt(total);
}

// One AdamW step (t counts from 1) on this process's shard, the gradients clipped to global norm
// `clip` (0: off) by their norm grad_norm, the value model_grad_norm returned.
inline void model_adamw_step(CpuModel& m, const AdamWSettings& o, int t, float grad_norm, float clip) {
    float grad_scale = clip_scale(grad_norm, clip);
    float bc1 = 1.0f - powf(o.beta1, (float)t), bc2 = 1.0f - powf(o.beta2, (float)t);
    for (const ParamSegment& seg : m.segments) {
        float wd = seg.decay ? o.weight_decay : 0.0f;
        float *w = &m.params[seg.start], *g = &m.grads[seg.start], *mm = &m.adam_m[seg.start], *vv = &m.adam_v[seg.start];
#pragma omp parallel for
        for (long long i = 0; i < seg.count; i++)
            w[i] = adamw_update(w[i], g[i] * grad_scale, &mm[i], &vv[i], o.lr, o.beta1, o.beta2, o.eps, wd, bc1, bc2);
    }
}

// Every process's updated shard to every process (one process: nothing to do).
inline void model_param_sync(CpuModel& m) { dist_all_gather(m.dist, m.params.data(), m.shard.size); }

// A stats step: the sums cleared before its first forward pass, and read after its last.
inline void model_stats_begin(CpuModel& m) { telemetry_sums_clear(m.stat_sums.data(), m.stats_layout); }
inline double* model_stats_sums(CpuModel& m) {
    m.stat_sums_read = m.stat_sums;
    return m.stat_sums_read.data();
}
inline bool model_stats_pending(CpuModel&) { return false; }  // computed in the forward pass

// The rest of backend.h's contract. The host arrays are the model's own here, so moving them
// between host and device does nothing.
inline HostState host_state(CpuModel& m) {
    return {m.params.data(), m.trains ? m.adam_m.data() : nullptr, m.trains ? m.adam_v.data() : nullptr};
}
inline void model_free(CpuModel& m) { m = CpuModel(); }
inline void model_upload(CpuModel&) {}
inline void model_download(CpuModel&) {}
inline void model_wait(CpuModel&) {}
inline void model_profile_begin(CpuModel&) {}  // the CPU's work is not timed by kind
inline void model_profile_end(CpuModel&, int) {}
inline WorkTimes model_profile_times(CpuModel&, int) { return {}; }

inline void model_logits_row(CpuModel& m, int row, float* out) {
    const float* z = m.acts.logits + (size_t)row * m.cfg.vocab_size;
    std::copy(z, z + m.cfg.vocab_size, out);
}

static_assert(check_backend<CpuModel>(), "CpuModel implements backend.h's contract");
