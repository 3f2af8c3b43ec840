#!/usr/bin/env bash
# The machine code of every kernel of a CUDA program, counted without a GPU and without a
# disassembler: the program is compiled to a cubin for one architecture (ARCH, default 90) and each
# kernel's .text section is 16 bytes an instruction on sm_70 and later (the count includes the few
# instructions that pad a kernel's end to 128 bytes). Two forms of a kernel compiled side by side
# compare statically: what a change adds or removes in the code the GPU runs.
# Usage, from the repository root: bash dev/kernel_sizes.sh dev/cuda/attention.cu [PATTERN]
#   prints "instructions  kernel(template arguments)" for the kernels whose name matches PATTERN
#   (grep -E, on the demangled name; default all), largest first.
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: bash dev/kernel_sizes.sh FILE.cu [PATTERN]" >&2; exit 2; }
cd "$(dirname "$0")/.."
arch=${ARCH:-90}
cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
multiarch=$(${CXX:-g++} -print-multiarch)
nvcc -std=c++17 -O3 -I. -I"/usr/include/$multiarch/openblas-openmp" -arch="sm_$arch" -cubin -o "$cubin" "$1"
readelf -S -W "$cubin" 2>/dev/null |
    awk '{ for (i = 1; i < NF; i++) if ($i ~ /^\.text\./ && $(i + 1) == "PROGBITS") print substr($i, 7), $(i + 4) }' |
    while read -r name size; do printf '%6d  %s\n' $((16#$size / 16)) "$(c++filt "$name" | sed 's/(.*//')"; done |
    grep -E -- "${2:-.}" | sort -rn
