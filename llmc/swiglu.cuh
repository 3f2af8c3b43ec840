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

inline void swiglu_forward_simple(bf16* swi, const bf16* fc13, int N, int F, cudaStream_t s) {
    swiglu_forward_kernel<<<ceil_div((long long)N * F, 256), 256, 0, s>>>(swi, fc13, N, F);
    cuda_check_launch();
}

inline void swiglu_backward_simple(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F, cudaStream_t s) {
    swiglu_backward_kernel<<<ceil_div((long long)N * F, 256), 256, 0, s>>>(dfc13, dswi, fc13, N, F);
    cuda_check_launch();
}

// ---------------------------------------------------------------------------------------------
// The same math laid out for bandwidth (checked and timed against the kernels above by
// dev/cuda/elementwise.cu). The kernels above read and write 2 bytes per thread and divide a 64-bit
// index for every element; at d22 (16,384 x 1,536) they run at 4-5x their memory floor. Here a
// thread takes 8 neighbouring columns of a row, each of its loads and stores 16 bytes, which needs
// F % 8 == 0 and 16-byte aligned arrays (swiglu_vec_supports). On an H100 at d22: forward 0.101 ->
// 0.053 ms, backward 0.117 -> 0.087 ms (2,839 and 2,904 GB/s).

inline bool swiglu_vec_supports(int F, std::initializer_list<const void*> arrays) {
    return F % 8 == 0 && aligned_16(arrays);
}

__global__ void swiglu_forward_vec_kernel(bf16* swi, const bf16* fc13, int N, int F) {
    long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x, per_row = F / 8;
    if (item >= N * per_row) return;
    long long n = item / per_row, i = item % per_row * 8;
    const bf16* row = fc13 + n * 2 * F;
    float gate[8], up[8], out[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(row + i), gate);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(row + F + i), up);
    for (int j = 0; j < 8; j++) out[j] = swiglu_forward(gate[j], up[j]);
    *reinterpret_cast<uint4*>(swi + n * F + i) = float_to_bf16x8(out);
}

__global__ void swiglu_backward_vec_kernel(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F) {
    long long item = (long long)blockIdx.x * blockDim.x + threadIdx.x, per_row = F / 8;
    if (item >= N * per_row) return;
    long long n = item / per_row, i = item % per_row * 8;
    const bf16* row = fc13 + n * 2 * F;
    float gate[8], up[8], dy[8], dgate[8], dup[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(row + i), gate);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(row + F + i), up);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(dswi + n * F + i), dy);
    for (int j = 0; j < 8; j++) swiglu_backward(gate[j], up[j], dy[j], &dgate[j], &dup[j]);
    *reinterpret_cast<uint4*>(dfc13 + n * 2 * F + i) = float_to_bf16x8(dgate);
    *reinterpret_cast<uint4*>(dfc13 + n * 2 * F + F + i) = float_to_bf16x8(dup);
}

inline void swiglu_forward_vec(bf16* swi, const bf16* fc13, int N, int F, cudaStream_t s) {
    if (!swiglu_vec_supports(F, {swi, fc13})) fail("swiglu_forward_vec: F = %d or an array not 16-byte aligned", F);
    swiglu_forward_vec_kernel<<<ceil_div((long long)N * F / 8, 256), 256, 0, s>>>(swi, fc13, N, F);
    cuda_check_launch();
}

inline void swiglu_backward_vec(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F, cudaStream_t s) {
    if (!swiglu_vec_supports(F, {dfc13, dswi, fc13})) fail("swiglu_backward_vec: F = %d or an array not 16-byte aligned", F);
    swiglu_backward_vec_kernel<<<ceil_div((long long)N * F / 8, 256), 256, 0, s>>>(dfc13, dswi, fc13, N, F);
    cuda_check_launch();
}

// What the model calls: the vectorised kernels where they apply, else the simple ones.
inline void swiglu_forward(bf16* swi, const bf16* fc13, int N, int F, cudaStream_t s) {
    if (swiglu_vec_supports(F, {swi, fc13})) swiglu_forward_vec(swi, fc13, N, F, s);
    else swiglu_forward_simple(swi, fc13, N, F, s);
}

inline void swiglu_backward(bf16* dfc13, const bf16* dswi, const bf16* fc13, int N, int F, cudaStream_t s) {
    if (swiglu_vec_supports(F, {dfc13, dswi, fc13})) swiglu_backward_vec(dfc13, dswi, fc13, N, F, s);
    else swiglu_backward_simple(dfc13, dswi, fc13, N, F, s);
}
