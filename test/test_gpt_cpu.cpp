// Parity of the CPU backend with the PyTorch reference (test/reference.py): logits, loss, every
// parameter gradient and every telemetry statistic, at the initial weights and at a trained state
// whose deeper layers' keys are close to low rank; and the losses and final weights of AdamW steps;
// the same for the --qk-norm variants plain and none, for --freeze wk,k_gain, and for two models
// of the shapes of pretrained ones (head_dim 128, an attention width other than d_model): a Qwen3
// with untied embeddings, a Llama with Llama 3 RoPE scaling.
// The reference ran in float64 from the same float32 weights; this backend runs in float32.
//   test_gpt_cpu REFERENCE_DIR   (the files test/reference.py writes)
#include <algorithm>
#include <string>
#include <vector>
#include "../llmc/checkpoint.h"
#include "../llmc/model_cpu.h"
#include "adamw_check.h"
#include "tensorfile.h"
#include "testing.h"

// Element-wise |got - want| <= atol + rtol |want|, with atol a fraction of the tensor's largest
// magnitude, so that elements that are tiny by cancellation do not dominate.
//
// Error model. The reference ran in float64 from the same float32 weights, so the difference is
// this backend's float32 rounding (unit roundoff u = 2^-24 = 6e-8). A sum of K products errs by
// about sqrt(K) u of the sum of its terms' magnitudes (K u at worst); here K <= 320 (vocabulary
// 320, d_model 256, and the 256 tokens a weight gradient sums over), and a gradient comes through
// about twenty such sums (three layers, forward and backward). So:
//   kRtol = 1e-4 (1700 u): an element not small by cancellation errs by some sqrt(K) u per sum on
//     its way, ~1e-6 to 1e-5; a wrong formula (a term missing, a factor off) errs by far more.
//   kAtolFrac = 1e-6 of the tensor's largest magnitude (16 u = sqrt(256) u): an element small by
//     cancellation keeps the absolute error of the large terms it was summed from. The key,
//     query and w2 gradients come closest, at 50% to 60% of it (OpenBLAS Haswell, SkylakeX and
//     Cooperlake kernels alike).
//   A gain's gradient is itself such a sum, one term per token (and head) that largely cancel, so
//     its terms can be far larger than its largest element: its scale is the largest sum of its
//     terms' magnitudes (the reference's grad_terms) where that is the larger.
static const double kRtol = 1e-4, kAtolFrac = 1e-6;
static bool compare(const std::string& name, const float* got, const double* want, size_t n, double rtol = kRtol,
                    double atol_frac = kAtolFrac, double scale = 0.0) {
    double maxabs = scale;
    for (size_t i = 0; i < n; i++) maxabs = std::fmax(maxabs, std::fabs(want[i]));
    return check_close(name, got, want, n, rtol, atol_frac * maxabs);
}

// The statistics are float64 sums over float32 activations, each within ~sqrt(K) u (1e-6) of its
// float64 value, and averages over 256 tokens, which do not add to that: 1e-5 relative, with the
// same kAtolFrac for statistics near zero (k_cos, k_mean_share). A statistic computed carelessly
// (the effective rank from a Gram matrix summed in float32, test_cpu_units) errs by far more; the
// checks use a few percent of this.
static const double kStatRtol = 1e-5;

// Logits, loss, statistics and gradients of one forward and backward pass at the weights of `ckpt`
// against the reference's `dbg`; gradient elements may differ by grad_atol_frac of their tensor's
// scale (its largest magnitude, or for a gain its terms', above) beyond the relative tolerance.
// Leaves the model loaded with those weights.
static void check_state(CpuModel& m, const std::string& label, const std::string& ckpt, const std::string& dbg,
                        double grad_atol_frac, std::vector<int>& tokens, std::vector<int>& targets) {
    auto ref = read_tensorfile(dbg);
    CheckpointInfo info = checkpoint_read_header(ckpt);
    const ModelConfig& c = info.config;
    const NamedTensor& tokens_t = tensor_or_fail(ref, "tokens", dbg);
    int B = (int)tokens_t.shape[0], T = (int)tokens_t.shape[1], N = B * T;
    tokens.resize(N);
    targets.resize(N);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)tokens_t.values[i];
        targets[i] = (int)tensor_or_fail(ref, "targets", dbg).values[i];
    }
    model_init(m, c, B, T);
    m.eot_token = (int)tensor_or_fail(ref, "eot", dbg).values[0];
    checkpoint_read(ckpt, m.params.data(), nullptr, nullptr);

    Telemetry stats;
    model_stats_begin(m);
    float loss = model_forward(m, tokens.data(), targets.data(), B, T, true);
    telemetry_from_sums(stats, model_stats_sums(m), m.stats_layout, c);
    compare(label + "logits", m.acts.logits, tensor_or_fail(ref, "logits", dbg).values.data(), (size_t)N * c.vocab_size);
    double want_loss = tensor_or_fail(ref, "loss", dbg).values[0];
    compare(label + "loss", &loss, &want_loss, 1);
    for (int k = 0; k < M_NUM_METRICS; k++) {
        std::string name = label + "stat " + kMetrics[k].name;
        const NamedTensor& want = tensor_or_fail(ref, std::string("stat.") + kMetrics[k].name, dbg);
        if (want.numel() != stats.values[k].size()) {
            report(false, name, "shape differs from the reference");
            continue;
        }
        compare(name, stats.values[k].data(), want.values.data(), want.numel(), kStatRtol, kAtolFrac);
    }
    model_zero_grad(m);
    model_backward(m, tokens.data(), targets.data(), 1.0f);
    const std::vector<double>& grads = tensor_or_fail(ref, "grads", dbg).values;
    const std::vector<double>& terms = tensor_or_fail(ref, "grad_terms", dbg).values;
    if (grads.size() != m.grads.size() || terms.size() != grads.size())
        fail("%s: gradient count differs from the model's", dbg.c_str());
    for (int kind = 0; kind < P_NUM_KINDS; kind++) {
        int layers = param_layers(c, kind);
        for (int l = 0; l < layers; l++) {
            size_t off = param_offset(c, kind, l), n = param_numel(c, kind);
            double terms_scale = *std::max_element(terms.begin() + off, terms.begin() + off + n);
            compare(label + "grad " + param_name(kind, l), &m.grads[off], &grads[off], n, kRtol, grad_atol_frac,
                    terms_scale);
        }
    }
}

// AdamW steps from the checkpoint's weights on the reference's batch, with its hyperparameters
// and frozen parameter kinds, against the reference's losses, gradient norms and final weights.
static void check_adamw_steps(CpuModel& m, const std::string& label, const std::string& ckpt, const std::string& dbg) {
    std::vector<int> tokens, targets;
    check_state(m, label, ckpt, dbg, kAtolFrac, tokens, targets);
    auto ref = read_tensorfile(dbg);
    const std::vector<double>& hyper = tensor_or_fail(ref, "hyper", dbg).values;
    int steps = (int)hyper[0], warmup = (int)hyper[1], B = m.B, T = m.T;
    float peak = (float)hyper[2], floor = (float)(hyper[2] * hyper[3]), clip = (float)hyper[5];
    model_freeze(m, (uint32_t)tensor_or_fail(ref, "freeze", dbg).values[0]);
    model_decay(m, (uint32_t)tensor_or_fail(ref, "decay", dbg).values[0]);
    AdamWSettings opt;
    opt.weight_decay = (float)hyper[4];
    std::vector<float> losses(steps), norms(steps);
    for (int step = 0; step < steps; step++) {
        losses[step] = model_forward(m, tokens.data(), targets.data(), B, T, false);
        model_zero_grad(m);
        model_backward(m, tokens.data(), targets.data(), 1.0f);
        norms[step] = model_grad_norm(m);
        opt.lr = lr_at_step(step, steps, warmup, peak, floor);
        model_adamw_step(m, opt, step + 1, norms[step], clip);
    }
    // The steps' weights drift from the reference's by ~1e-5 of their movement (below), and a loss
    // or a gradient norm by about as much relative to its own size, at most. The gradient norm of
    // the loss spike at the fourth step of qk-norm none (41, fifteen times the step before) is the
    // most sensitive to the drift, at 3e-5: up to three quarters of kRtol. Leaving out weight
    // decay changes these by ten times kRtol.
    compare(label + "adamw step losses", losses.data(), tensor_or_fail(ref, "step_losses", dbg).values.data(), steps);
    compare(label + "adamw step grad norms", norms.data(), tensor_or_fail(ref, "step_grad_norms", dbg).values.data(), steps);
    std::vector<float> initial(m.params.size());
    checkpoint_read(ckpt, initial.data(), nullptr, nullptr);
    // The final weights, per tensor in norm, within what the gradients' tolerance (kRtol and
    // kAtolFrac, as checked above) allows after AdamW's 1/sqrt(v) gain (adamw_check.h): a few
    // percent of it is used. Leaving out weight decay moves the matrices by four to ten times this
    // bound, a wrong bias correction by hundreds of times.
    check_adamw_final_weights(label, m.cfg, m.frozen, initial.data(), m.params.data(), ref, dbg,
                              {kRtol, kAtolFrac, opt.beta2});
}

// A stats step measures every micro-batch of the step: the statistics of a batch run as B
// micro-batches of one sequence each equal those of the batch run at once (sums of the same
// terms in another order), and a statistic of the first sequence alone differs from them.
static void check_stats_over_micro_batches(CpuModel& m, const std::string& ckpt, const std::string& dbg) {
    auto ref = read_tensorfile(dbg);
    const NamedTensor& tokens_t = tensor_or_fail(ref, "tokens", dbg);
    int B = (int)tokens_t.shape[0], T = (int)tokens_t.shape[1];
    std::vector<int> tokens(tokens_t.values.begin(), tokens_t.values.end());
    ModelConfig c = checkpoint_read_header(ckpt).config;
    model_init(m, c, B, T);
    m.eot_token = (int)tensor_or_fail(ref, "eot", dbg).values[0];
    checkpoint_read(ckpt, m.params.data(), nullptr, nullptr);
    Telemetry whole, micro, first;
    model_stats_begin(m);
    model_forward(m, tokens.data(), nullptr, B, T, true);
    telemetry_from_sums(whole, model_stats_sums(m), m.stats_layout, c);
    model_stats_begin(m);
    for (int b = 0; b < B; b++) {
        model_forward(m, tokens.data() + (size_t)b * T, nullptr, 1, T, true);
        if (b == 0) telemetry_from_sums(first, model_stats_sums(m), m.stats_layout, c);
    }
    telemetry_from_sums(micro, model_stats_sums(m), m.stats_layout, c);
    bool first_differs = false;
    for (int k = 0; k < M_NUM_METRICS; k++) {
        std::vector<double> want(whole.values[k].begin(), whole.values[k].end());
        // The same float64 sums in another order, over float32 activations that BLAS may round
        // otherwise for 64 rows than for 256 (another blocking): a few u of relative error, so 1e-6
        // (16 u), and 1e-7 absolute for the statistics that are near zero (k_cos, k_mean_share).
        check_close(std::string("stats over ") + std::to_string(B) + " micro-batches = over the batch: " + kMetrics[k].name,
                    micro.values[k].data(), want.data(), want.size(), 1e-6, 1e-7);
        first_differs |= kMetrics[k].shape != PER_DIM && first.values[k] != whole.values[k];
    }
    report(first_differs, "stats of the first micro-batch alone differ from those of the whole batch");
}

// The reference's batch holds document starts mid-window, so that attn_doc_start's check above is
// not one of zeros: every head puts some attention on them, and some queries but not all see one.
static void check_batch_has_document_starts(const std::string& dbg) {
    auto ref = read_tensorfile(dbg);
    const std::vector<double>& doc = tensor_or_fail(ref, "stat.attn_doc_start", dbg).values;
    double visible = tensor_or_fail(ref, "stat.doc_start_visible", dbg).values[0];
    bool every_head = !doc.empty();
    for (double v : doc) every_head &= v > 1e-3;
    report(every_head && visible > 0.1 && visible < 0.9, "the reference batch has document starts mid-window",
           strprintf("doc_start_visible %.3f", visible));
}

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: test_gpt_cpu REFERENCE_DIR");
    std::string dir = argv[1];
    CpuModel m;
    std::vector<int> tokens, targets;
    // The trained state's sharper attention (scores up to 9.6 rather than 4.1, logits up to 17
    // rather than 3.2) turns the scores' absolute rounding, ~|s| u, into larger relative errors of
    // the probabilities (exp's condition is |s|), and the smallest gradient elements carry ten
    // times the rounding: 1e-5 of a tensor's scale (a wrong formula errs by far more). The value and
    // w2 gradients come closest, at 6-7% of it in the -O3 build; the sanitizers' -O1 build, whose
    // loops add in one scalar accumulator, not in vector lanes, errs more.
    check_state(m, "trained state: ", dir + "/trained.ckpt", dir + "/debug_trained.bin", 1e-5, tokens, targets);
    check_adamw_steps(m, "", dir + "/model.ckpt", dir + "/debug_state.bin");
    check_adamw_steps(m, "qk-norm plain: ", dir + "/plain.ckpt", dir + "/debug_plain.bin");
    check_adamw_steps(m, "qk-norm none: ", dir + "/none.ckpt", dir + "/debug_none.bin");
    check_adamw_steps(m, "freeze wk,k_gain: ", dir + "/model.ckpt", dir + "/debug_freeze.bin");
    check_adamw_steps(m, "decay all: ", dir + "/model.ckpt", dir + "/debug_decay_all.bin");
    // head_dim 128, attention width 512 against d_model 192, GQA; untied embeddings, or the Llama 3
    // RoPE scaling with qk-norm none.
    check_adamw_steps(m, "qwen3 shape, untied: ", dir + "/qwen3.ckpt", dir + "/debug_qwen3.bin");
    check_adamw_steps(m, "llama3 shape, rope scaling: ", dir + "/llama3.ckpt", dir + "/debug_llama3.bin");
    check_stats_over_micro_batches(m, dir + "/trained.ckpt", dir + "/debug_trained.bin");
    check_batch_has_document_starts(dir + "/debug_trained.bin");
    return test_exit_code();
}
