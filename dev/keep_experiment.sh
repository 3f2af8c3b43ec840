#!/usr/bin/env bash
# Keeps what dev/gpu_experiment.sh brought back from a GPU machine in the repository: for every
# run of every experiment_<configuration>.tar.xz in FOLDER (the device tool's files_at), into DEST
# (default docs/runs/d22), DEST/<configuration>_seed<N>/ with
#   run.attnlog.xz   the run's log reduced by `attnlog reduce` (statistics at 16 significant bits, the
#                    losses, learning rates and notes exact), compressed with xz: any command reads it
#   stdout.txt.xz    what the run printed
#   MANIFEST         the command, the commit and the device, and how the log was reduced
#   probes/          the probes' tables, JSON and figures, when the run was probed
# Runs already kept are left as they are (a run is never overwritten). Prints each run kept and the
# size of DEST. Then, from the repository root, one command redraws the experiment's report:
#   /usr/bin/python3 scripts/report.py DEST/*/run.attnlog.xz -o DEST/report
# Usage: bash dev/keep_experiment.sh FOLDER [DEST]
set -euo pipefail
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: bash dev/keep_experiment.sh FOLDER [DEST]: FOLDER holds experiment_*.tar.xz" >&2; exit 2; }
from=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
dest=${2:-docs/runs/d22}
py=/usr/bin/python3
archives=("$from"/experiment_*.tar.xz)
[ -e "${archives[0]}" ] || { echo "error: $from: no experiment_*.tar.xz" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
for archive in "${archives[@]}"; do
    unpacked=$work/$(basename "$archive" .tar.xz)
    mkdir -p "$unpacked"
    "$py" -m tarfile -e "$archive" "$unpacked"
    for run in "$unpacked"/*/; do
        name=$(basename "$run")
        kept=$dest/$name
        if [ -e "$kept" ]; then
            echo "$name: kept already in $kept, left as it is"
            continue
        fi
        if [ ! -e "$run/run.attnlog" ]; then
            echo "$name: no run.attnlog (see its stdout.txt in $archive), not kept"
            continue
        fi
        mkdir -p "$work/staged/$name"
        "$py" scripts/attnlog.py reduce "$run/run.attnlog" -o "$work/staged/$name/run.attnlog.xz" >/dev/null
        xz -9 -c "$run/stdout.txt" >"$work/staged/$name/stdout.txt.xz"
        { cat "$run/MANIFEST"; echo "kept: run.attnlog reduced by scripts/attnlog.py reduce (16 significant bits), xz"; } \
            >"$work/staged/$name/MANIFEST"
        [ -d "$run/probes" ] && cp -r "$run/probes" "$work/staged/$name/"
        mv "$work/staged/$name" "$kept"
        echo "$name: $(du -k "$kept/run.attnlog.xz" | cut -f1) KiB log, $(du -sk "$kept" | cut -f1) KiB in all"
    done
done
echo "$dest: $(du -sh "$dest" | cut -f1) in all"
