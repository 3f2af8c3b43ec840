// cuDNN's fused causal attention: flash attention through cuDNN 9's graph API, on ./train's own
// layouts (attention.cuh's qk, qkv, out and lse, no copies). The graphs are those cuDNN's fused
// flash-attention engines take (cuDNN 9.0 and later, sm_80 and later):
//   forward:  S = Q K^T, times the scale, the causal mask (the row index >= the column index, else
//             -inf), softmax with its statistics Stats = max + ln(sum of exp) (./train's lse), O = P V;
//   backward: Delta = rowsum(dO * O), P = exp(scale Q K^T - Stats) masked, dV = P^T dO,
//             dS = P (dO V^T - Delta) scale, dK = dS^T Q, dQ = dS K, with dQ written by the
//             product itself (no float accumulator that thread blocks add into: the deterministic
//             form), and with GQA the full-head dK, dV summed over each group of query heads.
// K and V enter as transposed views (dimensions and strides 2 and 3 swapped, the same memory).
//
// libcudnn.so.9 is loaded at run time (dlopen), as nccl.cuh loads NCCL: as the loader finds it, else
// from PyTorch's (its wheels' nvidia/cudnn/lib, a conda environment's lib; dynamic_library.h). dev/cuda/cudnn_attention.cu checks these graphs against
// attention.cuh's kernels and times them; ./train hands its attention to them where they take the
// shape (CudnnAttention below). A failed cuDNN call throws std::runtime_error with
// cuDNN's own account of it; CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr make cuDNN say more.
//
// Built with -DUSE_CUDNN (the Makefile sets it when cudnn_graph.h is found); without it, the
// attention always runs on attention.cuh's kernels.
#pragma once
#include <cstdio>
#include "cuda_common.cuh"
#ifdef USE_CUDNN
#include <cudnn_graph.h>
#include "dynamic_library.h"
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------------
// The library's functions, looked up once.

struct CudnnApi {
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnBackendCreateDescriptor) create_descriptor;
    decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
    decltype(&cudnnBackendSetAttribute) set_attribute;
    decltype(&cudnnBackendGetAttribute) get_attribute;
    decltype(&cudnnBackendFinalize) finalize;
    decltype(&cudnnBackendExecute) execute;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnGetLastErrorString) last_error;
};

inline CudnnApi g_cudnn;

// Loads libcudnn.so.9 (*from: the path it came from where the loader did not find it); false (with the reason in
// *why) when it or a function is missing.
inline bool cudnn_load(std::string* from, std::string* why) {
    void* lib = load_library("libcudnn.so.9", "cudnn", from, why);
    if (!lib) return false;
    bool ok = true;
    auto find = [&](const char* name) {
        void* f = dlsym(lib, name);
        if (!f) {
            *why = std::string("libcudnn.so.9 has no ") + name;
            ok = false;
        }
        return f;
    };
    CudnnApi& a = g_cudnn;
    a.get_version = (decltype(a.get_version))find("cudnnGetVersion");
    a.create = (decltype(a.create))find("cudnnCreate");
    a.destroy = (decltype(a.destroy))find("cudnnDestroy");
    a.set_stream = (decltype(a.set_stream))find("cudnnSetStream");
    a.create_descriptor = (decltype(a.create_descriptor))find("cudnnBackendCreateDescriptor");
    a.destroy_descriptor = (decltype(a.destroy_descriptor))find("cudnnBackendDestroyDescriptor");
    a.set_attribute = (decltype(a.set_attribute))find("cudnnBackendSetAttribute");
    a.get_attribute = (decltype(a.get_attribute))find("cudnnBackendGetAttribute");
    a.finalize = (decltype(a.finalize))find("cudnnBackendFinalize");
    a.execute = (decltype(a.execute))find("cudnnBackendExecute");
    a.error_string = (decltype(a.error_string))find("cudnnGetErrorString");
    a.last_error = (decltype(a.last_error))find("cudnnGetLastErrorString");
    return ok;
}

// A failed call throws, with cuDNN's own account of why.
inline void cudnn_check(cudnnStatus_t status, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) return;
    char detail[1024] = "";
    g_cudnn.last_error(detail, sizeof detail);
    throw std::runtime_error(strprintf("%s: %s %s", what, g_cudnn.error_string(status), detail));
}

// ---------------------------------------------------------------------------------------------
// A graph under construction: its descriptors (all destroyed with it), its operations in order,
// and the unique ids of its real tensors.

typedef cudnnBackendDescriptor_t CudnnDesc;

struct CudnnDims {
    int64_t d[4];
};

// [b, h, s, d] dimensions and element strides of a tensor whose rows of heads lie `row` elements
// apart (./train's [B, T, heads, D] buffers), and the same with dimensions and strides 2 and 3
// swapped: the transposed view that cuDNN's products take for K and V.
inline void cudnn_bhsd(CudnnDims& dims, CudnnDims& strides, int B, int heads, int T, int D, int64_t row) {
    dims = {{B, heads, T, D}};
    strides = {{(int64_t)T * row, D, row, 1}};
}
inline void cudnn_transposed(CudnnDims& dims, CudnnDims& strides) {
    std::swap(dims.d[2], dims.d[3]);
    std::swap(strides.d[2], strides.d[3]);
}

struct CudnnGraph {
    std::vector<CudnnDesc> owned, ops;
    int64_t next_virtual_uid = 1000;

    CudnnGraph() = default;
    CudnnGraph(const CudnnGraph&) = delete;
    CudnnGraph& operator=(const CudnnGraph&) = delete;
    ~CudnnGraph() {
        for (CudnnDesc d : owned) g_cudnn.destroy_descriptor(d);
    }
    CudnnDesc make(cudnnBackendDescriptorType_t type) {
        CudnnDesc d;
        cudnn_check(g_cudnn.create_descriptor(type, &d), "create a descriptor");
        owned.push_back(d);
        return d;
    }
    static void set(CudnnDesc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
                    const void* value, const char* what) {
        cudnn_check(g_cudnn.set_attribute(d, name, type, n, value), what);
    }
    static void set_desc(CudnnDesc d, cudnnBackendAttributeName_t name, CudnnDesc value, const char* what) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
    }

    // A tensor: real ones carry the uid the variant pack names them by; virtual ones (never in
    // memory) get one of their own; by-value ones are float scalars read from the host.
    CudnnDesc tensor(const CudnnDims& dims, const CudnnDims& strides, cudnnDataType_t type, int64_t uid, bool is_virtual = false,
                bool by_value = false) {
        CudnnDesc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        int64_t alignment = 16, id = is_virtual ? next_virtual_uid++ : uid;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.d, "tensor dimensions");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.d, "tensor strides");
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "tensor id");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
        bool yes = true;
        if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual");
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by value");
        cudnn_check(g_cudnn.finalize(t), "finalise a tensor");
        return t;
    }
    // A virtual tensor of the given shape, contiguous.
    CudnnDesc scratch(const CudnnDims& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
        CudnnDims strides{{dims.d[1] * dims.d[2] * dims.d[3], dims.d[2] * dims.d[3], dims.d[3], 1}};
        return tensor(dims, strides, type, 0, true);
    }
    CudnnDesc scalar(int64_t uid) {
        CudnnDims one{{1, 1, 1, 1}};
        return tensor(one, one, CUDNN_DATA_FLOAT, uid, false, true);
    }

    // y = mode(x[, b[, t]]), math in float (a comparison's in booleans); GEN_INDEX takes an axis.
    void pointwise(cudnnPointwiseMode_t mode, CudnnDesc x, CudnnDesc b, CudnnDesc t, CudnnDesc y, int64_t axis = -1,
                   cudnnDataType_t precision = CUDNN_DATA_FLOAT) {
        CudnnDesc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
        cudnn_check(g_cudnn.finalize(pw), "finalise a pointwise descriptor");
        CudnnDesc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op");
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
        if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
        if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
        float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
        cudnn_check(g_cudnn.finalize(op), "finalise a pointwise op");
        ops.push_back(op);
    }
    // An operation whose attributes `ports` name the descriptors it reads and writes, finalised and added.
    void operation(cudnnBackendDescriptorType_t type,
                   std::initializer_list<std::pair<cudnnBackendAttributeName_t, CudnnDesc>> ports) {
        CudnnDesc op = make(type);
        for (const auto& port : ports) set_desc(op, port.first, port.second, "operation port");
        cudnn_check(g_cudnn.finalize(op), "finalise an operation");
        ops.push_back(op);
    }
    // c = a b over the last two dimensions, batched over the first two (broadcast where b has fewer heads).
    void matmul(CudnnDesc a, CudnnDesc b, CudnnDesc c) {
        CudnnDesc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type");
        cudnn_check(g_cudnn.finalize(mm), "finalise a matmul descriptor");
        operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}});
    }
    // y = the sum or maximum of x over the dimensions where y has fewer elements.
    void reduction(cudnnReduceTensorOp_t mode, CudnnDesc x, CudnnDesc y) {
        CudnnDesc rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction compute type");
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
        cudnn_check(g_cudnn.finalize(rd), "finalise a reduction descriptor");
        operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd},
                                                                 {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                                                                 {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y}});
    }
    // y: x seen with other dimensions and strides (a transposed view).
    void reshape(CudnnDesc x, CudnnDesc y) {
        operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}});
    }
    // The causal mask on scores s [b, h, T, T]: where the row (query) index is below the column
    // (key) index, -inf.
    CudnnDesc causal_mask(CudnnDesc s, CudnnDesc neg_inf, const CudnnDims& square) {
        CudnnDesc row = scratch(square, CUDNN_DATA_INT32), col = scratch(square, CUDNN_DATA_INT32);
        CudnnDesc keep = scratch(square, CUDNN_DATA_BOOLEAN), masked = scratch(square);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, 2);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, 3);
        pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
        pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, keep, masked);
        return masked;
    }
    // The operation graph of the ops added, finalised; with a handle (null: the graph alone, no GPU).
    CudnnDesc finish(cudnnHandle_t handle) {
        CudnnDesc g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data(),
            "operation graph ops");
        if (handle) set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
        cudnn_check(g_cudnn.finalize(g), "finalise the operation graph");
        return g;
    }
};

// The unique ids of the real tensors and scalars.
enum : int64_t { kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidDOut, kUidDQ, kUidDK, kUidDV, kUidDelta, kUidScale,
                 kUidNegInf, kUidOne };

struct CudnnShape {
    int B, T, H, Hkv, D;
};

// The tensors of ./train's layouts: Q and K inside qk [B, T, H + Hkv, D], V inside qkv
// [B, T, (H + 2 Hkv) D], O and dO [B, T, H D], Stats = lse [B, H, T]; the gradients like their inputs.
struct CudnnLayouts {
    CudnnDims q_dims, q_strides, k_dims, k_strides, v_dims, v_strides, o_dims, o_strides, stats_dims, stats_strides, square;
    explicit CudnnLayouts(const CudnnShape& s) {
        const int NH = s.H + s.Hkv;
        cudnn_bhsd(q_dims, q_strides, s.B, s.H, s.T, s.D, (int64_t)NH * s.D);
        cudnn_bhsd(k_dims, k_strides, s.B, s.Hkv, s.T, s.D, (int64_t)NH * s.D);
        cudnn_bhsd(v_dims, v_strides, s.B, s.Hkv, s.T, s.D, (int64_t)(s.H + 2 * s.Hkv) * s.D);
        cudnn_bhsd(o_dims, o_strides, s.B, s.H, s.T, s.D, (int64_t)s.H * s.D);
        stats_dims = {{s.B, s.H, s.T, 1}};
        stats_strides = {{(int64_t)s.H * s.T, s.T, 1, 1}};
        square = {{s.B, s.H, s.T, s.T}};
    }
};

inline void cudnn_attention_forward_graph(CudnnGraph& g, const CudnnShape& s) {
    CudnnLayouts l(s);
    CudnnDims kt_dims = l.k_dims, kt_strides = l.k_strides;
    cudnn_transposed(kt_dims, kt_strides);
    CudnnDesc q = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, kUidQ);
    CudnnDesc kt = g.tensor(kt_dims, kt_strides, CUDNN_DATA_BFLOAT16, kUidK);
    CudnnDesc v = g.tensor(l.v_dims, l.v_strides, CUDNN_DATA_BFLOAT16, kUidV);
    CudnnDesc o = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, kUidO);
    CudnnDesc stats = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, kUidStats);
    CudnnDesc scale = g.scalar(kUidScale), neg_inf = g.scalar(kUidNegInf);
    CudnnDims rows{{s.B, s.H, s.T, 1}};
    CudnnDesc scores = g.scratch(l.square), scaled = g.scratch(l.square);
    g.matmul(q, kt, scores);
    g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, nullptr, scaled);
    CudnnDesc masked = g.causal_mask(scaled, neg_inf, l.square);
    CudnnDesc row_max = g.scratch(rows), shifted = g.scratch(l.square), e = g.scratch(l.square);
    CudnnDesc row_sum = g.scratch(rows), log_sum = g.scratch(rows), p = g.scratch(l.square, CUDNN_DATA_BFLOAT16);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
    g.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, nullptr, shifted);
    g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
    g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum);
    g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats);
    g.pointwise(CUDNN_POINTWISE_DIV, e, row_sum, nullptr, p);
    g.matmul(p, v, o);
}

inline void cudnn_attention_backward_graph(CudnnGraph& g, const CudnnShape& s) {
    CudnnLayouts l(s);
    const bool gqa = s.H != s.Hkv;
    CudnnDims kt_dims = l.k_dims, kt_strides = l.k_strides, vt_dims = l.v_dims, vt_strides = l.v_strides;
    cudnn_transposed(kt_dims, kt_strides);
    cudnn_transposed(vt_dims, vt_strides);
    CudnnDesc q = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, kUidQ);
    CudnnDesc kt = g.tensor(kt_dims, kt_strides, CUDNN_DATA_BFLOAT16, kUidK);
    CudnnDesc vt = g.tensor(vt_dims, vt_strides, CUDNN_DATA_BFLOAT16, kUidV);
    CudnnDesc o = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, kUidO);
    CudnnDesc dout = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, kUidDOut);
    CudnnDesc stats = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, kUidStats);
    CudnnDesc dq = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, kUidDQ);
    CudnnDesc dk = g.tensor(l.k_dims, l.k_strides, CUDNN_DATA_BFLOAT16, kUidDK);
    CudnnDesc dv = g.tensor(l.v_dims, l.v_strides, CUDNN_DATA_BFLOAT16, kUidDV);
    CudnnDesc delta = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, kUidDelta);
    CudnnDesc scale = g.scalar(kUidScale), neg_inf = g.scalar(kUidNegInf), one = g.scalar(kUidOne);
    CudnnDims rows{{s.B, s.H, s.T, 1}}, transposed_square{{s.B, s.H, s.T, s.T}};
    CudnnDims transposed_square_strides{{(int64_t)s.H * s.T * s.T, (int64_t)s.T * s.T, 1, s.T}};
    // Delta = rowsum(dO * O), kept (non-virtual) for the products below.
    CudnnDesc prod = g.scratch(l.o_dims), prod_sum = g.scratch(rows);
    g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, prod);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, prod_sum);
    g.pointwise(CUDNN_POINTWISE_MUL, prod_sum, one, nullptr, delta);
    // P from the forward pass's statistics.
    CudnnDesc scores = g.scratch(l.square), scaled = g.scratch(l.square), centred = g.scratch(l.square);
    g.matmul(q, kt, scores);
    g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, nullptr, scaled);
    g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, centred);
    CudnnDesc masked = g.causal_mask(centred, neg_inf, l.square);
    CudnnDesc p = g.scratch(l.square);
    g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p);
    // A key-side gradient: square^T x, a [b, H, T, T] matrix seen transposed in bf16, summed over
    // each group's query heads with GQA.
    auto key_side_product = [&](CudnnDesc square, CudnnDesc x, CudnnDesc gradient) {
        CudnnDesc square_t = g.tensor(transposed_square, transposed_square_strides, CUDNN_DATA_BFLOAT16, 0, true);
        g.reshape(square, square_t);
        if (!gqa) return g.matmul(square_t, x, gradient);
        CudnnDesc full_heads = g.scratch({{s.B, s.H, s.T, s.D}}, CUDNN_DATA_BFLOAT16);
        g.matmul(square_t, x, full_heads);
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, full_heads, gradient);
    };
    key_side_product(p, dout, dv);  // dV = P^T dO
    // dS = P (dO V^T - Delta) scale.
    CudnnDesc dp = g.scratch(l.square), dp_centred = g.scratch(l.square), dp_p = g.scratch(l.square), ds = g.scratch(l.square);
    g.matmul(dout, vt, dp);
    g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, nullptr, dp_centred);
    g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, nullptr, dp_p);
    g.pointwise(CUDNN_POINTWISE_MUL, dp_p, scale, nullptr, ds);
    key_side_product(ds, q, dk);  // dK = dS^T Q
    // dQ = dS K, straight into dQ.
    CudnnDesc k_view = g.tensor(l.k_dims, l.k_strides, CUDNN_DATA_FLOAT, 0, true);
    g.reshape(kt, k_view);
    g.matmul(ds, k_view, dq);
}

// ---------------------------------------------------------------------------------------------
// A graph made runnable: the first engine configuration cuDNN's heuristics offer that finalises as
// an execution plan, and the workspace it needs.

struct CudnnPlan {
    CudnnGraph graph;
    CudnnDesc plan = nullptr;
    int64_t workspace_bytes = 0;
    std::string engine;
};

// The engine configurations cuDNN's heuristics (in `mode`) offer for a finished operation graph,
// best first; their descriptors belong to g.
inline std::vector<CudnnDesc> cudnn_engine_configs(CudnnGraph& g, CudnnDesc op_graph, cudnnBackendHeurMode_t mode) {
    CudnnDesc heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    CudnnGraph::set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph, "heuristics graph");
    CudnnGraph::set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    cudnn_check(g_cudnn.finalize(heur), "finalise the heuristics");
    int64_t count = 0;
    cudnn_check(g_cudnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
       "count the engine configurations");
    std::vector<CudnnDesc> configs(count);
    for (CudnnDesc& c : configs) c = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (count > 0)
        cudnn_check(g_cudnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                          configs.data()),
                    "read the engine configurations");
    configs.resize(count);
    return configs;
}

// Finalises `config` as p's execution plan: false, with cuDNN's reason in *why, where it refuses.
inline bool cudnn_plan_from(CudnnPlan& p, cudnnHandle_t handle, CudnnDesc config, std::string* why) {
    CudnnDesc plan = p.graph.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    // The handle again on the plan: cuDNN 9.19 takes it from the graph, versions before 9.11 want it here.
    CudnnGraph::set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
    CudnnGraph::set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "plan engine configuration");
    cudnnStatus_t status = g_cudnn.finalize(plan);
    if (status != CUDNN_STATUS_SUCCESS) {
        char detail[512] = "";
        g_cudnn.last_error(detail, sizeof detail);
        *why = strprintf("%s %s", g_cudnn.error_string(status), detail);
        return false;
    }
    cudnn_check(g_cudnn.get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, nullptr,
                             &p.workspace_bytes),
       "read the plan's workspace");
    p.plan = plan;
    return true;
}

inline void cudnn_make_plan(CudnnPlan& p, cudnnHandle_t handle) {
    std::vector<CudnnDesc> configs = cudnn_engine_configs(p.graph, p.graph.finish(handle), CUDNN_HEUR_MODE_A);
    if (configs.empty()) throw std::runtime_error("the heuristics offer no engine for this graph");
    std::string refusals, why;
    for (size_t i = 0; i < configs.size(); i++) {
        if (cudnn_plan_from(p, handle, configs[i], &why)) {
            p.engine = strprintf("configuration %zu of %zu", i, configs.size());
            return;
        }
        refusals += strprintf(" [%zu: %s]", i, why.c_str());
    }
    throw std::runtime_error("no engine configuration finalises:" + refusals);
}

// A configuration as an engine takes it: the engine's number and its knobs' values.
struct CudnnSetting {
    int64_t engine = -1;
    std::vector<std::pair<cudnnBackendKnobType_t, int64_t>> knobs;
    std::string text() const {
        std::string t = strprintf("engine %lld", (long long)engine);
        for (size_t i = 0; i < knobs.size(); i++)
            t += strprintf("%s%d=%lld", i == 0 ? ", knobs " : " ", (int)knobs[i].first, (long long)knobs[i].second);
        return t;
    }
    // As TRAIN_CUDNN_FORWARD and TRAIN_CUDNN_BACKWARD take it: "engine:type=value,type=value".
    std::string arg() const {
        std::string t = strprintf("%lld", (long long)engine);
        for (size_t i = 0; i < knobs.size(); i++)
            t += strprintf("%s%d=%lld", i == 0 ? ":" : ",", (int)knobs[i].first, (long long)knobs[i].second);
        return t;
    }
};

// A setting from its arg() form; false where the text is not one.
inline bool cudnn_parse_setting(const std::string& text, CudnnSetting* s) {
    *s = CudnnSetting();
    const char* p = text.c_str();
    char* end = nullptr;
    auto number = [&](int64_t* v) {
        if (*p < '0' || *p > '9') return false;
        *v = strtoll(p, &end, 10);
        p = end;
        return true;
    };
    if (!number(&s->engine)) return false;
    if (*p == '\0') return true;
    if (*p++ != ':') return false;
    for (;;) {
        int64_t type = 0, value = 0;
        if (!number(&type) || type >= CUDNN_KNOB_TYPE_COUNTS || *p++ != '=' || !number(&value)) return false;
        s->knobs.push_back({(cudnnBackendKnobType_t)type, value});
        if (*p == '\0') return true;
        if (*p++ != ',') return false;
    }
}

// An engine's knob: the values it takes, from min to max by stride.
struct CudnnKnob {
    cudnnBackendKnobType_t type;
    int64_t min, max, stride;
};

// Engine `index` for a finished operation graph, with its knobs in *knobs; null where the engine
// does not take the graph.
inline CudnnDesc cudnn_engine_for(CudnnGraph& g, CudnnDesc op_graph, int64_t index, std::vector<CudnnKnob>* knobs) {
    CudnnDesc engine = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    CudnnGraph::set_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, op_graph, "engine graph");
    CudnnGraph::set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index, "engine index");
    if (g_cudnn.finalize(engine) != CUDNN_STATUS_SUCCESS) return nullptr;
    const int64_t most = CUDNN_KNOB_TYPE_COUNTS;
    std::vector<CudnnDesc> infos(most);
    for (CudnnDesc& k : infos) k = g.make(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR);
    int64_t n = 0;
    cudnn_check(g_cudnn.get_attribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, most, &n,
                                      infos.data()),
                "read an engine's knobs");
    knobs->clear();
    for (int64_t i = 0; i < n && i < most; i++) {
        CudnnKnob k;
        int64_t got = 0;
        cudnn_check(g_cudnn.get_attribute(infos[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &got, &k.type),
                    "read a knob's type");
        cudnn_check(g_cudnn.get_attribute(infos[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &got, &k.min),
                    "read a knob's least value");
        cudnn_check(g_cudnn.get_attribute(infos[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &got, &k.max),
                    "read a knob's largest value");
        cudnn_check(g_cudnn.get_attribute(infos[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &got, &k.stride),
                    "read a knob's stride");
        knobs->push_back(k);
    }
    return engine;
}

// The configuration of `engine` with the knob values of s; null where cuDNN refuses it.
inline CudnnDesc cudnn_config_for(CudnnGraph& g, CudnnDesc engine, const CudnnSetting& s) {
    std::vector<CudnnDesc> choices;
    for (const auto& knob : s.knobs) {
        CudnnDesc c = g.make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
        CudnnGraph::set(c, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &knob.first, "knob type");
        CudnnGraph::set(c, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &knob.second, "knob value");
        if (g_cudnn.finalize(c) != CUDNN_STATUS_SUCCESS) return nullptr;
        choices.push_back(c);
    }
    CudnnDesc config = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    CudnnGraph::set_desc(config, CUDNN_ATTR_ENGINECFG_ENGINE, engine, "configuration engine");
    if (!choices.empty())
        CudnnGraph::set(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)choices.size(),
                        choices.data(), "configuration knobs");
    return g_cudnn.finalize(config) == CUDNN_STATUS_SUCCESS ? config : nullptr;
}

// p's plan from a setting asked for by hand (cudnn_make_plan's choice left aside): false, with
// the reason in *why, where cuDNN refuses the engine, the knobs or the plan.
inline bool cudnn_make_plan_with(CudnnPlan& p, cudnnHandle_t handle, const CudnnSetting& s, std::string* why) {
    std::vector<CudnnKnob> knobs;
    CudnnDesc engine = cudnn_engine_for(p.graph, p.graph.finish(handle), s.engine, &knobs);
    CudnnDesc config = engine ? cudnn_config_for(p.graph, engine, s) : nullptr;
    if (!config) {
        *why = engine ? "cuDNN refuses its knobs" : "the engine does not take the graph";
        return false;
    }
    if (!cudnn_plan_from(p, handle, config, why)) return false;
    p.engine = s.text() + " (asked for)";
    return true;
}

// Runs a plan with the given (uid, pointer) pairs; the workspace is the caller's.
inline void cudnn_execute(cudnnHandle_t handle, CudnnPlan& p, const std::vector<std::pair<int64_t, void*>>& tensors, void* workspace) {
    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    for (auto& t : tensors) {
        uids.push_back(t.first);
        pointers.push_back(t.second);
    }
    CudnnDesc pack;
    cudnn_check(g_cudnn.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "create the variant pack");
    try {
        CudnnGraph::set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data(), "pack ids");
        CudnnGraph::set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)pointers.size(),
                   pointers.data(), "pack pointers");
        CudnnGraph::set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "pack workspace");
        cudnn_check(g_cudnn.finalize(pack), "finalise the variant pack");
        cudnn_check(g_cudnn.execute(handle, p.plan, pack), "execute");
    } catch (...) {
        g_cudnn.destroy_descriptor(pack);
        throw;
    }
    g_cudnn.destroy_descriptor(pack);
}


// ---------------------------------------------------------------------------------------------
// What each cuDNN version needs.

// cuDNN's version as text ("9.15.0").
inline std::string cudnn_version_text(size_t version) {
    return strprintf("%zu.%zu.%zu", version / 10000, version / 100 % 100, version % 100);
}

// Why this cuDNN must not take shape s ("" when it may): the versions whose release notes say they
// compute this attention wrongly, and the shapes whose tensors cannot all be 16-byte aligned (each
// layer's lse starts B H T floats after the last).
inline std::string cudnn_attention_unfit(size_t version, const CudnnShape& s) {
    if (s.D % 8 != 0 || (int64_t)s.B * s.H * s.T % 4 != 0)
        return "its tensors are not all 16-byte aligned (head_dim a multiple of 8 and B H T of 4 are)";
    if (version >= 91000 && version < 91002) return "cuDNN 9.10.0 and 9.10.1 compute this attention wrongly";
    if (version < 91600 && s.T % 128 != 0)
        return strprintf("cuDNN %s's backward needs T a multiple of 128 (it gives NaN otherwise)",
                         cudnn_version_text(version).c_str());
    return "";
}

// The masked scores' fill: -inf, but finite before cuDNN 9.10, which would form -inf - -inf.
inline float cudnn_mask_fill(size_t version) { return version < 91000 ? -FLT_MAX : -INFINITY; }

// The two plans run on attention.cuh's layouts (the tensors' places in qk, qkv and dqk, dqkv, and
// the scalars): out and lse from qk and qkv; dqk and dqkv's value heads from dout, out and lse,
// with delta (B * H * T floats) as cuDNN's Delta.
inline void cudnn_attention_run_forward(cudnnHandle_t handle, CudnnPlan& plan, void* workspace, bf16* out, float* lse,
                                        const bf16* qk, const bf16* qkv, int H, int Hkv, int D) {
    float scale = 1.0f / sqrtf((float)D), fill = cudnn_mask_fill(g_cudnn.get_version());
    bf16 *q = const_cast<bf16*>(qk), *v = const_cast<bf16*>(qkv) + (size_t)(H + Hkv) * D;
    cudnn_execute(handle, plan, {{kUidQ, q}, {kUidK, q + (size_t)H * D}, {kUidV, v}, {kUidO, out}, {kUidStats, lse},
                                 {kUidScale, &scale}, {kUidNegInf, &fill}},
                  workspace);
}
inline void cudnn_attention_run_backward(cudnnHandle_t handle, CudnnPlan& plan, void* workspace, bf16* dqk, bf16* dqkv,
                                         float* delta, const bf16* dout, const bf16* out, const float* lse,
                                         const bf16* qk, const bf16* qkv, int H, int Hkv, int D) {
    float scale = 1.0f / sqrtf((float)D), fill = cudnn_mask_fill(g_cudnn.get_version()), one = 1.0f;
    const size_t k_offset = (size_t)H * D, v_offset = (size_t)(H + Hkv) * D;
    bf16* q = const_cast<bf16*>(qk);
    cudnn_execute(handle, plan,
                  {{kUidQ, q}, {kUidK, q + k_offset}, {kUidV, const_cast<bf16*>(qkv) + v_offset},
                   {kUidO, const_cast<bf16*>(out)}, {kUidDOut, const_cast<bf16*>(dout)},
                   {kUidStats, const_cast<float*>(lse)}, {kUidDQ, dqk}, {kUidDK, dqk + k_offset},
                   {kUidDV, dqkv + v_offset}, {kUidDelta, delta}, {kUidScale, &scale}, {kUidNegInf, &fill},
                   {kUidOne, &one}},
                  workspace);
}

// ---------------------------------------------------------------------------------------------
// ./train's attention through cuDNN. The library, a handle and each shape's
// two plans are made when first needed; a shape cuDNN cannot take (the library missing, a version
// or shape above, no plan, no memory for the workspace) keeps attention.cuh's kernels, and one line
// says which it is. The rows' statistics stay with attention.cuh's forward kernel (train_gpt.cu's
// layer_attention_forward); the backward takes the out and lse of either forward.

struct CudnnAttention {
    struct Plans {
        CudnnShape shape;
        std::unique_ptr<CudnnPlan> forward, backward;  // null: this shape runs on attention.cuh's kernels
    };
    bool started = false;
    std::string unavailable;         // why cuDNN is not used at all ("": it is)
    std::string loaded_from;         // where the library came from, if not found by the loader (PyTorch's)
    cudnnHandle_t handle = nullptr;
    std::vector<Plans> shapes;       // every shape met
    void* workspace = nullptr;       // the largest any plan needs
    int64_t workspace_bytes = 0;
    int workspace_generation = 0;    // times the workspace moved (a pass's CUDA graph holds its address)
    // Candidate builds: each pass's plan from a setting asked for by hand (engine < 0: none), from
    // TRAIN_CUDNN_FORWARD and TRAIN_CUDNN_BACKWARD ("engine:type=value,...", the form
    // dev_cudnn_attention --engines prints), for timing a setting its survey found in whole steps.
    CudnnSetting asked[2];
};

inline bool operator==(const CudnnShape& a, const CudnnShape& b) {
    return a.B == b.B && a.T == b.T && a.H == b.H && a.Hkv == b.Hkv && a.D == b.D;
}

// The library and a handle (its stream is set at every call); c.unavailable says why not.
inline void cudnn_attention_start(CudnnAttention& c) {
    c.started = true;
    const char* names[2] = {"TRAIN_CUDNN_FORWARD", "TRAIN_CUDNN_BACKWARD"};
    for (int pass = 0; kCandidateKernels && pass < 2; pass++) {
        const char* text = getenv(names[pass]);
        if (text && *text && !cudnn_parse_setting(text, &c.asked[pass]))
            fail("%s=%s: not a setting of cuDNN's (engine:knob type=value,... as in 6:14=1,24=26)", names[pass], text);
    }
    if (!cudnn_load(&c.loaded_from, &c.unavailable)) return;
    try {
        cudnn_check(g_cudnn.create(&c.handle), "create a handle");
    } catch (const std::exception& e) {
        c.unavailable = e.what();
        if (c.handle) g_cudnn.destroy(c.handle);
        c.handle = nullptr;
    }
}

// The plans of shape s, made the first time it is met (with one line saying what runs it); null
// where attention.cuh's kernels run it.
inline CudnnAttention::Plans* cudnn_attention_plans(CudnnAttention& c, const CudnnShape& s, cudaStream_t stream) {
    for (CudnnAttention::Plans& p : c.shapes)
        if (p.shape == s) return p.backward ? &p : nullptr;
    if (!c.started) cudnn_attention_start(c);
    CudnnAttention::Plans p{s};
    std::string why = c.unavailable.empty() ? cudnn_attention_unfit(g_cudnn.get_version(), s) : c.unavailable;
    if (why.empty()) {
        try {
            p.forward.reset(new CudnnPlan);
            cudnn_attention_forward_graph(p.forward->graph, s);
            p.backward.reset(new CudnnPlan);
            cudnn_attention_backward_graph(p.backward->graph, s);
            CudnnPlan* plans[2] = {p.forward.get(), p.backward.get()};
            for (int pass = 0; pass < 2; pass++) {
                std::string refused;
                if (c.asked[pass].engine < 0)
                    cudnn_make_plan(*plans[pass], c.handle);
                else if (!cudnn_make_plan_with(*plans[pass], c.handle, c.asked[pass], &refused))
                    throw std::runtime_error(strprintf("TRAIN_CUDNN_%s=%s: cuDNN refuses it: %s",
                                                       pass ? "BACKWARD" : "FORWARD", c.asked[pass].arg().c_str(),
                                                       refused.c_str()));
            }
        } catch (const std::exception& e) {
            why = e.what();
            p.forward.reset();
            p.backward.reset();
        }
    }
    const bool asked = c.asked[0].engine >= 0 || c.asked[1].engine >= 0;
    int64_t need = p.backward ? std::max(p.forward->workspace_bytes, p.backward->workspace_bytes) : 0;
    if (need > c.workspace_bytes) {  // a larger workspace first, so that a failure leaves the old one to the others
        void* larger = nullptr;
        if (cudaMalloc(&larger, need) == cudaSuccess) {
            cudaCheck(cudaStreamSynchronize(stream));  // the old one may still be in use by queued work
            cudaCheck(cudaFree(c.workspace));
            c.workspace = larger;
            c.workspace_bytes = need;
            c.workspace_generation++;
        } else {
            cudaGetLastError();  // not a sticky error: clear it, and leave this shape to attention.cuh
            why = strprintf("no device memory for its %.1f MiB of workspace", need / 1048576.0);
            p.forward.reset();
            p.backward.reset();
        }
    }
    // a setting asked for by hand runs as asked or not at all
    if (asked && !p.backward) fail("a cuDNN setting asked for (TRAIN_CUDNN_FORWARD, TRAIN_CUDNN_BACKWARD), but the "
                                   "attention at %d x %d cannot run on cuDNN: %s", s.B, s.T, why.c_str());
    if (g_fail_rank <= 0) {
        std::string shape = strprintf("attention at %d x %d:", s.B, s.T);
        std::string settings;
        for (int pass = 0; p.backward && pass < 2; pass++)
            if (c.asked[pass].engine >= 0)
                settings += strprintf("; the %s from %s", pass ? "backward" : "forward",
                                      (pass ? p.backward : p.forward)->engine.c_str());
        if (!c.loaded_from.empty()) settings += "; loaded from " + c.loaded_from;
        if (p.backward)
            printf("%s cuDNN %s's fused kernels (%.1f MiB of workspace; statistics: ./train's kernel beside them%s)\n",
                   shape.c_str(), cudnn_version_text(g_cudnn.get_version()).c_str(), c.workspace_bytes / 1048576.0,
                   settings.c_str());
        else
            printf("%s ./train's kernels (not cuDNN's: %s)\n", shape.c_str(), why.c_str());
    }
    c.shapes.push_back(std::move(p));
    return c.shapes.back().backward ? &c.shapes.back() : nullptr;
}

// out and lse (attention.cuh's layouts) through cuDNN; false, with nothing done, where this shape
// keeps attention.cuh's kernels (or an array is not 16-byte aligned, which the shape's check rules
// out for ./train's buffers).
inline bool cudnn_attention_forward(CudnnAttention& c, bf16* out, float* lse, const bf16* qk, const bf16* qkv, int B,
                                    int T, int H, int Hkv, int D, cudaStream_t stream) {
    CudnnAttention::Plans* p = cudnn_attention_plans(c, {B, T, H, Hkv, D}, stream);
    if (!p || !aligned_16({out, lse, qk, qkv})) return false;
    try {
        cudnn_check(g_cudnn.set_stream(c.handle, stream), "set the stream");
        cudnn_attention_run_forward(c.handle, *p->forward, c.workspace, out, lse, qk, qkv, H, Hkv, D);
    } catch (const std::exception& e) {
        fail("cuDNN attention forward at %d x %d: %s", B, T, e.what());
    }
    return true;
}

// dqk and dqkv's value heads (as attention_backward writes them; delta: B * H * T floats of
// workspace) through cuDNN; false, with nothing done, where this shape keeps attention.cuh's kernels.
inline bool cudnn_attention_backward(CudnnAttention& c, bf16* dqk, bf16* dqkv, float* delta, const bf16* dout,
                                     const bf16* out, const float* lse, const bf16* qk, const bf16* qkv, int B, int T,
                                     int H, int Hkv, int D, cudaStream_t stream) {
    CudnnAttention::Plans* p = cudnn_attention_plans(c, {B, T, H, Hkv, D}, stream);
    if (!p || !aligned_16({dqk, dqkv, delta, dout, out, lse, qk, qkv})) return false;
    try {
        cudnn_check(g_cudnn.set_stream(c.handle, stream), "set the stream");
        cudnn_attention_run_backward(c.handle, *p->backward, c.workspace, dqk, dqkv, delta, dout, out, lse, qk, qkv, H,
                                     Hkv, D);
    } catch (const std::exception& e) {
        fail("cuDNN attention backward at %d x %d: %s", B, T, e.what());
    }
    return true;
}

inline void cudnn_attention_free(CudnnAttention& c) {
    c.shapes.clear();  // the plans' descriptors before the handle
    if (c.handle) g_cudnn.destroy(c.handle);
    cudaCheck(cudaFree(c.workspace));
    c = CudnnAttention();
}
#else
// Built without cuDNN's headers: nothing is handed to cuDNN (said once).
struct CudnnAttention {
    bool said = false;
    int workspace_generation = 0;  // no workspace: never moves
};
inline bool cudnn_attention_said_missing(CudnnAttention& c) {
    if (!c.said && g_fail_rank <= 0) printf("attention: ./train's kernels (this build has no cuDNN: no cudnn_graph.h)\n");
    c.said = true;
    return false;
}
inline bool cudnn_attention_forward(CudnnAttention& c, bf16*, float*, const bf16*, const bf16*, int, int, int, int, int,
                                    cudaStream_t) {
    return cudnn_attention_said_missing(c);
}
inline bool cudnn_attention_backward(CudnnAttention& c, bf16*, bf16*, float*, const bf16*, const bf16*, const float*,
                                     const bf16*, const bf16*, int, int, int, int, int, cudaStream_t) {
    return cudnn_attention_said_missing(c);
}
inline void cudnn_attention_free(CudnnAttention&) {}
#endif
