// Shared libraries opened at run time (dlopen) by their name, as the loader finds them
// (LD_LIBRARY_PATH, the system's cache), or else where PyTorch's packages put NVIDIA's libraries:
// pip's CUDA wheels in site-packages/nvidia/<package>/lib (cuDNN in nvidia/cudnn/lib, NCCL in
// nvidia/nccl/lib), a folder the loader never searches, and an active conda environment in
// $CONDA_PREFIX/lib. So ./train takes cuDNN's attention and NCCL's collectives from the PyTorch
// the shell would run, with no setting. Opened by path, such a library finds the ones it loads in
// turn through its own RUNPATH ($ORIGIN and the wheels' folders beside it).
#pragma once
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

extern char** environ;

// The path of `soname` in the folder of wheel `package` (site-packages/nvidia/<package>/lib) on
// the module path (sys.path) of the python3 the PATH names, the first that has it: "" where none
// does, with *problem saying why where python3 could not be asked (not on PATH, failed, silent for
// 60 s). Asks python3 itself, so that a virtual environment, a user's site or PYTHONPATH count as
// they do for PyTorch. Started by posix_spawn with no shell (no copy of this process's memory, no
// fork handlers: safe beside a CUDA context or MPI's registered memory); called only where the
// loader did not find the library.
inline std::string wheel_library_path(const char* package, const char* soname, std::string* problem) {
    static const char* script =
        "import os, sys\n"
        "for d in filter(None, sys.path):\n"
        "    p = os.path.join(os.path.abspath(d), 'nvidia', sys.argv[1], 'lib', sys.argv[2])\n"
        "    if os.path.isfile(p):\n"
        "        print('\\n' + p)\n"  // on a line of its own, whatever a site's start-up code printed
        "        break\n";
    problem->clear();
    int out[2];
    if (pipe(out) != 0) {
        *problem = std::string("no pipe to python3: ") + strerror(errno);
        return "";
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addclose(&actions, out[1]);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    const char* argv[] = {"python3", "-c", script, package, soname, nullptr};
    pid_t pid = 0;
    const int spawned = posix_spawnp(&pid, "python3", &actions, nullptr, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (spawned != 0) {
        close(out[0]);
        *problem = std::string("cannot run python3 (") + strerror(spawned) + ")";
        return "";
    }
    std::string text;
    char buf[4096];
    bool timed_out = false;
    for (;;) {
        pollfd wait_for = {out[0], POLLIN, 0};
        if (poll(&wait_for, 1, 60000) == 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        const ssize_t n = read(out[0], buf, sizeof buf);
        if (n > 0)
            text.append(buf, n);
        else if (n == 0 || errno != EINTR)
            break;
    }
    close(out[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        *problem = timed_out ? "python3 said nothing for 60 s" : "python3 failed";
        return "";
    }
    // the last line that names the library
    const std::string tail = std::string("/") + soname;
    std::string path;
    for (size_t begin = 0, end; begin < text.size(); begin = end + 1) {
        end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(begin, end - begin);
        if (line.size() > tail.size() && line.compare(line.size() - tail.size(), tail.size(), tail) == 0) path = line;
    }
    return path;
}

// dlopen(soname) as the loader finds it, else the same file from $CONDA_PREFIX/lib or from wheel
// `package` (wheel_library_path); *from is then that path (empty where the loader found it). Null
// where none opens, with *why saying what each gave.
inline void* load_library(const char* soname, const char* package, std::string* from, std::string* why) {
    from->clear();
    void* lib = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (lib) return lib;
    const std::string by_name = std::string("cannot load ") + soname + " (" + dlerror() + ")";
    std::string path, problem;
    const char* conda = getenv("CONDA_PREFIX");
    if (conda && *conda && access((std::string(conda) + "/lib/" + soname).c_str(), R_OK) == 0)
        path = std::string(conda) + "/lib/" + soname;
    else
        path = wheel_library_path(package, soname, &problem);
    if (path.empty()) {
        *why = by_name + ", nor find it in PyTorch's wheels (" +
               (problem.empty() ? std::string("no nvidia/") + package + "/lib/" + soname + " on the sys.path of python3"
                                : problem) +
               "); put its folder on LD_LIBRARY_PATH";
        return nullptr;
    }
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        *why = by_name + ", nor " + path + " (" + dlerror() + ")";
        return nullptr;
    }
    *from = path;
    return lib;
}
