// Checks of the CPU building blocks against values derived by hand: the eigenvalue solver behind
// the effective rank, the statistics on inputs whose answer is known in closed form, the online
// softmax accumulators, the learning-rate schedule, the random numbers, and the checkpoint file
// (round trip and every kind of damage).
#include <sys/resource.h>
#include <algorithm>
#include <csignal>
#include <fstream>
#include <functional>
#include <string>
#include <vector>
#include "../llmc/checkpoint.h"
#include "../llmc/dynamic_library.h"
#include "../llmc/memory.h"
#include "../llmc/model_cpu.h"
#include "../llmc/run_dir.h"
#include "testing.h"

static ModelConfig small_config() {
    ModelConfig c;
    c.vocab_size = 50;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.head_dim = 8;
    c.d_model = 32;
    c.d_ff = 24;
    c.max_seq_len = 16;
    return c;
}

// Singular values of an N x D matrix (row-major) by one-sided Jacobi rotations in float64: a
// method independent of the Gram matrix, accurate for the smallest singular values too.
static std::vector<double> singular_values(std::vector<double> a, int N, int D) {
    for (int sweep = 0; sweep < 60; sweep++) {
        bool rotated = false;
        for (int p = 0; p < D; p++)
            for (int q = p + 1; q < D; q++) {
                double alpha = 0, beta = 0, gamma = 0;
                for (int n = 0; n < N; n++) {
                    double x = a[(size_t)n * D + p], y = a[(size_t)n * D + q];
                    alpha += x * x;
                    beta += y * y;
                    gamma += x * y;
                }
                if (fabs(gamma) <= 1e-15 * sqrt(alpha * beta)) continue;
                rotated = true;
                double zeta = (beta - alpha) / (2 * gamma);
                double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                double cs = 1 / sqrt(1 + t * t), sn = cs * t;
                for (int n = 0; n < N; n++) {
                    double x = a[(size_t)n * D + p], y = a[(size_t)n * D + q];
                    a[(size_t)n * D + p] = cs * x - sn * y;
                    a[(size_t)n * D + q] = sn * x + cs * y;
                }
            }
        if (!rotated) break;
    }
    std::vector<double> sv(D, 0.0);
    for (int p = 0; p < D; p++)
        for (int n = 0; n < N; n++) sv[p] += a[(size_t)n * D + p] * a[(size_t)n * D + p];
    for (double& x : sv) x = sqrt(x);
    return sv;
}

// A = Q diag(lambda) Q^T, symmetric, with Q the product of two Householder reflections of random
// vectors: its eigenvalues are lambda, exactly.
static std::vector<double> matrix_with_eigenvalues(const std::vector<double>& lambda, Rng& rng) {
    int n = (int)lambda.size();
    std::vector<double> q((size_t)n * n, 0.0), a((size_t)n * n, 0.0), v(n);
    for (int i = 0; i < n; i++) q[(size_t)i * n + i] = 1.0;
    for (int reflection = 0; reflection < 2; reflection++) {  // Q <- Q (I - 2 v v^T / v^T v)
        double vv = 0;
        for (double& x : v) {
            x = rng_normal(rng);
            vv += x * x;
        }
        for (int i = 0; i < n; i++) {
            double qv = 0;
            for (int k = 0; k < n; k++) qv += q[(size_t)i * n + k] * v[k];
            for (int k = 0; k < n; k++) q[(size_t)i * n + k] -= 2 * qv * v[k] / vv;
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < n; k++) a[(size_t)i * n + j] += q[(size_t)i * n + k] * lambda[k] * q[(size_t)j * n + k];
    return a;
}

static void test_eigenvalues() {
    // Spectra of every kind the keys give: repeated zeros (rank-deficient), graded from 1 down to
    // 1e-12 (keys near low rank), a cluster of equal eigenvalues, one of size 1 and 2, at the head
    // sizes of the models (64, 128).
    Rng rng{7};
    std::vector<std::pair<std::string, std::vector<double>>> spectra;
    std::vector<double> zeros(12), graded(64), cluster(128), one{2.5}, two{-1.0, 3.0};
    for (int i = 0; i < 12; i++) zeros[i] = (i % 3 == 0) ? 0.0 : 1.0 + i * 0.75;
    for (int i = 0; i < 64; i++) graded[i] = pow(1e-12, i / 63.0);
    for (int i = 0; i < 128; i++) cluster[i] = i < 40 ? 7.0 : 1.0 + 0.01 * i;
    spectra = {{"12, repeated zeros", zeros}, {"64, graded 1..1e-12", graded}, {"128, 40 equal", cluster},
               {"1", one}, {"2", two}};
    for (auto& [name, lambda] : spectra) {
        int n = (int)lambda.size();
        std::vector<double> a = matrix_with_eigenvalues(lambda, rng), eig(n), want(lambda);
        bool converged = symmetric_eigenvalues(a.data(), n, eig.data());
        std::sort(eig.begin(), eig.end());
        std::sort(want.begin(), want.end());
        report(converged, "eigenvalues converge: n = " + name);
        // Householder and QL in float64 are backward stable: eigenvalues within ~n u64 ||A||, at most
        // 128 x 1.1e-16 x 7 = 1e-13, of the exact ones (the rounding of A itself is of that order
        // too). 1e-12 of the largest is still far below the gaps the spectra have (1e-3 and more,
        // and 1e-12 of 1 at the graded one's bottom, which only an absolute error bounds).
        double scale = 0;
        for (double x : want) scale = std::max(scale, fabs(x));
        check_close("eigenvalues of Q diag Q^T: n = " + name, eig.data(), want.data(), n, 0, 1e-12 * scale);
    }
    // Zero diagonal, ones beside it: eigenvalues 2 cos(k pi / (n + 1)), and rotations whose cosine
    // comes out exactly 0 (the iteration's branch for them).
    for (int n : {3, 4, 7}) {
        std::vector<double> a((size_t)n * n, 0.0), eig(n), want(n);
        for (int i = 0; i + 1 < n; i++) a[(size_t)i * n + i + 1] = a[(size_t)(i + 1) * n + i] = 1.0;
        for (int k = 1; k <= n; k++) want[k - 1] = 2 * cos(k * M_PI / (n + 1));
        bool ok = symmetric_eigenvalues(a.data(), n, eig.data());
        std::sort(eig.begin(), eig.end());
        std::sort(want.begin(), want.end());
        report(ok, "eigenvalues converge: tridiagonal 0 / 1, n = " + std::to_string(n));
        check_close("eigenvalues of the tridiagonal 0 / 1 matrix, n = " + std::to_string(n), eig.data(), want.data(), n, 0,
                    1e-13);
    }
    // Wilkinson's W21+ (diagonal |10 - i|, ones beside it): pairs of eigenvalues equal to 14 digits,
    // which a loose test of when a coupling is negligible gets wrong at ~1e-10. Against its singular
    // values by one-sided Jacobi (the absolute eigenvalues of a symmetric matrix), an independent
    // method.
    {
        const int n = 21;
        std::vector<double> w((size_t)n * n, 0.0), eig(n);
        for (int i = 0; i < n; i++) {
            w[(size_t)i * n + i] = fabs(10.0 - i);
            if (i + 1 < n) w[(size_t)i * n + i + 1] = w[(size_t)(i + 1) * n + i] = 1.0;
        }
        std::vector<double> want = singular_values(w, n, n);
        bool ok = symmetric_eigenvalues(w.data(), n, eig.data());
        for (double& x : eig) x = fabs(x);
        std::sort(eig.begin(), eig.end());
        std::sort(want.begin(), want.end());
        report(ok, "eigenvalues converge: Wilkinson W21+");
        // Both methods are accurate to a few u64 ||W|| (||W|| about 11): 1e-12 is ~400 times that.
        check_close("eigenvalues of Wilkinson W21+ (absolute) against its singular values", eig.data(), want.data(), n,
                    0, 1e-12);
    }
    // Scale: the iteration squares elements, so tiny and huge matrices are scaled by a power of
    // two first; a matrix times 2^+-700 has its eigenvalues times 2^+-700, bit for bit.
    {
        std::vector<double> tiny{0, 1e-200, 1e-200, 0}, huge{1e155, 1e155, 1e155, -1e155}, eig(2);
        double want_tiny[2] = {-1e-200, 1e-200}, want_huge[2] = {-sqrt(2.0) * 1e155, sqrt(2.0) * 1e155};
        bool ok = symmetric_eigenvalues(tiny.data(), 2, eig.data());
        std::sort(eig.begin(), eig.end());
        report(ok, "eigenvalues converge: 2 x 2 of 1e-200");
        check_close("eigenvalues of a 2 x 2 of 1e-200", eig.data(), want_tiny, 2, 1e-14, 0);
        ok = symmetric_eigenvalues(huge.data(), 2, eig.data());
        std::sort(eig.begin(), eig.end());
        report(ok, "eigenvalues converge: 2 x 2 of 1e155");
        check_close("eigenvalues of a 2 x 2 of 1e155", eig.data(), want_huge, 2, 1e-14, 0);
        std::vector<double> base = matrix_with_eigenvalues(graded, rng), e1(64), e2(64), e3(64);
        std::vector<double> up(base), down(base), plain(base);
        for (double& x : up) x = ldexp(x, 700);
        for (double& x : down) x = ldexp(x, -700);
        bool all = symmetric_eigenvalues(plain.data(), 64, e1.data()) && symmetric_eigenvalues(up.data(), 64, e2.data()) &&
                   symmetric_eigenvalues(down.data(), 64, e3.data());
        for (int i = 0; i < 64; i++) all &= e2[i] == ldexp(e1[i], 700) && e3[i] == ldexp(e1[i], -700);
        report(all, "eigenvalues of 2^+-700 A are 2^+-700 times A's, bit for bit");
    }
    // The zero matrix and a diagonal one need no iteration.
    std::vector<double> zero(16 * 16, 0.0), eig(16), diag(16 * 16, 0.0), want(16);
    for (int i = 0; i < 16; i++) diag[i * 16 + i] = want[i] = 3.0 - i;
    bool converged = symmetric_eigenvalues(zero.data(), 16, eig.data());
    report(converged && std::all_of(eig.begin(), eig.end(), [](double x) { return x == 0.0; }), "eigenvalues of 0 are 0");
    converged = symmetric_eigenvalues(diag.data(), 16, eig.data());
    report(converged, "eigenvalues of a diagonal matrix converge");
    check_close("eigenvalues of a diagonal matrix, exactly", eig.data(), want.data(), 16, 0, 0);
}

static void test_effective_ranks_interleaved() {
    // effective_ranks_of_grams interleaves two QL iterations; each must give the bits it gives
    // alone, whichever of the two needs more sweeps (a graded spectrum beside a flat one and beside
    // one of rank 1, in both orders).
    Rng rng{11};
    int D = 64;
    std::vector<double> graded(D), flat(D, 2.0), rank1(D, 0.0);
    for (int i = 0; i < D; i++) graded[i] = pow(1e-10, i / (D - 1.0));
    rank1[0] = 5.0;
    std::vector<double> grams[3] = {matrix_with_eigenvalues(graded, rng), matrix_with_eigenvalues(flat, rng),
                                    matrix_with_eigenvalues(rank1, rng)};
    auto alone = [&](std::vector<double> g) {
        std::vector<double> eig(D);
        return symmetric_eigenvalues(g.data(), D, eig.data()) ? effective_rank_from_gram_eigenvalues(eig.data(), D) : NAN;
    };
    bool same = true;
    for (int x = 0; x < 3; x++)
        for (int y = 0; y < 3; y++) {
            std::vector<double> a = grams[x], b = grams[y];
            double ra, rb;
            effective_ranks_of_grams(a.data(), b.data(), D, &ra, &rb);
            same &= ra == alone(grams[x]) && rb == alone(grams[y]);
        }
    report(same, "effective ranks interleaved in pairs: each the bits it has alone");
    // A flat spectrum: erank D within a few u64 (the eigenvalues equal to ~1e-15 relative).
    double flat_rank = alone(grams[1]), rank1_rank = alone(grams[2]), want_flat = D, want_rank1 = 1;
    check_close("effective rank of a flat spectrum", &flat_rank, &want_flat, 1, 1e-12, 0);
    // Rank 1: float64 rounding leaves the other eigenvalues at ~u64 of the largest, singular values
    // ~1e-8 of it, adding ~1e-6 to the erank (as in test_key_statistics); 1e-5 is ten times that, a
    // second direction would add ~1.
    check_close("effective rank of rank 1", &rank1_rank, &want_rank1, 1, 1e-5, 0);
    // Keys that overflowed or went NaN have no effective rank: NaN, not a number that looks fine.
    std::vector<double> with_nan = grams[1], with_inf = grams[1];
    with_nan[5] = with_nan[5 * D] = NAN;
    with_inf[0] = INFINITY;
    double r_nan, r_inf;
    effective_ranks_of_grams(with_nan.data(), with_inf.data(), D, &r_nan, &r_inf);
    report(std::isnan(r_nan) && std::isnan(r_inf), "effective rank of a Gram matrix with a NaN or an infinity: NaN");
}

static void test_effective_rank() {
    // Singular values all equal: erank = D. One non-zero: erank = 1. Two equal: 2.
    double all[4] = {4, 4, 4, 4}, one[4] = {9, 0, 0, 0}, two[4] = {0, 5, 5, 0};
    double got[3] = {effective_rank_from_gram_eigenvalues(all, 4), effective_rank_from_gram_eigenvalues(one, 4),
                     effective_rank_from_gram_eigenvalues(two, 4)};
    double want[3] = {4, 1, 2};
    // exp of an entropy of exactly representable probabilities, in float64: a few u64 (1e-16).
    check_close("effective rank of equal / one / two singular values", got, want, 3, 1e-12, 1e-12);
}

// Fills a layer's normalised keys and adds its key sums (key_sums) and finishes them.
static Telemetry key_stats_of(const ModelConfig& c, int N, const std::function<void(int n, int h, float* k)>& fill) {
    int NH = c.n_head + c.n_kv_head, D = c.head_dim;
    std::vector<float> qk((size_t)N * NH * D, 0.0f);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < c.n_kv_head; h++) fill(n, h, &qk[((size_t)n * NH + c.n_head + h) * D]);
    std::vector<double> keys_f64((size_t)c.n_kv_head * N * (D + 1));
    TelemetrySums lay = telemetry_sums_layout(c);
    std::vector<double> sums(lay.total);
    telemetry_sums_clear(sums.data(), lay);
    key_sums(sums.data(), lay, 0, qk.data(), keys_f64.data(), N, c);
    sums[lay.count] = N;
    Telemetry tm;
    telemetry_from_sums(tm, sums.data(), lay, c);
    return tm;
}

static void test_key_statistics() {
    ModelConfig c = small_config();
    int D = c.head_dim, N = 40;
    // Head 0: one-hot keys of magnitude 3 on varying axes; head 1: every component +-1 with random signs.
    Rng rng{3};
    Telemetry tm = key_stats_of(c, N, [&](int n, int h, float* k) {
        if (h == 0) k[n % D] = 3.0f;
        else for (int i = 0; i < D; i++) k[i] = rng_uniform(rng) < 0.5f ? -1.0f : 1.0f;
    });
    double got[6] = {tm.values[M_K_NORM][0], tm.values[M_K_MAXABS][0], tm.values[M_K_PR][0],
                     tm.values[M_K_NORM][1], tm.values[M_K_MAXABS][1], tm.values[M_K_PR][1]};
    double want[6] = {3, 3, 1, sqrt((double)D), 1, (double)D};
    // Exact float32 inputs (3, +-1): only the float32 rounding of a square root or a quotient, a
    // few u32 (6e-8) relative; 1e-6 is 16 u32.
    check_close("k_norm, k_maxabs, k_pr of one-hot and of +-1 keys", got, want, 6, 1e-6, 0);
    // One-hot keys spread evenly over the D axes: K^T K = (9 N / D) I, so erank = D; and the mean
    // cosine of distinct pairs is (number of same-axis pairs) / (all pairs).
    double per_axis = (double)N / D, same_pairs = D * per_axis * (per_axis - 1);
    double want_cos = same_pairs / ((double)N * (N - 1));
    double got2[2] = {tm.values[M_K_ERANK][0], tm.values[M_K_COS][0]}, want2[2] = {(double)D, want_cos};
    // A diagonal Gram matrix of exact float64 sums, and cosines of float32-normalised keys: a few
    // u32 relative, as above (the 1e-9 floor is below both values).
    check_close("k_erank and k_cos of evenly spread one-hot keys", got2, want2, 2, 1e-6, 1e-9);
    // Identical keys: cosine 1, effective rank 1.
    Telemetry same = key_stats_of(c, N, [&](int, int, float* k) {
        for (int i = 0; i < D; i++) k[i] = 0.5f + i;
    });
    double got3[2] = {same.values[M_K_COS][0], same.values[M_K_ERANK][0]}, want3[2] = {1, 1};
    // Rank 1: float64 rounding leaves the other Gram eigenvalues at ~u64 of the largest, singular
    // values ~1e-8 of the largest, each adding ~2e-7 to the entropy: erank 1 + ~1e-6 at most, and
    // cosines of float32-normalised keys within a few u32 of 1. 1e-5 is ten times that; a second
    // direction would add ~1.
    check_close("k_cos and k_erank of identical keys", got3, want3, 2, 1e-5, 1e-5);
    // Identical keys are all mean: share 1, and nothing is left once it is removed. Keys k and -k
    // in turn: no common direction, and one direction both before and after centring.
    Telemetry opposite = key_stats_of(c, N, [&](int n, int, float* k) {
        for (int i = 0; i < D; i++) k[i] = (n % 2 ? -1.0f : 1.0f) * (0.5f + i);
    });
    double got4[5] = {same.values[M_K_MEAN_SHARE][0], same.values[M_K_ERANK_CENTERED][0],
                      opposite.values[M_K_MEAN_SHARE][0], opposite.values[M_K_ERANK][0],
                      opposite.values[M_K_ERANK_CENTERED][0]};
    double want4[5] = {1, 0, 0, 1, 1};
    // As above: a rank-1 effective rank within ~1e-6, shares within a few u32 of 0 or 1.
    check_close("k_mean_share and k_erank_centered of identical and of opposite keys", got4, want4, 5, 1e-5, 1e-5);
}

static double effective_rank_of_singular_values(const std::vector<double>& sv) {
    double total = 0, h = 0;
    for (double x : sv) total += x;
    for (double x : sv)
        if (x > 0) h -= x / total * log(x / total);
    return exp(h);
}

static void test_near_low_rank_keys() {
    // Keys K = U diag(sigma) V^T in general position (U, V random orthonormal) whose singular values
    // fall from 1 to 1e-5: nearly rank 1, and nearly rank 2. The small singular values hold much of
    // the effective rank, and a Gram matrix summed in float32 loses them (its rounding, ~1e-7 of the
    // largest eigenvalue, is far above their squares, ~1e-10). Expected: the effective ranks of the
    // float32 keys themselves, from their singular values in float64 (one-sided Jacobi).
    ModelConfig c = small_config();
    c.head_dim = 64;
    c.d_model = c.n_head * c.head_dim;
    int D = c.head_dim, N = 256;
    Rng rng{21};
    auto orthonormal_columns = [&](int rows, int cols) {  // Gram-Schmidt on Gaussian columns
        std::vector<double> q((size_t)rows * cols);
        for (double& x : q) x = rng_normal(rng);
        for (int j = 0; j < cols; j++)
            for (int pass = 0; pass < 2; pass++) {
                for (int i = 0; i < j; i++) {
                    double dot = 0;
                    for (int r = 0; r < rows; r++) dot += q[(size_t)r * cols + i] * q[(size_t)r * cols + j];
                    for (int r = 0; r < rows; r++) q[(size_t)r * cols + j] -= dot * q[(size_t)r * cols + i];
                }
                double norm = 0;
                for (int r = 0; r < rows; r++) norm += q[(size_t)r * cols + j] * q[(size_t)r * cols + j];
                for (int r = 0; r < rows; r++) q[(size_t)r * cols + j] /= sqrt(norm);
            }
        return q;
    };
    std::vector<double> spectra[2] = {std::vector<double>(D, 1e-5), std::vector<double>(D)};
    spectra[0][0] = 1.0;  // near rank 1
    for (int i = 0; i < D; i++) spectra[1][i] = i == 0 ? 1.0 : i == 1 ? 0.5 : 1e-3 * pow(1e-2, (i - 2) / (D - 3.0));
    std::vector<float> keys[2];
    for (int h = 0; h < 2; h++) {
        std::vector<double> U = orthonormal_columns(N, D), V = orthonormal_columns(D, D);
        keys[h].assign((size_t)N * D, 0.0f);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < D; i++) {
                double x = 0;
                for (int k = 0; k < D; k++) x += U[(size_t)n * D + k] * spectra[h][k] * V[(size_t)i * D + k];
                keys[h][(size_t)n * D + i] = (float)x;
            }
    }
    Telemetry tm = key_stats_of(c, N, [&](int n, int h, float* k) { std::copy_n(&keys[h][(size_t)n * D], D, k); });
    double got[4], want[4];
    for (int h = 0; h < 2; h++) {
        std::vector<double> k64(keys[h].begin(), keys[h].end()), centred(k64);
        for (int i = 0; i < D; i++) {
            double mean = 0;
            for (int n = 0; n < N; n++) mean += k64[(size_t)n * D + i] / N;
            for (int n = 0; n < N; n++) centred[(size_t)n * D + i] -= mean;
        }
        got[2 * h] = tm.values[M_K_ERANK][h];
        got[2 * h + 1] = tm.values[M_K_ERANK_CENTERED][h];
        want[2 * h] = effective_rank_of_singular_values(singular_values(k64, N, D));
        want[2 * h + 1] = effective_rank_of_singular_values(singular_values(centred, N, D));
    }
    // The float64 Gram matrix rounds at ~1e-16 of the largest eigenvalue, a relative error of 1e-6
    // on the smallest (1e-10), which moves the effective rank by less than that; a float32 Gram
    // matrix (rounding ~1e-7, above those eigenvalues) changes it at the first digits.
    check_close("k_erank and k_erank_centered of keys near rank 1 and 2 (singular values down to 1e-5), within 1e-5",
                got, want, 4, 1e-5, 0);
}

static void test_attention_statistics() {
    // Zero queries make every score 0: each row t is uniform over t + 1 keys, so its entropy is
    // ln(t + 1), its largest probability and its mass on position 0 are 1 / (t + 1).
    ModelConfig c = small_config();
    int B = 2, T = 16, N = B * T, NH = c.n_head + c.n_kv_head, D = c.head_dim;
    std::vector<float> qk_rope((size_t)N * NH * D, 0.0f), qkv((size_t)N * c.qkv_dim(), 0.0f);
    Rng rng{5};
    for (int n = 0; n < N; n++)
        for (int i = c.n_head * D; i < NH * D; i++) qk_rope[(size_t)n * NH * D + i] = rng_normal(rng);
    std::vector<float> atty((size_t)N * c.d_model), lse((size_t)N * c.n_head);
    std::vector<float> row_stats((size_t)ATTN_NUM_ROW_STATS * B * c.n_head * T);
    attention_forward(atty.data(), lse.data(), row_stats.data(), nullptr, qk_rope.data(), qkv.data(), B, T, c);
    TelemetrySums lay = telemetry_sums_layout(c);
    std::vector<double> sums(lay.total);
    telemetry_sums_clear(sums.data(), lay);
    query_attention_sums(sums.data(), lay, 0, qk_rope.data(), row_stats.data(), B, T, c);
    sums[lay.count] = N;
    Telemetry tm;
    telemetry_from_sums(tm, sums.data(), lay, c);
    double ent = 0, inv = 0;
    for (int t = 0; t < T; t++) {
        ent += log(t + 1.0) / T;
        inv += 1.0 / (t + 1) / T;
    }
    double got[4] = {tm.values[M_ATTN_ENTROPY][1], tm.values[M_ATTN_MAXP][2], tm.values[M_ATTN_SINK][3],
                     tm.values[M_ATTN_LOGIT_MAX][0]};
    double want[4] = {ent, inv, inv, 0};
    // float32 accumulators over at most 16 equal scores: a few u32 relative (1e-7); the 1e-6
    // floor for the logit max, exactly 0. A row off by one key errs by about 1/(t+1)^2.
    check_close("uniform attention: entropy ln(t+1), maxp and sink 1/(t+1), logit max 0", got, want, 4, 1e-5, 1e-6);
}

static void test_document_starts() {
    // Uniform attention (zero queries) over sequences whose document starts are known: row t puts
    // 1 / (t + 1) on each of its keys, so its mass on the document starts s <= t is their count
    // over t + 1. Token 7 is the end-of-text token. Sequence 0: 7 at 3, 4 and 15 (starts 4 and 5; 16
    // is past the window); sequence 1: 7 at 0 (start 1); sequence 2: none, though sequence 1 ends
    // in 7 (its position 0 is no start). Position 0 counting, or a start taken at the 7 itself
    // instead of after it, changes the expected values below.
    ModelConfig c = small_config();
    int B = 3, T = 16, N = B * T, NH = c.n_head + c.n_kv_head, D = c.head_dim, eot = 7;
    std::vector<int> tokens(N, 2);
    for (int n : {3, 4, 15, T + 0, T + 15}) tokens[n] = eot;
    std::vector<std::vector<int>> starts = {{4, 5}, {1}, {}};
    std::vector<uint32_t> bits((size_t)B * document_start_words(T));
    document_start_bits(bits.data(), tokens.data(), B, T, eot);
    std::vector<float> qk_rope((size_t)N * NH * D, 0.0f), qkv((size_t)N * c.qkv_dim(), 0.0f);
    std::vector<float> atty((size_t)N * c.d_model), lse((size_t)N * c.n_head);
    size_t rows = (size_t)B * c.n_head * T;
    std::vector<float> row_stats(ATTN_NUM_ROW_STATS * rows);
    attention_forward(atty.data(), lse.data(), row_stats.data(), bits.data(), qk_rope.data(), qkv.data(), B, T, c);
    std::vector<double> want_rows(rows), want_mean(c.n_head, 0.0);
    double seen = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < c.n_head; h++)
            for (int t = 0; t < T; t++) {
                int in_view = 0;
                for (int s : starts[b]) in_view += s <= t;
                want_rows[((size_t)b * c.n_head + h) * T + t] = in_view / (t + 1.0);
                want_mean[h] += in_view / (t + 1.0) / N;
                seen += h == 0 && in_view > 0;
            }
    // float32 sums of at most two probabilities 1/(t+1), each within an ulp: 1e-6 relative.
    check_close("uniform attention: mass on document starts, row by row", row_stats.data() + ATTN_STAT_DOC_START * rows,
                want_rows.data(), rows, 1e-6, 0);
    TelemetrySums lay = telemetry_sums_layout(c);
    std::vector<double> sums(lay.total);
    telemetry_sums_clear(sums.data(), lay);
    query_attention_sums(sums.data(), lay, 0, qk_rope.data(), row_stats.data(), B, T, c);
    sums[lay.count] = N;
    sums[lay.doc_view] = queries_seeing_document_start(tokens.data(), B, T, eot);
    Telemetry tm;
    telemetry_from_sums(tm, sums.data(), lay, c);
    check_close("attn_doc_start: the mean over rows of the mass on document starts", tm.values[M_ATTN_DOC_START].data(),
                want_mean.data(), c.n_head, 1e-6, 0);
    double want_visible = seen / N, got_visible = tm.values[M_DOC_START_VISIBLE][0];
    report(seen == (T - 4) + (T - 1) && got_visible == (float)want_visible,
           "doc_start_visible: the share of queries with a document start in view", strprintf("%g", got_visible));
    // Without an end-of-text token there are no document starts.
    document_start_bits(bits.data(), tokens.data(), B, T, -1);
    bool none = queries_seeing_document_start(tokens.data(), B, T, -1) == 0;
    for (uint32_t w : bits) none &= w == 0;
    report(none, "no end-of-text token: no document starts");
}

static void test_online_entropy() {
    // The online accumulators, fed a row in chunks with rescaling, give the entropy of the whole row.
    Rng rng{11};
    std::vector<float> s(200);
    for (float& x : s) x = 6.0f * rng_normal(rng);
    double m = -1e30, l = 0, direct = 0;
    for (float x : s) m = std::max(m, (double)x);
    for (float x : s) l += exp(x - m);
    for (float x : s) {
        double p = exp(x - m) / l;
        direct -= p * log(p);
    }
    float om = -INFINITY, ol = 0, oa = 0;
    for (size_t start = 0; start < s.size(); start += 37) {
        float cm = om;
        for (size_t j = start; j < std::min(s.size(), start + 37); j++) cm = fmaxf(cm, s[j]);
        if (om != -INFINITY) softmax_stats_rescale(om, cm, &ol, &oa);
        om = cm;
        for (size_t j = start; j < std::min(s.size(), start + 37); j++) {
            float e = expf(s[j] - om);
            ol += e;
            oa += e * (s[j] - om);
        }
    }
    float got = softmax_row_entropy(ol, oa);
    // float32 accumulators: H = ln l - a / l, a summing e (s - m) with |s - m| up to ~35, errs by
    // about u32 |s - m|, 2e-6 at worst, against 1e-6 + 1e-5 H = 4e-6 allowed; a rescaling that
    // dropped the a term's shift l (m_old - m_new) errs by the order of H itself.
    check_close("online softmax entropy equals the direct entropy", &got, &direct, 1, 1e-5, 1e-6);
}

static void test_lr_schedule() {
    float peak = 1.0f, floor = 0.1f;
    double got[5] = {lr_at_step(0, 100, 10, peak, floor), lr_at_step(9, 100, 10, peak, floor),
                     lr_at_step(10, 100, 10, peak, floor), lr_at_step(99, 100, 10, peak, floor),
                     lr_at_step(54, 100, 10, peak, floor)};
    double mid = floor + 0.5 * (peak - floor) * (1 + cos(M_PI * 44.0 / 89.0));
    double want[5] = {0.1, 1.0, 1.0, 0.1, mid};
    // A few float32 operations: within a few u32 (2e-7) relative; 1e-7 absolute is below every
    // value. A schedule off by one step moves these by 1e-2 or more.
    check_close("learning rate: warm-up, peak, floor at the last step, cosine midway", got, want, 5, 1e-6, 1e-7);
}

static void test_rng() {
    Rng a{42}, b{42}, d{43};
    bool same = true, differs = false;
    for (int i = 0; i < 100; i++) {
        uint64_t x = rng_next(a);
        same &= x == rng_next(b);
        differs |= x != rng_next(d);
    }
    report(same && differs, "rng: a seed gives one sequence, another seed another");
    double sum = 0, sq = 0;
    const int n = 400000;
    for (int i = 0; i < n; i++) {
        double x = rng_normal(a);
        sum += x;
        sq += x * x;
    }
    double got[2] = {sum / n, sq / n}, want[2] = {0, 1};
    // Sampling error: the mean of n = 400k standard normals has standard deviation 1/sqrt(n) =
    // 1.6e-3, the mean square sqrt(2/n) = 2.2e-3; 0.01 is 4.5 of those (the seed is fixed, so the
    // check is deterministic). A transform off by a factor (variance 0.5 or 2) fails.
    check_close("rng_normal: mean 0 and variance 1 (400k samples)", got, want, 2, 0, 0.01);
}

static void test_init() {
    ModelConfig c = small_config();
    std::vector<float> p(num_parameters(c));
    init_parameters(c, p.data(), 1);
    auto stddev = [&](int kind, int l) {
        const float* x = &p[param_offset(c, kind, l)];
        size_t n = param_numel(c, kind);
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        return sqrt(s / n);
    };
    double got[3] = {stddev(P_WTE, 0), stddev(P_W2, 1), p[param_offset(c, P_K_GAIN, 1) + 3]};
    double want[3] = {0.02, 0.02 / sqrt(2.0 * c.n_layer), 1.0};
    // Sampling error of a standard deviation from n values: 1/sqrt(2n) relative, 1.8% for wte's
    // 1600 values and 2.6% for w2's 768: 5% is two to three of those (deterministic for the seed).
    // A w2 without its 1/sqrt(2L) is twice too large; the gains are exact.
    check_close("init: wte std 0.02, w2 std 0.02/sqrt(2L), gains 1", got, want, 3, 0.05, 0);
}

// The fields of pretrained models: the kinds an untied model adds (lm_head: a decayed matrix, which
// --freeze can name only when it exists), the memory it needs, and the RoPE scaling's three bands of
// frequencies.
static void test_pretrained_fields() {
    ModelConfig c = small_config();
    c.head_dim = 64;
    c.d_model = 4 * 64;
    ModelConfig untied = c, wide = c, scaled = c;
    untied.tied_embeddings = 0;
    wide.d_model = 48;
    scaled.rope_factor = 8.0f, scaled.rope_low_freq_factor = 1.0f, scaled.rope_high_freq_factor = 4.0f;
    scaled.rope_original_max_pos = 32;
    report(config_error(wide).empty() && config_error(untied).empty() && config_error(scaled).empty(),
           "config: d_model apart from n_head * head_dim, untied embeddings and RoPE scaling are possible");
    report(absent_kinds(c) == param_kind_bit(P_LM_HEAD) && absent_kinds(untied) == 0 && param_is_matrix(P_LM_HEAD) &&
               adamw_segments(untied, 0).back().decay == 1 &&
               adamw_segments(untied, 0).back().start + adamw_segments(untied, 0).back().count == (long long)num_parameters(untied),
           "untied embeddings: lm_head exists only then, last in the layout, and takes weight decay");
    // The memory estimate counts lm_head's weights, gradients and AdamW moments: 16 bytes each.
    CpuModel m;
    double extra = memory_need(m, untied, 2, 8).weights - memory_need(m, c, 2, 8).weights;
    report(extra == 16.0 * c.vocab_size * c.d_model, "memory estimate: lm_head's V x C weights, gradients and moments",
           strprintf("%.0f bytes more", extra));
    // The inverse frequencies of head_dim 64, theta 10^4, with factor 8 and bands of wavelength
    // 32 / 4 = 8 and 32 / 1 = 32: pair 0 (wavelength 2 pi) keeps its frequency, pairs 1..5
    // (wavelength 8.4 to 26.5) are blended, the rest (35.3 and up) are 8 times slower. Pair 3 by
    // hand: wavelength 2 pi 10^(3/8) = 14.90, s = (32 / 14.90 - 1) / 3 = 0.3826, ratio
    // s + (1 - s) / 8 = 0.4597.
    auto ratio = [&](int i) {
        double plain = rope_inv_freq(i, 64, 1e4, 0, 0, 0, 0);
        return rope_inv_freq(i, 64, 1e4, 8, 1, 4, 32) / plain;
    };
    double wavelength3 = 2 * M_PI * pow(1e4, 6.0 / 64), s3 = (32 / wavelength3 - 1) / 3;
    report(ratio(0) == 1.0 && ratio(1) < 1.0 && ratio(5) > 0.125 && ratio(6) == 0.125 && ratio(31) == 0.125 &&
               fabs(ratio(3) - (s3 + (1 - s3) / 8)) < 1e-15 && fabs(ratio(3) - 0.4597) < 1e-4,
           "rope scaling: high frequencies kept, low ones divided by the factor, the band between blended",
           strprintf("pair 3: %.6f", ratio(3)));
}

// --decay's words: kinds and groups, their union; AdamW's segments take the flag of their kind.
static void test_decay_kinds() {
    uint32_t mask = 0;
    std::string unknown;
    uint32_t gains = param_kind_bit(P_ATTN_NORM) | param_kind_bit(P_Q_GAIN) | param_kind_bit(P_K_GAIN) |
                     param_kind_bit(P_MLP_NORM) | param_kind_bit(P_FINAL_NORM);
    bool ok = parse_decay_kinds("matrices", &mask, &unknown) && mask == matrix_kinds() && !(mask & gains) &&
              (mask & param_kind_bit(P_LM_HEAD)) && parse_decay_kinds("gains", &mask, &unknown) && mask == gains &&
              parse_decay_kinds("all", &mask, &unknown) && mask == kAllParamKinds &&
              parse_decay_kinds("none", &mask, &unknown) && mask == 0 &&
              parse_decay_kinds("matrices,k_gain", &mask, &unknown) && mask == (matrix_kinds() | param_kind_bit(P_K_GAIN)) &&
              parse_decay_kinds("wq", &mask, &unknown) && mask == param_kind_bit(P_WQ);
    report(ok, "--decay: kinds, the groups matrices, gains and all, their union, and none");
    bool refused = !parse_decay_kinds("all,bias", &mask, &unknown) && unknown == "bias" &&
                   !parse_decay_kinds("gains,", &mask, &unknown) && unknown == "an empty name" &&
                   !parse_decay_kinds("", &mask, &unknown) && unknown == "an empty name" &&
                   !parse_decay_kinds("none,wq", &mask, &unknown) && unknown == "none";
    report(refused, "--decay: an unknown word, an empty one, and none beside others are refused by name", unknown);
    ModelConfig c = small_config();
    std::vector<ParamSegment> segs = adamw_segments(c, param_kind_bit(P_WK), param_kind_bit(P_K_GAIN) | param_kind_bit(P_WV));
    long long decayed = 0, want = (long long)c.n_layer * (param_numel(c, P_K_GAIN) + param_numel(c, P_WV)), total = 0;
    for (const ParamSegment& s : segs) {
        if (s.decay) decayed += s.count;
        total += s.count;
    }
    report(decayed == want && total == (long long)(num_parameters(c) - c.n_layer * param_numel(c, P_WK)),
           "adamw segments: weight decay on the kinds asked for only, frozen kinds left out",
           strprintf("%lld decayed of %lld", decayed, total));
}

static void test_checkpoint() {
    ModelConfig c = small_config();
    size_t P = num_parameters(c);
    std::vector<float> params(P), m(P), v(P);
    Rng rng{9};
    for (size_t i = 0; i < P; i++) {
        params[i] = rng_normal(rng);
        m[i] = rng_normal(rng);
        v[i] = rng_uniform(rng);
    }
    char dir[] = "/tmp/ckpt_test_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    std::string path = std::string(dir) + "/model.ckpt";
    CheckpointInfo info;
    info.config = c;
    info.step = 17;
    info.data_position = 123;
    info.has_optimizer_state = true;
    info.origin = {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1111222233334444ull, 0x5555666677778888ull};
    checkpoint_write(path, info, params.data(), m.data(), v.data());
    std::vector<float> p2(P), m2(P), v2(P);
    CheckpointInfo back = checkpoint_read(path, p2.data(), m2.data(), v2.data());
    bool same = back.step == 17 && back.data_position == 123 && back.has_optimizer_state &&
                memcmp(&back.config, &c, sizeof c) == 0 && p2 == params && m2 == m && v2 == v;
    report(same, "checkpoint round trip: configuration, step, position, parameters, AdamW state");
    const CheckpointOrigin& o = back.origin;
    report(o.run_id == info.origin.run_id && o.continuation == info.origin.continuation &&
               o.train_data == info.origin.train_data && o.val_data == info.origin.val_data,
           "checkpoint round trip: the run, the continuation and the data's fingerprints");
    CheckpointInfo peeked;
    report(checkpoint_peek(path, &peeked) && peeked.step == 17 && peeked.origin.continuation == info.origin.continuation,
           "checkpoint_peek: the step and origin of a checkpoint");
    CheckpointInfo variant = info;
    variant.config.qk_norm = QK_NORM_NONE;
    variant.schedule.frozen = param_kind_bit(P_WV) | param_kind_bit(P_K_GAIN);
    variant.schedule.decayed = param_kind_bit(P_WQ) | param_kind_bit(P_Q_GAIN);  // a matrix left out, a gain added
    std::string variant_path = std::string(dir) + "/variant.ckpt";
    checkpoint_write(variant_path, variant, params.data(), m.data(), v.data());
    CheckpointInfo variant_back = checkpoint_read_header(variant_path);
    report(variant_back.config.qk_norm == QK_NORM_NONE && variant_back.schedule.frozen == variant.schedule.frozen &&
               variant_back.schedule.decayed == variant.schedule.decayed && info.schedule.decayed == matrix_kinds(),
           "checkpoint round trip: qk_norm, the frozen kinds and the decayed kinds (by default the matrices)");
    // A model of a pretrained one's shape: untied (lm_head follows final_norm), d_model apart from
    // n_head * head_dim, Llama 3 RoPE scaling.
    CheckpointInfo pretrained = info;
    ModelConfig& pc = pretrained.config;
    pc.tied_embeddings = 0;
    pc.d_model = 24;
    pc.rope_factor = 8.0f, pc.rope_low_freq_factor = 1.0f, pc.rope_high_freq_factor = 4.0f, pc.rope_original_max_pos = 8192;
    size_t PP = num_parameters(pc);
    std::vector<float> pp(PP), pm(PP, 0.5f), pv(PP, 0.25f), pp2(PP), pm2(PP), pv2(PP);
    for (size_t i = 0; i < PP; i++) pp[i] = rng_normal(rng);
    std::string pretrained_path = std::string(dir) + "/pretrained.ckpt";
    checkpoint_write(pretrained_path, pretrained, pp.data(), pm.data(), pv.data());
    CheckpointInfo pretrained_back = checkpoint_read(pretrained_path, pp2.data(), pm2.data(), pv2.data());
    report(memcmp(&pretrained_back.config, &pc, sizeof pc) == 0 && pp2 == pp && pm2 == pm && pv2 == pv,
           "checkpoint round trip: untied embeddings, d_model apart from the attention width, RoPE scaling");
    // Its layout: wte 50x24; per layer 4096 (attn_norm 24, wq 32x24, wk and wv 16x24, the gains 8
    // each, wo 24x32, mlp_norm 24, w1, w3, w2 24x24); final_norm 24; then lm_head 50x24.
    report(PP == 1200 + 2 * 4096 + 24 + 1200 && param_offset(pc, P_LM_HEAD) == 1200 + 2 * 4096 + 24 &&
               param_numel(pc, P_WO) == 24 * 32 && param_layers(c, P_LM_HEAD) == 0 &&
               num_parameters(c) == param_offset(c, P_FINAL_NORM) + 32,
           "layout: lm_head last when untied, none when tied; wo is d_model x attention width",
           strprintf("%zu parameters, lm_head at %zu", PP, param_offset(pc, P_LM_HEAD)));

    // Headers with valid checksums whose fields are out of range are refused, naming the field.
    auto refused_header = [&](const std::string& name, const std::function<void(CheckpointInfo&)>& change,
                              const std::string& says) {
        CheckpointInfo odd = info;
        odd.data_order = {2, 8, 32, 1, 5};  // 2 micro-batches of 2 x 8 a step
        odd.data_position = 2 * odd.step;
        change(odd);
        std::string p = std::string(dir) + "/" + name + ".ckpt";
        checkpoint_write(p, odd, params.data(), m.data(), v.data());
        expect_user_error("checkpoint: " + name, [&] { checkpoint_read_header(p); }, p, says, p);
    };
    refused_header("negative step", [](CheckpointInfo& i) { i.step = -5; i.data_position = -10; }, "step -5 is out of range");
    refused_header("huge data position", [](CheckpointInfo& i) { i.data_position = 1LL << 40; }, "does not match its step");
    refused_header("impossible data order", [](CheckpointInfo& i) { i.data_order.total_batch = 20; }, "data order is impossible");
    refused_header("unknown qk_norm", [](CheckpointInfo& i) { i.config.qk_norm = 3; }, "qk_norm 3 is not");
    refused_header("rope factor below 1", [](CheckpointInfo& i) {
        i.config.rope_factor = 0.5f, i.config.rope_low_freq_factor = 1.0f, i.config.rope_high_freq_factor = 4.0f;
        i.config.rope_original_max_pos = 64;
    }, "rope_factor must be 0");
    refused_header("rope bands reversed", [](CheckpointInfo& i) {
        i.config.rope_factor = 8.0f, i.config.rope_low_freq_factor = 4.0f, i.config.rope_high_freq_factor = 1.0f;
        i.config.rope_original_max_pos = 64;
    }, "0 < low < high");
    refused_header("rope fields without a factor", [](CheckpointInfo& i) { i.config.rope_original_max_pos = 64; },
                   "must be 0 when rope_factor is 0");
    refused_header("unknown frozen kind", [](CheckpointInfo& i) { i.schedule.frozen = 1u << P_NUM_KINDS; },
                   strprintf("frozen parameter mask 0x%x", 1u << P_NUM_KINDS));
    refused_header("unknown decayed kind", [](CheckpointInfo& i) { i.schedule.decayed = matrix_kinds() | 1u << P_NUM_KINDS; },
                   strprintf("weight decay mask 0x%x", 1u << P_NUM_KINDS));
    ModelConfig wide = c;
    wide.n_head = 1 << 20;
    wide.head_dim = 1 << 12;  // n_head * head_dim overflows 32 bits
    wide.d_model = 0;
    report(config_error(wide).find("above the limit") != std::string::npos, "config: n_head * head_dim past 2^31 is refused",
           config_error(wide));

    std::vector<char> bytes;
    {
        FILE* f = open_or_fail(path.c_str(), "rb");
        bytes.resize(file_size_or_fail(path.c_str()));
        read_or_fail(f, bytes.data(), bytes.size(), path.c_str(), "all");
        fclose(f);
    }
    auto write_variant = [&](const std::string& name, std::vector<char> b) {
        std::string p = std::string(dir) + "/" + name;
        FILE* f = open_or_fail(p.c_str(), "wb");
        write_or_fail(f, b.data(), b.size(), p.c_str());
        fclose(f);
        return p;
    };
    // A configuration of more than 2^59 parameters (2^24 layers of d_ff 2^24), its count in the
    // header: refused by name, before the count times 12 bytes overflows 64 bits.
    std::vector<char> big_bytes = bytes;
    int32_t huge[8] = {2, 1 << 24, 32, 1, 64, 2048, 1 << 24, 4};
    ModelConfig big = c;
    big.vocab_size = huge[0], big.n_layer = huge[1], big.n_head = huge[2], big.n_kv_head = huge[3];
    big.head_dim = huge[4], big.d_model = huge[5], big.d_ff = huge[6], big.max_seq_len = huge[7];
    int64_t big_count = (int64_t)num_parameters(big);
    memcpy(&big_bytes[16], huge, sizeof huge);
    memcpy(&big_bytes[72], &big_count, 8);
    uint32_t crc = header_crc((const uint8_t*)big_bytes.data());
    memcpy(&big_bytes[92], &crc, 4);
    big_bytes.resize(kCheckpointHeaderBytes);
    std::string too_big = write_variant("too_big.ckpt", big_bytes);
    expect_user_error("checkpoint: more than 2^59 parameters", [&] { checkpoint_read_header(too_big); }, too_big,
                      "more than 2^59 parameters", too_big);
    std::vector<float> sink(P);
    std::string truncated = write_variant("truncated.ckpt", std::vector<char>(bytes.begin(), bytes.end() - 100));
    expect_user_error("checkpoint: truncated file", [&] { checkpoint_read(truncated, sink.data(), nullptr, nullptr); }, truncated, "checkpoint is truncated", truncated);
    std::vector<char> b = bytes;
    b[0] = 'X';
    std::string magic = write_variant("magic.ckpt", b);
    expect_user_error("checkpoint: bad magic", [&] { checkpoint_read(magic, sink.data(), nullptr, nullptr); }, magic, "not a checkpoint", magic);
    b = bytes;
    b[20] ^= 1;  // n_layer
    std::string header = write_variant("header.ckpt", b);
    // The bytes a version did not define read as zero whatever they hold (docs/checkpoint_format.md):
    // a version 1 file is the gain variant with nothing frozen, one of version 1 or 2 records no run.
    auto with_version = [&](uint32_t version, const std::string& name) {
        std::vector<char> old = bytes;
        memcpy(&old[8], &version, 4);
        uint32_t garbage[2] = {2, 0x3}, none = 0;  // qk_norm none, wte and attn_norm frozen
        memcpy(&old[156], garbage, 8);
        memcpy(&old[164], &none, 4);  // the origin stays the one written: nonzero
        uint32_t old_crc = header_crc((const uint8_t*)old.data());
        memcpy(&old[92], &old_crc, 4);
        return write_variant(name, old);
    };
    CheckpointInfo version1 = checkpoint_read(with_version(1, "version1.ckpt"), sink.data(), nullptr, nullptr);
    report(version1.config.qk_norm == QK_NORM_GAIN && version1.schedule.frozen == 0 && version1.origin.run_id == 0 && sink == params,
           "checkpoint: a version 1 file reads as the gain variant with nothing frozen, whatever bytes 156..163 hold");
    CheckpointInfo version2 = checkpoint_read_header(with_version(2, "version2.ckpt"));
    const CheckpointOrigin& none2 = version2.origin;
    report(version2.config.qk_norm == QK_NORM_NONE && version2.schedule.frozen == 3 && none2.run_id == 0 &&
               none2.continuation == 0 && none2.train_data == 0 && none2.val_data == 0,
           "checkpoint: a version 2 file records no run or data, whatever bytes 164..199 hold");
    report(checkpoint_peek(with_version(2, "version2.ckpt"), &peeked) && peeked.origin.run_id == 0 && peeked.step == 17,
           "checkpoint_peek: a version 2 file records no run");
    // Bytes 200..219 (version 4: untied embeddings, RoPE scaling) of a version 3 file read as zero:
    // tied and no scaling, whatever they hold.
    std::vector<char> v3 = bytes;
    uint32_t three = 3, untied_flag = 1;
    float odd_rope[3] = {8.0f, 1.0f, 4.0f};
    memcpy(&v3[8], &three, 4);
    memcpy(&v3[200], &untied_flag, 4);
    memcpy(&v3[204], odd_rope, sizeof odd_rope);
    uint32_t v3_crc = header_crc((const uint8_t*)v3.data());
    memcpy(&v3[92], &v3_crc, 4);
    CheckpointInfo version3 = checkpoint_read(write_variant("version3.ckpt", v3), sink.data(), nullptr, nullptr);
    report(memcmp(&version3.config, &c, sizeof c) == 0 && version3.origin.run_id == info.origin.run_id && sink == params,
           "checkpoint: a version 3 file reads as before, tied and without RoPE scaling, whatever bytes 200..219 hold");
    // Bytes 220..223 (version 5: the decayed kinds) of a version 4 file read as zero: the matrices.
    std::vector<char> v4 = bytes;
    uint32_t four = 4, all_changed = kAllParamKinds;
    memcpy(&v4[8], &four, 4);
    memcpy(&v4[220], &all_changed, 4);
    uint32_t v4_crc = header_crc((const uint8_t*)v4.data());
    memcpy(&v4[92], &v4_crc, 4);
    CheckpointInfo version4 = checkpoint_read_header(write_variant("version4.ckpt", v4));
    std::vector<char> v5 = v4;
    uint32_t five = 5;
    memcpy(&v5[8], &five, 4);
    uint32_t v5_crc = header_crc((const uint8_t*)v5.data());
    memcpy(&v5[92], &v5_crc, 4);
    CheckpointInfo version5 = checkpoint_read_header(write_variant("version5.ckpt", v5));
    report(version4.schedule.decayed == matrix_kinds() && version5.schedule.decayed == gain_kinds(),
           "checkpoint: a version 4 file decays the matrices whatever bytes 220..223 hold; in version 5 they flip kinds");
    std::vector<char> bad_flag = bytes;
    uint32_t two = 2;
    memcpy(&bad_flag[200], &two, 4);
    uint32_t bad_crc = header_crc((const uint8_t*)bad_flag.data());
    memcpy(&bad_flag[92], &bad_crc, 4);
    std::string bad_flag_path = write_variant("untied2.ckpt", bad_flag);
    expect_user_error("checkpoint: an untied flag other than 0 or 1", [&] { checkpoint_read_header(bad_flag_path); },
                      bad_flag_path, "untied-embeddings flag 2", bad_flag_path);
    expect_user_error("checkpoint: damaged header", [&] { checkpoint_read(header, sink.data(), nullptr, nullptr); }, header, "checkpoint header is damaged", header);
    b = bytes;
    b[kCheckpointHeaderBytes + 1000] ^= 4;
    std::string payload = write_variant("payload.ckpt", b);
    expect_user_error("checkpoint: damaged data", [&] { checkpoint_read(payload, sink.data(), nullptr, nullptr); }, payload, "checkpoint data is damaged", payload);
    b = bytes;
    b[kCheckpointHeaderBytes + (P + 10) * sizeof(float)] ^= 4;  // in the AdamW first moments
    std::string moments = write_variant("moments.ckpt", b);
    expect_user_error("checkpoint: damaged AdamW state, read without it (the weights of -e)",
                      [&] { checkpoint_read(moments, sink.data(), nullptr, nullptr); }, moments, "checkpoint data is damaged",
                      moments);
    std::string none = std::string(dir) + "/none.ckpt";
    expect_user_error("checkpoint: missing file", [&] { checkpoint_read(none, sink.data(), nullptr, nullptr); }, none, "cannot open");
    // A full disk (here: a file size limit) fails the write with one line and leaves the previous
    // checkpoint under the same name as it was, with no temporary file behind.
    expect_user_error("checkpoint: a full disk leaves the previous checkpoint intact", [&] {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit limit = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &limit);
        checkpoint_write(path, info, params.data(), m.data(), v.data());
    }, path, "write failed", path);
    report(!file_exists(path + ".tmp"), "checkpoint: no temporary file is left after a failed write");
    std::string readonly_target = std::string(dir) + "/missing_dir/model.ckpt";
    expect_user_error("checkpoint: unwritable path fails cleanly", [&] { checkpoint_write(readonly_target, info, params.data(), nullptr, nullptr); }, readonly_target, "cannot write");
    std::string cmd = std::string("rm -rf ") + dir;
    if (system(cmd.c_str()) != 0) fail("cleanup failed");
}

// A model that does not train (--measure): no gradients or AdamW state, in memory or in the
// estimate before allocating, and the very forward pass, loss and statistics' sums, of one that does.
static void test_forward_only_model() {
    ModelConfig c = small_config();
    size_t P = num_parameters(c);
    int B = 2, T = 8;
    CpuModel training, measuring;
    MemoryNeed need_training = memory_need(training, c, B, T, Dist(), true);
    MemoryNeed need_measuring = memory_need(measuring, c, B, T, Dist(), false);
    report(need_training.weights == 16.0 * P && need_measuring.weights == 4.0 * P &&
               need_training.total - need_training.weights == need_measuring.total - need_measuring.weights,
           "memory_need: forward only, the weights alone (4 P bytes, not 16 P) beside the same activations");
    Options measure;
    measure.measure = 1;
    for (const Options& o : {Options(), measure})  // weights that do not fit: the message says what they hold
        expect_user_error(o.measure ? "check_memory: a measurement's weights" : "check_memory: a training run's weights",
                          [&] { check_memory(o, {}, c, {5e9, 6e9}, {1e9, "this machine"}); }, "model option -m (--preset) d6",
                          o.measure ? "the weights need 5.0 GB; this machine has 1.0 GB"
                                    : "the weights, gradients and AdamW state need 5.0 GB");
    model_init(training, c, B, T, Dist(), true);
    model_init(measuring, c, B, T, Dist(), false);
    HostState h = host_state(measuring);
    report(measuring.grads.empty() && measuring.adam_m.empty() && measuring.adam_v.empty() && !h.adam_m && !h.adam_v &&
               measuring.params.size() == P && host_state(training).adam_m,
           "model_init: forward only, no gradients or AdamW state (host_state's are null)");
    init_parameters(c, training.params.data(), 3);
    measuring.params = training.params;
    std::vector<int> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (7 * i + 3) % c.vocab_size, targets[i] = (5 * i + 1) % c.vocab_size;
    float losses[2];
    CpuModel* models[2] = {&training, &measuring};
    for (int k = 0; k < 2; k++) {
        model_stats_begin(*models[k]);
        losses[k] = model_forward(*models[k], tokens.data(), targets.data(), B, T, true);
    }
    report(losses[0] == losses[1] && training.stat_sums == measuring.stat_sums,
           "model_forward: forward only gives the loss and statistics' sums of a model that trains, bit for bit");
}

// ZeRO-1's shards: for any number of processes they cover the parameters once, in equal padded
// blocks, and the AdamW segments cut to them are together the segments of one process, with the
// same weight decay flags.
static void test_param_shards() {
    ModelConfig c = small_config();
    size_t P = num_parameters(c);
    for (uint32_t frozen : {0u, param_kind_bit(P_WK) | param_kind_bit(P_K_GAIN)}) {
        std::vector<ParamSegment> whole = adamw_segments(c, frozen);
        std::vector<int> want(P, -1);  // -1: not updated; else the decay flag
        for (const ParamSegment& g : whole)
            for (long long i = g.start; i < g.start + g.count; i++) want[i] = g.decay;
        for (int world : {1, 2, 3, 7}) {
            std::vector<int> owners(P, 0), got(P, -1);
            bool blocks_ok = true;
            for (int rank = 0; rank < world; rank++) {
                ParamShard s = param_shard(P, rank, world);
                blocks_ok &= s.padded == s.size * world && s.padded >= P && s.padded < P + 64 * world &&
                             (world == 1 || s.size % 64 == 0) &&
                             s.begin == std::min(P, rank * s.size) && s.end - s.begin <= s.size;
                for (size_t i = s.begin; i < s.end; i++) owners[i]++;
                for (const ParamSegment& g : shard_segments(whole, s)) {
                    blocks_ok &= g.start >= (long long)s.begin && g.start + g.count <= (long long)s.end;
                    for (long long i = g.start; i < g.start + g.count; i++) got[i] = got[i] == -1 ? g.decay : 9;
                }
            }
            bool once = std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; });
            report(blocks_ok && once && got == want,
                   strprintf("param shards: %d processes, frozen %s: every parameter in one shard, the segments intact",
                             world, param_kinds_text(frozen).c_str()));
        }
    }
}

// The parts a forward pass reads in turn (forward_read_bounds), which the candidate adamw_beside
// updates one by one: every tensor lies in its part (the embedding in the first, layer l's block in
// part l + 1, the final norm and an untied output projection in the last), and the AdamW segments
// cut to the parts are together the whole segments, decay flags included, also where --decay merges
// one layer's last tensor with the next layer's first.
static void test_forward_read_parts() {
    ModelConfig tied = small_config(), untied = small_config();
    untied.tied_embeddings = false;
    for (const ModelConfig& c : {tied, untied}) {
        const std::vector<long long> bounds = forward_read_bounds(c);
        const long long P = (long long)num_parameters(c);
        bool parts_ok = (int)bounds.size() == c.n_layer + 3 && bounds.front() == 0 && bounds.back() == P &&
                        std::is_sorted(bounds.begin(), bounds.end());
        for (int kind = 0; kind < P_NUM_KINDS && parts_ok; kind++)
            for (int l = 0; l < param_layers(c, kind); l++) {
                const int part = param_is_per_layer(kind) ? l + 1 : kind < kFirstLayerKind ? 0 : c.n_layer + 1;
                const long long start = (long long)param_offset(c, kind, l), end = start + (long long)param_numel(c, kind);
                parts_ok &= start >= bounds[part] && end <= bounds[part + 1];
            }
        for (uint32_t decayed : {matrix_kinds(), kAllParamKinds})
            for (uint32_t frozen : {0u, param_kind_bit(P_WTE) | param_kind_bit(P_ATTN_NORM)}) {
                const std::vector<ParamSegment> whole = adamw_segments(c, frozen, decayed);
                std::vector<int> want(P, -1), got(P, -1);  // -1: not updated; else the decay flag
                for (const ParamSegment& g : whole)
                    for (long long i = g.start; i < g.start + g.count; i++) want[i] = g.decay;
                bool within = true;
                for (size_t p = 0; p + 1 < bounds.size(); p++)
                    for (const ParamSegment& g : segments_within(whole, bounds[p], bounds[p + 1])) {
                        within &= g.count > 0 && g.start >= bounds[p] && g.start + g.count <= bounds[p + 1];
                        for (long long i = g.start; i < g.start + g.count; i++) got[i] = got[i] == -1 ? g.decay : 9;
                    }
                report(parts_ok && within && got == want,
                       strprintf("forward read parts: %s embeddings, decay %s, frozen %s: every tensor in its part, the "
                                 "segments cut to the parts intact", c.tied_embeddings ? "tied" : "untied",
                                 param_kinds_text(decayed).c_str(), param_kinds_text(frozen).c_str()));
            }
    }
}

// The run folder (run_dir.h): which checkpoints may resume into a log, which --keep removes, and
// the lock a live run holds.
static void test_run_dir() {
    // A run (id 7) started by continuation A; B resumed from A's step 4; C from B's step 6.
    RunLineage line;
    line.run_id = 7;
    const uint64_t A = 1, B = 2, C = 3, X = 9;
    line.continuations = {{A, 0, 0}, {B, A, 4}, {C, B, 6}};
    auto problem = [&](uint64_t run, uint64_t writer, int64_t step) { return lineage_problem(line, {run, writer, 0, 0}, step); };
    report(problem(7, C, 9).empty() && problem(7, B, 6).empty() && problem(7, A, 4).empty() && problem(7, A, 2).empty(),
           "lineage: checkpoints on the log's line resume (the last continuation's, and earlier ones' up to where the next began)");
    report(problem(7, B, 8).find("resumed from step 6") != std::string::npos,
           "lineage: a checkpoint written past the step a later continuation resumed from is abandoned", problem(7, B, 8));
    report(problem(7, A, 5).find("resumed from step 4") != std::string::npos, "lineage: so is one two continuations back",
           problem(7, A, 5));
    report(problem(8, C, 9).find("another run") != std::string::npos, "lineage: another run's checkpoint is refused",
           problem(8, C, 9));
    report(problem(7, X, 3).find("never wrote into this log") != std::string::npos,
           "lineage: a continuation the log does not hold is refused", problem(7, X, 3));
    report(problem(0, 0, 5).empty() && lineage_problem(RunLineage(), {7, C, 0, 0}, 5).empty(),
           "lineage: a checkpoint or log from before runs had ids is not judged");
    // A log begun by a run resumed into a new folder from X's step 5: X's checkpoints up to step 5 are its line.
    RunLineage moved;
    moved.run_id = 7;
    moved.continuations = {{B, X, 5}};
    report(lineage_problem(moved, {7, X, 0, 0}, 5).empty() && lineage_problem(moved, {7, X, 0, 0}, 3).empty() &&
               !lineage_problem(moved, {7, X, 0, 0}, 6).empty(),
           "lineage: a log begun by a resume takes its origin's checkpoints up to the step it began at");
    // A continuation killed before its first checkpoint, resumed again from the same checkpoint.
    RunLineage retried = line;
    retried.continuations.push_back({X, C, 9});
    report(lineage_problem(retried, {7, C, 0, 0}, 9).empty(), "lineage: resuming the same checkpoint again is allowed");

    // --keep ranks by the step recorded inside, not by name, and leaves later steps alone.
    char dir[] = "/tmp/run_dir_test_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    std::string d = dir;
    ModelConfig c = small_config();
    std::vector<float> params(num_parameters(c), 0.5f);
    auto write_ckpt = [&](const std::string& name, int64_t step) {
        CheckpointInfo info;
        info.config = c;
        info.step = step;
        checkpoint_write(d + "/" + name, info, params.data(), nullptr, nullptr);
    };
    write_ckpt("model_step999998.ckpt", 999998);
    write_ckpt("model_step1000001.ckpt", 1000001);
    write_ckpt("model_step1000002.ckpt", 1000002);
    write_ckpt("model_step2000000.ckpt", 2000000);  // a longer run's, or an abandoned continuation's
    write_ckpt("model.ckpt", 3000000);
    FILE* junk = fopen((d + "/model_step000001.ckpt").c_str(), "wb");  // not a checkpoint: never touched
    fputs("junk", junk);
    fclose(junk);
    remove_old_checkpoints(d, 2, 1000002, checkpoint_path(d, 1000002, false));
    std::vector<std::string> left = files_in(d, "model", ".ckpt");
    std::vector<std::string> want = {"model.ckpt", "model_step000001.ckpt", "model_step1000001.ckpt",
                                     "model_step1000002.ckpt", "model_step2000000.ckpt"};
    std::string listing;
    for (const std::string& n : left) listing += n + " ";
    report(left == want, "--keep 2 at step 1000002: removes step 999998 (named after 1000001), keeps later steps and "
                         "files that are not checkpoints", listing);
    std::vector<CheckpointFile> ranked = checkpoints_in(d);
    report(ranked.size() == 4 && ranked[0].name == "model.ckpt" && ranked[1].name == "model_step2000000.ckpt",
           "checkpoints_in: newest step first");
    // A copy of the user's under another name, at the very step just written: neither is removed.
    write_ckpt("model_best.ckpt", 1000003);
    write_ckpt("model_step1000003.ckpt", 1000003);
    remove_old_checkpoints(d, 1, 1000003, checkpoint_path(d, 1000003, false));
    left = files_in(d, "model", ".ckpt");
    want = {"model.ckpt", "model_best.ckpt", "model_step000001.ckpt", "model_step1000003.ckpt", "model_step2000000.ckpt"};
    listing.clear();
    for (const std::string& n : left) listing += n + " ";
    report(left == want, "--keep 1: the checkpoint just written stays, and files ./train does not name as its own", listing);
    // A new run into a folder whose only checkpoint does not read (damaged, or of a newer format)
    // is refused all the same: it would overwrite it.
    char other[] = "/tmp/run_dir_unreadable_XXXXXX";
    if (!mkdtemp(other)) fail("mkdtemp failed");
    std::string damaged = std::string(other) + "/model_step000004.ckpt";
    write_file(damaged, "not a checkpoint any more");
    expect_user_error("run folder: a checkpoint that does not read still stops a new run",
                      [&] { set_aside_unresumable_log(other, std::string(other) + "/run.attnlog"); }, other,
                      "a run's checkpoints are already there", damaged);

    // A second run into a locked folder is refused with one line; the lock goes with its holder.
    int ready[2];
    if (pipe(ready) != 0) fail("pipe failed");
    pid_t holder = fork();
    if (holder == 0) {
        lock_run_dir(d);
        char one = 1;
        ssize_t w = write(ready[1], &one, 1);
        (void)w;
        pause();
        _exit(0);
    }
    char got;
    ssize_t r = read(ready[0], &got, 1);
    (void)r;
    expect_user_error("run folder: a second run into a folder a live run holds is refused", [&] { lock_run_dir(d); }, d,
                      "another ./train is running into this directory");
    kill(holder, SIGKILL);
    waitpid(holder, nullptr, 0);
    ChildResult after = run_child([&] { lock_run_dir(d); });
    report(after.status == 0 && after.err.empty(), "run folder: the lock dies with the process that held it", after.err);
}

// The memory cgroups' limits, from a made-up /proc/self/cgroup and cgroup file system.
static void test_cgroup_memory() {
    char dir[] = "/tmp/cgroup_test_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    std::string root = dir;
    auto put = [&](const std::string& path, const std::string& text) {
        make_dirs(path.substr(0, path.find_last_of('/')));
        write_file(path, text);
    };
    // Version 2: the job's cgroup allows 4 GB and uses 3 GB, 1 GB of it file cache; its parent 10 GB (using 3).
    put(root + "/slurm/job1/memory.max", "4000000000\n");
    put(root + "/slurm/job1/memory.current", "3000000000\n");
    put(root + "/slurm/job1/memory.stat", "anon 2000000000\nfile 1000000000\n");
    put(root + "/slurm/memory.max", "10000000000\n");
    put(root + "/slurm/memory.current", "3000000000\n");
    MemoryLimit v2 = cgroup_memory_headroom("0::/slurm/job1\n", root);
    report(std::fabs(v2.bytes - 2e9) < 1 && v2.where.find("/slurm/job1") != std::string::npos,
           "cgroup v2: limit less use, file cache counted free", strprintf("%.0f %s", v2.bytes, v2.where.c_str()));
    put(root + "/slurm/memory.max", "4500000000\n");  // the parent is now the tighter one
    MemoryLimit parent = cgroup_memory_headroom("0::/slurm/job1\n", root);
    report(std::fabs(parent.bytes - 1.5e9) < 1 && parent.where.find("cgroup /slurm ") != std::string::npos,
           "cgroup v2: the tightest of the cgroup and those above it", strprintf("%.0f %s", parent.bytes, parent.where.c_str()));
    put(root + "/slurm/job1/memory.max", "max\n");
    put(root + "/slurm/memory.max", "max\n");
    report(std::isinf(cgroup_memory_headroom("0::/slurm/job1\n", root).bytes), "cgroup v2: \"max\" is no limit");
    // Version 1, a memory controller among others, beside unrelated lines.
    put(root + "/memory/docker/abc/memory.limit_in_bytes", "2000000000\n");
    put(root + "/memory/docker/abc/memory.usage_in_bytes", "1500000000\n");
    put(root + "/memory/docker/abc/memory.stat", "cache 5\ntotal_cache 250000000\n");
    put(root + "/memory/memory.limit_in_bytes", "9223372036854771712\n");
    MemoryLimit v1 = cgroup_memory_headroom("12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/\n", root);
    report(std::fabs(v1.bytes - 7.5e8) < 1, "cgroup v1: limit less use, total_cache counted free; 2^63 is no limit",
           strprintf("%.0f %s", v1.bytes, v1.where.c_str()));
    report(std::isinf(cgroup_memory_headroom("", root).bytes), "cgroup: none known, no limit");
}

// A library the loader cannot find by its name, taken from a wheel's folder on python3's sys.path:
// zlib copied to <site>/nvidia/zwheel/lib/libzwheel.so.1, the site on PYTHONPATH; or from an active
// conda environment's lib.
static void test_wheel_libraries() {
    void* z = dlopen("libz.so.1", RTLD_NOW);
    Dl_info info{};
    if (!z || !dladdr(dlsym(z, "zlibVersion"), &info) || !info.dli_fname) fail("test: zlib not found");
    char dir[] = "/tmp/wheel_test_XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp failed");
    const std::string root = dir, lib_dir = root + "/site/nvidia/zwheel/lib", path = lib_dir + "/libzwheel.so.1";
    auto copy_zlib = [&](const std::string& to) {
        make_dirs(to.substr(0, to.find_last_of('/')));
        std::ifstream in(info.dli_fname, std::ios::binary);
        std::ofstream out(to, std::ios::binary);
        out << in.rdbuf();
    };
    copy_zlib(path);
    copy_zlib(root + "/conda/lib/libzconda.so.1");
    write_file(lib_dir + "/libbroken.so.1", "not a shared library\n");
    // start-up code that prints, with and without an end of line, before the answer
    make_dirs(root + "/noisy");
    write_file(root + "/noisy/sitecustomize.py", "import sys\nprint('site says hello')\nsys.stdout.write('and more')\n");
    const char* saved_names[] = {"PYTHONPATH", "CONDA_PREFIX", "PATH"};
    std::string saved[3];
    bool had[3];
    for (int k = 0; k < 3; k++) {
        const char* v = getenv(saved_names[k]);
        had[k] = v != nullptr;
        saved[k] = v ? v : "";
    }
    unsetenv("CONDA_PREFIX");
    std::string problem, from, why;
    setenv("PYTHONPATH", (root + "/site").c_str(), 1);
    std::string found = wheel_library_path("zwheel", "libzwheel.so.1", &problem);
    report(found == path && problem.empty(), "wheels: a library in nvidia/<package>/lib on sys.path", found + problem);
    report(wheel_library_path("zwheel", "libother.so.1", &problem).empty() &&
               wheel_library_path("other", "libzwheel.so.1", &problem).empty() && problem.empty(),
           "wheels: none where the package's folder lacks the file, or there is no such package", problem);
    void* lib = load_library("libzwheel.so.1", "zwheel", &from, &why);
    report(lib && from == path && dlsym(lib, "zlibVersion"), "wheels: a library the loader does not find opens from the wheel",
           from + why);
    lib = load_library("libz.so.1", "zwheel", &from, &why);
    report(lib && from.empty(), "wheels: one the loader finds by its name is taken from there", from);
    lib = load_library("libbroken.so.1", "zwheel", &from, &why);
    report(!lib && why.find(lib_dir + "/libbroken.so.1") != std::string::npos,
           "wheels: a wheel's file that does not load is named in the error", why);
    setenv("PYTHONPATH", (root + "/noisy:" + root + "/site").c_str(), 1);
    found = wheel_library_path("zwheel", "libzwheel.so.1", &problem);
    report(found == path, "wheels: found whatever python3's start-up code prints before", found + problem);
    setenv("CONDA_PREFIX", (root + "/conda").c_str(), 1);
    lib = load_library("libzconda.so.1", "zwheel", &from, &why);
    report(lib && from == root + "/conda/lib/libzconda.so.1", "wheels: a conda environment's lib", from + why);
    unsetenv("CONDA_PREFIX");
    unsetenv("PYTHONPATH");
    lib = load_library("libzwheel.so.1", "zwheel", &from, &why);
    report(!lib && why.find("cannot load libzwheel.so.1") != std::string::npos &&
               why.find("no nvidia/zwheel/lib/libzwheel.so.1 on the sys.path of python3") != std::string::npos &&
               why.find("LD_LIBRARY_PATH") != std::string::npos,
           "wheels: neither the loader nor a wheel: the error says both, and what to do", why);
    setenv("PATH", (root + "/conda").c_str(), 1);  // a PATH without python3
    found = wheel_library_path("zwheel", "libzwheel.so.1", &problem);
    lib = load_library("libzwheel.so.1", "zwheel", &from, &why);
    report(found.empty() && problem.find("cannot run python3") != std::string::npos && !lib &&
               why.find("cannot run python3") != std::string::npos,
           "wheels: no python3 on PATH is said so", why);
    for (int k = 0; k < 3; k++) {
        if (had[k])
            setenv(saved_names[k], saved[k].c_str(), 1);
        else
            unsetenv(saved_names[k]);
    }
    if (system((std::string("rm -rf ") + dir).c_str()) != 0) fail("cleanup failed");
}

int main() {
    test_eigenvalues();
    test_effective_ranks_interleaved();
    test_effective_rank();
    test_key_statistics();
    test_near_low_rank_keys();
    test_attention_statistics();
    test_document_starts();
    test_online_entropy();
    test_lr_schedule();
    test_rng();
    test_init();
    test_pretrained_fields();
    test_decay_kinds();
    test_checkpoint();
    test_forward_only_model();
    test_param_shards();
    test_forward_read_parts();
    test_run_dir();
    test_cgroup_memory();
    test_wheel_libraries();
    return test_exit_code();
}
