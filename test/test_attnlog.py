"""Tests of the log reader (attnlog.reader, scripts/attnlog.py from the checkout) on logs written by the C++ writer (test/test_runlog.cpp): every value
read back, and every kind of damage recognised and reported.

    TEST_RUNLOG_BIN=build/test_runlog /usr/bin/python3 -m pytest -q test/test_attnlog.py
"""
import csv
import io
import json
import lzma
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pandas
import pytest

import attnlog
from attnlog import commands, reader

ROOT = Path(__file__).resolve().parent.parent

WRITER = os.environ.get("TEST_RUNLOG_BIN", str(ROOT / "build" / "test_runlog"))
SCRIPT = ROOT / "scripts" / "attnlog.py"

# -- what test_runlog writes -------------------------------------------------------------------------

CONFIG = {"vocab_size": 96, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "head_dim": 8, "d_model": 32,
          "d_ff": 80, "max_seq_len": 16, "rope_theta": 500000.0, "norm_eps": 1e-06, "qk_norm": 0, "tied_embeddings": 1,
          "rope_factor": 0.0, "rope_low_freq_factor": 0.0, "rope_high_freq_factor": 0.0, "rope_original_max_pos": 0}
OPTIONS = {"data": 'C:\\runs\\"best".bin', "lr": "0.003", "comment": "tab\there\nnew line, ünïcode ✓",
           "control": "\x01\x1f", "bytes": "\ufffd ok"}
SCALARS = ["loss", "lr", "grad_norm", "tokens_per_s", "ms"]
COLUMNS = {"kv_head": 2, "q_head": 4, "dim": 8}


def writer_metrics():
    """[(name, dim)] of every telemetry metric in payload order, dim naming its columns ("kv_head",
    "q_head" or "dim"), or "scalar" for one value per step: the trainer's table of metrics, as
    test_runlog --metrics prints it. Without
    test_runlog, none: every test that needs it then fails, saying so (run_writer)."""
    if not os.path.exists(WRITER):
        return []
    result = subprocess.run([WRITER, "--metrics"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [(name, dim) for name, dim in json.loads(result.stdout)]


METRICS = writer_metrics()
DIM_OF = dict(METRICS)
DIM_NAMES = [name for name, _ in METRICS]


def metric_shape(dim):
    """The shape of a metric test_runlog writes: its 3 layers by its columns, or () for a scalar."""
    return () if dim == "scalar" else (3, COLUMNS[dim])


def dims_text(dim):
    """A metric's dims as info and dump print them."""
    return "scalar" if dim == "scalar" else f"layer x {dim}"


TELEMETRY_BYTES = 4 * sum(int(np.prod(metric_shape(dim))) for _, dim in METRICS)
STEP, VAL, TELEMETRY, NOTE = 1, 2, 3, 4


def scalar_value(name, step, segment):
    seg = 100 * segment
    return {"loss": seg + 8 - step / 8, "lr": seg + (step + 1) / 1024, "grad_norm": seg + 1 + step / 16,
            "tokens_per_s": seg + 1000 * (step + 1), "ms": seg + 2 * step + 0.5}[name]


def val_value(step, segment):
    return 100 * segment + 7 - step / 8


def metric_value(m, step, segment):
    if METRICS[m][1] == "scalar":  # layer 0, column 0
        return np.float64(segment * 1e6 + step * 1e5 + m * 1000 + 0.5)
    layers = np.arange(3)[:, None]
    cols = np.arange(COLUMNS[METRICS[m][1]])[None, :]
    return segment * 1e6 + step * 1e5 + m * 1000 + layers * 100 + cols + 0.5


def note_text(step, segment):
    return f'segment {segment}, step {step}: "quoted" \\ ünïcode ✓ \ufffd'


def has_val(step):
    return step % 5 == 0 or step == 9


def has_telemetry(step):
    return step % 3 == 0


def check_values(log, steps, missing=(), segment_of=lambda step: 0):
    """Every value of every record equals its formula. steps: those written; missing: (type, step)
    pairs expected to be lost."""
    step_steps = [s for s in steps if (STEP, s) not in missing]
    for name in SCALARS:
        got_steps, values = log.scalars(name)
        assert got_steps.tolist() == step_steps
        assert values.dtype == np.float32
        np.testing.assert_array_equal(values, np.float32([scalar_value(name, s, segment_of(s)) for s in step_steps]))
    val_steps = [s for s in steps if has_val(s) and (VAL, s) not in missing]
    got_steps, values = log.val_loss()
    assert got_steps.tolist() == val_steps
    np.testing.assert_array_equal(values, np.float32([val_value(s, segment_of(s)) for s in val_steps]))
    tel_steps = [s for s in steps if has_telemetry(s) and (TELEMETRY, s) not in missing]
    assert log.metric_names() == [name for name, _ in METRICS]
    for m, (name, dim) in enumerate(METRICS):
        got_steps, values = log.metric(name)
        assert got_steps.tolist() == tel_steps
        assert values.shape == (len(tel_steps),) + metric_shape(dim) and values.dtype == np.float32
        for i, s in enumerate(tel_steps):
            np.testing.assert_array_equal(values[i], np.float32(metric_value(m, s, segment_of(s))))


def frames(data):
    """(offset, type, flags, step, payload length) of every record, read strictly as
    docs/log_format.md lays them out."""
    pos = 20 + struct.unpack_from("<I", data, 12)[0]
    out = []
    while pos < len(data):
        assert data[pos:pos + 4] == b"\xffREC"
        rtype, flags, length, step = struct.unpack_from("<HHIq", data, pos + 4)
        assert zlib.crc32(data[pos + 4:pos + 20 + length]) == struct.unpack_from("<I", data, pos + 20 + length)[0]
        out.append((pos, rtype, flags, step, length))
        pos += 24 + length
    return out


def make_record(rtype, step, payload):
    body = struct.pack("<HHIq", rtype, 0, len(payload), step) + payload
    return b"\xffREC" + body + struct.pack("<I", zlib.crc32(body))


def with_header(data, header_text, version=1):
    """The log with another header text (and preamble version), checksum made to match."""
    old_end = 20 + struct.unpack_from("<I", data, 12)[0]
    return (b"ATTNLOG\0" + struct.pack("<III", version, len(header_text), zlib.crc32(header_text))
            + header_text + data[old_end:])


def run_writer(mode, path):
    if not os.path.exists(WRITER):
        pytest.fail(f"{WRITER} not found: build it with "
                    "g++ -std=c++17 -O2 -Wall -Wextra -I. test/test_runlog.cpp -o build/test_runlog")
    result = subprocess.run([WRITER, mode, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def run_cli(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(result, *parts):
    assert result.returncode == commands.USER_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert result.stdout == ""
    for part in parts:
        assert part in result.stderr


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("written") / "run.attnlog"
    run_writer("write", path)
    return path


@pytest.fixture
def data(log_path):
    return log_path.read_bytes()


def saved(tmp_path, data, name="copy.attnlog"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# -- round trip --------------------------------------------------------------------------------------


def test_preamble(data):
    assert data[:8] == b"ATTNLOG\0"
    version, length, crc = struct.unpack_from("<III", data, 8)
    assert version == 1
    assert zlib.crc32(data[20:20 + length]) == crc


def test_header_fields(log_path):
    log = attnlog.open_log(log_path)
    h = log.header
    assert log.version == 1 and h["format"] == "attnlog" and h["version"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h["created"])
    assert log.config == CONFIG and list(log.config) == list(CONFIG)
    assert all(type(log.config[k]) is int for k in CONFIG if k not in ("rope_theta", "norm_eps") and "factor" not in k)
    assert h["options"] == OPTIONS and list(h["options"]) == list(OPTIONS)
    assert h["seed"] == 2**64 - 1
    assert (h["backend"], h["device"]) == ("cpu", 'test device "x" \\ 2 cores')
    assert h["num_processes"] == 3 and h["train_tokens"] == 1420931
    table = h["records"]
    assert [(t["type"], t["name"]) for t in table] == [(1, "step"), (2, "val"), (3, "telemetry"), (4, "note")]
    assert [f["name"] for f in table[0]["fields"]] == SCALARS
    assert [f["name"] for f in table[1]["fields"]] == ["val_loss"]
    for t in table[:2]:
        assert all(f["dtype"] == "float32" and f["shape"] == [] and f["meaning"] for f in t["fields"])
    assert [(f["name"], f["dtype"], f["shape"], f["dims"]) for f in table[2]["fields"]] == [
        (name, "float32", list(metric_shape(dim)), [] if dim == "scalar" else ["layer", dim]) for name, dim in METRICS]
    assert [(f["name"], f["dtype"], f["shape"]) for f in table[3]["fields"]] == [("text", "utf8", [-1])]


def test_header_without_num_processes(tmp_path, data):
    """Logs written before data-parallel training have no "num_processes": one process, read as
    such; the writer's (3 processes) is shown by info. Nor do they have "train_tokens"."""
    assert "3 process(es)" in run_cli("info", saved(tmp_path, data, "three.attnlog")).stdout
    header = json.loads(data[20:20 + struct.unpack_from("<I", data, 12)[0]])
    del header["num_processes"], header["train_tokens"]
    path = saved(tmp_path, with_header(data, json.dumps(header).encode()))
    log = attnlog.open_log(path)
    assert "num_processes" not in log.header and "train_tokens" not in log.header and log.problems == []
    check_values(log, range(10))
    result = run_cli("info", path)
    assert result.returncode == 0 and result.stdout.endswith("problems: none\n"), result.stderr
    assert "1 process(es)" in result.stdout


def test_record_frames(data):
    expected = []
    for s in range(10):
        if s in (0, 7):
            expected.append((NOTE, s, len(note_text(s, 0).encode())))
        expected.append((STEP, s, 20))
        if has_val(s):
            expected.append((VAL, s, 4))
        if has_telemetry(s):
            expected.append((TELEMETRY, s, TELEMETRY_BYTES))
    got = frames(data)
    assert [(t, s, n) for _, t, _, s, n in got] == expected
    assert all(flags == 0 for _, _, flags, _, _ in got)


def test_round_trip(log_path):
    log = attnlog.open_log(log_path)
    check_values(log, range(10))
    assert log.notes() == [(0, note_text(0, 0)), (7, note_text(7, 0))]
    assert log.record_counts() == {"step": 10, "val": 3, "telemetry": 4, "note": 2}
    assert log.step_range() == (0, 9)
    assert log.problems == []


def test_header_only_log_reads_as_empty(tmp_path, data):
    """A run that stopped before its first step: every field reads as zero records of its shape."""
    header_end = 20 + struct.unpack_from("<I", data, 12)[0]
    log = attnlog.open_log(saved(tmp_path, data[:header_end]))
    steps, values = log.metric("k_norm")
    assert steps.shape == (0,) and values.shape == (0, log.config["n_layer"], COLUMNS[DIM_OF["k_norm"]])
    steps, loss = log.scalars("loss")
    assert steps.shape == (0,) and loss.shape == (0,)
    assert log.problems == []


def test_resumed_run_later_records_win(tmp_path, data):
    path = saved(tmp_path, data)
    run_writer("append", path)  # re-does steps 6..11 with values of segment 1
    log = attnlog.open_log(path)
    check_values(log, range(12), segment_of=lambda step: 1 if step >= 6 else 0)
    notes = log.notes()
    assert [step for step, _ in notes] == [0, 7, 9, 7]
    assert notes[3][1] == note_text(7, 1)
    assert notes[2][1].startswith("resumed at ") and '"seed": 18446744073709551615' in notes[2][1]
    assert "torn" not in notes[2][1]
    assert log.problems == [
        "4 step records repeat steps 6..9 (a resumed run re-did them); the later records are used",
        "1 val records repeat step 9 (a resumed run re-did them); the later records are used",
        "2 telemetry records repeat steps 6..9 (a resumed run re-did them); the later records are used"]


def test_resume_removes_torn_tail(tmp_path, data):
    path = saved(tmp_path, data[:-10])
    run_writer("append", path)
    log = attnlog.open_log(path)
    check_values(log, range(12), segment_of=lambda step: 1 if step >= 6 else 0)
    assert f"removed a torn tail of {TELEMETRY_BYTES + 24 - 10} bytes" in log.notes()[2][1]
    assert not any("torn" in p or "checksum" in p for p in log.problems)


# -- damage ------------------------------------------------------------------------------------------


def test_torn_tail_at_every_byte(tmp_path, data):
    last = frames(data)[-1]
    start = last[0]
    assert (last[1], last[3]) == (TELEMETRY, 9)
    path = tmp_path / "cut.attnlog"
    for cut in range(start, len(data)):
        path.write_bytes(data[:cut])
        log = attnlog.open_log(path)
        check_values(log, range(10), missing={(TELEMETRY, 9)})
        expected = [] if cut == start else [f"torn tail: {cut - start} bytes at offset {start} ignored"]
        assert log.problems == expected, cut


def test_torn_tail_in_info(tmp_path, data):
    start = frames(data)[-1][0]
    result = run_cli("info", saved(tmp_path, data[:start + 30]))
    assert result.returncode == 0
    assert f"  torn tail: 30 bytes at offset {start} ignored\n" in result.stdout


# Opens a log, cuts the file (to nothing or to its header) while it is open, then reads every value
# and prints them as JSON. Run in a child process: a reader that died of SIGBUS there shows as a
# failed test with the signal's exit status instead of killing pytest.
READ_AFTER_TRUNCATE = """
import json, os, sys
import attnlog
path, cut = sys.argv[1], int(sys.argv[2])
log = attnlog.open_log(path)
os.truncate(path, cut)
values = {name: [log.scalars(name)[0].tolist(), log.scalars(name)[1].tolist()] for name in log.scalar_names()}
values.update({name: [log.metric(name)[0].tolist(), log.metric(name)[1].tolist()] for name in log.metric_names()})
values["val"] = [log.val_loss()[0].tolist(), log.val_loss()[1].tolist()]
values["notes"] = log.notes()
print(json.dumps(values))
"""


@pytest.mark.parametrize("cut", ["empty", "header"])
def test_log_truncated_while_open(tmp_path, data, cut):
    """A log cut short after it was opened (a run started again over it) still reads as it was
    when opened, in every value."""
    path = saved(tmp_path, data)
    size = 0 if cut == "empty" else 20 + struct.unpack_from("<I", data, 12)[0]
    result = subprocess.run([sys.executable, "-c", READ_AFTER_TRUNCATE, str(path), str(size)],
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")))
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr}"
    assert path.stat().st_size == size
    log = attnlog.open_log(saved(tmp_path, data, "intact.attnlog"))
    values = json.loads(result.stdout)
    for name in log.scalar_names():
        assert values[name] == [a.tolist() for a in log.scalars(name)], name
    for name in log.metric_names():
        assert values[name] == [a.tolist() for a in log.metric(name)], name
    assert values["val"] == [a.tolist() for a in log.val_loss()]
    assert [tuple(n) for n in values["notes"]] == log.notes()
    check_values(log, range(10))


@pytest.mark.parametrize("rtype, step", [(TELEMETRY, 3), (STEP, 4), (VAL, 5), (NOTE, 7)])
def test_checksum_mismatch_skips_one_record(tmp_path, data, rtype, step):
    offset, _, _, _, length = next(f for f in frames(data) if f[1] == rtype and f[3] == step)
    damaged = bytearray(data)
    damaged[offset + 20 + length // 2] ^= 0x10
    log = attnlog.open_log(saved(tmp_path, bytes(damaged)))
    name = {STEP: "step", VAL: "val", TELEMETRY: "telemetry", NOTE: "note"}[rtype]
    assert log.problems == [f"checksum mismatch in the {name} record at offset {offset} (step {step}): "
                            f"{24 + length} bytes skipped"]
    check_values(log, range(10), missing={(rtype, step)})
    assert len(log.notes()) == (1 if rtype == NOTE else 2)


@pytest.mark.parametrize("where", ["marker", "length"])
def test_damaged_frame_resynchronises(tmp_path, data, where):
    offset, _, _, _, length = next(f for f in frames(data) if f[1] == TELEMETRY and f[3] == 3)
    damaged = bytearray(data)
    if where == "marker":
        damaged[offset] ^= 0xFF
    else:
        struct.pack_into("<I", damaged, offset + 8, 10**9)
    log = attnlog.open_log(saved(tmp_path, bytes(damaged)))
    assert log.problems == [f"damaged bytes: {24 + length} bytes at offset {offset} skipped"]
    check_values(log, range(10), missing={(TELEMETRY, 3)})


def test_resume_notes_set_aside_what_they_replace(tmp_path, data):
    """Records written before a note "resumed from step S" for steps S and later are set aside, each
    counted by the first such note after it that covers its step; records after the last note stay,
    whatever their step."""
    resumed = [make_record(NOTE, 8, b"resumed from step 8 at noon"), make_record(STEP, 8, bytes(20)),
               make_record(NOTE, 4, b"resumed from step 4"), make_record(STEP, 2**63 - 1, bytes(20)),
               make_record(STEP, -(2**63), bytes(20))]
    log = attnlog.open_log(saved(tmp_path, data + b"".join(resumed)))
    # the first note: step 8, 9, val 9, telemetry 9; the second: step 4..7 and the new 8, val 5, telemetry 6
    assert log.superseded == [(8, 4), (4, 7)]
    assert log.scalars("loss")[0].tolist() == [-(2**63), 0, 1, 2, 3, 2**63 - 1]
    assert log.problems == []


def test_unknown_record_type_skipped(tmp_path, data):
    records = frames(data)
    second, last = records[1][0], records[-1][0]
    future = make_record(77, 4, b"a record type of a newer writer")
    log = attnlog.open_log(saved(tmp_path, data[:second] + future + data[second:last] + future + data[last:]))
    assert log.problems == ["2 records of unknown type 77 skipped (not in the header's record table)"]
    check_values(log, range(10))
    assert log.record_counts() == {"step": 10, "val": 3, "telemetry": 4, "note": 2}


def test_wrong_payload_length_skipped(tmp_path, data):
    offset = next(f[0] for f in frames(data) if f[1] == STEP and f[3] == 2)
    wrong = make_record(STEP, 2, b"\0" * 24)
    log = attnlog.open_log(saved(tmp_path, data[:offset] + wrong + data[offset + 44:]))
    assert log.problems == ["1 step records skipped: their payload is not the 20 bytes of the record table "
                            f"(the first at offset {offset})"]
    check_values(log, range(10), missing={(STEP, 2)})


# -- headers it cannot use -----------------------------------------------------------------------------


def expect_log_error(path, *parts):
    with pytest.raises(attnlog.LogError) as error:
        attnlog.open_log(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path))
    for part in parts:
        assert part in message
    assert_one_line_error(run_cli("info", path), *parts)
    return error.value


def test_damaged_header_checksum(tmp_path, data):
    damaged = bytearray(data)
    damaged[200] ^= 0x01
    expect_log_error(saved(tmp_path, bytes(damaged)), "damaged header: checksum mismatch",
                     "19 intact records follow")


def test_header_not_json(tmp_path, data):
    text = data[20:20 + struct.unpack_from("<I", data, 12)[0]]
    expect_log_error(saved(tmp_path, with_header(data, text[:-5])), "damaged header: its text is not valid JSON",
                     "19 intact records follow")
    expect_log_error(saved(tmp_path, with_header(data, b"[1, 2]"), "array.attnlog"), "not valid JSON")


def test_header_versions_disagree(tmp_path, data):
    header = json.loads(data[20:20 + struct.unpack_from("<I", data, 12)[0]])
    header["version"] = 2
    expect_log_error(saved(tmp_path, with_header(data, json.dumps(header).encode())),
                     "the preamble says version 1, the text says format 'attnlog' version 2")


def test_malformed_record_table(tmp_path, data):
    header = json.loads(data[20:20 + struct.unpack_from("<I", data, 12)[0]])
    header["records"][2]["fields"][0]["dtype"] = "float17"
    expect_log_error(saved(tmp_path, with_header(data, json.dumps(header).encode())),
                     "damaged header: its record table is malformed")


@pytest.mark.parametrize("cut", [0, 5, 12, 19, 20, 1000, "header - 1"])
def test_truncated_header(tmp_path, data, cut):
    if cut == "header - 1":
        cut = 20 + struct.unpack_from("<I", data, 12)[0] - 1
    expect_log_error(saved(tmp_path, data[:cut]), "truncated header", "nothing can be read")


def test_newer_version(tmp_path, data):
    header = json.loads(data[20:20 + struct.unpack_from("<I", data, 12)[0]])
    header["version"] = 2
    header["compression"] = "something new"
    error = expect_log_error(saved(tmp_path, with_header(data, json.dumps(header).encode(), version=2)),
                             "format version 2 is newer than this reader's (1)",
                             f"created {header['created']}", "n_layer=3", "records not read")
    assert error.header["config"] == CONFIG and error.header["options"] == OPTIONS
    assert "compression" not in error.header


def test_newer_version_damaged_header(tmp_path, data):
    newer = bytearray(data)
    newer[8] = 2
    newer[200] ^= 0x01
    error = expect_log_error(saved(tmp_path, bytes(newer)), "format version 2 is newer", "unreadable too")
    assert error.header is None


def test_not_a_log(tmp_path):
    expect_log_error(saved(tmp_path, b"step,loss\n0,8.0\n"), "not a run log")
    expect_log_error(tmp_path / "absent.attnlog", "cannot open")


# -- command line ------------------------------------------------------------------------------------


def test_cli_info(log_path):
    result = run_cli("info", log_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"{log_path}: attnlog format version 1, created ")
    assert "records: 10 step, 3 val, 4 telemetry, 2 note; steps 0..9\n" in out
    assert "model: vocab_size=96 n_layer=3 n_head=4 n_kv_head=2 head_dim=8" in out
    assert '  data = "C:\\\\runs\\\\\\"best\\".bin"\n' in out
    assert "metrics: " + ", ".join(f"{name} [{dims_text(dim)}]" for name, dim in METRICS) + "\n" in out
    assert out.endswith("problems: none\n")


def test_cli_dump_metric_at_step(log_path):
    result = run_cli("dump", log_path, "--metric", "q_norm", "--step", 6)
    assert result.returncode == 0, result.stderr
    m = [name for name, _ in METRICS].index("q_norm")
    rows = [" ".join(str(v) for v in np.float32(metric_value(m, 6, 0))[layer]) for layer in range(3)]
    assert result.stdout == (f"step 6\n  q_norm [layer x {DIM_OF['q_norm']}]\n"
                             + "".join(f"    layer {layer}: {row}\n" for layer, row in enumerate(rows)))


def test_cli_dump_step(log_path):
    result = run_cli("dump", log_path, "--step", 0)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:4] == ["step 0", "  loss 8.0, lr 0.0009765625, grad_norm 1.0, tokens_per_s 1000.0, ms 0.5",
                         "  val_loss 7.0", f"  note: {note_text(0, 0)}"]
    assert lines[4] == f"  {METRICS[0][0]} [layer x {METRICS[0][1]}]"
    assert len(lines) == 4 + sum(1 + (1 if dim == "scalar" else 3) for _, dim in METRICS)
    name = next(name for name, dim in METRICS if dim == "scalar")  # one value, on a line of its own
    at = lines.index(f"  {name} [scalar]")
    assert lines[at + 1] == f"    {np.float32(metric_value(DIM_NAMES.index(name), 0, 0))}"


def test_cli_dump_errors(log_path):
    assert_one_line_error(run_cli("dump", log_path, "--step", 42), "nothing recorded at step 42")
    assert_one_line_error(run_cli("dump", log_path, "--metric", "k_nrom"), "no metric named 'k_nrom'")


@pytest.mark.parametrize("m", range(len(METRICS)))
def test_cli_csv_metric(tmp_path, log_path, m):
    out = tmp_path / "metric.csv"
    result = run_cli("csv", log_path, "--metric", METRICS[m][0], "-o", out)
    assert result.returncode == 0 and result.stdout == "", result.stderr
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    if METRICS[m][1] == "scalar":  # one value per step: step,name
        assert rows[0] == ["step", METRICS[m][0]]
        assert [[int(a), float(v)] for a, v in rows[1:]] == [[s, np.float32(metric_value(m, s, 0))] for s in (0, 3, 6, 9)]
        return
    assert rows[0] == ["step", "layer", "head_or_dim", "value"]
    expected = [[s, layer, col, metric_value(m, s, 0)[layer, col]]
                for s in (0, 3, 6, 9) for layer in range(3) for col in range(COLUMNS[METRICS[m][1]])]
    assert [[int(a), int(b), int(c), float(v)] for a, b, c, v in rows[1:]] == expected


def test_cli_csv_scalars_and_val(log_path):
    result = run_cli("csv", log_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_cli("csv", log_path, "--scalars").stdout
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert list(rows[0]) == ["step"] + SCALARS
    assert [int(r["step"]) for r in rows] == list(range(10))
    for r in rows:
        s = int(r["step"])
        assert [np.float32(r[n]) for n in SCALARS] == [np.float32(scalar_value(n, s, 0)) for n in SCALARS]
    result = run_cli("csv", log_path, "--val")
    assert result.stdout == "step,val_loss\n0,7.0\n5,6.375\n9,5.875\n"


def test_cli_csv_unwritable_output(tmp_path, log_path):
    assert_one_line_error(run_cli("csv", log_path, "-o", tmp_path / "no" / "such" / "dir.csv"), "cannot write")


def test_library_names_errors(log_path):
    log = attnlog.open_log(log_path)
    with pytest.raises(attnlog.LogError, match="no telemetry field named 'k_nrom'"):
        log.metric("k_nrom")
    with pytest.raises(attnlog.LogError, match="no step field named 'los' .it has loss, lr"):
        log.scalars("los")


# -- export: every value of every log, one row each ----------------------------------------------------

EXPORT_COLUMNS = ["run", "step", "metric", "layer", "head", "head_kind", "kv_head", "value"]
GROUP = CONFIG["n_head"] // CONFIG["n_kv_head"]  # query heads 0, 1 read kv head 0; 2, 3 read kv head 1


def expected_export(steps, segment_of=lambda step: 0):
    """{(metric, step, layer, head): (head_kind, kv_head, float32 value)} of every value test_runlog
    writes, from the formulas; layer, head and kv_head -1 for the values of the step and val records."""
    rows = {}
    for s in steps:
        seg = segment_of(s)
        for name in SCALARS:
            rows[name, s, -1, -1] = ("scalar", -1, np.float32(scalar_value(name, s, seg)))
        if has_val(s):
            rows["val_loss", s, -1, -1] = ("scalar", -1, np.float32(val_value(s, seg)))
        if has_telemetry(s):
            for m, (name, dim) in enumerate(METRICS):
                table = np.float32(metric_value(m, s, seg))
                if dim == "scalar":
                    rows[name, s, -1, -1] = ("scalar", -1, table)
                    continue
                kv_of = {"kv_head": lambda col: col, "q_head": lambda col: col // GROUP}.get(dim, lambda col: -1)
                for (layer, col), value in np.ndenumerate(table):
                    rows[name, s, layer, col] = (dim, kv_of(col), value)
    return rows


def export_rows(columns):
    """{run: {(metric, step, layer, head): (head_kind, kv_head, float32 value)}} of the columns of an
    export, and the row count."""
    runs = {}
    values = np.asarray(columns["value"]).astype(np.float32)
    for run, step, metric, layer, head, kind, kv_head, value in zip(
            *[list(columns[k]) for k in EXPORT_COLUMNS[:-1]], values):
        runs.setdefault(run, {})[metric, step, layer, head] = (kind, kv_head, value)
    return runs, len(values)


def read_export_csv(path):
    """The columns of an exported CSV as pandas.read_csv reads them with its defaults."""
    frame = pandas.read_csv(path)
    assert list(frame.columns) == EXPORT_COLUMNS
    assert [str(frame[k].dtype) for k in EXPORT_COLUMNS[1:]] == ["int64", "object"] + ["int64"] * 2 + ["object",
                                                                                                   "int64", "float64"]
    return {k: frame[k].to_numpy() for k in EXPORT_COLUMNS}


def read_export_npz(path):
    """The columns of an exported npz, the text columns decoded from their codes as pandas does it."""
    with np.load(path) as f:
        arrays = dict(f)
    assert list(arrays) == EXPORT_COLUMNS + ["run_names", "metric_names", "head_kind_names"]
    columns = {k: arrays[k] for k in EXPORT_COLUMNS}
    for k in ("run", "metric", "head_kind"):
        assert arrays[k].dtype == np.int8  # a handful of names: one byte a row
        columns[k] = pandas.Categorical.from_codes(arrays[k], arrays[f"{k}_names"]).to_numpy()
    return columns


def test_export_csv_holds_every_value(tmp_path, log_path):
    out = tmp_path / "all.csv"
    result = run_cli("export", log_path, "-o", out)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stderr
    runs, count = export_rows(read_export_csv(out))
    expected = expected_export(range(10))
    assert count == len(expected) == 10 * len(SCALARS) + 3 + TELEMETRY_BYTES // 4 * 4  # one row per value
    assert runs == {f"{log_path.parent.name}/run": expected}  # float32 values read back exactly
    with open(out, newline="") as f:
        first = next(csv.DictReader(f))
    assert [first[k] for k in ("metric", "layer", "head", "head_kind", "kv_head")] == ["loss", "-1", "-1", "scalar",
                                                                                     "-1"]


def test_export_npz_two_logs(tmp_path, log_path):
    resumed = saved(tmp_path, log_path.read_bytes(), "run.attnlog")
    run_writer("append", resumed)  # steps 6..9 again, with other values, then 10 and 11
    out = tmp_path / "two.npz"
    result = run_cli("export", log_path, resumed, "--run-label", "first", "-o", out)
    assert result.returncode == 0, result.stderr
    columns = read_export_npz(out)
    assert {len(c) for c in columns.values()} == {len(columns["run"])}
    assert [columns[k].dtype for k in EXPORT_COLUMNS[1:]] == [np.int64, object, np.int32, np.int32, object, np.int32,
                                                              np.float32]
    runs, _ = export_rows(columns)
    labels = list(dict.fromkeys(columns["run"].tolist()))
    assert labels == ["first", f"{tmp_path.name}/run"]
    assert runs == {"first": expected_export(range(10)),  # a re-done step once, with its later values
                    labels[1]: expected_export(range(12), lambda step: 1 if step >= 6 else 0)}
    log = attnlog.open_log(resumed)  # and the values are the reader's arrays, bit for bit
    for name in log.metric_names():
        steps, values = log.metric(name)
        rows = (columns["run"] == labels[1]) & (columns["metric"] == name)
        np.testing.assert_array_equal(columns["step"][rows].reshape(len(steps), -1)[:, 0], steps)
        assert np.array_equal(columns["value"][rows].view(np.uint32), values.ravel().view(np.uint32))


def test_export_formats_agree_and_npz_is_compressed(tmp_path, log_path):
    """The CSV and the npz of the same logs hold the same rows (missing positions -1 in both); the
    npz is compressed, a byte a row for each text column."""
    for kind in ("csv", "npz"):
        assert run_cli("export", log_path, log_path, "-o", tmp_path / f"all.{kind}").returncode == 0
    from_csv, from_npz = read_export_csv(tmp_path / "all.csv"), read_export_npz(tmp_path / "all.npz")
    for k in EXPORT_COLUMNS[:-1]:
        assert from_csv[k].tolist() == from_npz[k].tolist(), k
    assert np.array_equal(from_csv["value"].astype(np.float32).view(np.uint32), from_npz["value"].view(np.uint32))
    with zipfile.ZipFile(tmp_path / "all.npz") as archive:
        assert {i.compress_type for i in archive.infolist()} == {zipfile.ZIP_DEFLATED}
    # Two runs: 8 names of the few hundred bytes' worth each text column would take per row.
    assert (tmp_path / "all.npz").stat().st_size < (tmp_path / "all.csv").stat().st_size / 4


def test_export_kv_head_of_each_query_head():
    """Query head h reads kv head h // (n_head / n_kv_head); a kv head is its own; a dimension has none;
    a config without a whole number of query heads per kv head, or with fewer than the field, gives none."""
    heads = np.arange(8, dtype=np.int32)
    kv = lambda kind, **config: reader._kv_heads(heads, kind, config).tolist()  # noqa: E731
    assert kv("q_head", n_head=8, n_kv_head=2) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert kv("q_head", n_head=8, n_kv_head=8) == list(range(8))  # no grouping: the identity
    assert kv("q_head", n_head=8, n_kv_head=1) == [0] * 8
    assert kv("kv_head", n_head=8, n_kv_head=2) == list(range(8))
    for kind, config in (("dim", {"n_head": 8, "n_kv_head": 2}), ("q_head", {"n_head": 8, "n_kv_head": 3}),
                         ("q_head", {"n_head": 4, "n_kv_head": 2}), ("q_head", {"n_head": 8.0, "n_kv_head": 2}),
                         ("q_head", {})):
        assert kv(kind, **config) == [-1] * 8, (kind, config)


def float32_cases(count, seed=0):
    """Every kind of float32: random bit patterns (all exponents, subnormals, both signs), and the
    edges: zeros, the smallest and largest subnormals and normals, the largest finite, the neighbours
    of 1 and of powers of ten, where numpy's text turns from positional to scientific (1e-4, 1e16)."""
    bits = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    random = bits.view(np.float32)
    edges = np.array([0.0, 1.4e-45, 2.8e-45, 1.1754942e-38, 1.17549435e-38, 3.4028235e38, 1.0, 0.1, 1 / 3,
                      2**24 + 2, 16777217.0, 1e-4, 9.9999997e-5, 1e16, 9.999999e15, 1e-30, 1e30, 6.0221e23, 1e-45],
                     np.float32)
    powers = np.float32(10.0) ** np.arange(-45, 39, dtype=np.float32)
    with np.errstate(over="ignore"):  # the float after the largest is inf, left out below
        near = np.concatenate([np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf)),
                               np.nextafter(powers, np.float32(0)), powers])
    every = np.concatenate([random, edges, near])
    every = np.concatenate([every, -every])
    return every[np.isfinite(every)]


def test_export_csv_floats_read_back_by_pandas_defaults(tmp_path):
    """pandas.read_csv with its defaults, cast back to float32, gives every float32 bit for bit, from
    the text the export writes; NaN is read as NaN, the infinities as themselves. Between 1e-13 and
    1e13 in size its float64 is the one float() reads from the same text (17 digits of the float32's
    float64, as the export wrote them before, made pandas read a third of such values otherwise)."""
    values = np.concatenate([float32_cases(300_000), np.float32([np.nan, np.inf, -np.inf])])
    n = len(values)
    block = {"run": np.full(n, "r"), "step": np.arange(n), "metric": np.full(n, "m"), "layer": np.full(n, -1),
             "head": np.full(n, -1), "head_kind": np.full(n, "scalar"), "kv_head": np.full(n, -1), "value": values}
    reader.write_long(tmp_path / "floats.csv", [block])
    got = pandas.read_csv(tmp_path / "floats.csv").value.to_numpy()
    assert got.dtype == np.float64
    assert np.array_equal(got.astype(np.float32).view(np.uint32)[:-3], values.view(np.uint32)[:-3])
    assert np.isnan(got[-3]) and got[-2] == np.inf and got[-1] == -np.inf
    assert np.signbit(got[values.view(np.uint32) == 0x80000000]).all()  # -0.0 keeps its sign
    with open(tmp_path / "floats.csv", newline="") as f:
        texts = [row[-1] for row in csv.reader(f)][1:]
    usual = (np.abs(values) >= 1e-13) & (np.abs(values) <= 1e13)
    assert usual.sum() > 100_000
    assert got[usual].tolist() == [float(text) for text, keep in zip(texts, usual) if keep]


def test_export_csv_float64_is_pandas_not_the_float32(tmp_path):
    """Why the export promises the float32 and not its float64: pandas' default parser reads no text
    as 45.068931579589844 (a float32, 0x42344696), only as its neighbours; the shortest decimal of
    the float32, 45.06893, reads back to the same float32."""
    value = np.uint32(0x42344696).view(np.float32)
    exact = float(value)
    texts = [repr(exact), "%.17e" % exact, "%.25f" % exact, "4.5068931579589844e1", "45068931579589844e-15",
             str(value)]
    got = pandas.read_csv(io.StringIO("v\n" + "\n".join(texts) + "\n")).v.to_numpy()
    assert exact not in got.tolist()
    assert got[-1].astype(np.float32) == value and texts[-1] == "45.06893"


def test_export_labels_and_torn_tail(tmp_path, data):
    cut = saved(tmp_path, data[:frames(data)[-1][0] + 30])  # the step 9 telemetry record torn
    out = tmp_path / "cut.csv"
    result = run_cli("export", cut, cut, "-o", out)
    assert result.returncode == 0, result.stderr
    runs, count = export_rows(read_export_csv(out))
    expected = {k: v for k, v in expected_export(range(10)).items() if not (k[1] == 9 and k[0] in DIM_OF)}
    label = f"{tmp_path.name}/copy"
    assert runs == {label: expected, f"{label} (2)": expected} and count == 2 * len(expected)


def test_export_errors(tmp_path, log_path):
    out = tmp_path / "out.csv"
    out.write_text("an earlier export\n")
    assert_one_line_error(run_cli("export", log_path, "-o", tmp_path / "out.xlsx"), "out.xlsx", ".csv or .npz")
    not_log = saved(tmp_path, b"step,loss\n0,8.0\n", "loss.attnlog")
    assert_one_line_error(run_cli("export", log_path, not_log, "-o", out), "loss.attnlog", "not a run log")
    assert_one_line_error(run_cli("export", log_path, "-o", out, "--run-label", "a", "--run-label", "b"),
                          "--run-label")
    assert_one_line_error(run_cli("export", log_path, "-o", tmp_path / "no" / "such.npz"), "such.npz", "cannot write")
    assert out.read_text() == "an earlier export\n"  # nothing written, nothing left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.attnlog", "out.csv"]


# -- hostile input: headers with a right checksum and wrong content, damage full of false markers -------


def header_of(data):
    return json.loads(data[20:20 + struct.unpack_from("<I", data, 12)[0]])


def edited(data, edit):
    """The log with its header changed by edit(header), checksum made to match."""
    header = header_of(data)
    edit(header)
    return with_header(data, json.dumps(header).encode())


def setter(*path, value):
    def edit(header):
        for key in path[:-1]:
            header = header[key]
        header[path[-1]] = value
    return edit


MALFORMED_HEADERS = [  # (what, edit of the header or its text, parts of the one-line error)
    ("config number as bool", setter("config", "n_layer", value=True), ["config.n_layer is true, not a number"]),
    ("config null", setter("config", value=None), ["config is null, not an object"]),
    ("config missing", lambda h: h.pop("config"), ["it has no model configuration"]),
    ("option not a string", setter("options", "lr", value=0.003), ["options.lr is 0.003, not a string"]),
    ("seed negative", setter("seed", value=-1), ["seed is -1, not an unsigned 64-bit integer"]),
    ("device a list", setter("device", value=["gpu"]), ['device is ["gpu"], not a string']),
    ("no processes", setter("num_processes", value=0), ["num_processes is 0, not a positive integer"]),
    ("processes as text", setter("num_processes", value="2"), ['num_processes is "2", not an integer']),
    ("tokens negative", setter("train_tokens", value=-1), ["train_tokens is -1, not a number of tokens"]),
    ("tokens as float", setter("train_tokens", value=1.5), ["train_tokens is 1.5, not an integer"]),
    ("version as bool", setter("version", value=True), ["the text says format 'attnlog' version True"]),
    ("measurement a path", setter("measurement", value="a.ckpt"), ['measurement is "a.ckpt", not an object']),
    ("measurement without checkpoint", setter("measurement", value={"step": 3}), ["measurement has no 'checkpoint'"]),
    ("measurement of a negative step", setter("measurement", value={"checkpoint": "a.ckpt", "step": -1}),
     ["measurement.step is -1, not a count"]),
    ("measurement tokens as text", setter("measurement", value={"checkpoint": "a.ckpt", "step": 1, "tokens": "9"}),
     ['measurement.tokens is "9", not an integer']),
    ("measurement of a run with an odd id", setter("measurement", value={"checkpoint": "a", "step": 1, "run_id": "x1"}),
     ['measurement.run_id is "x1", not 16 hexadecimal digits']),
    ("records null", setter("records", value=None), ["its record table is malformed: records is null, not a list"]),
    ("reduced a string", setter("reduced", value="yes"), ['reduced is "yes", not an object']),
    ("reduced without its bits", setter("reduced", value={"from": "x"}), ["reduced has no 'significant_bits'"]),
    ("reduced to 99 bits", setter("reduced", value={"from": "x", "significant_bits": 99}),
     ["reduced.significant_bits is 99, not 2 to 24"]),
    ("reduced leaving out a number", setter("reduced", value={"from": "x", "significant_bits": 8, "left_out": [1]}),
     ["reduced.left_out.0 is 1, not a string"]),
    ("record type null", setter("records", 1, value=None), ["records[1] is null, not an object"]),
    ("type id as bool", setter("records", 1, "type", value=True), ["records[1].type is true, not an integer"]),
    ("type id too large", setter("records", 1, "type", value=70000), ["records[1].type is 70000, not a record type"]),
    ("type id twice", setter("records", 1, "type", value=1), ["records[1] repeats the type 1 of records[0]"]),
    ("type name twice", setter("records", 1, "name", value="step"), ['records[1] repeats the name "step"']),
    ("field name twice", setter("records", 0, "fields", 1, "name", value="loss"),
     ["records[0].fields[1].name \"loss\" names a field of record type 'step' twice"]),
    ("fields an object", setter("records", 2, "fields", value={}), ["records[2].fields is {}, not a list"]),
    ("field without shape", lambda h: h["records"][2]["fields"][0].pop("shape"),
     ["records[2].fields[0] has no 'shape'"]),
    ("shape with a float", setter("records", 2, "fields", 0, "shape", value=[3, 2.5]),
     ["records[2].fields[0].shape[1] is 2.5, not an integer"]),
    ("shape negative", setter("records", 2, "fields", 0, "shape", value=[3, -2]), ["shape[1] is -2, not a dimension"]),
    ("shape huge", setter("records", 2, "fields", 0, "shape", value=[3, 2**40]),
     ["shape[1] is 1099511627776, not a dimension (0 .. 2^31)"]),
    ("shape beyond a payload", setter("records", 2, "fields", 0, "shape", value=[2**31, 2**31]),
     ["spans more than the 4294967295 bytes a record's payload can hold"]),
    ("shape empty but vast", setter("records", 2, "fields", 0, "shape", value=[2**31, 0]), ["spans more than"]),
    ("shape of 40 dimensions", lambda h: h["records"][2]["fields"][0].update(shape=[1] * 40, dims=["x"] * 40),
     ["records[2].fields[0].shape has 40 dimensions, more than 16"]),
    ("dims not one per dimension", setter("records", 2, "fields", 0, "dims", value=["layer"]),
     ['dims is ["layer"], not one name per dimension of the shape [3, 2]']),
    ("unknown dtype", setter("records", 2, "fields", 0, "dtype", value="float16"), ['dtype is "float16", not one of']),
    ("text field not last", lambda h: h["records"][3]["fields"].append(h["records"][1]["fields"][0]),
     ["records[3].fields[1] follows the text field of record type 'note'"]),
    ("NaN", b'{"format": "attnlog", "version": 1, "config": {"x": NaN}, "records": []}', ["NaN is no JSON number"]),
    ("Infinity", b'{"format": "attnlog", "version": 1, "config": {"x": -Infinity}, "records": []}',
     ["-Infinity is no JSON number"]),
    ("number too large", b'{"format": "attnlog", "version": 1, "config": {"x": 1e999}, "records": []}',
     ["the number 1e999 is too large for a float"]),
    ("integer of 5000 digits", b'{"config": {"x": ' + b"9" * 5000 + b"}}", ["not valid JSON", "digits"]),
    ("nested 65 deep", b'{"x": ' + b"[" * 64 + b"]" * 64 + b"}", ["nested deeper than 64 levels"]),
    ("nested a million deep", b'{"x": ' + b"[" * 10**6 + b"]" * 10**6 + b"}", ["nested deeper than 64 levels"]),
    ("lone surrogate", setter("device", value="\ud800"), ["a string holds a lone surrogate ('\\ud800')"]),
    ("null", b"null", ["its text is not valid JSON of a header (null, not an object)"]),
    ("an array", b'["format", "attnlog"]',
     ['its text is not valid JSON of a header (["format", "attnlog"], not an object)']),
]


@pytest.mark.parametrize("what, edit, parts", MALFORMED_HEADERS, ids=[case[0] for case in MALFORMED_HEADERS])
def test_malformed_header_is_one_line(tmp_path, data, what, edit, parts):
    """A header whose checksum is right but whose content is not what the format says: one line naming
    what is wrong and where, from the library and from the command line, never a traceback."""
    text = edit if isinstance(edit, bytes) else None
    damaged = with_header(data, text) if text else edited(data, edit)
    expect_log_error(saved(tmp_path, damaged), "damaged header: ", "19 intact records follow", *parts)


def test_measurement_header(tmp_path, data, log_path):
    """A measurement's log (./train --measure) names the checkpoint it measured: log.measurement, and a
    line of info; a training run's log has none."""
    measured = {"checkpoint": "/runs/a/model.ckpt", "step": 300, "run_id": "0123456789abcdef", "tokens": 76800}
    path = saved(tmp_path, edited(data, setter("measurement", value=measured)))
    assert attnlog.open_log(path).measurement == measured and attnlog.open_log(log_path).measurement is None
    result = run_cli("info", path)
    assert result.returncode == 0, result.stderr
    assert ("measurement: the weights of step 300 of run 0123456789abcdef in /runs/a/model.ckpt, trained on 76,800 "
            "tokens; no training: each step of the log is a batch measured with these weights") in result.stdout
    bare = saved(tmp_path, edited(data, setter("measurement", value={"checkpoint": "w.ckpt", "step": 0})), "bare.attnlog")
    assert "measurement: the weights of step 0 in w.ckpt; no training" in run_cli("info", bare).stdout
    assert "measurement:" not in run_cli("info", log_path).stdout


def test_surrogate_pair_is_text(tmp_path, data):
    """An escaped surrogate pair is one character, not a lone surrogate."""
    text = json.dumps({**header_of(data), "device": "\U0001f600"}, ensure_ascii=True).encode()
    assert b"\\ud83d\\ude00" in text
    assert attnlog.open_log(saved(tmp_path, with_header(data, text))).header["device"] == "\U0001f600"


def test_newer_version_with_odd_members(tmp_path, data):
    """The members of a newer version's header that the reader shows are only the well-formed ones,
    and its one line stays one line whatever they hold."""
    header = header_of(data)
    header.update(version=2, created="a\nb\u2028c", config={"n_layer": [3]}, options=None)
    error = expect_log_error(saved(tmp_path, with_header(data, json.dumps(header).encode(), version=2)),
                             "format version 2 is newer", "created a\\nb\\u2028c")
    assert "config" not in error.header and "options" not in error.header and error.header["created"] == "a\nb\u2028c"


def test_names_with_line_breaks_stay_on_one_line(tmp_path, data):
    """Problems name record types by the header's names, whatever they hold: still one line each."""
    offset = next(f[0] for f in frames(data) if f[1] == STEP and f[3] == 2)
    damaged = bytearray(edited(data, setter("records", 0, "name", value="step\nor\rnot")))
    damaged[len(damaged) - len(data) + offset + 30] ^= 1
    log = attnlog.open_log(saved(tmp_path, bytes(damaged)))
    assert [p.startswith("checksum mismatch in the step\\nor\\rnot record") for p in log.problems] == [True]
    result = run_cli("info", saved(tmp_path, bytes(damaged)))
    assert result.returncode == 0 and "  checksum mismatch in the step\\nor\\rnot record" in result.stdout


def test_odd_but_well_formed_layouts(tmp_path, data):
    """A record table laid out otherwise than the writer's, but as the format allows: telemetry fields
    of one dimension, of three, of a single value (its records then no longer fit the table), a step
    field of int32: every command reads it, and csv --metric says in one line that it writes
    layer-by-column metrics only."""
    def edit(header):
        telemetry = header["records"][2]["fields"]
        telemetry[0].update(shape=[6], dims=["x"])  # k_norm: as many values as its [3, 2]
        telemetry[1].update(shape=[3, 2, 1], dims=["layer", "kv_head", "one"])
        telemetry[2].update(shape=[], dims=[])  # 1 value instead of 6: the records no longer fit
        header["records"][0]["fields"][4].update(dtype="int32")
    changed = edited(data, edit)
    log = attnlog.open_log(saved(tmp_path, changed))
    path, first = Path(log.path), frames(data)[3][0] + len(changed) - len(data)  # the step 0 telemetry record
    assert log.problems == [f"4 telemetry records skipped: their payload is not the {TELEMETRY_BYTES - 20} bytes of "
                            f"the record table (the first at offset {first})"]
    steps, ms = log.scalars("ms")
    assert ms.dtype == np.int32 and steps.tolist() == list(range(10))
    for command in (["info"], ["dump"], ["dump", "--metric", METRICS[0][0]], ["csv"], ["csv", "--val"],
                    ["export", "-o", tmp_path / "all.csv"]):
        result = run_cli(command[0], path, *command[1:])
        assert result.returncode == 0 and result.stderr == "", (command, result.stderr)
    assert f"{METRICS[1][0]} [layer x kv_head x one]" in run_cli("info", path).stdout
    assert_one_line_error(run_cli("csv", path, "--metric", METRICS[0][0]), "has the shape [6], not layer by column")


def test_text_field_after_numbers(tmp_path, data):
    """A note type of a number then the text: the text is found after the number, and a record too
    short for the number is skipped, said once."""
    def edit(header):
        header["records"][3]["fields"].insert(0, {"name": "count", "dtype": "int64", "shape": [], "dims": []})
    changed = edited(data, edit)
    log = attnlog.open_log(saved(tmp_path, changed + make_record(NOTE, 5, b"1234567")))
    assert log.problems == ["1 note records skipped: their payload is shorter than the 8 bytes of the record "
                            f"table (the first at offset {len(changed)})"]
    texts = [note_text(0, 0).encode(), note_text(7, 0).encode()]
    steps, count = log.read("note", "count")
    assert steps.tolist() == [0, 7] and count.tolist() == [struct.unpack_from("<q", t)[0] for t in texts]
    assert log.notes() == [(0, texts[0][8:].decode()), (7, texts[1][8:].decode())]


def test_names_of_text_fields_are_no_scalars(tmp_path, data):
    path = saved(tmp_path, edited(data, lambda h: h["records"][0]["fields"].append(
        {"name": "comment", "dtype": "utf8", "shape": [-1], "dims": ["byte"]})))
    log = attnlog.open_log(path)
    assert log.scalar_names() == SCALARS and "comment" in log.record_types["step"].fields
    assert run_cli("dump", path, "--step", 1).returncode == 0


def test_range_crcs_equal_zlib():
    """The CRCs of many overlapping ranges, from the CRCs of the prefixes, are zlib's."""
    rng = np.random.default_rng(5)
    buf = rng.bytes(100_000)
    a, b = np.sort(rng.integers(0, len(buf) + 1, (2, 2000)), axis=0)
    b[:5] = a[:5]  # empty ranges too
    got = reader._range_crcs(buf, a, b)
    assert got.tolist() == [zlib.crc32(buf[x:y]) for x, y in zip(a.tolist(), b.tolist())]


def false_markers(size):
    """size bytes of b"\\xffREC" over and over: every frame claims a payload of 0x434552FF bytes."""
    return b"\xffREC" * (size // 4)


def claiming_frames(size):
    """size bytes of frames, each claiming a payload that runs to 30 bytes before the end of them
    (every one fits in the file, none checks out), two markers every 16 bytes."""
    out, n = bytearray(), size // 16
    for i in range(n):
        rest = max((n - i) * 16 - 30, 8)
        out += b"\xffREC\xffREC" + struct.pack("<II", rest, rest - 4)
    return bytes(out)


@pytest.mark.parametrize("make", [false_markers, claiming_frames])
def test_damage_full_of_false_markers_is_linear(tmp_path, data, make):
    """4 MB of false markers between the records: the reader skips them in time linear in their size,
    and finds the records on either side. (Checking each marker by the CRC of the record it claims,
    as the rules read literally do, takes time quadratic in the size: 25 s for 1 MB of claiming_frames.)"""
    cut = frames(data)[8][0]
    path = saved(tmp_path, data[:cut] + make(4 << 20) + data[cut:])
    start = time.perf_counter()
    log = attnlog.open_log(path)
    took = time.perf_counter() - start
    print(f"\n{make.__name__}: 4 MB read in {took:.2f} s")
    assert took < 10, took  # about 0.05 s (false_markers) and 0.3 s (claiming_frames) on 2 cores
    check_values(log, range(10))
    said = {false_markers: f"damaged bytes: {4 << 20} bytes at offset {cut} skipped",
            claiming_frames: f"checksum mismatch in the record of type 21247 at offset {cut} (step "}[make]
    assert len(log.problems) == 1 and log.problems[0].startswith(said) and f" {4 << 20} bytes" in log.problems[0]


# -- reduced copies and compressed logs ----------------------------------------------------------------


def with_noisy_telemetry(data, seed=0):
    """The log with every telemetry value a random float32 of magnitude 1e-30 to 1e30: values that no
    fewer bits than 24 hold exactly."""
    rng = np.random.default_rng(seed)
    out = bytearray(data[:frames(data)[0][0]])
    for pos, rtype, _, step, length in frames(data):
        payload = data[pos + 20:pos + 20 + length]
        if rtype == TELEMETRY:
            n = length // 4
            payload = (rng.uniform(1, 2, n) * rng.choice([-1, 1], n) * 10.0 ** rng.integers(-30, 30, n)).astype("<f4")
            payload = payload.tobytes()
        out += make_record(rtype, step, payload)
    return bytes(out)


def test_round_significant_rounds_to_nearest_even():
    one_ulp = 2.0**-15  # of 16 significant bits at 1
    x = np.float32([1 + one_ulp / 2, 1 + 1.5 * one_ulp, -(1 + 0.5625 * one_ulp), 2 - 2.0**-20, 3.4028235e38, np.inf,
                    -np.inf, 0.0, 1e-45, -3e-42])
    got = reader.round_significant(x, 16)
    expected = np.float32([1, 1 + 2 * one_ulp, -(1 + one_ulp), 2, (2 - 2.0**-15) * 2.0**127, np.inf, -np.inf, 0.0, 1e-45,
                           -3e-42])
    # ties to the even neighbour, a carry into the exponent, the largest float cut (not made inf), subnormals kept
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(reader.round_significant(np.float32([np.nan]), 8)[0])
    np.testing.assert_array_equal(reader.round_significant(x, 24).view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("bits", [16, 5, 24])
def test_reduce_rounds_the_telemetry_and_keeps_the_rest(tmp_path, data, bits):
    source = saved(tmp_path, with_noisy_telemetry(data))
    out = tmp_path / "small.attnlog"
    result = run_cli("reduce", source, "-o", out, "--bits", bits)
    assert result.returncode == 0 and result.stderr == "" and "left out" not in result.stdout, result.stderr
    full, small = attnlog.open_log(source), attnlog.open_log(out)
    assert small.reduced == {"from": "copy.attnlog", "significant_bits": bits} and small.problems == []
    assert {k: v for k, v in small.header.items() if k != "reduced"} == full.header
    assert len(frames(out.read_bytes())) == len(frames(source.read_bytes()))
    for name in SCALARS:
        np.testing.assert_array_equal(np.stack(small.scalars(name)), np.stack(full.scalars(name)))
    np.testing.assert_array_equal(np.stack(small.val_loss()), np.stack(full.val_loss()))
    assert small.notes() == full.notes()
    changed = 0
    for name in full.metric_names():
        (steps, before), (steps_after, after) = full.metric(name), small.metric(name)
        assert steps_after.tolist() == steps.tolist()
        before, after = before.astype(np.float64), after.astype(np.float64)
        half_ulp = 2.0 ** (np.floor(np.log2(np.abs(before))) - bits)  # of `bits` significant bits
        assert (np.abs(after - before) <= half_ulp).all(), name  # the nearest such number
        assert not (small.metric(name)[1].view(np.uint32) & ((1 << (24 - bits)) - 1)).any(), name
        changed += int((after != before).sum())
    assert (changed > 0) == (bits < 24)
    info = run_cli("info", out)
    assert f"reduced: a copy of copy.attnlog whose telemetry is rounded to {bits} significant bits" in info.stdout


def test_reduce_to_xz_reads_as_the_reduced_log(tmp_path, data):
    source = saved(tmp_path, with_noisy_telemetry(data))
    plain, packed = tmp_path / "plain.attnlog", tmp_path / "run.attnlog.xz"
    for out in (plain, packed):
        assert run_cli("reduce", source, "-o", out).returncode == 0
    assert packed.read_bytes().startswith(b"\xfd7zXZ\0")
    a, b = attnlog.open_log(plain), attnlog.open_log(packed)
    assert a.header == b.header and b.problems == []
    for name in b.metric_names():
        np.testing.assert_array_equal(np.stack(a.metric(name)[1]), np.stack(b.metric(name)[1]))
    assert attnlog.run_labels([packed, tmp_path / "run.attnlog"]) == [f"{tmp_path.name}/run", f"{tmp_path.name}/run (2)"]


def test_reduce_leaves_out_what_a_read_leaves_out(tmp_path, data):
    """Superseded records and damaged bytes are not copied: the copy reads as the source does, with
    no problems and nothing set aside; the command says what was left out."""
    damaged = bytearray(data)
    pos, _, _, _, length = frames(data)[5]
    damaged[pos + 20 + length // 2] ^= 0xFF
    resumed = [make_record(NOTE, 6, b"resumed from step 6"), make_record(STEP, 6, struct.pack("<5f", 1, 2, 3, 4, 5))]
    source = saved(tmp_path, bytes(damaged) + b"".join(resumed))
    full = attnlog.open_log(source)
    assert full.superseded and full.problems
    out = tmp_path / "small.attnlog"
    result = run_cli("reduce", source, "-o", out)
    assert result.returncode == 0 and "left out, as every read does: checksum mismatch" in result.stdout
    small = attnlog.open_log(out)
    assert small.superseded == [] and small.problems == []
    for name in SCALARS:
        np.testing.assert_array_equal(np.stack(small.scalars(name)), np.stack(full.scalars(name)))
    assert small.notes() == full.notes() and small.record_counts() == full.record_counts()
    # the copy says what the source's reads left out, and a copy of the copy keeps the original's name
    (start, count), = full.superseded
    assert (start, count) == (6, 7)  # steps 6-9, the validation loss of 9, the telemetry of 6 and 9
    assert small.reduced["left_out"] == full.problems + ["7 records superseded by the resume from step 6"]
    assert "  left out of the copy: checksum mismatch" in run_cli("info", out).stdout
    again = tmp_path / "again.attnlog"
    assert run_cli("reduce", out, "-o", again, "--bits", "12").returncode == 0
    assert attnlog.open_log(again).reduced == dict(small.reduced, significant_bits=12, left_out=small.reduced["left_out"])


def test_reduce_refusals(tmp_path, data):
    source = saved(tmp_path, with_noisy_telemetry(data))
    taken = saved(tmp_path, b"already here", "taken.attnlog")
    assert_one_line_error(run_cli("reduce", source, "-o", taken), str(taken), "exists already")
    assert taken.read_bytes() == b"already here"
    for bits in ("1", "25", "x"):
        assert_one_line_error(run_cli("reduce", source, "-o", tmp_path / "new.attnlog", "--bits", bits), "--bits",
                              "not a whole number from 2 to 24")
    assert not (tmp_path / "new.attnlog").exists()
    eight = tmp_path / "eight.attnlog.xz"
    assert run_cli("reduce", source, "-o", eight, "--bits", "8").returncode == 0
    assert_one_line_error(run_cli("reduce", eight, "-o", tmp_path / "more.attnlog"), "already reduced to 8",
                          "--bits 16")
    assert run_cli("reduce", eight, "-o", tmp_path / "fewer.attnlog", "--bits", "6").returncode == 0


def test_reduce_leaves_nothing_when_it_cannot_write(tmp_path, data):
    """A file size limit (as a full disk) stops reduce with one line naming the output, and leaves
    neither the output nor a staged file behind."""
    source = saved(tmp_path, with_noisy_telemetry(data))
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    for name in ("small.attnlog", "small.attnlog.xz"):
        result = subprocess.run([sys.executable, str(SCRIPT), "reduce", str(source), "-o", str(out_dir / name)],
                                capture_output=True, text=True, preexec_fn=limited)
        assert_one_line_error(result, str(out_dir / name), "cannot write", "nothing written")
    assert list(out_dir.iterdir()) == []


def test_xz_streams_padding_and_damage(tmp_path, data):
    """An xz file of several streams (as `xz` appends them) with stream padding reads as the log they
    hold together; bytes after the last stream, or damage inside one, are problems, and what comes
    before them still reads."""
    cut = frames(data)[12][0]
    two = lzma.compress(data[:cut], format=lzma.FORMAT_XZ) + bytes(8) + lzma.compress(data[cut:], format=lzma.FORMAT_XZ)
    log = attnlog.open_log(saved(tmp_path, two, "two.attnlog.xz"))
    assert log.problems == []
    check_values(log, range(10))
    log = attnlog.open_log(saved(tmp_path, two + b"garbage", "tail.attnlog.xz"))
    assert log.problems == ["7 bytes after the xz stream ignored (no xz stream)"]
    check_values(log, range(10))
    damaged = bytearray(lzma.compress(data[:cut], format=lzma.FORMAT_XZ))
    first = len(damaged)
    damaged += lzma.compress(data[cut:], format=lzma.FORMAT_XZ)
    damaged[first + len(damaged[first:]) // 2] ^= 0xFF
    log = attnlog.open_log(saved(tmp_path, bytes(damaged), "damaged.attnlog.xz"))
    assert log.problems[0].startswith("damaged xz compression near byte ")
    assert log.scalars("loss")[0].tolist()[:5] == [0, 1, 2, 3, 4]  # the first stream's steps, at least


def test_xz_cut_short_reads_its_intact_part(tmp_path, data):
    packed = lzma.compress(data, format=lzma.FORMAT_XZ)
    log = attnlog.open_log(saved(tmp_path, packed[:len(packed) * 2 // 3], "cut.attnlog.xz"))
    assert log.problems[0].startswith("the xz file ends early: read the ")
    steps = log.scalars("loss")[0].tolist()
    assert 0 < len(steps) < 10 and steps == list(range(len(steps)))
    assert_one_line_error(run_cli("info", saved(tmp_path, b"\xfd7zXZ\0" + bytes(40), "junk.xz")),
                          "junk.xz: damaged xz compression")
