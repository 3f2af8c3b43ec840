// RMSNorm over rows of width C: out = x / sqrt(mean(x^2) + eps) * g (the formulas of math.h).
// One warp per row; the residual add that precedes each norm is fused into the matrix product
// before it (matmul.cuh).
#pragma once
#include <algorithm>
#include <vector>
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

// ./train's forward (dev_norms checks it against the kernel above and times both): the kernel above
// reads a row 2 bytes a lane, twice, one load after another: 0.0176 ms for a d22 row block at B8
// (16,384 x 512) on an H100, 1.9 TB/s. Here lane j of the row's warp loads chunks j, j + 32, ... of
// 8 values (16 bytes) at once, keeps them in registers (K chunks at most: C up to 256 K), and
// stores 16 bytes a chunk; the row's sum of squares in another order than the default's.
inline bool rmsnorm_forward_vec_supports(int C, std::initializer_list<const void*> arrays) {
    return C % 8 == 0 && C <= 2048 && aligned_16(arrays);
}

template <int K>
__global__ void rmsnorm_forward_vec_kernel(bf16* out, float* rstd, const bf16* x, const bf16* g, int N, int C, float eps) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const bf16* xr = x + (size_t)row * C;
    float v[K][8];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = 8 * (lane + 32 * k);
        const uint4 raw = i < C ? *reinterpret_cast<const uint4*>(xr + i) : make_uint4(0, 0, 0, 0);
        bf16x8_to_float(raw, v[k]);
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        for (int e = 0; e < 8; e++) ss += v[k][e] * v[k][e];
    const float r = rmsnorm_rstd(warp_sum(ss), C, eps);
    if (lane == 0) rstd[row] = r;
    bf16* o = out + (size_t)row * C;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int i = 8 * (lane + 32 * k);
        if (i >= C) break;
        float gain[8], y[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(g + i), gain);
        for (int e = 0; e < 8; e++) y[e] = rmsnorm_out(v[k][e], r, gain[e]);
        *reinterpret_cast<uint4*>(o + i) = float_to_bf16x8(y);
    }
}

inline void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* g, int N, int C, float eps, cudaStream_t s,
                            bool vec = true) {
    const int warps = 8, blocks = ceil_div(N, warps);
    if (vec && rmsnorm_forward_vec_supports(C, {out, x, g})) {
        const int chunks = ceil_div(C, 256);  // a lane's chunks
        if (chunks == 1) rmsnorm_forward_vec_kernel<1><<<blocks, warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
        else if (chunks == 2) rmsnorm_forward_vec_kernel<2><<<blocks, warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
        else if (chunks <= 4) rmsnorm_forward_vec_kernel<4><<<blocks, warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
        else rmsnorm_forward_vec_kernel<8><<<blocks, warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
    } else {
        rmsnorm_forward_kernel<<<blocks, warps * 32, 0, s>>>(out, rstd, x, g, N, C, eps);
    }
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

// out[i] += sum over p of partial[p * stride + i], for i < cols. A block of 32 x G threads takes 32
// columns (tile: which 32); thread row g adds the parts g, g + G, g + 2G, ... in order, then row 0
// adds the G sums in order: a fixed order (the same bits every run) with G times the parallelism of
// one thread per column. G is 32, with 8 loads in flight: a d22 layer's 1,024 partial rows wait on 4
// memory latencies (G = 8, unrolled by the compiler's 4, waited on 32).
template <int G>
__device__ __forceinline__ void column_sum_tile(float* out, const float* partial, int parts, int cols, int stride,
                                                int tile) {
    __shared__ float sums[G][32];
    int col = tile * 32 + threadIdx.x, g = threadIdx.y;
    float acc = 0.0f;
    if (col < cols) {
#pragma unroll 8
        for (int p = g; p < parts; p += G) acc += partial[(size_t)p * stride + col];
    }
    sums[g][threadIdx.x] = acc;
    __syncthreads();
    if (g == 0 && col < cols) {
        float total = 0.0f;
        for (int k = 0; k < G; k++) total += sums[k][threadIdx.x];
        out[col] += total;
    }
}

template <int G>
__global__ void column_sum_kernel(float* out, const float* partial, int parts, int cols, int stride) {
    column_sum_tile<G>(out, partial, parts, cols, stride, blockIdx.x);
}

static const int kColumnSumRows = 32;  // G

inline void column_sum(float* out, const float* partial, int parts, int cols, int stride, cudaStream_t s) {
    column_sum_kernel<kColumnSumRows><<<ceil_div(cols, 32), dim3(32, kColumnSumRows), 0, s>>>(out, partial, parts, cols, stride);
    cuda_check_launch();
}

// ./train's backward pass defers the column sums of its gain gradients to its end and runs them in
// one launch, where one launch after each norm's backward would be 89 a d22 step, each of a few
// blocks (16 for a d22 RMSNorm, 2 for a QK-norm gain) with the GPU's other SMs idle while it runs:
// on an H200 at d22, 8 x 2048, 0.033 ms for all of them against 0.443 ms one launch each. Each
// norm's partial rows then need a buffer of their own until the end. A job's tile is
// column_sum_kernel's block: the same sums in the same order, the same bits (dev/cuda/norms.cu
// checks them equal).
struct ColumnSumJob {
    float* out;
    const float* partial;
    int parts, cols, stride, first_tile;  // first_tile: the launch's block that takes its columns 0..31
};
static const int kColumnSumJobsPerLaunch = 96;  // 96 x 32 bytes: within a kernel's 4 KB of parameters
struct ColumnSumBatch {
    ColumnSumJob job[kColumnSumJobsPerLaunch];
    int jobs;
};
using ColumnSumJobs = std::vector<ColumnSumJob>;

template <int G>
__global__ void column_sums_kernel(ColumnSumBatch batch) {
    int j = 0;
    while (j + 1 < batch.jobs && batch.job[j + 1].first_tile <= (int)blockIdx.x) j++;
    const ColumnSumJob& job = batch.job[j];
    column_sum_tile<G>(job.out, job.partial, job.parts, job.cols, job.stride, blockIdx.x - job.first_tile);
}

// The column sums of a backward pass: recorded in *defer for column_sums_run, or at once with defer
// null (dev/cuda/norms.cu, which checks one kernel at a time).
inline void column_sum_or_defer(float* out, const float* partial, int parts, int cols, int stride, cudaStream_t s,
                                ColumnSumJobs* defer) {
    if (defer) defer->push_back({out, partial, parts, cols, stride, 0});
    else column_sum(out, partial, parts, cols, stride, s);
}

// Runs the recorded column sums, in launches of up to kColumnSumJobsPerLaunch jobs, and forgets them.
inline void column_sums_run(ColumnSumJobs& jobs, cudaStream_t s) {
    for (size_t first = 0; first < jobs.size(); first += kColumnSumJobsPerLaunch) {
        ColumnSumBatch batch;
        batch.jobs = (int)std::min(jobs.size() - first, (size_t)kColumnSumJobsPerLaunch);
        int tiles = 0;
        for (int j = 0; j < batch.jobs; j++) {
            batch.job[j] = jobs[first + j];
            batch.job[j].first_tile = tiles;
            tiles += ceil_div(batch.job[j].cols, 32);
        }
        column_sums_kernel<kColumnSumRows><<<tiles, dim3(32, kColumnSumRows), 0, s>>>(batch);
        cuda_check_launch();
    }
    jobs.clear();
}

inline int rmsnorm_backward_blocks(int N) { return ceil_div(N, kNormRowsPerBlock); }

// The backward pass for any row width; scratch: rmsnorm_backward_blocks(N) * C floats.
inline void rmsnorm_backward_rows(bf16* dx, float* dg, float* scratch, const bf16* dy, const bf16* x, const float* rstd,
                                  const bf16* g, int N, int C, cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    const int warps = 8, blocks = rmsnorm_backward_blocks(N);
    size_t smem = (size_t)warps * C * sizeof(float);
    if (smem > 48 * 1024)
        cudaCheck(cudaFuncSetAttribute(rmsnorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    rmsnorm_backward_kernel<<<blocks, warps * 32, smem, s>>>(dx, scratch, dy, x, rstd, g, N, C);
    cuda_check_launch();
    column_sum_or_defer(dg, scratch, blocks, C, C, s, defer);
}

// ---------------------------------------------------------------------------------------------
// The backward pass laid out for bandwidth (6.4x faster than the one above on an H200 at d22's
// 16,384 x 512, docs/benchmarks.md): the same math. The kernel above gives a block 64 rows, so a
// d22 step's 16,384 rows make 256 blocks
// whose warps each walk 8 rows one after another, and its lanes read 2 bytes at a stride: the GPU
// waits on latency. Here a block takes kNormVecRowsPerBlock rows (1,024 blocks at d22), each lane
// reads 16 bytes at a time (8 columns: lane l holds columns 256 k + 8 l .. 256 k + 8 l + 7 of the
// row, k < K = C / 256), and keeps the gain gradient of its own columns in registers across its
// rows. The sums run in a fixed order, as above: the same inputs give the same bits.
static const int kNormVecRowsPerBlock = 16;

template <int K>
__global__ void rmsnorm_backward_vec_kernel(bf16* dx, float* dg_partial, const bf16* dy, const bf16* x, const float* rstd,
                                            const bf16* g, int N) {
    constexpr int C = 256 * K;
    extern __shared__ float warp_dg[];  // [warps][C]
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float gain[K][8], dg[K][8] = {};
    for (int k = 0; k < K; k++) bf16x8_to_float(reinterpret_cast<const uint4*>(g)[k * 32 + lane], gain[k]);
    int first = blockIdx.x * kNormVecRowsPerBlock;
    for (int row = first + warp; row < min(N, first + kNormVecRowsPerBlock); row += warps) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)row * C);
        const uint4* dyr = reinterpret_cast<const uint4*>(dy + (size_t)row * C);
        uint4* dxr = reinterpret_cast<uint4*>(dx + (size_t)row * C);
        float xv[K][8], dyv[K][8], acc[K][8], r = rstd[row], dot = 0.0f;
        for (int k = 0; k < K; k++) {
            bf16x8_to_float(xr[k * 32 + lane], xv[k]);
            bf16x8_to_float(dyr[k * 32 + lane], dyv[k]);
            // The gradient dx adds to is read here, with x and dy, so that a row waits on one memory
            // latency instead of two (after the row's reduction below it would be a second).
            bf16x8_to_float(dxr[k * 32 + lane], acc[k]);
            for (int j = 0; j < 8; j++) dot += rmsnorm_dot_term(gain[k][j], dyv[k][j], xv[k][j], r);
        }
        dot = warp_sum(dot) / C;
        for (int k = 0; k < K; k++) {
            for (int j = 0; j < 8; j++) {
                acc[k][j] += rmsnorm_dx(gain[k][j], dyv[k][j], xv[k][j], r, dot);
                dg[k][j] += rmsnorm_dgain(dyv[k][j], xv[k][j], r);
            }
            dxr[k * 32 + lane] = float_to_bf16x8(acc[k]);
        }
    }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < 8; j++) warp_dg[(size_t)warp * C + k * 256 + lane * 8 + j] = dg[k][j];
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < warps; w++) acc += warp_dg[(size_t)w * C + i];
        dg_partial[(size_t)blockIdx.x * C + i] = acc;
    }
}

// Whether rmsnorm_backward_vec takes these rows: C a multiple of 256 up to 1,024 (the presets' and
// Qwen3-0.6B's widths; wider rows would spill the registers that hold a lane's 4 x 8 K values), the
// bf16 arrays 16-byte aligned (the rows are then too, C * 2 bytes being a multiple of 16).
inline bool rmsnorm_backward_vec_supports(int C, const void* dx, const void* dy, const void* x, const void* g) {
    return aligned_16({dx, dy, x, g}) && C % 256 == 0 && C / 256 >= 1 && C / 256 <= 4;
}

inline int rmsnorm_backward_vec_blocks(int N) { return ceil_div(N, kNormVecRowsPerBlock); }

// As rmsnorm_backward_rows; scratch: rmsnorm_backward_vec_blocks(N) * C floats. Rows it does not take
// are a fatal error: callers ask rmsnorm_backward_vec_supports first.
inline void rmsnorm_backward_vec(bf16* dx, float* dg, float* scratch, const bf16* dy, const bf16* x, const float* rstd,
                                 const bf16* g, int N, int C, cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    if (!rmsnorm_backward_vec_supports(C, dx, dy, x, g)) fail("rmsnorm_backward_vec: C = %d or an unaligned row", C);
    const int warps = 8, blocks = rmsnorm_backward_vec_blocks(N);
    size_t smem = (size_t)warps * C * sizeof(float);
    auto launch = [&](auto kernel) {
        if (smem > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<blocks, warps * 32, smem, s>>>(dx, scratch, dy, x, rstd, g, N);
    };
    switch (C / 256) {
        case 1: launch(rmsnorm_backward_vec_kernel<1>); break;
        case 2: launch(rmsnorm_backward_vec_kernel<2>); break;
        case 3: launch(rmsnorm_backward_vec_kernel<3>); break;
        default: launch(rmsnorm_backward_vec_kernel<4>); break;
    }
    cuda_check_launch();
    column_sum_or_defer(dg, scratch, blocks, C, C, s, defer);
}

// The backward pass: dx += the gradient through the norm, dg += the gain's, by the vectorised kernel
// where it takes the rows, else by the general one. scratch: rmsnorm_backward_scratch_floats(N, C).
inline size_t rmsnorm_backward_scratch_floats(int N, int C) {
    return (size_t)std::max(rmsnorm_backward_blocks(N), rmsnorm_backward_vec_blocks(N)) * C;
}

// defer: where the gain gradient's column sums are recorded (column_sums_run), or null for at once.
inline void rmsnorm_backward(bf16* dx, float* dg, float* scratch, const bf16* dy, const bf16* x, const float* rstd,
                             const bf16* g, int N, int C, cudaStream_t s, ColumnSumJobs* defer = nullptr) {
    if (rmsnorm_backward_vec_supports(C, dx, dy, x, g)) rmsnorm_backward_vec(dx, dg, scratch, dy, x, rstd, g, N, C, s, defer);
    else rmsnorm_backward_rows(dx, dg, scratch, dy, x, rstd, g, N, C, s, defer);
}
