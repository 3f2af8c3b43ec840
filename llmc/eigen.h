// Eigenvalues of a small symmetric matrix, for the effective rank of the keys: the singular
// values of a keys matrix K (N x D) are the square roots of the eigenvalues of the D x D Gram
// matrix K^T K, so only a D x D problem (D = 64; 128 in pretrained models) is ever solved, however
// many keys there are. Method: Householder reduction to tridiagonal form, then the implicit QL
// iteration with Wilkinson-style shifts; O(D^3) with a small constant (~0.3 ms for D = 64, eight
// times that for 128).
#pragma once
#include <cmath>
#include <vector>

// a: n x n symmetric, row-major; destroyed. eig: n eigenvalues (unsorted). Returns false if the
// iteration did not converge (never seen for Gram matrices, but the caller reports it).
inline bool symmetric_eigenvalues(double* a, int n, double* eig) {
    std::vector<double> d(n), e(n, 0.0), v(n), p(n);
    // 1. Householder: for each column k, reflect the part below the diagonal onto one component.
    for (int k = 0; k < n - 2; k++) {
        double norm2 = 0.0;
        for (int i = k + 1; i < n; i++) norm2 += a[i * n + k] * a[i * n + k];
        double x0 = a[(k + 1) * n + k];
        double alpha = x0 >= 0.0 ? -sqrt(norm2) : sqrt(norm2);  // sign chosen to avoid cancellation
        d[k] = a[k * n + k];
        e[k] = alpha;
        double vtv = norm2 - x0 * x0 + (x0 - alpha) * (x0 - alpha);
        if (norm2 == 0.0 || vtv == 0.0) {
            e[k] = x0;
            continue;  // the column is already reduced
        }
        for (int i = k + 1; i < n; i++) v[i] = a[i * n + k];
        v[k + 1] -= alpha;
        // H A H with H = I - beta v v^T equals A - v w^T - w v^T, where p = beta A v and
        // w = p - (beta v.p / 2) v; applied to the trailing block only.
        double beta = 2.0 / vtv, vp = 0.0;
        for (int i = k + 1; i < n; i++) {
            double s = 0.0;
            for (int j = k + 1; j < n; j++) s += a[i * n + j] * v[j];
            p[i] = beta * s;
            vp += v[i] * p[i];
        }
        double half = 0.5 * beta * vp;
        for (int i = k + 1; i < n; i++) p[i] -= half * v[i];  // p now holds w
        for (int i = k + 1; i < n; i++)
            for (int j = k + 1; j < n; j++) a[i * n + j] -= v[i] * p[j] + p[i] * v[j];
    }
    if (n >= 2) {
        d[n - 2] = a[(n - 2) * n + n - 2];
        e[n - 2] = a[(n - 1) * n + n - 2];
    }
    d[n - 1] = a[(n - 1) * n + n - 1];

    // 2. Implicit QL on the tridiagonal matrix (diagonal d, e[i] couples d[i] and d[i+1]).
    for (int l = 0; l < n; l++) {
        for (int iter = 0;; iter++) {
            int m = l;
            for (; m < n - 1; m++) {  // find a negligible off-diagonal element: the block splits there
                double dd = fabs(d[m]) + fabs(d[m + 1]);
                if (fabs(e[m]) <= 1e-15 * dd) break;
            }
            if (m == l) break;
            if (iter == 60) return false;
            // Shift: the eigenvalue of the leading 2x2 block closest to d[l].
            double g = (d[l + 1] - d[l]) / (2.0 * e[l]);
            double r = hypot(g, 1.0);
            g = d[m] - d[l] + e[l] / (g + (g >= 0.0 ? r : -r));
            double s = 1.0, c = 1.0, shift = 0.0;
            int i = m - 1;
            for (; i >= l; i--) {  // chase the bulge from the bottom of the block up to row l
                double f = s * e[i], b = c * e[i];
                r = hypot(f, g);
                e[i + 1] = r;
                if (r == 0.0) {  // exact underflow: the block splits, restart on it
                    d[i + 1] -= shift;
                    e[m] = 0.0;
                    break;
                }
                s = f / r;
                c = g / r;
                g = d[i + 1] - shift;
                r = (d[i] - g) * s + 2.0 * c * b;
                shift = s * r;
                d[i + 1] = g + shift;
                g = c * r - b;
            }
            if (r == 0.0 && i >= l) continue;
            d[l] -= shift;
            e[l] = g;
            e[m] = 0.0;
        }
    }
    for (int i = 0; i < n; i++) eig[i] = d[i];
    return true;
}

// Effective rank (Roy & Vetterli 2007) from the eigenvalues of K^T K: with singular values
// sigma_i = sqrt(lambda_i) and p_i = sigma_i / sum sigma, erank = exp(-sum p_i ln p_i).
inline double effective_rank_from_gram_eigenvalues(const double* eig, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += sqrt(eig[i] > 0.0 ? eig[i] : 0.0);
    if (total <= 0.0) return 0.0;
    double h = 0.0;
    for (int i = 0; i < n; i++) {
        double p = sqrt(eig[i] > 0.0 ? eig[i] : 0.0) / total;
        if (p > 0.0) h -= p * log(p);
    }
    return exp(h);
}

// Effective rank of a keys matrix K from its D x D Gram matrix K^T K (float64, symmetric; a
// scratch copy is made); NaN if the eigenvalue iteration fails.
inline double effective_rank_of_gram(const double* gram, int D) {
    std::vector<double> a(gram, gram + (size_t)D * D), eig(D);
    return symmetric_eigenvalues(a.data(), D, eig.data()) ? effective_rank_from_gram_eigenvalues(eig.data(), D) : NAN;
}
