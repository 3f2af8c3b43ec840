// How much memory a model needs and how much this process may have: checked before anything is
// allocated, so that a run too large stops at once with the option to change, not hours later
// or by the kernel's OOM killer.
#pragma once
#include <sys/resource.h>
#include <cmath>
#include <cstdio>
#include <string>
#include "utils.h"

// Memory, in bytes, that a model needs: for its weights, gradients and AdamW state alone (a model
// that does not train: its weights alone), and in all with the activations of the largest
// micro-batch.
struct MemoryNeed {
    double weights, total;
};

// The most this process can still allocate, and what sets that bound, for messages ("the GPU",
// "this machine", a limit's name).
struct MemoryLimit {
    double bytes = INFINITY;
    std::string where;
};

inline void tighten(MemoryLimit& limit, double bytes, const std::string& where) {
    if (bytes < limit.bytes) limit = {std::max(0.0, bytes), where};
}

// The number after `key` on a line of `text` that starts with it ("MemAvailable:", "file "), or NAN.
inline double number_after(const std::string& text, const std::string& key) {
    for (size_t at = 0; at < text.size(); at = text.find('\n', at) + 1) {
        if (text.compare(at, key.size(), key) == 0) return strtod(text.c_str() + at + key.size(), nullptr);
        if (text.find('\n', at) == std::string::npos) break;
    }
    return NAN;
}

// A small text file whole ("" when it cannot be read): the files of /proc and /sys.
inline std::string read_small_file(const std::string& path) {
    std::string text;
    if (FILE* f = fopen(path.c_str(), "r")) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1u << 20)) text.append(buf, n);
        fclose(f);
    }
    return text;
}

// What the memory cgroups this process is in (`proc_cgroup`: the text of /proc/self/cgroup) still
// let it allocate, under the cgroup file system at `root` (/sys/fs/cgroup): the least, over the
// process's cgroup and each above it, of its limit less what it uses, its file cache counted as
// free (the kernel reclaims that first). Version 2 ("0::/path": memory.max, memory.current,
// memory.stat's file) and version 1 ("N:memory:/path" or "N:...,memory,...:/path", under
// root/memory: memory.limit_in_bytes, memory.usage_in_bytes, memory.stat's total_cache).
inline MemoryLimit cgroup_memory_headroom(const std::string& proc_cgroup, const std::string& root) {
    MemoryLimit limit;
    for (size_t at = 0; at < proc_cgroup.size();) {
        size_t end = std::min(proc_cgroup.find('\n', at), proc_cgroup.size());
        std::string line = proc_cgroup.substr(at, end - at);
        at = end + 1;
        size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
        if (c2 == std::string::npos) continue;
        std::string controllers = "," + line.substr(c1 + 1, c2 - c1 - 1) + ",", path = line.substr(c2 + 1);
        bool v2 = line.compare(0, c1, "0") == 0 && controllers == ",,";
        if (!v2 && controllers.find(",memory,") == std::string::npos) continue;
        std::string base = v2 ? root : root + "/memory";
        const char* max_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
        const char* used_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
        const char* cache_key = v2 ? "file " : "total_cache ";
        while (true) {  // this cgroup, then each above it
            std::string dir = base + (path == "/" ? "" : path);
            double max = strtod(read_small_file(dir + max_file).c_str(), nullptr);  // "max" (no limit) reads as 0
            double used = strtod(read_small_file(dir + used_file).c_str(), nullptr);
            double cache = number_after(read_small_file(dir + "/memory.stat"), cache_key);
            if (max > 0 && max < 1e18)  // version 1 writes "no limit" as about 2^63
                tighten(limit, max - used + (std::isnan(cache) ? 0 : cache),
                        strprintf("the memory limit of cgroup %s (%.1f GB)", path.c_str(), max / 1e9));
            if (path == "/" || path.empty()) break;
            size_t slash = path.find_last_of('/');
            path = slash == 0 ? "/" : path.substr(0, slash);
        }
    }
    return limit;
}

// What this process may still allocate on this machine: the least of the memory the system can
// give without swapping (MemAvailable), what the address-space limit (ulimit -v) leaves beside
// the process's present size, and what its memory cgroups leave (containers, Slurm jobs).
// Unlimited where none of them is known.
inline MemoryLimit host_memory_limit() {
    MemoryLimit limit;
    double kb = number_after(read_small_file("/proc/meminfo"), "MemAvailable:");
    if (!std::isnan(kb)) tighten(limit, kb * 1024.0, "this machine");
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
        double size_kb = number_after(read_small_file("/proc/self/status"), "VmSize:");
        tighten(limit, (double)as.rlim_cur - (std::isnan(size_kb) ? 0 : size_kb * 1024.0),
                strprintf("the address-space limit (ulimit -v, %.1f GB)", (double)as.rlim_cur / 1e9));
    }
    MemoryLimit cgroup = cgroup_memory_headroom(read_small_file("/proc/self/cgroup"), "/sys/fs/cgroup");
    tighten(limit, cgroup.bytes, cgroup.where);
    return limit;
}

// The most memory this process has held at once (its peak resident set), in bytes.
inline double peak_resident_bytes() {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss * 1024.0;  // Linux counts it in kilobytes
}
