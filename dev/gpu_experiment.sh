#!/usr/bin/env bash
# The research reports' experiment at their scale, on a GPU machine, over what dev/gpu_bundle.sh
# built (unpacked into build/gpu), from the repository root: the d22 model at 4 x 2048 tokens a step,
# 1000 steps, statistics every 10 steps, the default corpus, for each configuration and seed:
#   gain       --qk-norm gain (the default)          plain      --qk-norm plain
#   none       --qk-norm none                        decay_all  --decay all (the gains decayed too)
#   freeze_k   --freeze k_gain
# (CONFIGS, default all five in that order; SEEDS, default 1337 42 7), but those kept in the
# repository already (KEPT, default docs/runs/d22: a folder <configuration>_seed<N> with its log).
# A run takes about 40 s alone on an H200, a quarter of it on the host (reading the corpus, starting
# cuBLAS, writing the final checkpoint), so JOBS runs (default 2) share the GPU at a time, each filling the other's host time;
# each run gives the bits it would give alone, and its ms a step are those of a shared GPU. Runs
# start while EXPERIMENT_SECONDS (default 560) allow one more (RUN_SECONDS, default 60, the time of
# a run beside another; one may end up to RUN_SECONDS after EXPERIMENT_SECONDS, and a device call
# must allow for it), so one device call makes as many as fit; CONFIGS and SEEDS name the rest for
# the next call. Prints one row per run as it ends (configuration, seed, status, final loss,
# validation loss, median ms a step) and writes, per configuration once its runs have ended,
# $OUT/experiment_<configuration>.tar.xz: each run's folder
# with its log (run.attnlog), its printed output and a MANIFEST (the command, the commit, the
# device), without checkpoints (a d22 checkpoint with its AdamW state is about 0.9 GB). With PROBES
# (default 1) the final checkpoint of each configuration's first run made is probed (scripts/probe.py
# svd on the CPU, then ablate and sweep on the GPU; each within PROBE_SECONDS, default 240 (ablate
# took 161-163 s of an H200 three at a time), with the CPU's cores
# shared among the JOBS): their tables, figures and JSON go into the run's folder, probes/. A kept
# run is made again where it is a configuration's first seed and its probes are not all kept
# (probes/ablate.json): dev/keep_experiment.sh adds them to it when the losses are the kept run's.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
out=${OUT:-$(mktemp -d)}
deadline=$((SECONDS + ${EXPERIMENT_SECONDS:-560}))
per_run=${RUN_SECONDS:-60}
kept=${KEPT:-docs/runs/d22}  # the runs kept in the repository (dev/keep_experiment.sh), not made again
once() { tr ' ' '\n' <<<"$1" | awk 'NF && !seen[$0]++' | tr '\n' ' '; }  # each word once, in order
# each seed and configuration once (a repeat would run into its twin's folder)
read -r -a seeds <<<"$(once "${SEEDS:-1337 42 7}")"
read -r -a configs <<<"$(once "${CONFIGS:-gain plain none decay_all freeze_k}")"
runs=$(mktemp -d)
device=$(nvidia-smi -L 2>/dev/null | head -1)
commit=$(cat "$g/COMMIT" 2>/dev/null || echo 'commit unknown')

options_of() {  # a configuration's options
    case $1 in
        gain) echo "--qk-norm gain" ;;
        plain) echo "--qk-norm plain" ;;
        none) echo "--qk-norm none" ;;
        decay_all) echo "--decay all" ;;
        freeze_k) echo "--freeze k_gain" ;;
        *) return 1 ;;
    esac
}
summary() {  # a run's folder: final loss, validation loss and median ms a step, from its log
    PYTHONPATH=scripts "$py" -c 'import sys, statistics, attnlog
log = attnlog.open_log(sys.argv[1] + "/run.attnlog")
_, loss = log.scalars("loss")
_, ms = log.scalars("ms")
_, val = log.val_loss()
last_val = float(val[-1]) if len(val) else float("nan")
print(f"{float(loss[-1]):.4f} {last_val:.4f} {statistics.median(float(x) for x in ms[2:]):.1f}")' "$1" 2>/dev/null ||
        echo "- - -"
}

run_one() {  # configuration, seed, whether to probe its final checkpoint: the run, then its row
    local config=$1 seed=$2 probe=$3 name=${1}_seed$2 dir status loss val ms kind
    local -a command
    dir=$runs/$config/$name
    mkdir -p "$dir"
    # shellcheck disable=SC2046  # the options are words
    command=("$g/bin/train" -i "$g/data/train_*.bin" -j "$g/data/val_*.bin" -k "$g/data/tokenizer.model" -m d22 -b 4
             -t 2048 -x 1000 -s 10 --seed "$seed" $(options_of "$config") --device cuda -o "$dir")
    # with cuDNN from PyTorch's wheels (gpu_env.sh): ./train's attention where libcudnn.so.9 loads
    timeout --kill-after=10 $((per_run * 2)) "${with_cudnn[@]}" "${command[@]}" >"$dir/stdout.txt" 2>&1
    status=$?
    printf 'command: %s\ncommit: %s\ndevice: %s\nstatus: %d\nshared: %d runs at a time on the GPU\n' "${command[*]}" \
        "$commit" "$device" "$status" "$jobs" >"$dir/MANIFEST"
    if [ "$probe" = 1 ] && [ -e "$dir/model.ckpt" ]; then
        mkdir -p "$dir/probes"
        for kind in svd ablate sweep; do
            left=$((deadline - SECONDS - per_run))
            seconds=$(( left < ${PROBE_SECONDS:-240} ? left : ${PROBE_SECONDS:-240} ))
            [ "$seconds" -gt 10 ] || { echo "  probe $kind of $name: no time"; continue; }
            on=(); [ "$kind" = svd ] || on=(--device cuda)
            start=$SECONDS
            timeout --kill-after=10 "$seconds" env PYTHONPATH=scripts OMP_NUM_THREADS="$probe_threads" \
                "$py" scripts/probe.py "$kind" "$dir/model.ckpt" \
                --data "$g/data" "${on[@]}" --out "$dir/probes" --json "$dir/probes/$kind.json" \
                >"$dir/probes/$kind.txt" 2>&1
            echo "  probe $kind of $name: status $? in $((SECONDS - start)) s"
        done
    fi
    rm -f "$dir"/*.ckpt
    read -r loss val ms <<<"$(summary "$dir")"
    printf '%-10s %6s %-6s %10s %10s %8s\n' "$config" "$seed" "$([ "$status" -eq 0 ] && echo ok || echo "rc $status")" \
        "$loss" "$val" "$ms"
    touch "$dir/ENDED"
}
archive_ended() {  # each configuration whose runs were all started and have all ended, archived once
    local config made
    for config in "${!started[@]}"; do
        [ -n "${considered[$config]:-}" ] && [ -z "${archived[$config]:-}" ] || continue
        made=()
        for name in ${started[$config]}; do
            [ -e "$runs/$config/$name/ENDED" ] || continue 2
            made+=("$name")
        done
        (cd "$runs/$config" && "$py" -m tarfile -c "$out/experiment_$config.tar.xz" "${made[@]}")
        archived[$config]=1
    done
}

jobs=${JOBS:-2}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "JOBS must be a number of runs at a time, 1 or more, not '$jobs'" >&2; exit 2; }
# the CPU's threads shared by the probes that may run at once: PyTorch's small float64 products and
# SVDs slow down by orders of magnitude when several processes each take every core
probe_threads=$(( $(nproc) / jobs > 1 ? $(nproc) / jobs : 1 ))
declare -A started considered archived  # configuration: its runs' names; its seeds all gone through; archived
echo "d22, 4 x 2048, 1000 steps, statistics every 10 steps, $jobs runs at a time; $device; $commit"
printf '%-10s %6s %-6s %10s %10s %8s\n' configuration seed status "final loss" "val loss" "ms/step"
for config in "${configs[@]}"; do
    options_of "$config" >/dev/null || { echo "$config: not a configuration of this script"; continue; }
    for seed in "${seeds[@]}"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
            wait -n
            archive_ended
        done
        if [ $((deadline - SECONDS)) -lt "$per_run" ]; then
            printf '%-10s %6s %-6s\n' "$config" "$seed" "no time"
            continue
        fi
        probe=0
        [ "${PROBES:-1}" != 0 ] && [ -z "${started[$config]:-}" ] && probe=1  # the configuration's first run made
        # a kept run is made again only to be probed, where its probes are not all kept
        if [ -e "$kept/${config}_seed$seed/run.attnlog.xz" ] &&
            { [ "$probe" = 0 ] || [ -e "$kept/${config}_seed$seed/probes/ablate.json" ]; }; then
            printf '%-10s %6s %-6s\n' "$config" "$seed" "kept"
            continue
        fi
        started[$config]="${started[$config]:-} ${config}_seed$seed"
        run_one "$config" "$seed" "$probe" &
    done
    considered[$config]=1
done
while [ -n "$(jobs -rp)" ]; do  # each configuration archived as soon as its last run ends
    wait -n
    archive_ended
done
wait
archive_ended
ls -la "$out"/experiment_*.tar.xz 2>/dev/null | awk '{print "  " $NF ": " $5 " bytes"}'
