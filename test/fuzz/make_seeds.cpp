// Writes the seed corpora of the fuzzing harnesses, each file made by the project's own writers:
//   make_seeds DIR    DIR/checkpoint/*  checkpoint_write: with and without the AdamW moments,
//                                       with and without a recorded data order and schedule
//                     DIR/shard/*       write_shard: uint16 and uint32 tokens, shuffled or not
//                     DIR/runlog/*      runlog_create and every record writer: a whole log, one
//                                       with a torn tail, one with a damaged record, a resumed one,
//                                       a header alone
// Every seed is accepted by its parser. Built and run by `make fuzz` and `make test`.
#include <sys/stat.h>
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/runlog_append.h"
#include "fuzz.h"

static std::string g_dir;

static std::string scratch() { return g_dir + "/scratch.tmpfile"; }

static void make_dir(const std::string& path) {
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) fail("%s: cannot create (%s)", path.c_str(), strerror(errno));
}

static void checkpoint_seeds() {
    ModelConfig tiny;
    apply_preset(tiny, {"tiny", "the smallest model: 36 parameters", 1, 1, 1, 2, 1, 4});
    tiny.vocab_size = 2;
    for (int variant = 0; variant < 8; variant++) {
        ModelConfig c = tiny;
        if (variant & 4) {  // the fields of pretrained models: untied, a d_model apart, RoPE scaling
            c.tied_embeddings = 0;
            c.d_model = 3;
            c.rope_factor = 8.0f, c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_original_max_pos = 2;
        }
        size_t P = num_parameters(c);
        std::vector<float> params(P), m(P), v(P);
        for (size_t i = 0; i < P; i++) {
            params[i] = 0.25f * (float)i - 3;
            m[i] = 1e-3f * (float)i;
            v[i] = 1e-6f * (float)(i + 1);
        }
        CheckpointInfo info;
        info.config = c;
        info.step = 6;
        info.has_optimizer_state = variant & 1;
        if (variant & 2) {  // a recorded data order and schedule
            info.data_order = {2, 4, 16, 1, 1337};
            info.data_position = info.step * 2;
            info.schedule = {3e-3f, 3e-4f, 0.1f, 1.0f, 0.9f, 0.95f, 2, 10, 2};
        }
        checkpoint_write(scratch(), info, params.data(), m.data(), v.data());
        checkpoint_read_header(scratch());
        write_seed(strprintf("%s/checkpoint/seed%d", g_dir.c_str(), variant),
                   kFixHeaderCrc | kFixPayloadCrc | (variant & 1 ? kPassMoments : 0), scratch());
    }
}

static void shard_seeds() {
    for (int variant = 0; variant < 4; variant++) {
        std::vector<uint32_t> tokens(40 + 17 * variant);
        for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint32_t)(i * 7 % 50) + (variant & 1 ? 70000 : 0);
        write_shard(scratch(), tokens);  // version 1 (uint16) or, with ids above 65535, 2 (uint32)
        int version;
        check_shard_tokens(scratch().c_str(), check_shard_header(scratch().c_str(), &version), version,
                           variant & 1 ? 70050 : 50);
        ShardFuzzParams p = {};
        p.seed = 42;
        p.position = (uint64_t)variant * 3;
        p.vocab_size = variant & 1 ? 70050 : 50;
        p.batch = (uint8_t)variant;
        p.seq_len = (uint8_t)(3 + variant);
        p.shuffle = (uint8_t)(variant >> 1 & 1);
        std::string bytes((const char*)&p, sizeof p);
        FILE* in = open_or_fail(scratch().c_str(), "rb");
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) bytes.append(buf, n);
        fclose(in);
        remove(scratch().c_str());
        std::string path = strprintf("%s/shard/seed%d", g_dir.c_str(), variant);
        FILE* out = open_or_fail(path.c_str(), "wb");
        write_or_fail(out, bytes.data(), bytes.size(), path.c_str());
        fclose(out);
    }
}

static void runlog_seeds() {
    ModelConfig c = fuzz_log_config();
    RunInfo info;
    info.config = c;
    info.options = {{"train", "data/train_*.bin"}, {"steps", "8"}, {"comment", "quote \" backslash \\ tab\t\xff"}};
    info.seed = 1337;
    info.backend = "cpu";
    info.device = "fuzz";
    info.run_id = 0x0123456789abcdefull;  // the ids a resume reads back (runlog_lineage)
    info.continuation = 1;
    Telemetry t;
    t.resize(c);
    for (int m = 0; m < M_NUM_METRICS; m++)
        for (size_t i = 0; i < t.values[m].size(); i++) t.values[m][i] = 0.5f * m + (float)i;
    // A whole log: notes, steps, validation, telemetry.
    auto write_log = [&](int steps) {
        RunLog log = runlog_create(scratch(), info);
        runlog_note(log, 0, "a note: ünïcode ✓");
        for (int s = 0; s < steps; s++) {
            runlog_step(log, s, 8.0f - s, 1e-3f, 1.5f, 1000.0f, 20.0f);
            if (s % 2 == 0) runlog_telemetry(log, s, t, c);
            if (s % 3 == 0) runlog_val(log, s, 7.5f - s);
        }
        runlog_close(log);
    };
    auto bytes_of = [&] {
        std::string b;
        FILE* in = open_or_fail(scratch().c_str(), "rb");
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) b.append(buf, n);
        fclose(in);
        return b;
    };
    // Each log as it is; the harness sets the checksums of the header, and of the records unless
    // the seed is about a damaged one.
    auto put = [&](const std::string& name, const std::string& bytes, uint8_t switches = kFixHeaderCrc | kFixPayloadCrc) {
        FILE* out = open_or_fail(scratch().c_str(), "wb");
        write_or_fail(out, bytes.data(), bytes.size(), scratch().c_str());
        fclose(out);
        size_t size;
        RunLog check;
        check.path = scratch();
        check.fd = open(scratch().c_str(), O_RDONLY);
        runlog_check_existing(check, c, &size);
        close(check.fd);
        write_seed(g_dir + "/runlog/" + name, switches, scratch());
    };
    write_log(4);
    std::string whole = bytes_of();
    remove(scratch().c_str());
    put("whole", whole);
    put("torn", whole.substr(0, whole.size() - 9));
    std::string damaged = whole;
    uint32_t header_bytes;
    memcpy(&header_bytes, &whole[12], 4);
    damaged[(kPreambleBytes + header_bytes + whole.size()) / 2] ^= 0x20;  // in a record
    put("damaged", damaged, kFixHeaderCrc);
    RunLog header_only = runlog_create(scratch(), info);
    runlog_close(header_only);
    std::string header = bytes_of();
    remove(scratch().c_str());
    put("header", header);
    write_log(3);
    info.continuation = 2;
    info.resumed_from = 1;
    info.resumed_from_step = 2;
    RunLog resumed = runlog_open_append(scratch(), info, 2, "lr 0.003 -> 0.002");
    runlog_step(resumed, 2, 6.0f, 1e-3f, 1.5f, 1000.0f, 20.0f);
    runlog_close(resumed);
    std::string resumed_bytes = bytes_of();
    remove(scratch().c_str());
    put("resumed", resumed_bytes);
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    g_dir = argv[1];
    try {  // built with -DFAIL_THROWS, as the harnesses are
        for (const char* sub : {"", "/checkpoint", "/shard", "/runlog"}) make_dir(g_dir + sub);
        checkpoint_seeds();
        shard_seeds();
        runlog_seeds();
    } catch (const FailError& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
