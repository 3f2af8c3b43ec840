// libFuzzer harness of the shard reader (llmc/dataloader.h): check_shard_header and
// check_shard_tokens, then dataloader_init on the shard and a few batches from a sought position.
// Input: ShardFuzzParams (below), then the shard file.
// Seeds: test/fuzz/make_seeds.cpp, shards written by write_shard.
#include "llmc/dataloader.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < sizeof(ShardFuzzParams)) return 0;
    ShardFuzzParams p;
    memcpy(&p, data, sizeof p);
    std::vector<uint8_t> file(data + sizeof p, data + size);
    MemFile f(file);
    const char* path = f.path.c_str();
    expect_accept_or_reject([&] {
        int version;
        long long n = check_shard_header(path, &version);
        // Accepted: the file holds exactly n tokens of the version's width.
        if (kShardHeaderBytes + n * shard_token_bytes(version) != (long long)file.size()) __builtin_trap();
        check_shard_tokens(path, n, version, (int)(p.vocab_size & 0x7FFFFFFF));
    });
    expect_accept_or_reject([&] {
        DataLoader L;
        dataloader_init(&L, path, 1 + p.batch % 4, 1 + p.seq_len % 16, (int)(p.vocab_size & 0x7FFFFFFF), p.shuffle & 1,
                        p.seed);
        dataloader_seek(&L, p.position % (1 << 20));
        for (int b = 0; b < 3; b++) {
            dataloader_next_batch(&L);
            for (int i = 0; i < L.B * L.T; i++)
                if (L.inputs[i] < 0 || L.inputs[i] >= L.vocab_size || L.targets[i] < 0 || L.targets[i] >= L.vocab_size)
                    __builtin_trap();
        }
    });
    return 0;
}
