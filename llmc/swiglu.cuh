// SwiGLU: swi = silu(gate) * up, where each row of fc13 [N, 2F] holds the gate (first F values)
// and the up projection (last F). Element-wise, with the formulas of math.h.
#pragma once
#include "cuda_common.cuh"
#include "math.h"

__global__ void swiglu_forward_kernel(bf16* swi, const bf16* fc13, int N, int F) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * F) return;
    long long n = idx / F, i = idx % F;
    const bf16* row = fc13 + n * 2 * F;
    swi[idx] = __float2bfloat16(swiglu_forward(__bfloat162float(row[i]), __bfloat162float(row[F + i])));
}

__global__ void swiglu_backward_kernel(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * F) return;
    long long n = idx / F, i = idx % F;
    const bf16* row = fc13 + n * 2 * F;
    float da, db;
    swiglu_backward(__bfloat162float(row[i]), __bfloat162float(row[F + i]), __bfloat162float(dswi[idx]), &da, &db);
    dfc13[n * 2 * F + i] = __float2bfloat16(da);
    dfc13[n * 2 * F + F + i] = __float2bfloat16(db);
}

inline void swiglu_forward(bf16* swi, const bf16* fc13, int N, int F, cudaStream_t s) {
    swiglu_forward_kernel<<<ceil_div((long long)N * F, 256), 256, 0, s>>>(swi, fc13, N, F);
    cuda_check_launch();
}

inline void swiglu_backward(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F, cudaStream_t s) {
    swiglu_backward_kernel<<<ceil_div((long long)N * F, 256), 256, 0, s>>>(dfc13, dswi, fc13, N, F);
    cuda_check_launch();
}
