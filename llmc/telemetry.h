// The telemetry of one stats step (docs/telemetry.md): what is measured, its shape, and
// the host-side container both backends fill. The table below is the single source of truth for
// metric names and order: the binary log's header and telemetry records are written from it.
#pragma once
#include <string>
#include <vector>
#include "config.h"

enum MetricShape {
    PER_KV_HEAD,  // [n_layer][n_kv_head]
    PER_Q_HEAD,   // [n_layer][n_head]
    PER_DIM,      // [n_layer][head_dim]
};

enum MetricId {
    M_K_NORM, M_K_MAXABS, M_K_PR, M_K_COS, M_K_ERANK,
    M_Q_NORM, M_ATTN_ENTROPY, M_ATTN_SINK, M_ATTN_MAXP, M_ATTN_LOGIT_MAX,
    M_G_Q, M_G_K,
    M_NUM_METRICS
};

struct MetricInfo {
    const char* name;
    MetricShape shape;
    const char* meaning;
};

static const MetricInfo kMetrics[M_NUM_METRICS] = {
    {"k_norm", PER_KV_HEAD, "mean L2 norm of the keys after k_norm and its gain, before RoPE"},
    {"k_maxabs", PER_KV_HEAD, "mean over keys of the largest absolute component"},
    {"k_pr", PER_KV_HEAD, "mean participation ratio (sum k^2)^2 / sum k^4, 1..head_dim"},
    {"k_cos", PER_KV_HEAD, "mean cosine similarity over all pairs of distinct keys"},
    {"k_erank", PER_KV_HEAD, "effective rank (Roy & Vetterli) of the keys x head_dim matrix"},
    {"q_norm", PER_Q_HEAD, "mean L2 norm of the queries after q_norm and its gain, before RoPE"},
    {"attn_entropy", PER_Q_HEAD, "mean entropy of an attention row, nats"},
    {"attn_sink", PER_Q_HEAD, "mean attention probability on the first position"},
    {"attn_maxp", PER_Q_HEAD, "mean over rows of the largest attention probability"},
    {"attn_logit_max", PER_Q_HEAD, "largest attention logit q.k/sqrt(head_dim), after RoPE"},
    {"g_q", PER_DIM, "q_norm gain vector"},
    {"g_k", PER_DIM, "k_norm gain vector"},
};

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
