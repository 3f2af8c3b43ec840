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
};

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
};
static_assert(sizeof(ModelConfig) == 8 * sizeof(int) + 2 * sizeof(float),
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

// Splits a JSON object into (key, raw value text) pairs: just enough JSON for the resume check to
// find the header's "config" object and its numbers. Keys come back as written (escapes kept),
// which is all a comparison with plain ASCII names needs. Returns false on malformed text.
inline bool json_members(const std::string& s, std::vector<std::pair<std::string, std::string>>& out) {
    size_t i = 0, n = s.size();
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
    auto skip_space = [&] {
        while (i < n && is_space(s[i])) i++;
    };
    auto skip_string = [&] {  // from the opening quote to just past the closing one
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\') i++;
        i++;
        return i <= n;
    };
    auto skip_value = [&] {  // up to the ',' or the bracket that ends the value
        int depth = 0;
        while (i < n) {
            char c = s[i];
            if (depth == 0 && (c == ',' || c == '}' || c == ']')) return true;
            if (c == '"') {
                if (!skip_string()) return false;
                continue;
            }
            if (c == '{' || c == '[') depth++;
            if (c == '}' || c == ']') depth--;
            i++;
        }
        return false;
    };
    skip_space();
    if (i >= n || s[i] != '{') return false;
    i++;
    skip_space();
    if (i < n && s[i] == '}') return true;
    while (true) {
        skip_space();
        if (i >= n || s[i] != '"') return false;
        size_t key_start = i + 1;
        if (!skip_string()) return false;
        std::string key = s.substr(key_start, i - 1 - key_start);
        skip_space();
        if (i >= n || s[i] != ':') return false;
        i++;
        skip_space();
        size_t value_start = i;
        if (!skip_value()) return false;
        size_t value_end = i;
        while (value_end > value_start && is_space(s[value_end - 1])) value_end--;
        out.emplace_back(key, s.substr(value_start, value_end - value_start));
        if (s[i] == '}') return true;
        if (s[i] != ',') return false;
        i++;
    }
}

// Empty when the header's model configuration equals `config`, else a sentence naming the first
// field that differs.
inline std::string runlog_config_difference(const std::string& header, const ModelConfig& config) {
    std::vector<std::pair<std::string, std::string>> top, fields;
    std::string logged_config;
    if (json_members(header, top))
        for (auto& member : top)
            if (member.first == "config") logged_config = member.second;
    if (logged_config.empty() || !json_members(logged_config, fields))
        return "the header holds no readable model configuration";
    for (const ConfigField& f : kConfigFields) {
        auto it = std::find_if(fields.begin(), fields.end(), [&](auto& m) { return m.first == f.name; });
        if (it == fields.end()) return strprintf("the model configuration in the header has no %s", f.name);
        const char* logged = it->second.c_str();
        bool same = f.int_field ? strtoll(logged, nullptr, 10) == config.*f.int_field
                                : strtof(logged, nullptr) == config.*f.float_field;
        if (!same)
            return "the model configuration differs from this run's: " + std::string(f.name) + " is " + it->second +
                   " in the log, " + config_value_text(config, f) + " in this run";
    }
    return "";
}

// Checks the preamble and header of an existing log a resumed run will append to (`data` holds
// the file's first bytes, the header included when the file has all of it); returns the offset of
// its first record.
inline size_t runlog_check_header(const std::string& path, const std::vector<uint8_t>& data, const ModelConfig& c) {
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
    std::string difference = runlog_config_difference(
        std::string((const char*)&data[kPreambleBytes], header_bytes), c);
    if (!difference.empty()) fail("%s: %s", p, difference.c_str());
    return kPreambleBytes + header_bytes;
}

// Size of the record at `pos` when its marker, length and checksum agree, else 0.
inline size_t runlog_intact_size(const std::vector<uint8_t>& d, size_t pos) {
    if (pos + kRecordOverhead > d.size() || memcmp(&d[pos], kRecordMarker, 4) != 0) return 0;
    uint32_t payload_bytes, crc;
    memcpy(&payload_bytes, &d[pos + 8], 4);
    size_t crc_at = pos + kFrameBytes + payload_bytes;
    if (crc_at + 4 > d.size()) return 0;
    memcpy(&crc, &d[crc_at], 4);
    return crc32_of(&d[pos + 4], crc_at - pos - 4) == crc ? crc_at + 4 - pos : 0;
}

// Where the intact records end, found the way readers find them: after a damaged record reading
// resumes at the next marker that frames an intact record; bytes after the last intact record
// are a torn tail.
struct RunLogScan {
    size_t intact_end;  // just past the last intact record
    int64_t last_step;  // that record's step, -1 when there is none
};

inline RunLogScan runlog_scan(const std::vector<uint8_t>& d, size_t pos) {
    RunLogScan scan = {pos, -1};
    while (pos < d.size()) {
        size_t size = runlog_intact_size(d, pos);
        if (size) {
            memcpy(&scan.last_step, &d[pos + 12], 8);
            pos += size;
            scan.intact_end = pos;
            continue;
        }
        auto next = std::search(d.begin() + pos + 1, d.end(), kRecordMarker, kRecordMarker + 4);
        if (next == d.end()) break;
        pos = next - d.begin();
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
    while (pos + kRecordOverhead <= size) {
        runlog_read_at(log, frame, kFrameBytes, pos);
        uint32_t payload_bytes;
        memcpy(&payload_bytes, frame + 8, 4);
        last = pos;
        pos += kRecordOverhead + payload_bytes;
    }
    if (pos != size) return false;
    std::vector<uint8_t> record(size - last);  // empty when the log has no records
    runlog_read_at(log, record.data(), record.size(), last);
    if (!record.empty() && !runlog_intact_size(record, 0)) return false;
    scan.intact_end = size;
    scan.last_step = -1;
    if (!record.empty()) memcpy(&scan.last_step, &record[12], 8);
    return true;
}

// Opens an existing log to continue a run: checks that it is a version 1 log of the same model,
// removes a torn tail, and appends a note saying when the run resumed and with which options.
// With resume_step >= 0 (the step of the checkpoint the run resumes from) the note sits at that
// step and begins "resumed from step S": a reader then takes the records written before it for
// steps S and later as those of an abandoned continuation. `changes` (may be empty) says which
// training options differ from the checkpoint's run. Records already there are never changed.
inline RunLog runlog_open_append(const std::string& path, const RunInfo& info, int64_t resume_step = -1,
                                 const std::string& changes = "") {
    RunLog log;
    log.path = path;
    log.fd = open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    if (log.fd < 0) fail("%s: cannot open (%s)", path.c_str(), strerror(errno));
    size_t size = (size_t)file_size_or_fail(path.c_str());
    // The preamble, then the header it announces: as much of both as the file holds.
    std::vector<uint8_t> head(std::min(size, kPreambleBytes));
    runlog_read_at(log, head.data(), head.size(), 0);
    if (head.size() == kPreambleBytes) {
        uint32_t header_bytes;
        memcpy(&header_bytes, &head[12], 4);
        head.resize(std::min(size, kPreambleBytes + header_bytes));
        runlog_read_at(log, head.data() + kPreambleBytes, head.size() - kPreambleBytes, kPreambleBytes);
    }
    size_t records_start = runlog_check_header(path, head, info.config);
    RunLogScan scan;
    if (!runlog_ends_intact(log, records_start, size, scan)) {
        std::vector<uint8_t> data(size);
        runlog_read_at(log, data.data(), size, 0);
        scan = runlog_scan(data, records_start);
    }
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
