// What every CUDA file of the project shares: error checks that name the failing call, the bf16
// type, and warp/block reductions whose order is fixed (so results are the same bits every run).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <initializer_list>
#include <cstdio>
#include <cstdlib>
#include <string>
#include "utils.h"

typedef __nv_bfloat16 bf16;

// Kernels written for speed whose correctness and speed no GPU has measured yet ("candidates",
// checked and timed by dev/cuda) replace the defaults only in a build with -DLLMC_CANDIDATE_KERNELS
// (make build/train_candidates, build/test_gpt_cuda_candidates; dev/gpu_bundle.sh carries both when
// a kernel reads kCandidateKernels), so that a GPU machine can check and time whole steps with them
// before they become the defaults. docs/benchmarks.md lists them ("Written since") with what each
// is predicted to gain.
#ifdef LLMC_CANDIDATE_KERNELS
constexpr bool kCandidateKernels = true;
#else
constexpr bool kCandidateKernels = false;
#endif

// Whether the candidate `name` is on: in the candidate build, unless the environment's
// TRAIN_CANDIDATES_OFF (names separated by commas) turns it off, so that a GPU machine can time
// each candidate's share of a step with one binary (dev/gpu_speed.sh). The names: adamw_tiles
// (adamw.cuh), adamw_beside, grads_beside, stats_pass_graph and stats_deferred (train_gpt.cu),
// qk_forward_ahead and query_norms (qknorm_rope.cuh, train_gpt.cu), stats_rows_plain and
// stats_rows_wgmma (attention.cuh, train_gpt.cu), embedding_ahead (encoder.cuh), gram_dmma,
// gram_key_records and gram_from_projection (telemetry.cuh, train_gpt.cu).
inline bool candidate_on(const char* name) {
    if (!kCandidateKernels) return false;
    const char* off = getenv("TRAIN_CANDIDATES_OFF");
    return !off || (std::string(",") + off + ",").find(std::string(",") + name + ",") == std::string::npos;
}

// A failed call ends the run through fail(): one line, and in a data-parallel run every process
// stops with it (a process that exited alone would leave the others waiting in a collective).
inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA: %s at %s:%d", cudaGetErrorString(err), file, line);
}
#define cudaCheck(x) cuda_check((x), __FILE__, __LINE__)
// After every kernel launch: a bad launch configuration is reported where it happened.
#define cuda_check_launch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// Whether every array starts at a 16-byte boundary (a null one does), as 16-byte loads need.
inline bool aligned_16(std::initializer_list<const void*> arrays) {
    for (const void* p : arrays)
        if ((uintptr_t)p % 16) return false;
    return true;
}

// The code this build holds for the device in use, as the device reports it: the __CUDA_ARCH__ it
// was compiled for and whether it has sm_90a's own instructions (wgmma). Kernels that need either
// trap elsewhere; the host asks this once, before it launches them or captures a graph (a build
// with no code for the device ends at this launch with CUDA's error).
struct DeviceCode {
    int arch = 0;
    bool sm90a = false;
};
__global__ void device_code_kernel(int* out) {
#ifdef __CUDA_ARCH__
    out[0] = __CUDA_ARCH__;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    out[1] = 1;
#else
    out[1] = 0;
#endif
#endif
}
inline DeviceCode device_code() {
    static const DeviceCode code = [] {
        int* d = nullptr;
        int h[2] = {0, 0};
        cudaCheck(cudaMalloc(&d, sizeof(h)));
        cudaCheck(cudaMemset(d, 0, sizeof(h)));
        device_code_kernel<<<1, 1>>>(d);
        cuda_check_launch();
        cudaCheck(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
        cudaCheck(cudaFree(d));
        DeviceCode found;
        found.arch = h[0];
        found.sm90a = h[1] == 1;
        return found;
    }();
    return code;
}

// The 8 bf16 of a 16-byte vector (one load or store of a thread at full width) as floats, and back.
__device__ __forceinline__ void bf16x8_to_float(uint4 v, float* out) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
    for (int j = 0; j < 4; j++) {
        float2 f = __bfloat1622float2(h[j]);
        out[2 * j] = f.x;
        out[2 * j + 1] = f.y;
    }
}
__device__ __forceinline__ uint4 float_to_bf16x8(const float* in) {
    uint4 v;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(in[2 * j], in[2 * j + 1]);
    return v;
}

// 4 and 8 floats from one and two 16-byte loads (p 16-byte aligned).
__device__ __forceinline__ void load_float4(float (&out)[4], const float* p) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
}

__device__ __forceinline__ void load_float8(float (&out)[8], const float* p) {
    float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Sum and max over the 32 lanes of a warp (butterfly: every lane ends with the result).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum and max over the G lanes of a group (G a power of two; the groups are aligned blocks of G
// lanes, and every lane of the warp takes part).
template <int G>
__device__ __forceinline__ float group_sum(float v) {
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int G>
__device__ __forceinline__ float group_max(float v) {
    for (int o = G / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// The sum of the squares of four elements, in this order and rounding (each square rounded, then
// added in order; the _rn intrinsics are never contracted into product-adds): a vector's squared norm
// from a group of lanes that hold four elements each, group_sum of these, gives the same bits
// wherever it is computed (telemetry.cuh's heads' records; qknorm_rope.cuh's forward, whose lanes
// hold eight).
__device__ __forceinline__ float sum_of_squares4(float a, float b, float c, float d) {
    return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)), __fmul_rn(c, c)), __fmul_rn(d, d));
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
