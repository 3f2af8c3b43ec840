#!/usr/bin/env bash
# The two device calls of a lent GPU session, from the repository root, with build/gpu.tar.xz carried
# (dev/gpu_bundle.sh made it). Each call unpacks the bundle and makes the PyTorch reference where the
# machine lacks them: a machine left idle for 30 s goes back, and the next call gets a bare one.
#   bash dev/gpu_session.sh verify   the default build as a whole (the reference, cuda_parity; whether
#                                    ./train finds cuDNN with only its own libraries on the path), then,
#                                    if that passed and CONFIGS names configurations, runs of the
#                                    reports' experiment (dev/gpu_experiment.sh) in the time left
#   bash dev/gpu_session.sh speed    the candidates' parity (where the bundle has them), cuDNN's
#                                    attention and the norms', optimiser's, attention, telemetry and elementwise kernels' checks, every
#                                    algorithm cuBLASLt offers for the d22 products timed
#                                    (OUT/matmul_algorithms.txt), Nsight Compute on ./train's
#                                    statistics' and memory-bound kernels (OUT/ncu_memory_bound.txt),
#                                    cuDNN's engines for the d22 layer surveyed, every
#                                    setting of their knobs (OUT/cudnn_engines.txt), all while torch.compile compiles
#                                    the reports' recipe in the background; then
#                                    dev/gpu_speed.sh at 8 and 4 x 2048
# Each ends within SESSION_SECONDS; the tables print as they come, and all that the call prints is
# also kept in OUT/session_<verify|speed>.txt, whole where a terminal keeps only its end; the logs and
# the experiment's archives go into OUT. The two calls are sized for a machine held for 15 minutes
# (its start of a minute or two included) and commands of at most 10: verify defaults to 200 s (the
# checks alone) and speed to 580 s; give speed what is left, less 60 s, when that differs. CONFIGS
# and SEEDS pass to gpu_experiment.sh (the runs to make, those kept left out but a configuration's
# first, made again to be probed where its probes are not kept), with a SESSION_SECONDS that leaves
# them time (a d22 run takes about 75 s three at a time, its probes about 200 s more).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$SECONDS
case ${1:-} in verify) budget=${SESSION_SECONDS:-200} ;; *) budget=${SESSION_SECONDS:-580} ;; esac
case ${1:-} in
    verify | speed)  # everything printed, also into the file; tee waited for at the end, so that it is whole
        exec > >(tee "${OUT:-/tmp}/session_$1.txt") 2>&1
        tee_pid=$!
        trap 'exec >&- 2>&-; wait "$tee_pid"' EXIT
        ;;
esac
left() { echo $((budget - (SECONDS - start))); }
[ -x build/gpu/bin/train ] || python3 -m tarfile -e build/gpu.tar.xz build || { echo "no bundle: build/gpu.tar.xz"; exit 1; }
reference() { [ -e build/ref/debug_state.bin ] || echo reference; }
case ${1:-} in
    verify)
        if ! CHECK_PARTS="$(reference) cuda_parity" CHECK_SECONDS=$(( $(left) < 180 ? $(left) : 180 )) bash dev/gpu_check.sh; then
            echo "the experiment's runs not made: they must come from a build that passed its checks"
            exit 1
        fi
        # ./train with only the bundle's libraries on the path (not gpu_env.sh's with_cudnn): whether
        # it finds cuDNN on its own, the loader's or PyTorch's wheel's (dynamic_library.h); its line
        # of what runs the attention
        (source dev/gpu_env.sh && timeout 60 "$g/bin/train" -i "$g/data/train_*.bin" -k "$g/data/tokenizer.model" \
            -m d22 -b 1 -t 2048 -x 2 -v 0 -g 0 -n 0 --device cuda -o "$(mktemp -d)" 2>&1 |
            grep -E '^(attention|error)' | cut -c1-250 | sed 's|^|  ./train without the wheels on its path: |')
        # and whether a build on this machine would find cuDNN's and NCCL's headers in the wheels (Makefile)
        python3 -c 'import glob, site; print("  headers in the wheels:", ", ".join((glob.glob(site.getsitepackages()[0]
            + "/nvidia/" + h) or ["none: " + h])[0] for h in ("cudnn/include/cudnn_graph.h", "nccl/include/nccl.h")))' 2>&1 |
            cut -c1-300
        # The configurations CONFIGS names, each seed of SEEDS not kept in docs/runs/d22 yet, the
        # first run of each probed (its final checkpoint: the probes' outputs kept with the run)
        [ -n "${CONFIGS:-}" ] || exit 0
        CONFIGS=$CONFIGS SEEDS=${SEEDS:-7 42 1337} PROBES=${PROBES:-1} EXPERIMENT_SECONDS=$(left) bash dev/gpu_experiment.sh
        ;;
    speed)  # what decides the defaults first: the candidates' correctness and cuDNN's, then the times
        # torch.compile's compilation of the reports' recipe (minutes of the CPU: the step with and
        # without statistics, at each batch size gpu_speed.sh times, in its order) in the background
        # while the checks run, which time nothing on the host: the timed torch.compile of
        # gpu_speed.sh then finds its kernels in the inductor's cache. Waited for before any timing.
        # shellcheck disable=SC2086  # the batch sizes are words
        (source dev/gpu_env.sh && timeout 240 env PYTHONPATH=scripts "$py" -c 'import sys, types, attnlog, bench
for B in map(int, sys.argv[2:]):
    bench.bench_torch_gpu(types.SimpleNamespace(warmup=2), attnlog.open_log(sys.argv[1]).config, B, 2048, 3, True, [10])' \
            docs/runs/d22/gain_seed7/run.attnlog.xz ${SPEED_TORCH_BATCHES:-8 4} >"${OUT:-/tmp}/torch_compile_warm.txt" 2>&1) &
        warm=$!
        CHECK_PARTS="$(reference) cuda_parity_candidates dev_norms dev_optimizer dev_cudnn_attention dev_attention dev_telemetry dev_elementwise" \
            CHECK_SECONDS=$(( $(left) < 200 ? $(left) : 200 )) bash dev/gpu_check.sh
        # Every algorithm cuBLASLt offers for the d22 products, timed (OUT/matmul_algorithms.txt): whether
        # one that gives the first choice's bits is faster; and whether those the candidate may keep
        # (matmul_tune) give them on other data
        (source dev/gpu_env.sh && timeout 30 "$g/bin/dev_matmul" --algorithms >"${OUT:-/tmp}/matmul_algorithms.txt" 2>&1)
        echo "cuBLASLt's algorithms: status $?"
        grep -E "a step's matrix products|^FAIL|passed, [0-9]+ failed" "${OUT:-/tmp}/matmul_algorithms.txt" | cut -c1-250 |
            sed 's/^/  /'
        # Every engine configuration cuDNN's heuristics offer for the d22 layer at 8 x 2048, then every
        # engine at every setting of its knobs, timed, with its bits against ./train's plan's
        # (OUT/cudnn_engines.txt): whether a faster one gives the same bits twice. Up to 50 s, and
        # only while 360 s are left for what follows (the timings). Printed: ./train's plans, how
        # many settings of each engine made plans, and the fastest of each pass.
        survey=$(( $(left) - 360 < 50 ? $(left) - 360 : 50 ))
        if [ "$survey" -ge 10 ]; then
            (source dev/gpu_env.sh && timeout $((survey + 20)) "${with_cudnn[@]}" CUDNN_SURVEY_SECONDS=$survey \
                "$g/bin/dev_cudnn_attention" --engines >"${OUT:-/tmp}/cudnn_engines.txt" 2>&1)
            echo "cuDNN's engines: status $?"
            grep -E "^   (fastest|suggested|(forward|backward) +(\./train's plan|sweep, engine [0-9]+:))" \
                "${OUT:-/tmp}/cudnn_engines.txt" | cut -c1-200
            # the last (fastest) setting suggested for each pass, 3% faster than ./train's plan or more
            # and the same bits twice: gpu_speed.sh times train_candidates with it (TRAIN_CUDNN_FORWARD,
            # TRAIN_CUDNN_BACKWARD)
            SPEED_CUDNN=$(sed -n 's/^   suggested: \(TRAIN_CUDNN_[A-Z]*=[0-9:=,]*\) .*/\1/p' "${OUT:-/tmp}/cudnn_engines.txt" |
                tac | awk -F= '!seen[$1]++' | tr '\n' ' ')
            export SPEED_CUDNN
        else
            echo "cuDNN's engines: not surveyed, no time"
        fi
        # Nsight Compute's reading of ./train's kernels in a d22 step at 8 x 2048, one run of ./train
        # each (its passes run directly, its 26th launch of the kernel read), into
        # OUT/ncu_memory_bound.txt: what bounds them, for work without a GPU. First the statistics'
        # three largest (a step with statistics at 3-7 times their bound, docs/benchmarks.md; the
        # runs take statistics every step), then the memory-bound kernels not read before, then those
        # read at 0a29dbc. Within NCU_SECONDS (default 90), while the compilation lasts or more than
        # 400 s of the call are left.
        ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        ncu_end=$((SECONDS + ${NCU_SECONDS:-90}))
        for kernel in attention_row_stats_from_lse:1 gram_products_sym:1 head_row_stats_vec:1 rmsnorm_forward_vec:0 \
            qk_norm_rope_backward_vec:0 rmsnorm_backward_vec:0 qk_norm_rope_forward_vec:0; do
            [ -n "$ncu" ] && [ $((ncu_end - SECONDS)) -gt 20 ] && { kill -0 "$warm" 2>/dev/null || [ "$(left)" -gt 400 ]; } ||
                break
            (source dev/gpu_env.sh && timeout $((ncu_end - SECONDS)) "${with_cudnn[@]}" TRAIN_CUDA_GRAPH=0 "$ncu" \
                --clock-control none -k "regex:^${kernel%:*}_kernel" --launch-skip 25 --launch-count 1 \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
                "$g/bin/train" -i "$g/data/train_*.bin" -k "$g/data/tokenizer.model" -m d22 -b 8 -t 2048 -x 2 \
                -s "${kernel#*:}" -v 0 -g 0 -n 0 --device cuda -o "$(mktemp -d)" >>"${OUT:-/tmp}/ncu_memory_bound.txt" 2>&1)
            echo "ncu on ./train's ${kernel%:*}_kernel: status $?"
        done
        start_wait=$SECONDS
        wait "$warm"
        echo "torch.compile's compilation in the background: status $?, waited $((SECONDS - start_wait)) s"
        # its torch.compile runs within what is left but 75 s (its --profile runs)
        SPEED_BATCHES="8 4" SPEED_TORCH_BATCHES=${SPEED_TORCH_BATCHES:-8 4} SPEED_SECONDS=$(( $(left) - 75 )) \
            bash dev/gpu_speed.sh
        ;;
    *)
        echo "usage: bash dev/gpu_session.sh verify|speed" >&2
        exit 2
        ;;
esac
