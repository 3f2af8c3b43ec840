// The CPU backend: the whole model of docs/model.md in float32, forward, backward and
// AdamW, over explicit named buffers. Matrix products go through BLAS (cblas_sgemm), everything
// else is plain loops parallelised with OpenMP. The per-element formulas come from math.h and
// are the ones the CUDA kernels use.
//
// Shapes: B batch, T sequence, N = B*T token rows, C model width, H query heads, Hkv key/value
// heads, D head width, F SwiGLU width, V vocabulary, QKV = (H + 2 Hkv) D.
#pragma once
#include <cblas.h>
#include <omp.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>
#include "config.h"
#include "eigen.h"
#include "math.h"
#include "telemetry.h"
#include "utils.h"

// glibc ships vectorised versions of expf (libmvec). GCC uses them in `omp simd` loops only when
// told they exist, which -ffast-math does along with much else (it would also break NaN checks);
// this declaration tells it just that. The softmax loops below run 5-10x faster with it.
#if defined(__GLIBC__) && defined(__x86_64__)
#pragma omp declare simd notinbranch
extern "C" float expf(float) noexcept;
#endif

// ---------------------------------------------------------------------------------------------
// Activations kept from the forward pass for the backward pass. Per-layer buffers hold all
// layers back to back: buffer[l * per_layer_size + ...].
struct CpuActivations {
    std::vector<float> emb;        // [N, C]        token embeddings, the input of layer 0
    std::vector<float> ln1;        // [L, N, C]     rmsnorm(x) * attn_norm
    std::vector<float> ln1_rstd;   // [L, N]        1 / rms(x)
    std::vector<float> qkv;        // [L, N, QKV]   h @ [Wq; Wk; Wv]^T, before the q/k norms
    std::vector<float> qk_rstd;    // [L, N, H+Hkv] 1 / rms of each query and key head
    std::vector<float> qk_normed;  // [L, N, H+Hkv, D] after q_norm/k_norm and gains, before RoPE:
                                   //   the key part is the buffer the key statistics read
    std::vector<float> qk_rope;    // [L, N, H+Hkv, D] the same after RoPE: what attention uses
    std::vector<float> att_lse;    // [L, B, H, T]  log-sum-exp of each attention row
    std::vector<float> atty;       // [L, N, C]     attention output, heads side by side
    std::vector<float> res_attn;   // [L, N, C]     residual stream after the attention block
    std::vector<float> ln2;        // [L, N, C]
    std::vector<float> ln2_rstd;   // [L, N]
    std::vector<float> fc13;       // [L, N, 2F]    h @ [W1; W3]^T: gate (first F) and up (last F)
    std::vector<float> swi;        // [L, N, F]     silu(gate) * up
    std::vector<float> res_mlp;    // [L, N, C]     residual stream after the MLP: the layer output
    std::vector<float> lnf;        // [N, C]
    std::vector<float> lnf_rstd;   // [N]
    std::vector<float> logits;     // [N, V]        turned into dlogits in place by the backward pass
    std::vector<float> logit_lse;  // [N]           log-sum-exp of each logits row
    std::vector<float> losses;     // [N]           cross-entropy of each position
};

// Gradients with respect to activations; one layer at a time, so no [L] dimension.
struct CpuGradScratch {
    std::vector<float> dres;     // [N, C] gradient flowing down the residual stream
    std::vector<float> dln;      // [N, C]
    std::vector<float> dqkv;     // [N, QKV]
    std::vector<float> dqk;      // [N, H+Hkv, D] gradient of the post-RoPE queries and keys
    std::vector<float> datty;    // [N, C]
    std::vector<float> dfc13;    // [N, 2F]
    std::vector<float> dswi;     // [N, F]
};

struct CpuModel {
    ModelConfig cfg;
    int max_B = 0, max_T = 0;  // activation buffers are sized for these
    std::vector<float> params, grads, adam_m, adam_v;  // flat, in the layout of config.h
    std::vector<float> rope_cos, rope_sin;             // [max_seq_len, D/2]
    CpuActivations acts;
    CpuGradScratch scratch;
    int B = 0, T = 0;         // shape of the last forward pass
};

inline float* param_ptr(CpuModel& m, int kind, int l = 0) { return m.params.data() + param_offset(m.cfg, kind, l); }
inline float* grad_ptr(CpuModel& m, int kind, int l = 0) { return m.grads.data() + param_offset(m.cfg, kind, l); }

inline void cpu_model_init(CpuModel& m, const ModelConfig& cfg, int max_B, int max_T) {
    m.cfg = cfg;
    m.max_B = max_B;
    m.max_T = max_T;
    size_t P = num_parameters(cfg);
    m.params.assign(P, 0.0f);
    m.grads.assign(P, 0.0f);
    m.adam_m.assign(P, 0.0f);
    m.adam_v.assign(P, 0.0f);
    int D = cfg.head_dim, half = D / 2;
    m.rope_cos.resize((size_t)cfg.max_seq_len * half);
    m.rope_sin.resize((size_t)cfg.max_seq_len * half);
    for (int t = 0; t < cfg.max_seq_len; t++)
        for (int i = 0; i < half; i++) {
            double a = rope_angle(t, i, D, cfg.rope_theta);
            m.rope_cos[(size_t)t * half + i] = (float)cos(a);
            m.rope_sin[(size_t)t * half + i] = (float)sin(a);
        }
    size_t N = (size_t)max_B * max_T, L = cfg.n_layer, C = cfg.d_model, F = cfg.d_ff;
    size_t QKV = cfg.qkv_dim(), QK = (size_t)(cfg.n_head + cfg.n_kv_head) * D;
    CpuActivations& a = m.acts;
    a.emb.assign(N * C, 0);
    a.ln1.assign(L * N * C, 0);
    a.ln1_rstd.assign(L * N, 0);
    a.qkv.assign(L * N * QKV, 0);
    a.qk_rstd.assign(L * N * (cfg.n_head + cfg.n_kv_head), 0);
    a.qk_normed.assign(L * N * QK, 0);
    a.qk_rope.assign(L * N * QK, 0);
    a.att_lse.assign(L * N * cfg.n_head, 0);
    a.atty.assign(L * N * C, 0);
    a.res_attn.assign(L * N * C, 0);
    a.ln2.assign(L * N * C, 0);
    a.ln2_rstd.assign(L * N, 0);
    a.fc13.assign(L * N * 2 * F, 0);
    a.swi.assign(L * N * F, 0);
    a.res_mlp.assign(L * N * C, 0);
    a.lnf.assign(N * C, 0);
    a.lnf_rstd.assign(N, 0);
    a.logits.assign(N * cfg.vocab_size, 0);
    a.logit_lse.assign(N, 0);
    a.losses.assign(N, 0);
    CpuGradScratch& s = m.scratch;
    s.dres.assign(N * C, 0);
    s.dln.assign(N * C, 0);
    s.dqkv.assign(N * QKV, 0);
    s.dqk.assign(N * QK, 0);
    s.datty.assign(N * C, 0);
    s.dfc13.assign(N * 2 * F, 0);
    s.dswi.assign(N * F, 0);
}

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

// out = x / rms(x) * g over rows of width C; rstd[n] = 1 / sqrt(mean(x^2) + eps).
inline void rmsnorm_forward(float* out, float* rstd, const float* x, const float* g, int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * C;
        float ss = 0.0f;
        for (int i = 0; i < C; i++) ss += xr[i] * xr[i];
        float r = 1.0f / sqrtf(ss / C + eps);
        rstd[n] = r;
        float* o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = xr[i] * r * g[i];
    }
}

// With xhat = x r: dx = r (g dy - xhat mean(g dy xhat)), dg = sum over rows of dy xhat.
inline void rmsnorm_backward(float* dx, float* dg, const float* dy, const float* x, const float* rstd,
                             const float* g, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * C;
        const float* dyr = dy + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int i = 0; i < C; i++) dot += g[i] * dyr[i] * xr[i] * r;
        dot /= C;
        float* dxr = dx + (size_t)n * C;
        for (int i = 0; i < C; i++) dxr[i] += r * (g[i] * dyr[i] - xr[i] * r * dot);
    }
    // Gain gradient: a column sum. Each thread owns a range of columns and walks the rows in order,
    // so the result does not depend on the number of threads.
#pragma omp parallel for
    for (int i = 0; i < C; i++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dy[(size_t)n * C + i] * x[(size_t)n * C + i] * rstd[n];
        dg[i] += acc;
    }
}

// Per-head RMSNorm of the queries and keys with their gains, then RoPE. Reads the raw
// projections in qkv [N, QKV] (queries, keys, values side by side), writes the normalised
// vectors (qk_normed), their RoPE rotations (qk_rope), both [N, H+Hkv, D], and the rstds.
inline void qk_norm_rope_forward(float* qk_normed, float* qk_rope, float* qk_rstd, const float* qkv,
                                 const float* g_q, const float* g_k, const float* rope_cos,
                                 const float* rope_sin, int B, int T, const ModelConfig& c) {
    int D = c.head_dim, half = D / 2, NH = c.n_head + c.n_kv_head, QKV = c.qkv_dim();
#pragma omp parallel for collapse(2)
    for (int n = 0; n < B * T; n++) {
        for (int h = 0; h < NH; h++) {
            int t = n % T;
            const float* x = qkv + (size_t)n * QKV + (size_t)h * D;  // queries then keys: contiguous
            const float* g = h < c.n_head ? g_q : g_k;
            float ss = 0.0f;
            for (int i = 0; i < D; i++) ss += x[i] * x[i];
            float r = 1.0f / sqrtf(ss / D + c.norm_eps);
            qk_rstd[(size_t)n * NH + h] = r;
            float* y = qk_normed + ((size_t)n * NH + h) * D;
            for (int i = 0; i < D; i++) y[i] = x[i] * r * g[i];
            float* z = qk_rope + ((size_t)n * NH + h) * D;
            for (int i = 0; i < half; i++)
                rope_rotate(y[i], y[i + half], rope_cos[t * half + i], rope_sin[t * half + i], &z[i], &z[i + half]);
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
                for (int i = 0; i < D; i++) dot += g[i] * dy[i] * x[i] * r;
                dot /= D;
                float* dx = dqkv + (size_t)n * QKV + (size_t)h * D;
                for (int i = 0; i < D; i++) dx[i] = r * (g[i] * dy[i] - x[i] * r * dot);
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
                float xhat = qkv[(size_t)n * QKV + (size_t)h * D + i] * qk_rstd[(size_t)n * NH + h];
                if (h < c.n_head) acc_q += dyi * xhat;
                else acc_k += dyi * xhat;
            }
        }
        dg_q[i] += acc_q;
        dg_k[i] += acc_k;
    }
}

// Per-row attention statistics of one stats step, summed per query head (telemetry.md).
struct AttnRowStats {
    std::vector<double> entropy, sink, maxp;  // [B*H*T] per row, reduced by the caller
    std::vector<float> logit_max;
};

// Causal attention for one (sequence, head) at a time, as three matrix products through BLAS:
// S = Q K^T / sqrt(D) (a T x T scratch per thread, upper triangle ignored), the causal softmax of
// each row in place, Y = P V. Saves each row's log-sum-exp so that the backward pass can rebuild P.
// Query head h reads key/value head h / (H / Hkv). With stats, also keeps each row's entropy, mass
// on position 0, largest probability and largest logit (telemetry.md).
inline void attention_forward(float* atty, float* lse, const float* qk_rope, const float* qkv, int B, int T,
                              const ModelConfig& c, AttnRowStats* stats) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv, QKV = c.qkv_dim(), C = c.d_model;
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
                    for (int j = 0; j <= t; j++) m = fmaxf(m, row[j]);
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
                    if (stats) {
                        stats->entropy[r] = softmax_row_entropy(l, a);
                        stats->sink[r] = row[0];
                        stats->maxp[r] = inv_l;  // the largest term is e^(m - m) = 1
                        stats->logit_max[r] = m;
                    }
                }
                float* y = atty + (size_t)b * T * C + (size_t)h * D;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.0f, S.data(), T, v, QKV, 0.0f, y, C);
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
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv, QKV = c.qkv_dim(), C = c.d_model;
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
                    const float* y = atty + (size_t)b * T * C + (size_t)h * D;
                    const float* dy = datty + (size_t)b * T * C + (size_t)h * D;
                    float* dq = dqk + ((size_t)b * T * NH + h) * D;
                    const float* row_lse = lse + ((size_t)b * H + h) * T;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, NH * D, k, NH * D, 0.0f, P.data(), T);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.0f, dy, C, v, QKV, 0.0f, dS.data(), T);
                    for (int t = 0; t < T; t++) {
                        float* p = &P[(size_t)t * T];
                        float* ds = &dS[(size_t)t * T];
                        float dyy = 0.0f;
                        for (int i = 0; i < D; i++) dyy += dy[(size_t)t * C + i] * y[(size_t)t * C + i];
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
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.0f, P.data(), T, dy, C, first ? 0.0f : 1.0f, dv, QKV);
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
        for (int i = 0; i < V; i++) m = fmaxf(m, z[i]);
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
// Key statistics of one layer from the post-k_norm, pre-RoPE keys (telemetry.md). The per-key
// sums run in double precision over the N = B*T keys; the Gram matrix K^T K behind the effective
// rank is one BLAS product. Heads in parallel.
inline void key_statistics(Telemetry& tm, int layer, const float* qk_normed, int N, const ModelConfig& c) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, NH = H + Hkv;
#pragma omp parallel for schedule(dynamic)
    for (int kvh = 0; kvh < Hkv; kvh++) {
        const float* keys = qk_normed + (size_t)(H + kvh) * D;  // row n at keys + n * NH * D
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
            }
            double norm = sqrt(sq);
            sum_norm += norm;
            sum_maxabs += mx;
            sum_pr += participation_ratio(sq, quad);
            if (norm > 0)
                for (int i = 0; i < D; i++) unit_sum[i] += k[i] / norm;
        }
        std::vector<float> gram((size_t)D * D);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, D, N, 1.0f, keys, NH * D, keys, NH * D, 0.0f, gram.data(), D);
        double us2 = 0;
        for (int i = 0; i < D; i++) us2 += unit_sum[i] * unit_sum[i];
        tm.row(M_K_NORM, layer, c)[kvh] = (float)(sum_norm / N);
        tm.row(M_K_MAXABS, layer, c)[kvh] = (float)(sum_maxabs / N);
        tm.row(M_K_PR, layer, c)[kvh] = (float)(sum_pr / N);
        tm.row(M_K_COS, layer, c)[kvh] = (float)mean_pairwise_cosine(us2, (double)N);
        tm.row(M_K_ERANK, layer, c)[kvh] = effective_rank_of_gram(gram.data(), D);
    }
}

// Query norms and the attention statistics of one layer, reduced over (b, t) in a fixed order.
inline void query_attention_statistics(Telemetry& tm, int layer, const float* qk_normed, const AttnRowStats& rs,
                                       int B, int T, const ModelConfig& c) {
    int H = c.n_head, D = c.head_dim, NH = H + c.n_kv_head, N = B * T;
    for (int h = 0; h < H; h++) {
        double qn = 0, ent = 0, sink = 0, maxp = 0;
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
                ent += rs.entropy[row];
                sink += rs.sink[row];
                maxp += rs.maxp[row];
                lmax = fmaxf(lmax, rs.logit_max[row]);
            }
        tm.row(M_Q_NORM, layer, c)[h] = (float)(qn / N);
        tm.row(M_ATTN_ENTROPY, layer, c)[h] = (float)(ent / N);
        tm.row(M_ATTN_SINK, layer, c)[h] = (float)(sink / N);
        tm.row(M_ATTN_MAXP, layer, c)[h] = (float)(maxp / N);
        tm.row(M_ATTN_LOGIT_MAX, layer, c)[h] = lmax;
    }
}

// ---------------------------------------------------------------------------------------------
// The model.

// Forward pass over tokens [B, T]. With targets, computes the per-position losses and returns
// their mean; without (targets == nullptr), leaves the logits [B*T, V] for sampling and returns 0.
// With stats, also measures every statistic of telemetry.md into it.
inline float cpu_forward(CpuModel& m, const int* tokens, const int* targets, int B, int T, Telemetry* stats) {
    const ModelConfig& c = m.cfg;
    if (B > m.max_B || T > m.max_T) fail("internal: batch %dx%d exceeds the allocated %dx%d", B, T, m.max_B, m.max_T);
    m.B = B;
    m.T = T;
    int N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size, L = c.n_layer, H = c.n_head;
    int QKV = c.qkv_dim(), QK = (H + c.n_kv_head) * c.head_dim;
    CpuActivations& a = m.acts;
    const float* wte = param_ptr(m, P_WTE);
#pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(&a.emb[(size_t)n * C], wte + (size_t)tokens[n] * C, C * sizeof(float));

    AttnRowStats rs;
    if (stats) {
        stats->resize(c);
        size_t rows = (size_t)B * H * T;
        rs.entropy.resize(rows);
        rs.sink.resize(rows);
        rs.maxp.resize(rows);
        rs.logit_max.resize(rows);
    }
    for (int l = 0; l < L; l++) {
        const float* x = l == 0 ? a.emb.data() : &a.res_mlp[(size_t)(l - 1) * N * C];
        float* ln1 = &a.ln1[(size_t)l * N * C];
        float* qkv = &a.qkv[(size_t)l * N * QKV];
        float* qk_normed = &a.qk_normed[(size_t)l * N * QK];
        float* qk_rope = &a.qk_rope[(size_t)l * N * QK];
        float* atty = &a.atty[(size_t)l * N * C];
        float* res_attn = &a.res_attn[(size_t)l * N * C];
        float* ln2 = &a.ln2[(size_t)l * N * C];
        float* fc13 = &a.fc13[(size_t)l * N * 2 * F];
        float* swi = &a.swi[(size_t)l * N * F];
        float* res_mlp = &a.res_mlp[(size_t)l * N * C];

        rmsnorm_forward(ln1, &a.ln1_rstd[(size_t)l * N], x, param_ptr(m, P_ATTN_NORM, l), N, C, c.norm_eps);
        matmul_forward(qkv, ln1, param_ptr(m, P_WQ, l), N, C, QKV);  // wq, wk, wv are one matrix
        qk_norm_rope_forward(qk_normed, qk_rope, &a.qk_rstd[(size_t)l * N * (H + c.n_kv_head)], qkv,
                             param_ptr(m, P_Q_NORM, l), param_ptr(m, P_K_NORM, l), m.rope_cos.data(),
                             m.rope_sin.data(), B, T, c);
        attention_forward(atty, &a.att_lse[(size_t)l * N * H], qk_rope, qkv, B, T, c, stats ? &rs : nullptr);
        if (stats) {
            key_statistics(*stats, l, qk_normed, N, c);
            query_attention_statistics(*stats, l, qk_normed, rs, B, T, c);
            memcpy(stats->row(M_G_Q, l, c), param_ptr(m, P_Q_NORM, l), c.head_dim * sizeof(float));
            memcpy(stats->row(M_G_K, l, c), param_ptr(m, P_K_NORM, l), c.head_dim * sizeof(float));
        }
        matmul_forward(res_attn, atty, param_ptr(m, P_WO, l), N, C, C);
#pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * C; i++) res_attn[i] += x[i];

        rmsnorm_forward(ln2, &a.ln2_rstd[(size_t)l * N], res_attn, param_ptr(m, P_MLP_NORM, l), N, C, c.norm_eps);
        matmul_forward(fc13, ln2, param_ptr(m, P_W1, l), N, C, 2 * F);  // w1, w3 are one matrix
        swiglu_forward_rows(swi, fc13, N, F);
        matmul_forward(res_mlp, swi, param_ptr(m, P_W2, l), N, F, C);
#pragma omp parallel for
        for (size_t i = 0; i < (size_t)N * C; i++) res_mlp[i] += res_attn[i];
    }
    const float* xL = &a.res_mlp[(size_t)(L - 1) * N * C];
    rmsnorm_forward(a.lnf.data(), a.lnf_rstd.data(), xL, param_ptr(m, P_FINAL_NORM), N, C, c.norm_eps);
    matmul_forward(a.logits.data(), a.lnf.data(), wte, N, C, V);  // tied embedding
    if (!targets) return 0.0f;
    crossentropy_forward(a.losses.data(), a.logit_lse.data(), a.logits.data(), targets, N, V);
    double sum = 0;
    for (int n = 0; n < N; n++) sum += a.losses[n];
    return (float)(sum / N);
}

// Backward pass of the last forward pass (which must have had targets). Adds the gradient of
// loss_scale * mean loss to m.grads; loss_scale = 1 / (gradient accumulation steps).
inline void cpu_backward(CpuModel& m, const int* tokens, const int* targets, float loss_scale) {
    const ModelConfig& c = m.cfg;
    int B = m.B, T = m.T, N = B * T, C = c.d_model, F = c.d_ff, V = c.vocab_size, L = c.n_layer;
    int H = c.n_head, NH = H + c.n_kv_head, QKV = c.qkv_dim(), QK = NH * c.head_dim;
    CpuActivations& a = m.acts;
    CpuGradScratch& s = m.scratch;

    // Classifier: dlogits in place, then into the final norm and the (tied) embedding.
    crossentropy_backward_inplace(a.logits.data(), a.logit_lse.data(), targets, N, V, loss_scale / N);
    matmul_backward(s.dln.data(), grad_ptr(m, P_WTE), a.logits.data(), a.lnf.data(), param_ptr(m, P_WTE), N, C, V, false);
    std::fill(s.dres.begin(), s.dres.begin() + (size_t)N * C, 0.0f);
    rmsnorm_backward(s.dres.data(), grad_ptr(m, P_FINAL_NORM), s.dln.data(), &a.res_mlp[(size_t)(L - 1) * N * C],
                     a.lnf_rstd.data(), param_ptr(m, P_FINAL_NORM), N, C);

    for (int l = L - 1; l >= 0; l--) {
        const float* x = l == 0 ? a.emb.data() : &a.res_mlp[(size_t)(l - 1) * N * C];
        const float* res_attn = &a.res_attn[(size_t)l * N * C];
        // MLP block: res_mlp = res_attn + swi @ W2^T. dres is the gradient of res_mlp and, since
        // the residual passes it through unchanged, also part of the gradient of res_attn.
        matmul_backward(s.dswi.data(), grad_ptr(m, P_W2, l), s.dres.data(), &a.swi[(size_t)l * N * F],
                        param_ptr(m, P_W2, l), N, F, C, false);
        swiglu_backward_rows(s.dfc13.data(), s.dswi.data(), &a.fc13[(size_t)l * N * 2 * F], N, F);
        matmul_backward(s.dln.data(), grad_ptr(m, P_W1, l), s.dfc13.data(), &a.ln2[(size_t)l * N * C],
                        param_ptr(m, P_W1, l), N, C, 2 * F, false);
        rmsnorm_backward(s.dres.data(), grad_ptr(m, P_MLP_NORM, l), s.dln.data(), res_attn,
                         &a.ln2_rstd[(size_t)l * N], param_ptr(m, P_MLP_NORM, l), N, C);
        // Attention block: res_attn = x + atty @ Wo^T.
        matmul_backward(s.datty.data(), grad_ptr(m, P_WO, l), s.dres.data(), &a.atty[(size_t)l * N * C],
                        param_ptr(m, P_WO, l), N, C, C, false);
        attention_backward(s.dqk.data(), s.dqkv.data(), s.datty.data(), &a.atty[(size_t)l * N * C],
                           &a.att_lse[(size_t)l * N * H], &a.qk_rope[(size_t)l * N * QK], &a.qkv[(size_t)l * N * QKV],
                           B, T, c);
        qk_norm_rope_backward(s.dqkv.data(), grad_ptr(m, P_Q_NORM, l), grad_ptr(m, P_K_NORM, l), s.dqk.data(),
                              &a.qkv[(size_t)l * N * QKV], &a.qk_rstd[(size_t)l * N * NH], param_ptr(m, P_Q_NORM, l),
                              param_ptr(m, P_K_NORM, l), m.rope_cos.data(), m.rope_sin.data(), B, T, c);
        matmul_backward(s.dln.data(), grad_ptr(m, P_WQ, l), s.dqkv.data(), &a.ln1[(size_t)l * N * C],
                        param_ptr(m, P_WQ, l), N, C, QKV, false);
        rmsnorm_backward(s.dres.data(), grad_ptr(m, P_ATTN_NORM, l), s.dln.data(), x, &a.ln1_rstd[(size_t)l * N],
                         param_ptr(m, P_ATTN_NORM, l), N, C);
    }
    // Embedding: each position adds its gradient to its token's row, in position order.
    float* dwte = grad_ptr(m, P_WTE);
    for (int n = 0; n < N; n++) {
        float* row = dwte + (size_t)tokens[n] * C;
        const float* d = &s.dres[(size_t)n * C];
        for (int i = 0; i < C; i++) row[i] += d[i];
    }
}

inline void cpu_zero_grad(CpuModel& m) { std::fill(m.grads.begin(), m.grads.end(), 0.0f); }

// Global L2 norm of all gradients, summed in double in a fixed order.
inline float cpu_grad_norm(const CpuModel& m) {
    const float* g = m.grads.data();
    long long P = (long long)m.grads.size();
    const long long chunk = 1 << 16;
    long long nchunks = (P + chunk - 1) / chunk;
    std::vector<double> partial(nchunks);
#pragma omp parallel for
    for (long long k = 0; k < nchunks; k++) {
        double acc = 0;
        for (long long i = k * chunk; i < std::min(P, (k + 1) * chunk); i++) acc += (double)g[i] * g[i];
        partial[k] = acc;
    }
    double total = 0;
    for (double p : partial) total += p;
    return (float)sqrt(total);
}

struct AdamWSettings {
    float lr, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

// One AdamW step (t counts from 1) on gradients scaled by grad_scale (the clipping factor).
inline void cpu_adamw_step(CpuModel& m, const AdamWSettings& o, int t, float grad_scale) {
    const ModelConfig& c = m.cfg;
    float bc1 = 1.0f - powf(o.beta1, (float)t), bc2 = 1.0f - powf(o.beta2, (float)t);
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        int layers = param_is_per_layer(kind) ? c.n_layer : 1;
        float wd = param_is_matrix(kind) ? o.weight_decay : 0.0f;
        long long n = (long long)param_numel(c, kind);
        for (int l = 0; l < layers; l++) {
            size_t off = param_offset(c, kind, l);
            float *w = &m.params[off], *g = &m.grads[off], *mm = &m.adam_m[off], *vv = &m.adam_v[off];
#pragma omp parallel for
            for (long long i = 0; i < n; i++)
                w[i] = adamw_update(w[i], g[i] * grad_scale, &mm[i], &vv[i], o.lr, o.beta1, o.beta2, o.eps, wd, bc1, bc2);
        }
    }
}
