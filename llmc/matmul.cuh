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
    return results;
}

inline void matmul_run(Matmul& mm, const MatmulProblem& p, const MatmulDescs& md, const cublasLtMatmulAlgo_t& algo,
                       cudaStream_t stream) {
    float alpha = 1.0f, beta = p.c ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(mm.handle, md.desc, &alpha, p.a, md.a, p.b, md.b, &beta, p.c ? p.c : p.d, md.c, p.d, md.d,
                               &algo, mm.workspace, mm.workspace_bytes, stream));
}

// The product with the heuristic's first choice for its key, asked once.
inline void matmul_lt(Matmul& mm, const MatmulProblem& p, cudaStream_t stream) {
    MatmulDescs md = matmul_describe(p);
    auto it = mm.algos.find(md.key);
    if (it == mm.algos.end()) {
        std::vector<cublasLtMatmulHeuristicResult_t> found = matmul_heuristics(mm, md, 1);
        if (found.empty())
            fail("cuBLASLt has no algorithm for m %d n %d k %d, op(A) %c op(B) %c, lda %d ldb %d ldd %d, %s output%s, "
                 "batch %d", p.m, p.n, p.k, p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.lda, p.ldb, p.ldd,
                 p.d_fp32 ? "float" : "bf16", p.c ? " plus C" : "", p.batch);
        it = mm.algos.emplace(md.key, found[0]).first;
    }
    matmul_run(mm, p, md, it->second.algo, stream);
    matmul_release(md);
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
