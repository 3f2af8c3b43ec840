// The telemetry of one stats step (docs/telemetry.md): what is measured, its shape, and
// the host-side container both backends fill. The table below is the single source of truth for
// metric names and order: the binary log's header and telemetry records are written from it.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "config.h"
#include "eigen.h"
#include "math.h"

enum MetricShape {
    PER_KV_HEAD,  // [n_layer][n_kv_head]
    PER_Q_HEAD,   // [n_layer][n_head]
    PER_DIM,      // [n_layer][head_dim]
};

enum MetricId {
    M_K_NORM, M_K_MAXABS, M_K_PR, M_K_COS, M_K_ERANK, M_K_MEAN_SHARE, M_K_ERANK_CENTERED,
    M_Q_NORM, M_ATTN_ENTROPY, M_ATTN_SINK, M_ATTN_MAXP, M_ATTN_LOGIT_MAX,
    M_G_Q, M_G_K,
    M_NUM_METRICS
};

struct MetricInfo {
    MetricId id;
    const char* name;
    MetricShape shape;
    const char* meaning;
};

static constexpr MetricInfo kMetrics[] = {
    {M_K_NORM, "k_norm", PER_KV_HEAD, "mean L2 norm of the keys after the k norm and its gain, before RoPE"},
    {M_K_MAXABS, "k_maxabs", PER_KV_HEAD, "mean over keys of the largest absolute component"},
    {M_K_PR, "k_pr", PER_KV_HEAD, "mean participation ratio (sum k^2)^2 / sum k^4, 1..head_dim"},
    {M_K_COS, "k_cos", PER_KV_HEAD, "mean cosine similarity over all pairs of distinct keys"},
    {M_K_ERANK, "k_erank", PER_KV_HEAD, "effective rank (Roy & Vetterli) of the keys x head_dim matrix"},
    {M_K_MEAN_SHARE, "k_mean_share", PER_KV_HEAD, "||mean key||^2 / mean ||key||^2: the share of key energy in the common direction"},
    {M_K_ERANK_CENTERED, "k_erank_centered", PER_KV_HEAD, "effective rank of the keys minus their mean"},
    {M_Q_NORM, "q_norm", PER_Q_HEAD, "mean L2 norm of the queries after the q norm and its gain, before RoPE"},
    {M_ATTN_ENTROPY, "attn_entropy", PER_Q_HEAD, "mean entropy of an attention row, nats"},
    {M_ATTN_SINK, "attn_sink", PER_Q_HEAD, "mean attention probability on the first position"},
    {M_ATTN_MAXP, "attn_maxp", PER_Q_HEAD, "mean over rows of the largest attention probability"},
    {M_ATTN_LOGIT_MAX, "attn_logit_max", PER_Q_HEAD, "largest attention logit q.k/sqrt(head_dim), after RoPE"},
    {M_G_Q, "g_q", PER_DIM, "gain vector of the q norm (parameter q_gain)"},
    {M_G_K, "g_k", PER_DIM, "gain vector of the k norm (parameter k_gain)"},
};

// The enum and the table must list the metrics in the same order: the enum indexes the table.
constexpr bool metric_table_in_enum_order() {
    for (int m = 0; m < M_NUM_METRICS; m++)
        if (kMetrics[m].id != m) return false;
    return true;
}
static_assert(sizeof(kMetrics) / sizeof(kMetrics[0]) == M_NUM_METRICS, "one kMetrics entry per MetricId");
static_assert(metric_table_in_enum_order(), "kMetrics must list the metrics in MetricId order");

// The attention kernels' per-row statistics, each an array [B, H, T] of the row_stats buffer,
// which the telemetry reduces per query head into the attn_* metrics.
enum AttentionRowStat {
    ATTN_STAT_ENTROPY = 0,    // -sum_j p_tj ln p_tj, in nats
    ATTN_STAT_SINK = 1,       // p_t0, the probability on the first position
    ATTN_STAT_MAXP = 2,       // max_j p_tj
    ATTN_STAT_LOGIT_MAX = 3,  // max_j s_tj
    ATTN_NUM_ROW_STATS = 4,
};

// The name of a metric's second dimension, as the log's header spells it.
inline const char* metric_dim_name(MetricShape s) {
    return s == PER_KV_HEAD ? "kv_head" : s == PER_Q_HEAD ? "q_head" : "dim";
}

inline int metric_cols(const ModelConfig& c, MetricShape s) {
    return s == PER_KV_HEAD ? c.n_kv_head : s == PER_Q_HEAD ? c.n_head : c.head_dim;
}

// One stats step's measurements: values[m] holds metric m as a row-major [n_layer][cols] array.
struct Telemetry {
    std::vector<float> values[M_NUM_METRICS];

    void resize(const ModelConfig& c) {
        for (int m = 0; m < M_NUM_METRICS; m++)
            values[m].assign((size_t)c.n_layer * metric_cols(c, kMetrics[m].shape), 0.0f);
    }
    float* row(int m, int layer, const ModelConfig& c) {
        return values[m].data() + (size_t)layer * metric_cols(c, kMetrics[m].shape);
    }
};

// The key statistics that come from a key head's augmented Gram matrix G = A^T A, where A = [K 1]
// is the N x (D+1) matrix of its keys with a column of ones: the top-left D x D block is K^T K,
// the last row the key sum s = sum_n k_n, the corner N. Both backends accumulate G in float64
// (row-major, (D+1) x (D+1); only the upper triangle is read) and finish here.
struct KeyGramStatistics {
    double erank, erank_centered, mean_share;
};

inline KeyGramStatistics key_gram_statistics(const double* gram_aug, int D) {
    int W = D + 1;
    auto g = [&](int i, int j) { return i <= j ? gram_aug[(size_t)i * W + j] : gram_aug[(size_t)j * W + i]; };
    double n = g(D, D), s_sq = 0.0, trace = 0.0;
    std::vector<double> gram((size_t)D * D), centered((size_t)D * D);
    for (int i = 0; i < D; i++) {
        s_sq += g(i, D) * g(i, D);
        trace += g(i, i);
        for (int j = 0; j < D; j++) {
            gram[(size_t)i * D + j] = g(i, j);
            centered[(size_t)i * D + j] = centered_gram(g(i, j), g(i, D), g(j, D), n);
        }
    }
    return {effective_rank_of_gram(gram.data(), D), effective_rank_of_gram(centered.data(), D), mean_share(s_sq, trace, n)};
}

// ---------------------------------------------------------------------------------------------
// What the statistics are made of. A stats step measures every micro-batch of the step on every
// process: each forward pass adds its keys' and rows' sums into one float64 array, the processes'
// arrays are added (their maxima taken), and only then are the sums turned into statistics. So a
// statistic is the same whether the step's batch ran as one micro-batch, as several, or on
// several processes: sums of the same terms, in another order.
//
// The array, in doubles (both backends fill this layout, the GPU's on the device):
//   key_sums   [L][Hkv][3 + D]     sum ||k||, sum max_i |k_i|, sum participation ratio, sum k/||k|| (D)
//   query_sums [L][H][4]           sum ||q||, and the attention rows' sums of entropy, sink, max p
//   grams      [L][Hkv][D+1][D+1]  the augmented Gram matrices [K 1]^T [K 1] (upper triangle read)
//   count      1                   the number of tokens summed
//   -- [0, summed) is added across processes; the maxima take their maximum:
//   maxima     [L][H]              the largest attention logit
//   -- the gains, the same on every process, are copied:
//   gains      [L][2][D]           g_q, then g_k
enum KeySum { KS_NORM, KS_MAXABS, KS_PR, KS_UNIT };  // KS_UNIT: the first of D entries
enum QuerySum { QS_NORM, QS_ENTROPY, QS_SINK, QS_MAXP, QS_NUM };

struct TelemetrySums {
    size_t key_sums, query_sums, grams, count, maxima, gains;  // offsets, in doubles
    size_t summed;  // [0, summed) is added across processes
    size_t total;   // doubles in all
    int key_record;  // doubles per key head in key_sums: 3 + D
};

inline TelemetrySums telemetry_sums_layout(const ModelConfig& c) {
    TelemetrySums t;
    size_t L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, W = D + 1;
    t.key_record = 3 + c.head_dim;
    t.key_sums = 0;
    t.query_sums = t.key_sums + L * Hkv * t.key_record;
    t.grams = t.query_sums + L * H * QS_NUM;
    t.count = t.grams + L * Hkv * W * W;
    t.summed = t.count + 1;
    t.maxima = t.summed;
    t.gains = t.maxima + L * H;
    t.total = t.gains + L * 2 * D;
    return t;
}

// Before a step's first forward pass with statistics: sums 0, maxima -infinity.
inline void telemetry_sums_clear(double* sums, const TelemetrySums& t) {
    std::fill(sums, sums + t.total, 0.0);
    std::fill(sums + t.maxima, sums + t.gains, -INFINITY);
}

// The statistics of telemetry.md from the sums over every key and attention row of the step.
inline void telemetry_from_sums(Telemetry& tm, const double* sums, const TelemetrySums& t, const ModelConfig& c) {
    tm.resize(c);
    int L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, W = D + 1;
    double n = sums[t.count];
    for (int k = 0; k < L * Hkv; k++) {  // [L][Hkv], as the per-kv-head metrics
        const double* r = sums + t.key_sums + (size_t)k * t.key_record;
        double unit_sq = 0.0;
        for (int i = 0; i < D; i++) unit_sq += r[KS_UNIT + i] * r[KS_UNIT + i];
        tm.values[M_K_NORM][k] = (float)(r[KS_NORM] / n);
        tm.values[M_K_MAXABS][k] = (float)(r[KS_MAXABS] / n);
        tm.values[M_K_PR][k] = (float)(r[KS_PR] / n);
        tm.values[M_K_COS][k] = (float)mean_pairwise_cosine(unit_sq, n);
    }
    for (int k = 0; k < L * H; k++) {  // [L][H]
        const double* r = sums + t.query_sums + (size_t)k * QS_NUM;
        tm.values[M_Q_NORM][k] = (float)(r[QS_NORM] / n);
        tm.values[M_ATTN_ENTROPY][k] = (float)(r[QS_ENTROPY] / n);
        tm.values[M_ATTN_SINK][k] = (float)(r[QS_SINK] / n);
        tm.values[M_ATTN_MAXP][k] = (float)(r[QS_MAXP] / n);
        tm.values[M_ATTN_LOGIT_MAX][k] = (float)sums[t.maxima + k];
    }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < D; i++) {
            tm.row(M_G_Q, l, c)[i] = (float)sums[t.gains + (size_t)l * 2 * D + i];
            tm.row(M_G_K, l, c)[i] = (float)sums[t.gains + (size_t)l * 2 * D + D + i];
        }
    // The effective ranks and the mean share: an eigenvalue problem per layer and key head.
#pragma omp parallel for schedule(dynamic)
    for (int k = 0; k < L * Hkv; k++) {
        KeyGramStatistics g = key_gram_statistics(sums + t.grams + (size_t)k * W * W, D);
        tm.values[M_K_ERANK][k] = (float)g.erank;
        tm.values[M_K_MEAN_SHARE][k] = (float)g.mean_share;
        tm.values[M_K_ERANK_CENTERED][k] = (float)g.erank_centered;
    }
}
