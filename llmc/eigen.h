// Eigenvalues of a small symmetric matrix, for the effective rank of the keys: the singular
// values of a keys matrix K (N x D) are the square roots of the eigenvalues of the D x D Gram
// matrix K^T K, so only a D x D problem (D = 64; 128 in pretrained models) is ever solved, however
// many keys there are. Method: Householder reduction to tridiagonal form, then the implicit QL
// iteration on the squares of the off-diagonal (no square root per rotation); O(D^3) with a small
// constant. A stats step solves two problems per key head (the keys, and the keys minus their
// mean), 352 at d22, on the host beside the device's work, so their speed sets how often the
// statistics can be taken for free.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

// Householder reduction of a (n x n symmetric, row-major; destroyed) to the tridiagonal matrix
// with diagonal d[0..n) and off-diagonal e[0..n-1), e[i] coupling d[i] and d[i+1]. Step k reflects
// row k right of the diagonal (column k below it, by symmetry) onto one component. The trailing
// block keeps both triangles so that every loop runs along contiguous rows without a reduction,
// and vectorises: A v as a sum of A's rows scaled by v's elements, then the rank-2 update.
inline void householder_tridiagonal(double* a, int n, double* d, double* e) {
    std::vector<double> v(n), p(n);
    for (int k = 0; k < n - 2; k++) {
        const double* row = a + (size_t)k * n;
        double norm2 = 0.0;
        for (int i = k + 1; i < n; i++) norm2 += row[i] * row[i];
        double x0 = row[k + 1];
        double alpha = x0 >= 0.0 ? -sqrt(norm2) : sqrt(norm2);  // sign chosen to avoid cancellation
        d[k] = row[k];
        e[k] = alpha;
        double vtv = norm2 - x0 * x0 + (x0 - alpha) * (x0 - alpha);
        if (norm2 == 0.0 || vtv == 0.0) {
            e[k] = x0;
            continue;  // the row is already reduced
        }
        int m = n - k - 1;  // the trailing block's size; it starts at (k+1, k+1)
        double* __restrict vb = v.data() + k + 1;
        double* __restrict pb = p.data() + k + 1;
        for (int i = 0; i < m; i++) vb[i] = row[k + 1 + i];
        vb[0] -= alpha;
        // H A H with H = I - beta v v^T equals A - v w^T - w v^T, where p = beta A v and
        // w = p - (beta v.p / 2) v.
        double beta = 2.0 / vtv;
        for (int i = 0; i < m; i++) pb[i] = 0.0;
        int j = 0;
        for (; j + 1 < m; j += 2) {  // two rows a pass: half the loads and stores of p
            const double* __restrict aj = a + (size_t)(k + 1 + j) * n + k + 1;
            const double* __restrict ak = aj + n;
            double vj = vb[j], vk = vb[j + 1];
            for (int i = 0; i < m; i++) pb[i] = (pb[i] + aj[i] * vj) + ak[i] * vk;
        }
        if (j < m) {
            const double* __restrict aj = a + (size_t)(k + 1 + j) * n + k + 1;
            double vj = vb[j];
            for (int i = 0; i < m; i++) pb[i] += aj[i] * vj;
        }
        double vp = 0.0;
        for (int i = 0; i < m; i++) {
            pb[i] *= beta;
            vp += vb[i] * pb[i];
        }
        double half = 0.5 * beta * vp;
        for (int i = 0; i < m; i++) pb[i] -= half * vb[i];  // p now holds w
        for (int i = 0; i < m; i++) {
            double* __restrict ai = a + (size_t)(k + 1 + i) * n + k + 1;
            double vi = vb[i], wi = pb[i];
            for (int j = 0; j < m; j++) ai[j] -= vi * pb[j] + wi * vb[j];
        }
    }
    if (n >= 2) {
        d[n - 2] = a[(size_t)(n - 2) * n + n - 2];
        e[n - 2] = a[(size_t)(n - 2) * n + n - 1];
    }
    d[n - 1] = a[(size_t)n * n - 1];
}

// The eigenvalues of a symmetric tridiagonal matrix (diagonal d, squared off-diagonal e2[i]
// coupling d[i] and d[i+1]; both destroyed, the eigenvalues left in d, unsorted) by implicit QL
// with the shift of the leading 2 x 2 block, in the root-free form of Pal, Walker and Kahan: the
// rotations' cosines and sines appear only squared, c^2 = p / (p + e^2) and s^2 = e^2 / (p + e^2)
// with p = gamma^2 / c^2, so a rotation costs two divisions, where the plain form also computes a
// hypotenuse. Each rotation waits for the previous one's divisions, so the iteration advances a
// rotation at a time (advance()) and two problems interleaved keep a core busy where one cannot.
struct TridiagonalQl {
    double *d, *e2;
    int n;
    int l = 0, m = 0, i = -1, iter = 0;  // the block [l, m]; i: the sweep's next rotation, below l when none
    double sigma = 0, c2 = 1, s2 = 0, gamma = 0, p = 0;
    bool failed = false;  // an eigenvalue took more than 60 iterations (never seen for Gram matrices)

    // One rotation, or the start of the next sweep; false once every eigenvalue has converged.
    bool advance() {
        if (i >= l) {
            rotate();
            return true;
        }
        const double eps2 = 1e-30;  // a coupling is negligible below 1e-15 (|d_m| + |d_m+1|)
        for (; l < n; l++, iter = 0) {
            for (m = l; m < n - 1; m++) {  // the first negligible coupling from l: the block splits there
                double dd = fabs(d[m]) + fabs(d[m + 1]);
                if (e2[m] <= eps2 * dd * dd) break;
            }
            if (m == l) continue;
            if (iter++ == 60) {
                failed = true;
                break;
            }
            // The shift: the eigenvalue of the leading 2 x 2 block closest to d[l].
            double el = sqrt(e2[l]);
            double g = (d[l + 1] - d[l]) / (2.0 * el), r = hypot(g, 1.0);
            sigma = d[l] - el / (g + (g >= 0.0 ? r : -r));
            c2 = 1.0;
            s2 = 0.0;
            gamma = d[m] - sigma;
            p = gamma * gamma;
            i = m - 1;
            return true;
        }
        l = n;
        return false;
    }

    // The rotation of rows i and i+1, chasing the bulge from the bottom of the block up to row l.
    void rotate() {
        double bb = e2[i], sum = p + bb;
        if (i != m - 1) e2[i + 1] = s2 * sum;
        double old_c2 = c2, old_gamma = gamma, alpha = d[i];
        c2 = p / sum;
        s2 = bb / sum;
        gamma = c2 * (alpha - sigma) - s2 * old_gamma;
        d[i + 1] = old_gamma + (alpha - gamma);
        p = c2 != 0.0 ? gamma * gamma / c2 : old_c2 * bb;
        if (--i < l) {  // the sweep ends at row l
            e2[l] = s2 * p;
            d[l] = sigma + gamma;
        }
    }
};

// One symmetric eigenvalue problem: a (n x n, row-major; destroyed) reduced to tridiagonal form
// for its TridiagonalQl, scaled by a power of two first. The reduction and the iteration square
// elements, which would underflow below about 1e-154 and overflow above 1e154; scaled, the largest
// element lies in [0.5, 1) (for any but the most extreme matrices), and since every operation
// commutes with a power of two, a matrix that needs no scaling gives the same bits either way.
// Advance ql until it is done, then finish() leaves the eigenvalues (unsorted) in eig.
struct SymmetricEigenvalues {
    std::vector<double> e2;
    double scale = 1.0;
    TridiagonalQl ql;

    SymmetricEigenvalues(double* a, int n, double* eig) : e2(n, 0.0), ql{eig, e2.data(), n} {
        double largest = 0.0;
        for (size_t i = 0; i < (size_t)n * n; i++) largest = fmax(largest, fabs(a[i]));
        int exponent = 0;
        if (largest > 0.0 && std::isfinite(largest)) frexp(largest, &exponent);
        scale = ldexp(1.0, -std::max(-1000, std::min(1000, exponent)));  // a normal power of two: exact
        for (size_t i = 0; i < (size_t)n * n; i++) a[i] *= scale;
        householder_tridiagonal(a, n, eig, e2.data());
        for (double& x : e2) x *= x;
    }
    SymmetricEigenvalues(const SymmetricEigenvalues&) = delete;  // ql points into e2
    // false if the iteration did not converge
    bool finish() {
        for (int i = 0; i < ql.n; i++) ql.d[i] /= scale;
        return !ql.failed;
    }
};

// a: n x n symmetric, row-major; destroyed. eig: n eigenvalues (unsorted). Returns false if the
// iteration did not converge.
inline bool symmetric_eigenvalues(double* a, int n, double* eig) {
    SymmetricEigenvalues problem(a, n, eig);
    while (problem.ql.advance()) {
    }
    return problem.finish();
}

// Effective rank (Roy & Vetterli 2007) from the eigenvalues of K^T K: with singular values
// sigma_i = sqrt(lambda_i) and p_i = sigma_i / sum sigma, erank = exp(-sum p_i ln p_i).
inline double effective_rank_from_gram_eigenvalues(const double* eig, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (!std::isfinite(eig[i])) return NAN;  // keys that overflowed or were NaN: no rank to speak of
        total += sqrt(eig[i] > 0.0 ? eig[i] : 0.0);
    }
    if (total <= 0.0) return 0.0;
    double h = 0.0;
    for (int i = 0; i < n; i++) {
        double p = sqrt(eig[i] > 0.0 ? eig[i] : 0.0) / total;
        if (p > 0.0) h -= p * log(p);
    }
    return exp(h);
}

// The effective ranks of two keys matrices from their D x D Gram matrices (float64, symmetric;
// destroyed): the two eigenvalue problems interleaved, each giving the bits it gives alone; NaN
// for one whose iteration fails.
inline void effective_ranks_of_grams(double* gram_a, double* gram_b, int D, double* erank_a, double* erank_b) {
    std::vector<double> eig_a(D), eig_b(D);
    SymmetricEigenvalues a(gram_a, D, eig_a.data()), b(gram_b, D, eig_b.data());
    while (a.ql.advance() | b.ql.advance()) {  // not ||: each advances until both are done
    }
    *erank_a = a.finish() ? effective_rank_from_gram_eigenvalues(eig_a.data(), D) : NAN;
    *erank_b = b.finish() ? effective_rank_from_gram_eigenvalues(eig_b.data(), D) : NAN;
}
