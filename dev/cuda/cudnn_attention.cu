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
//   --engines     checks nothing: a survey of every engine configuration cuDNN offers for the d22
//                 layer at 8 x 2048 (survey_engines), their times and bits beside ./train's plan's.
// CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr make cuDNN say why a graph or plan is refused.
// Build: make build/dev_cudnn_attention.
#include <chrono>
#include <cstdlib>
#include <cstring>
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
// A survey of cuDNN's engines for one layer: every engine configuration its heuristics offer (in
// modes A and FALLBACK; ./train runs mode A's first that finalises), each run on random inputs,
// the backward pass from ./train's plan's forward outputs. A row each: the engine, its knobs and
// what cuDNN says of its determinism, the seconds its plan took to make (the heuristics and the
// finalising), its workspace and time, whether it gives the bits of ./train's plan and the same
// bits twice. It checks nothing: the measurement that a rule choosing another engine than
// ./train's would start from. A program run of its own (--engines), since a faulty engine may
// leave the GPU unusable; it stops after CUDNN_SURVEY_SECONDS (default 30; a third of them for the
// forward pass's configurations) or kSurveyConfigs configurations of a mode.

static const size_t kSurveyConfigs = 12;

// What a configuration runs, for a survey of them: its engine's number among cuDNN's engines, its
// knobs (type=value) and whether cuDNN says its results may differ from run to run.
static std::string cudnn_config_text(CudnnGraph& g, CudnnDesc config) {
    CudnnDesc engine = g.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0, index = -1;
    cudnn_check(g_cudnn.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine),
                "read a configuration's engine");
    cudnn_check(g_cudnn.get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index),
                "read an engine's index");
    std::string text = strprintf("engine %lld", (long long)index);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnn_check(g_cudnn.get_attribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                      CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes),
                "read an engine's numerical notes");
    for (int64_t i = 0; i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) text += " (nondeterministic, cuDNN says)";
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
        text += strprintf("%s%d=%lld", i == 0 ? ", knobs " : " ", (int)type, (long long)value);
    }
    return text;
}

static void survey_engines(cudnnHandle_t handle, const CudnnShape& s) {
    const int NH = s.H + s.Hkv;
    const size_t qk_n = (size_t)s.B * s.T * NH * s.D, qkv_n = (size_t)s.B * s.T * (s.H + 2 * s.Hkv) * s.D;
    const size_t out_n = (size_t)s.B * s.T * s.H * s.D, rows = (size_t)s.B * s.H * s.T;
    const char* seconds_text = getenv("CUDNN_SURVEY_SECONDS");
    const double budget = seconds_text ? atof(seconds_text) : 30.0;
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    Rng rng{(uint64_t)s.T * 11 + s.H};
    bf16 *qk = upload_bf16(random_values(qk_n, 1.0f, rng)), *qkv = upload_bf16(random_values(qkv_n, 1.0f, rng));
    bf16* dout = upload_bf16(random_values(out_n, 1.0f, rng));
    bf16 *out, *dqk, *dqkv, *out_train;
    float *lse, *lse_train, *delta;
    for (bf16** p : {&out, &out_train}) cudaCheck(cudaMalloc(p, out_n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dqk, qk_n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dqkv, qkv_n * sizeof(bf16)));
    cudaCheck(cudaMemset(dqkv, 0, qkv_n * sizeof(bf16)));
    for (float** p : {&lse, &lse_train, &delta}) cudaCheck(cudaMalloc(p, rows * sizeof(float)));
    const double fwd_flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0, bwd_flops = 2.5 * fwd_flops;
    printf("cuDNN's engines for %s (a survey: no checks):\n", shape_name(s).c_str());
    bool have_forward = false;
    for (int backward = 0; backward < 2; backward++) {
        const char* pass = backward ? "backward" : "forward";
        const double pass_end = backward ? budget : budget / 3;
        bool stopped = false;
        auto build = [&](CudnnGraph& g) {
            if (backward) cudnn_attention_backward_graph(g, s);
            else cudnn_attention_forward_graph(g, s);
        };
        auto run = [&](CudnnPlan& p, void* workspace) {
            if (backward)
                cudnn_attention_run_backward(handle, p, workspace, dqk, dqkv, delta, dout, out_train, lse_train, qk, qkv,
                                             s.H, s.Hkv, s.D);
            else cudnn_attention_run_forward(handle, p, workspace, out, lse, qk, qkv, s.H, s.Hkv, s.D);
        };
        auto results = [&] {  // the pass's outputs, each bf16 or float exactly as a float
            std::vector<float> a = backward ? download_bf16(dqk, qk_n) : download_bf16(out, out_n);
            std::vector<float> b = backward ? download_bf16(dqkv, qkv_n) : download(lse, rows);
            a.insert(a.end(), b.begin(), b.end());
            return a;
        };
        // One configuration's row; train_bits: ./train's plan's results, or empty while this is that
        // plan's row (which then fills them). False, with the reason printed, where it did not run.
        auto survey_one = [&](CudnnPlan& p, const std::string& label, double prepare_s, std::vector<float>* train_bits) {
            void* workspace = nullptr;
            if (cudaMalloc(&workspace, std::max<int64_t>(1, p.workspace_bytes)) != cudaSuccess) {
                cudaGetLastError();
                printf("   %-8s %s: no memory for its %.1f MiB of workspace\n", pass, label.c_str(),
                       p.workspace_bytes / 1048576.0);
                return false;
            }
            try {
                run(p, workspace);
                std::vector<float> got = results();
                run(p, workspace);
                const bool twice = same_bits(results(), got);
                if (train_bits->empty()) {
                    *train_bits = got;
                    if (!backward) {  // the backward pass's inputs: ./train's forward outputs
                        cudaCheck(cudaMemcpy(out_train, out, out_n * sizeof(bf16), cudaMemcpyDeviceToDevice));
                        cudaCheck(cudaMemcpy(lse_train, lse, rows * sizeof(float), cudaMemcpyDeviceToDevice));
                    }
                }
                const float ms = time_ms([&] { run(p, workspace); }, 10);
                printf("   %-8s %s: ready in %.2f s, %.1f MiB of workspace, %.3f ms (%.0f TFLOP/s), %s, %s\n", pass,
                       label.c_str(), prepare_s, p.workspace_bytes / 1048576.0, ms,
                       (backward ? bwd_flops : fwd_flops) / ms * 1e-9,
                       same_bits(got, *train_bits) ? "./train's bits" : "OTHER BITS than ./train's",
                       twice ? "the same bits twice" : "OTHER BITS THE SECOND TIME");
            } catch (const std::exception& e) {
                printf("   %-8s %s: %s\n", pass, label.c_str(), e.what());
                cudaCheck(cudaFree(workspace));
                return false;
            }
            cudaCheck(cudaFree(workspace));
            return true;
        };
        // ./train's plan first: its results are the others' reference, and its forward outputs the
        // backward pass's inputs (without them there is no backward survey)
        std::vector<float> train_bits;
        bool reference = false;
        if (!backward || have_forward) {
            try {
                CudnnPlan p;
                build(p.graph);
                const double t0 = elapsed();
                cudnn_make_plan(p, handle);
                reference = survey_one(p, "./train's plan (mode A, " + p.engine + ")", elapsed() - t0, &train_bits);
            } catch (const std::exception& e) {
                printf("   %-8s ./train's plan: %s\n", pass, e.what());
            }
        }
        if (!backward) have_forward = reference;
        if (!reference) {
            printf("   %-8s (no survey without ./train's plan's results)\n", pass);
            continue;
        }
        for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
            const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK";
            for (size_t i = 0; i < kSurveyConfigs; i++) {
                if (elapsed() > pass_end) {  // the forward's configurations take a third, the backward's the rest
                    if (!stopped) printf("   (the %s's survey stopped: its time is up)\n", pass);
                    stopped = true;
                    break;
                }
                bool listed = false;  // the heuristics answered: an error after that is this configuration's
                try {
                    CudnnPlan p;
                    build(p.graph);
                    const double t0 = elapsed();
                    std::vector<CudnnDesc> configs = cudnn_engine_configs(p.graph, p.graph.finish(handle), mode);
                    listed = true;
                    if (i >= configs.size()) break;
                    const std::string label = strprintf("mode %s %zu/%zu, %s", mode_name, i, configs.size(),
                                                        cudnn_config_text(p.graph, configs[i]).c_str());
                    std::string why;
                    if (!cudnn_plan_from(p, handle, configs[i], &why)) {
                        printf("   %-8s %s: refused (%s)\n", pass, label.c_str(), why.c_str());
                        continue;
                    }
                    survey_one(p, label, elapsed() - t0, &train_bits);
                } catch (const std::exception& e) {
                    printf("   %-8s mode %s %zu: %s\n", pass, mode_name, i, e.what());
                    if (!listed) break;  // the mode's heuristics fail: they would for every configuration
                }
            }
        }
    }
    for (void* p : {(void*)qk, (void*)qkv, (void*)dout, (void*)out, (void*)out_train, (void*)dqk, (void*)dqkv,
                    (void*)lse, (void*)lse_train, (void*)delta})
        cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    bool graph_only = argc == 2 && strcmp(argv[1], "--graph-only") == 0;
    bool engines = argc == 2 && strcmp(argv[1], "--engines") == 0;
    if (argc > 1 && !graph_only && !engines) fail("usage: %s [--graph-only | --engines]", argv[0]);
    std::string why;
    if (!cudnn_load(&why) && graph_only) {  // make test's run on a machine without the library: nothing to check
        printf("(%s: the graphs not checked)\n", why.c_str());
        return 0;
    }
    if (!why.empty()) {
        report(false, "cuDNN", why);
        printf("\n%d passed, %d failed\n", g_passed, g_failed);
        return 1;
    }
    printf("cuDNN %zu\n", g_cudnn.get_version());
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
