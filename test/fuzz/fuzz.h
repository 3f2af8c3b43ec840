// What the fuzzing harnesses of test/fuzz share. Each harness is built with clang's libFuzzer,
// AddressSanitizer and UndefinedBehaviorSanitizer and with -DFAIL_THROWS, so that the parsers'
// fail() throws FailError: an input they reject is a normal return, and a crash, a leak, a file
// left open, undefined behaviour, a timeout or an allocation beyond -malloc_limit_mb is a finding.
//
// The parsers read files by name: the harness puts each input into an anonymous in-memory file
// (memfd_create) and hands them its /proc/self/fd path. The checkpoint and run log inputs start
// with a byte of switches that tells the harness which of the file's checksums to set right before
// parsing, so that mutations reach the checks behind them instead of all ending at the first
// checksum mismatch; the shard inputs with the loader's settings (ShardFuzzParams).
#pragma once
#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/config.h"
#include "llmc/utils.h"

// An anonymous in-memory file holding `bytes`, closed when it goes out of scope.
struct MemFile {
    int fd = -1;
    std::string path;
    explicit MemFile(const std::vector<uint8_t>& bytes) {
        fd = memfd_create("fuzz", MFD_CLOEXEC);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        for (size_t done = 0; done < bytes.size();) {
            ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
            if (w <= 0) {
                perror("write");
                abort();
            }
            done += (size_t)w;
        }
        path = "/proc/self/fd/" + std::to_string(fd);
    }
    ~MemFile() { close(fd); }
    MemFile(const MemFile&) = delete;
    MemFile& operator=(const MemFile&) = delete;
};

// The switch byte every input starts with: which checksums to set right first.
enum FuzzSwitches : uint8_t {
    kFixHeaderCrc = 1,   // checkpoint: the header's CRC; run log: the header text's CRC
    kFixPayloadCrc = 2,  // checkpoint: the payload's CRC; run log: every record's, hopping frame to frame
    kPassMoments = 4,    // checkpoint: give checkpoint_read arrays for the AdamW moments
};

// The shard harness's input starts with the loader's settings.
struct ShardFuzzParams {
    uint64_t seed, position;  // the shuffle's seed; the data position dataloader_seek goes to
    uint32_t vocab_size;      // its low 31 bits
    uint8_t batch, seq_len;   // B = 1 + batch % 4, T = 1 + seq_len % 16
    uint8_t shuffle;          // bit 0: shuffle
    uint8_t unused;
};
static_assert(sizeof(ShardFuzzParams) == 24, "ShardFuzzParams is read from 24 input bytes");

// The model of the run log harness: its logs, seeds included, are checked against this one.
inline ModelConfig fuzz_log_config() {
    ModelConfig c;
    apply_preset(c, {"fuzz", "2 layers, 2 query heads sharing a key/value head of 4 dimensions", 2, 2, 1, 4, 16, 8});
    c.vocab_size = 64;
    return c;
}

inline void put_u32(std::vector<uint8_t>& b, size_t offset, uint32_t v) { memcpy(&b[offset], &v, 4); }

inline int lowest_free_descriptor() {
    int fd = dup(2);
    close(fd);
    return fd;
}

// Runs a parser on an input; a rejection (FailError) is an expected outcome. Every file it opens
// must be closed again, when it rejects the input too (LeakSanitizer does not see an open FILE:
// the C library keeps a list of them): the lowest free descriptor is the same after as before.
template <typename Body>
inline void expect_accept_or_reject(Body body) {
    int before = lowest_free_descriptor();
    try {
        body();
    } catch (const FailError&) {
    }
    int after = lowest_free_descriptor();
    if (after != before) {
        fprintf(stderr, "a file was left open: the lowest free descriptor was %d before, %d after\n", before, after);
        __builtin_trap();
    }
}

// Writes one seed input: the switch byte, then the file as the project's writer made it.
inline void write_seed(const std::string& path, uint8_t switches, const std::string& file_path) {
    std::string bytes(1, (char)switches);
    FILE* in = open_or_fail(file_path.c_str(), "rb");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) bytes.append(buf, n);
    fclose(in);
    FILE* out = open_or_fail(path.c_str(), "wb");
    write_or_fail(out, bytes.data(), bytes.size(), path.c_str());
    fclose(out);
    remove(file_path.c_str());
}
