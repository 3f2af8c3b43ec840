// libFuzzer harness of the checkpoint reader (llmc/checkpoint.h): checkpoint_read_header, then,
// for a header it accepts, checkpoint_read into arrays sized from that header.
// Input: a switch byte (fuzz.h: kFixHeaderCrc, kFixPayloadCrc, kPassMoments), then the file.
// Seeds: test/fuzz/make_seeds.cpp, checkpoints written by checkpoint_write.
#include "llmc/checkpoint.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    uint8_t switches = data[0];
    std::vector<uint8_t> file(data + 1, data + size);
    if (file.size() >= (size_t)kCheckpointHeaderBytes) {  // the payload's CRC lies in the header: first
        if (switches & kFixPayloadCrc)
            put_u32(file, 88, crc32_of(file.data() + kCheckpointHeaderBytes, file.size() - kCheckpointHeaderBytes));
        if (switches & kFixHeaderCrc) put_u32(file, 92, header_crc(file.data()));
    }
    MemFile f(file);
    expect_accept_or_reject([&] {
        CheckpointInfo info = checkpoint_read_header(f.path);
        size_t P = num_parameters(info.config);
        // Accepted: the file holds P floats, and more when it has the moments.
        if ((size_t)kCheckpointHeaderBytes + P * 4 > file.size()) __builtin_trap();
        std::vector<float> params(P), m, v;
        if (switches & kPassMoments) {
            m.resize(P);
            v.resize(P);
        }
        checkpoint_read(f.path, params.data(), m.empty() ? nullptr : m.data(), v.empty() ? nullptr : v.data());
    });
    return 0;
}
