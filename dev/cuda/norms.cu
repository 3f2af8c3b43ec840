// Checks and times the normalisation kernels against the CPU backend: RMSNorm forward and backward
// (llmc/rmsnorm.cuh) and the per-head QK-norm with RoPE, forward and backward (llmc/qknorm_rope.cuh),
// with the candidates' forward (items loaded ahead, the queries' norms) against ./train's, bit for
// bit; and the gain gradients' column sums run one launch a job against all in one.
// Build: make build/dev_norms (nvcc); run: ./build/dev_norms. Exit status 1 if a check fails.
#include <cstring>
#include "dev/cuda/common.h"
#include "llmc/model_cpu.h"
#include "llmc/qknorm_rope.cuh"
#include "llmc/rmsnorm.cuh"

static void check_rmsnorm(int N, int C) {
    Rng rng{(uint64_t)N * 31 + C};
    std::vector<float> x = random_values((size_t)N * C, 1.5f, rng), g = random_values(C, 1.0f, rng);
    std::vector<float> dy = random_values((size_t)N * C, 0.1f, rng), dx0 = random_values((size_t)N * C, 0.1f, rng);
    // CPU reference
    std::vector<float> out((size_t)N * C), rstd(N), dx = dx0, dg(C, 0.0f);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), g.data(), N, C, 1e-5f);
    rmsnorm_backward(dx.data(), dg.data(), dy.data(), x.data(), rstd.data(), g.data(), N, C);
    // GPU
    bf16 *d_x = upload_bf16(x), *d_g = upload_bf16(g), *d_dy = upload_bf16(dy), *d_dx = upload_bf16(dx0), *d_out;
    float *d_rstd, *d_dg, *d_scratch;
    cudaCheck(cudaMalloc(&d_out, (size_t)N * C * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));
    d_dg = upload(std::vector<float>(C, 0.0f));
    cudaCheck(cudaMalloc(&d_scratch, rmsnorm_backward_scratch_floats(N, C) * sizeof(float)));
    rmsnorm_forward(d_out, d_rstd, d_x, d_g, N, C, 1e-5f, 0, false);
    rmsnorm_backward(d_dx, d_dg, d_scratch, d_dy, d_x, d_rstd, d_g, N, C, 0);
    std::string tag = " N" + std::to_string(N) + " C" + std::to_string(C);
    compare_to_reference("rmsnorm forward" + tag, download_bf16(d_out, out.size()), out);
    compare_to_reference("rmsnorm rstd" + tag, download(d_rstd, N), rstd);
    compare_to_reference("rmsnorm backward dx" + tag, download_bf16(d_dx, dx.size()), dx);
    compare_to_reference("rmsnorm backward dgain" + tag, download(d_dg, C), dg);
    float fwd = time_ms([&] { rmsnorm_forward(d_out, d_rstd, d_x, d_g, N, C, 1e-5f, 0, false); });
    double bytes = 2.0 * N * C * 2, bwd_bytes = 4.0 * N * C * 2;  // backward: x, dy, dx read, dx written
    printf("   rmsnorm%s: forward %.3f ms (%.0f GB/s)\n", tag.c_str(), fwd, bytes / fwd / 1e6);
    if (rmsnorm_forward_vec_supports(C, {d_out, d_x, d_g})) {  // the vectorised forward (./train's), into fresh buffers
        bf16* v_out;
        float* v_rstd;
        cudaCheck(cudaMalloc(&v_out, (size_t)N * C * sizeof(bf16)));
        cudaCheck(cudaMalloc(&v_rstd, N * sizeof(float)));
        cudaCheck(cudaMemset(v_out, 0xFF, (size_t)N * C * sizeof(bf16)));  // NaN: an element not written shows
        rmsnorm_forward(v_out, v_rstd, d_x, d_g, N, C, 1e-5f, 0, true);
        compare_to_reference("rmsnorm forward, vectorised" + tag, download_bf16(v_out, out.size()), out);
        // rstd from float32 sums of the same bf16-exact squares in another order: a few 1e-7 apart,
        // far under 1e-5, which a chunk left out of the sum would not be.
        std::vector<float> got_rstd = download(v_rstd, N);
        check_close("rmsnorm rstd, vectorised" + tag, got_rstd.data(), rstd.data(), N, 1e-5, 0.0);
        float ms = time_ms([&] { rmsnorm_forward(v_out, v_rstd, d_x, d_g, N, C, 1e-5f, 0, true); });
        printf("   rmsnorm%s: forward, vectorised %.3f ms (%.0f GB/s, %.2fx the general kernel's speed)\n", tag.c_str(), ms,
               bytes / ms / 1e6, fwd / ms);
        for (void* p : {(void*)v_out, (void*)v_rstd}) cudaCheck(cudaFree(p));
    }
    // Each of the two backward kernels that rmsnorm_backward chooses between, where it applies: the
    // same answers, and its time.
    bool vec_takes = rmsnorm_backward_vec_supports(C, d_dx, d_dy, d_x, d_g);
    for (bool vec : {false, true}) {
        if (vec && !vec_takes) continue;
        bf16* k_dx = upload_bf16(dx0);
        float* k_dg = upload(std::vector<float>(C, 0.0f));
        auto backward = [&] {
            if (vec) rmsnorm_backward_vec(k_dx, k_dg, d_scratch, d_dy, d_x, d_rstd, d_g, N, C, 0);
            else rmsnorm_backward_rows(k_dx, k_dg, d_scratch, d_dy, d_x, d_rstd, d_g, N, C, 0);
        };
        backward();
        std::string kernel = vec ? ", vectorised kernel" : ", general kernel";
        compare_to_reference("rmsnorm backward dx" + kernel + tag, download_bf16(k_dx, dx.size()), dx);
        compare_to_reference("rmsnorm backward dgain" + kernel + tag, download(k_dg, C), dg);
        float ms = time_ms(backward);
        printf("   rmsnorm%s: backward%s %.3f ms (%.0f GB/s)%s\n", tag.c_str(), kernel.c_str(), ms, bwd_bytes / ms / 1e6,
               vec == vec_takes ? ", the one rmsnorm_backward takes" : "");
        for (void* p : {(void*)k_dx, (void*)k_dg}) cudaCheck(cudaFree(p));
    }
    for (void* p : {(void*)d_x, (void*)d_g, (void*)d_dy, (void*)d_dx, (void*)d_out, (void*)d_rstd, (void*)d_dg, (void*)d_scratch})
        cudaCheck(cudaFree(p));
}

// The float32 outputs that feed the statistics (the keys and queries after their norm, and rstd)
// from the same bf16-exact inputs as the CPU's: float32 sums of D squares in another order, and
// rsqrt's few units of the last place; 1e-5 relative is some 170 u32 (6e-8). A regression to bf16 keys
// (0.4%) fails it.
static bool compare_float32(const std::string& name, const std::vector<float>& got, const std::vector<float>& want) {
    double maxabs = 0;
    for (float w : want) maxabs = std::fmax(maxabs, std::fabs(w));
    if (got.size() != want.size()) {
        report(false, name, "sizes differ");
        return false;
    }
    return check_close(name, got.data(), want.data(), want.size(), 1e-5, 1e-6 * maxabs);
}

// A vector's norm as telemetry.cuh's head_row_stats_vec_kernel computes it from its float32
// elements: lanes of four elements, each lane's squares rounded and added in order
// (sum_of_squares4), the lanes' sums added in group_sum's butterfly (masks G/2 .. 1), the square
// root. fmaf(a, a, 0) is a's square rounded once, and the sums of its results are not contracted.
static float head_records_norm(const float* y, int D) {
    const int G = D / 4;
    std::vector<float> lane(G), next(G);
    for (int j = 0; j < G; j++) {
        float sum = std::fmaf(y[4 * j], y[4 * j], 0.0f);
        for (int i = 1; i < 4; i++) sum = sum + std::fmaf(y[4 * j + i], y[4 * j + i], 0.0f);
        lane[j] = sum;
    }
    for (int mask = G / 2; mask > 0; mask /= 2) {
        for (int j = 0; j < G; j++) next[j] = lane[j] + lane[j ^ mask];
        lane.swap(next);
    }
    return std::sqrt(lane[0]);
}

// The candidates' forward (qk_norm_rope_forward_ahead_kernel) against ./train's vectorised one on
// the same inputs, each output poisoned (all bits set) first: with one and with four items a group,
// the same qk_rope and rstd, without the float32 vectors (a step without statistics) and with them,
// and the same vectors, bit for bit. With the queries' norms (query_norms): the same qk_rope, rstd
// and keys' vectors, bit for bit; each query's first element its vector's norm, the bits that the
// heads' records compute from ./train's vector (head_records_norm) and the CPU's norm within
// compare_float32's tolerance; the rest of its row left as it was. Times each, without the float32
// vectors and with them.
static void check_qk_forward_ahead(int N, int T, int H, int Hkv, int D, bool normalise, const std::vector<float>& normed,
                                   const std::string& tag, const bf16* d_qkv, const bf16* d_gq, const bf16* d_gk,
                                   const float* d_cs, const float* d_sn) {
    const int NH = H + Hkv;
    const size_t vectors = (size_t)N * NH * D;
    bf16* d_rope;
    float *d_normed, *d_rstd;
    cudaCheck(cudaMalloc(&d_rope, vectors * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_normed, vectors * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd, (size_t)N * NH * sizeof(float)));
    struct Outputs { std::vector<uint16_t> rope; std::vector<float> normed, rstd; };
    // items 0: ./train's vectorised kernel; with_vectors false: no float32 vectors asked for
    auto run = [&](int items, bool query_norms, bool with_vectors = true) {
        cudaCheck(cudaMemset(d_rope, 0xFF, vectors * sizeof(bf16)));
        cudaCheck(cudaMemset(d_normed, 0xFF, vectors * sizeof(float)));
        cudaCheck(cudaMemset(d_rstd, 0xFF, (size_t)N * NH * sizeof(float)));
        qk_norm_rope_forward(d_rope, with_vectors ? d_normed : nullptr, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv,
                             D, 1e-5f, normalise, 0, items, query_norms);
        Outputs o{std::vector<uint16_t>(vectors), download(d_normed, vectors), download(d_rstd, (size_t)N * NH)};
        cudaCheck(cudaMemcpy(o.rope.data(), d_rope, vectors * sizeof(bf16), cudaMemcpyDeviceToHost));
        return o;
    };
    auto same = [](const auto& a, const auto& b) {
        return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    const Outputs vec = run(0, false);
    for (int items : {1, kQkForwardAheadItems}) {
        const Outputs bare = run(items, false, false);
        report(same(bare.rope, vec.rope) && same(bare.rstd, vec.rstd),
               strprintf("qk norm forward, %d item(s) a group loaded ahead, no float32 vectors: ./train's qk_rope and "
                         "rstd, bit for bit%s", items, tag.c_str()));
        const Outputs o = run(items, false);
        report(same(o.rope, vec.rope) && same(o.normed, vec.normed) && same(o.rstd, vec.rstd),
               strprintf("qk norm forward, %d item(s) a group loaded ahead: ./train's qk_rope, rstd and float32 vectors, bit for bit%s",
                         items, tag.c_str()));
        const Outputs q = run(items, true);
        std::vector<float> norm_got, norm_want;
        bool keys_same = same(q.rope, vec.rope) && same(q.rstd, vec.rstd), rest_untouched = true, records_bits = true;
        uint32_t poison = 0xFFFFFFFFu;
        for (size_t item = 0; item < (size_t)N * NH; item++) {
            const size_t row = item * D;
            if ((int)(item % NH) >= H) {
                keys_same &= memcmp(&q.normed[row], &vec.normed[row], D * sizeof(float)) == 0;
                continue;
            }
            double sq = 0;
            for (int i = 0; i < D; i++) sq += (double)normed[row + i] * normed[row + i];
            norm_got.push_back(q.normed[row]);
            norm_want.push_back((float)std::sqrt(sq));
            const float records_norm = head_records_norm(&vec.normed[row], D);
            records_bits &= memcmp(&q.normed[row], &records_norm, sizeof(float)) == 0;
            for (int i = 1; i < D; i++) rest_untouched &= memcmp(&q.normed[row + i], &poison, sizeof poison) == 0;
        }
        report(keys_same, strprintf("qk norm forward with the queries' norms, %d item(s) a group: ./train's qk_rope, rstd and "
                                    "keys' vectors, bit for bit%s", items, tag.c_str()));
        compare_float32(strprintf("qk norm forward with the queries' norms, %d item(s) a group: each query's norm%s", items,
                                  tag.c_str()),
                        norm_got, norm_want);
        report(records_bits, strprintf("qk norm forward with the queries' norms, %d item(s) a group: each norm the bits "
                                       "the heads' records compute from the query's vector%s", items, tag.c_str()));
        report(rest_untouched, strprintf("qk norm forward with the queries' norms, %d item(s) a group: the rest of a query's "
                                         "row not written%s", items, tag.c_str()));
    }
    auto ms = [&](int items, float* out, bool query_norms) {
        return time_ms([&] {
            qk_norm_rope_forward(d_rope, out, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f, normalise, 0,
                                 items, query_norms);
        });
    };
    const float plain = ms(0, nullptr, false), ahead = ms(kQkForwardAheadItems, nullptr, false);
    const float stats = ms(0, d_normed, false), stats_ahead = ms(kQkForwardAheadItems, d_normed, false),
                stats_norms = ms(kQkForwardAheadItems, d_normed, true);
    printf("   qk norm + rope forward, %d items a group loaded ahead%s: %.3f ms (%.2fx the vectorised one); with the float32 "
           "vectors %.3f ms (%.2fx), with the queries' norms in place of theirs %.3f ms (%.2fx)\n",
           kQkForwardAheadItems, tag.c_str(), ahead, plain / ahead, stats_ahead, stats / stats_ahead, stats_norms,
           stats / stats_norms);
    for (void* p : {(void*)d_rope, (void*)d_normed, (void*)d_rstd}) cudaCheck(cudaFree(p));
}

static void check_qk_norm_rope(int B, int T, int H, int Hkv, int qk_norm = QK_NORM_GAIN, int D = 64) {
    ModelConfig c;
    c.qk_norm = qk_norm;
    bool normalise = qk_norm != QK_NORM_NONE;
    c.n_head = H;
    c.n_kv_head = Hkv;
    c.head_dim = D;
    c.d_model = H * D;
    c.max_seq_len = T;
    int N = B * T, NH = H + Hkv, QKV = c.qkv_dim(), half = D / 2;
    Rng rng{(uint64_t)N * 7 + H};
    std::vector<float> qkv = random_values((size_t)N * QKV, 2.0f, rng), gq = random_values(D, 1.0f, rng);
    std::vector<float> gk = random_values(D, 1.0f, rng), dqk = random_values((size_t)N * NH * D, 0.1f, rng);
    std::vector<float> cs((size_t)T * half), sn((size_t)T * half);
    rope_tables(c, T, cs.data(), sn.data());
    std::vector<float> normed((size_t)N * NH * D), rope((size_t)N * NH * D), rstd((size_t)N * NH);
    qk_norm_rope_forward(normed.data(), rope.data(), rstd.data(), qkv.data(), gq.data(), gk.data(), cs.data(), sn.data(), B, T, c);
    std::vector<float> dqkv = qkv, dg_q(D, 0.0f), dg_k(D, 0.0f);  // the value part stays as it was
    qk_norm_rope_backward(dqkv.data(), dg_q.data(), dg_k.data(), dqk.data(), qkv.data(), rstd.data(), gq.data(), gk.data(),
                          cs.data(), sn.data(), B, T, c);
    bf16 *d_qkv = upload_bf16(qkv), *d_gq = upload_bf16(gq), *d_gk = upload_bf16(gk), *d_dqk = upload_bf16(dqk);
    bf16 *d_rope, *d_dqkv = upload_bf16(qkv);
    float *d_cs = upload(cs), *d_sn = upload(sn), *d_rstd, *d_dg = upload(std::vector<float>(2 * D, 0.0f)), *d_scratch, *d_normed;
    cudaCheck(cudaMalloc(&d_rope, (size_t)N * NH * D * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_normed, (size_t)N * NH * D * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd, (size_t)N * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&d_scratch, (size_t)qk_norm_rope_backward_blocks(N, NH) * 2 * D * sizeof(float)));
    std::string tag = " B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + ":" + std::to_string(Hkv) +
                      " D" + std::to_string(D) + " qk-norm " + kQkNormNames[qk_norm];
    std::vector<float> dg_cpu(dg_q);
    dg_cpu.insert(dg_cpu.end(), dg_k.begin(), dg_k.end());
    // Runs one implementation's forward and backward from fresh outputs (the forward's poisoned with
    // NaN, all bits set, so that an element a kernel leaves unwritten fails), compares them with the
    // CPU backend, and times them (ms forward, ms backward).
    auto check = [&](const std::string& impl, auto forward, auto backward) {
        cudaCheck(cudaMemset(d_rope, 0xFF, (size_t)N * NH * D * sizeof(bf16)));
        cudaCheck(cudaMemset(d_normed, 0xFF, (size_t)N * NH * D * sizeof(float)));
        cudaCheck(cudaMemset(d_rstd, 0xFF, (size_t)N * NH * sizeof(float)));
        cudaCheck(cudaMemcpy(d_dqkv, d_qkv, (size_t)N * QKV * sizeof(bf16), cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemset(d_dg, 0, 2 * D * sizeof(float)));
        forward(d_normed);
        backward();
        std::string name = impl + tag;
        compare_float32("qk norm forward, before RoPE (float32)" + name, download(d_normed, normed.size()), normed);
        compare_to_reference("qk norm forward, after RoPE" + name, download_bf16(d_rope, rope.size()), rope);
        compare_float32("qk norm rstd (float32)" + name, download(d_rstd, rstd.size()), rstd);
        compare_to_reference("qk norm backward dqkv (values untouched)" + name, download_bf16(d_dqkv, dqkv.size()), dqkv);
        compare_to_reference("qk norm backward gains" + name, download(d_dg, 2 * D), dg_cpu);
        return std::make_pair(time_ms([&] { forward(nullptr); }), time_ms(backward));
    };
    auto [fwd, bwd] = check(
        "",
        [&](float* normed_out) {
            qk_norm_rope_forward_simple(d_rope, normed_out, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f, normalise, 0);
        },
        [&] {
            qk_norm_rope_backward_simple(d_dqkv, d_dg, d_dg + D, d_scratch, d_dqk, d_qkv, d_rstd, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv,
                                  D, normalise, 0);
        });
    printf("   qk norm + rope%s: forward %.3f ms, backward %.3f ms\n", tag.c_str(), fwd, bwd);
    if (qk_norm_rope_vec_supports(D, {d_rope, d_normed, d_qkv, d_dqkv, d_dqk, d_gq, d_gk, d_cs, d_sn})) {
        auto [fwd_vec, bwd_vec] = check(
            ", vec",
            [&](float* normed_out) {
                qk_norm_rope_forward_vec(d_rope, normed_out, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f,
                                         normalise, 0);
            },
            [&] {
                qk_norm_rope_backward_vec(d_dqkv, d_dg, d_dg + D, d_scratch, d_dqk, d_qkv, d_rstd, d_gq, d_gk, d_cs, d_sn, N, T,
                                          H, Hkv, D, normalise, 0);
            });
        printf("   qk norm + rope, vec%s: forward %.3f ms (%.2fx), backward %.3f ms (%.2fx)\n", tag.c_str(), fwd_vec,
               fwd / fwd_vec, bwd_vec, bwd / bwd_vec);
        check_qk_forward_ahead(N, T, H, Hkv, D, normalise, normed, tag, d_qkv, d_gq, d_gk, d_cs, d_sn);
    }
    for (void* p : {(void*)d_qkv, (void*)d_gq, (void*)d_gk, (void*)d_dqk, (void*)d_rope, (void*)d_normed, (void*)d_dqkv,
                    (void*)d_cs, (void*)d_sn, (void*)d_rstd, (void*)d_dg, (void*)d_scratch})
        cudaCheck(cudaFree(p));
}

// The gain gradients' column sums of a backward pass: each job by its own column_sum launch, and all
// of them by column_sums_run's one launch (./train's): the same bits, and the times of the two. The
// jobs are a d22 backward pass's at 8 x 2048 (L = 22: 2L + 1 RMSNorm gains of 512 columns from
// 1,024 partial rows, 2L QK-norm gains of 64 columns from 1,024 rows of 128), or fewer layers; each
// output starts from its own random values (the sums add into them).
static void check_column_sums(int L, int parts) {
    const int C = 512, D = 64;
    struct Job { int cols, stride; size_t at; };  // at: where its first partial row starts
    std::vector<Job> jobs;
    size_t floats = 0;
    for (int j = 0; j < 2 * L + 1; j++, floats += (size_t)parts * C) jobs.push_back({C, C, floats});
    for (int l = 0; l < L; l++, floats += (size_t)parts * 2 * D)  // the q gain's columns, then the k gain's
        for (int half = 0; half < 2; half++) jobs.push_back({D, 2 * D, floats + half * D});
    jobs.push_back({80, 80, floats});  // and a width whose last tile of 32 columns is half full
    floats += (size_t)parts * 80;
    Rng rng{(uint64_t)L * 131 + parts};
    float* d_partial = upload(random_values(floats, 0.01f, rng));
    std::vector<float> out0 = random_values((2 * L + 1) * C + 2 * L * D + 80, 0.1f, rng);
    float *d_once = upload(out0), *d_deferred = upload(out0);
    auto queue = [&](float* outs, ColumnSumJobs* defer) {
        size_t out_at = 0;
        for (const Job& job : jobs) {
            column_sum_or_defer(outs + out_at, d_partial + job.at, parts, job.cols, job.stride, 0, defer);
            out_at += job.cols;
        }
        if (defer) column_sums_run(*defer, 0);
    };
    ColumnSumJobs deferred;
    queue(d_once, nullptr);
    queue(d_deferred, &deferred);
    const std::vector<float> once = download(d_once, out0.size()), all = download(d_deferred, out0.size());
    std::string tag = strprintf(" (%zu jobs of %d partial rows)", jobs.size(), parts);
    report(memcmp(once.data(), all.data(), once.size() * sizeof(float)) == 0 && once != out0,
           "gain column sums in one launch: the bits of one launch a job" + tag);
    const float ms_once = time_ms([&] { queue(d_once, nullptr); });
    const float ms_all = time_ms([&] { queue(d_deferred, &deferred); });
    printf("   gain column sums%s: one launch a job %.3f ms, one launch in all %.3f ms (%.2fx)\n", tag.c_str(), ms_once,
           ms_all, ms_once / ms_all);
    for (void* p : {(void*)d_partial, (void*)d_once, (void*)d_deferred}) cudaCheck(cudaFree(p));
}

int main() {
    if (!require_gpu()) return 0;
    check_rmsnorm(37, 96);
    check_rmsnorm(8 * 2048, 512);
    check_rmsnorm(1007, 512);      // a last block of 15 rows
    check_rmsnorm(4 * 256, 256);   // d6's width
    check_rmsnorm(4 * 256, 768);   // d12's
    check_rmsnorm(4 * 512, 1024);  // Qwen3-0.6B's
    check_rmsnorm(4 * 512, 1536);  // the vectorised forward's widest register tile, in part and in full
    check_rmsnorm(4 * 512, 2048);
    check_qk_norm_rope(2, 17, 4, 2);
    check_qk_norm_rope(2, 17, 4, 2, QK_NORM_NONE);
    check_qk_norm_rope(3, 100, 4, 2);  // 1,800 (token, head) items: a last block of 8 of 256
    check_qk_norm_rope(2, 17, 4, 2, QK_NORM_GAIN, 16);   // the narrowest and widest heads of the vectorised kernels
    check_qk_norm_rope(2, 17, 4, 2, QK_NORM_GAIN, 32);
    check_qk_norm_rope(2, 17, 4, 2, QK_NORM_GAIN, 256);
    check_qk_norm_rope(8, 2048, 8, 8);
    check_qk_norm_rope(2, 17, 16, 8, QK_NORM_GAIN, 128);  // Qwen3's heads
    check_qk_norm_rope(2, 17, 4, 2, QK_NORM_NONE, 128);   // Llama's
    check_column_sums(22, 1024);  // d22's at 8 x 2048 (89 jobs) and one more: one launch
    check_column_sums(1, 3);      // a model of one layer: 6 jobs
    check_column_sums(30, 64);    // 122 jobs: two launches
    return test_exit_code();
}
