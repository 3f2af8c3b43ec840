// Parity of the CUDA backend with the PyTorch reference (test/reference.py), with bf16
// tolerances: |a - b| <= atol + 0.079 |b| per element with a per-tensor atol,
// AdamW losses within 0.05, statistics within 1%, at the initial weights and at the trained state.
// Also checks that two runs give the same bits.
//   test_gpt_cuda REFERENCE_DIR
#define TESTING
#include "../train_gpt.cu"
#include "tensorfile.h"
#include "testing.h"

static const double kBf16Rtol = 0.079;

// atol: a fraction of the tensor's largest magnitude (bf16 keeps ~3 significant digits, and
// sums of many bf16 products land a little further from the float64 answer).
static bool compare_bf16(const std::string& name, const float* got, const double* want, size_t n, double atol_frac) {
    double maxabs = 0;
    for (size_t i = 0; i < n; i++) maxabs = std::fmax(maxabs, std::fabs(want[i]));
    return check_close(name, got, want, n, kBf16Rtol, atol_frac * maxabs);
}

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: test_gpt_cuda REFERENCE_DIR");
    setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear in order with errors on stderr
    std::string name;
    if (!cuda_device_present(&name)) {
        printf("no CUDA device: nothing to test\n");
        return 0;
    }
    printf("device: %s\n", name.c_str());
    std::string dir = argv[1], ckpt = dir + "/model.ckpt", dbg = dir + "/debug_state.bin";
    auto ref = read_tensorfile(dbg);
    CheckpointInfo info = checkpoint_read_header(ckpt);
    const ModelConfig& c = info.config;
    const NamedTensor& tokens_t = tensor_or_fail(ref, "tokens", dbg);
    int B = (int)tokens_t.shape[0], T = (int)tokens_t.shape[1], N = B * T, V = c.vocab_size;
    std::vector<int> tokens(N), targets(N);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)tokens_t.values[i];
        targets[i] = (int)tensor_or_fail(ref, "targets", dbg).values[i];
    }
    size_t P = num_parameters(c);
    GpuModel g;
    model_init(g, c, B, T);
    checkpoint_read(ckpt, host_state(g).params, nullptr, nullptr);  // AdamW state: zeros
    model_upload(g);

    Telemetry stats;
    float loss = model_forward(g, tokens.data(), targets.data(), B, T, &stats);
    model_wait_stats(g);
    std::vector<float> logits((size_t)N * V);
    for (int n = 0; n < N; n++) model_logits_row(g, n, &logits[(size_t)n * V]);
    compare_bf16("cuda logits", logits.data(), tensor_or_fail(ref, "logits", dbg).values.data(), logits.size(), 0.02);
    double want_loss = tensor_or_fail(ref, "loss", dbg).values[0];
    check_close("cuda loss", &loss, &want_loss, 1, 0.0, 0.01);
    for (int k = 0; k < M_NUM_METRICS; k++) {
        const NamedTensor& want = tensor_or_fail(ref, std::string("stat.") + kMetrics[k].name, dbg);
        double maxabs = 0;
        for (double v : want.values) maxabs = std::fmax(maxabs, std::fabs(v));
        check_close(std::string("cuda stat ") + kMetrics[k].name, stats.values[k].data(), want.values.data(), want.numel(),
                    0.01, 1e-3 * maxabs);
    }
    model_zero_grad(g);
    model_backward(g, tokens.data(), targets.data(), 1.0f);
    std::vector<float> grads(P);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(grads.data(), g.grads, P * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<double>& want_grads = tensor_or_fail(ref, "grads", dbg).values;
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        int layers = param_is_per_layer(kind) ? c.n_layer : 1;
        for (int l = 0; l < layers; l++) {
            size_t off = param_offset(c, kind, l);
            compare_bf16("cuda grad " + param_name(kind, l), &grads[off], &want_grads[off], param_numel(c, kind), 0.05);
        }
    }

    // Determinism: the same forward and backward again gives the same bits.
    Telemetry stats2;
    model_forward(g, tokens.data(), targets.data(), B, T, &stats2);
    model_wait_stats(g);
    model_zero_grad(g);
    model_backward(g, tokens.data(), targets.data(), 1.0f);
    std::vector<float> grads2(P);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(grads2.data(), g.grads, P * sizeof(float), cudaMemcpyDeviceToHost));
    bool same = memcmp(grads.data(), grads2.data(), P * sizeof(float)) == 0;
    for (int k = 0; k < M_NUM_METRICS; k++) same &= stats.values[k] == stats2.values[k];
    report(same, "cuda determinism: two runs give identical gradients and statistics");

    // AdamW steps with the reference's hyperparameters.
    const std::vector<double>& hyper = tensor_or_fail(ref, "hyper", dbg).values;
    int steps = (int)hyper[0], warmup = (int)hyper[1];
    float peak = (float)hyper[2], floor = (float)(hyper[2] * hyper[3]), clip = (float)hyper[5];
    AdamWSettings opt;
    opt.weight_decay = (float)hyper[4];
    std::vector<float> losses(steps);
    for (int step = 0; step < steps; step++) {
        losses[step] = model_forward(g, tokens.data(), targets.data(), B, T, nullptr);
        model_zero_grad(g);
        model_backward(g, tokens.data(), targets.data(), 1.0f);
        float norm = model_grad_norm(g);
        opt.lr = lr_at_step(step, steps, warmup, peak, floor);
        model_adamw_step(g, opt, step + 1, norm, clip);
    }
    check_close("cuda adamw step losses (within 0.05)", losses.data(), tensor_or_fail(ref, "step_losses", dbg).values.data(),
                steps, 0.0, 0.05);
    model_free(g);

    // The trained state, whose deeper layers' keys are close to low rank: the forward pass and
    // every statistic (taken from float32 keys, the Gram matrices summed in float64).
    std::string trained_ckpt = dir + "/trained.ckpt", trained_dbg = dir + "/debug_trained.bin";
    auto trained = read_tensorfile(trained_dbg);
    GpuModel t;
    model_init(t, c, B, T);
    checkpoint_read(trained_ckpt, host_state(t).params, nullptr, nullptr);
    model_upload(t);
    Telemetry trained_stats;
    float trained_loss = model_forward(t, tokens.data(), targets.data(), B, T, &trained_stats);
    model_wait_stats(t);
    for (int n = 0; n < N; n++) model_logits_row(t, n, &logits[(size_t)n * V]);
    compare_bf16("cuda trained state: logits", logits.data(), tensor_or_fail(trained, "logits", trained_dbg).values.data(),
                 logits.size(), 0.02);
    double want_trained_loss = tensor_or_fail(trained, "loss", trained_dbg).values[0];
    check_close("cuda trained state: loss", &trained_loss, &want_trained_loss, 1, 0.0, 0.01);
    for (int k = 0; k < M_NUM_METRICS; k++) {
        const NamedTensor& want = tensor_or_fail(trained, std::string("stat.") + kMetrics[k].name, trained_dbg);
        double maxabs = 0;
        for (double v : want.values) maxabs = std::fmax(maxabs, std::fabs(v));
        check_close(std::string("cuda trained state: stat ") + kMetrics[k].name, trained_stats.values[k].data(),
                    want.values.data(), want.numel(), 0.01, 1e-3 * maxabs);
    }
    model_free(t);
    return test_exit_code();
}
