// Checks the causal attention kernels of llmc/attention.cuh against the CPU backend (model_cpu.h)
// and times them. Needs a CUDA GPU (sm_80 or newer).
//
// For several shapes (GQA and not, T = 1, partial tiles, T = 2048, head widths the simple kernels
// alone cover) it feeds every implementation (simple, mma, mma_wide: the mma kernels with tiles of
// 128 rows, forward and backward, measured no faster; mma_lean: the candidate with fewer
// instructions a score) and the CPU the same bf16-rounded random inputs and
// compares, per tensor, with |gpu - cpu| <= atol + rtol |cpu| per element (test/testing.h prints the
// worst element of each) and the relative RMS error of the whole tensor:
//   forward:  out, lse and the row statistics (the mass on document starts of random ones among them);
//   backward: dq, dk, dv (the CPU backward gets the out and lse the GPU backward reads, so that
//             the check sees the backward kernels alone), the untouched query/key part of dqkv,
//             and the same bits on a second run;
//   mma_wide against mma: the same bits, forward and backward; mma_lean near mma.
// Times the forward (with and without statistics) and the backward at T = 2048 (the d22 layer
// first, before the checks), and the mma kernels with their registers capped for more blocks an SM
// (min_blocks_experiment).
// Prints PASS/FAIL lines; exit status 1 if any check fails.
//
// Build (from the repository root), all on one line:
//   nvcc -std=c++17 -O3 -I. -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a
//        -Xcompiler -fopenmp dev/cuda/attention.cu -o build/dev_attention -lopenblas -lgomp
// (sm_90a, not sm_90: the candidate stats_rows_wgmma's Hopper instructions, checked only where built;
// make's own build: make CUDA_ARCHS="80 90a" build/dev_attention, as dev/gpu_bundle.sh does.)
// Run: ./build/dev_attention [--check-only]   (--check-only skips the timings, e.g. under compute-sanitizer)
#define LLMC_ATTENTION_VARIANTS  // every mma variant, not only those ./train runs
#include <cstring>
#include <string>
#include <tuple>
#include <vector>
#include "llmc/model_cpu.h"
#include "llmc/attention.cuh"
#include "llmc/rand.h"
#include "test/testing.h"
#include "dev/cuda/common.h"  // time_ms

struct Shape {
    int B, T, H, Hkv, D;
    float q_gain;  // scales the queries: larger gives sharper attention
};

static std::string shape_name(const Shape& s) {
    char buf[128];
    snprintf(buf, sizeof buf, "B%d T%d H%d:%d D%d%s", s.B, s.T, s.H, s.Hkv, s.D, s.q_gain > 1.0f ? " sharp" : "");
    return buf;
}

// ---------------------------------------------------------------------------------------------
// Host-side helpers

// Random values of either sign, never zero (at least 0.05 in magnitude, also after bf16 rounding).
static std::vector<bf16> random_bf16(size_t n, float gain, Rng& rng) {
    std::vector<bf16> v(n);
    for (size_t i = 0; i < n; i++) {
        float x = rng_normal(rng);
        if (fabsf(x) < 0.05f) x = x < 0 ? -0.05f : 0.05f;
        v[i] = __float2bfloat16(x * gain);
    }
    return v;
}

static std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); i++) f[i] = __bfloat162float(v[i]);
    return f;
}

// Heads head0 .. head0 + count - 1 of each of N tokens whose rows are `stride` elements apart:
// [N, count, D], the layout of a gradient's query, key or value part on its own.
static std::vector<float> gather_heads(const std::vector<float>& src, size_t N, size_t stride, int head0, int count, int D) {
    std::vector<float> out(N * count * D);
    for (size_t n = 0; n < N; n++)
        for (int i = 0; i < count * D; i++) out[n * count * D + i] = src[n * stride + (size_t)head0 * D + i];
    return out;
}

static double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = fmax(m, fabs((double)x));
    return m;
}

// The RMS error of a whole tensor within `fraction` of the reference's RMS, plus `floor`.
static void check_rms_error(const std::string& name, const std::vector<float>& got, const std::vector<float>& want,
                            double fraction, double floor) {
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = (double)got[i] - want[i];
        err2 += d * d;
        ref2 += (double)want[i] * want[i];
    }
    double rms_err = sqrt(err2 / got.size()), rms_ref = sqrt(ref2 / got.size());
    check_within(name + " rms", rms_err, fraction * rms_ref + floor,
                 strprintf("RMS error %.3g of the reference's RMS %.3g", rms_ref > 0 ? rms_err / rms_ref : 0.0, rms_ref));
}

// A bf16 tensor: element-wise |got - want| <= atol + 0.079 |want| with atol = 0.01 max|want| + 1e-4,
// and an RMS error of at most 0.01 RMS(want) + 1e-4 (bf16 rounding alone gives about 0.002), which
// catches small systematic errors (a key too many in a long row) that the element-wise bound lets
// by. The 1e-4 floor, far below the bf16 resolution of the O(1) inputs, covers tensors that are
// zero up to rounding (dq and dk at T = 1, where ds = p (dp - Delta) vanishes).
static void check_bf16_tensor(const std::string& name, const std::vector<float>& got, const std::vector<float>& want) {
    check_close(name, got.data(), want.data(), got.size(), 0.079, 0.01 * max_abs(want) + 1e-4);
    check_rms_error(name, got, want, 0.01, 1e-4);
}

template <typename T>
static T* device_alloc(size_t n) {
    T* p = nullptr;
    cudaCheck(cudaMalloc(&p, n * sizeof(T)));
    return p;
}

template <typename T>
static T* device_copy(const std::vector<T>& v) {
    T* p = device_alloc<T>(v.size());
    cudaCheck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

template <typename T>
static std::vector<T> host_copy(const T* p, size_t n) {
    std::vector<T> v(n);
    cudaCheck(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Fills with all-ones bytes: NaN in bf16 and in float, so an element a kernel forgot to write
// shows up as a non-finite value.
template <typename T>
static void poison(T* p, size_t n) {
    cudaCheck(cudaMemset(p, 0xFF, n * sizeof(T)));
}

// The inputs of one shape on the host (bf16 and the same values as float) and on the device.
struct Problem {
    Shape s;
    size_t N, qk_size, qkv_size, out_size, rows;
    std::vector<bf16> qk, qkv, dout;
    std::vector<uint32_t> doc_bits;  // the document starts of random tokens (telemetry_sums.h)
    bf16 *d_qk, *d_qkv, *d_dout, *d_out, *d_dqk, *d_dqkv;
    float *d_lse, *d_stats, *d_delta;
    uint32_t* d_doc_bits;
};

// Tokens 0..9 at random, 0 the end-of-text token, and one at the end of the first sequence (the
// second's position 0 is no document start): the document starts fall anywhere, tile and word
// boundaries included.
static std::vector<uint32_t> random_document_starts(int B, int T, Rng& rng) {
    std::vector<int> tokens((size_t)B * T);
    for (int& t : tokens) t = (int)(rng_uniform(rng) * 10);
    tokens[T - 1] = 0;
    std::vector<uint32_t> bits((size_t)B * document_start_words(T));
    document_start_bits(bits.data(), tokens.data(), B, T, 0);
    return bits;
}

// A document start at positions first, first + every, ... of each sequence (position 0 is none):
// where the random starts above put one in nearly every 64-key tile, these leave tiles without any,
// as a corpus of long documents does (the Brown corpus' 500 texts run about 2,000 words each).
static std::vector<uint32_t> spaced_document_starts(int B, int T, int first, int every) {
    std::vector<int> tokens((size_t)B * T, 1);
    for (int b = 0; b < B; b++)
        for (int t = first; t < T; t += every) tokens[(size_t)b * T + t - 1] = 0;
    std::vector<uint32_t> bits((size_t)B * document_start_words(T));
    document_start_bits(bits.data(), tokens.data(), B, T, 0);
    return bits;
}

static Problem make_problem(const Shape& s, uint64_t seed) {
    Problem p;
    p.s = s;
    p.N = (size_t)s.B * s.T;
    p.qk_size = p.N * (s.H + s.Hkv) * s.D;
    p.qkv_size = p.N * (s.H + 2 * s.Hkv) * s.D;
    p.out_size = p.N * s.H * s.D;
    p.rows = (size_t)s.B * s.H * s.T;
    Rng rng{seed};
    p.qk = random_bf16(p.qk_size, 1.0f, rng);
    for (size_t n = 0; n < p.N; n++)  // queries only: sharper or flatter attention
        for (int i = 0; i < s.H * s.D; i++) {
            bf16& x = p.qk[n * (s.H + s.Hkv) * s.D + i];
            x = __float2bfloat16(__bfloat162float(x) * s.q_gain);
        }
    p.qkv = random_bf16(p.qkv_size, 1.0f, rng);
    p.dout = random_bf16(p.out_size, 1.0f, rng);
    p.doc_bits = random_document_starts(s.B, s.T, rng);
    p.d_doc_bits = device_copy(p.doc_bits);
    p.d_qk = device_copy(p.qk);
    p.d_qkv = device_copy(p.qkv);
    p.d_dout = device_copy(p.dout);
    p.d_out = device_alloc<bf16>(p.out_size);
    p.d_dqk = device_alloc<bf16>(p.qk_size);
    p.d_dqkv = device_alloc<bf16>(p.qkv_size);
    p.d_lse = device_alloc<float>(p.rows);
    p.d_stats = device_alloc<float>(ATTN_NUM_ROW_STATS * p.rows);
    p.d_delta = device_alloc<float>(p.rows);
    return p;
}

static void free_problem(Problem& p) {
    for (void* ptr : {(void*)p.d_qk, (void*)p.d_qkv, (void*)p.d_dout, (void*)p.d_out, (void*)p.d_dqk, (void*)p.d_dqkv,
                      (void*)p.d_lse, (void*)p.d_stats, (void*)p.d_delta, (void*)p.d_doc_bits})
        cudaCheck(cudaFree(ptr));
}

static ModelConfig attention_config(const Shape& s) {
    ModelConfig c;
    c.n_head = s.H;
    c.n_kv_head = s.Hkv;
    c.head_dim = s.D;
    c.d_model = s.H * s.D;
    return c;
}

// ---------------------------------------------------------------------------------------------
// Validation of one shape: both implementations against the CPU.

struct CpuForward {
    std::vector<float> out, lse, row_stats;  // row_stats: ATTN_NUM_ROW_STATS arrays of p.rows
};

// model_cpu.h's attention_forward (the float overload) on the same bf16-rounded inputs.
static CpuForward cpu_forward_reference(const Problem& p) {
    const Shape& s = p.s;
    CpuForward r;
    r.out.assign(p.out_size, 0.0f);
    r.lse.assign(p.rows, 0.0f);
    r.row_stats.assign(ATTN_NUM_ROW_STATS * p.rows, 0.0f);
    std::vector<float> qk = to_float(p.qk), qkv = to_float(p.qkv);
    attention_forward(r.out.data(), r.lse.data(), r.row_stats.data(), p.doc_bits.data(), qk.data(), qkv.data(), s.B, s.T,
                      attention_config(s));
    return r;
}

static void validate(const Problem& p, const CpuForward& ref, AttentionImpl impl) {
    const Shape& s = p.s;
    const std::string prefix = std::string(attention_impl_name(impl)) + " " + shape_name(s) + " ";

    // Forward with statistics, against the CPU.
    poison(p.d_out, p.out_size);
    poison(p.d_lse, p.rows);
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0, impl);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<bf16> out = host_copy(p.d_out, p.out_size);
    std::vector<float> lse = host_copy(p.d_lse, p.rows);
    std::vector<float> stats = host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    check_bf16_tensor(prefix + "out", to_float(out), ref.out);
    // lse and the statistics are float32 from the same bf16 inputs: only summation order differs.
    // lse = m + ln l, l a sum of up to T = 2048 terms e^(s - m): its float32 error is at most
    // T u32 = 1.2e-4 of l (sqrt(T) u32 = 3e-6 typically), an absolute error of as much in lse.
    check_close(prefix + "lse", lse.data(), ref.lse.data(), p.rows, 1e-4, 1e-4);
    // The entropy ln l - a / l, a summing e (s - m) (s - m): the same relative error times the
    // scores' spread |s - m| (a few units, some tens for the sharp shape): 1e-3 relative, 1e-4
    // absolute for rows whose entropy is near 0.
    // The probabilities p_t0 and max p, e^(s - lse): relative errors of |ds| + |dlse|, ~1e-4;
    // 1e-3 relative, and 1e-6 absolute for probabilities that underflow; the same for the mass on
    // document starts, a sum of such probabilities (a start missed, or one too many, costs a whole
    // probability, ~1/(t+1) for the flat rows, far above 1e-3 of the mass). The largest score: one
    // float32 dot product of D <= 192 bf16 terms (exact products): ~D u32 |s|, within 1e-4.
    auto ref_stat = [&](AttentionRowStat k) { return ref.row_stats.data() + k * p.rows; };
    check_close(prefix + "entropy", stats.data() + ATTN_STAT_ENTROPY * p.rows, ref_stat(ATTN_STAT_ENTROPY), p.rows, 1e-3, 1e-4);
    check_close(prefix + "p_t0", stats.data() + ATTN_STAT_SINK * p.rows, ref_stat(ATTN_STAT_SINK), p.rows, 1e-3, 1e-6);
    check_close(prefix + "max p", stats.data() + ATTN_STAT_MAXP * p.rows, ref_stat(ATTN_STAT_MAXP), p.rows, 1e-3, 1e-6);
    check_close(prefix + "mass on document starts", stats.data() + ATTN_STAT_DOC_START * p.rows,
                ref_stat(ATTN_STAT_DOC_START), p.rows, 1e-3, 1e-6);
    check_close(prefix + "max logit", stats.data() + ATTN_STAT_LOGIT_MAX * p.rows, ref_stat(ATTN_STAT_LOGIT_MAX), p.rows,
                1e-4, 1e-4);

    // Without statistics: the same out and lse, bit for bit.
    poison(p.d_out, p.out_size);
    poison(p.d_lse, p.rows);
    attention_forward(p.d_out, p.d_lse, nullptr, nullptr, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0, impl);
    cudaCheck(cudaDeviceSynchronize());
    bool same = same_bits(out, host_copy(p.d_out, p.out_size)) && same_bits(lse, host_copy(p.d_lse, p.rows));
    report(same, prefix + "forward without statistics gives the same bits", same ? "" : "out or lse differ");

    // Backward, twice. dqkv starts as NaN: its query/key part must stay so, its value part be written.
    std::vector<bf16> dqk[2], dqkv[2];
    for (int run = 0; run < 2; run++) {
        poison(p.d_dqk, p.qk_size);
        poison(p.d_dqkv, p.qkv_size);
        poison(p.d_delta, p.rows);
        attention_backward(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_out, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H,
                           s.Hkv, s.D, 0, impl);
        cudaCheck(cudaDeviceSynchronize());
        dqk[run] = host_copy(p.d_dqk, p.qk_size);
        dqkv[run] = host_copy(p.d_dqkv, p.qkv_size);
    }
    same = same_bits(dqk[0], dqk[1]) && same_bits(dqkv[0], dqkv[1]);
    report(same, prefix + "backward deterministic", same ? "two runs gave the same bits" : "two runs differ");

    // The CPU backward (model_cpu.h's float overload) from the out and lse the GPU backward read.
    std::vector<float> cpu_dqk(p.qk_size, 0.0f), cpu_dqkv(p.qkv_size, 0.0f);
    std::vector<float> qk = to_float(p.qk), qkv = to_float(p.qkv), dout = to_float(p.dout), outf = to_float(out);
    attention_backward(cpu_dqk.data(), cpu_dqkv.data(), dout.data(), outf.data(), lse.data(), qk.data(), qkv.data(), s.B,
                       s.T, attention_config(s));
    std::vector<float> gpu_dqk = to_float(dqk[0]), gpu_dqkv = to_float(dqkv[0]);
    size_t qk_stride = (size_t)(s.H + s.Hkv) * s.D, qkv_stride = (size_t)(s.H + 2 * s.Hkv) * s.D;
    check_bf16_tensor(prefix + "dq", gather_heads(gpu_dqk, p.N, qk_stride, 0, s.H, s.D),
                      gather_heads(cpu_dqk, p.N, qk_stride, 0, s.H, s.D));
    check_bf16_tensor(prefix + "dk", gather_heads(gpu_dqk, p.N, qk_stride, s.H, s.Hkv, s.D),
                      gather_heads(cpu_dqk, p.N, qk_stride, s.H, s.Hkv, s.D));
    check_bf16_tensor(prefix + "dv", gather_heads(gpu_dqkv, p.N, qkv_stride, s.H + s.Hkv, s.Hkv, s.D),
                      gather_heads(cpu_dqkv, p.N, qkv_stride, s.H + s.Hkv, s.Hkv, s.D));
    size_t touched = 0;
    for (size_t n = 0; n < p.N; n++)
        for (size_t i = 0; i < (size_t)(s.H + s.Hkv) * s.D; i++)
            if (__bfloat16_as_ushort(dqkv[0][n * qkv_stride + i]) != 0xFFFF) touched++;
    report(touched == 0, prefix + "dqkv query/key part untouched",
           touched ? std::to_string(touched) + " elements written" : "");
}

// impl's forward pass with statistics (without: row_stats stays poisoned), its outputs poisoned
// first: out, lse, row_stats. They stay on the device for a backward pass to read.
static std::tuple<std::vector<bf16>, std::vector<float>, std::vector<float>> forward_outputs(const Problem& p,
                                                                                          AttentionImpl impl,
                                                                                          bool stats = true) {
    const Shape& s = p.s;
    poison(p.d_out, p.out_size);
    poison(p.d_lse, p.rows);
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    attention_forward(p.d_out, p.d_lse, stats ? p.d_stats : nullptr, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv,
                      s.D, 0, impl);
    cudaCheck(cudaDeviceSynchronize());
    return std::make_tuple(host_copy(p.d_out, p.out_size), host_copy(p.d_lse, p.rows),
                           host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows));
}

// impl's backward pass from the out and lse on the device, dqk and dqkv poisoned first.
static std::pair<std::vector<bf16>, std::vector<bf16>> backward_outputs(const Problem& p, AttentionImpl impl) {
    const Shape& s = p.s;
    poison(p.d_dqk, p.qk_size);
    poison(p.d_dqkv, p.qkv_size);
    attention_backward(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_out, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv,
                       s.D, 0, impl);
    cudaCheck(cudaDeviceSynchronize());
    return std::make_pair(host_copy(p.d_dqk, p.qk_size), host_copy(p.d_dqkv, p.qkv_size));
}

// A candidate against the implementation it rearranges, on the same inputs, bit for bit: the
// forward pass with and without statistics (out, lse, statistics), and the backward pass (dq, dk, dv)
// from the base's out and lse. mma_wide against mma: with MB = 2 every sum takes its terms in the
// order MB = 1 takes them (a chunk it skips is one whose products MB = 1 adds as zeros). The LPT
// forms against theirs: the same blocks doing the same work, started in another order. So a
// difference points at a tiling or indexing error rather than at rounding.
static void check_same_bits(const Problem& p, AttentionImpl base, AttentionImpl impl) {
    const std::string prefix = std::string(attention_impl_name(impl)) + " " + shape_name(p.s) + " ";
    const std::string of = std::string("gives ") + attention_impl_name(base) + "'s bits";
    bool same = true;
    for (bool stats : {false, true}) {
        auto a = forward_outputs(p, impl, stats), b = forward_outputs(p, base, stats);
        same &= same_bits(std::get<0>(a), std::get<0>(b)) && same_bits(std::get<1>(a), std::get<1>(b)) &&
                same_bits(std::get<2>(a), std::get<2>(b));
    }
    report(same, prefix + "forward " + of + " (out, lse, statistics; without statistics too)", same ? "" : "they differ");
    auto bwd_base = backward_outputs(p, base);  // both from the base's out and lse, left by the forward above
    auto bwd = backward_outputs(p, impl);
    same = same_bits(bwd_base.first, bwd.first) && same_bits(bwd_base.second, bwd.second);
    report(same, prefix + "backward " + of + " (dq, dk, dv)", same ? "" : "they differ");
}

// mma_lean (a candidate: the softmax in base 2 on unscaled scores, ex2 flushing to zero) against
// mma on the same inputs. Its probabilities differ from mma's by the rounding of their exponents'
// arguments: of m c2, an offset of each row that cancels in out but not in lse, p_t0 or max p, and
// of s c2 - m c2 against (s/sqrt(D) - m) log2(e), a few 1e-7 of |s - m|; a few 1e-6 relative in
// all, so that a few bf16 outputs in 1,000 round the other way, by one unit in 256. The RMS
// difference of each bf16 tensor (out, dq, dk, dv) stays near 1e-4 of its RMS, and must stay under
// 1e-3 of it plus 1e-6, ten times below what validate() lets through against the CPU (a scale or a
// rescaling gone wrong moves every row); the 1e-6 covers dq and dk at T = 1, rounding residues of
// about 1e-8. lse and the statistics in float: within 1e-5 (lse, the probabilities: 1e-5
// relative), the entropy 1e-4 (its sum weighs each error by |s - m|, up to some tens in the sharp
// shape), the largest logit bit for bit (the same scaled maximum: rounding is monotonic). Both
// backward passes read mma's out and lse, so that they differ by their own kernels alone.
static void check_lean_near_mma(const Problem& p) {
    const Shape& s = p.s;
    const std::string prefix = "mma_lean " + shape_name(s) + " near mma: ";
    auto lean = forward_outputs(p, ATTENTION_MMA_LEAN);
    auto mma = forward_outputs(p, ATTENTION_MMA);  // its out and lse stay for both backward passes
    check_rms_error(prefix + "out", to_float(std::get<0>(lean)), to_float(std::get<0>(mma)), 1e-3, 1e-6);
    check_close(prefix + "lse", std::get<1>(lean).data(), std::get<1>(mma).data(), p.rows, 1e-5, 1e-5);
    auto stat = [&](const std::vector<float>& stats, AttentionRowStat k) { return stats.data() + k * p.rows; };
    const std::vector<float>& lean_stats = std::get<2>(lean);
    const std::vector<float>& mma_stats = std::get<2>(mma);
    check_close(prefix + "entropy", stat(lean_stats, ATTN_STAT_ENTROPY), stat(mma_stats, ATTN_STAT_ENTROPY), p.rows, 1e-4,
                1e-4);
    const std::pair<AttentionRowStat, const char*> probabilities[] = {
        {ATTN_STAT_SINK, "p_t0"}, {ATTN_STAT_MAXP, "max p"}, {ATTN_STAT_DOC_START, "mass on document starts"}};
    for (const auto& [k, name] : probabilities)
        check_close(prefix + name, stat(lean_stats, k), stat(mma_stats, k), p.rows, 1e-5, 1e-6);
    bool same = memcmp(stat(lean_stats, ATTN_STAT_LOGIT_MAX), stat(mma_stats, ATTN_STAT_LOGIT_MAX),
                       p.rows * sizeof(float)) == 0;
    report(same, prefix + "the largest logits bit for bit", same ? "" : "they differ");
    auto lean_grads = backward_outputs(p, ATTENTION_MMA_LEAN);
    auto mma_grads = backward_outputs(p, ATTENTION_MMA);
    const std::vector<float> lean_dqk = to_float(lean_grads.first), lean_dqkv = to_float(lean_grads.second);
    const std::vector<float> mma_dqk = to_float(mma_grads.first), mma_dqkv = to_float(mma_grads.second);
    const size_t qk_stride = (size_t)(s.H + s.Hkv) * s.D, qkv_stride = (size_t)(s.H + 2 * s.Hkv) * s.D;
    check_rms_error(prefix + "dq", gather_heads(lean_dqk, p.N, qk_stride, 0, s.H, s.D),
                    gather_heads(mma_dqk, p.N, qk_stride, 0, s.H, s.D), 1e-3, 1e-6);
    check_rms_error(prefix + "dk", gather_heads(lean_dqk, p.N, qk_stride, s.H, s.Hkv, s.D),
                    gather_heads(mma_dqk, p.N, qk_stride, s.H, s.Hkv, s.D), 1e-3, 1e-6);
    check_rms_error(prefix + "dv", gather_heads(lean_dqkv, p.N, qkv_stride, s.H + s.Hkv, s.Hkv, s.D),
                    gather_heads(mma_dqkv, p.N, qkv_stride, s.H + s.Hkv, s.Hkv, s.D), 1e-3, 1e-6);
}

// attention_row_stats (the statistics alone, for a step whose output comes from cuDNN) against
// attention_forward with statistics, bit for bit: lse and every row statistic (the mma kernel
// without its P V product makes them with the same instructions).
static void check_row_stats_alone(const Problem& p) {
    const Shape& s = p.s;
    auto run = [&](bool alone) {
        poison(p.d_out, p.out_size);
        poison(p.d_lse, p.rows);
        poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
        if (alone)
            attention_row_stats(p.d_lse, p.d_stats, p.d_out, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
        else
            attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
        cudaCheck(cudaDeviceSynchronize());
        return std::make_pair(host_copy(p.d_lse, p.rows), host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows));
    };
    auto full = run(false), alone = run(true);
    bool same = same_bits(full.first, alone.first) && same_bits(full.second, alone.second);
    report(same, "statistics alone " + shape_name(s) + ": attention_forward's bits (lse, statistics)",
           same ? "" : "they differ");
}


// The candidate stats_rows_plain (PLAIN_TILES): its statistics those of ./train's form, bit for bit,
// in both block orders, each run on a poisoned buffer, from the lse in p.d_lse. Its plain form runs
// only in a tile without a document start, so with p's random starts (one token in ten) it would
// hardly run: here starts one every 150 tokens (tiles with and without them), and none at all.
static void check_plain_tiles(const Problem& p, const std::string& prefix) {
    const Shape& s = p.s;
    uint32_t* spaced = device_copy(spaced_document_starts(s.B, s.T, 37, 150));
    for (const uint32_t* doc_bits : {(const uint32_t*)spaced, (const uint32_t*)nullptr}) {
        auto run = [&](bool lpt, bool plain) {
            poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
            attention_row_stats_from_lse(p.d_stats, p.d_lse, doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, lpt, plain);
            cudaCheck(cudaDeviceSynchronize());
            return host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
        };
        const std::vector<float> want = run(false, false);
        for (bool lpt : {false, true})
            report(same_bits(run(lpt, true), want), prefix + "plain tiles apart" + (lpt ? ", in the LPT order" : "") +
                                                        (doc_bits ? ", starts every 150 tokens" : ", no document starts") +
                                                        ": ./train's bits");
    }
    cudaCheck(cudaFree(spaced));
}

// Statistic k of the rows' statistics `got` (ATTN_NUM_ROW_STATS arrays of `rows`) against the CPU's,
// at the CPU's tolerances.
static void row_stat_against_cpu(const std::string& name, const std::vector<float>& got, const CpuForward& ref,
                                 size_t rows, AttentionRowStat k) {
    check_close(name + " against the CPU", got.data() + k * rows, ref.row_stats.data() + k * rows, rows, 1e-3,
                k == ATTN_STAT_ENTROPY ? 1e-4 : 1e-6);
}

// The candidate stats_rows_wgmma (WGMMA, sm_90a): its statistics against ./train's form's from the
// same lse, each run on a poisoned buffer, with p's random starts, starts every 150 tokens and none.
// Its scores come from wgmma's products where ./train's come from mma.sync's: the same terms, whose
// float32 sums the two instructions need not round alike, so within the tolerances that hold the
// statistics from lse to attention_forward's (1e-4 relative, 1e-6 absolute, 1e-5 for the
// entropy), the largest logits too; whether they are the same bits is printed. Among its own forms
// (both block orders, plain tiles or not, and run twice) the same bits: the same blocks do the same
// work.
static void check_wgmma_tiles(const Problem& p, const CpuForward& ref, const std::string& prefix) {
    const Shape& s = p.s;
    if (!attention_wgmma_compiled()) {
        printf("(this build has no sm_90a code: the wgmma statistics not checked)\n");
        return;
    }
    uint32_t* spaced = device_copy(spaced_document_starts(s.B, s.T, 37, 150));
    const std::pair<const uint32_t*, const char*> starts[] = {
        {p.d_doc_bits, "random starts"}, {spaced, "starts every 150 tokens"}, {nullptr, "no document starts"}};
    for (const auto& start : starts) {
        const uint32_t* doc_bits = start.first;
        const char* starts_name = start.second;
        auto run = [&](bool lpt, bool plain, bool wgmma) {
            poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
            attention_row_stats_from_lse(p.d_stats, p.d_lse, doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, lpt, plain,
                                         wgmma);
            cudaCheck(cudaDeviceSynchronize());
            return host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
        };
        const std::string name = prefix + "wgmma, " + starts_name;
        const std::vector<float> train = run(false, false, false), got = run(true, false, true);
        for (int k = 0; k < ATTN_NUM_ROW_STATS; k++)
            check_close(name + ", statistic " + std::to_string(k) + " against ./train's kernel's", got.data() + k * p.rows,
                        train.data() + k * p.rows, p.rows, 1e-4, k == ATTN_STAT_ENTROPY ? 1e-5 : 1e-6);
        if (doc_bits == p.d_doc_bits)  // the CPU's statistics are those of p's own starts
            for (AttentionRowStat k : {ATTN_STAT_ENTROPY, ATTN_STAT_SINK, ATTN_STAT_MAXP, ATTN_STAT_DOC_START})
                row_stat_against_cpu(name + ", statistic " + std::to_string((int)k), got, ref, p.rows, k);
        printf("  (%s: %s ./train's kernel's bits)\n", name.c_str(), same_bits(got, train) ? "the same as" : "not");
        report(same_bits(run(true, false, true), got), name + ": the same bits twice");
        report(same_bits(run(false, false, true), got), name + ": the same bits in ./train's block order");
        report(same_bits(run(true, true, true), got), name + ": the same bits with plain tiles apart");
    }
    cudaCheck(cudaFree(spaced));
}

// attention_row_stats_from_lse (the statistics from a log-sum-exp made elsewhere) against the
// statistics attention_forward makes beside that lse, and against the CPU: the largest logit bit for
// bit (the same scaled scores), the others to float rounding: a lane's float sums of up to 512
// terms in two forms (p (s - lse) here, the online softmax's l and a there), and for the entropy
// the rounding of lse itself (half a unit of its last place, up to 1e-6 for |lse| >= 16), so within
// 1e-4 relative and 1e-6 absolute (1e-5 for the entropy), far under what a tile or a row's lse
// gone wrong moves them (5e-4 relative and more); and the CPU's tolerances. Then again from an lse
// a few units of its last place off, as cuDNN's, rounded apart, may be: still within the CPU's.
// Every statistic poisoned first. Shapes the mma kernels do not take are left to attention_row_stats.
static void check_row_stats_from_lse(const Problem& p, const CpuForward& ref) {
    const Shape& s = p.s;
    if (attention_auto(s.D) != ATTENTION_MMA) return;
    attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> want = host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    const bool ran = attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> got = host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    const std::string prefix = "statistics from lse " + shape_name(s) + ": ";
    report(ran, prefix + "runs where the mma kernels do");
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);  // the LPT order (./train's candidate): the same bits
    attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, true);
    cudaCheck(cudaDeviceSynchronize());
    report(same_bits(host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows), got), prefix + "in the LPT order, the same bits");
    check_plain_tiles(p, prefix);
    check_wgmma_tiles(p, ref, prefix);
    auto stat = [&](const std::vector<float>& v, AttentionRowStat k) { return v.data() + k * p.rows; };
    const std::vector<float> got_max(stat(got, ATTN_STAT_LOGIT_MAX), stat(got, ATTN_STAT_LOGIT_MAX) + p.rows),
        want_max(stat(want, ATTN_STAT_LOGIT_MAX), stat(want, ATTN_STAT_LOGIT_MAX) + p.rows);
    report(same_bits(got_max, want_max), prefix + "the largest logits, attention_forward's bits");
    auto against_cpu = [&](const std::vector<float>& v, const std::string& name, AttentionRowStat k) {
        row_stat_against_cpu(name, v, ref, p.rows, k);
    };
    for (AttentionRowStat k : {ATTN_STAT_ENTROPY, ATTN_STAT_SINK, ATTN_STAT_MAXP, ATTN_STAT_DOC_START}) {
        const std::string name = prefix + "statistic " + std::to_string((int)k);
        check_close(name + " against attention_forward's", stat(got, k), stat(want, k), p.rows, 1e-4,
                    k == ATTN_STAT_ENTROPY ? 1e-5 : 1e-6);
        against_cpu(got, name, k);
    }
    // Every lse 3 units of its last place up (odd rows) or down (even rows).
    std::vector<float> lse = host_copy(p.d_lse, p.rows);
    for (size_t r = 0; r < p.rows; r++)
        for (int step = 0; step < 3; step++) lse[r] = std::nextafter(lse[r], r % 2 ? INFINITY : -INFINITY);
    cudaCheck(cudaMemcpy(p.d_lse, lse.data(), p.rows * sizeof(float), cudaMemcpyHostToDevice));
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> off = host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    for (AttentionRowStat k : {ATTN_STAT_ENTROPY, ATTN_STAT_SINK, ATTN_STAT_MAXP, ATTN_STAT_DOC_START})
        against_cpu(off, prefix + "from an lse 3 ulp off, statistic " + std::to_string((int)k), k);
}

// ---------------------------------------------------------------------------------------------
// Registers against occupancy: the mma kernels' MIN_BLOCKS (attention.cuh: the blocks an SM must be
// able to hold at once, which caps each thread's registers; ./train's is 0, ptxas's own choice) at
// D = 64: 1 (up to 255 registers), 3 (168; the backward kernels spill a little) and 4 (128, with
// spills); then the rows' statistics from lse, ./train's kernel on a statistics step, at 5 and 6.
// For each kernel and value: its registers, the bytes it spills to local memory, the blocks an SM
// holds, and its time; and every value must give ./train's bits (the same floating-point and
// tensor-core instructions in the same order; only the registers and integer arithmetic differ).
// dK/dV and dQ are timed apart, so the table also says how the backward divides between them.

struct AttentionOutputs {
    std::vector<bf16> out, dqk, dqkv;
    std::vector<float> lse, stats;
};

// The forward pass with statistics and the backward pass, from the same inputs, at MIN_BLOCKS = M;
// every output poisoned first.
template <int M>
static AttentionOutputs run_min_blocks(const Problem& p) {
    const Shape& s = p.s;
    poison(p.d_out, p.out_size);
    poison(p.d_lse, p.rows);
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    attention_forward_mma<64, 1, M>(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, 0);
    poison(p.d_dqk, p.qk_size);
    poison(p.d_dqkv, p.qkv_size);
    attention_backward_dkdv_mma<64, 1, M>(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H,
                                          s.Hkv, 0);
    attention_backward_dq_mma<64, 1, M>(p.d_dqk, p.d_delta, p.d_dout, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, 0);
    cudaCheck(cudaDeviceSynchronize());
    return {host_copy(p.d_out, p.out_size), host_copy(p.d_dqk, p.qk_size), host_copy(p.d_dqkv, p.qkv_size),
            host_copy(p.d_lse, p.rows), host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows)};
}

static void print_kernel_occupancy(const char* kernel, int min_blocks, const void* fn, int smem, float ms) {
    cudaFuncAttributes a;
    cudaCheck(cudaFuncGetAttributes(&a, fn));
    int blocks = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kMmaThreads, smem));
    printf("%-26s %10d %9d %8zu %13d %9.3f\n", kernel, min_blocks, a.numRegs, (size_t)a.localSizeBytes, blocks, ms);
}

template <int M>
static void min_blocks_variant(const Problem& p, const AttentionOutputs& want) {
    const Shape& s = p.s;
    AttentionOutputs got = run_min_blocks<M>(p);
    bool same = same_bits(got.out, want.out) && same_bits(got.lse, want.lse) && same_bits(got.stats, want.stats) &&
                same_bits(got.dqk, want.dqk) && same_bits(got.dqkv, want.dqkv);
    report(same, "mma MIN_BLOCKS " + std::to_string(M) + " " + shape_name(s) + ": the bits of MIN_BLOCKS 0",
           same ? "" : "they differ");
    float fwd = time_ms([&] {
        attention_forward_mma<64, 1, M>(p.d_out, p.d_lse, nullptr, nullptr, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, 0);
    });
    float fwd_stats = time_ms([&] {
        attention_forward_mma<64, 1, M>(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, 0);
    });
    float dkdv = time_ms([&] {
        attention_backward_dkdv_mma<64, 1, M>(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T,
                                              s.H, s.Hkv, 0);
    });
    float dq = time_ms([&] {
        attention_backward_dq_mma<64, 1, M>(p.d_dqk, p.d_delta, p.d_dout, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, 0);
    });
    const int kv_smem = attention_kv_buffers_smem_bytes<64>(), dkdv_smem = attention_dkdv_mma_smem_bytes<64, 1>();
    print_kernel_occupancy("forward", M, (const void*)attention_forward_mma_kernel<64, 1, false, M>, kv_smem, fwd);
    print_kernel_occupancy("forward + statistics", M, (const void*)attention_forward_mma_kernel<64, 1, true, M>, kv_smem,
                           fwd_stats);
    print_kernel_occupancy("backward dK, dV", M, (const void*)attention_backward_dkdv_mma_kernel<64, 1, M>, dkdv_smem, dkdv);
    print_kernel_occupancy("backward dQ", M, (const void*)attention_backward_dq_mma_kernel<64, 1, M>, kv_smem, dq);
}

// The rows' statistics from lse (./train's on a statistics step: attention_row_stats_from_lse_kernel
// in the LPT order) at MIN_BLOCKS = M, the statistics poisoned first; its row of the table. At D =
// 64 ptxas gives it 116 registers, 4 blocks of 4 warps an SM; 5 and 6 blocks cap them. PLAIN: the
// candidate stats_rows_plain's form (102 registers uncapped, still 4 blocks: 5 take 96 or fewer).
// WGMMA: the candidate stats_rows_wgmma's (96 registers uncapped, 5 blocks; at 6, 80 and 16 bytes
// spilled), its keys in STAGES buffers. doc_bits: the document starts (p's, or others).
template <int M, bool PLAIN = false, bool WGMMA = false, int STAGES = 2>
static std::vector<float> from_lse_min_blocks(const Problem& p, const uint32_t* doc_bits) {
    const Shape& s = p.s;
    const dim3 grid = tile_grid(true, ceil_div(s.T, kMmaTile), s.H, s.B);
    constexpr int smem = attention_stats_from_lse_smem_bytes<64, WGMMA, STAGES>();
    static_assert(smem <= 48 * 1024, "launched directly: no opt-in above 48 KiB");
    auto launch = [&] {
        attention_row_stats_from_lse_kernel<64, true, M, PLAIN, WGMMA, STAGES><<<grid, kMmaThreads, smem>>>(
            p.d_stats, p.d_lse, doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv);
    };
    poison(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    launch();
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> got = host_copy(p.d_stats, ATTN_NUM_ROW_STATS * p.rows);
    const std::string name = WGMMA ? std::string("from lse, wgmma ") + (PLAIN ? "plain " : "") + std::to_string(STAGES) + "st"
                             : PLAIN ? "from lse, plain tiles" : doc_bits == p.d_doc_bits ? "statistics from lse"
                                                                                          : "from lse, long docs";
    print_kernel_occupancy(name.c_str(), M,
                           (const void*)attention_row_stats_from_lse_kernel<64, true, M, PLAIN, WGMMA, STAGES>, smem,
                           time_ms(launch));
    return got;
}

static void min_blocks_experiment(const Shape& s) {
    Problem p = make_problem(s, 11);
    // ./train's entry points (MIN_BLOCKS = 0) leave Delta in p.d_delta for the variants.
    attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0,
                      ATTENTION_MMA);
    attention_backward(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_out, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D,
                       0, ATTENTION_MMA);
    AttentionOutputs want = run_min_blocks<0>(p);
    printf("\nregisters against occupancy, %s\n", shape_name(s).c_str());
    printf("%-26s %10s %9s %8s %13s %9s\n", "kernel", "MIN_BLOCKS", "registers", "spilled", "blocks per SM", "ms");
    min_blocks_variant<0>(p, want);
    min_blocks_variant<1>(p, want);
    min_blocks_variant<3>(p, want);
    min_blocks_variant<4>(p, want);
    // from the lse of run_min_blocks<4>: ./train's bits
    const std::vector<float> rows = from_lse_min_blocks<0>(p, p.d_doc_bits);
    const std::vector<float> rows5 = from_lse_min_blocks<5>(p, p.d_doc_bits), rows6 = from_lse_min_blocks<6>(p, p.d_doc_bits);
    for (int m : {5, 6})
        report(same_bits(m == 5 ? rows5 : rows6, rows),
               "statistics from lse MIN_BLOCKS " + std::to_string(m) + " " + shape_name(s) + ": the bits of MIN_BLOCKS 0");
    // The candidate stats_rows_plain against ./train's kernel, both with long documents (a start
    // every 1,024 tokens; p's random starts leave no tile to its plain form)
    uint32_t* long_docs = device_copy(spaced_document_starts(s.B, s.T, 37, 1024));
    const std::vector<float> train_rows = from_lse_min_blocks<0>(p, long_docs);
    const std::vector<float> plain = from_lse_min_blocks<0, true>(p, long_docs);
    const std::vector<float> plain5 = from_lse_min_blocks<5, true>(p, long_docs);
    for (int m : {0, 5})
        report(same_bits(m == 0 ? plain : plain5, train_rows), "statistics from lse, plain tiles, MIN_BLOCKS " +
                                                                   std::to_string(m) + " " + shape_name(s) +
                                                                   ", long documents: the bits of ./train's kernel");
    // The candidate stats_rows_wgmma (sm_90a builds) on the same starts: its keys in 2, 3 and 4
    // buffers (the candidate's), at 6 blocks an SM, and with plain tiles apart; the same
    // instructions on every score, so the same bits as each other
    if (attention_wgmma_compiled()) {
        const std::vector<float> wgmma = from_lse_min_blocks<0, false, true, kStatsWgmmaStages>(p, long_docs);
        const std::vector<float> others[] = {from_lse_min_blocks<0, false, true, 2>(p, long_docs),
                                             from_lse_min_blocks<0, false, true, 3>(p, long_docs),
                                             from_lse_min_blocks<6, false, true, kStatsWgmmaStages>(p, long_docs),
                                             from_lse_min_blocks<0, true, true, kStatsWgmmaStages>(p, long_docs)};
        bool same = true;
        for (const std::vector<float>& o : others) same &= same_bits(o, wgmma);
        report(same, "statistics from lse, wgmma, 2 and 3 stages, MIN_BLOCKS 6 and plain tiles " + shape_name(s) +
                         ": the bits of the candidate's form");
    }
    cudaCheck(cudaFree(long_docs));
    free_problem(p);
}

// Causal attention FLOPs: the forward is two products of T x T x D halved by the mask; the
// backward is counted as five such products (S and dP recomputed, dV, dK, dQ), its usual count.
static void benchmark(const Shape& s) {
    Problem p = make_problem(s, 7);
    double fwd_flops = 2.0 * 2.0 * s.B * s.H * (double)s.T * s.T * s.D / 2.0, bwd_flops = 2.5 * fwd_flops;
    printf("\ntiming %s (forward %.1f GFLOP, backward %.1f GFLOP)\n", shape_name(s).c_str(), fwd_flops * 1e-9,
           bwd_flops * 1e-9);
    printf("%-16s %-24s %10s %10s\n", "impl", "pass", "ms", "TFLOP/s");
    for (AttentionImpl impl : {ATTENTION_MMA, ATTENTION_MMA_LPT, ATTENTION_MMA_LEAN, ATTENTION_MMA_LEAN_LPT,
                               ATTENTION_MMA_WIDE, ATTENTION_SIMPLE}) {
        if (!attention_supports(impl, s.D)) continue;
        int reps = attention_is_mma(impl) ? 20 : 3;
        float fwd = time_ms([&] { attention_forward(p.d_out, p.d_lse, nullptr, nullptr, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0, impl); }, reps);
        float fwd_stats = time_ms([&] {
            attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0, impl);
        }, reps);
        float bwd = time_ms([&] {
            attention_backward(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_out, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H,
                               s.Hkv, s.D, 0, impl);
        }, reps);
        printf("%-16s %-24s %10.3f %10.1f\n", attention_impl_name(impl), "forward", fwd, fwd_flops / (fwd * 1e-3) * 1e-12);
        printf("%-16s %-24s %10.3f %10.1f\n", attention_impl_name(impl), "forward + statistics", fwd_stats,
               fwd_flops / (fwd_stats * 1e-3) * 1e-12);
        printf("%-16s %-24s %10.3f %10.1f\n", attention_impl_name(impl), "backward", bwd, bwd_flops / (bwd * 1e-3) * 1e-12);
    }
    // The statistics alone (attention_row_stats: the mma kernel without P V), FLOPs counted as the
    // forward's, so that the column compares with the rows above.
    float alone = time_ms([&] {
        attention_row_stats(p.d_lse, p.d_stats, p.d_out, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
    }, 20);
    printf("%-16s %-24s %10.3f %10.1f\n", "auto", "statistics alone", alone, fwd_flops / (alone * 1e-3) * 1e-12);
    // The same from the forward's lse (attention_row_stats_from_lse), where the mma kernels run.
    if (attention_auto(s.D) == ATTENTION_MMA) {
        float from_lse = time_ms([&] {
            attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0);
        }, 20);
        printf("%-16s %-24s %10.3f %10.1f\n", "auto", "statistics from lse", from_lse,
               fwd_flops / (from_lse * 1e-3) * 1e-12);
        float from_lse_lpt = time_ms([&] {
            attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, true);
        }, 20);
        printf("%-16s %-24s %10.3f %10.1f\n", "lpt", "statistics from lse", from_lse_lpt,
               fwd_flops / (from_lse_lpt * 1e-3) * 1e-12);
        // The random starts put one in nearly every tile; with long documents (one start every 1,024
        // tokens) most tiles hold none: ./train's kernel and the candidate stats_rows_plain's form.
        uint32_t* long_docs = device_copy(spaced_document_starts(s.B, s.T, 37, 1024));
        // The candidate stats_rows_wgmma's forms beside them, where the build has sm_90a's code.
        for (bool wgmma : {false, true}) {
            if (wgmma && !attention_wgmma_compiled()) continue;
            for (bool plain : {false, true}) {
                float ms = time_ms([&] {
                    attention_row_stats_from_lse(p.d_stats, p.d_lse, long_docs, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, true,
                                                 plain, wgmma);
                }, 20);
                const std::string impl = std::string("lpt") + (plain ? " plain" : "") + (wgmma ? " wgmma" : "");
                printf("%-16s %-24s %10.3f %10.1f\n", impl.c_str(), "from lse, long documents", ms,
                       fwd_flops / (ms * 1e-3) * 1e-12);
            }
        }
        cudaCheck(cudaFree(long_docs));
    }
    cudaCheck(cudaDeviceSynchronize());
    free_problem(p);
}

// --profile-d22: each pass ./train runs on the d22 layer at B4 (the forward without and with the
// statistics, the statistics alone and from lse, the backward), once to warm up and once more, with nothing
// checked and nothing timed: the launches for a profiler to read (ncu --launch-skip skips the
// first round).
static void profile_passes(const Shape& s) {
    Problem p = make_problem(s, 7);
    for (int round = 0; round < 2; round++) {
        attention_forward(p.d_out, p.d_lse, nullptr, nullptr, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0, ATTENTION_MMA);
        attention_forward(p.d_out, p.d_lse, p.d_stats, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0,
                          ATTENTION_MMA);
        attention_row_stats(p.d_lse, p.d_stats, p.d_out, p.d_doc_bits, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv, s.D, 0);
        attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0);
        if (attention_wgmma_compiled())  // the candidate stats_rows_wgmma's form
            attention_row_stats_from_lse(p.d_stats, p.d_lse, p.d_doc_bits, p.d_qk, s.B, s.T, s.H, s.Hkv, s.D, 0, true, false,
                                         true);
        attention_backward(p.d_dqk, p.d_dqkv, p.d_delta, p.d_dout, p.d_out, p.d_lse, p.d_qk, p.d_qkv, s.B, s.T, s.H, s.Hkv,
                           s.D, 0, ATTENTION_MMA);
        cudaCheck(cudaDeviceSynchronize());
    }
    free_problem(p);
    printf("profiled passes of %s: done\n", shape_name(s).c_str());
}

int main(int argc, char** argv) {
    bool timing = true, profile = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check-only") == 0) timing = false;
        else if (strcmp(argv[i], "--profile-d22") == 0) profile = true;
        else
            fail("usage: %s [--check-only | --profile-d22]  (--check-only: validation without the timings; "
                 "--profile-d22: the d22 layer's passes for a profiler, nothing checked)", argv[0]);
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "error: no CUDA device: dev/cuda/attention needs a GPU\n");
        return 1;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (profile) {
        profile_passes({4, 2048, 8, 8, 64, 1.0f});
        return 0;
    }

    // The d22 layer's timings first: what decides between the implementations comes back even where
    // a device call's time ends during the validation below (whose PASS and FAIL lines then say how
    // far it got).
    if (timing) {
        benchmark({4, 2048, 8, 8, 64, 1.0f});
        benchmark({8, 2048, 8, 8, 64, 1.0f});  // the speed goal's batch
    }

    const Shape shapes[] = {
        {2, 1, 4, 2, 64, 1.0f},     // a single position
        {2, 17, 8, 2, 64, 1.0f},    // GQA 8:2, one partial tile
        {1, 200, 4, 4, 64, 1.0f},   // H == Hkv, partial last tile
        {2, 130, 4, 2, 64, 1.0f},   // two rows past a 128-row tile
        {3, 64, 2, 1, 64, 1.0f},    // exactly one tile
        {4, 70, 8, 8, 64, 1.0f},    // one whole LPT group (4 batch elements of 8 heads) in every kernel
        {9, 130, 8, 4, 64, 1.0f},   // LPT groups of 4 (8 heads) and 8 (4 key heads) batch elements, a partial one first
        {5, 70, 6, 3, 64, 1.0f},    // heads not a power of 2: LPT groups of 4 and 8 batch elements, partial ones first
        {1, 333, 4, 1, 64, 4.0f},   // all query heads on one key head, sharp attention
        {1, 2048, 8, 8, 64, 1.0f},  // the d22 layer at its full length
        {2, 100, 4, 2, 128, 1.0f},  // D = 128 (Qwen3's and Llama's heads): simple and mma
        {1, 300, 4, 1, 128, 4.0f},  // the same, all query heads on one key head, sharp, partial last tile
        {9, 100, 8, 4, 128, 1.0f},  // D = 128 in LPT groups of 4 and 8 batch elements, partial ones first
        {1, 50, 2, 1, 32, 1.0f},    // D = 32
        {1, 40, 2, 2, 34, 1.0f},    // D = 34: lanes with no pair, and a partial 64-wide group
        {1, 70, 2, 1, 192, 1.0f},   // D = 192: the widest lane layout
    };
    uint64_t seed = 1;
    for (const Shape& s : shapes) {
        printf("\n%s\n", shape_name(s).c_str());
        Problem p = make_problem(s, seed++);
        CpuForward ref = cpu_forward_reference(p);
        for (AttentionImpl impl : {ATTENTION_SIMPLE, ATTENTION_MMA, ATTENTION_MMA_WIDE, ATTENTION_MMA_LEAN}) {
            if (!attention_supports(impl, s.D)) {
                printf("(%s does not take D = %d)\n", attention_impl_name(impl), s.D);
                continue;
            }
            validate(p, ref, impl);
        }
        if (attention_supports(ATTENTION_MMA_WIDE, s.D)) check_same_bits(p, ATTENTION_MMA, ATTENTION_MMA_WIDE);
        if (attention_supports(ATTENTION_MMA_LPT, s.D)) check_same_bits(p, ATTENTION_MMA, ATTENTION_MMA_LPT);
        if (attention_supports(ATTENTION_MMA_LEAN, s.D)) check_lean_near_mma(p);
        if (attention_supports(ATTENTION_MMA_LEAN_LPT, s.D)) check_same_bits(p, ATTENTION_MMA_LEAN, ATTENTION_MMA_LEAN_LPT);
        check_row_stats_alone(p);
        check_row_stats_from_lse(p, ref);
        free_problem(p);
    }

    if (timing) {
        benchmark({4, 2048, 8, 2, 64, 1.0f});  // the d22 layer with GQA 8:2
        benchmark({4, 2048, 16, 8, 128, 1.0f});  // Qwen3-0.6B's attention layer
        min_blocks_experiment({4, 2048, 8, 8, 64, 1.0f});
    }

    printf("\n%d passed, %d failed\n", g_passed, g_failed);
    return test_exit_code();
}
