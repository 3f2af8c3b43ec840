// The command-line options of ./train. One table drives parsing, -h and the list of options
// recorded in the run log; resolve_config turns the model options (or a checkpoint) into the
// model configuration.
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include "checkpoint.h"
#include "config.h"
#include "hf_checkpoint.h"
#include "memory.h"
#include "utils.h"

struct Options {
    std::string train_pattern, val_pattern, tokenizer, out_dir, init_ckpt, resume_ckpt;
    std::string preset = "d6", device = "auto", data_dir = "data/brown", qk_norm = "gain", freeze, decay = "matrices";
    int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0, d_model = 0, d_ff = 0, max_seq_len = 0, vocab_size = 0;
    int tied_embeddings = 1;
    float rope_theta = 10000.0f, norm_eps = 1e-5f;
    int batch = 4, seq_len = 0, total_batch = 0, steps = 800, warmup = 40;
    float lr = 3e-3f, lr_floor = 0.1f, weight_decay = 0.1f, clip = 1.0f, beta1 = 0.9f, beta2 = 0.95f;
    int val_every = 100, val_batches = 16, ckpt_every = 0, keep = 0, stats_every = 10, shuffle = 1;
    int samples = 3, sample_tokens = 48, threads = 0, profile = 0, allow_changes = 0;
    int eot = -1;  // the end-of-text token; -1: the tokenizer's BOS, none without a tokenizer
    int measure = 0;
    std::string measure_data = "train";
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
static constexpr OptSpec kOptions[] = {
    // data
    OPT("-i", "--train", OPT_STR, train_pattern, "training shards, a glob (default: the Brown corpus, prepared on first use)"),
    OPT("-j", "--val", OPT_STR, val_pattern, "validation shards, a glob (default: the Brown corpus' validation split)"),
    OPT("-k", "--tokenizer", OPT_STR, tokenizer, "SentencePiece model for the vocabulary size and sampled text (default: tokenizer.model beside the training shards)"),
    OPT("", "--data-dir", OPT_STR, data_dir, "where the default corpus is prepared and cached (relative: to the directory of ./train)"),
    OPT("", "--shuffle", OPT_INT, shuffle, "1: visit shards and windows in a seeded random order each epoch; 0: in order"),
    OPT("", "--eot", OPT_INT, eot, "end-of-text token, the one between documents (the token after it starts one: attn_doc_start; -1: the tokenizer's BOS, which prepare_data puts before every document; none without a tokenizer)"),
    // model
    OPT("-m", "--preset", OPT_STR, preset, "model preset: d6 (default, minutes on a CPU), d12, d22 (the reports' model)"),
    OPT("", "--n-layer", OPT_INT, n_layer, "transformer blocks (overrides the preset)"),
    OPT("", "--n-head", OPT_INT, n_head, "query heads (d_model = n_head * head_dim unless --d-model)"),
    OPT("", "--n-kv-head", OPT_INT, n_kv_head, "key/value heads; must divide n_head (GQA when fewer)"),
    OPT("", "--head-dim", OPT_INT, head_dim, "width of a head (presets: 64; on a GPU the tensor-core attention takes 64, other widths a simpler, slower kernel)"),
    OPT("", "--d-model", OPT_INT, d_model, "width of the residual stream, when not n_head * head_dim"),
    OPT("", "--d-ff", OPT_INT, d_ff, "SwiGLU hidden width"),
    OPT("", "--max-seq-len", OPT_INT, max_seq_len, "longest sequence the model is built for"),
    OPT("", "--vocab-size", OPT_INT, vocab_size, "vocabulary size (default: the tokenizer's; required for shards without one)"),
    OPT("", "--rope-theta", OPT_FLOAT, rope_theta, "RoPE base"),
    OPT("", "--norm-eps", OPT_FLOAT, norm_eps, "epsilon inside every RMSNorm"),
    OPT("", "--tied-embeddings", OPT_INT, tied_embeddings, "1: wte is also the output projection; 0: an lm_head of its own"),
    OPT("", "--qk-norm", OPT_STR, qk_norm, "how each query and key head is normalised before RoPE:"),  // and the variants
    OPT("", "--freeze", OPT_STR, freeze, "parameter kinds kept at their initial or loaded values, comma-separated (e.g. k_gain or q_gain,k_gain)"),
    OPT("-e", "--init", OPT_STR, init_ckpt, "start from the weights of this checkpoint, or of a Hugging Face model directory (config.json, safetensors: Qwen3 or Llama); optimiser state fresh"),
    OPT("-r", "--resume", OPT_STR, resume_ckpt, "resume this checkpoint's run: weights, AdamW state, step, data position, log"),
    OPT("", "--allow-changes", OPT_INT, allow_changes, "1: let -r go on with training options or data other than the checkpoint's run had; the log records them. Those options:"),  // kScheduleOptions
    // optimisation
    OPT("-b", "--batch", OPT_INT, batch, "micro-batch size, in sequences"),
    OPT("-t", "--seq-len", OPT_INT, seq_len, "sequence length (default: max_seq_len)"),
    OPT("-d", "--total-batch", OPT_INT, total_batch, "tokens per optimiser step, a multiple of batch * seq_len (gradient accumulation; default: one micro-batch per process)"),
    OPT("-x", "--steps", OPT_INT, steps, "optimiser steps"),
    OPT("-l", "--lr", OPT_FLOAT, lr, "peak learning rate"),
    OPT("-u", "--warmup", OPT_INT, warmup, "linear warm-up steps, then cosine decay"),
    OPT("-q", "--lr-floor", OPT_FLOAT, lr_floor, "final learning rate as a fraction of the peak"),
    OPT("-c", "--weight-decay", OPT_FLOAT, weight_decay, "AdamW weight decay, on the kinds --decay names"),
    OPT("", "--decay", OPT_STR, decay, "parameter kinds that take weight decay, comma-separated: kinds and matrices, gains, all; or none (all: as torch.optim.AdamW(model.parameters()))"),
    OPT("", "--clip", OPT_FLOAT, clip, "clip the global gradient norm to this (0: off)"),
    OPT("", "--beta1", OPT_FLOAT, beta1, "AdamW beta1"),
    OPT("", "--beta2", OPT_FLOAT, beta2, "AdamW beta2"),
    OPT("", "--seed", OPT_LONG, seed, "seed of the initial weights, the data order and the samples"),
    // evaluation, telemetry, output
    OPT("-v", "--val-every", OPT_INT, val_every, "evaluate the validation loss every N steps (0: only at the end)"),
    OPT("", "--val-batches", OPT_INT, val_batches, "micro-batches per validation (the same ones each time)"),
    OPT("-s", "--stats-every", OPT_INT, stats_every, "measure the key/attention statistics every N steps (0: never)"),
    OPT("", "--measure", OPT_INT, measure, "measure the checkpoint of -e instead of training: N batches of -d tokens, forward passes only, the statistics on every batch (0: train)"),
    OPT("", "--measure-data", OPT_STR, measure_data, "the data --measure reads: train (the -i shards, in the training order) or val (the -j shards, in order)"),
    OPT("-o", "--out", OPT_STR, out_dir, "output directory for the log and checkpoints (default: runs/<date>-<time>)"),
    OPT("-n", "--ckpt-every", OPT_INT, ckpt_every, "also write a checkpoint every N steps (0: only the final one)"),
    OPT("", "--keep", OPT_INT, keep, "keep only the N latest (by step) of the checkpoints -n writes; checkpoints of later steps, of a longer earlier run, stay (0: all)"),
    OPT("-g", "--sample-tokens", OPT_INT, sample_tokens, "tokens per sampled line printed at the end (0: none)"),
    OPT("", "--samples", OPT_INT, samples, "lines of text sampled at the end"),
    OPT("", "--device", OPT_STR, device, "auto (GPU when there is one), cpu or cuda"),
    OPT("", "--threads", OPT_INT, threads, "CPU threads (default: all)"),
    OPT("", "--profile", OPT_INT, profile, "1: time the phases of each step (forward, backward, optimiser) and print the means at the end; 2: also the device's time per kind of work (the GPU's kernels, from CUDA events)"),
};
#undef OPT

// The training options a resumed run compares with its checkpoint's run, by long name, with their
// field of checkpoint.h's TrainingSchedule (which the checkpoint records): another value needs
// --allow-changes 1. Besides these, the schedule holds --freeze's and --decay's kinds and the CPU
// threads of all processes.
using ScheduleOption = NamedField<TrainingSchedule>;
static const ScheduleOption kScheduleOptions[] = {
    {"--lr", nullptr, &TrainingSchedule::lr},         {"--lr-floor", nullptr, &TrainingSchedule::lr_floor},
    {"--weight-decay", nullptr, &TrainingSchedule::weight_decay}, {"--clip", nullptr, &TrainingSchedule::clip},
    {"--beta1", nullptr, &TrainingSchedule::beta1},   {"--beta2", nullptr, &TrainingSchedule::beta2},
    {"--warmup", &TrainingSchedule::warmup, nullptr}, {"--steps", &TrainingSchedule::steps, nullptr},
};

// How messages name an option: "-s (--stats-every)", or "--clip" for one without a short name.
inline std::string option_label(const OptSpec& s) {
    return s.short_name[0] ? strprintf("%s (%s)", s.short_name, s.long_name) : std::string(s.long_name);
}

constexpr bool same_text(const char* a, const char* b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

// The place in kOptions of the option with this long name ("--stats-every"), or -1.
constexpr int option_index(const char* long_name) {
    for (int i = 0; i < (int)(sizeof kOptions / sizeof kOptions[0]); i++)
        if (same_text(kOptions[i].long_name, long_name)) return i;
    return -1;
}

template <int I>
inline const char* option_label_of() {
    static_assert(I >= 0, "OPTION_LABEL: no option of kOptions has this long name");
    static const std::string label = option_label(kOptions[I]);
    return label.c_str();
}

// The label of the option with this long name, as a C string: OPTION_LABEL("--stats-every") is
// "-s (--stats-every)". A long name that kOptions lacks does not compile.
#define OPTION_LABEL(long_name) option_label_of<option_index(long_name)>()

template <int I>
constexpr const char* option_name_of() {
    static_assert(I >= 0, "OPTION_NAME: no option of kOptions has this long name");
    return kOptions[I].short_name[0] ? kOptions[I].short_name : kOptions[I].long_name;
}

// How a hint names the option with this long name: its short name, or the long one when it has
// none. OPTION_NAME("--out") is "-o", OPTION_NAME("--clip") "--clip".
#define OPTION_NAME(long_name) option_name_of<option_index(long_name)>()

// The same for a long name known only at run time (an entry of a table); fails on one kOptions lacks.
inline std::string option_label(const char* long_name) {
    int i = option_index(long_name);
    if (i < 0) fail("internal: no option %s", long_name);
    return option_label(kOptions[i]);
}

inline std::string option_name(const char* long_name) {
    int i = option_index(long_name);
    if (i < 0) fail("internal: no option %s", long_name);
    return kOptions[i].short_name[0] ? kOptions[i].short_name : kOptions[i].long_name;
}

// The option's value in `o`, of an option of type OPT_INT or OPT_FLOAT.
inline double option_number(const Options& o, const char* long_name) {
    int i = option_index(long_name);
    const char* p = (const char*)&o + (i < 0 ? 0 : kOptions[i].offset);
    if (i < 0 || (kOptions[i].type != OPT_INT && kOptions[i].type != OPT_FLOAT)) fail("internal: %s is no number", long_name);
    return kOptions[i].type == OPT_INT ? *(const int*)p : *(const float*)p;
}

// The training schedule these options give, with the CPU threads of all processes (0 on the GPU),
// the frozen kinds and the decayed ones.
inline TrainingSchedule training_schedule(const Options& o, int32_t cpu_threads, uint32_t frozen, uint32_t decayed) {
    TrainingSchedule t;
    for (const ScheduleOption& s : kScheduleOptions)
        if (s.float_field) t.*s.float_field = (float)option_number(o, s.name);
        else t.*s.int_field = (int32_t)option_number(o, s.name);
    t.cpu_threads = cpu_threads;
    t.frozen = frozen;
    t.decayed = decayed;
    return t;
}

inline std::string option_value_text(const Options& o, const OptSpec& s) {
    const char* p = (const char*)&o + s.offset;
    switch (s.type) {
        case OPT_INT: return std::to_string(*(const int*)p);
        case OPT_LONG: return std::to_string(*(const long long*)p);
        case OPT_FLOAT: return strprintf("%g", *(const float*)p);
        case OPT_STR: return *(const std::string*)p;
    }
    return "";
}

inline void print_help() {
    printf("usage: ./train [options]\n\n"
           "Trains a GPT (RMSNorm, QK-norm, RoPE, GQA, SwiGLU, tied embeddings) and logs, per layer and\n"
           "head, the statistics of its attention keys and attention patterns. With no options it trains\n"
           "the d6 preset on the Brown corpus, preparing the corpus the first time.\n\noptions:\n");
    const Options defaults;
    for (const OptSpec& o : kOptions) {
        char names[48];
        snprintf(names, sizeof names, "%s%s%s", o.short_name, o.short_name[0] ? ", " : "    ", o.long_name);
        std::string value = option_value_text(defaults, o);
        std::string help = o.help;
        if (same_text(o.long_name, "--qk-norm"))  // the variants, from their table
            for (int v = 0; v < QK_NORM_NUM; v++)
                help += strprintf(" %s (%s)%s", kQkNormNames[v], kQkNorms[v].brief, v + 1 < QK_NORM_NUM ? "," : "");
        if (same_text(o.long_name, "--allow-changes")) {  // the options of the schedule, and the data's
            for (const ScheduleOption& s : kScheduleOptions) help += " " + option_name(s.name);
            help += " " + option_name("--freeze") + " " + option_name("--decay") + ", CPU threads; data: " +
                    option_name("--train") + " " + option_name("--val");
        }
        printf("  %-22s %s%s\n", names, help.c_str(), value.empty() ? "" : (" [" + value + "]").c_str());
    }
    printf("  -h, --help             this text\n");
}

// The options only training uses, besides the schedule's (kScheduleOptions): a measurement
// (--measure) refuses them rather than ignore them.
static const char* const kTrainingOnlyOptions[] = {"--resume", "--allow-changes", "--freeze", "--decay", "--stats-every",
                                                   "--val-every", "--val-batches", "--ckpt-every", "--keep"};

// --measure N measures the checkpoint of -e, and trains nothing: an option of training is refused.
inline void check_measure_options(const Options& o, const std::set<std::string>& given) {
    auto refuse = [&](const char* option) {
        if (given.count(option))
            fail("option %s: %s measures a checkpoint and trains nothing; leave it out", option_label(option).c_str(),
                 OPTION_LABEL("--measure"));
    };
    for (const ScheduleOption& s : kScheduleOptions) refuse(s.name);
    for (const char* option : kTrainingOnlyOptions) refuse(option);
    if (o.init_ckpt.empty()) fail("option %s: needs the checkpoint to measure (%s CKPT)", OPTION_LABEL("--measure"), OPTION_NAME("--init"));
}

// Fills `given` with the long names of the options on the command line.
inline Options parse_options(int argc, char** argv, std::set<std::string>& given) {
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
    need(o.batch >= 1, OPTION_LABEL("--batch"), "must be at least 1");
    need(o.seq_len >= 0, OPTION_LABEL("--seq-len"), "must not be negative (0: max_seq_len)");
    need(o.total_batch >= 0, OPTION_LABEL("--total-batch"), "must not be negative (0: one micro-batch per process)");
    need(o.steps >= 1, OPTION_LABEL("--steps"), "must be at least 1");
    need(o.warmup >= 0, OPTION_LABEL("--warmup"), "must not be negative");
    need(o.lr > 0, OPTION_LABEL("--lr"), "must be positive");
    need(o.lr_floor >= 0 && o.lr_floor <= 1, OPTION_LABEL("--lr-floor"), "must be between 0 and 1");
    need(o.weight_decay >= 0, OPTION_LABEL("--weight-decay"), "must not be negative");
    need(o.clip >= 0, OPTION_LABEL("--clip"), "must not be negative (0 turns clipping off)");
    need(o.beta1 >= 0 && o.beta1 < 1, OPTION_LABEL("--beta1"), "must be in [0, 1)");
    need(o.beta2 >= 0 && o.beta2 < 1, OPTION_LABEL("--beta2"), "must be in [0, 1)");
    need(o.val_every >= 0, OPTION_LABEL("--val-every"), "must not be negative");
    need(o.val_batches >= 1, OPTION_LABEL("--val-batches"), "must be at least 1");
    need(o.stats_every >= 0, OPTION_LABEL("--stats-every"), "must not be negative (0 turns statistics off)");
    need(o.ckpt_every >= 0, OPTION_LABEL("--ckpt-every"), "must not be negative");
    need(o.keep >= 0, OPTION_LABEL("--keep"), "must not be negative (0 keeps every checkpoint)");
    need(o.samples >= 0 && o.samples <= 64, OPTION_LABEL("--samples"), "must be between 0 and 64");
    need(o.sample_tokens >= 0, OPTION_LABEL("--sample-tokens"), "must not be negative");
    need(o.threads >= 0, OPTION_LABEL("--threads"), "must not be negative");
    need(o.shuffle == 0 || o.shuffle == 1, OPTION_LABEL("--shuffle"), "must be 0 or 1");
    need(o.eot >= -1, OPTION_LABEL("--eot"), "must be a token id, or -1 (the tokenizer's BOS)");
    need(o.profile >= 0 && o.profile <= 2, OPTION_LABEL("--profile"), "must be 0, 1 or 2");
    need(o.tied_embeddings == 0 || o.tied_embeddings == 1, OPTION_LABEL("--tied-embeddings"), "must be 0 or 1");
    need(o.allow_changes == 0 || o.allow_changes == 1, OPTION_LABEL("--allow-changes"), "must be 0 or 1");
    need(o.device == "auto" || o.device == "cpu" || o.device == "cuda", OPTION_LABEL("--device"), "must be auto, cpu or cuda");
    need(o.measure >= 0, OPTION_LABEL("--measure"), "must not be negative (0: train)");
    need(o.measure_data == "train" || o.measure_data == "val", OPTION_LABEL("--measure-data"), "must be train or val");
    if (o.measure) check_measure_options(o, given);
    else need(!given.count("--measure-data"), OPTION_LABEL("--measure-data"), ("goes with " + std::string(OPTION_LABEL("--measure"))).c_str());
    need(o.init_ckpt.empty() || o.resume_ckpt.empty(), OPTION_LABEL("--init"),
         ("cannot be combined with " + std::string(OPTION_LABEL("--resume"))).c_str());
    need(qk_norm_index(o.qk_norm) >= 0, OPTION_LABEL("--qk-norm"), ("must be " + names_in_words(kQkNormNames, QK_NORM_NUM)).c_str());
    uint32_t kinds_mask;
    std::string unknown, kinds;
    for (const char* name : kParamNames) kinds += (kinds.empty() ? "" : ", ") + std::string(name);
    auto quoted = [&] { return unknown == "an empty name" ? unknown : "'" + unknown + "'"; };
    if (!parse_param_kinds(o.freeze, &kinds_mask, &unknown))
        fail("option %s: %s is not a parameter kind (%s)", OPTION_LABEL("--freeze"), quoted().c_str(), kinds.c_str());
    if (!parse_decay_kinds(o.decay, &kinds_mask, &unknown))
        fail("option %s: %s is not a parameter kind or a group (matrices, gains, all; or none alone; kinds: %s)",
             OPTION_LABEL("--decay"), quoted().c_str(), kinds.c_str());
    return o;
}

// The model options that set an int field of ModelConfig: their long name, their field in Options
// and in ModelConfig.
struct ModelOption {
    const char* option;
    int Options::*value;
    int ModelConfig::*field;
};

static const ModelOption kModelOptions[] = {
    {"--n-layer", &Options::n_layer, &ModelConfig::n_layer},       {"--n-head", &Options::n_head, &ModelConfig::n_head},
    {"--n-kv-head", &Options::n_kv_head, &ModelConfig::n_kv_head}, {"--head-dim", &Options::head_dim, &ModelConfig::head_dim},
    {"--d-model", &Options::d_model, &ModelConfig::d_model},       {"--d-ff", &Options::d_ff, &ModelConfig::d_ff},
    {"--max-seq-len", &Options::max_seq_len, &ModelConfig::max_seq_len}, {"--vocab-size", &Options::vocab_size, &ModelConfig::vocab_size}};

// A message about the configuration in the words of the options the user typed: "n_head 2 is not
// a multiple of n_kv_head 3" reads "--n-head 2 is not a multiple of --n-kv-head 3". A field of
// kConfigFields is set by the option of the same name with dashes ("--n-head"), where there is one.
inline std::string in_option_names(std::string text) {
    for (const ConfigField& f : kConfigFields) {
        std::string option = "--" + std::string(f.name);
        std::replace(option.begin(), option.end(), '_', '-');
        if (option_index(option.c_str()) >= 0) text = replace_whole_word(text, f.name, option_label(option.c_str()));
    }
    return text;
}

// The presets' names: "d6, d12, d22".
inline std::string preset_names() {
    std::string names;
    for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
    return names;
}

// The model configuration: from the checkpoint, or the Hugging Face directory of -e, when there is
// one (explicit model options must then agree with it), else from the preset and the explicit options.
inline ModelConfig resolve_config(const Options& o, const std::set<std::string>& given, int tokenizer_vocab,
                                  const std::string& ckpt) {
    ModelConfig c;
    if (!o.resume_ckpt.empty() && is_directory(o.resume_ckpt))
        fail("option %s: %s is a directory; a run resumes from a checkpoint file of ./train (%s starts from a Hugging Face "
             "model directory)", OPTION_LABEL("--resume"), o.resume_ckpt.c_str(), OPTION_NAME("--init"));
    for (std::string hf_file : {".safetensors", ".safetensors.index.json", "config.json"})
        if (ckpt.size() >= hf_file.size() && ckpt.compare(ckpt.size() - hf_file.size(), hf_file.size(), hf_file) == 0)
            fail("option %s: %s is a file of a Hugging Face checkpoint; give the directory that holds it to %s",
                 o.resume_ckpt.empty() ? OPTION_LABEL("--init") : OPTION_LABEL("--resume"), ckpt.c_str(), OPTION_NAME("--init"));
    if (!ckpt.empty()) {
        c = is_directory(ckpt) ? hf_open(ckpt).config : checkpoint_read_header(ckpt).config;
        for (const ModelOption& m : kModelOptions)
            if (o.*m.value && o.*m.value != c.*m.field)
                fail("option %s %d does not match the checkpoint %s, which has %d", option_label(m.option).c_str(), o.*m.value,
                     ckpt.c_str(), c.*m.field);
        if (tokenizer_vocab && tokenizer_vocab != c.vocab_size)
            fail("%s: checkpoint vocabulary %d does not match the tokenizer's %d", ckpt.c_str(), c.vocab_size, tokenizer_vocab);
        if (given.count("--preset"))
            fail("option %s: the model comes from the checkpoint %s; leave the preset out", OPTION_LABEL("--preset"), ckpt.c_str());
        if ((given.count("--rope-theta") && o.rope_theta != c.rope_theta) || (given.count("--norm-eps") && o.norm_eps != c.norm_eps))
            fail("option %s does not match the checkpoint %s (rope_theta %g, norm_eps %g)",
                 given.count("--rope-theta") ? OPTION_LABEL("--rope-theta") : OPTION_LABEL("--norm-eps"), ckpt.c_str(),
                 c.rope_theta, c.norm_eps);
        if (given.count("--qk-norm") && qk_norm_index(o.qk_norm) != c.qk_norm)
            fail("option %s %s does not match the checkpoint %s, which has %s", OPTION_LABEL("--qk-norm"), o.qk_norm.c_str(),
                 ckpt.c_str(), kQkNormNames[c.qk_norm]);
        if (given.count("--tied-embeddings") && o.tied_embeddings != c.tied_embeddings)
            fail("option %s %d does not match the checkpoint %s, which has %d", OPTION_LABEL("--tied-embeddings"),
                 o.tied_embeddings, ckpt.c_str(), c.tied_embeddings);
        return c;
    }
    const Preset* p = find_preset(o.preset.c_str());
    if (!p) fail("option %s: unknown preset '%s' (%s)", OPTION_LABEL("--preset"), o.preset.c_str(), preset_names().c_str());
    apply_preset(c, *p);
    c.vocab_size = tokenizer_vocab;
    for (const ModelOption& m : kModelOptions)
        if (o.*m.value < 0 || (o.*m.value == 0 && given.count(m.option)))
            fail("option %s must be at least 1", option_label(m.option).c_str());
        else if (o.*m.value)
            c.*m.field = o.*m.value;
    if (!o.d_model) c.d_model = c.n_head * c.head_dim;
    c.rope_theta = o.rope_theta;
    c.norm_eps = o.norm_eps;
    c.qk_norm = qk_norm_index(o.qk_norm);
    c.tied_embeddings = o.tied_embeddings;
    if (tokenizer_vocab && o.vocab_size && o.vocab_size != tokenizer_vocab)
        fail("option %s %d does not match the tokenizer's %d", OPTION_LABEL("--vocab-size"), o.vocab_size, tokenizer_vocab);
    if (!c.vocab_size)
        fail("option %s: needed when the shards have no tokenizer (%s)", OPTION_LABEL("--vocab-size"), OPTION_NAME("--tokenizer"));
    std::string err = config_error(c);
    if (!err.empty()) fail("model options: %s", in_option_names(err).c_str());
    return c;
}

// What to change when the weights do not fit: the model option whose return to the preset's value
// shrinks the model most (or the preset itself), as "model option --n-layer 100000"; "the model of
// X" when it comes from a checkpoint or a Hugging Face directory X.
inline std::string model_size_culprit(const Options& o, const std::set<std::string>& given, const ModelConfig& c) {
    std::string ckpt = o.resume_ckpt.empty() ? o.init_ckpt : o.resume_ckpt;
    if (!ckpt.empty()) return "the model of " + ckpt;
    std::string culprit = OPTION_LABEL("--preset") + (" " + o.preset);
    const Preset* p = find_preset(o.preset.c_str());
    if (!p) return "model option " + culprit;
    ModelConfig preset = c;
    apply_preset(preset, *p);
    size_t smallest = num_parameters(c);
    for (const ModelOption& f : kModelOptions) {  // (--max-seq-len never shrinks it)
        if (!given.count(f.option)) continue;
        ModelConfig smaller = c;
        smaller.*f.field = preset.*f.field;
        if (!o.d_model || f.field == &ModelConfig::d_model) smaller.d_model = smaller.n_head * smaller.head_dim;
        if (num_parameters(smaller) < smallest) {
            smallest = num_parameters(smaller);
            culprit = strprintf("%s %d", option_label(f.option).c_str(), c.*f.field);
        }
    }
    return "model option " + culprit;
}

// What MemoryNeed's weights count: a measurement (--measure) holds the weights alone.
inline const char* model_memory_parts(const Options& o) {
    return o.measure ? "weights" : "weights, gradients and AdamW state";
}

// Stops, before anything is allocated, when the need is more than `limit` allows, naming the
// option to change: when the weights alone do not fit, the model option or model (model_size_culprit);
// else -b and -t.
inline void check_memory(const Options& o, const std::set<std::string>& given, const ModelConfig& c,
                         const MemoryNeed& need, const MemoryLimit& limit) {
    if (need.total <= limit.bytes) return;
    if (need.weights > limit.bytes)
        fail("%s: the %s need %.1f GB; %s has %.1f GB available", model_size_culprit(o, given, c).c_str(),
             model_memory_parts(o), need.weights / 1e9, limit.where.c_str(), limit.bytes / 1e9);
    fail("options %s %d and %s: the activations need %.1f GB beside the model's %.1f GB; %s has %.1f GB available",
         OPTION_LABEL("--batch"), o.batch, OPTION_LABEL("--seq-len"), (need.total - need.weights) / 1e9, need.weights / 1e9,
         limit.where.c_str(), limit.bytes / 1e9);
}

// An allocation failed that the limits seen allowed (one this program cannot see, or memory
// taken meanwhile): names the larger part's options.
[[noreturn]] inline void fail_allocation(const Options& o, const std::set<std::string>& given, const ModelConfig& c,
                                         const MemoryNeed& need) {
    double activations = need.total - need.weights;
    std::string culprit = need.weights >= activations ? model_size_culprit(o, given, c)
                                                      : strprintf("options %s %d and %s", OPTION_LABEL("--batch"), o.batch,
                                                                  OPTION_LABEL("--seq-len"));
    fail("%s: allocating %.1f GB failed (%s %.1f GB, activations %.1f GB)", culprit.c_str(), need.total / 1e9,
         model_memory_parts(o), need.weights / 1e9, activations / 1e9);
}
