// Checks and times the telemetry kernels (llmc/telemetry.cuh) against the CPU backend's key_sums
// and query_attention_sums: every statistic of one layer (through telemetry_from_sums) from the
// same post-norm queries and keys (float32) and the same per-row attention accumulators, the
// effective ranks and mean share via the float64 Gram matrices, and the same bits on a second run;
// the Gram products on the float64 tensor cores from the float32 keys (D = 64: all tiles, and the
// upper tiles from registers, which ./train takes) and split over the rows (an alternative) against
// the copy to float64 and one DGEMM, and the vectorised head and attention statistics (./train's,
// "candidate" in the rows printed) against the simpler kernels ("default"), and the heads' records
// from the QK-norm forward's queries' norms (the candidate query_norms) against those from the
// vectors, bit for bit. Times one layer's telemetry, its parts, each way of the Gram products and
// both kernels of each statistic.
// Build: make build/dev_telemetry.
#include <cstring>
#include "dev/cuda/common.h"
#include "llmc/model_cpu.h"
#include "llmc/qknorm_rope.cuh"
#include "llmc/telemetry.cuh"

// The split Gram products (telemetry.cuh) against one DGEMM's, on the same float64 keys: products
// of float32 values are exact in float64, so the two differ only by the order of the sums, N u64
// relative at most (4e-12 for N = 16,384); 1e-11 of the largest entry. Then the same bits twice,
// and both times.
static void check_gram_split(Matmul& mm, const float* d_qk, int N, int H, int Hkv, int D, const std::string& tag) {
    const int W = D + 1;
    size_t n = (size_t)Hkv * W * W;
    double *d_dgemm, *d_split, *d_partial, *d_keys_f64;
    cudaCheck(cudaMalloc(&d_keys_f64, (size_t)Hkv * N * W * sizeof(double)));
    keys_to_f64(d_keys_f64, d_qk, N, H, Hkv, D, 0);
    cudaCheck(cudaMalloc(&d_dgemm, n * sizeof(double)));
    cudaCheck(cudaMalloc(&d_split, n * sizeof(double)));
    cudaCheck(cudaMalloc(&d_partial, gram_split_doubles(Hkv, W) * sizeof(double)));
    auto run_dgemm = [&] {
        cudaCheck(cudaMemset(d_dgemm, 0, n * sizeof(double)));
        gram_products(d_dgemm, d_keys_f64, mm, N, Hkv, W, 0);
    };
    auto run_split = [&] {
        cudaCheck(cudaMemset(d_split, 0, n * sizeof(double)));
        gram_products_split(d_split, d_partial, d_keys_f64, mm, N, Hkv, W, 0);
    };
    run_dgemm();
    run_split();
    std::vector<double> want = download(d_dgemm, n), got = download(d_split, n);
    double largest = 0;
    for (double w : want) largest = std::fmax(largest, std::fabs(w));
    check_close("gram products split over " + std::to_string(gram_slices(N)) + " slices" + tag, got.data(), want.data(), n,
                1e-11, 1e-11 * largest);
    run_split();
    report(download(d_split, n) == got, "gram products split: the same bits twice" + tag);
    float ms_dgemm = time_ms(run_dgemm), ms_split = time_ms(run_split);
    printf("   gram products%s: one DGEMM %.3f ms, split %.3f ms (%.2fx)\n", tag.c_str(), ms_dgemm, ms_split,
           ms_dgemm / ms_split);
    for (void* p : {(void*)d_dgemm, (void*)d_split, (void*)d_partial, (void*)d_keys_f64}) cudaCheck(cudaFree(p));
}

// Why gram_dmma does not apply to these keys, or "" where it does.
static std::string gram_dmma_skipped(int D, const float* d_qk) {
    if (D != 64) return "head_dim " + std::to_string(D);
    if (!gram_dmma_compiled()) return "this build has no sm_90 code for this device";
    return gram_dmma_applies(D, GramKeys{d_qk}) ? "" : "the keys are not 16-byte aligned";
}

// The float64 tensor-core products from the float32 keys, all tiles (gram_products_mma) and the upper
// tiles only (gram_products_sym, ./train's at D = 64), against the copy to float64 and one DGEMM (./train's at
// other widths): as for the split products, they differ only by the order of the sums. The scratch
// is poisoned with NaN first, so a slice's entry a kernel does not write shows. Then the same bits
// twice, and the times of all three (the DGEMM with its copy).
static void check_gram_from_float32(Matmul& mm, const float* d_qk, int N, int H, int Hkv, int D, const std::string& tag) {
    const int W = D + 1;
    size_t n = (size_t)Hkv * W * W, partial_doubles = gram_split_doubles(Hkv, W, kGramMmaSlices);
    double *d_dgemm, *d_got, *d_partial, *d_keys_f64;
    cudaCheck(cudaMalloc(&d_dgemm, n * sizeof(double)));
    cudaCheck(cudaMalloc(&d_got, n * sizeof(double)));
    cudaCheck(cudaMalloc(&d_partial, partial_doubles * sizeof(double)));
    cudaCheck(cudaMalloc(&d_keys_f64, (size_t)Hkv * N * W * sizeof(double)));
    auto run_dgemm = [&] {
        cudaCheck(cudaMemset(d_dgemm, 0, n * sizeof(double)));
        keys_to_f64(d_keys_f64, d_qk, N, H, Hkv, D, 0);
        gram_products(d_dgemm, d_keys_f64, mm, N, Hkv, W, 0);
    };
    run_dgemm();
    std::vector<double> want = download(d_dgemm, n);
    double largest = 0;
    for (double w : want) largest = std::fmax(largest, std::fabs(w));
    const float ms_dgemm = time_ms(run_dgemm);
    printf("   keys to float64 + gram products%s: DGEMM %.3f ms\n", tag.c_str(), ms_dgemm);
    struct Way {
        const char* name;
        int slices;
        bool (*products)(double*, double*, const float*, int, int, int, int, cudaStream_t);
    } ways[] = {{"on the float64 tensor cores", gram_mma_slices(N),
                 [](double* g, double* p, const float* q, int N, int H, int Hkv, int D, cudaStream_t s) {
                     gram_products_mma(g, p, q, N, H, Hkv, D, s);
                     return true;
                 }},
                {"on the float64 tensor cores, upper tiles from registers (./train's)", gram_sym_slices(N, Hkv),
                 gram_products_sym},
                // the candidate gram_dmma, Hopper's products of 16 x 8 at each K (./train_candidates' kGramDmmaK)
                {"as m16n8k4 (gram_dmma)", gram_dmma_slices(N, Hkv, 4),
                 [](double* g, double* p, const float* q, int N, int H, int Hkv, int D, cudaStream_t s) {
                     return gram_products_dmma(g, p, GramKeys{q}, N, H, Hkv, D, s, 4);
                 }},
                {"as m16n8k8 (gram_dmma)", gram_dmma_slices(N, Hkv, 8),
                 [](double* g, double* p, const float* q, int N, int H, int Hkv, int D, cudaStream_t s) {
                     return gram_products_dmma(g, p, GramKeys{q}, N, H, Hkv, D, s, 8);
                 }},
                {"as m16n8k16 (gram_dmma)", gram_dmma_slices(N, Hkv, 16),
                 [](double* g, double* p, const float* q, int N, int H, int Hkv, int D, cudaStream_t s) {
                     return gram_products_dmma(g, p, GramKeys{q}, N, H, Hkv, D, s, 16);
                 }}};
    for (const Way& way : ways) {
        if (strstr(way.name, "gram_dmma") && !gram_dmma_applies(D, GramKeys{d_qk})) {
            printf("   gram products %s%s: skipped, %s\n", way.name, tag.c_str(), gram_dmma_skipped(D, d_qk).c_str());
            continue;
        }
        bool ran = true;
        auto run = [&] {
            cudaCheck(cudaMemset(d_got, 0, n * sizeof(double)));
            ran = way.products(d_got, d_partial, d_qk, N, H, Hkv, D, 0);
        };
        cudaCheck(cudaMemset(d_partial, 0xFF, partial_doubles * sizeof(double)));  // NaN
        run();
        std::string what = std::string("gram products ") + way.name;
        report(ran, what + " take the keys" + tag);
        if (!ran) continue;
        std::vector<double> got = download(d_got, n);
        check_close(what + " over " + std::to_string(way.slices) + " slices" + tag, got.data(), want.data(), n, 1e-11,
                    1e-11 * largest);
        run();
        report(download(d_got, n) == got, what + ": the same bits twice" + tag);
        const float ms = time_ms(run);
        printf("   gram products %s%s: %.3f ms (%.2fx the DGEMM's speed)\n", way.name, tag.c_str(), ms, ms_dgemm / ms);
    }
    for (void* p : {(void*)d_dgemm, (void*)d_got, (void*)d_partial, (void*)d_keys_f64}) cudaCheck(cudaFree(p));
}

// A candidate part of the telemetry against the default, on the same inputs: run(sums, partial,
// candidate) adds the part into sums, which start cleared (telemetry_sums_clear: maxima at
// -infinity). The scratch is poisoned with NaN before the candidate runs, so a record it does not
// write shows. Within rtol and atol (the maxima, where both are -infinity, compare equal), then the
// same bits twice, and both times. Returns the candidate's sums.
template <typename Run>
static std::vector<double> check_candidate_part(const std::string& part, const ModelConfig& c, const TelemetrySums& lay,
                                                int N, double rtol, double atol, const std::string& tag, Run run) {
    double *d_default, *d_candidate;
    float* d_partial;
    const size_t partial_floats = telemetry_partial_floats(N, c);
    cudaCheck(cudaMalloc(&d_default, lay.total * sizeof(double)));
    cudaCheck(cudaMalloc(&d_candidate, lay.total * sizeof(double)));
    cudaCheck(cudaMalloc(&d_partial, partial_floats * sizeof(float)));
    auto cleared_run = [&](double* sums, bool candidate) {
        telemetry_sums_clear_kernel<<<64, 256>>>(sums, lay);
        cuda_check_launch();
        run(sums, d_partial, candidate);
    };
    cleared_run(d_default, false);
    cudaCheck(cudaMemset(d_partial, 0xFF, partial_floats * sizeof(float)));  // NaN
    cleared_run(d_candidate, true);
    const std::vector<double> want = download(d_default, lay.total), got = download(d_candidate, lay.total);
    std::vector<double> w = want, g = got;
    for (size_t i = 0; i < lay.total; i++)
        if (std::isinf(w[i]) && g[i] == w[i]) g[i] = w[i] = 0.0;
    check_close(part + ", candidate against the default" + tag, g.data(), w.data(), lay.total, rtol, atol);
    cleared_run(d_candidate, true);
    report(download(d_candidate, lay.total) == got, part + ", candidate: the same bits twice" + tag);
    float ms_default = time_ms([&] { run(d_default, d_partial, false); });
    float ms_candidate = time_ms([&] { run(d_candidate, d_partial, true); });
    printf("   %s%s: default %.3f ms, candidate %.3f ms (%.2fx)\n", part.c_str(), tag.c_str(), ms_default, ms_candidate,
           ms_default / ms_candidate);
    for (void* p : {(void*)d_default, (void*)d_candidate, (void*)d_partial}) cudaCheck(cudaFree(p));
    return got;
}

// The vectorised head statistics (head_row_stats_vec_kernel, ./train's): the same per-row terms up to the order
// of a row's float32 sum of squares, summed in float32 per block of 256 rows in another order, two
// levels deep in both kernels (about 40 additions each: 72 u32 = 4.3e-6 apart at worst), so within
// 1e-5 relative and 1e-6 N absolute for the unit-vector sums, whose signs cancel.
static void check_head_stats_vec(const ModelConfig& c, const TelemetrySums& lay, const float* d_qk, int N, int layer,
                                 const std::string& tag) {
    if (!head_row_stats_vec_supports(c.head_dim, d_qk)) return;
    check_candidate_part("head statistics", c, lay, N, 1e-5, 1e-6 * N, tag, [&](double* sums, float* partial, bool vec) {
        head_statistics(sums, lay, partial, d_qk, N, c, layer, 0, vec);
    });
}

// The candidate gram_key_records: the key heads' records from gram_products_dmma_kernel (the query
// heads' alone from the records' kernel) against the records' kernel's for every head, each with the
// Gram products of gram_dmma (which the records leave as they are). The records
// in the same float32 terms but for a key's sum of squares (8 columns a lane and 8 lanes, against 4
// and 16: a few u32 apart), summed in float32 over about 40 keys a lane and then in double, against
// 32 rows a lane, the block's groups in float32, then double: within 1e-5 relative and 1e-6 N
// absolute, as check_head_stats_vec; times both.
static void check_gram_key_records(const ModelConfig& c, const TelemetrySums& lay, const float* d_qk, int N, int layer,
                                   const std::string& tag) {
    Matmul mm;
    matmul_init(mm);
    for (int K : {4, 8, 16})
        check_candidate_part("head statistics and Gram products at K = " + std::to_string(K) +
                                 ", key records from the Gram products",
                             c, lay, N, 1e-5, 1e-6 * N, tag, [&](double* sums, float* partial, bool in_gram) {
                                 head_statistics(sums, lay, partial, d_qk, N, c, layer, 0, true, false, !in_gram);
                                 key_gram(sums, lay, partial, nullptr, mm, d_qk, N, c, layer, 0, true, K, in_gram);
                             });
    matmul_free(mm);
}


// The candidate attention statistics (attention_row_sums_kernel and its finish): float32 sums of up
// to 64 terms a thread, then over the block's warps, against 4 terms a thread, the block's warps, and
// the chunks in double, so within 1e-5 relative (the default's 72 u32 = 4.3e-6 at worst) and 1e-6 N
// absolute; the largest logits exactly.
static void check_attention_stats_split(const ModelConfig& c, const TelemetrySums& lay, const float* d_rows,
                                        const std::vector<float>& row_stats, int B, int T, int layer,
                                        const std::string& tag) {
    auto run = [&](double* sums, float* partial, bool split) {
        attention_statistics(sums, lay, partial, d_rows, B, T, c, layer, 0, split);
    };
    const std::vector<double> got = check_candidate_part("attention statistics", c, lay, B * T, 1e-5, 1e-6 * B * T, tag, run);
    const int H = c.n_head;
    const size_t rows = (size_t)B * H * T;
    bool same_max = true;
    for (int h = 0; h < H; h++) {
        float m = -INFINITY;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) m = std::fmax(m, row_stats[ATTN_STAT_LOGIT_MAX * rows + ((size_t)b * H + h) * T + t]);
        same_max = same_max && got[lay.max_logit(layer, h)] == (double)m;
    }
    report(same_max, "attention statistics, candidate: the largest logits exactly" + tag);
}

// The candidate gram_from_projection, from check_query_norms' projections and ./train's forward's
// float32 vectors and rstd (d_vectors, d_rstd): the Gram matrices and key records (gram_key_records)
// computed from the key projections, their rstd and the k gain are those from the float32 keys, bit
// for bit, at K = 4, 8 and 16 (the keys are computed as the forward computes them); and the
// candidates' forward with key_vectors false writes none of the key heads' float32 rows (a buffer
// set to NaN first stays NaN there) and the query heads' as ./train's. Times the Gram products both
// ways.
static void check_gram_from_projection(const ModelConfig& c, const TelemetrySums& lay, int N, int T, int layer,
                                       const std::string& tag, const bf16* d_qkv, const bf16* d_gq, const bf16* d_gk,
                                       const float* d_cs, const float* d_sn, const float* d_rstd,
                                       const float* d_vectors) {
    const int H = c.n_head, Hkv = c.n_kv_head, NH = H + Hkv, D = c.head_dim;
    const size_t vectors = (size_t)N * NH * D;
    const GramKeys projection{nullptr, d_qkv, d_rstd, d_gk};
    float* d_partial;
    double* d_sums;
    cudaCheck(cudaMalloc(&d_partial, telemetry_partial_floats(N, c) * sizeof(float)));
    cudaCheck(cudaMalloc(&d_sums, lay.total * sizeof(double)));
    Matmul mm;
    matmul_init(mm);
    for (int K : {4, 8, 16}) {
        auto products = [&](const GramKeys* keys) {  // null: from the float32 keys
            key_gram(d_sums, lay, d_partial, nullptr, mm, d_vectors, N, c, layer, 0, true, K, true, keys);
        };
        auto sums = [&](const GramKeys* keys) {
            telemetry_sums_clear_kernel<<<64, 256>>>(d_sums, lay);
            cuda_check_launch();
            products(keys);
            return download(d_sums, lay.total);
        };
        const std::vector<double> from_vectors = sums(nullptr), from_projection = sums(&projection);
        report(memcmp(from_vectors.data(), from_projection.data(), lay.total * sizeof(double)) == 0,
               strprintf("Gram products and key records at K = %d from the keys' projections: those from the float32 "
                         "keys, bit for bit%s", K, tag.c_str()));
        printf("   Gram products and key records%s at K = %d: from the float32 keys %.3f ms, from their projections "
               "%.3f ms\n", tag.c_str(), K, time_ms([&] { products(nullptr); }), time_ms([&] { products(&projection); }));
    }
    // the forward without the keys' float32 rows
    bf16* d_rope;
    float *d_rstd_again, *d_out;
    cudaCheck(cudaMalloc(&d_rope, vectors * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_out, vectors * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd_again, (size_t)N * NH * sizeof(float)));
    const std::vector<float> want = download(d_vectors, vectors), want_rstd = download(d_rstd, (size_t)N * NH);
    for (int items : {1, kQkForwardAheadItems}) {  // ITEMS 1 runs where qk_forward_ahead is off
        cudaCheck(cudaMemset(d_out, 0xFF, vectors * sizeof(float)));
        qk_norm_rope_forward(d_rope, d_out, d_rstd_again, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f, true, 0,
                             items, false, false);
        const std::vector<float> got = download(d_out, vectors);
        bool keys_untouched = true, queries_same = true;
        for (size_t e = 0; e < vectors; e++) {
            if ((int)(e / D % NH) >= H) keys_untouched &= std::isnan(got[e]);
            else queries_same &= memcmp(&got[e], &want[e], sizeof(float)) == 0;
        }
        report(keys_untouched && queries_same && download(d_rstd_again, (size_t)N * NH) == want_rstd,
               strprintf("QK-norm forward without the keys' float32 rows (%d item(s) a group): none written, the "
                         "queries' rows and every rstd those of ./train's forward, bit for bit%s", items, tag.c_str()));
    }
    matmul_free(mm);
    for (void* p : {(void*)d_partial, (void*)d_sums, (void*)d_rope, (void*)d_rstd_again, (void*)d_out}) cudaCheck(cudaFree(p));
}

// The candidate query_norms: the heads' records from the QK-norm forward's queries' norms (each in
// its row's first element, qk_norm_rope_forward_ahead_kernel) against those from the float32 vectors
// of ./train's forward, on the same projections: the same sums, bit for bit (the forward computes a
// norm as the records' kernel does). Both forwards' buffers are set to NaN first. Times the records
// both ways. Then, where gram_dmma applies, the candidate gram_from_projection (check_gram_from_projection).
static void check_query_norms(const ModelConfig& c, const TelemetrySums& lay, int B, int T, int layer,
                              const std::string& tag) {
    const int N = B * T, H = c.n_head, Hkv = c.n_kv_head, NH = H + Hkv, D = c.head_dim, half = D / 2;
    Rng rng{(uint64_t)N * 13 + H};
    ModelConfig rc = c;
    rc.max_seq_len = T;
    std::vector<float> cs((size_t)T * half), sn((size_t)T * half);
    rope_tables(rc, T, cs.data(), sn.data());
    bf16 *d_qkv = upload_bf16(random_values((size_t)N * c.qkv_dim(), 2.0f, rng)),
         *d_gq = upload_bf16(random_values(D, 1.0f, rng)), *d_gk = upload_bf16(random_values(D, 1.0f, rng)), *d_rope;
    float *d_cs = upload(cs), *d_sn = upload(sn), *d_rstd, *d_vectors, *d_norms, *d_partial;
    double* d_sums;
    const size_t vectors = (size_t)N * NH * D;
    cudaCheck(cudaMalloc(&d_rope, vectors * sizeof(bf16)));
    cudaCheck(cudaMalloc(&d_rstd, (size_t)N * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&d_vectors, vectors * sizeof(float)));
    cudaCheck(cudaMalloc(&d_norms, vectors * sizeof(float)));
    cudaCheck(cudaMalloc(&d_partial, telemetry_partial_floats(N, c) * sizeof(float)));
    cudaCheck(cudaMalloc(&d_sums, lay.total * sizeof(double)));
    if (!qk_norm_rope_vec_supports(D, {d_rope, d_vectors, d_qkv, d_gq, d_gk, d_cs, d_sn}) ||
        !head_row_stats_vec_supports(D, d_vectors))
        fail("dev_telemetry: the queries' norms need head_dim 64 or 128, not %d", D);
    auto records = [&](const float* qk_normed, bool query_norms) {
        telemetry_sums_clear_kernel<<<64, 256>>>(d_sums, lay);
        cuda_check_launch();
        head_statistics(d_sums, lay, d_partial, qk_normed, N, c, layer, 0, true, query_norms);
        return download(d_sums, lay.total);
    };
    cudaCheck(cudaMemset(d_vectors, 0xFF, vectors * sizeof(float)));
    qk_norm_rope_forward(d_rope, d_vectors, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f, true, 0);
    const std::vector<double> from_vectors = records(d_vectors, false);
    double norm_sum = 0;
    for (int h = 0; h < H; h++) norm_sum += from_vectors[lay.query(layer, h) + QS_NORM];
    for (int items : {1, kQkForwardAheadItems}) {
        cudaCheck(cudaMemset(d_norms, 0xFF, vectors * sizeof(float)));
        qk_norm_rope_forward(d_rope, d_norms, d_rstd, d_qkv, d_gq, d_gk, d_cs, d_sn, N, T, H, Hkv, D, 1e-5f, true, 0, items,
                             true);
        const std::vector<double> from_norms = records(d_norms, true);
        report(memcmp(from_vectors.data(), from_norms.data(), lay.total * sizeof(double)) == 0 &&
                   std::isfinite(norm_sum) && norm_sum > 0,
               strprintf("head statistics from the queries' norms of the QK-norm forward (%d item(s) a group): those from "
                         "their vectors, bit for bit%s", items, tag.c_str()));
    }
    if (gram_dmma_skipped(D, d_vectors).empty())
        check_gram_from_projection(c, lay, N, T, layer, tag, d_qkv, d_gq, d_gk, d_cs, d_sn, d_rstd, d_vectors);
    const float ms_vectors = time_ms([&] { head_statistics(d_sums, lay, d_partial, d_vectors, N, c, layer, 0); });
    const float ms_norms = time_ms([&] { head_statistics(d_sums, lay, d_partial, d_norms, N, c, layer, 0, true, true); });
    printf("   head statistics%s: from the queries' vectors %.3f ms, from their norms %.3f ms (%.2fx)\n", tag.c_str(),
           ms_vectors, ms_norms, ms_vectors / ms_norms);
    for (void* p : {(void*)d_qkv, (void*)d_gq, (void*)d_gk, (void*)d_rope, (void*)d_cs, (void*)d_sn, (void*)d_rstd,
                    (void*)d_vectors, (void*)d_norms, (void*)d_partial, (void*)d_sums})
        cudaCheck(cudaFree(p));
}

static void check_layer(int B, int T, int H, int Hkv, int layer, int D = 64) {
    ModelConfig c;
    c.n_layer = layer + 1;
    c.n_head = H;
    c.n_kv_head = Hkv;
    c.head_dim = D;
    c.d_model = H * D;
    int N = B * T, NH = H + Hkv;
    Rng rng{(uint64_t)N * 11 + H};
    // Keys with a few dominant axes, as trained keys have, so that the statistics are not all alike.
    std::vector<float> qk = random_values((size_t)N * NH * D, 1.0f, rng);
    for (size_t i = 0; i < qk.size(); i++)
        if (i % D < 3) qk[i] = qk[i] * 6.0f + 2.0f;
    // and a key of norm 0 now and then (no unit vector to add), in the last key head
    for (int n = 5; n < N; n += 97) std::fill_n(qk.begin() + ((size_t)n * NH + NH - 1) * D, D, 0.0f);
    size_t rows = (size_t)B * H * T;
    std::vector<float> row_stats(ATTN_NUM_ROW_STATS * rows);
    for (size_t r = 0; r < rows; r++) {
        row_stats[ATTN_STAT_ENTROPY * rows + r] = (float)(3.0 * rng_uniform(rng));
        row_stats[ATTN_STAT_SINK * rows + r] = (float)rng_uniform(rng);
        row_stats[ATTN_STAT_MAXP * rows + r] = (float)rng_uniform(rng);
        row_stats[ATTN_STAT_LOGIT_MAX * rows + r] = 10.0f * rng_normal(rng);
        row_stats[ATTN_STAT_DOC_START * rows + r] = rng_uniform(rng) < 0.5 ? 0.0f : (float)rng_uniform(rng);
    }
    std::vector<float> g_q = random_values(D, 1.0f, rng), g_k = random_values(D, 1.0f, rng);
    TelemetrySums lay = telemetry_sums_layout(c);
    std::vector<double> want_sums(lay.total);
    telemetry_sums_clear(want_sums.data(), lay);
    std::vector<double> keys_f64((size_t)Hkv * N * (D + 1));
    key_sums(want_sums.data(), lay, layer, qk.data(), keys_f64.data(), N, c);
    query_attention_sums(want_sums.data(), lay, layer, qk.data(), row_stats.data(), B, T, c);
    std::copy(g_q.begin(), g_q.end(), want_sums.begin() + lay.gains + (size_t)layer * 2 * D);
    std::copy(g_k.begin(), g_k.end(), want_sums.begin() + lay.gains + (size_t)layer * 2 * D + D);
    want_sums[lay.count] = N;
    want_sums[lay.doc_view] = N / 3;  // counted on the host, as the token count
    Telemetry want;
    telemetry_from_sums(want, want_sums.data(), lay, c);

    float *d_qk = upload(qk), *d_rows = upload(row_stats), *d_gq = upload(g_q), *d_gk = upload(g_k), *d_partial;
    double *d_sums, *d_keys_f64;
    cudaCheck(cudaMalloc(&d_sums, lay.total * sizeof(double)));
    cudaCheck(cudaMalloc(&d_keys_f64, keys_f64.size() * sizeof(double)));
    cudaCheck(cudaMalloc(&d_partial, telemetry_partial_floats(N, c) * sizeof(float)));
    Matmul mm;
    matmul_init(mm);
    TelemetryWays ways;  // ./train's; the candidates gram_dmma and gram_key_records below
    auto run_layer = [&] {  // a stats step of one micro-batch: the sums cleared, then this layer's added
        telemetry_sums_clear_kernel<<<64, 256>>>(d_sums, lay);
        cuda_check_launch();
        telemetry_layer(d_sums, lay, d_partial, d_keys_f64, mm, d_qk, d_rows, d_gq, d_gk, B, T, c, layer, 0, {}, ways);
    };
    std::string tag = " B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + ":" + std::to_string(Hkv) +
                      " D" + std::to_string(D);
    Telemetry got;
    // The layer's statistics against the CPU's; `what` names the way of the Gram products.
    auto check_statistics = [&](const std::string& what) {
        run_layer();
        std::vector<double> host = download(d_sums, lay.total);
        host[lay.count] = N;
        host[lay.doc_view] = N / 3;
        telemetry_from_sums(got, host.data(), lay, c);
        for (int m = 0; m < M_NUM_METRICS; m++) {
            int row = kMetrics[m].shape == PER_STEP ? 0 : layer;
            const float* g = got.row(m, row, c);
            const float* w = want.row(m, row, c);
            int cols = metric_cols(c, kMetrics[m].shape);
            // Per-token float32 terms summed in float32 partial sums (the CPU sums them otherwise):
            // at most N u32 = 1e-3 relative for N = 16384 tokens (sqrt(N) u32 = 8e-6 typically), and
            // 1e-5 absolute for the statistics near zero (k_cos, k_mean_share). The effective ranks
            // come from float64 Gram matrices on both sides.
            check_close(std::string("telemetry ") + kMetrics[m].name + what + tag, g, w, cols, 1e-3, 1e-5);
        }
        return host;
    };
    const std::string skipped = gram_dmma_skipped(D, d_qk);
    if (skipped.empty()) {  // the candidates', through telemetry_layer as train_candidates runs them
        ways.gram_dmma_k = kGramDmmaK;
        check_statistics(", Gram products of gram_dmma");
        ways.gram_key_records = true;
        check_statistics(", Gram products and key records of gram_dmma");
        ways = TelemetryWays();
    } else {
        printf("   the candidates gram_dmma and gram_key_records%s: skipped, %s\n", tag.c_str(), skipped.c_str());
    }
    std::vector<double> host = check_statistics("");
    run_layer();
    std::vector<double> again = download(d_sums, lay.total);
    again[lay.count] = N;
    again[lay.doc_view] = N / 3;
    report(again == host, "telemetry gives the same bits twice" + tag);
    float ms = time_ms(run_layer);
    double t0 = omp_get_wtime();
    telemetry_from_sums(got, host.data(), lay, c);
    printf("   telemetry of one layer%s: %.3f ms on the GPU, %.3f ms for all layers' statistics on the host\n", tag.c_str(),
           ms, (omp_get_wtime() - t0) * 1e3);
    printf("   its parts: head statistics %.3f ms, attention statistics %.3f ms, key Gram matrices %.3f ms\n",
           time_ms([&] { head_statistics(d_sums, lay, d_partial, d_qk, N, c, layer, 0); }),
           time_ms([&] { attention_statistics(d_sums, lay, d_partial, d_rows, B, T, c, layer, 0); }),
           time_ms([&] { key_gram(d_sums, lay, d_partial, d_keys_f64, mm, d_qk, N, c, layer, 0); }));
    check_head_stats_vec(c, lay, d_qk, N, layer, tag);
    if (skipped.empty()) check_gram_key_records(c, lay, d_qk, N, layer, tag);
    check_query_norms(c, lay, B, T, layer, tag);
    check_attention_stats_split(c, lay, d_rows, row_stats, B, T, layer, tag);
    if (D == 64) check_gram_from_float32(mm, d_qk, N, H, Hkv, D, tag);
    check_gram_split(mm, d_qk, N, H, Hkv, D, tag);
    for (void* p : {(void*)d_qk, (void*)d_rows, (void*)d_gq, (void*)d_gk, (void*)d_sums, (void*)d_keys_f64, (void*)d_partial})
        cudaCheck(cudaFree(p));
    matmul_free(mm);
}

// The float64 tensor cores' rate at each shape of mma.sync, Ampere's m8n8k4 (the Gram kernels of
// ./train) and Hopper's m16n8k4, k8 and k16 (the candidate gram_dmma): one wave of blocks of 4
// warps, as many an SM as the kernel's registers allow, each warp kRateChains independent products
// kRateRounds times over (enough in flight to hide an instruction's latency), the products' count
// over the time. Printed, not checked.
static const int kRateChains = 8, kRateRounds = 4096;
template <int K>  // 0: m8n8k4
__global__ void dmma_rate_kernel(double* out) {
    constexpr int A = K ? K / 2 : 1, B = K ? K / 4 : 1;
    double acc[kRateChains][4] = {}, a[A], b[B];
    for (int v = 0; v < A; v++) a[v] = 1e-3 * (threadIdx.x % 7 + v);
    for (int v = 0; v < B; v++) b[v] = 1e-3 * (threadIdx.x % 5 + v);
    for (int r = 0; r < kRateRounds; r++)
#pragma unroll
        for (int c = 0; c < kRateChains; c++) {
            if constexpr (K == 0) {
                double d[2] = {acc[c][0], acc[c][1]};
                mma_f64_8x8x4(d, a[0], b[0]);
                acc[c][0] = d[0], acc[c][1] = d[1];
            } else {
                mma_f64_16x8<K>(acc[c], a, b);
            }
        }
    double sum = 0;
    for (int c = 0; c < kRateChains; c++) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
static void dmma_rates() {
    int device = 0, sms = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int threads = 128, most_blocks = 32 * sms;
    double* d_out;
    cudaCheck(cudaMalloc(&d_out, (size_t)most_blocks * threads * sizeof(double)));
    auto rate = [&](const char* shape, int products, void (*kernel)(double*)) {
        int per_sm = 0;
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
        const int blocks = std::min(most_blocks, std::max(1, per_sm) * sms);
        const float ms = time_ms([&] {
            kernel<<<blocks, threads>>>(d_out);
            cuda_check_launch();
        }, 5);
        const double flops = 2.0 * products * kRateChains * kRateRounds * ((double)blocks * threads / 32);
        printf("   float64 tensor cores, mma.sync %s: %.1f TFLOP/s (%d blocks of 4 warps an SM)\n", shape,
               flops / (ms * 1e-3) / 1e12, per_sm);
    };
    rate("m8n8k4 (./train's Gram products)", 8 * 8 * 4, dmma_rate_kernel<0>);
    if (gram_dmma_compiled()) {
        rate("m16n8k4", 16 * 8 * 4, dmma_rate_kernel<4>);
        rate("m16n8k8", 16 * 8 * 8, dmma_rate_kernel<8>);
        rate("m16n8k16", 16 * 8 * 16, dmma_rate_kernel<16>);
    } else {
        printf("   float64 tensor cores, Hopper's shapes: skipped, this build has no sm_90 code for this device\n");
    }
    cudaCheck(cudaFree(d_out));
}

int main() {
    if (!require_gpu()) return 0;
    dmma_rates();
    check_layer(2, 33, 4, 2, 1);
    check_layer(1, 67, 4, 2, 0);  // an odd count of rows: the candidate's warps with one group idle
    check_layer(3, 700, 8, 4, 0);  // the candidate attention statistics: 3 chunks of rows, the last partial
    check_layer(8, 2048, 8, 8, 0);
    check_layer(2, 300, 16, 8, 0, 128);  // Qwen3's and Llama's heads; more than one block of rows
    return test_exit_code();
}
