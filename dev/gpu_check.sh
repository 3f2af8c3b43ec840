#!/usr/bin/env bash
# The GPU checks, on a machine with a GPU, from the repository root, over what dev/gpu_bundle.sh
# built (unpacked into build/gpu). Prints one table row per part as it finishes (part, PASS or
# FAIL, what it showed) and ends with "N passed, N failed"; every log goes into one archive,
# $OUT/gpu_check_logs.tar.gz (a temporary folder's when OUT is unset), brought up to date after
# every part. Every part has a time limit, and all of them a deadline, so a hang (NCCL's start,
# say) costs that part only. No GPU is a failure, and every run names --device cuda: nothing
# passes on the CPU alone.
# Parts, in order of what they cost to lose:
#   device        nvidia-smi lists a GPU
#   reference     the PyTorch reference (test/reference.py) into build/ref
#   cuda_parity   test_gpt_cuda: forward, gradients, statistics, AdamW against the reference, for
#                 the QK-norm variants, a frozen set, the Qwen3 and Llama shapes, determinism and
#                 gradient accumulation (its PASS and FAIL lines counted), and passes replayed from
#                 CUDA graphs against the same passes run directly. ./train and test_gpt_cuda run here
#                 with cuDNN from PyTorch's wheels (gpu_env.sh's with_cudnn), as ./train's attention is
#                 cuDNN's where libcudnn.so.9 loads
#   cuda_parity_candidates  the same with the candidate kernels (kCandidateKernels) in place of the
#                 defaults, where the bundle holds them (dev/gpu_bundle.sh builds them when a kernel is one)
#   dev_*         every dev/cuda kernel check against its CPU reference (likewise), and cuDNN's fused
#                 attention against ./train's (dev_cudnn_attention, cuDNN from PyTorch's wheels)
#   d6 runs       training with statistics, validation, checkpoints and samples, a resume that must give the
#                 same losses bit for bit, a run from the final weights (-e), a measurement of
#                 them, the QK-norm variants, 4 micro-batches against the CPU, the NCCL path
#   python        transformers and tokenizers against the import, the export and the BPE
#                 tokenizer (pytest: test_hf_import, test_export_hf, test_bpe); host code only,
#                 left out with CHECK_SKIP_PYTHON=1
#   d22           50 steps of the reports' model at 4 x 2048 with a resume from step 25, and a
#                 measurement of its final weights on the GPU and on the CPU: statistics within 1%
# CHECK_PARTS names the parts to run (default all; the device is always checked): any of reference,
# cuda_parity, cuda_parity_candidates, dev (every dev_*) or a dev_<name>, d6, python, d22. The
# parity parts need the reference (made by its part, or by an earlier run into build/ref).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # build/gpu/check.sh or dev/gpu_check.sh: to the repository root
logs=$(mktemp -d)
runs=$(mktemp -d)
archive=${OUT:-$(mktemp -d)}/gpu_check_logs.tar.gz
# Every part ends by this many seconds from the start (CHECK_SECONDS, default 560: a device call
# of 600 s with time to spare), so the table and the archive come back whatever hangs.
deadline=$((SECONDS + ${CHECK_SECONDS:-560}))
export PYTHONUNBUFFERED=1
passed=0
failed=0
pack() { tar -czf "$archive.part" -C "$logs" . && mv "$archive.part" "$archive"; }
trap pack EXIT
trap 'echo "stopped"; exit 1' INT TERM

row() {  # part, status (0: pass), what it showed; the archive brought up to date
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    printf '%-26s %-4s %s\n' "$1" "$([ "$2" -eq 0 ] && echo PASS || echo FAIL)" "$3"
    pack
}
limited() {  # seconds, log name, command...: the command's status, 124 when it ran out of time (its
    # own limit or the deadline's); in the foreground, so that Ctrl-C reaches it
    local seconds=$1 name=$2 left=$((deadline - SECONDS))
    shift 2
    [ "$left" -lt "$seconds" ] && seconds=$left
    if [ "$seconds" -le 0 ]; then
        echo "not run: no time left before the deadline" >"$logs/$name.log"
        return 124
    fi
    timeout --foreground --kill-after=10 "$seconds" "$@" >"$logs/$name.log" 2>&1
}
on_gpu() { ! grep -q "no CUDA device" "$logs/$1.log"; }
checks() {  # seconds, name, command...: a test program's PASS / FAIL lines as one row
    local seconds=$1 name=$2 status p f
    shift 2
    limited "$seconds" "$name" "$@"
    status=$?
    p=$(grep -c '^PASS ' "$logs/$name.log")
    f=$(grep -c '^FAIL ' "$logs/$name.log")
    if ! on_gpu "$name"; then row "$name" 1 "no CUDA device"; return; fi
    row "$name" $((status != 0 || f > 0 || p == 0)) "$p passed, $f failed, status $status"
    grep '^FAIL ' "$logs/$name.log" | head -5 | cut -c1-200 | sed 's/^/    /'
}
losses() { grep -E "^step +[0-9]+/" "$logs/$1.log" | cut -d'|' -f2 | tr -s ' '; }
loss_of_step() { grep -E "^step +$2/" "$logs/$1.log" | cut -d'|' -f2 | tr -dc '0-9.'; }
norm_of_step() { grep -E "^step +$2/" "$logs/$1.log" | cut -d'|' -f3 | tr -dc '0-9.'; }
# A run with a checkpoint at step `at`, and a run resumed from that checkpoint with the same options
# but the preset (-m: the model comes from the checkpoint): run_status, and resumed_same 1 when the
# resumed run's losses (as printed) are the first run's after step `at`.
run_and_resume() {  # name, seconds, at, train options...
    local name=$1 seconds=$2 at=$3 after resume=()
    shift 3
    limited "$seconds" "$name" "${with_cudnn[@]}" "$g/bin/train" "$@" --device cuda -n "$at" -o "$runs/$name"
    run_status=$?
    cp -r "$runs/$name" "$runs/${name}_b" 2>/dev/null && rm -f "$runs/${name}_b/model.ckpt"
    while [ $# -gt 0 ]; do
        if [ "$1" = -m ]; then shift 2; else resume+=("$1"); shift; fi
    done
    limited "$seconds" "${name}_resumed" "${with_cudnn[@]}" "$g/bin/train" "${resume[@]}" --device cuda -r "$(printf '%s_b/model_step%06d.ckpt' "$runs/$name" "$at")"
    run_status=$((run_status + $?))
    after=$(losses "$name" | tail -n +$((at + 1)))
    resumed_same=$([ -n "$after" ] && [ "$after" = "$(losses "${name}_resumed")" ] && echo 1 || echo 0)
}
part() {  # whether CHECK_PARTS asks for this part
    [ -z "${CHECK_PARTS:-}" ] || [[ " $CHECK_PARTS " == *" $1 "* ]] || { [[ $1 == dev_* ]] && [[ " $CHECK_PARTS " == *" dev "* ]]; }
}
within() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= tol) }'; }
relative_within() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b > 0 && d <= tol * b) }'; }

# -- device, reference, parity, kernels ----------------------------------------------------------------
gpus=$(nvidia-smi -L 2>&1)
if ! grep -q '^GPU ' <<<"$gpus"; then
    row device 1 "no GPU: $(head -1 <<<"$gpus")"
    echo "$passed passed, $failed failed"
    exit 1
fi
row device 0 "$(head -1 <<<"$gpus" | cut -c1-80); $(cat "$g/COMMIT" 2>/dev/null || echo 'commit unknown')"
for name in ${CHECK_PARTS:-}; do  # a name that is no part would otherwise leave the parts it meant unrun, silently
    case " reference cuda_parity cuda_parity_candidates dev d6 python d22 " in *" $name "*) continue ;; esac
    [ -x "$g/bin/$name" ] && [[ $name == dev_* ]] && continue
    row "$name" 1 "CHECK_PARTS names no such part"
done
if part reference; then
    limited 600 reference env PYTHONPATH=scripts "$py" test/reference.py --out build/ref
    row reference $? "$(tail -1 "$logs/reference.log" | cut -c1-120)"
fi
part cuda_parity && checks 600 cuda_parity "${with_cudnn[@]}" "$g/bin/test_gpt_cuda" build/ref
part cuda_parity_candidates && [ -x "$g/bin/test_gpt_cuda_candidates" ] && checks 600 cuda_parity_candidates "${with_cudnn[@]}" "$g/bin/test_gpt_cuda_candidates" build/ref
for k in "$g"/bin/dev_*; do
    name=$(basename "$k")
    prefix=()  # the wheels' libraries only for the program that loads cuDNN (gpu_env.sh), with
    # cuDNN's own log of its warnings and errors (why an engine refuses a graph) in the archive
    [ "$name" = dev_cudnn_attention ] &&
        prefix=("${with_cudnn[@]}" CUDNN_LOGLEVEL_DBG=2 "CUDNN_LOGDEST_DBG=$logs/cudnn_debug.log")
    part "$name" && checks 300 "$name" "${prefix[@]}" "$k"
    [ "$name" = dev_cudnn_attention ] && [ -e "$logs/cudnn_debug.log" ] && truncate -s '<2M' "$logs/cudnn_debug.log" &&
        pack  # its first 2 MB
done

# -- d6 training runs on the GPU --------------------------------------------------------------------
data=(-i "$g/data/train_*.bin" -j "$g/data/val_*.bin" -k "$g/data/tokenizer.model")
common=("${data[@]}" -x 30 -s 3 -v 10 -g 16)
if part d6; then
    run_and_resume train_a 300 20 "${common[@]}"
    samples=$(grep -c '^  > ' "$logs/train_a.log")  # sampled from the GPU's logits at the end
    row "d6 train, resume" $((run_status != 0 || resumed_same != 1 || samples == 0)) \
        "loss $(loss_of_step train_a 1) -> $(loss_of_step train_a 30), $samples samples; resumed steps 21-30 $([ "$resumed_same" = 1 ] && echo identical || echo DIFFER)"
    cp "$runs/train_a/model.ckpt" "$runs/train_a_before.ckpt" 2>/dev/null
    limited 300 train_init "${with_cudnn[@]}" "$g/bin/train" "${common[@]}" --device cuda -e "$runs/train_a/model.ckpt" -x 5 -o "$runs/c"
    status_c=$?
    # A measurement of run a's final weights: its first batch is step 1 of run c (-e from the same
    # weights) before that run's first update, the same loss; the checkpoint stays as it was.
    limited 300 measure "${with_cudnn[@]}" "$g/bin/train" -i "$g/data/train_*.bin" -k "$g/data/tokenizer.model" -g 0 --device cuda \
        -e "$runs/train_a/model.ckpt" --measure 3 -o "$runs/measure"
    status_m=$?
    measured=$(grep -E '^batch 1/3' "$logs/measure.log" | cut -d'|' -f2 | tr -dc '0-9.')
    ok=$([ "$status_c$status_m" = 00 ] && [ -n "$measured" ] && [ "$measured" = "$(loss_of_step train_init 1)" ] &&
        cmp -s "$runs/train_a/model.ckpt" "$runs/train_a_before.ckpt" && echo 0 || echo 1)
    row "d6 -e, measure" "$ok" "batch 1 of the measurement $measured, step 1 of -e $(loss_of_step train_init 1)"
    for variant in "--qk-norm plain" "--qk-norm none" "--freeze k_gain"; do
        name=train_$(echo "$variant" | tr -dc 'a-z_')
        # shellcheck disable=SC2086  # the variant is two words
        limited 300 "$name" "${with_cudnn[@]}" "$g/bin/train" "${common[@]}" $variant --device cuda -g 0 -o "$runs/$name"
        status=$?
        first=$(loss_of_step "$name" 1)
        final=$(loss_of_step "$name" 30)
        falls=$(awk -v a="$first" -v b="$final" 'BEGIN { print (b != "" && b + 0 < a + 0) ? 0 : 1 }')
        row "d6 $variant" $((status != 0 || falls != 0)) "loss $first -> $final"
    done
    # Four micro-batches a step (-b 4, -d 4096: the 1/4 scale, the added gradients) against the CPU
    # backend on the same batches: losses within 0.02 (bf16's ~0.005 and the drift of three steps)
    # and gradient norms within 5%.
    accum=("${data[@]}" -x 3 -b 4 -d 4096 -v 0 -g 0 -n 0)
    limited 300 accum_gpu "${with_cudnn[@]}" "$g/bin/train" "${accum[@]}" --device cuda -o "$runs/accum_gpu"
    status_g=$?
    limited 300 accum_cpu "$g/bin/train" "${accum[@]}" --device cpu -o "$runs/accum_cpu"
    status_c=$?
    ok=$((status_g + status_c))
    for step in 1 2 3; do
        within "$(loss_of_step accum_gpu $step)" "$(loss_of_step accum_cpu $step)" 0.02 || ok=1
        relative_within "$(norm_of_step accum_gpu $step)" "$(norm_of_step accum_cpu $step)" 0.05 || ok=1
    done
    row "d6 4 micro-batches" $((ok != 0)) "GPU loss $(loss_of_step accum_gpu 3) norm $(norm_of_step accum_gpu 3), CPU $(loss_of_step accum_cpu 3) $(norm_of_step accum_cpu 3) at step 3"
    # The NCCL path with one process (TRAIN_NCCL=1: a communicator of one GPU; NCCL refuses two
    # processes on one GPU): the same losses and gradient norms, and the same weights and AdamW state
    # in the final checkpoint, bit for bit, as run a. libnccl.so.2 from the system, else from PyTorch's wheels.
    nccl_lib=$( (ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}'
                 "$py" -c 'import glob, site; print(*glob.glob(site.getsitepackages()[0] + "/nvidia/nccl*/lib/libnccl.so.2")[:1])' 2>/dev/null) | head -1)
    if [ -z "$nccl_lib" ]; then
        row "d6 nccl" 1 "no libnccl.so.2 on this machine"
    else
        # cuDNN's folder too (gpu_env.sh's with_cudnn), as the run it must match had it
        limited 300 train_nccl env LD_LIBRARY_PATH="$(dirname "$nccl_lib"):$LD_LIBRARY_PATH${wheel_libs:+:$wheel_libs}" \
            TRAIN_NCCL=1 "$g/bin/train" "${common[@]}" --device cuda -n 20 -o "$runs/nccl"
        status=$?
        steps_of() { grep -E '^step ' "$logs/$1.log" | cut -d'|' -f1-3; }
        ok=$([ "$status" -eq 0 ] && [ -n "$(steps_of train_nccl)" ] && [ "$(steps_of train_a)" = "$(steps_of train_nccl)" ] &&
            cmp -s -i 256 "$runs/train_a/model.ckpt" "$runs/nccl/model.ckpt" && echo 0 || echo 1)  # past the header (run ids)
        row "d6 nccl" "$ok" "status $status; losses, norms, checkpoint $([ "$ok" = 0 ] && echo identical to run a || echo DIFFER)"
    fi
fi

# -- transformers and tokenizers (the machine's python has them) ---------------------------------------
# CHECK_SKIP_PYTHON=1 leaves this part out (host code only: the import, the export, the tokenizer),
# for a device call that needs its time for the GPU's own parts.
if part python && [ "${CHECK_SKIP_PYTHON:-0}" = 1 ]; then
    echo "transformers, tokenizers   not run (CHECK_SKIP_PYTHON=1)"
elif part python; then
    limited 900 python env HF_LOGITS_BIN="$g/bin/hf_logits" TRAIN_BIN="$g/bin/train" PYTHONPATH=scripts:test \
        "$py" -m pytest -q -p no:cacheprovider test/test_hf_import.py test/test_export_hf.py test/test_bpe.py \
        -k "transformers or tokenizers_library"
    status=$?
    summary=$(grep -E ' in [0-9.]+s' "$logs/python.log" | tail -1 | tr -d '=')
    skipped=$(grep -cE 'SKIPPED|skipped' "$logs/python.log")
    row "transformers, tokenizers" $((status != 0 || skipped != 0)) "${summary:-no summary} (pytest status $status)"
    grep -E '^(FAILED|ERROR)' "$logs/python.log" | head -5 | cut -c1-200 | sed 's/^/    /'
fi

# -- d22 at the reports' scale ----------------------------------------------------------------------------
if part d22; then
    d22=("${data[@]}" -m d22 -b 4 -t 2048 -x 50 -v 0 -g 10)
    run_and_resume d22 600 25 "${d22[@]}"
    ms=$(grep -E '^step +50/50' "$logs/d22.log" | cut -d'|' -f5 | tr -s ' ')
    row "d22 4x2048, resume" $((run_status != 0 || resumed_same != 1)) \
        "loss $(loss_of_step d22 1) -> $(loss_of_step d22 50),${ms:- no step 50}; resumed steps 26-50 $([ "$resumed_same" = 1 ] && echo identical || echo DIFFER)"
    measure=(-i "$g/data/val_*.bin" -k "$g/data/tokenizer.model" -b 4 -t 2048 -e "$runs/d22/model.ckpt" --measure 2)
    limited 300 d22_measure_gpu "${with_cudnn[@]}" "$g/bin/train" "${measure[@]}" --device cuda -o "$runs/m_gpu"
    status_g=$?
    limited 600 d22_measure_cpu "$g/bin/train" "${measure[@]}" --device cpu -o "$runs/m_cpu"
    status_c=$?
    limited 120 d22_stats "$py" dev/compare_stats.py "$runs/m_gpu/run.attnlog" "$runs/m_cpu/run.attnlog"
    status=$?
    row "d22 statistics GPU vs CPU" $((status_g + status_c + status != 0)) "$(tail -1 "$logs/d22_stats.log")"
    grep -E '^FAIL' "$logs/d22_stats.log" | head -8 | sed 's/^/    /'
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
