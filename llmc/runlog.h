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
//
// This header holds the format and the writer; runlog_scan.h finds where a log's intact records
// end, runlog_append.h checks an existing log and opens it for a resumed run.
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
#include "json.h"
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
    int64_t train_tokens = -1;    // tokens in the training shards, one epoch; -1: not known
    // Who writes: the run's id (the same in every log and checkpoint of the run) and that of this
    // continuation (each start or resume of ./train has its own); a resumed run also names the
    // continuation that wrote its checkpoint and the checkpoint's step. Zero: none (not resumed,
    // or a checkpoint that does not say).
    uint64_t run_id = 0, continuation = 0, resumed_from = 0;
    int64_t resumed_from_step = -1;  // -1: not resumed
    // A measurement (--measure) of a checkpoint's weights: the checkpoint (or Hugging Face
    // directory), the steps they had trained, the run that trained them and the tokens it trained
    // them on (the steps times its tokens per step); -1 and 0: not recorded. An empty checkpoint: a
    // training run.
    struct Measured {
        std::string checkpoint;
        int64_t step = -1, tokens = -1;
        uint64_t run_id = 0;
    } measured;
};

struct RunLog {
    std::string path;
    int fd = -1;                  // opened with O_APPEND: every write lands at the end
    std::vector<uint8_t> record;  // the record being assembled, reused from one record to the next
};

// The step record's fields, in payload order: the arguments of runlog_step.
static const char* const kStepFields[][2] = {
    {"loss", "training loss of the step: mean cross-entropy, nats per token"},
    {"lr", "learning rate the step used"},
    {"grad_norm", "global L2 norm of the gradient, before clipping"},
    {"tokens_per_s", "training throughput of the step, tokens per second"},
    {"ms", "wall-clock time of the step, milliseconds"},
};

// ---------------------------------------------------------------------------------------------
// The header

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
    if (info.train_tokens >= 0) j += sep + strprintf("\"train_tokens\": %lld", (long long)info.train_tokens);
    if (info.run_id) j += sep + ("\"run_id\": " + json_id(info.run_id));
    if (info.continuation) j += sep + ("\"continuation\": " + json_id(info.continuation));
    if (info.resumed_from) j += sep + ("\"resumed_from\": " + json_id(info.resumed_from));
    if (info.resumed_from_step >= 0) j += sep + strprintf("\"resumed_from_step\": %lld", (long long)info.resumed_from_step);
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
        if (m.shape == PER_STEP) {
            telemetry.push_back(json_field(m.name, "float32", "[]", "[]", m.meaning));
            continue;
        }
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

// The header's "measurement" member, after a comma, in a measurement's log; else "".
inline std::string runlog_measurement_member(const RunInfo::Measured& m) {
    if (m.checkpoint.empty()) return "";
    std::string j = ",\n  \"measurement\": {\"checkpoint\": " + json_string(m.checkpoint);
    if (m.step >= 0) j += strprintf(", \"step\": %lld", (long long)m.step);
    if (m.run_id) j += ", \"run_id\": " + json_id(m.run_id);
    if (m.tokens >= 0) j += strprintf(", \"tokens\": %lld", (long long)m.tokens);
    return j + "}";
}

inline std::string runlog_header_text(const RunInfo& info) {
    std::string config;
    for (const ConfigField& f : kConfigFields)
        config += (config.empty() ? "\"" : ", \"") + std::string(f.name) + "\": " + config_value_text(info.config, f);
    return "{\n  \"format\": \"attnlog\",\n" + strprintf("  \"version\": %u,\n", kRunLogVersion) +
           "  \"created\": \"" + utc_timestamp() + "\",\n  \"config\": {" + config + "},\n  " +
           runlog_run_members(info, ",\n  ") + runlog_measurement_member(info.measured) + ",\n" +
           runlog_record_table(info.config) + "}\n";
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

// Every metric of kMetrics in table order, each a row-major [n_layer][cols] float32 array (one
// float32 for a PER_STEP metric).
inline void runlog_telemetry(RunLog& log, int64_t step, const Telemetry& t, const ModelConfig& c) {
    runlog_begin(log, REC_TELEMETRY, step);
    for (int m = 0; m < M_NUM_METRICS; m++) {
        size_t n = metric_size(c, kMetrics[m].shape);
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
