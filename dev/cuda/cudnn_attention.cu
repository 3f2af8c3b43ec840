// cuDNN's fused causal attention (flash attention through cuDNN 9's graph API) against
// llmc/attention.cuh's tensor-core kernels: whether it computes the same attention, forward and
// backward, on ./train's own layouts (no copies), whether its backward gives the same bits twice,
// and what each costs on the d22 layer and on Qwen3-0.6B's. The experiment that decides whether
// ./train should hand its attention to cuDNN, as torch.compile's recipe does. Not yet run on a GPU.
//
// libcudnn.so.9 is loaded at run time (dlopen), as ./train loads NCCL: a GPU machine with PyTorch
// has it in its wheels (nvidia/cudnn/lib; dev/gpu_env.sh puts that on LD_LIBRARY_PATH). The graphs
// are those cuDNN's fused flash-attention engines take (cuDNN 9.0 and later, sm_80 and later):
//   forward:  S = Q K^T, times the scale, the causal mask (the row index >= the column index, else
//             -inf), softmax with its statistics Stats = max + ln(sum of exp) (./train's lse), O = P V;
//   backward: Delta = rowsum(dO * O), P = exp(scale Q K^T - Stats) masked, dV = P^T dO,
//             dS = P (dO V^T - Delta) scale, dK = dS^T Q, dQ = dS K, with dQ written by the
//             product itself (no float accumulator that thread blocks add into: the deterministic
//             form), and with GQA the full-head dK, dV summed over each group of query heads.
// K and V enter as transposed views (dimensions and strides 2 and 3 swapped, the same memory).
//
// Usage: build/dev_cudnn_attention [--graph-only]
//   --graph-only  builds and finalises the two operation graphs and stops there; that needs no GPU
//                 (only the library), so it checks the graphs' construction on any machine.
// CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr make cuDNN say why a graph or plan is refused.
// Build: make build/dev_cudnn_attention.
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include "dev/cuda/common.h"
#include "llmc/attention.cuh"

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

static CudnnApi g_cudnn;

// Loads libcudnn.so.9; false (with the reason in *why) when it or a function is missing.
static bool cudnn_load(std::string* why) {
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        *why = std::string("cannot load libcudnn.so.9: ") + dlerror();
        return false;
    }
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

// A failed call throws, with cuDNN's own account of why; each check catches it and reports FAIL.
static void ck(cudnnStatus_t status, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) return;
    char detail[1024] = "";
    g_cudnn.last_error(detail, sizeof detail);
    throw std::runtime_error(strprintf("%s: %s %s", what, g_cudnn.error_string(status), detail));
}

// ---------------------------------------------------------------------------------------------
// A graph under construction: its descriptors (all destroyed with it), its operations in order,
// and the unique ids of its real tensors.

typedef cudnnBackendDescriptor_t Desc;

struct Dims4 {
    int64_t d[4];
};

// [b, h, s, d] dimensions and element strides of a tensor whose rows of heads lie `row` elements
// apart (./train's [B, T, heads, D] buffers), and the same with dimensions and strides 2 and 3
// swapped: the transposed view that cuDNN's products take for K and V.
static void bhsd(Dims4& dims, Dims4& strides, int B, int heads, int T, int D, int64_t row) {
    dims = {{B, heads, T, D}};
    strides = {{(int64_t)T * row, D, row, 1}};
}
static void transposed(Dims4& dims, Dims4& strides) {
    std::swap(dims.d[2], dims.d[3]);
    std::swap(strides.d[2], strides.d[3]);
}

struct Graph {
    std::vector<Desc> owned, ops;
    int64_t next_virtual_uid = 1000;

    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() {
        for (Desc d : owned) g_cudnn.destroy_descriptor(d);
    }
    Desc make(cudnnBackendDescriptorType_t type) {
        Desc d;
        ck(g_cudnn.create_descriptor(type, &d), "create a descriptor");
        owned.push_back(d);
        return d;
    }
    static void set(Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t n,
                    const void* value, const char* what) {
        ck(g_cudnn.set_attribute(d, name, type, n, value), what);
    }
    static void set_desc(Desc d, cudnnBackendAttributeName_t name, Desc value, const char* what) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
    }

    // A tensor: real ones carry the uid the variant pack names them by; virtual ones (never in
    // memory) get one of their own; by-value ones are float scalars read from the host.
    Desc tensor(const Dims4& dims, const Dims4& strides, cudnnDataType_t type, int64_t uid, bool is_virtual = false,
                bool by_value = false) {
        Desc t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        int64_t alignment = 16, id = is_virtual ? next_virtual_uid++ : uid;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.d, "tensor dimensions");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.d, "tensor strides");
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "tensor id");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
        bool yes = true;
        if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual");
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by value");
        ck(g_cudnn.finalize(t), "finalise a tensor");
        return t;
    }
    // A virtual tensor of the given shape, contiguous.
    Desc scratch(const Dims4& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
        Dims4 strides{{dims.d[1] * dims.d[2] * dims.d[3], dims.d[2] * dims.d[3], dims.d[3], 1}};
        return tensor(dims, strides, type, 0, true);
    }
    Desc scalar(int64_t uid) {
        Dims4 one{{1, 1, 1, 1}};
        return tensor(one, one, CUDNN_DATA_FLOAT, uid, false, true);
    }

    // y = mode(x[, b[, t]]), math in float (a comparison's in booleans); GEN_INDEX takes an axis.
    void pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc t, Desc y, int64_t axis = -1,
                   cudnnDataType_t precision = CUDNN_DATA_FLOAT) {
        Desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
        ck(g_cudnn.finalize(pw), "finalise a pointwise descriptor");
        Desc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op");
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
        if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
        if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
        float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
        ck(g_cudnn.finalize(op), "finalise a pointwise op");
        ops.push_back(op);
    }
    // An operation whose attributes `ports` name the descriptors it reads and writes, finalised and added.
    void operation(cudnnBackendDescriptorType_t type,
                   std::initializer_list<std::pair<cudnnBackendAttributeName_t, Desc>> ports) {
        Desc op = make(type);
        for (const auto& port : ports) set_desc(op, port.first, port.second, "operation port");
        ck(g_cudnn.finalize(op), "finalise an operation");
        ops.push_back(op);
    }
    // c = a b over the last two dimensions, batched over the first two (broadcast where b has fewer heads).
    void matmul(Desc a, Desc b, Desc c) {
        Desc mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "matmul compute type");
        ck(g_cudnn.finalize(mm), "finalise a matmul descriptor");
        operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                                                              {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}});
    }
    // y = the sum or maximum of x over the dimensions where y has fewer elements.
    void reduction(cudnnReduceTensorOp_t mode, Desc x, Desc y) {
        Desc rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        cudnnDataType_t compute = CUDNN_DATA_FLOAT;
        set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "reduction compute type");
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
        ck(g_cudnn.finalize(rd), "finalise a reduction descriptor");
        operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd},
                                                                 {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                                                                 {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y}});
    }
    // y: x seen with other dimensions and strides (a transposed view).
    void reshape(Desc x, Desc y) {
        operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                  {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}});
    }
    // The causal mask on scores s [b, h, T, T]: where the row (query) index is below the column
    // (key) index, -inf.
    Desc causal_mask(Desc s, Desc neg_inf, const Dims4& square) {
        Desc row = scratch(square, CUDNN_DATA_INT32), col = scratch(square, CUDNN_DATA_INT32);
        Desc keep = scratch(square, CUDNN_DATA_BOOLEAN), masked = scratch(square);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, 2);
        pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, 3);
        pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, -1, CUDNN_DATA_BOOLEAN);
        pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, keep, masked);
        return masked;
    }
    // The operation graph of the ops added, finalised; with a handle (null: the graph alone, no GPU).
    Desc finish(cudnnHandle_t handle) {
        Desc g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data(),
            "operation graph ops");
        if (handle) set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
        ck(g_cudnn.finalize(g), "finalise the operation graph");
        return g;
    }
};

// The unique ids of the real tensors and scalars.
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV, UID_DELTA, UID_SCALE,
                 UID_NEG_INF, UID_ONE };

struct AttentionShape {
    int B, T, H, Hkv, D;
};

// The tensors of ./train's layouts: Q and K inside qk [B, T, H + Hkv, D], V inside qkv
// [B, T, (H + 2 Hkv) D], O and dO [B, T, H D], Stats = lse [B, H, T]; the gradients like their inputs.
struct Layouts {
    Dims4 q_dims, q_strides, k_dims, k_strides, v_dims, v_strides, o_dims, o_strides, stats_dims, stats_strides, square;
    explicit Layouts(const AttentionShape& s) {
        const int NH = s.H + s.Hkv;
        bhsd(q_dims, q_strides, s.B, s.H, s.T, s.D, (int64_t)NH * s.D);
        bhsd(k_dims, k_strides, s.B, s.Hkv, s.T, s.D, (int64_t)NH * s.D);
        bhsd(v_dims, v_strides, s.B, s.Hkv, s.T, s.D, (int64_t)(s.H + 2 * s.Hkv) * s.D);
        bhsd(o_dims, o_strides, s.B, s.H, s.T, s.D, (int64_t)s.H * s.D);
        stats_dims = {{s.B, s.H, s.T, 1}};
        stats_strides = {{(int64_t)s.H * s.T, s.T, 1, 1}};
        square = {{s.B, s.H, s.T, s.T}};
    }
};

static void build_forward(Graph& g, const AttentionShape& s) {
    Layouts l(s);
    Dims4 kt_dims = l.k_dims, kt_strides = l.k_strides;
    transposed(kt_dims, kt_strides);
    Desc q = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, UID_Q);
    Desc kt = g.tensor(kt_dims, kt_strides, CUDNN_DATA_BFLOAT16, UID_K);
    Desc v = g.tensor(l.v_dims, l.v_strides, CUDNN_DATA_BFLOAT16, UID_V);
    Desc o = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, UID_O);
    Desc stats = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, UID_STATS);
    Desc scale = g.scalar(UID_SCALE), neg_inf = g.scalar(UID_NEG_INF);
    Dims4 rows{{s.B, s.H, s.T, 1}};
    Desc scores = g.scratch(l.square), scaled = g.scratch(l.square);
    g.matmul(q, kt, scores);
    g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, nullptr, scaled);
    Desc masked = g.causal_mask(scaled, neg_inf, l.square);
    Desc row_max = g.scratch(rows), shifted = g.scratch(l.square), e = g.scratch(l.square);
    Desc row_sum = g.scratch(rows), log_sum = g.scratch(rows), p = g.scratch(l.square, CUDNN_DATA_BFLOAT16);
    g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
    g.pointwise(CUDNN_POINTWISE_SUB, masked, row_max, nullptr, shifted);
    g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
    g.pointwise(CUDNN_POINTWISE_LOG, row_sum, nullptr, nullptr, log_sum);
    g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_sum, nullptr, stats);
    g.pointwise(CUDNN_POINTWISE_DIV, e, row_sum, nullptr, p);
    g.matmul(p, v, o);
}

static void build_backward(Graph& g, const AttentionShape& s) {
    Layouts l(s);
    const bool gqa = s.H != s.Hkv;
    Dims4 kt_dims = l.k_dims, kt_strides = l.k_strides, vt_dims = l.v_dims, vt_strides = l.v_strides;
    transposed(kt_dims, kt_strides);
    transposed(vt_dims, vt_strides);
    Desc q = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, UID_Q);
    Desc kt = g.tensor(kt_dims, kt_strides, CUDNN_DATA_BFLOAT16, UID_K);
    Desc vt = g.tensor(vt_dims, vt_strides, CUDNN_DATA_BFLOAT16, UID_V);
    Desc o = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, UID_O);
    Desc dout = g.tensor(l.o_dims, l.o_strides, CUDNN_DATA_BFLOAT16, UID_DO);
    Desc stats = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, UID_STATS);
    Desc dq = g.tensor(l.q_dims, l.q_strides, CUDNN_DATA_BFLOAT16, UID_DQ);
    Desc dk = g.tensor(l.k_dims, l.k_strides, CUDNN_DATA_BFLOAT16, UID_DK);
    Desc dv = g.tensor(l.v_dims, l.v_strides, CUDNN_DATA_BFLOAT16, UID_DV);
    Desc delta = g.tensor(l.stats_dims, l.stats_strides, CUDNN_DATA_FLOAT, UID_DELTA);
    Desc scale = g.scalar(UID_SCALE), neg_inf = g.scalar(UID_NEG_INF), one = g.scalar(UID_ONE);
    Dims4 rows{{s.B, s.H, s.T, 1}}, transposed_square{{s.B, s.H, s.T, s.T}};
    Dims4 transposed_square_strides{{(int64_t)s.H * s.T * s.T, (int64_t)s.T * s.T, 1, s.T}};
    // Delta = rowsum(dO * O), kept (non-virtual) for the products below.
    Desc prod = g.scratch(l.o_dims), prod_sum = g.scratch(rows);
    g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, prod);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, prod_sum);
    g.pointwise(CUDNN_POINTWISE_MUL, prod_sum, one, nullptr, delta);
    // P from the forward pass's statistics.
    Desc scores = g.scratch(l.square), scaled = g.scratch(l.square), centred = g.scratch(l.square);
    g.matmul(q, kt, scores);
    g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, nullptr, scaled);
    g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, centred);
    Desc masked = g.causal_mask(centred, neg_inf, l.square);
    Desc p = g.scratch(l.square);
    g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p);
    // A key-side gradient: square^T x, a [b, H, T, T] matrix seen transposed in bf16, summed over
    // each group's query heads with GQA.
    auto key_side_product = [&](Desc square, Desc x, Desc gradient) {
        Desc square_t = g.tensor(transposed_square, transposed_square_strides, CUDNN_DATA_BFLOAT16, 0, true);
        g.reshape(square, square_t);
        if (!gqa) return g.matmul(square_t, x, gradient);
        Desc full_heads = g.scratch({{s.B, s.H, s.T, s.D}}, CUDNN_DATA_BFLOAT16);
        g.matmul(square_t, x, full_heads);
        g.reduction(CUDNN_REDUCE_TENSOR_ADD, full_heads, gradient);
    };
    key_side_product(p, dout, dv);  // dV = P^T dO
    // dS = P (dO V^T - Delta) scale.
    Desc dp = g.scratch(l.square), dp_centred = g.scratch(l.square), dp_p = g.scratch(l.square), ds = g.scratch(l.square);
    g.matmul(dout, vt, dp);
    g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, nullptr, dp_centred);
    g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, nullptr, dp_p);
    g.pointwise(CUDNN_POINTWISE_MUL, dp_p, scale, nullptr, ds);
    key_side_product(ds, q, dk);  // dK = dS^T Q
    // dQ = dS K, straight into dQ.
    Desc k_view = g.tensor(l.k_dims, l.k_strides, CUDNN_DATA_FLOAT, 0, true);
    g.reshape(kt, k_view);
    g.matmul(ds, k_view, dq);
}

// ---------------------------------------------------------------------------------------------
// A graph made runnable: the first engine configuration cuDNN's heuristics offer that finalises as
// an execution plan, and the workspace it needs.

struct Plan {
    Graph graph;
    Desc plan = nullptr;
    int64_t workspace_bytes = 0;
    std::string engine;
};

static void make_plan(Plan& p, cudnnHandle_t handle) {
    Desc op_graph = p.graph.finish(handle);
    Desc heur = p.graph.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    Graph::set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, op_graph, "heuristics graph");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    Graph::set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    ck(g_cudnn.finalize(heur), "finalise the heuristics");
    int64_t count = 0;
    ck(g_cudnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
       "count the engine configurations");
    if (count == 0) throw std::runtime_error("the heuristics offer no engine for this graph");
    std::vector<Desc> configs(count);
    for (Desc& c : configs) c = p.graph.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    ck(g_cudnn.get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                             configs.data()),
       "read the engine configurations");
    std::string refusals;
    for (int64_t i = 0; i < count; i++) {
        Desc plan = p.graph.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        // The handle again on the plan: cuDNN 9.19 takes it from the graph, versions before 9.11 want it here.
        Graph::set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
        Graph::set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "plan engine configuration");
        cudnnStatus_t status = g_cudnn.finalize(plan);
        if (status != CUDNN_STATUS_SUCCESS) {
            char detail[512] = "";
            g_cudnn.last_error(detail, sizeof detail);
            refusals += strprintf(" [%lld: %s %s]", (long long)i, g_cudnn.error_string(status), detail);
            continue;
        }
        ck(g_cudnn.get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, nullptr,
                                 &p.workspace_bytes),
           "read the plan's workspace");
        p.plan = plan;
        p.engine = strprintf("configuration %lld of %lld", (long long)i, (long long)count);
        return;
    }
    throw std::runtime_error("no engine configuration finalises:" + refusals);
}

// Runs a plan with the given (uid, pointer) pairs; the workspace is the caller's.
static void execute(cudnnHandle_t handle, Plan& p, const std::vector<std::pair<int64_t, void*>>& tensors, void* workspace) {
    std::vector<int64_t> uids;
    std::vector<void*> pointers;
    for (auto& t : tensors) {
        uids.push_back(t.first);
        pointers.push_back(t.second);
    }
    Desc pack;
    ck(g_cudnn.create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "create the variant pack");
    try {
        Graph::set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data(), "pack ids");
        Graph::set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)pointers.size(),
                   pointers.data(), "pack pointers");
        Graph::set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "pack workspace");
        ck(g_cudnn.finalize(pack), "finalise the variant pack");
        ck(g_cudnn.execute(handle, p.plan, pack), "execute");
    } catch (...) {
        g_cudnn.destroy_descriptor(pack);
        throw;
    }
    g_cudnn.destroy_descriptor(pack);
}

// ---------------------------------------------------------------------------------------------
// The experiment on one shape.

static std::string shape_name(const AttentionShape& s) {
    return strprintf("B%d T%d H%d:%d D%d", s.B, s.T, s.H, s.Hkv, s.D);
}

// Both graphs finalise as operation graphs (no handle, no GPU).
static void check_graphs(const AttentionShape& s) {
    for (int backward = 0; backward < 2; backward++) {
        const char* pass = backward ? "backward" : "forward";
        try {
            Graph g;
            if (backward) build_backward(g, s);
            else build_forward(g, s);
            g.finish(nullptr);
            report(true, strprintf("cuDNN %s graph %s", pass, shape_name(s).c_str()), strprintf("%zu operations", g.ops.size()));
        } catch (const std::exception& e) {
            report(false, strprintf("cuDNN %s graph %s", pass, shape_name(s).c_str()), e.what());
        }
    }
}

static void compare_bf16(const std::string& name, const bf16* got, const bf16* want, size_t n) {
    compare_to_reference(name, download_bf16(got, n), download_bf16(want, n));
}

static void experiment(cudnnHandle_t handle, const AttentionShape& s, bool timing) {
    const std::string tag = " " + shape_name(s);
    const int NH = s.H + s.Hkv;
    const size_t qk_n = (size_t)s.B * s.T * NH * s.D, qkv_n = (size_t)s.B * s.T * (s.H + 2 * s.Hkv) * s.D;
    const size_t out_n = (size_t)s.B * s.T * s.H * s.D, rows = (size_t)s.B * s.H * s.T;
    Rng rng{(uint64_t)s.T * 7 + s.H};
    bf16 *qk = upload_bf16(random_values(qk_n, 1.0f, rng)), *qkv = upload_bf16(random_values(qkv_n, 1.0f, rng));
    bf16* dout = upload_bf16(random_values(out_n, 1.0f, rng));
    bf16 *out_ref, *out, *dqk_ref, *dqkv_ref, *dqk, *dqkv;
    float *lse_ref, *lse, *delta;
    for (bf16** p : {&out_ref, &out}) cudaCheck(cudaMalloc(p, out_n * sizeof(bf16)));
    for (bf16** p : {&dqk_ref, &dqk}) cudaCheck(cudaMalloc(p, qk_n * sizeof(bf16)));
    for (bf16** p : {&dqkv_ref, &dqkv}) cudaCheck(cudaMalloc(p, qkv_n * sizeof(bf16)));
    for (float** p : {&lse_ref, &lse, &delta}) cudaCheck(cudaMalloc(p, rows * sizeof(float)));
    for (bf16* p : {dqkv_ref, dqkv}) cudaCheck(cudaMemset(p, 0, qkv_n * sizeof(bf16)));

    // ./train's tensor-core kernels: the reference.
    auto ours_forward = [&] { attention_forward(out_ref, lse_ref, nullptr, nullptr, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0); };
    auto ours_backward = [&] {
        attention_backward(dqk_ref, dqkv_ref, delta, dout, out_ref, lse_ref, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
    };
    ours_forward();
    ours_backward();

    // cuDNN before 9.10 wants the mask's fill finite (a row of masked scores must not give -inf - -inf).
    float scale = 1.0f / sqrtf((float)s.D), neg_inf = g_cudnn.get_version() < 91000 ? -FLT_MAX : -INFINITY, one = 1.0f;
    const size_t v_offset = (size_t)(s.H + s.Hkv) * s.D, k_offset = (size_t)s.H * s.D;
    // The plans, each reported on its own, so that one refused leaves the other's checks and times.
    Plan fwd, bwd;
    for (int backward = 0; backward < 2; backward++) {
        Plan& p = backward ? bwd : fwd;
        const std::string name = strprintf("cuDNN %s plan", backward ? "backward" : "forward") + tag;
        try {
            if (backward) build_backward(p.graph, s);
            else build_forward(p.graph, s);
            make_plan(p, handle);
            report(true, name, p.engine + strprintf(", %lld bytes of workspace", (long long)p.workspace_bytes));
        } catch (const std::exception& e) {
            report(false, name, e.what());
        }
    }
    void* workspace = nullptr;
    cudaCheck(cudaMalloc(&workspace, std::max<int64_t>(1, std::max(fwd.workspace_bytes, bwd.workspace_bytes))));
    const double fwd_flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0, bwd_flops = 2.5 * fwd_flops;
    if (fwd.plan) {
        auto cudnn_forward = [&] {
            execute(handle, fwd, {{UID_Q, qk}, {UID_K, qk + k_offset}, {UID_V, qkv + v_offset}, {UID_O, out},
                                  {UID_STATS, lse}, {UID_SCALE, &scale}, {UID_NEG_INF, &neg_inf}},
                    workspace);
        };
        try {
            cudnn_forward();
            compare_bf16("cuDNN forward: out" + tag, out, out_ref, out_n);
            check_close("cuDNN forward: lse (natural log)" + tag, download(lse, rows).data(),
                        download(lse_ref, rows).data(), rows, 1e-4, 1e-3);
            if (timing) {
                float ours = time_ms(ours_forward), cudnn = time_ms(cudnn_forward);
                printf("   %s forward: mma %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s)\n", shape_name(s).c_str(),
                       ours, fwd_flops / ours * 1e-9, cudnn, fwd_flops / cudnn * 1e-9);
            }
        } catch (const std::exception& e) {
            report(false, "cuDNN forward" + tag, e.what());
        }
    }
    if (bwd.plan) {
        // From ./train's forward pass (out, lse), so that this check needs nothing of cuDNN's forward.
        auto cudnn_backward = [&] {
            execute(handle, bwd, {{UID_Q, qk}, {UID_K, qk + k_offset}, {UID_V, qkv + v_offset}, {UID_O, out_ref},
                                  {UID_DO, dout}, {UID_STATS, lse_ref}, {UID_DQ, dqk}, {UID_DK, dqk + k_offset},
                                  {UID_DV, dqkv + v_offset}, {UID_DELTA, delta}, {UID_SCALE, &scale},
                                  {UID_NEG_INF, &neg_inf}, {UID_ONE, &one}},
                    workspace);
        };
        try {
            cudnn_backward();
            std::vector<float> dqk_got = download_bf16(dqk, qk_n), dqkv_got = download_bf16(dqkv, qkv_n);
            compare_to_reference("cuDNN backward: dq and dk" + tag, dqk_got, download_bf16(dqk_ref, qk_n));
            compare_to_reference("cuDNN backward: dv (and the untouched query, key parts)" + tag, dqkv_got,
                                 download_bf16(dqkv_ref, qkv_n));
            // The same bits on every run: checked after a second run, and again after the timed ones.
            auto same_bits_as_first = [&] {
                return download_bf16(dqk, qk_n) == dqk_got && download_bf16(dqkv, qkv_n) == dqkv_got;
            };
            cudnn_backward();
            bool same = same_bits_as_first();
            if (timing) {
                float ours = time_ms(ours_backward), cudnn = time_ms(cudnn_backward);
                printf("   %s backward: mma %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s)\n", shape_name(s).c_str(),
                       ours, bwd_flops / ours * 1e-9, cudnn, bwd_flops / cudnn * 1e-9);
                same = same && same_bits_as_first();
            }
            report(same, "cuDNN backward: the same bits on every run" + tag, same ? "" : "they differ: not deterministic");
        } catch (const std::exception& e) {
            report(false, "cuDNN backward" + tag, e.what());
        }
    }
    cudaCheck(cudaFree(workspace));
    for (void* p : {(void*)qk, (void*)qkv, (void*)dout, (void*)out_ref, (void*)out, (void*)dqk_ref, (void*)dqk,
                    (void*)dqkv_ref, (void*)dqkv, (void*)lse_ref, (void*)lse, (void*)delta})
        cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    bool graph_only = argc == 2 && strcmp(argv[1], "--graph-only") == 0;
    if (argc > 1 && !graph_only) fail("usage: %s [--graph-only]", argv[0]);
    std::string why;
    if (!cudnn_load(&why)) {
        report(false, "cuDNN", why);
        printf("\n%d passed, %d failed\n", g_passed, g_failed);
        return 1;
    }
    printf("cuDNN %zu\n", g_cudnn.get_version());
    // The layers the timings are for come first: a failure that ends the process (an illegal memory
    // access in cuDNN) then loses the least.
    const AttentionShape shapes[] = {
        {4, 2048, 8, 8, 64},    // the d22 layer
        {8, 2048, 8, 8, 64},    // the same at 8 x 2048
        {4, 2048, 16, 8, 128},  // Qwen3-0.6B's layer
        {2, 256, 4, 4, 64},     // small, H == Hkv
        {2, 200, 8, 2, 64},     // GQA 8:2, T not a multiple of 64
        {1, 300, 4, 2, 128},    // head_dim 128, T not a multiple of 64
    };
    if (graph_only) {
        for (const AttentionShape& s : shapes) check_graphs(s);
    } else if (require_gpu()) {
        cudnnHandle_t handle = nullptr;
        try {
            ck(g_cudnn.create(&handle), "create a handle");
            ck(g_cudnn.set_stream(handle, 0), "set the stream");
        } catch (const std::exception& e) {
            report(false, "cuDNN handle", e.what());
        }
        // cuDNN 9.10.0 and 9.10.1 compute this attention wrongly (their release notes); up to 9.15 the
        // backward needs T a multiple of 128 (it gives NaN otherwise).
        const size_t version = g_cudnn.get_version();
        if (version >= 91000 && version < 91002) report(false, "cuDNN version", "9.10.0 and 9.10.1 are known to be wrong here");
        else if (handle) {
            for (const AttentionShape& s : shapes) {
                if (version <= 91500 && s.T % 128 != 0) {
                    printf("(%s left out: cuDNN %zu's backward needs T a multiple of 128)\n", shape_name(s).c_str(), version);
                    continue;
                }
                experiment(handle, s, s.T == 2048);
            }
        }
        if (handle) g_cudnn.destroy(handle);
    }
    printf("\n%d passed, %d failed\n", g_passed, g_failed);
    return test_exit_code();
}
