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

// Column-major D[m, n] = op(A) op(B) (+ C when c != nullptr; C and D may differ), batched over
// `batch` problems `stride_*` elements apart. A, B are bf16; C and D are bf16 or float (d_fp32).
// When accumulate is set, C is D and the product is added to what D holds.
inline void matmul_lt(Matmul& mm, void* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const void* c, int m,
                      int n, int k, bool trans_a, bool trans_b, int lda, int ldb, int ldd, bool d_fp32,
                      cudaStream_t stream, int batch = 1, long long stride_a = 0, long long stride_b = 0,
                      long long stride_d = 0) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cudaDataType_t dtype = d_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&lc, dtype, m, n, ldd));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, dtype, m, n, ldd));
    if (batch > 1) {
        cublasLtMatrixLayout_t layouts[4] = {la, lb, lc, ld};
        long long strides[4] = {stride_a, stride_b, stride_d, stride_d};
        for (int i = 0; i < 4; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof strides[i]));
        }
    }
    // The heuristic assumes 256-byte aligned pointers unless told otherwise, and an algorithm chosen
    // under that assumption refuses a less aligned pointer. So the key includes the alignments.
    uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_d = pointer_alignment(d);
    uint32_t align_c = c ? pointer_alignment(c) : align_d;
    MatmulKey key = {m, n, k, (int)trans_a, (int)trans_b, lda, ldb, ldd, (int)d_fp32, c != nullptr, batch,
                     (int)align_a, (int)align_b, (int)align_c, (int)align_d};
    auto it = mm.algos.find(key);
    if (it == mm.algos.end()) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &mm.workspace_bytes, sizeof mm.workspace_bytes));
        const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const uint32_t aligns[4] = {align_a, align_b, align_c, align_d};
        for (int i = 0; i < 4; i++)
            cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &aligns[i], sizeof aligns[i]));
        cublasLtMatmulHeuristicResult_t result;
        int found = 0;
        cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(mm.handle, desc, la, lb, lc, ld, pref, 1, &result, &found);
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        if (status != CUBLAS_STATUS_SUCCESS || found == 0)
            fail("cuBLASLt has no algorithm (status %d) for m %d n %d k %d, op(A) %c op(B) %c, lda %d ldb %d ldd %d, "
                 "%s output%s, batch %d", (int)status, m, n, k, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', lda, ldb, ldd,
                 d_fp32 ? "float" : "bf16", c ? " plus C" : "", batch);
        it = mm.algos.emplace(key, result).first;
    }
    float alpha = 1.0f, beta = c ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(mm.handle, desc, &alpha, a, la, b, lb, &beta, c ? c : d, lc, d, ld, &it->second.algo,
                               mm.workspace, mm.workspace_bytes, stream));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(lc));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
}

// Row-major out[N, OC] = inp[N, IC] @ W[OC, IC]^T (+ residual[N, OC] when given: the residual add
// of a transformer block, fused into the product).
inline void matmul_forward(Matmul& mm, __nv_bfloat16* out, const __nv_bfloat16* inp, const __nv_bfloat16* W,
                           const __nv_bfloat16* residual, int N, int IC, int OC, cudaStream_t stream, int ld_out = 0) {
    matmul_lt(mm, out, W, inp, residual, OC, N, IC, true, false, IC, IC, ld_out ? ld_out : OC, false, stream);
}

// Row-major dinp[N, IC] = dout[N, OC] @ W[OC, IC] and dW[OC, IC] += dout^T @ inp (float32 gradients).
inline void matmul_backward(Matmul& mm, __nv_bfloat16* dinp, float* dW, const __nv_bfloat16* dout,
                            const __nv_bfloat16* inp, const __nv_bfloat16* W, int N, int IC, int OC,
                            cudaStream_t stream, int ld_dout = 0) {
    int ldo = ld_dout ? ld_dout : OC;
    matmul_lt(mm, dinp, W, dout, nullptr, IC, N, OC, false, false, IC, ldo, IC, false, stream);
    matmul_lt(mm, dW, inp, dout, dW, IC, OC, N, false, true, IC, ldo, IC, true, stream);
}
