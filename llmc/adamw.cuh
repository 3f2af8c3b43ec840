// The optimiser's kernels: the global gradient norm (deterministic two-stage sum) and AdamW over
// float32 master weights, refreshing the bf16 copy the forward pass reads.
#pragma once
#include <vector>
#include "config.h"
#include "cuda_common.cuh"
#include "math.h"

static const int kNormBlocks = 1024;  // fixed, so the summation order never changes

// Stage 1: each block sums the squares of a fixed, strided share of the gradients into partial[].
__global__ void squared_norm_partial_kernel(double* partial, const float* g, long long n) {
    __shared__ float shared[32];
    float acc = 0.0f;
    // Per thread, float is exact enough for a share of at most ~n / (1024 * 512) values; the
    // cross-thread and cross-block sums are done in fixed order.
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        acc += g[i] * g[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Stage 2: one warp adds the partial sums in a fixed order.
__global__ void squared_norm_final_kernel(double* out, const double* partial, int parts) {
    double acc = 0.0;
    for (int p = threadIdx.x; p < parts; p += 32) acc += partial[p];
    acc = warp_sum_double(acc);
    if (threadIdx.x == 0) *out = acc;
}

// Writes the sum of the squares of g[0..n) to *out (device). scratch: kNormBlocks doubles.
inline void squared_norm(double* out, double* scratch, const float* g, long long n, cudaStream_t s) {
    squared_norm_partial_kernel<<<kNormBlocks, 512, 0, s>>>(scratch, g, n);
    cuda_check_launch();
    squared_norm_final_kernel<<<1, 32, 0, s>>>(out, scratch, kNormBlocks);
    cuda_check_launch();
}

// The norm from its square (after the processes' squares were added): *out = sqrt(*sq).
__global__ void norm_from_square_kernel(float* out, const double* sq) { *out = (float)sqrt(*sq); }

// AdamW on every segment: blockIdx.y is the segment, the blocks of x stride over it. The
// segments lie in this process's shard, whose AdamW state m, v starts at parameter state_begin.
// grad_scale is the clipping factor, read on the device (no host round trip between the norm
// and the update).
__global__ void adamw_kernel(float* params, bf16* params_bf16, const float* grads, float* m, float* v, long long state_begin,
                             const ParamSegment* segments, const float* grad_norm, float max_norm, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2) {
    ParamSegment seg = segments[blockIdx.y];
    float scale = clip_scale(*grad_norm, max_norm), wd = seg.decay ? weight_decay : 0.0f;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < seg.count; j += (long long)gridDim.x * blockDim.x) {
        long long i = seg.start + j, k = i - state_begin;
        float w = adamw_update(params[i], grads[i] * scale, &m[k], &v[k], lr, beta1, beta2, eps, wd, bc1, bc2);
        params[i] = w;
        params_bf16[i] = __float2bfloat16(w);
    }
}

inline void adamw_step(float* params, bf16* params_bf16, const float* grads, float* m, float* v, long long state_begin,
                       const ParamSegment* device_segments, int num_segments, const float* grad_norm, float max_norm,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int t, cudaStream_t s) {
    if (num_segments == 0) return;  // a shard holding only frozen parameters
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    dim3 grid(64, num_segments);
    adamw_kernel<<<grid, 256, 0, s>>>(params, params_bf16, grads, m, v, state_begin, device_segments, grad_norm, max_norm,
                                      lr, beta1, beta2, eps, weight_decay, bc1, bc2);
    cuda_check_launch();
}

// Candidate (adamw_tiles): AdamW in tiles of equal size. The kernel above gives each of d22's 134
// segments 64 blocks, whatever its length (512 weights to the embedding's 4.2 M, whose 64 blocks
// loop 256 times, a memory latency each: their loads cannot pass the stores before them), and
// reads and writes 4 bytes a thread. Here each block takes a tile of kAdamwTile weights of one
// segment (the segments' tiles numbered one after another, tile_first), so the work spreads evenly
// over every SM; a thread updates two runs of 4 weights with 16-byte loads and stores where the run
// lies in its segment and the segment's weights and AdamW state start 16-byte aligned, else one
// weight at a time; in a whole tile both runs' loads go out before either's stores. The same
// adamw_update of the same values: the same bits as the kernel above (dev/cuda/optimizer.cu checks
// them equal and times both).
static const int kAdamwTileThreads = 256, kAdamwTile = 2 * 4 * kAdamwTileThreads;

// tile_first[s]: segment s's first tile; tile_first[segments.size()]: the number of tiles.
inline std::vector<int> adamw_tile_starts(const std::vector<ParamSegment>& segments) {
    std::vector<int> first(1, 0);
    for (const ParamSegment& seg : segments) first.push_back(first.back() + (int)((seg.count + kAdamwTile - 1) / kAdamwTile));
    return first;
}

__global__ void __launch_bounds__(kAdamwTileThreads) adamw_tiles_kernel(
    float* params, bf16* params_bf16, const float* grads, float* m, float* v, long long state_begin,
    const ParamSegment* segments, const int* tile_first, int num_segments, const float* grad_norm, float max_norm, float lr,
    float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2) {
    int lo = 0, hi = num_segments - 1;  // the segment of this tile: the last whose first tile is not past it
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tile_first[mid] <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const ParamSegment seg = segments[lo];
    const float scale = clip_scale(*grad_norm, max_norm), wd = seg.decay ? weight_decay : 0.0f;
    const bool aligned = seg.start % 4 == 0 && (seg.start - state_begin) % 4 == 0;
    const long long tile_start = (long long)(blockIdx.x - tile_first[lo]) * kAdamwTile;
    // A run of 4 weights from 16-byte loads: loaded, updated, stored.
    struct Run {
        float w[4], g[4], m[4], v[4];
    };
    auto load = [&](Run& r, long long i, long long k) {
        load_float4(r.w, params + i);
        load_float4(r.g, grads + i);
        load_float4(r.m, m + k);
        load_float4(r.v, v + k);
    };
    auto update_store = [&](Run& r, long long i, long long k) {
#pragma unroll
        for (int e = 0; e < 4; e++)
            r.w[e] = adamw_update(r.w[e], r.g[e] * scale, &r.m[e], &r.v[e], lr, beta1, beta2, eps, wd, bc1, bc2);
        *reinterpret_cast<float4*>(params + i) = make_float4(r.w[0], r.w[1], r.w[2], r.w[3]);
        *reinterpret_cast<float4*>(m + k) = make_float4(r.m[0], r.m[1], r.m[2], r.m[3]);
        *reinterpret_cast<float4*>(v + k) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
        __nv_bfloat162 first = __floats2bfloat162_rn(r.w[0], r.w[1]), second = __floats2bfloat162_rn(r.w[2], r.w[3]);
        __stwb(reinterpret_cast<uint2*>(params_bf16 + i),
               make_uint2(*reinterpret_cast<unsigned*>(&first), *reinterpret_cast<unsigned*>(&second)));
    };
    const long long j0 = tile_start + 4 * threadIdx.x, j1 = j0 + 4 * kAdamwTileThreads;  // in the segment
    if (aligned && tile_start + kAdamwTile <= seg.count) {  // the whole tile: both runs' loads first
        Run r0, r1;
        load(r0, seg.start + j0, seg.start + j0 - state_begin);
        load(r1, seg.start + j1, seg.start + j1 - state_begin);
        update_store(r0, seg.start + j0, seg.start + j0 - state_begin);
        update_store(r1, seg.start + j1, seg.start + j1 - state_begin);
        return;
    }
    for (int run = 0; run < 2; run++) {  // a segment's last tile, or one not aligned
        const long long j = run ? j1 : j0, i = seg.start + j, k = i - state_begin;
        if (aligned && j + 4 <= seg.count) {
            Run r;
            load(r, i, k);
            update_store(r, i, k);
        } else {
            for (int e = 0; e < 4 && j + e < seg.count; e++) {
                const float w = adamw_update(params[i + e], grads[i + e] * scale, &m[k + e], &v[k + e], lr, beta1, beta2,
                                             eps, wd, bc1, bc2);
                params[i + e] = w;
                params_bf16[i + e] = __float2bfloat16(w);
            }
        }
    }
}

// As adamw_step, with tile_first (device) from adamw_tile_starts of the same segments, `tiles` its
// last entry.
inline void adamw_step_tiles(float* params, bf16* params_bf16, const float* grads, float* m, float* v,
                             long long state_begin, const ParamSegment* device_segments, const int* tile_first,
                             int num_segments, int tiles, const float* grad_norm, float max_norm, float lr, float beta1,
                             float beta2, float eps, float weight_decay, int t, cudaStream_t s) {
    if (num_segments == 0 || tiles == 0) return;  // a shard holding only frozen parameters, or empty segments
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    adamw_tiles_kernel<<<tiles, kAdamwTileThreads, 0, s>>>(params, params_bf16, grads, m, v, state_begin, device_segments,
                                                           tile_first, num_segments, grad_norm, max_norm, lr, beta1, beta2,
                                                           eps, weight_decay, bc1, bc2);
    cuda_check_launch();
}

__global__ void float_to_bf16_kernel(bf16* out, const float* in, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

inline void float_to_bf16(bf16* out, const float* in, long long n, cudaStream_t s) {
    float_to_bf16_kernel<<<1024, 256, 0, s>>>(out, in, n);
    cuda_check_launch();
}
