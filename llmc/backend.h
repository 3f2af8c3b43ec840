// What a backend is: the contract between the training loop (train<Model> in train_gpt.cu) and
// the two models it is written over, CpuModel (model_cpu.h) and GpuModel (train_gpt.cu). No
// virtual functions: a backend is a struct that derives from ModelShape, and the free functions
// of BACKEND_CONTRACT below, overloaded on its type. The training loop calls nothing else of it;
// check_backend<Model>(), asserted after each backend, fails to compile, naming the function,
// where a backend lacks one or offers it with other arguments or another result.
//
// Both backends compute the same model in the same order (docs/model.md): the CPU's in float32,
// the GPU's in bf16 with float32 master weights, every reduction in a fixed order, so that a run
// repeats itself bit for bit on the same backend and machine.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include "config.h"
#include "distributed.h"
#include "memory.h"
#include "telemetry.h"

// What every backend's model holds, and the only fields the training loop reads. Set by
// model_shape_init, in model_init.
struct ModelShape {
    ModelConfig cfg;
    int max_B = 0, max_T = 0;    // the buffers are sized for micro-batches up to max_B x max_T
    int B = 0, T = 0;            // the shape of the last forward pass
    Dist dist;                   // this process among those of a data-parallel run
    ParamShard shard;            // its shard of the parameters (ZeRO-1): the AdamW state it keeps and updates
    TelemetrySums stats_layout;  // the layout of model_stats_sums' array
    uint32_t frozen = 0;         // the parameter kinds held fixed (config.h's frozen_kinds)
    uint32_t decayed = matrix_kinds();  // the parameter kinds that take weight decay (--decay)
    int eot_token = -1;          // the corpus' end-of-text token, for the document starts of the statistics (-1: none)
    bool trains = true;          // false: forward passes only (--measure), without gradients or AdamW state
};

inline void model_shape_init(ModelShape& m, const ModelConfig& c, int max_B, int max_T, const Dist& dist, bool trains) {
    m.cfg = c;
    m.trains = trains;
    m.max_B = max_B;
    m.max_T = max_T;
    m.dist = dist;
    m.shard = param_shard(num_parameters(c), dist.rank, dist.world);
    m.stats_layout = telemetry_sums_layout(c);
}

// The host copy of the weights and AdamW state, in the layout of config.h, shard.padded floats
// each (P of them parameters); of the AdamW state only this process's shard is kept up to date
// (the training loop gathers the rest for a checkpoint). A model that does not train has no
// AdamW state: adam_m and adam_v are null.
struct HostState {
    float *params, *adam_m, *adam_v;
};

// --profile 2: the device's time per kind of work, a label and its milliseconds summed over the
// profiled steps, from a backend that can time its work; empty from one that cannot.
using WorkTimes = std::vector<std::pair<std::string, double>>;

// One AdamW step's settings (the learning rate changes every step).
struct AdamWSettings {
    float lr, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

// The functions, one line each: the result, the call, and what it must do. In the calls, m is the
// model (cm when it is const), c a ModelConfig, dist a Dist, opt an AdamWSettings; B, T, row, step
// kinds (a mask of parameter kinds) and slot are integers, scale, norm and clip floats, stats and trains bools;
// tokens and targets are B x T token ids, out a float array. BackendCheck below gives each its type.
#define BACKEND_CONTRACT(X)                                                                                           \
    /* before anything is allocated */                                                                               \
    X(MemoryNeed, memory_need(cm, c, B, T, dist, trains),                                                           \
      "the bytes this shape needs, weights and in all (memory.h); trains: with the gradients and AdamW state")      \
    X(MemoryLimit, memory_available(cm), "what this process may still allocate where the model lives")              \
    /* life */                                                                                                       \
    X(void, model_init(m, c, B, T, dist, trains),                                                                   \
      "allocate for micro-batches up to B x T as process dist.rank, zero weights; trains: gradients, AdamW state") \
    X(void, model_free(m), "release everything model_init took")                                                    \
    /* weights */                                                                                                    \
    X(HostState, host_state(m), "the host copy of the weights and AdamW state that checkpoints read and write")      \
    X(void, model_upload(m), "make the model compute with the host copy, after it was written")                     \
    X(void, model_download(m), "bring the host copy up to date, before a checkpoint reads it")                      \
    X(void, model_freeze(m, kinds), "hold these kinds (and those the variant leaves unused) fixed from now on")     \
    X(void, model_decay(m, kinds), "weight decay on these kinds from now on (at first: the matrices)")              \
    /* a step */                                                                                                     \
    X(void, model_zero_grad(m), "set the gradients to 0, before a step's first micro-batch")                       \
    X(float, model_forward(m, tokens, targets, B, T, stats),                                                        \
      "forward pass of a B x T micro-batch: the mean loss; targets null: the logits only; stats: add the sums")      \
    X(void, model_backward(m, tokens, targets, scale),                                                               \
      "add the gradient of scale * the mean loss of the last forward pass (frozen kinds' stays 0)")                 \
    X(void, model_grad_sync(m), "sum the gradients over the processes, each into its own shard")                   \
    X(float, model_grad_norm(m), "the global L2 norm of the gradients, over every process")                        \
    X(void, model_adamw_step(m, opt, step, norm, clip),                                                             \
      "AdamW step `step` (from 1) of this process's shard, the gradients clipped to norm clip (0: not)")             \
    X(void, model_param_sync(m), "every process's updated shard to every process")                                \
    X(void, model_wait(m), "return once the work queued so far is done (timing; an update beside the next forward pass excepted)")                                 \
    X(void, model_profile_begin(m), "--profile 2: a step begins; time its work by kind from now on")                \
    X(void, model_profile_end(m, slot),                                                                              \
      "--profile 2: the step's work is done: add its times by kind into slot 0 or 1, or drop them (-1)")            \
    X(WorkTimes, model_profile_times(m, slot), "--profile 2: the times per kind of work added into a slot")          \
    /* statistics */                                                                                                 \
    X(void, model_stats_begin(m), "clear the sums before a stats step's first forward pass")                        \
    X(double*, model_stats_sums(m),                                                                                  \
      "a host copy of the sums of the forward passes since, in stats_layout, that stays until the next call")        \
    X(bool, model_stats_pending(m),                                                                                  \
      "the last forward pass's statistics still run (beside the backward pass): read the sums after it")             \
    /* sampling */                                                                                                   \
    X(void, model_logits_row(m, row, out), "row `row` of the last forward pass's logits, vocab_size floats, into out")

// Instantiated for a model, checks every function of the contract (its static members are the
// calls' arguments, never defined: the calls are never evaluated).
template <typename Model>
struct BackendCheck {
    static_assert(std::is_base_of<ModelShape, Model>::value, "a backend's model derives from ModelShape");
    static Model& m;
    static const Model& cm;
    static const ModelConfig& c;
    static const Dist& dist;
    static const AdamWSettings& opt;
    static int B, T, row, step, slot;
    static uint32_t kinds;
    static const int *tokens, *targets;
    static bool stats, trains;
    static float scale, norm, clip, *out;
#define CHECK_BACKEND_FUNCTION(result, call, what) \
    static_assert(std::is_same<decltype(call), result>::value, "a backend's " #call " returns " #result ": " what);
    BACKEND_CONTRACT(CHECK_BACKEND_FUNCTION)
#undef CHECK_BACKEND_FUNCTION
    static constexpr bool ok = true;
};

template <typename Model>
constexpr bool check_backend() {
    return BackendCheck<Model>::ok;
}
