"""Fuzzing of the log reader (attnlog.reader): thousands of damaged and malformed logs, made from logs the C++ writer
wrote (test/test_runlog.cpp) by a seeded generator, so that every run makes the same ones. Each must
either open, and then read in full (every field of every record type, the notes, the counts, the
step range, and info, dump, csv and export through the command line's own functions) with no error
but LogError, or be refused with one LogError of one line; the command line exits 0, or 1 with one
line `error: FILE: ...`; no case takes long. Where the header survives, the records the reader finds
are the ones the rules of docs/log_format.md, read literally, find.

    TEST_RUNLOG_BIN=build/test_runlog /usr/bin/python3 -m pytest -q -s test/test_attnlog_fuzz.py
"""
import contextlib
import copy
import io
import json
import re
import struct
import time
import zlib

import numpy as np
import pytest

from attnlog import commands, reader
from test_attnlog import attnlog, make_record, run_writer, with_header

pytestmark = pytest.mark.filterwarnings("error")  # the command line prints nothing but its output and one error line

SEED = 20251126
CASE_SECONDS = 2.0  # what one case may take, opening, reading and the command line together; most take ms
MARKER = b"\xffREC"


def pick(rng, choices):
    return choices[rng.integers(len(choices))]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """The logs every case starts from: a run as written, and a resumed one (a resume note, steps re-done)."""
    folder = tmp_path_factory.mktemp("bases")
    run_writer("write", folder / "run.attnlog")
    resumed = folder / "resumed.attnlog"
    resumed.write_bytes((folder / "run.attnlog").read_bytes())
    run_writer("append", resumed)
    return [(folder / name).read_bytes() for name in ("run.attnlog", "resumed.attnlog")]


def header_end(data):
    return 20 + struct.unpack_from("<I", data, 12)[0]


# -- what a case must satisfy ------------------------------------------------------------------------


class Tally:
    """What the cases came to, printed at the end of each test."""

    def __init__(self, name):
        self.name, self.opened, self.refused, self.slowest, self.errors = name, 0, 0, 0.0, {}

    def say(self):
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.errors.items(), key=lambda kv: -kv[1]))
        print(f"\n{self.name}: {self.opened + self.refused} cases, {self.opened} opened and read in full, "
              f"{self.refused} refused with one line ({kinds}); slowest {self.slowest * 1000:.0f} ms")


def check_case(path, tally, rng, literal=True):
    """Opens the log at path and reads everything in it, as the library and as the command line
    (one subcommand, chosen by rng, besides info); True when it opened. literal: compare the records
    found with check_records."""
    start = time.perf_counter()
    try:
        log = attnlog.open_log(path)
    except attnlog.LogError as e:
        message = str(e)
        assert message.startswith(str(path)) and len(message.splitlines()) == 1 and "\n" not in message, message
        kind = re.sub(r"[^a-z ].*", "", message[len(str(path)) + 2:]).strip()
        tally.errors[kind] = tally.errors.get(kind, 0) + 1
        log = None
    if log is not None:
        read_everything(log)
        if literal:
            check_records(log)
    run_cli(["info", path], log is not None)
    run_cli(pick_command(rng, path, log), None)
    took = time.perf_counter() - start
    tally.slowest = max(tally.slowest, took)
    assert took < CASE_SECONDS, f"{path}: {took:.1f} s"
    if log is None:
        tally.refused += 1
    else:
        tally.opened += 1
    return log is not None


def maybe(call, *args):
    """call(*args), or None where it raises LogError (a field the log does not have, say)."""
    try:
        return call(*args)
    except attnlog.LogError as e:
        assert len(str(e).splitlines()) == 1
        return None


def read_everything(log):
    for rtype in log.record_types.values():
        for name, spec in rtype.fields.items():
            if spec["dtype"] == "utf8":
                continue
            steps, values = log.read(rtype.name, name)
            assert values.shape == (len(steps),) + spec["shape"] and steps.dtype == np.int64
            assert (steps[1:] > steps[:-1]).all()
    for name in log.scalar_names():
        log.scalars(name)
    for name in log.metric_names():
        log.metric(name)
    maybe(log.val_loss)
    notes = log.notes()
    assert all(isinstance(text, str) and isinstance(step, int) for step, text in notes)
    counts = log.record_counts()
    assert set(counts) == set(log.record_types) and all(n >= 0 for n in counts.values())
    span = log.step_range()
    assert span is None or span[0] <= span[1]
    assert all(isinstance(p, str) and len(p.splitlines()) == 1 for p in log.problems)
    for block in attnlog.long_table(log, "label"):
        assert len({len(column) for column in block.values()}) == 1


def pick_command(rng, path, log):
    """One subcommand of the command line, with options that make sense for the log where it opened."""
    metrics = log.metric_names() if log is not None else []
    metric = pick(rng, metrics) if metrics and rng.random() < 0.8 else "k_norm"
    span = log.step_range() if log is not None else None
    step = int(rng.integers(span[0], span[1] + 1)) if span and span[1] - span[0] < 2**62 else 3
    out = path.with_name("out" + (".csv" if rng.random() < 0.7 else ".npz"))
    choices = [["dump", path], ["dump", path, "--step", step], ["dump", path, "--metric", metric],
               ["csv", path], ["csv", path, "--val"], ["csv", path, "--metric", metric],
               ["export", path, "-o", out], ["export", path, path, "-o", out, "--run-label", "a"]]
    return pick(rng, choices)


def run_cli(argv, opens):
    """The command line in this process: exit status 0, or 1 with one line `error: FILE: ...`;
    opens: whether the log opened (then the command must not fail on it), None if unknown."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = reader.main([str(a) for a in argv])
    assert status in (0, commands.USER_ERROR), (argv, status)
    if status:
        assert err.getvalue().startswith("error: ") and len(err.getvalue().splitlines()) == 1, err.getvalue()
        assert err.getvalue().endswith("\n") and not (opens and argv[0] == "info"), err.getvalue()
    else:
        assert err.getvalue() == "", err.getvalue()


# -- the rules of docs/log_format.md, read literally --------------------------------------------------


def literal_records(data, pos):
    """(offsets of the intact records, damaged stretches [(start, stop)]) as the reading rules say:
    take a record where one is intact, else search forward from the next byte for the first marker
    that frames an intact record. Quadratic at worst, which the small logs here do not mind."""

    def intact(at):
        if data[at:at + 4] != MARKER or at + 24 > len(data):
            return False
        length = struct.unpack_from("<I", data, at + 8)[0]
        if at + 24 + length > len(data):
            return False
        return zlib.crc32(data[at + 4:at + 20 + length]) == struct.unpack_from("<I", data, at + 20 + length)[0]

    found, damaged = [], []
    while pos < len(data):
        if intact(pos):
            found.append(pos)
            pos += 24 + struct.unpack_from("<I", data, pos + 8)[0]
            continue
        stop = data.find(MARKER, pos + 1)
        while stop != -1 and not intact(stop):
            stop = data.find(MARKER, stop + 1)
        stop = len(data) if stop == -1 else stop
        damaged.append((pos, stop))
        pos = stop
    return found, damaged


def check_records(log):
    """The reader's records, damage, counts and set-aside continuations are the literal rules'."""
    data = bytes(log._buf)
    start = header_end(data)
    found, damaged = literal_records(data, start)
    (offsets, _, _, _), got_damaged = reader._records(data, start)
    assert offsets.tolist() == found and got_damaged == damaged
    types = {t.id: t for t in log.record_types.values()}
    kept = {name: [] for name in log.record_types}  # name -> [(offset, step)] of the records of a usable length
    resumes = []  # (note offset, step it resumed from)
    for at in found:
        rtype, _, length, step = struct.unpack_from("<HHIq", data, at + 4)
        t = types.get(rtype)
        if t is None or (length != t.payload_bytes if t.payload_bytes is not None else length < t.fixed_bytes):
            continue
        kept[t.name].append((at, step))
        resumed = reader.RESUMED.match(data[at + 20:at + 20 + min(length, 64)].decode("utf-8", "replace"))
        if t.name == "note" and resumed and int(resumed.group(1)) < 2**63:
            resumes.append((at, int(resumed.group(1))))
    superseded = []
    for note_at, resumed in resumes:  # each record set aside by the first resume note after it that covers its step
        count = 0
        for name, records in kept.items():
            if name != "note":
                count += sum(at < note_at and step >= resumed for at, step in records)
                kept[name] = [(at, step) for at, step in records if not (at < note_at and step >= resumed)]
        if count:
            superseded.append((resumed, count))
    assert log.superseded == superseded
    assert log.record_counts() == {name: len(records) for name, records in kept.items()}


# -- damage to the records ---------------------------------------------------------------------------


def boundaries(data):
    """Offsets where a cut is most likely to find a mistake: every byte of the preamble, around the
    end of the header, and at and near each part of each record's frame."""
    cuts = set(range(0, 25)) | {header_end(data) + d for d in (-2, -1, 0, 1, 2)}
    found, _ = literal_records(data, header_end(data))
    for at in found:
        length = struct.unpack_from("<I", data, at + 8)[0]
        for part in (0, 1, 3, 4, 6, 8, 12, 19, 20, 20 + length // 2, 20 + length - 1, 20 + length, 23 + length):
            cuts.add(at + part)
    return sorted(c for c in cuts if c <= len(data))


def test_truncated_at_every_boundary(tmp_path, bases):
    tally, rng = Tally("truncations"), np.random.default_rng(SEED)
    path = tmp_path / "cut" / "run.attnlog"
    path.parent.mkdir()
    for data in bases:
        for cut in boundaries(data):
            path.write_bytes(data[:cut])
            opened = check_case(path, tally, rng)
            assert opened == (cut >= header_end(data)), cut  # the header whole: it opens, whatever the records
    tally.say()


def false_frame(rng, data, at):
    """A marker and a frame that claims a record: of a known or unknown type, a length that is small,
    exact to somewhere later in the file, past its end, or huge; an arbitrary checksum after it."""
    rest = len(data) - at
    length = [int(rng.integers(0, 64)), int(rng.integers(0, max(rest, 1))), max(rest - 24, 0), rest + 10,
              2**32 - 1, 0x434552FF][rng.integers(6)]
    rtype = pick(rng, [1, 2, 3, 4, 77, 0xFFFF])
    frame = MARKER + struct.pack("<HHIq", rtype, int(rng.integers(0, 3)), length, int(rng.integers(-5, 20)))
    return frame + rng.bytes(int(rng.integers(0, 8)))


def intact_record(rng, log_types):
    """A record with a right checksum: of a known type with the right or a wrong length, of an unknown
    type, or a note, often one that says the run resumed from some step."""
    rtype = pick(rng, log_types + [77])
    step = pick(rng, [0, 3, 5, 9, 11, 2**63 - 1, -(2**63), int(rng.integers(0, 12))])
    if rtype == 4:
        text = f"resumed from step {pick(rng, [0, 4, 6, 9, 10**30])}" if rng.random() < 0.6 else "a note"
        return make_record(rtype, step, text.encode() + rng.bytes(int(rng.integers(0, 4))))
    sizes = {1: 20, 2: 4}
    length = sizes.get(rtype, int(rng.integers(0, 200))) if rng.random() < 0.7 else int(rng.integers(0, 64))
    return make_record(rtype, step, rng.bytes(length))


def damage(rng, data):
    """data with one to four pieces of damage after the header (bit flips, false frames, intact records
    where they do not belong, stretches deleted, repeated, zeroed or full of markers, a cut)."""
    data, start = bytearray(data), header_end(data)
    for _ in range(rng.integers(1, 5)):
        at = int(rng.integers(start, len(data) + 1))
        span = int(rng.integers(1, 200))
        kind = rng.integers(9)
        if kind == 0 and at < len(data):
            data[at] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            data[at:at] = false_frame(rng, data, at)
        elif kind == 2:
            data[at:at] = intact_record(rng, [1, 2, 3, 4])
        elif kind == 3:
            del data[at:at + span]
        elif kind == 4:
            source = int(rng.integers(start, len(data)))
            data[at:at] = data[source:source + span]
        elif kind == 5:
            data[at:at + span] = bytes(len(data[at:at + span]))
        elif kind == 6:
            data[at:at] = MARKER * int(rng.integers(1, pick(rng, [50, 600])))
        elif kind == 7:
            del data[at:]
        else:  # records after the last resume note, or a resume note after everything
            data += b"".join(intact_record(rng, [1, 2, 3, 4]) for _ in range(rng.integers(1, 4)))
    return bytes(data)


def test_damaged_records(tmp_path, bases):
    """Damage after the header: every log opens, and finds what the literal rules find."""
    tally, rng = Tally("damaged records"), np.random.default_rng(SEED + 1)
    path = tmp_path / "damaged" / "run.attnlog"
    path.parent.mkdir()
    for case in range(1000):
        path.write_bytes(damage(rng, bases[case % 2]))
        assert check_case(path, tally, rng), case
    tally.say()


def test_damage_anywhere(tmp_path, bases):
    """Bytes flipped anywhere, the preamble and the header included."""
    tally, rng = Tally("damage anywhere"), np.random.default_rng(SEED + 2)
    path = tmp_path / "anywhere" / "run.attnlog"
    path.parent.mkdir()
    for case in range(300):
        data = bytearray(bases[case % 2])
        for _ in range(rng.integers(1, 4)):
            data[rng.integers(min(len(data), 200 if rng.random() < 0.5 else len(data)))] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(data))
        check_case(path, tally, rng)
    tally.say()


# -- headers whose checksum is right but whose content is not ------------------------------------------


def deep(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


ODD_VALUES = [None, True, False, 0, -1, 1, 3, 2**31, 2**31 + 1, 2**32, 2**63, 2**64, -(2**63), 1.5, -0.0, 1e300,
              "", "x", "float17", "utf8", "int64", "float64", "layer", "line\nbreak\u2028", "\ufffd", [], [-1], [0],
              [1], [3, 2], [2**31, 0], [0, 2**31], [2**31, 2**31], [1] * 40, [3, 2.5], [3, -2], [3, "2"], [3, None],
              [True], {}, {"a": 1}, {"type": 1}, ["layer", 2], deep(70), deep(20), list(range(300))]


def nodes(value, path=()):
    """Every (path, value) in the JSON value, the value itself first."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from nodes(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from nodes(item, path + (i,))


def mutate_header(rng, header):
    """One structural change to the header (a copy): a member replaced by an odd value, removed,
    repeated, wrapped, or an unknown member added; half the time in the record table."""
    header = copy.deepcopy(header)
    every = list(nodes(header))[1:]
    table = [node for node in every if node[0][0] == "records"]
    path, value = pick(rng, table if table and rng.random() < 0.5 else every)
    parent = header
    for key in path[:-1]:
        parent = parent[key]
    key, kind = path[-1], rng.integers(6)
    if kind <= 1:
        parent[key] = copy.deepcopy(ODD_VALUES[rng.integers(len(ODD_VALUES))])
    elif kind == 2:
        del parent[key]
    elif kind == 3 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))  # a record type or a field twice
    elif kind == 3:
        parent[key] = [value] if rng.random() < 0.5 else {"value": value}
    elif kind == 4 and isinstance(value, dict):
        value["unknown"] = copy.deepcopy(ODD_VALUES[rng.integers(len(ODD_VALUES))])
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = [value * 1000, -value, value + 0.5, value or 1][rng.integers(4)]
    else:
        parent[key] = copy.deepcopy(ODD_VALUES[rng.integers(len(ODD_VALUES))])
    return header


def relayout_header(rng, header):
    """One change to the header (a copy) that leaves it well-formed but lays its records out otherwise:
    a field reshaped (as many values or not), of another dtype, renamed, dropped, moved or made text; a
    record type renumbered, renamed as another, dropped, or given a field after its text; members the
    reader does not need dropped, unknown ones added; config values of other numbers."""
    header = copy.deepcopy(header)
    table = header["records"]
    entry = pick(rng, table)
    fields = entry["fields"]
    field = pick(rng, fields) if fields else {"name": "x", "dtype": "float32", "shape": [], "dims": []}
    kind = rng.integers(12)
    if kind == 0:
        field["shape"] = pick(rng, [[], [1], [6], [2, 3], [3, 2, 1], [1, 1, 6], [0], [3, 0], [2**31, 0, 0]])
        field["dims"] = [pick(rng, ["layer", "kv_head", "q_head", "dim", "x"]) for _ in field["shape"]]
    elif kind == 1:
        field["dtype"] = pick(rng, ["float32", "int32", "float64", "int64"])
    elif kind == 2:
        field["name"] = pick(rng, ["loss", "val_loss", "k_norm", "text", "new"])
        entry["fields"] = list({f["name"]: f for f in fields}.values())  # a name once, as the format requires
    elif kind == 3 and fields:
        fields.remove(field)
    elif kind == 4 and fields:
        fields.insert(rng.integers(len(fields) + 1), fields.pop(rng.integers(len(fields))))
    elif kind == 5:
        fields[-1:] = [{"name": "text", "dtype": "utf8", "shape": [-1], "dims": ["byte"]}]
    elif kind == 6:
        others = [t["type"] for t in table]
        entry["type"] = pick(rng, [t for t in (0, 1, 2, 3, 4, 5, 77, 0xFFFF) if t not in others] or [entry["type"]])
    elif kind == 7:
        other = pick(rng, table)
        entry["name"], other["name"] = other["name"], entry["name"]
    elif kind == 8:
        table.remove(entry)
    elif kind == 9:
        for key in ("created", "options", "seed", "backend", "device"):
            if rng.random() < 0.5:
                header.pop(key, None)
    elif kind == 10:
        header[pick(rng, ["num_processes", "compression", "z"])] = copy.deepcopy(pick(rng, ODD_VALUES[:43]))
    else:
        key = pick(rng, list(header["config"]))
        header["config"][key] = pick(rng, [0, -3, 2.5, 1e-300, 10**18, 1e300])
    return header


def mutate_text(rng, text):
    """A change to the header's text that no JSON encoder makes: NaN or Infinity, a number of too many
    digits or too large for a float, deep nesting, a lone surrogate, bytes that are no UTF-8, a cut,
    trailing bytes, or a whole other JSON value."""
    numbers = [m.start() for m in re.finditer(rb"(?<=[:\[ ])-?\d", text)]
    at = numbers[rng.integers(len(numbers))] if numbers else 0
    number = re.match(rb"-?[\d.eE+-]+", text[at:])
    end = at + (len(number.group()) if number else 0)
    kind = rng.integers(9)
    if kind == 0:
        return text[:at] + [b"NaN", b"Infinity", b"-Infinity"][rng.integers(3)] + text[end:]
    if kind == 1:
        return text[:at] + [b"1e999", b"9" * 5000, b"-1e400", b"1" + b"0" * 400][rng.integers(4)] + text[end:]
    if kind == 2:
        levels = pick(rng, [65, 1000, 100000])
        return text[:at] + b"[" * levels + b"1" + b"]" * levels + text[end:]
    if kind == 3:
        quote = text.find(b'"', int(rng.integers(len(text))))
        return text[:quote + 1] + pick(rng, [b"\\ud800", b"\\udfff x", b"\\ud83d\\ude00"]) + text[quote + 1:]
    if kind == 4:
        at = int(rng.integers(len(text)))
        return text[:at] + pick(rng, [b"\xff", b"\xc3", b"\xed\xa0\x80"]) + text[at:]
    if kind == 5:
        return text[:rng.integers(len(text))]
    if kind == 6:
        return text + pick(rng, [b" x", b"{}", b"\0"])
    if kind == 7:
        return pick(rng, [b"null", b"[]", b"1", b'"attnlog"', b"{}", b'{"format": "attnlog", "version": 1}'])
    return text.replace(b'"version": 1', pick(rng, [b'"version": 1.0', b'"version": true', b'"version": "1"']))


def test_malformed_headers(tmp_path, bases):
    """Headers with a right checksum and wrong content: each opens (then reads in full) or is refused
    with one line; in the preamble, now and then another version."""
    tally, rng = Tally("malformed headers"), np.random.default_rng(SEED + 3)
    path = tmp_path / "headers" / "run.attnlog"
    path.parent.mkdir()
    parsed = [json.loads(data[20:header_end(data)]) for data in bases]
    for case in range(1800):
        data, header = bases[case % 2], parsed[case % 2]
        chance = rng.random()
        if chance < 0.75:
            for _ in range(rng.integers(1, 4)):
                header = (mutate_header if chance < 0.4 else relayout_header)(rng, header)
            text = json.dumps(header).encode()
        else:
            text = mutate_text(rng, data[20:header_end(data)])
        version = pick(rng, [1, 1, 1, 1, 1, 1, 0, 2])
        path.write_bytes(with_header(data, text, version))
        check_case(path, tally, rng, literal=version == 1)
    tally.say()
