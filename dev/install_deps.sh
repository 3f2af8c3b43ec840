#!/usr/bin/env bash
# Installs the Debian packages a step needs, once: `build` (compile ./train, with Open MPI, and
# prepare the default corpus) or `test` (also the PyTorch reference, the Python tests and the
# fuzzers).
# As root it runs apt-get; otherwise it prints the one command to run and fails.
set -euo pipefail
what=${1:-build}
missing=()
need_file() { [ -e "$1" ] || missing+=("$2"); }
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }

need_cmd g++ g++
need_cmd make make
# OpenBLAS's OpenMP build (see the Makefile for why not the default pthread one).
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
[ -e "/usr/lib/$multiarch/openblas-openmp/libopenblas.so" ] || missing+=(libopenblas-openmp-dev)
need_file /usr/include/sentencepiece_processor.h libsentencepiece-dev
need_cmd npm npm
need_cmd tar tar
# Open MPI: data-parallel training over processes (mpirun, and the headers ./train builds with).
need_cmd mpirun openmpi-bin
need_cmd mpicxx libopenmpi-dev
if [ "$what" = test ]; then
    # clang with libFuzzer's runtime, for the fuzzing harnesses of test/fuzz.
    need_cmd clang++ clang
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing+=(libclang-rt-dev)
    for mod in torch:python3-torch numpy:python3-numpy matplotlib:python3-matplotlib pytest:python3-pytest \
               sentencepiece:python3-sentencepiece; do
        /usr/bin/python3 -c "import ${mod%%:*}" >/dev/null 2>&1 || missing+=("${mod#*:}")
    done
fi
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing packages: ${missing[*]}; install them with: sudo apt-get update && sudo $cmd" >&2
    exit 1
fi
echo "installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
$cmd -qq >/dev/null
