// The model's configuration (docs/model.md), its named presets, and the
// parameter layout: where every tensor lives in the one flat parameter buffer. The same layout is
// used by the CPU backend, the CUDA backend, the checkpoint file and the PyTorch reference.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "math.h"
#include "rand.h"
#include "utils.h"

// The --qk-norm variants: how the queries and keys of each head are normalised before RoPE. One
// line each: the variant (QK_NORM_<NAME>; its place in the table is the number checkpoints and
// logs hold), its name (--qk-norm, the log's options), whether it normalises, whether its gains
// q_gain and k_gain train (else they stay in the parameter layout, held at 1, never trained), a
// few words for -h, and what it is (docs/model.md).
#define QK_NORM_TABLE(X)                                                                                       \
    X(GAIN, gain, true, true, "RMSNorm with learnable gains",                                                 \
      "RMSNorm with a learnable gain per component: the default, the model of the research reports")           \
    X(PLAIN, plain, true, false, "RMSNorm, no gains", "RMSNorm without a gain: every key has length sqrt(D)") \
    X(NONE, none, false, false, "no norm", "not normalised: the classic GPT")

enum QkNorm {
#define QK_NORM_ENUM(NAME, name, normalises, trains_gains, brief, meaning) QK_NORM_##NAME,
    QK_NORM_TABLE(QK_NORM_ENUM)
#undef QK_NORM_ENUM
    QK_NORM_NUM
};

struct QkNormInfo {
    bool normalises, trains_gains;
    const char* brief;
    const char* meaning;
};

static constexpr QkNormInfo kQkNorms[QK_NORM_NUM] = {
#define QK_NORM_INFO(NAME, name, normalises, trains_gains, brief, meaning) {normalises, trains_gains, brief, meaning},
    QK_NORM_TABLE(QK_NORM_INFO)
#undef QK_NORM_INFO
};

static const char* const kQkNormNames[QK_NORM_NUM] = {
#define QK_NORM_NAME(NAME, name, normalises, trains_gains, brief, meaning) #name,
    QK_NORM_TABLE(QK_NORM_NAME)
#undef QK_NORM_NAME
};

// Of a valid variant: whether it normalises the queries and keys, and whether its gains train.
inline bool qk_norm_normalises(int v) { return kQkNorms[v].normalises; }
inline bool qk_norm_trains_gains(int v) { return kQkNorms[v].trains_gains; }

// The variant named `name`, or -1.
inline int qk_norm_index(const std::string& name) {
    for (int v = 0; v < QK_NORM_NUM; v++)
        if (name == kQkNormNames[v]) return v;
    return -1;
}

// A list in words: "gain, plain or none"; numbered, "0 (gain), 1 (plain) or 2 (none)".
inline std::string names_in_words(const char* const* names, int n, bool numbered = false) {
    std::string text;
    for (int i = 0; i < n; i++) {
        text += i == 0 ? "" : i == n - 1 ? " or " : ", ";
        text += numbered ? strprintf("%d (%s)", i, names[i]) : std::string(names[i]);
    }
    return text;
}

// `text` with every whole-word occurrence of `word` (not part of a longer name of letters, digits,
// '_' or '-') replaced by `by`: "n_head 3" -> "--n-head 3", not touching "n_head_x".
inline std::string replace_whole_word(std::string text, const std::string& word, const std::string& by) {
    auto word_char = [](char ch) { return isalnum((unsigned char)ch) || ch == '_' || ch == '-'; };
    for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
        bool whole = (at == 0 || !word_char(text[at - 1])) && (at + word.size() == text.size() || !word_char(text[at + word.size()]));
        if (!whole) continue;
        text.replace(at, word.size(), by);
        at += by.size() - 1;
    }
    return text;
}

struct ModelConfig {
    int vocab_size = 8192;  // V
    int n_layer = 6;        // L
    int n_head = 4;         // H, query heads
    int n_kv_head = 2;      // Hkv, key/value heads; H % Hkv == 0 (GQA when Hkv < H)
    int head_dim = 64;      // D
    int d_model = 256;      // C, the residual stream's width (the presets: H * D)
    int d_ff = 768;         // F, SwiGLU hidden width
    int max_seq_len = 256;  // longest sequence the model is trained for
    float rope_theta = 10000.0f;
    float norm_eps = 1e-5f;
    int qk_norm = QK_NORM_GAIN;
    int tied_embeddings = 1;  // 1: wte is also the output projection; 0: lm_head is
    // Llama 3 RoPE frequency scaling (math.h's rope_inv_freq); rope_factor 0: none.
    float rope_factor = 0.0f;
    float rope_low_freq_factor = 0.0f;
    float rope_high_freq_factor = 0.0f;
    int rope_original_max_pos = 0;

    int attn_dim() const { return n_head * head_dim; }  // width of the attention: H * D, may differ from C
    int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim; }  // rows of [Wq; Wk; Wv]
    int group_size() const { return n_head / n_kv_head; }  // query heads per key/value head
};

// A field of struct S by name: an int or a float one (exactly one of the two is set).
template <typename S>
struct NamedField {
    const char* name;
    int S::*int_field;
    float S::*float_field;
};

// Every ModelConfig field by name: the header lists them and a resumed run compares them.
using ConfigField = NamedField<ModelConfig>;

static const ConfigField kConfigFields[] = {
    {"vocab_size", &ModelConfig::vocab_size, nullptr}, {"n_layer", &ModelConfig::n_layer, nullptr},
    {"n_head", &ModelConfig::n_head, nullptr},         {"n_kv_head", &ModelConfig::n_kv_head, nullptr},
    {"head_dim", &ModelConfig::head_dim, nullptr},     {"d_model", &ModelConfig::d_model, nullptr},
    {"d_ff", &ModelConfig::d_ff, nullptr},             {"max_seq_len", &ModelConfig::max_seq_len, nullptr},
    {"rope_theta", nullptr, &ModelConfig::rope_theta}, {"norm_eps", nullptr, &ModelConfig::norm_eps},
    {"qk_norm", &ModelConfig::qk_norm, nullptr},  // QK_NORM_TABLE's place of the variant
    {"tied_embeddings", &ModelConfig::tied_embeddings, nullptr},
    {"rope_factor", nullptr, &ModelConfig::rope_factor},
    {"rope_low_freq_factor", nullptr, &ModelConfig::rope_low_freq_factor},
    {"rope_high_freq_factor", nullptr, &ModelConfig::rope_high_freq_factor},
    {"rope_original_max_pos", &ModelConfig::rope_original_max_pos, nullptr},
};
static_assert(sizeof(ModelConfig) == 11 * sizeof(int) + 5 * sizeof(float),
              "ModelConfig has changed: list every one of its fields in kConfigFields");

// Whether c has field f at its default value, the one a file written before the field existed
// means: qk_norm and the fields after it came later; the first fields have no such default.
inline bool config_field_is_default(const ModelConfig& c, const ConfigField& f) {
    static const ModelConfig defaults;
    for (const ConfigField& g : kConfigFields) {  // the fields before qk_norm were always written
        if (g.int_field == &ModelConfig::qk_norm) break;
        if (&g == &f) return false;
    }
    return f.int_field ? c.*f.int_field == defaults.*f.int_field : c.*f.float_field == defaults.*f.float_field;
}

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

// The Llama 3 RoPE scaling fields: all zero (no scaling), or a factor of at least 1, frequency
// factors 0 < low < high and an original context of at least 1 position.
inline std::string rope_scaling_error(const ModelConfig& c) {
    if (c.rope_factor == 0.0f) {
        if (c.rope_low_freq_factor != 0.0f || c.rope_high_freq_factor != 0.0f || c.rope_original_max_pos != 0)
            return "rope_low_freq_factor, rope_high_freq_factor and rope_original_max_pos must be 0 when rope_factor is 0 (no scaling)";
        return "";
    }
    if (!(c.rope_factor >= 1.0f) || !std::isfinite(c.rope_factor))
        return "rope_factor must be 0 (no scaling) or a finite number of at least 1";
    if (!(c.rope_low_freq_factor > 0.0f) || !(c.rope_high_freq_factor > c.rope_low_freq_factor) ||
        !std::isfinite(c.rope_high_freq_factor))
        return "rope_low_freq_factor and rope_high_freq_factor must be finite with 0 < low < high";
    if (c.rope_original_max_pos < 1 || c.rope_original_max_pos > kMaxConfigSize)
        return strprintf("rope_original_max_pos %d must be between 1 and %d", c.rope_original_max_pos, kMaxConfigSize);
    return "";
}

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
    if ((long long)(c.n_head + 2LL * c.n_kv_head) * c.head_dim > kMaxConfigSize)
        return strprintf("(n_head + 2 n_kv_head) * head_dim is above the limit of %d", kMaxConfigSize);
    if (c.d_model < 1) return strprintf("d_model %d must be at least 1", c.d_model);
    if (c.d_ff < 1) return strprintf("d_ff %d must be at least 1", c.d_ff);
    if (c.max_seq_len < 1) return strprintf("max_seq_len %d must be at least 1", c.max_seq_len);
    if (!(c.rope_theta > 1.0f) || !std::isfinite(c.rope_theta)) return "rope_theta must be a finite number greater than 1";
    if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps)) return "norm_eps must be a finite positive number";
    if (c.qk_norm < 0 || c.qk_norm >= QK_NORM_NUM)
        return strprintf("qk_norm %d is not %s", c.qk_norm, names_in_words(kQkNormNames, QK_NORM_NUM, true).c_str());
    if (c.tied_embeddings != 0 && c.tied_embeddings != 1) return strprintf("tied_embeddings %d is not 0 or 1", c.tied_embeddings);
    return rope_scaling_error(c);
}

// The cos and sin of RoPE's angles at positions 0..T-1, [T][D/2] each (math.h's rope_inv_freq,
// with the configuration's scaling): the tables both backends turn the pairs by.
inline void rope_tables(const ModelConfig& c, int T, float* cos_table, float* sin_table) {
    int half = c.head_dim / 2;
    std::vector<double> inv_freq(half);
    for (int i = 0; i < half; i++)
        inv_freq[i] = rope_inv_freq(i, c.head_dim, c.rope_theta, c.rope_factor, c.rope_low_freq_factor,
                                    c.rope_high_freq_factor, c.rope_original_max_pos);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = rope_angle(t, inv_freq[i]);
            cos_table[(size_t)t * half + i] = (float)cos(a);
            sin_table[(size_t)t * half + i] = (float)sin(a);
        }
}

// ---------------------------------------------------------------------------------------------
// Parameter layout. One flat float buffer holds every parameter (the checkpoint stores them in the
// same order): the kinds of the table before the per-layer ones, then one block per layer of the
// per-layer kinds in table order, then the kinds after them:
//   wte | attn_norm wq wk wv q_gain k_gain wo mlp_norm w1 w3 w2 (layer 0) | ... (layer L-1) | final_norm | lm_head
// Within a layer wq, wk, wv follow each other, so together they are one [(H+2Hkv)*D, C] matrix
// and the three projections are one matrix product; w1 and w3 likewise form one [2F, C] matrix.
//
// The parameter kinds in layout order, one line each: the kind (P_<NAME>), its name (checkpoint
// tensors, --freeze, the PyTorch reference), the shape of one tensor in the model's letters (V
// vocabulary, C d_model, H and Hkv query and key/value heads, D head width, F SwiGLU width), its
// role, one per layer (LAYER), one in all (ONCE) or one when the embeddings are untied (UNTIED, else
// none), and what it is. Roles: MATRIX, initialised
// N(0, 0.02) and decayed; RESIDUAL, a matrix whose product adds to the residual stream (one of 2L
// branches), initialised with that standard deviation divided by sqrt(2L); GAIN, initialised to 1,
// not decayed. A bit mask over the kinds (bit k: kind k) says which are frozen.
#define PARAM_TABLE(X)                                                                                  \
    X(WTE, wte, (V, C), MATRIX, ONCE, "token embedding, also the output projection when tied")       \
    X(ATTN_NORM, attn_norm, (C), GAIN, LAYER, "gain of the RMSNorm before attention")                \
    X(WQ, wq, (H * D, C), MATRIX, LAYER, "query projection")                                         \
    X(WK, wk, (Hkv * D, C), MATRIX, LAYER, "key projection")                                         \
    X(WV, wv, (Hkv * D, C), MATRIX, LAYER, "value projection")                                       \
    X(Q_GAIN, q_gain, (D), GAIN, LAYER, "gain of the query norm, shared by the layer's query heads") \
    X(K_GAIN, k_gain, (D), GAIN, LAYER, "gain of the key norm, shared by the layer's key heads")     \
    X(WO, wo, (C, H * D), RESIDUAL, LAYER, "attention output projection")                            \
    X(MLP_NORM, mlp_norm, (C), GAIN, LAYER, "gain of the RMSNorm before the MLP")                    \
    X(W1, w1, (F, C), MATRIX, LAYER, "SwiGLU gate projection")                                       \
    X(W3, w3, (F, C), MATRIX, LAYER, "SwiGLU up projection")                                         \
    X(W2, w2, (C, F), RESIDUAL, LAYER, "SwiGLU down projection")                                     \
    X(FINAL_NORM, final_norm, (C), GAIN, ONCE, "gain of the final RMSNorm")                          \
    X(LM_HEAD, lm_head, (V, C), MATRIX, UNTIED, "output projection of untied embeddings")

enum ParamKind {
#define PARAM_ENUM(NAME, name, shape, role, count, meaning) P_##NAME,
    PARAM_TABLE(PARAM_ENUM)
#undef PARAM_ENUM
    P_NUM_KINDS
};

enum ParamRole { PARAM_MATRIX, PARAM_RESIDUAL, PARAM_GAIN };
enum ParamCount { PARAM_ONCE, PARAM_LAYER, PARAM_UNTIED };

struct ParamInfo {
    ParamRole role;
    ParamCount count;
    const char* meaning;
};

static constexpr ParamInfo kParams[P_NUM_KINDS] = {
#define PARAM_INFO(NAME, name, shape, role, count, meaning) {PARAM_##role, PARAM_##count, meaning},
    PARAM_TABLE(PARAM_INFO)
#undef PARAM_INFO
};

static const char* const kParamNames[P_NUM_KINDS] = {
#define PARAM_NAME(NAME, name, shape, role, count, meaning) #name,
    PARAM_TABLE(PARAM_NAME)
#undef PARAM_NAME
};

constexpr bool param_is_per_layer(int kind) { return kParams[kind].count == PARAM_LAYER; }
// Matrices take weight decay; gains do not.
constexpr bool param_is_matrix(int kind) { return kParams[kind].role != PARAM_GAIN; }

// The per-layer kinds [kFirstLayerKind, kEndLayerKinds) are one run of the table: a layer's block.
constexpr int first_per_layer_kind() {
    int k = 0;
    while (k < P_NUM_KINDS && !param_is_per_layer(k)) k++;
    return k;
}
static constexpr int kFirstLayerKind = first_per_layer_kind();
constexpr int end_of_per_layer_kinds() {
    int k = kFirstLayerKind;
    while (k < P_NUM_KINDS && param_is_per_layer(k)) k++;
    return k;
}
static constexpr int kEndLayerKinds = end_of_per_layer_kinds();
constexpr bool per_layer_kinds_in_one_run() {
    for (int k = kEndLayerKinds; k < P_NUM_KINDS; k++)
        if (param_is_per_layer(k)) return false;
    return true;
}
static_assert(per_layer_kinds_in_one_run(), "PARAM_TABLE: the per-layer kinds must follow each other");
static_assert(P_WK == P_WQ + 1 && P_WV == P_WK + 1 && P_W3 == P_W1 + 1,
              "PARAM_TABLE: wq, wk, wv and w1, w3 follow each other (each group is one matrix product)");
static_assert(P_NUM_KINDS <= 32, "the frozen kinds are a 32-bit mask");

// The product of a shape's sizes: shape_numel(N, C) = N * C.
template <typename... Sizes>
constexpr size_t shape_numel(Sizes... sizes) {
    return (size_t(1) * ... * (size_t)sizes);
}

// Tensors of this kind in the model: n_layer for a per-layer kind, none for an UNTIED kind of a
// model with tied embeddings, else 1.
inline int param_layers(const ModelConfig& c, int kind) {
    if (param_is_per_layer(kind)) return c.n_layer;
    return kParams[kind].count == PARAM_UNTIED && c.tied_embeddings ? 0 : 1;
}

// The kind whose tensor turns the final norm's output into logits: wte when the embeddings are tied.
inline int output_projection(const ModelConfig& c) { return c.tied_embeddings ? P_WTE : P_LM_HEAD; }

// Tensors in the model, of every kind.
inline int num_param_tensors(const ModelConfig& c) {
    int n = 0;
    for (int k = 0; k < P_NUM_KINDS; k++) n += param_layers(c, k);
    return n;
}

// Number of floats in one tensor of this kind (one layer's worth for per-layer kinds; the size a
// tensor would have for a kind the configuration has none of).
inline size_t param_numel(const ModelConfig& c, int kind) {
    [[maybe_unused]] size_t V = c.vocab_size, C = c.d_model, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, F = c.d_ff;
    switch (kind) {
#define PARAM_NUMEL(NAME, name, shape, role, count, meaning) \
    case P_##NAME: return shape_numel shape;
        PARAM_TABLE(PARAM_NUMEL)
#undef PARAM_NUMEL
    }
    return 0;
}

// Floats in one layer's block.
inline size_t layer_numel(const ModelConfig& c) {
    size_t n = 0;
    for (int k = kFirstLayerKind; k < kEndLayerKinds; k++) n += param_numel(c, k);
    return n;
}

inline size_t num_parameters(const ModelConfig& c) {
    size_t n = 0;
    for (int k = 0; k < P_NUM_KINDS; k++) n += param_numel(c, k) * (size_t)param_layers(c, k);
    return n;
}

// The tensor's name as the PyTorch reference spells it: "wte", "layers.3.wk", "final_norm".
inline std::string param_name(int kind, int l = 0) {
    return (param_is_per_layer(kind) ? "layers." + std::to_string(l) + "." : std::string()) + kParamNames[kind];
}

// Offset (in floats) of the tensor of this kind, of layer l for per-layer kinds.
inline size_t param_offset(const ModelConfig& c, int kind, int l = 0) {
    size_t off = 0;
    if (!param_is_per_layer(kind)) {  // after every tensor of the kinds before it
        for (int k = 0; k < kind; k++) off += param_numel(c, k) * (size_t)param_layers(c, k);
        return off;
    }
    for (int k = 0; k < kFirstLayerKind; k++) off += param_numel(c, k);
    off += (size_t)l * layer_numel(c);
    for (int k = kFirstLayerKind; k < kind; k++) off += param_numel(c, k);
    return off;
}

// Frozen parameters: a bit mask over ParamKind (bit k: every tensor of kind k). They keep their
// values: no update, no weight decay, no part in the gradient norm.
constexpr uint32_t param_kind_bit(int kind) { return 1u << kind; }
static const uint32_t kAllParamKinds = (1u << P_NUM_KINDS) - 1;

// The kinds of which the model has no tensor (lm_head when the embeddings are tied), as a mask.
inline uint32_t absent_kinds(const ModelConfig& c) {
    uint32_t mask = 0;
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (param_layers(c, kind) == 0) mask |= param_kind_bit(kind);
    return mask;
}

// The kinds frozen in a run: those asked for, and the gains a --qk-norm variant without gains
// holds at 1.
inline uint32_t frozen_kinds(const ModelConfig& c, uint32_t asked) {
    return asked | (qk_norm_trains_gains(c.qk_norm) ? 0u : param_kind_bit(P_Q_GAIN) | param_kind_bit(P_K_GAIN));
}

// The kinds of a role: the matrices (what model.md decays by default) or the gains, as a mask.
inline uint32_t matrix_kinds() {
    uint32_t mask = 0;
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (param_is_matrix(kind)) mask |= param_kind_bit(kind);
    return mask;
}
inline uint32_t gain_kinds() { return kAllParamKinds & ~matrix_kinds(); }

// A contiguous run of parameters that either all take weight decay or none do.
struct ParamSegment {
    long long start, count;
    int decay;
};

// What AdamW updates: the parameter layout without the frozen kinds, as the fewest segments
// (consecutive tensors with the same weight decay flag merged); the kinds in `decayed` take weight
// decay (--decay; by default the matrices).
inline std::vector<ParamSegment> adamw_segments(const ModelConfig& c, uint32_t frozen, uint32_t decayed = matrix_kinds()) {
    std::vector<ParamSegment> segs, merged;
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        if (frozen & param_kind_bit(kind)) continue;
        int decay = decayed & param_kind_bit(kind) ? 1 : 0;
        for (int l = 0; l < param_layers(c, kind); l++)
            segs.push_back({(long long)param_offset(c, kind, l), (long long)param_numel(c, kind), decay});
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

// The segments cut to the parameters [begin, end).
inline std::vector<ParamSegment> segments_within(const std::vector<ParamSegment>& segs, long long begin, long long end) {
    std::vector<ParamSegment> cut;
    for (const ParamSegment& g : segs) {
        long long lo = std::max(g.start, begin), hi = std::min(g.start + g.count, end);
        if (lo < hi) cut.push_back({lo, hi - lo, g.decay});
    }
    return cut;
}

// The segments cut to a shard: what this process's AdamW updates.
inline std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segs, const ParamShard& s) {
    return segments_within(segs, (long long)s.begin, (long long)s.end);
}

// The parameter layout in the parts a forward pass reads one after another: the tensors before
// the layers (the embedding), each layer's block, the tensors after them (the final norm, an untied
// output projection). Part p is [bounds[p], bounds[p + 1]): n_layer + 2 parts, from 0 to P.
inline std::vector<long long> forward_read_bounds(const ModelConfig& c) {
    std::vector<long long> bounds{0};
    for (int l = 0; l <= c.n_layer; l++)
        bounds.push_back((long long)(param_offset(c, kFirstLayerKind, 0) + (size_t)l * layer_numel(c)));
    bounds.push_back((long long)num_parameters(c));
    return bounds;
}

// A comma-separated list of words as a mask: each word's mask from `word_mask` (0 when it names
// nothing; an empty list: no kind). Returns false, with *unknown set to the word, at one that does not.
template <typename WordMask>
inline bool parse_kind_words(const std::string& names, uint32_t* mask, std::string* unknown, WordMask word_mask) {
    *mask = 0;
    if (names.empty()) return true;
    for (size_t start = 0, end; start <= names.size(); start = end + 1) {
        end = names.find(',', start);
        if (end == std::string::npos) end = names.size();
        std::string word = names.substr(start, end - start);
        uint32_t bits = word.empty() ? 0 : word_mask(word);
        if (!bits) {
            *unknown = word.empty() ? "an empty name" : word;
            return false;
        }
        *mask |= bits;
    }
    return true;
}

// The mask of the parameter kind with this name, or 0.
inline uint32_t param_kind_mask(const std::string& word) {
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        if (word == kParamNames[kind]) return param_kind_bit(kind);
    return 0;
}

// "k_gain,q_gain" as a mask (an empty string: no kind). Returns false, with *unknown set to the
// word, when a word is not a parameter kind.
inline bool parse_param_kinds(const std::string& names, uint32_t* mask, std::string* unknown) {
    return parse_kind_words(names, mask, unknown, param_kind_mask);
}

// --decay's value as a mask: comma-separated kinds and the groups "matrices", "gains" and "all",
// their union; "none" for no kind. Returns false, with *unknown set to the word, at one that is neither.
inline bool parse_decay_kinds(const std::string& names, uint32_t* mask, std::string* unknown) {
    *mask = 0;
    if (names == "none") return true;
    if (names.empty()) {
        *unknown = "an empty name";
        return false;
    }
    return parse_kind_words(names, mask, unknown, [](const std::string& word) {
        return word == "matrices" ? matrix_kinds() : word == "gains" ? gain_kinds() : word == "all" ? kAllParamKinds
                                                                                                   : param_kind_mask(word);
    });
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
    if (qk_norm_trains_gains(c.qk_norm)) return;
    for (int l = 0; l < c.n_layer; l++)
        for (int kind : {P_Q_GAIN, P_K_GAIN})
            for (size_t i = 0; i < param_numel(c, kind); i++) params[param_offset(c, kind, l) + i] = 1.0f;
}

// Initialisation of model.md, by the roles of PARAM_TABLE: matrices ~ N(0, 0.02), the residual
// branches' output projections with the standard deviation divided by sqrt(2L), every gain 1.
// Deterministic for a seed on every platform.
inline void init_parameters(const ModelConfig& c, float* params, uint64_t seed) {
    Rng rng{seed};
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        float std = kParams[kind].role == PARAM_RESIDUAL ? 0.02f / sqrtf(2.0f * c.n_layer) : 0.02f;
        for (int l = 0; l < param_layers(c, kind); l++) {
            float* p = params + param_offset(c, kind, l);
            size_t n = param_numel(c, kind);
            for (size_t i = 0; i < n; i++) p[i] = param_is_matrix(kind) ? std * rng_normal(rng) : 1.0f;
        }
    }
}
