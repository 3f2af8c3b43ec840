// Parity of the CUDA backend with the PyTorch reference (test/reference.py), with bf16
// tolerances: |a - b| <= atol + 0.079 |b| per element with a per-tensor atol, AdamW losses within
// 0.05 and final weights per tensor in norm, statistics within 1%, at the initial weights and at
// the trained state whose deeper layers' keys are close to low rank; the --qk-norm variants and
// frozen parameters; two models of the shapes of pretrained Qwen3 and Llama (head_dim 128, an
// attention width other than d_model, untied embeddings, Llama 3 RoPE scaling). Also checks that
// two runs give the same bits, that gradients accumulated over micro-batches are the batch's, and
// that passes replayed from CUDA graphs give the bits of the passes run directly.
//   test_gpt_cuda REFERENCE_DIR
#define TESTING
#include "../train_gpt.cu"
#include "adamw_check.h"
#include "tensorfile.h"
#include "testing.h"

// Error model. The matrix products read bf16 operands (8 significant bits: unit roundoff
// u = 2^-8 = 3.9e-3) and add in float32. A product of K terms of rounded operands errs by about
// sqrt(K) u of the sum of its terms' magnitudes: sqrt(320) u = 0.07 for the longest sums here
// (vocabulary 320, d_model 256, 256 tokens). So rtol 0.079 (20 u): an element that is not small by
// cancellation is within one such sum's error; a wrong formula (a term missing, a factor off)
// errs by more than that. The per-tensor atol, a fraction of the tensor's largest magnitude,
// covers the elements small by cancellation, which keep the absolute error of the large terms.
static const double kBf16Rtol = 0.079;
static const double kGradAtolFrac = 0.05;  // gradients come through ~20 such sums: a few times the logits' 0.02

// atol: atol_frac of the tensor's largest magnitude (see above).
static bool compare_bf16(const std::string& name, const float* got, const double* want, size_t n, double atol_frac,
                         double rtol = kBf16Rtol) {
    double maxabs = 0;
    for (size_t i = 0; i < n; i++) maxabs = std::fmax(maxabs, std::fabs(want[i]));
    return check_close(name, got, want, n, rtol, atol_frac * maxabs);
}

// A forward pass with statistics, finished on the host: the loss.
static float forward_with_stats(GpuModel& g, const int* tokens, const int* targets, int B, int T, Telemetry& stats) {
    model_stats_begin(g);
    float loss = model_forward(g, tokens, targets, B, T, true);
    telemetry_from_sums(stats, model_stats_sums(g), g.stats_layout, g.cfg);
    return loss;
}

// Loads the weights of `ckpt` (AdamW state zero), runs the forward pass with statistics and
// compares the logits, the loss and every statistic with the reference's `dbg`.
static void check_forward(GpuModel& g, const std::string& label, const std::string& ckpt, const std::string& dbg,
                          const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T,
                          Telemetry& stats) {
    auto ref = read_tensorfile(dbg);
    HostState h = host_state(g);
    checkpoint_read(ckpt, h.params, nullptr, nullptr);
    std::fill(h.adam_m, h.adam_m + g.P, 0.0f);
    std::fill(h.adam_v, h.adam_v + g.P, 0.0f);
    model_upload(g);
    float loss = forward_with_stats(g, tokens.data(), targets.data(), B, T, stats);
    int N = B * T, V = g.cfg.vocab_size;
    std::vector<float> logits((size_t)N * V);
    for (int n = 0; n < N; n++) model_logits_row(g, n, &logits[(size_t)n * V]);
    // A logit is one sum over d_model = 256 after three layers: its small elements within 2% of
    // the largest logit (about 5 u).
    compare_bf16(label + "logits", logits.data(), tensor_or_fail(ref, "logits", dbg).values.data(), logits.size(), 0.02);
    double want_loss = tensor_or_fail(ref, "loss", dbg).values[0];
    // The loss averages 256 tokens' log-softmax, computed in float32 from the logits: their
    // independent errors of ~u |z| (|z| <= 17) average down to ~u |z| / 16, under 0.005; 0.01 is
    // twice that, and a loss that is not the mean (a sum, a token off) is off by far more.
    check_close(label + "loss", &loss, &want_loss, 1, 0.0, 0.01);
    // A statistic is a float64 average over 256 tokens of quantities each within ~u (0.4%) of
    // their float64 values, from bf16 activations: within 1% relative, with 1e-3 of the metric's
    // largest value for values near zero (k_cos, k_mean_share). But bf16 weights and stored
    // activations also move the model itself, and near a low-rank state that moves the effective
    // ranks far more: the reference's bf16.stat.* are the statistics with that rounding emulated
    // (model_torch.forward's store), which at the trained state moved k_erank 6% and
    // k_erank_centered 20%, every other statistic under 0.5%. So each statistic may also differ by
    // the largest relative change the emulated rounding made to it.
    for (int k = 0; k < M_NUM_METRICS; k++) {
        const NamedTensor& want = tensor_or_fail(ref, std::string("stat.") + kMetrics[k].name, dbg);
        const NamedTensor& emulated = tensor_or_fail(ref, std::string("bf16.stat.") + kMetrics[k].name, dbg);
        double maxabs = 0, moved = 0;
        for (double v : want.values) maxabs = std::fmax(maxabs, std::fabs(v));
        for (size_t i = 0; i < want.values.size(); i++)
            moved = std::fmax(moved, std::fabs(emulated.values[i] - want.values[i]) / (std::fabs(want.values[i]) + 1e-3 * maxabs));
        check_close(label + "stat " + kMetrics[k].name, stats.values[k].data(), want.values.data(), want.numel(),
                    0.01 + moved, 1e-3 * maxabs);
    }
}

// One forward and backward pass on the loaded weights: the gradients, on the host. The gain
// gradients' partial rows (GpuModel::dgain_partial, each norm's in a part of its own until the
// column sums at the end of the pass) are filled with NaN first, so that a sum that reads a part
// before its norm wrote it gives a NaN gradient, and the comparison with the reference fails; one
// that reads another norm's part gives that norm's values, which fails it too.
static std::vector<float> backward_gradients(GpuModel& g, const std::vector<int>& tokens, const std::vector<int>& targets,
                                             int B, int T) {
    model_forward(g, tokens.data(), targets.data(), B, T, false);
    model_zero_grad(g);
    cudaCheck(cudaMemsetAsync(g.dgain_partial, 0xff, g.dgain_partial_floats * sizeof(float), g.stream));
    model_backward(g, tokens.data(), targets.data(), 1.0f);
    std::vector<float> grads(g.P);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(grads.data(), g.grads, g.P * sizeof(float), cudaMemcpyDeviceToHost));
    return grads;
}

// Every tensor's gradient against the reference's, with bf16 tolerances.
static void compare_gradients(GpuModel& g, const std::string& label, const std::vector<float>& grads, const std::string& dbg) {
    auto ref = read_tensorfile(dbg);
    const std::vector<double>& want = tensor_or_fail(ref, "grads", dbg).values;
    if (want.size() != grads.size()) fail("%s: gradient count differs from the model's", dbg.c_str());
    const ModelConfig& c = g.cfg;
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        for (int l = 0; l < param_layers(c, kind); l++) {
            size_t off = param_offset(c, kind, l);
            compare_bf16(label + "grad " + param_name(kind, l), &grads[off], &want[off], param_numel(c, kind), kGradAtolFrac);
        }
}

// AdamW steps from the loaded weights with the reference's hyperparameters: the losses, and the
// final weights per tensor in norm.
static void check_adamw_steps(GpuModel& g, const std::string& label, const std::string& dbg, const std::vector<int>& tokens,
                              const std::vector<int>& targets, int B, int T) {
    auto ref = read_tensorfile(dbg);
    const std::vector<double>& hyper = tensor_or_fail(ref, "hyper", dbg).values;
    int steps = (int)hyper[0], warmup = (int)hyper[1];
    float peak = (float)hyper[2], floor = (float)(hyper[2] * hyper[3]), clip = (float)hyper[5];
    AdamWSettings opt;
    opt.weight_decay = (float)hyper[4];
    model_decay(g, (uint32_t)tensor_or_fail(ref, "decay", dbg).values[0]);
    model_download(g);
    std::vector<float> initial(g.host_params);
    std::vector<float> losses(steps), norms(steps);
    for (int step = 0; step < steps; step++) {
        losses[step] = model_forward(g, tokens.data(), targets.data(), B, T, false);
        model_zero_grad(g);
        model_backward(g, tokens.data(), targets.data(), 1.0f);
        norms[step] = model_grad_norm(g);
        opt.lr = lr_at_step(step, steps, warmup, peak, floor);
        model_adamw_step(g, opt, step + 1, norms[step], clip);
    }
    // The first step's gradient norm (before clipping), of the loaded weights: gradients each within
    // kBf16Rtol of the reference's have a norm within kBf16Rtol of its. (Later steps' weights have
    // moved apart a little, as the losses below have.)
    check_close(label + "adamw first step's gradient norm", norms.data(),
                tensor_or_fail(ref, "step_grad_norms", dbg).values.data(), 1, kBf16Rtol, 0.0);
    // The losses fall from 5.9 to 1.9 over the steps; bf16 gradients (within kBf16Rtol) steer the
    // weights a little otherwise, and the losses, whose own bf16 error is ~0.005 (above), move
    // apart by a few hundredths at most. Steps of the wrong size (a bias correction wrong) change
    // the losses by more than 1 (2.1 to 2.3 on the CPU, where test_gpt_cpu tried it).
    check_close(label + "adamw step losses (within 0.05)", losses.data(), tensor_or_fail(ref, "step_losses", dbg).values.data(),
                steps, 0.0, 0.05);
    // The final weights: the bound that the gradients' tolerance (kBf16Rtol, kGradAtolFrac) allows
    // after AdamW's 1/sqrt(v) gain (adamw_check.h). With bf16 gradients it is 0.7 to 4 times the
    // weights' movement (a gradient within 0.05 of its tensor's largest may have either sign), so
    // it catches steps of the wrong sign or a learning rate off by a factor, not a weight decay
    // (0.2% to 0.6% of the movement) or a bias correction: the update is math.h's adamw_update,
    // which test_gpt_cpu checks at float32 precision, and dev/cuda/optimizer.cu checks the CUDA
    // step, bias corrections included, against the CPU's.
    model_download(g);
    check_adamw_final_weights(label, g.cfg, g.frozen, initial.data(), g.host_params.data(), ref, dbg,
                              {kBf16Rtol, kGradAtolFrac, opt.beta2});
}

// The statistics beside the layers (StatsBeside, train_gpt.cu) are those taken between them, bit for
// bit. First a pass on other tokens (the batch shifted by one), so that a
// read of a buffer the pass before left would show; then every buffer of the float32 queries and
// keys and of the rows' statistics set to NaN, so that a read before its write would too.
static void check_stats_beside(GpuModel& g, const std::string& label, const std::vector<int>& tokens,
                               const std::vector<int>& targets, int B, int T) {
    std::vector<int> shifted(tokens.size());
    for (size_t i = 0; i < tokens.size(); i++) shifted[i] = tokens[(i + 1) % tokens.size()];
    Telemetry other, beside, between;
    forward_with_stats(g, shifted.data(), targets.data(), B, T, other);
    const ModelConfig& c = g.cfg;
    size_t N = (size_t)B * T, keys = N * (c.n_head + c.n_kv_head) * c.head_dim, rows = ATTN_NUM_ROW_STATS * N * c.n_head;
    for (float* p : {g.acts.qk_normed, g.beside.qk_normed}) cudaCheck(cudaMemsetAsync(p, 0xff, keys * sizeof(float), g.stream));
    for (float* p : {g.acts.row_stats, g.beside.row_stats}) cudaCheck(cudaMemsetAsync(p, 0xff, rows * sizeof(float), g.stream));
    if (g.beside.layer_qk_normed) {  // the candidate stats_deferred's, every layer's
        cudaCheck(cudaMemsetAsync(g.beside.layer_qk_normed, 0xff, c.n_layer * keys * sizeof(float), g.stream));
        cudaCheck(cudaMemsetAsync(g.beside.layer_row_stats, 0xff, c.n_layer * rows * sizeof(float), g.stream));
    }
    forward_with_stats(g, tokens.data(), targets.data(), B, T, beside);
    g.beside.on = false;
    forward_with_stats(g, tokens.data(), targets.data(), B, T, between);
    g.beside.on = true;
    bool same = true;
    for (int k = 0; k < M_NUM_METRICS; k++) same &= beside.values[k] == between.values[k];
    report(same, label + "statistics beside the layers' forward pass are those taken between them, bit for bit");
}

// The candidate build's QK-norm + RoPE forward with four items a group loaded ahead (qk_forward_ahead)
// and, on a stats step, the queries' norms in place of their float32 vectors (query_norms) and the
// keys' left unwritten for the Gram products to compute from their projections
// (gram_from_projection, where gram_dmma and gram_key_records apply), against ./train's kernel and
// vectors: the same loss and statistics, bit for bit, from a stats pass with the three candidates
// and one with none. Where the shape takes them (head_dim 64 or 128), the candidates' pass must have
// left a query's float32 row unwritten but for its norm (the buffers set to NaN first): the norms
// were what the statistics read; and where gram_from_projection applies, a key's row unwritten.
static void check_qk_forward_candidates(GpuModel& g, const std::string& label, const std::vector<int>& tokens,
                                        const std::vector<int>& targets, int B, int T) {
    const ModelConfig& c = g.cfg;
    const int NH = c.n_head + c.n_kv_head, D = c.head_dim;
    const size_t vectors = (size_t)B * T * NH * D;
    g.beside.defer = false;  // the float32 vectors in the buffers read below
    auto pass = [&](bool candidates, Telemetry& stats) {
        g.qk_forward_ahead = g.query_norms = g.gram_from_projection = candidates;
        for (float* p : {g.acts.qk_normed, g.beside.qk_normed})
            cudaCheck(cudaMemsetAsync(p, 0xff, vectors * sizeof(float), g.stream));
        return forward_with_stats(g, tokens.data(), targets.data(), B, T, stats);
    };
    Telemetry plain, both;
    const float plain_loss = pass(false, plain), loss = pass(true, both);
    bool same = memcmp(&loss, &plain_loss, sizeof loss) == 0;
    for (int k = 0; k < M_NUM_METRICS; k++) same &= both.values[k] == plain.values[k];
    report(same, label + "QK-norm forward loading ahead, the queries' norms in place of their vectors, the keys from "
                         "their projections: the loss and statistics of ./train's kernel, bit for bit");
    if (D == 64 || D == 128) {  // the float32 vectors of the last layer that used the buffer: its first query's row
        std::vector<float> row(D);
        cudaCheck(cudaStreamSynchronize(g.stream));
        cudaCheck(cudaMemcpy(row.data(), g.acts.qk_normed, D * sizeof(float), cudaMemcpyDeviceToHost));
        bool norm_only = std::isfinite(row[0]) && row[0] > 0.0f;
        for (int i = 1; i < D; i++) norm_only &= std::isnan(row[i]);
        report(norm_only, label + "with the queries' norms, a query's float32 row holds its norm and nothing more");
        bool projection = D == 64 && g.gram_dmma_k && g.gram_key_records;  // where gram_from_projection applies
        for (int l = 0; l < c.n_layer; l++) projection &= aligned_16({gpu_param(g, P_K_GAIN, l)});
        if (projection) {  // the first key head's row
            cudaCheck(cudaMemcpy(row.data(), g.acts.qk_normed + (size_t)c.n_head * D, D * sizeof(float),
                                 cudaMemcpyDeviceToHost));
            bool unwritten = true;
            for (int i = 0; i < D; i++) unwritten &= std::isnan(row[i]);
            report(unwritten, label + "with the keys from their projections, a key's float32 row is not written");
        }
    }
    g.qk_forward_ahead = candidate_on("qk_forward_ahead");
    g.query_norms = candidate_on("query_norms");
    g.gram_from_projection = candidate_on("gram_from_projection");
    g.beside.defer = candidate_on("stats_deferred");
}

// The candidate build's statistics deferred past their forward pass (StatsBeside's stats_deferred),
// on and off: a stats step of two micro-batches (the batch, then the batch shifted by one), each a
// forward pass with statistics and a backward pass, then the sums read, as the training loop does it.
// The same statistics and gradients, bit for bit, with each layer's deferred statistics made slow
// (each waits 20 ms on its stream first: far longer than the passes that follow, so that a missing
// wait would show). The statistics must have been deferred, and the same slow statistics with the
// waits skipped must give other statistics: the comparison catches a missing wait.
static void check_stats_deferred(GpuModel& g, const std::string& label, const std::vector<int>& tokens,
                                 const std::vector<int>& targets, int B, int T) {
    StatsBeside& sb = g.beside;
    std::vector<int> shifted(tokens.size());
    for (size_t i = 0; i < tokens.size(); i++) shifted[i] = tokens[(i + 1) % tokens.size()];
    const std::vector<int>* batches[2] = {&tokens, &shifted};
    bool deferred = false;
    auto step = [&](bool defer, bool skip_waits, std::vector<float>& grads) {
        sb.defer = defer;
        sb.test_delay_us = defer ? 20000 : 0;
        sb.test_skip_waits = skip_waits;
        deferred = false;
        model_zero_grad(g);
        model_stats_begin(g);
        for (const std::vector<int>* x : batches) {
            model_forward(g, x->data(), targets.data(), B, T, true);
            deferred |= sb.pending;
            model_backward(g, x->data(), targets.data(), 0.5f);
        }
        Telemetry stats;
        telemetry_from_sums(stats, model_stats_sums(g), g.stats_layout, g.cfg);
        grads.resize(g.P);
        cudaCheck(cudaMemcpy(grads.data(), g.grads, g.P * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaStreamSynchronize(sb.stream));  // nothing left running into the next check
        return stats;
    };
    auto same_stats = [](const Telemetry& a, const Telemetry& b) {
        bool same = true;
        for (int k = 0; k < M_NUM_METRICS; k++) same &= a.values[k] == b.values[k];
        return same;
    };
    std::vector<float> plain_grads, grads, unwaited_grads;
    const Telemetry plain = step(false, false, plain_grads);
    const bool plain_deferred = deferred;
    const Telemetry later = step(true, false, grads);
    // deferred wherever the rows' statistics come from the lse (the mma kernels take the head width)
    const bool deferrable = attention_row_stats_from_lse_supports(g.cfg.head_dim);
    report(deferred == deferrable && !plain_deferred && same_stats(later, plain) &&
               memcmp(grads.data(), plain_grads.data(), g.P * sizeof(float)) == 0,
           label + "statistics deferred past their forward pass (slowed): the same statistics and gradients, bit for bit",
           deferred == deferrable ? "" : deferred ? "deferred where they must not be" : "the statistics were not deferred");
    if (deferrable) {
        const Telemetry unwaited = step(true, true, unwaited_grads);
        report(!same_stats(unwaited, plain),
               label + "the deferred statistics without their waits (slowed): other statistics, as they must be");
    }
    sb.defer = candidate_on("stats_deferred");
    sb.test_delay_us = 0;
    sb.test_skip_waits = false;
}

// The candidate build's weight gradients' products beside the backward pass (GradsBeside), on and
// off: the same gradients, bit for bit, from two backward passes added into the gradients (as
// gradient accumulation does), with the streams beside made slow (each product waits 200 us first:
// on these shapes the pass would otherwise finish a product's input before a missing wait could
// matter). The products must have run beside the pass (a backward pass of the shape first, so that
// their algorithms are chosen), and the same slow products with the pass's waits skipped must give
// other gradients: the comparison catches a missing wait.
static void check_grads_beside(GpuModel& g, const std::string& label, const std::vector<int>& tokens,
                               const std::vector<int>& targets, int B, int T) {
    GradsBeside& gb = g.grads_beside;
    auto gradients = [&](bool beside, bool skip_waits = false) {
        gb.on = beside;
        gb.test_delay_us = beside ? 200 : 0;
        gb.test_skip_waits = skip_waits;
        model_zero_grad(g);
        for (int pass = 0; pass < 2; pass++) {
            model_forward(g, tokens.data(), targets.data(), B, T, false);
            model_backward(g, tokens.data(), targets.data(), 0.5f);
        }
        std::vector<float> grads(g.P);
        cudaCheck(cudaStreamSynchronize(g.stream));
        cudaCheck(cudaMemcpy(grads.data(), g.grads, g.P * sizeof(float), cudaMemcpyDeviceToHost));
        return grads;
    };
    const std::vector<float> plain = gradients(false);
    const long long products = gb.products;
    const std::vector<float> grads = gradients(true);
    report(gb.products != products && memcmp(grads.data(), plain.data(), g.P * sizeof(float)) == 0,
           label + "backward passes with the weight products beside the pass: the same gradients, bit for bit",
           gb.products == products ? "no product ran beside the pass" : "");
    const std::vector<float> unwaited = gradients(true, true);
    report(memcmp(unwaited.data(), plain.data(), g.P * sizeof(float)) != 0,
           label + "the weight products beside the pass without its waits (slowed): other gradients, as they must be");
    gb.on = candidate_on("grads_beside");
    gb.test_delay_us = 0;
    gb.test_skip_waits = false;
}

// The candidate adamw_beside (AdamwBeside, train_gpt.cu): four training steps of two micro-batches
// each (the third step's first with statistics), each step's update beside the next step's forward
// pass, give the losses, the gradients' norms, the statistics' sums, the weights and the AdamW state
// of the same steps with the update on the model's stream, bit for bit: with the passes run
// directly, and from CUDA graphs (captured at their second run and replayed after, so that the
// graph's waits on the update queued outside it are exercised; the passes must have been
// captured). Each part's update is slowed by 200 us, so that a forward pass reading a part before
// its update is done, or a backward pass adding into gradients not yet set to 0, would show. The update must have run beside
// the passes, and the same slowed update with the forward pass's waits skipped must give other
// losses: the comparison catches a missing wait. On a model of its own, from the weights of `ckpt`
// with the parameter kinds `freeze` frozen.
static void check_adamw_beside(const std::string& label, const std::string& ckpt, uint32_t freeze,
                               const std::vector<int>& tokens, const std::vector<int>& targets, int B, int T) {
    GpuModel g;
    model_init(g, checkpoint_read_header(ckpt).config, B, T);
    model_freeze(g, freeze);
    AdamwBeside& ab = g.adamw_beside;
    HostState h = host_state(g);
    checkpoint_read(ckpt, h.params, nullptr, nullptr);
    const std::vector<float> params(g.host_params), adam_m(g.host_adam_m), adam_v(g.host_adam_v);
    struct Steps {
        std::vector<float> losses, norms, params, adam_m, adam_v;
        std::vector<double> stat_sums;
    };
    long long beside_updates = 0;
    std::string graphs_problem;  // of the run from graphs: a pass not captured, or a capture refused
    auto train = [&](bool beside, bool graphs, bool skip_waits) {
        g.host_params = params;
        g.host_adam_m = adam_m;
        g.host_adam_v = adam_v;
        model_upload(g);
        ab.on = beside;
        ab.test_delay_us = beside ? 200 : 0;
        ab.test_skip_waits = skip_waits;
        g.graphs.on = graphs;
        AdamWSettings opt;
        opt.lr = 1e-3f;
        opt.weight_decay = 0.1f;
        Steps r;
        auto read_sums = [&] {
            const double* sums = model_stats_sums(g);
            r.stat_sums.assign(sums, sums + g.stats_layout.total);
        };
        for (int step = 0; step < 4; step++) {
            model_zero_grad(g);
            for (int micro = 0; micro < 2; micro++) {
                const bool tm = step == 2 && micro == 0;
                if (tm) model_stats_begin(g);
                r.losses.push_back(model_forward(g, tokens.data(), targets.data(), B, T, tm));
                const bool pending = tm && model_stats_pending(g);  // read after the backward pass, as training does
                if (tm && !pending) read_sums();
                model_backward(g, tokens.data(), targets.data(), 0.5f);
                if (pending) read_sums();
            }
            r.norms.push_back(model_grad_norm(g));
            model_adamw_step(g, opt, step + 1, r.norms.back(), 1.0f);
            beside_updates += ab.pending;
        }
        cudaCheck(cudaDeviceSynchronize());  // with the waits skipped, the update may still run
        model_download(g);
        r.params = g.host_params;
        r.adam_m = g.host_adam_m;
        r.adam_v = g.host_adam_v;
        if (graphs) {
            int captured = 0;
            for (const PassGraphs::Entry& e : g.graphs.entries) captured += e.exec != nullptr;
            if (captured < 2 || !g.graphs.refused.empty())  // at least the forward and backward passes without statistics
                graphs_problem = strprintf("%d passes captured%s%s", captured, g.graphs.refused.empty() ? "" : "; refused: ",
                                           g.graphs.refused.c_str());
        }
        pass_graphs_free(g.graphs);
        return r;
    };
    auto same = [](const Steps& a, const Steps& b) {
        return a.losses == b.losses && a.norms == b.norms && a.stat_sums == b.stat_sums &&
               memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0 &&
               memcmp(a.adam_m.data(), b.adam_m.data(), a.adam_m.size() * sizeof(float)) == 0 &&
               memcmp(a.adam_v.data(), b.adam_v.data(), a.adam_v.size() * sizeof(float)) == 0;
    };
    const Steps plain = train(false, false, false);
    const bool none_beside = beside_updates == 0;
    const Steps direct = train(true, false, false), graphed = train(true, true, false);
    report(none_beside && beside_updates == 8 && same(direct, plain),
           label + "AdamW steps with the update beside the next forward pass: the same losses, norms, weights and "
                   "AdamW state, bit for bit",
           strprintf("%lld updates beside of 8", beside_updates));
    report(graphs_problem.empty() && same(graphed, plain),
           label + "the same with the passes from CUDA graphs, which wait for the update queued outside them: the same bits",
           graphs_problem);
    const Steps unwaited = train(true, false, true);
    report(unwaited.losses != plain.losses,
           label + "the update beside without the forward pass's waits (slowed): other losses, as they must be");
    model_free(g);
}

// CUDA graphs (./train's unless TRAIN_CUDA_GRAPH=0, cuda_graph.cuh). A step, on one of two batches (the tokens and
// the same tokens shifted by one): the batch's forward and backward passes, its first sequence's as
// a micro-batch (another shape: two more graphs), then a statistics forward pass of the batch (run
// directly; from a graph of its own in the candidate build, unless its statistics are deferred) and
// a backward pass after it. Six steps
// with graphs, the batches in turn, take every pass through its direct run, its capture and launch,
// and launches of its graph; each step must give the loss, every gradient and every statistic of
// the same step run directly, bit for bit. Before each step the host's copy of the losses and the
// device's logits are filled with NaN, so that a replay that left either alone shows. And the four
// passes (five in the candidate build) must have been captured.
static void check_graphs(const std::string& label, const std::string& ckpt, const std::vector<int>& tokens,
                         const std::vector<int>& targets, int B, int T, bool defer = false) {
    GpuModel g;
    model_init(g, checkpoint_read_header(ckpt).config, B, T);
    g.beside.defer = defer;  // the candidate stats_deferred (whose pass with statistics has no graph)
    HostState h = host_state(g);
    checkpoint_read(ckpt, h.params, nullptr, nullptr);
    model_upload(g);
    std::vector<int> shifted(tokens.begin() + 1, tokens.end());
    shifted.push_back(tokens[0]);
    const std::vector<int>* batches[2] = {&tokens, &shifted};
    bool deferred = false;  // a pass's statistics ran on past it, beside the backward pass
    auto step = [&](int batch, std::vector<float>& grads, Telemetry& stats) {
        const int* x = batches[batch]->data();
        std::fill(g.losses_host, g.losses_host + (size_t)B * T, NAN);
        cudaCheck(cudaMemsetAsync(g.acts.logits, 0xFF, (size_t)B * T * g.Vp * sizeof(bf16), g.stream));
        model_zero_grad(g);
        float loss = model_forward(g, x, targets.data(), B, T, false);
        model_backward(g, x, targets.data(), 1.0f);
        loss += model_forward(g, x, targets.data(), 1, T, false);
        model_backward(g, x, targets.data(), 0.5f);
        // the statistics' sums read where a training step reads them (forward_backward): after the
        // backward pass where they are deferred, which then runs beside them, else before it
        model_stats_begin(g);
        loss += model_forward(g, x, targets.data(), B, T, true);
        const bool pending = model_stats_pending(g);
        deferred |= pending;
        if (!pending) telemetry_from_sums(stats, model_stats_sums(g), g.stats_layout, g.cfg);
        model_backward(g, x, targets.data(), 1.0f);
        if (pending) telemetry_from_sums(stats, model_stats_sums(g), g.stats_layout, g.cfg);
        grads.resize(g.P);
        cudaCheck(cudaStreamSynchronize(g.stream));
        cudaCheck(cudaMemcpy(grads.data(), g.grads, g.P * sizeof(float), cudaMemcpyDeviceToHost));
        return loss;
    };
    g.graphs.on = false;
    std::vector<float> direct[2], graphed;
    Telemetry direct_stats[2];
    float direct_loss[2];
    for (int batch = 0; batch < 2; batch++) direct_loss[batch] = step(batch, direct[batch], direct_stats[batch]);
    g.graphs.on = true;
    for (int k = 0; k < 6; k++) {
        const int batch = k % 2;
        Telemetry stats;
        const float loss = step(batch, graphed, stats);
        bool same = memcmp(&loss, &direct_loss[batch], sizeof loss) == 0 &&
                    memcmp(graphed.data(), direct[batch].data(), g.P * sizeof(float)) == 0;
        for (int m = 0; m < M_NUM_METRICS; m++)
            same &= stats.values[m].size() == direct_stats[batch].values[m].size() &&
                    memcmp(stats.values[m].data(), direct_stats[batch].values[m].data(),
                           stats.values[m].size() * sizeof(float)) == 0;
        report(same, strprintf("%sstep %d (batch %d): the direct step's loss, gradients and statistics, bit for bit",
                               label.c_str(), k + 1, batch + 1));
    }
    // deferred where asked wherever the rows' statistics come from the lse (the mma kernels take the
    // head width), and nowhere else
    const bool deferrable = defer && kCandidateKernels && g.beside.layer_qk_normed &&
                            attention_row_stats_from_lse_supports(g.cfg.head_dim);
    report(deferred == deferrable, strprintf("%sthe statistics %sdeferred past their forward pass", label.c_str(),
                                             deferrable ? "" : "not "));
    // the pass with statistics from a graph of its own unless its statistics are deferred past it
    int captured = 0, want = stats_pass_graph_on() && !stats_defer_now(g, true) ? 5 : 4;
    for (const PassGraphs::Entry& e : g.graphs.entries) captured += e.exec != nullptr;
    report(captured == want && g.graphs.refused.empty(), strprintf("%sthe %d passes were captured", label.c_str(), want),
           strprintf("%d captured%s%s", captured, g.graphs.refused.empty() ? "" : "; refused: ", g.graphs.refused.c_str()));
    model_free(g);
}

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: test_gpt_cuda REFERENCE_DIR");
    setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear in order with errors on stderr
    // The checks against the CPU run every pass directly; check_graphs then shows that replays from
    // CUDA graphs, ./train's default, give the direct passes' bits.
    setenv("TRAIN_CUDA_GRAPH", "0", 1);
    std::string name;
    if (!cuda_device_present(0, &name)) {
        printf("no CUDA device: nothing to test\n");
        return 0;
    }
    printf("device: %s\n", name.c_str());
    std::string dir = argv[1], ckpt = dir + "/model.ckpt", dbg = dir + "/debug_state.bin";
    auto ref = read_tensorfile(dbg);
    const ModelConfig c = checkpoint_read_header(ckpt).config;
    const NamedTensor& tokens_t = tensor_or_fail(ref, "tokens", dbg);
    int B = (int)tokens_t.shape[0], T = (int)tokens_t.shape[1], N = B * T;
    std::vector<int> tokens(N), targets(N);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)tokens_t.values[i];
        targets[i] = (int)tensor_or_fail(ref, "targets", dbg).values[i];
    }
    size_t P = num_parameters(c);
    int eot = (int)tensor_or_fail(ref, "eot", dbg).values[0];  // the batch's document starts follow it
    GpuModel g;
    model_init(g, c, B, T);
    g.eot_token = eot;

    // The trained state: the forward pass and every statistic (from float32 keys, the Gram
    // matrices summed in float64).
    Telemetry stats;
    check_forward(g, "cuda trained state: ", dir + "/trained.ckpt", dir + "/debug_trained.bin", tokens, targets, B, T, stats);

    // The initial weights: the forward pass, every gradient, determinism and AdamW steps.
    check_forward(g, "cuda ", ckpt, dbg, tokens, targets, B, T, stats);
    std::vector<float> grads = backward_gradients(g, tokens, targets, B, T);
    compare_gradients(g, "cuda ", grads, dbg);

    // Determinism: the same forward and backward again gives the same bits.
    Telemetry stats2;
    forward_with_stats(g, tokens.data(), targets.data(), B, T, stats2);
    model_zero_grad(g);
    model_backward(g, tokens.data(), targets.data(), 1.0f);
    std::vector<float> grads2(P);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(grads2.data(), g.grads, P * sizeof(float), cudaMemcpyDeviceToHost));
    bool same = memcmp(grads.data(), grads2.data(), P * sizeof(float)) == 0;
    for (int k = 0; k < M_NUM_METRICS; k++) same &= stats.values[k] == stats2.values[k];
    report(same, "cuda determinism: two runs give identical gradients and statistics");
    check_stats_beside(g, "cuda ", tokens, targets, B, T);
    if (kCandidateKernels) check_grads_beside(g, "cuda ", tokens, targets, B, T);
    if (kCandidateKernels) check_qk_forward_candidates(g, "cuda ", tokens, targets, B, T);
    if (kCandidateKernels) check_stats_deferred(g, "cuda ", tokens, targets, B, T);

    // Gradient accumulation as the training loop does it: the batch's B sequences as B micro-batches,
    // each backward pass scaled by 1/B and added into the gradients, give the whole batch's gradient.
    // The per-token work is the same; only the float32 sums over tokens (the weight gradients) are
    // grouped otherwise, and a matrix product of other rows (another cuBLASLt algorithm) may round a
    // bf16 activation gradient one place apart (up to 2^-7 of it), again at each residual add: within
    // 2^-6 of each element, 2^-6 of the tensor's largest for elements small by cancellation. A
    // missing 1/B is a factor of B off; gradients written over, not added, lose three quarters of
    // the batch.
    model_zero_grad(g);
    for (int b = 0; b < B; b++) {
        const int* tb = tokens.data() + (size_t)b * T;
        const int* yb = targets.data() + (size_t)b * T;
        model_forward(g, tb, yb, 1, T, false);
        model_backward(g, tb, yb, 1.0f / B);
    }
    std::vector<float> accumulated(P);
    cudaCheck(cudaStreamSynchronize(g.stream));
    cudaCheck(cudaMemcpy(accumulated.data(), g.grads, P * sizeof(float), cudaMemcpyDeviceToHost));
    for (int kind = 0; kind < P_NUM_KINDS; kind++)
        for (int l = 0; l < param_layers(c, kind); l++) {
            size_t off = param_offset(c, kind, l), n = param_numel(c, kind);
            std::vector<double> want(grads.begin() + off, grads.begin() + off + n);
            compare_bf16("cuda gradient accumulated over micro-batches = of the batch: " + param_name(kind, l),
                         &accumulated[off], want.data(), n, 1.0 / 64, 1.0 / 64);
        }

    check_adamw_steps(g, "cuda ", dbg, tokens, targets, B, T);

    // A stats step measures every micro-batch: the batch as B micro-batches of one sequence gives
    // the statistics of the batch at once (float32 partial sums grouped otherwise, so not the bits).
    Telemetry whole, micro;
    forward_with_stats(g, tokens.data(), nullptr, B, T, whole);
    model_stats_begin(g);
    for (int b = 0; b < B; b++) model_forward(g, tokens.data() + (size_t)b * T, nullptr, 1, T, true);
    telemetry_from_sums(micro, model_stats_sums(g), g.stats_layout, g.cfg);
    for (int k = 0; k < M_NUM_METRICS; k++) {
        std::vector<double> want(whole.values[k].begin(), whole.values[k].end());
        // float32 partial sums of the same terms grouped otherwise (then added in float64): a few
        // u32 (6e-8) times the sums' condition; 1e-5 relative, 1e-6 absolute for values near zero.
        check_close(std::string("cuda stats over micro-batches = over the batch: ") + kMetrics[k].name,
                    micro.values[k].data(), want.data(), want.size(), 1e-5, 1e-6);
    }
    model_free(g);

    // The --qk-norm variants and frozen parameters: the forward pass, and AdamW steps that leave
    // the frozen tensors exactly as they were (plain and none hold their unused gains fixed); weight
    // decay on every kind (--decay all, at a rate that moves the gains past the checks). Then
    // the shapes of pretrained models: head_dim 128 (the mma attention kernels, as at 64; the
    // simple ones are dev_attention's to check), an attention width of 4 x 128 against d_model
    // 192 (the output projection's product), GQA; untied embeddings (lm_head's product and
    // gradient) in the Qwen3, Llama 3 RoPE scaling (the host's tables) with qk-norm none in the Llama.
    struct { const char* label; const char* ckpt; const char* dbg; bool freezes; } variants[] = {
        {"cuda qk-norm plain: ", "plain.ckpt", "debug_plain.bin", true},
        {"cuda qk-norm none: ", "none.ckpt", "debug_none.bin", true},
        {"cuda freeze wk,k_gain: ", "model.ckpt", "debug_freeze.bin", true},
        {"cuda decay all: ", "model.ckpt", "debug_decay_all.bin", false},
        {"cuda qwen3 shape, untied: ", "qwen3.ckpt", "debug_qwen3.bin", false},
        {"cuda llama3 shape, rope scaling: ", "llama3.ckpt", "debug_llama3.bin", true}};
    for (const auto& v : variants) {
        std::string vckpt = dir + "/" + v.ckpt, vdbg = dir + "/" + v.dbg;
        model_init(g, checkpoint_read_header(vckpt).config, B, T);
        g.eot_token = eot;
        const ModelConfig& vc = g.cfg;
        check_forward(g, v.label, vckpt, vdbg, tokens, targets, B, T, stats);
        check_stats_beside(g, v.label, tokens, targets, B, T);
        if (kCandidateKernels) check_grads_beside(g, v.label, tokens, targets, B, T);
        if (kCandidateKernels) check_qk_forward_candidates(g, v.label, tokens, targets, B, T);
        if (kCandidateKernels) check_stats_deferred(g, v.label, tokens, targets, B, T);
        compare_gradients(g, v.label, backward_gradients(g, tokens, targets, B, T), vdbg);
        // Frozen: no gradient (so out of the norm), and AdamW leaves the tensors as they were.
        model_freeze(g, (uint32_t)tensor_or_fail(read_tensorfile(vdbg), "freeze", vdbg).values[0]);
        std::vector<float> frozen_grads = backward_gradients(g, tokens, targets, B, T);
        std::vector<float> before(g.host_params);
        check_adamw_steps(g, v.label, vdbg, tokens, targets, B, T);
        model_download(g);
        bool zero = true, kept = true;
        for (int kind = 0; kind < P_NUM_KINDS; kind++)
            for (int l = 0; l < param_layers(vc, kind) && (g.frozen & param_kind_bit(kind)); l++) {
                size_t off = param_offset(vc, kind, l), n = param_numel(vc, kind);
                for (size_t i = 0; i < n; i++) zero &= frozen_grads[off + i] == 0.0f;
                kept &= memcmp(&before[off], &g.host_params[off], n * sizeof(float)) == 0;
            }
        if (v.freezes) {
            report(zero && g.frozen, std::string(v.label) + "frozen parameters have no gradient");
            report(kept && g.frozen, std::string(v.label) + "frozen parameters unchanged by AdamW");
        }
        model_free(g);
    }

    // Last, as a capture that a call inside it fails ends the program. The Qwen3 shape's head_dim
    // 128 takes the statistics' other paths (the Gram products in float64 by cuBLAS).
    check_graphs("cuda graphs: ", ckpt, tokens, targets, B, T);
    check_graphs("cuda graphs, qwen3 shape: ", dir + "/qwen3.ckpt", tokens, targets, B, T);
    if (kCandidateKernels) check_graphs("cuda graphs, statistics deferred: ", ckpt, tokens, targets, B, T, true);
    if (kCandidateKernels) {  // the model's tensors, lm_head untied, two kinds frozen
        check_adamw_beside("cuda adamw beside: ", ckpt, 0, tokens, targets, B, T);
        check_adamw_beside("cuda adamw beside, qwen3 shape, untied: ", dir + "/qwen3.ckpt", 0, tokens, targets, B, T);
        check_adamw_beside("cuda adamw beside, freeze wk,k_gain: ", ckpt, param_kind_bit(P_WK) | param_kind_bit(P_K_GAIN),
                           tokens, targets, B, T);
    }
    return test_exit_code();
}
