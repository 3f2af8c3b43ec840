// Checks and times the cuBLASLt products of llmc/matmul.cuh against OpenBLAS on the CPU: the
// forward product (with and without the fused residual), both backward products (the weight
// gradient accumulates in float32), a padded output stride as the classifier uses, and the
// batched Gram matrices of the telemetry. Shapes of the d22 model and of the parity test's model.
// Then the tuning of each product's algorithm (matmul_tune, ./train's) on the same
// data: the algorithms it may keep give the first choice's bits (check_tuning), and its times.
// With --algorithms it instead times every algorithm cuBLASLt's heuristic offers for the products of
// the d22 model's layers and runs check_tuning on them (sweep_algorithms below), on inputs filled
// on the device: quick enough for a device session. Build: make build/dev_matmul. Each shape is
// announced before it runs, so an unsupported one is named by the last line printed.
#include "dev/cuda/common.h"
#include "llmc/matmul.cuh"
#include "llmc/model_cpu.h"

// A device buffer's bytes.
static std::vector<unsigned char> download_bytes(const void* d, size_t bytes) {
    return download((const unsigned char*)d, bytes);
}

// The tuning (matmul_tune) on one product, on this program's data: `first`, the output's bytes
// from the heuristic's first choice; `reset`, the output's initial bytes restored before each run.
//   every algorithm it may keep (matmul_same_bits_algorithms, judged on its own stand-ins) gives them;
//   a product it tunes had its stand-ins run (else the line above would pass on nothing);
//   the tuned Matmul's product, as ./train runs it, gives them;
//   a fresh untuned Matmul's (the heuristic asked for one algorithm) gives them: the first
//   of the eight the tuning is offered is the untuned choice.
static void check_tuning(Matmul& mm, Matmul& tuned, const std::string& name, const MatmulProblem& p, size_t out_bytes,
                            const std::vector<unsigned char>& first, const std::function<void()>& reset) {
    MatmulDescs md = matmul_describe(p);
    std::vector<cublasLtMatmulHeuristicResult_t> algos = matmul_heuristics(mm, md, kTuneAlgorithms);
    std::vector<SameBitsAlgorithm> passed = matmul_same_bits_algorithms(mm, p, md, algos, 0);
    std::string differ, kept;
    for (const SameBitsAlgorithm& a : passed) {
        reset();
        kept += " #" + std::to_string(a.index);
        if (matmul_try(mm, p, md, algos[a.index].algo, 0) != CUBLAS_STATUS_SUCCESS) {
            differ += " #" + std::to_string(a.index) + " (refused)";
        } else if (download_bytes(p.d, out_bytes) != first) {
            differ += " #" + std::to_string(a.index);
        }
    }
    matmul_release(md);
    report(differ.empty(), "matmul tuning: the algorithms it may keep give the first choice's bits, " + name,
           (passed.empty() ? std::string("it keeps the first choice") : "it may keep" + kept) + strprintf(" of %zu", algos.size()) +
               (differ.empty() ? "" : "; on this data these do not:" + differ));
    bool tunable = matmul_tunes(p, algos);
    report(!tunable || (!passed.empty() && passed[0].index == 0), "matmul tuning: its stand-ins run, " + name,
           tunable ? strprintf("%zu timed", passed.size())
                   : "not tuned (too small, one algorithm offered, or a first choice that splits K)");
    Matmul fresh;  // no choice cached yet
    matmul_init(fresh);
    for (Matmul* m : {&tuned, &fresh}) {
        reset();
        matmul_lt(*m, p, 0);
        bool same = download_bytes(p.d, out_bytes) == first;
        report(same, std::string(m == &tuned ? "matmul tuning: the tuned product gives" : "matmul: the untuned product gives") +
                         " the first of the eight algorithms' bits, " + name, same ? "the same bits" : "other bits");
    }
    matmul_free(fresh);
    reset();
}

static void check_linear(Matmul& mm, Matmul& tuned, int N, int IC, int OC, int ld_out, bool residual) {
    std::string tag = "N" + std::to_string(N) + " IC" + std::to_string(IC) + " OC" + std::to_string(OC) +
                      (ld_out != OC ? " ld" + std::to_string(ld_out) : "") + (residual ? " +residual" : "");
    printf("   checking %s\n", tag.c_str());
    Rng rng{(uint64_t)N * 131 + IC * 7 + OC};
    std::vector<float> inp = random_values((size_t)N * IC, 1.0f, rng), W = random_values((size_t)OC * IC, 0.05f, rng);
    std::vector<float> res = random_values((size_t)N * ld_out, 1.0f, rng), dout = random_values((size_t)N * ld_out, 0.1f, rng);
    std::vector<float> dW0 = random_values((size_t)OC * IC, 0.01f, rng);
    // CPU reference with the same strides.
    std::vector<float> inp_c = inp, out((size_t)N * OC), dout_c((size_t)N * OC), dinp((size_t)N * IC), dW = dW0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dout_c[(size_t)n * OC + o] = dout[(size_t)n * ld_out + o];
    matmul_forward(out.data(), inp_c.data(), W.data(), N, IC, OC);
    if (residual)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += res[(size_t)n * ld_out + o];
    matmul_backward(dinp.data(), dW.data(), dout_c.data(), inp_c.data(), W.data(), N, IC, OC, false);
    bf16 *d_inp = upload_bf16(inp), *d_W = upload_bf16(W), *d_res = upload_bf16(res), *d_dout = upload_bf16(dout), *d_out, *d_dinp;
    float* d_dW = upload(dW0);
    size_t out_bytes = (size_t)N * ld_out * sizeof(bf16), dinp_bytes = (size_t)N * IC * sizeof(bf16),
           dW_bytes = dW0.size() * sizeof(float);
    cudaCheck(cudaMalloc(&d_out, out_bytes));
    cudaCheck(cudaMalloc(&d_dinp, dinp_bytes));
    // Outputs start as NaN (0xffff), so that an element never written shows, and the padding up to
    // ld_out is the same bytes in every run.
    auto nan_out = [&] { cudaCheck(cudaMemset(d_out, 0xff, out_bytes)); };
    auto nan_dinp = [&] { cudaCheck(cudaMemset(d_dinp, 0xff, dinp_bytes)); };
    auto initial_dW = [&] { cudaCheck(cudaMemcpy(d_dW, dW0.data(), dW_bytes, cudaMemcpyHostToDevice)); };
    nan_out();
    nan_dinp();
    matmul_forward(mm, d_out, d_inp, d_W, residual ? d_res : nullptr, N, IC, OC, 0, ld_out);
    matmul_backward(mm, d_dinp, d_dW, d_dout, d_inp, d_W, N, IC, OC, 0, ld_out);
    std::vector<float> got = download_bf16(d_out, (size_t)N * ld_out), got_packed((size_t)N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) got_packed[(size_t)n * OC + o] = got[(size_t)n * ld_out + o];
    compare_to_reference("matmul forward " + tag, got_packed, out);
    compare_to_reference("matmul backward dinp " + tag, download_bf16(d_dinp, dinp.size()), dinp);
    compare_to_reference("matmul backward dW (accumulated) " + tag, download(d_dW, dW.size()), dW);
    // The tuning (matmul_tune) keeps the first choice's bits, on this data too.
    const std::vector<unsigned char> first_out = download_bytes(d_out, out_bytes), first_dinp = download_bytes(d_dinp, dinp_bytes),
                                     first_dW = download_bytes(d_dW, dW_bytes);
    check_tuning(mm, tuned, "forward " + tag, linear_forward_problem(d_out, d_inp, d_W, residual ? d_res : nullptr, N, IC, OC, ld_out),
                    out_bytes, first_out, nan_out);
    check_tuning(mm, tuned, "dinp " + tag, linear_dinp_problem(d_dinp, d_dout, d_W, N, IC, OC, ld_out), dinp_bytes, first_dinp,
                    nan_dinp);
    check_tuning(mm, tuned, "dW " + tag, linear_dweight_problem(d_dW, d_dout, d_inp, N, IC, OC, ld_out), dW_bytes, first_dW,
                    initial_dW);
    auto forward = [&](Matmul& m) { matmul_forward(m, d_out, d_inp, d_W, residual ? d_res : nullptr, N, IC, OC, 0, ld_out); };
    auto backward = [&](Matmul& m) { matmul_backward(m, d_dinp, d_dW, d_dout, d_inp, d_W, N, IC, OC, 0, ld_out); };
    float fwd = time_ms([&] { forward(mm); }), bwd = time_ms([&] { backward(mm); });
    float t_fwd = time_ms([&] { forward(tuned); }), t_bwd = time_ms([&] { backward(tuned); });
    double flop = 2.0 * N * IC * OC;
    printf("   %s: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s); tuned %.3f and %.3f ms\n",
           tag.c_str(), fwd, flop / fwd / 1e9, bwd, 2 * flop / bwd / 1e9, t_fwd, t_bwd);
    for (void* p : {(void*)d_inp, (void*)d_W, (void*)d_res, (void*)d_dout, (void*)d_out, (void*)d_dinp, (void*)d_dW})
        cudaCheck(cudaFree(p));
}

// Gram matrices K_h^T K_h of Hkv key heads inside rows of NH heads, as telemetry_layer computes them.
static void check_gram(Matmul& mm, int N, int H, int Hkv) {
    int D = 64, NH = H + Hkv;
    std::string tag = "gram N" + std::to_string(N) + " H" + std::to_string(H) + ":" + std::to_string(Hkv);
    printf("   checking %s\n", tag.c_str());
    Rng rng{(uint64_t)N + H};
    std::vector<float> qk = random_values((size_t)N * NH * D, 1.0f, rng), want((size_t)Hkv * D * D, 0.0f);
    for (int h = 0; h < Hkv; h++)
        for (int n = 0; n < N; n++) {
            const float* k = &qk[((size_t)n * NH + H + h) * D];
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++) want[((size_t)h * D + i) * D + j] += k[i] * k[j];
        }
    bf16* d_qk = upload_bf16(qk);
    float* d_gram;
    cudaCheck(cudaMalloc(&d_gram, want.size() * sizeof(float)));
    const bf16* keys = d_qk + (size_t)H * D;
    matmul_lt(mm, {d_gram, keys, keys, nullptr, D, D, N, false, true, NH * D, NH * D, D, true, Hkv, D, D, (long long)D * D}, 0);
    // Products of bf16 keys are exact in float32; the float32 sums over N tokens (another order
    // than the CPU's) err by ~sqrt(N) u32 = 8e-6 of the diagonal (the largest entries, ~N) for N =
    // 16384: 1e-4 of the largest entry for the off-diagonal entries, small by cancellation.
    compare_to_reference("matmul " + tag, download(d_gram, want.size()), want, 1e-4);
    cudaCheck(cudaFree(d_qk));
    cudaCheck(cudaFree(d_gram));
}

// --algorithms: the algorithms cuBLASLt's heuristic offers for a product (up to kSweepAlgorithms),
// each timed, with its configuration and whether it gives the heuristic's first choice's bits: one
// that is faster and gives the same bits could replace the first choice without changing any run
// (split-K sums in another order; other tiles and stages need not). ./train tunes among them.
static const int kSweepAlgorithms = 8;

// Milliseconds of a d22 step's products: with the heuristic's first choice, with the tuned one
// (matmul_tune), with the fastest algorithm that gives the first choice's bits here, with the
// fastest of all.
struct SweepTotals {
    double first = 0, tuned = 0, same_bits = 0, fastest = 0;
};

static std::string algorithm_config(const cublasLtMatmulAlgo_t& algo) {
    int32_t id = 0;
    uint32_t tile = 0, stages = 0, swizzle = 0;
    uint16_t cluster = 0;
    size_t written;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle,
                                                     &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                                     &written));
    const std::pair<int32_t, uint32_t> split = algorithm_split(algo);
    return strprintf("algo %d tile %u stages %u split-K %d (reduction %u) swizzle %u cluster %u", id, tile, stages,
                     split.first, split.second, swizzle, (unsigned)cluster);
}

// One product's algorithms. `reset` restores the output's initial values (the weight gradient adds
// into what it holds), `calls` is how many times a d22 step runs the product.
static void sweep_product(Matmul& mm, Matmul& tuned, const std::string& name, const MatmulProblem& p, size_t out_bytes,
                          const std::function<void()>& reset, int calls, SweepTotals& totals) {
    MatmulDescs md = matmul_describe(p);
    std::vector<cublasLtMatmulHeuristicResult_t> algos = matmul_heuristics(mm, md, kSweepAlgorithms);
    double flop = 2.0 * p.m * p.n * p.k * p.batch;
    printf("   %s: %zu algorithms\n", name.c_str(), algos.size());
    std::vector<unsigned char> first_bits(out_bytes), bits(out_bytes);
    double first_ms = 0, same_ms = 1e30, fastest_ms = 1e30;
    for (size_t i = 0; i < algos.size(); i++) {
        reset();
        cublasStatus_t status = matmul_try(mm, p, md, algos[i].algo, 0);
        if (status != CUBLAS_STATUS_SUCCESS) {  // offered but refused: said, and the sweep goes on
            printf("     #%zu refused (status %d), %s\n", i, (int)status, algorithm_config(algos[i].algo).c_str());
            if (i == 0) break;
            continue;
        }
        cudaCheck(cudaMemcpy(i == 0 ? first_bits.data() : bits.data(), p.d, out_bytes, cudaMemcpyDeviceToHost));
        bool same = i == 0 || memcmp(bits.data(), first_bits.data(), out_bytes) == 0;
        float ms = time_ms([&] { matmul_run(mm, p, md, algos[i].algo, 0); });
        if (i == 0) first_ms = ms;
        if (same) same_ms = std::min(same_ms, (double)ms);
        fastest_ms = std::min(fastest_ms, (double)ms);
        printf("     #%zu %.4f ms (%.0f TFLOP/s) %s, workspace %zu, %s\n", i, ms, flop / ms / 1e9,
               same ? "the same bits" : "other bits", algos[i].workspaceSize, algorithm_config(algos[i].algo).c_str());
    }
    if (first_ms == 0) {
        report(false, "cuBLASLt runs its first choice for " + name, algos.empty() ? "none offered" : "refused");
    } else {
        totals.first += calls * first_ms;
        totals.same_bits += calls * same_ms;
        totals.fastest += calls * fastest_ms;
        // the tuning's checks, on this data (another pattern than its stand-ins'), and its time
        check_tuning(mm, tuned, name, p, out_bytes, first_bits, reset);
        const cublasLtMatmulAlgo_t& kept = tuned.algos.at(md.key).algo;  // as the other times: no descriptors made
        totals.tuned += calls * time_ms([&] { matmul_run(mm, p, md, kept, 0); });
    }
    reset();
    matmul_release(md);
}

// The three products of a linear layer of N tokens, IC -> OC (output rows ld_out apart), on inputs
// filled on the device (matmul.cuh's fixed pattern: no CPU reference here, the checks have one).
static void sweep_linear(Matmul& mm, Matmul& tuned, int N, int IC, int OC, int ld_out, bool residual, int calls, SweepTotals& totals) {
    std::string tag = "N" + std::to_string(N) + " IC" + std::to_string(IC) + " OC" + std::to_string(OC) +
                      (ld_out != OC ? " ld" + std::to_string(ld_out) : "") + (residual ? " +residual" : "");
    size_t n_inp = (size_t)N * IC, n_W = (size_t)OC * IC, n_out = (size_t)N * ld_out;
    auto bf16s = [](size_t n) {
        bf16* p;
        cudaCheck(cudaMalloc(&p, n * sizeof(bf16)));
        return p;
    };
    bf16 *inp = bf16s(n_inp), *W = bf16s(n_W), *dout = bf16s(n_out), *out = bf16s(n_out), *dinp = bf16s(n_inp);
    bf16* res = residual ? bf16s(n_out) : nullptr;
    float *dW0, *dW;
    cudaCheck(cudaMalloc(&dW0, n_W * sizeof(float)));
    cudaCheck(cudaMalloc(&dW, n_W * sizeof(float)));
    fill_pattern(inp, n_inp, false, 1, 0);
    fill_pattern(W, n_W, false, 2, 0);
    fill_pattern(dout, n_out, false, 3, 0);
    fill_pattern(dW0, n_W, true, 4, 0);  // as floats: the weight gradient's first values
    if (residual) fill_pattern(res, n_out, false, 5, 0);
    auto nan_out = [&] { cudaCheck(cudaMemset(out, 0xff, n_out * sizeof(bf16))); };
    auto nan_dinp = [&] { cudaCheck(cudaMemset(dinp, 0xff, n_inp * sizeof(bf16))); };
    auto initial_dW = [&] { cudaCheck(cudaMemcpy(dW, dW0, n_W * sizeof(float), cudaMemcpyDeviceToDevice)); };
    sweep_product(mm, tuned, "forward " + tag, linear_forward_problem(out, inp, W, res, N, IC, OC, ld_out), n_out * sizeof(bf16),
                  nan_out, calls, totals);
    sweep_product(mm, tuned, "backward dinp " + tag, linear_dinp_problem(dinp, dout, W, N, IC, OC, ld_out), n_inp * sizeof(bf16),
                  nan_dinp, calls, totals);
    sweep_product(mm, tuned, "backward dW " + tag, linear_dweight_problem(dW, dout, inp, N, IC, OC, ld_out), n_W * sizeof(float),
                  initial_dW, calls, totals);
    for (void* p : {(void*)inp, (void*)W, (void*)res, (void*)dout, (void*)out, (void*)dinp, (void*)dW0, (void*)dW})
        if (p) cudaCheck(cudaFree(p));
}

static void sweep_algorithms(Matmul& mm, Matmul& tuned) {
    for (int B : {8, 4}) {
        int N = B * 2048, L = 22;
        printf("d22 at %d x 2048: every algorithm the heuristic offers (up to %d), the heuristic's first choice #0\n", B,
               kSweepAlgorithms);
        SweepTotals t;
        sweep_linear(mm, tuned, N, 512, 1536, 1536, false, L, t);
        sweep_linear(mm, tuned, N, 512, 512, 512, true, L, t);
        sweep_linear(mm, tuned, N, 512, 3072, 3072, false, L, t);
        sweep_linear(mm, tuned, N, 1536, 512, 512, true, L, t);
        sweep_linear(mm, tuned, N, 512, 8192, 8192, false, 1, t);
        printf("d22 at %d x 2048, a step's matrix products: the heuristic's first choices %.3f ms, the tuned %.3f ms "
               "(%.3fx), the fastest with the first choices' bits here %.3f ms (%.3fx), the fastest of all %.3f ms (%.3fx)\n",
               B, t.first, t.tuned, t.first / t.tuned, t.same_bits, t.first / t.same_bits, t.fastest, t.first / t.fastest);
    }
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it comes, should a time limit stop the program
    if (!require_gpu()) return 0;
    Matmul mm, tuned;
    matmul_init(mm);
    matmul_init(tuned);
    tuned.tune = true;
    if (argc > 1 && strcmp(argv[1], "--algorithms") == 0) {
        sweep_algorithms(mm, tuned);
        matmul_free(mm);
        matmul_free(tuned);
        printf("\n%d passed, %d failed\n", g_passed, g_failed);
        return test_exit_code();
    }
    // d22 at B = 8, T = 2048: qkv, attention output, MLP up and down, classifier.
    check_linear(mm, tuned, 16384, 512, 1536, 1536, false);
    check_linear(mm, tuned, 16384, 512, 512, 512, true);
    check_linear(mm, tuned, 16384, 512, 3072, 3072, false);
    check_linear(mm, tuned, 16384, 1536, 512, 512, true);
    check_linear(mm, tuned, 16384, 512, 8192, 8192, false);
    check_gram(mm, 16384, 8, 8);
    // The parity test's model (B = 4, T = 64): V = 320 padded to 384, GQA 4:2, d_ff 192.
    check_gram(mm, 256, 4, 2);
    check_linear(mm, tuned, 256, 256, 512, 512, false);
    check_linear(mm, tuned, 256, 256, 256, 256, true);
    check_linear(mm, tuned, 256, 256, 384, 384, false);
    check_linear(mm, tuned, 256, 192, 256, 256, true);
    check_linear(mm, tuned, 256, 256, 320, 384, false);
    matmul_print_tuning(tuned);
    matmul_free(mm);
    matmul_free(tuned);
    return test_exit_code();
}
