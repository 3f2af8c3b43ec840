// The optimiser's kernels: the global gradient norm (deterministic two-stage sum) and AdamW over
// float32 master weights, refreshing the bf16 copy the forward pass reads.
#pragma once
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

__global__ void float_to_bf16_kernel(bf16* out, const float* in, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

inline void float_to_bf16(bf16* out, const float* in, long long n, cudaStream_t s) {
    float_to_bf16_kernel<<<1024, 256, 0, s>>>(out, in, n);
    cuda_check_launch();
}
