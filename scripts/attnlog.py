#!/usr/bin/env python3
"""Reads the trainer's binary run log (docs/log_format.md): a library and a command line.

Library (numpy is all it needs):
    import attnlog
    log = attnlog.open_log("run.attnlog")
    steps, loss = log.scalars("loss")          # one value per training step
    steps, val = log.val_loss()
    steps, k_norm = log.metric("k_norm")       # [steps, n_layer, n_kv_head]
    log.problems                               # what was damaged or skipped, in words

Command line:
    attnlog.py info LOG                                           header, counts, problems
    attnlog.py dump LOG [--metric NAME] [--step N]                records as readable text
    attnlog.py csv LOG [--metric NAME | --scalars | --val] [-o FILE]   a tidy CSV table
    attnlog.py export LOG [LOG ...] -o FILE.csv|FILE.npz [--run-label L ...]
                                                                  every value of every log, one row each

A log that cannot be read raises LogError, whose message is one line; the command line prints it
and exits with status 2.
"""
import argparse
import csv
import json
import mmap
import os
import re
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

MAGIC = b"ATTNLOG\0"
VERSION = 1  # the newest format version this reader understands
MARKER = b"\xffREC"
PREAMBLE = struct.Struct("<8sIII")  # magic, version, header length, CRC-32 of the header
FRAME = struct.Struct("<4sHHIq")  # marker, record type, flags, payload length, step
CRC = struct.Struct("<I")  # after the payload: CRC-32 of everything from the type to here
OVERHEAD = FRAME.size + CRC.size
RESUMED = re.compile(r"resumed from step (\d+)")  # the note a resumed run begins with
DTYPES = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8"}  # and "utf8"
HEADER_KEYS = ("format", "version", "created", "config", "options", "seed", "backend", "device", "records")


class LogError(Exception):
    """A log that cannot be read (or an export that cannot be made); str(error) is one line naming
    the file and what is wrong. For a log of a newer format version, .header holds the header fields
    this reader understands."""

    def __init__(self, message, header=None):
        super().__init__(message)
        self.header = header


class RecordType:
    """One entry of the header's record table: .id, .name, and .fields, which maps each field's
    name to its header entry (dtype, shape, dims, meaning) plus "offset", its place in the payload."""

    def __init__(self, entry):
        self.id = int(entry["type"])
        self.name = str(entry["name"])
        self.fields = {}
        offset = 0  # None once a text field has taken the rest of the payload
        for field in entry["fields"]:
            if offset is None:
                raise ValueError(f"record type {self.name} has a field after its text field")
            shape = tuple(int(n) for n in field["shape"])
            self.fields[str(field["name"])] = dict(field, shape=shape, offset=offset)
            if field["dtype"] == "utf8":
                offset = None
            elif field["dtype"] in DTYPES and min(shape, default=0) >= 0:
                offset += np.dtype(DTYPES[field["dtype"]]).itemsize * int(np.prod(shape))
            else:
                raise ValueError(f"field {field['name']} has dtype {field['dtype']} and shape {shape}")
        self.payload_bytes = offset  # None when the payload's length varies


def open_log(path):
    """Opens and checks a run log; raises LogError when it cannot be read."""
    return RunLog(path)


class RunLog:
    """An opened log: .path, .header (the header's JSON as a dict), .config (the model), .version,
    .record_types (name -> RecordType) and .problems (damage found and records skipped, in words).
    Arrays are read from the file, mapped into memory, when asked for."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.problems = []
        self.superseded = []  # (resume step, records set aside): see _set_aside_abandoned
        self._buf = _map_file(self.path)
        self.version, self.header, records_start = self._read_header()
        self.config = self.header["config"]
        self.record_types = {t.name: t for t in self._record_table(records_start)}
        self._scan(records_start)

    # -- reading the file ------------------------------------------------------------------------

    def _read_header(self):
        buf, path = self._buf, self.path
        if buf[:len(MAGIC)] != MAGIC[:len(buf)]:
            raise LogError(f"{path}: not a run log (the file does not start with ATTNLOG)")
        if len(buf) < PREAMBLE.size:
            raise LogError(f"{path}: truncated header: the file is {len(buf)} bytes, its preamble "
                           f"alone is {PREAMBLE.size}; nothing can be read")
        _, version, length, crc = PREAMBLE.unpack_from(buf, 0)
        end = PREAMBLE.size + length
        if end > len(buf):
            raise LogError(f"{path}: truncated header: {length} bytes announced, "
                           f"{len(buf) - PREAMBLE.size} present; nothing can be read")
        text = buf[PREAMBLE.size:end]
        crc_ok = zlib.crc32(text) == crc
        header = _parse_json(text) if crc_ok else None
        if version > VERSION:
            known = {k: header[k] for k in HEADER_KEYS if k in header} if header else None
            said = f"its header reads: {_summary(known)}" if known else "its header is unreadable too"
            raise LogError(f"{path}: format version {version} is newer than this reader's "
                           f"({VERSION}); {said}; records not read (a newer attnlog.py reads them)",
                           known)
        if not crc_ok:
            self._damaged_header(f"checksum mismatch (stored {crc:#010x}, computed "
                                 f"{zlib.crc32(text):#010x})", end)
        if header is None:
            self._damaged_header("its text is not valid JSON", end)
        if version != VERSION or header.get("version") != version or header.get("format") != "attnlog":
            self._damaged_header(f"the preamble says version {version}, the text says format "
                                 f"{header.get('format')!r} version {header.get('version')!r}", end)
        if not isinstance(header.get("config"), dict):
            self._damaged_header("it has no model configuration", end)
        return version, header, end

    def _record_table(self, records_start):
        try:
            table = [RecordType(entry) for entry in self.header["records"]]
        except (KeyError, TypeError, ValueError) as e:
            self._damaged_header(f"its record table is malformed ({e!r})", records_start)
        if len({t.id for t in table}) != len(table) or len({t.name for t in table}) != len(table):
            self._damaged_header("its record table names a record type twice", records_start)
        return table

    def _damaged_header(self, reason, records_start):
        """Raises LogError, saying what is still there: the intact records, which cannot be
        decoded without the header's record table."""
        view, pos, count = memoryview(self._buf), records_start, 0
        while pos < len(self._buf):
            frame = _intact_frame(self._buf, view, pos)
            if frame:
                count += 1
                pos += OVERHEAD + frame[1]
                continue
            resume = _next_intact(self._buf, view, pos)
            pos = len(self._buf) if resume is None else resume
        raise LogError(f"{self.path}: damaged header: {reason}; {count} intact records follow, "
                       "unreadable without the header's record table")

    def _scan(self, pos):
        """Finds every intact record. Damaged bytes are reported and skipped: reading resumes at
        the next marker that frames an intact record."""
        buf, view, end = self._buf, memoryview(self._buf), len(self._buf)
        types, steps, offsets, lengths = [], [], [], []
        while pos < end:
            frame = _intact_frame(buf, view, pos)
            if frame:
                types.append(frame[0])
                lengths.append(frame[1])
                steps.append(frame[2])
                offsets.append(pos + FRAME.size)
                pos += OVERHEAD + frame[1]
                continue
            resume = _next_intact(buf, view, pos)
            self.problems.append(self._damage(pos, end if resume is None else resume))
            if resume is None:
                break
            pos = resume
        types, steps = np.array(types, np.int64), np.array(steps, np.int64)
        offsets, lengths = np.array(offsets, np.int64), np.array(lengths, np.int64)
        by_id = {t.id: t for t in self.record_types.values()}
        self._index = {}  # type name -> (steps, payload offsets, payload lengths), in file order
        for type_id in np.unique(types).tolist():
            mask = types == type_id
            rtype = by_id.get(type_id)
            if rtype is None:
                self.problems.append(f"{mask.sum()} records of unknown type {type_id} skipped "
                                     "(not in the header's record table)")
                continue
            wrong = mask & (lengths != rtype.payload_bytes) if rtype.payload_bytes is not None else None
            if wrong is not None and wrong.any():
                self.problems.append(
                    f"{wrong.sum()} {rtype.name} records skipped: their payload is not the "
                    f"{rtype.payload_bytes} bytes of the record table (the first at offset "
                    f"{offsets[wrong][0] - FRAME.size})")
                mask &= ~wrong
            self._index[rtype.name] = (steps[mask], offsets[mask], lengths[mask])
        self._set_aside_abandoned()
        for name, (steps, _, _) in self._index.items():
            if name != "note":
                self._report_repeats(name, steps)

    def _set_aside_abandoned(self):
        """A note "resumed from step S" marks where a resumed run began: the records written before
        it for steps S and later belong to the continuation it replaced. They stay in the file, are
        left out of every read, and are counted in self.superseded as (S, records)."""
        self.superseded = []
        steps, offsets, lengths = self._index.get("note", ((), (), ()))
        view = memoryview(self._buf)
        for note_offset, length in zip(offsets, lengths):
            resumed = RESUMED.match(bytes(view[note_offset:note_offset + min(length, 64)]).decode("utf-8", "replace"))
            if not resumed:
                continue
            start, count = int(resumed.group(1)), 0
            for name, (s, o, n) in list(self._index.items()):
                abandoned = (o < note_offset) & (s >= start)
                if name != "note" and abandoned.any():
                    count += int(abandoned.sum())
                    self._index[name] = (s[~abandoned], o[~abandoned], n[~abandoned])
            if count:
                self.superseded.append((start, count))

    def _damage(self, pos, stop):
        """One line about the unreadable bytes [pos, stop)."""
        if pos + OVERHEAD <= len(self._buf):
            marker, type_id, _, length, step = FRAME.unpack_from(self._buf, pos)
            if marker == MARKER and pos + OVERHEAD + length <= len(self._buf):
                kind = next((t.name for t in self.record_types.values() if t.id == type_id), None)
                kind = f"{kind} record" if kind else f"record of type {type_id}"
                return (f"checksum mismatch in the {kind} at offset {pos} (step {step}): "
                        f"{stop - pos} bytes skipped")
        if stop == len(self._buf):
            return f"torn tail: {stop - pos} bytes at offset {pos} ignored"
        return f"damaged bytes: {stop - pos} bytes at offset {pos} skipped"

    def _report_repeats(self, name, steps):
        values, counts = np.unique(steps, return_counts=True)
        repeated = values[counts > 1]
        if len(repeated):
            where = f"step {repeated[0]}" if len(repeated) == 1 else f"steps {repeated[0]}..{repeated[-1]}"
            self.problems.append(f"{(counts - 1).sum()} {name} records repeat {where} (a resumed run "
                                 "re-did them); the later records are used")

    # -- the data ------------------------------------------------------------------------------------

    def read(self, type_name, field_name):
        """(steps, values) of one numeric field of a record type of the header's record table:
        steps ascending, values [steps, *field shape]. When a step was recorded more than once,
        the later record wins."""
        rtype = self.record_types.get(type_name)
        if rtype is None or field_name not in rtype.fields or rtype.fields[field_name]["dtype"] == "utf8":
            known = ", ".join(f for f, spec in rtype.fields.items() if spec["dtype"] != "utf8") if rtype else ""
            raise LogError(f"{self.path}: no {type_name} field named {field_name!r}"
                           + (f" (it has {known})" if known else f" (no {type_name} records in its table)"))
        spec = rtype.fields[field_name]
        dtype, shape = np.dtype(DTYPES[spec["dtype"]]), spec["shape"]
        steps, offsets, _ = self._index.get(type_name, (np.zeros(0, np.int64),) * 3)
        last = len(steps) - 1 - np.unique(steps[::-1], return_index=True)[1]
        steps, starts = steps[last], offsets[last] + spec["offset"]
        values = np.empty((len(steps),) + shape, dtype)
        rows = values.reshape(len(steps), int(np.prod(shape, dtype=np.int64)))  # also for no records
        for i, start in enumerate(starts.tolist()):  # one copy per record, straight from the file
            rows[i] = np.frombuffer(self._buf, dtype, rows.shape[1], start)
        return steps, values

    def scalars(self, name):
        """(steps, values) of one field of the step records: loss, lr, grad_norm, tokens_per_s, ms."""
        return self.read("step", name)

    def scalar_names(self):
        return list(self.record_types["step"].fields) if "step" in self.record_types else []

    def val_loss(self):
        """(steps, values) of the validation loss."""
        return self.read("val", "val_loss")

    def metric(self, name):
        """(steps [S], values [S, n_layer, cols]) of one telemetry metric."""
        return self.read("telemetry", name)

    def metric_names(self):
        return list(self.record_types["telemetry"].fields) if "telemetry" in self.record_types else []

    def notes(self):
        """Every note as (step, text), in the order they were written."""
        steps, offsets, lengths = self._index.get("note", ((), (), ()))
        view = memoryview(self._buf)
        return [(int(s), bytes(view[o:o + n]).decode("utf-8", "replace"))
                for s, o, n in zip(steps, offsets, lengths)]

    def record_counts(self):
        """Intact records of each type of the record table, repeated steps included."""
        return {name: len(self._index[name][0]) if name in self._index else 0 for name in self.record_types}

    def step_range(self):
        """(first, last) step over all records, or None for a log without records."""
        steps = [index[0] for index in self._index.values() if len(index[0])]
        return (int(min(s.min() for s in steps)), int(max(s.max() for s in steps))) if steps else None


# -- long format: one row per value, for data-frame tools --------------------------------------------

EXPORT_COLUMNS = ("run", "step", "metric", "layer", "head", "head_kind", "value")
EMPTY_DTYPES = {"step": np.int64, "layer": np.int64, "head": np.int64, "value": np.float64}  # others: text


def run_labels(paths, given=()):
    """A label for each log: the given ones first, in order, then folder/stem of the file (the
    trainer names every log run.attnlog, so the folder is what tells runs apart); a label that
    occurs again gets a number, "label (2)"."""
    labels, seen = [], {}
    for i, path in enumerate(paths):
        label = given[i] if i < len(given) else f"{Path(path).resolve().parent.name}/{Path(path).stem}"
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return labels


def long_table(log, label):
    """Every value of the log in long format, one block of equal-length numpy columns (the names of
    EXPORT_COLUMNS) per numeric field of each record type of the header's record table: the step
    records' fields (loss, lr, ...), the validation loss, and every telemetry metric. A field of one
    value per record has layer and head -1 and head_kind "scalar"; a [layer x X] field has a row per
    layer and column, head_kind X (kv_head, q_head or dim). Steps as the reader gives them: ascending,
    a step recorded twice (a resumed run) once, with its later values."""
    for rtype in log.record_types.values():  # in the order of the header's table
        for name, spec in rtype.fields.items():
            if spec["dtype"] == "utf8":
                continue
            steps, values = log.read(rtype.name, name)
            layer, head, kind = _positions(spec)
            rows = len(steps) * len(layer)
            yield {"run": np.full(rows, label), "step": np.repeat(steps, len(layer)), "metric": np.full(rows, name),
                   "layer": np.tile(layer, len(steps)), "head": np.tile(head, len(steps)),
                   "head_kind": np.full(rows, kind), "value": values.astype(np.float64).ravel()}


def _positions(spec):
    """(layer [n], head [n], head_kind) of the n values of one record's field, in payload order."""
    shape, dims = spec["shape"], list(spec.get("dims") or [])
    if not shape:
        return np.full(1, -1), np.full(1, -1), "scalar"
    if len(shape) == 2 and len(dims) == 2 and dims[0] == "layer":
        return np.repeat(np.arange(shape[0]), shape[1]), np.tile(np.arange(shape[1]), shape[0]), str(dims[1])
    size = int(np.prod(shape))  # another layout: the flat index as the head
    return np.full(size, -1), np.arange(size), " x ".join(map(str, dims)) or "value"


def write_long(path, blocks):
    """Writes long_table blocks to path, a .csv (a header row, then a row per value; layer and head
    empty for scalars; every value the exact decimal of its float32, so float() or pandas.read_csv
    read back the same number) or a .npz (one 1-D array per column, strings as fixed-width unicode,
    layer and head -1 for scalars: pandas.DataFrame(dict(numpy.load(path))) loads it). The file
    appears whole or not at all: it is written beside path under another name, then renamed."""
    kind = Path(path).suffix.lower()
    if kind not in (".csv", ".npz"):
        raise LogError(f"{path}: cannot tell the format from the name (it must end in .csv or .npz)")
    temp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{Path(path).name}.{os.getpid()}.part")
    try:
        with open(temp, "x" if kind == ".csv" else "xb", **({"newline": ""} if kind == ".csv" else {})) as out:
            if kind == ".csv":
                _write_csv(out, blocks)
            else:
                blocks = list(blocks) or [{k: np.zeros(0, EMPTY_DTYPES.get(k, "<U1")) for k in EXPORT_COLUMNS}]
                np.savez(out, **{k: np.concatenate([block[k] for block in blocks]) for k in EXPORT_COLUMNS})
        os.replace(temp, path)
    except BaseException as e:
        if os.path.exists(temp):
            os.unlink(temp)
        if isinstance(e, OSError):  # name the file asked for, not the temporary one
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
        raise


def _write_csv(out, blocks):
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for block in blocks:
        layer, head = (np.where(block[k] < 0, "", block[k].astype(str)) for k in ("layer", "head"))
        writer.writerows(zip(block["run"], block["step"].astype(str), block["metric"], layer, head,
                             block["head_kind"], block["value"].astype(str)))


def _map_file(path):
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise LogError(f"{path}: cannot open ({e.strerror})") from None


def _parse_json(text):
    """The header as a dict, or None when it is not a JSON object."""
    try:
        header = json.loads(bytes(text).decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and json.JSONDecodeError are both ValueErrors
        return None
    return header if isinstance(header, dict) else None


def _intact_frame(buf, view, pos):
    """(type, payload length, step) of the record at pos when its marker, length and checksum
    agree, else None."""
    if pos + OVERHEAD > len(buf):
        return None
    marker, type_id, _, length, step = FRAME.unpack_from(buf, pos)
    crc_at = pos + FRAME.size + length
    if marker != MARKER or crc_at + CRC.size > len(buf):
        return None
    if zlib.crc32(view[pos + len(MARKER):crc_at]) != CRC.unpack_from(buf, crc_at)[0]:
        return None
    return type_id, length, step


def _next_intact(buf, view, pos):
    """Offset of the first intact record after pos, or None."""
    pos = buf.find(MARKER, pos + 1)
    while pos != -1 and not _intact_frame(buf, view, pos):
        pos = buf.find(MARKER, pos + 1)
    return None if pos == -1 else pos


def _summary(header):
    """The run a header describes, in one line."""
    parts = [f"{key} {header[key]}" for key in ("created", "backend", "device") if key in header]
    if isinstance(header.get("config"), dict):
        parts.append("model " + " ".join(f"{k}={v}" for k, v in header["config"].items()))
    return ", ".join(parts)


def _text(values):
    """Numbers as the shortest text that reads back as the same value."""
    return np.asarray(values).astype(str)


# -- command line ----------------------------------------------------------------------------------


def command_info(log, args):
    h = log.header
    print(f"{log.path}: {h['format']} format version {log.version}, created {h.get('created')}")
    print(f"run: backend {h.get('backend')}, device {json.dumps(h.get('device'), ensure_ascii=False)}, "
          f"seed {h.get('seed')}")
    print("model: " + " ".join(f"{k}={v}" for k, v in log.config.items()))
    options = h.get("options") or {}
    print(f"options ({len(options)}):")
    for name, value in options.items():
        print(f"  {name} = {json.dumps(value, ensure_ascii=False)}")
    counts = ", ".join(f"{n} {name}" for name, n in log.record_counts().items())
    span = log.step_range()
    print(f"records: {counts}; " + (f"steps {span[0]}..{span[1]}" if span else "no steps"))
    metrics = log.record_types.get("telemetry")
    if metrics:
        print("metrics: " + ", ".join(f"{name} [{' x '.join(spec['dims'])}]" for name, spec in metrics.fields.items()))
    for start, count in log.superseded:
        print(f"superseded: {count} records written for steps {start} and later before the run resumed from step "
              f"{start} (an abandoned continuation, kept in the file, left out of every read)")
    notes = log.notes()
    print(f"notes ({len(notes)}):")
    for step, text in notes[:10]:
        print(f"  step {step}: {text}")
    if len(notes) > 10:
        print(f"  ... {len(notes) - 10} more (dump shows them all)")
    print("problems:" + ("" if log.problems else " none"))
    for problem in log.problems:
        print(f"  {problem}")


def command_dump(log, args):
    if args.metric is not None and args.metric not in log.metric_names():
        raise LogError(f"{log.path}: no metric named {args.metric!r} (it has {', '.join(log.metric_names())})")
    lines = {}  # step -> its lines, in the order they are printed

    def add(step, line):
        if args.step is None or step == args.step:
            lines.setdefault(step, []).append(line)

    if args.metric is None:
        names = log.scalar_names()
        if names:
            columns = [_text(log.scalars(name)[1]) for name in names]
            for i, step in enumerate(log.scalars(names[0])[0].tolist()):
                add(step, "  " + ", ".join(f"{name} {column[i]}" for name, column in zip(names, columns)))
        if "val" in log.record_types:
            steps, values = log.val_loss()
            for step, value in zip(steps.tolist(), _text(values)):
                add(step, f"  val_loss {value}")
        for step, text in log.notes():
            add(step, f"  note: {text}")
    for name in [args.metric] if args.metric else log.metric_names():
        steps, values = log.metric(name)
        dims = " x ".join(log.record_types["telemetry"].fields[name]["dims"])
        for step, table in zip(steps.tolist(), values):
            if args.step is None or step == args.step:  # format only the tables to be printed
                add(step, f"  {name} [{dims}]\n" + "\n".join(
                    f"    layer {layer}: {' '.join(_text(row))}" for layer, row in enumerate(table)))
    if args.step is not None and args.step not in lines:
        raise LogError(f"{log.path}: nothing recorded at step {args.step}")
    for step in sorted(lines):
        print(f"step {step}")
        print("\n".join(lines[step]))


def command_csv(log, args):
    if args.metric is not None:
        steps, values = log.metric(args.metric)
        n, layers, cols = values.shape
        header = ["step", "layer", "head_or_dim", "value"]
        columns = [np.repeat(steps, layers * cols), np.tile(np.repeat(np.arange(layers), cols), n),
                   np.tile(np.arange(cols), n * layers), values.ravel()]
    elif args.val:
        header = ["step", "val_loss"]
        columns = list(log.val_loss())
    else:
        header = ["step"] + log.scalar_names()
        columns = [log.scalars(name) for name in header[1:]]
        columns = [columns[0][0] if columns else np.zeros(0, np.int64)] + [v for _, v in columns]
    out = open(args.output, "w", newline="") if args.output else sys.stdout
    try:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*[_text(c) for c in columns]))
    finally:
        if out is not sys.stdout:
            out.close()


def command_export(logs, args):
    given = args.run_label or []
    if len(given) > len(logs):
        raise LogError(f"more --run-label options ({len(given)}) than logs ({len(logs)}): one label per log, in order")
    labels = run_labels([log.path for log in logs], given)
    write_long(args.output, (block for log, label in zip(logs, labels) for block in long_table(log, label)))


COMMANDS = {"info": command_info, "dump": command_dump, "csv": command_csv, "export": command_export}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="attnlog.py", description="Reads the trainer's binary run log "
                                     "(docs/log_format.md).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="header summary, record counts, step range, problems")
    info.add_argument("log", help="the run log")
    dump = commands.add_parser("dump", help="the records as readable text, step by step")
    dump.add_argument("log", help="the run log")
    dump.add_argument("--metric", help="only this telemetry metric")
    dump.add_argument("--step", type=int, help="only this step")
    table = commands.add_parser("csv", help="a tidy CSV table, of the step records unless told otherwise")
    table.add_argument("log", help="the run log")
    which = table.add_mutually_exclusive_group()
    which.add_argument("--metric", help="one telemetry metric: step,layer,head_or_dim,value")
    which.add_argument("--scalars", action="store_true", help="the step records: step,loss,lr,... (the default)")
    which.add_argument("--val", action="store_true", help="the validation loss: step,val_loss")
    table.add_argument("-o", "--output", metavar="FILE", help="write here instead of to standard output")
    export = commands.add_parser("export", help="every value of every log in long format, one row per value: "
                                 "run,step,metric,layer,head,head_kind,value")
    export.add_argument("logs", nargs="+", metavar="LOG", help="the run log(s)")
    export.add_argument("-o", "--output", metavar="FILE", required=True,
                        help="FILE.csv (a table with a header row) or FILE.npz (one array per column)")
    export.add_argument("--run-label", action="append", metavar="LABEL", help="the run column of a log, once "
                        "per log in the order given (default: the log's folder/file stem)")
    args = parser.parse_args(argv)
    try:
        logs = [open_log(path) for path in args.logs] if args.command == "export" else open_log(args.log)
        COMMANDS[args.command](logs, args)
    except LogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output (head, less) has stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # the output file
        print(f"error: {e.filename}: cannot write ({e.strerror})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
