// The checkpoint file: a fixed 256-byte header with the full model configuration, then the
// parameters as float32 in the order of config.h, optionally followed by the AdamW moments.
// Layout (little-endian), documented for other readers in docs/checkpoint_format.md:
//   0  char[8]  magic "ATTNCKPT"       8  u32 version (5)          12 u32 header bytes (256)
//   16 i32 x 8  vocab_size, n_layer, n_head, n_kv_head, head_dim, d_model, d_ff, max_seq_len
//   48 f32 x 2  rope_theta, norm_eps   56 i64 step (optimiser steps taken)
//   64 u32 flags (bit 0: AdamW m and v follow the parameters)   68 u32 dtype (0 = float32)
//   72 i64 number of parameters P       80 i64 data position (training batches consumed)
//   88 u32 CRC-32 of the payload        92 u32 CRC-32 of header bytes [0, 92) and [96, 256)
//   96 i32 x 4  the run's batch, seq_len, total_batch, shuffle    112 i64 the run's seed
//               (what the data order depends on; zero when not recorded)
//   120 f32 x 6, i32 x 3  the run's schedule (TrainingSchedule, zero when not recorded)
//   156 i32 qk_norm (config.h's QkNorm)   160 u32 the run's frozen parameter kinds (config.h)
//   164 u32 zero   168 u64 the run's id   176 u64 the id of the continuation that wrote it (RunLineage)
//   184 u64 x 2  fingerprints of the training and validation data (DataLoader's fingerprint)
//   200 u32 untied embeddings (1: lm_head follows final_norm; 0: tied)
//   204 f32 x 3  rope_factor, rope_low_freq_factor, rope_high_freq_factor   216 i32 rope_original_max_pos
//   220 u32 the parameter kinds whose weight decay differs from the default (--decay: the decayed
//       kinds XOR the matrices)
//   224..255 zero
//   256 payload: params[P] (then m[P], v[P] when flag bit 0)
// Files are written to "<path>.tmp" and renamed, so a crash never leaves a half-written checkpoint
// under the real name.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>
#include "config.h"
#include "utils.h"

static const char kCheckpointMagic[8] = {'A', 'T', 'T', 'N', 'C', 'K', 'P', 'T'};
// Version 2 added qk_norm and the frozen kinds (bytes 156..163), version 3 the run's identity and
// its data's fingerprints (164..199), version 4 untied embeddings and the RoPE scaling (200..219),
// version 5 the decayed kinds (220..223), each stored so that zero is what a file before it meant. A
// reader takes the bytes a file's version did not define as zero, whatever they hold: in a version 1
// file the gain variant with nothing frozen (the model version 1 knew), in a version 1 or 2 file no
// recorded identity or data, before version 4 tied embeddings and no RoPE scaling, before version 5
// weight decay on the matrices.
static const uint32_t kCheckpointVersion = 5;
static const int kCheckpointHeaderBytes = 256;

// The header bytes a version defines; the rest read as zero.
inline size_t checkpoint_defined_bytes(uint32_t version) {
    return version == 1 ? 156 : version == 2 ? 164 : version == 3 ? 200 : version == 4 ? 220 : 224;
}

// The options that fix the order in which the training data is read: a resumed run must use the
// same ones, or its data position means something else.
struct DataOrder {
    int32_t batch = 0, seq_len = 0, total_batch = 0, shuffle = 0;
    int64_t seed = 0;
};

// CRC-32 of the header without its own checksum field (bytes 92..95).
inline uint32_t header_crc(const uint8_t* h) {
    return crc32_update(crc32_of(h, 92), h + 96, kCheckpointHeaderBytes - 96);
}

// The options that shape the rest of a run's training: a resumed run that changes one no longer
// continues the same run (the trainer refuses unless told to). lr == 0: not recorded.
struct TrainingSchedule {
    float lr = 0, lr_floor = 0, weight_decay = 0, clip = 0, beta1 = 0, beta2 = 0;
    int32_t warmup = 0, steps = 0;
    int32_t cpu_threads = 0;  // CPU runs: the threads of all processes (float sums depend on them); 0 on the GPU
    uint32_t frozen = 0;      // parameter kinds held fixed (--freeze, and the gains a variant leaves unused)
    uint32_t decayed = matrix_kinds();  // parameter kinds that take weight decay (--decay)
};

// Which run wrote a checkpoint and on what data: a resumed run checks that the run log it appends
// to is this run's, that the continuation that wrote the checkpoint was not abandoned, and that
// the data is the same. Zero: not recorded (a checkpoint written before version 3, or by a tool).
struct CheckpointOrigin {
    uint64_t run_id = 0, continuation = 0;
    uint64_t train_data = 0, val_data = 0;
};

struct CheckpointInfo {
    ModelConfig config;
    int64_t step = 0;
    int64_t data_position = 0;
    bool has_optimizer_state = false;
    DataOrder data_order;
    TrainingSchedule schedule;
    CheckpointOrigin origin;
};

inline void checkpoint_write(const std::string& path, const CheckpointInfo& info, const float* params,
                             const float* adam_m, const float* adam_v) {
    const ModelConfig& c = info.config;
    int64_t P = (int64_t)num_parameters(c);
    uint8_t h[kCheckpointHeaderBytes] = {0};
    auto put32 = [&](int off, uint32_t v) { memcpy(h + off, &v, 4); };
    auto put64 = [&](int off, int64_t v) { memcpy(h + off, &v, 8); };
    memcpy(h, kCheckpointMagic, 8);
    put32(8, kCheckpointVersion);
    put32(12, kCheckpointHeaderBytes);
    int32_t ints[8] = {c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.d_model, c.d_ff, c.max_seq_len};
    memcpy(h + 16, ints, sizeof ints);
    memcpy(h + 48, &c.rope_theta, 4);
    memcpy(h + 52, &c.norm_eps, 4);
    put64(56, info.step);
    bool opt = info.has_optimizer_state && adam_m && adam_v;
    put32(64, opt ? 1u : 0u);
    put32(68, 0);
    put64(72, P);
    put64(80, info.data_position);
    uint32_t crc = crc32_of(params, P * sizeof(float));
    if (opt) {
        crc = crc32_update(crc, adam_m, P * sizeof(float));
        crc = crc32_update(crc, adam_v, P * sizeof(float));
    }
    put32(88, crc);
    int32_t order[4] = {info.data_order.batch, info.data_order.seq_len, info.data_order.total_batch, info.data_order.shuffle};
    memcpy(h + 96, order, sizeof order);
    put64(112, info.data_order.seed);
    const TrainingSchedule& t = info.schedule;
    float sched[6] = {t.lr, t.lr_floor, t.weight_decay, t.clip, t.beta1, t.beta2};
    int32_t sched_ints[3] = {t.warmup, t.steps, t.cpu_threads};
    memcpy(h + 120, sched, sizeof sched);
    memcpy(h + 144, sched_ints, sizeof sched_ints);
    put32(156, (uint32_t)c.qk_norm);
    put32(160, t.frozen);
    memcpy(h + 168, &info.origin.run_id, 8);
    memcpy(h + 176, &info.origin.continuation, 8);
    memcpy(h + 184, &info.origin.train_data, 8);
    memcpy(h + 192, &info.origin.val_data, 8);
    put32(200, c.tied_embeddings ? 0u : 1u);
    float rope[3] = {c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor};
    memcpy(h + 204, rope, sizeof rope);
    memcpy(h + 216, &c.rope_original_max_pos, 4);
    put32(220, t.decayed ^ matrix_kinds());
    put32(92, header_crc(h));
    AtomicFile f = atomic_open(path);
    atomic_write(f, h, sizeof h);
    atomic_write(f, params, P * sizeof(float));
    if (opt) {
        atomic_write(f, adam_m, P * sizeof(float));
        atomic_write(f, adam_v, P * sizeof(float));
    }
    atomic_commit(f);
}

// Checkpoints hold at most 2^59 parameters: their size in bytes, 256 + 12 P, then fits in an
// int64, and the count of a configuration (sizes up to 2^24 each) is checked against it before
// num_parameters, which wraps around past 2^64, is trusted.
static const uint64_t kCheckpointMaxParameters = 1ull << 59;

inline bool parameter_count_fits(const ModelConfig& c) {
    uint64_t per_layer = layer_numel(c), rest = 0;  // < 2^52 each
    for (int k = 0; k < P_NUM_KINDS; k++)
        if (!param_is_per_layer(k)) rest += param_numel(c, k) * (uint64_t)param_layers(c, k);
    return rest <= kCheckpointMaxParameters && per_layer <= (kCheckpointMaxParameters - rest) / (uint64_t)c.n_layer;
}

// Reads and checks the header only (magic, version, header checksum, a possible configuration,
// file size). Fails with one line naming the file for anything wrong.
inline CheckpointInfo checkpoint_read_header(const std::string& path) {
    uint8_t h[kCheckpointHeaderBytes];
    {
        ScopedFile f(open_or_fail(path.c_str(), "rb"));
        if (fread(h, 1, sizeof h, f) != sizeof h) fail("%s: not a checkpoint (shorter than its 256-byte header)", path.c_str());
    }
    if (memcmp(h, kCheckpointMagic, 8) != 0) fail("%s: not a checkpoint (bad magic)", path.c_str());
    uint32_t version, hbytes, flags, dtype, crc_payload, crc_header;
    memcpy(&version, h + 8, 4);
    memcpy(&hbytes, h + 12, 4);
    if (version == 0 || version > kCheckpointVersion)
        fail("%s: checkpoint format version %u is not one this program reads (1 to %u)", path.c_str(), version, kCheckpointVersion);
    memcpy(&crc_header, h + 92, 4);
    if (hbytes != kCheckpointHeaderBytes || header_crc(h) != crc_header)
        fail("%s: checkpoint header is damaged (checksum mismatch)", path.c_str());
    size_t defined = checkpoint_defined_bytes(version);
    memset(h + defined, 0, kCheckpointHeaderBytes - defined);
    CheckpointInfo info;
    ModelConfig& c = info.config;
    int32_t ints[8];
    memcpy(ints, h + 16, sizeof ints);
    c.vocab_size = ints[0]; c.n_layer = ints[1]; c.n_head = ints[2]; c.n_kv_head = ints[3];
    c.head_dim = ints[4]; c.d_model = ints[5]; c.d_ff = ints[6]; c.max_seq_len = ints[7];
    memcpy(&c.rope_theta, h + 48, 4);
    memcpy(&c.norm_eps, h + 52, 4);
    memcpy(&info.step, h + 56, 8);
    memcpy(&flags, h + 64, 4);
    memcpy(&dtype, h + 68, 4);
    int64_t P;
    memcpy(&P, h + 72, 8);
    memcpy(&info.data_position, h + 80, 8);
    memcpy(&crc_payload, h + 88, 4);
    info.has_optimizer_state = flags & 1u;
    int32_t order[4];
    memcpy(order, h + 96, sizeof order);
    info.data_order.batch = order[0];
    info.data_order.seq_len = order[1];
    info.data_order.total_batch = order[2];
    info.data_order.shuffle = order[3];
    memcpy(&info.data_order.seed, h + 112, 8);
    float sched[6];
    int32_t sched_ints[3];
    memcpy(sched, h + 120, sizeof sched);
    memcpy(sched_ints, h + 144, sizeof sched_ints);
    info.schedule = {sched[0], sched[1], sched[2], sched[3], sched[4], sched[5], sched_ints[0], sched_ints[1], sched_ints[2]};
    uint32_t decay_changed;
    memcpy(&decay_changed, h + 220, 4);
    info.schedule.decayed = decay_changed ^ matrix_kinds();
    memcpy(&c.qk_norm, h + 156, 4);
    memcpy(&info.schedule.frozen, h + 160, 4);
    memcpy(&info.origin.run_id, h + 168, 8);
    memcpy(&info.origin.continuation, h + 176, 8);
    memcpy(&info.origin.train_data, h + 184, 8);
    memcpy(&info.origin.val_data, h + 192, 8);
    uint32_t untied;
    memcpy(&untied, h + 200, 4);
    if (untied > 1) fail("%s: checkpoint's untied-embeddings flag %u is not 0 or 1", path.c_str(), untied);
    c.tied_embeddings = untied ? 0 : 1;
    memcpy(&c.rope_factor, h + 204, 4);
    memcpy(&c.rope_low_freq_factor, h + 208, 4);
    memcpy(&c.rope_high_freq_factor, h + 212, 4);
    memcpy(&c.rope_original_max_pos, h + 216, 4);
    if (info.schedule.frozen & ~kAllParamKinds)
        fail("%s: checkpoint's frozen parameter mask 0x%x names kinds that do not exist", path.c_str(), info.schedule.frozen);
    if (decay_changed & ~kAllParamKinds)
        fail("%s: checkpoint's weight decay mask 0x%x names kinds that do not exist", path.c_str(), decay_changed);
    std::string err = config_error(c);
    if (!err.empty()) fail("%s: checkpoint holds an impossible configuration: %s", path.c_str(), err.c_str());
    if (info.step < 0 || info.step > INT32_MAX) fail("%s: checkpoint step %lld is out of range", path.c_str(), (long long)info.step);
    const DataOrder& o = info.data_order;
    if (o.batch != 0) {  // recorded: it must be an order the trainer could have used
        long long micro = (long long)o.batch * o.seq_len;
        if (o.batch < 1 || o.seq_len < 1 || o.seq_len > c.max_seq_len || o.total_batch < 1 || micro > (1LL << 28) ||
            o.total_batch % micro != 0 || (o.shuffle != 0 && o.shuffle != 1))
            fail("%s: checkpoint's data order is impossible (batch %d, seq_len %d, total_batch %d, shuffle %d)", path.c_str(),
                 o.batch, o.seq_len, o.total_batch, o.shuffle);
        if (info.data_position != info.step * (o.total_batch / micro))
            fail("%s: checkpoint's data position %lld does not match its step %lld (%lld micro-batches a step)", path.c_str(),
                 (long long)info.data_position, (long long)info.step, o.total_batch / micro);
    } else if (info.data_position < 0) {
        fail("%s: checkpoint's data position %lld is negative", path.c_str(), (long long)info.data_position);
    }
    if (dtype != 0) fail("%s: checkpoint dtype %u is not float32", path.c_str(), dtype);
    if (!parameter_count_fits(c))
        fail("%s: checkpoint holds an impossible configuration: more than 2^59 parameters", path.c_str());
    if (P != (int64_t)num_parameters(c)) fail("%s: checkpoint parameter count does not match its configuration", path.c_str());
    long long want = kCheckpointHeaderBytes + (long long)P * 4 * (info.has_optimizer_state ? 3 : 1);
    long long have = file_size_or_fail(path.c_str());
    if (have != want) fail("%s: checkpoint is %s (%lld bytes, expected %lld)", path.c_str(), have < want ? "truncated" : "too long", have, want);
    return info;
}

// The step and origin of a file whose header reads as a checkpoint's (magic, a known version,
// its checksum), without failing: false for anything else.
inline bool checkpoint_peek(const std::string& path, CheckpointInfo* info) {
    uint8_t h[kCheckpointHeaderBytes];
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return false;
    bool whole = fread(h, 1, sizeof h, f) == sizeof h;
    fclose(f);
    uint32_t version, crc;
    memcpy(&version, h + 8, 4);
    memcpy(&crc, h + 92, 4);
    if (!whole || memcmp(h, kCheckpointMagic, 8) != 0 || version == 0 || version > kCheckpointVersion || header_crc(h) != crc)
        return false;
    size_t defined = checkpoint_defined_bytes(version);
    memset(h + defined, 0, kCheckpointHeaderBytes - defined);
    memcpy(&info->step, h + 56, 8);
    memcpy(&info->origin.run_id, h + 168, 8);
    memcpy(&info->origin.continuation, h + 176, 8);
    return true;
}

// Reads `count` floats of the payload into `into`, or, with `into` null, through a small buffer
// (moments that are not wanted: the checksum covers them all the same); returns the CRC so far.
inline uint32_t checkpoint_read_floats(FILE* f, float* into, size_t count, uint32_t crc, const char* path,
                                       const char* what) {
    if (into) {
        read_or_fail(f, into, count * sizeof(float), path, what);
        return crc32_update(crc, into, count * sizeof(float));
    }
    std::vector<float> chunk(std::min(count, (size_t)1 << 20));
    for (size_t done = 0; done < count; done += chunk.size()) {
        size_t n = std::min(chunk.size(), count - done);
        read_or_fail(f, chunk.data(), n * sizeof(float), path, what);
        crc = crc32_update(crc, chunk.data(), n * sizeof(float));
    }
    return crc;
}

// Reads the parameters (and, when present and wanted, the AdamW moments: adam_m and adam_v
// non-null), checking the payload's checksum. The caller has sized the arrays from
// checkpoint_read_header's configuration.
inline CheckpointInfo checkpoint_read(const std::string& path, float* params, float* adam_m, float* adam_v) {
    CheckpointInfo info = checkpoint_read_header(path);
    size_t P = num_parameters(info.config);
    ScopedFile f(open_or_fail(path.c_str(), "rb"));
    uint8_t h[kCheckpointHeaderBytes];
    read_or_fail(f, h, sizeof h, path.c_str(), "the header");
    uint32_t crc_want;
    memcpy(&crc_want, h + 88, 4);
    read_or_fail(f, params, P * sizeof(float), path.c_str(), "the parameters");
    uint32_t crc = crc32_of(params, P * sizeof(float));
    if (info.has_optimizer_state) {
        bool wanted = adam_m && adam_v;
        crc = checkpoint_read_floats(f, wanted ? adam_m : nullptr, P, crc, path.c_str(), "the AdamW first moments");
        crc = checkpoint_read_floats(f, wanted ? adam_v : nullptr, P, crc, path.c_str(), "the AdamW second moments");
    }
    if (crc != crc_want) fail("%s: checkpoint data is damaged (checksum mismatch)", path.c_str());
    return info;
}
