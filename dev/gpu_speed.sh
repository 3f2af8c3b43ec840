#!/usr/bin/env bash
# The short speed check of a GPU machine, over what dev/gpu_bundle.sh built (unpacked into
# build/gpu), from the repository root; cheap enough to follow build/gpu/check.sh in one device call.
# Prints one line per run: ./train on the reports' model (d22) at 8 x 2048 and 4 x 2048
# (SPEED_BATCHES) with the statistics never, every 10 steps and every step (mean ms of steps 22 .. 51
# of 53, from the run's log, and the final loss), each followed by the same run of
# train_candidates (the candidate kernels in place of the defaults) when the bundle has them and
# SPEED_CANDIDATE_STATS (default "0 10 1") names the statistics' interval. Then, at the first of
# SPEED_BATCHES, one more run of ./train with statistics every 10 steps (and of train_candidates
# with statistics every step), its passes run directly (TRAIN_CUDA_GRAPH=0) where it replays them
# from CUDA graphs: its time, and whether its losses, gradient norms and statistics are the run's
# with graphs, bit for bit. Then train_candidates with each cuDNN setting of SPEED_CUDNN (which
# gpu_session.sh takes from dev_cudnn_attention --engines), then with each candidate turned off in
# turn (SPEED_CANDIDATES_OFF, below). Then, while SPEED_SECONDS (default 150)
# last, PyTorch's torch.compile recipe of scripts/bench.py at each of SPEED_TORCH_BATCHES (default 8)
# x 2048 with the reports' statistics every 10 steps and never (one process: it compiles the step
# with and without statistics once a shape, a minute or more). Last, the phases of one run of
# ./train at each of SPEED_BATCHES and of train_candidates at the first, statistics every 10 steps,
# and the device's time per kind of work in its steps with and without statistics (--profile 2). Every run's printed output goes into
# OUT/gpu_speed_logs.tar.gz. Both builds run with the wheels' libraries on the path (gpu_env.sh's
# with_cudnn: they load cuDNN from there), so that they use the same ones. The first ./train run's
# lines of what runs its attention (cuDNN's kernels, or why not) and of what tuning its matrix
# products' algorithms did are printed. scripts/bench.py gpu is the full benchmark; this is its part
# that fits what is left of a device call. Before all of it, a short run of train_candidates: a
# candidate that ends that build's runs is turned off in every run (printed), so that the others
# are still timed.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
deadline=$((SECONDS + ${SPEED_SECONDS:-150}))
runs=$(mktemp -d)
data=(-i "$g/data/train_*.bin" -j "$g/data/val_*.bin" -k "$g/data/tokenizer.model" -v 0 -g 0 -n 0)
mean_ms() {  # a run's log (53 steps): the mean ms of steps 22 .. 51, which take statistics at 30, 40 and 50
    # with -s 10, a tenth of them, as torch.compile's 32 steps below time theirs (./train's last step,
    # which takes statistics too, left out). A pass's CUDA graph is captured the second time the pass
    # runs: a pass with statistics from its graph (train_candidates) at step 20 with -s 10, a cost paid
    # once, as torch.compile's compilation is (left out of its times); the window starts after it.
    PYTHONPATH=scripts "$py" -c 'import sys, attnlog, statistics
_, ms = attnlog.open_log(sys.argv[1]).scalars("ms")
print(f"{statistics.mean(float(x) for x in ms[22:52]):.2f}")' "$1"
}
final_loss() {  # a run's log: its last step's loss (./train_candidates must train as ./train does)
    PYTHONPATH=scripts "$py" -c 'import sys, attnlog
_, loss = attnlog.open_log(sys.argv[1]).scalars("loss")
print("%.4f" % float(loss[-1]))' "$1"
}
same_bits() {  # two runs' logs: whether every step's loss, gradient norm and statistics are the same bits
    PYTHONPATH=scripts "$py" -c 'import sys, attnlog
a, b = (attnlog.open_log(p) for p in sys.argv[1:])
same = all(a.scalars(k)[1].tobytes() == b.scalars(k)[1].tobytes() for k in ("loss", "grad_norm"))
stats = all(a.metric(k)[1].tobytes() == b.metric(k)[1].tobytes() for k in a.metric_names())
print("the same losses, norms and statistics, bit for bit" if same and stats else
      ("LOSSES OR NORMS DIFFER" if not same else "STATISTICS DIFFER"))' "$1" "$2" 2>&1 ||
        echo "the comparison FAILED"
}
run_d22() {  # name, binary, B, statistics every, then env's assignments: a 53-step d22 run into $runs/name
    local name=$1 binary=$2 B=$3 every=$4
    shift 4
    timeout 60 env "$@" "${with_cudnn[@]}" CUDNN_LOGLEVEL_DBG=2 "CUDNN_LOGDEST_DBG=$runs/$name.cudnn.log" \
        "$g/bin/$binary" "${data[@]}" -m d22 -b "$B" -t 2048 -x 53 -s "$every" --device cuda -o "$runs/$name" \
        >"$runs/$name.log" 2>&1
}
echo "speed, d22 ($(cat "$g/COMMIT" 2>/dev/null)): ms/step, mean of steps 22-51 (from 0)"
# A candidate that ends train_candidates' runs (a call the device refuses) would cost every timing of
# that build: a short run first (d22 at 1 x 2048, its passes captured as graphs and replayed,
# statistics every other step), and should it fail, the same with each candidate off in turn; the
# first that runs is turned off for every run below (TRAIN_CANDIDATES_OFF, added to those the runs
# that time one candidate's share turn off).
smoke() { run_d22 smoke train_candidates 1 2 "$@"; }  # env's assignments
if [ -x "$g/bin/train_candidates" ] && ! smoke; then
    echo "  ./train_candidates, d22 at 1 x 2048: a short run FAILED: $(tail -1 "$runs/smoke.log" | cut -c1-150)"
    for name in adamw_beside stats_pass_graph stats_deferred grads_beside query_norms qk_forward_ahead adamw_tiles \
        stats_rows_plain stats_rows_wgmma embedding_ahead gram_dmma gram_key_records gram_from_projection; do
        smoke "TRAIN_CANDIDATES_OFF=${TRAIN_CANDIDATES_OFF:+$TRAIN_CANDIDATES_OFF,}$name" || continue
        export TRAIN_CANDIDATES_OFF=${TRAIN_CANDIDATES_OFF:+$TRAIN_CANDIDATES_OFF,}$name
        echo "  ./train_candidates runs without $name: turned off in every run below"
        break
    done
fi
# Both builds run with the wheels' folders on the path, where a CUDA 13 wheel's cuBLAS comes before
# the machine's: the one they load (gpu_check.sh's parity runs load the machine's)
echo "  cuBLASLt: $("${with_cudnn[@]}" ldd "$g/bin/train" 2>/dev/null | awk '/libcublasLt/ {print $3}')"
for B in ${SPEED_BATCHES:-8 4}; do
    for every in 0 10 1; do
        for binary in train train_candidates; do
            [ "$binary" = train ] || { [ -x "$g/bin/$binary" ] && [[ " ${SPEED_CANDIDATE_STATS:-0 10 1} " == *" $every "* ]]; } ||
                continue
            name=d22_b${B}_s${every}_$binary
            if run_d22 "$name" "$binary" "$B" "$every"; then
                touch "$runs/$name.ok"
                # every candidate is meant to give ./train's bits, the statistics of stats_rows_wgmma
                # and gram_dmma aside (other instructions' sums may round otherwise, and with
                # gram_dmma gram_key_records sums the key records in another order: "STATISTICS
                # DIFFER" can be that; the run without the first two, below, is compared with
                # ./train's too): the whole run says whether they do
                against="" train_run=$runs/d22_b${B}_s${every}_train
                if [ "$binary" != train ] && [ -e "$train_run.ok" ]; then
                    against=", against ./train: $(same_bits "$train_run/run.attnlog" "$runs/$name/run.attnlog")"
                fi
                printf '  %-18s %d x 2048, statistics every %-2s %s ms, final loss %s%s\n' "./$binary" "$B" "$every" \
                    "$(mean_ms "$runs/$name/run.attnlog")" "$(final_loss "$runs/$name/run.attnlog")" "$against"
            else
                printf '  %-18s %d x 2048, statistics every %-2s FAILED: %s\n' "./$binary" "$B" "$every" \
                    "$(tail -1 "$runs/$name.log" | cut -c1-150)"
            fi
            if [ -z "${attention_said:-}" ]; then
                grep -E '^(attention|cuBLASLt algorithms tuned)' "$runs/$name.log" | cut -c1-200 | sed 's/^/    /'
                attention_said=1
            fi
        done
    done
done
# A build with its passes run directly (TRAIN_CUDA_GRAPH=0), beside the same run replaying them from
# CUDA graphs (the same binary, command and cuDNN log settings): the time, and whether every step's
# loss, gradient norm and statistics are the same bits. ./train at statistics every 10 steps, and
# train_candidates, where the bundle has it, at statistics every step (its passes with statistics
# come from a graph too where their statistics are not deferred). The window (steps 22-51) of a run with graphs starts after the steps that
# capture the passes' graphs (a cost of milliseconds once).
B=${SPEED_BATCHES:-8}
B=${B%% *}
for direct in train:10 train_candidates:1; do
    binary=${direct%:*} every=${direct#*:}
    name=d22_b${B}_s${every}_$binary
    [ -e "$runs/$name.ok" ] || continue
    if run_d22 "${name}_direct" "$binary" "$B" "$every" TRAIN_CUDA_GRAPH=0; then
        same=$(same_bits "$runs/$name/run.attnlog" "$runs/${name}_direct/run.attnlog")
        printf '  %-18s %d x 2048, statistics every %-2s %s ms without CUDA graphs: %s\n' "./$binary" "$B" "$every" \
            "$(mean_ms "$runs/${name}_direct/run.attnlog")" "$same"
    else
        printf '  %-18s %d x 2048, statistics every %-2s without CUDA graphs FAILED: %s\n' "./$binary" "$B" "$every" \
            "$(tail -1 "$runs/${name}_direct.log" | cut -c1-150)"
    fi
    grep -E '^CUDA graphs' "$runs/$name.log" | cut -c1-200 | sed 's/^/    /'
done
# cuDNN settings that dev_cudnn_attention --engines found faster (SPEED_CUDNN: assignments of
# TRAIN_CUDNN_FORWARD or TRAIN_CUDNN_BACKWARD, which the candidate build takes), each in whole steps:
# train_candidates at the first batch size, statistics every 10 steps, against the same run with
# the heuristics' plans (other kernels: other bits, the final loss says whether it trains alike).
for setting in ${SPEED_CUDNN:-}; do
    all=d22_b${B}_s10_train_candidates
    [ -e "$runs/$all.ok" ] && [ $((deadline - SECONDS)) -gt 150 ] || continue
    name=${all}_${setting%%=*}
    if run_d22 "$name" train_candidates "$B" 10 "$setting"; then
        printf '  %-18s %d x 2048, statistics every 10 %s ms with %s (%s ms with the heuristics'"'"' plans), final loss %s (%s)\n' \
            ./train_candidates "$B" "$(mean_ms "$runs/$name/run.attnlog")" "$setting" "$(mean_ms "$runs/$all/run.attnlog")" \
            "$(final_loss "$runs/$name/run.attnlog")" "$(final_loss "$runs/$all/run.attnlog")"
        grep -E '^attention' "$runs/$name.log" | cut -c1-250 | sed 's/^/    /'
    else
        printf '  %-18s %d x 2048, statistics every 10 with %s FAILED: %s\n' ./train_candidates "$B" "$setting" \
            "$(tail -1 "$runs/$name.log" | cut -c1-150)"
    fi
done
# Each candidate's share: train_candidates with one candidate turned off (TRAIN_CANDIDATES_OFF,
# cuda_common.cuh's candidate_on), at the statistics' interval and batch where it is meant to
# count, against the same run with all of them (SPEED_CANDIDATES_OFF: name:every:B, default below,
# a name that may be several separated by commas; each while more than 90 s are left, for
# torch.compile after them). A pass whose statistics are deferred (stats_deferred) is not captured
# as a graph, so stats_pass_graph's share is the run without both against the run without the first.
for entry in ${SPEED_CANDIDATES_OFF-adamw_beside:10:8 grads_beside:10:8 stats_deferred:1:8 query_norms:1:8 \
    stats_deferred:1:4 stats_deferred,stats_pass_graph:1:4 adamw_beside:10:4 adamw_tiles:10:4 stats_rows_plain:1:8 \
    stats_rows_wgmma,gram_dmma:1:8 gram_dmma:1:8 gram_key_records:1:8 gram_from_projection:1:8}; do
    IFS=: read -r off every B <<<"$entry"
    all=d22_b${B}_s${every}_train_candidates
    [ -e "$runs/$all.ok" ] && [ $((deadline - SECONDS)) -gt 90 ] || continue
    if run_d22 "${all}_without_$off" train_candidates "$B" "$every" \
        "TRAIN_CANDIDATES_OFF=${TRAIN_CANDIDATES_OFF:+$TRAIN_CANDIDATES_OFF,}$off"; then
        against=""  # without stats_rows_wgmma and gram_dmma every candidate is meant to give ./train's bits
        train_run=$runs/d22_b${B}_s${every}_train
        if [ "$off" = stats_rows_wgmma,gram_dmma ] && [ -e "$train_run.ok" ]; then
            against=", against ./train: $(same_bits "$train_run/run.attnlog" "$runs/${all}_without_$off/run.attnlog")"
        fi
        printf '  %-18s %d x 2048, statistics every %-2s %s ms without %s (%s ms with every candidate): %s%s\n' \
            ./train_candidates "$B" "$every" "$(mean_ms "$runs/${all}_without_$off/run.attnlog")" "$off" \
            "$(mean_ms "$runs/$all/run.attnlog")" "$(same_bits "$runs/$all/run.attnlog" "$runs/${all}_without_$off/run.attnlog")" \
            "$against"
    else
        printf '  %-18s %d x 2048, statistics every %-2s without %s FAILED: %s\n' ./train_candidates "$B" "$every" "$off" \
            "$(tail -1 "$runs/${all}_without_$off.log" | cut -c1-150)"
    fi
done
left=$((deadline - SECONDS))
if [ "$left" -gt 20 ]; then  # one process, one compilation: every 10 steps (the goal's comparison) first
    # shellcheck disable=SC2086  # the batch sizes are words
    timeout "$left" env PYTHONPATH=scripts PYTHONUNBUFFERED=1 "$py" -c 'import sys, types, attnlog, bench, torch
args = types.SimpleNamespace(warmup=2)
config = attnlog.open_log(sys.argv[1]).config
for B in map(int, sys.argv[2:]):
    print(f"torch.compile {B} x 2048: compiling and timing", flush=True)
    name = f"  PyTorch {torch.__version__} torch.compile {B} x 2048, statistics every"
    report = lambda every, ms: print(f"{name} {every:<2} {ms:.2f} ms")
    if bench.bench_torch_gpu(args, config, B, 2048, 32, True, [10, 0], report) is None:
        print(f"{name} 10 and 0: needs PyTorch >= 2.5 with CUDA")' "$runs/d22_b8_s0_train/run.attnlog" \
        ${SPEED_TORCH_BATCHES:-8} >"$runs/torch_compile.log" 2>&1
    status=$?
    grep '^  PyTorch' "$runs/torch_compile.log"
    [ "$status" -ne 124 ] || echo "  torch.compile: stopped after ${left} s, at: $(tail -1 "$runs/torch_compile.log" | cut -c1-150)"
    [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || echo "  torch.compile FAILED: $(tail -1 "$runs/torch_compile.log" | cut -c1-150)"
else
    echo "  torch.compile: no time left"
fi
first_batch=${SPEED_BATCHES:-8}
first_batch=${first_batch%% *}
for B in ${SPEED_BATCHES:-8 4}; do
    for binary in train train_candidates; do  # the candidates at the first batch size
        [ "$binary" = train ] || { [ -x "$g/bin/$binary" ] && [ "$B" = "$first_batch" ]; } || continue
        echo "  ./$binary, d22 $B x 2048, statistics every 10 steps, --profile 2:"
        timeout 60 "${with_cudnn[@]}" "$g/bin/$binary" "${data[@]}" -m d22 -b "$B" -t 2048 -x 30 -s 10 --profile 2 \
            --device cuda -o "$runs/profile_b${B}_$binary" 2>&1 | tee "$runs/profile_b${B}_$binary.log" |
            sed -n '/^profile/,/^  sum/p' | sed 's/^/  /'
    done
done
# every run's printed output, for what a table line leaves out (no checkpoints, no logs of the runs;
# cuDNN's warnings and errors in each run's .cudnn.log, at most its first 2 MB)
for f in "$runs"/*.cudnn.log; do [ -e "$f" ] && truncate -s '<2M' "$f"; done
tar -czf "${OUT:-/tmp}/gpu_speed_logs.tar.gz" -C "$runs" --exclude='*.ckpt' --exclude='*.attnlog' . 2>/dev/null
