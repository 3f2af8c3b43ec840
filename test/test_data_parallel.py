"""Data-parallel training on the CPU: ./train under mpirun, two processes of one thread, against one
process that takes the same global batch by gradient accumulation (docs/multi_gpu.md).

The two are not bit for bit the same: one process adds each micro-batch's gradient into the
accumulated one inside its matrix products (and its embedding rows position by position), two
processes add their two gradients once, in the reduce-scatter. So every quantity is compared
within 1e-6 relative: losses, gradient norms, validation losses, every statistic, and the final
weights and AdamW moments per tensor (relative norm of the difference; a single element where
a gradient is rounding noise can move by more, as AdamW divides by sqrt(v))."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import attnlog
from attnlog import model_torch
from test_train_cli import TRAIN, TINY_MODEL, assert_one_line_error, data, run  # noqa: F401
from tolerance import assert_close, assert_norm_close

ROOT = Path(__file__).resolve().parent.parent

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun (Open MPI: openmpi-bin)")
# Root in a container, two processes on two cores, shared memory without cross-process reads.
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
ONE_THREAD = [a if a != "2" or TINY_MODEL[i - 1] != "--threads" else "1" for i, a in enumerate(TINY_MODEL)]
# 6 steps of 256 tokens: 2 micro-batches of 4 x 32 in one process, one in each of two.
STEPS = ["-d", "256", "-x", "6", "-s", "1", "-v", "3", "--val-batches", "3", "-n", "3", "-g", "0"]
# Error model: the same float32 arithmetic but for where two partial gradients are added (inside a
# matrix product, or after it in the reduce-scatter), a difference of a few u32 (6e-8) of the
# terms' magnitudes per gradient element, and weights that drift apart by as little. Losses,
# gradient norms and statistics, sums and means of such values, and the weights and moments per
# tensor in norm (one element whose gradient is rounding noise may move by more, AdamW dividing
# by sqrt(v)), stay within 1e-6 relative: 16 u32. The first moments of the gains and of the
# deeper layers' wq and wk come closest, at about 70% (OpenBLAS's Haswell, SkylakeX and Cooperlake
# kernels alike): sums of terms that largely cancel, whose roundings are large beside the sum. A
# lost or doubled micro-batch, or a reduction that misses a process's share, is off by far more.
RTOL = 1e-6


def mpi(n, *argv):
    return run([MPIRUN, *MPI_FLAGS, "-np", str(n), *argv])


def train_args(data, out, *extra):
    return [TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *ONE_THREAD, "-o", out, *STEPS, *extra]


def checkpoint_arrays(path):
    """The weights and both AdamW moments of a checkpoint, by tensor name."""
    c, params, _ = model_torch.read_checkpoint(path)
    flat = np.frombuffer(Path(path).read_bytes()[model_torch.CKPT_HEADER:], dtype="<f4")
    P = flat.size // 3
    out, offset = {}, 0
    for name, tensor in params.items():
        n = tensor.numel()
        for k, what in enumerate(("w", "m", "v")):
            out[f"{what} {name}"] = flat[k * P + offset:k * P + offset + n].astype(np.float64)
        offset += n
    assert offset == P, (offset, P)
    return out


def assert_runs_agree(one, two, steps=None):
    """Losses, gradient norms, validation losses and every statistic within RTOL (a statistic with
    a zero value: within RTOL of the metric's largest value)."""
    a, b = attnlog.open_log(one / "run.attnlog"), attnlog.open_log(two / "run.attnlog")
    assert a.problems == [] and b.problems == []
    for field in ("loss", "grad_norm"):
        sa, va = a.scalars(field)
        sb, vb = b.scalars(field)
        keep = np.isin(sa, sb if steps is None else steps)
        assert list(sa[keep]) == list(sb[np.isin(sb, sa[keep])]), field
        assert_close(vb[np.isin(sb, sa[keep])], va[keep], rtol=RTOL, what=field)
    assert_close(b.val_loss()[1][-1], a.val_loss()[1][-1], rtol=RTOL, what="val_loss")
    for name in a.record_types["telemetry"].fields:
        if name == "step":
            continue
        sa, va = a.metric(name)
        sb, vb = b.metric(name)
        keep = np.isin(sa, sb)
        assert keep.sum() >= 1
        x, y = va[keep], vb[np.isin(sb, sa)]
        assert_close(y, x, rtol=RTOL, atol=RTOL * np.abs(x).max(), what=name)


def assert_checkpoints_agree(one, two):
    a, b = checkpoint_arrays(one), checkpoint_arrays(two)
    for name in a:
        assert_norm_close(b[name], a[name], RTOL, what=name)


@pytest.fixture(scope="module")
def one_and_two(data, tmp_path_factory):
    """The same 6 steps: one process with 2 micro-batches per step, two processes with one each."""
    root = tmp_path_factory.mktemp("dp")
    one = run(train_args(data, root / "one"))
    assert one.returncode == 0, one.stdout + one.stderr
    two = mpi(2, *train_args(data, root / "two"))
    assert two.returncode == 0, two.stdout + two.stderr
    return root, one, two


def test_two_processes_train_as_one_with_accumulation(one_and_two):
    root, one, two = one_and_two
    assert "data parallel: 2 processes" in two.stdout and "2 micro-batches" in two.stdout
    assert two.stdout.count("step 1/6") == 1  # only rank 0 prints
    assert attnlog.open_log(root / "two" / "run.attnlog").header["num_processes"] == 2
    assert attnlog.open_log(root / "one" / "run.attnlog").header["num_processes"] == 1
    assert_runs_agree(root / "one", root / "two")
    assert_checkpoints_agree(root / "one" / "model.ckpt", root / "two" / "model.ckpt")
    assert_checkpoints_agree(root / "one" / "model_step000003.ckpt", root / "two" / "model_step000003.ckpt")
    report = run([sys.executable, ROOT / "scripts" / "report.py", root / "two" / "run.attnlog", "-o", root / "report"])
    assert report.returncode == 0, report.stderr
    assert "x 2 processes (data parallel)" in (root / "report" / "report.md").read_text()


def test_three_processes_with_frozen_kinds(data, tmp_path):
    """Three processes (shards that do not divide the parameters: the last one padded) and frozen
    kinds cut out of every shard: as one process with 3 micro-batches a step."""
    extra = ["-d", "384", "--freeze", "wk,k_gain"]
    one = run(train_args(data, tmp_path / "one", *extra))
    assert one.returncode == 0, one.stdout + one.stderr
    three = mpi(3, *train_args(data, tmp_path / "three", *extra))
    assert three.returncode == 0, three.stdout + three.stderr
    assert "3 micro-batches, 1 on each of 3 processes" in three.stdout
    assert_runs_agree(tmp_path / "one", tmp_path / "three")
    assert_checkpoints_agree(tmp_path / "one" / "model.ckpt", tmp_path / "three" / "model.ckpt")
    start, end = checkpoint_arrays(tmp_path / "one" / "model_step000003.ckpt"), checkpoint_arrays(tmp_path / "three" / "model.ckpt")
    _, initial, _ = model_torch.read_checkpoint(tmp_path / "one" / "model.ckpt")
    for name in initial:
        if name.endswith(".wk") or name.endswith(".k_gain"):
            assert np.array_equal(start[f"w {name}"], end[f"w {name}"]) and not end[f"m {name}"].any(), name


def test_the_statistics_cover_every_micro_batch(data, tmp_path):
    """A stats step measures the whole step's batch: in data order (--shuffle 0) two micro-batches
    of 4 x 32 hold the tokens of one of 8 x 32, and the first step's statistics, from the same
    weights, agree within rounding. (Those of the first micro-batch alone would not.)"""
    wide = [a if a != "4" or ONE_THREAD[i - 1] != "-b" else "8" for i, a in enumerate(ONE_THREAD)]
    for name, shape in (("narrow", ONE_THREAD), ("wide", wide)):
        r = run([TRAIN, "-i", data / "train_*.bin", *shape, "-o", tmp_path / name, *STEPS, "--shuffle", "0", "-x", "1"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("2 micro-batches" if name == "narrow" else "1 micro-batch") in r.stdout
    a, b = attnlog.open_log(tmp_path / "narrow" / "run.attnlog"), attnlog.open_log(tmp_path / "wide" / "run.attnlog")
    for name in ("k_norm", "k_erank", "k_cos", "attn_entropy", "attn_sink", "attn_logit_max"):
        x, y = a.metric(name)[1][0], b.metric(name)[1][0]
        assert_close(y, x, rtol=RTOL, atol=RTOL * np.abs(x).max(), what=name)


def test_two_processes_measure_as_one(one_and_two, data, tmp_path):
    """--measure under mpirun: each process measures its micro-batch of every batch of -d tokens and the
    statistics are those of the whole batch, summed over the processes as in training: within RTOL of
    one process measuring both micro-batches (the losses, means of the same float losses, exactly)."""
    root = one_and_two[0]
    args = [TRAIN, "-i", data / "train_*.bin", *ONE_THREAD, "-d", "256", "-g", "0", "-e", root / "one" / "model.ckpt",
            "--measure", "3"]
    one, two = run([*args, "-o", tmp_path / "one"]), mpi(2, *args, "-o", tmp_path / "two")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stdout + two.stderr
    assert "2 micro-batches, 1 on each of 2 processes" in two.stdout and two.stdout.count("batch 1/3") == 1
    a, b = attnlog.open_log(tmp_path / "one" / "run.attnlog"), attnlog.open_log(tmp_path / "two" / "run.attnlog")
    assert b.header["num_processes"] == 2 and a.problems == [] and b.problems == []
    assert np.array_equal(a.scalars("loss")[1], b.scalars("loss")[1])
    for name in a.metric_names():
        (sa, x), (sb, y) = a.metric(name), b.metric(name)
        assert list(sa) == list(sb) == [0, 1, 2], name
        assert_close(y, x, rtol=RTOL, atol=RTOL * np.abs(x).max(), what=name)


def test_resume_with_another_number_of_processes(one_and_two, tmp_path):
    """1 -> 2 and 2 -> 1: resumed at step 3, each continues the run it came from, within RTOL. With
    one thread a process, the threads of all processes together change (1 -> 2, 2 -> 1), which, as
    for another --threads, changes the last bits: refused, then allowed with --allow-changes 1."""
    root, _, _ = one_and_two
    for start, n, label in (("one", 2, "one_then_two"), ("two", 1, "two_then_one")):
        run_dir = tmp_path / label
        shutil.copytree(root / start, run_dir)
        (run_dir / "model.ckpt").unlink()
        options = attnlog.open_log(run_dir / "run.attnlog").header["options"]
        argv = [TRAIN, "-i", options["train"], "-j", options["val"], *ONE_THREAD, *STEPS,
                "-r", run_dir / "model_step000003.ckpt"]
        refused = run(argv) if n == 1 else mpi(n, *argv)
        assert refused.returncode != 0
        change = f"--threads (times processes) {3 - n} -> {n}"
        assert change in refused.stderr and "another count of threads (or of processes)" in refused.stderr
        argv += ["--allow-changes", "1"]
        r = run(argv) if n == 1 else mpi(n, *argv)
        assert r.returncode == 0, r.stdout + r.stderr
        assert_runs_agree(root / start, run_dir, steps=[3, 4, 5])
        assert_checkpoints_agree(root / start / "model.ckpt", run_dir / "model.ckpt")
        notes = attnlog.open_log(run_dir / "run.attnlog").notes()
        assert any(f'"num_processes": {n}' in text for _, text in notes), notes


def test_total_batch_must_split_over_the_processes(data, tmp_path):
    """An error every process meets: rank 0 tells it, in one whole line (another rank's stop, should
    it come first, is a whole line too)."""
    r = mpi(2, TRAIN, "-i", data / "train_*.bin", *ONE_THREAD, "-d", "384", "-x", "1", "-o", tmp_path / "o")
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error" in line and "rank" in line and "MPI" not in line]
    why = "option -d (--total-batch) 384: its 3 micro-batches of 4x32 do not split evenly over 2 processes"
    assert errors and all(re.fullmatch(rf"error: rank [01]: {re.escape(why)}", line) for line in errors), r.stderr
    assert f"error: rank 0: {why}" in errors, r.stderr


def test_a_failing_process_stops_every_process(one_and_two, data, tmp_path):
    """Process 1 cannot read its data: one line names the rank and the cause, every process stops,
    the job's status is not 0 and the checkpoint it resumed from is untouched."""
    root, _, _ = one_and_two
    run_dir = tmp_path / "run"
    shutil.copytree(root / "two", run_dir)
    ckpt = run_dir / "model_step000003.ckpt"
    before = ckpt.read_bytes()
    good = [TRAIN, "-j", data / "val_*.bin", *ONE_THREAD, *STEPS, "-r", ckpt]
    start = time.time()
    # mpirun's MPMD form: rank 0 gets the good data, rank 1 a pattern that matches nothing.
    r = run([MPIRUN, *MPI_FLAGS, "-np", "1", *good, "-i", data / "train_*.bin", ":",
             "-np", "1", *good, "-i", tmp_path / "missing" / "train_*.bin"])
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: rank 1: {tmp_path / 'missing' / 'train_*.bin'}: no shard matches"], r.stderr
    assert time.time() - start < 60 and ckpt.read_bytes() == before
    assert attnlog.open_log(run_dir / "run.attnlog").problems == []


def test_a_killed_process_stops_the_run_and_keeps_the_last_checkpoint(data, tmp_path):
    """SIGKILL to process 1 in the middle of a run: mpirun ends every process with a non-zero
    status; the last checkpoint written stays whole and the log readable. The SIGTERM mpirun sends
    rank 0 when it aborts the job is no request to stop after the step: rank 0 does not say so."""
    out = tmp_path / "run"
    argv = [str(a) for a in (TRAIN, "-i", data / "train_*.bin", *ONE_THREAD, "-o", out, "-d", "256", "-x", "100000",
                             "-s", "5", "-v", "0", "-n", "2", "-g", "0")]
    proc = subprocess.Popen([MPIRUN, *MPI_FLAGS, "-np", "2", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "model_step000004.ckpt").exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.05)
        rank1 = [pid for pid in os.listdir("/proc") if pid.isdigit() and is_rank(int(pid), 1, str(TRAIN))]
        assert len(rank1) == 1
        os.kill(int(rank1[0]), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "stopping after this step" not in err, err
    ckpts = sorted(out.glob("model_step*.ckpt"))
    assert ckpts and not list(out.glob("*.tmp")) and not (out / "model.ckpt").exists()
    model_torch.read_checkpoint(ckpts[-1])  # checks both CRCs and the size
    assert attnlog.open_log(out / "run.attnlog").problems == []


def is_rank(pid, rank, program):
    """Whether process pid runs `program` as rank `rank` of an mpirun job."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return cmd == program and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env


def test_sigusr1_stops_every_process_with_a_checkpoint(data, tmp_path):
    """mpirun passes SIGUSR1 on to every process (SIGINT and SIGTERM it turns into a kill after a
    second): the run finishes its step, writes a checkpoint and prints how to resume."""
    out = tmp_path / "run"
    argv = [str(a) for a in (TRAIN, "-i", data / "train_*.bin", *ONE_THREAD, "-o", out, "-d", "256", "-x", "100000",
                             "-s", "5", "-v", "0", "-g", "0")]
    proc = subprocess.Popen([MPIRUN, *MPI_FLAGS, "-np", "2", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step") and " 3/" in line:
                break
        proc.send_signal(signal.SIGUSR1)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped = re.search(r"stopped by SIGUSR1 after step (\d+) of 100000; resume with:\n  (.+)\n", rest)
    assert stopped, rest + err
    ckpt = out / f"model_step{int(stopped.group(1)):06d}.ckpt"
    assert f"-r {ckpt}" in stopped.group(2)
    model_torch.read_checkpoint(ckpt)
    assert attnlog.open_log(out / "run.attnlog").problems == []


@pytest.mark.parametrize("rank1, why", [
    (["-l", "0.01"], "option -l (--lr) differs between the processes"),
    (["-b", "2", "-d", "256"], "option -b (--batch) differs between the processes"),
    (["--n-layer", "3"], "option --n-layer differs between the processes"),
])
def test_processes_given_other_options_are_refused(data, tmp_path, rank1, why):
    """mpirun's MPMD form with other options for process 1: refused, naming the option, before
    the first collective could mismatch (which MPI would report as MPI_ERR_TRUNCATE)."""
    argv = [TRAIN, "-i", data / "train_*.bin", *ONE_THREAD, "-d", "256", "-x", "2", "-g", "0", "-o", tmp_path / "o"]
    r = run([MPIRUN, *MPI_FLAGS, "-np", "1", *argv, ":", "-np", "1", *argv, *rank1])
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert errors and all(re.fullmatch(rf"error: rank [01]: {re.escape(why)}; give every process the same options", line)
                          for line in errors), r.stderr
    assert not (tmp_path / "o").exists()


def test_processes_given_other_data_are_refused(data, tmp_path):
    """The same options, but process 1's shards hold other tokens: refused by the data's fingerprint."""
    other = tmp_path / "other"
    shutil.copytree(data, other)
    raw = bytearray((other / "train_000000.bin").read_bytes())
    raw[1024 + 2 * 50] ^= 1
    (other / "train_000000.bin").write_bytes(bytes(raw))
    argv = [TRAIN, *ONE_THREAD, "-d", "256", "-x", "2", "-g", "0", "-o", tmp_path / "o"]
    r = run([MPIRUN, *MPI_FLAGS, "-np", "1", *argv, "-i", data / "train_*.bin", ":",
             "-np", "1", *argv, "-i", other / "train_*.bin"])
    assert r.returncode != 0
    assert "error: rank 0: option -i (--train): the processes read different training data" in r.stderr, r.stderr
