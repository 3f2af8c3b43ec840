#!/usr/bin/env python3
"""Whether two training runs are the same run, bit for bit: their logs' step records (loss, lr,
grad_norm; not the timing fields tokens_per_s and ms), validation records and telemetry records,
and their final checkpoints' payloads (after the 256-byte header, which holds the random run ids).
Notes are not compared (they hold times and paths).

    dev/compare_runs.py RUN_DIR_A RUN_DIR_B      each holding run.attnlog and model.ckpt

Prints what it compared and each difference; exits 0 when the runs are the same, 1 when not.
Reads the files by docs/log_format.md and docs/checkpoint_format.md alone (no project module).
"""
import json
import struct
import sys
import zlib
from pathlib import Path

PREAMBLE = struct.Struct("<8sIII")  # magic, version, header length, header CRC
FRAME = struct.Struct("<4sHHIq")  # marker, type, flags, payload length, step
MARKER = b"\xffREC"
STEP, VAL, TELEMETRY, NOTE = 1, 2, 3, 4
STEP_FIELDS_COMPARED = 12  # loss, lr, grad_norm: the step record's first three float32
CHECKPOINT_HEADER = 256


def read_log(path):
    """The header (parsed) and the intact records as (type, step, payload), in file order."""
    data = Path(path).read_bytes()
    magic, _version, header_len, _crc = PREAMBLE.unpack_from(data, 0)
    if magic != b"ATTNLOG\0":
        sys.exit(f"{path}: not a run log")
    header = json.loads(data[PREAMBLE.size:PREAMBLE.size + header_len])
    records, pos = [], PREAMBLE.size + header_len
    while pos + FRAME.size + 4 <= len(data):
        marker, rtype, _flags, length, step = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length
        if marker != MARKER or end + 4 > len(data):
            sys.exit(f"{path}: a damaged record at byte {pos}; compare logs of runs that ended normally")
        (crc,) = struct.unpack_from("<I", data, end)
        if zlib.crc32(data[pos + 4:end]) != crc:
            sys.exit(f"{path}: a record at byte {pos} fails its checksum")
        records.append((rtype, step, data[pos + FRAME.size:end]))
        pos = end + 4
    return header, records


def compare_logs(a, b):
    (header_a, records_a), (header_b, records_b) = read_log(a), read_log(b)
    problems = []
    for key in ("config", "records"):
        if header_a.get(key) != header_b.get(key):
            problems.append(f"the headers' {key} differ")
    counts = {}
    for rtype, name in ((STEP, "step"), (VAL, "val"), (TELEMETRY, "telemetry")):
        xs = [(s, p) for t, s, p in records_a if t == rtype]
        ys = [(s, p) for t, s, p in records_b if t == rtype]
        counts[name] = len(xs)
        if len(xs) != len(ys):
            problems.append(f"{len(xs)} {name} records against {len(ys)}")
            continue
        for (sx, px), (sy, py) in zip(xs, ys):
            if rtype == STEP:
                px, py = px[:STEP_FIELDS_COMPARED], py[:STEP_FIELDS_COMPARED]
            if sx != sy or px != py:
                problems.append(f"the {name} records of step {sx} differ")
                break
    return counts, problems


def compare_checkpoints(a, b):
    x, y = Path(a).read_bytes(), Path(b).read_bytes()
    if x[CHECKPOINT_HEADER:] != y[CHECKPOINT_HEADER:]:
        return [f"the checkpoints' payloads differ ({len(x)} and {len(y)} bytes)"]
    return []


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    counts, problems = compare_logs(a / "run.attnlog", b / "run.attnlog")
    problems += compare_checkpoints(a / "model.ckpt", b / "model.ckpt")
    size = (a / "model.ckpt").stat().st_size - CHECKPOINT_HEADER
    print(f"compared {counts['step']} step records (loss, lr, grad_norm), {counts['val']} val records, "
          f"{counts['telemetry']} telemetry records and {size} bytes of checkpoint payload")
    for p in problems:
        print("DIFFERENT:", p)
    print("the same run, bit for bit" if not problems else "the runs differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
