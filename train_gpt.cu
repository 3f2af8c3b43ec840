// train_gpt.cu: trains the GPT of docs/model.md and, while it trains, measures what its attention
// keys and attention patterns do (docs/telemetry.md), appending everything to a crash-safe
// binary log (docs/log_format.md).
//
// One program, two backends: the CUDA backend when a GPU is present, the CPU backend
// (llmc/model_cpu.h) otherwise, with the same options, the same log and the same checkpoints.
// Built by nvcc when the CUDA toolkit is installed; without it, the same file compiles as plain
// C++ (g++ -x c++) and holds the CPU backend only.
#include <omp.h>
#include <chrono>
#include <future>
#include <set>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/dataloader.h"
#include "llmc/dataprep.h"
#include "llmc/model_cpu.h"
#include "llmc/rand.h"
#include "llmc/runlog.h"
#include "llmc/telemetry.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

// =============================================================================================
// The CUDA backend. bf16 weights and activations, float32 master weights, gradients and AdamW
// state; matrix products in cuBLASLt with float32 accumulation. Every kernel is deterministic
// (no floating-point atomics), so the same run twice gives the same bits.
#ifdef __CUDACC__
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/encoder.cuh"
#include "llmc/matmul.cuh"
#include "llmc/qknorm_rope.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/telemetry.cuh"

struct GpuModel {
    ModelConfig cfg;
    int max_B = 0, max_T = 0, Vp = 0;  // Vp: the vocabulary rounded up to 128, the logits' row stride
    int B = 0, T = 0;                  // shape of the last forward pass
    size_t P = 0;
    float *params, *grads, *adam_m, *adam_v;  // float32, the layout of config.h
    bf16* params_bf16;                        // what the forward and backward passes read
    float *rope_cos, *rope_sin;               // [max_seq_len, D/2]
    // Activations kept for the backward pass ([L, ...] buffers hold all layers back to back;
    // the shapes are those of CpuActivations in llmc/model_cpu.h).
    bf16 *emb, *ln1, *qkv, *qk_rope, *atty, *res_attn, *ln2, *fc13, *swi, *res_mlp, *lnf, *logits;
    float *ln1_rstd, *qk_rstd, *att_lse, *ln2_rstd, *lnf_rstd, *losses;
    // Gradients of activations, one layer at a time.
    bf16 *dres, *dln, *dqkv, *dqk, *datty, *dfc13, *dswi;
    float *dgain_scratch, *att_delta;
    // Telemetry: the post-norm, pre-RoPE queries and keys of the layer being measured, the attention
    // kernel's per-row accumulators, the partial sums and the stats buffer (telemetry.cuh).
    bf16* qk_normed;
    float *row_stats, *stats, *stats_partial, *stats_host;
    TelemetryLayout stats_layout;
    std::future<void> stats_done;  // the host's share of the statistics (effective ranks), running
    // Inputs and optimiser bookkeeping.
    int *tokens, *targets, *buckets;
    TokenBuckets host_buckets;
    double* norm_partial;
    float *grad_norm, *losses_host;
    ParamSegment* segments;
    int num_segments = 0;
    Matmul mm;
    cudaStream_t stream;
};

template <typename T>
static T* device_alloc(size_t count) {
    T* p = nullptr;
    cudaError_t err = cudaMalloc(&p, count * sizeof(T));
    if (err == cudaErrorMemoryAllocation)
        fail("options -b (--batch) and -t (--seq-len): the GPU has no room for this model's activations "
             "(%.1f GB more were asked for)", count * sizeof(T) / 1e9);
    cudaCheck(err);
    cudaCheck(cudaMemset(p, 0, count * sizeof(T)));
    return p;
}

inline bool cuda_device_present(std::string* name) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();  // clear the error state
        return false;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    *name = prop.name;
    return true;
}

static void gpu_model_init(GpuModel& g, const ModelConfig& c, int max_B, int max_T) {
    if (c.head_dim != 64 && c.head_dim != 128) fail("the CUDA backend supports head_dim 64 and 128, not %d", c.head_dim);
    if (c.d_ff % 8 != 0) fail("the CUDA backend needs d_ff to be a multiple of 8 (got %d)", c.d_ff);
    g.cfg = c;
    g.max_B = max_B;
    g.max_T = max_T;
    g.Vp = (c.vocab_size + 127) / 128 * 128;
    g.P = num_parameters(c);
    cudaCheck(cudaStreamCreate(&g.stream));
    matmul_init(g.mm);
    size_t P = g.P, N = (size_t)max_B * max_T, L = c.n_layer, C = c.d_model, F = c.d_ff, D = c.head_dim;
    size_t H = c.n_head, NH = H + c.n_kv_head, QKV = c.qkv_dim();
    g.params = device_alloc<float>(P);
    g.grads = device_alloc<float>(P);
    g.adam_m = device_alloc<float>(P);
    g.adam_v = device_alloc<float>(P);
    g.params_bf16 = device_alloc<bf16>(P);
    std::vector<float> cs((size_t)c.max_seq_len * D / 2), sn(cs.size());
    for (int t = 0; t < c.max_seq_len; t++)
        for (size_t i = 0; i < D / 2; i++) {
            double a = rope_angle(t, (int)i, (int)D, c.rope_theta);
            cs[t * D / 2 + i] = (float)cos(a);
            sn[t * D / 2 + i] = (float)sin(a);
        }
    g.rope_cos = device_alloc<float>(cs.size());
    g.rope_sin = device_alloc<float>(sn.size());
    cudaCheck(cudaMemcpy(g.rope_cos, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g.rope_sin, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
    g.emb = device_alloc<bf16>(N * C);
    g.ln1 = device_alloc<bf16>(L * N * C);
    g.ln1_rstd = device_alloc<float>(L * N);
    g.qkv = device_alloc<bf16>(L * N * QKV);
    g.qk_rstd = device_alloc<float>(L * N * NH);
    g.qk_rope = device_alloc<bf16>(L * N * NH * D);
    g.att_lse = device_alloc<float>(L * N * H);
    g.atty = device_alloc<bf16>(L * N * C);
    g.res_attn = device_alloc<bf16>(L * N * C);
    g.ln2 = device_alloc<bf16>(L * N * C);
    g.ln2_rstd = device_alloc<float>(L * N);
    g.fc13 = device_alloc<bf16>(L * N * 2 * F);
    g.swi = device_alloc<bf16>(L * N * F);
    g.res_mlp = device_alloc<bf16>(L * N * C);
    g.lnf = device_alloc<bf16>(N * C);
    g.lnf_rstd = device_alloc<float>(N);
    g.logits = device_alloc<bf16>(N * g.Vp);
    g.losses = device_alloc<float>(N);
    g.dres = device_alloc<bf16>(N * C);
    g.dln = device_alloc<bf16>(N * C);
    g.dqkv = device_alloc<bf16>(N * QKV);
    g.dqk = device_alloc<bf16>(N * NH * D);
    g.datty = device_alloc<bf16>(N * C);
    g.dfc13 = device_alloc<bf16>(N * 2 * F);
    g.dswi = device_alloc<bf16>(N * F);
    size_t scratch = std::max((size_t)rmsnorm_backward_blocks((int)N) * C, (size_t)qk_norm_rope_backward_blocks((int)N, (int)NH) * 2 * D);
    g.dgain_scratch = device_alloc<float>(scratch);
    g.att_delta = device_alloc<float>(N * H);
    g.qk_normed = device_alloc<bf16>(N * NH * D);
    g.row_stats = device_alloc<float>(4 * N * H);
    g.stats_layout = telemetry_layout(c);
    g.stats = device_alloc<float>(g.stats_layout.total);
    g.stats_partial = device_alloc<float>(telemetry_partial_floats((int)N, c));
    cudaCheck(cudaMallocHost(&g.stats_host, g.stats_layout.total * sizeof(float)));
    cudaCheck(cudaMallocHost(&g.losses_host, N * sizeof(float)));
    g.tokens = device_alloc<int>(N);
    g.targets = device_alloc<int>(N);
    g.buckets = device_alloc<int>(3 * N + 1);
    g.norm_partial = device_alloc<double>(kNormBlocks);
    g.grad_norm = device_alloc<float>(1);
    // AdamW segments: runs of consecutive tensors with the same weight decay flag.
    std::vector<ParamSegment> segs;
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        int layers = param_is_per_layer(kind) ? c.n_layer : 1;
        for (int l = 0; l < layers; l++) {
            long long start = (long long)param_offset(c, kind, l), count = (long long)param_numel(c, kind);
            segs.push_back({start, count, param_is_matrix(kind) ? 1 : 0});
        }
    }
    std::sort(segs.begin(), segs.end(), [](const ParamSegment& a, const ParamSegment& b) { return a.start < b.start; });
    std::vector<ParamSegment> merged;
    for (const ParamSegment& s : segs) {
        if (!merged.empty() && merged.back().decay == s.decay && merged.back().start + merged.back().count == s.start)
            merged.back().count += s.count;
        else
            merged.push_back(s);
    }
    g.num_segments = (int)merged.size();
    g.segments = device_alloc<ParamSegment>(merged.size());
    cudaCheck(cudaMemcpy(g.segments, merged.data(), merged.size() * sizeof(ParamSegment), cudaMemcpyHostToDevice));
}

static void gpu_upload_params(GpuModel& g, const float* params, const float* m, const float* v) {
    cudaCheck(cudaMemcpy(g.params, params, g.P * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g.adam_m, m, g.P * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g.adam_v, v, g.P * sizeof(float), cudaMemcpyHostToDevice));
    float_to_bf16(g.params_bf16, g.params, (long long)g.P, g.stream);
    cudaCheck(cudaStreamSynchronize(g.stream));
}

static void gpu_download_params(GpuModel& g, float* params, float* m, float* v) {
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(params, g.params, g.P * sizeof(float), cudaMemcpyDeviceToHost));
    if (m) cudaCheck(cudaMemcpy(m, g.adam_m, g.P * sizeof(float), cudaMemcpyDeviceToHost));
    if (v) cudaCheck(cudaMemcpy(v, g.adam_v, g.P * sizeof(float), cudaMemcpyDeviceToHost));
}

static bf16* gpu_param(GpuModel& g, int kind, int l = 0) { return g.params_bf16 + param_offset(g.cfg, kind, l); }
static float* gpu_grad(GpuModel& g, int kind, int l = 0) { return g.grads + param_offset(g.cfg, kind, l); }

// Forward pass; same contract as cpu_forward. Leaves the logits on the device (row stride Vp).
static float gpu_forward(GpuModel& g, const int* tokens, const int* targets, int B, int T, Telemetry* tm) {
    const ModelConfig& c = g.cfg;
    if (B > g.max_B || T > g.max_T) fail("internal: batch %dx%d exceeds the allocated %dx%d", B, T, g.max_B, g.max_T);
    g.B = B;
    g.T = T;
    int N = B * T, C = c.d_model, F = c.d_ff, L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    int NH = H + Hkv, QKV = c.qkv_dim();
    cudaStream_t s = g.stream;
    cudaCheck(cudaMemcpyAsync(g.tokens, tokens, N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (targets) cudaCheck(cudaMemcpyAsync(g.targets, targets, N * sizeof(int), cudaMemcpyHostToDevice, s));
    embedding_forward(g.emb, g.tokens, gpu_param(g, P_WTE), N, C, s);
    for (int l = 0; l < L; l++) {
        const bf16* x = l == 0 ? g.emb : g.res_mlp + (size_t)(l - 1) * N * C;
        bf16* ln1 = g.ln1 + (size_t)l * N * C;
        bf16* qkv = g.qkv + (size_t)l * N * QKV;
        bf16* qk_rope = g.qk_rope + (size_t)l * N * NH * D;
        float* lse = g.att_lse + (size_t)l * N * H;
        bf16* atty = g.atty + (size_t)l * N * C;
        bf16* res_attn = g.res_attn + (size_t)l * N * C;
        bf16* ln2 = g.ln2 + (size_t)l * N * C;
        bf16* fc13 = g.fc13 + (size_t)l * N * 2 * F;
        bf16* swi = g.swi + (size_t)l * N * F;
        bf16* res_mlp = g.res_mlp + (size_t)l * N * C;
        rmsnorm_forward(ln1, g.ln1_rstd + (size_t)l * N, x, gpu_param(g, P_ATTN_NORM, l), N, C, c.norm_eps, s);
        matmul_forward(g.mm, qkv, ln1, gpu_param(g, P_WQ, l), nullptr, N, C, QKV, s);  // [Wq; Wk; Wv] in one product
        qk_norm_rope_forward(qk_rope, tm ? g.qk_normed : nullptr, g.qk_rstd + (size_t)l * N * NH, qkv,
                             gpu_param(g, P_Q_NORM, l), gpu_param(g, P_K_NORM, l), g.rope_cos, g.rope_sin, N, T, H, Hkv,
                             D, c.norm_eps, s);
        attention_forward(atty, lse, tm ? g.row_stats : nullptr, qk_rope, qkv, B, T, H, Hkv, D, s);
        if (tm)
            telemetry_layer(g.stats, g.stats_layout, g.stats_partial, g.mm, g.qk_normed, g.row_stats,
                            g.params + param_offset(c, P_Q_NORM, l), B, T, c, l, s);
        matmul_forward(g.mm, res_attn, atty, gpu_param(g, P_WO, l), x, N, C, C, s);  // + residual
        rmsnorm_forward(ln2, g.ln2_rstd + (size_t)l * N, res_attn, gpu_param(g, P_MLP_NORM, l), N, C, c.norm_eps, s);
        matmul_forward(g.mm, fc13, ln2, gpu_param(g, P_W1, l), nullptr, N, C, 2 * F, s);  // [W1; W3]
        swiglu_forward(swi, fc13, N, F, s);
        matmul_forward(g.mm, res_mlp, swi, gpu_param(g, P_W2, l), res_attn, N, F, C, s);  // + residual
    }
    rmsnorm_forward(g.lnf, g.lnf_rstd, g.res_mlp + (size_t)(L - 1) * N * C, gpu_param(g, P_FINAL_NORM), N, C, c.norm_eps, s);
    matmul_forward(g.mm, g.logits, g.lnf, gpu_param(g, P_WTE), nullptr, N, C, c.vocab_size, s, g.Vp);
    if (tm) {
        cudaCheck(cudaMemcpyAsync(g.stats_host, g.stats, g.stats_layout.total * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    float mean = 0.0f;
    if (targets) {
        classifier(g.logits, g.losses, g.targets, N, c.vocab_size, g.Vp, 0.0f, s);
        cudaCheck(cudaMemcpyAsync(g.losses_host, g.losses, N * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    cudaCheck(cudaStreamSynchronize(s));
    // The effective ranks need an eigenvalue problem per layer and key head on the host: it runs
    // beside the GPU's backward pass; gpu_wait_stats waits for it.
    if (tm) g.stats_done = std::async(std::launch::async, [&g, tm] { telemetry_finish(*tm, g.stats_host, g.stats_layout, g.cfg); });
    if (targets) {
        double sum = 0;
        for (int n = 0; n < N; n++) sum += g.losses_host[n];
        mean = (float)(sum / N);
    }
    return mean;
}

// Backward pass of the last forward pass (which had targets); adds into g.grads.
static void gpu_backward(GpuModel& g, const int* tokens, float loss_scale) {
    const ModelConfig& c = g.cfg;
    int B = g.B, T = g.T, N = B * T, C = c.d_model, F = c.d_ff, L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head;
    int D = c.head_dim, NH = H + Hkv, QKV = c.qkv_dim(), V = c.vocab_size;
    cudaStream_t s = g.stream;
    classifier(g.logits, g.losses, g.targets, N, V, g.Vp, loss_scale / N, s);  // logits -> dlogits
    matmul_backward(g.mm, g.dln, gpu_grad(g, P_WTE), g.logits, g.lnf, gpu_param(g, P_WTE), N, C, V, s, g.Vp);
    cudaCheck(cudaMemsetAsync(g.dres, 0, (size_t)N * C * sizeof(bf16), s));
    rmsnorm_backward(g.dres, gpu_grad(g, P_FINAL_NORM), g.dgain_scratch, g.dln, g.res_mlp + (size_t)(L - 1) * N * C,
                     g.lnf_rstd, gpu_param(g, P_FINAL_NORM), N, C, s);
    for (int l = L - 1; l >= 0; l--) {
        const bf16* x = l == 0 ? g.emb : g.res_mlp + (size_t)(l - 1) * N * C;
        const bf16* res_attn = g.res_attn + (size_t)l * N * C;
        const bf16* atty = g.atty + (size_t)l * N * C;
        const bf16* qkv = g.qkv + (size_t)l * N * QKV;
        // MLP block (dres: gradient of the block's output, and, through the residual, of res_attn).
        matmul_backward(g.mm, g.dswi, gpu_grad(g, P_W2, l), g.dres, g.swi + (size_t)l * N * F, gpu_param(g, P_W2, l), N, F, C, s);
        swiglu_backward(g.dfc13, g.dswi, g.fc13 + (size_t)l * N * 2 * F, N, F, s);
        matmul_backward(g.mm, g.dln, gpu_grad(g, P_W1, l), g.dfc13, g.ln2 + (size_t)l * N * C, gpu_param(g, P_W1, l), N, C, 2 * F, s);
        rmsnorm_backward(g.dres, gpu_grad(g, P_MLP_NORM, l), g.dgain_scratch, g.dln, res_attn, g.ln2_rstd + (size_t)l * N,
                         gpu_param(g, P_MLP_NORM, l), N, C, s);
        // Attention block.
        matmul_backward(g.mm, g.datty, gpu_grad(g, P_WO, l), g.dres, atty, gpu_param(g, P_WO, l), N, C, C, s);
        attention_backward(g.dqk, g.dqkv, g.att_delta, g.datty, atty, g.att_lse + (size_t)l * N * H,
                           g.qk_rope + (size_t)l * N * NH * D, qkv, B, T, H, Hkv, D, s);
        qk_norm_rope_backward(g.dqkv, gpu_grad(g, P_Q_NORM, l), g.dgain_scratch, g.dqk, qkv, g.qk_rstd + (size_t)l * N * NH,
                              gpu_param(g, P_Q_NORM, l), gpu_param(g, P_K_NORM, l), g.rope_cos, g.rope_sin, N, T, H, Hkv, D, s);
        matmul_backward(g.mm, g.dln, gpu_grad(g, P_WQ, l), g.dqkv, g.ln1 + (size_t)l * N * C, gpu_param(g, P_WQ, l), N, C, QKV, s);
        rmsnorm_backward(g.dres, gpu_grad(g, P_ATTN_NORM, l), g.dgain_scratch, g.dln, x, g.ln1_rstd + (size_t)l * N,
                         gpu_param(g, P_ATTN_NORM, l), N, C, s);
    }
    group_positions_by_token(g.host_buckets, tokens, N, V);
    embedding_backward(gpu_grad(g, P_WTE), g.dres, g.host_buckets, g.buckets, N, C, s);
}

// Returns once the statistics of the last forward pass with statistics are complete.
static void gpu_wait_stats(GpuModel& g) {
    if (g.stats_done.valid()) g.stats_done.get();
}

static void gpu_zero_grad(GpuModel& g) { cudaCheck(cudaMemsetAsync(g.grads, 0, g.P * sizeof(float), g.stream)); }

static float gpu_grad_norm(GpuModel& g) {
    global_norm(g.grad_norm, g.norm_partial, g.grads, (long long)g.P, g.stream);
    float norm;
    cudaCheck(cudaMemcpyAsync(&norm, g.grad_norm, sizeof(float), cudaMemcpyDeviceToHost, g.stream));
    cudaCheck(cudaStreamSynchronize(g.stream));
    return norm;
}

// AdamW with clipping to max_norm by the norm gpu_grad_norm left on the device.
static void gpu_adamw_step(GpuModel& g, const AdamWSettings& o, int t, float max_norm) {
    adamw_step(g.params, g.params_bf16, g.grads, g.adam_m, g.adam_v, g.segments, g.num_segments, g.grad_norm, max_norm,
               o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t, g.stream);
}

// Row `row` of the last forward pass's logits, as floats.
static void gpu_logits_row(GpuModel& g, int row, float* out) {
    std::vector<bf16> tmp(g.cfg.vocab_size);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(tmp.data(), g.logits + (size_t)row * g.Vp, tmp.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (int v = 0; v < g.cfg.vocab_size; v++) out[v] = __bfloat162float(tmp[v]);
}
#endif  // __CUDACC__

extern "C" void openblas_set_num_threads(int);

// ---------------------------------------------------------------------------------------------
// Options. One table drives parsing, -h and the list of options recorded in the run log.

struct Options {
    std::string train_pattern, val_pattern, tokenizer, out_dir, init_ckpt, resume_ckpt;
    std::string preset = "d6", device = "auto", data_dir = "data/brown";
    int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0, d_ff = 0, max_seq_len = 0, vocab_size = 0;
    float rope_theta = 10000.0f, norm_eps = 1e-5f;
    int batch = 4, seq_len = 0, total_batch = 0, steps = 800, warmup = 40;
    float lr = 3e-3f, lr_floor = 0.1f, weight_decay = 0.1f, clip = 1.0f, beta1 = 0.9f, beta2 = 0.95f;
    int val_every = 100, val_batches = 16, ckpt_every = 0, stats_every = 10, shuffle = 1;
    int samples = 3, sample_tokens = 48, threads = 0, profile = 0;
    long long seed = 1337;
};

enum OptType { OPT_INT, OPT_LONG, OPT_FLOAT, OPT_STR };

struct OptSpec {
    const char* short_name;
    const char* long_name;
    OptType type;
    size_t offset;
    const char* help;
};

#define OPT(s, l, type, field, help) {s, l, type, offsetof(Options, field), help}
static const OptSpec kOptions[] = {
    // data
    OPT("-i", "--train", OPT_STR, train_pattern, "training shards, a glob (default: the Brown corpus, prepared on first use)"),
    OPT("-j", "--val", OPT_STR, val_pattern, "validation shards, a glob (default: the Brown corpus' validation split)"),
    OPT("-k", "--tokenizer", OPT_STR, tokenizer, "SentencePiece model for the vocabulary size and sampled text (default: tokenizer.model beside the training shards)"),
    OPT("", "--data-dir", OPT_STR, data_dir, "where the default corpus is prepared and cached"),
    OPT("", "--shuffle", OPT_INT, shuffle, "1: visit shards and windows in a seeded random order each epoch; 0: in order"),
    // model
    OPT("-m", "--preset", OPT_STR, preset, "model preset: d6 (default, minutes on a CPU), d12, d22 (the reports' model)"),
    OPT("", "--n-layer", OPT_INT, n_layer, "transformer blocks (overrides the preset)"),
    OPT("", "--n-head", OPT_INT, n_head, "query heads (d_model = n_head * head_dim)"),
    OPT("", "--n-kv-head", OPT_INT, n_kv_head, "key/value heads; must divide n_head (GQA when fewer)"),
    OPT("", "--head-dim", OPT_INT, head_dim, "width of a head (presets: 64)"),
    OPT("", "--d-ff", OPT_INT, d_ff, "SwiGLU hidden width"),
    OPT("", "--max-seq-len", OPT_INT, max_seq_len, "longest sequence the model is built for"),
    OPT("", "--vocab-size", OPT_INT, vocab_size, "vocabulary size (default: the tokenizer's; required for shards without one)"),
    OPT("", "--rope-theta", OPT_FLOAT, rope_theta, "RoPE base"),
    OPT("", "--norm-eps", OPT_FLOAT, norm_eps, "epsilon inside every RMSNorm"),
    OPT("-e", "--init", OPT_STR, init_ckpt, "start from the weights of this checkpoint (optimiser state fresh)"),
    OPT("-r", "--resume", OPT_STR, resume_ckpt, "resume this checkpoint's run: weights, AdamW state, step, data position, log"),
    // optimisation
    OPT("-b", "--batch", OPT_INT, batch, "micro-batch size, in sequences"),
    OPT("-t", "--seq-len", OPT_INT, seq_len, "sequence length (default: max_seq_len)"),
    OPT("-d", "--total-batch", OPT_INT, total_batch, "tokens per optimiser step, a multiple of batch * seq_len (gradient accumulation; default: one micro-batch)"),
    OPT("-x", "--steps", OPT_INT, steps, "optimiser steps"),
    OPT("-l", "--lr", OPT_FLOAT, lr, "peak learning rate"),
    OPT("-u", "--warmup", OPT_INT, warmup, "linear warm-up steps, then cosine decay"),
    OPT("-q", "--lr-floor", OPT_FLOAT, lr_floor, "final learning rate as a fraction of the peak"),
    OPT("-c", "--weight-decay", OPT_FLOAT, weight_decay, "AdamW weight decay on the matrices (not on gains)"),
    OPT("", "--clip", OPT_FLOAT, clip, "clip the global gradient norm to this (0: off)"),
    OPT("", "--beta1", OPT_FLOAT, beta1, "AdamW beta1"),
    OPT("", "--beta2", OPT_FLOAT, beta2, "AdamW beta2"),
    OPT("", "--seed", OPT_LONG, seed, "seed of the initial weights, the data order and the samples"),
    // evaluation, telemetry, output
    OPT("-v", "--val-every", OPT_INT, val_every, "evaluate the validation loss every N steps (0: only at the end)"),
    OPT("", "--val-batches", OPT_INT, val_batches, "micro-batches per validation (the same ones each time)"),
    OPT("-s", "--stats-every", OPT_INT, stats_every, "measure the key/attention statistics every N steps (0: never)"),
    OPT("-o", "--out", OPT_STR, out_dir, "output directory for the log and checkpoints (default: runs/<date>-<time>)"),
    OPT("-n", "--ckpt-every", OPT_INT, ckpt_every, "also write a checkpoint every N steps (0: only the final one)"),
    OPT("-g", "--sample-tokens", OPT_INT, sample_tokens, "tokens per sampled line printed at the end (0: none)"),
    OPT("", "--samples", OPT_INT, samples, "lines of text sampled at the end"),
    OPT("", "--device", OPT_STR, device, "auto (GPU when there is one), cpu or cuda"),
    OPT("", "--threads", OPT_INT, threads, "CPU threads (default: all)"),
    OPT("", "--profile", OPT_INT, profile, "1: time the phases of each step (forward, backward, optimiser) and print the means at the end"),
};
#undef OPT

static std::string option_value_text(const Options& o, const OptSpec& s) {
    const char* p = (const char*)&o + s.offset;
    switch (s.type) {
        case OPT_INT: return std::to_string(*(const int*)p);
        case OPT_LONG: return std::to_string(*(const long long*)p);
        case OPT_FLOAT: return strprintf("%g", *(const float*)p);
        case OPT_STR: return *(const std::string*)p;
    }
    return "";
}

static void print_help() {
    printf("usage: ./train [options]\n\n"
           "Trains a GPT (RMSNorm, QK-norm, RoPE, GQA, SwiGLU, tied embeddings) and logs, per layer and\n"
           "head, the statistics of its attention keys and attention patterns. With no options it trains\n"
           "the d6 preset on the Brown corpus, preparing the corpus the first time.\n\noptions:\n");
    const Options defaults;
    for (const OptSpec& o : kOptions) {
        char names[48];
        snprintf(names, sizeof names, "%s%s%s", o.short_name, o.short_name[0] ? ", " : "    ", o.long_name);
        std::string value = option_value_text(defaults, o);
        printf("  %-22s %s%s\n", names, o.help, value.empty() ? "" : (" [" + value + "]").c_str());
    }
    printf("  -h, --help             this text\n");
}

static std::string option_label(const OptSpec& s) {
    return s.short_name[0] ? strprintf("%s (%s)", s.short_name, s.long_name) : std::string(s.long_name);
}

// Fills `given` with the long names of the options on the command line.
static Options parse_options(int argc, char** argv, std::set<std::string>& given) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            print_help();
            exit(0);
        }
        const OptSpec* spec = nullptr;
        for (const OptSpec& s : kOptions)
            if ((s.short_name[0] && arg == s.short_name) || arg == s.long_name) spec = &s;
        if (!spec) fail("unknown option '%s' (./train -h lists them)", arg.c_str());
        given.insert(spec->long_name);
        if (i + 1 >= argc) fail("option %s needs a value", option_label(*spec).c_str());
        const char* v = argv[++i];
        char* end = nullptr;
        char* p = (char*)&o + spec->offset;
        errno = 0;
        switch (spec->type) {
            case OPT_INT: {
                long x = strtol(v, &end, 10);
                if (*v == '\0' || *end != '\0' || errno || x < -2147483647L || x > 2147483647L)
                    fail("option %s: '%s' is not an integer", option_label(*spec).c_str(), v);
                *(int*)p = (int)x;
                break;
            }
            case OPT_LONG: {
                long long x = strtoll(v, &end, 10);
                if (*v == '\0' || *end != '\0' || errno) fail("option %s: '%s' is not an integer", option_label(*spec).c_str(), v);
                *(long long*)p = x;
                break;
            }
            case OPT_FLOAT: {
                float x = strtof(v, &end);
                if (*v == '\0' || *end != '\0' || errno || !std::isfinite(x))
                    fail("option %s: '%s' is not a number", option_label(*spec).c_str(), v);
                *(float*)p = x;
                break;
            }
            case OPT_STR: *(std::string*)p = v; break;
        }
    }
    auto need = [](bool ok, const char* opt, const char* what) {
        if (!ok) fail("option %s: %s", opt, what);
    };
    need(o.batch >= 1, "-b (--batch)", "must be at least 1");
    need(o.seq_len >= 0, "-t (--seq-len)", "must not be negative (0: max_seq_len)");
    need(o.total_batch >= 0, "-d (--total-batch)", "must not be negative (0: one micro-batch)");
    need(o.steps >= 1, "-x (--steps)", "must be at least 1");
    need(o.warmup >= 0, "-u (--warmup)", "must not be negative");
    need(o.lr > 0, "-l (--lr)", "must be positive");
    need(o.lr_floor >= 0 && o.lr_floor <= 1, "-q (--lr-floor)", "must be between 0 and 1");
    need(o.weight_decay >= 0, "-c (--weight-decay)", "must not be negative");
    need(o.clip >= 0, "--clip", "must not be negative (0 turns clipping off)");
    need(o.beta1 >= 0 && o.beta1 < 1, "--beta1", "must be in [0, 1)");
    need(o.beta2 >= 0 && o.beta2 < 1, "--beta2", "must be in [0, 1)");
    need(o.val_every >= 0, "-v (--val-every)", "must not be negative");
    need(o.val_batches >= 1, "--val-batches", "must be at least 1");
    need(o.stats_every >= 0, "-s (--stats-every)", "must not be negative (0 turns statistics off)");
    need(o.ckpt_every >= 0, "-n (--ckpt-every)", "must not be negative");
    need(o.samples >= 0 && o.samples <= 64, "--samples", "must be between 0 and 64");
    need(o.sample_tokens >= 0, "-g (--sample-tokens)", "must not be negative");
    need(o.threads >= 0, "--threads", "must not be negative");
    need(o.shuffle == 0 || o.shuffle == 1, "--shuffle", "must be 0 or 1");
    need(o.profile == 0 || o.profile == 1, "--profile", "must be 0 or 1");
    need(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "--device", "must be auto, cpu or cuda");
    need(o.init_ckpt.empty() || o.resume_ckpt.empty(), "-e (--init)", "cannot be combined with -r (--resume)");
    return o;
}

// The model configuration: from the checkpoint when there is one (explicit model options must
// then agree with it), else from the preset and the explicit options.
static ModelConfig resolve_config(const Options& o, const std::set<std::string>& given, int tokenizer_vocab,
                                  const std::string& ckpt) {
    ModelConfig c;
    struct Explicit {
        int value;
        int ModelConfig::*field;
        const char* option;
    } ints[] = {{o.n_layer, &ModelConfig::n_layer, "--n-layer"},     {o.n_head, &ModelConfig::n_head, "--n-head"},
                {o.n_kv_head, &ModelConfig::n_kv_head, "--n-kv-head"}, {o.head_dim, &ModelConfig::head_dim, "--head-dim"},
                {o.d_ff, &ModelConfig::d_ff, "--d-ff"},                {o.max_seq_len, &ModelConfig::max_seq_len, "--max-seq-len"},
                {o.vocab_size, &ModelConfig::vocab_size, "--vocab-size"}};
    if (!ckpt.empty()) {
        c = checkpoint_read_header(ckpt).config;
        for (const Explicit& e : ints)
            if (e.value && e.value != c.*e.field)
                fail("option %s %d does not match the checkpoint %s, which has %d", e.option, e.value, ckpt.c_str(), c.*e.field);
        if (tokenizer_vocab && tokenizer_vocab != c.vocab_size)
            fail("%s: checkpoint vocabulary %d does not match the tokenizer's %d", ckpt.c_str(), c.vocab_size, tokenizer_vocab);
        if (given.count("--preset"))
            fail("option -m (--preset): the model comes from the checkpoint %s; leave the preset out", ckpt.c_str());
        if ((given.count("--rope-theta") && o.rope_theta != c.rope_theta) || (given.count("--norm-eps") && o.norm_eps != c.norm_eps))
            fail("option %s does not match the checkpoint %s (rope_theta %g, norm_eps %g)",
                 given.count("--rope-theta") ? "--rope-theta" : "--norm-eps", ckpt.c_str(), c.rope_theta, c.norm_eps);
        return c;
    }
    const Preset* p = find_preset(o.preset.c_str());
    if (!p) fail("option -m (--preset): unknown preset '%s' (d6, d12, d22)", o.preset.c_str());
    apply_preset(c, *p);
    c.vocab_size = tokenizer_vocab;
    for (const Explicit& e : ints)
        if (e.value < 0) fail("option %s must be positive", e.option);
        else if (e.value) c.*e.field = e.value;
    c.d_model = c.n_head * c.head_dim;
    c.rope_theta = o.rope_theta;
    c.norm_eps = o.norm_eps;
    if (tokenizer_vocab && o.vocab_size && o.vocab_size != tokenizer_vocab)
        fail("option --vocab-size %d does not match the tokenizer's %d", o.vocab_size, tokenizer_vocab);
    if (!c.vocab_size) fail("option --vocab-size: needed when the shards have no tokenizer (-k)");
    std::string err = config_error(c);
    if (!err.empty()) fail("model options: %s", err.c_str());
    return c;
}

static double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::string format_duration(double s) {
    int t = (int)(s + 0.5);
    if (t >= 3600) return strprintf("%dh%02dm", t / 3600, t / 60 % 60);
    if (t >= 60) return strprintf("%dm%02ds", t / 60, t % 60);
    return strprintf("%ds", t);
}

static std::string cpu_device_name(int threads) {
    std::string name = "CPU";
    if (FILE* f = fopen("/proc/cpuinfo", "r")) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                const char* colon = strchr(line, ':');
                if (colon) name = std::string(colon + 2, strcspn(colon + 2, "\n"));
                break;
            }
        fclose(f);
    }
    return strprintf("%s, %d threads", name.c_str(), threads);
}

// ---------------------------------------------------------------------------------------------
// The backend in use. Each model_* function runs on the GPU when there is one, on the CPU else.

struct Trainer {
    bool on_gpu = false;
    CpuModel cpu;  // the CPU backend; on the GPU path only its parameter and AdamW arrays are used,
                   // as the host copy for initialisation and checkpoints
#ifdef __CUDACC__
    GpuModel gpu;
#endif
};

static float model_forward(Trainer& t, const int* tokens, const int* targets, int B, int T, Telemetry* tm) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_forward(t.gpu, tokens, targets, B, T, tm);
#endif
    return cpu_forward(t.cpu, tokens, targets, B, T, tm);
}

static void model_backward(Trainer& t, const int* tokens, const int* targets, float loss_scale) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_backward(t.gpu, tokens, loss_scale);
#endif
    cpu_backward(t.cpu, tokens, targets, loss_scale);
}

static void model_zero_grad(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_zero_grad(t.gpu);
#endif
    cpu_zero_grad(t.cpu);
}

static float model_grad_norm(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_grad_norm(t.gpu);
#endif
    return cpu_grad_norm(t.cpu);
}

// One AdamW step; the gradient norm is the one model_grad_norm just returned.
static void model_adamw(Trainer& t, const AdamWSettings& o, int step, float grad_norm, float clip) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_adamw_step(t.gpu, o, step, clip);
#endif
    cpu_adamw_step(t.cpu, o, step, clip_scale(grad_norm, clip));
}

// Returns once the statistics of the last forward pass that measured them are complete.
static void model_wait_stats(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) gpu_wait_stats(t.gpu);
#else
    (void)t;
#endif
}

// Returns once the device has finished the work queued so far (timing).
static void model_wait(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) cudaCheck(cudaStreamSynchronize(t.gpu.stream));
#else
    (void)t;
#endif
}

static void model_logits_row(Trainer& t, int row, float* out) {
#ifdef __CUDACC__
    if (t.on_gpu) return gpu_logits_row(t.gpu, row, out);
#endif
    const float* z = &t.cpu.acts.logits[(size_t)row * t.cpu.cfg.vocab_size];
    std::copy(z, z + t.cpu.cfg.vocab_size, out);
}

// Makes the host arrays (t.cpu.params, adam_m, adam_v) current, e.g. before a checkpoint.
static void model_sync_to_host(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) gpu_download_params(t.gpu, t.cpu.params.data(), t.cpu.adam_m.data(), t.cpu.adam_v.data());
#else
    (void)t;
#endif
}

static void model_sync_to_device(Trainer& t) {
#ifdef __CUDACC__
    if (t.on_gpu) gpu_upload_params(t.gpu, t.cpu.params.data(), t.cpu.adam_m.data(), t.cpu.adam_v.data());
#else
    (void)t;
#endif
}

// ---------------------------------------------------------------------------------------------
// Sampling: continue from the document-start token with temperature 0.8.

static void print_samples(Trainer& tr, int max_B, int max_T, const Tokenizer& tok, const Options& o, uint64_t seed) {
    if (o.samples == 0 || o.sample_tokens == 0) return;
    int V = tr.cpu.cfg.vocab_size, S = std::min(o.samples, max_B), len = 1;
    std::vector<std::vector<int>> seqs(S, std::vector<int>{tokenizer_bos_id(&tok)});
    std::vector<int> window;
    std::vector<float> z(V);
    std::vector<double> prob(V);
    Rng rng{seed};
    for (int i = 0; i < o.sample_tokens; i++, len++) {
        int T = std::min(len, max_T);
        window.assign((size_t)S * T, 0);
        for (int s = 0; s < S; s++)
            for (int t = 0; t < T; t++) window[(size_t)s * T + t] = seqs[s][len - T + t];
        model_forward(tr, window.data(), nullptr, S, T, nullptr);
        for (int s = 0; s < S; s++) {
            model_logits_row(tr, s * T + T - 1, z.data());
            double mx = -1e300, total = 0;
            for (int v = 0; v < V; v++) mx = std::max(mx, (double)z[v]);
            for (int v = 0; v < V; v++) total += prob[v] = exp((z[v] - mx) / 0.8);
            double u = rng_uniform(rng) * total;
            int pick = V - 1;
            for (int v = 0; v < V; v++)
                if ((u -= prob[v]) <= 0) {
                    pick = v;
                    break;
                }
            seqs[s].push_back(pick);
        }
    }
    printf("samples (temperature 0.8):\n");
    for (int s = 0; s < S; s++) {
        std::string text = tokenizer_decode(&tok, std::vector<int>(seqs[s].begin() + 1, seqs[s].end()));
        for (char& ch : text)
            if (ch == '\n') ch = ' ';
        printf("  > %s\n", text.c_str());
    }
}

// Mean loss over the same validation batches each time.
static float evaluate(Trainer& tr, DataLoader& val, int batches) {
    dataloader_reset(&val);
    double sum = 0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(&val);
        sum += model_forward(tr, val.inputs.data(), val.targets.data(), val.B, val.T, nullptr);
    }
    return (float)(sum / batches);
}

static void save_checkpoint(Trainer& tr, const std::string& path, int step, long long data_position, const DataOrder& order) {
    model_sync_to_host(tr);
    CheckpointInfo info;
    info.config = tr.cpu.cfg;
    info.step = step;
    info.data_position = data_position;
    info.has_optimizer_state = true;
    info.data_order = order;
    checkpoint_write(path, info, tr.cpu.params.data(), tr.cpu.adam_m.data(), tr.cpu.adam_v.data());
}

#ifndef TESTING
int main(int argc, char** argv) {
    std::set<std::string> given;
    Options o = parse_options(argc, argv, given);
    int threads = o.threads ? o.threads : omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);

    Trainer tr;
    std::string device_name;
#ifdef __CUDACC__
    if (o.device != "cpu") tr.on_gpu = cuda_device_present(&device_name);
    if (o.device == "cuda" && !tr.on_gpu) fail("option --device cuda: no CUDA device is available");
#else
    if (o.device == "cuda") fail("option --device cuda: this build has no CUDA backend (build with nvcc)");
#endif
    if (tr.on_gpu) printf("device: %s (CUDA)\n", device_name.c_str());
    else {
        device_name = cpu_device_name(threads);
        printf("device: no CUDA device; training on the CPU (%d threads)\n", threads);
    }

    // Data: the default corpus is prepared the first time it is needed.
    if (o.train_pattern.empty()) {
        ensure_brown_dataset(o.data_dir);
        o.train_pattern = o.data_dir + "/train_*.bin";
        if (o.val_pattern.empty()) o.val_pattern = o.data_dir + "/val_*.bin";
        if (o.tokenizer.empty()) o.tokenizer = o.data_dir + "/tokenizer.model";
    }
    std::string shard_dir = o.train_pattern.substr(0, o.train_pattern.find_last_of('/') + 1);
    if (file_exists(shard_dir + "dataset.txt") && !file_exists(shard_dir + ".complete"))
        fail("%s: the preparation of this dataset did not finish (no .complete); prepare it again", shard_dir.c_str());
    if (o.tokenizer.empty()) {
        std::string dir = shard_dir;
        if (file_exists(dir + "tokenizer.model")) o.tokenizer = dir + "tokenizer.model";
    }
    Tokenizer tok;
    bool have_tokenizer = !o.tokenizer.empty();
    if (have_tokenizer) tokenizer_load(&tok, o.tokenizer);
    std::string ckpt = o.resume_ckpt.empty() ? o.init_ckpt : o.resume_ckpt;
    ModelConfig c = resolve_config(o, given, have_tokenizer ? tokenizer_vocab_size(&tok) : 0, ckpt);
    int T = o.seq_len ? o.seq_len : c.max_seq_len, B = o.batch;
    if (T > c.max_seq_len) fail("option -t (--seq-len) %d is above the model's max_seq_len %d", T, c.max_seq_len);
    if ((long long)B * T > (1LL << 28)) fail("options -b (--batch) %d and -t (--seq-len) %d: %lld tokens per micro-batch is too many", B, T, (long long)B * T);
    int tokens_per_micro = B * T;
    if (!o.total_batch) o.total_batch = tokens_per_micro;
    if (o.total_batch % tokens_per_micro != 0)
        fail("option -d (--total-batch) %d is not a multiple of batch * seq_len = %d", o.total_batch, tokens_per_micro);
    int accum = o.total_batch / tokens_per_micro;

    DataLoader train, val;
    dataloader_init(&train, o.train_pattern.c_str(), B, T, c.vocab_size, o.shuffle == 1, (uint64_t)o.seed);
    bool have_val = !o.val_pattern.empty();
    if (have_val) {
        dataloader_init(&val, o.val_pattern.c_str(), B, T, c.vocab_size, false, 0);
        if (o.val_batches > val.batches_per_epoch) {
            printf("validation: %s holds %lld batches of %dx%d; evaluating those instead of %d\n", o.val_pattern.c_str(),
                   val.batches_per_epoch, B, T, o.val_batches);
            o.val_batches = (int)val.batches_per_epoch;
        }
    }

    // Model and optimiser state: on the host first (initialisation, checkpoint), then the device.
    int max_B = B;  // sampling at the end uses at most B sequences
    try {
        cpu_model_init(tr.cpu, c, tr.on_gpu ? 0 : max_B, tr.on_gpu ? 0 : T);
    } catch (const std::bad_alloc&) {
        fail("options -b (--batch) %d and -t (--seq-len) %d: not enough memory for this model's activations", B, T);
    }
#ifdef __CUDACC__
    if (tr.on_gpu) gpu_model_init(tr.gpu, c, max_B, T);
#endif
    int start_step = 0;
    long long data_position = 0;  // micro-batches of training data consumed
    DataOrder order;
    order.batch = B;
    order.seq_len = T;
    order.total_batch = o.total_batch;
    order.shuffle = o.shuffle;
    order.seed = o.seed;
    if (!ckpt.empty()) {
        CheckpointInfo info = checkpoint_read(ckpt, tr.cpu.params.data(), tr.cpu.adam_m.data(), tr.cpu.adam_v.data());
        if (!o.resume_ckpt.empty()) {
            if (!info.has_optimizer_state) fail("%s: cannot resume: the checkpoint holds no optimiser state (start from it with -e)", ckpt.c_str());
            start_step = (int)info.step;
            if (start_step >= o.steps) fail("option -x (--steps) %d: the checkpoint %s is already at step %d", o.steps, ckpt.c_str(), start_step);
            const DataOrder& was = info.data_order;
            struct { long long now, then; const char* option; } same[] = {
                {B, was.batch, "-b (--batch)"}, {T, was.seq_len, "-t (--seq-len)"}, {o.total_batch, was.total_batch, "-d (--total-batch)"},
                {o.shuffle, was.shuffle, "--shuffle"}, {o.seed, was.seed, "--seed"}};
            for (const auto& x : same)
                if (was.batch && x.now != x.then)  // recorded: the data order must be the same
                    fail("option %s is %lld but the run of %s used %lld; resume with the same data order", x.option, x.now, ckpt.c_str(), x.then);
            data_position = info.data_position;
            for (long long i = 0; i < data_position; i++) dataloader_next_batch(&train);
        } else {
            std::fill(tr.cpu.adam_m.begin(), tr.cpu.adam_m.end(), 0.0f);
            std::fill(tr.cpu.adam_v.begin(), tr.cpu.adam_v.end(), 0.0f);
        }
    } else {
        init_parameters(c, tr.cpu.params.data(), (uint64_t)o.seed);
    }
    model_sync_to_device(tr);

    // Output directory and run log.
    if (o.out_dir.empty()) o.out_dir = o.resume_ckpt.empty() ? utc_time("runs/%Y%m%d-%H%M%S") : o.resume_ckpt.substr(0, o.resume_ckpt.find_last_of('/') + 1);
    if (o.out_dir.empty()) o.out_dir = ".";
    make_dirs(o.out_dir);
    std::string log_path = o.out_dir + "/run.attnlog";
    RunInfo run;
    run.config = c;
    for (const OptSpec& s : kOptions) run.options.push_back({s.long_name + 2, option_value_text(o, s)});
    run.seed = (uint64_t)o.seed;
    run.backend = tr.on_gpu ? "cuda" : "cpu";
    run.device = device_name;
    RunLog log;
    if (!o.resume_ckpt.empty() && file_exists(log_path)) {
        log = runlog_open_append(log_path, run);
    } else {
        if (file_exists(log_path)) fail("%s: a run log is already there; choose another output directory (-o) or resume (-r)", log_path.c_str());
        log = runlog_create(log_path, run);
    }

    size_t P = num_parameters(c);
    printf("model: %d layers, %d heads (%d key/value), head_dim %d, d_model %d, d_ff %d, vocab %d: %.2fM parameters\n",
           c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.d_model, c.d_ff, c.vocab_size, P / 1e6);
    printf("training: %d steps of %d tokens (batch %d x seq %d, %d micro-batch%s), lr %g, stats every %d steps\n",
           o.steps, o.total_batch, B, T, accum, accum > 1 ? "es" : "", o.lr, o.stats_every);
    printf("data: %s (%lld tokens)%s%s\n", o.train_pattern.c_str(), train.total_tokens,
           have_val ? ", validation " : "", have_val ? o.val_pattern.c_str() : "");
    printf("output: %s\n", o.out_dir.c_str());

    AdamWSettings opt;
    opt.beta1 = o.beta1;
    opt.beta2 = o.beta2;
    opt.weight_decay = o.weight_decay;
    Telemetry stats;
    double run_start = now_seconds(), step_seconds_avg = 0;
    float last_val = NAN;
    int width = (int)std::to_string(o.steps).size();
    // --profile: seconds per phase, summed over the steps after the first (which warms up), split
    // by whether the step measured statistics.
    enum { PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER, PH_STEP, NUM_PHASES };
    double phase_sum[2][NUM_PHASES] = {{0}}, phase_steps[2] = {0, 0};
    double phase_mark = 0;
    auto phase = [&](int which, bool stats_step, int step) {
        if (!o.profile) return;
        model_wait(tr);
        double now = now_seconds();
        if (step > start_step) phase_sum[stats_step][which] += now - phase_mark;
        phase_mark = now;
    };
    for (int step = start_step; step < o.steps; step++) {
        bool last = step == o.steps - 1;
        bool stats_step = o.stats_every > 0 && (step % o.stats_every == 0 || last);
        double t0 = now_seconds();
        phase_mark = t0;
        model_zero_grad(tr);
        double loss_sum = 0;
        for (int micro = 0; micro < accum; micro++) {
            dataloader_next_batch(&train);
            data_position++;
            loss_sum += model_forward(tr, train.inputs.data(), train.targets.data(), B, T, stats_step && micro == 0 ? &stats : nullptr);
            phase(PH_FORWARD, stats_step, step);
            model_backward(tr, train.inputs.data(), train.targets.data(), 1.0f / accum);
            phase(PH_BACKWARD, stats_step, step);
        }
        float loss = (float)(loss_sum / accum);
        float norm = model_grad_norm(tr);
        opt.lr = lr_at_step(step, o.steps, o.warmup, o.lr, o.lr * o.lr_floor);
        if (!std::isfinite(loss) || !std::isfinite(norm)) {
            model_wait_stats(tr);
            runlog_step(log, step, loss, opt.lr, norm, 0, 0);
            runlog_close(log);
            fail("step %d: the loss is %g and the gradient norm %g; stopping before the weights are damaged "
                 "(%s and earlier checkpoints are intact; try a lower -l)", step, loss, norm, log_path.c_str());
        }
        model_adamw(tr, opt, step + 1, norm, o.clip);
        model_wait(tr);  // the step's time includes the update
        if (stats_step) model_wait_stats(tr);  // and the statistics
        phase(PH_OPTIMIZER, stats_step, step);
        double dt = now_seconds() - t0;
        if (o.profile && step > start_step) {
            phase_sum[stats_step][PH_STEP] += dt;
            phase_steps[stats_step]++;
        }
        step_seconds_avg = step == start_step ? dt : 0.9 * step_seconds_avg + 0.1 * dt;
        float tok_s = (float)(o.total_batch / dt);
        runlog_step(log, step, loss, opt.lr, norm, tok_s, (float)(dt * 1e3));
        if (stats_step) runlog_telemetry(log, step, stats, c);
        printf("step %*d/%d | loss %.4f | norm %.3f | lr %.2e | %.0f ms | %.0f tok/s | eta %s\n", width, step + 1, o.steps,
               loss, norm, opt.lr, dt * 1e3, tok_s, format_duration(step_seconds_avg * (o.steps - step - 1)).c_str());
        fflush(stdout);
        if (have_val && ((o.val_every && (step + 1) % o.val_every == 0) || last)) {
            last_val = evaluate(tr, val, o.val_batches);
            runlog_val(log, step, last_val);
            printf("val loss %.4f\n", last_val);
        }
        if ((o.ckpt_every && (step + 1) % o.ckpt_every == 0) || last) {
            std::string path = last ? o.out_dir + "/model.ckpt" : strprintf("%s/model_step%06d.ckpt", o.out_dir.c_str(), step + 1);
            runlog_flush(log);
            save_checkpoint(tr, path, step + 1, data_position, order);
            printf("wrote %s\n", path.c_str());
        }
    }
    runlog_close(log);
    for (int k = 0; k < 2 && o.profile; k++) {
        if (!phase_steps[k]) continue;
        double n = phase_steps[k];
        printf("profile, %s (%.0f steps): forward %.2f ms, backward %.2f ms, optimiser %.2f ms, step %.2f ms\n",
               k ? "steps with statistics" : "steps without statistics", n, 1e3 * phase_sum[k][PH_FORWARD] / n,
               1e3 * phase_sum[k][PH_BACKWARD] / n, 1e3 * phase_sum[k][PH_OPTIMIZER] / n, 1e3 * phase_sum[k][PH_STEP] / n);
    }
    printf("done in %s; final val loss %.4f\n", format_duration(now_seconds() - run_start).c_str(), last_val);
    if (have_tokenizer) print_samples(tr, max_B, T, tok, o, (uint64_t)o.seed + 1);
    printf("report: %s scripts/report.py %s\n", "/usr/bin/python3", log_path.c_str());
    dataloader_free(&train);
    if (have_val) dataloader_free(&val);
    return 0;
}
#endif  // TESTING
