// Hugging Face checkpoint directories as ./train -e reads them: config.json, and the weights in
// model.safetensors or in the shards that model.safetensors.index.json lists. Two architectures are
// this model (docs/model.md): Qwen3ForCausalLM (RMSNorm of queries and keys with gains: --qk-norm
// gain) and LlamaForCausalLM (no norm there: --qk-norm none). Both rotate the halves of each head
// (rotate_half), as this model does, so the weights load unpermuted. Whatever else a config.json
// asks for that this model does not compute (biases, sliding windows, other RoPE scalings, experts)
// is refused with one line naming the field; so is a tensor that is missing, unknown, or of a
// shape other than the configuration implies. scripts/attnlog/export_hf.py writes the same layout.
#pragma once
#include <sys/stat.h>
#include <climits>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "checkpoint.h"
#include "config.h"
#include "json.h"
#include "safetensors.h"
#include "utils.h"

// The architectures read, and what their config.json means when it leaves a field out (the
// defaults of transformers' Qwen3Config and LlamaConfig).
struct HfArchitecture {
    const char* name;
    int qk_norm;
    int default_head_dim;  // 0: hidden_size / num_attention_heads
    int default_max_position_embeddings;
};
static const HfArchitecture kHfArchitectures[] = {
    {"Qwen3ForCausalLM", QK_NORM_GAIN, 128, 32768},
    {"LlamaForCausalLM", QK_NORM_NONE, 0, 2048},
};

// The Hugging Face module of each parameter kind; a per-layer one under model.layers.N.
static const struct {
    int kind;
    const char* module;
} kHfModules[] = {
    {P_WTE, "model.embed_tokens"},      {P_ATTN_NORM, "input_layernorm"},
    {P_WQ, "self_attn.q_proj"},         {P_WK, "self_attn.k_proj"},
    {P_WV, "self_attn.v_proj"},         {P_Q_GAIN, "self_attn.q_norm"},
    {P_K_GAIN, "self_attn.k_norm"},     {P_WO, "self_attn.o_proj"},
    {P_MLP_NORM, "post_attention_layernorm"}, {P_W1, "mlp.gate_proj"},
    {P_W3, "mlp.up_proj"},              {P_W2, "mlp.down_proj"},
    {P_FINAL_NORM, "model.norm"},       {P_LM_HEAD, "lm_head"},
};
static_assert(sizeof kHfModules / sizeof kHfModules[0] == P_NUM_KINDS, "kHfModules: a module for every parameter kind");

// The Hugging Face name of the tensor of this kind (of layer l): "model.layers.3.self_attn.k_proj.weight".
inline std::string hf_tensor_name(int kind, int l = 0) {
    std::string module;
    for (const auto& m : kHfModules)
        if (m.kind == kind) module = m.module;
    return (param_is_per_layer(kind) ? "model.layers." + std::to_string(l) + "." : std::string()) + module + ".weight";
}

// The shape of one tensor of this kind, [out, in] for a matrix (as torch.nn.Linear holds it).
template <typename... Sizes>
inline std::vector<uint64_t> shape_dims(Sizes... sizes) {
    return {(uint64_t)sizes...};
}
inline std::vector<uint64_t> param_shape(const ModelConfig& c, int kind) {
    [[maybe_unused]] uint64_t V = c.vocab_size, C = c.d_model, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, F = c.d_ff;
    switch (kind) {
#define PARAM_SHAPE(NAME, name, shape, role, count, meaning) \
    case P_##NAME: return shape_dims shape;
        PARAM_TABLE(PARAM_SHAPE)
#undef PARAM_SHAPE
    }
    return {};
}

// Whether a model of this configuration stores tensors of this kind in a Hugging Face checkpoint:
// every kind it has, but the q and k norms only where it normalises (Llama has none).
inline bool hf_stores(const ModelConfig& c, int kind) {
    if ((kind == P_Q_GAIN || kind == P_K_GAIN) && !qk_norm_normalises(c.qk_norm)) return false;
    return param_layers(c, kind) > 0;
}

// A parameter tensor of the layout and the safetensors tensor it comes from.
struct HfParam {
    int kind, layer;
    SafetensorsTensor tensor;
};

struct HfCheckpoint {
    std::string dir, architecture;
    std::string weights;  // model.safetensors or model.safetensors.index.json: the file the tensors are named in
    ModelConfig config;
    std::vector<HfParam> params;  // in layout order
    std::vector<SafetensorsTensor> tied_head;  // lm_head.weight of a tied model, when stored: must equal the embedding
};

// ---------------------------------------------------------------------------------------------
// config.json

// config.json's fields, each read with the file's name in every message.
struct HfConfigFields {
    const char* path;
    const JsonValue& json;

    // The field's value; nullptr when it is absent or null (transformers' default then applies).
    const JsonValue* get(const char* key) const {
        const JsonValue* v = json.get(key);
        return v && v->kind != JsonValue::NUL ? v : nullptr;
    }
    int integer(const char* key, int fallback, bool required = false) const {
        const JsonValue* v = get(key);
        if (!v && required) fail("%s: %s is missing", path, key);
        if (!v) return fallback;
        long long x = json_is_integer(v) && v->text.size() <= 12 ? strtoll(v->text.c_str(), nullptr, 10) : LLONG_MAX;
        if (x < INT_MIN || x > INT_MAX) fail("%s: %s %s is not a whole number of int range", path, key, json_text(*v).c_str());
        return (int)x;
    }
    float number(const char* key, float fallback) const {
        const JsonValue* v = get(key);
        if (!v) return fallback;
        if (v->kind != JsonValue::NUMBER) fail("%s: %s %s is not a number", path, key, json_text(*v).c_str());
        return (float)strtod(v->text.c_str(), nullptr);
    }
    bool flag(const char* key, bool fallback) const {
        const JsonValue* v = get(key);
        if (!v) return fallback;
        if (v->kind != JsonValue::BOOL) fail("%s: %s %s is not true or false", path, key, json_text(*v).c_str());
        return v->text == "true";
    }
    std::string text(const char* key, const char* fallback) const {
        const JsonValue* v = get(key);
        if (!v) return fallback;
        if (v->kind != JsonValue::STRING) fail("%s: %s %s is not a string", path, key, json_text(*v).c_str());
        return v->text;
    }
};

// The architecture config.json names (its one entry of "architectures").
inline const HfArchitecture& hf_architecture(const HfConfigFields& f) {
    const JsonValue* list = f.get("architectures");
    if (!list) fail("%s: architectures is missing", f.path);
    if (list->kind != JsonValue::ARRAY || list->items.size() != 1 || list->items[0].kind != JsonValue::STRING)
        fail("%s: architectures %s is not a list of one name", f.path, json_text(*list).c_str());
    for (const HfArchitecture& a : kHfArchitectures)
        if (list->items[0].text == a.name) return a;
    fail("%s: architectures %s: only Qwen3ForCausalLM and LlamaForCausalLM are this model", f.path, json_text(*list).c_str());
}

// The RoPE settings: rope_theta and the Llama 3 frequency scaling, from rope_scaling (transformers
// 4) or rope_parameters (transformers 5, which holds rope_theta too). "default" is no scaling.
inline void hf_rope(const HfConfigFields& f, ModelConfig& c) {
    const char* key = f.get("rope_scaling") ? "rope_scaling" : "rope_parameters";
    const JsonValue* rope = f.get(key);
    c.rope_theta = f.number("rope_theta", 10000.0f);
    if (!rope) return;
    if (rope->kind != JsonValue::OBJECT) fail("%s: %s %s is not an object", f.path, key, json_text(*rope).c_str());
    std::string label = std::string(f.path) + " (" + key + ")";
    HfConfigFields r{label.c_str(), *rope};
    if (!f.get("rope_theta")) c.rope_theta = r.number("rope_theta", c.rope_theta);
    std::string type = r.text("rope_type", r.text("type", "default").c_str());
    if (type == "default") return;
    if (type != "llama3")
        fail("%s: %s.rope_type \"%s\" is not implemented (only llama3 frequency scaling is)", f.path, key, type.c_str());
    for (const char* needed : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (!r.get(needed)) fail("%s: %s.%s is missing (llama3 scaling needs it)", f.path, key, needed);
    c.rope_factor = r.number("factor", 0);
    c.rope_low_freq_factor = r.number("low_freq_factor", 0);
    c.rope_high_freq_factor = r.number("high_freq_factor", 0);
    c.rope_original_max_pos = r.integer("original_max_position_embeddings", 0);
    if (r.number("attention_factor", 1.0f) != 1.0f) fail("%s: %s.attention_factor is not implemented", f.path, key);
}

// What a config.json may ask for that this model does not compute: each refused, its field named.
inline void hf_refuse_unimplemented(const HfConfigFields& f) {
    for (const char* bias : {"attention_bias", "mlp_bias"})
        if (f.flag(bias, false)) fail("%s: %s true: biases are not implemented", f.path, bias);
    if (f.flag("use_sliding_window", false)) fail("%s: use_sliding_window true: sliding-window attention is not implemented", f.path);
    if (const JsonValue* types = f.get("layer_types"))
        for (const JsonValue& t : types->kind == JsonValue::ARRAY ? types->items : std::vector<JsonValue>{*types})
            if (t.kind != JsonValue::STRING || t.text != "full_attention")
                fail("%s: layer_types holds %s: only full_attention is implemented", f.path, json_text(t).c_str());
    std::string act = f.text("hidden_act", "silu");
    if (act != "silu") fail("%s: hidden_act \"%s\" is not implemented (only silu)", f.path, act.c_str());
    for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"})
        if (const JsonValue* v = f.get(moe))
            if (json_text(*v) != "0") fail("%s: %s %s: mixtures of experts are not implemented", f.path, moe, json_text(*v).c_str());
    if (f.number("attention_dropout", 0) != 0) fail("%s: attention_dropout is not 0: dropout is not implemented", f.path);
    if (f.number("partial_rotary_factor", 1) != 1) fail("%s: partial_rotary_factor is not 1: RoPE turns every dimension here", f.path);
}

// This model's names of the configuration's fields in config.json's: messages of config_error
// read in the file's words.
static const char* const kHfFieldNames[][2] = {
    {"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"}, {"n_kv_head", "num_key_value_heads"},
    {"d_model", "hidden_size"}, {"d_ff", "intermediate_size"}, {"max_seq_len", "max_position_embeddings"},
    {"norm_eps", "rms_norm_eps"}, {"rope_factor", "rope_scaling.factor"},
    {"rope_low_freq_factor", "rope_scaling.low_freq_factor"}, {"rope_high_freq_factor", "rope_scaling.high_freq_factor"},
    {"rope_original_max_pos", "rope_scaling.original_max_position_embeddings"}};

// The model configuration of a config.json's text; `path` names it in messages.
inline ModelConfig hf_parse_config(const std::string& text, const char* path, std::string* architecture) {
    JsonValue json;
    if (!json_parse(text, json) || json.kind != JsonValue::OBJECT) fail("%s: not a JSON object", path);
    HfConfigFields f{path, json};
    const HfArchitecture& arch = hf_architecture(f);
    *architecture = arch.name;
    hf_refuse_unimplemented(f);
    ModelConfig c;
    c.vocab_size = f.integer("vocab_size", 0, true);
    c.d_model = f.integer("hidden_size", 0, true);
    c.d_ff = f.integer("intermediate_size", 0, true);
    c.n_layer = f.integer("num_hidden_layers", 0, true);
    c.n_head = f.integer("num_attention_heads", 0, true);
    c.n_kv_head = f.integer("num_key_value_heads", c.n_head);
    if (c.n_head < 1) fail("%s: num_attention_heads %d must be at least 1", path, c.n_head);
    c.head_dim = f.integer("head_dim", arch.default_head_dim ? arch.default_head_dim : c.d_model / c.n_head);
    c.max_seq_len = f.integer("max_position_embeddings", arch.default_max_position_embeddings);
    c.norm_eps = f.number("rms_norm_eps", 1e-6f);
    c.qk_norm = arch.qk_norm;
    c.tied_embeddings = f.flag("tie_word_embeddings", false) ? 1 : 0;
    hf_rope(f, c);
    std::string err = config_error(c);
    for (const auto& names : kHfFieldNames) err = replace_whole_word(err, names[0], names[1]);
    if (!err.empty()) fail("%s: %s", path, err.c_str());
    if (!parameter_count_fits(c)) fail("%s: more than 2^59 parameters", path);
    return c;
}

// A whole small file (a JSON file of a checkpoint directory); above `limit` bytes it is refused.
inline std::string read_text_file(const std::string& path, long long limit) {
    long long size = file_size_or_fail(path.c_str());
    if (size > limit) fail("%s: %lld bytes, more than a file of its kind holds (%lld)", path.c_str(), size, limit);
    std::string text((size_t)size, '\0');
    ScopedFile f(open_or_fail(path.c_str(), "rb"));
    read_or_fail(f, &text[0], (size_t)size, path.c_str(), "the file");
    return text;
}

// ---------------------------------------------------------------------------------------------
// The weights

// The tensors of a sharded checkpoint: model.safetensors.index.json's weight_map names the file of
// each, and each file must hold exactly the tensors it is named for.
inline std::vector<SafetensorsTensor> hf_read_shards(const std::string& dir, const std::string& index_path) {
    const char* path = index_path.c_str();
    JsonValue index;
    if (!json_parse(read_text_file(index_path, 1 << 26), index) || index.kind != JsonValue::OBJECT)
        fail("%s: not a JSON object", path);
    const JsonValue* map = index.get("weight_map");
    if (!map || map->kind != JsonValue::OBJECT) fail("%s: weight_map (tensor name -> file) is missing", path);
    std::map<std::string, std::string> file_of;
    std::vector<std::string> files;
    for (const auto& [name, file] : map->members) {
        if (file.kind != JsonValue::STRING || file.text.empty() || file.text.find('/') != std::string::npos || file.text == "." ||
            file.text == "..")
            fail("%s: weight_map places %s in %s, not a file of this directory", path, name.c_str(), json_text(file).c_str());
        if (!file_of.emplace(name, file.text).second) fail("%s: weight_map names %s twice", path, name.c_str());
        if (std::find(files.begin(), files.end(), file.text) == files.end()) files.push_back(file.text);
    }
    std::vector<SafetensorsTensor> all;
    for (const std::string& file : files) {
        size_t before = all.size();
        for (SafetensorsTensor& t : safetensors_read_header(dir + "/" + file)) {
            auto it = file_of.find(t.name);
            if (it == file_of.end() || it->second != file)
                fail("%s: holds tensor %s, which %s places %s", t.path.c_str(), t.name.c_str(), path,
                     it == file_of.end() ? "nowhere" : ("in " + it->second).c_str());
            all.push_back(std::move(t));
        }
        size_t named = 0;
        for (const auto& entry : file_of) named += entry.second == file;
        if (all.size() - before != named)
            fail("%s: weight_map places %zu tensors in %s, which holds %zu", path, named, file.c_str(), all.size() - before);
    }
    return all;
}

// Every tensor of the checkpoint assigned to its place in the parameter layout; anything missing,
// unknown or of another shape than the configuration implies is refused, naming `weights`.
inline void hf_match_tensors(HfCheckpoint& h, std::vector<SafetensorsTensor> all) {
    const ModelConfig& c = h.config;
    const char* weights = h.weights.c_str();
    std::map<std::string, SafetensorsTensor> by_name;
    for (SafetensorsTensor& t : all)
        if (!by_name.emplace(t.name, t).second) fail("%s: tensor %s is stored twice", weights, t.name.c_str());
    auto take = [&](const std::string& name, const std::vector<uint64_t>& shape) {
        auto it = by_name.find(name);
        if (it == by_name.end()) fail("%s: tensor %s is missing (a %s of config.json's sizes has it)", weights, name.c_str(),
                                      h.architecture.c_str());
        SafetensorsTensor t = it->second;
        if (t.shape != shape)
            fail("%s: tensor %s has shape %s; config.json implies %s", t.path.c_str(), name.c_str(), shape_text(t.shape).c_str(),
                 shape_text(shape).c_str());
        by_name.erase(it);
        return t;
    };
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        for (int l = 0; hf_stores(c, kind) && l < param_layers(c, kind); l++)
            h.params.push_back({kind, l, take(hf_tensor_name(kind, l), param_shape(c, kind))});
    std::string head = hf_tensor_name(P_LM_HEAD);
    if (c.tied_embeddings && by_name.count(head)) h.tied_head.push_back(take(head, param_shape(c, P_WTE)));
    if (!by_name.empty())
        fail("%s: unknown tensor %s: no part of a %s of config.json's settings", by_name.begin()->second.path.c_str(),
             by_name.begin()->first.c_str(), h.architecture.c_str());
}

inline bool is_directory(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Reads and checks a checkpoint directory's config.json and every safetensors header, before any
// weight is read or allocated.
inline HfCheckpoint hf_open(const std::string& dir) {
    HfCheckpoint h;
    h.dir = dir;
    std::string config_path = dir + "/config.json";
    if (!file_exists(config_path))
        fail("%s: a directory without config.json: not a Hugging Face checkpoint (config.json and model.safetensors)", dir.c_str());
    h.config = hf_parse_config(read_text_file(config_path, 1 << 24), config_path.c_str(), &h.architecture);
    std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
    if (file_exists(single)) {
        h.weights = single;
        hf_match_tensors(h, safetensors_read_header(single));
    } else if (file_exists(index)) {
        h.weights = index;
        hf_match_tensors(h, hf_read_shards(dir, index));
    } else {
        fail("%s: neither model.safetensors nor model.safetensors.index.json is there", dir.c_str());
    }
    return h;
}

// The weights into params (the layout of h.config, num_parameters floats); the q and k gains of a
// model without them are 1. A stored lm_head of a tied model must be the embedding, bit for bit.
inline void hf_read_params(const HfCheckpoint& h, float* params) {
    const ModelConfig& c = h.config;
    for (const HfParam& p : h.params) safetensors_read(p.tensor, params + param_offset(c, p.kind, p.layer));
    hold_unused_gains(c, params);
    const float* wte = params + param_offset(c, P_WTE);
    for (const SafetensorsTensor& t : h.tied_head)
        safetensors_read_chunks(t, [&](const float* values, uint64_t first, size_t n) {
            if (memcmp(values, wte + first, n * sizeof(float)) != 0)
                fail("%s: %s differs from model.embed_tokens.weight, but config.json ties them (tie_word_embeddings)",
                     t.path.c_str(), t.name.c_str());
        });
}

// The dtypes the weights are stored in, for messages: "BF16", "F32 and BF16".
inline std::string hf_dtypes(const HfCheckpoint& h) {
    std::set<int> seen;
    for (const HfParam& p : h.params) seen.insert(p.tensor.dtype);
    std::vector<std::string> names;
    for (int d : seen) names.push_back(kSafetensorsDtypeNames[d]);
    std::string text;
    for (size_t i = 0; i < names.size(); i++) text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    return text;
}
