// Matrix products through cuBLASLt: bf16 inputs, float32 accumulation, bf16 or float32 output.
//
// The model stores matrices row-major (a weight W is [out, in]); cuBLAS is column-major. A
// row-major [R, K] array is the column-major [K, R] array with the same bytes, so every product
// below is written for cuBLAS as the transposed product: out = inp @ W^T (row-major) is
// out^T = W @ inp^T, i.e. column-major D[OC, N] = op_T(W as [IC, OC]) x inp as [IC, N].
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <map>
#include <array>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>
#include "cuda_common.cuh"

#define cublasCheck(x) cublas_check((x), __FILE__, __LINE__)
inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: status %d at %s:%d", (int)status, file, line);  // as cuda_check
}

// Everything the choice of algorithm depends on: shape, operations, strides, types, pointer alignments.
typedef std::array<int, 15> MatmulKey;

struct Matmul {
    cublasLtHandle_t handle = nullptr;
    cublasHandle_t blas = nullptr;  // classic cuBLAS, for the float64 products of the telemetry
    void* workspace = nullptr;
    size_t workspace_bytes = 32u << 20;
    // The heuristic's choice for each problem shape, asked once: the same shape then always runs
    // the same algorithm, which keeps results bit-identical from step to step.
    std::map<MatmulKey, cublasLtMatmulHeuristicResult_t> algos;
    // ./train sets it: each shape's algorithm tuned once among those that give the heuristic's first
    // choice's bits (matmul_tune); what that did.
    bool tune = false;
    int tuned = 0, tuned_other = 0;           // products tuned, of them on another algorithm than the first
    int tuned_refused = 0;                    // tuned algorithms the real problem refused (the first choice runs)
    double tuned_first_ms = 0, tuned_ms = 0;  // their times with the first choice, with the chosen one
};

// The largest power of two, up to 256, that divides the address.
inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

inline void matmul_init(Matmul& mm) {
    cublasCheck(cublasLtCreate(&mm.handle));
    cublasCheck(cublasCreate(&mm.blas));
    cublasCheck(cublasSetMathMode(mm.blas, CUBLAS_PEDANTIC_MATH));  // exact float64, the same bits every run
    cudaCheck(cudaMalloc(&mm.workspace, mm.workspace_bytes));
}

inline void matmul_free(Matmul& mm) {
    cudaCheck(cudaFree(mm.workspace));
    cublasCheck(cublasLtDestroy(mm.handle));
    cublasCheck(cublasDestroy(mm.blas));
}

// One product: column-major D[m, n] = op(A) op(B) (+ C when c != nullptr; C and D may differ),
// batched over `batch` problems `stride_*` elements apart. A, B are bf16; C and D are bf16 or float
// (d_fp32). When c is d, the product is added to what D holds.
struct MatmulProblem {
    void* d;
    const __nv_bfloat16* a;
    const __nv_bfloat16* b;
    const void* c;
    int m, n, k;
    bool trans_a, trans_b;
    int lda, ldb, ldd;
    bool d_fp32;
    int batch = 1;
    long long stride_a = 0, stride_b = 0, stride_d = 0;
};

// A problem's cuBLASLt descriptors, and the key its algorithm is kept under.
struct MatmulDescs {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    MatmulKey key;
};

inline MatmulDescs matmul_describe(const MatmulProblem& p) {
    MatmulDescs md;
    cublasCheck(cublasLtMatmulDescCreate(&md.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(md.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(md.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cudaDataType_t dtype = p.d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasCheck(cublasLtMatrixLayoutCreate(&md.a, CUDA_R_16BF, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&md.b, CUDA_R_16BF, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&md.c, dtype, p.m, p.n, p.ldd));
    cublasCheck(cublasLtMatrixLayoutCreate(&md.d, dtype, p.m, p.n, p.ldd));
    if (p.batch > 1) {
        cublasLtMatrixLayout_t layouts[4] = {md.a, md.b, md.c, md.d};
        long long strides[4] = {p.stride_a, p.stride_b, p.stride_d, p.stride_d};
        for (int i = 0; i < 4; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &p.batch,
                                                         sizeof p.batch));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof strides[i]));
        }
    }
    // The heuristic assumes 256-byte aligned pointers unless told otherwise, and an algorithm chosen
    // under that assumption refuses a less aligned pointer. So the key includes the alignments.
    uint32_t align_d = pointer_alignment(p.d), align_c = p.c ? pointer_alignment(p.c) : align_d;
    md.key = {p.m, p.n, p.k, (int)p.trans_a, (int)p.trans_b, p.lda, p.ldb, p.ldd, (int)p.d_fp32, p.c != nullptr, p.batch,
              (int)pointer_alignment(p.a), (int)pointer_alignment(p.b), (int)align_c, (int)align_d};
    return md;
}

inline void matmul_release(MatmulDescs& md) {
    cublasCheck(cublasLtMatmulDescDestroy(md.desc));
    for (cublasLtMatrixLayout_t layout : {md.a, md.b, md.c, md.d}) cublasCheck(cublasLtMatrixLayoutDestroy(layout));
}

// Up to `count` algorithms cuBLASLt's heuristic offers for the problem within the workspace, its
// first choice first (none: an empty list).
inline std::vector<cublasLtMatmulHeuristicResult_t> matmul_heuristics(Matmul& mm, const MatmulDescs& md, int count) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &mm.workspace_bytes,
                                                     sizeof mm.workspace_bytes));
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        uint32_t align = (uint32_t)md.key[11 + i];
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align, sizeof align));
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(count);
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(mm.handle, md.desc, md.a, md.b, md.c, md.d, pref, count,
                                                           results.data(), &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    results.resize(status == CUBLAS_STATUS_SUCCESS ? found : 0);
    std::vector<cublasLtMatmulHeuristicResult_t> usable;
    for (const cublasLtMatmulHeuristicResult_t& r : results)
        if (r.state == CUBLAS_STATUS_SUCCESS) usable.push_back(r);
    return usable;
}

// The product with the given algorithm; cuBLASLt's status, a refusal leaving no CUDA error behind
// for the next launch's check. workspace: mm's when null; another of the same size for a product
// on a stream beside the one mm's serves (two products at once cannot share one).
inline cublasStatus_t matmul_try(Matmul& mm, const MatmulProblem& p, const MatmulDescs& md, const cublasLtMatmulAlgo_t& algo,
                                 cudaStream_t stream, void* workspace = nullptr) {
    float alpha = 1.0f, beta = p.c ? 1.0f : 0.0f;
    cublasStatus_t status = cublasLtMatmul(mm.handle, md.desc, &alpha, p.a, md.a, p.b, md.b, &beta, p.c ? p.c : p.d, md.c,
                                           p.d, md.d, &algo, workspace ? workspace : mm.workspace, mm.workspace_bytes,
                                           stream);
    if (status != CUBLAS_STATUS_SUCCESS) cudaGetLastError();
    return status;
}

inline void matmul_run(Matmul& mm, const MatmulProblem& p, const MatmulDescs& md, const cublasLtMatmulAlgo_t& algo,
                       cudaStream_t stream, void* workspace = nullptr) {
    cublasCheck(matmul_try(mm, p, md, algo, stream, workspace));
}

// -- The algorithm tuned among those that give the first choice's bits ----------------------------
//
// Algorithms that sum each output element in the same order give the same bits on every input. So
// matmul_tune tunes only products whose first choice does not split K, allows only algorithms that
// do not either (split-K number and reduction scheme: a split sums in another order), and of those
// only the ones that give the first choice's output bit for bit on
// two stand-in problems of the same shape, aliasing and pointer alignments (buffers of its own):
// one of hashed values in [-1, 1), and one where, besides, every output's sum starts with a term of
// 2^16 and ends with its negative, so that every addition in between rounds at 2^-7 and the result
// keeps all of those roundings: there two neighbouring additions taken in the other order change
// about one bf16 output in 170 (K = 512: dev/matmul_order.py), where the plain values show it in
// none of 20,000. The fastest that passes, if it takes at most kTuneMargin of the first choice's time, is
// kept for the shape; timings may pick another of them in another run, the bits are the same. Only
// products large enough to gain (matmul_tunable) are tuned. A refusal or a failed allocation leaves
// the first choice (also a refusal at the first real call); a fault (a sticky CUDA error) ends the
// run as anywhere else. dev_matmul checks every algorithm that passes against the first choice on
// data of its own.
static const int kTuneAlgorithms = 8;
static const double kTuneMargin = 0.97;  // another algorithm must take at most this share of the first's time
static const double kTuneMs = 1.0;       // each algorithm timed over about this many milliseconds of runs

inline bool matmul_tunable(const MatmulProblem& p) {
    double outputs = (double)p.m * p.n * p.batch;
    return outputs >= 65536.0 && outputs * p.k >= 1073741824.0;  // 2^16 outputs, 2^30 multiply-adds
}

// Elements a column-major `rows` x `cols` matrix with leading dimension ld spans, over `batch`
// matrices `stride` elements apart.
inline size_t layout_span(int rows, int cols, int ld, int batch, long long stride) {
    return (size_t)stride * (batch - 1) + (size_t)ld * (cols - 1) + rows;
}

// out[i] (bf16, or float when fp32) = a value in [-1, 1) hashed from i and the seed: a fixed
// pattern whose values use the whole bf16 mantissa.
__global__ void fill_pattern_kernel(void* out, size_t n, bool fp32, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float v = (float)(h & 0xffffu) / 32768.0f - 1.0f;
    if (fp32) ((float*)out)[i] = v;
    else ((__nv_bfloat16*)out)[i] = __float2bfloat16(v);
}

inline void fill_pattern(void* out, size_t n, bool fp32, uint32_t seed, cudaStream_t stream) {
    if (n == 0) return;
    fill_pattern_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, n, fp32, seed);
    cuda_check_launch();
}

// The cancelling stand-in's large terms: `count` vectors of K elements (the rows of op(A), or the
// columns of op(B)), `vector_stride` apart with their elements `k_stride` apart, in each of `batch`
// matrices `batch_stride` apart: element 0 of each set to `first`, element K - 1 to `last`.
__global__ void set_k_ends_kernel(__nv_bfloat16* mem, int count, int K, long long vector_stride, long long k_stride,
                                  int batch, long long batch_stride, float first, float last) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)count * batch) return;
    __nv_bfloat16* v = mem + (idx / count) * batch_stride + (idx % count) * vector_stride;
    v[0] = __float2bfloat16(first);
    v[(K - 1) * k_stride] = __float2bfloat16(last);
}

// *count += the number of 16-bit words in which a and b differ.
__global__ void count_differences_kernel(unsigned int* count, const uint16_t* a, const uint16_t* b, size_t n) {
    unsigned int local = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local += a[i] != b[i];
    if (local) atomicAdd(count, local);
}

// How an algorithm splits K: (split-K number, reduction scheme); split-K 0 when unknown.
inline std::pair<int32_t, uint32_t> algorithm_split(const cublasLtMatmulAlgo_t& algo) {
    int32_t split_k = 1;
    uint32_t reduction = 0;
    size_t written;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k, &written) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof reduction,
                                             &written) != CUBLAS_STATUS_SUCCESS)
        return {0, 0};
    return {split_k, reduction};
}

// An algorithm that passed, with its mean time on the stand-in.
struct SameBitsAlgorithm {
    int index;  // in the heuristic's list
    float ms;
};

// The stand-in of a problem: buffers of its own with the real pointers' alignments (see above).
struct MatmulStandIn {
    const MatmulProblem& p;
    const MatmulDescs& md;
    Matmul& mm;
    cudaStream_t stream;
    bool in_place;              // the product adds into its output (C is D), as the weight gradients
    size_t n[3], out_bytes;     // elements of a, b and the output's span
    void* mem[6] = {};          // a, b, c0 (C, or an in-place output's first values), ref, out, count
    char* at[6] = {};           // the same, moved to the real pointers' alignments
    cudaEvent_t start = nullptr, stop = nullptr;

    MatmulStandIn(Matmul& mm_, const MatmulProblem& p_, const MatmulDescs& md_, cudaStream_t s)
        : p(p_), md(md_), mm(mm_), stream(s), in_place(p_.c != nullptr && p_.c == p_.d) {
        n[0] = layout_span(p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda, p.batch, p.stride_a);
        n[1] = layout_span(p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb, p.batch, p.stride_b);
        n[2] = layout_span(p.m, p.n, p.ldd, p.batch, p.stride_d);
        out_bytes = n[2] * (p.d_fp32 ? sizeof(float) : sizeof(__nv_bfloat16));
    }
    MatmulStandIn(const MatmulStandIn&) = delete;  // it owns device memory
    MatmulStandIn& operator=(const MatmulStandIn&) = delete;
    ~MatmulStandIn() {
        cudaGetLastError();  // a failed allocation is not the next launch's error
        cudaStreamSynchronize(stream);
        for (cudaEvent_t e : {start, stop})
            if (e) cudaEventDestroy(e);
        for (void* m : mem)
            if (m) cudaFree(m);
    }
    // false when the memory is not there
    bool allocate() {
        const size_t bytes[6] = {n[0] * sizeof(__nv_bfloat16), n[1] * sizeof(__nv_bfloat16), p.c ? out_bytes : 0, out_bytes,
                                 out_bytes, sizeof(unsigned int)};
        // the key's alignments of a, b, c and d (matmul_describe); below 256 bytes, the address moved
        // by it is aligned to it and to no more
        const int align[6] = {md.key[11], md.key[12], md.key[13], md.key[14], md.key[14], 256};
        for (int i = 0; i < 6; i++) {
            if (bytes[i] == 0) continue;
            if (cudaMalloc(&mem[i], bytes[i] + 256) != cudaSuccess) return false;
            at[i] = (char*)mem[i] + (align[i] < 256 ? align[i] : 0);
        }
        return cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
    }
    // Inputs of the plain stand-in, or of the cancelling one.
    void fill(bool cancelling) {
        fill_pattern(at[0], n[0], false, 17u, stream);
        fill_pattern(at[1], n[1], false, 18u, stream);
        if (p.c) fill_pattern(at[2], n[2], p.d_fp32, 19u, stream);
        if (!cancelling || p.k < 2) return;
        int count_a = p.m, count_b = p.n;
        set_k_ends_kernel<<<ceil_div((long long)count_a * p.batch, 256), 256, 0, stream>>>(
            (__nv_bfloat16*)at[0], count_a, p.k, p.trans_a ? p.lda : 1, p.trans_a ? 1 : p.lda, p.batch, p.stride_a, 256.0f,
            -256.0f);
        set_k_ends_kernel<<<ceil_div((long long)count_b * p.batch, 256), 256, 0, stream>>>(
            (__nv_bfloat16*)at[1], count_b, p.k, p.trans_b ? 1 : p.ldb, p.trans_b ? p.ldb : 1, p.batch, p.stride_b, 256.0f,
            256.0f);
        cuda_check_launch();
    }
    // One product of algorithm `algo` into output `dst` (3: ref, 4: out), from its first values
    // when it adds into them.
    cublasStatus_t run(const cublasLtMatmulAlgo_t& algo, int dst, bool from_first_values = true) {
        if (in_place && from_first_values) cudaCheck(cudaMemcpyAsync(at[dst], at[2], out_bytes, cudaMemcpyDeviceToDevice, stream));
        MatmulProblem q = p;  // the same product on the stand-in's buffers
        q.a = (const __nv_bfloat16*)at[0];
        q.b = (const __nv_bfloat16*)at[1];
        q.c = in_place ? at[dst] : p.c ? at[2] : nullptr;
        q.d = at[dst];
        return matmul_try(mm, q, md, algo, stream);
    }
    // Whether out holds ref's bytes.
    bool out_is_ref() {
        unsigned int differ = 0;
        cudaCheck(cudaMemsetAsync(at[5], 0, sizeof differ, stream));
        count_differences_kernel<<<264, 256, 0, stream>>>((unsigned int*)at[5], (const uint16_t*)at[3],
                                                         (const uint16_t*)at[4], out_bytes / 2);
        cuda_check_launch();
        cudaCheck(cudaMemcpyAsync(&differ, at[5], sizeof differ, cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        return differ == 0;
    }
    // Mean milliseconds of `runs` products of the algorithm into out, after two untimed ones, all
    // queued without a wait between them (an in-place product keeps adding: its values do not matter
    // here).
    float time(const cublasLtMatmulAlgo_t& algo, int runs) {
        bool ran = true;
        for (int r = 0; r < 2; r++) ran = run(algo, 4, false) == CUBLAS_STATUS_SUCCESS && ran;
        cudaCheck(cudaEventRecord(start, stream));
        for (int r = 0; r < runs; r++) ran = run(algo, 4, false) == CUBLAS_STATUS_SUCCESS && ran;
        cudaCheck(cudaEventRecord(stop, stream));
        cudaCheck(cudaEventSynchronize(stop));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        return ran ? ms / runs : INFINITY;  // a refusal never the fastest
    }
};

// Whether the product is tuned among the heuristic's algorithms (first choice first): large enough
// (matmul_tunable), more than one offered, and a first choice that does not split K. Such a first
// choice adds the splits' sums at the end: the cancelling stand-in's large terms would then fall in
// the first and last splits only, and reorderings inside the others would show in almost no bf16
// output. Such products keep the first choice.
inline bool matmul_tunes(const MatmulProblem& p, const std::vector<cublasLtMatmulHeuristicResult_t>& algos) {
    return algos.size() >= 2 && matmul_tunable(p) && algorithm_split(algos[0].algo).first == 1;
}

// The heuristic's algorithms (its list, first choice first) that split K as the first choice does
// and give its bits on both stand-ins, with their times; the first choice first. Empty when the
// product is not tuned (matmul_tunes) or its stand-in could not run.
inline std::vector<SameBitsAlgorithm> matmul_same_bits_algorithms(Matmul& mm, const MatmulProblem& p,
                                                                  const MatmulDescs& md,
                                                                  const std::vector<cublasLtMatmulHeuristicResult_t>& algos,
                                                                  cudaStream_t stream) {
    std::vector<SameBitsAlgorithm> passed;
    if (!matmul_tunes(p, algos)) return passed;
    const std::pair<int32_t, uint32_t> first_split = algorithm_split(algos[0].algo);
    std::vector<int> candidates;
    for (size_t i = 1; i < algos.size(); i++)
        if (algorithm_split(algos[i].algo) == first_split) candidates.push_back((int)i);
    MatmulStandIn s(mm, p, md, stream);
    if (!s.allocate()) return passed;
    for (bool cancelling : {true, false}) {  // the plain one last: its inputs are the timings'
        s.fill(cancelling);
        cudaCheck(cudaMemsetAsync(s.at[3], 0, s.out_bytes, stream));  // the gaps between columns alike in both
        if (s.run(algos[0].algo, 3) != CUBLAS_STATUS_SUCCESS) return passed;
        std::vector<int> kept;
        for (int i : candidates) {
            cudaCheck(cudaMemsetAsync(s.at[4], 0, s.out_bytes, stream));  // nothing left of the one before
            if (s.run(algos[i].algo, 4) == CUBLAS_STATUS_SUCCESS && s.out_is_ref()) kept.push_back(i);
        }
        candidates = kept;
    }
    // Each timed over about kTuneMs; the first choice before and after the others, its faster time kept.
    float probe = s.time(algos[0].algo, 10);
    int runs = std::max(10, std::min(1000, (int)(kTuneMs / std::max(probe, 1e-3f))));
    passed.push_back({0, s.time(algos[0].algo, runs)});
    for (int i : candidates) passed.push_back({i, s.time(algos[i].algo, runs)});
    passed[0].ms = std::min(passed[0].ms, s.time(algos[0].algo, runs));
    return passed;
}

// The algorithm kept for the shape: the fastest that passed, if it takes at most kTuneMargin of the
// first choice's time; else the first choice. *first_ms and *kept_ms: their stand-in times (0 when
// the product was not tuned).
inline cublasLtMatmulHeuristicResult_t matmul_tune(Matmul& mm, const MatmulProblem& p, const MatmulDescs& md,
                                                   const std::vector<cublasLtMatmulHeuristicResult_t>& algos,
                                                   cudaStream_t stream, float* first_ms, float* kept_ms) {
    std::vector<SameBitsAlgorithm> passed = matmul_same_bits_algorithms(mm, p, md, algos, stream);
    *first_ms = *kept_ms = 0;
    if (passed.empty()) return algos[0];
    SameBitsAlgorithm best = passed[0];
    for (const SameBitsAlgorithm& a : passed)
        if (a.ms < best.ms) best = a;
    if (best.ms > kTuneMargin * passed[0].ms) best = passed[0];
    *first_ms = passed[0].ms;
    *kept_ms = best.ms;
    return algos[best.index];
}

// The product with the heuristic's first choice for its key (or, with mm.tune, matmul_tune's),
// asked once.
// workspace: as matmul_try's. A product given another workspace runs beside others, so its
// algorithm must have been chosen before (the tuning times products on mm's workspace, alone).
inline void matmul_lt(Matmul& mm, const MatmulProblem& p, cudaStream_t stream, void* workspace = nullptr) {
    MatmulDescs md = matmul_describe(p);
    auto it = mm.algos.find(md.key);
    if (it == mm.algos.end() && workspace)
        fail("cuBLASLt: a product beside another (m %d n %d k %d) whose algorithm was not chosen yet", p.m, p.n, p.k);
    if (it == mm.algos.end()) {
        std::vector<cublasLtMatmulHeuristicResult_t> found = matmul_heuristics(mm, md, mm.tune ? kTuneAlgorithms : 1);
        if (found.empty())
            fail("cuBLASLt has no algorithm for m %d n %d k %d, op(A) %c op(B) %c, lda %d ldb %d ldd %d, %s output%s, "
                 "batch %d", p.m, p.n, p.k, p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.lda, p.ldb, p.ldd,
                 p.d_fp32 ? "float" : "bf16", p.c ? " plus C" : "", p.batch);
        float first_ms = 0, kept_ms = 0;
        cublasLtMatmulHeuristicResult_t chosen = mm.tune ? matmul_tune(mm, p, md, found, stream, &first_ms, &kept_ms) : found[0];
        bool other = memcmp(&chosen.algo, &found[0].algo, sizeof chosen.algo) != 0;
        if (other) {
            // a tuned algorithm's first real call: should the real problem refuse it, the first choice
            if (matmul_try(mm, p, md, chosen.algo, stream) != CUBLAS_STATUS_SUCCESS) {
                mm.tuned_refused++;
                chosen = found[0];
                kept_ms = first_ms;
                other = false;
            }
        }
        if (first_ms > 0) {
            mm.tuned++;
            mm.tuned_other += other;
            mm.tuned_first_ms += first_ms;
            mm.tuned_ms += kept_ms;
        }
        it = mm.algos.emplace(md.key, chosen).first;
        if (other) {  // its first real call has run
            matmul_release(md);
            return;
        }
    }
    matmul_run(mm, p, md, it->second.algo, stream, workspace);
    matmul_release(md);
}

// What tuning did (nothing without mm.tune; in a data-parallel run, process 0's), for the end of a run.
inline void matmul_print_tuning(const Matmul& mm) {
    if (!mm.tune || g_fail_rank > 0) return;
    std::string refused = mm.tuned_refused ? strprintf("; %d refused at their first real call", mm.tuned_refused) : "";
    printf("cuBLASLt algorithms tuned: %d products (shapes and alignments), %d of them on another algorithm than the "
           "heuristic's first (with its bits); one call of each: %.3f ms -> %.3f ms%s\n", mm.tuned, mm.tuned_other,
           mm.tuned_first_ms, mm.tuned_ms, refused.c_str());
}

// The three products of a linear layer, row-major out[N, OC] = inp[N, IC] @ W[OC, IC]^T: as cuBLAS
// is column-major, each is written as the transposed product (see the top of this file).
inline MatmulProblem linear_forward_problem(__nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* W,
                                            const __nv_bfloat16* residual, int N, int IC, int OC, int ld_out = 0) {
    return {out, W, inp, residual, OC, N, IC, true, false, IC, IC, ld_out ? ld_out : OC, false};
}
inline MatmulProblem linear_dinp_problem(__nv_bfloat16* dinp, const __nv_bfloat16* dout, const __nv_bfloat16* W, int N,
                                         int IC, int OC, int ld_dout = 0) {
    return {dinp, W, dout, nullptr, IC, N, OC, false, false, IC, ld_dout ? ld_dout : OC, IC, false};
}
inline MatmulProblem linear_dweight_problem(float* dW, const __nv_bfloat16* dout, const __nv_bfloat16* inp, int N,
                                            int IC, int OC, int ld_dout = 0) {
    return {dW, inp, dout, dW, IC, OC, N, false, true, IC, ld_dout ? ld_dout : OC, IC, true};
}

// Row-major out[N, OC] = inp[N, IC] @ W[OC, IC]^T (+ residual[N, OC] when given: the residual add
// of a transformer block, fused into the product).
inline void matmul_forward(Matmul& mm, __nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* W,
                           const __nv_bfloat16* residual, int N, int IC, int OC, cudaStream_t stream, int ld_out = 0) {
    matmul_lt(mm, linear_forward_problem(out, inp, W, residual, N, IC, OC, ld_out), stream);
}

// Row-major dinp[N, IC] = dout[N, OC] @ W[OC, IC] and dW[OC, IC] += dout^T @ inp (float32 gradients).
inline void matmul_backward(Matmul& mm, __nv_bfloat16* dinp, float* dW, const __nv_bfloat16* dout,
                            const __nv_bfloat16* inp, const __nv_bfloat16* W, int N, int IC, int OC,
                            cudaStream_t stream, int ld_dout = 0) {
    matmul_lt(mm, linear_dinp_problem(dinp, dout, W, N, IC, OC, ld_dout), stream);
    matmul_lt(mm, linear_dweight_problem(dW, dout, inp, N, IC, OC, ld_dout), stream);
}
