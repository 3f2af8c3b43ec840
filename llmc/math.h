// Per-element math shared by the CPU backend and the CUDA kernels. Everything here is compiled
// for both the host and the device, so the formulas the CI machine tests on the CPU are the very
// formulas the GPU runs; only the loops around them differ.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define HD __host__ __device__ __forceinline__
#else
#define HD inline
#endif

// ---------------------------------------------------------------------------------------------
// Activations

HD float sigmoid_f(float a) { return 1.0f / (1.0f + expf(-a)); }

// SwiGLU: out = silu(a) * b, with silu(a) = a * sigmoid(a).
HD float swiglu_forward(float a, float b) { return a * sigmoid_f(a) * b; }

// Gradients of out = silu(a) * b: d/da = b * sigmoid(a) * (1 + a * (1 - sigmoid(a))), d/db = silu(a).
HD void swiglu_backward(float a, float b, float dout, float* da, float* db) {
    float s = sigmoid_f(a);
    *da = dout * b * s * (1.0f + a * (1.0f - s));
    *db = dout * a * s;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm of a row x of width n with gain g: y_i = x_i r g_i, r = 1 / sqrt(mean_i x_i^2 + eps).
// The model's one norm: before attention and the MLP, at the end, and per head on the queries and
// keys. Every backend computes it with these functions.

HD float rmsnorm_rstd(float sum_sq, int n, float eps) { return 1.0f / sqrtf(sum_sq / n + eps); }

HD float rmsnorm_out(float x, float r, float g) { return x * r * g; }

// Backward, with xhat = x r: dx_i = r (g_i dy_i - xhat_i m), where m = mean_i g_i dy_i xhat_i
// is the mean of rmsnorm_dot_term over the row; the gain's gradient sums dy_i xhat_i over rows.
// With r = 1 and m = 0 the norm is the identity times g, forward and backward: the path of
// --qk-norm none, which has no normalisation.
HD float rmsnorm_dot_term(float g, float dy, float x, float r) { return g * dy * x * r; }

HD float rmsnorm_dx(float g, float dy, float x, float r, float mean_dot) { return r * (g * dy - x * r * mean_dot); }

HD float rmsnorm_dgain(float dy, float x, float r) { return dy * (x * r); }

// ---------------------------------------------------------------------------------------------
// RoPE, rotate-half convention: the pair (x[i], x[i + D/2]) at position t turns by the angle
// t * f_i, f_i = theta^(-2i/D) its inverse frequency. Angles are formed in double precision: at
// t = 2047 a float angle would already be off by ~1e-4 radians. Backends tabulate cos/sin once
// per run with these functions (config.h's rope_tables).
//
// Llama 3's frequency scaling (factor > 0) stretches the slow pairs to a context `factor` times
// the one the model was trained on (original_len positions), with wavelength 2 pi / f_i: a pair
// whose wavelength is shorter than original_len / high_freq_factor keeps f_i, one longer than
// original_len / low_freq_factor turns `factor` times slower, and between the two f_i is blended
// linearly in original_len / wavelength from the one to the other.
HD double rope_inv_freq(int i, int head_dim, double theta, double factor, double low_freq_factor,
                        double high_freq_factor, double original_len) {
    double f = pow(theta, -2.0 * (double)i / (double)head_dim);
    if (factor == 0.0) return f;
    double wavelength = 2.0 * 3.14159265358979323846 / f;
    if (wavelength < original_len / high_freq_factor) return f;
    if (wavelength > original_len / low_freq_factor) return f / factor;
    double blend = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1.0 - blend) * f / factor + blend * f;
}

HD double rope_angle(int t, double inv_freq) { return (double)t * inv_freq; }

// Forward rotation of one pair; the backward pass is the same rotation with -sin.
HD void rope_rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
    *y0 = x0 * c - x1 * s;
    *y1 = x1 * c + x0 * s;
}

// ---------------------------------------------------------------------------------------------
// Optimiser

// AdamW exactly as torch.optim.AdamW computes it: decoupled weight decay first,
// w <- w (1 - lr wd), then w <- w - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), where
// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are the bias corrections of step t (from 1).
HD float adamw_update(float w, float g, float* m, float* v, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float bc1, float bc2) {
    float m_new = beta1 * *m + (1.0f - beta1) * g;
    float v_new = beta2 * *v + (1.0f - beta2) * g * g;
    *m = m_new;
    *v = v_new;
    w = w * (1.0f - lr * weight_decay);
    return w - (lr / bc1) * m_new / (sqrtf(v_new) / sqrtf(bc2) + eps);
}

// Factor that brings the global gradient norm down to max_norm, as torch's clip_grad_norm_.
HD float clip_scale(float grad_norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    float s = max_norm / (grad_norm + 1e-6f);
    return s < 1.0f ? s : 1.0f;
}

// Learning rate at step (0-based): linear warm-up over `warmup` steps to `peak`, then a cosine
// from `peak` down to `floor` at the last step.
HD float lr_at_step(int step, int total_steps, int warmup, float peak, float floor) {
    if (step < warmup) return peak * (float)(step + 1) / (float)warmup;
    if (total_steps <= warmup + 1) return peak;
    float progress = (float)(step - warmup) / (float)(total_steps - 1 - warmup);
    if (progress > 1.0f) progress = 1.0f;
    return floor + 0.5f * (peak - floor) * (1.0f + cosf(3.14159265358979f * progress));
}

// ---------------------------------------------------------------------------------------------
// Telemetry: what remains of each statistic once the loops have accumulated their sums.

// Participation ratio of one vector's components from sum x^2 and sum x^4: 1 for a one-hot
// vector, D for a vector whose components all have the same magnitude.
HD double participation_ratio(double sum_sq, double sum_quad) {
    return sum_quad > 0.0 ? sum_sq * sum_sq / sum_quad : 0.0;
}

// Mean cosine similarity over all N(N-1)/2 unordered pairs of distinct unit vectors u_n, from
// their sum s = sum_n u_n: ||s||^2 = N + 2 sum_{n<m} u_n.u_m.
HD double mean_pairwise_cosine(double sum_norm_sq, double n) {
    return n > 1.0 ? (sum_norm_sq - n) / (n * (n - 1.0)) : 0.0;
}

// Share of the keys' energy in their common direction, ||mean_n k_n||^2 / mean_n ||k_n||^2, from
// the squared norm of the key sum s = sum_n k_n and the sum of the squared key norms:
// ||s||^2 / (N sum_n ||k_n||^2). 1 when every key is the same vector; 1/N for orthogonal keys of
// equal norm.
HD double mean_share(double key_sum_norm_sq, double sum_norm_sq, double n) {
    return sum_norm_sq > 0.0 ? key_sum_norm_sq / (n * sum_norm_sq) : 0.0;
}

// Entry (i, j) of the Gram matrix of the centred keys k_n - s / N, from the keys' Gram entry
// g_ij = sum_n k_ni k_nj and the key sum s: sum_n (k_ni - s_i/N)(k_nj - s_j/N) = g_ij - s_i s_j / N.
HD double centered_gram(double g_ij, double s_i, double s_j, double n) { return g_ij - s_i * s_j / n; }

// Entropy of one softmax row from online-softmax accumulators taken relative to the row's
// largest logit m: l = sum_j e^(s_j - m) and a = sum_j e^(s_j - m) (s_j - m). With
// p_j = e^(s_j - m) / l, H = -sum p_j ln p_j = -sum p_j ((s_j - m) - ln l) = ln l - a / l.
// Keeping the logits relative to m avoids cancelling two large numbers when attention is sharp.
HD float softmax_row_entropy(float l, float a) { return logf(l) - a / l; }

// An online-softmax pass that meets a new largest logit m_new re-expresses its accumulators
// relative to it: with r = e^(m_old - m_new), every term e^(s - m_old) (s - m_old) becomes
// r e^(s - m_old) ((s - m_old) + (m_old - m_new)).
HD void softmax_stats_rescale(float m_old, float m_new, float* l, float* a) {
    float r = expf(m_old - m_new);
    *a = r * (*a + *l * (m_old - m_new));
    *l = r * *l;
}
