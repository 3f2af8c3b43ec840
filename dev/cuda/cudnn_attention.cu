// cuDNN's fused causal attention (llmc/cudnn_attention.cuh: flash attention through cuDNN 9's graph
// API) against llmc/attention.cuh's tensor-core kernels: whether it computes the same attention,
// forward and backward, on ./train's own layouts (no copies), whether its backward gives the same
// bits twice, and what each costs on the d22 layer and on Qwen3-0.6B's. The experiment that decides
// whether ./train should hand its attention to cuDNN, as torch.compile's recipe does (./train does
// where libcudnn.so.9 loads).
//
// libcudnn.so.9 is loaded at run time: a GPU machine with PyTorch has it in its wheels
// (nvidia/cudnn/lib; dev/gpu_env.sh puts that on LD_LIBRARY_PATH).
//
// Usage: build/dev_cudnn_attention [--graph-only | --engines]
//   --graph-only  checks which shapes and versions ./train hands to cuDNN, builds and finalises the
//                 two operation graphs and stops there; that needs no GPU (only the library), so it
//                 checks the graphs' construction on any machine (make test runs it; without the
//                 library or a build with cuDNN it says so and checks nothing).
//   --engines     checks nothing: a survey of every engine configuration cuDNN's heuristics offer
//                 for the d22 layer at 8 x 2048, then of every engine at every setting of its knobs
//                 (survey_engines), their times and bits beside ./train's plan's.
// CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr make cuDNN say why a graph or plan is refused.
// Build: make build/dev_cudnn_attention.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include "dev/cuda/common.h"
#include "llmc/attention.cuh"
#include "llmc/cudnn_attention.cuh"
#ifdef USE_CUDNN

// ---------------------------------------------------------------------------------------------
// The experiment on one shape.

static std::string shape_name(const CudnnShape& s) {
    return strprintf("B%d T%d H%d:%d D%d", s.B, s.T, s.H, s.Hkv, s.D);
}

// Which shapes and versions ./train hands to cuDNN (cudnn_attention_unfit): the known-wrong
// versions and the unaligned shapes refused, the rest taken (host logic: no library, no GPU).
static void check_unfit_rules() {
    const CudnnShape d22{4, 2048, 8, 8, 64}, odd_t{2, 200, 8, 2, 64};
    struct Case {
        size_t version;
        CudnnShape shape;
        bool taken;
        const char* what;
    } cases[] = {
        {91900, d22, true, "9.19.0, the d22 layer"},
        {90100, d22, true, "9.1.0, the d22 layer"},
        {91000, d22, false, "9.10.0 (computes this attention wrongly)"},
        {91001, d22, false, "9.10.1 (likewise)"},
        {91002, d22, true, "9.10.2"},
        {91500, odd_t, false, "9.15.0, T = 200"},
        {91501, odd_t, false, "9.15.1, T = 200 (every 9.15)"},
        {91600, odd_t, true, "9.16.0, T = 200"},
        {91900, {1, 2048, 8, 8, 60}, false, "head_dim 60 (rows not 16-byte aligned)"},
        {91900, {1, 129, 3, 1, 64}, false, "B H T = 387 (a layer's lse not 16-byte aligned)"},
    };
    for (const Case& k : cases) {
        std::string why = cudnn_attention_unfit(k.version, k.shape);
        report(why.empty() == k.taken, strprintf("cuDNN takes %s: %s", k.what, k.taken ? "yes" : "no"),
               why.empty() ? "taken" : why);
    }
}

// Both graphs finalise as operation graphs (no handle, no GPU).
static void check_graphs(const CudnnShape& s) {
    for (int backward = 0; backward < 2; backward++) {
        const char* pass = backward ? "backward" : "forward";
        try {
            CudnnGraph g;
            if (backward) cudnn_attention_backward_graph(g, s);
            else cudnn_attention_forward_graph(g, s);
            g.finish(nullptr);
            report(true, strprintf("cuDNN %s graph %s", pass, shape_name(s).c_str()), strprintf("%zu operations", g.ops.size()));
        } catch (const std::exception& e) {
            report(false, strprintf("cuDNN %s graph %s", pass, shape_name(s).c_str()), e.what());
        }
    }
}

static void compare_bf16(const std::string& name, const bf16* got, const bf16* want, size_t n) {
    compare_to_reference(name, download_bf16(got, n), download_bf16(want, n));
}

// ./train's way in (CudnnAttention, cudnn_attention_forward/backward): the same bits as the plans
// run directly, out and lse from qk and qkv, dqk and dqkv from ./train's out_ref and lse_ref.
static void train_path_check(const CudnnShape& s, const bf16* qk, const bf16* qkv, const bf16* dout, const bf16* out_ref,
                             const float* lse_ref, const bf16* out_want, const float* lse_want, const bf16* dqk_want,
                             const bf16* dqkv_want) {
    const std::string tag = " " + shape_name(s);
    const size_t qk_n = (size_t)s.B * s.T * (s.H + s.Hkv) * s.D, qkv_n = (size_t)s.B * s.T * (s.H + 2 * s.Hkv) * s.D;
    const size_t out_n = (size_t)s.B * s.T * s.H * s.D, rows = (size_t)s.B * s.H * s.T;
    bf16 *out, *dqk, *dqkv;
    float *lse, *delta;
    cudaCheck(cudaMalloc(&out, out_n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dqk, qk_n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dqkv, qkv_n * sizeof(bf16)));
    cudaCheck(cudaMemset(dqkv, 0, qkv_n * sizeof(bf16)));
    for (float** p : {&lse, &delta}) cudaCheck(cudaMalloc(p, rows * sizeof(float)));
    CudnnAttention c;
    bool ran = cudnn_attention_forward(c, out, lse, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0) &&
               cudnn_attention_backward(c, dqk, dqkv, delta, dout, out_ref, lse_ref, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
    if (!ran) {
        report(false, "./train's cuDNN attention" + tag, "it left this shape to attention.cuh");
    } else {
        bool same = download_bf16(out, out_n) == download_bf16(out_want, out_n) &&
                    download(lse, rows) == download(lse_want, rows) &&
                    download_bf16(dqk, qk_n) == download_bf16(dqk_want, qk_n) &&
                    download_bf16(dqkv, qkv_n) == download_bf16(dqkv_want, qkv_n);
        report(same, "./train's cuDNN attention: the plans' bits" + tag, same ? "" : "they differ");
    }
    cudnn_attention_free(c);
    for (void* p : {(void*)out, (void*)dqk, (void*)dqkv, (void*)lse, (void*)delta}) cudaCheck(cudaFree(p));
}

static void experiment(cudnnHandle_t handle, const CudnnShape& s, bool timing) {
    const std::string tag = " " + shape_name(s);
    const int NH = s.H + s.Hkv;
    const size_t qk_n = (size_t)s.B * s.T * NH * s.D, qkv_n = (size_t)s.B * s.T * (s.H + 2 * s.Hkv) * s.D;
    const size_t out_n = (size_t)s.B * s.T * s.H * s.D, rows = (size_t)s.B * s.H * s.T;
    Rng rng{(uint64_t)s.T * 7 + s.H};
    bf16 *qk = upload_bf16(random_values(qk_n, 1.0f, rng)), *qkv = upload_bf16(random_values(qkv_n, 1.0f, rng));
    bf16* dout = upload_bf16(random_values(out_n, 1.0f, rng));
    bf16 *out_ref, *out, *dqk_ref, *dqkv_ref, *dqk, *dqkv;
    float *lse_ref, *lse, *delta;
    for (bf16** p : {&out_ref, &out}) cudaCheck(cudaMalloc(p, out_n * sizeof(bf16)));
    for (bf16** p : {&dqk_ref, &dqk}) cudaCheck(cudaMalloc(p, qk_n * sizeof(bf16)));
    for (bf16** p : {&dqkv_ref, &dqkv}) cudaCheck(cudaMalloc(p, qkv_n * sizeof(bf16)));
    for (float** p : {&lse_ref, &lse, &delta}) cudaCheck(cudaMalloc(p, rows * sizeof(float)));
    for (bf16* p : {dqkv_ref, dqkv}) cudaCheck(cudaMemset(p, 0, qkv_n * sizeof(bf16)));

    // ./train's tensor-core kernels: the reference.
    auto ours_forward = [&] { attention_forward(out_ref, lse_ref, nullptr, nullptr, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0); };
    auto ours_backward = [&] {
        attention_backward(dqk_ref, dqkv_ref, delta, dout, out_ref, lse_ref, qk, qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
    };
    ours_forward();
    ours_backward();

    // The plans, each reported on its own, so that one refused leaves the other's checks and times.
    CudnnPlan fwd, bwd;
    for (int backward = 0; backward < 2; backward++) {
        CudnnPlan& p = backward ? bwd : fwd;
        const std::string name = strprintf("cuDNN %s plan", backward ? "backward" : "forward") + tag;
        try {
            if (backward) cudnn_attention_backward_graph(p.graph, s);
            else cudnn_attention_forward_graph(p.graph, s);
            cudnn_make_plan(p, handle);
            report(true, name, p.engine + strprintf(", %lld bytes of workspace", (long long)p.workspace_bytes));
        } catch (const std::exception& e) {
            report(false, name, e.what());
        }
    }
    void* workspace = nullptr;
    cudaCheck(cudaMalloc(&workspace, std::max<int64_t>(1, std::max(fwd.workspace_bytes, bwd.workspace_bytes))));
    const double fwd_flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0, bwd_flops = 2.5 * fwd_flops;
    if (fwd.plan) {
        auto cudnn_forward = [&] {
            cudnn_attention_run_forward(handle, fwd, workspace, out, lse, qk, qkv, s.H, s.Hkv, s.D);
        };
        try {
            cudnn_forward();
            compare_bf16("cuDNN forward: out" + tag, out, out_ref, out_n);
            check_close("cuDNN forward: lse (natural log)" + tag, download(lse, rows).data(),
                        download(lse_ref, rows).data(), rows, 1e-4, 1e-3);
            if (timing) {
                float ours = time_ms(ours_forward), cudnn = time_ms(cudnn_forward);
                printf("   %s forward: mma %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s)\n", shape_name(s).c_str(),
                       ours, fwd_flops / ours * 1e-9, cudnn, fwd_flops / cudnn * 1e-9);
            }
        } catch (const std::exception& e) {
            report(false, "cuDNN forward" + tag, e.what());
        }
    }
    if (bwd.plan) {
        // From ./train's forward pass (out, lse), so that this check needs nothing of cuDNN's forward.
        auto cudnn_backward = [&] {
            cudnn_attention_run_backward(handle, bwd, workspace, dqk, dqkv, delta, dout, out_ref, lse_ref, qk, qkv, s.H,
                                         s.Hkv, s.D);
        };
        try {
            cudnn_backward();
            std::vector<float> dqk_got = download_bf16(dqk, qk_n), dqkv_got = download_bf16(dqkv, qkv_n);
            compare_to_reference("cuDNN backward: dq and dk" + tag, dqk_got, download_bf16(dqk_ref, qk_n));
            compare_to_reference("cuDNN backward: dv (and the untouched query, key parts)" + tag, dqkv_got,
                                 download_bf16(dqkv_ref, qkv_n));
            // The same bits on every run: checked after a second run, and again after the timed ones.
            auto same_bits_as_first = [&] {
                return download_bf16(dqk, qk_n) == dqk_got && download_bf16(dqkv, qkv_n) == dqkv_got;
            };
            cudnn_backward();
            bool same = same_bits_as_first();
            if (timing) {
                float ours = time_ms(ours_backward), cudnn = time_ms(cudnn_backward);
                printf("   %s backward: mma %.3f ms (%.0f TFLOP/s), cuDNN %.3f ms (%.0f TFLOP/s)\n", shape_name(s).c_str(),
                       ours, bwd_flops / ours * 1e-9, cudnn, bwd_flops / cudnn * 1e-9);
                same = same && same_bits_as_first();
            }
            report(same, "cuDNN backward: the same bits on every run" + tag, same ? "" : "they differ: not deterministic");
        } catch (const std::exception& e) {
            report(false, "cuDNN backward" + tag, e.what());
        }
    }
    if (fwd.plan && bwd.plan) train_path_check(s, qk, qkv, dout, out_ref, lse_ref, out, lse, dqk, dqkv);
    cudaCheck(cudaFree(workspace));
    for (void* p : {(void*)qk, (void*)qkv, (void*)dout, (void*)out_ref, (void*)out, (void*)dqk_ref, (void*)dqk,
                    (void*)dqkv_ref, (void*)dqkv, (void*)lse_ref, (void*)lse, (void*)delta})
        cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------
// A survey of cuDNN's engines for one layer, each configuration run on random inputs (the backward
// pass from ./train's plan's forward outputs): first every configuration its heuristics offer (in
// modes A and FALLBACK; ./train runs mode A's first that finalises), then every engine that takes
// the graph at every setting of its knobs (a sweep: the heuristics offer a few of the 37 values of
// an engine's kernel configuration knob; which others make plans, and how fast, the sweep finds
// out). A row each: the engine, its knobs and what cuDNN says of its determinism, the seconds its
// plan took to make, its workspace and time, and, where it is faster than ./train's plan, whether
// it gives ./train's bits and the same bits twice; a `suggested:` line for each setting that gives
// the same bits twice, is not noted nondeterministic, and is faster than ./train's plan by 3% or
// more when the two are timed again in turns (each better than the last); at the end, for each
// pass, the fastest with ./train's bits and the fastest with the same bits twice. It checks
// nothing: the measurement that a rule choosing another configuration than ./train's would start
// from. A program run of its own (--engines), since a faulty engine may leave the GPU unusable (its
// lines are printed one at a time, so that they survive a crash); it stops after
// CUDNN_SURVEY_SECONDS (default 30): the heuristics' configurations of both passes within the first
// 30% of them, then the backward pass's sweep (the backward is three quarters of the attention's
// time) until 80%, then the forward's.

static const size_t kSurveyConfigs = 12;

// " (nondeterministic, cuDNN says)" where cuDNN notes that the engine's results may differ from
// run to run, else "".
static std::string engine_note(CudnnDesc engine) {
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0;
    cudnn_check(g_cudnn.get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                      CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes),
                "read an engine's numerical notes");
    for (int64_t i = 0; i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return " (nondeterministic, cuDNN says)";
    return "";
}

// The setting of a configuration the heuristics offer; *engine: its engine.
static CudnnSetting config_setting(CudnnGraph& g, CudnnDesc config, CudnnDesc* engine) {
    CudnnSetting s;
    *engine = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    cudnn_check(g_cudnn.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine),
                "read a configuration's engine");
    cudnn_check(g_cudnn.get_attribute(*engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &s.engine),
                "read an engine's index");
    const int64_t most = CUDNN_KNOB_TYPE_COUNTS;
    std::vector<CudnnDesc> knobs(most);
    for (CudnnDesc& k : knobs) k = g.make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    cudnn_check(g_cudnn.get_attribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, most, &n,
                                      knobs.data()),
                "read a configuration's knobs");
    for (int64_t i = 0; i < n && i < most; i++) {
        cudnnBackendKnobType_t type;
        int64_t value = 0, got = 0;
        cudnn_check(g_cudnn.get_attribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &got, &type),
                    "read a knob's type");
        cudnn_check(g_cudnn.get_attribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &got, &value),
                    "read a knob's value");
        s.knobs.push_back({type, value});
    }
    return s;
}

// Every setting of an engine's knobs: each knob from its least value to its largest by its stride
// (the largest taken at most kSweepValues values apart from the least), all combinations.
static const int64_t kSweepValues = 64;
static std::vector<CudnnSetting> knob_settings(int64_t engine, const std::vector<CudnnKnob>& knobs) {
    std::vector<CudnnSetting> all(1);
    all[0].engine = engine;
    for (const CudnnKnob& k : knobs) {
        std::vector<CudnnSetting> next;
        const int64_t stride = std::max<int64_t>(1, k.stride);
        for (const CudnnSetting& s : all)
            for (int64_t v = k.min, i = 0; v <= k.max && i < kSweepValues; v += stride, i++) {
                CudnnSetting t = s;
                t.knobs.push_back({k.type, v});
                next.push_back(t);
            }
        all.swap(next);
    }
    return all;
}

// One pass's survey: its graph, how to run it and read its results, ./train's plan (kept, with its
// workspace, to time the others against) and its results, the settings surveyed so far and the
// fastest.
struct PassSurvey {
    bool backward;
    std::function<void(CudnnPlan&, void*)> run;
    std::function<std::vector<float>()> results;
    std::function<void()> keep_forward_outputs;  // the backward pass's inputs, from ./train's forward plan
    double flops = 0;
    cudnnHandle_t handle = nullptr;  // none: the graphs built without a device (--graph-only)
    std::unique_ptr<CudnnPlan> train_plan;
    void* train_workspace = nullptr;
    std::vector<float> train_bits;  // ./train's plan's results (empty: its row not made yet)
    std::vector<std::string> surveyed;
    std::vector<CudnnSetting> offered;  // the heuristics' settings, best first
    float train_ms = 0, best_same_ms = 0, best_twice_ms = 0, suggested_ratio = 0.97f;
    std::string best_same, best_twice;  // the fastest rows' labels

    PassSurvey(bool backward_pass) : backward(backward_pass) {}
    PassSurvey(const PassSurvey&) = delete;
    ~PassSurvey() {
        if (train_workspace) cudaCheck(cudaFree(train_workspace));
    }
    const char* name() const { return backward ? "backward" : "forward"; }
    void build(CudnnGraph& g, const CudnnShape& s) const {
        if (backward) cudnn_attention_backward_graph(g, s);
        else cudnn_attention_forward_graph(g, s);
    }
    // The number of cuDNN's engines for the pass's graph (some of which may not take it).
    int64_t engine_count(const CudnnShape& s) const {
        CudnnGraph g;
        build(g, s);
        int64_t count = 0, n = 0;
        cudnn_check(g_cudnn.get_attribute(g.finish(handle), CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                          CUDNN_TYPE_INT64, 1, &n, &count),
                    "count the engines");
        return count;
    }
    // ./train's plan's row: its results and time, the others' reference. False where it did not run.
    bool reference_row(std::unique_ptr<CudnnPlan> p, const std::string& label, double prepare_s) {
        if (cudaMalloc(&train_workspace, std::max<int64_t>(1, p->workspace_bytes)) != cudaSuccess) {
            cudaGetLastError();
            train_workspace = nullptr;
            printf("   %-8s %s: no memory for its %.1f MiB of workspace\n", name(), label.c_str(), p->workspace_bytes / 1048576.0);
            return false;
        }
        try {
            run(*p, train_workspace);
            std::vector<float> got = results();
            run(*p, train_workspace);
            const bool twice = same_bits(results(), got);
            train_ms = time_ms([&] { run(*p, train_workspace); }, 10);
            printf("   %-8s %s: ready in %.2f s, %.1f MiB of workspace, %.3f ms (%.0f TFLOP/s), %s\n", name(),
                   label.c_str(), prepare_s, p->workspace_bytes / 1048576.0, train_ms, flops / train_ms * 1e-9,
                   twice ? "the same bits twice" : "OTHER BITS THE SECOND TIME");
            train_bits = got;
            if (keep_forward_outputs) keep_forward_outputs();
            best_same = best_twice = label;
            best_same_ms = best_twice_ms = train_ms;
        } catch (const std::exception& e) {
            printf("   %-8s %s: %s\n", name(), label.c_str(), e.what());
            return false;
        }
        train_plan = std::move(p);
        return true;
    }
    // Another plan's row (setting: what made it; deterministic: cuDNN does not note its engine as
    // nondeterministic). Timed first; its bits checked only where it is faster than ./train's plan.
    // One whose bits come out the same twice and whose time, taken again in turns with ./train's
    // plan's, is below suggested_ratio of it prints a `suggested:` line (each better than the last),
    // which gpu_session.sh reads. False, with the reason printed, where it did not run.
    bool row(CudnnPlan& p, const std::string& label, double prepare_s, const CudnnSetting& setting, bool deterministic) {
        void* workspace = nullptr;
        if (cudaMalloc(&workspace, std::max<int64_t>(1, p.workspace_bytes)) != cudaSuccess) {
            cudaGetLastError();
            printf("   %-8s %s: no memory for its %.1f MiB of workspace\n", name(), label.c_str(),
                   p.workspace_bytes / 1048576.0);
            return false;
        }
        try {
            const float ms = time_ms([&] { run(p, workspace); }, 10);
            std::string bits = "slower than ./train's plan: its bits not checked";
            if (ms < train_ms) {
                run(p, workspace);
                std::vector<float> got = results();
                run(p, workspace);
                const bool twice = same_bits(results(), got), same = same_bits(got, train_bits);
                bits = strprintf("%s, %s", same ? "./train's bits" : "OTHER BITS than ./train's",
                                 twice ? "the same bits twice" : "OTHER BITS THE SECOND TIME");
                if (same && twice && ms < best_same_ms) best_same = label, best_same_ms = ms;
                if (twice && ms < best_twice_ms) best_twice = label, best_twice_ms = ms;
                if (twice && deterministic) {
                    float mine = ms, theirs = train_ms;  // each the least of three turns
                    for (int turn = 0; turn < 3; turn++) {
                        theirs = std::min(theirs, time_ms([&] { run(*train_plan, train_workspace); }, 10));
                        mine = std::min(mine, time_ms([&] { run(p, workspace); }, 10));
                    }
                    if (mine / theirs < suggested_ratio) {
                        suggested_ratio = mine / theirs;
                        printf("   suggested: TRAIN_CUDNN_%s=%s (%.3f of ./train's plan's time, %.3f against %.3f ms)\n",
                               backward ? "BACKWARD" : "FORWARD", setting.arg().c_str(), suggested_ratio, mine, theirs);
                    }
                }
            }
            printf("   %-8s %s: ready in %.2f s, %.1f MiB of workspace, %.3f ms (%.0f TFLOP/s), %s\n", name(),
                   label.c_str(), prepare_s, p.workspace_bytes / 1048576.0, ms, flops / ms * 1e-9, bits.c_str());
        } catch (const std::exception& e) {
            printf("   %-8s %s: %s\n", name(), label.c_str(), e.what());
            cudaCheck(cudaFree(workspace));
            return false;
        }
        cudaCheck(cudaFree(workspace));
        return true;
    }
};

// ./train's plan's row, then those of the configurations the heuristics offer, until `end` s.
static void survey_offered(PassSurvey& ps, const CudnnShape& s, const std::function<double()>& elapsed, double end) {
    try {
        std::unique_ptr<CudnnPlan> p(new CudnnPlan);
        ps.build(p->graph, s);
        const double t0 = elapsed();
        cudnn_make_plan(*p, ps.handle);
        const std::string label = "./train's plan (mode A, " + p->engine + ")";
        if (!ps.reference_row(std::move(p), label, elapsed() - t0)) return;
    } catch (const std::exception& e) {
        printf("   %-8s ./train's plan: %s\n", ps.name(), e.what());
        return;
    }
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
        const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK";
        for (size_t i = 0; i < kSurveyConfigs; i++) {
            if (elapsed() > end) {
                printf("   (the %s's configurations from the heuristics stopped: their time is up)\n", ps.name());
                return;
            }
            bool listed = false;  // the heuristics answered: an error after that is this configuration's
            try {
                CudnnPlan p;
                ps.build(p.graph, s);
                const double t0 = elapsed();
                std::vector<CudnnDesc> configs = cudnn_engine_configs(p.graph, p.graph.finish(ps.handle), mode);
                listed = true;
                if (i >= configs.size()) break;
                CudnnDesc engine;
                const CudnnSetting setting = config_setting(p.graph, configs[i], &engine);
                ps.offered.push_back(setting);
                ps.surveyed.push_back(setting.text());
                const std::string note = engine_note(engine);
                const std::string label = strprintf("mode %s %zu/%zu, %s%s", mode_name, i, configs.size(),
                                                    setting.text().c_str(), note.c_str());
                std::string why;
                if (!cudnn_plan_from(p, ps.handle, configs[i], &why)) {
                    printf("   %-8s %s: refused (%s)\n", ps.name(), label.c_str(), why.c_str());
                    continue;
                }
                ps.row(p, label, elapsed() - t0, setting, note.empty());
            } catch (const std::exception& e) {
                printf("   %-8s mode %s %zu: %s\n", ps.name(), mode_name, i, e.what());
                if (!listed) break;  // the mode's heuristics fail: they would for every configuration
            }
        }
    }
}

// The sweep: every engine that takes the pass's graph, at every setting of its knobs not surveyed
// already, the heuristics' engines first; a row for each setting that makes a plan, a line for each
// engine with how many cuDNN refused. Until `end` s.
static void survey_sweep(PassSurvey& ps, const CudnnShape& s, const std::function<double()>& elapsed, double end) {
    if (ps.train_bits.empty()) return;  // no reference for the bits
    std::vector<int64_t> order;
    for (const CudnnSetting& o : ps.offered)
        if (std::find(order.begin(), order.end(), o.engine) == order.end()) order.push_back(o.engine);
    int64_t count = 0;
    try {
        count = ps.engine_count(s);
    } catch (const std::exception& e) {
        printf("   %-8s sweep: %s\n", ps.name(), e.what());
        return;
    }
    for (int64_t i = 0; i < count; i++)
        if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
    for (int64_t index : order) {
        std::vector<CudnnSetting> settings;
        try {
            CudnnGraph g;
            ps.build(g, s);
            std::vector<CudnnKnob> knobs;
            if (!cudnn_engine_for(g, g.finish(ps.handle), index, &knobs)) continue;  // the engine does not take the graph
            settings = knob_settings(index, knobs);
        } catch (const std::exception& e) {
            printf("   %-8s sweep, engine %lld: %s\n", ps.name(), (long long)index, e.what());
            continue;
        }
        int refused = 0, made = 0, seen = 0;
        for (const CudnnSetting& setting : settings) {
            if (elapsed() > end) {
                printf("   %-8s sweep, engine %lld: %d of %zu settings made plans, %d refused, %d surveyed before; the "
                       "sweep stopped: its time is up\n",
                       ps.name(), (long long)index, made, settings.size(), refused, seen);
                return;
            }
            if (std::find(ps.surveyed.begin(), ps.surveyed.end(), setting.text()) != ps.surveyed.end()) {
                seen++;
                continue;
            }
            ps.surveyed.push_back(setting.text());
            try {
                CudnnPlan p;
                ps.build(p.graph, s);
                const double t0 = elapsed();
                std::vector<CudnnKnob> knobs;
                CudnnDesc engine = cudnn_engine_for(p.graph, p.graph.finish(ps.handle), index, &knobs);
                CudnnDesc config = engine ? cudnn_config_for(p.graph, engine, setting) : nullptr;
                std::string why;
                if (!config || !cudnn_plan_from(p, ps.handle, config, &why)) {
                    refused++;
                    continue;
                }
                made++;
                const std::string note = engine_note(engine);
                ps.row(p, "sweep, " + setting.text() + note, elapsed() - t0, setting, note.empty());
            } catch (const std::exception& e) {
                printf("   %-8s sweep, %s: %s\n", ps.name(), setting.text().c_str(), e.what());
            }
        }
        printf("   %-8s sweep, engine %lld: %d of %zu settings made plans, %d refused, %d surveyed before\n", ps.name(),
               (long long)index, made, settings.size(), refused, seen);
    }
}

// The sweep's settings of each engine that takes a pass's graph, which needs no device: every
// combination of its knobs' values, each once, each value in its knob's range, each read back
// from the text TRAIN_CUDNN_BACKWARD takes (and malformed texts refused).
static void check_sweep_settings(const CudnnShape& s) {
    for (int backward = 0; backward < 2; backward++) {
        PassSurvey ps{backward == 1};
        const std::string name = strprintf("the sweep's settings of the %s graph %s", ps.name(), shape_name(s).c_str());
        try {
            const int64_t count = ps.engine_count(s);
            int engines = 0;
            size_t total = 0;
            bool right = true;
            for (int64_t index = 0; index < count; index++) {
                CudnnGraph g;
                ps.build(g, s);
                std::vector<CudnnKnob> knobs;
                if (!cudnn_engine_for(g, g.finish(nullptr), index, &knobs)) continue;
                const std::vector<CudnnSetting> settings = knob_settings(index, knobs);
                size_t want = 1;
                for (const CudnnKnob& k : knobs)
                    want *= (size_t)std::min(kSweepValues, (k.max - k.min) / std::max<int64_t>(1, k.stride) + 1);
                std::vector<std::string> texts;
                for (const CudnnSetting& t : settings) {
                    texts.push_back(t.text());
                    CudnnSetting back;  // as TRAIN_CUDNN_BACKWARD takes it
                    right = right && cudnn_parse_setting(t.arg(), &back) && back.text() == t.text();
                    right = right && t.engine == index && t.knobs.size() == knobs.size();
                    for (size_t j = 0; right && j < knobs.size(); j++)
                        right = t.knobs[j].first == knobs[j].type && t.knobs[j].second >= knobs[j].min &&
                                t.knobs[j].second <= knobs[j].max;
                }
                std::sort(texts.begin(), texts.end());
                right = right && settings.size() == want && std::unique(texts.begin(), texts.end()) == texts.end();
                engines++;
                total += settings.size();
            }
            for (const char* bad : {"", "x", "6:", "6:24", "6:24=", "6:24=1,", "6;24=1", "6:99=1", "-6", "6:24=1 "}) {
                CudnnSetting ignored;
                right = right && !cudnn_parse_setting(bad, &ignored);
            }
            report(right && engines > 0, name, strprintf("%d of %lld engines take the graph, %zu settings", engines,
                                                         (long long)count, total));
        } catch (const std::exception& e) {
            report(false, name, e.what());
        }
    }
}

// One layer's random inputs and outputs on the device, and its two passes as PassSurvey runs and
// reads them: the backward pass from the forward outputs of ./train's plan (keep_forward_outputs).
struct LayerRuns {
    size_t qk_n, qkv_n, out_n, rows;
    bf16 *qk, *qkv, *dout, *out, *out_train, *dqk, *dqkv;
    float *lse, *lse_train, *delta;
    PassSurvey forward{false}, backward{true};

    LayerRuns(cudnnHandle_t handle, const CudnnShape& s) {
        qk_n = (size_t)s.B * s.T * (s.H + s.Hkv) * s.D;
        qkv_n = (size_t)s.B * s.T * (s.H + 2 * s.Hkv) * s.D;
        out_n = (size_t)s.B * s.T * s.H * s.D;
        rows = (size_t)s.B * s.H * s.T;
        Rng rng{(uint64_t)s.T * 11 + s.H};
        qk = upload_bf16(random_values(qk_n, 1.0f, rng));
        qkv = upload_bf16(random_values(qkv_n, 1.0f, rng));
        dout = upload_bf16(random_values(out_n, 1.0f, rng));
        for (bf16** p : {&out, &out_train}) cudaCheck(cudaMalloc(p, out_n * sizeof(bf16)));
        cudaCheck(cudaMalloc(&dqk, qk_n * sizeof(bf16)));
        cudaCheck(cudaMalloc(&dqkv, qkv_n * sizeof(bf16)));
        cudaCheck(cudaMemset(dqkv, 0, qkv_n * sizeof(bf16)));
        for (float** p : {&lse, &lse_train, &delta}) cudaCheck(cudaMalloc(p, rows * sizeof(float)));
        // the results of each pass, each bf16 or float exactly as a float
        auto concatenated = [](std::vector<float> a, const std::vector<float>& b) {
            a.insert(a.end(), b.begin(), b.end());
            return a;
        };
        forward.run = [this, handle, s](CudnnPlan& p, void* w) {
            cudnn_attention_run_forward(handle, p, w, out, lse, qk, qkv, s.H, s.Hkv, s.D);
        };
        forward.results = [this, concatenated] { return concatenated(download_bf16(out, out_n), download(lse, rows)); };
        forward.keep_forward_outputs = [this] {
            cudaCheck(cudaMemcpy(out_train, out, out_n * sizeof(bf16), cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemcpy(lse_train, lse, rows * sizeof(float), cudaMemcpyDeviceToDevice));
        };
        backward.run = [this, handle, s](CudnnPlan& p, void* w) {
            cudnn_attention_run_backward(handle, p, w, dqk, dqkv, delta, dout, out_train, lse_train, qk, qkv, s.H, s.Hkv,
                                         s.D);
        };
        backward.results = [this, concatenated] {
            return concatenated(download_bf16(dqk, qk_n), download_bf16(dqkv, qkv_n));
        };
        forward.flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0;
        backward.flops = 2.5 * forward.flops;
        forward.handle = backward.handle = handle;
    }
    LayerRuns(const LayerRuns&) = delete;
    ~LayerRuns() {
        for (void* p : {(void*)qk, (void*)qkv, (void*)dout, (void*)out, (void*)out_train, (void*)dqk, (void*)dqkv,
                        (void*)lse, (void*)lse_train, (void*)delta})
            cudaCheck(cudaFree(p));
    }
};

static void survey_engines(cudnnHandle_t handle, const CudnnShape& s) {
    const char* seconds_text = getenv("CUDNN_SURVEY_SECONDS");
    const double budget = seconds_text ? atof(seconds_text) : 30.0;
    const auto start = std::chrono::steady_clock::now();
    const std::function<double()> elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    LayerRuns layer(handle, s);
    PassSurvey &forward = layer.forward, &backward = layer.backward;
    printf("cuDNN's engines for %s (a survey: no checks):\n", shape_name(s).c_str());
    survey_offered(forward, s, elapsed, 0.15 * budget);
    if (!forward.train_bits.empty()) survey_offered(backward, s, elapsed, 0.3 * budget);
    else printf("   backward (no survey without ./train's forward plan's outputs)\n");
    survey_sweep(backward, s, elapsed, 0.8 * budget);
    survey_sweep(forward, s, elapsed, budget);
    for (const PassSurvey* ps : {&forward, &backward}) {
        if (ps->train_bits.empty()) continue;
        printf("   fastest %-8s with ./train's bits, the same twice: %s, %.3f ms (./train's plan %.3f ms)\n", ps->name(),
               ps->best_same.c_str(), ps->best_same_ms, ps->train_ms);
        printf("   fastest %-8s with the same bits twice: %s, %.3f ms\n", ps->name(), ps->best_twice.c_str(),
               ps->best_twice_ms);
    }
}

// ./train's plan of each pass made again from its setting, as TRAIN_CUDNN_FORWARD and
// TRAIN_CUDNN_BACKWARD make one (cudnn_make_plan_with): the same bits.
static void check_plan_with_setting(cudnnHandle_t handle, const CudnnShape& s) {
    LayerRuns layer(handle, s);
    for (PassSurvey* ps : {&layer.forward, &layer.backward}) {
        const std::string name = strprintf("cuDNN %s %s: ./train's plan made again from its setting", ps->name(),
                                           shape_name(s).c_str());
        void *workspace = nullptr, *again_workspace = nullptr;
        try {
            CudnnPlan train, again;
            ps->build(train.graph, s);
            std::string why;
            CudnnSetting setting;
            for (CudnnDesc config : cudnn_engine_configs(train.graph, train.graph.finish(handle), CUDNN_HEUR_MODE_A))
                if (cudnn_plan_from(train, handle, config, &why)) {  // cudnn_make_plan's choice: the first that finalises
                    CudnnDesc engine;
                    setting = config_setting(train.graph, config, &engine);
                    break;
                }
            ps->build(again.graph, s);
            if (setting.engine < 0 || !cudnn_make_plan_with(again, handle, setting, &why)) {
                report(false, name, setting.engine < 0 ? "no plan from the heuristics" : setting.text() + ": " + why);
                continue;
            }
            cudaCheck(cudaMalloc(&workspace, std::max<int64_t>(1, train.workspace_bytes)));
            cudaCheck(cudaMalloc(&again_workspace, std::max<int64_t>(1, again.workspace_bytes)));
            ps->run(train, workspace);
            const std::vector<float> want = ps->results();
            if (ps->keep_forward_outputs) ps->keep_forward_outputs();
            ps->run(again, again_workspace);
            report(same_bits(ps->results(), want), name, setting.arg());
        } catch (const std::exception& e) {
            report(false, name, e.what());
        }
        for (void* w : {workspace, again_workspace}) cudaCheck(cudaFree(w));
    }
}

int main(int argc, char** argv) {
    bool graph_only = argc == 2 && strcmp(argv[1], "--graph-only") == 0;
    bool engines = argc == 2 && strcmp(argv[1], "--engines") == 0;
    if (argc > 1 && !graph_only && !engines) fail("usage: %s [--graph-only | --engines]", argv[0]);
    if (engines) setvbuf(stdout, nullptr, _IOLBF, 0);  // the survey's rows survive a crash in cuDNN
    std::string why, from;
    if (!cudnn_load(&from, &why) && graph_only) {  // make test's run on a machine without the library: nothing to check
        printf("(%s: the graphs not checked)\n", why.c_str());
        return 0;
    }
    if (!why.empty()) {
        report(false, "cuDNN", why);
        printf("\n%d passed, %d failed\n", g_passed, g_failed);
        return 1;
    }
    printf("cuDNN %zu%s\n", g_cudnn.get_version(), from.empty() ? "" : (", from " + from).c_str());
    // The layers the timings are for come first: a failure that ends the process (an illegal memory
    // access in cuDNN) then loses the least.
    const CudnnShape shapes[] = {
        {4, 2048, 8, 8, 64},    // the d22 layer
        {8, 2048, 8, 8, 64},    // the same at 8 x 2048
        {4, 2048, 16, 8, 128},  // Qwen3-0.6B's layer
        {2, 256, 4, 4, 64},     // small, H == Hkv
        {2, 200, 8, 2, 64},     // GQA 8:2, T not a multiple of 64
        {1, 300, 4, 2, 128},    // head_dim 128, T not a multiple of 64
    };
    if (graph_only) {
        check_unfit_rules();
        for (const CudnnShape& s : shapes) check_graphs(s);
        check_sweep_settings(shapes[1]);
    } else if (require_gpu()) {
        cudnnHandle_t handle = nullptr;
        try {
            cudnn_check(g_cudnn.create(&handle), "create a handle");
            cudnn_check(g_cudnn.set_stream(handle, 0), "set the stream");
        } catch (const std::exception& e) {
            report(false, "cuDNN handle", e.what());
        }
        const size_t version = g_cudnn.get_version();
        std::string unfit = cudnn_attention_unfit(version, {1, 128, 1, 1, 64});
        if (!unfit.empty()) report(false, "cuDNN version", unfit);
        else if (handle && engines) {
            std::string why = cudnn_attention_unfit(version, shapes[1]);
            if (!why.empty()) printf("(%s left out: %s)\n", shape_name(shapes[1]).c_str(), why.c_str());
            else survey_engines(handle, shapes[1]);
        } else if (handle) {
            for (const CudnnShape& s : shapes) {
                std::string why = cudnn_attention_unfit(version, s);
                if (!why.empty()) printf("(%s left out: %s)\n", shape_name(s).c_str(), why.c_str());
                else experiment(handle, s, s.T == 2048);
            }
            if (cudnn_attention_unfit(version, shapes[1]).empty()) check_plan_with_setting(handle, shapes[1]);
        }
        if (handle) g_cudnn.destroy(handle);
    }
    printf("\n%d passed, %d failed\n", g_passed, g_failed);
    return test_exit_code();
}
#else
int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "--graph-only") == 0) {  // make test's run: nothing to check
        printf("(this build has no cuDNN, no cudnn_graph.h: the graphs not checked)\n");
        return 0;
    }
    report(false, "cuDNN", "this build has no cuDNN (no cudnn_graph.h)");
    printf("\n%d passed, %d failed\n", g_passed, g_failed);
    return 1;
}
#endif
