// Resuming a run into its log: the checks an existing run log passes before a resumed run appends
// to it (a header the reader accepts, of the same model, with the record table this program
// writes), the continuations it records (which checkpoints may resume into it, run_dir.h), the
// removal of a torn tail, and the note that begins the new continuation. Records already there
// are never changed.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>
#include "config.h"
#include "json.h"
#include "runlog.h"
#include "runlog_scan.h"
#include "utils.h"

// ---------------------------------------------------------------------------------------------
// The header read back

// Empty when the header's model configuration `logged` (its "config" object) equals `config`,
// else a sentence naming the first field that differs.
inline std::string runlog_config_difference(const JsonValue& logged, const ModelConfig& config) {
    for (const ConfigField& f : kConfigFields) {
        const JsonValue* v = logged.get(f.name);
        if (!v && config_field_is_default(config, f)) continue;  // a log older than the field: the model it knew
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

// Empty when the members of the header besides the record table hold what docs/log_format.md
// says, as the reader checks them: created, backend and device strings, options an object of
// strings, seed an integer in [0, 2^64), num_processes a positive integer, train_tokens an integer
// of at least 0, config an object of numbers. Else where it is wrong.
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
    const JsonValue* tokens = header.get("train_tokens");
    if (tokens && (!json_is_integer(tokens) || (tokens->text[0] == '-' && tokens->text != "-0")))
        return "its train_tokens is " + json_text(*tokens).substr(0, 40) + ", not a number of tokens";
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
    bool measurement = false;  // the log of a measurement (--measure): no training continues it
};

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
    lineage.measurement = header.get("measurement") != nullptr;
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
// Checking and opening for appending

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
