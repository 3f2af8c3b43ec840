// What a stats step sums (docs/telemetry.md): the records both backends add their keys' and
// attention rows' sums into, one float64 array whose layout is defined here once for the CPU
// (model_cpu.h) and the GPU (telemetry.cuh), and the attention kernels' per-row statistics those
// sums start from. telemetry.h turns the sums into statistics.
//
// A stats step measures every micro-batch of the step on every process: each forward pass adds its
// keys' and rows' sums into the array, the processes' arrays are added (their maxima taken), and
// only then are the sums turned into statistics. So a statistic is the same whether the step's
// batch ran as one micro-batch, as several, or on several processes: sums of the same terms, in
// another order.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>
#include "config.h"
#include "math.h"

// The attention kernels' per-row statistics: ATTN_NUM_ROW_STATS arrays [B, H, T] one after the
// other in the row_stats buffer (activations.h), in this order; the telemetry reduces them per
// query head into the attn_* statistics.
enum AttentionRowStat {
    ATTN_STAT_ENTROPY = 0,    // -sum_j p_tj ln p_tj, in nats
    ATTN_STAT_SINK = 1,       // p_t0, the probability on the first position
    ATTN_STAT_MAXP = 2,       // max_j p_tj
    ATTN_STAT_LOGIT_MAX = 3,  // max_j s_tj
    ATTN_STAT_DOC_START = 4,  // sum of p_ts over the document starts s <= t (below)
    ATTN_NUM_ROW_STATS = 5,
};

// Document starts (telemetry.md, attn_doc_start): position s of a sequence starts a document when
// the token before it, at s - 1, is the corpus' end-of-text token (the one that separates
// documents; -1: none). Position 0 never does: its token before lies outside the window, and the
// attention on it is attn_sink's. The attention kernels read them as bits, B rows of
// document_start_words(T) words: bit s % 32 of word s / 32 of row b is set when s starts a document.
HD bool is_document_start(const int* seq, int s, int eot) { return s > 0 && eot >= 0 && seq[s - 1] == eot; }
HD bool document_start_bit(const uint32_t* row_bits, int s) { return (row_bits[s / 32] >> (s % 32)) & 1u; }
HD int document_start_words(int T) { return (T + 31) / 32; }

// The bits of the B sequences of T tokens, into bits [B][document_start_words(T)].
inline void document_start_bits(uint32_t* bits, const int* tokens, int B, int T, int eot) {
    int W = document_start_words(T);
    for (int b = 0; b < B; b++)
        for (int w = 0; w < W; w++) {
            uint32_t word = 0;
            for (int i = 0; i < 32 && 32 * w + i < T; i++)
                if (is_document_start(tokens + (size_t)b * T, 32 * w + i, eot)) word |= 1u << i;
            bits[(size_t)b * W + w] = word;
        }
}

// How many of the B x T queries have a document start in view (some start s <= t): in each
// sequence, the queries from its first document start on.
inline double queries_seeing_document_start(const int* tokens, int B, int T, int eot) {
    double count = 0;
    for (int b = 0; b < B; b++)
        for (int s = 1; s < T; s++)
            if (is_document_start(tokens + (size_t)b * T, s, eot)) {
                count += T - s;
                break;
            }
    return count;
}

// A micro-batch's document starts, for a forward pass with statistics: their bits into `bits`, and
// the number of queries with one in view.
inline double micro_batch_document_starts(std::vector<uint32_t>& bits, const int* tokens, int B, int T, int eot) {
    bits.resize((size_t)B * document_start_words(T));
    document_start_bits(bits.data(), tokens, B, T, eot);
    return queries_seeing_document_start(tokens, B, T, eot);
}

// The record of a head's rows x (keys after the k norm and gain, before RoPE): the sums of ||x||,
// of max_i |x_i|, of the participation ratio (sum x^2)^2 / sum x^4, then of the unit vectors
// x / ||x|| (D entries, KS_UNIT the first): head_record_size(D) values. The CPU sums a key head's
// rows in float64 straight into the array; the GPU sums each block of rows in float32 into a
// record of this layout (query heads fill only KS_NORM there), then the blocks' records in float64.
enum HeadSum { KS_NORM, KS_MAXABS, KS_PR, KS_UNIT };
HD int head_record_size(int D) { return KS_UNIT + D; }

// A query head's record: the sum of ||q||, and the sums of its attention rows' statistics.
enum QuerySum { QS_NORM, QS_ENTROPY, QS_SINK, QS_MAXP, QS_DOC_START, QS_NUM };

// The array, in doubles:
//   key_sums   [L][Hkv][head_record_size(D)]  HeadSum records of the key heads
//   query_sums [L][H][QS_NUM]                 QuerySum records
//   grams      [L][Hkv][D+1][D+1]             the augmented Gram matrices [K 1]^T [K 1] (upper triangle read)
//   count      1                              the number of tokens summed
//   doc_view   1                              of those, the queries with a document start in view
//   -- [0, summed) is added across processes; the maxima take their maximum:
//   maxima     [L][H]                         the largest attention logit
//   -- the gains, the same on every process, are copied:
//   gains      [L][2][D]                      g_q, then g_k
// The member functions give where layer l's records of a head start.
struct TelemetrySums {
    size_t key_sums, query_sums, grams, count, doc_view, maxima, gains;  // offsets, in doubles
    size_t summed;  // [0, summed) is added across processes
    size_t total;   // doubles in all
    int key_record;  // doubles per key head in key_sums: head_record_size(D)
    int n_head, n_kv_head, head_dim;

    HD size_t key(int l, int kv_head) const { return key_sums + ((size_t)l * n_kv_head + kv_head) * key_record; }
    HD size_t query(int l, int q_head) const { return query_sums + ((size_t)l * n_head + q_head) * QS_NUM; }
    HD size_t gram(int l, int kv_head) const {
        size_t W = head_dim + 1;
        return grams + ((size_t)l * n_kv_head + kv_head) * W * W;
    }
    HD size_t max_logit(int l, int q_head) const { return maxima + (size_t)l * n_head + q_head; }
    HD size_t layer_gains(int l) const { return gains + (size_t)l * 2 * head_dim; }  // g_q [D], then g_k [D]
};

inline TelemetrySums telemetry_sums_layout(const ModelConfig& c) {
    TelemetrySums t;
    size_t L = c.n_layer, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, W = D + 1;
    t.n_head = c.n_head;
    t.n_kv_head = c.n_kv_head;
    t.head_dim = c.head_dim;
    t.key_record = head_record_size(c.head_dim);
    t.key_sums = 0;
    t.query_sums = t.key_sums + L * Hkv * t.key_record;
    t.grams = t.query_sums + L * H * QS_NUM;
    t.count = t.grams + L * Hkv * W * W;
    t.doc_view = t.count + 1;
    t.summed = t.doc_view + 1;
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
