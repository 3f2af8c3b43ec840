// Causal self-attention on the GPU, forward and backward:
//   s_tj = q_t . k_j / sqrt(D) for j <= t,   p_t = softmax(s_t),   y_t = sum_j p_tj v_j,
// bf16 tensors in and out, softmax and every sum in float32. No T x T matrix is ever stored: the
// forward pass runs each row's softmax "online" over the keys (keeping its running maximum m and
// l = sum_j e^(s_tj - m)) and saves the row's log-sum-exp; the backward pass rebuilds p from it
// (the FlashAttention-2 scheme). Two implementations of the same math:
//   simple: one warp per row, plain float FMAs, any even D up to 256. Short enough to check line by
//           line; the fallback for head widths the fast path does not cover.
//   mma:    64 x 64 tiles of queries and keys through the tensor cores (mma.sync m16n8k16, bf16
//           operands, float32 accumulators), D = 64 or 128; mma_wide (D = 64) takes 128 rows a
//           block on the side each kernel keeps (two blocks of 16 rows a warp): the same bits, no
//           faster on an H100 (dev_attention measures it; nothing else asks for it). mma_lean (the
//           LEAN kernels): the same tiles with fewer instructions a score, the softmax in base 2 on
//           unscaled scores (see kLog2e). mma_lpt and mma_lean_lpt (LPT): mma's and mma_lean's
//           blocks started longest tile first across heads (tile_block), the same bits. ./train
//           runs mma_lean_lpt where cuDNN does not take the shape (on an H200 at d22, 8 x 2048:
//           0.168 ms forward and 0.600 backward a layer, against mma's 0.209 and 0.650).
// attention_forward / attention_backward pick what attention_auto says: mma at D = 64 and 128
// where the device has the shared memory for it, simple otherwise; attention_row_stats computes
// the rows' statistics alone (for a step whose output comes from cuDNN's kernels,
// cudnn_attention.cuh). Both backward passes are deterministic: each output element is summed by
// one thread in a fixed order, with no atomics.
//
// Layouts, row-major; B batch, T sequence, H query heads, Hkv key/value heads (H % Hkv == 0, query
// head h reads key/value head h / (H / Hkv)), D head width:
//   qk   [B, T, H + Hkv, D]       queries, then keys, of each token, after RoPE
//   qkv  [B, T, (H + 2 Hkv) D]    the projections; value head g is head H + Hkv + g of a token
//   out  [B, T, H D]              heads side by side
//   lse  [B, H, T]                ln sum_j e^(s_tj) of each row
//   row_stats (optional)          ATTN_NUM_ROW_STATS arrays [B, H, T], in AttentionRowStat order
//   doc_bits (optional)           [B, document_start_words(T)]: the document starts (telemetry_sums.h)
// Gradients: dqk like qk (post-RoPE queries and keys); the value gradients go into the value
// heads of dqkv, whose query and key heads are left untouched; dout like out.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>
#include <cuda_bf16.h>
#include "cuda_common.cuh"
#include "math.h"
#include "telemetry_sums.h"  // AttentionRowStat

// ---------------------------------------------------------------------------------------------
// Pieces shared by both implementations

// The online softmax of a row keeps, relative to its largest score so far m, l = sum e^(s - m) and
// (for the entropy) a = sum e^(s - m)(s - m). A larger maximum m_new re-expresses both (math.h)
// and returns the factor that the row's running sum of values must be multiplied by. Before the
// first score m is -inf and there is nothing to rescale (math.h's formula would form 0 * -inf).
__device__ __forceinline__ float online_softmax_raise_max(float m_old, float m_new, float* l, float* a) {
    if (m_old == -INFINITY) return 0.0f;
    softmax_stats_rescale(m_old, m_new, l, a);
    return expf(m_old - m_new);
}

// What the forward pass keeps of a finished row: its log-sum-exp and, on statistics steps, the
// row statistics. s_first is the row's score at key 0, doc = sum e^(s - m) over the row's
// document starts; `rows` = B * H * T.
template <bool WITH_STATS>
__device__ __forceinline__ void store_row_results(float* lse, float* row_stats, size_t row, size_t rows, float m,
                                                  float l, float a, float s_first, float doc) {
    lse[row] = m + logf(l);
    if (WITH_STATS) {
        float inv_l = 1.0f / l;
        row_stats[ATTN_STAT_ENTROPY * rows + row] = softmax_row_entropy(l, a);
        row_stats[ATTN_STAT_SINK * rows + row] = expf(s_first - m) * inv_l;
        row_stats[ATTN_STAT_MAXP * rows + row] = inv_l;  // the largest term is e^(m - m) = 1
        row_stats[ATTN_STAT_LOGIT_MAX * rows + row] = m;
        row_stats[ATTN_STAT_DOC_START * rows + row] = doc * inv_l;
    }
}

// Delta_t = dout_t . out_t for every row (b, h, t), stored at (b * H + h) * T + t: the part of
// ds_tj = p_tj (dout_t . v_j - Delta_t) that sums over the whole row (Delta_t = sum_j p_tj dout_t . v_j).
// One warp per row.
__global__ void __launch_bounds__(128) attention_delta_kernel(float* delta, const bf16* dout, const bf16* out,
                                                              int B, int T, int H, int D) {
    size_t rows = (size_t)B * H * T;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together
    int t = (int)(row % T), h = (int)(row / T % H), b = (int)(row / T / H);
    size_t offset = ((size_t)b * T + t) * H * D + (size_t)h * D;
    float sum = 0.0f;
    for (int d = 2 * lane; d < D; d += 64) {
        float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + offset + d));
        float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + offset + d));
        sum += x.x * y.x + x.y * y.y;
    }
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
}

// ---------------------------------------------------------------------------------------------
// Simple implementation: one warp per row. A D-vector is spread over the 32 lanes in pairs: lane i
// holds elements 64 p + 2 i and 64 p + 2 i + 1 for p = 0 .. PAIRS-1, so each p is one contiguous
// 128-byte read by the warp. Elements at or beyond D (D is even: a pair is all in or all out) are
// never read or written and are held as zeros.

template <int PAIRS>
__device__ __forceinline__ void lane_load(float (&v)[2 * PAIRS], const bf16* src, int D, int lane) {
#pragma unroll
    for (int p = 0; p < PAIRS; p++) {
        int d = 64 * p + 2 * lane;
        float2 x = make_float2(0.0f, 0.0f);
        if (d < D) x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src + d));
        v[2 * p] = x.x;
        v[2 * p + 1] = x.y;
    }
}

template <int PAIRS>
__device__ __forceinline__ void lane_store(bf16* dst, const float (&v)[2 * PAIRS], float scale, int D, int lane) {
#pragma unroll
    for (int p = 0; p < PAIRS; p++) {
        int d = 64 * p + 2 * lane;
        if (d < D) *reinterpret_cast<__nv_bfloat162*>(dst + d) = __floats2bfloat162_rn(v[2 * p] * scale, v[2 * p + 1] * scale);
    }
}

// Dot product of two lane-spread vectors; every lane gets the same bits (warp_sum is a butterfly),
// so decisions taken on the result are uniform across the warp.
template <int PAIRS>
__device__ __forceinline__ float warp_dot(const float (&x)[2 * PAIRS], const float (&y)[2 * PAIRS]) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 2 * PAIRS; i++) s += x[i] * y[i];
    return warp_sum(s);
}

// Forward: one warp per query row (b, h, t), at row index (b * H + h) * T + t. The warp walks the
// keys j = 0 .. t in order, keeping the online softmax state (the same in every lane) and its
// lanes' share of sum_j e^(s_tj - m) v_j; on statistics steps also the sum over the document
// starts j, rescaled with l.
template <int PAIRS, bool WITH_STATS>
__global__ void __launch_bounds__(128) attention_forward_simple_kernel(bf16* out, float* lse, float* row_stats,
                                                                       const uint32_t* doc_bits, const bf16* qk,
                                                                       const bf16* qkv, int B, int T, int H, int Hkv,
                                                                       int D) {
    size_t rows = (size_t)B * H * T;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together
    int t = (int)(row % T), h = (int)(row / T % H), b = (int)(row / T / H);
    int kv_head = h / (H / Hkv);
    size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D;  // between tokens
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;            // key j at j * qk_stride
    const bf16* values = qkv + (size_t)b * T * qkv_stride + (size_t)(H + Hkv + kv_head) * D;  // value j at j * qkv_stride
    const float scale = 1.0f / sqrtf((float)D);

    float q[2 * PAIRS], kv[2 * PAIRS], acc[2 * PAIRS];
    lane_load<PAIRS>(q, qk + ((size_t)b * T + t) * qk_stride + (size_t)h * D, D, lane);
#pragma unroll
    for (int i = 0; i < 2 * PAIRS; i++) acc[i] = 0.0f;
    const uint32_t* row_bits = WITH_STATS && doc_bits ? doc_bits + (size_t)b * document_start_words(T) : nullptr;
    float m = -INFINITY, l = 0.0f, a = 0.0f, s_first = 0.0f, doc = 0.0f;
    for (int j = 0; j <= t; j++) {
        lane_load<PAIRS>(kv, keys + (size_t)j * qk_stride, D, lane);
        float s = warp_dot<PAIRS>(q, kv) * scale;
        if (j == 0) s_first = s;
        if (s > m) {
            float r = online_softmax_raise_max(m, s, &l, &a);
#pragma unroll
            for (int i = 0; i < 2 * PAIRS; i++) acc[i] *= r;
            doc *= r;
            m = s;
        }
        float e = expf(s - m);
        l += e;
        a += e * (s - m);
        if (row_bits && document_start_bit(row_bits, j)) doc += e;
        lane_load<PAIRS>(kv, values + (size_t)j * qkv_stride, D, lane);
#pragma unroll
        for (int i = 0; i < 2 * PAIRS; i++) acc[i] += e * kv[i];
    }
    lane_store<PAIRS>(out + ((size_t)b * T + t) * H * D + (size_t)h * D, acc, 1.0f / l, D, lane);
    if (lane == 0) store_row_results<WITH_STATS>(lse, row_stats, row, rows, m, l, a, s_first, doc);
}

// Backward, keys and values: one warp per key row (b, g, j), at row index (b * Hkv + g) * T + j.
// For each query head h of the group of g, in order, and each query t = j .. T-1 that sees key j,
// in order, it rebuilds p_tj = e^(s_tj - lse_t) and adds
//   dv_j += p_tj dout_t,   dk_j += p_tj (dout_t . v_j - Delta_t) q_t   (times 1/sqrt(D) at the end).
template <int PAIRS>
__global__ void __launch_bounds__(128) attention_backward_dkdv_simple_kernel(bf16* dqk, bf16* dqkv, const bf16* dout,
                                                                             const float* lse, const float* delta,
                                                                             const bf16* qk, const bf16* qkv, int B,
                                                                             int T, int H, int Hkv, int D) {
    size_t rows = (size_t)B * Hkv * T;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together
    int j = (int)(row % T), kv_head = (int)(row / T % Hkv), b = (int)(row / T / Hkv);
    int group = H / Hkv;
    size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D, out_stride = (size_t)H * D;
    size_t k_offset = ((size_t)b * T + j) * qk_stride + (size_t)(H + kv_head) * D;
    size_t v_offset = ((size_t)b * T + j) * qkv_stride + (size_t)(H + Hkv + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);

    float k[2 * PAIRS], v[2 * PAIRS], q[2 * PAIRS], dy[2 * PAIRS], dk[2 * PAIRS], dv[2 * PAIRS];
    lane_load<PAIRS>(k, qk + k_offset, D, lane);
    lane_load<PAIRS>(v, qkv + v_offset, D, lane);
#pragma unroll
    for (int i = 0; i < 2 * PAIRS; i++) dk[i] = dv[i] = 0.0f;
    for (int h = kv_head * group; h < (kv_head + 1) * group; h++) {
        const bf16* queries = qk + (size_t)b * T * qk_stride + (size_t)h * D;  // query t at t * qk_stride
        const bf16* douts = dout + (size_t)b * T * out_stride + (size_t)h * D;  // dout t at t * out_stride
        const float* row_lse = lse + ((size_t)b * H + h) * T;
        const float* row_delta = delta + ((size_t)b * H + h) * T;
        for (int t = j; t < T; t++) {
            lane_load<PAIRS>(q, queries + (size_t)t * qk_stride, D, lane);
            lane_load<PAIRS>(dy, douts + (size_t)t * out_stride, D, lane);
            float p = expf(warp_dot<PAIRS>(q, k) * scale - row_lse[t]);
            float ds = p * (warp_dot<PAIRS>(dy, v) - row_delta[t]);
#pragma unroll
            for (int i = 0; i < 2 * PAIRS; i++) {
                dv[i] += p * dy[i];
                dk[i] += ds * q[i];
            }
        }
    }
    lane_store<PAIRS>(dqk + k_offset, dk, scale, D, lane);
    lane_store<PAIRS>(dqkv + v_offset, dv, 1.0f, D, lane);
}

// Backward, queries: one warp per query row (b, h, t), at row index (b * H + h) * T + t. Over the
// keys j = 0 .. t, in order: dq_t += p_tj (dout_t . v_j - Delta_t) k_j (times 1/sqrt(D) at the end).
template <int PAIRS>
__global__ void __launch_bounds__(128) attention_backward_dq_simple_kernel(bf16* dqk, const bf16* dout, const float* lse,
                                                                           const float* delta, const bf16* qk,
                                                                           const bf16* qkv, int B, int T, int H,
                                                                           int Hkv, int D) {
    size_t rows = (size_t)B * H * T;
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together
    int t = (int)(row % T), h = (int)(row / T % H), b = (int)(row / T / H);
    int kv_head = h / (H / Hkv);
    size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D;
    size_t q_offset = ((size_t)b * T + t) * qk_stride + (size_t)h * D;
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;
    const bf16* values = qkv + (size_t)b * T * qkv_stride + (size_t)(H + Hkv + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);
    const float row_lse = lse[row], row_delta = delta[row];

    float q[2 * PAIRS], dy[2 * PAIRS], k[2 * PAIRS], v[2 * PAIRS], dq[2 * PAIRS];
    lane_load<PAIRS>(q, qk + q_offset, D, lane);
    lane_load<PAIRS>(dy, dout + ((size_t)b * T + t) * H * D + (size_t)h * D, D, lane);
#pragma unroll
    for (int i = 0; i < 2 * PAIRS; i++) dq[i] = 0.0f;
    for (int j = 0; j <= t; j++) {
        lane_load<PAIRS>(k, keys + (size_t)j * qk_stride, D, lane);
        lane_load<PAIRS>(v, values + (size_t)j * qkv_stride, D, lane);
        float p = expf(warp_dot<PAIRS>(q, k) * scale - row_lse);
        float ds = p * (warp_dot<PAIRS>(dy, v) - row_delta);
#pragma unroll
        for (int i = 0; i < 2 * PAIRS; i++) dq[i] += ds * k[i];
    }
    lane_store<PAIRS>(dqk + q_offset, dq, scale, D, lane);
}

// ---------------------------------------------------------------------------------------------
// Tensor-core implementation. A block of 4 warps takes a tile of 64 MB rows (queries, or keys in the
// dK/dV kernel), 16 MB rows per warp, and walks tiles of 64 of the other side through shared memory.
//
// mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and
// c = lane % 4; each 32-bit register holds two bf16, the lower column (or row, for B) in the low half:
//   A, 16 x 16:  a0 = A[g][2c, 2c+1]   a1 = A[g+8][2c, 2c+1]   a2 = A[g][2c+8, 2c+9]   a3 = A[g+8][2c+8, 2c+9]
//   B, 16 x 8:   b0 = B[2c, 2c+1][g]   b1 = B[2c+8, 2c+9][g]
//   C, 16 x 8 (float):  c0, c1 = C[g][2c, 2c+1]   c2, c3 = C[g+8][2c, 2c+1]
// The accumulators of two neighbouring 16 x 8 blocks therefore hold, element for element, the A
// operand of the 16 x 16 block they form: scores turn into the left operand of the next product
// without leaving registers. A lane owns two rows of its warp's 16, g and g + 8 (index r = 0, 1
// below; accumulator element e belongs to row r = e / 2 and column 2c + e % 2 of its 8-wide block).
//
// Operands come from shared memory through ldmatrix.x4: lanes 8i .. 8i+7 give the addresses of the
// 8 rows (16 bytes each) of 8 x 8 matrix i, and register i of every lane receives elements
// [g][2c, 2c+1] of matrix i, or, with .trans, elements [2c][g] and [2c+1][g]: in both cases one
// fragment register of the layout above.

constexpr int kMmaTile = 64;      // rows per tile, on both sides
constexpr int kMmaThreads = 128;  // 4 warps x 16 MB rows

// Shared tiles are [64][D + 8] bf16: the 16 bytes of padding keep rows 16-byte aligned and move
// each row 4 banks along, so that the 8 rows an ldmatrix phase reads fall in different banks.
constexpr int kMmaTilePad = 8;

// d += A B for a 16 x 16 A and the 16 x 8 B of registers b0, b1.
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// `row` is this lane's row address (see above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
    uint32_t address = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
    uint32_t address = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// A operand: the 16 x 16 block of a shared tile at rows row0.., columns col0.. Matrices 0-3: rows
// row0, row0 + 8, row0, row0 + 8 at columns col0, col0, col0 + 8, col0 + 8 (a0 .. a3).
template <int LD>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const bf16* tile, int row0, int col0, int lane) {
    ldmatrix_x4(a, tile + (row0 + lane % 8 + (lane / 8) % 2 * 8) * LD + col0 + lane / 16 * 8);
}

// B operands of X tile^T, where B[k][n] = tile[n0 + n][k0 + k] (the tile's rows are the n index, as
// the keys in Q K^T), for two consecutive 16-deep k steps: b[0], b[1] for k0 and b[2], b[3] for
// k0 + 16. Matrices 0-3: rows n0 .. n0 + 7 at columns k0, k0 + 8, k0 + 16, k0 + 24.
template <int LD>
__device__ __forceinline__ void load_b_fragments_rows_n(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
    ldmatrix_x4(b, tile + (n0 + lane % 8) * LD + k0 + lane / 8 * 8);
}

// B operands of X tile, where B[k][n] = tile[k0 + k][n0 + n] (the tile's rows are the k index, as
// the keys in P V), for two neighbouring 8-wide n blocks: b[0], b[1] for n0 and b[2], b[3] for
// n0 + 8. Transposed matrices 0-3: rows k0, k0 + 8, k0, k0 + 8 at columns n0, n0, n0 + 8, n0 + 8.
template <int LD>
__device__ __forceinline__ void load_b_fragments_rows_k(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
    ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + (lane / 8) % 2 * 8) * LD + n0 + lane / 16 * 8);
}

__device__ __forceinline__ uint32_t pack_floats_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) | ((uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16);
}

// The A operand of a 16 x 16 block from the accumulators of its left and right 16 x 8 halves.
__device__ __forceinline__ void accumulators_to_a_fragment(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
    a[0] = pack_floats_bf16x2(left[0], left[1]);
    a[1] = pack_floats_bf16x2(left[2], left[3]);
    a[2] = pack_floats_bf16x2(right[0], right[1]);
    a[3] = pack_floats_bf16x2(right[2], right[3]);
}

// LEAN: the mma kernels with fewer instructions a score (ATTENTION_MMA_LEAN). Their
// softmax runs in base 2 on the unscaled scores s: with c = log2(e) / sqrt(D) and a row's largest
// unscaled score m, a probability is 2^(s c - m c), one product-add and one ex2 (the form flushing
// results below 2^-126 to zero: one MUFU.EX2, where __expf's ex2 without it adds a compare and two
// products that keep such results), in place of a product by 1/sqrt(D), a subtraction and __expf's
// product by log2(e). The entropy's sum then holds terms p (s c - m c), log2(e) times the natural
// ones. Masked scores are kLeanMasked rather than -inf: finite, so that p (s c - m c) = 0 x a finite
// number, with no test of p, and so that a row's first rescaling needs no test either; every row's
// maximum is a real score from its first tile on (each row sees key 0 there).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr float kLeanMasked = -1e30f;

__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Which tile of which head and batch element a block of the mma kernels takes. A tile's rank orders
// a head's tiles by their work: rank 0 is the longest (the last query tile, which sees every key;
// in the dK/dV kernel the first key tile, which every query sees). The device starts a grid's
// blocks in order, x fastest. ./train's grid is (tiles, heads, B): a head's tiles start longest
// first, but one head after another, so the last heads' longest tiles start near the end and run on
// while most of the device has nothing left. A list-scheduling model of d22's causal layer (32
// tiles of 1 to 32 steps a head, at 2 and 3 blocks an SM on 132 SMs) takes 1.15-1.23x the even
// share of the work at 8 x 2048 and 1.30-1.46x at 4 x 2048 in that order; the dev_attention times
// of the d22 layer on an H100 (B4 0.122 ms forward, 0.370 backward; B8 inside a training step 0.206
// and 0.615) are consistent with it: 1.2x less work a second at B4. LPT (longest processing time
// first): the (batch element, head) pairs in groups of about kLptHeads (a group is 2^s
// whole batch elements, heads 2^s <= kLptHeads where heads allow, no more than B), the partial
// group first, each group's tiles rank by rank with its pairs side by side; the same model takes
// 1.00-1.13x. The grid is (heads, tiles 2^s, groups): x the head, y = rank 2^s + the batch
// element's place in its group, z the group, so that decoding a block is shifts and masks of its
// indices (a division would move them off the uniform datapath and cost the kernels tens of
// registers); the partial group's missing batch elements are blocks that return at once (valid
// false). A group bounds the keys and values in flight (32 heads' at d22: 16 MiB), which stay in L2
// for the many blocks that read them. The work of a block is the same in either order: so are its
// bits.
constexpr int kLptHeads = 32;
struct TileBlock {
    int rank, head, b;
    bool valid;
};
// ceil(log2 x) for x >= 1, 32 - clz(x - 1), the same on the host and the device.
__host__ __device__ inline int ceil_log2(int x) {
#ifdef __CUDA_ARCH__
    return 32 - __clz(x - 1);
#else
    return x > 1 ? 32 - __builtin_clz((unsigned)(x - 1)) : 0;
#endif
}
// s, a group's 2^s batch elements: the most with heads 2^s <= kLptHeads (with h in (2^(k-1), 2^k],
// 2^(5 - k); one batch element where heads > kLptHeads), and no more than B needs.
__host__ __device__ inline int lpt_shift(int heads, int B) {
    static_assert(kLptHeads == 32, "the shift below is 5 - ceil(log2 heads)");
    const int by_heads = 5 - ceil_log2(heads), by_batch = ceil_log2(B);
    const int s = by_heads > 0 ? by_heads : 0;
    return s < by_batch ? s : by_batch;
}
template <bool LPT>
__device__ __forceinline__ TileBlock tile_block(int heads, int B) {
    if constexpr (!LPT) {
        return {(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, true};
    } else {
        const int s = lpt_shift(heads, B), missing = ((int)gridDim.z << s) - B;  // batch elements, in the first group
        const int b = ((int)blockIdx.z << s) + (int)(blockIdx.y & ((1u << s) - 1)) - missing;
        return {(int)(blockIdx.y >> s), (int)blockIdx.x, b, b >= 0};
    }
}
// Whether the LPT grid takes `tiles` ranks (its y dimension, tiles 2^s, at most 65535: T up to 131,008
// at one head, 1,048,512 at d22's 8). Where it does not, attention_prepare picks ./train's order.
inline bool lpt_grid_fits(int tiles, int heads, int B) { return ((long long)tiles << lpt_shift(heads, B)) <= 65535; }
// The grid of `tiles` ranks of heads x B (batch element, head) pairs in tile_block's order.
inline dim3 tile_grid(bool lpt, int tiles, int heads, int B) {
    if (!lpt) return dim3(tiles, heads, B);
    if (!lpt_grid_fits(tiles, heads, B)) fail("internal: %d tiles of %d heads in the LPT grid", tiles, heads);
    const int s = lpt_shift(heads, B);
    return dim3(heads, tiles << s, (B + (1 << s) - 1) >> s);
}

// cp.async (sm_80+): global-to-shared copies that complete in the background, so that the next
// tile loads while the current one is in use. A thread commits its copies in groups and waits
// until at most `pending` of its groups are still in flight; a __syncthreads() after the wait makes
// every thread's copies visible to the block. A copy with `valid` false reads nothing and writes
// zeros (its source address must still be a valid one).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    uint32_t address = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
    uint32_t address = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// Starts copying rows row0 .. row0 + 63 of a sequence (row r of D bf16 at src + r * stride) into a
// shared tile with row pitch LD, zeros for rows at or beyond T. 16-byte copies: src and stride are
// multiples of 8 elements (D a multiple of 8, 16-byte aligned base pointers, checked on the host).
template <int D, int LD>
__device__ __forceinline__ void load_tile_async(bf16* tile, const bf16* src, size_t stride, int row0, int T) {
    constexpr int kChunks = D / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < kMmaTile * kChunks; i += kMmaThreads) {
        int r = i / kChunks, chunk = i % kChunks;
        bool valid = row0 + r < T;
        cp_async_16(tile + r * LD + chunk * 8, src + (size_t)(valid ? row0 + r : 0) * stride + chunk * 8, valid);
    }
}

// The forward and dQ kernels' shared memory, in bytes: two buffers each of key and value tiles
// (dynamic: above the 48 KiB default for D = 128, whose launches opt in).
template <int D>
constexpr int attention_kv_buffers_smem_bytes() {
    return 4 * kMmaTile * (D + kMmaTilePad) * (int)sizeof(bf16);
}

// Double buffering over the key/value tiles of a sequence: starts copying tile `index + 1` into
// the buffers not in use (when index < last), then waits until tile `index` has landed in
// k_tiles[index % 2] and v_tiles[index % 2] (the keys alone without VALUES), and synchronises the
// block.
template <int D, int LD, bool VALUES = true>
__device__ __forceinline__ void next_kv_tiles(bf16 (*k_tiles)[kMmaTile * LD], bf16 (*v_tiles)[kMmaTile * LD],
                                              const bf16* keys, const bf16* values, size_t qk_stride,
                                              size_t qkv_stride, int index, int last, int T) {
    if (index < last) {
        const int buffer = index % 2, j_next = (index + 1) * kMmaTile;
        load_tile_async<D, LD>(k_tiles[1 - buffer], keys, qk_stride, j_next, T);
        if (VALUES) load_tile_async<D, LD>(v_tiles[1 - buffer], values, qkv_stride, j_next, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// Starts copying x[t0 .. t0 + 63] of one row of lse or Delta, zeros beyond T.
__device__ __forceinline__ void load_row_values_async(float* dst, const float* x, int t0, int T) {
    for (int i = threadIdx.x; i < kMmaTile; i += kMmaThreads) {
        bool valid = t0 + i < T;
        cp_async_4(dst + i, x + (valid ? t0 + i : 0), valid);
    }
}

// Hopper's warpgroup products (wgmma, the candidate stats_rows_wgmma): the block's four warps, a
// warpgroup, compute one 64 x 64 tile S = Q K^T as a few asynchronous instructions, the keys read
// by the tensor cores straight from shared memory, where mma.sync takes 32 products and 16 ldmatrix
// loads a warp. Each warp's A operand (its 16 queries) stays in registers, as mma.sync's A
// fragments (the same layout); S arrives in mma.sync's accumulator layout too, lane (g, c) of warp w
// holding rows 16w + g and + 8 at columns 8n + 2c and + 1, so the code after the product is the
// same. wgmma exists only in sm_90a's code (CUDA_ARCHS=90a): elsewhere these helpers trap, and
// attention_wgmma_compiled() tells the host which build it has.
//
// The tiles wgmma reads are in its layout without swizzling: 8 x 8 "core matrices" (8 rows of 16
// bytes, 128 contiguous bytes); a row group's D / 8 of them side by side, 128 bytes apart (the
// descriptor's leading byte offset, along the product's k), and the row groups D * 16 bytes apart
// (its stride byte offset). A row's 16-byte chunk lands at:
template <int D>
__host__ __device__ constexpr int core_tile_offset(int row, int chunk) {
    return (row / 8) * D * 16 + chunk * 128 + (row % 8) * 16;
}

// load_tile_async into that layout. Lane i of 8 takes row 8 r + i of a chunk, so that 8 lanes write
// one core matrix's 128 contiguous bytes, and a warp's 32 lanes read 4 neighbouring chunks (64
// contiguous bytes) of 8 rows.
template <int D>
__device__ __forceinline__ void load_tile_core_async(bf16* tile, const bf16* src, size_t stride, int row0, int T) {
    constexpr int kChunks = D / 8;
    char* bytes = reinterpret_cast<char*>(tile);
    for (int i = threadIdx.x; i < kMmaTile * kChunks; i += kMmaThreads) {
        const int chunk = i / 8 % kChunks, r = i / (8 * kChunks) * 8 + i % 8;
        const bool valid = row0 + r < T;
        cp_async_16(bytes + core_tile_offset<D>(r, chunk), src + (size_t)(valid ? row0 + r : 0) * stride + chunk * 8, valid);
    }
}

// load_a_fragment from a tile in the core-matrix layout: ldmatrix takes each lane's 16-byte row
// wherever it lies.
template <int D>
__device__ __forceinline__ void load_a_fragment_core(uint32_t (&a)[4], const bf16* tile, int row0, int col0, int lane) {
    const int r = row0 + lane % 8 + (lane / 8) % 2 * 8, chunk = col0 / 8 + lane / 16;
    ldmatrix_x4(a, reinterpret_cast<const bf16*>(reinterpret_cast<const char*>(tile) + core_tile_offset<D>(r, chunk)));
}

// Shared memory written through the generic proxy (cp.async, stores) made visible to the async
// proxy wgmma reads through: by each writing thread after its writes completed, before the barrier
// that hands them to the warpgroup.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
    __trap();
#endif
}

// The descriptor of a shared-memory operand in the layout above, from its first core matrix:
// address, leading and stride byte offsets, each in units of 16 bytes; no swizzling (bits 62-63: 0).
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* first, uint32_t leading_bytes, uint32_t stride_bytes) {
    const uint32_t address = (uint32_t)__cvta_generic_to_shared(first);
    return (uint64_t)((address & 0x3FFFF) >> 4) | (uint64_t)(leading_bytes >> 4) << 16 |
           (uint64_t)(stride_bytes >> 4) << 32;
}

// Before a warpgroup's first wgmma of a product: its registers (A fragments, accumulators) settled.
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// s (the warpgroup's 64 x 64, this lane's share) = A B, or s + A B with ACCUMULATE: A the warp's
// 16 x 16 slice of 64 x 16 in registers, B 16 x 64 from descriptor b (K-major: the tile's rows are
// B's columns, as the keys of Q K^T). Asynchronous: s may be read only after wgmma_commit_and_wait.
// Without ACCUMULATE s is only written ("=f"), so that nothing sets it before.
#define WGMMA_SCORES(constraint)                                                                                    \
    constraint(s[0][0]), constraint(s[0][1]), constraint(s[0][2]), constraint(s[0][3]), constraint(s[1][0]),         \
        constraint(s[1][1]), constraint(s[1][2]), constraint(s[1][3]), constraint(s[2][0]), constraint(s[2][1]),     \
        constraint(s[2][2]), constraint(s[2][3]), constraint(s[3][0]), constraint(s[3][1]), constraint(s[3][2]),     \
        constraint(s[3][3]), constraint(s[4][0]), constraint(s[4][1]), constraint(s[4][2]), constraint(s[4][3]),     \
        constraint(s[5][0]), constraint(s[5][1]), constraint(s[5][2]), constraint(s[5][3]), constraint(s[6][0]),     \
        constraint(s[6][1]), constraint(s[6][2]), constraint(s[6][3]), constraint(s[7][0]), constraint(s[7][1]),     \
        constraint(s[7][2]), constraint(s[7][3])
#define WGMMA_64X64X16                                                                                             \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                    \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                                \
    "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
template <bool ACCUMULATE>
__device__ __forceinline__ void wgmma_64x64x16(float (&s)[kMmaTile / 8][4], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (ACCUMULATE)
        asm volatile(WGMMA_64X64X16 : WGMMA_SCORES("+f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1)
                     : "memory");
    else
        asm volatile(WGMMA_64X64X16 : WGMMA_SCORES("=f") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(0)
                     : "memory");
#else
    __trap();
#endif
}
#undef WGMMA_SCORES
#undef WGMMA_64X64X16

// The warpgroup's products committed and waited for; then each accumulator passes through an empty
// statement that "writes" it, so that the compiler reads none of them before the wait.
__device__ __forceinline__ void wgmma_commit_and_wait(float (&s)[kMmaTile / 8][4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int n = 0; n < kMmaTile / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(s[n][e])::"memory");
#else
    __trap();
#endif
}

// Whether this build's device code has sm_90a's instructions (wgmma) for the device in use
// (cuda_common.cuh's device_code). Where it does not, the wgmma forms above trap.
inline bool attention_wgmma_compiled() { return device_code().sm90a; }

// C (MB blocks of 16 rows x N) += A tile^T, A the warp's MB blocks of 16 x D as A fragments in
// registers, tile N x D: a product over the head dimension with the tile's rows as C's columns
// (S = Q K^T, dP = dO V^T). Each B fragment is loaded once for all MB blocks (a warp of MB blocks
// reads shared memory 1/MB as often per product).
template <int D, int LD, int MB, int N>
__device__ __forceinline__ void mma_blocks_times_tile_transposed(float (&acc)[MB][N / 8][4],
                                                                 const uint32_t (&a)[MB][D / 16][4], const bf16* tile,
                                                                 int lane) {
#pragma unroll
    for (int nb = 0; nb < N / 8; nb++) {
#pragma unroll
        for (int kc = 0; kc < D / 16; kc += 2) {
            uint32_t b[4];
            load_b_fragments_rows_n<LD>(b, tile, nb * 8, kc * 16, lane);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                mma_bf16_16x8x16(acc[mb][nb], a[mb][kc], b[0], b[1]);
                mma_bf16_16x8x16(acc[mb][nb], a[mb][kc + 1], b[2], b[3]);
            }
        }
    }
}

// The same product with A read from shared memory, 32 columns at a time, as it is used: MB blocks
// of 16 rows of a_tile from row a_row0 (S^T = K Q^T, dP^T = V dO^T, whose left operands, the
// block's keys and values, would not fit in registers beside the dK and dV sums). Each sum takes
// its terms in the same order as above.
template <int D, int LD, int MB, int N>
__device__ __forceinline__ void mma_shared_blocks_times_tile_transposed(float (&acc)[MB][N / 8][4], const bf16* a_tile,
                                                                        int a_row0, const bf16* tile, int lane) {
#pragma unroll
    for (int kc = 0; kc < D / 16; kc += 2) {
        uint32_t a[MB][2][4];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) {
            load_a_fragment<LD>(a[mb][0], a_tile, a_row0 + 16 * mb, kc * 16, lane);
            load_a_fragment<LD>(a[mb][1], a_tile, a_row0 + 16 * mb, (kc + 1) * 16, lane);
        }
#pragma unroll
        for (int nb = 0; nb < N / 8; nb++) {
            uint32_t b[4];
            load_b_fragments_rows_n<LD>(b, tile, nb * 8, kc * 16, lane);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                mma_bf16_16x8x16(acc[mb][nb], a[mb][0], b[0], b[1]);
                mma_bf16_16x8x16(acc[mb][nb], a[mb][1], b[2], b[3]);
            }
        }
    }
}

// C (MB blocks of 16 x D) += A tile, A (16 x K per block) from the accumulators `left` of a
// product above, tile K x D: a product over the tile's rows (O += P V, dQ += dS K, dV += P^T dO,
// dK += dS^T Q), each B fragment loaded once for all MB blocks as above.
template <int D, int LD, int MB, int K>
__device__ __forceinline__ void mma_block_scores_times_tile(float (&acc)[MB][D / 8][4], const float (&left)[MB][K / 8][4],
                                                            const bf16* tile, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[MB][4];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) accumulators_to_a_fragment(a[mb], left[mb][2 * kk], left[mb][2 * kk + 1]);
#pragma unroll
        for (int nd = 0; nd < D / 8; nd += 2) {
            uint32_t b[4];
            load_b_fragments_rows_k<LD>(b, tile, kk * 16, nd * 8, lane);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                mma_bf16_16x8x16(acc[mb][nd], a[mb], b[0], b[1]);
                mma_bf16_16x8x16(acc[mb][nd + 1], a[mb], b[2], b[3]);
            }
        }
    }
}

// The document starts among the keys j0 .. j0 + 63 of a tile, bit j - j0 for key j, from the
// sequence's bits (null: none): two words, the second absent when the tile runs past T.
__device__ __forceinline__ uint64_t tile_document_starts(const uint32_t* row_bits, int j0, int words) {
    static_assert(kMmaTile == 64, "a tile's document starts are two 32-bit words");
    if (!row_bits) return 0;
    const int w = j0 / 32;
    return row_bits[w] | (w + 1 < words ? (uint64_t)row_bits[w + 1] << 32 : 0);
}

// The forward pass's online softmax of one block of 16 query rows, as one lane holds it: its two
// rows g and g + 8 (positions t), their running maxima m, sums l = sum e^(s - m), entropy sums
// a = sum e^(s - m)(s - m), sums over the document starts, and scores at key 0; the lane's share of
// the rows' output sums sum_j e^(s_tj - m) v_j is kept beside it as 16 x 8 blocks.
struct RowBlockSoftmax {
    int t[2];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, a[2] = {0.0f, 0.0f}, doc[2] = {0.0f, 0.0f};
    float s_first[2] = {0.0f, 0.0f};
};

// The largest x of the four lanes of a quad (same g), which hold the 64 columns of the same two rows.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Row r's new maximum m_new: its mass on document starts and its output sums times `rescale`, the
// factor that takes sums relative to the old maximum to the new one (l and a are rescaled already).
template <int D>
__device__ __forceinline__ void raise_row_max(RowBlockSoftmax& rb, float (&o)[D / 8][4], int r, float m_new,
                                              float rescale) {
    rb.doc[r] *= rescale;
    rb.m[r] = m_new;
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
        o[nd][2 * r] *= rescale;
        o[nd][2 * r + 1] *= rescale;
    }
}

// One key tile (keys j0 .. j0 + 63) of a block of rows: scales its scores s (16 x 64) and masks
// them where `diagonal` (a tile that reaches the query tile's first query: there keys after a
// row's query or beyond T become -inf), raises the rows' maxima, rescaling their sums and output
// sums o, and turns s into the unnormalised probabilities e^(s - m), 0 where masked, adding this
// lane's share to l, a and doc (bit i of tile_bits: key j0 + i starts a document). Every row sees
// key 0 in the first tile, so its maximum is finite from then on, and a tile whose keys are all
// masked for a row leaves the row as it was. A masked term is skipped in a: its 0 * (-inf) would be
// NaN. __expf (one ex2.approx) is within a few 1e-6 relative of expf for every term that matters
// (its error grows with |x|, and e^x is below 1e-9 beyond x = -20): far below bf16's 4e-3, at a
// third of expf's instructions. The backward kernels use it too.
template <int D, bool WITH_STATS>
__device__ __forceinline__ void online_softmax_tile(RowBlockSoftmax& rb, float (&s)[kMmaTile / 8][4], float (&o)[D / 8][4],
                                                    int j0, int T, bool diagonal, uint64_t tile_bits, float scale, int c) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = j0 + nb * 8 + 2 * c + e % 2, r = e / 2;
            s[nb][e] *= scale;
            if (diagonal && (j > rb.t[r] || j >= T)) s[nb][e] = -INFINITY;
            tile_max[r] = fmaxf(tile_max[r], s[nb][e]);
        }
    }
    if (WITH_STATS && j0 == 0) {  // key 0 sits in element 0 (row g) and 2 (row g + 8) of lane c == 0
        rb.s_first[0] = s[0][0];
        rb.s_first[1] = s[0][2];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float m_new = fmaxf(rb.m[r], quad_max(tile_max[r]));
        float rescale = online_softmax_raise_max(rb.m[r], m_new, &rb.l[r], &rb.a[r]);
        raise_row_max<D>(rb, o, r, m_new, rescale);
    }
#pragma unroll
    for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = e / 2;
            float p = __expf(s[nb][e] - rb.m[r]);
            rb.l[r] += p;
            if (WITH_STATS && p > 0.0f) rb.a[r] += p * (s[nb][e] - rb.m[r]);
            if (WITH_STATS && ((tile_bits >> (nb * 8 + 2 * c + e % 2)) & 1)) rb.doc[r] += p;
            s[nb][e] = p;
        }
    }
}

// online_softmax_tile's LEAN form (see kLog2e): the same state, with m the rows' largest unscaled
// scores (kLeanMasked before the first tile), a the entropy sums in base 2 and s_first unscaled;
// c2 = log2(e) / sqrt(D). Each score costs a maximum, a product-add, an ex2 and an addition (a
// product-add more on statistics steps), and the document starts are looked at only in a tile
// that holds one (tile_bits is the same for every thread of the block).
template <int D, bool WITH_STATS>
__device__ __forceinline__ void online_softmax_tile_lean(RowBlockSoftmax& rb, float (&s)[kMmaTile / 8][4],
                                                         float (&o)[D / 8][4], int j0, int T, bool diagonal,
                                                         uint64_t tile_bits, float c2, int c) {
    float tile_max[2] = {kLeanMasked, kLeanMasked};
#pragma unroll
    for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = j0 + nb * 8 + 2 * c + e % 2, r = e / 2;
            if (diagonal && (j > rb.t[r] || j >= T)) s[nb][e] = kLeanMasked;
            tile_max[r] = fmaxf(tile_max[r], s[nb][e]);
        }
    }
    if (WITH_STATS && j0 == 0) {
        rb.s_first[0] = s[0][0];
        rb.s_first[1] = s[0][2];
    }
    float m_c[2];  // the rows' new largest scores times c2: every term of this tile subtracts them
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float m_new = fmaxf(rb.m[r], quad_max(tile_max[r]));
        m_c[r] = __fmul_rn(m_new, c2);
        // Earlier terms were taken relative to m_old c2: times 2^(m_old c2 - m_new c2) they are
        // relative to m_new c2, and their entropy terms gain that exponent (math.h's rescaling in
        // base 2). Both products rounded as such (__fmul_rn: never fused into the subtraction), so
        // that the factor is exactly 1 where the maximum holds, rather than off by the rounding of
        // m c2 at every tile. Before the first tile it is 2^(-1e29 or less) = 0, with l = a = 0.
        const float shift = __fmul_rn(rb.m[r], c2) - m_c[r];
        const float rescale = exp2_ftz(shift);
        rb.a[r] = rescale * fmaf(rb.l[r], shift, rb.a[r]);
        rb.l[r] *= rescale;
        raise_row_max<D>(rb, o, r, m_new, rescale);
    }
#pragma unroll
    for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e / 2;
            const float x = fmaf(s[nb][e], c2, -m_c[r]);  // (s - m) c2: kLeanMasked gives -1e29 or less
            const float p = exp2_ftz(x);
            rb.l[r] += p;
            if (WITH_STATS) rb.a[r] = fmaf(p, x, rb.a[r]);
            s[nb][e] = p;
        }
    }
    if (WITH_STATS && tile_bits) {
#pragma unroll
        for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if ((tile_bits >> (nb * 8 + 2 * c + e % 2)) & 1) rb.doc[e / 2] += s[nb][e];
        }
    }
}

// The end of a block of rows: each lane summed its own 16 columns of each tile, so the quad adds
// up its shares; then the rows before T store their output (o / l; not without OUTPUT), log-sum-exp
// and statistics. LEAN: rb in online_softmax_tile_lean's terms, scaled back first (scale = 1/sqrt(D)).
template <int D, bool WITH_STATS, bool OUTPUT = true, bool LEAN = false>
__device__ __forceinline__ void store_row_block(bf16* out, float* lse, float* row_stats, RowBlockSoftmax& rb,
                                                const float (&o)[D / 8][4], int b, int h, int B, int T, int H, int c,
                                                float scale) {
    const size_t rows = (size_t)B * H * T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
#pragma unroll
        for (int lanes = 1; lanes <= 2; lanes *= 2) {
            rb.l[r] += __shfl_xor_sync(0xffffffffu, rb.l[r], lanes);
            rb.a[r] += __shfl_xor_sync(0xffffffffu, rb.a[r], lanes);
            rb.doc[r] += __shfl_xor_sync(0xffffffffu, rb.doc[r], lanes);
        }
        const int t = rb.t[r];
        if (t < T) {
            if (OUTPUT) {
                float inv_l = 1.0f / rb.l[r];
                bf16* y = out + ((size_t)b * T + t) * H * D + (size_t)h * D + 2 * c;
#pragma unroll
                for (int nd = 0; nd < D / 8; nd++)
                    *reinterpret_cast<__nv_bfloat162*>(y + nd * 8) = __floats2bfloat162_rn(o[nd][2 * r] * inv_l, o[nd][2 * r + 1] * inv_l);
            }
            // LEAN: the products rounded as such (__fmul_rn), so that lse = m + ln l rounds the same
            // way with and without statistics (a fused m_raw scale + ln l would round once where
            // the statistics' other uses of m keep the product apart): at D = 128 the scale is no
            // power of 2.
            const float m = LEAN ? __fmul_rn(rb.m[r], scale) : rb.m[r];
            const float a = LEAN ? rb.a[r] * kLn2 : rb.a[r];
            const float s_first = LEAN ? __fmul_rn(rb.s_first[r], scale) : rb.s_first[r];
            if (c == 0)
                store_row_results<WITH_STATS>(lse, row_stats, ((size_t)b * H + h) * T + t, rows, m, rb.l[r], a, s_first,
                                              rb.doc[r]);
        }
    }
}

// Forward: block (query tile, h, b); grid.x = number of query tiles, taken last first so that the
// longest rows start first. A query tile is 64 MB rows: each warp keeps MB blocks of 16 queries as A
// fragments and, over key tiles 0 .. the last one its tile's queries see, computes S = Q K^T (16 x 64
// per block) and goes on with each block's online softmax (online_softmax_tile), adding P V into
// its 16 x D output sums. Key/value tiles are double-buffered: tile i + 1 is copied in while tile i
// is in use. MB = 1 is what ./train runs; MB = 2 (a warp's 32 rows share each B fragment it loads
// from shared memory: ATTENTION_MMA_WIDE) measured no faster, and slower with the statistics.
// STATS_ONLY: the rows' statistics and lse alone, no output (out unused): no values are read and no
// P V product is made, for a step whose output comes from elsewhere (cuDNN's kernels). The
// statistics are the same bits as the full kernel's: the same instructions make them. LEAN: the
// softmax of online_softmax_tile_lean (ATTENTION_MMA_LEAN). LPT: tile_block's order.
template <int D, int MB, bool WITH_STATS, int MIN_BLOCKS = 0, bool STATS_ONLY = false, bool LEAN = false, bool LPT = false>
__global__ void __launch_bounds__(kMmaThreads, MIN_BLOCKS) attention_forward_mma_kernel(bf16* out, float* lse,
        float* row_stats, const uint32_t* doc_bits, const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv) {
    static_assert(D % 32 == 0, "D must be a multiple of 32");
    static_assert(MB == 1 || MB == 2, "a query tile stages in one or two of the shared tiles");
    static_assert(!STATS_ONLY || WITH_STATS, "the statistics alone need the statistics");
    constexpr int LD = D + kMmaTilePad, kQueryTile = MB * kMmaTile;
    extern __shared__ __align__(16) unsigned char kv_shared[];  // attention_kv_buffers_smem_bytes<D>()
    bf16 (*k_tiles)[kMmaTile * LD] = reinterpret_cast<bf16 (*)[kMmaTile * LD]>(kv_shared);  // 2 buffers
    bf16 (*v_tiles)[kMmaTile * LD] = k_tiles + 2;                                            // 2 buffers
    const TileBlock work = tile_block<LPT>(H, B);
    if (!work.valid) return;
    const int q_tiles = LPT ? (T + kQueryTile - 1) / kQueryTile : (int)gridDim.x;
    const int q_tile = q_tiles - 1 - work.rank;
    const int h = work.head, b = work.b, kv_head = h / (H / Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D;
    const bf16* queries = qk + (size_t)b * T * qk_stride + (size_t)h * D;
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;
    const bf16* values = qkv + (size_t)b * T * qkv_stride + (size_t)(H + Hkv + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);
    const int q0 = q_tile * kQueryTile, warp_q0 = q0 + warp * 16 * MB;  // the tile's and the warp's first query
    const int last_k_tile = min(q0 + kQueryTile - 1, T - 1) / kMmaTile;

    // Copy groups: the queries (rows 64 i .. 64 i + 63 of the tile through k_tiles[1] and, for a
    // second 64, v_tiles[1]: free until the loop prefetches into them), then key/value tile 0.
    load_tile_async<D, LD>(k_tiles[1], queries, qk_stride, q0, T);
    if (MB == 2) load_tile_async<D, LD>(v_tiles[1], queries, qk_stride, q0 + kMmaTile, T);
    cp_async_commit();
    load_tile_async<D, LD>(k_tiles[0], keys, qk_stride, 0, T);
    if (!STATS_ONLY) load_tile_async<D, LD>(v_tiles[0], values, qkv_stride, 0, T);
    cp_async_commit();
    // The warp's queries, as the A operands of S = Q K^T: block mb is the tile's rows
    // 16 (MB warp + mb) .. + 15.
    cp_async_wait<1>();
    __syncthreads();
    uint32_t q_frag[MB][D / 16][4];
    RowBlockSoftmax rb[MB];
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        const int row = (MB * warp + mb) * 16;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            load_a_fragment<LD>(q_frag[mb][kc], row < kMmaTile ? k_tiles[1] : v_tiles[1], row % kMmaTile, kc * 16, lane);
        rb[mb].t[0] = q0 + row + g;
        rb[mb].t[1] = q0 + row + g + 8;
        if constexpr (LEAN) rb[mb].m[0] = rb[mb].m[1] = kLeanMasked;
    }
    __syncthreads();

    float o[MB][D / 8][4] = {};  // the output sums of each block of rows
    const int words = document_start_words(T);
    const uint32_t* row_bits = WITH_STATS && doc_bits ? doc_bits + (size_t)b * words : nullptr;  // the sequence's
    for (int k_tile_index = 0; k_tile_index <= last_k_tile; k_tile_index++) {
        const int j0 = k_tile_index * kMmaTile, buffer = k_tile_index % 2;
        next_kv_tiles<D, LD, !STATS_ONLY>(k_tiles, v_tiles, keys, values, qk_stride, qkv_stride, k_tile_index,
                                          last_k_tile, T);
        // A tile whose first key comes after every query of the warp adds nothing to its rows
        // (with MB = 2 the last tile for the first half of the query tile's warps).
        if (j0 <= warp_q0 + 16 * MB - 1) {
            float s[MB][kMmaTile / 8][4] = {};  // scores: 16 rows x 64 keys as 16 x 8 blocks, per block of rows
            mma_blocks_times_tile_transposed<D, LD, MB, kMmaTile>(s, q_frag, k_tiles[buffer], lane);
            // Only the tiles from the query tile's first query on hold keys after a row's query or
            // beyond T: an earlier tile ends before that query, which is < T.
            const bool diagonal = j0 + kMmaTile - 1 >= q0;
            const uint64_t tile_bits = WITH_STATS ? tile_document_starts(row_bits, j0, words) : 0;
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
                if constexpr (LEAN)
                    online_softmax_tile_lean<D, WITH_STATS>(rb[mb], s[mb], o[mb], j0, T, diagonal, tile_bits, scale * kLog2e, c);
                else
                    online_softmax_tile<D, WITH_STATS>(rb[mb], s[mb], o[mb], j0, T, diagonal, tile_bits, scale, c);
            }
            if (!STATS_ONLY) mma_block_scores_times_tile<D, LD, MB, kMmaTile>(o, s, v_tiles[buffer], lane);
        }
        __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    }
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
        store_row_block<D, WITH_STATS, !STATS_ONLY, LEAN>(out, lse, row_stats, rb[mb], o[mb], b, h, B, T, H, c, scale);
}

// The rows' statistics from a log-sum-exp computed elsewhere (cuDNN's forward on a statistics
// step): with lse_t known, p_tj = e^(s_tj - lse_t) needs no running maximum, so a score costs one
// product-add, one exponential and one more product-add (for sum_j p_tj (s_tj - lse_t), the
// entropy's negative), where the online softmax above also keeps and rescales maxima and sums. The
// grid, tiles and S = Q K^T are the forward kernel's (MB = 1), without values. Statistics as
// telemetry.md defines them: entropy -sum_j p (s - lse), p at key 0, e^(max_j s - lse), max_j s, and
// the mass on document starts; they agree with the forward kernel's to float rounding, and the
// largest logit bit for bit (the same scaled scores). ./train's statistics steps beside cuDNN's
// forward, in tile_block's LPT order; dev_attention checks and times it in both orders.
// PLAIN_TILES (the candidate stats_rows_plain): a tile that holds no masked score, no key 0 and no
// document start (at T = 2048, 465 of a head's 528 tiles, fewer where documents start) takes a
// form of the loop without their tests: a product-add, an ex2, a maximum and a product-add a
// score, where ./train's form gives every tile the mask's compares and select too. The same
// operations on every score that counts, so the same bits. WGMMA (the candidate stats_rows_wgmma,
// sm_90a): S = Q K^T as the warpgroup's wgmma products, the key tiles in their core-matrix layout
// (unpadded), in STAGES buffers, STAGES - 1 tiles loading while one is in use (./train's form: 2;
// the candidate's, kStatsWgmmaStages; whether the keys' loads are part of a tile's time, about
// 3,400 clocks a block on an H200 at d22, dev_attention's times at 2, 3 and 4 say); the rest as
// it is.
template <int D, bool WGMMA = false, int STAGES = 2>
constexpr int attention_stats_from_lse_smem_bytes() {
    return STAGES * kMmaTile * (WGMMA ? D : D + kMmaTilePad) * (int)sizeof(bf16);
}

// The keys' pipeline of STAGES buffers in wgmma's layout: tile index + STAGES - 1 starts loading
// into the buffer tile index - 1 used (every warp was done with it at the previous iteration's end;
// at index 0, the queries', which every warp read before the barrier after its ldmatrix), then tile
// `index` is waited for and made visible to wgmma (fence_proxy_async_shared) before the
// block synchronises. A group is committed at every call, empty past the last tile, so that all but
// the newest STAGES - 1 groups are always tile `index` and those before it.
template <int D, int STAGES>
__device__ __forceinline__ void next_key_tile_staged(bf16 (*k_tiles)[kMmaTile * D], const bf16* keys, size_t stride,
                                                     int index, int last, int T) {
    const int ahead = index + STAGES - 1;
    if (ahead <= last) load_tile_core_async<D>(k_tiles[ahead % STAGES], keys, stride, ahead * kMmaTile, T);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    fence_proxy_async_shared();
    __syncthreads();
}

// The WGMMA form's start: the block's queries (through the last buffer, free until the loop refills
// it) as each warp's A fragments, and key tiles 0 .. STAGES - 2 started, each its own group (empty
// past the last tile). The caller synchronises the block before the loop.
template <int D, int STAGES>
__device__ __forceinline__ void wgmma_queries_and_first_keys(uint32_t (&q_frag)[1][D / 16][4],
                                                             bf16 (*k_tiles)[kMmaTile * D], const bf16* queries,
                                                             const bf16* keys, size_t stride, int q0, int last, int T,
                                                             int warp, int lane) {
    load_tile_core_async<D>(k_tiles[STAGES - 1], queries, stride, q0, T);
    cp_async_commit();
    for (int i = 0; i < STAGES - 1; i++) {
        if (i <= last) load_tile_core_async<D>(k_tiles[i], keys, stride, i * kMmaTile, T);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();
    __syncthreads();
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) load_a_fragment_core<D>(q_frag[0][kc], k_tiles[STAGES - 1], warp * 16, kc * 16, lane);
}

// The WGMMA form's scores: s = Q K^T for a key tile in wgmma's layout, in k steps of 16 (the core
// matrices 2 kk and 2 kk + 1 of each row group), waited for.
template <int D>
__device__ __forceinline__ void wgmma_scores(float (&s)[kMmaTile / 8][4], const uint32_t (&q_frag)[1][D / 16][4],
                                             const bf16* key_tile) {
    static_assert(core_tile_offset<D>(1, 0) == 16 && core_tile_offset<D>(0, 1) == 128 && core_tile_offset<D>(8, 0) == D * 16,
                  "the descriptor's offsets: rows 16 bytes apart, k chunks 128, row groups D * 16");
    auto keys_k = [&](int kk) {
        return wgmma_descriptor(reinterpret_cast<const char*>(key_tile) + kk * 256, 128, D * 16);
    };
    wgmma_fence();
    wgmma_64x64x16<false>(s, q_frag[0][0], keys_k(0));
#pragma unroll
    for (int kk = 1; kk < D / 16; kk++) wgmma_64x64x16<true>(s, q_frag[0][kk], keys_k(kk));
    wgmma_commit_and_wait(s);
}

template <int D, bool LPT = false, int MIN_BLOCKS = 0, bool PLAIN_TILES = false, bool WGMMA = false, int STAGES = 2>
__global__ void __launch_bounds__(kMmaThreads, MIN_BLOCKS) attention_row_stats_from_lse_kernel(float* row_stats,
        const float* lse, const uint32_t* doc_bits, const bf16* qk, int B, int T, int H, int Hkv) {
    static_assert(D % 32 == 0, "D must be a multiple of 32");
    static_assert(!WGMMA || kMmaThreads == 128, "a block is one warpgroup");
    static_assert(STAGES == 2 || (WGMMA && STAGES > 2), "more stages in the wgmma form only");
    constexpr int LD = D + kMmaTilePad, kTile = kMmaTile * (WGMMA ? D : LD);
    // attention_stats_from_lse_smem_bytes<D, WGMMA, STAGES>()
    extern __shared__ __align__(128) unsigned char keys_shared[];
    bf16 (*k_tiles)[kTile] = reinterpret_cast<bf16 (*)[kTile]>(keys_shared);  // STAGES buffers
    const TileBlock work = tile_block<LPT>(H, B);
    if (!work.valid) return;
    const int q_tile = (LPT ? (T + kMmaTile - 1) / kMmaTile : (int)gridDim.x) - 1 - work.rank;
    const int h = work.head, b = work.b, kv_head = h / (H / Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const size_t qk_stride = (size_t)(H + Hkv) * D;
    const bf16* queries = qk + (size_t)b * T * qk_stride + (size_t)h * D;
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);
    const int q0 = q_tile * kMmaTile, warp_q0 = q0 + warp * 16;
    const int last_k_tile = min(q0 + kMmaTile - 1, T - 1) / kMmaTile;

    // The queries through k_tiles[1] (free until the loop prefetches into it), then key tile 0.
    uint32_t q_frag[1][D / 16][4];
    if constexpr (WGMMA) {
        wgmma_queries_and_first_keys<D, STAGES>(q_frag, k_tiles, queries, keys, qk_stride, q0, last_k_tile, T, warp, lane);
    } else {
        load_tile_async<D, LD>(k_tiles[1], queries, qk_stride, q0, T);
        cp_async_commit();
        load_tile_async<D, LD>(k_tiles[0], keys, qk_stride, 0, T);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) load_a_fragment<LD>(q_frag[0][kc], k_tiles[1], warp * 16, kc * 16, lane);
    }
    __syncthreads();

    const size_t row0 = ((size_t)b * H + h) * T;
    const float c2 = scale * kLog2e;
    int t[2];
    float row_lse[2], row_lse2[2], neg_entropy2[2] = {0.0f, 0.0f}, doc[2] = {0.0f, 0.0f}, sink[2] = {0.0f, 0.0f};
    float max_raw[2] = {kLeanMasked, kLeanMasked};  // the largest unscaled score
    for (int r = 0; r < 2; r++) {
        t[r] = warp_q0 + g + 8 * r;
        row_lse[r] = t[r] < T ? lse[row0 + t[r]] : 0.0f;
        row_lse2[r] = row_lse[r] * kLog2e;  // in base 2
    }
    const int words = document_start_words(T);
    const uint32_t* row_bits = doc_bits ? doc_bits + (size_t)b * words : nullptr;
    for (int k_tile_index = 0; k_tile_index <= last_k_tile; k_tile_index++) {
        const int j0 = k_tile_index * kMmaTile, buffer = k_tile_index % STAGES;
        if constexpr (WGMMA) next_key_tile_staged<D, STAGES>(k_tiles, keys, qk_stride, k_tile_index, last_k_tile, T);
        else next_kv_tiles<D, LD, false>(k_tiles, k_tiles, keys, keys, qk_stride, qk_stride, k_tile_index, last_k_tile, T);
        // Every warp takes every tile (the last one starts at the block's first query): the
        // warpgroup's products need all four.
        if (WGMMA || j0 <= warp_q0 + 15) {
            float s[1][kMmaTile / 8][4] = {};
            if constexpr (WGMMA)
                wgmma_scores<D>(s[0], q_frag, k_tiles[buffer]);
            else
                mma_blocks_times_tile_transposed<D, LD, 1, kMmaTile>(s, q_frag, k_tiles[buffer], lane);
            const bool diagonal = j0 + kMmaTile - 1 >= q0;
            const uint64_t tile_bits = tile_document_starts(row_bits, j0, words);
            // p = 2^(s c2 - lse log2(e)) in the LEAN form of the forward kernel (see kLog2e): one
            // product-add and one ex2 a score, its entropy term one more product-add. The document
            // starts are looked at only in a tile that holds one (DOC; tile_bits is the same for
            // the whole block, and most tiles hold none); with PLAIN_TILES the mask and key 0 only
            // in a tile that may hold them (EDGE: the diagonal tiles and the first).
            auto tile = [&](auto doc_starts, auto edge) {
                constexpr bool DOC = decltype(doc_starts)::value, EDGE = decltype(edge)::value;
#pragma unroll
                for (int nb = 0; nb < kMmaTile / 8; nb++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int j = j0 + nb * 8 + 2 * c + e % 2, r = e / 2;
                        const float raw = EDGE && diagonal && (j > t[r] || j >= T) ? kLeanMasked : s[0][nb][e];
                        const float x = fmaf(raw, c2, -row_lse2[r]);  // (s - lse) log2(e); -1e29 or less where masked
                        const float p = exp2_ftz(x);                   // 0 where masked
                        max_raw[r] = fmaxf(max_raw[r], raw);
                        neg_entropy2[r] = fmaf(p, x, neg_entropy2[r]);
                        if (EDGE && nb == 0 && e % 2 == 0 && j == 0) sink[r] = p;  // key 0: lane c = 0 of the first tile
                        if (DOC && ((tile_bits >> (nb * 8 + 2 * c + e % 2)) & 1)) doc[r] += p;
                    }
                }
            };
            if (PLAIN_TILES && !tile_bits && !diagonal && j0 > 0)
                tile(std::false_type(), std::false_type());
            else if (tile_bits)
                tile(std::true_type(), std::true_type());
            else
                tile(std::false_type(), std::true_type());
        }
        __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    }
    const size_t rows = (size_t)B * H * T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // the four lanes of a quad hold the columns of the same two rows
#pragma unroll
        for (int lanes = 1; lanes <= 2; lanes *= 2) {
            neg_entropy2[r] += __shfl_xor_sync(0xffffffffu, neg_entropy2[r], lanes);
            doc[r] += __shfl_xor_sync(0xffffffffu, doc[r], lanes);
            sink[r] += __shfl_xor_sync(0xffffffffu, sink[r], lanes);
            max_raw[r] = fmaxf(max_raw[r], __shfl_xor_sync(0xffffffffu, max_raw[r], lanes));
        }
        if (c == 0 && t[r] < T) {
            // Kept in their ranges: an lse rounded apart from these scores can leave a row's
            // probabilities summing to 1 +- a few 1e-7, and its entropy a few 1e-8 below 0.
            const size_t row = row0 + t[r];
            const float m = max_raw[r] * scale;  // the forward kernel's maximum: the same product
            row_stats[ATTN_STAT_ENTROPY * rows + row] = fmaxf(-neg_entropy2[r] * kLn2, 0.0f);
            row_stats[ATTN_STAT_SINK * rows + row] = fminf(sink[r], 1.0f);
            row_stats[ATTN_STAT_MAXP * rows + row] = fminf(expf(m - row_lse[r]), 1.0f);
            row_stats[ATTN_STAT_LOGIT_MAX * rows + row] = m;
            row_stats[ATTN_STAT_DOC_START * rows + row] = fminf(doc[r], 1.0f);
        }
    }
}

// Shared memory of the dK/dV kernel, in bytes: the block's MB * 64 keys and values, two buffers
// of query and dout tiles, two buffers of lse and Delta values.
template <int D, int MB>
constexpr int attention_dkdv_mma_smem_bytes() {
    return (2 * MB + 4) * kMmaTile * (D + kMmaTilePad) * (int)sizeof(bf16) + 4 * kMmaTile * (int)sizeof(float);
}

// Backward, keys and values: block (key tile, key/value head g, b), a key tile of MB * 64 keys:
// each warp holds MB blocks of 16 keys. The block's keys and values stay in shared memory; each
// warp keeps its MB x 16 x D sums dK, dV in registers and walks, in order, the query heads of the
// group and, for each, the 64-query tiles from the one holding the key tile's first key to the last
// ("steps"; the next step's tiles are copied in while the current ones are in use). A step's
// queries are taken in chunks of 64 (D = 64, MB = 1), 32 (MB = 2, or D = 128), so that the scores
// of the warp's MB blocks take no more registers than one block of 64 at D = 64:
//   S^T = K Q^T, P^T = e^(S^T / sqrt(D) - lse) (0 where the query is before the key or beyond T),
//   dP^T = V dO^T, dS^T = P^T (dP^T - Delta), dV += P^T dO, dK += dS^T Q.
// MB = 1 is what ./train runs; MB = 2 (each B fragment serves two blocks of keys) is mma_wide.
// LEAN: P^T = 2^(S^T c2 - lse log2(e)), c2 = log2(e) / sqrt(D), one product-add and one ex2 a score
// (see kLog2e). LPT: tile_block's order (rank: the key tile).
template <int D, int MB, int MIN_BLOCKS = 0, bool LEAN = false, bool LPT = false>
__global__ void __launch_bounds__(kMmaThreads, MIN_BLOCKS) attention_backward_dkdv_mma_kernel(bf16* dqk, bf16* dqkv,
        const bf16* dout, const float* lse, const float* delta, const bf16* qk, const bf16* qkv, int B, int T, int H,
        int Hkv) {
    static_assert(D % 32 == 0, "D must be a multiple of 32");
    static_assert(MB == 1 || MB == 2, "a key tile of 64 or 128");
    constexpr int LD = D + kMmaTilePad, kTileElements = kMmaTile * LD;
    // Keys per block; queries per product: the scores of a warp's blocks in no more registers than
    // one 16 x 64 block's at D = 64 (beside dK and dV, which take MB D registers a lane).
    constexpr int kKeyTile = MB * kMmaTile, kChunk = kMmaTile * 64 / (MB * D);
    static_assert(kChunk % 16 == 0 && kMmaTile % kChunk == 0, "chunks of whole 16-query steps that fill the tile");
    extern __shared__ __align__(16) unsigned char dkdv_shared[];  // attention_dkdv_mma_smem_bytes<D, MB>()
    bf16* k_tile = reinterpret_cast<bf16*>(dkdv_shared);            // kKeyTile rows
    bf16* v_tile = k_tile + MB * kTileElements;                      // kKeyTile rows
    bf16* q_tiles = v_tile + MB * kTileElements;                     // 2 buffers
    bf16* dout_tiles = q_tiles + 2 * kTileElements;                  // 2 buffers
    float* lse_tiles = reinterpret_cast<float*>(dout_tiles + 2 * kTileElements);  // 2 buffers of 64
    float* delta_tiles = lse_tiles + 2 * kMmaTile;                                // 2 buffers of 64
    const TileBlock work = tile_block<LPT>(Hkv, B);  // rank: the key tile
    if (!work.valid) return;
    const int kv_head = work.head, b = work.b, group = H / Hkv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D, out_stride = (size_t)H * D;
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;
    const bf16* values = qkv + (size_t)b * T * qkv_stride + (size_t)(H + Hkv + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);
    const int k0 = work.rank * kKeyTile, warp_k0 = k0 + warp * 16 * MB;  // the block's and the warp's first key

    // Step i: query head h_first + i / q_tiles_per_head, query tile first_q_tile + i % q_tiles_per_head.
    const int first_q_tile = work.rank * MB, q_tiles_per_head = (T + kMmaTile - 1) / kMmaTile - first_q_tile;
    const int steps = group * q_tiles_per_head, h_first = kv_head * group;
    auto load_step_async = [&](int step, int buffer) {
        const int h = h_first + step / q_tiles_per_head, t0 = (first_q_tile + step % q_tiles_per_head) * kMmaTile;
        load_tile_async<D, LD>(q_tiles + buffer * kTileElements, qk + (size_t)b * T * qk_stride + (size_t)h * D, qk_stride, t0, T);
        load_tile_async<D, LD>(dout_tiles + buffer * kTileElements, dout + (size_t)b * T * out_stride + (size_t)h * D,
                               out_stride, t0, T);
        load_row_values_async(lse_tiles + buffer * kMmaTile, lse + ((size_t)b * H + h) * T, t0, T);
        load_row_values_async(delta_tiles + buffer * kMmaTile, delta + ((size_t)b * H + h) * T, t0, T);
    };
#pragma unroll
    for (int i = 0; i < MB; i++) {
        load_tile_async<D, LD>(k_tile + i * kTileElements, keys, qk_stride, k0 + i * kMmaTile, T);
        load_tile_async<D, LD>(v_tile + i * kTileElements, values, qkv_stride, k0 + i * kMmaTile, T);
    }
    load_step_async(0, 0);
    cp_async_commit();

    int j_row[MB][2];  // the keys of this lane's two rows in each block
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        j_row[mb][0] = warp_k0 + 16 * mb + g;
        j_row[mb][1] = warp_k0 + 16 * mb + g + 8;
    }
    float dk[MB][D / 8][4] = {}, dv[MB][D / 8][4] = {};
    for (int step = 0; step < steps; step++) {
        const int buffer = step % 2;
        if (step + 1 < steps) {  // prefetch the next step's tiles into the other buffer
            load_step_async(step + 1, 1 - buffer);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int t0 = (first_q_tile + step % q_tiles_per_head) * kMmaTile;
#pragma unroll
        for (int chunk = 0; chunk < kMmaTile / kChunk; chunk++) {
            const int i0 = chunk * kChunk, tc = t0 + i0;  // the chunk's first query: its index in the tile and position
            // A chunk narrower than the tile can end before the warp's first key: then P is 0 there,
            // nothing to add.
            if (kChunk < kMmaTile && tc + kChunk - 1 < warp_k0) continue;
            const bf16* q_chunk = q_tiles + buffer * kTileElements + i0 * LD;
            const bf16* dout_chunk = dout_tiles + buffer * kTileElements + i0 * LD;
            const float* lse_chunk = lse_tiles + buffer * kMmaTile + i0;
            const float* delta_chunk = delta_tiles + buffer * kMmaTile + i0;

            // S^T, dP^T: MB blocks of 16 keys x kChunk queries.
            float st[MB][kChunk / 8][4] = {}, dpt[MB][kChunk / 8][4] = {};
            mma_shared_blocks_times_tile_transposed<D, LD, MB, kChunk>(st, k_tile, warp_k0 - k0, q_chunk, lane);
            mma_shared_blocks_times_tile_transposed<D, LD, MB, kChunk>(dpt, v_tile, warp_k0 - k0, dout_chunk, lane);
            // P^T into st, dS^T (still without the 1/sqrt(D)) into dpt. Only a chunk that starts
            // before the key tile's last key has queries before a key, and only a last, partial
            // tile has queries beyond T.
            const bool boundary = tc < k0 + kKeyTile - 1 || tc + kChunk > T;
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
#pragma unroll
                for (int nb = 0; nb < kChunk / 8; nb++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int i = nb * 8 + 2 * c + e % 2, t = tc + i, r = e / 2;
                        float p = LEAN ? exp2_ftz(fmaf(st[mb][nb][e], scale * kLog2e, -lse_chunk[i] * kLog2e))
                                       : __expf(st[mb][nb][e] * scale - lse_chunk[i]);
                        if (boundary && (t < j_row[mb][r] || t >= T)) p = 0.0f;
                        st[mb][nb][e] = p;
                        dpt[mb][nb][e] = p * (dpt[mb][nb][e] - delta_chunk[i]);
                    }
                }
            }
            mma_block_scores_times_tile<D, LD, MB, kChunk>(dv, st, dout_chunk, lane);
            mma_block_scores_times_tile<D, LD, MB, kChunk>(dk, dpt, q_chunk, lane);
        }
        __syncthreads();  // every warp is done with this buffer before the next step refills it
    }

#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int j = j_row[mb][r];
            if (j < T) {
                bf16* dk_row = dqk + ((size_t)b * T + j) * qk_stride + (size_t)(H + kv_head) * D + 2 * c;
                bf16* dv_row = dqkv + ((size_t)b * T + j) * qkv_stride + (size_t)(H + Hkv + kv_head) * D + 2 * c;
#pragma unroll
                for (int nd = 0; nd < D / 8; nd++) {
                    *reinterpret_cast<__nv_bfloat162*>(dk_row + nd * 8) =
                        __floats2bfloat162_rn(dk[mb][nd][2 * r] * scale, dk[mb][nd][2 * r + 1] * scale);
                    *reinterpret_cast<__nv_bfloat162*>(dv_row + nd * 8) =
                        __floats2bfloat162_rn(dv[mb][nd][2 * r], dv[mb][nd][2 * r + 1]);
                }
            }
        }
    }
}

// Backward, queries: block (query tile, h, b), a query tile of MB * 64 queries, tiles taken last
// first. Each warp keeps its MB blocks of 16 queries and their dout as A fragments and its
// MB x 16 x D sums dQ in registers, and over key tiles 0 .. the last one its tile's queries see,
// in chunks of keys (64 with MB = 1 and D = 64; else 16, which leaves the scores few registers
// beside the fragments, and costs no extra shared-memory reads: only the B operands come from there):
// S = Q K^T, P = e^(S / sqrt(D) - lse) (0 for future keys and keys beyond T), dP = dO V^T,
// dS = P (dP - Delta), dQ += dS K. Key/value tiles are double-buffered as in the forward pass.
// MB = 1 is what ./train runs; MB = 2 (each B fragment serves two blocks of queries) is mma_wide.
// LEAN: P as in the dK/dV kernel's LEAN form. LPT: tile_block's order.
template <int D, int MB, int MIN_BLOCKS = 0, bool LEAN = false, bool LPT = false>
__global__ void __launch_bounds__(kMmaThreads, MIN_BLOCKS) attention_backward_dq_mma_kernel(bf16* dqk,
        const bf16* dout, const float* lse, const float* delta, const bf16* qk, const bf16* qkv, int B, int T, int H,
        int Hkv) {
    static_assert(D % 32 == 0, "D must be a multiple of 32");
    static_assert(MB == 1 || MB == 2, "a query tile stages in one or both of the key/value buffers");
    constexpr int LD = D + kMmaTilePad, kQueryTile = MB * kMmaTile, kChunk = MB == 1 && D == 64 ? kMmaTile : 16;
    static_assert(D == 64 || D == 128, "the chunks' widths are chosen for these");
    extern __shared__ __align__(16) unsigned char kv_shared[];  // attention_kv_buffers_smem_bytes<D>()
    bf16 (*k_tiles)[kMmaTile * LD] = reinterpret_cast<bf16 (*)[kMmaTile * LD]>(kv_shared);  // 2 buffers
    bf16 (*v_tiles)[kMmaTile * LD] = k_tiles + 2;                                            // 2 buffers
    const TileBlock work = tile_block<LPT>(H, B);
    if (!work.valid) return;
    const int q_tiles = LPT ? (T + kQueryTile - 1) / kQueryTile : (int)gridDim.x;
    const int q_tile = q_tiles - 1 - work.rank;
    const int h = work.head, b = work.b, kv_head = h / (H / Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const size_t qk_stride = (size_t)(H + Hkv) * D, qkv_stride = (size_t)(H + 2 * Hkv) * D, out_stride = (size_t)H * D;
    const bf16* queries = qk + (size_t)b * T * qk_stride + (size_t)h * D;
    const bf16* douts = dout + (size_t)b * T * out_stride + (size_t)h * D;
    const bf16* keys = qk + (size_t)b * T * qk_stride + (size_t)(H + kv_head) * D;
    const bf16* values = qkv + (size_t)b * T * qkv_stride + (size_t)(H + Hkv + kv_head) * D;
    const float scale = 1.0f / sqrtf((float)D);
    const int q0 = q_tile * kQueryTile, warp_q0 = q0 + warp * 16 * MB;  // the tile's and the warp's first query
    const int warp_q_last = warp_q0 + 16 * MB - 1;
    const int last_k_tile = min(q0 + kQueryTile - 1, T - 1) / kMmaTile;

    // Copy groups: the queries and output gradients, rows 64 i .. 64 i + 63 of the query tile
    // through buffers 1 - i (free until the loop fills them); key/value tile 0 at once with
    // MB = 1, and with MB = 2 once the fragments have been read out of buffer 0.
#pragma unroll
    for (int i = 0; i < MB; i++) {
        load_tile_async<D, LD>(k_tiles[1 - i], queries, qk_stride, q0 + i * kMmaTile, T);
        load_tile_async<D, LD>(v_tiles[1 - i], douts, out_stride, q0 + i * kMmaTile, T);
    }
    cp_async_commit();
    if (MB == 1) {
        load_tile_async<D, LD>(k_tiles[0], keys, qk_stride, 0, T);
        load_tile_async<D, LD>(v_tiles[0], values, qkv_stride, 0, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
    // The warp's queries and output gradients as A operands: block mb is the tile's rows
    // 16 (MB warp + mb) .. + 15.
    uint32_t q_frag[MB][D / 16][4], dout_frag[MB][D / 16][4];
    int t_row[MB][2];  // the positions of this lane's two rows in each block
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
        const int row = (MB * warp + mb) * 16, buffer = 1 - row / kMmaTile;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            load_a_fragment<LD>(q_frag[mb][kc], k_tiles[buffer], row % kMmaTile, kc * 16, lane);
            load_a_fragment<LD>(dout_frag[mb][kc], v_tiles[buffer], row % kMmaTile, kc * 16, lane);
        }
        t_row[mb][0] = q0 + row + g;
        t_row[mb][1] = q0 + row + g + 8;
    }
    __syncthreads();
    if (MB > 1) {
        load_tile_async<D, LD>(k_tiles[0], keys, qk_stride, 0, T);
        load_tile_async<D, LD>(v_tiles[0], values, qkv_stride, 0, T);
        cp_async_commit();
    }

    float row_lse[MB][2], row_delta[MB][2];
#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            size_t row = ((size_t)b * H + h) * T + t_row[mb][r];
            row_lse[mb][r] = t_row[mb][r] < T ? lse[row] : 0.0f;
            row_delta[mb][r] = t_row[mb][r] < T ? delta[row] : 0.0f;
        }
    }
    float dq[MB][D / 8][4] = {};
    for (int k_tile_index = 0; k_tile_index <= last_k_tile; k_tile_index++) {
        const int j0 = k_tile_index * kMmaTile, buffer = k_tile_index % 2;
        next_kv_tiles<D, LD>(k_tiles, v_tiles, keys, values, qk_stride, qkv_stride, k_tile_index, last_k_tile, T);
#pragma unroll
        for (int chunk = 0; chunk < kMmaTile / kChunk; chunk++) {
            const int jc = j0 + chunk * kChunk;  // the chunk's first key
            // A chunk narrower than the tile can start after the warp's last query: then P is 0 there,
            // nothing to add.
            if (kChunk < kMmaTile && jc > warp_q_last) continue;
            const bf16* k_chunk = k_tiles[buffer] + chunk * kChunk * LD;
            const bf16* v_chunk = v_tiles[buffer] + chunk * kChunk * LD;

            float s[MB][kChunk / 8][4] = {}, dp[MB][kChunk / 8][4] = {};  // S, dP: MB blocks of 16 queries x kChunk keys
            mma_blocks_times_tile_transposed<D, LD, MB, kChunk>(s, q_frag, k_chunk, lane);
            mma_blocks_times_tile_transposed<D, LD, MB, kChunk>(dp, dout_frag, v_chunk, lane);
            // dS (still without the 1/sqrt(D)) in place of the scores. As in the forward pass, only
            // a chunk that reaches the query tile's first query has future keys or keys beyond T.
            const bool diagonal = jc + kChunk - 1 >= q0;
#pragma unroll
            for (int mb = 0; mb < MB; mb++) {
#pragma unroll
                for (int nb = 0; nb < kChunk / 8; nb++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int j = jc + nb * 8 + 2 * c + e % 2, r = e / 2;
                        float p = LEAN ? exp2_ftz(fmaf(s[mb][nb][e], scale * kLog2e, -row_lse[mb][r] * kLog2e))
                                       : __expf(s[mb][nb][e] * scale - row_lse[mb][r]);
                        if (diagonal && (j > t_row[mb][r] || j >= T)) p = 0.0f;
                        s[mb][nb][e] = p * (dp[mb][nb][e] - row_delta[mb][r]);
                    }
                }
            }
            mma_block_scores_times_tile<D, LD, MB, kChunk>(dq, s, k_chunk, lane);
        }
        __syncthreads();  // every warp is done with this buffer before the next iteration refills it
    }

#pragma unroll
    for (int mb = 0; mb < MB; mb++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t_row[mb][r];
            if (t < T) {
                bf16* dq_row = dqk + ((size_t)b * T + t) * qk_stride + (size_t)h * D + 2 * c;
#pragma unroll
                for (int nd = 0; nd < D / 8; nd++)
                    *reinterpret_cast<__nv_bfloat162*>(dq_row + nd * 8) =
                        __floats2bfloat162_rn(dq[mb][nd][2 * r] * scale, dq[mb][nd][2 * r + 1] * scale);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host API. Shapes or pointers the kernels cannot take are fatal errors (utils.h's fail(): one
// "error: ..." line, exit status 1); so is any CUDA error (cuda_common.cuh).

enum AttentionImpl {
    ATTENTION_AUTO,      // the fastest that applies (attention_auto)
    ATTENTION_SIMPLE,    // any even D up to 256
    ATTENTION_MMA,       // D = 64 or 128
    ATTENTION_MMA_WIDE,  // D = 64: mma with tiles of 128 (MB = 2: the forward's and dQ's queries, dK/dV's keys)
    ATTENTION_MMA_LEAN,  // D = 64 or 128: mma with fewer instructions a score (LEAN)
    ATTENTION_MMA_LPT,   // D = 64 or 128: mma, the blocks in tile_block's order (LPT)
    ATTENTION_MMA_LEAN_LPT,  // both
};

inline bool attention_is_mma(AttentionImpl impl) { return impl != ATTENTION_SIMPLE && impl != ATTENTION_AUTO; }
inline bool attention_takes_head_dim(AttentionImpl impl, int D) {
    return impl == ATTENTION_MMA_WIDE ? D == 64 : attention_is_mma(impl) ? D == 64 || D == 128 : true;
}
inline const char* attention_impl_name(AttentionImpl impl) {
    return impl == ATTENTION_MMA        ? "mma"
           : impl == ATTENTION_MMA_WIDE ? "mma_wide"
           : impl == ATTENTION_MMA_LEAN ? "mma_lean"
           : impl == ATTENTION_MMA_LPT  ? "mma_lpt"
           : impl == ATTENTION_MMA_LEAN_LPT ? "mma_lean_lpt"
           : impl == ATTENTION_SIMPLE   ? "simple"
                                        : "auto";
}

// Whether this program holds impl's kernels. Each mma variant is its own set of kernels, so a
// program compiles only those it can run: ./train's (mma_lean_lpt, mma_lean, which it falls back
// to, and mma, which attention_auto names), or, with LLMC_ATTENTION_VARIANTS defined (dev_attention),
// every one. All of them would make ./train's build half again as long (72 s against 46 s on 2
// cores, for sm_80 and sm_90, when it held mma alone).
constexpr bool attention_built(AttentionImpl impl) {
#ifdef LLMC_ATTENTION_VARIANTS
    return true;
#else
    return impl == ATTENTION_AUTO || impl == ATTENTION_SIMPLE || impl == ATTENTION_MMA || impl == ATTENTION_MMA_LEAN ||
           impl == ATTENTION_MMA_LEAN_LPT;
#endif
}

// f(mb, lean, lpt) with MB, LEAN and LPT as std::integral_constant values, where this program
// holds the variant I.
template <AttentionImpl I, int MB, bool LEAN, bool LPT, typename F>
inline void attention_call_variant(F&& f) {
    if constexpr (attention_built(I))
        f(std::integral_constant<int, MB>(), std::bool_constant<LEAN>(), std::bool_constant<LPT>());
    else
        fail("internal: the %s attention kernels are not built into this program", attention_impl_name(I));
}

// Calls f(mb, lean, lpt) with the mma kernels' template arguments MB, LEAN and LPT of impl (above);
// false, with nothing called, where impl is not an mma one.
template <typename F>
inline bool attention_mma_variant(AttentionImpl impl, F&& f) {
    switch (impl) {
        case ATTENTION_MMA: attention_call_variant<ATTENTION_MMA, 1, false, false>(f); return true;
        case ATTENTION_MMA_WIDE: attention_call_variant<ATTENTION_MMA_WIDE, 2, false, false>(f); return true;
        case ATTENTION_MMA_LEAN: attention_call_variant<ATTENTION_MMA_LEAN, 1, true, false>(f); return true;
        case ATTENTION_MMA_LPT: attention_call_variant<ATTENTION_MMA_LPT, 1, false, true>(f); return true;
        case ATTENTION_MMA_LEAN_LPT: attention_call_variant<ATTENTION_MMA_LEAN_LPT, 1, true, true>(f); return true;
        default: return false;
    }
}

// The shared memory a block of the mma kernels of impl at head width D takes: the dK/dV kernel's,
// the largest.
inline int attention_mma_smem_bytes(AttentionImpl impl, int D) {
    return impl == ATTENTION_MMA_WIDE ? attention_dkdv_mma_smem_bytes<64, 2>()
           : D == 64                  ? attention_dkdv_mma_smem_bytes<64, 1>()
                                      : attention_dkdv_mma_smem_bytes<128, 1>();
}

// The most shared memory a block may take on the current device (what a kernel can opt in to):
// 227 KiB on an H100, 163 KiB on an A100, 99 KiB on the sm_86/89 cards, where the D = 128 dK/dV
// kernel's 103 KiB does not fit. Asked of the driver once per device: every attention call asks.
inline int device_shared_memory_per_block() {
    static int known_device = -1, known_bytes = 0;
    int device = 0;
    cudaCheck(cudaGetDevice(&device));
    if (device != known_device) {
        cudaCheck(cudaDeviceGetAttribute(&known_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        known_device = device;
    }
    return known_bytes;
}

// Whether impl can run at head width D on the current device.
inline bool attention_supports(AttentionImpl impl, int D) {
    if (!attention_built(impl) || !attention_takes_head_dim(impl, D)) return false;
    return !attention_is_mma(impl) || attention_mma_smem_bytes(impl, D) <= device_shared_memory_per_block();
}

// What ATTENTION_AUTO runs: mma where it takes D and the device has the shared memory for it (D = 64
// everywhere; D = 128 where a block may have 103 KiB, as on sm_80 and sm_90), simple otherwise. On an
// H100, Qwen3-0.6B's layer (4 x 2048, 16:8 heads, D = 128): mma 146-162 TFLOP/s, simple 4-5.5.
inline AttentionImpl attention_auto(int D) {
    return attention_supports(ATTENTION_MMA, D) ? ATTENTION_MMA : ATTENTION_SIMPLE;
}

inline bool attention_aligned(const void* p, size_t bytes) { return p && (uintptr_t)p % bytes == 0; }

// Checks the shape and the tensors, and turns ATTENTION_AUTO into the implementation that runs.
// bf16 tensors must be 16-byte aligned for mma (whole-row 16-byte copies), 4-byte for simple
// (bf16 pairs); float arrays must be non-null.
inline AttentionImpl attention_prepare(AttentionImpl impl, int B, int T, int H, int Hkv, int D,
                                       std::initializer_list<const bf16*> bf16_tensors,
                                       std::initializer_list<const float*> float_tensors) {
    if (B < 1 || T < 1 || H < 1 || Hkv < 1 || H % Hkv != 0)
        fail("attention: bad shape B=%d T=%d H=%d Hkv=%d (all at least 1, H a multiple of Hkv)", B, T, H, Hkv);
    if (D < 2 || D > 256 || D % 2 != 0) fail("attention: head_dim %d not supported (even, 2 to 256)", D);
    if ((long long)B * H * T > (1LL << 26)) fail("attention: B*H*T = %lld rows is more than 2^26", (long long)B * H * T);
    if (B > 65535 || H > 65535) fail("attention: B=%d or H=%d above 65535 (grid limit)", B, H);
    if (impl == ATTENTION_AUTO) impl = attention_auto(D);
    const char* name = attention_impl_name(impl);
    if (!attention_built(impl)) fail("attention: the %s kernels are not built into this program", name);
    if (!attention_takes_head_dim(impl, D))
        fail("attention: the %s kernels take head_dim %s, not %d", name, impl == ATTENTION_MMA_WIDE ? "64" : "64 or 128", D);
    if (!attention_supports(impl, D))
        fail("attention: the %s kernels at head_dim %d need %d bytes of shared memory a block; this GPU allows %d", name,
             D, attention_mma_smem_bytes(impl, D), device_shared_memory_per_block());
    size_t alignment = attention_is_mma(impl) ? 16 : 4;
    for (const bf16* p : bf16_tensors)
        if (!attention_aligned(p, alignment)) fail("attention: a bf16 tensor is null or not %zu-byte aligned", alignment);
    for (const float* p : float_tensors)
        if (!attention_aligned(p, sizeof(float))) fail("attention: a float tensor is null or misaligned");
    // A grid too tall for the LPT order runs the same kernels in ./train's order: the same bits.
    const int tiles = ceil_div(T, kMmaTile);
    const bool lpt_fits = lpt_grid_fits(tiles, H, B) && lpt_grid_fits(tiles, Hkv, B);
    if (impl == ATTENTION_MMA_LPT && !lpt_fits) impl = ATTENTION_MMA;
    if (impl == ATTENTION_MMA_LEAN_LPT && !lpt_fits) impl = ATTENTION_MMA_LEAN;
    return impl;
}

// Rows (warps) to blocks of 128 threads for the simple kernels.
inline int attention_simple_blocks(long long rows) { return ceil_div(rows * 32, 128); }

template <int PAIRS>
inline void attention_forward_simple(bf16* out, float* lse, float* row_stats, const uint32_t* doc_bits, const bf16* qk,
                                     const bf16* qkv, int B, int T, int H, int Hkv, int D, cudaStream_t stream) {
    int blocks = attention_simple_blocks((long long)B * H * T);
    if (row_stats)
        attention_forward_simple_kernel<PAIRS, true><<<blocks, 128, 0, stream>>>(out, lse, row_stats, doc_bits, qk, qkv, B,
                                                                                 T, H, Hkv, D);
    else
        attention_forward_simple_kernel<PAIRS, false><<<blocks, 128, 0, stream>>>(out, lse, row_stats, doc_bits, qk, qkv, B,
                                                                                  T, H, Hkv, D);
    cuda_check_launch();
}

template <int PAIRS>
inline void attention_backward_simple(bf16* dqk, bf16* dqkv, const float* delta, const bf16* dout, const float* lse,
                                      const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv, int D,
                                      cudaStream_t stream) {
    attention_backward_dkdv_simple_kernel<PAIRS><<<attention_simple_blocks((long long)B * Hkv * T), 128, 0, stream>>>(
        dqk, dqkv, dout, lse, delta, qk, qkv, B, T, H, Hkv, D);
    cuda_check_launch();
    attention_backward_dq_simple_kernel<PAIRS><<<attention_simple_blocks((long long)B * H * T), 128, 0, stream>>>(
        dqk, dout, lse, delta, qk, qkv, B, T, H, Hkv, D);
    cuda_check_launch();
}

// Lets `kernel` take `bytes` of dynamic shared memory where that is above the 48 KiB default: once
// per kernel and device (a kernel's sizes are constants), not at every launch.
template <typename Kernel>
inline void allow_shared_memory(Kernel kernel, int bytes) {
    if (bytes <= 48 * 1024) return;
    static std::vector<std::pair<const void*, int>> allowed;  // (kernel, device)
    int device = 0;
    cudaCheck(cudaGetDevice(&device));
    const std::pair<const void*, int> key((const void*)kernel, device);
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) return;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    allowed.push_back(key);
}

// The mma kernels' MIN_BLOCKS, __launch_bounds__'s second argument: the blocks an SM must be able
// to hold at once, which caps each thread's registers. ./train's is 0, none given: ptxas then
// allocates on its own (dK/dV 177 registers, dQ 174, the forward 135 at D = 64 on sm_90), and a 1
// lets it take up to 255. dev_attention measures what other values do. STATS_ONLY: the kernel's
// form without the output (row_stats required). LEAN: ATTENTION_MMA_LEAN's kernels. LPT: the
// blocks in tile_block's order (ATTENTION_MMA_LPT).
template <int D, int MB, int MIN_BLOCKS = 0, bool STATS_ONLY = false, bool LEAN = false, bool LPT = false>
inline void attention_forward_mma(bf16* out, float* lse, float* row_stats, const uint32_t* doc_bits, const bf16* qk,
                                  const bf16* qkv, int B, int T, int H, int Hkv, cudaStream_t stream) {
    constexpr int smem = attention_kv_buffers_smem_bytes<D>();
    const dim3 grid = tile_grid(LPT, ceil_div(T, MB * kMmaTile), H, B);
    if constexpr (STATS_ONLY) {
        if (!row_stats) fail("internal: the attention's statistics alone, without row_stats");
        allow_shared_memory(attention_forward_mma_kernel<D, MB, true, MIN_BLOCKS, true, LEAN, LPT>, smem);
        attention_forward_mma_kernel<D, MB, true, MIN_BLOCKS, true, LEAN, LPT>
            <<<grid, kMmaThreads, smem, stream>>>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv);
    } else if (row_stats) {
        allow_shared_memory(attention_forward_mma_kernel<D, MB, true, MIN_BLOCKS, false, LEAN, LPT>, smem);
        attention_forward_mma_kernel<D, MB, true, MIN_BLOCKS, false, LEAN, LPT>
            <<<grid, kMmaThreads, smem, stream>>>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv);
    } else {
        allow_shared_memory(attention_forward_mma_kernel<D, MB, false, MIN_BLOCKS, false, LEAN, LPT>, smem);
        attention_forward_mma_kernel<D, MB, false, MIN_BLOCKS, false, LEAN, LPT>
            <<<grid, kMmaThreads, smem, stream>>>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv);
    }
    cuda_check_launch();
}

template <int D, int MB, int MIN_BLOCKS = 0, bool LEAN = false, bool LPT = false>
inline void attention_backward_dkdv_mma(bf16* dqk, bf16* dqkv, const float* delta, const bf16* dout, const float* lse,
                                        const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv,
                                        cudaStream_t stream) {
    constexpr int smem = attention_dkdv_mma_smem_bytes<D, MB>();
    auto kernel = attention_backward_dkdv_mma_kernel<D, MB, MIN_BLOCKS, LEAN, LPT>;
    allow_shared_memory(kernel, smem);
    kernel<<<tile_grid(LPT, ceil_div(T, MB * kMmaTile), Hkv, B), kMmaThreads, smem, stream>>>(dqk, dqkv, dout, lse, delta,
                                                                                               qk, qkv, B, T, H, Hkv);
    cuda_check_launch();
}

template <int D, int MB, int MIN_BLOCKS = 0, bool LEAN = false, bool LPT = false>
inline void attention_backward_dq_mma(bf16* dqk, const float* delta, const bf16* dout, const float* lse, const bf16* qk,
                                      const bf16* qkv, int B, int T, int H, int Hkv, cudaStream_t stream) {
    constexpr int smem = attention_kv_buffers_smem_bytes<D>();
    auto kernel = attention_backward_dq_mma_kernel<D, MB, MIN_BLOCKS, LEAN, LPT>;
    allow_shared_memory(kernel, smem);
    kernel<<<tile_grid(LPT, ceil_div(T, MB * kMmaTile), H, B), kMmaThreads, smem, stream>>>(dqk, dout, lse, delta, qk, qkv,
                                                                                             B, T, H, Hkv);
    cuda_check_launch();
}

// The tensor-core backward, from Delta (computed first): key tiles of MB * 64 for dK and dV, query
// tiles of MB * 64 for dQ.
template <int D, int MB, bool LEAN = false, bool LPT = false>
inline void attention_backward_mma(bf16* dqk, bf16* dqkv, const float* delta, const bf16* dout, const float* lse,
                                   const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv, cudaStream_t stream) {
    attention_backward_dkdv_mma<D, MB, 0, LEAN, LPT>(dqk, dqkv, delta, dout, lse, qk, qkv, B, T, H, Hkv, stream);
    attention_backward_dq_mma<D, MB, 0, LEAN, LPT>(dqk, delta, dout, lse, qk, qkv, B, T, H, Hkv, stream);
}

// out, lse (and row_stats when non-null, else no statistics are computed) from qk and qkv; the
// statistics' document starts from doc_bits (null: none).
inline void attention_forward(bf16* out, float* lse, float* row_stats, const uint32_t* doc_bits, const bf16* qk,
                              const bf16* qkv, int B, int T, int H, int Hkv, int D, cudaStream_t stream,
                              AttentionImpl impl = ATTENTION_AUTO) {
    impl = attention_prepare(impl, B, T, H, Hkv, D, {out, qk, qkv}, {lse});
    const bool mma = attention_mma_variant(impl, [&](auto mb, auto lean, auto lpt) {
        if (D == 64)
            return attention_forward_mma<64, mb, 0, false, lean, lpt>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv,
                                                                     stream);
        if constexpr (mb == 1)  // MB = 2 takes D = 64 only
            if (D == 128)
                return attention_forward_mma<128, 1, 0, false, lean, lpt>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H,
                                                                         Hkv, stream);
        fail("internal: attention implementation %d at head_dim %d", (int)impl, D);
    });
    if (mma) return;
    if (impl != ATTENTION_SIMPLE) {
        fail("internal: attention implementation %d at head_dim %d", (int)impl, D);
    } else if (D <= 64) {
        attention_forward_simple<1>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, D, stream);
    } else if (D <= 128) {
        attention_forward_simple<2>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, D, stream);
    } else {
        attention_forward_simple<4>(out, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, D, stream);
    }
}

// The rows' statistics (row_stats, non-null) and lse alone, the bits attention_forward gives them, for
// a step whose output comes from elsewhere (cuDNN's kernels): where the mma kernels run, their form
// without the P V product; elsewhere attention_forward itself, its output into out_scratch. ./train
// takes attention_row_stats_from_lse where the mma kernels run (on an H200 at d22, 8 x 2048: 0.110
// ms a layer in LPT order against 0.179 here), so that only a width without them comes here.
inline void attention_row_stats(float* lse, float* row_stats, bf16* out_scratch, const uint32_t* doc_bits,
                                const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv, int D,
                                cudaStream_t stream) {
    AttentionImpl impl = attention_prepare(ATTENTION_AUTO, B, T, H, Hkv, D, {out_scratch, qk, qkv}, {lse, row_stats});
    if (impl == ATTENTION_MMA && D == 64)
        attention_forward_mma<64, 1, 0, true>(nullptr, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, stream);
    else if (impl == ATTENTION_MMA && D == 128)
        attention_forward_mma<128, 1, 0, true>(nullptr, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, stream);
    else
        attention_forward(out_scratch, lse, row_stats, doc_bits, qk, qkv, B, T, H, Hkv, D, stream, impl);
}

// Whether attention_row_stats_from_lse takes head width D (the mma kernels do): where it does, the
// rows' statistics read nothing the backward pass writes (attention_row_stats' scratch is).
inline bool attention_row_stats_from_lse_supports(int D) { return attention_auto(D) == ATTENTION_MMA; }

// The rows' statistics (row_stats) from the lse of a forward pass made elsewhere, through
// attention_row_stats_from_lse_kernel where the mma kernels take D (true), else nothing (false);
// lpt: its blocks in tile_block's LPT order where its grid takes the shape; plain_tiles: its
// PLAIN_TILES form (both the same bits); wgmma: its WGMMA form with kStatsWgmmaStages buffers, where
// attention_wgmma_compiled().
constexpr int kStatsWgmmaStages = 4;
inline bool attention_row_stats_from_lse(float* row_stats, const float* lse, const uint32_t* doc_bits, const bf16* qk,
                                         int B, int T, int H, int Hkv, int D, cudaStream_t stream, bool lpt = false,
                                         bool plain_tiles = false, bool wgmma = false) {
    if (!attention_row_stats_from_lse_supports(D)) return false;
    attention_prepare(ATTENTION_MMA, B, T, H, Hkv, D, {qk}, {lse, row_stats});
    if (wgmma && !attention_wgmma_compiled()) fail("internal: the wgmma statistics need a build for sm_90a");
    lpt = lpt && lpt_grid_fits(ceil_div(T, kMmaTile), H, B);
    const dim3 grid = tile_grid(lpt, ceil_div(T, kMmaTile), H, B);
    auto launch = [&](auto kernel, int smem) {
        allow_shared_memory(kernel, smem);  // the wgmma form's 4 buffers at D = 128: 64 KiB
        kernel<<<grid, kMmaThreads, smem, stream>>>(row_stats, lse, doc_bits, qk, B, T, H, Hkv);
    };
    auto launch_d = [&](auto width, auto use_wgmma) {
        constexpr int W = decltype(width)::value;
        constexpr bool G = decltype(use_wgmma)::value;
        constexpr int S = G ? kStatsWgmmaStages : 2, smem = attention_stats_from_lse_smem_bytes<W, G, S>();
        if (plain_tiles)
            lpt ? launch(attention_row_stats_from_lse_kernel<W, true, 0, true, G, S>, smem)
                : launch(attention_row_stats_from_lse_kernel<W, false, 0, true, G, S>, smem);
        else
            lpt ? launch(attention_row_stats_from_lse_kernel<W, true, 0, false, G, S>, smem)
                : launch(attention_row_stats_from_lse_kernel<W, false, 0, false, G, S>, smem);
    };
    auto launch_both = [&](auto width) {
        wgmma ? launch_d(width, std::true_type()) : launch_d(width, std::false_type());
    };
    if (D == 64)
        launch_both(std::integral_constant<int, 64>());
    else
        launch_both(std::integral_constant<int, 128>());
    cuda_check_launch();
    return true;
}

// dqk (all of it) and the value heads of dqkv from dout and the forward pass's inputs, out and lse.
// delta_scratch: B * H * T floats of workspace.
inline void attention_backward(bf16* dqk, bf16* dqkv, float* delta_scratch, const bf16* dout, const bf16* out,
                               const float* lse, const bf16* qk, const bf16* qkv, int B, int T, int H, int Hkv, int D,
                               cudaStream_t stream, AttentionImpl impl = ATTENTION_AUTO) {
    impl = attention_prepare(impl, B, T, H, Hkv, D, {dqk, dqkv, dout, out, qk, qkv}, {delta_scratch, lse});
    attention_delta_kernel<<<attention_simple_blocks((long long)B * H * T), 128, 0, stream>>>(delta_scratch, dout, out,
                                                                                             B, T, H, D);
    cuda_check_launch();
    const bool mma = attention_mma_variant(impl, [&](auto mb, auto lean, auto lpt) {
        if (D == 64)
            return attention_backward_mma<64, mb, lean, lpt>(dqk, dqkv, delta_scratch, dout, lse, qk, qkv, B, T, H, Hkv,
                                                             stream);
        if constexpr (mb == 1)  // MB = 2 takes D = 64 only
            if (D == 128)
                return attention_backward_mma<128, 1, lean, lpt>(dqk, dqkv, delta_scratch, dout, lse, qk, qkv, B, T, H,
                                                                 Hkv, stream);
        fail("internal: attention implementation %d at head_dim %d", (int)impl, D);
    });
    if (mma) return;
    if (impl != ATTENTION_SIMPLE) {
        fail("internal: attention implementation %d at head_dim %d", (int)impl, D);
    } else if (D <= 64) {
        attention_backward_simple<1>(dqk, dqkv, delta_scratch, dout, lse, qk, qkv, B, T, H, Hkv, D, stream);
    } else if (D <= 128) {
        attention_backward_simple<2>(dqk, dqkv, delta_scratch, dout, lse, qk, qkv, B, T, H, Hkv, D, stream);
    } else {
        attention_backward_simple<4>(dqk, dqkv, delta_scratch, dout, lse, qk, qkv, B, T, H, Hkv, D, stream);
    }
}
