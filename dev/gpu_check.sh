#!/usr/bin/env bash
# The GPU checks, on a machine with a GPU, from the repository root, over what dev/gpu_bundle.sh
# built: the PyTorch reference (made here), the CUDA parity test against it (with the determinism
# check), every
# dev/cuda kernel check, and short training runs of ./train through every path of its loop
# (statistics, validation, checkpoints, resume, -e) and with each QK-norm variant, a measurement
# (--measure), the NCCL path of a data-parallel run with one process, and the Hugging Face import
# against transformers' own Qwen3 and Llama. Prints a summary line per part and ends
# with "N passed, N failed" over the parity and kernel checks. Logs go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
g=build/gpu
logs=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH="$g/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi -L
PYTHONPATH=scripts "${PYTHON:-python3}" test/reference.py --out "$g/ref" || { echo "the PyTorch reference failed"; exit 1; }
passed=0
failed=0
run_checks() {  # name, command...: counts the PASS / FAIL lines of a test program
    local name=$1
    shift
    "$@" >"$logs/$name.log" 2>&1
    local status=$? p f
    p=$(grep -c '^PASS ' "$logs/$name.log")
    f=$(grep -c '^FAIL ' "$logs/$name.log")
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    echo "== $name: $p passed, $f failed (status $status)"
    grep '^FAIL ' "$logs/$name.log" | cut -c1-300
}
run_checks cuda_parity "$g/bin/test_gpt_cuda" "$g/ref"
for k in "$g"/bin/dev_*; do run_checks "$(basename "$k")" "$k"; done

# The training loop on the GPU: 30 steps of d6 with statistics, validation and checkpoints, a
# resume from the step-20 checkpoint that must reproduce the last 10 losses bit for bit, and a
# run started from the final weights with -e.
runs=$(mktemp -d)
common=(-i "$g/data/train_*.bin" -j "$g/data/val_*.bin" -k "$g/data/tokenizer.model" -x 30 -s 3 -v 10 -g 16)
train_ok=1
"$g/bin/train" "${common[@]}" -n 20 -o "$runs/a" >"$logs/train_a.log" 2>&1 || train_ok=0
cp -r "$runs/a" "$runs/b" && rm "$runs/b/model.ckpt"
"$g/bin/train" "${common[@]}" -r "$runs/b/model_step000020.ckpt" >"$logs/train_resumed.log" 2>&1 || train_ok=0
"$g/bin/train" "${common[@]}" -e "$runs/a/model.ckpt" -x 5 -o "$runs/c" >"$logs/train_init.log" 2>&1 || train_ok=0
tail -8 "$logs/train_a.log"
last_losses() { grep -E '^step (2[1-9]|30)/30' "$1" | cut -d'|' -f2; }
if [ "$train_ok" -eq 1 ] && [ -n "$(last_losses "$logs/train_a.log")" ] &&
    [ "$(last_losses "$logs/train_a.log")" = "$(last_losses "$logs/train_resumed.log")" ]; then
    echo "== training runs: ok; the resumed run's losses equal the uninterrupted run's"
    passed=$((passed + 1))
else
    echo "== training runs: FAILED (logs: train_a.log, train_resumed.log, train_init.log)"
    failed=$((failed + 1))
fi
# A measurement (--measure) of run a's final weights: forward passes with statistics on every batch,
# nothing trained. Its first batch is what step 1 of run c (-e from the same weights) computes before
# its first update, the same loss; the checkpoint stays as it was.
cp "$runs/a/model.ckpt" "$runs/a_before.ckpt"
"$g/bin/train" -i "$g/data/train_*.bin" -k "$g/data/tokenizer.model" -g 0 -e "$runs/a/model.ckpt" --measure 3 \
    -o "$runs/measure" >"$logs/measure.log" 2>&1
measure_status=$?
measured=$(grep -E '^batch 1/3' "$logs/measure.log" | cut -d'|' -f2)
if [ "$measure_status" -eq 0 ] && [ -n "$measured" ] && [ "$(grep -c '^batch ' "$logs/measure.log")" -eq 3 ] &&
    [ "$measured" = "$(grep -E '^step 1/5' "$logs/train_init.log" | cut -d'|' -f2)" ] &&
    cmp -s "$runs/a/model.ckpt" "$runs/a_before.ckpt" && [ -z "$(ls "$runs/measure" | grep -v '^run.attnlog$')" ]; then
    echo "== measurement: ok; batch 1 is step 1 of the run from the same weights, the checkpoint unchanged"
    passed=$((passed + 1))
else
    echo "== measurement: FAILED (status $measure_status; logs: measure.log, train_init.log)"
    tail -3 "$logs/measure.log"
    failed=$((failed + 1))
fi
# The QK-norm variants and frozen gains train on the GPU: 30 steps each, the loss falling.
variants_ok=1
for variant in "--qk-norm plain" "--qk-norm none" "--freeze k_gain"; do
    name=$(echo "$variant" | tr -d ' -')
    # shellcheck disable=SC2086  # the variant is two words
    "$g/bin/train" "${common[@]}" $variant -g 0 -o "$runs/$name" >"$logs/train_$name.log" 2>&1 || variants_ok=0
    first=$(grep -E '^step +1/30' "$logs/train_$name.log" | cut -d'|' -f2 | tr -dc '0-9.')
    final=$(grep -E '^step 30/30' "$logs/train_$name.log" | cut -d'|' -f2 | tr -dc '0-9.')
    echo "   $variant: loss $first -> $final"
    awk -v a="$first" -v b="$final" 'BEGIN { exit !(b != "" && b + 0 < a + 0) }' || variants_ok=0
done
if [ "$variants_ok" -eq 1 ]; then
    echo "== variant runs: ok"
    passed=$((passed + 1))
else
    echo "== variant runs: FAILED (logs: train_qknormplain.log, train_qknormnone.log, train_freezek_gain.log)"
    failed=$((failed + 1))
fi
# The NCCL path of a data-parallel run, with one process (TRAIN_NCCL=1: a communicator of one GPU;
# NCCL refuses two processes on one GPU): the same losses, gradient norms and final checkpoint,
# bit for bit, as the plain run a. libnccl.so.2 from the system, else from PyTorch's wheels.
nccl_lib=$( (ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}';
             "${PYTHON:-python3}" -c 'import glob, site; print(*glob.glob(site.getsitepackages()[0] + "/nvidia/nccl*/lib/libnccl.so.2")[:1])' 2>/dev/null) | head -1)
if [ -z "$nccl_lib" ]; then
    echo "== nccl path: not checked (no libnccl.so.2 on this machine)"
else
    LD_LIBRARY_PATH="$(dirname "$nccl_lib"):$LD_LIBRARY_PATH" TRAIN_NCCL=1 "$g/bin/train" "${common[@]}" -n 20 -o "$runs/nccl" \
        >"$logs/train_nccl.log" 2>&1
    nccl_status=$?
    steps_of() { grep -E '^step ' "$1" | cut -d'|' -f1-3; }
    if [ "$nccl_status" -eq 0 ] && [ "$(steps_of "$logs/train_a.log")" = "$(steps_of "$logs/train_nccl.log")" ] &&
        cmp -s "$runs/a/model.ckpt" "$runs/nccl/model.ckpt"; then
        echo "== nccl path ($nccl_lib): ok; losses, norms and the final checkpoint equal the plain run's bit for bit"
        passed=$((passed + 1))
    else
        echo "== nccl path: FAILED (status $nccl_status; logs: train_a.log, train_nccl.log)"
        tail -3 "$logs/train_nccl.log"
        failed=$((failed + 1))
    fi
fi
# The Hugging Face import against transformers itself (a GPU machine's python has it): tiny Qwen3
# and Llama models built by transformers from a config, saved, imported, their logits compared
# (test/test_hf_import.py; the import runs on the CPU backend).
if "${PYTHON:-python3}" -c 'import transformers, pytest' 2>/dev/null; then
    HF_LOGITS_BIN=$g/bin/hf_logits PYTHONPATH=scripts:test "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider \
        test/test_hf_import.py -k transformers >"$logs/hf_transformers.log" 2>&1
    hf_status=$?
    if [ "$hf_status" -eq 0 ] && grep -qE '^2 passed' "$logs/hf_transformers.log"; then
        echo "== transformers' Qwen3 and Llama: ok; the import gives their logits"
        passed=$((passed + 1))
    else
        echo "== transformers' Qwen3 and Llama: FAILED (log: hf_transformers.log)"
        tail -5 "$logs/hf_transformers.log"
        failed=$((failed + 1))
    fi
else
    echo "== transformers' Qwen3 and Llama: not checked (no transformers or pytest in ${PYTHON:-python3})"
fi
echo "$passed passed, $failed failed"
