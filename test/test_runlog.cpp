// Tests of the run log writer, llmc/runlog.h.
//   test_runlog              checks the writer itself: it never overwrites, resuming keeps earlier
//                            records, removes a torn tail and checks the model, the header's JSON
//                            is escaped correctly, a full disk leaves a readable file
//   test_runlog write PATH   writes a log of known values, for test/test_attnlog.py
//   test_runlog append PATH  resumes that log and re-does steps 6..11 with other values
//   test_runlog --metrics    the telemetry metrics of llmc/telemetry.h as JSON, for test_attnlog.py
//   test_runlog check-append PATH...   resumes each log (as `append` does, without new records) in
//                            a child process and prints a line per log: "accepted" or
//                            "refused: <its error line>", for test/fuzz/test_append_vs_reader.py
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <functional>
#include "llmc/runlog_append.h"
#include "testing.h"

// ---------------------------------------------------------------------------------------------
// The logged run: a small model with n_head != n_kv_head and every dimension different, so that
// a transposed or misplaced array shows up as wrong values.

static ModelConfig test_config() {
    ModelConfig c;
    c.vocab_size = 96;
    c.n_layer = 3;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.head_dim = 8;
    c.d_model = 32;
    c.d_ff = 80;
    c.max_seq_len = 16;
    c.rope_theta = 500000.0f;
    c.norm_eps = 1e-6f;
    return c;
}

// Options that need every kind of JSON escaping, and a byte that is not UTF-8.
static RunInfo test_info() {
    RunInfo info;
    info.config = test_config();
    info.options = {{"data", "C:\\runs\\\"best\".bin"},
                    {"lr", "0.003"},
                    {"comment", "tab\there\nnew line, ünïcode ✓"},
                    {"control", "\x01\x1f"},
                    {"bytes", "\xff ok"}};
    info.seed = 18446744073709551615ull;
    info.backend = "cpu";
    info.device = "test device \"x\" \\ 2 cores";
    info.num_processes = 3;
    info.train_tokens = 1420931;
    return info;
}

// Writes steps first..last of one segment (0: the first run, 1: the resumed one). Every value is
// a formula of (segment, step, metric, layer, column), exact in float32, that test_attnlog.py
// recomputes.
static void write_segment(RunLog& log, int segment, int first, int last) {
    ModelConfig c = test_config();
    Telemetry t;
    t.resize(c);
    float seg = 100.0f * segment;
    for (int s = first; s <= last; s++) {
        if (s == 0 || s == 7)
            runlog_note(log, s, strprintf("segment %d, step %d: \"quoted\" \\ ünïcode ✓ \xff",
                                          segment, s));
        runlog_step(log, s, seg + 8 - s / 8.0f, seg + (s + 1) / 1024.0f, seg + 1 + s / 16.0f, seg + 1000.0f * (s + 1),
                    seg + 2 * s + 0.5f);
        if (s % 5 == 0 || s == 9) runlog_val(log, s, seg + 7 - s / 8.0f);
        if (s % 3 == 0) {
            for (int m = 0; m < M_NUM_METRICS; m++)
                for (int l = 0; l < c.n_layer; l++)
                    for (int col = 0; col < metric_cols(c, kMetrics[m].shape); col++)
                        t.row(m, l, c)[col] = segment * 1e6f + s * 1e5f + m * 1000 + l * 100 + col + 0.5f;
            runlog_telemetry(log, s, t, c);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

static std::string g_dir;  // a fresh temporary directory for the files of the checks

static std::string temp_path(const char* name) { return g_dir + "/" + name; }

static std::string read_text(const std::string& path) {
    std::string s;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return s;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}

static void write_text(const std::string& path, const std::string& text) {
    FILE* f = open_or_fail(path.c_str(), "wb");
    write_or_fail(f, text.data(), text.size(), path.c_str());
    fclose(f);
}

static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A user error is one line on stderr.
static bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

// Reports a check of a command that must fail: exit status 1 and one line naming the file and
// containing `expected`.
static void check_user_error(const std::string& name, const ChildResult& r, const std::string& path,
                             const std::string& expected) {
    bool ok = r.status == 1 && one_line(r.err) && contains(r.err, path) && contains(r.err, expected);
    report(ok, name, strprintf("exit %d, stderr: ", r.status) + r.err.substr(0, r.err.find_last_not_of('\n') + 1));
}

struct Record {
    size_t offset;
    uint16_t type;
    int64_t step;
    std::string payload;
};

struct LogFile {
    bool header_ok = false;
    std::string header;
    std::vector<Record> records;
    size_t trailing = 0;  // bytes after the last record that checks out
};

// Reads a log strictly as docs/log_format.md lays it out, without runlog.h's reading code: the
// preamble, the header, then records one after another while each one checks out.
static LogFile read_log(const std::string& path) {
    std::string d = read_text(path);
    LogFile f;
    uint32_t version = 0, header_bytes = 0, header_crc = 0;
    if (d.size() >= 20) {
        memcpy(&version, &d[8], 4);
        memcpy(&header_bytes, &d[12], 4);
        memcpy(&header_crc, &d[16], 4);
    }
    f.header_ok = d.size() >= 20 && d.compare(0, 8, std::string("ATTNLOG\0", 8)) == 0 && version == 1 &&
                  20 + (size_t)header_bytes <= d.size() && crc32_of(&d[20], header_bytes) == header_crc;
    if (!f.header_ok) return f;
    f.header = d.substr(20, header_bytes);
    size_t pos = 20 + header_bytes;
    while (pos + 24 <= d.size() && d.compare(pos, 4, "\xffREC") == 0) {
        Record r;
        uint32_t payload_bytes, crc;
        memcpy(&r.type, &d[pos + 4], 2);
        memcpy(&payload_bytes, &d[pos + 8], 4);
        memcpy(&r.step, &d[pos + 12], 8);
        if (pos + 24 + payload_bytes > d.size()) break;
        memcpy(&crc, &d[pos + 20 + payload_bytes], 4);
        if (crc32_of(&d[pos + 4], 16 + payload_bytes) != crc) break;
        r.offset = pos;
        r.payload = d.substr(pos + 20, payload_bytes);
        f.records.push_back(r);
        pos += 24 + payload_bytes;
    }
    f.trailing = d.size() - pos;
    return f;
}

static float payload_float(const Record& r, size_t i) {
    float v = 0;
    if (r.payload.size() >= 4 * (i + 1)) memcpy(&v, &r.payload[4 * i], 4);
    return v;
}

// A log of three step records, steps 0..2 with loss = step.
static void write_three_steps(const std::string& path) {
    RunLog log = runlog_create(path, test_info());
    for (int s = 0; s < 3; s++) runlog_step(log, s, (float)s, 1e-3f, 1.0f, 100.0f, 5.0f);
    runlog_close(log);
}

// ---------------------------------------------------------------------------------------------
// Checks

static void test_create_refuses_existing() {
    std::string path = temp_path("existing.log");
    write_text(path, "precious");
    ChildResult r = run_child([&] { runlog_create(path, test_info()); });
    check_user_error("create_refuses_existing", r, path, "already exists");
    report(read_text(path) == "precious", "create_leaves_existing_file_unchanged");
}

static void test_header() {
    std::string path = temp_path("header.log");
    RunLog log = runlog_create(path, test_info());
    runlog_close(log);
    LogFile f = read_log(path);
    report(f.header_ok && f.records.empty() && f.trailing == 0, "header_preamble_and_crc");

    // Each line is exactly how the header must spell one value.
    const char* expected[] = {
        R"("format": "attnlog")",
        R"("version": 1)",
        R"("data": "C:\\runs\\\"best\".bin")",
        "\"comment\": \"tab\\there\\nnew line, ünïcode ✓\"",
        R"("control": "\u0001\u001f")",
        "\"bytes\": \"\xef\xbf\xbd ok\"",
        R"("device": "test device \"x\" \\ 2 cores")",
        R"("seed": 18446744073709551615)",
        R"("backend": "cpu")",
        R"("num_processes": 3)",
        R"("train_tokens": 1420931)",
        R"("config": {"vocab_size": 96, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "head_dim": 8, "d_model": 32, "d_ff": 80, "max_seq_len": 16, "rope_theta": 500000.0, "norm_eps": 1e-06, "qk_norm": 0, "tied_embeddings": 1, "rope_factor": 0.0, "rope_low_freq_factor": 0.0, "rope_high_freq_factor": 0.0, "rope_original_max_pos": 0})",
        R"({"name": "k_norm", "dtype": "float32", "shape": [3, 2], "dims": ["layer", "kv_head"])",
        R"({"name": "q_norm", "dtype": "float32", "shape": [3, 4], "dims": ["layer", "q_head"])",
        R"({"name": "g_k", "dtype": "float32", "shape": [3, 8], "dims": ["layer", "dim"])",
        R"({"name": "text", "dtype": "utf8", "shape": [-1], "dims": ["byte"])",
    };
    std::string missing;
    for (const char* e : expected)
        if (missing.empty() && !contains(f.header, e)) missing = e;
    report(missing.empty(), "header_json_escaping_and_fields", missing.empty() ? "" : "missing " + missing);

    JsonValue header;
    bool parsed = json_parse(f.header, header);
    const JsonValue* config = header.get("config");
    report(parsed && header.members.size() == 11 && header.members[0].first == "format" &&
               header.members.back().first == "records" && config && runlog_config_difference(*config, test_config()).empty(),
           "header_json_structure", strprintf("%zu top-level members", header.members.size()));
}

static void test_append_removes_torn_tail() {
    std::string path = temp_path("torn.log");
    write_three_steps(path);
    LogFile before = read_log(path);
    long long size = file_size_or_fail(path.c_str());
    if (truncate(path.c_str(), size - 7) != 0) fail("%s: truncate: %s", path.c_str(), strerror(errno));
    RunLog log = runlog_open_append(path, test_info());
    runlog_step(log, 3, 3.0f, 1e-3f, 1.0f, 100.0f, 5.0f);
    runlog_close(log);
    LogFile after = read_log(path);

    bool kept = before.records.size() == 3 && after.records.size() == 4;
    for (int i = 0; kept && i < 2; i++)
        kept = after.records[i].offset == before.records[i].offset &&
               after.records[i].payload == before.records[i].payload && after.records[i].step == i;
    report(kept && after.trailing == 0, "append_keeps_intact_records", strprintf("%zu records", after.records.size()));
    if (after.records.size() != 4) return;
    const Record& note = after.records[2];
    report(note.type == REC_NOTE && note.step == 1 && note.payload.rfind("resumed at 20", 0) == 0 &&
               contains(note.payload, "removed a torn tail of 37 bytes") &&
               contains(note.payload, R"("seed": 18446744073709551615)"),
           "append_note_after_torn_tail", note.payload.substr(0, 80));
    const Record& resumed = after.records[3];
    report(resumed.type == REC_STEP && resumed.step == 3 && payload_float(resumed, 0) == 3.0f &&
               resumed.offset == note.offset + 24 + note.payload.size(),
           "append_writes_after_the_note");
}

static void test_append_keeps_damaged_middle_record() {
    // A damaged record followed by intact ones is not a torn tail: nothing may be cut off.
    std::string path = temp_path("damaged.log");
    write_three_steps(path);
    LogFile before = read_log(path);
    std::string bytes = read_text(path);
    bytes[before.records[1].offset + 20] ^= 0x40;
    write_text(path, bytes);
    RunLog log = runlog_open_append(path, test_info());
    runlog_close(log);
    std::string after = read_text(path);
    LogFile f = read_log(path);  // stops at the damaged record
    report(after.compare(0, bytes.size(), bytes) == 0 && f.records.size() == 1 &&
               f.trailing == after.size() - before.records[1].offset,
           "append_keeps_damaged_middle_record", strprintf("%zu -> %zu bytes", bytes.size(), after.size()));
}

static void test_append_removes_damaged_last_record() {
    // Bytes after the last intact record are a torn tail, even when they frame a whole record.
    std::string path = temp_path("last.log");
    write_three_steps(path);
    LogFile before = read_log(path);
    std::string bytes = read_text(path);
    bytes[before.records[2].offset + 22] ^= 0x40;
    write_text(path, bytes);
    RunLog log = runlog_open_append(path, test_info());
    runlog_close(log);
    LogFile f = read_log(path);
    report(f.records.size() == 3 && f.trailing == 0 && f.records[2].offset == before.records[2].offset &&
               f.records[2].step == 1 && contains(f.records[2].payload, "removed a torn tail of 44 bytes"),
           "append_removes_damaged_last_record");
}

static void test_append_clean_log() {
    std::string path = temp_path("clean.log");
    write_three_steps(path);
    std::string bytes = read_text(path);
    RunLog log = runlog_open_append(path, test_info());
    runlog_close(log);
    LogFile f = read_log(path);
    bool ok = read_text(path).compare(0, bytes.size(), bytes) == 0 && f.records.size() == 4 && f.trailing == 0 &&
              f.records[3].type == REC_NOTE && f.records[3].step == 2 && !contains(f.records[3].payload, "torn");
    report(ok, "append_to_clean_log_adds_only_a_note");
}

// The continuations a log records: the one in its header, then each resumed run's from its note,
// read back whether the file ends intact (the fast path) or a damaged record needs a scan; a refusal
// by the lineage check leaves the file as it was.
static void test_lineage() {
    std::string path = temp_path("lineage.log");
    RunInfo info = test_info();
    info.run_id = 0xfeedfacecafebeefull;
    info.continuation = 11;
    RunLog log = runlog_create(path, info);
    runlog_step(log, 0, 1.0f, 1e-3f, 1.0f, 1.0f, 1.0f);
    runlog_note(log, 0, "resumed from step 0 at then; run: {\"run_id\": \"0000000000000001\", \"continuation\": \"0000000000000063\"}");
    runlog_close(log);
    auto resume = [&](uint64_t id, uint64_t from, int64_t step) {
        RunInfo r = info;
        r.continuation = id;
        r.resumed_from = from;
        r.resumed_from_step = step;
        RunLog l = runlog_open_append(path, r, step);
        runlog_step(l, step, 2.0f, 1e-3f, 1.0f, 1.0f, 1.0f);
        runlog_close(l);
    };
    resume(22, 11, 4);
    resume(33, 22, 6);
    RunLineage seen;
    std::string before = read_text(path);
    ChildResult refused = run_child([&] {
        RunInfo r = info;
        runlog_open_append(path, r, 3, "", [&](const RunLineage& l) {
            seen = l;
            fail("%s: refused by the lineage check", path.c_str());
        });
    });
    report(refused.status == 1 && read_text(path) == before, "lineage: a refusal leaves the log as it was", refused.err);
    auto lineage_of = [&]() {
        RunLineage l;
        RunLog check;
        check.path = path;
        check.fd = open(path.c_str(), O_RDONLY);
        size_t size;
        runlog_check_existing(check, info.config, &size, &l);
        close(check.fd);
        return l;
    };
    auto text = [](const RunLineage& l) {
        std::string t = strprintf("run %llx:", (unsigned long long)l.run_id);
        for (const Continuation& c : l.continuations)
            t += strprintf(" %llu<-%llu@%lld", (unsigned long long)c.id, (unsigned long long)c.resumed_from, (long long)c.start_step);
        return t;
    };
    std::string want = "run feedfacecafebeef: 11<-0@0 22<-11@4 33<-22@6";  // the note of another run is not one
    report(text(lineage_of()) == want, "lineage: the header's continuation and each resumed run's", text(lineage_of()));
    std::string bytes = read_text(path);
    LogFile f = read_log(path);
    bytes[f.records.back().offset + 22] ^= 0x01;  // the last record damaged: found by the scan, not by hopping
    write_text(path, bytes);
    report(text(lineage_of()) == want, "lineage: read the same by the scan over a damaged log", text(lineage_of()));
    remove(path.c_str());
}

static void test_append_refusals() {
    std::string path = temp_path("refusals.log");
    write_three_steps(path);
    std::string bytes = read_text(path);

    RunInfo other = test_info();
    other.config.n_layer = 4;
    ChildResult r = run_child([&] { runlog_open_append(path, other); });
    check_user_error("append_refuses_other_n_layer", r, path, "n_layer is 3 in the log, 4 in this run");
    other = test_info();
    other.config.norm_eps = 1e-5f;
    r = run_child([&] { runlog_open_append(path, other); });
    check_user_error("append_refuses_other_norm_eps", r, path, "norm_eps is 1e-06 in the log, 1e-05 in this run");
    report(read_text(path) == bytes, "refused_append_leaves_file_unchanged");

    std::string damaged = bytes;
    damaged[40] ^= 1;  // inside the header text
    write_text(path, damaged);
    r = run_child([&] { runlog_open_append(path, test_info()); });
    check_user_error("append_refuses_damaged_header", r, path, "header is damaged");

    std::string newer = bytes;
    newer[8] = 2;
    write_text(path, newer);
    r = run_child([&] { runlog_open_append(path, test_info()); });
    check_user_error("append_refuses_newer_version", r, path, "format version 2");

    write_text(path, bytes.substr(0, 30));
    r = run_child([&] { runlog_open_append(path, test_info()); });
    check_user_error("append_refuses_truncated_header", r, path, "truncated header");

    write_text(path, "step,loss\n0,8\n");
    r = run_child([&] { runlog_open_append(path, test_info()); });
    check_user_error("append_refuses_other_files", r, path, "not a run log");

    std::string absent = temp_path("absent.log");
    r = run_child([&] { runlog_open_append(absent, test_info()); });
    check_user_error("append_refuses_missing_file", r, absent, "cannot open");
}

// The log `bytes` with its header text replaced by `header`, the preamble's length and CRC set to
// match: a header that only its content makes wrong.
static std::string with_header(const std::string& bytes, const std::string& header) {
    uint32_t old_bytes, header_bytes = (uint32_t)header.size(), crc = crc32_of(header.data(), header.size());
    memcpy(&old_bytes, &bytes[12], 4);
    std::string out = bytes.substr(0, 20) + header + bytes.substr(20 + old_bytes);
    memcpy(&out[12], &header_bytes, 4);
    memcpy(&out[16], &crc, 4);
    return out;
}

static std::string replaced(std::string s, const std::string& from, const std::string& to) {
    size_t at = s.find(from);
    if (at == std::string::npos) fail("internal: \"%s\" is not in the header", from.c_str());
    return s.replace(at, from.size(), to);
}

// A log written before the QK-norm variants has no qk_norm in its configuration, nor the fields
// that came after it (untied embeddings, RoPE scaling): a run of the default variant with their
// defaults appends to it, a run of another variant, or with untied embeddings, is refused.
static void test_append_to_a_log_before_the_variants() {
    std::string path = temp_path("before_variants.log");
    write_three_steps(path);
    std::string bytes = read_text(path);
    std::string later_fields = ", \"qk_norm\": 0, \"tied_embeddings\": 1, \"rope_factor\": 0.0, \"rope_low_freq_factor\": 0.0, "
                               "\"rope_high_freq_factor\": 0.0, \"rope_original_max_pos\": 0";
    std::string old = with_header(bytes, replaced(read_log(path).header, later_fields, ""));
    write_text(path, old);
    RunLog log = runlog_open_append(path, test_info());
    runlog_step(log, 3, 3.0f, 1e-3f, 1.0f, 100.0f, 5.0f);
    runlog_close(log);
    size_t records = read_log(path).records.size();
    report(records == 5, "append_of_gain_to_a_log_before_the_variants", strprintf("%zu records", records));  // + its note
    write_text(path, old);
    RunInfo plain = test_info();
    plain.config.qk_norm = QK_NORM_PLAIN;
    ChildResult r = run_child([&] { runlog_open_append(path, plain); });
    check_user_error("append_of_plain_to_a_log_before_the_variants_refused", r, path, "has no qk_norm");
    RunInfo untied = test_info();
    untied.config.tied_embeddings = 0;
    ChildResult ru = run_child([&] { runlog_open_append(path, untied); });
    check_user_error("append_of_untied_to_a_log_before_the_field_refused", ru, path, "has no tied_embeddings");
}

static void test_append_refuses_headers_readers_reject() {
    // Headers whose checksum is right but whose content the reader (scripts/attnlog.py) rejects,
    // or whose record table is not the one this program writes: each refused with one line, the
    // file untouched.
    std::string path = temp_path("headers.log");
    write_three_steps(path);
    std::string bytes = read_text(path);
    std::string h = read_log(path).header;
    std::string k_pr_field = h.substr(h.find("      {\"name\": \"k_pr\""));
    k_pr_field = k_pr_field.substr(0, k_pr_field.find('\n') + 1);
    const struct {
        const char* name;
        std::string header, says;
    } cases[] = {
        {"other_format", replaced(h, R"("format": "attnlog")", R"("format": "attnlog2")"), R"(its format is "attnlog2")"},
        {"format_repeated_last_differs", replaced(h, R"("format": "attnlog",)", R"("format": "attnlog", "format": "x",)"),
         R"(its format is "x")"},
        {"text_version_differs", replaced(h, R"("version": 1)", R"("version": 2)"), "its text says version 2, the preamble 1"},
        {"text_version_float", replaced(h, R"("version": 1)", R"("version": 1.0)"), "its text says version 1.0, the preamble 1"},
        {"text_version_missing", replaced(h, R"("version": 1)", R"("versions": 1)"), "its text says version nothing"},
        {"text_after_the_object", h + "{}", "not a JSON object in UTF-8"},
        {"not_an_object", "[" + h + "]", "not a JSON object in UTF-8"},
        {"raw_control_character", replaced(h, R"("backend": "cpu")", "\"backend\": \"c\tpu\""), "not a JSON object"},
        {"invalid_utf8", replaced(h, R"("backend": "cpu")", "\"backend\": \"c\xff" "u\""), "not a JSON object"},
        {"bad_escape", replaced(h, R"("backend": "cpu")", R"("backend": "c\xu")"), "not a JSON object"},
        {"lone_surrogate", replaced(h, R"("backend": "cpu")", R"("backend": "c\ud800")"), "not a JSON object"},
        {"integer_too_long_for_python", replaced(h, "18446744073709551615", std::string(4301, '7')), "not a JSON object"},
        {"float_too_large", replaced(h, R"("rope_theta": 500000.0)", R"("rope_theta": 1e999)"), "not a JSON object"},
        {"leading_zero", replaced(h, R"("n_layer": 3)", R"("n_layer": 03)"), "not a JSON object"},
        {"seed_too_large", replaced(h, "18446744073709551615", "18446744073709551616"), "its seed is 18446744073709551616"},
        {"seed_negative", replaced(h, "18446744073709551615", "-1"), "its seed is -1"},
        {"option_not_text", replaced(h, R"("lr": "0.003")", R"("lr": 0.003)"), R"(its option "lr" is not a string)"},
        {"backend_not_text", replaced(h, R"("backend": "cpu")", R"("backend": null)"), "its backend is null, not a string"},
        {"train_tokens_negative", replaced(h, R"("train_tokens": 1420931)", R"("train_tokens": -5)"),
         "its train_tokens is -5, not a number of tokens"},
        {"train_tokens_as_text", replaced(h, R"("train_tokens": 1420931)", R"("train_tokens": "5")"),
         R"(its train_tokens is "5", not a number of tokens)"},
        {"no_config", replaced(h, R"("config": {)", R"("konfig": {)"), "it holds no model configuration"},
        {"config_as_text", replaced(h, R"("n_layer": 3)", R"("n_layer": "3")"), R"(its config member "n_layer" is not a number)"},
        {"config_integer_as_float", replaced(h, R"("n_layer": 3)", R"("n_layer": 3.0)"), "n_layer is 3.0 in the log, 3 in this run"},
        {"no_record_table", replaced(h, R"("records": [)", R"("recs": [)"), "the header has no record table"},
        {"metric_renamed", replaced(h, R"({"name": "k_pr")", R"({"name": "k_px")"),
         R"(field 3 of the telemetry record is "k_px" "float32" [3, 2] ["layer", "kv_head"] in the log, "k_pr" "float32" [3, 2])"},
        {"metric_shape", replaced(h, R"("shape": [3, 2])", R"("shape": [3, 3])"), R"(field 1 of the telemetry record is "k_norm" "float32" [3, 3])"},
        {"metric_dims", replaced(h, R"(["layer", "kv_head"])", R"(["layer", "q_head"])"), R"("k_norm" "float32" [3, 2] ["layer", "q_head"] in the log)"},
        {"metric_dtype", replaced(h, R"("dtype": "float32", "shape": [3, 2])", R"("dtype": "float64", "shape": [3, 2])"),
         R"("k_norm" "float64" [3, 2])"},
        {"metric_missing", replaced(h, k_pr_field, ""), "the telemetry record has 13 fields in the log, 14 in this program"},
        {"step_field_missing_key", replaced(h, R"({"name": "loss", "dtype": "float32", )", R"({"name": "loss", )"),
         R"(field 1 of the step record is "loss" (no dtype) [] [] in the log)"},
        {"meaning_not_text", replaced(h, R"("meaning": "learning rate the step used")", R"("meaning": 5)"),
         "field 2 of the step record has a meaning that is not text"},
        {"record_type_renamed", replaced(h, R"("name": "val")", R"("name": "valid")"),
         R"(record type 2 is "valid" (type 2) in the log, "val" (type 2) in this program)"},
        {"record_type_renumbered", replaced(h, R"("type": 4)", R"("type": 5)"), R"(record type 4 is "note" (type 5) in the log)"},
        {"record_type_added", replaced(h, R"("records": [)", R"("records": [{"type": 9, "name": "x", "fields": []},)"),
         "it lists 5 record types, this program writes 4"},
    };
    for (const auto& c : cases) {
        write_text(path, with_header(bytes, c.header));
        expect_user_error(std::string("append_refuses_header_") + c.name, [&] { runlog_open_append(path, test_info()); },
                          path, c.says, path);
    }

    // The meanings are words for people: a log whose meanings are worded otherwise is appended to.
    std::string reworded = with_header(bytes, replaced(h, "mean cosine similarity", "average cosine similarity"));
    write_text(path, reworded);
    ChildResult r = run_child([&] {
        RunLog log = runlog_open_append(path, test_info());
        runlog_close(log);
    });
    LogFile f = read_log(path);
    report(r.status == 0 && read_text(path).compare(0, reworded.size(), reworded) == 0 && f.records.size() == 4 &&
               f.records[3].type == REC_NOTE,
           "append_accepts_reworded_meanings", strprintf("status %d, %zu records", r.status, f.records.size()) + r.err);
}

static void test_range_crc() {
    // runlog_scan's checksums of arbitrary ranges against crc32_of over the same bytes.
    std::vector<uint8_t> d(5000);
    Rng rng{7};
    for (uint8_t& b : d) b = (uint8_t)rng_next(rng);
    RangeCrc ranges(d);
    int wrong = 0;
    for (int k = 0; k < 2000; k++) {
        size_t a = rng_next(rng) % (d.size() + 1), b = rng_next(rng) % (d.size() + 1);
        if (a > b) std::swap(a, b);
        if (k < 3) a = b = k * RangeCrc::kBlock;  // empty ranges, on a block boundary
        if (ranges.of(a, b) != crc32_of(d.data() + a, b - a)) wrong++;
    }
    report(wrong == 0, "range_crc_equals_crc_of_the_bytes", strprintf("%d of 2000 ranges wrong", wrong));
}

// A log of three steps, then a damaged region of `region` bytes, an intact step record (step 9)
// and a torn tail of 10 bytes: the appender must keep the region and the record after it, remove
// the tail, and take time linear in the region's size.
static void check_scan_of_region(const std::string& name, const std::string& region) {
    std::string path = temp_path("markers.log");
    remove(path.c_str());
    write_three_steps(path);
    FILE* f = open_or_fail(path.c_str(), "ab");
    write_or_fail(f, region.data(), region.size(), path.c_str());
    fclose(f);
    RunLog log;
    log.path = path;
    log.fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    runlog_step(log, 9, 9.0f, 1e-3f, 1.0f, 100.0f, 5.0f);
    runlog_write(log, (const uint8_t*)"\xffREC\x01\x00\x00\x00\x00\x00", 10);
    runlog_close(log);
    size_t before = (size_t)file_size_or_fail(path.c_str());
    double start = now_seconds();
    RunLog appended = runlog_open_append(path, test_info());
    runlog_close(appended);
    double seconds = now_seconds() - start;
    std::string after = read_text(path);
    size_t note = after.rfind("\xffREC");
    int64_t step = -1;
    if (note != std::string::npos && note + 20 <= after.size()) memcpy(&step, &after[note + 12], 8);
    bool ok = note == before - 10 && step == 9 && contains(after.substr(note), "removed a torn tail of 10 bytes");
    report(ok, "append_scans_" + name, strprintf("%.1f MB region, %.2f s", region.size() / 1048576.0, seconds));
    report(seconds < 30, "append_scan_is_fast_" + name, strprintf("%.2f s for %.1f MB (limit 30 s)", seconds, region.size() / 1048576.0));
    remove(path.c_str());
}

static void test_append_false_marker_regions() {
    const size_t region = 4 << 20;
    // The marker over and over: each frames a length past the end of the file.
    std::string markers;
    while (markers.size() < region) markers += "\xffREC";
    check_scan_of_region("4MB_of_markers", markers);
    // False frames, 24 bytes apart, each claiming a payload that reaches the end of the region: a
    // scan that checks each claim by reading it takes time quadratic in the region's size (hours).
    std::string frames(region, '\0');
    for (size_t pos = 0; pos + 24 <= region; pos += 24) {
        uint32_t payload_bytes = (uint32_t)(region - pos - 24);
        memcpy(&frames[pos], "\xffREC\x01\x00\x00\x00", 8);
        memcpy(&frames[pos + 8], &payload_bytes, 4);
    }
    check_scan_of_region("4MB_of_false_frames", frames);
}

static void test_disk_full() {
    // The file size limit makes the disk "full" after 10 step records (44 bytes each) and 13
    // bytes of the 11th.
    std::string path = temp_path("full.log");
    ChildResult r = run_child([&] {
        RunLog log = runlog_create(path, test_info());
        struct rlimit limit;
        limit.rlim_cur = limit.rlim_max = (rlim_t)file_size_or_fail(path.c_str()) + 10 * 44 + 13;
        signal(SIGXFSZ, SIG_IGN);  // so that write(2) fails with EFBIG instead
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0) fail("setrlimit: %s", strerror(errno));
        for (int s = 0;; s++) runlog_step(log, s, (float)s, 1e-3f, 1.0f, 100.0f, 5.0f);
    });
    check_user_error("full_disk_is_one_line_error", r, path, "write failed");
    LogFile f = read_log(path);
    bool intact = f.records.size() == 10 && f.trailing == 13;
    for (size_t i = 0; intact && i < f.records.size(); i++) intact = payload_float(f.records[i], 0) == (float)i;
    report(intact, "full_disk_keeps_written_records",
           strprintf("%zu records, %zu trailing bytes", f.records.size(), f.trailing));
    RunLog log = runlog_open_append(path, test_info());
    runlog_close(log);
    f = read_log(path);
    report(f.records.size() == 11 && f.trailing == 0 && f.records[10].step == 9 &&
               contains(f.records[10].payload, "removed a torn tail of 13 bytes"),
           "full_disk_log_can_be_resumed");
}

static void test_telemetry_size_check() {
    std::string path = temp_path("sizes.log");
    ChildResult r = run_child([&] {
        RunLog log = runlog_create(path, test_info());
        ModelConfig bigger = test_config();
        bigger.n_layer = 4;
        Telemetry t;
        t.resize(bigger);
        runlog_telemetry(log, 0, t, test_config());
    });
    check_user_error("telemetry_of_other_size_is_refused", r, path, "k_norm holds 8 values, the model has 6");
    report(read_log(path).records.empty(), "refused_telemetry_writes_nothing");
}

// Prints kMetrics, in table (= payload) order, as one JSON array of [name, dim] pairs: dim names the
// metric's columns, "kv_head", "q_head" or "dim", as the log writer spells it in the header.
static void print_metrics() {
    std::string out;
    for (const MetricInfo& m : kMetrics)
        out += (out.empty() ? "[" : ", [") + json_string(m.name) + ", " + json_string(metric_dim_name(m.shape)) + "]";
    printf("[%s]\n", out.c_str());
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "write") == 0) {
        RunLog log = runlog_create(argv[2], test_info());
        write_segment(log, 0, 0, 9);
        runlog_close(log);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "append") == 0) {
        RunLog log = runlog_open_append(argv[2], test_info());
        write_segment(log, 1, 6, 11);
        runlog_close(log);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "check-append") == 0) {
        for (int i = 2; i < argc; i++) {
            ChildResult r = run_child([&] {
                RunLog log = runlog_open_append(argv[i], test_info());
                runlog_close(log);
            });
            std::string line = r.err.substr(0, r.err.find('\n'));
            printf("%s\n", r.status == 0 ? "accepted" : ("refused: " + line).c_str());
        }
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--metrics") == 0) {
        print_metrics();
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [write PATH | append PATH | check-append PATH... | --metrics]\n", argv[0]);
        return 1;
    }
    char dir[] = "/tmp/test_runlog.XXXXXX";
    if (!mkdtemp(dir)) fail("cannot create a temporary directory (%s)", strerror(errno));
    g_dir = dir;
    test_create_refuses_existing();
    test_header();
    test_append_removes_torn_tail();
    test_append_keeps_damaged_middle_record();
    test_append_removes_damaged_last_record();
    test_append_clean_log();
    test_append_refusals();
    test_lineage();
    test_append_to_a_log_before_the_variants();
    test_append_refuses_headers_readers_reject();
    test_range_crc();
    test_append_false_marker_regions();
    test_disk_full();
    test_telemetry_size_check();
    for (const char* name : {"existing.log", "header.log", "torn.log", "damaged.log", "last.log", "clean.log", "refusals.log",
                             "headers.log", "full.log", "sizes.log"})
        remove(temp_path(name).c_str());
    rmdir(dir);
    return test_exit_code();
}
