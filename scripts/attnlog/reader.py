"""Reads the trainer's binary run log (docs/log_format.md): a library and a command line.

Library (numpy is all it needs):
    import attnlog
    log = attnlog.open_log("run.attnlog")
    steps, loss = log.scalars("loss")          # one value per training step
    steps, val = log.val_loss()
    steps, k_norm = log.metric("k_norm")       # [steps, n_layer, n_kv_head]
    log.problems                               # what was damaged or skipped, in words

Command line (`attnlog`, or /usr/bin/python3 scripts/attnlog.py from the checkout):
    attnlog info LOG                                           header, counts, problems
    attnlog dump LOG [--metric NAME] [--step N]                records as readable text
    attnlog csv LOG [--metric NAME | --scalars | --val] [-o FILE]   a tidy CSV table
    attnlog export LOG [LOG ...] -o FILE.csv|FILE.npz [--run-label L ...]
                                                               every value of every log, one row each
    attnlog reduce LOG -o OUT[.xz] [--bits N]                  a smaller copy: the telemetry rounded

A log compressed with xz (LOG.xz, as `reduce` writes one) reads as the log it holds.

A log that cannot be read raises LogError, whose message is one line; the command line prints it
as every command of the package prints an error (attnlog.commands: one line, status 1).
"""
import argparse
import csv
import functools
import json
import lzma
import math
import mmap
import os
import re
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

from attnlog.commands import ArgumentParser, UserError, one_line, run

MAGIC = b"ATTNLOG\0"
XZ_MAGIC = b"\xfd7zXZ\0"  # the start of an xz file
VERSION = 1  # the newest format version this reader understands
MARKER = b"\xffREC"
PREAMBLE = struct.Struct("<8sIII")  # magic, version, header length, CRC-32 of the header
FRAME = struct.Struct("<4sHHIq")  # marker, record type, flags, payload length, step
CRC = struct.Struct("<I")  # after the payload: CRC-32 of everything from the type to here
OVERHEAD = FRAME.size + CRC.size
RESUMED = re.compile(r"resumed from step (\d+)")  # the note a resumed run begins with
DTYPES = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8"}  # and "utf8"
HEADER_KEYS = ("format", "version", "created", "config", "options", "seed", "backend", "device", "num_processes",
               "train_tokens", "measurement", "reduced", "records")
FLOAT32_BITS = 24  # the significant bits of a float32 (23 stored, one implied)
MAX_DEPTH = 64  # the deepest nesting of the header's JSON a reader accepts (version 1 nests 5 deep)
MAX_DIM = 2**31  # the largest dimension of a field's shape
MAX_NDIM = 16  # the most dimensions a field may have
MAX_PAYLOAD = 2**32 - 1  # the frame's length field: no record's payload is longer
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # "\ud800" in JSON makes a lone surrogate: no Unicode text


class LogError(UserError):
    """A log that cannot be read (or an export that cannot be made); str(error) is one line naming
    the file and what is wrong. For a log of a newer format version, .header holds the header fields
    this reader understands."""

    def __init__(self, message, header=None):
        super().__init__(message)
        self.header = header


class Malformed(ValueError):
    """A header whose JSON parses but does not hold what docs/log_format.md says: str(error) says
    where (e.g. records[2].fields[0].shape[1]) and what is wrong."""


class RecordType:
    """One entry of the header's record table: .id, .name, and .fields, which maps each field's
    name to its header entry (dtype, shape, dims, meaning) plus "offset", its place in the payload.
    .payload_bytes is the payload's length, None when a text field makes it vary; .fixed_bytes the
    length of the fields before the text field (all of them when there is none). Raises Malformed
    when the entry is not as docs/log_format.md describes it; where names it in the message."""

    def __init__(self, entry, where):
        _expect(entry, dict, where)
        self.id = _member(entry, "type", int, where)
        if not 0 <= self.id <= 0xFFFF:
            raise Malformed(f"{where}.type is {self.id}, not a record type (0 .. 65535, the frame's uint16)")
        self.name = _member(entry, "name", str, where)
        self.fields = {}
        offset = 0  # None once a text field has taken the rest of the payload
        for i, field in enumerate(_member(entry, "fields", list, where)):
            at = f"{where}.fields[{i}]"
            if offset is None:
                raise Malformed(f"{at} follows the text field of record type {self.name!r}, which takes "
                                "the rest of the payload")
            name, size = _field_layout(field, at)
            if name in self.fields:
                raise Malformed(f"{at}.name {_brief(name)} names a field of record type {self.name!r} twice")
            self.fields[name] = dict(field, shape=tuple(field["shape"]), offset=offset)
            if size is None:
                self.fixed_bytes, offset = offset, None
            elif offset + size > MAX_PAYLOAD:
                raise Malformed(f"the fields of record type {self.name!r} take more than the {MAX_PAYLOAD} "
                                "bytes a record's payload can hold")
            else:
                offset += size
        if offset is not None:
            self.fixed_bytes = offset
        self.payload_bytes = offset


def _field_layout(field, where):
    """(name, bytes in the payload or None for a text field) of a field of the record table, after
    checking its name, dtype, shape, dims (and meaning, where present)."""
    _expect(field, dict, where)
    name = _member(field, "name", str, where)
    dtype = _member(field, "dtype", str, where)
    shape = _member(field, "shape", list, where)
    dims = _member(field, "dims", list, where)
    if "meaning" in field:
        _member(field, "meaning", str, where)
    if dtype not in DTYPES and dtype != "utf8":
        raise Malformed(f"{where}.dtype is {_brief(dtype)}, not one of {', '.join(DTYPES)}, utf8")
    for i, n in enumerate(shape):
        _expect(n, int, f"{where}.shape[{i}]")
    if len(dims) != len(shape) or not all(isinstance(d, str) for d in dims):
        raise Malformed(f"{where}.dims is {_brief(dims)}, not one name per dimension of the shape {_brief(shape)}")
    if dtype == "utf8":
        if shape != [-1]:
            raise Malformed(f"{where}.shape is {_brief(shape)}, not the [-1] of a utf8 field (the rest of the payload)")
        return name, None
    if len(shape) > MAX_NDIM:
        raise Malformed(f"{where}.shape has {len(shape)} dimensions, more than {MAX_NDIM}")
    for i, n in enumerate(shape):
        if not 0 <= n <= MAX_DIM:
            raise Malformed(f"{where}.shape[{i}] is {n}, not a dimension (0 .. 2^31)")
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    if itemsize * math.prod(max(n, 1) for n in shape) > MAX_PAYLOAD:  # an empty dimension counted as 1
        raise Malformed(f"{where}.shape {_brief(shape)} spans more than the {MAX_PAYLOAD} bytes a record's "
                        "payload can hold (an empty dimension counted as 1)")
    return name, itemsize * math.prod(shape)


KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _expect(value, kind, where):
    """value, when it is of the JSON kind (dict, list, str or int: true and false are no integers)."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise Malformed(f"{where} is {_brief(value)}, not {KINDS[kind]}")
    return value


def _member(obj, key, kind, where=None):
    """obj[key], which must be there and be of the JSON kind; where: obj's place in the header, None
    for the header itself."""
    if key not in obj:
        raise Malformed(f"{where or 'the header'} has no {key!r}")
    return _expect(obj[key], kind, f"{where}.{key}" if where else key)


def _brief(value, show=json.dumps):
    """A value of the header as a short text, for a message."""
    text = show(value)
    return text if len(text) <= 40 else text[:36] + " ..."


def _check_header(header):
    """Raises Malformed when a member of the header that this reader uses is not what the format
    says: config an object of numbers, options an object of strings, created, backend and device
    strings, seed an unsigned 64-bit integer, num_processes a positive integer, train_tokens an
    integer of at least 0, measurement (a measurement's log) the checkpoint measured, reduced (a
    reduced copy) what it was made from. The record table is checked by RecordType."""
    for key in ("created", "config", "options", "seed", "backend", "device", "num_processes", "train_tokens",
                "measurement", "reduced"):
        if key in header:
            CHECKS[key](header[key], key)


def _numbers(value, where):
    for key, number in _expect(value, dict, where).items():
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            raise Malformed(f"{where}.{key} is {_brief(number)}, not a number")


def _strings(value, where):
    for key, text in _expect(value, dict, where).items():
        _expect(text, str, f"{where}.{key}")


def _seed(value, where):
    if not 0 <= _expect(value, int, where) < 2**64:
        raise Malformed(f"{where} is {value}, not an unsigned 64-bit integer")


def _count(value, where):
    if _expect(value, int, where) < 1:
        raise Malformed(f"{where} is {value}, not a positive integer")


def _tokens(value, where):
    if _expect(value, int, where) < 0:
        raise Malformed(f"{where} is {value}, not a number of tokens")


def _string(value, where):
    _expect(value, str, where)


def _table(value, where):
    _expect(value, list, where)  # its entries: RecordType


def _measurement(value, where):
    """The checkpoint a measurement measured: its path, and when recorded its step, the run that
    trained it (16 hexadecimal digits) and the tokens it trained on."""
    _expect(value, dict, where)
    _member(value, "checkpoint", str, where)
    for key in [key for key in ("step", "tokens") if key in value]:
        if _member(value, key, int, where) < 0:
            raise Malformed(f"{where}.{key} is {value[key]}, not a count")
    if "run_id" in value and not re.fullmatch("[0-9a-f]{16}", _member(value, "run_id", str, where)):
        raise Malformed(f"{where}.run_id is {_brief(value['run_id'])}, not 16 hexadecimal digits")


def _reduced(value, where):
    """What `attnlog reduce` made of the log: the file it came from, the significant bits its
    telemetry was rounded to, and (when there was any) what a read of the source left out."""
    _expect(value, dict, where)
    _member(value, "from", str, where)
    if not 2 <= _member(value, "significant_bits", int, where) <= FLOAT32_BITS:
        raise Malformed(f"{where}.significant_bits is {value['significant_bits']}, not 2 to {FLOAT32_BITS}")
    if "left_out" in value:
        _strings(dict(enumerate(_member(value, "left_out", list, where))), f"{where}.left_out")


CHECKS = {"format": _string, "version": lambda value, where: _expect(value, int, where), "created": _string,
          "config": _numbers, "options": _strings, "seed": _seed, "backend": _string, "device": _string,
          "num_processes": _count, "train_tokens": _tokens, "measurement": _measurement, "reduced": _reduced,
          "records": _table}


def _known_members(header):
    """The members of a newer version's header that this reader understands and finds well-formed
    (the record table as it is, when it is a list)."""
    known = {}
    for key in HEADER_KEYS:
        try:
            if key in header:
                CHECKS[key](header[key], key)
                known[key] = header[key]
        except Malformed:
            pass
    return known


def open_log(path):
    """Opens and checks a run log; raises LogError when it cannot be read."""
    return RunLog(path)


class RunLog:
    """An opened log: .path, .header (the header's JSON as a dict), .config (the model), .version,
    .record_types (name -> RecordType) and .problems (damage found and records skipped, in words).
    The file is read whole when opened; arrays are taken from those bytes when asked for."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.problems = []
        self.superseded = []  # (resume step, records set aside): see _set_aside_abandoned
        self._buf = _read_file(self.path)
        if self._buf[:len(XZ_MAGIC)] == XZ_MAGIC:
            self._buf = self._decompressed()
        self.version, self.header, records_start = self._read_header()
        self.config = self.header["config"]
        # A measurement's log (./train --measure): {"checkpoint", "step", "run_id", "tokens"} of the
        # weights it measured (the last two when recorded); its steps are the batches measured, 0..N-1,
        # all of one model state. None for a training run's log.
        self.measurement = self.header.get("measurement")
        # A copy made by `attnlog reduce`: {"from": the file it was made from, "significant_bits": the
        # precision of its telemetry's float32 values, "left_out": what reads of that file left out,
        # when anything}. None for a log as the trainer wrote it.
        self.reduced = self.header.get("reduced")
        self.record_types = {t.name: t for t in self._record_table(records_start)}
        self._scan(records_start)

    # -- reading the file ------------------------------------------------------------------------

    def _decompressed(self):
        """The log an xz file holds: its streams one after another, as `xz -d` reads them,
        decompressed piece by piece, so that damage or a cut keeps what comes before it (the
        records there read as in a log whose writing stopped at that point: a torn tail at most).
        Damage, a cut, and bytes after the last stream that are neither stream padding nor another
        stream are problems; a file that gives not even a preamble cannot be read."""
        buf, pieces, pos, piece = self._buf, [], 0, 1 << 14
        while pos < len(buf):
            inflate, at = lzma.LZMADecompressor(lzma.FORMAT_XZ), pos
            try:
                while at < len(buf) and not inflate.eof:
                    pieces.append(inflate.decompress(buf[at:at + piece]))
                    at += piece
            except lzma.LZMAError as e:
                self.problems.append(f"damaged xz compression near byte {at} of the file ({e}): read the "
                                     f"{sum(map(len, pieces))} bytes of the log before it")
                break
            if not inflate.eof:
                self.problems.append(f"the xz file ends early: read the {sum(map(len, pieces))} bytes of the log "
                                     "its intact part holds")
                break
            pos = min(at, len(buf)) - len(inflate.unused_data)
            while pos < len(buf) and buf[pos] == 0:  # stream padding
                pos += 1
            if pos < len(buf) and buf[pos:pos + len(XZ_MAGIC)] != XZ_MAGIC:
                self.problems.append(f"{len(buf) - pos} bytes after the xz stream ignored (no xz stream)")
                break
        data = b"".join(pieces)
        if len(data) < PREAMBLE.size and self.problems:
            raise LogError(f"{self.path}: {self.problems[-1]}; nothing can be read")
        return data

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
        header, why = _parse_json(text) if crc_ok else (None, None)
        if version > VERSION:
            known = _known_members(header) if header else None
            said = f"its header reads: {_summary(known)}" if known else "its header is unreadable too"
            raise LogError(f"{path}: format version {version} is newer than this reader's "
                           f"({VERSION}); {said}; records not read (a newer attnlog.py reads them)",
                           known)
        if not crc_ok:
            self._damaged_header(f"checksum mismatch (stored {crc:#010x}, computed "
                                 f"{zlib.crc32(text):#010x})", end)
        if header is None:
            self._damaged_header(f"its text is not valid JSON of a header ({why})", end)
        said = header.get("version")
        if version != VERSION or type(said) is not int or said != version or header.get("format") != "attnlog":
            self._damaged_header(f"the preamble says version {version}, the text says format "
                                 f"{_brief(header.get('format'), repr)} version {_brief(said, repr)}", end)
        if "config" not in header:
            self._damaged_header("it has no model configuration", end)
        try:
            _check_header(header)
        except Malformed as e:
            self._damaged_header(f"its {e}", end)
        return version, header, end

    def _record_table(self, records_start):
        try:
            table = [RecordType(entry, f"records[{i}]")
                     for i, entry in enumerate(_member(self.header, "records", list))]
            ids, names = {}, {}
            for i, t in enumerate(table):
                for seen, key, what in ((ids, t.id, "type"), (names, t.name, "name")):
                    if key in seen:
                        raise Malformed(f"records[{i}] repeats the {what} {_brief(key)} of records[{seen[key]}]")
                    seen[key] = i
        except Malformed as e:
            self._damaged_header(f"its record table is malformed: {e}", records_start)
        return table

    def _damaged_header(self, reason, records_start):
        """Raises LogError, saying what is still there: the intact records, which cannot be
        decoded without the header's record table."""
        count = len(_records(self._buf, records_start)[0][0])
        raise LogError(f"{self.path}: damaged header: {reason}; {count} intact records follow, "
                       "unreadable without the header's record table")

    def _scan(self, pos):
        """Finds every intact record. Damaged bytes are reported and skipped: reading resumes at
        the next marker that frames an intact record."""
        (offsets, types, lengths, steps), damaged = _records(self._buf, pos)
        self._by_id = {t.id: t for t in self.record_types.values()}
        self.problems.extend(self._damage(start, stop) for start, stop in damaged)
        offsets += FRAME.size
        self._index = {}  # type name -> (steps, payload offsets, payload lengths), in file order
        order = np.argsort(types, kind="stable")  # each type's records together, in file order
        ids, firsts, counts = np.unique(types[order], return_index=True, return_counts=True)
        for type_id, first, count in zip(ids.tolist(), firsts.tolist(), counts.tolist()):
            mine = order[first:first + count]
            rtype = self._by_id.get(type_id)
            if rtype is None:
                self.problems.append(f"{count} records of unknown type {type_id} skipped "
                                     "(not in the header's record table)")
                continue
            if rtype.payload_bytes is not None:
                wrong, said = lengths[mine] != rtype.payload_bytes, f"is not the {rtype.payload_bytes} bytes"
            else:
                wrong, said = lengths[mine] < rtype.fixed_bytes, f"is shorter than the {rtype.fixed_bytes} bytes"
            if wrong.any():
                self.problems.append(
                    f"{wrong.sum()} {rtype.name} records skipped: their payload {said} of the record "
                    f"table (the first at offset {offsets[mine[wrong]][0] - FRAME.size})")
                mine = mine[~wrong]
            self._index[rtype.name] = (steps[mine], offsets[mine], lengths[mine])
        self._set_aside_abandoned()
        for name, (steps, _, _) in self._index.items():
            if name != "note":
                self._report_repeats(name, steps)
        self.problems = [one_line(problem) for problem in self.problems]

    def _set_aside_abandoned(self):
        """A note "resumed from step S" marks where a resumed run began: the records written before
        it for steps S and later belong to the continuation it replaced. They stay in the file, are
        left out of every read, and are counted in self.superseded as (S, records), each record by
        the first such note after it whose S is at or below its step."""
        self.superseded = []
        at, starts = [], []
        for _, note_offset, text in self._note_texts(most=64):
            resumed = RESUMED.match(text)
            if resumed and int(resumed.group(1)) < 2**63:  # a larger step is no step of any record
                at.append(note_offset)
                starts.append(int(resumed.group(1)))
        if not at:
            return
        at, starts = np.array(at, np.int64), np.array(starts, np.int64)
        lowest = np.minimum.accumulate(starts[::-1])[::-1]  # the lowest step resumed from at each note or later
        aside = {}  # type name -> (steps, index of the first resume note after each) of its records set aside
        for name, (s, o, n) in list(self._index.items()):
            after = np.searchsorted(at, o, side="right")
            abandoned = after < len(at)
            abandoned[abandoned] = s[abandoned] >= lowest[after[abandoned]]
            if name != "note" and abandoned.any():
                aside[name] = (s[abandoned], after[abandoned])
                self._index[name] = (s[~abandoned], o[~abandoned], n[~abandoned])
        if aside:
            counts = _first_at_or_below(starts, *(np.concatenate(c) for c in zip(*aside.values())))
            self.superseded = [(int(starts[k]), int(counts[k])) for k in np.flatnonzero(counts)]

    def _damage(self, pos, stop):
        """One line about the unreadable bytes [pos, stop)."""
        if pos + OVERHEAD <= len(self._buf):
            marker, type_id, _, length, step = FRAME.unpack_from(self._buf, pos)
            if marker == MARKER and pos + OVERHEAD + length <= len(self._buf):
                kind = self._by_id[type_id].name if type_id in self._by_id else None
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
        return self._numeric_fields("step")

    def val_loss(self):
        """(steps, values) of the validation loss."""
        return self.read("val", "val_loss")

    def metric(self, name):
        """(steps [S], values [S, n_layer, cols]) of one telemetry metric; values [S] for a metric of
        one value per step (doc_start_visible)."""
        return self.read("telemetry", name)

    def metric_names(self):
        return self._numeric_fields("telemetry")

    def _numeric_fields(self, type_name):
        rtype = self.record_types.get(type_name)
        return [name for name, spec in rtype.fields.items() if spec["dtype"] != "utf8"] if rtype else []

    def records(self):
        """(record type, step, payload bytes) of every record a read sees, in file order: the intact
        ones, less those set aside as superseded."""
        kept = [(offset, self.record_types[name].id, step, length) for name, (steps, offsets, lengths)
                in self._index.items() for step, offset, length in zip(steps.tolist(), offsets.tolist(), lengths.tolist())]
        return [(type_id, step, self._buf[offset:offset + length]) for offset, type_id, step, length in sorted(kept)]

    def notes(self):
        """Every note as (step, text), in the order they were written."""
        return [(int(step), text) for step, _, text in self._note_texts()]

    def _note_texts(self, most=None):
        """(step, offset, text) of every note, its text field (at most the first `most` bytes of it)
        found through the record table: the rest of the payload after the fields before it."""
        steps, offsets, lengths = self._index.get("note", (np.zeros(0, np.int64),) * 3)
        rtype, view = self.record_types.get("note"), memoryview(self._buf)
        skip = rtype.fixed_bytes if rtype and rtype.payload_bytes is None else 0
        ends = offsets + (lengths if most is None else np.minimum(lengths, skip + most))
        return [(s, o, bytes(view[o + skip:end]).decode("utf-8", "replace"))
                for s, o, end in zip(steps.tolist(), offsets.tolist(), ends.tolist())]

    def record_counts(self):
        """Intact records of each type of the record table, repeated steps included."""
        return {name: len(self._index[name][0]) if name in self._index else 0 for name in self.record_types}

    def step_range(self):
        """(first, last) step over all records, or None for a log without records."""
        steps = [index[0] for index in self._index.values() if len(index[0])]
        return (int(min(s.min() for s in steps)), int(max(s.max() for s in steps))) if steps else None


# -- long format: one row per value, for data-frame tools --------------------------------------------

EXPORT_COLUMNS = ("run", "step", "metric", "layer", "head", "head_kind", "kv_head", "value")
CATEGORIES = ("run", "metric", "head_kind")  # text columns; the npz holds them as codes into <column>_names
NO_POSITION = -1  # layer, head or kv_head of a value that has none (a step record's loss has no layer)
EMPTY_DTYPES = {"step": np.int64, "layer": np.int32, "head": np.int32, "kv_head": np.int32, "value": np.float32}


def run_labels(paths, given=()):
    """A label for each log: the given ones first, in order, then folder/stem of the file (the
    trainer names every log run.attnlog, so the folder is what tells runs apart); a label that
    occurs again gets a number, "label (2)". The stem of a compressed log, run.attnlog.xz, is run."""
    labels, seen = [], {}
    for i, path in enumerate(paths):
        name = Path(path).name.removesuffix(".xz")
        label = given[i] if i < len(given) else f"{Path(path).resolve().parent.name}/{Path(name).stem}"
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return labels


def long_table(log, label):
    """Every value of the log in long format, one block of equal-length numpy columns (the names of
    EXPORT_COLUMNS) per numeric field of each record type of the header's record table: the step
    records' fields (loss, lr, ...), the validation loss, and every telemetry metric. A field of one
    value per record has layer, head and kv_head NO_POSITION and head_kind "scalar"; a [layer x X]
    field has a row per layer and column, head_kind X (kv_head, q_head or dim), and kv_head the kv
    head that the column's query head reads (a kv_head column: itself; a dim: NO_POSITION). value
    keeps the field's float type (float32 for every field ./train writes); integers become float64.
    Steps as the reader gives them: ascending, a step recorded twice (a resumed run) once, with its
    later values."""
    for rtype in log.record_types.values():  # in the order of the header's table
        for name, spec in rtype.fields.items():
            if spec["dtype"] == "utf8":
                continue
            steps, values = log.read(rtype.name, name)
            if not len(steps):
                continue
            layer, head, kind = _positions(spec)
            kv_head = _kv_heads(head, kind, log.config)
            rows = len(steps) * len(layer)
            value = values.ravel() if values.dtype.kind == "f" else values.ravel().astype(np.float64)
            yield {"run": np.full(rows, label), "step": np.repeat(steps, len(layer)), "metric": np.full(rows, name),
                   "layer": np.tile(layer, len(steps)), "head": np.tile(head, len(steps)),
                   "head_kind": np.full(rows, kind), "kv_head": np.tile(kv_head, len(steps)), "value": value}


def _positions(spec):
    """(layer [n], head [n], head_kind) of the n values of one record's field, in payload order."""
    shape, dims = spec["shape"], list(spec.get("dims") or [])
    if not shape:
        return np.full(1, NO_POSITION, np.int32), np.full(1, NO_POSITION, np.int32), "scalar"
    if len(shape) == 2 and len(dims) == 2 and dims[0] == "layer":
        return (np.repeat(np.arange(shape[0], dtype=np.int32), shape[1]),
                np.tile(np.arange(shape[1], dtype=np.int32), shape[0]), str(dims[1]))
    size = int(np.prod(shape))  # another layout: the flat index as the head
    return np.full(size, NO_POSITION, np.int32), np.arange(size, dtype=np.int32), " x ".join(map(str, dims)) or "value"


def _kv_heads(head, kind, config):
    """The kv head of each column head of kind: query head h reads kv head h // (n_head / n_kv_head)
    (grouped-query attention, docs/model.md); NO_POSITION where there is none, or where the config
    gives no whole number of query heads per kv head, or fewer query heads than the field has."""
    if kind == "kv_head":
        return head
    n_head, n_kv_head = config.get("n_head"), config.get("n_kv_head")
    grouped = (type(n_head) is int and type(n_kv_head) is int and 0 < n_kv_head <= n_head
               and n_head % n_kv_head == 0 and head.max(initial=-1) < n_head)
    if kind != "q_head" or not grouped:
        return np.full(len(head), NO_POSITION, np.int32)
    return (head // (n_head // n_kv_head)).astype(np.int32)


def write_long(path, blocks):
    """Writes long_table blocks to path, a .csv or a .npz (docs/log_format.md): the file appears
    whole or not at all, written beside path under another name, then renamed.

    .csv: a header row, then a row per value; each value the shortest decimal that reads back as
    the same number of its field's type, nan, inf or -inf; pandas.read_csv's defaults read it, and
    the values of float32 fields back to their exact bits with .astype("float32") (its float64 need
    not be the float32's exact value: pandas' default parser rounds some decimals wrongly).
    .npz, compressed: one 1-D array per column, the text columns (CATEGORIES) as small integer codes
    into <column>_names."""
    kind = Path(path).suffix.lower()
    if kind not in (".csv", ".npz"):
        raise LogError(f"{path}: cannot tell the format from the name (it must end in .csv or .npz)")
    temp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{Path(path).name}.{os.getpid()}.part")
    try:
        with open(temp, "x" if kind == ".csv" else "xb", **({"newline": ""} if kind == ".csv" else {})) as out:
            (_write_csv if kind == ".csv" else _write_npz)(out, blocks)
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
        writer.writerows(zip(*[block[k] if k in CATEGORIES else _text(block[k]) for k in EXPORT_COLUMNS]))


def _write_npz(out, blocks):
    blocks = list(blocks)
    columns, tables = {}, {}
    for k in EXPORT_COLUMNS:
        if k in CATEGORIES:
            names = {}  # text -> code, in order of appearance
            codes = [_codes(b[k], names) for b in blocks]
            dtype = np.min_scalar_type(-max(len(names), 1))  # signed, as pandas.Categorical.from_codes takes them
            columns[k] = np.concatenate(codes).astype(dtype) if codes else np.zeros(0, dtype)
            tables[f"{k}_names"] = np.array(list(names), dtype=str)
        else:
            columns[k] = np.concatenate([b[k] for b in blocks]) if blocks else np.zeros(0, EMPTY_DTYPES[k])
    np.savez_compressed(out, **columns, **tables)


def _codes(texts, names):
    """The code of each of texts, the codes given by names (text -> code), which grows by the new ones."""
    unique, inverse = np.unique(texts, return_inverse=True)
    return np.array([names.setdefault(text, len(names)) for text in unique.tolist()], np.int64)[inverse]


def _read_file(path):
    """The file's bytes, read whole into memory: a snapshot of the log as it was when opened. A run
    may append to its log while it is read, or a run started again over it may cut it short; a map
    of the file itself would then die of SIGBUS on the pages cut off, a snapshot cannot change.
    The bytes go to anonymous memory, in huge pages where the system gives them: for a log of
    100 MB ten times as fast as f.read(), which faults in every 4 KiB page of its copy."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
                return f.read()
            buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # memory, not the file
            if hasattr(mmap, "MADV_HUGEPAGE"):
                buf.madvise(mmap.MADV_HUGEPAGE)
            got = 0
            with memoryview(buf) as view:
                while got < size:
                    n = f.readinto(view[got:])
                    if not n:  # the file was cut short since fstat
                        break
                    got += n
            return buf if got == size else buf[:got]
    except OSError as e:
        raise LogError(f"{path}: cannot open ({e.strerror})") from None


def _parse_json(text):
    """(the header as a dict, None), or (None, what is wrong): not UTF-8, not JSON, not an object,
    NaN or Infinity (no JSON numbers), a number too large for a float, nesting deeper than
    MAX_DEPTH, a string holding a lone surrogate (no Unicode text: it cannot even be printed)."""
    try:
        header = json.loads(bytes(text).decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
        if not isinstance(header, dict):
            return None, f"{_brief(header)}, not an object"
        _check_tree(header, text)
    except RecursionError:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    except Exception as e:  # UnicodeDecodeError, JSONDecodeError, Malformed, an integer of too many digits, ...
        return None, str(e) or type(e).__name__
    return header, None


def _no_constant(name):
    raise Malformed(f"{name} is no JSON number")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise Malformed(f"the number {text[:20]}{'...' if len(text) > 20 else ''} is too large for a float")
    return value


def _check_tree(root, text):
    """Raises Malformed when the JSON parsed from text nests deeper than MAX_DEPTH or a string (or a
    key) holds a lone surrogate. Iterative: no depth of nesting can exhaust the stack here."""
    stack = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels")
        items = value.values() if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items if isinstance(item, (dict, list)))
    if SURROGATE_ESCAPE.search(text):  # UTF-8 itself holds none: only an escape makes one
        try:
            json.dumps(root, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise Malformed(f"a string holds a lone surrogate ({e.object[e.start]!r}), which is no Unicode "
                            "text") from None


def _records(buf, pos):
    """Every intact record from pos on, as int64 arrays (offsets, types, payload lengths, steps), and
    the damaged stretches between them, [(start, stop)]: docs/log_format.md, reading rules 4 to 6."""
    scan, end = _Scan(buf), len(buf)
    offsets, types, lengths, steps, damaged = [], [], [], [], []
    while pos < end:
        frame = scan.frame(pos)
        if frame is None:
            stop, frame = scan.next_intact(pos)
            damaged.append((pos, stop))
            pos = stop
            if frame is None:
                break
        offsets.append(pos)
        types.append(frame[0])
        lengths.append(frame[1])
        steps.append(frame[2])
        pos += OVERHEAD + frame[1]
    return tuple(np.array(column, np.int64) for column in (offsets, types, lengths, steps)), damaged


class _Scan:
    """Tells which offsets of buf start intact records, in time linear in the file's size however many
    false markers, claiming however long records, a damaged stretch holds. A record is checked by
    its own CRC while it starts after every byte a CRC has been computed over, as each record of an
    undamaged stretch does: no byte goes through two CRCs. Once a marker to be checked lies among
    bytes a CRC has been over (behind a false frame that claimed a long payload), or a search for the
    next intact record has met SEARCH markers that frame none, _intact_after finds every intact
    record from there on at once, and answers from then on. Offsets asked about must not decrease."""

    SEARCH = 256

    def __init__(self, buf):
        self.buf, self.view, self.size = buf, memoryview(buf), len(buf)
        self.fresh = 0  # no CRC has been computed over a byte from here on
        self.intact, self.place = None, 0  # once found at once: the offsets of the intact records, our place in them

    def frame(self, pos):
        """(type, payload length, step) of the record at pos when it is intact, else None."""
        if self.intact is None:  # by its own CRC: pos is at or after self.fresh, as next_intact makes sure
            if pos + OVERHEAD > self.size:
                return None
            marker, type_id, _, length, step = FRAME.unpack_from(self.buf, pos)
            crc_at = pos + FRAME.size + length
            if marker != MARKER or crc_at + CRC.size > self.size:
                return None
            self.fresh = crc_at
            if zlib.crc32(self.view[pos + len(MARKER):crc_at]) != CRC.unpack_from(self.buf, crc_at)[0]:
                return None
            return type_id, length, step
        while self.place < len(self.intact) and self.intact[self.place] < pos:
            self.place += 1
        if self.place == len(self.intact) or self.intact[self.place] != pos:
            return None
        _, type_id, _, length, step = FRAME.unpack_from(self.buf, pos)
        return type_id, length, step

    def next_intact(self, pos):
        """(offset, frame) of the first intact record after pos (at the first marker that frames one),
        or (the file's size, None)."""
        at = pos
        for _ in range(self.SEARCH if self.intact is None else 0):
            at = self.buf.find(MARKER, at + 1)
            if at == -1:
                return self.size, None
            if at < self.fresh:
                break
            frame = self.frame(at)
            if frame:
                return at, frame
        if self.intact is None:
            self.intact = _intact_after(self.buf, at - 1)
        while self.place < len(self.intact) and self.intact[self.place] <= pos:
            self.place += 1
        if self.place == len(self.intact):
            return self.size, None
        return self.intact[self.place], self.frame(self.intact[self.place])


def _intact_after(buf, pos):
    """The offsets of every intact record that starts after pos, ascending (a list). Every marker's
    record is checked at once: its length read, its CRC computed from CRCs of the file's prefixes
    (_range_crcs), so that no byte is read more than a few times however the records overlap."""
    u8 = np.frombuffer(buf, np.uint8)
    found = _markers(u8, pos + 1)
    found = found[found <= len(u8) - OVERHEAD]
    ends = found + OVERHEAD + _u32_at(u8, found + 8)
    found, ends = found[ends <= len(u8)], ends[ends <= len(u8)]
    crc_at = ends - CRC.size
    return found[_range_crcs(buf, found + len(MARKER), crc_at) == _u32_at(u8, crc_at)].tolist()


def _markers(u8, start, chunk=1 << 24):
    """Offsets of every marker at or after start in the bytes u8, ascending (int64), found a chunk
    at a time."""
    found = [np.zeros(0, np.int64)]
    for lo in range(start, len(u8) - len(MARKER) + 1, chunk):
        window = u8[lo:lo + chunk + len(MARKER) - 1]
        at = np.flatnonzero(window[:len(window) - len(MARKER) + 1] == MARKER[0])
        for k in range(1, len(MARKER)):
            at = at[window[at + k] == MARKER[k]]
        found.append(at + lo)
    return np.concatenate(found)


def _u32_at(u8, at):
    """The little-endian uint32 at each offset of at, as int64."""
    return sum(u8[at + k].astype(np.int64) << (8 * k) for k in range(4))


def _range_crcs(buf, starts, stops):
    """zlib.crc32(buf[start:stop]) for each pair, as int64, in time linear in the bytes from the
    first start to the last stop however long and overlapping the ranges: one pass computes the
    CRC state at every start and stop, and the CRC of a range follows from the states at its ends
    (the CRC is linear): the state at the start run through stop - start zero bytes (_after_zeros),
    XOR the state at the stop."""
    if not len(starts):
        return np.zeros(0, np.int64)
    points, where = np.unique(np.concatenate([starts, stops]), return_inverse=True)
    view, state, before, states = memoryview(buf), 0xFFFFFFFF, int(points[0]), []
    for point in points.tolist():
        state = zlib.crc32(view[before:point], state)
        states.append(state)
        before = point
    states = np.array(states, np.int64)
    return _after_zeros(states[where[:len(starts)]], stops - starts) ^ states[where[len(starts):]]


@functools.lru_cache(maxsize=None)
def _zero_tables():
    """For k = 0 .. 33, the CRC register after 2^k zero bytes as a function of the register before:
    a linear map, as 4 x 256 entries (the contribution of each value of each of its 4 bytes)."""
    mask, index = 0xFFFFFFFF, np.arange(256)
    columns = [~zlib.crc32(b"\0", ~(1 << bit) & mask) & mask for bit in range(32)]  # one zero byte
    tables = []
    for _ in range(34):
        table = np.zeros(1024, np.int64)
        for bit, column in enumerate(columns):
            table[256 * (bit // 8) + index[(index >> (bit % 8)) & 1 == 1]] ^= column
        tables.append(table)
        columns = [int(_through(table, np.int64(column))) for column in columns]  # twice as many zeros
    return tables


def _through(table, state):
    """The register(s) state through the linear map of one of _zero_tables."""
    return (table[state & 255] ^ table[256 + ((state >> 8) & 255)] ^ table[512 + ((state >> 16) & 255)]
            ^ table[768 + (state >> 24)])


def _after_zeros(states, counts):
    """Each CRC register of states (int64) after its count of zero bytes: the map of 2^k zero
    bytes applied for each bit k of the count."""
    states, tables = states.copy(), _zero_tables()
    for k in range(int(counts.max(initial=0)).bit_length()):
        pick = ((counts >> k) & 1) == 1
        if pick.any():
            states[pick] = _through(tables[k], states[pick])
    return states


def _first_at_or_below(limits, values, firsts):
    """For queries (value, first) that each have one: how many find each index k of limits as the
    first k >= first with limits[k] <= value, an int64 array as long as limits. The queries are
    taken from the largest value down, and each index ruled out for good (its limit above the value)
    is joined to the next, so that finding the first index still in takes almost constant time."""
    following = list(range(len(limits) + 1))  # the next index not ruled out, through path halving

    def first_in(k):
        while following[k] != k:
            following[k] = following[following[k]]
            k = following[k]
        return k

    out, ruled_out = np.argsort(limits)[::-1].tolist(), 0  # by limit, largest first
    queries = np.argsort(values)[::-1].tolist()  # by value, largest first
    counts, limits, values, firsts = [0] * len(limits), limits.tolist(), values.tolist(), firsts.tolist()
    for q in queries:
        while ruled_out < len(out) and limits[out[ruled_out]] > values[q]:
            following[out[ruled_out]] = out[ruled_out] + 1
            ruled_out += 1
        counts[first_in(firsts[q])] += 1
    return np.array(counts, np.int64)


def _summary(header):
    """The run a header describes, in one line."""
    parts = [f"{key} {header[key]}" for key in ("created", "backend", "device") if key in header]
    if isinstance(header.get("config"), dict):
        parts.append("model " + " ".join(f"{k}={v}" for k, v in header["config"].items()))
    return ", ".join(parts)


def measurement_text(measured):
    """What a measurement's log measured, in words."""
    m = measured
    trained = ("the weights" + (f" of step {m['step']}" if "step" in m else "")
               + (f" of run {m['run_id']}" if "run_id" in m else ""))
    tokens = f", trained on {m['tokens']:,} tokens" if "tokens" in m else ""
    return (f"{trained} in {m['checkpoint']}{tokens}; no training: each step of the log is a batch measured "
            "with these weights")


def _text(values):
    """Numbers as the shortest text that reads back as the same value."""
    return np.asarray(values).astype(str)


def _dims_text(dims):
    """A field's dims as info and dump show them: "layer x kv_head", or "scalar" for one value."""
    return " x ".join(dims) or "scalar"


def _rows(table, dims):
    """One record's field as lines of text: a line per index of its first dimension ("layer 2: 0.5
    1.5 ..." for a [layer x kv_head] table, the rest of the dimensions flattened), or its one value."""
    if table.ndim == 0:
        return [str(_text(table))]
    if table.size == 0:
        return []
    return [f"{dims[0]} {i}: {' '.join(row)}" for i, row in enumerate(_text(table.reshape(len(table), -1)))]


# -- a smaller copy ---------------------------------------------------------------------------------


def round_significant(values, bits):
    """float32 values rounded to the nearest number of `bits` significant bits, ties to even (the
    rounding of IEEE arithmetic): a relative change of at most 2^-bits. A finite value that would
    round up past the largest float32 is cut to `bits` bits instead; infinities, NaN and the
    subnormal numbers (below 2^-126, which hold fewer significant bits) stay as they are."""
    drop = FLOAT32_BITS - bits
    if drop <= 0:
        return values.copy()
    word = values.view(np.uint32).astype(np.uint64)
    kept = (word + (1 << (drop - 1)) - 1 + ((word >> drop) & 1)) >> drop << drop
    exponent = word & 0x7F800000
    special = (exponent == 0x7F800000) | (exponent == 0)
    overflow = ~special & ((kept & 0x7F800000) == 0x7F800000)
    kept[overflow] = word[overflow] >> drop << drop
    kept[special] = word[special]
    return kept.astype(np.uint32).view(np.float32)


def frame_record(type_id, step, payload):
    """One record as docs/log_format.md lays it out: frame, payload, CRC."""
    body = FRAME.pack(MARKER, type_id, 0, len(payload), step)[len(MARKER):] + bytes(payload)
    return MARKER + body + CRC.pack(zlib.crc32(body))


def reduced_log(log, bits):
    """The bytes of a copy of log whose telemetry records hold their float32 fields rounded to `bits`
    significant bits (round_significant), every other record as it was, and whose header says so
    (its "reduced" member: the original file, the bits, and what reads of the original and of
    every copy between left out). The copy holds what a read of log sees: damaged bytes and
    superseded records are left out. Rounded
    values keep their low bits zero, which compression then takes almost for free: xz makes 1.35 MB
    of the 1.9 MB log of a d22 run of 1000 steps (statistics every 10 steps), 0.82 MB of its copy at
    16 bits."""
    left_out = (log.reduced or {}).get("left_out", []) + log.problems + [
        f"{count} records superseded by the resume from step {start}" for start, count in log.superseded]
    source = log.reduced["from"] if log.reduced else os.path.basename(log.path)
    header = dict(log.header, reduced=dict({"from": source, "significant_bits": bits},
                                           **({"left_out": left_out} if left_out else {})))
    text = json.dumps(header, ensure_ascii=False).encode("utf-8")
    records = log.records()
    telemetry = log.record_types.get("telemetry")
    mine = [i for i, (type_id, _, _) in enumerate(records) if telemetry and type_id == telemetry.id]
    if mine:  # every telemetry payload has the table's length: round each float32 field of all at once
        payloads = np.frombuffer(b"".join(records[i][2] for i in mine), np.uint8).reshape(len(mine), -1).copy()
        for spec in telemetry.fields.values():
            if spec["dtype"] == "float32":
                columns = slice(spec["offset"], spec["offset"] + 4 * int(np.prod(spec["shape"], dtype=np.int64)))
                field = np.ascontiguousarray(payloads[:, columns]).view("<f4")
                payloads[:, columns] = round_significant(field, bits).view(np.uint8)
        for row, i in enumerate(mine):
            records[i] = records[i][:2] + (payloads[row].tobytes(),)
    return b"".join([PREAMBLE.pack(MAGIC, VERSION, len(text), zlib.crc32(text)), text]
                    + [frame_record(type_id, step, payload) for type_id, step, payload in records])


def xz_compressed(data):
    """data compressed as one xz stream, with a dictionary no larger than the data needs (what a
    reader must then hold in memory too)."""
    dictionary = max(1 << 16, min(1 << 26, 1 << max(len(data) - 1, 1).bit_length()))
    return lzma.compress(data, format=lzma.FORMAT_XZ,
                         filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": dictionary}])


def exists_already(path):
    return LogError(f"{path}: exists already; a log is never overwritten (choose another name)")


def write_new(path, data):
    """Writes data to a file that must not exist yet (a log is never overwritten), whole or not at
    all: into a staged file beside it, flushed to the disk, then linked to path, which fails when
    path exists; the staged file is removed in every case."""
    if os.path.lexists(path):
        raise exists_already(path)
    fd, staged = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".attnlog-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(staged, path)
    except FileExistsError:
        raise exists_already(path) from None
    except OSError as e:
        raise LogError(f"{path}: cannot write ({e.strerror or e}); nothing written") from None
    finally:
        os.unlink(staged)


# -- command line ----------------------------------------------------------------------------------


def command_info(log, args):
    h = log.header
    print(f"{log.path}: {h['format']} format version {log.version}, created {h.get('created')}")
    print(f"run: backend {h.get('backend')}, device {json.dumps(h.get('device'), ensure_ascii=False)}, "
          f"{h.get('num_processes', 1)} process(es), seed {h.get('seed')}")
    print("model: " + " ".join(f"{k}={v}" for k, v in log.config.items()))
    if log.measurement:
        print("measurement: " + measurement_text(log.measurement))
    if log.reduced:
        print(f"reduced: a copy of {log.reduced['from']} whose telemetry is rounded to "
              f"{log.reduced['significant_bits']} significant bits")
        for what in log.reduced.get("left_out", []):
            print(f"  left out of the copy: {what}")
    options = h.get("options") or {}
    print(f"options ({len(options)}):")
    for name, value in options.items():
        print(f"  {name} = {json.dumps(value, ensure_ascii=False)}")
    counts = ", ".join(f"{n} {name}" for name, n in log.record_counts().items())
    span = log.step_range()
    print(f"records: {counts}; " + (f"steps {span[0]}..{span[1]}" if span else "no steps"))
    metrics = log.record_types.get("telemetry")
    if metrics:
        print("metrics: " + ", ".join(f"{name} [{_dims_text(spec['dims'])}]" for name, spec in metrics.fields.items()))
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
        if "val_loss" in log._numeric_fields("val"):
            steps, values = log.val_loss()
            for step, value in zip(steps.tolist(), _text(values)):
                add(step, f"  val_loss {value}")
        for step, text in log.notes():
            add(step, f"  note: {text}")
    for name in [args.metric] if args.metric else log.metric_names():
        steps, values = log.metric(name)
        dims = log.record_types["telemetry"].fields[name]["dims"]
        for step, table in zip(steps.tolist(), values):
            if args.step is None or step == args.step:  # format only the tables to be printed
                add(step, f"  {name} [{_dims_text(dims)}]" + "".join(f"\n    {row}" for row in _rows(table, dims)))
    if args.step is not None and args.step not in lines:
        raise LogError(f"{log.path}: nothing recorded at step {args.step}")
    for step in sorted(lines):
        print(f"step {step}")
        print("\n".join(lines[step]))


def _metric_columns(log, name):
    """The header and columns of csv --metric: step,layer,head_or_dim,value for a metric of layer by
    column, step,NAME for a metric of one value per step."""
    steps, values = log.metric(name)
    if values.ndim not in (1, 3):
        raise LogError(f"{log.path}: {name} has the shape {list(values.shape[1:])}, not layer by column or one "
                       "value (export writes every value of every shape)")
    if values.ndim == 1:
        return ["step", name], [steps, values]
    n, layers, cols = values.shape
    return (["step", "layer", "head_or_dim", "value"],
            [np.repeat(steps, layers * cols), np.tile(np.repeat(np.arange(layers), cols), n),
             np.tile(np.arange(cols), n * layers), values.ravel()])


def command_csv(log, args):
    if args.metric is not None:
        header, columns = _metric_columns(log, args.metric)
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


def command_reduce(log, args):
    if log.reduced and log.reduced["significant_bits"] < args.bits:
        raise LogError(f"{log.path}: already reduced to {log.reduced['significant_bits']} significant bits; "
                       f"--bits {args.bits} would only pretend to more")
    if os.path.lexists(args.output):
        raise exists_already(args.output)
    data = reduced_log(log, args.bits)
    write_new(args.output, xz_compressed(data) if args.output.endswith(".xz") else data)
    left = f"; left out, as every read does: {'; '.join(log.problems)}" if log.problems else ""
    print(f"{args.output}: {len(data)} bytes, the telemetry of {log.path} at {args.bits} significant bits{left}")


COMMANDS = {"info": command_info, "dump": command_dump, "csv": command_csv, "export": command_export,
            "reduce": command_reduce}


@functools.lru_cache(maxsize=None)
def command_line():
    """The command line's parser (made once: parse_args leaves it as it is)."""
    parser = ArgumentParser(description="Reads the trainer's binary run log (docs/log_format.md).")
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
    which.add_argument("--metric", help="one telemetry metric: step,layer,head_or_dim,value (step,NAME for one "
                       "value per step)")
    which.add_argument("--scalars", action="store_true", help="the step records: step,loss,lr,... (the default)")
    which.add_argument("--val", action="store_true", help="the validation loss: step,val_loss")
    table.add_argument("-o", "--output", metavar="FILE", help="write here instead of to standard output")
    export = commands.add_parser("export", help="every value of every log in long format, one row per value: "
                                 "run,step,metric,layer,head,head_kind,kv_head,value")
    export.add_argument("logs", nargs="+", metavar="LOG", help="the run log(s)")
    export.add_argument("-o", "--output", metavar="FILE", required=True,
                        help="FILE.csv (a table with a header row) or FILE.npz (compressed, one array per column, "
                        "the text columns as codes into <column>_names)")
    export.add_argument("--run-label", action="append", metavar="LABEL", help="the run column of a log, once "
                        "per log in the order given (default: the log's folder/file stem)")
    reduce = commands.add_parser("reduce", help="a smaller copy: the telemetry's values rounded to fewer "
                                 "significant bits, everything else as it was; compressed with xz when OUT ends in .xz")
    reduce.add_argument("log", help="the run log")
    reduce.add_argument("-o", "--output", metavar="OUT", required=True, help="the copy (a new file)")
    reduce.add_argument("--bits", type=significant_bits, default=16,
                        help=f"significant bits kept, 2 to {FLOAT32_BITS} (default 16: a relative change below 2^-16, far "
                        f"below the 2^-8 of the bf16 arithmetic the GPU measures with; {FLOAT32_BITS} keeps every value)")
    return parser


def significant_bits(text):
    if not (text.isascii() and text.isdigit()) or not 2 <= int(text) <= FLOAT32_BITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 2 to {FLOAT32_BITS}")
    return int(text)


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    return run(run_command, command_line().parse_args, argv)


def run_command(args):
    logs = [open_log(path) for path in args.logs] if args.command == "export" else open_log(args.log)
    COMMANDS[args.command](logs, args)
