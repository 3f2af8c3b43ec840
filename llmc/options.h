// The command-line options of ./train. One table drives parsing, -h and the list of options
// recorded in the run log; resolve_config turns the model options (or a checkpoint) into the
// model configuration.
#pragma once
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
#include "memory.h"
#include "utils.h"

struct Options {
    std::string train_pattern, val_pattern, tokenizer, out_dir, init_ckpt, resume_ckpt;
    std::string preset = "d6", device = "auto", data_dir = "data/brown", qk_norm = "gain", freeze;
    int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0, d_ff = 0, max_seq_len = 0, vocab_size = 0;
    float rope_theta = 10000.0f, norm_eps = 1e-5f;
    int batch = 4, seq_len = 0, total_batch = 0, steps = 800, warmup = 40;
    float lr = 3e-3f, lr_floor = 0.1f, weight_decay = 0.1f, clip = 1.0f, beta1 = 0.9f, beta2 = 0.95f;
    int val_every = 100, val_batches = 16, ckpt_every = 0, keep = 0, stats_every = 10, shuffle = 1;
    int samples = 3, sample_tokens = 48, threads = 0, profile = 0, allow_changes = 0;
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
    OPT("", "--data-dir", OPT_STR, data_dir, "where the default corpus is prepared and cached (relative: to the directory of ./train)"),
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
    OPT("", "--qk-norm", OPT_STR, qk_norm, "how each query and key head is normalised before RoPE: gain (RMSNorm with learnable gains), plain (RMSNorm, no gains), none"),
    OPT("", "--freeze", OPT_STR, freeze, "parameter kinds kept at their initial or loaded values, comma-separated (e.g. k_gain or q_gain,k_gain)"),
    OPT("-e", "--init", OPT_STR, init_ckpt, "start from the weights of this checkpoint (optimiser state fresh)"),
    OPT("-r", "--resume", OPT_STR, resume_ckpt, "resume this checkpoint's run: weights, AdamW state, step, data position, log"),
    OPT("", "--allow-changes", OPT_INT, allow_changes, "1: let -r go on with training options (-l -u -q -x -c --clip --beta1 --beta2 --freeze, CPU threads) or data (-i -j) other than the checkpoint's run had; the log records them"),
    // optimisation
    OPT("-b", "--batch", OPT_INT, batch, "micro-batch size, in sequences"),
    OPT("-t", "--seq-len", OPT_INT, seq_len, "sequence length (default: max_seq_len)"),
    OPT("-d", "--total-batch", OPT_INT, total_batch, "tokens per optimiser step, a multiple of batch * seq_len (gradient accumulation; default: one micro-batch per process)"),
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
    OPT("", "--keep", OPT_INT, keep, "keep only the N latest (by step) of the checkpoints -n writes; checkpoints of later steps, of a longer earlier run, stay (0: all)"),
    OPT("-g", "--sample-tokens", OPT_INT, sample_tokens, "tokens per sampled line printed at the end (0: none)"),
    OPT("", "--samples", OPT_INT, samples, "lines of text sampled at the end"),
    OPT("", "--device", OPT_STR, device, "auto (GPU when there is one), cpu or cuda"),
    OPT("", "--threads", OPT_INT, threads, "CPU threads (default: all)"),
    OPT("", "--profile", OPT_INT, profile, "1: time the phases of each step (forward, backward, optimiser) and print the means at the end"),
};
#undef OPT

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
        printf("  %-22s %s%s\n", names, o.help, value.empty() ? "" : (" [" + value + "]").c_str());
    }
    printf("  -h, --help             this text\n");
}

inline std::string option_label(const OptSpec& s) {
    return s.short_name[0] ? strprintf("%s (%s)", s.short_name, s.long_name) : std::string(s.long_name);
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
    need(o.batch >= 1, "-b (--batch)", "must be at least 1");
    need(o.seq_len >= 0, "-t (--seq-len)", "must not be negative (0: max_seq_len)");
    need(o.total_batch >= 0, "-d (--total-batch)", "must not be negative (0: one micro-batch per process)");
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
    need(o.keep >= 0, "--keep", "must not be negative (0 keeps every checkpoint)");
    need(o.samples >= 0 && o.samples <= 64, "--samples", "must be between 0 and 64");
    need(o.sample_tokens >= 0, "-g (--sample-tokens)", "must not be negative");
    need(o.threads >= 0, "--threads", "must not be negative");
    need(o.shuffle == 0 || o.shuffle == 1, "--shuffle", "must be 0 or 1");
    need(o.profile == 0 || o.profile == 1, "--profile", "must be 0 or 1");
    need(o.allow_changes == 0 || o.allow_changes == 1, "--allow-changes", "must be 0 or 1");
    need(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "--device", "must be auto, cpu or cuda");
    need(o.init_ckpt.empty() || o.resume_ckpt.empty(), "-e (--init)", "cannot be combined with -r (--resume)");
    need(qk_norm_index(o.qk_norm) >= 0, "--qk-norm", ("must be " + names_in_words(kQkNormNames, QK_NORM_NUM)).c_str());
    uint32_t frozen;
    std::string unknown;
    if (!parse_param_kinds(o.freeze, &frozen, &unknown)) {
        std::string kinds;
        for (const char* name : kParamNames) kinds += (kinds.empty() ? "" : ", ") + std::string(name);
        fail("option --freeze: %s is not a parameter kind (%s)", unknown == "an empty name" ? unknown.c_str() :
             ("'" + unknown + "'").c_str(), kinds.c_str());
    }
    return o;
}

// A message about the configuration in the words of the options the user typed: "n_head 2 is not
// a multiple of n_kv_head 3" reads "--n-head 2 is not a multiple of --n-kv-head 3".
inline std::string in_option_names(std::string text) {
    static const char* const names[][2] = {
        {"vocab_size", "--vocab-size"}, {"n_layer", "--n-layer"},     {"n_head", "--n-head"},
        {"n_kv_head", "--n-kv-head"},   {"head_dim", "--head-dim"},   {"d_ff", "--d-ff"},
        {"max_seq_len", "--max-seq-len"}, {"rope_theta", "--rope-theta"}, {"norm_eps", "--norm-eps"}};
    auto word_char = [](char ch) { return isalnum((unsigned char)ch) || ch == '_' || ch == '-'; };
    for (const auto& n : names) {
        size_t len = strlen(n[0]);
        for (size_t at = text.find(n[0]); at != std::string::npos; at = text.find(n[0], at + 1)) {
            bool whole = (at == 0 || !word_char(text[at - 1])) && (at + len == text.size() || !word_char(text[at + len]));
            if (whole) text.replace(at, len, n[1]);
        }
    }
    return text;
}

// The model configuration: from the checkpoint when there is one (explicit model options must
// then agree with it), else from the preset and the explicit options.
inline ModelConfig resolve_config(const Options& o, const std::set<std::string>& given, int tokenizer_vocab,
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
        if (given.count("--qk-norm") && qk_norm_index(o.qk_norm) != c.qk_norm)
            fail("option --qk-norm %s does not match the checkpoint %s, which has %s", o.qk_norm.c_str(), ckpt.c_str(),
                 kQkNormNames[c.qk_norm]);
        return c;
    }
    const Preset* p = find_preset(o.preset.c_str());
    if (!p) fail("option -m (--preset): unknown preset '%s' (d6, d12, d22)", o.preset.c_str());
    apply_preset(c, *p);
    c.vocab_size = tokenizer_vocab;
    for (const Explicit& e : ints)
        if (e.value < 0 || (e.value == 0 && given.count(e.option))) fail("option %s must be at least 1", e.option);
        else if (e.value) c.*e.field = e.value;
    c.d_model = c.n_head * c.head_dim;
    c.rope_theta = o.rope_theta;
    c.norm_eps = o.norm_eps;
    c.qk_norm = qk_norm_index(o.qk_norm);
    if (tokenizer_vocab && o.vocab_size && o.vocab_size != tokenizer_vocab)
        fail("option --vocab-size %d does not match the tokenizer's %d", o.vocab_size, tokenizer_vocab);
    if (!c.vocab_size) fail("option --vocab-size: needed when the shards have no tokenizer (-k)");
    std::string err = config_error(c);
    if (!err.empty()) fail("model options: %s", in_option_names(err).c_str());
    return c;
}

// The model option whose return to the preset's value shrinks the model most (or the preset
// itself), as "--n-layer 100000": what to change when the weights do not fit.
inline std::string model_size_culprit(const Options& o, const std::set<std::string>& given, const ModelConfig& c) {
    std::string culprit = "-m (--preset) " + o.preset;
    const Preset* p = find_preset(o.preset.c_str());
    if (!p) return culprit;
    ModelConfig preset = c;
    apply_preset(preset, *p);
    size_t smallest = num_parameters(c);
    struct { const char* option; int ModelConfig::*field; } sizes[] = {
        {"--n-layer", &ModelConfig::n_layer}, {"--n-head", &ModelConfig::n_head}, {"--n-kv-head", &ModelConfig::n_kv_head},
        {"--head-dim", &ModelConfig::head_dim}, {"--d-ff", &ModelConfig::d_ff}, {"--vocab-size", &ModelConfig::vocab_size}};
    for (const auto& f : sizes) {
        if (!given.count(f.option)) continue;
        ModelConfig smaller = c;
        smaller.*f.field = preset.*f.field;
        smaller.d_model = smaller.n_head * smaller.head_dim;
        if (num_parameters(smaller) < smallest) {
            smallest = num_parameters(smaller);
            culprit = strprintf("%s %d", f.option, c.*f.field);
        }
    }
    return culprit;
}

// Stops, before anything is allocated, when the need is more than `limit` allows, naming the
// option to change: when the weights alone do not fit, the model option (model_size_culprit);
// else -b and -t.
inline void check_memory(const Options& o, const std::set<std::string>& given, const ModelConfig& c,
                         const MemoryNeed& need, const MemoryLimit& limit) {
    if (need.total <= limit.bytes) return;
    if (need.weights > limit.bytes)
        fail("model option %s: the weights, gradients and AdamW state need %.1f GB; %s has %.1f GB available",
             model_size_culprit(o, given, c).c_str(), need.weights / 1e9, limit.where.c_str(), limit.bytes / 1e9);
    fail("options -b (--batch) %d and -t (--seq-len): the activations need %.1f GB beside the model's %.1f GB; %s has "
         "%.1f GB available", o.batch, (need.total - need.weights) / 1e9, need.weights / 1e9, limit.where.c_str(), limit.bytes / 1e9);
}

// An allocation failed that the limits seen allowed (one this program cannot see, or memory
// taken meanwhile): names the larger part's options.
[[noreturn]] inline void fail_allocation(const Options& o, const std::set<std::string>& given, const ModelConfig& c,
                                         const MemoryNeed& need) {
    double activations = need.total - need.weights;
    std::string culprit = need.weights >= activations ? "model option " + model_size_culprit(o, given, c)
                                                      : strprintf("options -b (--batch) %d and -t (--seq-len)", o.batch);
    fail("%s: allocating %.1f GB failed (weights, gradients and AdamW state %.1f GB, activations %.1f GB)", culprit.c_str(),
         need.total / 1e9, need.weights / 1e9, activations / 1e9);
}
