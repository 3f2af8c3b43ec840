// train_gpt.cu: trains the GPT of docs/model.md and, while it trains, measures what its attention
// keys and attention patterns do (docs/telemetry.md), appending everything to a crash-safe
// binary log (docs/log_format.md).
//
// One program, two backends: the CUDA backend when a GPU is present, the CPU backend otherwise,
// with the same options, the same log and the same checkpoints. Both implement the contract of
// llmc/backend.h, and the training loop is one template over it. Built by nvcc when the CUDA
// toolkit is installed; without it, the same file compiles as plain C++ (g++ -x c++) and holds
// the CPU backend only. It reads top to bottom as: the includes, the GPU model (its buffers,
// forward and backward pass, update and telemetry), the training loop, main.
#include <omp.h>
#include <signal.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <set>
#include <string>
#include <vector>
#include "llmc/activations.h"  // the table of activation buffers both backends carve
#include "llmc/backend.h"      // what a backend offers the training loop
#include "llmc/checkpoint.h"   // the checkpoint file
#include "llmc/config.h"       // the model configuration, the parameter kinds and layout
#include "llmc/dataloader.h"   // the token shards, batches and the data order
#include "llmc/dataprep.h"     // the default corpus, prepared on first use
#include "llmc/distributed.h"  // the processes of a data-parallel run and their collectives
#include "llmc/model_cpu.h"    // the CPU backend
#include "llmc/options.h"      // the command line
#include "llmc/rand.h"         // the sampling's random numbers
#include "llmc/resume.h"       // what -r checks against its checkpoint, and the command that resumes
#include "llmc/run_dir.h"      // the output folder, its lock, its log and its checkpoints
#include "llmc/runlog.h"       // the run log's records
#include "llmc/telemetry.h"    // the statistics of a stats step, from their sums
#include "llmc/tokenizer.h"    // SentencePiece, for the vocabulary and the samples
#include "llmc/utils.h"        // fail(), files, time

// =============================================================================================
// The GPU model. bf16 weights and activations, float32 master weights, gradients and AdamW
// state; matrix products in cuBLASLt with float32 accumulation. Every kernel is deterministic
// (no floating-point atomics), so the same run twice gives the same bits.
#ifdef __CUDACC__
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/cudnn_attention.cuh"
#include "llmc/cuda_common.cuh"
#include "llmc/cuda_graph.cuh"
#include "llmc/encoder.cuh"
#include "llmc/matmul.cuh"
#include "llmc/nccl.cuh"
#include "llmc/qknorm_rope.cuh"
#include "llmc/rmsnorm.cuh"
#include "llmc/swiglu.cuh"
#include "llmc/telemetry.cuh"

// --profile 2: the device's time per kind of work. Before each kind of work the model marks its
// stream (mark(label): an event recorded there), so the time from one mark to the next is what the
// device spent on that work, or waiting for the host to queue more, which then counts as that
// work's. The model_wait at the end of each phase marks "idle: the host between phases". An event
// costs the host a few microseconds and the device nothing it can measure.
struct KernelClock {
    bool on = false;
    std::vector<cudaEvent_t> events;   // a pool, reused every step
    std::vector<const char*> labels;   // the label of each mark of the step so far
    WorkTimes ms[2];  // summed per label, in the order first seen

    void mark(const char* label, cudaStream_t s) {
        if (!on) return;
        if (labels.size() == events.size()) {
            events.emplace_back();
            cudaCheck(cudaEventCreate(&events.back()));
        }
        cudaCheck(cudaEventRecord(events[labels.size()], s));
        labels.push_back(label);
    }
    void begin_step() {
        labels.clear();
        on = true;
    }
    // After the step's work: the marks' times into ms[slot] (slot -1: dropped); no more marks until
    // the next step begins.
    void end_step(int slot, cudaStream_t s) {
        if (!on) return;
        mark("", s);  // the end of the last kind of work
        on = false;
        cudaCheck(cudaEventSynchronize(events[labels.size() - 1]));
        for (size_t i = 0; slot >= 0 && i + 1 < labels.size(); i++) {
            float t;
            cudaCheck(cudaEventElapsedTime(&t, events[i], events[i + 1]));
            auto it = std::find_if(ms[slot].begin(), ms[slot].end(), [&](const auto& e) { return e.first == labels[i]; });
            if (it == ms[slot].end()) ms[slot].push_back({labels[i], t});
            else it->second += t;
        }
        labels.clear();
    }
};

// A statistics step's per-layer statistics run on a second stream, beside the next layers' forward
// pass, not between them on the model's stream, where they took 6.2 ms of a d22 step at 8 x 2048 (an
// H200 at b31e86d: the rows' statistics beside cuDNN's forward 2.5, the heads' records 1.2, the Gram
// products 1.1, the rest 1.4). They read what their layer's forward pass wrote (with the candidate
// gram_from_projection its qkv and qk_rstd as well), the document starts and the gains (float32,
// and with that candidate the bf16 k gain), none of which the model's stream writes again before
// the pass ends, and they write
// only scratch and sums that nothing else touches during a forward pass (stats_partial, keys_f64,
// stat_sums; att_delta and datty where the rows' statistics need their own forward pass): a change
// must keep it so. They are memory-bound where most of the forward pass is bound by the tensor cores,
// so the device can run them in the gaps and tails of the model's kernels: the model's stream takes
// the higher priority, so that its blocks go first and the statistics' fill what they leave. The
// float32 queries and keys and the rows' statistics alternate between two buffers (an odd layer's
// here, an even layer's in the activations' table), so that layer l + 1 runs while layer l is
// measured; layer l + 2 waits for layer l's statistics before writing over them, and the forward pass
// ends waiting for the last layer's. The same kernels on the same inputs in the same order on their
// stream: the same bits (test_gpt_cuda checks it). Measured on an H200 (d22, statistics every step):
// 35.00 -> 34.43 ms a step at 8 x 2048, 24.88 -> 23.73 ms at 4 x 2048. --profile 2 keeps them on the
// model's stream, timed one by one, and so does a model's first forward pass, which times the matrix
// products' algorithms (matmul_tune) and must have the GPU alone.
//
// Candidate (stats_deferred): the statistics left to run beside the backward pass too. Each layer's
// float32 queries and keys and rows' statistics in buffers of their own (+1.5 GB at d22, 8 x 2048,
// carved where the candidate build trains with it on), so that the forward pass never waits for a
// layer's statistics; the model's stream waits for them all (stats_join) only where something needs
// them or would write over what they read: the sums read (model_stats_sums, which the training loop
// then calls after the step's last backward pass: model_stats_pending), the sums cleared, the
// weights written (AdamW, an upload), and the start of the next forward pass (the document starts,
// the activations). The backward pass writes nothing they read where the rows' statistics come
// from the lse (the other way takes the backward's att_delta and datty as scratch, and then they
// are not deferred). A pass with deferred statistics is not captured as a graph
// (stats_pass_graph): a capture must join its second stream before it ends.
struct StatsBeside {
    bool on = true;
    bool warm = false;  // a forward pass has run (its products' algorithms tuned)
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;   // a layer's forward pass done: its statistics may start
    cudaEvent_t done[2] = {};      // the statistics of the last layer that used each pair of buffers
    float *qk_normed = nullptr, *row_stats = nullptr;  // an odd layer's
    bool defer = candidate_on("stats_deferred");
    float *layer_qk_normed = nullptr, *layer_row_stats = nullptr;  // deferred: every layer's, one after another
    cudaEvent_t deferred_done = nullptr;  // the last layer's deferred statistics done
    bool pending = false;                 // deferred statistics queued that the model's stream has not waited for
    // For the tests: the deferred statistics of each layer wait this long on their stream first, and
    // the passes skip their waits for them (a check that the comparison catches a missing wait).
    int test_delay_us = 0;
    bool test_skip_waits = false;
};

// Candidate (grads_beside): the weight gradients' products of the backward pass on streams beside
// the rest of the pass. At d22, 8 x 2048 a layer's backward holds four of them, each with a small
// output (16 to 96 of cuBLASLt's 128 x 128 tiles for 132 SMs) summed over 16,384 tokens, and
// between them the memory-bound kernels (SwiGLU, the norms, QK-norm + RoPE: 3.9 ms a step) that
// leave the tensor cores idle; beside the pass each fills what the other leaves. A product reads its
// layer's saved input and one gradient buffer (dres, dfc13, dqkv or the logits) and adds into its
// own weight gradient; the pass's stream waits for it before it next writes that gradient buffer
// (done[], by product), and for all of them at the end of the pass, before anything else adds into
// a weight gradient (the embedding's backward into the tied wte's, the next pass). The layers'
// products run in order on one stream; the classifier's, the largest (a d22 layer's four together
// are about its size), on one of its own of lower priority, which only the end of the pass waits
// for, so that the layers' never queue behind it. A product runs beside only in a pass of a shape
// whose backward has run before (`shapes`): its algorithm is chosen, and tuned, in that first pass,
// on the pass's stream alone, and beside it it uses a workspace of its own. The same products of the
// same inputs with the same algorithms: the same bits (test_gpt_cuda_candidates checks it, with the
// streams beside made slow on purpose, so that a missing wait would show). --profile 2 keeps them on
// the pass's stream.
enum { DW_CLASSIFIER, DW_MLP_OUT, DW_MLP_IN, DW_ATTN_OUT, DW_QKV, kWeightProducts };
struct GradsBeside {
    bool on = candidate_on("grads_beside");
    cudaStream_t stream[2] = {};  // the layers' products; the classifier's
    void* workspace[2] = {};      // cuBLASLt's for each, as large as the model's (carved in the candidate build)
    cudaEvent_t ready = nullptr;  // the pass's stream has a product's inputs
    cudaEvent_t joined[2] = {};   // each stream's products done
    cudaEvent_t done[kWeightProducts] = {};  // the last product of each kind
    bool queued[kWeightProducts] = {};       // in this pass
    std::vector<std::pair<int, int>> shapes;  // (B, T) of the backward passes run
    long long products = 0;                   // run beside, so far
    bool seen(int B, int T) const { return std::find(shapes.begin(), shapes.end(), std::make_pair(B, T)) != shapes.end(); }
    // For the tests: each product waits this long on its stream first, and the pass skips its
    // waits (a check that the comparison of the gradients catches a missing one).
    int test_delay_us = 0;
    bool test_skip_waits = false;
};

// Candidate (adamw_beside): a step's AdamW update on a stream beside the next step's forward pass.
// AdamW takes 0.77-0.88 ms of a d22 step at 8 x 2048 (an H200 at e5cf2c5), bound by the memory,
// with the tensor cores idle; the next forward pass reads a layer's weights only when it reaches the
// layer. So the update runs in the parts of the parameter layout that a forward pass reads one after
// another (config.h's forward_read_bounds: the embedding, each layer's block, the final norm and an
// untied output projection), each part's end marked by an event, and the forward pass waits for a
// part's event just before it first reads that part: layer l's update runs beside the layers before
// it, and beside the host's work between the steps. After the last part the update's stream sets
// the gradients to 0 (AdamW was their last reader), so model_zero_grad leaves them to it; the
// forward pass's last wait comes after that, so the next backward pass adds into zeros. A captured
// forward pass holds its waits as nodes on events recorded outside the graph
// (cudaEventWaitExternal): a replay waits for the update queued before it. The host's reads and
// writes of the weights (model_download, model_upload) wait for the update first. The same kernels
// on the same values: the same bits (test_gpt_cuda_candidates checks it, with the update slowed so
// that a missing wait would show). One process only (the processes' shards are gathered after the
// update), and not under --profile 2, which times the update on the model's stream.
struct AdamwBeside {
    bool on = candidate_on("adamw_beside");
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr;     // the gradients' norm is on the device: the update may begin
    std::vector<cudaEvent_t> done;   // each part's update done (the last: the gradients zeroed too)
    struct Part {
        int first = 0, count = 0;       // its segments in `segments`
        int tile_first = 0, tiles = 0;  // its adamw_tile_starts in `tile_first`, and their last entry
    };
    std::vector<Part> parts;
    ParamSegment* segments = nullptr;  // AdamW's segments cut at the parts' bounds (device)
    int* tile_first = nullptr;         // each part's adamw_tile_starts, one after another (device)
    bool pending = false;              // an update queued that the model's stream has not waited for
    // For the tests: each part's update waits this long on its stream first, and the forward pass
    // skips its waits (a check that the comparison catches a missing one).
    int test_delay_us = 0;
    bool test_skip_waits = false;
};

// Spins for `us` microseconds (the test delays of GradsBeside, AdamwBeside and StatsBeside's deferred
// statistics).
__global__ void spin_kernel(int us) {
    for (int i = 0; i < us; i++) __nanosleep(1000);
}

struct GpuModel : ModelShape {  // and backend.h's ModelShape
    int Vp = 0;  // the vocabulary rounded up to 128, the logits' row stride
    size_t P = 0;
    // Data-parallel training (distributed.h): params and grads hold shard.padded floats (P of them
    // parameters), adam_m and adam_v only this process's shard (ZeRO-1). A model that does not
    // train (trains false) has no grads, adam_m or adam_v.
    bool use_nccl = false;  // several processes (or TRAIN_NCCL=1): the collectives of nccl.cuh
    Nccl nccl;
    CudnnAttention cudnn;   // the attention where libcudnn.so.9 loads (cudnn_attention.cuh)
    StatsBeside beside;
    GradsBeside grads_beside;
    AdamwBeside adamw_beside;
    // Candidates (qknorm_rope.cuh's qk_norm_rope_forward_ahead_kernel): the QK-norm + RoPE forward
    // with four items' loads in flight a group of lanes; on a stats step, the queries' norms in place
    // of their float32 vectors, which the statistics read only for those norms.
    bool qk_forward_ahead = candidate_on("qk_forward_ahead"), query_norms = candidate_on("query_norms");
    // Candidates (attention.cuh's attention_row_stats_from_lse_kernel): the rows' statistics with
    // the tiles that need no mask apart (stats_rows_plain), their scores from wgmma's products
    // (stats_rows_wgmma, where the build has sm_90a's code: model_init decides).
    bool stats_rows_plain = candidate_on("stats_rows_plain"), stats_rows_wgmma = false;
    // Candidates (telemetry.cuh's gram_products_dmma_kernel): the keys' Gram products through
    // Hopper's float64 products of 16 x 8 (gram_dmma), the K of their instruction (0: ./train's
    // kernel; where the build has sm_90's code: model_init decides); with them, the key heads'
    // records from the same reads of the keys (gram_key_records).
    int gram_dmma_k = 0;
    bool gram_key_records = candidate_on("gram_key_records");
    // Candidate (with both above): on a stats step the QK-norm forward writes no float32 keys, and
    // the Gram products compute the same keys from the projections and their rstd
    // (gram_from_projection).
    bool gram_from_projection = candidate_on("gram_from_projection");
    // Everything on the device lives in one allocation, `memory`, carved by gpu_carve.
    void* memory = nullptr;
    float *params, *grads, *adam_m, *adam_v;  // float32, the layout of config.h
    bf16* params_bf16;                        // what the forward and backward passes read
    float *rope_cos, *rope_sin;               // [max_seq_len, D/2]
    Activations<bf16> acts;                   // the table of activations.h
    // Kernel workspaces: partial gain gradients, a stats step's sums (telemetry.h) and the
    // per-block partial sums behind them (telemetry.cuh), the inputs, the gradient norm (and its
    // square, summed over the processes), and the AdamW segments.
    // The gain gradients' column sums run at the end of the backward pass, 96 to a launch
    // (rmsnorm.cuh's ColumnSumJob: one launch for d22's 89), so each norm's partial rows have a part
    // of their own of dgain_partial until then: room for the 2L + 1 RMSNorms' and L QK-norms', taken
    // in the order the backward pass calls them.
    float *dgain_partial, *stats_partial;
    size_t dgain_partial_floats = 0;
    ColumnSumJobs gain_sum_jobs;
    double* stat_sums;
    double stats_tokens = 0;    // tokens measured since model_stats_begin
    double stats_doc_view = 0;  // of those, the queries with a document start in view
    uint32_t* doc_bits;         // a stats step's document starts (telemetry_sums.h)
    std::vector<uint32_t> host_doc_bits;
    int *tokens, *targets, *buckets;
    double *norm_partial, *grad_sq;
    float* grad_norm;
    KernelClock clock;  // --profile 2
    PassGraphs graphs;  // unless TRAIN_CUDA_GRAPH=0 (cuda_graph.cuh)
    ParamSegment* segments;
    int max_segments = 0, num_segments = 0;  // room carved; in use (frozen kinds and other shards have none)
    int* adamw_tile_first;                   // adamw_tile_starts of the segments (the candidate adamw_tiles)
    int adamw_tiles = 0;
    // On the host: pinned buffers the device copies into, and the host copy of the weights and
    // AdamW state (shard.padded floats each; of the AdamW state, this process's shard).
    float* losses_host = nullptr;
    double* stat_sums_host = nullptr;
    TokenBuckets host_buckets;
    std::vector<float> host_params, host_adam_m, host_adam_v;
    Matmul mm;
    cudaStream_t stream;
};

// Whether a pass with statistics (tm) leaves them to run past its end (StatsBeside's stats_deferred).
static bool stats_defer_now(const GpuModel& g, bool tm) {
    return tm && g.beside.defer && g.beside.on && g.beside.warm && !g.clock.on && g.trains &&
           g.beside.layer_qk_normed && attention_row_stats_from_lse_supports(g.cfg.head_dim);
}

// The model's stream waits for the deferred statistics queued so far (nothing when none are).
static void stats_join(GpuModel& g) {
    if (!g.beside.pending) return;
    if (!g.beside.test_skip_waits) cudaCheck(cudaStreamWaitEvent(g.stream, g.beside.deferred_done, 0));
    g.beside.pending = false;
}

// Whether this step's AdamW update runs beside the next forward pass (AdamwBeside: its segments are
// carved where the candidate build trains as one process).
static bool adamw_beside_now(const GpuModel& g) {
    return g.adamw_beside.on && g.adamw_beside.segments && !g.use_nccl && !g.clock.on;
}

// The model's stream waits for part `part` of the update beside it (a forward pass, before it reads
// the part's weights); in a capture, the graph's node waits for the update queued before its launch.
static void wait_for_update(GpuModel& g, int part) {
    AdamwBeside& ab = g.adamw_beside;
    if (ab.done.empty() || ab.test_skip_waits) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(g.stream, &capture));
    cudaCheck(cudaStreamWaitEvent(g.stream, ab.done[part],
                                  capture == cudaStreamCaptureStatusActive ? cudaEventWaitExternal : cudaEventWaitDefault));
}

// The host waits for an update beside that the model's stream has not waited for (before it reads or
// writes the weights itself).
static void adamw_beside_finish(GpuModel& g) {
    if (!g.adamw_beside.pending) return;
    cudaCheck(cudaStreamSynchronize(g.adamw_beside.stream));
    g.adamw_beside.pending = false;
}

// The model's stream waits for all of an update beside that it has not waited for (a backward pass
// or the gradients' norm with no forward pass since the update: the gradients are its to set to 0).
static void adamw_beside_join(GpuModel& g) {
    AdamwBeside& ab = g.adamw_beside;
    if (!ab.pending) return;
    cudaCheck(cudaStreamWaitEvent(g.stream, ab.done.back(), 0));
    ab.pending = false;
}

// Whether GPU `index` (this process's among those of its machine) exists; its name if so, and
// then it is the GPU everything after runs on.
inline bool cuda_device_present(int index, std::string* name) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();  // clear the error state
        return false;
    }
    if (count == 1) index = 0;        // the launcher gave each process a GPU of its own
    if (index >= count) return true;  // a GPU, but none for this process: name left empty
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, index));
    cudaCheck(cudaSetDevice(index));
    *name = prop.name;
    return true;
}

// Points every device buffer into the arena (which only counts when its base is null).
static void gpu_carve(GpuModel& g, Arena& a) {
    const ModelConfig& c = g.cfg;
    size_t P = g.P, N = (size_t)g.max_B * g.max_T, D = c.head_dim, NH = c.n_head + c.n_kv_head;
    g.params = a.take<float>(g.shard.padded);
    g.grads = a.take<float>(g.trains ? g.shard.padded : 0);
    g.adam_m = a.take<float>(g.trains ? g.shard.size : 0);
    g.adam_v = a.take<float>(g.trains ? g.shard.size : 0);
    g.params_bf16 = a.take<bf16>(P);
    g.rope_cos = a.take<float>((size_t)c.max_seq_len * D / 2);
    g.rope_sin = a.take<float>((size_t)c.max_seq_len * D / 2);
    carve_activations(g.acts, activation_dims(c, g.max_B, g.max_T, g.Vp), Where::GPU, a);
    const size_t norm_partial_floats = rmsnorm_backward_scratch_floats((int)N, c.d_model),
                 qk_partial_floats = (size_t)qk_norm_rope_backward_blocks((int)N, (int)NH) * 2 * D;
    g.dgain_partial_floats = g.trains ? (2 * c.n_layer + 1) * norm_partial_floats + c.n_layer * qk_partial_floats : 0;
    g.dgain_partial = a.take<float>(g.dgain_partial_floats);
    for (void*& w : g.grads_beside.workspace) w = a.take<char>(g.trains && kCandidateKernels ? g.mm.workspace_bytes : 0);
    g.stat_sums = a.take<double>(g.stats_layout.total);
    g.stats_partial = a.take<float>(telemetry_partial_floats((int)N, c));
    g.beside.qk_normed = a.take<float>(N * NH * D);
    g.beside.row_stats = a.take<float>((size_t)ATTN_NUM_ROW_STATS * N * c.n_head);
    if (kCandidateKernels && g.trains && g.beside.defer) {  // the candidate stats_deferred's buffers
        g.beside.layer_qk_normed = a.take<float>(c.n_layer * N * NH * D);
        g.beside.layer_row_stats = a.take<float>((size_t)c.n_layer * ATTN_NUM_ROW_STATS * N * c.n_head);
    }
    g.doc_bits = a.take<uint32_t>((size_t)g.max_B * document_start_words(g.max_T));
    g.tokens = a.take<int>(N);
    g.targets = a.take<int>(N);
    g.buckets = a.take<int>(3 * N + 1);
    g.norm_partial = a.take<double>(kNormBlocks);
    g.grad_sq = a.take<double>(1);
    g.grad_norm = a.take<float>(1);
    g.segments = a.take<ParamSegment>(g.max_segments);
    g.adamw_tile_first = a.take<int>(g.max_segments + 1);
    // AdamwBeside's: each of the parts' L + 1 bounds cuts at most one segment in two
    if (kCandidateKernels && g.trains && g.dist.world == 1) {
        const int parts = c.n_layer + 2;
        g.adamw_beside.segments = a.take<ParamSegment>(g.max_segments + parts - 1);
        g.adamw_beside.tile_first = a.take<int>(g.max_segments + 2 * parts - 1);
    }
}

// The sizes everything is carved to.
static void gpu_set_shape(GpuModel& g, const ModelConfig& c, int max_B, int max_T, const Dist& dist, bool trains) {
    model_shape_init(g, c, max_B, max_T, dist, trains);
    g.Vp = (c.vocab_size + 127) / 128 * 128;
    g.P = num_parameters(c);
    g.max_segments = num_param_tensors(c);  // one per tensor, the most any frozen set leaves
}

// AdamW's segments (in this process's shard) of the kinds not frozen, each with its weight decay flag,
// onto the device.
static void upload_segments(GpuModel& g) {
    adamw_beside_finish(g);  // its segments are read by an update beside
    std::vector<ParamSegment> segments = shard_segments(adamw_segments(g.cfg, g.frozen, g.decayed), g.shard);
    g.num_segments = (int)segments.size();
    cudaCheck(cudaMemcpy(g.segments, segments.data(), segments.size() * sizeof(ParamSegment), cudaMemcpyHostToDevice));
    const std::vector<int> tile_first = adamw_tile_starts(segments);
    g.adamw_tiles = tile_first.back();
    cudaCheck(cudaMemcpy(g.adamw_tile_first, tile_first.data(), tile_first.size() * sizeof(int), cudaMemcpyHostToDevice));
    AdamwBeside& ab = g.adamw_beside;
    if (!ab.segments) return;
    const std::vector<long long> bounds = forward_read_bounds(g.cfg);
    std::vector<ParamSegment> cut;
    std::vector<int> cut_tile_first;
    ab.parts.clear();
    for (size_t p = 0; p + 1 < bounds.size(); p++) {
        const std::vector<ParamSegment> part = segments_within(segments, bounds[p], bounds[p + 1]);
        const std::vector<int> part_tiles = adamw_tile_starts(part);
        ab.parts.push_back({(int)cut.size(), (int)part.size(), (int)cut_tile_first.size(), part_tiles.back()});
        cut.insert(cut.end(), part.begin(), part.end());
        cut_tile_first.insert(cut_tile_first.end(), part_tiles.begin(), part_tiles.end());
    }
    cudaCheck(cudaMemcpy(ab.segments, cut.data(), cut.size() * sizeof(ParamSegment), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(ab.tile_first, cut_tile_first.data(), cut_tile_first.size() * sizeof(int), cudaMemcpyHostToDevice));
}

// Holds the parameter kinds in `asked` (and those the variant leaves unused) fixed from now on:
// AdamW gets the segments of the others only.
static void model_freeze(GpuModel& g, uint32_t asked) {
    g.frozen = frozen_kinds(g.cfg, asked);
    upload_segments(g);
}

// Weight decay on the parameter kinds in `kinds` from now on.
static void model_decay(GpuModel& g, uint32_t kinds) {
    g.decayed = kinds;
    upload_segments(g);
}

// Device memory the model needs as process dist.rank of dist.world (weights, bf16 weights, and
// when it trains the gradients and this process's shard of the AdamW state; then the activations,
// workspaces and cuBLASLt's workspace), to check before model_init allocates it.
static MemoryNeed memory_need(const GpuModel&, const ModelConfig& c, int B, int T, const Dist& dist, bool trains) {
    GpuModel g;
    gpu_set_shape(g, c, B, T, dist, trains);
    Arena count;
    gpu_carve(g, count);
    double handles = 256e6;                   // the CUDA context's and the cuBLAS handles' own memory, a margin
    if (nccl_wanted(dist)) handles += 512e6;  // and NCCL's buffers and its own, a margin
    double training = trains ? g.shard.padded + 2.0 * g.shard.size : 0;  // gradients, AdamW state
    double model = sizeof(float) * (g.shard.padded + training) + sizeof(bf16) * (double)g.P;
    return {model, (double)count.used + g.mm.workspace_bytes + handles};
}

static MemoryLimit memory_available(const GpuModel&) {
    size_t free = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free, &total));
    return {(double)free, "the GPU"};
}

static void model_init(GpuModel& g, const ModelConfig& c, int max_B, int max_T, const Dist& dist = Dist(),
                       bool trains = true) {
    if (c.head_dim != 64 && c.head_dim != 128) fail("the CUDA backend supports head_dim 64 and 128, not %d", c.head_dim);
    if (c.d_ff % 8 != 0) fail("the CUDA backend needs d_ff to be a multiple of 8 (got %d)", c.d_ff);
    if ((long long)max_B * max_T > kStatMaxTokens)
        fail("options %s and %s: %lld tokens in a micro-batch is more than the statistics take (%lld); use a smaller "
             "batch with gradient accumulation (%s)", OPTION_LABEL("--batch"), OPTION_LABEL("--seq-len"),
             (long long)max_B * max_T, kStatMaxTokens, OPTION_NAME("--total-batch"));
    gpu_set_shape(g, c, max_B, max_T, dist, trains);
    g.use_nccl = nccl_wanted(dist);
    if (g.use_nccl) nccl_init(g.nccl, dist);
    // the model's stream first, the statistics' beside it (StatsBeside)
    int least = 0, greatest = 0;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaCheck(cudaStreamCreateWithPriority(&g.stream, cudaStreamDefault, greatest));
    cudaCheck(cudaStreamCreateWithPriority(&g.beside.stream, cudaStreamNonBlocking, least));
    cudaCheck(cudaEventCreateWithFlags(&g.beside.ready, cudaEventDisableTiming));
    for (cudaEvent_t& e : g.beside.done) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&g.beside.deferred_done, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithPriority(&g.grads_beside.stream[0], cudaStreamNonBlocking, greatest));
    cudaCheck(cudaStreamCreateWithPriority(&g.grads_beside.stream[1], cudaStreamNonBlocking, least));
    cudaCheck(cudaEventCreateWithFlags(&g.grads_beside.ready, cudaEventDisableTiming));
    for (cudaEvent_t& e : g.grads_beside.joined) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : g.grads_beside.done) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithPriority(&g.adamw_beside.stream, cudaStreamNonBlocking, least));
    cudaCheck(cudaEventCreateWithFlags(&g.adamw_beside.start, cudaEventDisableTiming));
    g.adamw_beside.done.assign(kCandidateKernels && trains ? c.n_layer + 2 : 0, nullptr);
    for (cudaEvent_t& e : g.adamw_beside.done) {  // recorded once, so that every wait has a record to wait for
        cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(e, g.adamw_beside.stream));
    }
    if (candidate_on("stats_rows_wgmma")) {
        g.stats_rows_wgmma = attention_wgmma_compiled();
        if (!g.stats_rows_wgmma && g_fail_rank <= 0)
            printf("stats_rows_wgmma: this build has no sm_90a code (CUDA_ARCHS=90a): ./train's kernel instead\n");
    }
    if (candidate_on("gram_dmma")) {
        g.gram_dmma_k = gram_dmma_compiled() ? kGramDmmaK : 0;
        if (!g.gram_dmma_k && g_fail_rank <= 0)
            printf("gram_dmma: this build has no sm_90 code for this device: ./train's Gram products instead\n");
    }
    matmul_init(g.mm);
    g.mm.tune = true;  // algorithms tuned among those with the first choice's bits (matmul_tune)
    g.graphs.on = pass_graphs_wanted();

    Arena count;
    gpu_carve(g, count);
    cudaError_t err = cudaMalloc(&g.memory, count.used);
    if (err == cudaErrorMemoryAllocation)
        fail("options %s and %s: the GPU has no room for this model and its activations (%.1f GB were asked for)",
             OPTION_LABEL("--batch"), OPTION_LABEL("--seq-len"), count.used / 1e9);
    cudaCheck(err);
    cudaCheck(cudaMemset(g.memory, 0, count.used));
    Arena arena{(char*)g.memory};
    gpu_carve(g, arena);

    std::vector<float> cs((size_t)c.max_seq_len * c.head_dim / 2), sn(cs.size());
    rope_tables(c, c.max_seq_len, cs.data(), sn.data());
    cudaCheck(cudaMemcpy(g.rope_cos, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g.rope_sin, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
    model_freeze(g, 0);
    cudaCheck(cudaMallocHost(&g.stat_sums_host, g.stats_layout.total * sizeof(double)));
    cudaCheck(cudaMallocHost(&g.losses_host, (size_t)max_B * max_T * sizeof(float)));
    g.host_params.assign(g.shard.padded, 0.0f);
    g.host_adam_m.assign(trains ? g.shard.padded : 0, 0.0f);
    g.host_adam_v.assign(trains ? g.shard.padded : 0, 0.0f);
}

static void model_free(GpuModel& g) {
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaStreamSynchronize(g.beside.stream));
    for (cudaStream_t gs : g.grads_beside.stream) cudaCheck(cudaStreamSynchronize(gs));
    cudaCheck(cudaStreamSynchronize(g.adamw_beside.stream));
    cudaCheck(cudaFree(g.memory));
    cudaCheck(cudaFreeHost(g.stat_sums_host));
    cudaCheck(cudaFreeHost(g.losses_host));
    matmul_print_tuning(g.mm);
    matmul_free(g.mm);
    pass_graphs_print(g.graphs);
    pass_graphs_free(g.graphs);
    nccl_free(g.nccl);
    cudnn_attention_free(g.cudnn);
    for (cudaEvent_t e : g.clock.events) cudaCheck(cudaEventDestroy(e));
    g.clock = KernelClock();
    cudaCheck(cudaStreamDestroy(g.stream));
    cudaCheck(cudaStreamDestroy(g.beside.stream));
    cudaCheck(cudaEventDestroy(g.beside.ready));
    for (cudaEvent_t e : g.beside.done) cudaCheck(cudaEventDestroy(e));
    cudaCheck(cudaEventDestroy(g.beside.deferred_done));
    g.beside = StatsBeside();
    for (cudaStream_t gs : g.grads_beside.stream) cudaCheck(cudaStreamDestroy(gs));
    cudaCheck(cudaEventDestroy(g.grads_beside.ready));
    for (cudaEvent_t e : g.grads_beside.joined) cudaCheck(cudaEventDestroy(e));
    for (cudaEvent_t e : g.grads_beside.done) cudaCheck(cudaEventDestroy(e));
    g.grads_beside = GradsBeside();
    cudaCheck(cudaStreamDestroy(g.adamw_beside.stream));
    cudaCheck(cudaEventDestroy(g.adamw_beside.start));
    for (cudaEvent_t e : g.adamw_beside.done) cudaCheck(cudaEventDestroy(e));
    g.adamw_beside = AdamwBeside();
    g.memory = nullptr;
    g.losses_host = nullptr;
    g.stat_sums_host = nullptr;
}

// The host copy of the weights and AdamW state; model_upload makes the device use it (the
// weights, and this process's shard of the AdamW state), model_download brings it up to date
// (before a checkpoint).
static HostState host_state(GpuModel& g) {
    return {g.host_params.data(), g.trains ? g.host_adam_m.data() : nullptr, g.trains ? g.host_adam_v.data() : nullptr};
}

static void model_upload(GpuModel& g) {
    size_t b = g.shard.begin, n = g.shard.end - g.shard.begin;
    stats_join(g);  // deferred statistics read the gains (the copies below follow the model's stream's work)
    adamw_beside_finish(g);
    cudaCheck(cudaMemcpy(g.params, g.host_params.data(), g.P * sizeof(float), cudaMemcpyHostToDevice));
    if (g.trains) {
        cudaCheck(cudaMemcpy(g.adam_m, g.host_adam_m.data() + b, n * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(g.adam_v, g.host_adam_v.data() + b, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    float_to_bf16(g.params_bf16, g.params, (long long)g.P, g.stream);
    cudaCheck(cudaStreamSynchronize(g.stream));
}

static void model_download(GpuModel& g) {
    size_t b = g.shard.begin, n = g.shard.end - g.shard.begin;
    adamw_beside_finish(g);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(g.host_params.data(), g.params, g.P * sizeof(float), cudaMemcpyDeviceToHost));
    if (!g.trains) return;
    cudaCheck(cudaMemcpy(g.host_adam_m.data() + b, g.adam_m, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(g.host_adam_v.data() + b, g.adam_v, n * sizeof(float), cudaMemcpyDeviceToHost));
}

static bf16* gpu_param(GpuModel& g, int kind, int l = 0) { return g.params_bf16 + param_offset(g.cfg, kind, l); }
static float* gpu_param_f32(GpuModel& g, int kind, int l = 0) { return g.params + param_offset(g.cfg, kind, l); }
static float* gpu_grad(GpuModel& g, int kind, int l = 0) { return g.grads + param_offset(g.cfg, kind, l); }

// A layer's attention. The candidate build hands it to cuDNN's fused kernels where cuDNN takes the
// shape (`cudnn`: model_forward says when), attention.cuh's kernels run it otherwise. On a
// statistics step cuDNN's out and lse still go on, and attention.cuh computes the rows' statistics
// beside them: from cuDNN's lse where its mma kernels take the head width, else by its own
// forward pass (its lse and output into buffers free until the backward: att_delta, datty), so
// that taking statistics never changes what the model computes. Either backward takes the out and
// lse of either forward. attention.cuh's kernels are the mma kernels' lean form in tile_block's
// order (longest tiles first across heads) where the mma kernels take the head width.
static AttentionImpl attention_impl(int D) {
    return attention_auto(D) == ATTENTION_MMA ? ATTENTION_MMA_LEAN_LPT : ATTENTION_AUTO;
}
// Whether the rows' statistics are still to be computed (layer_attention_row_stats): cuDNN's forward
// ran on a statistics step.
static bool layer_attention_forward(GpuModel& g, Activations<bf16>& la, bool stats, bool cudnn, int B, int T) {
    const ModelConfig& c = g.cfg;
    const int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    bool fused = cudnn && cudnn_attention_forward(g.cudnn, la.atty, la.att_lse, la.qk_rope, la.qkv, B, T, H, Hkv, D,
                                                  g.stream);
    if (!fused)
        attention_forward(la.atty, la.att_lse, stats ? la.row_stats : nullptr, g.doc_bits, la.qk_rope, la.qkv, B, T, H,
                          Hkv, D, g.stream, attention_impl(D));
    return fused && stats;
}
// The rows' statistics beside cuDNN's forward, on stream s.
static void layer_attention_row_stats(GpuModel& g, Activations<bf16>& la, int B, int T, cudaStream_t s) {
    const ModelConfig& c = g.cfg;
    Activations<bf16>& a = g.acts;
    const int H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    if (!attention_row_stats_from_lse(la.row_stats, la.att_lse, g.doc_bits, la.qk_rope, B, T, H, Hkv, D, s,
                                      /* lpt */ true, g.stats_rows_plain, g.stats_rows_wgmma))
        attention_row_stats(a.att_delta, la.row_stats, a.datty, g.doc_bits, la.qk_rope, la.qkv, B, T, H, Hkv, D, s);
}
static void layer_attention_backward(GpuModel& g, Activations<bf16>& la, int B, int T) {
    const ModelConfig& c = g.cfg;
    Activations<bf16>& a = g.acts;
    if (cudnn_attention_backward(g.cudnn, a.dqk, a.dqkv, a.att_delta, a.datty, la.atty, la.att_lse, la.qk_rope, la.qkv,
                                 B, T, c.n_head, c.n_kv_head, c.head_dim, g.stream))
        return;
    attention_backward(a.dqk, a.dqkv, a.att_delta, a.datty, la.atty, la.att_lse, la.qk_rope, la.qkv, B, T, c.n_head,
                       c.n_kv_head, c.head_dim, g.stream, attention_impl(c.head_dim));
}

// The forward pass's work on the device, from the tokens and targets (`targets`: whether there are
// any) already there: the embedding to the losses, copied into host memory. Queues it all on the
// stream and waits for none of it.
static void forward_pass(GpuModel& g, bool targets, int B, int T, bool tm) {
    const ModelConfig& c = g.cfg;
    int N = B * T, C = c.d_model, F = c.d_ff, L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    int A = c.attn_dim(), QKV = c.qkv_dim();
    Activations<bf16>& a = g.acts;
    cudaStream_t s = g.stream;
    auto mark = [&](const char* work) { g.clock.mark(work, s); };  // --profile 2
    mark("embedding");
    wait_for_update(g, 0);  // the weights' update beside (AdamwBeside), part by part
    embedding_forward(a.emb, g.tokens, gpu_param(g, P_WTE), N, C, s);
    ActivationDims dims = activation_dims(c, B, T, g.Vp);
    // cuDNN's attention on the passes that train or evaluate, not a sample's (a new T every token,
    // and cuDNN makes plans for each shape).
    bool cudnn = targets;
    // the statistics beside the layers (StatsBeside), deferred past the pass or not
    const bool beside = tm && g.beside.on && g.beside.warm && !g.clock.on, defer = stats_defer_now(g, tm);
    for (int l = 0; l < L; l++) {
        Activations<bf16> la = layer_activations(a, dims, l);  // this layer's part of each buffer
        if (defer) {
            la.qk_normed = g.beside.layer_qk_normed + (size_t)l * N * (H + Hkv) * D;
            la.row_stats = g.beside.layer_row_stats + (size_t)l * ATTN_NUM_ROW_STATS * N * H;
        } else if (beside && l % 2 == 1) {
            la.qk_normed = g.beside.qk_normed;
            la.row_stats = g.beside.row_stats;
        }
        const bf16* x = l == 0 ? a.emb : layer_activations(a, dims, l - 1).res_mlp;
        mark("RMSNorm forward");
        wait_for_update(g, l + 1);
        rmsnorm_forward(la.ln1, la.ln1_rstd, x, gpu_param(g, P_ATTN_NORM, l), N, C, c.norm_eps, s);
        mark("matrix products of the layers, forward");
        matmul_forward(g.mm, la.qkv, la.ln1, gpu_param(g, P_WQ, l), nullptr, N, C, QKV, s);  // [Wq; Wk; Wv] in one product
        mark("QK-norm + RoPE forward");
        if (beside && !defer && l >= 2) cudaCheck(cudaStreamWaitEvent(s, g.beside.done[l % 2], 0));  // its buffers measured
        const bool vec = qk_norm_rope_vec_supports(D, {la.qk_rope, la.qkv, la.qk_normed, gpu_param(g, P_Q_GAIN, l),
                                                       gpu_param(g, P_K_GAIN, l), g.rope_cos, g.rope_sin});
        const bool query_norms = tm && vec && g.query_norms && head_row_stats_vec_supports(D, la.qk_normed);
        TelemetryWays ways{query_norms, g.gram_dmma_k, g.gram_key_records, {}};
        if (tm && vec && g.gram_from_projection) {  // the keys for the statistics from their projections
            ways.projection = {nullptr, la.qkv, la.qk_rstd, gpu_param(g, P_K_GAIN, l)};
            if (!gram_from_projection_applies(ways, D, la.qk_normed)) ways.projection = GramKeys();
        }
        qk_norm_rope_forward(la.qk_rope, tm ? la.qk_normed : nullptr, la.qk_rstd, la.qkv, gpu_param(g, P_Q_GAIN, l),
                             gpu_param(g, P_K_GAIN, l), g.rope_cos, g.rope_sin, N, T, H, Hkv, D, c.norm_eps,
                             qk_norm_normalises(c.qk_norm), s, vec && g.qk_forward_ahead ? kQkForwardAheadItems : 0,
                             query_norms, !ways.projection.qkv);
        mark("attention forward");
        const bool rows_left = layer_attention_forward(g, la, tm, cudnn, B, T);
        if (tm) {
            cudaStream_t ts = s;  // the statistics' stream
            if (beside) {
                cudaCheck(cudaEventRecord(g.beside.ready, s));
                cudaCheck(cudaStreamWaitEvent(g.beside.stream, g.beside.ready, 0));
                ts = g.beside.stream;
                if (defer && g.beside.test_delay_us) spin_kernel<<<1, 1, 0, ts>>>(g.beside.test_delay_us);
            }
            if (rows_left) layer_attention_row_stats(g, la, B, T, ts);
            telemetry_layer(g.stat_sums, g.stats_layout, g.stats_partial, a.keys_f64, g.mm, la.qk_normed, la.row_stats,
                            gpu_param_f32(g, P_Q_GAIN, l), gpu_param_f32(g, P_K_GAIN, l), B, T, c, l, ts, mark, ways);
            if (beside) cudaCheck(cudaEventRecord(g.beside.done[l % 2], ts));
        }
        mark("matrix products of the layers, forward");
        matmul_forward(g.mm, la.res_attn, la.atty, gpu_param(g, P_WO, l), x, N, A, C, s);  // + residual
        mark("RMSNorm forward");
        rmsnorm_forward(la.ln2, la.ln2_rstd, la.res_attn, gpu_param(g, P_MLP_NORM, l), N, C, c.norm_eps, s);
        mark("matrix products of the layers, forward");
        matmul_forward(g.mm, la.fc13, la.ln2, gpu_param(g, P_W1, l), nullptr, N, C, 2 * F, s);  // [W1; W3]
        mark("SwiGLU forward");
        swiglu_forward(la.swi, la.fc13, N, F, s);
        mark("matrix products of the layers, forward");
        matmul_forward(g.mm, la.res_mlp, la.swi, gpu_param(g, P_W2, l), la.res_attn, N, F, C, s);  // + residual
    }
    mark("RMSNorm forward");
    wait_for_update(g, L + 1);
    rmsnorm_forward(a.lnf, a.lnf_rstd, layer_activations(a, dims, L - 1).res_mlp, gpu_param(g, P_FINAL_NORM), N, C,
                    c.norm_eps, s);
    mark("classifier forward: matrix product, softmax and loss");
    matmul_forward(g.mm, a.logits, a.lnf, gpu_param(g, output_projection(c)), nullptr, N, C, c.vocab_size, s, g.Vp);
    if (targets) {
        classifier(a.logits, a.losses, a.logit_lse, g.targets, N, c.vocab_size, g.Vp, 0.0f, s);
        mark("losses to the host");
        cudaCheck(cudaMemcpyAsync(g.losses_host, a.losses, N * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    if (defer) {  // waited for by stats_join
        cudaCheck(cudaEventRecord(g.beside.deferred_done, g.beside.stream));
        g.beside.pending = true;
    } else if (beside) {
        cudaCheck(cudaStreamWaitEvent(s, g.beside.done[(L - 1) % 2], 0));  // every layer measured
    }
    g.beside.warm = true;
}

// Forward pass; same contract as the CPU's model_forward. Leaves the logits on the device (row
// stride Vp). A pass that trains or evaluates without statistics, untimed by --profile 2, runs
// from a CUDA graph unless TRAIN_CUDA_GRAPH=0 (cuda_graph.cuh). Candidate (stats_pass_graph): a
// pass with statistics from its own graph too, its second stream's work (StatsBeside) forked from
// the model's stream and joined back into it inside the capture. Launched one by one, a d22 pass
// with statistics queues about twice the kernels of one without, and at 4 x 2048 (an H200 at
// 0a29dbc) a statistics step cost 8.4 ms against 5.3 at 8 x 2048, where the device's own work for
// the statistics is half as large: the host, not the device, is the likely bound there.
static bool stats_pass_graph_on() {
    static const bool on = candidate_on("stats_pass_graph");
    return on;
}

static float model_forward(GpuModel& g, const int* tokens, const int* targets, int B, int T, bool tm) {
    if (B > g.max_B || T > g.max_T) fail("internal: batch %dx%d exceeds the allocated %dx%d", B, T, g.max_B, g.max_T);
    g.B = B;
    g.T = T;
    const int N = B * T;
    cudaStream_t s = g.stream;
    stats_join(g);  // the last pass's deferred statistics read the document starts and the activations
    g.clock.mark("inputs to the device", s);
    cudaCheck(cudaMemcpyAsync(g.tokens, tokens, N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (targets) cudaCheck(cudaMemcpyAsync(g.targets, targets, N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (tm) {  // the document starts: counted on the host, their bits for the attention kernels
        g.stats_tokens += (double)N;
        g.stats_doc_view += micro_batch_document_starts(g.host_doc_bits, tokens, B, T, g.eot_token);
        cudaCheck(cudaMemcpyAsync(g.doc_bits, g.host_doc_bits.data(), g.host_doc_bits.size() * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, s));
    }
    auto pass = [&] { forward_pass(g, targets != nullptr, B, T, tm); };
    // A graph keeps the way its pass ran when captured: with the statistics beside the layers or
    // between them (g.beside.on), which the key leaves out; the two give the same bits.
    if (targets && (!tm || (stats_pass_graph_on() && !stats_defer_now(g, tm))) && !g.clock.on)
        pass_graph_run(g.graphs, {tm ? 2 : 0, B, T, 0.0f, g.cudnn.workspace_generation}, s, pass);
    else
        pass();
    g.adamw_beside.pending = false;  // the pass waited for all of it (AdamwBeside)
    cudaCheck(cudaStreamSynchronize(s));
    float mean = 0.0f;
    if (targets) {
        double sum = 0;
        for (int n = 0; n < N; n++) sum += g.losses_host[n];
        mean = (float)(sum / N);
    }
    return mean;
}

// Whether this backward pass runs its weight gradients' products beside it (GradsBeside).
static bool grads_beside_now(const GpuModel& g) {
    const GradsBeside& gb = g.grads_beside;
    return kCandidateKernels && gb.on && !g.clock.on && gb.seen(g.B, g.T);
}

// A linear layer's backward, matmul_backward's two products: with `beside`, the weight gradient's
// on a GradsBeside stream (the classifier's own, or the layers'), once the pass's stream has its
// inputs, and the event of its kind recorded after it.
static void linear_backward(GpuModel& g, bool beside, int kind, bf16* dinp, float* dW, const bf16* dout, const bf16* inp,
                            const bf16* W, int IC, int OC, int ld_dout = 0) {
    const int N = g.B * g.T;
    if (!beside) {
        matmul_backward(g.mm, dinp, dW, dout, inp, W, N, IC, OC, g.stream, ld_dout);
        return;
    }
    GradsBeside& gb = g.grads_beside;
    const int side = kind == DW_CLASSIFIER;
    cudaCheck(cudaEventRecord(gb.ready, g.stream));
    cudaCheck(cudaStreamWaitEvent(gb.stream[side], gb.ready, 0));
    if (gb.test_delay_us) spin_kernel<<<1, 1, 0, gb.stream[side]>>>(gb.test_delay_us);
    matmul_lt(g.mm, linear_dweight_problem(dW, dout, inp, N, IC, OC, ld_dout), gb.stream[side], gb.workspace[side]);
    cudaCheck(cudaEventRecord(gb.done[kind], gb.stream[side]));
    gb.queued[kind] = true;
    gb.products++;
    matmul_lt(g.mm, linear_dinp_problem(dinp, dout, W, N, IC, OC, ld_dout), g.stream);
}

// The pass's stream waits for the last weight product of a kind queued beside it in this pass
// (before it writes over the gradient that product reads).
static void wait_for_product(GpuModel& g, int kind) {
    const GradsBeside& gb = g.grads_beside;
    if (gb.queued[kind] && !gb.test_skip_waits) cudaCheck(cudaStreamWaitEvent(g.stream, gb.done[kind], 0));
}

// The end of a pass with products beside it: the pass's stream waits for each stream that ran one
// (a stream that ran none in a captured pass is not part of the capture: it cannot be waited on).
static void join_products(GpuModel& g) {
    GradsBeside& gb = g.grads_beside;
    const bool ran[2] = {gb.queued[DW_MLP_OUT] || gb.queued[DW_MLP_IN] || gb.queued[DW_ATTN_OUT] || gb.queued[DW_QKV],
                         gb.queued[DW_CLASSIFIER]};
    for (int side = 0; side < 2; side++)
        if (ran[side]) {
            cudaCheck(cudaEventRecord(gb.joined[side], gb.stream[side]));
            cudaCheck(cudaStreamWaitEvent(g.stream, gb.joined[side], 0));
        }
}

// The backward pass's work on the device from the classifier down to the first layer's input (the
// embedding's gradient is model_backward's), adding into g.grads. Queues it all on the stream and
// waits for none of it.
static void backward_pass(GpuModel& g, float loss_scale) {
    const ModelConfig& c = g.cfg;
    int B = g.B, T = g.T, N = B * T, C = c.d_model, F = c.d_ff, L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head;
    int D = c.head_dim, A = c.attn_dim(), QKV = c.qkv_dim(), V = c.vocab_size, out = output_projection(c);
    Activations<bf16>& a = g.acts;
    ActivationDims dims = activation_dims(c, B, T, g.Vp);
    cudaStream_t s = g.stream;
    auto mark = [&](const char* work) { g.clock.mark(work, s); };  // --profile 2
    // The partial rows of a norm's gain gradient: the next free part of dgain_partial, their column
    // sums recorded in `defer` and run at the end of the pass.
    ColumnSumJobs* defer = &g.gain_sum_jobs;
    float* next_partial = g.dgain_partial;
    auto partial = [&](size_t floats) {
        if (next_partial + floats > g.dgain_partial + g.dgain_partial_floats)
            fail("internal: the backward pass's gain gradients need more room than dgain_partial has");
        float* p = next_partial;
        next_partial += floats;
        return p;
    };
    const size_t norm_floats = rmsnorm_backward_scratch_floats(N, C),
                 qk_floats = (size_t)qk_norm_rope_backward_blocks(N, H + Hkv) * 2 * D;
    const bool beside = grads_beside_now(g);
    for (bool& q : g.grads_beside.queued) q = false;
    mark("classifier backward: softmax gradient, matrix products");
    classifier(a.logits, a.losses, a.logit_lse, g.targets, N, V, g.Vp, loss_scale / N, s);  // logits -> dlogits
    linear_backward(g, beside, DW_CLASSIFIER, a.dln, gpu_grad(g, out), a.logits, a.lnf, gpu_param(g, out), C, V, g.Vp);
    mark("RMSNorm backward");
    cudaCheck(cudaMemsetAsync(a.dres, 0, (size_t)N * C * sizeof(bf16), s));
    rmsnorm_backward(a.dres, gpu_grad(g, P_FINAL_NORM), partial(norm_floats), a.dln,
                     layer_activations(a, dims, L - 1).res_mlp, a.lnf_rstd, gpu_param(g, P_FINAL_NORM), N, C, s, defer);
    for (int l = L - 1; l >= 0; l--) {
        Activations<bf16> la = layer_activations(a, dims, l);
        const bf16* x = l == 0 ? a.emb : layer_activations(a, dims, l - 1).res_mlp;
        // MLP block (dres: gradient of the block's output, and, through the residual, of res_attn).
        mark("matrix products of the layers, backward");
        linear_backward(g, beside, DW_MLP_OUT, a.dswi, gpu_grad(g, P_W2, l), a.dres, la.swi, gpu_param(g, P_W2, l), F, C);
        mark("SwiGLU backward");
        wait_for_product(g, DW_MLP_IN);  // the layer above's reads dfc13
        swiglu_backward(a.dfc13, a.dswi, la.fc13, N, F, s);
        mark("matrix products of the layers, backward");
        linear_backward(g, beside, DW_MLP_IN, a.dln, gpu_grad(g, P_W1, l), a.dfc13, la.ln2, gpu_param(g, P_W1, l), C,
                        2 * F);
        mark("RMSNorm backward");
        wait_for_product(g, DW_MLP_OUT);  // reads dres
        rmsnorm_backward(a.dres, gpu_grad(g, P_MLP_NORM, l), partial(norm_floats), a.dln, la.res_attn, la.ln2_rstd,
                         gpu_param(g, P_MLP_NORM, l), N, C, s, defer);
        // Attention block.
        mark("matrix products of the layers, backward");
        linear_backward(g, beside, DW_ATTN_OUT, a.datty, gpu_grad(g, P_WO, l), a.dres, la.atty, gpu_param(g, P_WO, l), A,
                        C);
        mark("attention backward");
        wait_for_product(g, DW_QKV);  // the layer above's reads dqkv
        layer_attention_backward(g, la, B, T);
        mark("QK-norm + RoPE backward");
        qk_norm_rope_backward(a.dqkv, gpu_grad(g, P_Q_GAIN, l), gpu_grad(g, P_K_GAIN, l), partial(qk_floats), a.dqk,
                              la.qkv, la.qk_rstd, gpu_param(g, P_Q_GAIN, l), gpu_param(g, P_K_GAIN, l), g.rope_cos,
                              g.rope_sin, N, T, H, Hkv, D, qk_norm_normalises(c.qk_norm), s, defer);
        mark("matrix products of the layers, backward");
        linear_backward(g, beside, DW_QKV, a.dln, gpu_grad(g, P_WQ, l), a.dqkv, la.ln1, gpu_param(g, P_WQ, l), C, QKV);
        mark("RMSNorm backward");
        wait_for_product(g, DW_ATTN_OUT);  // reads dres
        rmsnorm_backward(a.dres, gpu_grad(g, P_ATTN_NORM, l), partial(norm_floats), a.dln, x, la.ln1_rstd,
                         gpu_param(g, P_ATTN_NORM, l), N, C, s, defer);
    }
    mark("the gain gradients' column sums");
    column_sums_run(g.gain_sum_jobs, s);
    if (beside) join_products(g);
}

// Backward pass of the last forward pass (which had targets, already on the device); adds into
// g.grads. Untimed by --profile 2, all but the embedding's gradient (whose launch depends on the
// tokens) runs from a CUDA graph unless TRAIN_CUDA_GRAPH=0 (cuda_graph.cuh).
static void model_backward(GpuModel& g, const int* tokens, const int* targets, float loss_scale) {
    (void)targets;
    const ModelConfig& c = g.cfg;
    const int N = g.B * g.T, V = c.vocab_size;
    cudaStream_t s = g.stream;
    adamw_beside_join(g);
    auto pass = [&] { backward_pass(g, loss_scale); };
    if (!g.clock.on)
        pass_graph_run(g.graphs, {1, g.B, g.T, loss_scale, g.cudnn.workspace_generation}, s, pass);
    else
        pass();
    if (!g.grads_beside.seen(g.B, g.T)) g.grads_beside.shapes.push_back({g.B, g.T});
    g.clock.mark("embedding backward", s);
    group_positions_by_token(g.host_buckets, tokens, N, V);
    static const bool ahead = candidate_on("embedding_ahead");
    embedding_backward(gpu_grad(g, P_WTE), g.acts.dres, g.host_buckets, g.buckets, N, c.d_model, s, ahead);
    // Frozen parameters have no gradient: they stay out of the gradient norm.
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (g.frozen & param_kind_bit(kind))
            for (int l = 0; l < param_layers(c, kind); l++)
                cudaCheck(cudaMemsetAsync(gpu_grad(g, kind, l), 0, param_numel(c, kind) * sizeof(float), s));
}

// Returns once the device has finished the work queued so far (timing).
static void model_wait(GpuModel& g) {
    g.clock.mark("idle: the host between phases", g.stream);
    cudaCheck(cudaStreamSynchronize(g.stream));
}

// --profile 2: the clock records the marks of a step, from its beginning to its end.
static void model_profile_begin(GpuModel& g) { g.clock.begin_step(); }
static void model_profile_end(GpuModel& g, int slot) { g.clock.end_step(slot, g.stream); }

static WorkTimes model_profile_times(GpuModel& g, int slot) { return g.clock.ms[slot]; }

static void model_zero_grad(GpuModel& g) {
    g.clock.mark("optimiser: gradients zeroed, summed, their norm, AdamW", g.stream);
    // an update beside the model's stream sets them to 0 after AdamW reads them (AdamwBeside)
    if (!g.adamw_beside.pending) cudaCheck(cudaMemsetAsync(g.grads, 0, g.P * sizeof(float), g.stream));
    g.clock.mark("idle: the host between phases", g.stream);  // it loads the first micro-batch
}

// The gradients summed over the processes, into each one's shard (one process without NCCL:
// nothing to do).
static void model_grad_sync(GpuModel& g) {
    g.clock.mark("optimiser: gradients zeroed, summed, their norm, AdamW", g.stream);
    if (g.use_nccl) nccl_reduce_scatter(g.nccl, g.grads, g.shard.size, g.dist.rank, g.stream);
}

// Global L2 norm of the gradients (after model_grad_sync): each process's square of its shard,
// summed over the processes. Left on the device for AdamW too.
static float model_grad_norm(GpuModel& g) {
    adamw_beside_join(g);
    squared_norm(g.grad_sq, g.norm_partial, g.grads + g.shard.begin, (long long)(g.shard.end - g.shard.begin), g.stream);
    if (g.use_nccl) nccl_sum(g.nccl, g.grad_sq, 1, g.stream);
    norm_from_square_kernel<<<1, 1, 0, g.stream>>>(g.grad_norm, g.grad_sq);
    cuda_check_launch();
    float norm;
    cudaCheck(cudaMemcpyAsync(&norm, g.grad_norm, sizeof(float), cudaMemcpyDeviceToHost, g.stream));
    cudaCheck(cudaStreamSynchronize(g.stream));
    return norm;
}

// AdamW with clipping to `clip` by the norm model_grad_norm left on the device (grad_norm, its
// host copy, is not needed here).
static void model_adamw_step(GpuModel& g, const AdamWSettings& o, int t, float grad_norm, float clip) {
    (void)grad_norm;
    stats_join(g);  // deferred statistics read the gains
    static const bool tiles = candidate_on("adamw_tiles");
    // AdamW on `count` segments (and their `tile_count` tiles from tile_first) on stream s
    auto update = [&](const ParamSegment* segments, const int* tile_first, int count, int tile_count, cudaStream_t s) {
        if (tiles)
            adamw_step_tiles(g.params, g.params_bf16, g.grads, g.adam_m, g.adam_v, (long long)g.shard.begin, segments,
                             tile_first, count, tile_count, g.grad_norm, clip, o.lr, o.beta1, o.beta2, o.eps,
                             o.weight_decay, t, s);
        else
            adamw_step(g.params, g.params_bf16, g.grads, g.adam_m, g.adam_v, (long long)g.shard.begin, segments, count,
                       g.grad_norm, clip, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, t, s);
    };
    if (!adamw_beside_now(g)) {
        update(g.segments, g.adamw_tile_first, g.num_segments, g.adamw_tiles, g.stream);
        return;
    }
    AdamwBeside& ab = g.adamw_beside;
    cudaCheck(cudaEventRecord(ab.start, g.stream));
    cudaCheck(cudaStreamWaitEvent(ab.stream, ab.start, 0));
    for (size_t p = 0; p < ab.parts.size(); p++) {
        const AdamwBeside::Part& part = ab.parts[p];
        if (ab.test_delay_us) spin_kernel<<<1, 1, 0, ab.stream>>>(ab.test_delay_us);
        update(ab.segments + part.first, ab.tile_first + part.tile_first, part.count, part.tiles, ab.stream);
        if (p + 1 == ab.parts.size()) cudaCheck(cudaMemsetAsync(g.grads, 0, g.P * sizeof(float), ab.stream));
        cudaCheck(cudaEventRecord(ab.done[p], ab.stream));
    }
    ab.pending = true;
}

// Every process's updated shard to every process, and the bf16 copy of the whole model remade
// (one process without NCCL: AdamW already wrote it).
static void model_param_sync(GpuModel& g) {
    if (!g.use_nccl) return;
    g.clock.mark("parameters gathered (NCCL)", g.stream);
    nccl_all_gather(g.nccl, g.params, g.shard.size, g.dist.rank, g.stream);
    float_to_bf16(g.params_bf16, g.params, (long long)g.P, g.stream);
}

// A stats step: the sums cleared before its first forward pass; after its last, copied to the
// host (with the counts of tokens and of queries that see a document start, which the host keeps).
static void model_stats_begin(GpuModel& g) {
    stats_join(g);
    telemetry_sums_clear_kernel<<<64, 256, 0, g.stream>>>(g.stat_sums, g.stats_layout);
    cuda_check_launch();
    g.stats_tokens = 0;
    g.stats_doc_view = 0;
}

static bool model_stats_pending(GpuModel& g) { return g.beside.pending; }

static double* model_stats_sums(GpuModel& g) {
    stats_join(g);
    cudaCheck(cudaMemcpyAsync(g.stat_sums_host, g.stat_sums, g.stats_layout.total * sizeof(double), cudaMemcpyDeviceToHost,
                              g.stream));
    cudaCheck(cudaStreamSynchronize(g.stream));
    g.stat_sums_host[g.stats_layout.count] = g.stats_tokens;
    g.stat_sums_host[g.stats_layout.doc_view] = g.stats_doc_view;
    return g.stat_sums_host;
}

// Row `row` of the last forward pass's logits, as floats.
static void model_logits_row(GpuModel& g, int row, float* out) {
    std::vector<bf16> tmp(g.cfg.vocab_size);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(tmp.data(), g.acts.logits + (size_t)row * g.Vp, tmp.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (int v = 0; v < g.cfg.vocab_size; v++) out[v] = __bfloat162float(tmp[v]);
}

static_assert(check_backend<GpuModel>(), "GpuModel implements backend.h's contract");
#endif  // __CUDACC__

// =============================================================================================
// The training loop, written once for either model (CpuModel or GpuModel).

extern "C" void openblas_set_num_threads(int);

static const double kSampleTemperature = 0.8;

// What main sets up before there is a model: the options, the device, the data, the tokenizer,
// the model configuration and the shape of a batch.
struct Run {
    std::vector<std::string> argv;  // the command line as typed
    Options o;
    std::set<std::string> given;  // the long names of the options on the command line
    int threads = 0;
    bool on_gpu = false;
    std::string device_name;
    Tokenizer tok;
    bool have_tokenizer = false;
    std::string ckpt;  // the checkpoint of -r or -e
    RunFolder folder;  // who the run is and where it writes (run_dir.h)
    ModelConfig c;
    uint32_t frozen = 0;  // the parameter kinds held fixed: --freeze and those the variant leaves unused
    uint32_t decayed = 0;  // the parameter kinds that take weight decay (--decay)
    int B = 0, T = 0;  // a micro-batch
    MemoryNeed need;   // the memory start_model estimated and checked before allocating
    int accum = 0;        // micro-batches per step, over every process
    int local_accum = 0;  // of those, this process's: accum / dist.world
    DataLoader train, val;
    bool have_val = false;
    Dist dist;  // this process among those of a data-parallel run (distributed.h)
    bool writes() const { return dist.rank == 0; }  // the log, checkpoints and what is printed
    bool measuring() const { return o.measure > 0; }  // --measure: the checkpoint of -e measured, nothing trained
    std::future<void> stats_done;  // rank 0: the statistics being finished (collect_stats)
    double stats_host_seconds = 0;  // the last statistics' time on the host, from their sums
};

// Threads per process: the cores it may run on, shared with the other processes of this machine
// that may run on them too (none when the launcher bound each process to cores of its own). A
// collective: every process asks, whether or not its --threads makes the answer moot.
static int default_threads(const Dist& d) { return std::max(1, omp_get_num_procs() / dist_local_sharers(d)); }

static void choose_device(Run& r) {
    const Options& o = r.o;
#ifdef __CUDACC__
    if (o.device != "cpu") r.on_gpu = cuda_device_present(r.dist.local_rank, &r.device_name);
    if (o.device == "cuda" && !r.on_gpu) fail("option %s cuda: no CUDA device is available", OPTION_LABEL("--device"));
    if (r.on_gpu && r.device_name.empty())
        fail("process %d of this machine has no GPU of its own: start at most one process per GPU", r.dist.local_rank);
#else
    if (o.device == "cuda") fail("option %s cuda: this build has no CUDA backend (build with nvcc)", OPTION_LABEL("--device"));
#endif
    if (dist_min(r.dist, r.on_gpu) != dist_max(r.dist, r.on_gpu))
        fail("some processes have a GPU and some have not: give every process the same device (%s)", OPTION_NAME("--device"));
    if (r.dist.world > 1) printf("data parallel: %d processes\n", r.dist.world);
    if (r.on_gpu) printf("device: %s (CUDA)\n", r.device_name.c_str());
    else {
        r.device_name = cpu_device_name(r.threads);
        printf("device: no CUDA device; training on the CPU (%d threads)\n", r.threads);
    }
}

// The data (the default corpus is prepared the first time it is needed), the tokenizer, the model
// configuration and the batch shape.
static void prepare_data_and_config(Run& r) {
    Options& o = r.o;
    if (!o.data_dir.empty() && o.data_dir[0] != '/') o.data_dir = program_dir() + "/" + o.data_dir;
    if (r.given.count("--train") && o.train_pattern.empty()) fail("option %s: the pattern is empty", OPTION_LABEL("--train"));
    if (r.given.count("--val") && o.val_pattern.empty()) fail("option %s: the pattern is empty", OPTION_LABEL("--val"));
    if (o.train_pattern.empty()) {
        if (r.writes()) ensure_brown_dataset(o.data_dir);  // the first process prepares it, once
        dist_barrier(r.dist);
        ensure_brown_dataset(o.data_dir);
        o.train_pattern = o.data_dir + "/train_*.bin";
        if (o.val_pattern.empty()) o.val_pattern = o.data_dir + "/val_*.bin";
        if (o.tokenizer.empty()) o.tokenizer = o.data_dir + "/tokenizer.model";
    }
    std::string shard_dir = o.train_pattern.substr(0, o.train_pattern.find_last_of('/') + 1);
    if (file_exists(shard_dir + "dataset.txt") && !file_exists(shard_dir + ".complete"))
        fail("%s: the preparation of this dataset did not finish (no .complete); prepare it again", shard_dir.c_str());
    if (o.tokenizer.empty() && file_exists(shard_dir + "tokenizer.model")) o.tokenizer = shard_dir + "tokenizer.model";
    r.have_tokenizer = !o.tokenizer.empty();
    if (r.have_tokenizer) tokenizer_load(&r.tok, o.tokenizer);
    r.ckpt = o.resume_ckpt.empty() ? o.init_ckpt : o.resume_ckpt;
    r.c = resolve_config(o, r.given, r.have_tokenizer ? tokenizer_vocab_size(&r.tok) : 0, r.ckpt);
    if (o.eot >= r.c.vocab_size)
        fail("option %s %d: not a token of the vocabulary (0 to %d)", OPTION_LABEL("--eot"), o.eot, r.c.vocab_size - 1);
    if (o.eot < 0 && r.have_tokenizer) o.eot = tokenizer_bos_id(&r.tok);  // the log's options say the token used
    o.qk_norm = kQkNormNames[r.c.qk_norm];  // the log's options say the variant a checkpoint brought,
    o.rope_theta = r.c.rope_theta;          // and its RoPE base and norm epsilon
    o.norm_eps = r.c.norm_eps;
    o.tied_embeddings = r.c.tied_embeddings;
    std::string unknown;
    parse_param_kinds(o.freeze, &r.frozen, &unknown);  // checked by parse_options
    if (r.frozen & absent_kinds(r.c))
        fail("option %s %s: this model has no %s (a model with tied embeddings has no lm_head)", OPTION_LABEL("--freeze"),
             o.freeze.c_str(), param_kinds_text(r.frozen & absent_kinds(r.c)).c_str());
    r.frozen = frozen_kinds(r.c, r.frozen);
    if ((r.frozen | absent_kinds(r.c)) == kAllParamKinds)
        fail("option %s %s: every parameter would be frozen; nothing would train", OPTION_LABEL("--freeze"), o.freeze.c_str());
    parse_decay_kinds(o.decay, &r.decayed, &unknown);  // checked by parse_options
    const ModelConfig& c = r.c;
    int T = o.seq_len ? o.seq_len : c.max_seq_len, B = o.batch;
    if (T > c.max_seq_len) fail("option %s %d is above the model's max_seq_len %d", OPTION_LABEL("--seq-len"), T, c.max_seq_len);
    if ((long long)B * T > (1LL << 28))
        fail("options %s %d and %s %d: %lld tokens per micro-batch is too many", OPTION_LABEL("--batch"), B,
             OPTION_LABEL("--seq-len"), T, (long long)B * T);
    int tokens_per_micro = B * T;
    if (!o.total_batch) o.total_batch = tokens_per_micro * r.dist.world;  // a micro-batch per process
    if (o.total_batch % tokens_per_micro != 0)
        fail("option %s %d is not a multiple of batch * seq_len = %d", OPTION_LABEL("--total-batch"), o.total_batch,
             tokens_per_micro);
    r.B = B;
    r.T = T;
    r.accum = o.total_batch / tokens_per_micro;
    if (r.accum % r.dist.world != 0)
        fail("option %s %d: its %d micro-batches of %dx%d do not split evenly over %d processes",
             OPTION_LABEL("--total-batch"), o.total_batch, r.accum, B, T, r.dist.world);
    r.local_accum = r.accum / r.dist.world;

    // A measurement of the validation data reads it in order, as the validation loss does.
    bool measure_val = r.measuring() && o.measure_data == "val";
    if (measure_val && o.val_pattern.empty())
        fail("option %s val: there are no validation shards (%s)", OPTION_LABEL("--measure-data"), OPTION_NAME("--val"));
    dataloader_init(&r.train, (measure_val ? o.val_pattern : o.train_pattern).c_str(), B, T, c.vocab_size,
                    o.shuffle == 1 && !measure_val, (uint64_t)o.seed);
    if (r.measuring() && (long long)o.measure * r.accum > r.train.batches_per_epoch)
        printf("measurement: the data holds %lld micro-batches of %dx%d; the %lld asked for read it more than once\n",
               r.train.batches_per_epoch, B, T, (long long)o.measure * r.accum);
    r.have_val = !o.val_pattern.empty() && !r.measuring();
    if (r.have_val) {
        dataloader_init(&r.val, o.val_pattern.c_str(), B, T, c.vocab_size, false, 0);
        if (o.val_batches > r.val.batches_per_epoch) {
            printf("validation: %s holds %lld batches of %dx%d; evaluating those instead of %d\n", o.val_pattern.c_str(),
                   r.val.batches_per_epoch, B, T, o.val_batches);
            o.val_batches = (int)r.val.batches_per_epoch;
        }
    }
}

// Every process must train the same model on the same data with the same options, or their
// collectives would not match (MPI_ERR_TRUNCATE) or their weights drift apart: compared before
// the first collective that depends on them. Paths may differ (the same data elsewhere); the
// data itself is compared by its fingerprint.
static void check_same_everywhere(const Run& r) {
    if (r.dist.world == 1) return;
    auto same = [&](uint64_t x) {
        int lo = (int)(uint32_t)x, hi = (int)(uint32_t)(x >> 32);
        return dist_min(r.dist, lo) == dist_max(r.dist, lo) && dist_min(r.dist, hi) == dist_max(r.dist, hi);
    };
    auto text_hash = [](const std::string& text) {
        uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
        for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
        return h;
    };
    static const std::set<std::string> per_process = {"--train", "--val", "--tokenizer", "--data-dir", "--out", "--threads",
                                                      "--init", "--resume", "--profile"};
    for (const OptSpec& s : kOptions)
        if (!per_process.count(s.long_name) && !same(text_hash(option_value_text(r.o, s))))
            fail("option %s differs between the processes; give every process the same options", option_label(s).c_str());
    for (const ConfigField& f : kConfigFields)
        if (!same(text_hash(config_value_text(r.c, f))))
            fail("the model's %s differs between the processes (their %s, %s or %s files differ); give every process the "
                 "same model", f.name, OPTION_NAME("--resume"), OPTION_NAME("--init"), OPTION_NAME("--tokenizer"));
    if (!same(r.train.fingerprint))
        fail("option %s: the processes read different training data; give every process the same shards", OPTION_LABEL("--train"));
    if (!same(r.have_val ? r.val.fingerprint : 0))
        fail("option %s: the processes read different validation data; give every process the same shards", OPTION_LABEL("--val"));
}

// What a checkpoint of this run records besides its step and weights: the data order, the
// training schedule, who wrote it and on what data. A resumed run compares it with its checkpoint's.
static CheckpointInfo checkpoint_info(const Run& r) {
    CheckpointInfo info;
    info.config = r.c;
    info.has_optimizer_state = true;
    info.data_order.batch = r.B;
    info.data_order.seq_len = r.T;
    info.data_order.total_batch = r.o.total_batch;
    info.data_order.shuffle = r.o.shuffle;
    info.data_order.seed = r.o.seed;
    info.schedule = training_schedule(r.o, r.on_gpu ? 0 : r.threads * r.dist.world,  // the threads of every process
                                      r.frozen, r.decayed);
    info.origin = {r.folder.run_id, r.folder.continuation, r.train.fingerprint, r.have_val ? r.val.fingerprint : 0};
    return info;
}

// The weights and AdamW state: from the checkpoint of -r (with its step and data position) or -e,
// else freshly initialised; then onto the device.
template <typename Model>
static void load_weights(Model& m, Run& r, int* start_step, long long* data_position) {
    const Options& o = r.o;
    HostState h = host_state(m);
    r.folder = new_run();
    if (r.ckpt.empty()) {
        init_parameters(r.c, h.params, (uint64_t)o.seed);
    } else if (is_directory(r.ckpt)) {  // -e of a Hugging Face directory: its weights, the AdamW state still zero
        HfCheckpoint hf = hf_open(r.ckpt);
        hf_read_params(hf, h.params);
        printf("weights: %s (%s, %s), a Hugging Face checkpoint\n", r.ckpt.c_str(), hf.architecture.c_str(), hf_dtypes(hf).c_str());
    } else {
        bool resuming = !o.resume_ckpt.empty();  // -e: the weights only (the AdamW state stays 0)
        CheckpointInfo info =
            checkpoint_read(r.ckpt, h.params, resuming ? h.adam_m : nullptr, resuming ? h.adam_v : nullptr);
        if (resuming) {
            continue_run(r.folder, r.ckpt, info, check_resume(r.ckpt, info, checkpoint_info(r), o));
            *start_step = (int)info.step;
            *data_position = info.data_position;
            dataloader_seek(&r.train, *data_position);
        }
    }
    hold_unused_gains(r.c, h.params);
    model_upload(m);
    model_freeze(m, r.frozen);
    model_decay(m, r.decayed);
}

// What a measurement's header says of the weights it measures (-e): a checkpoint of this program
// records its step, its run and its tokens per step; a Hugging Face directory none of them.
static RunInfo::Measured measured_weights(const std::string& path) {
    RunInfo::Measured m;
    m.checkpoint = absolute_path(path);
    if (is_directory(path)) return m;
    CheckpointInfo info = checkpoint_read_header(path);
    m.step = info.step;
    m.run_id = info.origin.run_id;
    if (info.data_order.batch) m.tokens = info.step * info.data_order.total_batch;
    return m;
}

// What the run log's header says about the run besides the model (run_dir.h fills in its ids).
static RunInfo run_info(const Run& r) {
    RunInfo run;
    run.config = r.c;
    for (const OptSpec& s : kOptions) run.options.push_back({s.long_name + 2, option_value_text(r.o, s)});
    run.seed = (uint64_t)r.o.seed;
    run.backend = r.on_gpu ? "cuda" : "cpu";
    run.device = r.device_name;
    run.num_processes = r.dist.world;
    run.train_tokens = r.train.total_tokens;
    if (r.measuring()) run.measured = measured_weights(r.o.init_ckpt);
    return run;
}

static void print_run_summary(const Run& r) {
    const ModelConfig& c = r.c;
    const Options& o = r.o;
    printf("model: %d layers, %d heads (%d key/value), head_dim %d, d_model %d, d_ff %d, vocab %d, qk-norm %s: %.2fM "
           "parameters\n", c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.d_model, c.d_ff, c.vocab_size,
           kQkNormNames[c.qk_norm], num_parameters(c) / 1e6);
    if (!c.tied_embeddings) printf("embeddings: untied (lm_head is the output projection)\n");
    if (c.rope_factor != 0.0f)
        printf("rope scaling: llama3, factor %g, frequency factors %g and %g, original context %d\n", c.rope_factor,
               c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_pos);
    if (r.frozen) printf("frozen: %s\n", param_kinds_text(r.frozen).c_str());
    if (r.decayed != matrix_kinds() && !r.measuring())
        printf("weight decay: on %s (not the default, the matrices)\n", param_kinds_text(r.decayed & ~absent_kinds(c)).c_str());
    std::string shape = strprintf("%d tokens (batch %d x seq %d, %d micro-batch%s%s)", o.total_batch, r.B, r.T, r.accum,
                                  r.accum > 1 ? "es" : "",
                                  r.dist.world > 1 ? strprintf(", %d on each of %d processes", r.local_accum, r.dist.world).c_str() : "");
    if (r.measuring())
        printf("measuring %s: %d batches of %s, forward passes only, statistics on every batch\n", o.init_ckpt.c_str(),
               o.measure, shape.c_str());
    else
        printf("training: %d steps of %s, lr %g, stats every %d steps\n", o.steps, shape.c_str(), o.lr, o.stats_every);
    printf("data: %s (%lld tokens)%s%s\n", o.train_pattern.c_str(), r.train.total_tokens,
           r.have_val ? ", validation " : "", r.have_val ? o.val_pattern.c_str() : "");
    if (o.stats_every && o.eot < 0)
        printf("statistics: no end-of-text token (no tokenizer, and no %s): attn_doc_start is 0\n", OPTION_NAME("--eot"));
    printf("output: %s\n", o.out_dir.c_str());
}

// --profile: seconds per phase of a step, summed over the steps after the first (which warms
// up), split by whether the step measured statistics; with --profile 2 also the device's time per
// kind of work, where the backend can time it (the GPU's). With the candidate adamw_beside (not
// under --profile 2) the update's time falls in the next step's forward pass.
struct Profile {
    enum Phase { FORWARD, BACKWARD, OPTIMIZER, STEP, NUM_PHASES };
    bool on = false, kernels = false, counting = false, stats_step = false;
    double sum[2][NUM_PHASES] = {}, steps[2] = {}, mark = 0;
    double stats_host = 0, stats_waited = 0;  // the statistics from their sums on the host; the step's wait for them

    // A stats step's statistics, finished on the host (wait_stats) after `waited` seconds of waiting:
    // the wait stays out of the phase it falls in (a later stats step's forward or backward pass),
    // and in the step's time.
    void stats_finished(const Run& r, double waited) {
        mark += waited;
        if (!counting) return;
        stats_host += r.stats_host_seconds;
        stats_waited += waited;
    }

    template <typename Model>
    void begin_step(Model& m, bool count, bool stats, double now) {
        if (kernels) model_profile_begin(m);
        counting = on && count;
        stats_step = stats;
        mark = now;
    }
    // Ends a phase: waits for the device so that the phase's work is inside its time.
    template <typename Model>
    void end_phase(Model& m, Phase p) {
        if (!on) return;
        model_wait(m);
        double now = now_seconds();
        if (counting) sum[stats_step][p] += now - mark;
        mark = now;
    }
    template <typename Model>
    void end_step(Model& m, double seconds) {
        if (kernels) model_profile_end(m, counting ? (int)stats_step : -1);
        if (!counting) return;
        sum[stats_step][STEP] += seconds;
        steps[stats_step]++;
    }
    template <typename Model>
    void print(Model& m) const {
        bool untimed = false;
        for (int k = 0; k < 2; k++) {
            if (!steps[k]) continue;
            double n = steps[k];
            const char* which = k ? "steps with statistics" : "steps without statistics";
            printf("profile, %s (%.0f steps): forward %.2f ms, backward %.2f ms, optimiser %.2f ms, step %.2f ms\n",
                   which, n, 1e3 * sum[k][FORWARD] / n, 1e3 * sum[k][BACKWARD] / n, 1e3 * sum[k][OPTIMIZER] / n,
                   1e3 * sum[k][STEP] / n);
            if (k == 1 && stats_host > 0)
                printf("profile, steps with statistics: the statistics from their sums on the host (two eigenvalue problems "
                       "per key head, beside the passes that follow) %.2f ms, waited for %.2f ms\n",
                       1e3 * stats_host / n, 1e3 * stats_waited / n);
            WorkTimes w = kernels ? model_profile_times(m, k) : WorkTimes{};
            if (!w.empty()) print_work(w, which, n);
            untimed |= kernels && w.empty();
        }
        if (untimed) printf("profile 2: this backend does not time its work by kind (the GPU's does)\n");
    }
    // The device's time per kind of work, the largest first, ms per step and share of their sum.
    static void print_work(WorkTimes w, const char* which, double steps) {
        std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        double total = 0;
        for (const auto& e : w) total += e.second;
        printf("profile, %s, the device's time per step by kind of work (CUDA events):\n", which);
        for (const auto& e : w)
            printf("  %-56s %8.3f ms %5.1f%%\n", e.first.c_str(), e.second / steps, 100.0 * e.second / total);
        printf("  %-56s %8.3f ms\n", "sum", total / steps);
    }
};

// After a stats step's last forward pass (or its backward pass, where the GPU's statistics run beside
// it: StatsBeside's stats_deferred): every process's sums added into rank 0's, which turns them into
// the statistics (two eigenvalue problems per key head) beside the backward pass and the steps that
// follow on the GPU, when they are waited for on the CPU (wait_stats).
template <typename Model>
static void collect_stats(Model& m, Run& r, Telemetry* out) {
    double* sums = model_stats_sums(m);
    TelemetrySums lay = m.stats_layout;
    telemetry_sums_reduce(r.dist, sums, lay);
    if (!r.writes()) return;
    ModelConfig c = r.c;
    double* seconds = &r.stats_host_seconds;  // read after stats_done.get(), which orders the write before it
    // On the GPU the main thread spins while it waits for the device (CUDA's default with fewer
    // contexts than cores): the statistics take the other cores, as many as --threads allows. A
    // thread's own setting: a new thread's team would take every core.
    int threads = r.on_gpu ? std::max(1, r.threads - 1) : r.threads;
    r.stats_done = std::async(r.on_gpu ? std::launch::async : std::launch::deferred, [out, sums, lay, c, seconds, threads] {
        omp_set_num_threads(threads);
        double start = now_seconds();
        telemetry_from_sums(*out, sums, lay, c);
        *seconds = now_seconds() - start;
    });
}

// Waits for the statistics being finished (collect_stats); returns the seconds it waited.
static double wait_stats(Run& r) {
    double start = now_seconds();
    if (r.stats_done.valid()) r.stats_done.get();
    return now_seconds() - start;
}

// The forward and backward passes of one optimiser step: this process's r.local_accum of the
// step's r.accum micro-batches, its gradients accumulated; with stats (rank 0's), the statistics
// of every micro-batch of the step. Returns the mean loss over the step. A measurement's step (a
// batch of --measure) is the same without the backward passes.
//
// The step's micro-batches are the next r.accum of the data, whatever the number of processes:
// process k takes the k-th run of local_accum of them, so one process with gradient accumulation
// and several without see the same batches.
template <typename Model, typename Finish>
static float forward_backward(Model& m, Run& r, long long* data_position, Telemetry* stats, Profile& prof,
                              Finish&& finish_previous) {
    bool backward = !r.measuring();
    if (backward) model_zero_grad(m);
    if (stats) model_stats_begin(m);
    if (r.dist.world > 1) dataloader_seek(&r.train, *data_position + (long long)r.dist.rank * r.local_accum);
    double loss_sum = 0;
    for (int micro = 0; micro < r.local_accum; micro++) {
        const bool last = micro == r.local_accum - 1;
        dataloader_next_batch(&r.train);
        loss_sum += model_forward(m, r.train.inputs.data(), r.train.targets.data(), r.B, r.T, stats != nullptr);
        prof.end_phase(m, Profile::FORWARD);
        // The sums once the last forward pass is done, so that the host's part runs beside the
        // backward pass; where the device's part still runs (model_stats_pending), after the
        // backward pass, beside which it runs. The last stats step's statistics are finished
        // (finish_previous) just before these sums replace theirs.
        const bool collect = stats && last, after_backward = backward && model_stats_pending(m);
        auto finish_and_collect = [&] {
            finish_previous();
            collect_stats(m, r, stats);
        };
        if (collect && !after_backward) finish_and_collect();
        if (!backward) continue;
        model_backward(m, r.train.inputs.data(), r.train.targets.data(), 1.0f / r.accum);
        if (collect && after_backward) finish_and_collect();
        prof.end_phase(m, Profile::BACKWARD);
    }
    *data_position += r.accum;
    dist_sum(r.dist, &loss_sum, 1);
    return (float)(loss_sum / r.accum);
}

// Mean loss over the same validation batches each time, the processes taking every world-th.
template <typename Model>
static float evaluate(Model& m, Run& r, int batches) {
    double sum = 0;
    for (int i = r.dist.rank; i < batches; i += r.dist.world) {
        dataloader_seek(&r.val, i);
        dataloader_next_batch(&r.val);
        sum += model_forward(m, r.val.inputs.data(), r.val.targets.data(), r.val.B, r.val.T, false);
    }
    dist_sum(r.dist, &sum, 1);
    return (float)(sum / batches);
}

template <typename Model>
static void save_checkpoint(Model& m, const Run& r, const std::string& path, int step, long long data_position) {
    model_download(m);
    HostState h = host_state(m);
    // The AdamW state is sharded: rank 0 gathers it (the weights are whole on every process).
    dist_gather_to_root(r.dist, h.adam_m, m.shard.size);
    dist_gather_to_root(r.dist, h.adam_v, m.shard.size);
    if (!r.writes()) return;
    CheckpointInfo info = checkpoint_info(r);
    info.step = step;
    info.data_position = data_position;
    checkpoint_write(path, info, h.params, h.adam_m, h.adam_v);
}

// A few lines of text continued from the document-start token, sampled at kSampleTemperature.
template <typename Model>
static void print_samples(Model& m, const Run& r, uint64_t seed) {
    const Options& o = r.o;
    if (!r.have_tokenizer || o.samples == 0 || o.sample_tokens == 0) return;
    int V = r.c.vocab_size, S = std::min(o.samples, r.B), len = 1;
    std::vector<std::vector<int>> seqs(S, std::vector<int>{tokenizer_bos_id(&r.tok)});
    std::vector<int> window;
    std::vector<float> z(V);
    std::vector<double> prob(V);
    Rng rng{seed};
    for (int i = 0; i < o.sample_tokens; i++, len++) {
        int T = std::min(len, r.T);
        window.assign((size_t)S * T, 0);
        for (int s = 0; s < S; s++)
            for (int t = 0; t < T; t++) window[(size_t)s * T + t] = seqs[s][len - T + t];
        model_forward(m, window.data(), nullptr, S, T, false);
        for (int s = 0; s < S; s++) {
            model_logits_row(m, s * T + T - 1, z.data());
            double mx = -1e300, total = 0;
            for (int v = 0; v < V; v++) mx = std::max(mx, (double)z[v]);
            for (int v = 0; v < V; v++) total += prob[v] = exp((z[v] - mx) / kSampleTemperature);
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
    printf("samples (temperature %g):\n", kSampleTemperature);
    for (int s = 0; s < S; s++) {
        std::string text = tokenizer_decode(&r.tok, std::vector<int>(seqs[s].begin() + 1, seqs[s].end()));
        for (char& ch : text)
            if (ch == '\n') ch = ' ';
        printf("  > %s\n", text.c_str());
    }
}

// Ctrl-C (SIGINT), SIGTERM or SIGUSR1 while training: the first lets the step finish, then the
// run writes a checkpoint, closes its log and stops with the command that resumes it; a second
// stops at once. (Under mpirun, SIGUSR1 is the one to send: mpirun passes it on to every process,
// whereas it ends them on SIGINT and SIGTERM after a second.)
static volatile sig_atomic_t g_stop_signal = 0;

static const char* stop_signal_name(int sig) { return sig == SIGINT ? "Ctrl-C" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1"; }

static void on_stop_signal(int sig) {
    if (g_stop_signal) {  // the second: the signal's default action, once this handler returns
        static const char now[] = "\nstopping now, without a checkpoint\n";
        ssize_t ignored = write(2, now, sizeof now - 1);
        (void)ignored;
        signal(sig, SIG_DFL);
        raise(sig);  // blocked while its handler runs: delivered when it returns
        return;
    }
    g_stop_signal = sig;
    static const char note[] = "\nstopping after this step, with a checkpoint (a second Ctrl-C stops at once)\n";
    ssize_t ignored = write(2, note, sizeof note - 1);  // write() is safe in a signal handler; printf is not
    (void)ignored;
}

// A NaN or infinite loss or gradient norm (the same on every process): the step is logged and
// the run stops before the update would damage the weights.
[[noreturn]] static void stop_diverged(Run& r, RunLog& log, int step, float loss, float lr, float norm) {
    wait_stats(r);
    if (r.writes()) {
        runlog_step(log, step, loss, lr, norm, 0, 0);
        runlog_close(log);
    }
    dist_fail_together(r.dist, strprintf("step %d: the loss is %g and the gradient norm %g; stopping before the weights "
                                         "are damaged (%s and earlier checkpoints are intact; try a lower %s)",
                                         step, loss, norm, r.folder.log_path.c_str(), OPTION_NAME("--lr")));
}

// The model allocated, once every process has the same options and data and the memory it needs
// is there.
template <typename Model>
static void start_model(Model& m, Run& r) {
    check_same_everywhere(r);
    r.need = memory_need(m, r.c, r.B, r.T, r.dist, !r.measuring());
    check_memory(r.o, r.given, r.c, r.need, memory_available(m));
    try {
        model_init(m, r.c, r.B, r.T, r.dist, !r.measuring());  // sampling at the end uses at most B sequences of at most T
    } catch (const std::bad_alloc&) {
        fail_allocation(r.o, r.given, r.c, r.need);
    }
    m.eot_token = r.o.eot;  // the document starts of the statistics
}

// Rank 0, once every process has its data and weights: the output folder and the run log.
static RunLog open_output(Run& r) {
    RunLog log;
    dist_barrier(r.dist);
    if (!r.writes()) return log;
    take_run_dir(r.folder, r.o.out_dir);
    r.o.out_dir = r.folder.dir;  // the log's options say where it went
    log = open_run_log(r.folder, run_info(r), r.measuring() ? "" : r.o.init_ckpt);  // a measurement's header says whose
    print_run_summary(r);
    return log;
}

// After step `step`: a checkpoint every -n steps, at the last step, and when a signal asks the run
// to stop, which it then does (with the command that resumes it). log_pending() first logs what the
// steps so far have measured and not logged yet.
template <typename Model, typename LogPending>
static void checkpoint_after(Model& m, Run& r, RunLog& log, int step, long long data_position,
                             LogPending&& log_pending) {
    const Options& o = r.o;
    bool last = step == o.steps - 1;
    int stop_signal = dist_max(r.dist, g_stop_signal);  // a signal to any process stops them all
    bool stopping = stop_signal && !last;
    if (!((o.ckpt_every && (step + 1) % o.ckpt_every == 0) || last || stopping)) return;
    std::string path = checkpoint_path(o.out_dir, step + 1, last);
    log_pending();
    if (r.writes()) runlog_flush(log);
    save_checkpoint(m, r, path, step + 1, data_position);
    if (r.writes()) {
        printf("wrote %s\n", path.c_str());
        remove_old_checkpoints(o.out_dir, o.keep, step + 1, path);
    }
    if (!stopping) return;
    if (r.writes()) runlog_close(log);
    printf("stopped by %s after step %d of %d; resume with:\n  %s\n", stop_signal_name(stop_signal), step + 1, o.steps,
           resume_command(r.argv, path).c_str());
    fflush(stdout);
    dist_barrier(r.dist);  // the checkpoint is written before any process ends
    dist_finalize(r.dist);
    exit(128 + stop_signal);
}

// The end of a training run or measurement: the log closed, the profile and `done` printed, then a
// few sampled lines and the command that makes the report; everything freed.
template <typename Model>
static int finish(Model& m, Run& r, RunLog& log, const Profile& prof, const std::string& done) {
    if (r.writes()) runlog_close(log);
    prof.print(m);
    printf("%s\n", done.c_str());
    if (r.on_gpu) printf("peak host memory: %.2f GB\n", peak_resident_bytes() / 1e9);
    else printf("peak memory: %.2f GB (estimated before allocating: %.2f GB)\n", peak_resident_bytes() / 1e9, r.need.total / 1e9);
    if (r.writes()) {
        print_samples(m, r, (uint64_t)r.o.seed + 1);
        printf("report: /usr/bin/python3 %s/scripts/report.py %s\n", program_dir().c_str(), r.folder.log_path.c_str());
    }
    model_free(m);
    dataloader_free(&r.train);
    if (r.have_val) dataloader_free(&r.val);
    return 0;
}

template <typename Model>
static int train(Model& m, Run& r) {
    const Options& o = r.o;
    start_model(m, r);
    int start_step = 0;
    long long data_position = 0;  // micro-batches of training data consumed, by every process together
    load_weights(m, r, &start_step, &data_position);
    RunLog log = open_output(r);

    AdamWSettings opt;
    opt.beta1 = o.beta1;
    opt.beta2 = o.beta2;
    opt.weight_decay = o.weight_decay;
    Telemetry stats;
    Profile prof;
    prof.on = o.profile;
    prof.kernels = o.profile == 2;
    // Under mpirun only SIGUSR1 stops gracefully: mpirun sends SIGTERM to every process when it
    // aborts the job (and kills them a second later), which must not read as a request to stop.
    for (int sig : {SIGINT, SIGTERM, SIGUSR1})
        if (sig == SIGUSR1 || r.dist.world == 1) signal(sig, on_stop_signal);
    double run_start = now_seconds(), step_seconds_avg = 0;
    float last_val = NAN;
    int width = (int)std::to_string(o.steps).size();
    // A stats step's statistics are finished on the host beside the steps after it (collect_stats),
    // and logged once the next stats step needs their sums again, or before a checkpoint, a stop or
    // the last step's validation: no step waits for the host's part unless the next stats step comes
    // before it is done.
    int unlogged = -1;  // the stats step whose statistics are yet to be logged
    auto log_stats = [&] {
        if (unlogged < 0) return;
        prof.stats_finished(r, wait_stats(r));
        if (r.writes()) runlog_telemetry(log, unlogged, stats, r.c);
        unlogged = -1;
    };
    for (int step = start_step; step < o.steps; step++) {
        bool last = step == o.steps - 1;
        bool stats_step = o.stats_every > 0 && (step % o.stats_every == 0 || last);
        double t0 = now_seconds();
        prof.begin_step(m, step > start_step, stats_step, t0);
        float loss = forward_backward(m, r, &data_position, stats_step ? &stats : nullptr, prof, log_stats);
        model_grad_sync(m);  // the gradients summed over the processes, each its own shard
        float norm = model_grad_norm(m);
        opt.lr = lr_at_step(step, o.steps, o.warmup, o.lr, o.lr * o.lr_floor);
        if (!std::isfinite(loss) || !std::isfinite(norm)) {
            log_stats();
            stop_diverged(r, log, step, loss, opt.lr, norm);
        }
        model_adamw_step(m, opt, step + 1, norm, o.clip);
        model_param_sync(m);  // every process's updated shard to every process
        model_wait(m);        // the step's time includes the update (adamw_beside: beside the next forward pass)
        prof.end_phase(m, Profile::OPTIMIZER);
        double dt = now_seconds() - t0;
        prof.end_step(m, dt);
        step_seconds_avg = step == start_step ? dt : 0.9 * step_seconds_avg + 0.1 * dt;
        float tok_s = (float)(o.total_batch / dt);
        if (r.writes()) {
            runlog_step(log, step, loss, opt.lr, norm, tok_s, (float)(dt * 1e3));
        }
        if (stats_step) unlogged = step;
        if (last) log_stats();  // before the last validation loss, which tells a reader the run has ended
        printf("step %*d/%d | loss %.4f | norm %.3f | lr %.2e | %.0f ms | %.0f tok/s | eta %s\n", width, step + 1, o.steps,
               loss, norm, opt.lr, dt * 1e3, tok_s, format_duration(step_seconds_avg * (o.steps - step - 1)).c_str());
        fflush(stdout);
        if (r.have_val && ((o.val_every && (step + 1) % o.val_every == 0) || last)) {
            last_val = evaluate(m, r, o.val_batches);
            if (r.writes()) runlog_val(log, step, last_val);
            printf("val loss %.4f\n", last_val);
        }
        checkpoint_after(m, r, log, step, data_position, log_stats);
    }
    return finish(m, r, log, prof, strprintf("done in %s; final val loss %.4f", format_duration(now_seconds() - run_start).c_str(),
                                             last_val));
}

// --measure N: the weights of -e measured on N batches of the data (-d tokens each, split over the
// processes as a training step's), with the statistics of every batch: forward passes only, no
// update, no validation, no checkpoint. Batch b is logged as step b - 1 (steps count from 0, as a
// training run's do), with learning rate 0 and no gradient norm (NaN); its loss and statistics
// are those that step b - 1 of a training run from the same weights (-e) would log if that run
// had not changed them: on the first batch, bit for bit the ones its step 0 logs. A signal ends it
// at once; the log keeps every batch measured before.
template <typename Model>
static int measure(Model& m, Run& r) {
    const Options& o = r.o;
    start_model(m, r);
    int first_step = 0;
    long long data_position = 0;  // micro-batches consumed, by every process together
    load_weights(m, r, &first_step, &data_position);
    RunLog log = open_output(r);
    Telemetry stats;
    Profile prof;
    prof.on = o.profile;
    prof.kernels = o.profile == 2;
    double start = now_seconds(), batch_seconds_avg = 0, loss_sum = 0;
    int width = (int)std::to_string(o.measure).size();
    for (int step = 0; step < o.measure; step++) {
        double t0 = now_seconds();
        prof.begin_step(m, step > 0, true, t0);
        float loss = forward_backward(m, r, &data_position, &stats, prof, [] {});  // the last batch's waited for below
        model_wait(m);
        prof.stats_finished(r, wait_stats(r));
        double dt = now_seconds() - t0;
        prof.end_step(m, dt);
        batch_seconds_avg = step == 0 ? dt : 0.9 * batch_seconds_avg + 0.1 * dt;
        loss_sum += loss;
        float tok_s = (float)(o.total_batch / dt);
        if (r.writes()) {
            runlog_step(log, step, loss, 0.0f, NAN, tok_s, (float)(dt * 1e3));
            runlog_telemetry(log, step, stats, r.c);
        }
        printf("batch %*d/%d | loss %.4f | %.0f ms | %.0f tok/s | eta %s\n", width, step + 1, o.measure, loss, dt * 1e3,
               tok_s, format_duration(batch_seconds_avg * (o.measure - step - 1)).c_str());
        fflush(stdout);
    }
    return finish(m, r, log, prof, strprintf("measured in %s; mean loss %.4f over %d batches",
                                             format_duration(now_seconds() - start).c_str(), loss_sum / o.measure, o.measure));
}

#ifndef TESTING
int main(int argc, char** argv) {
    signal(SIGXFSZ, SIG_IGN);  // past a file-size limit (ulimit -f) a write fails with EFBIG, and says so
    Run r;
    r.dist = dist_init(&argc, &argv);
    if (!r.writes() && !freopen("/dev/null", "w", stdout)) fail("cannot silence this process's output (%s)", strerror(errno));
    r.argv.assign(argv, argv + argc);
    r.o = parse_options(argc, argv, r.given);
    int threads = default_threads(r.dist);
    r.threads = r.o.threads ? r.o.threads : threads;
    omp_set_num_threads(r.threads);
    openblas_set_num_threads(r.threads);
    choose_device(r);
    prepare_data_and_config(r);
    int status;
#ifdef __CUDACC__
    if (r.on_gpu) {
        GpuModel g;
        status = r.measuring() ? measure(g, r) : train(g, r);
    } else
#endif
    {
        CpuModel m;
        status = r.measuring() ? measure(m, r) : train(m, r);
    }
    dist_finalize(r.dist);
    return status;
}
#endif  // TESTING
