// The model's configuration (docs/model.md), its named presets, and the
// parameter layout: where every tensor lives in the one flat parameter buffer. The same layout is
// used by the CPU backend, the CUDA backend, the checkpoint file and the PyTorch reference.
#pragma once
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "rand.h"
#include "utils.h"

// How the queries and keys of each head are normalised before RoPE (--qk-norm): RMSNorm with a
// learnable gain per component (the default, the model of the research reports), RMSNorm without
// one (the gains stay in the parameter layout, held at 1 and never trained), or not at all (the
// classic GPT; the gains are likewise unused).
enum QkNorm { QK_NORM_GAIN = 0, QK_NORM_PLAIN = 1, QK_NORM_NONE = 2, QK_NORM_NUM };
static const char* const kQkNormNames[QK_NORM_NUM] = {"gain", "plain", "none"};

struct ModelConfig {
    int vocab_size = 8192;  // V
    int n_layer = 6;        // L
    int n_head = 4;         // H, query heads
    int n_kv_head = 2;      // Hkv, key/value heads; H % Hkv == 0 (GQA when Hkv < H)
    int head_dim = 64;      // D
    int d_model = 256;      // C = H * D
    int d_ff = 768;         // F, SwiGLU hidden width
    int max_seq_len = 256;  // longest sequence the model is trained for
    float rope_theta = 10000.0f;
    float norm_eps = 1e-5f;
    int qk_norm = QK_NORM_GAIN;

    int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim; }  // rows of [Wq; Wk; Wv]
    int group_size() const { return n_head / n_kv_head; }  // query heads per key/value head
};

struct Preset {
    const char* name;
    const char* what;
    int n_layer, n_head, n_kv_head, head_dim, d_ff, max_seq_len;
};

// Every preset has head_dim = 64, so that a key right after the k norm has norm sqrt(64) = 8 at
// initialisation, the level the research reports measure against.
static const Preset kPresets[] = {
    {"d6", "default: 6 layers, C=256, GQA 4:2, trains in minutes on 2 CPU cores", 6, 4, 2, 64, 768, 256},
    {"d12", "12 layers, C=512, GQA 8:4, T=1024", 12, 8, 4, 64, 1536, 1024},
    {"d22", "the research reports' model: 22 layers, C=512, 8 heads, T=2048", 22, 8, 8, 64, 1536, 2048},
};

inline const Preset* find_preset(const char* name) {
    for (const Preset& p : kPresets)
        if (strcmp(p.name, name) == 0) return &p;
    return nullptr;
}

inline void apply_preset(ModelConfig& c, const Preset& p) {
    c.n_layer = p.n_layer;
    c.n_head = p.n_head;
    c.n_kv_head = p.n_kv_head;
    c.head_dim = p.head_dim;
    c.d_model = p.n_head * p.head_dim;
    c.d_ff = p.d_ff;
    c.max_seq_len = p.max_seq_len;
}

// The largest value any size of the configuration may take: far above any model this program
// trains, and low enough that no product of sizes the code forms in 32-bit arithmetic overflows.
static const int kMaxConfigSize = 1 << 24;

// Returns an empty string when the configuration is possible, else one sentence saying which
// field is wrong and why (the caller adds the option or file name). Arithmetic in 64 bits: the
// fields may come from a file.
inline std::string config_error(const ModelConfig& c) {
    struct { const char* name; int value; } sizes[] = {
        {"vocab_size", c.vocab_size}, {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_kv_head", c.n_kv_head},
        {"head_dim", c.head_dim}, {"d_model", c.d_model}, {"d_ff", c.d_ff}, {"max_seq_len", c.max_seq_len}};
    for (const auto& f : sizes)
        if (f.value > kMaxConfigSize) return strprintf("%s %d is above the limit of %d", f.name, f.value, kMaxConfigSize);
    if (c.vocab_size < 2) return strprintf("vocab_size %d must be at least 2", c.vocab_size);
    if (c.n_layer < 1) return strprintf("n_layer %d must be at least 1", c.n_layer);
    if (c.n_head < 1 || c.n_kv_head < 1)
        return strprintf("n_head %d and n_kv_head %d must be at least 1", c.n_head, c.n_kv_head);
    if (c.n_head % c.n_kv_head != 0)
        return strprintf("n_head %d is not a multiple of n_kv_head %d", c.n_head, c.n_kv_head);
    if (c.head_dim < 2 || c.head_dim % 2 != 0) return strprintf("head_dim %d must be even and at least 2", c.head_dim);
    long long width = (long long)c.n_head * c.head_dim;
    if (width > kMaxConfigSize)
        return strprintf("n_head %d times head_dim %d is above the limit of %d", c.n_head, c.head_dim, kMaxConfigSize);
    if (c.d_model != width) return strprintf("d_model %d must equal n_head * head_dim = %lld", c.d_model, width);
    if ((long long)(c.n_head + 2LL * c.n_kv_head) * c.head_dim > kMaxConfigSize)
        return strprintf("(n_head + 2 n_kv_head) * head_dim is above the limit of %d", kMaxConfigSize);
    if (c.d_ff < 1) return strprintf("d_ff %d must be at least 1", c.d_ff);
    if (c.max_seq_len < 1) return strprintf("max_seq_len %d must be at least 1", c.max_seq_len);
    if (!(c.rope_theta > 1.0f) || !std::isfinite(c.rope_theta)) return "rope_theta must be a finite number greater than 1";
    if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps)) return "norm_eps must be a finite positive number";
    if (c.qk_norm < 0 || c.qk_norm >= QK_NORM_NUM) return strprintf("qk_norm %d is not 0 (gain), 1 (plain) or 2 (none)", c.qk_norm);
    return "";
}

// ---------------------------------------------------------------------------------------------
// Parameter layout. One flat float buffer holds every parameter in this order (the checkpoint
// stores them in the same order):
//   wte [V, C]
//   for each layer l = 0..L-1:
//     attn_norm [C], wq [H*D, C], wk [Hkv*D, C], wv [Hkv*D, C], q_gain [D], k_gain [D],
//     wo [C, H*D], mlp_norm [C], w1 [F, C], w3 [F, C], w2 [C, F]
//   final_norm [C]
// Within a layer wq, wk, wv follow each other, so together they are one [(H+2Hkv)*D, C] matrix
// and the three projections are one matrix product; w1 and w3 likewise form one [2F, C] matrix.

enum ParamKind {
    P_WTE, P_ATTN_NORM, P_WQ, P_WK, P_WV, P_Q_GAIN, P_K_GAIN, P_WO, P_MLP_NORM, P_W1, P_W3, P_W2,
    P_FINAL_NORM, P_NUM_KINDS
};

static const char* const kParamNames[P_NUM_KINDS] = {
    "wte", "attn_norm", "wq", "wk", "wv", "q_gain", "k_gain", "wo", "mlp_norm", "w1", "w3", "w2",
    "final_norm"};

inline bool param_is_per_layer(int kind) { return kind != P_WTE && kind != P_FINAL_NORM; }
// Matrices take weight decay; gains (q_gain, k_gain and every *_norm) do not.
inline bool param_is_matrix(int kind) {
    return kind == P_WTE || kind == P_WQ || kind == P_WK || kind == P_WV || kind == P_WO ||
           kind == P_W1 || kind == P_W3 || kind == P_W2;
}

// Number of floats in one tensor of this kind (one layer's worth for per-layer kinds).
inline size_t param_numel(const ModelConfig& c, int kind) {
    size_t V = c.vocab_size, C = c.d_model, D = c.head_dim, F = c.d_ff;
    size_t q_width = (size_t)c.n_head * D, kv_width = (size_t)c.n_kv_head * D;
    switch (kind) {
        case P_WTE: return V * C;
        case P_ATTN_NORM: case P_MLP_NORM: case P_FINAL_NORM: return C;
        case P_WQ: return q_width * C;
        case P_WK: case P_WV: return kv_width * C;
        case P_Q_GAIN: case P_K_GAIN: return D;
        case P_WO: return C * q_width;
        case P_W1: case P_W3: return F * C;
        case P_W2: return C * F;
    }
    return 0;
}

inline size_t layer_numel(const ModelConfig& c) {
    size_t n = 0;
    for (int k = P_ATTN_NORM; k <= P_W2; k++) n += param_numel(c, k);
    return n;
}

inline size_t num_parameters(const ModelConfig& c) {
    return param_numel(c, P_WTE) + (size_t)c.n_layer * layer_numel(c) + param_numel(c, P_FINAL_NORM);
}

// The tensor's name as the PyTorch reference spells it: "wte", "layers.3.wk", "final_norm".
inline std::string param_name(int kind, int l = 0) {
    return (param_is_per_layer(kind) ? "layers." + std::to_string(l) + "." : std::string()) + kParamNames[kind];
}

// Offset (in floats) of the tensor of this kind, of layer l for per-layer kinds.
inline size_t param_offset(const ModelConfig& c, int kind, int l = 0) {
    size_t wte = param_numel(c, P_WTE);
    if (kind == P_WTE) return 0;
    if (kind == P_FINAL_NORM) return wte + (size_t)c.n_layer * layer_numel(c);
    size_t off = wte + (size_t)l * layer_numel(c);
    for (int k = P_ATTN_NORM; k < kind; k++) off += param_numel(c, k);
    return off;
}

// Frozen parameters: a bit mask over ParamKind (bit k: every tensor of kind k). They keep their
// values: no update, no weight decay, no part in the gradient norm.
inline uint32_t param_kind_bit(int kind) { return 1u << kind; }
static const uint32_t kAllParamKinds = (1u << P_NUM_KINDS) - 1;

// The kinds frozen in a run: those asked for, and the gains a --qk-norm variant without gains
// holds at 1.
inline uint32_t frozen_kinds(const ModelConfig& c, uint32_t asked) {
    return asked | (c.qk_norm == QK_NORM_GAIN ? 0u : param_kind_bit(P_Q_GAIN) | param_kind_bit(P_K_GAIN));
}

// A contiguous run of parameters that either all take weight decay (matrices) or none do (gains).
struct ParamSegment {
    long long start, count;
    int decay;
};

// What AdamW updates: the parameter layout without the frozen kinds, as the fewest segments
// (consecutive tensors with the same weight decay flag merged).
inline std::vector<ParamSegment> adamw_segments(const ModelConfig& c, uint32_t frozen) {
    std::vector<ParamSegment> segs, merged;
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        if (frozen & param_kind_bit(kind)) continue;
        int layers = param_is_per_layer(kind) ? c.n_layer : 1;
        for (int l = 0; l < layers; l++)
            segs.push_back({(long long)param_offset(c, kind, l), (long long)param_numel(c, kind), param_is_matrix(kind) ? 1 : 0});
    }
    std::sort(segs.begin(), segs.end(), [](const ParamSegment& a, const ParamSegment& b) { return a.start < b.start; });
    for (const ParamSegment& s : segs) {
        if (!merged.empty() && merged.back().decay == s.decay && merged.back().start + merged.back().count == s.start)
            merged.back().count += s.count;
        else
            merged.push_back(s);
    }
    return merged;
}

// Data-parallel training shards the optimiser (ZeRO-1): of `world` processes, process `rank`
// keeps the AdamW state of, and updates, the parameters [begin, end) only. Every shard has the
// same size (the last one padded past P), as reduce-scatter and all-gather want, a multiple of 64
// floats so that each starts on a 256-byte boundary: the gradient and parameter buffers hold
// world * size floats. One process has one shard, the whole model.
struct ParamShard {
    int rank = 0, world = 1;
    size_t begin = 0, end = 0;  // this process's parameters; end <= P
    size_t size = 0;            // floats per shard, ceil(P / world)
    size_t padded = 0;          // world * size
};

inline ParamShard param_shard(size_t P, int rank, int world) {
    ParamShard s;
    s.rank = rank;
    s.world = world;
    s.size = world == 1 ? P : ((P + world - 1) / world + 63) / 64 * 64;
    s.padded = s.size * world;
    s.begin = std::min(P, (size_t)rank * s.size);
    s.end = std::min(P, s.begin + s.size);
    return s;
}

// The segments cut to a shard: what this process's AdamW updates.
inline std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segs, const ParamShard& s) {
    std::vector<ParamSegment> cut;
    for (const ParamSegment& g : segs) {
        long long lo = std::max(g.start, (long long)s.begin), hi = std::min(g.start + g.count, (long long)s.end);
        if (lo < hi) cut.push_back({lo, hi - lo, g.decay});
    }
    return cut;
}

// "k_gain,q_gain" as a mask (an empty string: no kind). Returns false, with *unknown set to the
// word, when a word is not a parameter kind.
inline bool parse_param_kinds(const std::string& names, uint32_t* mask, std::string* unknown) {
    *mask = 0;
    if (names.empty()) return true;
    for (size_t start = 0, end; start <= names.size(); start = end + 1) {
        end = names.find(',', start);
        if (end == std::string::npos) end = names.size();
        std::string word = names.substr(start, end - start);
        if (word.empty()) {
            *unknown = "an empty name";
            return false;
        }
        int kind = 0;
        while (kind < P_NUM_KINDS && word != kParamNames[kind]) kind++;
        if (kind == P_NUM_KINDS) {
            *unknown = word;
            return false;
        }
        *mask |= param_kind_bit(kind);
    }
    return true;
}

// The kinds of a mask as "q_gain,k_gain" (layout order), or "nothing".
inline std::string param_kinds_text(uint32_t mask) {
    std::string text;
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (mask & param_kind_bit(kind)) text += (text.empty() ? "" : ",") + std::string(kParamNames[kind]);
    return text.empty() ? "nothing" : text;
}

// The variants without gains compute with gains of 1: their gains are set to 1 wherever weights
// come in, so that every path (both backends, the checkpoint, the reference) sees the same model.
inline void hold_unused_gains(const ModelConfig& c, float* params) {
    if (c.qk_norm == QK_NORM_GAIN) return;
    for (int l = 0; l < c.n_layer; l++)
        for (int kind : {P_Q_GAIN, P_K_GAIN})
            for (size_t i = 0; i < param_numel(c, kind); i++) params[param_offset(c, kind, l) + i] = 1.0f;
}

// Initialisation of model.md: matrices ~ N(0, 0.02), the output projections wo and w2 with the
// standard deviation divided by sqrt(2L) (each residual branch adds to the stream, 2L branches in
// all), every gain 1. Deterministic for a seed on every platform.
inline void init_parameters(const ModelConfig& c, float* params, uint64_t seed) {
    Rng rng{seed};
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        int layers = param_is_per_layer(kind) ? c.n_layer : 1;
        float std = (kind == P_WO || kind == P_W2) ? 0.02f / sqrtf(2.0f * c.n_layer) : 0.02f;
        for (int l = 0; l < layers; l++) {
            float* p = params + param_offset(c, kind, l);
            size_t n = param_numel(c, kind);
            for (size_t i = 0; i < n; i++) p[i] = param_is_matrix(kind) ? std * rng_normal(rng) : 1.0f;
        }
    }
}
