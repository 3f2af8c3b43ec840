"""Compares the statistics of two run logs of the same model state and batches, such as a
measurement (--measure) of one checkpoint on the GPU and on the CPU: per metric, the largest
difference relative to the CPU's value (metrics that may be near zero, k_cos, k_mean_share and attn_doc_start,
relative to the metric's largest magnitude), over every step, layer and head both logs hold.

    python3 dev/compare_stats.py GPU.attnlog CPU.attnlog [--rtol 0.01]

Prints a line per metric, worst first, and exits 1 if any metric differs by more than rtol (or the
logs hold other steps or shapes)."""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import attnlog  # noqa: E402

NEAR_ZERO = ("k_cos", "k_mean_share", "attn_doc_start")  # signed, or zero where no document starts: to the largest


def differences(got_log, want_log):
    """{metric: (largest relative difference, where as text)} over the metrics both logs hold."""
    out = {}
    for name in want_log.metric_names():
        steps_w, want = want_log.metric(name)
        steps_g, got = got_log.metric(name)
        if list(steps_w) != list(steps_g) or want.shape != got.shape:
            raise SystemExit(f"error: {name}: the logs hold other steps or shapes ({want.shape}, {got.shape})")
        want, got = want.astype(float), got.astype(float)
        scale = abs(want).max() if name in NEAR_ZERO else abs(want)
        rel = abs(got - want) / (scale + 1e-30)
        index = np.unravel_index(rel.argmax(), rel.shape)
        out[name] = (float(rel.max()), f"step {int(steps_w[index[0]])} at {tuple(int(i) for i in index[1:])}: "
                                       f"{got[index]:.6g} against {want[index]:.6g}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("got", help="the log to check (the GPU's)")
    ap.add_argument("want", help="the log to check it against (the CPU's)")
    ap.add_argument("--rtol", type=float, default=0.01)
    args = ap.parse_args()
    diffs = differences(attnlog.open_log(args.got), attnlog.open_log(args.want))
    beyond = 0
    for name, (rel, where) in sorted(diffs.items(), key=lambda item: -item[1][0]):
        beyond += rel > args.rtol
        print(f"{'FAIL' if rel > args.rtol else 'ok  '} {name:18s} {100 * rel:8.3f}%  ({where})")
    print(f"{len(diffs) - beyond} of {len(diffs)} metrics within {100 * args.rtol:g}%")
    return 1 if beyond or not diffs else 0


if __name__ == "__main__":
    sys.exit(main())
