// Shared libraries opened at run time (dlopen) by their name, as the loader finds them
// (LD_LIBRARY_PATH, the system's cache), or else from PyTorch's CUDA wheels: pip installs NVIDIA's
// libraries into site-packages/nvidia/<package>/lib (cuDNN in nvidia/cudnn/lib, NCCL in
// nvidia/nccl/lib), a folder the loader never searches. A machine where PyTorch trains on the GPU
// has them there, so ./train takes cuDNN's attention and NCCL's collectives from them with no
// setting. Opened by path, such a library finds the ones it loads in turn through its own RUNPATH
// ($ORIGIN and the wheels' folders beside it).
#pragma once
#include <dlfcn.h>
#include <cstdio>
#include <string>

// The path of `soname` in the folder of wheel `package` (site-packages/nvidia/<package>/lib) on
// the module path (sys.path) of the python3 the PATH names, the first that has it: "" where none
// does, or there is no python3. Asks python3 itself, so that a virtual environment, conda, a user's
// site or PYTHONPATH count as they do for PyTorch.
inline std::string wheel_library_path(const char* package, const char* soname) {
    const std::string command = std::string("python3 -c 'import os, sys\n"
                                            "for d in filter(None, sys.path):\n"
                                            "    p = os.path.join(os.path.abspath(d), \"nvidia\", sys.argv[1], \"lib\", sys.argv[2])\n"
                                            "    if os.path.isfile(p):\n"
                                            "        print(p)\n"
                                            "        break' ") +
                                package + " " + soname + " 2>/dev/null";
    FILE* out = popen(command.c_str(), "r");
    if (!out) return "";
    std::string path;
    char buf[4096];
    while (fgets(buf, sizeof buf, out)) path += buf;
    pclose(out);
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    return path;
}

// dlopen(soname) as the loader finds it, else the same file from wheel `package`
// (wheel_library_path); *from is then that path (empty where the loader found it). Null where
// neither opens, with *why saying what each gave.
inline void* load_library(const char* soname, const char* package, std::string* from, std::string* why) {
    from->clear();
    void* lib = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (lib) return lib;
    const std::string by_name = dlerror();
    const std::string path = wheel_library_path(package, soname);
    if (path.empty()) {
        *why = "cannot load " + std::string(soname) + " (" + by_name + "), nor find it in PyTorch's wheels (no nvidia/" +
               package + "/lib/" + soname + " on the sys.path of python3)";
        return nullptr;
    }
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        *why = "cannot load " + std::string(soname) + " (" + by_name + "), nor " + path + " (" + dlerror() + ")";
        return nullptr;
    }
    *from = path;
    return lib;
}
