// libFuzzer harness of the Hugging Face checkpoint reader (llmc/safetensors.h, llmc/hf_checkpoint.h):
// a safetensors file's header, then every tensor it accepts read as float32; with a config.json,
// the model configuration it gives, the file's tensors matched to that model's parameters and read
// into a parameter buffer of num_parameters floats.
// Input: u16 L (little-endian), L bytes of config.json (L = 0: the file alone), then the file.
// Seeds: test/fuzz/make_seeds.cpp, tiny Qwen3 and Llama checkpoints.
#include "llmc/hf_checkpoint.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    size_t config_bytes = data[0] | (size_t)data[1] << 8;
    if (2 + config_bytes > size) return 0;
    std::string config((const char*)data + 2, config_bytes);
    std::vector<uint8_t> file(data + 2 + config_bytes, data + size);
    MemFile f(file);
    expect_accept_or_reject([&] {
        std::vector<SafetensorsTensor> tensors = safetensors_read_header(f.path);
        if (config.empty()) {
            for (const SafetensorsTensor& t : tensors) {
                // Accepted: the file holds the tensor's bytes.
                if (t.numel * kSafetensorsDtypeBytes[t.dtype] > file.size()) __builtin_trap();
                std::vector<float> values(t.numel);
                safetensors_read(t, values.data());
            }
            return;
        }
        HfCheckpoint h;
        h.weights = f.path;
        h.config = hf_parse_config(config, "config.json", &h.architecture);
        hf_match_tensors(h, tensors);
        // Accepted: every stored parameter came from 2 bytes or more of the file, and a layer's q
        // and k gains (Llama's, not stored) are fewer than its stored query projection.
        size_t P = num_parameters(h.config);
        if (2 * P > 3 * file.size()) __builtin_trap();
        std::vector<float> params(P);
        hf_read_params(h, params.data());
    });
    return 0;
}
