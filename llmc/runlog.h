// The run log (docs/log_format.md): a crash-safe, append-only binary file that holds what a
// training run measures, read by scripts/attnlog.py. Little-endian throughout:
//
//   preamble  "ATTNLOG\0" | uint32 version | uint32 header length | uint32 CRC-32 of the header
//   header    UTF-8 JSON: the model configuration, the run's options, and the record table, which
//             names every record type and gives the name, dtype and shape of each of its fields
//   records   "\xffREC" | uint16 type | uint16 flags | uint32 payload length | int64 step |
//             payload | uint32 CRC-32 of everything from type to the end of the payload
//
// Each record is assembled in memory and handed to the kernel with one write(2) on an O_APPEND
// descriptor: a crash of the trainer loses at most the record being written, and readers know
// that torn tail by its length and checksum. The marker lets a reader find the next record after
// a damaged one.
#pragma once
#include <fcntl.h>
#include <algorithm>
#include <cinttypes>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>
#include "config.h"
#include "telemetry.h"
#include "utils.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the run log stores numbers in the host's byte order, which must be little-endian");

static const char kRunLogMagic[8] = {'A', 'T', 'T', 'N', 'L', 'O', 'G', '\0'};
static const uint8_t kRecordMarker[4] = {0xFF, 'R', 'E', 'C'};  // 0xFF never occurs in UTF-8 text
static const uint32_t kRunLogVersion = 1;
static const size_t kPreambleBytes = 20;   // magic, version, header length, header CRC
static const size_t kFrameBytes = 20;      // marker, type, flags, payload length, step
static const size_t kRecordOverhead = 24;  // the frame and the CRC after the payload

enum RecordType : uint16_t { REC_STEP = 1, REC_VAL = 2, REC_TELEMETRY = 3, REC_NOTE = 4 };

// What the header says about the run besides the record table.
struct RunInfo {
    ModelConfig config;
    std::vector<std::pair<std::string, std::string>> options;  // every option, name -> value
    uint64_t seed = 0;
    std::string backend, device;  // backend is "cpu" or "cuda"
    int num_processes = 1;        // of a data-parallel run (distributed.h)
    // Who writes: the run's id (the same in every log and checkpoint of the run) and that of this
    // continuation (each start or resume of ./train has its own); a resumed run also names the
    // continuation that wrote its checkpoint and the checkpoint's step. Zero: none (not resumed,
    // or a checkpoint that does not say).
    uint64_t run_id = 0, continuation = 0, resumed_from = 0;
    int64_t resumed_from_step = 0;
};

// An id as JSON text: 16 hexadecimal digits in a string (a JSON number would lose bits).
inline std::string json_id(uint64_t id) { return strprintf("\"%016" PRIx64 "\"", id); }

struct RunLog {
    std::string path;
    int fd = -1;                  // opened with O_APPEND: every write lands at the end
    std::vector<uint8_t> record;  // the record being assembled, reused from one record to the next
};

// Every ModelConfig field by name: the header lists them and a resumed run compares them.
struct ConfigField {
    const char* name;
    int ModelConfig::*int_field;  // exactly one of the two is set
    float ModelConfig::*float_field;
};

static const ConfigField kConfigFields[] = {
    {"vocab_size", &ModelConfig::vocab_size, nullptr}, {"n_layer", &ModelConfig::n_layer, nullptr},
    {"n_head", &ModelConfig::n_head, nullptr},         {"n_kv_head", &ModelConfig::n_kv_head, nullptr},
    {"head_dim", &ModelConfig::head_dim, nullptr},     {"d_model", &ModelConfig::d_model, nullptr},
    {"d_ff", &ModelConfig::d_ff, nullptr},             {"max_seq_len", &ModelConfig::max_seq_len, nullptr},
    {"rope_theta", nullptr, &ModelConfig::rope_theta}, {"norm_eps", nullptr, &ModelConfig::norm_eps},
    {"qk_norm", &ModelConfig::qk_norm, nullptr},  // config.h's QkNorm: 0 gain, 1 plain, 2 none
};
static_assert(sizeof(ModelConfig) == 9 * sizeof(int) + 2 * sizeof(float),
              "ModelConfig has changed: list every one of its fields in kConfigFields");

// The step record's fields, in payload order: the arguments of runlog_step.
static const char* const kStepFields[][2] = {
    {"loss", "training loss of the step: mean cross-entropy, nats per token"},
    {"lr", "learning rate the step used"},
    {"grad_norm", "global L2 norm of the gradient, before clipping"},
    {"tokens_per_s", "training throughput of the step, tokens per second"},
    {"ms", "wall-clock time of the step, milliseconds"},
};

// ---------------------------------------------------------------------------------------------
// JSON text for the header

// Replaces every byte sequence that is not valid UTF-8 with U+FFFD, so the header stays valid JSON
// and notes stay valid text whatever bytes an option or a path holds.
inline std::string utf8_sanitized(const std::string& s) {
    std::string out;
    size_t i = 0, n = s.size();
    while (i < n) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                   : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && len >= 3) {  // no overlong forms, no UTF-16 surrogates, nothing above U+10FFFF
            unsigned char c1 = s[i + 1];
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F) && !(c == 0xF0 && c1 < 0x90) &&
                 !(c == 0xF4 && c1 > 0x8F);
        }
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            i++;
        }
    }
    return out;
}

inline std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (char ch : utf8_sanitized(s)) {
        unsigned char c = ch;
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20) out += strprintf("\\u%04x", c);
        else out += ch;
    }
    return out + "\"";
}

// The shortest decimal that reads back as the same float, always with a '.' or an exponent so
// that JSON readers see a float.
inline std::string json_float(float v) {
    std::string s;
    for (int digits = 6; digits <= 9; digits++) {
        s = strprintf("%.*g", digits, v);
        if (strtof(s.c_str(), nullptr) == v) break;
    }
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
}

inline std::string config_value_text(const ModelConfig& c, const ConfigField& f) {
    return f.int_field ? std::to_string(c.*f.int_field) : json_float(c.*f.float_field);
}

inline std::string utc_timestamp() { return utc_time("%Y-%m-%dT%H:%M:%SZ"); }

// The run's options, seed, backend and device as JSON members joined by `sep`:
// written into the header, and into the note of a resumed run.
inline std::string runlog_run_members(const RunInfo& info, const char* sep) {
    std::string j = "\"options\": {";
    for (size_t i = 0; i < info.options.size(); i++)
        j += (i ? ", " : "") + json_string(info.options[i].first) + ": " + json_string(info.options[i].second);
    j += "}";
    j += sep + strprintf("\"seed\": %" PRIu64, info.seed);
    j += sep + ("\"backend\": " + json_string(info.backend));
    j += sep + ("\"device\": " + json_string(info.device));
    j += sep + strprintf("\"num_processes\": %d", info.num_processes);
    if (info.run_id) j += sep + ("\"run_id\": " + json_id(info.run_id));
    if (info.continuation) j += sep + ("\"continuation\": " + json_id(info.continuation));
    if (info.resumed_from)
        j += sep + ("\"resumed_from\": " + json_id(info.resumed_from)) + sep +
             strprintf("\"resumed_from_step\": %lld", (long long)info.resumed_from_step);
    return j;
}

inline std::string json_field(const std::string& name, const char* dtype, const std::string& shape,
                              const std::string& dims, const char* meaning) {
    return "      {\"name\": " + json_string(name) + ", \"dtype\": \"" + dtype + "\", \"shape\": " + shape +
           ", \"dims\": " + dims + ", \"meaning\": " + json_string(meaning) + "}";
}

// One entry of the record table: the type's id, its name and its fields (json_field lines).
inline std::string json_record_type(RecordType type, const char* name, const std::vector<std::string>& fields) {
    std::string j = strprintf("    {\"type\": %d, \"name\": \"%s\", \"fields\": [\n", (int)type, name);
    for (size_t i = 0; i < fields.size(); i++) j += fields[i] + (i + 1 < fields.size() ? ",\n" : "\n");
    return j + "    ]}";
}

// The record table: how to decode each record type, so that a reader needs nothing but the file.
// Fields lie in the payload one after another in the listed order, arrays row-major.
inline std::string runlog_record_table(const ModelConfig& c) {
    std::vector<std::string> step, telemetry;
    for (const auto& f : kStepFields) step.push_back(json_field(f[0], "float32", "[]", "[]", f[1]));
    for (const MetricInfo& m : kMetrics) {
        const char* col = metric_dim_name(m.shape);
        telemetry.push_back(json_field(m.name, "float32", strprintf("[%d, %d]", c.n_layer, metric_cols(c, m.shape)),
                                       strprintf("[\"layer\", \"%s\"]", col), m.meaning));
    }
    std::string val =
        json_field("val_loss", "float32", "[]", "[]", "validation loss: mean cross-entropy, nats per token");
    std::string note =
        json_field("text", "utf8", "[-1]", "[\"byte\"]", "free text, e.g. where a resumed run came from");
    return "  \"records\": [\n" + json_record_type(REC_STEP, "step", step) + ",\n" +
           json_record_type(REC_VAL, "val", {val}) + ",\n" + json_record_type(REC_TELEMETRY, "telemetry", telemetry) +
           ",\n" + json_record_type(REC_NOTE, "note", {note}) + "\n  ]\n";
}

inline std::string runlog_header_text(const RunInfo& info) {
    std::string config;
    for (const ConfigField& f : kConfigFields)
        config += (config.empty() ? "\"" : ", \"") + std::string(f.name) + "\": " + config_value_text(info.config, f);
    return "{\n  \"format\": \"attnlog\",\n" + strprintf("  \"version\": %u,\n", kRunLogVersion) +
           "  \"created\": \"" + utc_timestamp() + "\",\n  \"config\": {" + config + "},\n  " +
           runlog_run_members(info, ",\n  ") + ",\n" + runlog_record_table(info.config) + "}\n";
}

// ---------------------------------------------------------------------------------------------
// Writing

inline void runlog_put_bytes(std::vector<uint8_t>& b, const void* src, size_t n) {
    b.insert(b.end(), (const uint8_t*)src, (const uint8_t*)src + n);
}

template <typename T>
inline void runlog_put(std::vector<uint8_t>& b, T value) { runlog_put_bytes(b, &value, sizeof value); }

// write(2) writes less than asked only when the disk fills up or a signal interrupts it: the rest
// is retried, and a failure ends the program with the records before this one intact (a reader
// sees the part of this one that reached the file as a torn tail).
inline void runlog_write(RunLog& log, const uint8_t* p, size_t n) {
    while (n > 0) {
        ssize_t w = write(log.fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            fail("%s: write failed (%s); what was written before stays readable", log.path.c_str(),
                 w < 0 ? strerror(errno) : "nothing was written");
        p += w;
        n -= (size_t)w;
    }
}

// Starts a record in log.record: its frame, whose payload length runlog_commit fills in.
inline void runlog_begin(RunLog& log, RecordType type, int64_t step) {
    log.record.clear();
    runlog_put_bytes(log.record, kRecordMarker, 4);
    runlog_put(log.record, (uint16_t)type);
    runlog_put(log.record, (uint16_t)0);  // flags: reserved, zero in version 1
    runlog_put(log.record, (uint32_t)0);  // payload length
    runlog_put(log.record, step);
}

// Completes the record (payload length, CRC) and appends it to the file with a single write.
inline void runlog_commit(RunLog& log) {
    std::vector<uint8_t>& r = log.record;
    uint32_t payload_bytes = (uint32_t)(r.size() - kFrameBytes);
    memcpy(&r[8], &payload_bytes, 4);
    runlog_put(r, crc32_of(r.data() + 4, r.size() - 4));
    runlog_write(log, r.data(), r.size());
}

// Makes everything written so far survive a power loss (a crash of the process alone loses
// nothing: each record is already in the kernel's hands). For checkpoints and the end of the run.
inline void runlog_flush(RunLog& log) {
    if (fsync(log.fd) != 0) fail("%s: cannot flush to disk (%s)", log.path.c_str(), strerror(errno));
}

inline void runlog_close(RunLog& log) {
    runlog_flush(log);
    if (close(log.fd) != 0) fail("%s: cannot close (%s)", log.path.c_str(), strerror(errno));
    log.fd = -1;
}

// Creates a new log holding only the preamble and header. An existing file is never overwritten.
inline RunLog runlog_create(const std::string& path, const RunInfo& info) {
    RunLog log;
    log.path = path;
    log.fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (log.fd < 0 && errno == EEXIST)
        fail("%s: already exists; a run log is never overwritten (resume appends to it)", path.c_str());
    if (log.fd < 0) fail("%s: cannot create (%s)", path.c_str(), strerror(errno));
    std::string header = runlog_header_text(info);
    std::vector<uint8_t> start;
    runlog_put_bytes(start, kRunLogMagic, 8);
    runlog_put(start, kRunLogVersion);
    runlog_put(start, (uint32_t)header.size());
    runlog_put(start, crc32_of(header.data(), header.size()));
    runlog_put_bytes(start, header.data(), header.size());
    runlog_write(log, start.data(), start.size());
    runlog_flush(log);
    return log;
}

inline void runlog_step(RunLog& log, int64_t step, float loss, float lr, float grad_norm, float tokens_per_s,
                        float ms) {
    runlog_begin(log, REC_STEP, step);
    for (float v : {loss, lr, grad_norm, tokens_per_s, ms}) runlog_put(log.record, v);
    runlog_commit(log);
}

inline void runlog_val(RunLog& log, int64_t step, float val_loss) {
    runlog_begin(log, REC_VAL, step);
    runlog_put(log.record, val_loss);
    runlog_commit(log);
}

// Every metric of kMetrics in table order, each a row-major [n_layer][cols] float32 array.
inline void runlog_telemetry(RunLog& log, int64_t step, const Telemetry& t, const ModelConfig& c) {
    runlog_begin(log, REC_TELEMETRY, step);
    for (int m = 0; m < M_NUM_METRICS; m++) {
        size_t n = (size_t)c.n_layer * metric_cols(c, kMetrics[m].shape);
        if (t.values[m].size() != n)
            fail("%s: telemetry metric %s holds %zu values, the model has %zu", log.path.c_str(), kMetrics[m].name,
                 t.values[m].size(), n);
        runlog_put_bytes(log.record, t.values[m].data(), n * sizeof(float));
    }
    runlog_commit(log);
}

inline void runlog_note(RunLog& log, int64_t step, const std::string& text) {
    runlog_begin(log, REC_NOTE, step);
    std::string utf8 = utf8_sanitized(text);
    runlog_put_bytes(log.record, utf8.data(), utf8.size());
    runlog_commit(log);
}

// ---------------------------------------------------------------------------------------------
// Resuming: checking and repairing an existing log before appending to it

// The header read back: a strict JSON parser (RFC 8259 and nothing more, and none of what
// scripts/attnlog.py refuses besides: integers of more than 4300 digits, floats too large for a
// double, lone surrogates, nesting deeper than 64), so that the appender accepts no header the
// reader rejects.
struct JsonValue {
    enum Kind { NUL, BOOL, NUMBER, STRING, ARRAY, OBJECT };
    Kind kind = NUL;
    std::string text;                                        // a string decoded; a number as written; true, false
    std::vector<JsonValue> items;                            // an array's
    std::vector<std::pair<std::string, JsonValue>> members;  // an object's, in file order

    // The member named `key`, the last one when the name repeats (as json.loads keeps it), else nullptr.
    const JsonValue* get(const std::string& key) const {
        for (size_t i = members.size(); i-- > 0;)
            if (members[i].first == key) return &members[i].second;
        return nullptr;
    }
};

static const int kJsonMaxDepth = 64;             // the header nests 5 deep
static const size_t kJsonMaxIntegerDigits = 4300;  // Python's int() refuses longer ones

struct JsonParser {
    const std::string& s;
    size_t i = 0;
    int depth = 0;

    bool at(char c) const { return i < s.size() && s[i] == c; }
    bool digit() const { return i < s.size() && s[i] >= '0' && s[i] <= '9'; }
    void skip_space() {
        while (at(' ') || at('\t') || at('\n') || at('\r')) i++;
    }
    bool hex4(uint32_t& u) {
        if (i + 4 > s.size()) return false;
        u = 0;
        for (int k = 0; k < 4; k++) {
            char c = s[i++];
            int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (v < 0) return false;
            u = u * 16 + (uint32_t)v;
        }
        return true;
    }
    static void put_utf8(std::string& out, uint32_t u) {
        if (u < 0x80) {
            out += (char)u;
        } else if (u < 0x800) {
            out += (char)(0xC0 | u >> 6);
            out += (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            out += (char)(0xE0 | u >> 12);
            out += (char)(0x80 | (u >> 6 & 0x3F));
            out += (char)(0x80 | (u & 0x3F));
        } else {
            out += (char)(0xF0 | u >> 18);
            out += (char)(0x80 | (u >> 12 & 0x3F));
            out += (char)(0x80 | (u >> 6 & 0x3F));
            out += (char)(0x80 | (u & 0x3F));
        }
    }
    bool string(std::string& out) {  // from the opening quote to just past the closing one
        for (i++; i < s.size();) {
            unsigned char c = s[i++];
            if (c == '"') return true;
            if (c < 0x20) return false;  // control characters must be escaped
            if (c != '\\') {
                out += (char)c;
                continue;
            }
            if (i >= s.size()) return false;
            char e = s[i++];
            static const char escapes[] = "\"\\/bfnrt", meanings[] = "\"\\/\b\f\n\r\t";
            const char* plain = e ? strchr(escapes, e) : nullptr;
            if (plain) {
                out += meanings[plain - escapes];
                continue;
            }
            uint32_t u, low;
            if (e != 'u' || !hex4(u)) return false;
            if (u >= 0xD800 && u < 0xDC00) {  // the first of a surrogate pair: the second must follow
                if (s.compare(i, 2, "\\u") != 0) return false;
                i += 2;
                if (!hex4(low) || low < 0xDC00 || low >= 0xE000) return false;
                u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000) {
                return false;  // a lone surrogate is no Unicode text
            }
            put_utf8(out, u);
        }
        return false;
    }
    bool number(std::string& out) {
        size_t start = i;
        if (at('-')) i++;
        if (at('0')) i++;
        else if (digit()) while (digit()) i++;
        else return false;
        bool integer = true;
        if (at('.')) {
            i++;
            if (!digit()) return false;
            while (digit()) i++;
            integer = false;
        }
        if (at('e') || at('E')) {
            i++;
            if (at('+') || at('-')) i++;
            if (!digit()) return false;
            while (digit()) i++;
            integer = false;
        }
        out = s.substr(start, i - start);
        if (integer) return out.size() - (out[0] == '-') <= kJsonMaxIntegerDigits;
        return std::isfinite(strtod(out.c_str(), nullptr));  // 1e999 is too large for a float
    }
    bool value(JsonValue& v) {
        skip_space();
        if (i >= s.size()) return false;
        char c = s[i];
        if (c == '"') {
            v.kind = JsonValue::STRING;
            return string(v.text);
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            v.kind = JsonValue::NUMBER;
            return number(v.text);
        }
        for (const char* word : {"true", "false", "null"})
            if (s.compare(i, strlen(word), word) == 0) {
                i += strlen(word);
                v.kind = word[0] == 'n' ? JsonValue::NUL : JsonValue::BOOL;
                v.text = word;
                return true;
            }
        if (c != '[' && c != '{') return false;
        if (++depth > kJsonMaxDepth) return false;
        bool object = c == '{';
        v.kind = object ? JsonValue::OBJECT : JsonValue::ARRAY;
        i++;
        skip_space();
        if (at(object ? '}' : ']')) {
            i++;
            depth--;
            return true;
        }
        while (true) {
            JsonValue item;
            if (object) {
                skip_space();
                std::string key;
                if (!at('"') || !string(key)) return false;
                skip_space();
                if (!at(':')) return false;
                i++;
                if (!value(item)) return false;
                v.members.emplace_back(std::move(key), std::move(item));
            } else {
                if (!value(item)) return false;
                v.items.push_back(std::move(item));
            }
            skip_space();
            if (at(',')) {
                i++;
                continue;
            }
            if (!at(object ? '}' : ']')) return false;
            i++;
            depth--;
            return true;
        }
    }
};

// Parses one JSON value that is the whole of `text` (whitespace around it allowed), which must
// be valid UTF-8. Returns false on anything else.
inline bool json_parse(const std::string& text, JsonValue& out) {
    if (utf8_sanitized(text) != text) return false;
    JsonParser parser{text};
    if (!parser.value(out)) return false;
    parser.skip_space();
    return parser.i == text.size();
}

// Compact JSON text of a value, for messages.
inline std::string json_text(const JsonValue& v) {
    switch (v.kind) {
        case JsonValue::STRING: return json_string(v.text);
        case JsonValue::ARRAY: {
            std::string j = "[";
            for (size_t k = 0; k < v.items.size(); k++) j += (k ? ", " : "") + json_text(v.items[k]);
            return j + "]";
        }
        case JsonValue::OBJECT: {
            std::string j = "{";
            for (size_t k = 0; k < v.members.size(); k++)
                j += (k ? ", " : "") + json_string(v.members[k].first) + ": " + json_text(v.members[k].second);
            return j + "}";
        }
        default: return v.kind == JsonValue::NUL ? "null" : v.text;
    }
}

inline bool json_equal(const JsonValue* a, const JsonValue* b) {
    return a && b && json_text(*a) == json_text(*b);
}

// Empty when the header's model configuration `logged` (its "config" object) equals `config`,
// else a sentence naming the first field that differs.
inline std::string runlog_config_difference(const JsonValue& logged, const ModelConfig& config) {
    for (const ConfigField& f : kConfigFields) {
        const JsonValue* v = logged.get(f.name);
        if (!v && f.int_field == &ModelConfig::qk_norm && config.qk_norm == QK_NORM_GAIN) continue;  // logs before variants
        if (!v) return strprintf("the model configuration in the header has no %s", f.name);
        char* end = nullptr;
        bool same = v->kind == JsonValue::NUMBER &&
                    (f.int_field ? strtoll(v->text.c_str(), &end, 10) == config.*f.int_field
                                 : strtof(v->text.c_str(), &end) == config.*f.float_field) &&
                    *end == '\0';
        if (!same)
            return "the model configuration differs from this run's: " + std::string(f.name) + " is " + json_text(*v) +
                   " in the log, " + config_value_text(config, f) + " in this run";
    }
    return "";
}

inline bool json_is_integer(const JsonValue* v) {
    return v && v->kind == JsonValue::NUMBER && v->text.find_first_of(".eE") == std::string::npos;
}

// Empty when the members of the header besides the record table hold what docs/log_format.md
// says, as the reader checks them: created, backend and device strings, options an object of
// strings, seed an integer in [0, 2^64), num_processes a positive integer, config an object of
// numbers. Else where it is wrong.
inline std::string runlog_header_members_problem(const JsonValue& header) {
    for (const char* key : {"created", "backend", "device"}) {
        const JsonValue* v = header.get(key);
        if (v && v->kind != JsonValue::STRING) return strprintf("its %s is %s, not a string", key, json_text(*v).substr(0, 40).c_str());
    }
    const JsonValue *options = header.get("options"), *seed = header.get("seed"), *config = header.get("config");
    if (options && options->kind != JsonValue::OBJECT) return "its options are not an object";
    for (size_t k = 0; options && k < options->members.size(); k++)
        if (options->members[k].second.kind != JsonValue::STRING)
            return "its option " + json_string(options->members[k].first).substr(0, 40) + " is not a string";
    std::string digits = json_is_integer(seed) ? seed->text : "";
    if (digits == "-0") digits = "0";
    if (seed && (digits.empty() || digits[0] == '-' || digits.size() > 20 || (digits.size() == 20 && digits > "18446744073709551615")))
        return "its seed is " + json_text(*seed).substr(0, 40) + ", not an unsigned 64-bit integer";
    const JsonValue* processes = header.get("num_processes");
    if (processes && (!json_is_integer(processes) || processes->text[0] == '-' || processes->text == "0"))
        return "its num_processes is " + json_text(*processes).substr(0, 40) + ", not a positive integer";
    if (!config || config->kind != JsonValue::OBJECT) return "it holds no model configuration";
    for (const auto& member : config->members)
        if (member.second.kind != JsonValue::NUMBER)
            return "its config member " + json_string(member.first).substr(0, 40) + " is not a number";
    return "";
}

// A field of the record table in a few words: name, dtype, shape and dims.
inline std::string runlog_field_text(const JsonValue& field) {
    std::string t;
    for (const char* key : {"name", "dtype", "shape", "dims"}) {
        const JsonValue* v = field.get(key);
        t += (t.empty() ? "" : " ") + (v ? json_text(*v) : strprintf("(no %s)", key));
    }
    return t;
}

// Empty when the log's record table `logged` decodes records as `ours`, the table this program
// writes, does: the same record types (type and name) in the same order, each with the same
// fields (name, dtype, shape, dims) in the same order. Only the meanings may be worded otherwise.
// Else a sentence saying where they first differ.
inline std::string runlog_table_difference(const JsonValue* logged, const JsonValue& ours) {
    if (!logged || logged->kind != JsonValue::ARRAY) return "the header has no record table";
    if (logged->items.size() != ours.items.size())
        return strprintf("it lists %zu record types, this program writes %zu", logged->items.size(), ours.items.size());
    for (size_t t = 0; t < ours.items.size(); t++) {
        const JsonValue &a = logged->items[t], &b = ours.items[t];
        const JsonValue* name = b.get("name");
        if (!json_equal(a.get("type"), b.get("type")) || !json_equal(a.get("name"), name)) {
            auto type_text = [](const JsonValue& entry) {
                const JsonValue *n = entry.get("name"), *id = entry.get("type");
                return (n ? json_text(*n) : "(no name)") + " (type " + (id ? json_text(*id) : "none") + ")";
            };
            return strprintf("record type %zu is %s in the log, %s in this program", t + 1, type_text(a).c_str(),
                             type_text(b).c_str());
        }
        const JsonValue *fa = a.get("fields"), *fb = b.get("fields");
        if (!fa || fa->kind != JsonValue::ARRAY || fa->items.size() != fb->items.size())
            return strprintf("the %s record has %s fields in the log, %zu in this program", name->text.c_str(),
                             fa && fa->kind == JsonValue::ARRAY ? std::to_string(fa->items.size()).c_str() : "no list of",
                             fb->items.size());
        for (size_t k = 0; k < fb->items.size(); k++) {
            const JsonValue &x = fa->items[k], &y = fb->items[k];
            for (const char* key : {"name", "dtype", "shape", "dims"})
                if (!json_equal(x.get(key), y.get(key)))
                    return strprintf("field %zu of the %s record is %s in the log, %s in this program", k + 1,
                                     name->text.c_str(), runlog_field_text(x).c_str(), runlog_field_text(y).c_str());
            const JsonValue* meaning = x.get("meaning");
            if (meaning && meaning->kind != JsonValue::STRING)
                return strprintf("field %zu of the %s record has a meaning that is not text", k + 1, name->text.c_str());
        }
    }
    return "";
}

// ---------------------------------------------------------------------------------------------
// A run's continuations

// Each start or resume of ./train is a continuation of its run. A log records the one that
// created it (in its header) and each that resumed into it (in the note it begins with), in the
// order they began; a continuation that resumed from step S supersedes the records written before
// it for steps S and later, so the log's line of training is the last continuation's, back along
// the steps it resumed from.
struct Continuation {
    uint64_t id = 0, resumed_from = 0;  // resumed_from: the continuation that wrote its checkpoint
    int64_t start_step = 0;             // the step it began at (0 for a new run)
};

struct RunLineage {
    uint64_t run_id = 0;  // 0: a log written before runs had ids
    std::vector<Continuation> continuations;
};

// An id written by json_id, else 0.
inline uint64_t json_to_id(const JsonValue* v) {
    if (!v || v->kind != JsonValue::STRING || v->text.size() != 16) return 0;
    uint64_t id = 0;
    for (char ch : v->text) {
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return 0;
        id = id << 4 | (uint64_t)d;
    }
    return id;
}

// The continuation whose members (runlog_run_members) `run` holds, starting at `step`.
inline Continuation continuation_of(const JsonValue& run, int64_t step) {
    Continuation c;
    c.id = json_to_id(run.get("continuation"));
    c.resumed_from = json_to_id(run.get("resumed_from"));
    c.start_step = step;
    return c;
}

// The lineage of a log from its header and its intact notes.
inline RunLineage runlog_lineage(const JsonValue& header, const std::vector<std::pair<int64_t, std::string>>& notes) {
    RunLineage lineage;
    lineage.run_id = json_to_id(header.get("run_id"));
    if (!lineage.run_id) return lineage;
    const JsonValue* step = header.get("resumed_from_step");
    Continuation first = continuation_of(header, json_is_integer(step) ? std::max(0LL, strtoll(step->text.c_str(), nullptr, 10)) : 0);
    if (first.id) lineage.continuations.push_back(first);
    static const char kRunMembers[] = "; run: ";  // runlog_open_append's note: "resumed from step S at ...; run: {...}"
    for (const auto& note : notes) {
        size_t at = note.second.find(kRunMembers);
        JsonValue run;
        if (note.second.compare(0, 18, "resumed from step ") != 0 || at == std::string::npos ||
            !json_parse(note.second.substr(at + sizeof kRunMembers - 1), run) || run.kind != JsonValue::OBJECT ||
            json_to_id(run.get("run_id")) != lineage.run_id)
            continue;
        Continuation c = continuation_of(run, note.first);
        if (c.id) lineage.continuations.push_back(c);
    }
    return lineage;
}

// Checks the preamble and header of an existing log a resumed run will append to (`data` holds
// the file's first bytes, the header included when the file has all of it): a version 1 log whose
// header scripts/attnlog.py reads (valid JSON, format "attnlog", the preamble's version, a model
// configuration), of the same model, with the record table this program writes. Fails naming the
// first thing wrong; returns the offset of the first record.
inline size_t runlog_check_header(const std::string& path, const std::vector<uint8_t>& data, const ModelConfig& c,
                                  JsonValue* header_out = nullptr) {
    const char* p = path.c_str();
    if (!data.empty() && memcmp(data.data(), kRunLogMagic, std::min(data.size(), sizeof kRunLogMagic)) != 0)
        fail("%s: not a run log (its first bytes are not \"ATTNLOG\")", p);
    if (data.size() < kPreambleBytes) fail("%s: truncated header (the file is %zu bytes)", p, data.size());
    uint32_t version, header_bytes, header_crc;
    memcpy(&version, &data[8], 4);
    memcpy(&header_bytes, &data[12], 4);
    memcpy(&header_crc, &data[16], 4);
    if (version != kRunLogVersion)
        fail("%s: format version %u, but this program writes version %u; cannot append to it", p, version,
             kRunLogVersion);
    if (kPreambleBytes + header_bytes > data.size())
        fail("%s: truncated header (%u bytes announced, %zu present)", p, header_bytes, data.size() - kPreambleBytes);
    if (crc32_of(&data[kPreambleBytes], header_bytes) != header_crc)
        fail("%s: the header is damaged (checksum mismatch); cannot append to it", p);
    JsonValue header;
    if (!json_parse(std::string((const char*)&data[kPreambleBytes], header_bytes), header) ||
        header.kind != JsonValue::OBJECT)
        fail("%s: the header is damaged (not a JSON object in UTF-8); cannot append to it", p);
    const JsonValue *format = header.get("format"), *text_version = header.get("version");
    if (!format || format->kind != JsonValue::STRING || format->text != "attnlog")
        fail("%s: the header is damaged (its format is %s, not \"attnlog\"); cannot append to it", p,
             format ? json_text(*format).substr(0, 80).c_str() : "missing");
    if (!json_is_integer(text_version) || text_version->text != std::to_string(version))
        fail("%s: the header is damaged (its text says version %s, the preamble %u); cannot append to it", p,
             text_version ? json_text(*text_version).substr(0, 80).c_str() : "nothing", version);
    std::string difference = runlog_header_members_problem(header);
    if (!difference.empty()) fail("%s: the header is damaged (%s); cannot append to it", p, difference.c_str());
    difference = runlog_config_difference(*header.get("config"), c);
    if (!difference.empty()) fail("%s: %s", p, difference.c_str());
    JsonValue ours;
    if (!json_parse("{" + runlog_record_table(c) + "}", ours)) fail("internal: the record table is not valid JSON");
    difference = runlog_table_difference(header.get("records"), *ours.get("records"));
    if (!difference.empty())
        fail("%s: the record table differs from the one this program writes: %s; cannot append to it", p, difference.c_str());
    if (header_out) *header_out = std::move(header);
    return kPreambleBytes + header_bytes;
}

// ---------------------------------------------------------------------------------------------
// Where the intact records end

// CRC-32 arithmetic (zlib's crc32_combine): a * b modulo the CRC polynomial, bits reflected.
inline uint32_t crc32_multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) product ^= b;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return product;
}

// x^(8n) modulo the polynomial: crc32(A + B) = crc32_multiply(crc32_x8n(len(B)), crc32(A)) ^ crc32(B).
inline uint32_t crc32_x8n(uint64_t n) {
    struct Squares {
        uint32_t v[64];  // x^(8 * 2^k)
        Squares() {
            v[0] = 1u << 23;  // x^8
            for (int k = 1; k < 64; k++) v[k] = crc32_multiply(v[k - 1], v[k - 1]);
        }
    };
    static const Squares squares;
    uint32_t power = 1u << 31;  // x^0
    for (int k = 0; n; k++, n >>= 1)
        if (n & 1) power = crc32_multiply(power, squares.v[k]);
    return power;
}

// The CRC-32 of any byte range of a buffer in time independent of the range's length, from the
// CRCs of the prefixes that end at multiples of kBlock bytes: crc(a..b) = crc(0..b) ^ crc(0..a)
// shifted by b - a bytes. What keeps a scan over candidate records that overlap linear.
struct RangeCrc {
    static const size_t kBlock = 256;
    const uint8_t* data;
    std::vector<uint32_t> prefix;  // prefix[k]: the CRC of the first k * kBlock bytes

    explicit RangeCrc(const std::vector<uint8_t>& d) : data(d.data()), prefix(d.size() / kBlock + 1) {
        for (size_t k = 1; k < prefix.size(); k++) prefix[k] = crc32_update(prefix[k - 1], data + (k - 1) * kBlock, kBlock);
    }
    uint32_t up_to(size_t end) const {
        size_t k = end / kBlock;
        return crc32_update(prefix[k], data + k * kBlock, end - k * kBlock);
    }
    uint32_t of(size_t begin, size_t end) const {
        return up_to(end) ^ crc32_multiply(crc32_x8n(end - begin), up_to(begin));
    }
};

// Size of the record at `pos` when its marker, length and checksum agree, else 0. The checksum
// comes from `ranges` when given, else it is computed over the record.
inline size_t runlog_intact_size(const std::vector<uint8_t>& d, size_t pos, const RangeCrc* ranges = nullptr) {
    if (pos + kRecordOverhead > d.size() || memcmp(&d[pos], kRecordMarker, 4) != 0) return 0;
    uint32_t payload_bytes, crc;
    memcpy(&payload_bytes, &d[pos + 8], 4);
    size_t crc_at = pos + kFrameBytes + payload_bytes;
    if (crc_at + 4 > d.size()) return 0;
    memcpy(&crc, &d[crc_at], 4);
    uint32_t actual = ranges ? ranges->of(pos + 4, crc_at) : crc32_of(&d[pos + 4], crc_at - pos - 4);
    return actual == crc ? crc_at + 4 - pos : 0;
}

// Where the intact records end, found the way readers find them: after a damaged record reading
// resumes at the next marker that frames an intact record; bytes after the last intact record
// are a torn tail.
struct RunLogScan {
    size_t intact_end;  // just past the last intact record
    int64_t last_step;  // that record's step, -1 when there is none
    std::vector<std::pair<int64_t, std::string>> notes;  // the intact notes' steps and texts, in file order
};

// The step and text of the intact record of `size` bytes at d[pos] when it is a note.
inline void runlog_keep_note(const uint8_t* record, size_t size, RunLogScan& scan) {
    uint16_t type;
    memcpy(&type, record + 4, 2);
    if (type != REC_NOTE) return;
    int64_t step;
    memcpy(&step, record + 12, 8);
    scan.notes.emplace_back(step, std::string((const char*)record + kFrameBytes, size - kRecordOverhead));
}

// Visits every marker from `pos` on, in order, skipping those inside a record taken: the first at
// or after the current position that frames an intact record is the next record a reader takes.
// Each marker costs the same whatever length its frame claims, so a damaged region full of
// markers takes time linear in its size.
inline RunLogScan runlog_scan(const std::vector<uint8_t>& d, size_t pos) {
    RunLogScan scan = {pos, -1, {}};
    RangeCrc ranges(d);
    const uint8_t *begin = d.data(), *end = begin + d.size();
    while (pos < d.size()) {
        const uint8_t* marker = std::search(begin + pos, end, kRecordMarker, kRecordMarker + 4);
        if (marker == end) break;
        pos = marker - begin;
        size_t size = runlog_intact_size(d, pos, &ranges);
        if (!size) {
            pos++;
            continue;
        }
        memcpy(&scan.last_step, &d[pos + 12], 8);
        runlog_keep_note(&d[pos], size, scan);
        pos += size;
        scan.intact_end = pos;
    }
    return scan;
}

// Reads exactly n bytes at `offset` of the log's file.
inline void runlog_read_at(const RunLog& log, void* dst, size_t n, size_t offset) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(log.fd, (uint8_t*)dst + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail("%s: cannot read (%s)", log.path.c_str(), r < 0 ? strerror(errno) : "the file shrank");
        got += (size_t)r;
    }
}

// The usual case, found by reading frames only: hopping from frame to frame by their lengths ends
// exactly at the end of the file, and the record found last is intact. Then the file ends with an
// intact record, nothing is torn (damage inside earlier records is for readers to skip), and the
// whole file need not be read.
inline bool runlog_ends_intact(const RunLog& log, size_t pos, size_t size, RunLogScan& scan) {
    size_t last = pos;
    uint8_t frame[kFrameBytes];
    std::vector<uint8_t> record;
    scan.notes.clear();
    while (pos + kRecordOverhead <= size) {
        runlog_read_at(log, frame, kFrameBytes, pos);
        uint32_t payload_bytes;
        uint16_t type;
        memcpy(&payload_bytes, frame + 8, 4);
        memcpy(&type, frame + 4, 2);
        last = pos;
        if (type == REC_NOTE && pos + kRecordOverhead + payload_bytes <= size) {  // notes are read whole
            record.resize(kRecordOverhead + payload_bytes);
            runlog_read_at(log, record.data(), record.size(), pos);
            if (runlog_intact_size(record, 0)) runlog_keep_note(record.data(), record.size(), scan);
        }
        pos += kRecordOverhead + payload_bytes;
    }
    if (pos != size) return false;
    record.resize(size - last);  // empty when the log has no records
    runlog_read_at(log, record.data(), record.size(), last);
    if (!record.empty() && !runlog_intact_size(record, 0)) return false;
    scan.intact_end = size;
    scan.last_step = -1;
    if (!record.empty()) memcpy(&scan.last_step, &record[12], 8);
    return true;
}

// Checks an existing log, open as log.fd, before a resumed run of the model `c` appends to it: its
// preamble and header (runlog_check_header), then where its intact records end; *size is the
// file's size, and the bytes from scan.intact_end to it are a torn tail. With `lineage`, the
// continuations the log records. Reads and changes nothing
// else: the parser the fuzzing harness test/fuzz/fuzz_runlog.cpp drives.
inline RunLogScan runlog_check_existing(const RunLog& log, const ModelConfig& c, size_t* size, RunLineage* lineage = nullptr) {
    struct stat st;
    if (fstat(log.fd, &st) != 0) fail("%s: cannot open (%s)", log.path.c_str(), strerror(errno));
    *size = (size_t)st.st_size;
    // The preamble, then the header it announces: as much of both as the file holds.
    std::vector<uint8_t> head(std::min(*size, kPreambleBytes));
    runlog_read_at(log, head.data(), head.size(), 0);
    if (head.size() == kPreambleBytes) {
        uint32_t header_bytes;
        memcpy(&header_bytes, &head[12], 4);
        head.resize(std::min(*size, kPreambleBytes + header_bytes));
        runlog_read_at(log, head.data() + kPreambleBytes, head.size() - kPreambleBytes, kPreambleBytes);
    }
    JsonValue header;
    size_t records_start = runlog_check_header(log.path, head, c, &header);
    RunLogScan scan;
    if (!runlog_ends_intact(log, records_start, *size, scan)) {
        std::vector<uint8_t> data(*size);
        runlog_read_at(log, data.data(), *size, 0);
        scan = runlog_scan(data, records_start);
    }
    if (lineage) *lineage = runlog_lineage(header, scan.notes);
    return scan;
}

// Opens an existing log to continue a run: checks that it is a version 1 log of the same model
// with the record table this program writes, whose header the reader accepts, removes a torn tail, and appends a note saying when the run resumed and with which options.
// With resume_step >= 0 (the step of the checkpoint the run resumes from) the note sits at that
// step and begins "resumed from step S": a reader then takes the records written before it for
// steps S and later as those of an abandoned continuation. `changes` (may be empty) says which
// training options differ from the checkpoint's run. `check_lineage`, when given, sees the
// continuations the log records before anything is written, and may refuse. Records already
// there are never changed.
inline RunLog runlog_open_append(const std::string& path, const RunInfo& info, int64_t resume_step = -1,
                                 const std::string& changes = "",
                                 const std::function<void(const RunLineage&)>& check_lineage = nullptr) {
    RunLog log;
    log.path = path;
    log.fd = open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    if (log.fd < 0) fail("%s: cannot open (%s)", path.c_str(), strerror(errno));
    size_t size;
    RunLineage lineage;
    RunLogScan scan = runlog_check_existing(log, info.config, &size, &lineage);
    if (check_lineage) check_lineage(lineage);
    size_t torn_bytes = size - scan.intact_end;
    if (torn_bytes && ftruncate(log.fd, (off_t)scan.intact_end) != 0)
        fail("%s: cannot remove the torn tail (%s)", path.c_str(), strerror(errno));
    std::string note = (resume_step >= 0 ? strprintf("resumed from step %lld at ", (long long)resume_step) : "resumed at ") +
                       utc_timestamp();
    if (torn_bytes) note += strprintf("; removed a torn tail of %zu bytes", torn_bytes);
    if (!changes.empty()) note += "; changed options: " + changes;
    runlog_note(log, resume_step >= 0 ? resume_step : scan.last_step, note + "; run: {" + runlog_run_members(info, ", ") + "}");
    runlog_flush(log);
    return log;
}
