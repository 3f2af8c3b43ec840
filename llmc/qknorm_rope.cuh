// Per-head RMSNorm of the queries and keys with their gains ("QK-norm"), then RoPE; with
// normalise = 0 (--qk-norm none) no norm, rstd 1 (math.h). One warp per
// (token, head); lane i holds the RoPE pairs (i, i + D/2), (i + 32, i + 32 + D/2), ...
// On stats steps the forward pass also writes the normalised vectors before RoPE, in float32: the
// keys at the point the telemetry of telemetry.md measures, without a bf16 rounding.
#pragma once
#include <type_traits>
#include "cuda_common.cuh"
#include "math.h"
#include "rmsnorm.cuh"  // warp_row_rstd, column_sum_or_defer

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

inline void qk_norm_rope_forward_simple(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv, const bf16* g_q,
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
inline void qk_norm_rope_backward_simple(bf16* dqkv, float* dg_q, float* dg_k, float* scratch, const bf16* dqk, const bf16* qkv,
                                  const float* qk_rstd, const bf16* g_q, const bf16* g_k, const float* rope_cos,
                                  const float* rope_sin, int N, int T, int H, int Hkv, int D, bool normalise,
                                  cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    const int warps = 8;
    int NH = H + Hkv, QKV = (H + 2 * Hkv) * D, blocks = qk_norm_rope_backward_blocks(N, NH);
    size_t smem = (size_t)warps * 2 * D * sizeof(float);
    qk_norm_rope_backward_kernel<<<blocks, warps * 32, smem, s>>>(dqkv, scratch, dqk, qkv, qk_rstd, g_q, g_k, rope_cos,
                                                                  rope_sin, N, T, H, NH, D, QKV, normalise);
    cuda_check_launch();
    column_sum_or_defer(dg_q, scratch, blocks, D, 2 * D, s, defer);
    column_sum_or_defer(dg_k, scratch + D, blocks, D, 2 * D, s, defer);
}

// ---------------------------------------------------------------------------------------------
// The same math laid out for bandwidth (checked and timed against the kernels above by
// dev/cuda/norms.cu). The kernels above give each (token, head) a whole warp whose lanes read 2
// bytes each, twice over (the norm, then the output); at d22 they run at 4-5x their memory floor,
// and these 4.6x (forward, 0.124 -> 0.027 ms) and 3.3x (backward, 0.154 -> 0.046 ms) faster on an H200.
// Here a group of G = D / 8 lanes takes one (token, head): lane j of the group holds elements
// 8j .. 8j + 7 in registers from one 16-byte load of each input, so a warp serves 32 / G heads. The
// RoPE partner of element i < D/2 is i + D/2, which sits in lane j + G/2 at the same place: the
// partner lane is j ^ (G/2), and one shuffle per element brings its value over. The group's sums
// go through shuffles within the group. D must be 16, 32, 64, 128 or 256 (G a power of two up to 32)
// and the arrays 16-byte aligned (qk_norm_rope_vec_supports).

inline bool qk_norm_rope_vec_supports(int D, std::initializer_list<const void*> arrays) {
    return (D == 16 || D == 32 || D == 64 || D == 128 || D == 256) && aligned_16(arrays);
}

// A lane's 8 elements after the rotation by (c, s), from its own values and its partner's (the
// same 8 places in the other half): a lane of the first half holds the pairs' first elements, one
// of the second half their second elements. All lanes must call it (it shuffles).
template <int G>
__device__ __forceinline__ void rope_rotate_group(float (&out)[8], const float (&own)[8], const float (&c)[8],
                                                  const float (&s)[8], bool first_half) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float partner = __shfl_xor_sync(0xffffffffu, own[k], G / 2), first, second;
        if (first_half) {
            rope_rotate(own[k], partner, c[k], s[k], &first, &second);
            out[k] = first;
        } else {
            rope_rotate(partner, own[k], c[k], s[k], &first, &second);
            out[k] = second;
        }
    }
}

// One item's forward by its group: from the lane's 8 elements of x (bf16, as read) and where its 8
// of the gain and of the RoPE tables' rows are, the normed elements y, the rotated z and the item's
// rstd (returned). All lanes must call it (it shuffles).
template <int D>
__device__ __forceinline__ float qk_norm_rope_group(float (&y)[8], float (&z)[8], uint4 x_raw, const bf16* gain,
                                                    const float* cos, const float* sin, float eps, int normalise,
                                                    int j) {
    constexpr int G = D / 8;
    float x[8], g[8], c[8], s[8];
    bf16x8_to_float(x_raw, x);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(gain), g);
    load_float8(c, cos);
    load_float8(s, sin);
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) ss += x[k] * x[k];
    ss = group_sum<G>(ss);
    const float r = normalise ? rmsnorm_rstd(ss, D, eps) : 1.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = rmsnorm_out(x[k], r, g[k]);
    rope_rotate_group<G>(z, y, c, s, j < G / 2);
    return r;
}

// One (token, head) per group of G lanes; a lane past the last item takes item 0's inputs, so that
// it can join the shuffles, and writes nothing.
template <int D>
__global__ void qk_norm_rope_forward_vec_kernel(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv,
                                                const bf16* g_q, const bf16* g_k, const float* rope_cos,
                                                const float* rope_sin, int N, int T, int H, int NH, int QKV,
                                                float eps, int normalise) {
    constexpr int G = D / 8, half = D / 2;
    const long long item = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G;
    const bool valid = item < (long long)N * NH;
    const int j = threadIdx.x % G, i = j % (G / 2) * 8;
    const long long n = valid ? item / NH : 0;
    const int h = valid ? (int)(item % NH) : 0, t = (int)(n % T);
    float y[8], z[8];
    const float r = qk_norm_rope_group<D>(y, z, *reinterpret_cast<const uint4*>(qkv + n * QKV + (size_t)h * D + 8 * j),
                                          (h < H ? g_q : g_k) + 8 * j, rope_cos + (size_t)t * half + i,
                                          rope_sin + (size_t)t * half + i, eps, normalise, j);
    if (!valid) return;
    if (j == 0) qk_rstd[item] = r;
    if (qk_normed) {
        float4* out = reinterpret_cast<float4*>(qk_normed + item * D + 8 * j);
        out[0] = make_float4(y[0], y[1], y[2], y[3]);
        out[1] = make_float4(y[4], y[5], y[6], y[7]);
    }
    *reinterpret_cast<uint4*>(qk_rope + item * D + 8 * j) = float_to_bf16x8(z);
}

// Candidates (qk_forward_ahead, query_norms): the forward above with ITEMS items a group, every
// item's 16-byte load of x issued before the first item is worked on. Nsight Compute read the kernel
// above at 25.7 us a call at d22, 8 x 2048 on an H200, 40% of the memory's speed at 5 blocks an SM:
// one load in flight a group, 20 KB an SM, about two thirds of what the memory's latency asks for
// at its speed. ITEMS = 4 keeps four in flight at 4 blocks an SM (64 registers a thread, 4 bytes
// spilled). Item k of a group is first + k * groups, so that a warp's loads stay contiguous. The
// same arithmetic, item by item, as the kernel above (qk_norm_rope_group): the same bits.
//
// query_norms (on a stats step, qk_normed non-null): a query head's float32 vector, which the
// statistics read only for its norm, is replaced by that norm in its first element; the rest of the
// row is not written. The norm is computed as telemetry.cuh's head_row_stats_vec_kernel computes it
// from the vector (lanes of four elements there, of eight here: a lane's two halves summed over the
// group apart, which is the order of the butterfly there, then added), so the statistics keep their
// bits while a stats step writes and reads half the float32 vectors.
//
// key_vectors 0 (gram_from_projection, on a stats step): the key heads' float32 rows are not written
// either; the Gram products compute the same keys from the projections and rstd (telemetry.cuh's
// ProjectedKeyColumns).
template <int D, int ITEMS>
__global__ void __launch_bounds__(256, ITEMS == 1 ? 5 : 4) qk_norm_rope_forward_ahead_kernel(
    bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv, const bf16* g_q, const bf16* g_k,
    const float* rope_cos, const float* rope_sin, int N, int T, int H, int NH, int QKV, float eps, int normalise,
    int query_norms, int key_vectors) {
    constexpr int G = D / 8, half = D / 2;
    const int groups = blockDim.x / G, j = threadIdx.x % G, i = j % (G / 2) * 8;
    const long long items = (long long)N * NH, first = (long long)blockIdx.x * ITEMS * groups + threadIdx.x / G;
    int n[ITEMS];  // an item's token; its head is item - n * NH
    uint4 x_raw[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {  // a lane past the last item takes item 0's inputs (for the shuffles)
        const long long item = first + (long long)k * groups;
        n[k] = item < items ? (int)(item / NH) : 0;
        const int h = item < items ? (int)(item - (long long)n[k] * NH) : 0;
        x_raw[k] = *reinterpret_cast<const uint4*>(qkv + (long long)n[k] * QKV + (size_t)h * D + 8 * j);
    }
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        const long long item = first + (long long)k * groups;
        const int t = n[k] % T, h = item < items ? (int)(item - (long long)n[k] * NH) : 0;
        float y[8], z[8];
        const float r = qk_norm_rope_group<D>(y, z, x_raw[k], (h < H ? g_q : g_k) + 8 * j,
                                              rope_cos + (size_t)t * half + i, rope_sin + (size_t)t * half + i, eps,
                                              normalise, j);
        float norm = 0.0f;
        if (query_norms) {  // the same in every lane (they shuffle)
            const float first_half = group_sum<G>(sum_of_squares4(y[0], y[1], y[2], y[3]));
            const float second_half = group_sum<G>(sum_of_squares4(y[4], y[5], y[6], y[7]));
            norm = sqrtf(first_half + second_half);
        }
        if (item >= items) continue;
        if (j == 0) qk_rstd[item] = r;
        if (qk_normed && query_norms && h < H) {
            if (j == 0) qk_normed[item * D] = norm;
        } else if (qk_normed && (key_vectors || h < H)) {
            float4* out = reinterpret_cast<float4*>(qk_normed + item * D + 8 * j);
            out[0] = make_float4(y[0], y[1], y[2], y[3]);
            out[1] = make_float4(y[4], y[5], y[6], y[7]);
        }
        *reinterpret_cast<uint4*>(qk_rope + item * D + 8 * j) = float_to_bf16x8(z);
    }
}
static const int kQkForwardAheadItems = 4;

// A group's inputs of one item: its lane's 8 elements of dz and of x, as read (bf16), and the
// item's rstd. A lane past the last item reads item 0's, so that it can join the shuffles.
template <int D>
__device__ __forceinline__ void qk_backward_item_inputs(uint4& dz, uint4& x, float& r, long long item, long long end,
                                                        const bf16* dqk, const bf16* qkv, const float* qk_rstd, int NH,
                                                        int QKV, int j) {
    const bool valid = item < end;
    const long long n = valid ? item / NH : 0;
    const int h = valid ? (int)(item % NH) : 0;
    dz = *reinterpret_cast<const uint4*>(dqk + (valid ? item : 0) * D + 8 * j);
    x = *reinterpret_cast<const uint4*>(qkv + n * QKV + (size_t)h * D + 8 * j);
    r = valid ? qk_rstd[item] : 1.0f;
}

// Backward: a block takes kQkItemsPerBlock items, as qk_norm_rope_backward_kernel does, so that the
// partial gain gradients [blocks][2D] and their reduction are the same. Each lane keeps the gain
// gradients of its 8 elements, for the query gain and the key gain, across the items it takes;
// then the block adds its groups' sums in a fixed order. Laid out so that the loads do not wait:
//  - a group loads its next item's dz, x and rstd before it works on the current one, so that a
//    load is in flight through each item's work. Loaded at the top of each item, a group would wait
//    a whole memory latency per item: on an H200 at d22, 8 x 2048, that layout reads memory at 39%
//    of its speed, stalled on its loads 58% of the time, 0.057 ms a layer; this one 0.046 ms.
//  - dx goes out in one 16-byte store (__stwb; written as a plain store, the compiler splits it
//    into four of 4 bytes).
//  - 64 registers a thread (__launch_bounds__(256, 4); no spills at any head width): four blocks
//    an SM, the 1,024 blocks of d22 at 8 x 2048 in 1.94 waves.
template <int D>
__global__ void __launch_bounds__(256, 4) qk_norm_rope_backward_vec_kernel(
    bf16* dqkv, float* dg_partial, const bf16* dqk, const bf16* qkv, const float* qk_rstd, const bf16* g_q,
    const bf16* g_k, const float* rope_cos, const float* rope_sin, int N, int T, int H, int NH, int QKV, int normalise) {
    constexpr int G = D / 8, half = D / 2;
    extern __shared__ float group_dg[];  // [groups of the block][2D]
    const int groups = blockDim.x / G, group = threadIdx.x / G, j = threadIdx.x % G, i = j % (G / 2) * 8;
    float dgq[8] = {}, dgk[8] = {};
    const long long first = (long long)blockIdx.x * kQkItemsPerBlock;
    const long long end = min((long long)N * NH, first + kQkItemsPerBlock);
    uint4 dz_next, x_next;
    float r_next;
    qk_backward_item_inputs<D>(dz_next, x_next, r_next, first + group, end, dqk, qkv, qk_rstd, NH, QKV, j);
    for (long long base = first; base < end; base += groups) {  // the same trip count in every lane
        const long long item = base + group;
        const bool valid = item < end;
        const long long n = valid ? item / NH : 0;
        const int h = valid ? (int)(item % NH) : 0, t = (int)(n % T);
        const uint4 dz_raw = dz_next, x_raw = x_next;
        const float r = r_next;
        if (base + groups < end)  // the same in every lane of the block
            qk_backward_item_inputs<D>(dz_next, x_next, r_next, item + groups, end, dqk, qkv, qk_rstd, NH, QKV, j);
        float dz[8], x[8], g[8], c[8], minus_s[8], dy[8], dx[8];
        bf16x8_to_float(dz_raw, dz);
        bf16x8_to_float(x_raw, x);
        bf16x8_to_float(*reinterpret_cast<const uint4*>((h < H ? g_q : g_k) + 8 * j), g);
        load_float8(c, rope_cos + (size_t)t * half + i);
        load_float8(minus_s, rope_sin + (size_t)t * half + i);
#pragma unroll
        for (int k = 0; k < 8; k++) minus_s[k] = -minus_s[k];
        rope_rotate_group<G>(dy, dz, c, minus_s, j < G / 2);  // turned back: the gradient of the normed vector
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) dot += rmsnorm_dot_term(g[k], dy[k], x[k], r);
        dot = normalise ? group_sum<G>(dot) / D : 0.0f;
        if (!valid) continue;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            dx[k] = rmsnorm_dx(g[k], dy[k], x[k], r, dot);
            float dg = rmsnorm_dgain(dy[k], x[k], r);
            if (h < H) dgq[k] += dg;
            else dgk[k] += dg;
        }
        __stwb(reinterpret_cast<uint4*>(dqkv + n * QKV + (size_t)h * D + 8 * j), float_to_bf16x8(dx));
    }
    // The groups' gain gradients (each lane's 8 of the query gain's and 8 of the key gain's) added
    // in group order into the block's partial row.
#pragma unroll
    for (int k = 0; k < 8; k++) {
        group_dg[(size_t)group * 2 * D + 8 * j + k] = dgq[k];
        group_dg[(size_t)group * 2 * D + D + 8 * j + k] = dgk[k];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < groups; w++) acc += group_dg[(size_t)w * 2 * D + c];
        dg_partial[(size_t)blockIdx.x * 2 * D + c] = acc;
    }
}

// Calls f(std::integral_constant<int, D>) for the head widths the vectorised kernels take.
template <typename F>
inline void with_head_dim(int D, F&& f) {
    switch (D) {
        case 16: f(std::integral_constant<int, 16>{}); break;
        case 32: f(std::integral_constant<int, 32>{}); break;
        case 64: f(std::integral_constant<int, 64>{}); break;
        case 128: f(std::integral_constant<int, 128>{}); break;
        case 256: f(std::integral_constant<int, 256>{}); break;
        default: fail("qk_norm_rope vec: head_dim %d not supported", D);
    }
}

static const int kQkVecThreads = 256;
static_assert(kQkVecThreads == 256, "the vectorised backward's and the candidates' forward's launch bounds name it");

// The vectorised forward and backward, with the arguments of the simple kernels' functions.
inline void qk_norm_rope_forward_vec(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv, const bf16* g_q,
                                     const bf16* g_k, const float* rope_cos, const float* rope_sin, int N, int T, int H,
                                     int Hkv, int D, float eps, bool normalise, cudaStream_t s) {
    if (!qk_norm_rope_vec_supports(D, {qk_rope, qk_normed, qkv, g_q, g_k, rope_cos, rope_sin}))
        fail("qk_norm_rope_forward_vec: head_dim %d or an array not 16-byte aligned", D);
    const int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;
    with_head_dim(D, [&](auto width) {
        constexpr int W = decltype(width)::value;
        qk_norm_rope_forward_vec_kernel<W><<<ceil_div((long long)N * NH * (W / 8), kQkVecThreads), kQkVecThreads, 0, s>>>(
            qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, NH, QKV, eps, normalise);
    });
    cuda_check_launch();
}

inline void qk_norm_rope_backward_vec(bf16* dqkv, float* dg_q, float* dg_k, float* scratch, const bf16* dqk,
                                      const bf16* qkv, const float* qk_rstd, const bf16* g_q, const bf16* g_k,
                                      const float* rope_cos, const float* rope_sin, int N, int T, int H, int Hkv, int D,
                                      bool normalise, cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    if (!qk_norm_rope_vec_supports(D, {dqkv, dqk, qkv, g_q, g_k, rope_cos, rope_sin}))
        fail("qk_norm_rope_backward_vec: head_dim %d or an array not 16-byte aligned", D);
    const int NH = H + Hkv, QKV = (H + 2 * Hkv) * D, blocks = qk_norm_rope_backward_blocks(N, NH);
    with_head_dim(D, [&](auto width) {
        constexpr int W = decltype(width)::value;
        size_t smem = (size_t)kQkVecThreads / (W / 8) * 2 * W * sizeof(float);
        qk_norm_rope_backward_vec_kernel<W><<<blocks, kQkVecThreads, smem, s>>>(
            dqkv, scratch, dqk, qkv, qk_rstd, g_q, g_k, rope_cos, rope_sin, N, T, H, NH, QKV, normalise);
    });
    cuda_check_launch();
    column_sum_or_defer(dg_q, scratch, blocks, D, 2 * D, s, defer);
    column_sum_or_defer(dg_k, scratch + D, blocks, D, 2 * D, s, defer);
}

// The candidates' forward (qk_norm_rope_forward_ahead_kernel): ITEMS 1 or kQkForwardAheadItems.
inline void qk_norm_rope_forward_ahead(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv,
                                       const bf16* g_q, const bf16* g_k, const float* rope_cos, const float* rope_sin,
                                       int N, int T, int H, int Hkv, int D, float eps, bool normalise, int items,
                                       bool query_norms, bool key_vectors, cudaStream_t s) {
    if (!qk_norm_rope_vec_supports(D, {qk_rope, qk_normed, qkv, g_q, g_k, rope_cos, rope_sin}))
        fail("qk_norm_rope_forward_ahead: head_dim %d or an array not 16-byte aligned", D);
    if (items != 1 && items != kQkForwardAheadItems)
        fail("internal: qk_norm_rope_forward_ahead takes 1 or %d items a group", kQkForwardAheadItems);
    const int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;
    with_head_dim(D, [&](auto width) {
        constexpr int W = decltype(width)::value;
        const long long per_block = (long long)kQkVecThreads / (W / 8) * items;
        auto kernel = items == 1 ? qk_norm_rope_forward_ahead_kernel<W, 1>
                                 : qk_norm_rope_forward_ahead_kernel<W, kQkForwardAheadItems>;
        kernel<<<ceil_div((long long)N * NH, per_block), kQkVecThreads, 0, s>>>(
            qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, NH, QKV, eps, normalise,
            query_norms, key_vectors);
    });
    cuda_check_launch();
}

// What the model calls: the vectorised kernels where they apply, else the simple ones. ahead_items
// (0: ./train's kernel), query_norms and key_vectors false: the candidates' kernel above, which
// needs the vectorised kernels' shapes.
inline void qk_norm_rope_forward(bf16* qk_rope, float* qk_normed, float* qk_rstd, const bf16* qkv, const bf16* g_q,
                                 const bf16* g_k, const float* rope_cos, const float* rope_sin, int N, int T, int H,
                                 int Hkv, int D, float eps, bool normalise, cudaStream_t s, int ahead_items = 0,
                                 bool query_norms = false, bool key_vectors = true) {
    if (ahead_items || query_norms || !key_vectors)
        qk_norm_rope_forward_ahead(qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, Hkv, D, eps,
                                   normalise, std::max(ahead_items, 1), query_norms, key_vectors, s);
    else if (qk_norm_rope_vec_supports(D, {qk_rope, qk_normed, qkv, g_q, g_k, rope_cos, rope_sin}))
        qk_norm_rope_forward_vec(qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, Hkv, D, eps,
                                 normalise, s);
    else
        qk_norm_rope_forward_simple(qk_rope, qk_normed, qk_rstd, qkv, g_q, g_k, rope_cos, rope_sin, N, T, H, Hkv, D, eps,
                                    normalise, s);
}

// defer: where the gains' column sums are recorded (column_sums_run), or null for at once.
inline void qk_norm_rope_backward(bf16* dqkv, float* dg_q, float* dg_k, float* scratch, const bf16* dqk, const bf16* qkv,
                                  const float* qk_rstd, const bf16* g_q, const bf16* g_k, const float* rope_cos,
                                  const float* rope_sin, int N, int T, int H, int Hkv, int D, bool normalise,
                                  cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    if (qk_norm_rope_vec_supports(D, {dqkv, dqk, qkv, g_q, g_k, rope_cos, rope_sin}))
        qk_norm_rope_backward_vec(dqkv, dg_q, dg_k, scratch, dqk, qkv, qk_rstd, g_q, g_k, rope_cos, rope_sin, N, T, H, Hkv,
                                  D, normalise, s, defer);
    else
        qk_norm_rope_backward_simple(dqkv, dg_q, dg_k, scratch, dqk, qkv, qk_rstd, g_q, g_k, rope_cos, rope_sin, N, T, H,
                                     Hkv, D, normalise, s, defer);
}
