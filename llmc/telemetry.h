// The telemetry of one stats step (docs/telemetry.md): what is measured, its shape, the host-side
// container both backends fill, and how the sums of telemetry_sums.h become statistics. The table
// below is the single source of truth for metric names and order: the binary log's header and
// telemetry records are written from it.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "config.h"
#include "distributed.h"
#include "eigen.h"
#include "math.h"
#include "telemetry_sums.h"

enum MetricShape {
    PER_KV_HEAD,  // [n_layer][n_kv_head]
    PER_Q_HEAD,   // [n_layer][n_head]
    PER_DIM,      // [n_layer][head_dim]
    PER_STEP,     // one value for the whole step (the log's shape [])
};

// The statistics, one line each in log order: the metric (M_<NAME>), its name in the log, its
// shape, and what it is. telemetry_from_sums computes each from the sums.
#define METRIC_TABLE(X)                                                                                              \
    X(K_NORM, k_norm, PER_KV_HEAD, "mean L2 norm of the keys after the k norm and its gain, before RoPE")           \
    X(K_MAXABS, k_maxabs, PER_KV_HEAD, "mean over keys of the largest absolute component")                          \
    X(K_PR, k_pr, PER_KV_HEAD, "mean participation ratio (sum k^2)^2 / sum k^4, 1..head_dim")                       \
    X(K_COS, k_cos, PER_KV_HEAD, "mean cosine similarity over all pairs of distinct keys")                          \
    X(K_ERANK, k_erank, PER_KV_HEAD, "effective rank (Roy & Vetterli) of the keys x head_dim matrix")               \
    X(K_MEAN_SHARE, k_mean_share, PER_KV_HEAD,                                                                      \
      "||mean key||^2 / mean ||key||^2: the share of key energy in the common direction")                          \
    X(K_ERANK_CENTERED, k_erank_centered, PER_KV_HEAD, "effective rank of the keys minus their mean")               \
    X(Q_NORM, q_norm, PER_Q_HEAD, "mean L2 norm of the queries after the q norm and its gain, before RoPE")         \
    X(ATTN_ENTROPY, attn_entropy, PER_Q_HEAD, "mean entropy of an attention row, nats")                             \
    X(ATTN_SINK, attn_sink, PER_Q_HEAD, "mean attention probability on the first position")                         \
    X(ATTN_DOC_START, attn_doc_start, PER_Q_HEAD,                                                                   \
      "mean attention probability on document starts (positions after the end-of-text token, position 0 excluded)") \
    X(DOC_START_VISIBLE, doc_start_visible, PER_STEP,                                                               \
      "share of the step's queries with a document start in view, where attn_doc_start can be above 0")            \
    X(ATTN_MAXP, attn_maxp, PER_Q_HEAD, "mean over rows of the largest attention probability")                      \
    X(ATTN_LOGIT_MAX, attn_logit_max, PER_Q_HEAD, "largest attention logit q.k/sqrt(head_dim), after RoPE")         \
    X(G_Q, g_q, PER_DIM, "gain vector of the q norm (parameter q_gain)")                                            \
    X(G_K, g_k, PER_DIM, "gain vector of the k norm (parameter k_gain)")

enum MetricId {
#define METRIC_ENUM(NAME, name, shape, meaning) M_##NAME,
    METRIC_TABLE(METRIC_ENUM)
#undef METRIC_ENUM
    M_NUM_METRICS
};

struct MetricInfo {
    const char* name;
    MetricShape shape;
    const char* meaning;
};

static constexpr MetricInfo kMetrics[M_NUM_METRICS] = {
#define METRIC_INFO(NAME, name, shape, meaning) {#name, shape, meaning},
    METRIC_TABLE(METRIC_INFO)
#undef METRIC_INFO
};

// The name of a per-layer metric's second dimension, as the log's header spells it.
inline const char* metric_dim_name(MetricShape s) {
    return s == PER_KV_HEAD ? "kv_head" : s == PER_Q_HEAD ? "q_head" : "dim";
}

// A metric is a row-major [rows][cols] array: a row per layer, or one value (PER_STEP).
inline int metric_rows(const ModelConfig& c, MetricShape s) { return s == PER_STEP ? 1 : c.n_layer; }

inline int metric_cols(const ModelConfig& c, MetricShape s) {
    return s == PER_KV_HEAD ? c.n_kv_head : s == PER_Q_HEAD ? c.n_head : s == PER_DIM ? c.head_dim : 1;
}

inline size_t metric_size(const ModelConfig& c, MetricShape s) { return (size_t)metric_rows(c, s) * metric_cols(c, s); }

// One stats step's measurements: values[m] holds metric m as a row-major [rows][cols] array.
struct Telemetry {
    std::vector<float> values[M_NUM_METRICS];

    void resize(const ModelConfig& c) {
        for (int m = 0; m < M_NUM_METRICS; m++) values[m].assign(metric_size(c, kMetrics[m].shape), 0.0f);
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
    KeyGramStatistics out{0, 0, mean_share(s_sq, trace, n)};
    effective_ranks_of_grams(gram.data(), centered.data(), D, &out.erank, &out.erank_centered);
    return out;
}

// The statistics of telemetry.md from the sums over every key and attention row of the step.
inline void telemetry_from_sums(Telemetry& tm, const double* sums, const TelemetrySums& t, const ModelConfig& c) {
    tm.resize(c);
    int L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    double n = sums[t.count];
    for (int k = 0; k < L * Hkv; k++) {  // [L][Hkv], as the per-kv-head metrics
        const double* r = sums + t.key(k / Hkv, k % Hkv);
        double unit_sq = 0.0;
        for (int i = 0; i < D; i++) unit_sq += r[KS_UNIT + i] * r[KS_UNIT + i];
        tm.values[M_K_NORM][k] = (float)(r[KS_NORM] / n);
        tm.values[M_K_MAXABS][k] = (float)(r[KS_MAXABS] / n);
        tm.values[M_K_PR][k] = (float)(r[KS_PR] / n);
        tm.values[M_K_COS][k] = (float)mean_pairwise_cosine(unit_sq, n);
    }
    for (int k = 0; k < L * H; k++) {  // [L][H]
        const double* r = sums + t.query(k / H, k % H);
        tm.values[M_Q_NORM][k] = (float)(r[QS_NORM] / n);
        tm.values[M_ATTN_ENTROPY][k] = (float)(r[QS_ENTROPY] / n);
        tm.values[M_ATTN_SINK][k] = (float)(r[QS_SINK] / n);
        tm.values[M_ATTN_DOC_START][k] = (float)(r[QS_DOC_START] / n);
        tm.values[M_ATTN_MAXP][k] = (float)(r[QS_MAXP] / n);
        tm.values[M_ATTN_LOGIT_MAX][k] = (float)sums[t.max_logit(k / H, k % H)];
    }
    tm.values[M_DOC_START_VISIBLE][0] = (float)(sums[t.doc_view] / n);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < D; i++) {
            tm.row(M_G_Q, l, c)[i] = (float)sums[t.layer_gains(l) + i];
            tm.row(M_G_K, l, c)[i] = (float)sums[t.layer_gains(l) + D + i];
        }
    // The effective ranks and the mean share: two eigenvalue problems per layer and key head.
#pragma omp parallel for schedule(dynamic)
    for (int k = 0; k < L * Hkv; k++) {
        KeyGramStatistics g = key_gram_statistics(sums + t.gram(k / Hkv, k % Hkv), D);
        tm.values[M_K_ERANK][k] = (float)g.erank;
        tm.values[M_K_MEAN_SHARE][k] = (float)g.mean_share;
        tm.values[M_K_ERANK_CENTERED][k] = (float)g.erank_centered;
    }
}

// Every process's sums into rank 0's (distributed.h): [0, summed) added, the maxima taken; the
// gains are the same everywhere. Only rank 0's array is complete afterwards.
inline void telemetry_sums_reduce(const Dist& d, double* sums, const TelemetrySums& t) {
    dist_sum_to_root(d, sums, t.summed);
    dist_max_to_root(d, sums + t.maxima, t.gains - t.maxima);
}
