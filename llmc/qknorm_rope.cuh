// Per-head RMSNorm of the queries and keys with their gains ("QK-norm"), then RoPE; with
// normalise = 0 (--qk-norm none) no norm, rstd 1 (math.h). One warp per
// (token, head); lane i holds the RoPE pairs (i, i + D/2), (i + 32, i + 32 + D/2), ...
// On stats steps the forward pass also writes the normalised vectors before RoPE, in float32: the
// keys at the point the telemetry of telemetry.md measures, without a bf16 rounding.
#pragma once
#include "cuda_common.cuh"
#include "math.h"
#include "rmsnorm.cuh"  // warp_row_rstd, column_sum

// qkv [N, QKV] raw projections (queries, keys, values); heads 0..H-1 are queries, H..H+Hkv-1 keys.
// Writes qk_rope [N, NH, D], qk_rstd [N, NH] and, when qk_normed is non-null, qk_normed [N, NH, D]
// (float32).
__global__ void qk_norm_rope_forward_kernel(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv,
                                            const bf16* g_q, const bf16* g_k, const float* rope_cos,
                                            const float* rope_sin, int N, int T, int H, int NH, int D, int QKV,
                                            float eps, int normalise) {
    int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (item >= N * NH) return;
    int n = item / NH, h = item % NH, t = n % T, half = D / 2;
    const bf16* x = qkv + (size_t)n * QKV + (size_t)h * D;
    const bf16* g = h < H ? g_q : g_k;
    float r = normalise ? warp_row_rstd(x, D, eps, lane) : 1.0f;
    if (lane == 0) qk_rstd[item] = r;
    bf16* z = qk_rope + (size_t)item * D;
    for (int i = lane; i < half; i += 32) {
        float y0 = rmsnorm_out(__bfloat162float(x[i]), r, __bfloat162float(g[i]));
        float y1 = rmsnorm_out(__bfloat162float(x[i + half]), r, __bfloat162float(g[i + half]));
        if (qk_normed) {
            qk_normed[(size_t)item * D + i] = y0;
            qk_normed[(size_t)item * D + i + half] = y1;
        }
        float z0, z1;
        rope_rotate(y0, y1, rope_cos[t * half + i], rope_sin[t * half + i], &z0, &z1);
        z[i] = __float2bfloat16(z0);
        z[i + half] = __float2bfloat16(z1);
    }
}

inline void qk_norm_rope_forward(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv, const bf16* g_q,
                                 const bf16* g_k, const float* rope_cos, const float* rope_sin, int N, int T, int H,
                                 int Hkv, int D, float eps, bool normalise, cudaStream_t s) {
    const int warps = 8;
    int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;
    qk_norm_rope_forward_kernel<<<ceil_div((long long)N * NH, warps), warps * 32, 0, s>>>(
        qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, NH, D, QKV, eps, normalise);
    cuda_check_launch();
}

// Backward: dqk [N, NH, D] is the gradient of the post-RoPE vectors. Un-rotates it (the rotation
// by -angle), goes back through the norm into the query/key part of dqkv (overwritten), and
// produces partial gain gradients per block, [blocks][2D]: the q gain's D, then the k gain's.
static const int kQkItemsPerBlock = 256;

__global__ void qk_norm_rope_backward_kernel(bf16* dqkv, float* dg_partial, const bf16* dqk, const bf16* qkv,
                                             const float* qk_rstd, const bf16* g_q, const bf16* g_k,
                                             const float* rope_cos, const float* rope_sin, int N, int T, int H,
                                             int NH, int D, int QKV, int normalise) {
    extern __shared__ float warp_dg[];  // [warps][2D]
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = D / 2;
    float* my_dg = warp_dg + (size_t)warp * 2 * D;
    for (int i = lane; i < 2 * D; i += 32) my_dg[i] = 0.0f;
    int first = blockIdx.x * kQkItemsPerBlock;
    for (int item = first + warp; item < min(N * NH, first + kQkItemsPerBlock); item += warps) {
        int n = item / NH, h = item % NH, t = n % T;
        const bf16* dz = dqk + (size_t)item * D;
        const bf16* x = qkv + (size_t)n * QKV + (size_t)h * D;
        const bf16* g = h < H ? g_q : g_k;
        float* dg = my_dg + (h < H ? 0 : D);
        float r = qk_rstd[item];
        // First pass: the dot product the norm's backward needs, sum_i g_i dy_i xhat_i.
        float dot = 0.0f;
        for (int i = lane; i < half; i += 32) {
            float dy0, dy1;
            rope_rotate(__bfloat162float(dz[i]), __bfloat162float(dz[i + half]), rope_cos[t * half + i],
                        -rope_sin[t * half + i], &dy0, &dy1);
            dot += rmsnorm_dot_term(__bfloat162float(g[i]), dy0, __bfloat162float(x[i]), r) +
                   rmsnorm_dot_term(__bfloat162float(g[i + half]), dy1, __bfloat162float(x[i + half]), r);
        }
        dot = normalise ? warp_sum(dot) / D : 0.0f;
        bf16* dx = dqkv + (size_t)n * QKV + (size_t)h * D;
        for (int i = lane; i < half; i += 32) {
            float dy0, dy1;
            rope_rotate(__bfloat162float(dz[i]), __bfloat162float(dz[i + half]), rope_cos[t * half + i],
                        -rope_sin[t * half + i], &dy0, &dy1);
            float x0 = __bfloat162float(x[i]), x1 = __bfloat162float(x[i + half]);
            dx[i] = __float2bfloat16(rmsnorm_dx(__bfloat162float(g[i]), dy0, x0, r, dot));
            dx[i + half] = __float2bfloat16(rmsnorm_dx(__bfloat162float(g[i + half]), dy1, x1, r, dot));
            dg[i] += rmsnorm_dgain(dy0, x0, r);
            dg[i + half] += rmsnorm_dgain(dy1, x1, r);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * D; i += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < warps; w++) acc += warp_dg[(size_t)w * 2 * D + i];
        dg_partial[(size_t)blockIdx.x * 2 * D + i] = acc;
    }
}

inline int qk_norm_rope_backward_blocks(int N, int NH) { return ceil_div((long long)N * NH, kQkItemsPerBlock); }

// dg_q, dg_k: the float gradients of the two gains (D values each), added to; scratch:
// qk_norm_rope_backward_blocks(N, NH) * 2D floats.
inline void qk_norm_rope_backward(bf16* dqkv, float* dg_q, float* dg_k, float* scratch, const bf16* dqk, const bf16* qkv,
                                  const float* qk_rstd, const bf16* g_q, const bf16* g_k, const float* rope_cos,
                                  const float* rope_sin, int N, int T, int H, int Hkv, int D, bool normalise,
                                  cudaStream_t s) {
    const int warps = 8;
    int NH = H + Hkv, QKV = (H + 2 * Hkv) * D, blocks = qk_norm_rope_backward_blocks(N, NH);
    size_t smem = (size_t)warps * 2 * D * sizeof(float);
    qk_norm_rope_backward_kernel<<<blocks, warps * 32, smem, s>>>(dqkv, scratch, dqk, qkv, qk_rstd, g_q, g_k, rope_cos,
                                                                  rope_sin, N, T, H, NH, D, QKV, normalise);
    cuda_check_launch();
    column_sum(dg_q, scratch, blocks, D, 2 * D, s);
    column_sum(dg_k, scratch + D, blocks, D, 2 * D, s);
}
