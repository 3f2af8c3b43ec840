// Token shards and the batch loader that feeds training and validation.
//
// A shard is one file: a header of 256 little-endian int32, then the tokens.
//   header[0] = 20240520 (magic), header[1] = version, header[2] = number of tokens, rest zero.
//   version 1: uint16 tokens, exactly llm.c's format, so shards written by llm.c load as they are;
//   version 2: uint32 tokens, for vocabularies larger than 65536.
//
// A batch is B*T+1 consecutive tokens of one shard: inputs are the first B*T, targets the same
// tokens shifted by one. The windows of a shard are the non-overlapping offsets 0, B*T, 2*B*T, ...
// that fit. The loader walks shards and windows either in order or in a seeded random order that
// changes every epoch, forever. Only one shard is held in memory at a time.
#pragma once
#include <algorithm>
#include <cstdint>
#include <glob.h>
#include <string>
#include <vector>

#include "rand.h"
#include "utils.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian and read with memcpy");

constexpr int kShardMagic = 20240520;
constexpr int kShardHeaderInts = 256;
constexpr long long kShardHeaderBytes = kShardHeaderInts * 4;

inline int shard_token_bytes(int version) { return version == 1 ? 2 : 4; }

// ---------------------------------------------------------------------------------------------
// Writing shards. A ShardWriter streams tokens into "<path>.tmp" and renames it to <path> when
// closed, so a crash never leaves a half-written shard under the real name.

struct ShardWriter {
    AtomicFile file;
    int version = 1;
    long long num_tokens = 0;
};

inline void shard_writer_open(ShardWriter* w, const std::string& path, int version) {
    if (version != 1 && version != 2) fail("%s: unknown shard version %d (1 = uint16, 2 = uint32)", path.c_str(), version);
    w->file = atomic_open(path);
    w->version = version;
    w->num_tokens = 0;
    int32_t header[kShardHeaderInts] = {0};  // the real header is written by shard_writer_close
    atomic_write(w->file, header, sizeof header);
}

// Gives up on a shard being written: its temporary file goes, the real name is never touched.
inline void shard_writer_discard(ShardWriter* w) {
    fclose(w->file.f);
    remove(w->file.tmp.c_str());
}

inline void shard_writer_append(ShardWriter* w, const uint32_t* tokens, size_t n) {
    if (w->num_tokens + (long long)n > INT32_MAX) {
        shard_writer_discard(w);
        fail("%s: more than %d tokens do not fit in one shard", w->file.path.c_str(), INT32_MAX);
    }
    if (w->version == 1) {
        std::vector<uint16_t> narrow(n);
        for (size_t i = 0; i < n; i++) {
            if (tokens[i] > 65535) {
                shard_writer_discard(w);
                fail("%s: token id %u does not fit in a version 1 (uint16) shard", w->file.path.c_str(), tokens[i]);
            }
            narrow[i] = (uint16_t)tokens[i];
        }
        atomic_write(w->file, narrow.data(), n * 2);
    } else {
        atomic_write(w->file, tokens, n * 4);
    }
    w->num_tokens += (long long)n;
}

inline void shard_writer_close(ShardWriter* w) {
    int32_t header[kShardHeaderInts] = {0};
    header[0] = kShardMagic;
    header[1] = w->version;
    header[2] = (int32_t)w->num_tokens;
    if (fseek(w->file.f, 0, SEEK_SET) != 0) fail("%s: cannot seek to the header (%s)", w->file.path.c_str(), strerror(errno));
    atomic_write(w->file, header, sizeof header);
    atomic_commit(w->file);
}

// Writes a whole shard at once. version 0 picks the smallest format: uint16 when every id fits.
inline void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version_or_0_for_auto = 0) {
    int version = version_or_0_for_auto;
    if (version == 0) {
        uint32_t max_id = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
        version = max_id < 65536 ? 1 : 2;
    }
    ShardWriter w;
    shard_writer_open(&w, path, version);
    shard_writer_append(&w, tokens.data(), tokens.size());
    shard_writer_close(&w);
}

// ---------------------------------------------------------------------------------------------
// Shuffling with the project's seeded generator (rand.h). std::shuffle differs between standard
// libraries; this gives the same order on every platform.

// Uniform in [0, n): draws past the last whole multiple of n are redrawn, so no value is favoured.
inline uint64_t rng_below(Rng& r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

// One independent stream of numbers per (seed, epoch, stream) triple.
inline Rng rng_for(uint64_t seed, uint64_t epoch, uint64_t stream) {
    Rng r{seed};
    r.state = rng_next(r) ^ epoch;
    r.state = rng_next(r) ^ stream;
    return r;
}

// Fisher-Yates shuffle.
template <typename T>
inline void rng_shuffle(Rng& r, std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[rng_below(r, i)]);
}

// ---------------------------------------------------------------------------------------------
// The loader.

struct DataLoader {
    // settings
    int B = 0, T = 0;
    int vocab_size = 0;
    bool shuffle = false;
    uint64_t seed = 0;

    // the shards, sorted by file name, with what their headers say
    std::vector<std::string> files;
    std::vector<long long> file_tokens;
    std::vector<int> file_versions;
    long long total_tokens = 0;       // tokens in all shards together
    long long batches_per_epoch = 0;  // batches in one pass over every shard
    uint64_t fingerprint = 0;         // of every shard's tokens in order (TokenHash), never 0

    // where the loader is: epoch, position in shard_order, position in windows
    long long epoch = 0;
    size_t shard_pos = 0, window_pos = 0;
    std::vector<int> shard_order;     // shard indices in this epoch's reading order
    std::vector<long long> windows;   // token offsets of the current shard's windows, in reading order

    // the shard in memory
    int loaded_shard = -1;
    std::vector<uint32_t> tokens;

    // the current batch, B*T each
    std::vector<int> inputs, targets;
};

inline long long batch_span(const DataLoader* L) { return (long long)L->B * L->T; }

// Windows of shard s: how many fit.
inline long long shard_windows(const DataLoader* L, int s) { return (L->file_tokens[s] - 1) / batch_span(L); }

// Reads a shard's header and checks it against the file's size; returns the token count.
inline long long check_shard_header(const char* path, int* version) {
    long long size = file_size_or_fail(path);
    if (size < kShardHeaderBytes)
        fail("%s: truncated: %lld bytes, shorter than the %lld-byte shard header", path, size, kShardHeaderBytes);
    int32_t header[kShardHeaderInts];
    {
        ScopedFile f(open_or_fail(path, "rb"));
        read_or_fail(f, header, sizeof header, path, "the shard header");
    }
    if (header[0] != kShardMagic) fail("%s: not a token shard: magic number %d, expected %d", path, header[0], kShardMagic);
    if (header[1] != 1 && header[1] != 2)
        fail("%s: unknown shard version %d (1 = uint16 tokens, 2 = uint32 tokens)", path, header[1]);
    if (header[2] < 0) fail("%s: negative token count %d in the header", path, header[2]);
    long long expected = kShardHeaderBytes + (long long)header[2] * shard_token_bytes(header[1]);
    if (size < expected)
        fail("%s: truncated: the header says %d tokens (%lld bytes) but the file has %lld bytes", path, header[2], expected, size);
    if (size > expected)
        fail("%s: %lld bytes, but the header says %d tokens (%lld bytes): data after the last token", path, size, header[2], expected);
    *version = header[1];
    return header[2];
}

// A fingerprint of a token sequence: four interleaved multiply-xor chains over the ids (four, so
// that the multiplications overlap), folded together at the end. Equal data, equal fingerprint,
// whatever the shard format; other data differs with overwhelming odds. Not a cryptographic hash.
struct TokenHash {
    uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
    long long count = 0;

    template <typename Id>
    void add(const Id* ids, long long n) {
        const uint64_t k = 0x9E3779B97F4A7C15ull;
        long long i = 0;
        for (int q = (int)(count % 4); i < n && q % 4 != 0; i++, q++) lane[q] = (lane[q] ^ ids[i]) * k;
        for (; i + 4 <= n; i += 4)
            for (int q = 0; q < 4; q++) lane[q] = (lane[q] ^ ids[i + q]) * k;
        for (int q = 0; i < n; i++, q++) lane[q] = (lane[q] ^ ids[i]) * k;
        count += n;
    }
    uint64_t value() const {
        uint64_t h = (uint64_t)count * 0xD6E8FEB86659FD93ull;
        for (uint64_t x : lane) h = (h ^ (x >> 29) ^ x) * 0x9E3779B97F4A7C15ull;
        return h ? h : 1;  // 0 means "not recorded"
    }
};

// Reads every token id of a shard and fails at the first that is outside the vocabulary: done
// for every shard before training starts, so that a bad id cannot stop a run hours in. A plain
// running maximum over each chunk (which the compiler vectorises); the position only on failure.
// The ids go into `hash` on the way.
template <typename Id>
inline void scan_token_ids(FILE* f, const char* path, long long n, int vocab_size, TokenHash& hash) {
    const long long chunk_tokens = 1 << 22;
    std::vector<Id> chunk;
    for (long long start = 0; start < n; start += chunk_tokens) {
        long long count = std::min(chunk_tokens, n - start);
        chunk.resize(count);
        read_or_fail(f, chunk.data(), count * sizeof(Id), path, "tokens");
        Id largest = 0;
        for (Id id : chunk) largest = std::max(largest, id);
        hash.add(chunk.data(), count);
        if ((uint64_t)largest < (uint64_t)vocab_size) continue;
        for (long long i = 0; i < count; i++)
            if ((uint64_t)chunk[i] >= (uint64_t)vocab_size)
                fail("%s: token id %u at position %lld is outside the vocabulary (vocab_size %d)", path, (unsigned)chunk[i],
                     start + i, vocab_size);
    }
}

inline void check_shard_tokens(const char* path, long long n, int version, int vocab_size, TokenHash* into = nullptr) {
    TokenHash unused;
    TokenHash& hash = into ? *into : unused;
    ScopedFile f(open_or_fail(path, "rb"));
    if (fseek(f, kShardHeaderBytes, SEEK_SET) != 0) fail("%s: cannot seek past the header (%s)", path, strerror(errno));
    if (version == 1) scan_token_ids<uint16_t>(f, path, n, vocab_size, hash);
    else scan_token_ids<uint32_t>(f, path, n, vocab_size, hash);
}

// Brings shard s into memory, checking every token id against the vocabulary.
inline void load_shard(DataLoader* L, int s) {
    if (L->loaded_shard == s) return;
    const char* path = L->files[s].c_str();
    long long n = L->file_tokens[s];
    int width = shard_token_bytes(L->file_versions[s]);
    ScopedFile f(open_or_fail(path, "rb"));
    if (fseek(f, kShardHeaderBytes, SEEK_SET) != 0) fail("%s: cannot seek past the header (%s)", path, strerror(errno));
    L->tokens.resize(n);
    std::vector<uint8_t> chunk;
    const long long chunk_tokens = 1 << 20;  // read in pieces: no second copy of the whole shard
    for (long long start = 0; start < n; start += chunk_tokens) {
        long long count = std::min(chunk_tokens, n - start);
        chunk.resize(count * width);
        read_or_fail(f, chunk.data(), chunk.size(), path, "tokens");
        for (long long i = 0; i < count; i++) {
            uint32_t id;
            if (width == 2) {
                uint16_t narrow;
                memcpy(&narrow, &chunk[i * 2], 2);
                id = narrow;
            } else {
                memcpy(&id, &chunk[i * 4], 4);
            }
            if (id >= (uint32_t)L->vocab_size)
                fail("%s: token id %u at position %lld is outside the vocabulary (vocab_size %d)", path, id, start + i, L->vocab_size);
            L->tokens[start + i] = id;
        }
    }
    L->loaded_shard = s;
}

// Sets shard_order for the current epoch.
inline void order_shards(DataLoader* L) {
    L->shard_order.resize(L->files.size());
    for (size_t i = 0; i < L->files.size(); i++) L->shard_order[i] = (int)i;
    if (L->shuffle) {
        Rng r = rng_for(L->seed, L->epoch, 0);
        rng_shuffle(r, L->shard_order);
    }
}

// Sets windows to the windows of the shard at shard_pos, in reading order.
inline void plan_windows(DataLoader* L) {
    int s = L->shard_order[L->shard_pos];
    std::vector<long long> all(shard_windows(L, s));
    for (size_t i = 0; i < all.size(); i++) all[i] = (long long)i * batch_span(L);
    if (L->shuffle) {
        Rng r = rng_for(L->seed, L->epoch, 1 + (uint64_t)s);
        rng_shuffle(r, all);
    }
    L->windows = std::move(all);
    L->window_pos = 0;
}

// Back to the first batch of the first epoch: the same batches as right after dataloader_init.
inline void dataloader_reset(DataLoader* L) {
    L->epoch = 0;
    L->shard_pos = 0;
    order_shards(L);
    plan_windows(L);
}

// Finds the shards matching `pattern` (a glob such as "data/brown/train_*.bin") and checks every
// header and every token id now, so that a bad file stops the program before any training starts.
inline void dataloader_init(DataLoader* L, const char* pattern, int B, int T, int vocab_size, bool shuffle,
                            uint64_t seed) {
    if (B < 1 || T < 1) fail("%s: batch size B=%d and sequence length T=%d must be at least 1", pattern, B, T);
    if (vocab_size < 1) fail("%s: vocab_size %d must be at least 1", pattern, vocab_size);
    *L = DataLoader();
    L->B = B;
    L->T = T;
    L->vocab_size = vocab_size;
    L->shuffle = shuffle;
    L->seed = seed;

    glob_t g;
    int rc = glob(pattern, 0, nullptr, &g);
    if (rc == GLOB_NOMATCH) fail("%s: no shard matches", pattern);
    if (rc != 0) fail("%s: cannot list the matching files", pattern);
    for (size_t i = 0; i < g.gl_pathc; i++) L->files.push_back(g.gl_pathv[i]);
    globfree(&g);
    std::sort(L->files.begin(), L->files.end());  // byte order, whatever the locale

    TokenHash hash;
    for (const std::string& path : L->files) {
        int version;
        long long n = check_shard_header(path.c_str(), &version);
        if (n < batch_span(L) + 1)
            fail("%s: %lld tokens, too few for one batch of B*T+1 = %lld tokens (B=%d, T=%d)", path.c_str(), n,
                 batch_span(L) + 1, B, T);
        uint32_t boundary = 0xFFFFFFFFu;  // where a shard ends is part of the data
        hash.add(&boundary, 1);
        check_shard_tokens(path.c_str(), n, version, vocab_size, &hash);
        L->file_tokens.push_back(n);
        L->file_versions.push_back(version);
        L->total_tokens += n;
    }
    for (size_t s = 0; s < L->files.size(); s++) L->batches_per_epoch += shard_windows(L, (int)s);
    L->fingerprint = hash.value();

    L->inputs.resize(batch_span(L));
    L->targets.resize(batch_span(L));
    dataloader_reset(L);
}

// Fills inputs and targets with the next batch, moving on to the next shard and epoch as needed.
inline void dataloader_next_batch(DataLoader* L) {
    while (L->window_pos >= L->windows.size()) {  // this shard is done
        if (++L->shard_pos >= L->shard_order.size()) {
            L->epoch++;
            L->shard_pos = 0;
            order_shards(L);
        }
        plan_windows(L);
    }
    load_shard(L, L->shard_order[L->shard_pos]);
    const uint32_t* window = L->tokens.data() + L->windows[L->window_pos++];
    for (long long i = 0; i < batch_span(L); i++) {
        L->inputs[i] = (int)window[i];
        L->targets[i] = (int)window[i + 1];
    }
}

// Moves the loader to where `position` calls of dataloader_next_batch from the start would leave
// it, in time independent of the position (a resumed run continues the data where it stopped).
inline void dataloader_seek(DataLoader* L, long long position) {
    if (position < 0) fail("internal: data position %lld is negative", position);
    L->epoch = position / L->batches_per_epoch;
    long long left = position % L->batches_per_epoch;
    order_shards(L);
    L->shard_pos = 0;
    while (left >= shard_windows(L, L->shard_order[L->shard_pos])) left -= shard_windows(L, L->shard_order[L->shard_pos++]);
    plan_windows(L);
    L->window_pos = (size_t)left;
}

inline void dataloader_free(DataLoader* L) { *L = DataLoader(); }
