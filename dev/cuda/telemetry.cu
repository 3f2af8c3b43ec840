// Checks and times the telemetry kernels (llmc/telemetry.cuh) against the CPU backend's
// key_statistics and query_attention_statistics: every statistic of one layer from the same
// post-norm queries and keys (float32) and the same per-row attention accumulators, the effective
// ranks and mean share via the float64 Gram matrices, and the same bits on a second run. Build: make build/dev_telemetry.
#include "dev/cuda/common.h"
#include "llmc/model_cpu.h"
#include "llmc/telemetry.cuh"

static void check_layer(int B, int T, int H, int Hkv, int layer) {
    ModelConfig c;
    c.n_layer = layer + 1;
    c.n_head = H;
    c.n_kv_head = Hkv;
    c.head_dim = 64;
    c.d_model = H * 64;
    int N = B * T, D = 64, NH = H + Hkv;
    Rng rng{(uint64_t)N * 11 + H};
    // Keys with a few dominant axes, as trained keys have, so that the statistics are not all alike.
    std::vector<float> qk = random_values((size_t)N * NH * D, 1.0f, rng);
    for (size_t i = 0; i < qk.size(); i++)
        if (i % D < 3) qk[i] = qk[i] * 6.0f + 2.0f;
    size_t rows = (size_t)B * H * T;
    std::vector<float> row_stats(ATTN_NUM_ROW_STATS * rows);
    for (size_t r = 0; r < rows; r++) {
        row_stats[ATTN_STAT_ENTROPY * rows + r] = (float)(3.0 * rng_uniform(rng));
        row_stats[ATTN_STAT_SINK * rows + r] = (float)rng_uniform(rng);
        row_stats[ATTN_STAT_MAXP * rows + r] = (float)rng_uniform(rng);
        row_stats[ATTN_STAT_LOGIT_MAX * rows + r] = 10.0f * rng_normal(rng);
    }
    std::vector<float> g_q = random_values(D, 1.0f, rng), g_k = random_values(D, 1.0f, rng);
    Telemetry want;
    want.resize(c);
    std::vector<double> keys_f64((size_t)Hkv * N * (D + 1));
    key_statistics(want, layer, qk.data(), keys_f64.data(), N, c);
    query_attention_statistics(want, layer, qk.data(), row_stats.data(), B, T, c);
    std::copy(g_q.begin(), g_q.end(), want.row(M_G_Q, layer, c));
    std::copy(g_k.begin(), g_k.end(), want.row(M_G_K, layer, c));

    TelemetryLayout lay = telemetry_layout(c);
    float *d_qk = upload(qk), *d_rows = upload(row_stats), *d_gq = upload(g_q), *d_gk = upload(g_k), *d_stats, *d_partial;
    double *d_grams, *d_keys_f64;
    cudaCheck(cudaMalloc(&d_stats, lay.total * sizeof(float)));
    cudaCheck(cudaMalloc(&d_grams, lay.gram_doubles * sizeof(double)));
    cudaCheck(cudaMalloc(&d_keys_f64, keys_f64.size() * sizeof(double)));
    cudaCheck(cudaMalloc(&d_partial, telemetry_partial_floats(N, c) * sizeof(float)));
    cudaCheck(cudaMemset(d_stats, 0, lay.total * sizeof(float)));  // the layers not measured stay defined
    cudaCheck(cudaMemset(d_grams, 0, lay.gram_doubles * sizeof(double)));
    Matmul mm;
    matmul_init(mm);
    auto run_layer = [&] {
        telemetry_layer(d_stats, d_grams, lay, d_partial, d_keys_f64, mm, d_qk, d_rows, d_gq, d_gk, B, T, c, layer, 0);
    };
    run_layer();
    std::vector<float> host = download(d_stats, lay.total);
    std::vector<double> host_grams(lay.gram_doubles);
    cudaCheck(cudaMemcpy(host_grams.data(), d_grams, lay.gram_doubles * sizeof(double), cudaMemcpyDeviceToHost));
    Telemetry got;
    telemetry_finish(got, host.data(), host_grams.data(), lay, c);
    std::string tag = " B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + ":" + std::to_string(Hkv);
    for (int m = 0; m < M_NUM_METRICS; m++) {
        const float* g = got.row(m, layer, c);
        const float* w = want.row(m, layer, c);
        int cols = metric_cols(c, kMetrics[m].shape);
        check_close(std::string("telemetry ") + kMetrics[m].name + tag, g, w, cols, 1e-3, 1e-5);
    }
    run_layer();
    std::vector<double> grams_again(lay.gram_doubles);
    cudaCheck(cudaMemcpy(grams_again.data(), d_grams, lay.gram_doubles * sizeof(double), cudaMemcpyDeviceToHost));
    report(download(d_stats, lay.total) == host && grams_again == host_grams, "telemetry gives the same bits twice" + tag);
    float ms = time_ms(run_layer);
    double t0 = omp_get_wtime();
    telemetry_finish(got, host.data(), host_grams.data(), lay, c);
    printf("   telemetry of one layer%s: %.3f ms on the GPU, %.3f ms for all layers' effective ranks on the host\n", tag.c_str(),
           ms, (omp_get_wtime() - t0) * 1e3);
    for (void* p : {(void*)d_qk, (void*)d_rows, (void*)d_gq, (void*)d_gk, (void*)d_stats, (void*)d_grams, (void*)d_keys_f64,
                    (void*)d_partial})
        cudaCheck(cudaFree(p));
    matmul_free(mm);
}

int main() {
    if (!require_gpu()) return 0;
    check_layer(2, 33, 4, 2, 1);
    check_layer(8, 2048, 8, 8, 0);
    return test_exit_code();
}
