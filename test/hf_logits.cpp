// The CPU backend's logits for a Hugging Face checkpoint directory, loaded as ./train -e loads it
// (llmc/hf_checkpoint.h), for test/test_hf_import.py to compare with its own implementation:
//   hf_logits DIR B T TOKENS LOGITS [CKPT]
// TOKENS holds B x T int32 token ids; LOGITS receives B x T x vocab_size float32 logits. CKPT, when
// given, receives the imported weights as a checkpoint of ./train (step 0, no AdamW state).
#include <string>
#include <vector>
#include "../llmc/checkpoint.h"
#include "../llmc/hf_checkpoint.h"
#include "../llmc/model_cpu.h"

int main(int argc, char** argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s DIR B T TOKENS LOGITS [CKPT]\n", argv[0]);
        return 2;
    }
    HfCheckpoint h = hf_open(argv[1]);
    const ModelConfig& c = h.config;
    int B = atoi(argv[2]), T = atoi(argv[3]), V = c.vocab_size;
    if (B < 1 || T < 1 || T > c.max_seq_len) fail("B %d and T %d: at least 1, T at most max_seq_len %d", B, T, c.max_seq_len);
    std::vector<int> tokens((size_t)B * T);
    {
        ScopedFile f(open_or_fail(argv[4], "rb"));
        read_or_fail(f, tokens.data(), tokens.size() * sizeof(int), argv[4], "the tokens");
    }
    for (int t : tokens)
        if (t < 0 || t >= V) fail("%s: token %d is outside the vocabulary of %d", argv[4], t, V);
    CpuModel m;
    model_init(m, c, B, T);
    hf_read_params(h, host_state(m).params);
    model_upload(m);
    model_forward(m, tokens.data(), nullptr, B, T, false);
    std::vector<float> logits((size_t)B * T * V);
    for (int row = 0; row < B * T; row++) model_logits_row(m, row, &logits[(size_t)row * V]);
    {
        ScopedFile f(open_or_fail(argv[5], "wb"));
        write_or_fail(f, logits.data(), logits.size() * sizeof(float), argv[5]);
    }
    if (argc == 7) {
        CheckpointInfo info;
        info.config = c;
        checkpoint_write(argv[6], info, host_state(m).params, nullptr, nullptr);
    }
    model_free(m);
    return 0;
}
