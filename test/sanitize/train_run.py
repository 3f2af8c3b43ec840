"""The sanitizers' training run, for `make sanitize` and `make test`: ./train built with ASan and
UBSan (build/sanitize/train) trains the tiny model of test_train_cli.py on 30 texts of the Brown
corpus for 6 steps, with statistics, validation and a checkpoint at step 3; resumes from that
checkpoint in place, appending to the run's log; and refuses a damaged checkpoint with one line.

    train_run.py TRAIN

Prints "PASS name" / "FAIL name: why" lines for test/run_tests.py, which sets the sanitizers'
options: a sanitizer error ends ./train with status 86, and its report goes to a file the runner
reads.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attnlog
from test_train_cli import PREPARE, TINY_MODEL, run  # the CLI tests' tiny model

ROOT = Path(__file__).resolve().parent.parent.parent


def check(ok, name, result=None):
    why = "" if result is None else f"status {result.returncode}; {(result.stdout + result.stderr)[-3000:]}"
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)
    return ok


def main(train):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "tiny"
        r = run([PREPARE, "--brown", "--out", data, "--max-docs", "30", "--vocab", "512"])
        if not check(r.returncode == 0, "sanitize: the tiny corpus is prepared", r):
            return
        args = [train, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2", "-v", "3",
                "--val-batches", "2"]
        out = tmp / "run"
        r = run([*args, "-n", "3", "-o", out])
        check(r.returncode == 0 and (out / "model_step000003.ckpt").exists() and (out / "model.ckpt").exists(),
              "sanitize: ./train trains 6 steps with statistics, validation and checkpoints", r)
        first = (out / "run.attnlog").read_bytes() if (out / "run.attnlog").exists() else b""

        r = run([*args, "-r", out / "model_step000003.ckpt"])
        after = (out / "run.attnlog").read_bytes()
        log = attnlog.open_log(out / "run.attnlog")
        check(r.returncode == 0 and after.startswith(first) and len(after) > len(first) and
              list(log.scalars("loss")[0]) == list(range(6)) and log.superseded == [(3, 6)] and not log.problems,
              "sanitize: ./train resumes from the step 3 checkpoint, appending to the run's log", r)

        damaged = tmp / "damaged.ckpt"
        shutil.copy(out / "model_step000003.ckpt", damaged)
        with open(damaged, "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0x10]))
        r = run([*args, "-r", damaged, "-o", tmp / "refused"])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "checkpoint data is damaged" in lines[0],
              "sanitize: ./train refuses a damaged checkpoint with one line", r)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
