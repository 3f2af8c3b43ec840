// Small helpers shared by every program: one-line fatal errors, checked file I/O, CRC-32.
// A user error never produces a stack trace or a partial file: it prints "error: ..." naming
// the file or option, and the program exits with status 1.
#pragma once
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <ctime>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#ifdef FAIL_THROWS
#include <stdexcept>

// Built with -DFAIL_THROWS (the fuzzing harnesses of test/fuzz), fail() throws this instead of
// printing and exiting, so that a rejected input ends as a caught exception; what() is the line
// without "error: ". Every other build prints the line and exits with status 1.
struct FailError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
#endif

// A data-parallel run (distributed.h) sets these: fail() names the failing process and stops
// every process of the run, not only its own.
inline int g_fail_rank = -1;  // -1: one process
inline void (*g_fail_stop_all)() = nullptr;

[[noreturn]] inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
#ifdef FAIL_THROWS
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    throw FailError(line);
#else
    // One write of the whole line: the lines of several processes sharing a terminal or a pipe
    // do not interleave.
    char line[4096];
    int n = g_fail_rank >= 0 ? snprintf(line, sizeof line, "error: rank %d: ", g_fail_rank) : snprintf(line, sizeof line, "error: ");
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    n = std::min(n, (int)sizeof line - 2);
    line[n++] = '\n';
    // An error every process meets (an option, the data) is told by rank 0, whose stop ends the
    // others before they speak; another rank waits a moment and then tells its own.
    if (g_fail_rank > 0) usleep(500000);
    fflush(stdout);
    ssize_t written = write(2, line, n);
    (void)written;
    if (g_fail_stop_all) g_fail_stop_all();
    exit(1);
#endif
}

inline FILE* open_or_fail(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (!f) fail("%s: cannot open (%s)", path, strerror(errno));
    return f;
}

// A FILE* closed when it goes out of scope: at every return, and when fail() throws in a
// FAIL_THROWS build, so that rejecting a file never leaves it open.
struct ScopedFile {
    FILE* f;
    explicit ScopedFile(FILE* file) : f(file) {}
    ~ScopedFile() {
        if (f) fclose(f);
    }
    ScopedFile(const ScopedFile&) = delete;
    ScopedFile& operator=(const ScopedFile&) = delete;
    operator FILE*() const { return f; }
};

// Reads exactly n bytes or fails naming the file: a short read means a truncated file.
inline void read_or_fail(FILE* f, void* dst, size_t n, const char* path, const char* what) {
    if (n && fread(dst, 1, n, f) != n) fail("%s: truncated or unreadable while reading %s", path, what);
}

inline void write_or_fail(FILE* f, const void* src, size_t n, const char* path) {
    if (n && fwrite(src, 1, n, f) != n) fail("%s: write failed (%s)", path, strerror(errno));
}

inline std::string strprintf(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// The current UTC time formatted by strftime, e.g. "%Y-%m-%dT%H:%M:%SZ".
inline std::string utc_time(const char* format) {
    time_t now = time(nullptr);
    struct tm t;
    gmtime_r(&now, &t);
    char buf[64];
    strftime(buf, sizeof buf, format, &t);
    return buf;
}

inline bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

inline long long file_size_or_fail(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) fail("%s: cannot open (%s)", path, strerror(errno));
    return (long long)st.st_size;
}

// Writes a whole file atomically: into "<path>.tmp", flushed to disk, then renamed over <path>.
// A crash or a full disk leaves the previous <path> untouched.
struct AtomicFile {
    std::string path, tmp;
    FILE* f = nullptr;
};

inline AtomicFile atomic_open(const std::string& path) {
    AtomicFile a;
    a.path = path;
    a.tmp = path + ".tmp";
    a.f = fopen(a.tmp.c_str(), "wb");
    if (!a.f) fail("%s: cannot write (%s)", path.c_str(), strerror(errno));
    return a;
}

inline void atomic_write(AtomicFile& a, const void* src, size_t n) {
    if (n && fwrite(src, 1, n, a.f) != n) {
        int e = errno;
        fclose(a.f);
        remove(a.tmp.c_str());
        fail("%s: write failed (%s); the previous file was left as it was", a.path.c_str(), strerror(e));
    }
}

inline void atomic_commit(AtomicFile& a) {
    int err = 0;  // the errno of the first step that failed
    if (fflush(a.f) != 0 || fsync(fileno(a.f)) != 0) err = errno;
    if (fclose(a.f) != 0 && !err) err = errno;
    if (!err && rename(a.tmp.c_str(), a.path.c_str()) != 0) err = errno;
    if (err) {
        remove(a.tmp.c_str());
        fail("%s: write failed (%s); the previous file was left as it was", a.path.c_str(), strerror(err));
    }
}

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of zlib and Python's
// zlib.crc32, so files written here can be checked with the standard library of any language.
inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    struct Table {
        uint32_t v[256];
        Table() {
            for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
                v[i] = c;
            }
        }
    };
    static const Table table;  // built once, thread-safe (C++11 static initialisation)
    const uint8_t* p = (const uint8_t*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table.v[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

inline uint32_t crc32_of(const void* data, size_t n) { return crc32_update(0, data, n); }

// Seconds on a steady clock, for timing.
inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "42s", "6m10s", "2h05m".
inline std::string format_duration(double s) {
    int t = (int)(s + 0.5);
    if (t >= 3600) return strprintf("%dh%02dm", t / 3600, t / 60 % 60);
    if (t >= 60) return strprintf("%dm%02ds", t / 60, t % 60);
    return strprintf("%ds", t);
}

// "<the CPU's model name>, N threads", for the log and the console.
inline std::string cpu_device_name(int threads) {
    std::string name = "CPU";
    if (FILE* f = fopen("/proc/cpuinfo", "r")) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                const char* colon = strchr(line, ':');
                if (colon) name = std::string(colon + 2, strcspn(colon + 2, "\n"));
                break;
            }
        fclose(f);
    }
    return strprintf("%s, %d threads", name.c_str(), threads);
}

// The word as a POSIX shell reads it back: as it is when it holds only safe characters, else in
// single quotes (a single quote inside written as '\'').
inline std::string shell_quote(const std::string& word) {
    if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=./:,@%") == std::string::npos)
        return word;
    std::string q = "'";
    for (char ch : word) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

// The absolute form of an existing path (as it is when it cannot be resolved).
inline std::string absolute_path(const std::string& path) {
    char buf[PATH_MAX];
    return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

// The directory of the running program (./train's: where the default corpus is cached and
// scripts/ lies, wherever it is started from).
inline std::string program_dir() {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return ".";
    std::string exe(buf, (size_t)n);
    const std::string deleted = " (deleted)";  // the file was replaced while the program runs
    if (exe.size() > deleted.size() && exe.compare(exe.size() - deleted.size(), deleted.size(), deleted) == 0)
        exe.resize(exe.size() - deleted.size());
    return exe.substr(0, exe.find_last_of('/'));
}
