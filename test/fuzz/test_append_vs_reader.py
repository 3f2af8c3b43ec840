"""The run log appender against the reader: runlog_open_append (llmc/runlog.h) must refuse every
log whose header scripts/attnlog.py rejects, and a log it accepts must read back with the same
record table. Checked on a few hundred headers mutated at random from one the writer made (the
checksum set right, so that the content alone decides), and on mutations that keep the JSON valid
but change what it says.

    /usr/bin/python3 -m pytest -q test/fuzz/test_append_vs_reader.py    (after make test's build)
"""
import json
import os
import random
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

import attnlog

ROOT = Path(__file__).resolve().parent.parent.parent

WRITER = Path(os.environ.get("TEST_RUNLOG_BIN", ROOT / "build" / "test_runlog"))
ALPHABET = list(' \t\n"\\{}[],:0123456789-+.eEabnrtuxfl') + ["\x00", "\x1f", "\u00e9", "\ud800"]


def with_header(log, text):
    """The log with its header text replaced, the preamble's length and CRC set to match."""
    length = struct.unpack_from("<I", log, 12)[0]
    return log[:12] + struct.pack("<II", len(text), zlib.crc32(text)) + text + log[20 + length:]


def reader_verdict(path):
    """The record table the reader decodes with, or None when it rejects the log."""
    try:
        log = attnlog.open_log(path)
    except (attnlog.LogError, RecursionError):
        return None
    return {name: (t.id, [(f, d["dtype"], d["shape"]) for f, d in t.fields.items()]) for name, t in log.record_types.items()}


def random_mutation(text, rng):
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(chars))
        kind = rng.choice(("delete", "insert", "replace"))
        if kind == "delete":
            del chars[at]
        elif kind == "insert":
            chars.insert(at, rng.choice(ALPHABET))
        else:
            chars[at] = rng.choice(ALPHABET)
    return "".join(chars).encode("utf-8", "surrogatepass")


def valid_json_mutations(header):
    """Headers that stay valid JSON but say something else: each member dropped or changed."""
    out = []
    for key in header:
        out.append({k: v for k, v in header.items() if k != key})
        for value in (None, 1, 1.0, True, "1", [], {}):
            out.append({**header, key: value})
    for t in range(len(header["records"])):
        for key in ("type", "name", "fields"):
            records = json.loads(json.dumps(header["records"]))
            records[t][key] = {"type": 7, "name": "x", "fields": []}[key]
            out.append({**header, "records": records})
        for f in range(len(header["records"][t]["fields"])):
            for key, value in (("shape", [2]), ("shape", [-1]), ("dtype", "int8"), ("dtype", "utf8"), ("name", "other"),
                               ("dims", ["layer"]), ("meaning", "reworded")):
                records = json.loads(json.dumps(header["records"]))
                records[t]["fields"][f][key] = value
                out.append({**header, "records": records})
    return [json.dumps(h, indent=1).encode() for h in out]


@pytest.fixture(scope="module")
def base_log(tmp_path_factory):
    if not WRITER.exists():
        pytest.fail(f"{WRITER} is missing: run make test")
    path = tmp_path_factory.mktemp("base") / "run.attnlog"
    subprocess.run([WRITER, "write", path], check=True)
    return path.read_bytes()


def test_appender_refuses_what_the_reader_rejects(base_log, tmp_path):
    length = struct.unpack_from("<I", base_log, 12)[0]
    text = base_log[20:20 + length].decode()
    rng = random.Random(20240520)
    headers = [random_mutation(text, rng) for _ in range(400)] + valid_json_mutations(json.loads(text))
    paths, verdicts = [], []
    for i, header in enumerate(headers):
        path = tmp_path / f"log{i}.attnlog"
        path.write_bytes(with_header(base_log, header))
        verdicts.append(reader_verdict(path))
        paths.append(path)
    appended = subprocess.run([WRITER, "check-append", *paths], stdout=subprocess.PIPE, text=True, check=True)
    outcomes = appended.stdout.splitlines()
    assert len(outcomes) == len(paths)
    original = tmp_path / "original.attnlog"
    original.write_bytes(base_log)
    expected = reader_verdict(original)
    accepted = 0
    for path, header, verdict, outcome in zip(paths, headers, verdicts, outcomes):
        if verdict is None:
            assert outcome.startswith("refused: error: "), (header[:300], outcome)
        if outcome == "accepted":
            accepted += 1
            assert reader_verdict(path) == expected, header[:300]
            assert path.read_bytes().startswith(with_header(base_log, header))
        else:
            assert path.read_bytes() == with_header(base_log, header), outcome  # refused: untouched
    rejected = sum(v is None for v in verdicts)
    # Not vacuous: both kinds occur, and some logs the reader reads are refused (their table differs).
    assert accepted >= 20 and rejected >= 100, (accepted, rejected)
    refused_only_here = sum(v is not None and o != "accepted" for v, o in zip(verdicts, outcomes))
    print(f"{len(headers)} headers: the reader rejects {rejected}, the appender accepts {accepted} and refuses "
          f"{refused_only_here} the reader reads")
    assert refused_only_here >= 20
