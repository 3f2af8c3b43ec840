// RMSNorm over rows of width C: out = x / sqrt(mean(x^2) + eps) * g (the formulas of math.h).
// One warp per row; the residual add that precedes each norm is fused into the matrix product
// before it (matmul.cuh).
#pragma once
#include "cuda_common.cuh"
#include "math.h"

// 1 / rms of a row of n values, the lanes of a warp striding it; every lane gets it.
__device__ __forceinline__ float warp_row_rstd(const bf16* x, int n, float eps, int lane) {
    float ss = 0.0f;
    for (int i = lane; i < n; i += 32) {
        float v = __bfloat162float(x[i]);
        ss += v * v;
    }
    return rmsnorm_rstd(warp_sum(ss), n, eps);
}

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* x, const bf16* g, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const bf16* xr = x + (size_t)row * C;
    float r = warp_row_rstd(xr, C, eps, lane);
    if (lane == 0) rstd[row] = r;
    bf16* o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) o[i] = __float2bfloat16(rmsnorm_out(__bfloat162float(xr[i]), r, __bfloat162float(g[i])));
}

inline void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* g, int N, int C, float eps, cudaStream_t s) {
    const int warps = 8;
    rmsnorm_forward_kernel<<<ceil_div(N, warps), warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
    cuda_check_launch();
}

// Backward (math.h): dx is added to (the residual stream's gradient is a sum of branches), and
// the gain gradient is summed over rows. Each block handles
// kRowsPerBlock rows; its warps keep their gain sums in shared memory and the block writes one
// partial row of dg; column_sum adds the partial rows in a fixed order. No atomics: the same
// inputs give the same bits.
static const int kNormRowsPerBlock = 64;

__global__ void rmsnorm_backward_kernel(bf16* dx, float* dg_partial, const bf16* dy, const bf16* x, const float* rstd,
                                        const bf16* g, int N, int C) {
    extern __shared__ float warp_dg[];  // [warps][C]
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* my_dg = warp_dg + (size_t)warp * C;
    for (int i = lane; i < C; i += 32) my_dg[i] = 0.0f;
    int first = blockIdx.x * kNormRowsPerBlock;
    for (int row = first + warp; row < min(N, first + kNormRowsPerBlock); row += warps) {
        const bf16* xr = x + (size_t)row * C;
        const bf16* dyr = dy + (size_t)row * C;
        float r = rstd[row], dot = 0.0f;
        for (int i = lane; i < C; i += 32)
            dot += rmsnorm_dot_term(__bfloat162float(g[i]), __bfloat162float(dyr[i]), __bfloat162float(xr[i]), r);
        dot = warp_sum(dot) / C;
        bf16* dxr = dx + (size_t)row * C;
        for (int i = lane; i < C; i += 32) {
            float xi = __bfloat162float(xr[i]), d = __bfloat162float(dyr[i]);
            dxr[i] = __float2bfloat16(__bfloat162float(dxr[i]) + rmsnorm_dx(__bfloat162float(g[i]), d, xi, r, dot));
            my_dg[i] += rmsnorm_dgain(d, xi, r);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < warps; w++) acc += warp_dg[(size_t)w * C + i];
        dg_partial[(size_t)blockIdx.x * C + i] = acc;
    }
}

// out[i] += sum over p of partial[p * stride + i], for i < cols. A block of 32 x 8 threads takes 32
// columns; thread row g adds the parts g, g + 8, g + 16, ... in order, then row 0 adds the eight
// sums in order: a fixed order (the same bits every run) with 8x the parallelism of one thread
// per column.
__global__ void column_sum_kernel(float* out, const float* partial, int parts, int cols, int stride) {
    __shared__ float sums[8][32];
    int col = blockIdx.x * 32 + threadIdx.x, g = threadIdx.y;
    float acc = 0.0f;
    if (col < cols)
        for (int p = g; p < parts; p += 8) acc += partial[(size_t)p * stride + col];
    sums[g][threadIdx.x] = acc;
    __syncthreads();
    if (g == 0 && col < cols) {
        float total = 0.0f;
        for (int k = 0; k < 8; k++) total += sums[k][threadIdx.x];
        out[col] += total;
    }
}

inline void column_sum(float* out, const float* partial, int parts, int cols, int stride, cudaStream_t s) {
    column_sum_kernel<<<ceil_div(cols, 32), dim3(32, 8), 0, s>>>(out, partial, parts, cols, stride);
    cuda_check_launch();
}

inline int rmsnorm_backward_blocks(int N) { return ceil_div(N, kNormRowsPerBlock); }

// scratch: rmsnorm_backward_blocks(N) * C floats.
inline void rmsnorm_backward(bf16* dx, float* dg, float* scratch, const bf16* dy, const bf16* x, const float* rstd,
                             const bf16* g, int N, int C, cudaStream_t s) {
    const int warps = 8, blocks = rmsnorm_backward_blocks(N);
    size_t smem = (size_t)warps * C * sizeof(float);
    if (smem > 48 * 1024)
        cudaCheck(cudaFuncSetAttribute(rmsnorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    rmsnorm_backward_kernel<<<blocks, warps * 32, smem, s>>>(dx, scratch, dy, x, rstd, g, N, C);
    cuda_check_launch();
    column_sum(dg, scratch, blocks, C, C, s);
}
