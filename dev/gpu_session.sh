#!/usr/bin/env bash
# The two device calls of a lent GPU session, from the repository root, with build/gpu.tar.xz carried
# (dev/gpu_bundle.sh made it). Each call unpacks the bundle and makes the PyTorch reference where the
# machine lacks them: a machine left idle for 30 s goes back, and the next call gets a bare one.
#   bash dev/gpu_session.sh verify   the default build as a whole (the reference, cuda_parity), then
#                                    the reports' experiment (dev/gpu_experiment.sh) in the time left
#   bash dev/gpu_session.sh speed    the candidates' parity and cuDNN's attention, dev/gpu_speed.sh at
#                                    8 x 2048, then the attention and telemetry kernels' checks
# Each ends within SESSION_SECONDS (default 560: a device call of 600 s with time to spare); the
# tables print as they come, the logs and the experiment's archives go into OUT. CONFIGS and SEEDS
# pass to gpu_experiment.sh (the runs a previous call did not make).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$SECONDS
budget=${SESSION_SECONDS:-560}
left() { echo $((budget - (SECONDS - start))); }
[ -x build/gpu/bin/train ] || python3 -m tarfile -e build/gpu.tar.xz build || { echo "no bundle: build/gpu.tar.xz"; exit 1; }
reference() { [ -e build/ref/debug_state.bin ] || echo reference; }
case ${1:-} in
    verify)
        CHECK_PARTS="$(reference) cuda_parity" CHECK_SECONDS=$(( $(left) < 200 ? $(left) : 200 )) bash dev/gpu_check.sh
        # Runs first (PROBES=0 unless asked): the probes cost a run's time each, and one more run of a
        # configuration, with PROBES=1 and one seed, makes the checkpoint they need in a later call.
        PROBES=${PROBES:-0} EXPERIMENT_SECONDS=$(left) bash dev/gpu_experiment.sh
        ;;
    speed)  # what decides the defaults first: the candidates' correctness and cuDNN's, then the times
        CHECK_PARTS="$(reference) cuda_parity_candidates dev_cudnn_attention" \
            CHECK_SECONDS=$(( $(left) < 200 ? $(left) : 200 )) bash dev/gpu_check.sh
        # its torch.compile runs within what is left but 45 s (its two --profile runs) and 90 s (the checks below)
        SPEED_BATCHES=8 SPEED_SECONDS=$(( $(left) - 135 )) bash dev/gpu_speed.sh
        mkdir -p "${OUT:-/tmp}/kernels"  # the second table's logs beside the first's
        CHECK_PARTS="dev_attention dev_telemetry" CHECK_SECONDS=$(left) OUT=${OUT:-/tmp}/kernels bash dev/gpu_check.sh
        ;;
    *)
        echo "usage: bash dev/gpu_session.sh verify|speed" >&2
        exit 2
        ;;
esac
