// Telemetry kernels: on a stats step they reduce, per layer and head, the statistics of
// telemetry.md from the post-norm, pre-RoPE queries and keys the forward pass wrote in float32 and
// from the per-row accumulators of the attention kernel, and add them into the step's sums
// (telemetry_sums.h's TelemetrySums, in float64 on the device) that the host turns into statistics once
// the step's every micro-batch (on every process) is in. Every reduction runs in a fixed order (no
// atomics), so a stats step gives the same bits every run. The augmented Gram matrices
// [K 1]^T [K 1] are accumulated in float64: at head_dim 64 from the float32 keys on the float64
// tensor cores, at other widths from float64 copies of the keys by cuBLAS.
#pragma once
#include <algorithm>
#include <functional>
#include "config.h"
#include "cuda_common.cuh"
#include "math.h"
#include "matmul.cuh"
#include "telemetry_sums.h"

static const int kStatRowsPerBlock = 256;
static const int kStatWarps = 8;
static const long long kStatMaxTokens = 65535LL * kStatRowsPerBlock;  // in a micro-batch: 65535 blocks of rows

// Per head h and block of rows: the head's record (telemetry_sums.h's HeadSum) of its rows in
// float, written as partial[(h * chunks + chunk) * head_record_size(D) + ...]. Heads 0..H-1 are
// queries, which fill only KS_NORM.
__global__ void head_row_stats_kernel(float* partial, const float* qk_normed, int N, int H, int NH, int D) {
    extern __shared__ float smem[];  // [warps][record]
    int h = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y, record = head_record_size(D);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    bool is_key = h >= H;
    float* mine = smem + (size_t)warp * record;  // this warp's record
    float* unit_sum = mine + KS_UNIT;
    for (int i = lane; i < record; i += 32) mine[i] = 0.0f;
    __syncwarp();  // lanes below add into entries other lanes zeroed
    int first = chunk * kStatRowsPerBlock, last = min(N, first + kStatRowsPerBlock);
    for (int n = first + warp; n < last; n += warps) {
        const float* x = qk_normed + ((size_t)n * NH + h) * D;
        float sq = 0.0f, quad = 0.0f, mx = 0.0f;
        for (int i = lane; i < D; i += 32) {
            float v = x[i], v2 = v * v;
            sq += v2;
            quad += v2 * v2;
            mx = fmaxf(mx, fabsf(v));
        }
        sq = warp_sum(sq);
        float norm = sqrtf(sq);
        if (lane == 0) mine[KS_NORM] += norm;
        if (!is_key) continue;
        quad = warp_sum(quad);
        mx = warp_max(mx);
        if (lane == 0) {
            mine[KS_MAXABS] += mx;
            mine[KS_PR] += (float)participation_ratio(sq, quad);
        }
        if (norm > 0.0f)
            for (int i = lane; i < D; i += 32) unit_sum[i] += x[i] / norm;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < record; i += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < warps; w++) acc += smem[(size_t)w * record + i];
        partial[((size_t)h * chunks + chunk) * record + i] = acc;
    }
}

// ./train's (dev_telemetry checks it against the kernel above and times both): the same records
// laid out for bandwidth. The kernel above gives each row a warp whose lanes read 4 bytes each,
// twice, and reduces every row's sums over 32 lanes: at d22 (16,384 tokens, 16 heads, D = 64) 0.101
// ms a layer on an H100, about 4x the time its 67 MB of keys take to read. Here a group of G = D /
// 4 lanes takes a row, lane j holding elements 4j .. 4j + 3 from one 16-byte load, so a warp reads
// 32 / G rows at once, each row's sums reduce over G lanes, and each lane keeps its 4 columns'
// unit-vector sums in registers across its rows. The groups' records are added in group order at
// the end, so the same keys give the same bits. D must be 64 or 128 (the widths the CUDA backend
// runs) and qk_normed 16-byte aligned.
//
// QUERY_NORMS (candidate, query_norms): a query head's rows hold only their norms, each in its
// first element, where qk_norm_rope_forward's query_norms put them; a query head's block reads those
// 4 bytes a row (a 32-byte sector of the row's 256 at D = 64), lane j of a group the group's row of
// round j, all at once, and the group adds them in round order: the order of the rows' sum here. The
// forward pass computes each norm as this kernel does (sum_of_squares4 a lane, group sums, a square
// root): the same bits.
inline bool head_row_stats_vec_supports(int D, const float* qk_normed) {
    return (D == 64 || D == 128) && aligned_16({qk_normed});
}

template <int D, bool QUERY_NORMS = false>
__global__ void head_row_stats_vec_kernel(float* partial, const float* qk_normed, int N, int H, int NH) {
    constexpr int G = D / 4, record = KS_UNIT + D;
    extern __shared__ float group_records[];  // [groups][record]
    const int h = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
    const int j = threadIdx.x % G, group = threadIdx.x / G, groups = blockDim.x / G;
    const bool is_key = h >= H;
    const int first = chunk * kStatRowsPerBlock, last = min(N, first + kStatRowsPerBlock);
    float norm_sum = 0.0f, maxabs_sum = 0.0f, pr_sum = 0.0f, unit[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    static_assert(kStatWarps * 32 == kStatRowsPerBlock, "a block's rows: G rounds of its groups");
    if (QUERY_NORMS && !is_key) {  // the same in the whole block
        const int own_row = first + group + j * groups;  // this lane's: its group's row of round j
        const float v = own_row < last ? qk_normed[((size_t)own_row * NH + h) * D] : 0.0f;
        for (int round = 0; round < G; round++) {
            const float norm = __shfl_sync(0xffffffffu, v, round, G);
            if (first + group + round * groups < last) norm_sum += norm;
        }
    }
    // Rounds in which every group takes one row, so that all lanes of a warp reach each shuffle (none
    // where the block's rows are the queries' norms, added above).
    for (int base = QUERY_NORMS && !is_key ? last : first; base < last; base += groups) {
        const int n = base + group;
        const bool valid = n < last;
        float4 v = valid ? *reinterpret_cast<const float4*>(qk_normed + ((size_t)n * NH + h) * D + 4 * j)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float x[4] = {v.x, v.y, v.z, v.w};
        float sq = sum_of_squares4(x[0], x[1], x[2], x[3]), quad = 0.0f, mx = 0.0f;
        for (int i = 0; i < 4; i++) {
            const float x2 = __fmul_rn(x[i], x[i]);  // sum_of_squares4's
            quad += x2 * x2;
            mx = fmaxf(mx, fabsf(x[i]));
        }
        sq = group_sum<G>(sq);
        const float norm = sqrtf(sq);
        if (!is_key) {
            if (valid) norm_sum += norm;
            continue;
        }
        quad = group_sum<G>(quad);
        mx = group_max<G>(mx);
        if (!valid) continue;
        norm_sum += norm;
        maxabs_sum += mx;
        pr_sum += (float)participation_ratio(sq, quad);
        if (norm > 0.0f)
            for (int i = 0; i < 4; i++) unit[i] += x[i] / norm;
    }
    float* mine = group_records + (size_t)group * record;
    if (j == 0) {
        mine[KS_NORM] = norm_sum;
        mine[KS_MAXABS] = maxabs_sum;
        mine[KS_PR] = pr_sum;
    }
    for (int i = 0; i < 4; i++) mine[KS_UNIT + 4 * j + i] = unit[i];
    __syncthreads();
    for (int i = threadIdx.x; i < record; i += blockDim.x) {
        float acc = 0.0f;
        for (int g = 0; g < groups; g++) acc += group_records[(size_t)g * record + i];
        partial[((size_t)h * chunks + chunk) * record + i] = acc;
    }
}

// One warp per head: adds its blocks' records in order (double) into the sums of `layer`: the whole
// record for key heads, ||q|| for query heads.
__global__ void head_stats_finish_kernel(double* sums, TelemetrySums lay, const float* partial, int chunks, int H,
                                         int D, int layer) {
    int h = blockIdx.x, lane = threadIdx.x, record = head_record_size(D);
    const float* p = partial + (size_t)h * chunks * record;
    auto chunks_sum = [&](int i) {
        double s = 0.0;
        for (int c = 0; c < chunks; c++) s += p[(size_t)c * record + i];
        return s;
    };
    if (h >= H) {
        double* key_rec = sums + lay.key(layer, h - H);
        for (int i = lane; i < record; i += 32) key_rec[i] += chunks_sum(i);
    } else if (lane == 0) {
        sums[lay.query(layer, h) + QS_NORM] += chunks_sum(KS_NORM);
    }
}

// The sums over rows k = first .. last - 1 (k = b T + t) of the attention kernel's per-row statistics
// of query head h (entropy, mass on position 0, largest probability, mass on document starts), and
// the largest logit, over the block: every thread gets them. row_stats holds ATTN_NUM_ROW_STATS
// [B, H, T] arrays; `shared` 32 floats.
struct AttentionRowSums {
    float entropy, sink, maxp, doc_start, logit_max;
};
__device__ __forceinline__ AttentionRowSums attention_rows_sum(const float* row_stats, int B, int T, int H, int h,
                                                               int first, int last, float* shared) {
    size_t rows = (size_t)B * H * T;
    float ent = 0.0f, sink = 0.0f, maxp = 0.0f, doc = 0.0f, lmax = -INFINITY;
    for (int k = first + threadIdx.x; k < last; k += blockDim.x) {
        int b = k / T, t = k % T;
        size_t row = ((size_t)b * H + h) * T + t;
        ent += row_stats[ATTN_STAT_ENTROPY * rows + row];
        sink += row_stats[ATTN_STAT_SINK * rows + row];
        maxp += row_stats[ATTN_STAT_MAXP * rows + row];
        doc += row_stats[ATTN_STAT_DOC_START * rows + row];
        lmax = fmaxf(lmax, row_stats[ATTN_STAT_LOGIT_MAX * rows + row]);
    }
    ent = block_sum(ent, shared);
    sink = block_sum(sink, shared);
    maxp = block_sum(maxp, shared);
    doc = block_sum(doc, shared);
    lmax = block_max(lmax, shared);
    return {ent, sink, maxp, doc, lmax};
}

// One block per query head: all B*T rows summed into the sums of `layer`.
__global__ void attention_stats_finish_kernel(double* sums, TelemetrySums lay, const float* row_stats, int B, int T,
                                              int H, int layer) {
    __shared__ float shared[32];
    int h = blockIdx.x;
    AttentionRowSums r = attention_rows_sum(row_stats, B, T, H, h, 0, B * T, shared);
    if (threadIdx.x == 0) {
        double* rec = sums + lay.query(layer, h);
        rec[QS_ENTROPY] += r.entropy;
        rec[QS_SINK] += r.sink;
        rec[QS_MAXP] += r.maxp;
        rec[QS_DOC_START] += r.doc_start;
        double& mx = sums[lay.max_logit(layer, h)];
        mx = fmax(mx, (double)r.logit_max);
    }
}

// ./train's (dev_telemetry checks it against the kernel above and times both): the same sums from
// many blocks. The kernel above gives each query head one block, 8 blocks at d22 on a GPU of 132
// multiprocessors, each thread walking 64 rows of 5 arrays: 0.037 ms a layer on an H100 for 2.6 MB.
// Here block (head, chunk) sums kAttnStatRows rows into a record of ATTN_NUM_ROW_STATS floats
// (partial [H][chunks][5]), and one thread per head adds its chunks' records in chunk order, in
// double: a fixed order, so the same rows give the same bits.
static const int kAttnStatRows = 1024;

inline int attention_stat_chunks(int B, int T) { return ceil_div(B * T, kAttnStatRows); }

__global__ void attention_row_sums_kernel(float* partial, const float* row_stats, int B, int T, int H) {
    __shared__ float shared[32];
    const int h = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y, first = chunk * kAttnStatRows;
    AttentionRowSums r = attention_rows_sum(row_stats, B, T, H, h, first, min(B * T, first + kAttnStatRows), shared);
    if (threadIdx.x == 0) {
        float* rec = partial + ((size_t)h * chunks + chunk) * ATTN_NUM_ROW_STATS;
        rec[ATTN_STAT_ENTROPY] = r.entropy;
        rec[ATTN_STAT_SINK] = r.sink;
        rec[ATTN_STAT_MAXP] = r.maxp;
        rec[ATTN_STAT_DOC_START] = r.doc_start;
        rec[ATTN_STAT_LOGIT_MAX] = r.logit_max;
    }
}

__global__ void attention_row_sums_finish_kernel(double* sums, TelemetrySums lay, const float* partial, int chunks,
                                                 int H, int layer) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    double ent = 0.0, sink = 0.0, maxp = 0.0, doc = 0.0, lmax = -INFINITY;
    for (int c = 0; c < chunks; c++) {
        const float* rec = partial + ((size_t)h * chunks + c) * ATTN_NUM_ROW_STATS;
        ent += rec[ATTN_STAT_ENTROPY];
        sink += rec[ATTN_STAT_SINK];
        maxp += rec[ATTN_STAT_MAXP];
        doc += rec[ATTN_STAT_DOC_START];
        lmax = fmax(lmax, (double)rec[ATTN_STAT_LOGIT_MAX]);
    }
    double* q = sums + lay.query(layer, h);
    q[QS_ENTROPY] += ent;
    q[QS_SINK] += sink;
    q[QS_MAXP] += maxp;
    q[QS_DOC_START] += doc;
    double& mx = sums[lay.max_logit(layer, h)];
    mx = fmax(mx, lmax);
}

// The layer's gains, g_q then g_k, into the sums (as doubles): the values the step measured with.
__global__ void gains_to_sums_kernel(double* sums, TelemetrySums lay, const float* g_q, const float* g_k, int D, int layer) {
    double* out = sums + lay.layer_gains(layer);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        out[i] = g_q[i];
        out[D + i] = g_k[i];
    }
}

// Before a stats step's first forward pass: sums 0, maxima -infinity (telemetry_sums_clear).
__global__ void telemetry_sums_clear_kernel(double* sums, TelemetrySums lay) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < lay.total; i += (size_t)gridDim.x * blockDim.x)
        sums[i] = i >= lay.maxima && i < lay.gains ? -INFINITY : 0.0;
}

// The key heads' keys as float64 rows with a trailing 1, keys_f64 [Hkv][N][D+1]: the augmented
// matrices whose Gram products give K^T K and the key sums in one float64 product.
__global__ void keys_to_f64_kernel(double* keys_f64, const float* qk_normed, int N, int H, int Hkv, int D) {
    long long W = D + 1, total = (long long)Hkv * N * W;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long long)gridDim.x * blockDim.x) {
        long long h = idx / ((long long)N * W), rem = idx % ((long long)N * W), n = rem / W, i = rem % W;
        keys_f64[idx] = i < D ? (double)qk_normed[(n * (H + Hkv) + H + h) * D + i] : 1.0;
    }
}

// keys_f64 from the float32 keys in qk_normed.
inline void keys_to_f64(double* keys_f64, const float* qk_normed, int N, int H, int Hkv, int D, cudaStream_t s) {
    keys_to_f64_kernel<<<std::min(ceil_div((long long)Hkv * N * (D + 1), 256), 4096), 256, 0, s>>>(keys_f64, qk_normed, N,
                                                                                                  H, Hkv, D);
    cuda_check_launch();
}

// The Gram products of the key heads' augmented keys (keys_f64 [Hkv][N][W], W = D + 1) added into
// gram_sums (Hkv W x W matrices): head h's rows [N][W] seen column-major are a W x N matrix A
// (leading dimension W), and G += A A^T, one batched float64 product.
inline void gram_products(double* gram_sums, const double* keys_f64, Matmul& mm, int N, int Hkv, int W, cudaStream_t s) {
    const double one = 1.0;
    cublasCheck(cublasSetStream(mm.blas, s));
    cublasCheck(cublasDgemmStridedBatched(mm.blas, CUBLAS_OP_N, CUBLAS_OP_T, W, W, N, &one, keys_f64, W, (long long)N * W,
                                          keys_f64, W, (long long)N * W, &one, gram_sums, W, (long long)W * W, Hkv));
}

// An alternative that dev_telemetry checks and times (./train does not use it): the same products
// split over the rows, 1.7x faster than the single DGEMM on an H100 at d22, slower than the
// tensor-core products below.
// One product of a head's N rows has a W x W result, a few blocks of output that each walk all N
// rows while most of the GPU idles; here each head's rows are kGramSlices slices (fewer when N is
// not a multiple), each slice's Gram matrix its own product (Hkv x slices of them), and the slices'
// matrices are added in a fixed order, so the same keys give the same bits.
static const int kGramSlices = 16;

// The slices of N rows: kGramSlices, halved until they divide N.
inline int gram_slices(int N) {
    int slices = kGramSlices;
    while (N % slices) slices /= 2;
    return slices;
}

// Scratch of the split products: Hkv x `slices` W x W matrices, in doubles.
inline size_t gram_split_doubles(int Hkv, int W, int slices = kGramSlices) { return (size_t)Hkv * slices * W * W; }

// The slices' matrices (partial [Hkv][slices][W * W]) added in slice order into gram_sums: a thread
// per entry, blockIdx.y the key head (gram_slices_sum).
__global__ void gram_slices_sum_kernel(double* gram_sums, const double* partial, int slices, int WW) {
    int h = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= WW) return;
    double acc = 0.0;
    for (int s = 0; s < slices; s++) acc += partial[((size_t)h * slices + s) * WW + i];
    gram_sums[(size_t)h * WW + i] += acc;
}

inline void gram_slices_sum(double* gram_sums, const double* partial, int Hkv, int slices, int WW, cudaStream_t s) {
    gram_slices_sum_kernel<<<dim3(ceil_div(WW, 256), Hkv), 256, 0, s>>>(gram_sums, partial, slices, WW);
    cuda_check_launch();
}

// The Gram products straight from the float32 keys at D = 64, through the
// float64 tensor cores (mma.sync m8n8k4 .f64), with no float64 copy of the keys: block (slice, key
// head), D / 8 warps; gram_mma_slices(N) slices of ceil(N / slices) keys (the last may be shorter).
// Warp w accumulates rows 8w .. 8w + 7 of K^T K, D / 8 tiles of 8 x 8. A k-step is 4 keys: lane l
// takes x[c][8t + g] (key c = l % 4 of the step, g = l / 4) for every tile column t, which is the
// B operand of tile (w, t) (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f64": B[k][n] at lane
// k + 4n) and, for t = w, its A operand (A[m][k] at lane 4m + k), since (K^T)[i][k] = K[k][i]. The
// block stages 32 keys at a time in shared memory as doubles (products of floats are exact in
// float64); the next 32 are read into registers while the current ones are in use. The appended
// column of ones gives K^T 1 (each warp sums its own 8 columns) and the count. Every sum runs in a
// fixed order: the same keys give the same bits.
static const int kGramMmaSlices = 64;  // 16,384 rows: 64 slices of 256, 512 blocks for 8 key heads
static const int kGramMmaRows = 32;    // keys staged at a time

// Up to kGramMmaSlices slices, each of at least kGramMmaRows keys where N allows.
inline int gram_mma_slices(int N) { return std::max(1, std::min(kGramMmaSlices, N / kGramMmaRows)); }

__device__ __forceinline__ void mma_f64_8x8x4(double (&d)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
}

template <int D>
__global__ void __launch_bounds__(D * 4) gram_products_mma_kernel(double* partial, const float* qk_normed, int N, int H,
                                                                  int Hkv, int slices) {
    constexpr int kTiles = D / 8, kThreads = 32 * kTiles, kPerThread = kGramMmaRows * D / kThreads;
    constexpr int LD = D + 4;  // the 16 lanes of a half-warp read 4 keys x 4 columns: 16 different bank pairs
    __shared__ double keys[kGramMmaRows][LD];
    const int h = blockIdx.y, slice = blockIdx.x, rows = (N + slices - 1) / slices;
    const int first = min(N, slice * rows), end = min(N, first + rows);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, W = D + 1;
    const float* head_keys = qk_normed + (size_t)(H + h) * D;  // key n at n * (H + Hkv) * D
    const size_t stride = (size_t)(H + Hkv) * D;

    float staged[kPerThread];  // element threadIdx.x + i kThreads of the next 32 keys (0 beyond the slice)
    auto fetch = [&](int n0) {
#pragma unroll
        for (int i = 0; i < kPerThread; i++) {
            const int e = threadIdx.x + i * kThreads, n = n0 + e / D;
            staged[i] = n < end ? head_keys[(size_t)n * stride + e % D] : 0.0f;
        }
    };
    double acc[kTiles][2] = {};  // tile (w, t): row 8w + g, columns 8t + 2c and 8t + 2c + 1
    double column_sum = 0.0;     // column 8w + g over this lane's keys (c, c + 4, ...)
    fetch(first);
    for (int n0 = first; n0 < end; n0 += kGramMmaRows) {
        __syncthreads();  // every warp is done with the keys staged before
#pragma unroll
        for (int i = 0; i < kPerThread; i++) {
            const int e = threadIdx.x + i * kThreads;
            keys[e / D][e % D] = (double)staged[i];
        }
        __syncthreads();
        if (n0 + kGramMmaRows < end) fetch(n0 + kGramMmaRows);
#pragma unroll
        for (int k0 = 0; k0 < kGramMmaRows; k0 += 4) {
            const double a = keys[k0 + c][8 * warp + g];
            column_sum += a;
#pragma unroll
            for (int t = 0; t < kTiles; t++) mma_f64_8x8x4(acc[t], a, keys[k0 + c][8 * t + g]);
        }
    }
    column_sum += __shfl_xor_sync(0xffffffffu, column_sum, 1);
    column_sum += __shfl_xor_sync(0xffffffffu, column_sum, 2);

    double* out = partial + ((size_t)h * slices + slice) * W * W;  // row-major W x W (symmetric)
    const int i = 8 * warp + g;
#pragma unroll
    for (int t = 0; t < kTiles; t++) {
        out[(size_t)i * W + 8 * t + 2 * c] = acc[t][0];
        out[(size_t)i * W + 8 * t + 2 * c + 1] = acc[t][1];
    }
    if (c == 0) out[(size_t)i * W + D] = out[(size_t)D * W + i] = column_sum;
    if (threadIdx.x == 0) out[(size_t)D * W + D] = (double)(end - first);
}

// Scratch of the telemetry, in floats, used by one part after another: the per-chunk records of the
// head statistics, the split records of the attention statistics, and at head_dim 64 the slices'
// Gram matrices of gram_products_mma (and of gram_products_sym and gram_products_dmma, fewer), with
// room after them for gram_products_dmma's slices' key records.
inline size_t telemetry_partial_floats(int N, const ModelConfig& c) {
    size_t records = (size_t)(c.n_head + c.n_kv_head) * ceil_div(N, kStatRowsPerBlock) * head_record_size(c.head_dim);
    size_t slices = c.head_dim == 64 ? 2 * (gram_split_doubles(c.n_kv_head, c.head_dim + 1, kGramMmaSlices) +
                                            (size_t)c.n_kv_head * kGramMmaSlices * head_record_size(c.head_dim))
                                     : 0;
    size_t attention = (size_t)c.n_head * ceil_div(N, kAttnStatRows) * ATTN_NUM_ROW_STATS;
    return std::max({records, slices, attention});
}

// As gram_products, from the float32 keys qk_normed [N, NH, D] (D = 64: at 128 a block's 16 warps
// would have 128 registers a lane for 64 of accumulators); partial: gram_split_doubles(Hkv, D + 1,
// kGramMmaSlices) doubles.
inline void gram_products_mma(double* gram_sums, double* partial, const float* qk_normed, int N, int H, int Hkv, int D,
                              cudaStream_t s) {
    const int slices = gram_mma_slices(N), W = D + 1;
    if (D != 64) fail("internal: the float64 tensor-core Gram products take head_dim 64, not %d", D);
    gram_products_mma_kernel<64><<<dim3(slices, Hkv), 64 * 4, 0, s>>>(partial, qk_normed, N, H, Hkv, slices);
    cuda_check_launch();
    gram_slices_sum(gram_sums, partial, Hkv, slices, W * W, s);
}

// ./train's (dev_telemetry checks it against the DGEMM and times it beside the kernel above): the
// same products at D = 64 with no shared memory in the loop and only the tiles on and above the
// diagonal. The kernel above computes all 64 tiles of 8 x 8 where the matrix's symmetry needs 36,
// reads every operand from shared memory (about as many bytes an SM a clock as its float64 tensor
// cores take), and writes 64 slices' matrices, half as many bytes as it reads of keys. Here the
// columns are grouped by class: tile row or column t, place g, is the key's column 8g + t, so that
// lane (g = l / 4, c = l % 4) holds columns 8g .. 8g + 7 of key c of a step of 4 keys (two 16-byte
// loads), and its value x[t] is both its A operand of the tiles (t, j) and its B operand of the
// tiles (i, t) (as in the kernel above: A[m][k] at lane 4m + k, B[k][n] at lane 4n + k). Tile (i,
// j)'s accumulators at lane (g, c) are the entries (8g + i, 8(2c + e) + j), e = 0, 1, written with
// their mirror images where i != j. Block (slice, key head) of kGramSymWarps warps (32 slices at
// d22's 8 key heads, gram_sym_slices); a warp takes every fourth step of its slice, the next two
// steps' keys loaded while the current one's 36 products run (at 2 warps an SM sub-partition, one
// step's products take about one load's latency, 600-900 clocks on an H100); the warps' sums are
// added in warp order through shared memory, then the slices' in slice order (gram_slices_sum): the
// same keys give the same bits, though not the bits of the kernel above, which sums in another
// order.
static const int kGramSymWarps = 4;
// Slices of at least 64 keys, about kGramSymBlocks blocks in all (2 an SM on an H100's 132, at the
// kernel's 255 registers a lane), at most kGramMmaSlices (the scratch's room).
static const int kGramSymBlocks = 256;
inline int gram_sym_slices(int N, int Hkv) {
    return std::max(1, std::min({kGramMmaSlices, N / 64, ceil_div(kGramSymBlocks, Hkv)}));
}

// The 36 tiles (i <= j) of an 8 x 8 grid of tiles, row by row.
__host__ __device__ constexpr int gram_tile_index(int i, int j) { return i * 8 - i * (i - 1) / 2 + (j - i); }

__global__ void __launch_bounds__(kGramSymWarps * 32) gram_products_sym_kernel(double* partial, const float* qk_normed,
                                                                               int N, int H, int Hkv, int slices) {
    constexpr int D = 64, W = D + 1, kTiles = 36, kHalf = kTiles / 2, kStep = 4 * kGramSymWarps;
    __shared__ double2 tile_spill[kGramSymWarps - 1][kHalf][32];  // warps 1.. : half of their tiles at a time
    __shared__ double column_spill[kGramSymWarps - 1][8][8];      // warps 1.. : [g][t], the sums of column 8g + t
    const int h = blockIdx.y, slice = blockIdx.x, rows = (N + slices - 1) / slices;
    const int first = min(N, slice * rows), end = min(N, first + rows);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const size_t stride = (size_t)(H + Hkv) * D;
    const float* lane_columns = qk_normed + (size_t)(H + h) * D + 8 * g;  // key n's columns 8g .. at n * stride

    // Columns 8g .. 8g + 7 of key n, zeros at or beyond the slice's end: the load always runs (key 0's
    // where n is past the end), so that no branch stands before the warp's mma.sync.
    auto load = [&](int n, float4 (&x)[2]) {
        const bool valid = n < end;
        const float4* p = reinterpret_cast<const float4*>(lane_columns + (size_t)(valid ? n : 0) * stride);
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f), lo = p[0], hi = p[1];
        x[0] = valid ? lo : zero;
        x[1] = valid ? hi : zero;
    };
    double acc[kTiles][2] = {};
    double column[8] = {};  // this lane's share of the sums of columns 8g .. 8g + 7
    // Two steps in flight: a step's 36 products take about as long as one load's latency.
    float4 next[2], after_next[2];
    load(first + 4 * warp + c, next);
    load(first + 4 * warp + kStep + c, after_next);
    for (int step0 = first + 4 * warp; step0 < end; step0 += kStep) {
        const double x[8] = {next[0].x, next[0].y, next[0].z, next[0].w, next[1].x, next[1].y, next[1].z, next[1].w};
        next[0] = after_next[0];
        next[1] = after_next[1];
        load(step0 + 2 * kStep + c, after_next);
#pragma unroll
        for (int t = 0; t < 8; t++) column[t] += x[t];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = i; j < 8; j++) mma_f64_8x8x4(acc[gram_tile_index(i, j)], x[i], x[j]);
    }
#pragma unroll
    for (int t = 0; t < 8; t++) {
        column[t] += __shfl_xor_sync(0xffffffffu, column[t], 1);
        column[t] += __shfl_xor_sync(0xffffffffu, column[t], 2);
    }

    // The warps' sums into warp 0's, in warp order.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        __syncthreads();  // warp 0 is done with the previous half
        if (warp > 0) {
#pragma unroll
            for (int k = 0; k < kHalf; k++) tile_spill[warp - 1][k][lane] = make_double2(acc[half * kHalf + k][0], acc[half * kHalf + k][1]);
            if (half == 0 && c == 0)
#pragma unroll
                for (int t = 0; t < 8; t++) column_spill[warp - 1][g][t] = column[t];
        }
        __syncthreads();
        if (warp == 0) {
            for (int w = 0; w < kGramSymWarps - 1; w++) {
#pragma unroll
                for (int k = 0; k < kHalf; k++) {
                    const double2 v = tile_spill[w][k][lane];
                    acc[half * kHalf + k][0] += v.x;
                    acc[half * kHalf + k][1] += v.y;
                }
                if (half == 0)
#pragma unroll
                    for (int t = 0; t < 8; t++) column[t] += column_spill[w][g][t];
            }
        }
    }
    if (warp > 0) return;

    double* out = partial + ((size_t)h * slices + slice) * W * W;  // row-major W x W (symmetric)
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = i; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 8 * g + i, col = 8 * (2 * c + e) + j;
                const double v = acc[gram_tile_index(i, j)][e];
                out[(size_t)r * W + col] = v;
                if (i != j) out[(size_t)col * W + r] = v;
            }
    if (c == 0)
#pragma unroll
        for (int t = 0; t < 8; t++) out[(size_t)(8 * g + t) * W + D] = out[(size_t)D * W + 8 * g + t] = column[t];
    if (lane == 0) out[(size_t)D * W + D] = (double)(end - first);
}

// As gram_products_mma, with the kernel above. Its 16-byte loads need qk_normed 16-byte
// aligned; false, with nothing done, where it is not.
inline bool gram_products_sym(double* gram_sums, double* partial, const float* qk_normed, int N, int H, int Hkv, int D,
                              cudaStream_t s) {
    if (D != 64 || !aligned_16({qk_normed})) return false;
    const int slices = gram_sym_slices(N, Hkv), W = D + 1;
    gram_products_sym_kernel<<<dim3(slices, Hkv), kGramSymWarps * 32, 0, s>>>(partial, qk_normed, N, H, Hkv, slices);
    cuda_check_launch();
    gram_slices_sum(gram_sums, partial, Hkv, slices, W * W, s);
    return true;
}

// Hopper's float64 tensor-core products (PTX ISA 7.8, sm_90 and later): D (16 x 8) += A (16 x K) B
// (K x 8) for K = 4, 8 or 16 in one instruction of a warp, 512 to 2,048 products where Ampere's
// m8n8k4 (above) does 256. Lane l (g = l / 4, t = l % 4) holds A[g + 8 (v % 2)][t + 4 (v / 2)] as
// a[v] (K / 2 values), B[t + 4 v][g] as b[v] (K / 4) and D[g + 8 (v / 2)][2 t + v % 2] as d[v]
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .f64). A build without
// sm_90's code traps (gram_dmma_compiled tells the host).
template <int K>
__device__ __forceinline__ void mma_f64_16x8(double (&d)[4], const double (&a)[K / 2], const double (&b)[K / 4]) {
    static_assert(K == 4 || K == 8 || K == 16, "m16n8k4, m16n8k8 or m16n8k16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (K == 4)
        asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                     "{%0, %1, %2, %3};\n"
                     : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                     : "d"(a[0]), "d"(a[1]), "d"(b[0]));
    else if constexpr (K == 8)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                     : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
                     : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                     : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                       "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
    (void)d, (void)a, (void)b;
    __trap();
#endif
}

// The candidate gram_dmma (dev_telemetry checks it against the DGEMM and times it at K = 4, 8 and 16
// beside ./train's kernel): gram_products_sym's products through the instructions above. The
// columns are grouped by class as there (class j: the columns 8p + j, p its place), lane (g, t)
// holding columns 8g .. 8g + 7 of keys t, t + 4, ... of a step of K keys (two 16-byte loads a key).
// A tile of 16 x 8 takes the classes 2r and 2r + 1 as its rows and class c as its columns: the
// lane's A operand is x[v / 2][2r + v % 2], its B operand x[v][c], and d[v] is the entry (8g + 2r +
// v / 2, 8 (2t + v % 2) + c). The 36 class blocks on and above the diagonal are the 20 tiles with c
// >= 2r (the half (2r + 1, 2r) of tile (r, 2r) lies below it and is not written). Two roles of warp
// take 10 tiles each: role 0 the row tiles 0 and 3 (and the column sums), role 1 the row tiles 1
// and 2; 40 accumulators a lane, where gram_products_sym_kernel has 72. Block (slice, key head) of
// 4 warps: warp w has role w % 2 and takes every other step of the slice from step w / 2, 16 keys
// loaded ahead of the step in use (8 with the key records; the two warps of a step load the same
// keys, the second from L1); the second half's sums are added into the first's through shared
// memory, then the slices' in slice order (gram_slices_sum): the same keys give the same bits, not
// those of the kernels above.
static const int kGramDmmaWarps = 4;
static const int kGramDmmaTiles = 10;  // a role's
static const int kGramDmmaAheadKeys = 16;
// ./train_candidates' K (dev_telemetry times K = 4, 8 and 16): of the two that hold 3 blocks an SM
// (16: 2), the one of fewer instructions.
static const int kGramDmmaK = 8;

// Blocks an SM: three at K = 4 and 8 (168 registers a lane: one value spilled without the key
// records, none with them), two at 16 (218-232 registers; at 168 ptxas spills 464 bytes). The
// forms' spills move with small changes of the code: ptxas -v says.
__host__ __device__ constexpr int gram_dmma_blocks_per_sm(int K) { return K == 16 ? 2 : 3; }

// Role ROLE's tile i: row tile gram_dmma_r, column class gram_dmma_c.
__host__ __device__ constexpr int gram_dmma_r(int role, int i) { return i < 8 - 2 * role ? role : 3 - role; }
__host__ __device__ constexpr int gram_dmma_c(int role, int i) {
    return i < 8 - 2 * role ? 2 * role + i : 2 * (3 - role) + i - (8 - 2 * role);
}

// The candidate gram_key_records: the key heads' records (telemetry_sums.h's HeadSum) taken by the
// kernel below from the keys it reads for the Gram products, where head_row_stats_vec_kernel reads
// them again. A key's 64 columns lie in the 8 lanes of its t (lanes t, t + 4, .., 8 columns each):
// its sum of squares, of fourth powers and its largest |x| reduce over them by shuffles across g
// (a butterfly: each of the 8 gets the same bits), so each holds the key's norm and participation
// ratio, and adds its 8 columns of the unit vector x / ||x||. A lane's sums, float32 as in the
// records' kernel, over its keys of a slice (about 40 at d22); of a key past the slice's end,
// nothing.
struct KeyRecordSums {
    float norm = 0.0f, maxabs = 0.0f, pr = 0.0f, unit[8] = {};
};
__device__ __forceinline__ void key_record_add(KeyRecordSums& r, const float4& lo, const float4& hi, bool valid) {
    const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float sq = 0.0f, quad = 0.0f, mx = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float x2 = __fmul_rn(x[j], x[j]);
        sq += x2;
        quad += x2 * x2;
        mx = fmaxf(mx, fabsf(x[j]));
    }
#pragma unroll
    for (int lanes = 4; lanes < 32; lanes *= 2) {
        sq += __shfl_xor_sync(0xffffffffu, sq, lanes);
        quad += __shfl_xor_sync(0xffffffffu, quad, lanes);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, lanes));
    }
    if (!valid) return;
    const float norm = sqrtf(sq);
    r.norm += norm;
    r.maxabs += mx;
    r.pr += (float)participation_ratio(sq, quad);
    if (norm > 0.0f) {
        const float inverse = 1.0f / norm;
#pragma unroll
        for (int j = 0; j < 8; j++) r.unit[j] += x[j] * inverse;
    }
}

// Where gram_products_dmma_kernel reads key head h's keys: the float32 keys qk_normed [N, NH, D] the
// QK-norm forward wrote (./train's, and the candidate's by default), or (the candidate
// gram_from_projection) the key projections in qkv [N, QKV] (bf16), their rstd [N, NH] and the
// layer's k gain (bf16), from which it computes the same float32 keys as the QK-norm forward
// (rmsnorm_out of the same inputs: the same bits), so that the forward need not write them.
struct GramKeys {
    const float* normed = nullptr;
    const bf16* qkv = nullptr;
    const float* rstd = nullptr;
    const bf16* gain = nullptr;
};
// A lane's source of columns 8g .. 8g + 7 of a key: load() issues the reads into raw (zeros for a
// key past the slice's end), values() makes the 8 floats of them when they are used. (The loads'
// forms are those ptxas allocates best: others spilled 20-32 bytes at K = 8.)
struct NormedKeyColumns {
    struct Raw {
        float4 lo, hi;
    };
    const float* columns;  // key 0's columns 8g ..
    size_t stride;         // from one key to the next
    __device__ void load(Raw& raw, int key, bool valid) const {
        const float4* p = reinterpret_cast<const float4*>(columns + (size_t)(valid ? key : 0) * stride);
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f), lo = p[0], hi = p[1];
        raw.lo = valid ? lo : zero;
        raw.hi = valid ? hi : zero;
    }
    __device__ void values(const Raw& raw, float4& lo, float4& hi) const { lo = raw.lo, hi = raw.hi; }
};
struct ProjectedKeyColumns {
    struct Raw {
        uint4 x;  // 8 bf16
        float r;
    };
    const bf16* columns;  // key 0's projection, columns 8g ..
    size_t stride;        // QKV
    const float* rstd;    // key 0's
    int rstd_stride;      // NH
    float gain[8];
    __device__ void load(Raw& raw, int key, bool valid) const {
        const uint4 x = *reinterpret_cast<const uint4*>(columns + (size_t)(valid ? key : 0) * stride);
        const float r = rstd[(size_t)(valid ? key : 0) * rstd_stride];
        raw = Raw{valid ? x : make_uint4(0, 0, 0, 0), valid ? r : 0.0f};
    }
    __device__ void values(const Raw& raw, float4& lo, float4& hi) const {
        float x[8], y[8];
        bf16x8_to_float(raw.x, x);
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = rmsnorm_out(x[j], raw.r, gain[j]);  // qk_norm_rope_group's
        lo = make_float4(y[0], y[1], y[2], y[3]);
        hi = make_float4(y[4], y[5], y[6], y[7]);
    }
};

// A warp of role ROLE over its steps of keys [n0, end), n0 += 2 K, read through `keys` (a
// NormedKeyColumns or ProjectedKeyColumns): its tiles into acc and, for role 0, the sums of its
// lane's columns (over its keys) into column; for role 1 with RECORDS, the keys' records into
// records.
template <int K, int ROLE, bool RECORDS, typename Keys>
__device__ __forceinline__ void gram_dmma_steps(double (&acc)[kGramDmmaTiles][4], double (&column)[8],
                                                KeyRecordSums& records, const Keys& keys, int n0, int end, int t) {
    // a lane's keys a step; the steps loaded ahead, half as many keys with RECORDS (with 16 keys
    // ahead ptxas spills 80 bytes at K = 8, 12 at K = 4)
    constexpr int U = K / 4, AHEAD_KEYS = RECORDS ? kGramDmmaAheadKeys / 2 : kGramDmmaAheadKeys;
    constexpr int AHEAD = AHEAD_KEYS > K ? AHEAD_KEYS / K : 1;
    // Columns 8g .. 8g + 7 of the lane's keys of the step from n, zeros at or beyond the slice's end
    // (the load always runs, key 0's there, so that no branch stands before the warp's mma.sync).
    using Raw = typename Keys::Raw;
    auto load = [&](int n, Raw (&raw)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) keys.load(raw[u], n + t + 4 * u, n + t + 4 * u < end);
    };
    Raw ahead[AHEAD][U];
#pragma unroll
    for (int s = 0; s < AHEAD; s++) load(n0 + s * 2 * K, ahead[s]);
    for (; n0 < end; n0 += 2 * K) {
        float4 step[U][2];  // this step's keys; the next load issued before any other work on them
#pragma unroll
        for (int u = 0; u < U; u++) keys.values(ahead[0][u], step[u][0], step[u][1]);
#pragma unroll
        for (int s = 0; s + 1 < AHEAD; s++)
#pragma unroll
            for (int u = 0; u < U; u++) ahead[s][u] = ahead[s + 1][u];
        load(n0 + AHEAD * 2 * K, ahead[AHEAD - 1]);
        if (RECORDS && ROLE == 1)
#pragma unroll
            for (int u = 0; u < U; u++) key_record_add(records, step[u][0], step[u][1], n0 + t + 4 * u < end);
        double x[U][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const float4 lo = step[u][0], hi = step[u][1];
            const double values[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int j = 0; j < 8; j++) x[u][j] = values[j];
        }
        if (ROLE == 0)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int j = 0; j < 8; j++) column[j] += x[u][j];
#pragma unroll
        for (int i = 0; i < kGramDmmaTiles; i++) {
            const int r = gram_dmma_r(ROLE, i), c = gram_dmma_c(ROLE, i);
            double a[K / 2], b[K / 4];
#pragma unroll
            for (int v = 0; v < K / 2; v++) a[v] = x[v / 2][2 * r + v % 2];
#pragma unroll
            for (int v = 0; v < K / 4; v++) b[v] = x[v][c];
            mma_f64_16x8<K>(acc[i], a, b);
        }
    }
}

// Role ROLE's tiles (and for role 0 the column sums and the count) into the block's W x W matrix.
template <int ROLE>
__device__ __forceinline__ void gram_dmma_write(double* out, const double (&acc)[kGramDmmaTiles][4],
                                                const double (&column)[8], int g, int t, int count) {
    constexpr int D = 64, W = D + 1;
#pragma unroll
    for (int i = 0; i < kGramDmmaTiles; i++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int row_class = 2 * gram_dmma_r(ROLE, i) + v / 2, column_class = gram_dmma_c(ROLE, i);
            if (row_class > column_class) continue;  // below the diagonal: its mirror is another tile's
            const int r = 8 * g + row_class, c = 8 * (2 * t + v % 2) + column_class;
            out[(size_t)r * W + c] = acc[i][v];
            if (row_class != column_class) out[(size_t)c * W + r] = acc[i][v];
        }
    if (ROLE == 0 && t == 0)
#pragma unroll
        for (int j = 0; j < 8; j++) out[(size_t)(8 * g + j) * W + D] = out[(size_t)D * W + 8 * g + j] = column[j];
    if (ROLE == 0 && g == 0 && t == 0) out[(size_t)D * W + D] = (double)count;
}

// RECORDS (the candidate gram_key_records): role 1 also takes the key records (KeyRecordSums), its
// lanes' sums added over t in double, the second half's into the first's, and writes them as the
// slice's record, records [key head][slice][head_record_size(64)].
// FROM_PROJECTION (the candidate gram_from_projection): the keys from GramKeys' projections, not
// its float32 keys.
template <int K, bool RECORDS, bool FROM_PROJECTION>
__global__ void __launch_bounds__(kGramDmmaWarps * 32, gram_dmma_blocks_per_sm(K))
    gram_products_dmma_kernel(double* partial, double* records, GramKeys source, int N, int H, int Hkv, int slices) {
    constexpr int D = 64, W = D + 1;
    __shared__ double tile_sums[2][kGramDmmaTiles * 4][32];  // the second half's, by role
    __shared__ double column_sums[8][8];                    // [g][j], role 0's second half
    __shared__ double record_sums[KS_UNIT + D];             // role 1's second half (RECORDS)
    const int h = blockIdx.y, slice = blockIdx.x, rows = (N + slices - 1) / slices;
    const int first = min(N, slice * rows), end = min(N, first + rows);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int role = warp % 2, half = warp / 2;
    const int NH = H + Hkv, QKV = (H + 2 * Hkv) * D;

    double acc[kGramDmmaTiles][4] = {};
    double column[8] = {};  // role 0: its columns' sums; role 1 with RECORDS: its columns' unit-vector sums
    KeyRecordSums rec;
    auto steps = [&](const auto& keys) {
        if (role == 0) gram_dmma_steps<K, 0, RECORDS>(acc, column, rec, keys, first + half * K, end, t);
        else gram_dmma_steps<K, 1, RECORDS>(acc, column, rec, keys, first + half * K, end, t);
    };
    if constexpr (FROM_PROJECTION) {
        ProjectedKeyColumns keys{source.qkv + (size_t)(H + h) * D + 8 * g, (size_t)QKV, source.rstd + H + h, NH, {}};
        bf16x8_to_float(*reinterpret_cast<const uint4*>(source.gain + 8 * g), keys.gain);
        steps(keys);
    } else {
        steps(NormedKeyColumns{source.normed + (size_t)(H + h) * D + 8 * g, (size_t)NH * D});
    }
    double row_sums[3] = {rec.norm, rec.maxabs, rec.pr};  // role 1 with RECORDS: the sums over its keys
    if (RECORDS && role == 1)
#pragma unroll
        for (int j = 0; j < 8; j++) column[j] = rec.unit[j];
    if (role == 0 || RECORDS)  // over t: the lanes of a g hold the same columns of other keys
#pragma unroll
        for (int j = 0; j < 8; j++) {
            column[j] += __shfl_xor_sync(0xffffffffu, column[j], 1);
            column[j] += __shfl_xor_sync(0xffffffffu, column[j], 2);
        }
    if (RECORDS && role == 1)
#pragma unroll
        for (int i = 0; i < 3; i++) {
            row_sums[i] += __shfl_xor_sync(0xffffffffu, row_sums[i], 1);
            row_sums[i] += __shfl_xor_sync(0xffffffffu, row_sums[i], 2);
        }
    if (half == 1) {
#pragma unroll
        for (int i = 0; i < kGramDmmaTiles; i++)
#pragma unroll
            for (int v = 0; v < 4; v++) tile_sums[role][i * 4 + v][lane] = acc[i][v];
        if (role == 0 && t == 0)
#pragma unroll
            for (int j = 0; j < 8; j++) column_sums[g][j] = column[j];
        if (RECORDS && role == 1 && t == 0) {
#pragma unroll
            for (int j = 0; j < 8; j++) record_sums[KS_UNIT + 8 * g + j] = column[j];
            if (g == 0)
#pragma unroll
                for (int i = 0; i < 3; i++) record_sums[i] = row_sums[i];
        }
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int i = 0; i < kGramDmmaTiles; i++)
#pragma unroll
        for (int v = 0; v < 4; v++) acc[i][v] += tile_sums[role][i * 4 + v][lane];
    if (role == 0)
#pragma unroll
        for (int j = 0; j < 8; j++) column[j] += column_sums[g][j];

    double* out = partial + ((size_t)h * slices + slice) * W * W;  // row-major W x W (symmetric)
    if (role == 0) {
        gram_dmma_write<0>(out, acc, column, g, t, end - first);
        return;
    }
    gram_dmma_write<1>(out, acc, column, g, t, end - first);
    if (RECORDS && t == 0) {  // the slice's record: [HeadSum]
        double* record = records + ((size_t)h * slices + slice) * (KS_UNIT + D);
#pragma unroll
        for (int j = 0; j < 8; j++) record[KS_UNIT + 8 * g + j] = column[j] + record_sums[KS_UNIT + 8 * g + j];
        if (g == 0)
#pragma unroll
            for (int i = 0; i < 3; i++) record[i] = row_sums[i] + record_sums[i];
    }
}

// Slices of at least 64 keys, as many as the blocks of one wave on the 132 SMs of an H100 or H200
// allow (at the blocks an SM the kernel's registers allow), at most kGramMmaSlices (the scratch's
// room): a count that depends on the shape alone, so that any device gives the same bits. d22: 49
// slices at K = 4 and 8 (392 blocks of 396), 33 at 16 (264).
inline int gram_dmma_slices(int N, int Hkv, int K) {
    return std::max(1, std::min({kGramMmaSlices, N / 64, 132 * gram_dmma_blocks_per_sm(K) / Hkv}));
}

// Whether this build runs gram_products_dmma_kernel on the device in use (its code for sm_90 or
// later).
inline bool gram_dmma_compiled() { return device_code().arch >= 900; }

// Whether gram_products_dmma takes these keys: D = 64, their arrays 16-byte aligned (the rstd aside),
// and the build has sm_90 code for the device.
inline bool gram_dmma_applies(int D, const GramKeys& keys) {
    return D == 64 && aligned_16({keys.normed, keys.qkv, keys.gain}) && gram_dmma_compiled();
}

// As gram_products_sym, with gram_products_dmma_kernel<K> (K = 4, 8 or 16); false, with nothing
// done, where gram_dmma_applies does not. key_records, where given (the candidate
// gram_key_records): the key heads' records (telemetry_sums.h's key_sums of the layer) added to as
// well, the slices' records in partial after their Gram matrices (telemetry_partial_floats has room).
inline bool gram_products_dmma(double* gram_sums, double* partial, const GramKeys& keys, int N, int H, int Hkv, int D,
                               cudaStream_t s, int K, double* key_records = nullptr) {
    if (!gram_dmma_applies(D, keys)) return false;
    const int slices = gram_dmma_slices(N, Hkv, K), W = D + 1;
    double* records = partial + (size_t)Hkv * slices * W * W;
    const bool projection = keys.qkv != nullptr;
    if (projection ? !keys.rstd || !keys.gain : !keys.normed) fail("internal: gram_products_dmma has no keys to read");
    auto launch = [&](auto width) {
        constexpr int KW = decltype(width)::value;
        auto kernel = projection ? (key_records ? gram_products_dmma_kernel<KW, true, true>
                                                : gram_products_dmma_kernel<KW, false, true>)
                                 : (key_records ? gram_products_dmma_kernel<KW, true, false>
                                                : gram_products_dmma_kernel<KW, false, false>);
        kernel<<<dim3(slices, Hkv), kGramDmmaWarps * 32, 0, s>>>(partial, records, keys, N, H, Hkv, slices);
        cuda_check_launch();
    };
    if (K == 4) launch(std::integral_constant<int, 4>());
    else if (K == 8) launch(std::integral_constant<int, 8>());
    else if (K == 16) launch(std::integral_constant<int, 16>());
    else fail("internal: the float64 tensor cores' products take K = 4, 8 or 16, not %d", K);
    gram_slices_sum(gram_sums, partial, Hkv, slices, W * W, s);
    if (key_records) gram_slices_sum(key_records, records, Hkv, slices, head_record_size(D), s);
    return true;
}

// As gram_products; partial: gram_split_doubles(Hkv, W) doubles. The slices of every head follow
// each other in keys_f64, so product b = h * slices + s reads slice s of head h.
inline void gram_products_split(double* gram_sums, double* partial, const double* keys_f64, Matmul& mm, int N, int Hkv,
                                int W, cudaStream_t s) {
    int slices = gram_slices(N), rows = N / slices;
    const double one = 1.0, zero = 0.0;
    cublasCheck(cublasSetStream(mm.blas, s));
    cublasCheck(cublasDgemmStridedBatched(mm.blas, CUBLAS_OP_N, CUBLAS_OP_T, W, W, rows, &one, keys_f64, W,
                                          (long long)rows * W, keys_f64, W, (long long)rows * W, &zero, partial, W,
                                          (long long)W * W, Hkv * slices));
    gram_slices_sum(gram_sums, partial, Hkv, slices, W * W, s);
}

// The three parts of a layer's statistics (telemetry_layer runs them in this order; dev/cuda/telemetry.cu
// times each). qk_normed [N, NH, D] is post-norm, pre-RoPE, float32.
//
// The per-head records (norms; for keys largest component, participation ratio, unit-vector sums):
// partial takes the blocks' records. `vec` takes head_row_stats_vec_kernel where it applies.
// `keys` false: the query heads' alone (the Gram products take the keys', gram_key_records).
inline void head_statistics(double* sums, const TelemetrySums& lay, float* partial, const float* qk_normed, int N,
                            const ModelConfig& c, int layer, cudaStream_t s, bool vec = true, bool query_norms = false,
                            bool keys = true) {
    int H = c.n_head, NH = H + c.n_kv_head, D = c.head_dim, chunks = ceil_div(N, kStatRowsPerBlock);
    const int heads = keys ? NH : H;  // the first `heads`
    if (N > kStatMaxTokens) fail("internal: %d tokens in a micro-batch is more than the statistics take", N);
    const int threads = kStatWarps * 32;
    if (query_norms && !(vec && head_row_stats_vec_supports(D, qk_normed)))
        fail("internal: the queries' norms from the forward pass need the vectorised heads' records");
    if (vec && head_row_stats_vec_supports(D, qk_normed)) {
        size_t smem = (size_t)(threads / (D / 4)) * head_record_size(D) * sizeof(float);
        auto launch = [&](auto kernel) {
            kernel<<<dim3(heads, chunks), threads, smem, s>>>(partial, qk_normed, N, H, NH);
        };
        if (D == 64) launch(query_norms ? head_row_stats_vec_kernel<64, true> : head_row_stats_vec_kernel<64>);
        else launch(query_norms ? head_row_stats_vec_kernel<128, true> : head_row_stats_vec_kernel<128>);
    } else {
        size_t smem = (size_t)kStatWarps * head_record_size(D) * sizeof(float);
        head_row_stats_kernel<<<dim3(heads, chunks), threads, smem, s>>>(partial, qk_normed, N, H, NH, D);
    }
    cuda_check_launch();
    head_stats_finish_kernel<<<heads, 32, 0, s>>>(sums, lay, partial, chunks, H, D, layer);
    cuda_check_launch();
}

// The attention's row statistics (row_stats from the forward pass) summed per query head. `split`
// takes the kernels that sum them from many blocks, with partial (free once head_statistics is
// done) for its records.
inline void attention_statistics(double* sums, const TelemetrySums& lay, float* partial, const float* row_stats, int B,
                                 int T, const ModelConfig& c, int layer, cudaStream_t s, bool split = true) {
    if (!split) {
        attention_stats_finish_kernel<<<c.n_head, 256, 0, s>>>(sums, lay, row_stats, B, T, c.n_head, layer);
        cuda_check_launch();
        return;
    }
    const int chunks = attention_stat_chunks(B, T);
    attention_row_sums_kernel<<<dim3(c.n_head, chunks), 256, 0, s>>>(partial, row_stats, B, T, c.n_head);
    cuda_check_launch();
    attention_row_sums_finish_kernel<<<ceil_div(c.n_head, 64), 64, 0, s>>>(sums, lay, partial, chunks, c.n_head, layer);
    cuda_check_launch();
}

// The augmented Gram matrices, one per key head, added to. At D = 64 the float64 tensor-core
// products straight from the float32 keys, with partial (once head_statistics is done with it) as
// their scratch: 3.0x faster than the copy and DGEMM on an H100 at d22 (0.066 against 0.200 ms a
// layer). Other widths copy the keys into keys_f64 (Hkv * N * (D+1) doubles) for cuBLAS's DGEMM;
// dev_telemetry checks and times the products split over slices beside it. `sym` takes
// gram_products_sym where it applies (0.047 against gram_products_mma's 0.063 ms a d22 layer at
// 8 x 2048 on an H200). dmma_k, where not 0, takes gram_products_dmma with that K (the candidate
// gram_dmma) where it applies, and with key_records the key heads' records too (gram_key_records:
// the caller's head_statistics left them out, which it may only where gram_dmma_applies);
// `projection`, where given, the keys' projections it reads in place of qk_normed's keys
// (gram_from_projection: the forward wrote none, which it may only where gram_dmma_applies).
inline void key_gram(double* sums, const TelemetrySums& lay, float* partial, double* keys_f64, Matmul& mm,
                     const float* qk_normed, int N, const ModelConfig& c, int layer, cudaStream_t s,
                     bool sym = true, int dmma_k = 0, bool key_records = false, const GramKeys* projection = nullptr) {
    int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, W = D + 1;
    double* gram = sums + lay.gram(layer, 0);
    double* records = key_records ? sums + lay.key(layer, 0) : nullptr;
    const GramKeys keys = projection ? *projection : GramKeys{qk_normed};
    if (dmma_k && gram_products_dmma(gram, reinterpret_cast<double*>(partial), keys, N, H, Hkv, D, s, dmma_k, records))
        return;
    if (key_records || projection)
        fail("internal: the key heads' records or the keys from their projections need the Gram products of gram_dmma");
    if (sym && gram_products_sym(gram, reinterpret_cast<double*>(partial), qk_normed, N, H, Hkv, D, s)) return;
    if (D == 64) {
        gram_products_mma(gram, reinterpret_cast<double*>(partial), qk_normed, N, H, Hkv, D, s);
        return;
    }
    keys_to_f64(keys_f64, qk_normed, N, H, Hkv, D, s);
    gram_products(gram, keys_f64, mm, N, Hkv, W, s);
}

// The sums of one layer's statistics added into `sums` (device). qk_normed [N, NH, D] (post-norm,
// pre-RoPE, float32), row_stats from the attention forward pass, g_q and g_k the layer's float
// gains; partial and keys_f64 are scratch (telemetry_partial_floats, Hkv * N * (D+1) doubles).
// mark(label), where given, is called before each part with its name (./train's --profile 2 times
// them apart). `ways`: the candidates' kernels.
struct TelemetryWays {
    bool query_norms = false;         // the query heads' rows of qk_normed hold only their norms
                                      // (head_row_stats_vec_kernel's QUERY_NORMS)
    int gram_dmma_k = 0;              // key_gram's dmma_k (gram_dmma)
    bool gram_key_records = false;    // the key heads' records from the Gram products where they apply
    // gram_from_projection: the layer's qkv, qk_rstd and k gain (GramKeys, normed unused), where the
    // key heads' rows of qk_normed were not written (qkv null: they were); with gram_dmma and
    // gram_key_records, where they apply (gram_from_projection_applies)
    GramKeys projection;
};
// Whether the keys may come from their projections: the Gram products of gram_dmma, with the key
// records, apply to them (the float32 keys' buffer qk_normed, 16-byte aligned, aside).
inline bool gram_from_projection_applies(const TelemetryWays& ways, int D, const float* qk_normed) {
    return ways.gram_dmma_k && ways.gram_key_records && ways.projection.qkv &&
           gram_dmma_applies(D, {qk_normed, ways.projection.qkv, ways.projection.rstd, ways.projection.gain});
}
inline void telemetry_layer(double* sums, const TelemetrySums& lay, float* partial, double* keys_f64,
                            Matmul& mm, const float* qk_normed, const float* row_stats, const float* g_q,
                            const float* g_k, int B, int T, const ModelConfig& c, int layer, cudaStream_t s,
                            const std::function<void(const char*)>& mark = {}, const TelemetryWays& ways = {}) {
    int N = B * T;
    auto part = [&](const char* label) { if (mark) mark(label); };
    const bool records_in_gram =
        ways.gram_key_records && ways.gram_dmma_k && gram_dmma_applies(c.head_dim, GramKeys{qk_normed});
    if (ways.projection.qkv && !gram_from_projection_applies(ways, c.head_dim, qk_normed))
        fail("internal: the keys from their projections where the Gram products of gram_dmma do not apply");
    part("statistics: the heads' norms, components, unit vectors");
    head_statistics(sums, lay, partial, qk_normed, N, c, layer, s, true, ways.query_norms, !records_in_gram);
    part("statistics: each attention row's, summed per head");
    attention_statistics(sums, lay, partial, row_stats, B, T, c, layer, s);
    part("statistics: the keys' Gram matrices");
    key_gram(sums, lay, partial, keys_f64, mm, qk_normed, N, c, layer, s, true, ways.gram_dmma_k, records_in_gram,
             ways.projection.qkv ? &ways.projection : nullptr);
    part("statistics: the gains");
    gains_to_sums_kernel<<<1, 128, 0, s>>>(sums, lay, g_q, g_k, c.head_dim, layer);
    cuda_check_launch();
}
