"""Token shards for ./train made with a Hugging Face byte-level BPE tokenizer (tokenizer.json of
GPT-2, Llama 3, Qwen2, Qwen3; attnlog.bpe), so that a pretrained model of that family can be
measured or fine-tuned on your text:

    attnlog-tokenize-hf prepare TOKENIZER FILE... --out DIR    # train_*.bin, val_*.bin, dataset.txt
    attnlog-tokenize-hf encode TOKENIZER TEXT                  # the ids of a text
    attnlog-tokenize-hf decode TOKENIZER ID...                 # the text of ids

(or /usr/bin/python3 scripts/tokenize_hf.py from the checkout). TOKENIZER is a tokenizer.json or
the model folder that holds it with its tokenizer_config.json.

`prepare` cuts the files into documents, splits them into training and validation and writes the
shards exactly as ./prepare_data does (dev/data/prepare_data.cpp, llmc/dataprep.h: the same
document modes, the same choice of validation documents, shards of --shard-tokens with a short
last one added to the one before), llm.c's format: version 1 (uint16) when every id of the
tokenizer fits, else version 2 (uint32), as for the vocabularies of 128k-152k tokens of Llama 3 and
Qwen. Each document is marked with the special tokens the tokenizer's config names:
  - it starts with bos_token, when tokenizer_config.json (or special_tokens_map.json) names one
    and does not set add_bos_token to false (Llama 3: <|begin_of_text|>);
  - otherwise it ends with eos_token (Qwen: <|endoftext|> for the base models; Qwen3's
    post-trained ones name <|im_end|>, the end of a chat turn: give --doc-end '<|endoftext|>' for
    plain text).
--doc-start and --doc-end set either (a token, or `none`); a config that names neither needs one
(GPT-2's: --doc-start '<|endoftext|>', as llm.c writes its shards). The text of a document is encoded as
tokenizers' encode(text, add_special_tokens=False) does: a special token written in the text
becomes that token.
"""
import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import struct
import sys
from array import array

from attnlog import bpe
from attnlog.commands import ArgumentParser, UserError, positive_int, run

SHARD_MAGIC, SHARD_HEADER_INTS = 20240520, 256  # llmc/dataloader.h
DOC_MODES = {"file": "each file is one document", "blank": "documents separated by blank lines",
             "line": "each line is one document"}
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
BLANK = " \t\r\f\v"

_worker_tokenizer = None  # the tokenizer of the encoding processes (inherited by fork)


# -- documents, as llmc/dataprep.h reads them ----------------------------------------------------------


def documents(files, mode, max_docs=0):
    """The documents of the files, in order: each file one (mode file), separated by blank lines
    (blank) or one per non-blank line (line); Windows line ends and a UTF-8 byte-order mark
    dropped, white space at a document's end and blank lines at its start too, documents of only
    white space skipped; at most max_docs (0: all), the files read no further than that. Text
    that is not UTF-8 is a UserError naming the file and line."""
    docs = (doc for path in files for doc in file_documents(path, mode) if doc)
    return itertools.islice(docs, max_docs or None)


def file_documents(path, mode):
    """The documents of one file, those left empty included."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"{path}: cannot open ({e.strerror})") from None
    lines = []
    with f:
        for number, raw in enumerate(f, 1):
            line = text_line(raw, number, path)
            blank = not line.strip(BLANK)
            if mode == "line":
                yield finish([line])
            elif mode == "blank" and blank:
                yield finish(lines)
            elif lines or not blank:  # a document never starts with a blank line
                lines.append(line)
    yield finish(lines)


def text_line(raw, number, path):
    raw = raw.rstrip(b"\n").removesuffix(b"\r")
    if number == 1:
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: line {number} is not UTF-8 text (byte 0x{raw[e.start]:02X} at column "
                        f"{e.start + 1})") from None


def finish(lines):
    """The document of these lines, and the list emptied for the next."""
    text = "\n".join(lines).rstrip(BLANK + "\n")
    lines.clear()
    return text


def choose_validation_docs(doc_bytes, fraction):
    """Which documents go to validation: walking them in order, one does when that brings the
    validation share of the text read so far closer to the fraction; at least one to each side
    (llmc/dataprep.h, choose_validation_docs)."""
    val, seen, in_val = [False] * len(doc_bytes), 0.0, 0.0
    for i, n in enumerate(doc_bytes):
        b = n + 1.0
        seen += b
        if in_val + b / 2 < fraction * seen:
            val[i] = True
            in_val += b
    if not any(val) and val:
        val[-1] = True
    if all(val) and len(val) > 1:
        val[0] = False
    return val


# -- shards ------------------------------------------------------------------------------------------


def shard_name(name, index):
    return f"{name}_{index:06d}.bin"


def is_shard_name(file_name, name):
    index = file_name[len(name) + 1:-4]
    return (file_name.startswith(name + "_") and file_name.endswith(".bin") and len(index) == 6
            and index.isdigit() and index.isascii())


class ShardSeries:
    """A split written as <dir>/<name>_000000.bin, _000001.bin, ... of at most max_tokens tokens
    each; a last shard of less than a tenth of max_tokens is added to the one before (as
    llmc/dataprep.h's ShardSeries does). Each shard is written under <path>.tmp and renamed when
    complete."""

    def __init__(self, out_dir, name, version, max_tokens):
        self.out_dir, self.name, self.version, self.max_tokens = out_dir, name, version, max_tokens
        self.file, self.count = None, 0   # the shard being written, its tokens
        self.held = []                    # tokens after a full shard, until they make a shard of their own
        self.shards = self.tokens = 0     # shards and tokens written

    def path(self):
        return os.path.join(self.out_dir, shard_name(self.name, self.shards))

    def write(self, ids):
        self.file.write(array("H" if self.version == 1 else "I", ids).tobytes())
        self.count += len(ids)

    def append(self, ids):
        while ids:
            if self.file is None:
                self.file, self.count = open(self.path() + ".tmp", "wb"), 0
                self.file.write(bytes(4 * SHARD_HEADER_INTS))  # the real header comes when the shard closes
            room = self.max_tokens - self.count
            if room > 0:
                self.write(ids[:room])
                ids = ids[room:]
                continue
            self.held += ids
            ids = []
            if len(self.held) >= self.max_tokens // 10:  # enough for a shard of their own
                ids, self.held = self.held, []
                self.close_shard()

    def close_shard(self):
        self.write(self.held)
        self.held = []
        self.file.seek(0)
        self.file.write(struct.pack(f"<{SHARD_HEADER_INTS}i", SHARD_MAGIC, self.version, self.count,
                                    *[0] * (SHARD_HEADER_INTS - 3)))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.path() + ".tmp", self.path())
        self.file = None
        self.tokens += self.count
        self.shards += 1

    def discard(self):
        """Gives up on the shard being written: its temporary file goes."""
        if self.file is not None:
            self.file.close()
            os.remove(self.path() + ".tmp")
            self.file = None

    def finish(self):
        """Closes the last shard and removes the shards of an earlier preparation past the last one
        written (named exactly as a shard: train_000007.bin, not train_extra.bin)."""
        if self.file is not None:
            self.close_shard()
        for file_name in os.listdir(self.out_dir):
            if is_shard_name(file_name, self.name) and int(file_name[len(self.name) + 1:-4]) >= self.shards:
                os.remove(os.path.join(self.out_dir, file_name))


# -- the documents' special tokens -------------------------------------------------------------------------


def read_config(folder):
    """tokenizer_config.json, else special_tokens_map.json, of the tokenizer's folder: (file name,
    its object) or (None, {})."""
    for name in CONFIG_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, UnicodeDecodeError, ValueError) as e:
                raise UserError(f"{path}: not a readable JSON file ({e})") from None
            if not isinstance(config, dict):
                raise UserError(f"{path}: not a tokenizer config: the top level is not an object")
            return name, config
    return None, {}


def config_token(config, field):
    """The token a config names for field (a string, or an object with its content), or None."""
    value = config.get(field)
    return value.get("content") if isinstance(value, dict) else value


def document_tokens(tok, start, end):
    """The (start, end) special tokens of every document, each (text, id) or None, and the rule
    that chose them, in words. start / end are the options' values (None: from the config)."""
    name, config = read_config(os.path.dirname(tok.path))
    if start is None and end is None:
        bos, eos = config_token(config, "bos_token"), config_token(config, "eos_token")
        if bos and config.get("add_bos_token", True) is not False:
            start, end, rule = bos, "none", f"bos_token of {name}"
        elif eos:
            start, end, rule = "none", eos, f"eos_token of {name}"
        else:
            raise UserError(f"{tok.path}: no {' or '.join(CONFIG_FILES)} beside it names a bos_token or eos_token; "
                            "say which special token marks documents with --doc-start or --doc-end")
    else:
        rule = "--doc-start / --doc-end"
    return resolve(tok, "--doc-start", start), resolve(tok, "--doc-end", end), rule


def resolve(tok, option, token):
    if token in (None, "none"):
        return None
    i = bpe.token_id(tok, token)
    if i is None:
        raise UserError(f"{option}: {token!r} is not a token of {tok.path}")
    return token, i


# -- prepare --------------------------------------------------------------------------------------------


def encode_document(text):
    return bpe.encode(_worker_tokenizer, text)


def check_output_dir(out_dir, force):
    """The output folder must be new or empty, unless --force (which replaces a dataset's files only)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out: {out_dir} is not a directory")
    names = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
    if names and not force:
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise UserError(f"{out_dir}: is not empty (it holds {names[0]}{more}); choose a new or empty --out, or --force "
                        "to write the dataset there (it replaces only a dataset's files: tokenizer.json, its config, "
                        "dataset.txt, .complete, train_NNNNNN.bin, val_NNNNNN.bin)")


def command_prepare(args):
    global _worker_tokenizer
    tok = bpe.load(args.tokenizer)
    start, end, rule = document_tokens(tok, args.doc_start, args.doc_end)
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val-fraction: {args.val_fraction:g} is not between 0 and 1")
    if args.shard_tokens < 10:
        raise UserError(f"--shard-tokens: {args.shard_tokens} is too small (at least 10)")
    doc_bytes = [len(doc.encode("utf-8")) for doc in documents(args.files, args.docs, args.max_docs)]
    if len(doc_bytes) < 2:
        raise UserError(f"{args.files[0]}: {len(doc_bytes)} document{'' if len(doc_bytes) == 1 else 's'} "
                        f"({DOC_MODES[args.docs]}): too few to split into training and validation")
    is_val = choose_validation_docs(doc_bytes, args.val_fraction)
    check_output_dir(args.out, args.force)
    print(f"tokenize: {len(doc_bytes)} documents in {len(args.files)} file(s) ({sum(doc_bytes) / 1e6:.1f} MB): "
          f"{len(doc_bytes) - sum(is_val)} train, {sum(is_val)} validation; each {marks(start, end)} ({rule})",
          flush=True)

    os.makedirs(args.out, exist_ok=True)
    stamp = os.path.join(args.out, ".complete")
    if os.path.exists(stamp):
        os.remove(stamp)
    version = 1 if tok.vocab_size <= 65536 else 2
    splits = {False: ShardSeries(args.out, "train", version, args.shard_tokens),
              True: ShardSeries(args.out, "val", version, args.shard_tokens)}
    docs = documents(args.files, args.docs, args.max_docs)
    _worker_tokenizer = tok
    try:
        with multiprocessing.get_context("fork").Pool(args.workers) if args.workers > 1 else nullpool() as pool:
            for val, ids in zip(is_val, pool.imap(encode_document, docs, chunksize=16)):
                splits[val].append(([start[1]] if start else []) + ids + ([end[1]] if end else []))
    except BaseException:
        for series in splits.values():
            series.discard()
        raise
    for series in splits.values():
        series.finish()

    copy_tokenizer(tok.path, args.out)
    train, val = splits[False], splits[True]
    with open(os.path.join(args.out, "dataset.txt"), "w", encoding="utf-8") as f:
        f.write(dataset_text(args, tok, start, end, rule, is_val, train, val, version))
    open(stamp, "w").close()
    print(f"tokenize: train {train.tokens} tokens ({train.shards} shard(s)), validation {val.tokens} tokens "
          f"({val.shards} shard(s)) in {args.out}; train with\n"
          f"  ./train -i '{args.out}/train_*.bin' -j '{args.out}/val_*.bin' --vocab-size {tok.vocab_size}"
          " (or the vocabulary of the checkpoint given with -e)")


def copy_tokenizer(path, out_dir):
    """The tokenizer into the dataset: path as tokenizer.json, and the config files beside it (an
    earlier preparation's that this tokenizer lacks removed)."""
    beside = [(os.path.join(os.path.dirname(path), name), name) for name in CONFIG_FILES]
    for source, name in [(path, "tokenizer.json")] + beside:
        target = os.path.join(out_dir, name)
        if os.path.isfile(source):
            if not (os.path.exists(target) and os.path.samefile(source, target)):
                shutil.copyfile(source, target)
        elif os.path.exists(target):
            os.remove(target)


def marks(start, end):
    """How the documents are marked, in words."""
    return " and ".join(filter(None, [start and f"starting with {start[0]} (id {start[1]})",
                                      end and f"ending with {end[0]} (id {end[1]})"])) or "with no special token"


class nullpool:
    """In place of a process pool: imap in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def imap(function, items, chunksize=1):
        return map(function, items)


def dataset_text(args, tok, start, end, rule, is_val, train, val, version):
    n_val = sum(is_val)
    return (f"source: {len(args.files)} text file(s) starting with {args.files[0]}\n"
            f"documents: {len(is_val)} ({DOC_MODES[args.docs]}"
            f"{f', at most {args.max_docs}' if args.max_docs else ''}), each {marks(start, end)}: {rule}\n"
            f"train: {len(is_val) - n_val} documents, {train.tokens} tokens in {train.shards} shard(s) train_*.bin\n"
            f"validation: {n_val} documents (chosen for {args.val_fraction:.4g} of the text, spread evenly), "
            f"{val.tokens} tokens in {val.shards} shard(s) val_*.bin\n"
            f"shards: version {version} ({'uint16' if version == 1 else 'uint32'} tokens), {args.shard_tokens} tokens "
            "each, the last of a split up to a tenth more\n"
            f"vocab_size: {tok.vocab_size}\n"
            f"tokenizer: tokenizer.json, byte-level BPE (a copy of {tok.path})\n")


# -- encode, decode --------------------------------------------------------------------------------------


def command_encode(args):
    tok = bpe.load(args.tokenizer)
    text = sys.stdin.read() if args.text == "-" else args.text
    print(" ".join(map(str, bpe.encode(tok, text))))


def command_decode(args):
    tok = bpe.load(args.tokenizer)
    sys.stdout.write(bpe.decode(tok, args.ids, skip_special=args.skip_special) + "\n")


def token_ids(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a token id (a whole number >= 0)")
    return int(text)


def command_line():
    parser = ArgumentParser(description="Token shards, encoding and decoding with a Hugging Face byte-level BPE "
                                        "tokenizer (tokenizer.json).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    prepare = commands.add_parser("prepare", help="text files to train_*.bin and val_*.bin shards")
    prepare.add_argument("tokenizer", metavar="TOKENIZER", help="tokenizer.json, or the folder that holds it")
    prepare.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files")
    prepare.add_argument("--out", required=True, metavar="DIR", help="output folder: new or empty, unless --force")
    prepare.add_argument("--docs", choices=DOC_MODES, default="file",
                         help="file: each file a document (default); blank: separated by blank lines; line: each line")
    prepare.add_argument("--val-fraction", type=float, default=0.05,
                         help="share of the text for validation (default 0.05)")
    prepare.add_argument("--max-docs", type=positive_int, default=0, help="use only the first N documents")
    prepare.add_argument("--doc-start", metavar="TOKEN",
                         help="token starting every document, or none (default: the config's bos_token)")
    prepare.add_argument("--doc-end", metavar="TOKEN",
                         help="token ending every document, or none (default: the config's eos_token, if no bos_token)")
    prepare.add_argument("--shard-tokens", type=positive_int, default=100_000_000,
                         help="tokens per shard (default 100M; the last of a split up to a tenth more)")
    prepare.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                         help="encoding processes (default: one per core)")
    prepare.add_argument("--force", action="store_true",
                         help="write into a folder that holds files, replacing a dataset's files there")
    encode = commands.add_parser("encode", help="print the ids of a text")
    encode.add_argument("tokenizer", metavar="TOKENIZER")
    encode.add_argument("text", metavar="TEXT", help="the text, or - for standard input")
    decode = commands.add_parser("decode", help="print the text of token ids")
    decode.add_argument("tokenizer", metavar="TOKENIZER")
    decode.add_argument("ids", nargs="+", type=token_ids, metavar="ID")
    decode.add_argument("--skip-special", action="store_true", help="leave special tokens out")
    return parser


COMMANDS = {"prepare": command_prepare, "encode": command_encode, "decode": command_decode}


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    return run(lambda args: COMMANDS[args.command](args), command_line().parse_args, argv)
