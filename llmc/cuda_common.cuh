// What every CUDA file of the project shares: error checks that name the failing call, the bf16
// type, and warp/block reductions whose order is fixed (so results are the same bits every run).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include "utils.h"

typedef __nv_bfloat16 bf16;

// A failed call ends the run through fail(): one line, and in a data-parallel run every process
// stops with it (a process that exited alone would leave the others waiting in a collective).
inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA: %s at %s:%d", cudaGetErrorString(err), file, line);
}
#define cudaCheck(x) cuda_check((x), __FILE__, __LINE__)
// After every kernel launch: a bad launch configuration is reported where it happened.
#define cuda_check_launch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// Sum and max over the 32 lanes of a warp (butterfly: every lane ends with the result).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024): warps reduce, then the first
// warp reduces the warps' sums. Every thread gets the result. `shared` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // `shared` may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}
