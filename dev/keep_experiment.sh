#!/usr/bin/env bash
# Keeps what dev/gpu_experiment.sh brought back from a GPU machine in the repository: for every
# run of every experiment_<configuration>.tar.xz in FOLDER (the device tool's files_at), into DEST
# (default docs/runs/d22 of the repository), DEST/<configuration>_seed<N>/ with
#   run.attnlog.xz   the run's log reduced by `attnlog reduce` (statistics at 16 significant bits, the
#                    losses, learning rates and notes exact), compressed with xz: any command reads it
#   stdout.txt.xz    what the run printed
#   MANIFEST         the command, the commit and the device, and what `attnlog reduce` said
#   probes/          the probes' tables, JSON and figures, when the run was probed
# A run is staged inside DEST and renamed into place whole; a run kept already is left as it is,
# never overwritten, except that a second run of its command with probes (gpu_experiment.sh's
# PROBES=1) adds those the kept run lacks when its losses are the kept run's, bit for bit. A run that cannot be kept (no
# log, an unreadable one, a status other than 0: stopped at its time limit, say) is reported and the
# others are kept; the status is then 1. Prints each run and the size of DEST. When it kept a run,
# it then writes the experiment's tables and figures again (scripts/experiment.py DEST, into
# DEST/report), which docs/research.md quotes: test/test_experiment.py fails until its tables are
# those of the new DEST/report/results.md.
# Usage: bash dev/keep_experiment.sh FOLDER [DEST]
set -uo pipefail
[ $# -ge 1 ] && [ -d "$1" ] || { echo "usage: bash dev/keep_experiment.sh FOLDER [DEST]: FOLDER holds experiment_*.tar.xz" >&2; exit 2; }
from=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${2:-$root/docs/runs/d22}
mkdir -p "$dest" && dest=$(cd "$dest" && pwd) || exit 1
py=/usr/bin/python3
archives=("$from"/experiment_*.tar.xz)
[ -e "${archives[0]}" ] || { echo "error: $from: no experiment_*.tar.xz" >&2; exit 1; }
work=$(mktemp -d "$dest/.keeping.XXXXXX")  # beside the kept runs: each moves into place by a rename
trap 'rm -rf "$work"' EXIT

keep_run() {  # the unpacked run's folder, its staging folder: the files to keep, or status 1
    local run=$1 staged=$2
    [ -e "$run/run.attnlog" ] || { echo "no run.attnlog (see the run's stdout.txt)"; return 1; }
    local status
    status=$(sed -n 's/^status: //p' "$run/MANIFEST" 2>/dev/null)
    [ "$status" = 0 ] || { echo "it did not end well (status ${status:-unknown}): $(tail -1 "$run/stdout.txt" 2>/dev/null)"; return 1; }
    mkdir -p "$staged" &&
        "$py" "$root/scripts/attnlog.py" reduce "$run/run.attnlog" -o "$staged/run.attnlog.xz" >"$work/reduce.txt" 2>&1 ||
        { tail -1 "$work/reduce.txt"; return 1; }
    { cat "$run/MANIFEST" 2>/dev/null || echo "no MANIFEST came back"
      echo "kept: scripts/attnlog.py reduce: $(sed -e "s|$staged/||g" -e "s|$run/||g" "$work/reduce.txt")"; } \
        >"$staged/MANIFEST" || return 1
    if [ -e "$run/stdout.txt" ]; then xz -9 -c "$run/stdout.txt" >"$staged/stdout.txt.xz" || return 1; fi
    if [ -d "$run/probes" ]; then cp -r "$run/probes" "$staged/" || return 1; fi
}

# The probes of a run kept without them all, from a second run of its command: each probe (sweep, svd,
# ablate) that the kept run lacks (its JSON) and the second run made, its table, JSON and figure; added
# only when the two runs' losses are the same, every step, bit for bit (./train gives the same bits
# for the same command and device), so that they are the kept run's probes.
missing_probes() {  # the unpacked run, the kept run: the probes the second has not and the first made
    local kind
    for kind in sweep svd ablate; do
        [ -e "$1/probes/$kind.json" ] && [ ! -e "$2/probes/$kind.json" ] && echo "$kind"
    done
}
add_probes() {  # the unpacked run, the kept run
    local run=$1 kept=$2 name kind
    name=$(basename "$kept")
    if ! PYTHONPATH="$root/scripts" "$py" -c 'import sys, attnlog
a, b = (attnlog.open_log(p).scalars("loss")[1] for p in sys.argv[1:])
sys.exit(0 if len(a) > 0 and list(a) == list(b) else 1)' "$run/run.attnlog" "$kept/run.attnlog.xz" 2>/dev/null; then
        echo "$name: kept already; this run's probes not added: its losses are not the kept run's"
        failed=1
        return
    fi
    local kinds
    kinds=$(missing_probes "$run" "$kept" | tr '\n' ' ')
    mkdir -p "$work/probes_$name" && cp -r "$kept/probes/." "$work/probes_$name/" 2>/dev/null
    for kind in $kinds; do
        cp "$run/probes/$kind".* "$run/probes/"*"_$kind".png "$work/probes_$name/" 2>/dev/null
    done
    # the kept probes and the new ones in a folder beside, then swapped in by renames
    if rm -rf "$work/old_probes_$name" && { [ ! -e "$kept/probes" ] || mv "$kept/probes" "$work/old_probes_$name"; } &&
        mv "$work/probes_$name" "$kept/probes"; then
        echo "probes ${kinds% }: from a second run of the same command, the same losses ($(grep -E '^(commit|device):' \
            "$run/MANIFEST" | tr '\n' ' '))" >>"$kept/MANIFEST"
        echo "$name: kept already; its probes ${kinds% } added from a second run with the same losses"
    else
        echo "$name: its probes could not be added"
        failed=1
    fi
}

failed=0
added=0
for archive in "${archives[@]}"; do
    unpacked=$work/$(basename "$archive" .tar.xz)
    mkdir -p "$unpacked"
    "$py" -m tarfile -e "$archive" "$unpacked" || { echo "$archive: cannot unpack, not kept"; failed=1; continue; }
    for run in "$unpacked"/*/; do
        run=${run%/}
        name=$(basename "$run")
        kept=$dest/$name
        if [ -e "$kept" ] && [ -n "$(missing_probes "$run" "$kept")" ]; then
            add_probes "$run" "$kept"
        elif [ -e "$kept" ]; then
            echo "$name: kept already in $kept, left as it is"
        elif why=$(keep_run "$run" "$work/staged_$name"); then
            mv "$work/staged_$name" "$kept"
            added=1
            echo "$name: $(du -k "$kept/run.attnlog.xz" | cut -f1) KiB log, $(du -sk "$kept" | cut -f1) KiB in all"
        else
            echo "$name: not kept: $why"
            failed=1
        fi
    done
done
echo "$dest: $(du -sh --exclude=.keeping.* "$dest" | cut -f1) in all"
if [ "$added" = 1 ]; then
    "$py" "$root/scripts/experiment.py" "$dest" || failed=1
    echo "docs/research.md quotes $dest/report/results.md: bring its tables up to date"
fi
exit $failed
