// A minimal test harness for the C++ tests. Each check prints one line, "PASS name" or
// "FAIL name: why"; test/run_tests.py counts those lines across every test program and prints
// the project's "N passed, N failed" summary. A program's exit status is 1 when any check failed.
#pragma once
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include "../llmc/config.h"
#include "../llmc/utils.h"

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

// How much of its tolerance a check used, as its line prints it: "uses 37% of its tolerance".
// The checks past half of theirs: grep -E 'uses ([5-9][0-9]|[0-9]{3,}|inf)% of its tolerance'.
inline std::string tolerance_used(double fraction) {
    if (!(fraction >= 0) || std::isinf(fraction)) return "uses inf% of its tolerance";
    return strprintf(fraction < 0.1 ? "uses %.1f%% of its tolerance" : "uses %.0f%% of its tolerance", 100 * fraction);
}

// Compares n values against a reference with |a - b| <= atol + rtol |b| per element, and reports
// the element closest to its limit (index, both values) and which fraction of its allowance
// |a - b| / (atol + rtol |b|) it used, whether the check passes or fails.
template <typename A, typename B>
inline bool check_close(const std::string& name, const A* got, const B* want, size_t n, double rtol, double atol) {
    if (n == 0) {
        report(false, name, "no values to compare");
        return false;
    }
    size_t worst = 0, bad = 0;
    double worst_used = -1, max_abs = 0, max_rel = 0;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        double a = (double)got[i], b = (double)want[i];
        if (!std::isfinite(a)) finite = false;
        double err = std::fabs(a - b), allowed = atol + rtol * std::fabs(b);
        if (!(err <= allowed)) bad++;
        double used = err == 0 ? 0.0 : allowed > 0 ? err / allowed : INFINITY;
        if (used != used) used = INFINITY;  // a NaN
        if (used > worst_used) {
            worst_used = used;
            worst = i;
        }
        max_abs = std::fmax(max_abs, err);
        if (b != 0) max_rel = std::fmax(max_rel, err / std::fabs(b));
    }
    std::string why = tolerance_used(worst_used) +
                      strprintf("; n=%zu max abs err %.3g, max rel err %.3g (rtol %.3g, atol %.3g); closest to its limit "
                                "[%zu]: got %.9g want %.9g; %zu beyond",
                                n, max_abs, max_rel, rtol, atol, worst, (double)got[worst], (double)want[worst], bad);
    bool ok = bad == 0 && finite;
    report(ok, name, finite ? why : "non-finite value; " + why);
    return ok;
}

// A measure of error (a norm of a difference, say) against its limit: passes when measure <= limit,
// and reports which fraction of the limit it used, then `detail`.
inline bool check_within(const std::string& name, double measure, double limit, const std::string& detail) {
    double used = measure == 0 ? 0.0 : limit > 0 ? measure / limit : INFINITY;
    bool ok = measure <= limit;
    report(ok, name, tolerance_used(used) + strprintf(" (%.3g of %.3g); ", measure, limit) + detail);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Running a user error in a child process.

struct ChildResult {
    int status = -1;  // exit status, or -1 when the child did not exit normally
    std::string err;  // everything it wrote to stderr
};

inline ChildResult run_child(const std::function<void()>& body) {
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    if (pipe(fds) != 0) fail("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        int null_out = open("/dev/null", O_WRONLY);
        dup2(null_out, 1);
        body();
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    ChildResult r;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) r.err.append(buf, n);
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
    return r;
}

// The body must end the process with status 1 and exactly one line
// "error: <names>: ...<says>...", and leave `keep` (a file it was given) as it was.
inline void expect_user_error(const std::string& name, const std::function<void()>& body, const std::string& names,
                              const std::string& says, const std::string& keep = "") {
    auto file_bytes = [](const std::string& path) {
        std::string bytes;
        if (FILE* f = fopen(path.c_str(), "rb")) {
            char buf[65536];
            size_t n;
            while ((n = fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
            fclose(f);
        } else {
            bytes = "<missing>";
        }
        return bytes;
    };
    std::string before = keep.empty() ? "" : file_bytes(keep);
    ChildResult r = run_child(body);
    std::string line = r.err.substr(0, r.err.find('\n'));
    bool one_line = !r.err.empty() && r.err.find('\n') == r.err.size() - 1;
    bool ok = r.status == 1 && one_line && line.compare(0, 9 + names.size(), "error: " + names + ": ") == 0 &&
              line.find(says) != std::string::npos;
    bool kept = keep.empty() || file_bytes(keep) == before;
    report(ok && kept, name,
           strprintf("status %d, stderr: %s%s", r.status, r.err.substr(0, 300).c_str(), kept ? "" : " (and the file changed)"));
}

inline int test_exit_code() { return g_failed ? 1 : 0; }
