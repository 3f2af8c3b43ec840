#!/usr/bin/env bash
# Installs the Debian packages a step needs, once: `build` (compile ./train, with Open MPI, and
# prepare the default corpus), `report` (what the Python package attnlog needs to read logs and
# make the report: scripts/report.py, and to tokenize with a Hugging Face tokenizer) or `test`
# (all of these, the PyTorch reference, the Python tests, installing the package offline into a
# virtual environment, and the fuzzers).
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
need_module() { /usr/bin/python3 -c "import $1" >/dev/null 2>&1 || missing+=("$2"); }
if [ "$what" = report ] || [ "$what" = test ]; then
    need_module numpy python3-numpy
    need_module matplotlib python3-matplotlib
    need_module markdown python3-markdown
    need_module regex python3-regex  # attnlog.bpe, the Hugging Face tokenizers (attnlog-tokenize-hf)
fi
if [ "$what" = test ]; then
    # clang with libFuzzer's runtime, for the fuzzing harnesses of test/fuzz.
    need_cmd clang++ clang
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing+=(libclang-rt-dev)
    need_module torch python3-torch
    need_module pytest python3-pytest
    need_module pandas python3-pandas  # the export's tests read it back as pandas.read_csv does
    need_module sentencepiece python3-sentencepiece
    # pip install -e . into a virtual environment, offline (test/test_package.py)
    need_module pip python3-pip
    need_module ensurepip python3-venv
    need_module setuptools python3-setuptools
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
