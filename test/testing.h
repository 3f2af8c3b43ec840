// A minimal test harness for the C++ tests. Each check prints one line, "PASS name" or
// "FAIL name: why"; test/run_tests.py counts those lines across every test program and prints
// the project's "N passed, N failed" summary. A program's exit status is 1 when any check failed.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

static int g_passed = 0, g_failed = 0;

inline void report(bool ok, const std::string& name, const std::string& why = "") {
    if (ok) {
        g_passed++;
        printf("PASS %s%s%s\n", name.c_str(), why.empty() ? "" : "  ", why.c_str());
    } else {
        g_failed++;
        printf("FAIL %s: %s\n", name.c_str(), why.c_str());
    }
    fflush(stdout);
}

// Compares n values against a reference with |a - b| <= atol + rtol |b| per element, and reports
// the worst element (index, both values, relative error) whether it passes or fails.
template <typename A, typename B>
inline bool check_close(const std::string& name, const A* got, const B* want, size_t n, double rtol, double atol) {
    if (n == 0) {
        report(false, name, "no values to compare");
        return false;
    }
    size_t worst = 0, bad = 0;
    double worst_excess = -1e300, max_abs = 0, max_rel = 0;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        double a = (double)got[i], b = (double)want[i];
        if (!std::isfinite(a)) finite = false;
        double err = std::fabs(a - b), allowed = atol + rtol * std::fabs(b);
        if (!(err <= allowed)) bad++;
        if (err - allowed > worst_excess) {
            worst_excess = err - allowed;
            worst = i;
        }
        max_abs = std::fmax(max_abs, err);
        if (b != 0) max_rel = std::fmax(max_rel, err / std::fabs(b));
    }
    char why[400];
    snprintf(why, sizeof why,
             "n=%zu max abs err %.3g, max rel err %.3g (rtol %.3g, atol %.3g); closest to its limit [%zu]: got %.9g want %.9g; %zu beyond",
             n, max_abs, max_rel, rtol, atol, worst, (double)got[worst], (double)want[worst], bad);
    bool ok = bad == 0 && finite;
    report(ok, name, finite ? why : std::string("non-finite value; ") + why);
    return ok;
}

inline int test_exit_code() { return g_failed ? 1 : 0; }
