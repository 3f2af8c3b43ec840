"""attnlog.bpe and attnlog-tokenize-hf: Hugging Face byte-level BPE tokenizers and their shards.

The tokenizer.json files here are written by hand, with vocabularies and merges small enough that
the right ids follow from the rules of the `tokenizers` library by hand (the derivation beside each
case). Where the library itself is at hand (its Python package, or its Node.js build installed by
`make test` into build/npm), a tokenizer trained by it, in the GPT-2, Llama 3 and Qwen2 forms,
encodes and decodes a varied text (Unicode, digits, white space runs, code, special tokens) to
exactly the library's ids and text. The shards `prepare` writes are read back by the training
loader itself (build/test_data read-shards).
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from attnlog import bpe, commands, tokenize_hf

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "tokenize_hf.py"
READER = Path(os.environ.get("TEST_DATA_BIN", ROOT / "build" / "test_data"))
NODE_MODULES = Path(os.environ.get("TOKENIZERS_NODE_MODULES", ROOT / "build" / "npm" / "node_modules"))

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PRE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def split_pre(pattern):
    """The pre-tokenizer of Llama 3 and Qwen2 with this regex."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


def added(content, i, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def spec(extra=(), merges=(), pre=GPT2_PRE, added_tokens=(), normalizer=None, **model):
    """A tokenizer.json as a dict: the 256 byte tokens with id = the byte, then `extra` (written in
    byte characters) with ids 256, 257, ... in order."""
    vocab = {c: b for b, c in enumerate(bpe.BYTE_CHARS)}
    for token in extra:
        vocab[token] = len(vocab)
    fields = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": vocab, "merges": [m.split(" ") for m in merges]}
    fields.update(model)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added_tokens),
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": fields}


def write(folder, tokenizer, config=None, name="tokenizer.json"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(tokenizer), encoding="utf-8")
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / name


def load(tmp_path, **kwargs):
    return bpe.load(write(tmp_path / "tok", spec(**kwargs)))


def words(tok, text):
    return [w for piece, _ in bpe.split_added(tok, text, None) for w in bpe.pre_tokenize(tok, piece)]


@pytest.fixture
def cli(capsys):
    """attnlog-tokenize-hf run in this process: its (status, stdout, stderr)."""
    def run(*args):
        status = tokenize_hf.main([str(a) for a in args])
        return (status, *capsys.readouterr())
    return run


def assert_one_line_error(result, *parts):
    status, out, err = result
    assert status == commands.USER_ERROR, out + err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert all(part in err for part in parts), (parts, err)


# -- the byte map, merges, pre-tokenizers, added tokens --------------------------------------------------------


def test_byte_map_is_gpt2s():
    # printable Latin-1 stands for itself; the rest in byte order from U+0100: 0x00-0x20 are
    # U+0100-U+0120, 0x7F U+0121, 0x80-0xA0 U+0122-U+0142, 0xAD U+0143
    known = {0x00: "\u0100", 0x09: "\u0109", 0x0A: "\u010a", 0x20: "\u0120", 0x7F: "\u0121", 0x80: "\u0122",
             0xA0: "\u0142", 0xAD: "\u0143", ord("a"): "a", ord("!"): "!", 0xA1: "\u00a1", 0xE9: "\u00e9"}
    assert {b: bpe.BYTE_CHARS[b] for b in known} == known
    assert len(set(bpe.BYTE_CHARS)) == 256


def test_merges_apply_by_rank(tmp_path):
    # "abc": the pairs (a, b) and (b, c); the one listed first in merges is merged, and the other
    # pair is then gone. ab = 256, bc = 257.
    assert bpe.encode(load(tmp_path / "1", extra=["ab", "bc"], merges=["b c", "a b"]), "abc") == [97, 257]
    assert bpe.encode(load(tmp_path / "2", extra=["ab", "bc"], merges=["a b", "b c"]), "abc") == [256, 99]


def test_merges_one_at_a_time_leftmost_first(tmp_path):
    # "aaa" with (a, a): the leftmost pair first, aa + a.
    assert bpe.encode(load(tmp_path / "1", extra=["aa"], merges=["a a"]), "aaa") == [256, 97]
    # "aaaa" with merges [aa a, a a] (aa = 256, aaa = 257): (a, a) at 0 makes aa a a; now (aa, a),
    # of rank 0, goes before the second (a, a): aaa a. Merging every (a, a) at once, as GPT-2's
    # original encoder does, would give aa aa instead.
    assert bpe.encode(load(tmp_path / "2", extra=["aa", "aaa"], merges=["aa a", "a a"]), "aaaa") == [257, 97]


def test_unicode_becomes_its_utf8_bytes(tmp_path):
    tok = load(tmp_path / "1")
    assert bpe.encode(tok, "\u00e9") == [0xC3, 0xA9]
    assert bpe.encode(tok, "\U0001F600") == [0xF0, 0x9F, 0x98, 0x80]
    assert bpe.encode(tok, " \n") == [0x20, 0x0A]
    # merges are written in byte characters: é is C3 A9, the characters \u00c3 \u00a9
    merged = load(tmp_path / "2", extra=["\u00c3\u00a9"], merges=["\u00c3 \u00a9"])
    assert bpe.encode(merged, "caf\u00e9") == [99, 97, 102, 256]


def test_gpt2_regex(tmp_path):
    tok = load(tmp_path)
    # contractions in lower case only, a space joins the next word or number, a run of spaces
    # before a word leaves its last space to the word
    assert words(tok, "I'm 12345  x") == ["I", "'m", "\u012012345", "\u0120", "\u0120x"]
    assert words(tok, "I'M") == ["I", "'", "M"]


def test_llama3_and_qwen2_regexes(tmp_path):
    text = "I'M 12345 ab\n\n  cd  end.\n"
    # (?i:'m) takes 'M; a space before digits stands alone; digits go in threes (Llama 3) or one by
    # one (Qwen2); \s*[\r\n]+ takes the newlines but not the spaces after them; of "  cd" the last
    # space joins the word; punctuation keeps the newline after it.
    llama = words(load(tmp_path / "l", pre=split_pre(LLAMA3)), text)
    assert llama == ["I", "'M", "\u0120", "123", "45", "\u0120ab", "\u010a\u010a", "\u0120", "\u0120cd", "\u0120",
                     "\u0120end", ".\u010a"]
    qwen = words(load(tmp_path / "q", pre=split_pre(QWEN2)), text)
    assert qwen == llama[:3] + ["1", "2", "3", "4", "5"] + llama[5:]


def test_byte_level_prefix_space_and_no_regex(tmp_path):
    prefix = dict(GPT2_PRE, add_prefix_space=True)
    assert bpe.encode(load(tmp_path / "1", pre=prefix), "hi") == [0x20, ord("h"), ord("i")]
    # (a, space) merges only when the regex does not cut "a b" into "a" and " b"
    assert bpe.encode(load(tmp_path / "2", extra=["a\u0120"], merges=["a \u0120"]), "a b") == [97, 32, 98]
    no_regex = dict(GPT2_PRE, use_regex=False)
    assert bpe.encode(load(tmp_path / "3", extra=["a\u0120"], merges=["a \u0120"], pre=no_regex), "a b") == [256, 98]


def test_special_tokens_come_out_first(tmp_path):
    tok = load(tmp_path / "1", extra=["a<"], merges=["a <"],
               added_tokens=[added("<|endoftext|>", 1000), added("<x>", 1001), added("<x>y", 1002)])
    # the merge (a, <) would join across the special token if it were not cut out first
    assert bpe.encode(tok, "a<|endoftext|>b") == [97, 1000, 98]
    assert bpe.encode(tok, "<x>y<x>") == [1002, 1001]  # leftmost, then longest
    assert bpe.decode(tok, [97, 1000, 98]) == "a<|endoftext|>b"
    assert bpe.decode(tok, [97, 1000, 98], skip_special=True) == "ab"
    assert tok.vocab_size == 1003


def test_added_tokens_normalized_or_not(tmp_path):
    nfc = {"type": "NFC"}
    raw = load(tmp_path / "raw", normalizer=nfc, added_tokens=[added("e\u0301", 1000, normalized=False)])
    assert bpe.encode(raw, "e\u0301") == [1000]          # found in the text as it is
    assert bpe.encode(raw, "\u00e9") == [0xC3, 0xA9]     # the composed form is not the token
    normalized = load(tmp_path / "norm", normalizer=nfc, added_tokens=[added("e\u0301", 1000, normalized=True)])
    assert bpe.encode(normalized, "\u00e9") == [1000]    # found in the normalized text, as NFC writes it
    assert bpe.encode(normalized, "e\u0301") == [1000]


def test_added_token_strip_and_single_word(tmp_path):
    tok = load(tmp_path / "1", added_tokens=[added("<mask>", 1000, lstrip=True, rstrip=True),
                                             added("<w>", 1001, single_word=True), added("<n>", 1002)])
    assert bpe.encode(tok, "a  <mask>  b") == [97, 1000, 98]  # the spaces on both sides go into the token
    assert bpe.encode(tok, "a  <n>  b") == [97, 32, 32, 1002, 32, 32, 98]
    assert bpe.encode(tok, "x <w> y") == [120, 32, 1001, 32, 121]
    assert bpe.encode(tok, "x<w>y") == [120, 60, 119, 62, 121]  # inside a word: not the token


def test_ignore_merges(tmp_path):
    # abc is in the vocabulary but no merge makes it: BPE gives ab c; with ignore_merges (Llama 3)
    # a word found whole in the vocabulary is that token
    kwargs = dict(extra=["ab", "bc", "abc"], merges=["a b", "b c"])
    assert bpe.encode(load(tmp_path / "1", **kwargs), "abc") == [256, 99]
    assert bpe.encode(load(tmp_path / "2", ignore_merges=True, **kwargs), "abc") == [258]


def test_normalizers(tmp_path):
    assert bpe.encode(load(tmp_path / "0"), "e\u0301") == [101, 0xCC, 0x81]
    assert bpe.encode(load(tmp_path / "1", normalizer={"type": "NFC"}), "e\u0301") == [0xC3, 0xA9]
    sequence = {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFC"}]}
    assert bpe.encode(load(tmp_path / "2", normalizer=sequence), "\ufb01") == [ord("f"), ord("i")]  # the ligature fi


def test_legacy_merges_read_as_pairs(tmp_path):
    legacy = spec(extra=["ab", "bc"], merges=["b c", "a b"])
    legacy["model"]["merges"] = ["#version: 0.2", "b c", "a b"]
    assert bpe.encode(bpe.load(write(tmp_path, legacy)), "abc") == [97, 257]


def test_unknown_bytes(tmp_path):
    tokenizer = spec(extra=["<unk>"])
    del tokenizer["model"]["vocab"]["z"]
    with pytest.raises(bpe.TokenizerError, match="no token for the byte 0x7A"):
        bpe.encode(bpe.load(write(tmp_path / "1", tokenizer)), "zz")
    tokenizer["model"]["unk_token"] = "<unk>"
    assert bpe.encode(bpe.load(write(tmp_path / "2", tokenizer)), "azz") == [97, 256, 256]
    tokenizer["model"]["fuse_unk"] = True
    assert bpe.encode(bpe.load(write(tmp_path / "3", tokenizer)), "azz") == [97, 256]


def test_decode_round_trip(tmp_path):
    tok = load(tmp_path, extra=["\u0120t", "he", "\u0120the"], merges=["\u0120 t", "h e", "\u0120t he"])
    text = "at the  café\tde \U0001F600 \u65e5\u672c 12\r\n"
    ids = bpe.encode(tok, text)
    assert 258 in ids and bpe.decode(tok, ids) == text
    assert bpe.decode(tok, [0xC3]) == "\ufffd"             # a character cut short
    assert bpe.decode(tok, [104, 99999, 105]) == "hi"     # ids outside the vocabulary are left out


# -- malformed tokenizer.json: one line naming the file and the field --------------------------------------------


def mutate(path, value):
    """spec() with the field at path (keys separated by dots) set to value (None: removed)."""
    tokenizer = spec(extra=["ab"], merges=["a b"])
    *parents, last = path.split(".")
    target = tokenizer
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return tokenizer


@pytest.mark.parametrize("path, value, parts", [
    ("model.type", "WordPiece", ["model.type: 'WordPiece' is not implemented"]),
    ("model.dropout", 0.1, ["model.dropout"]),
    ("model.continuing_subword_prefix", "##", ["model.continuing_subword_prefix"]),
    ("model.byte_fallback", True, ["model.byte_fallback"]),
    ("model.vocab", None, ["model.vocab: missing"]),
    ("model.vocab", {}, ["model.vocab: empty"]),
    ("model.merges", [["a", "q q"]], ["model.merges[0]: 'q q' is not in model.vocab"]),
    ("model.merges", ["a b c"], ["model.merges[0]"]),
    ("model.merges", [["a", "b"], ["b", "c"]], ["model.merges[1]: 'bc' is not in model.vocab"]),
    ("model.vocab.ab", -3, ["model.vocab: the id of 'ab' is -3"]),
    ("model.vocab.ab", 97, ["model.vocab: id 97 is given to both 'a' and 'ab'"]),
    ("model.unk_token", "<unk>", ["model.unk_token: '<unk>' is not in model.vocab"]),
    ("normalizer", {"type": "Lowercase"}, ["normalizer.type: 'Lowercase' is not implemented"]),
    ("pre_tokenizer", {"type": "Metaspace"}, ["pre_tokenizer.type: 'Metaspace' is not implemented"]),
    ("pre_tokenizer", None, ["pre_tokenizer: missing"]),
    ("pre_tokenizer", dict(split_pre(LLAMA3), pretokenizers=[{"type": "Split", "pattern": {"Regex": "("},
                                                            "behavior": "Isolated", "invert": False}, GPT2_PRE]),
     ["pre_tokenizer.pretokenizers[0].pattern: not a regular expression"]),
    ("pre_tokenizer", dict(split_pre(LLAMA3), pretokenizers=[{"type": "Split", "pattern": {"Regex": " "},
                                                            "behavior": "MergedWithNext", "invert": False}, GPT2_PRE]),
     ["pre_tokenizer.pretokenizers[0].behavior: 'MergedWithNext' is not implemented"]),
    ("pre_tokenizer", dict(split_pre(LLAMA3), pretokenizers=[GPT2_PRE, GPT2_PRE]),
     ["pre_tokenizer.pretokenizers[0].type: 'ByteLevel' is not implemented here"]),
    ("added_tokens", [{"id": 5}], ["added_tokens[0].content: missing"]),
    ("added_tokens", [added("ab", 7)], ["added_tokens[0]: 'ab' has id 7 here but 256 in model.vocab"]),
    ("decoder", {"type": "WordPiece"}, ["decoder.type: 'WordPiece' is not implemented"]),
])
def test_malformed_tokenizer_json(tmp_path, path, value, parts, cli):
    tokenizer = write(tmp_path, mutate(path, value))
    assert_one_line_error(cli("encode", tokenizer, "abc"), str(tokenizer), *parts)


def test_unreadable_tokenizer_json(tmp_path, cli):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": ')
    assert_one_line_error(cli("encode", tmp_path, "x"), str(bad), "not a JSON file")
    bad.write_text("[1, 2]")
    assert_one_line_error(cli("encode", bad, "x"), str(bad), "the top level is not an object")
    assert_one_line_error(cli("encode", tmp_path / "none", "x"), str(tmp_path / "none"), "No such file or directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("encode", tmp_path / "empty", "x"), str(tmp_path / "empty" / "tokenizer.json"),
                          "No such file or directory")


def test_encode_and_decode_commands(tmp_path, cli):
    path = write(tmp_path, spec(extra=["ab"], merges=["a b"], added_tokens=[added("<|endoftext|>", 300)]))
    assert cli("encode", path, "ab<|endoftext|>\u00e9") == (0, "256 300 195 169\n", "")
    assert cli("decode", path, "256", "300", "195", "169") == (0, "ab<|endoftext|>\u00e9\n", "")
    assert cli("decode", path, "256", "300", "--skip-special") == (0, "ab\n", "")
    # the script of the checkout, reading standard input
    result = subprocess.run([sys.executable, str(SCRIPT), "encode", str(path), "-"], input="ab", capture_output=True,
                            text=True)
    assert (result.returncode, result.stdout) == (0, "256\n"), result.stderr
    assert_one_line_error(cli("decode", path, "-4"), "'-4' is not a token id")


# -- against the tokenizers library ------------------------------------------------------------------------------


class PythonTokenizers:
    """The library's Python package."""
    name = "tokenizers (Python)"

    def __init__(self, module):
        self.lib = module

    def train(self, corpus, out):
        lib = self.lib
        tok = lib.Tokenizer(lib.models.BPE())
        tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = lib.trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                          initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet())
        tok.train([str(corpus)], trainer)
        tok.save(str(out))

    def encode(self, path, texts):
        tok = self.lib.Tokenizer.from_file(str(path))
        results = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            results.append((ids, tok.decode(ids, skip_special_tokens=False)))
        return results


NODE_TRAIN = """const t = require('tokenizers');
const tok = new t.Tokenizer(t.BPE.empty());
tok.setPreTokenizer(t.byteLevelPreTokenizer(false, true));
tok.train([process.argv[1]]);
tok.save(process.argv[2], false);
"""
NODE_ENCODE = """const t = require('tokenizers');
const fs = require('fs');
const tok = t.Tokenizer.fromFile(process.argv[1]);
const texts = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
(async () => {
  const out = [];
  for (const text of texts) {
    const ids = (await tok.encode(text, null, {addSpecialTokens: false})).getIds();
    out.push([ids, await tok.decode(ids, false)]);
  }
  fs.writeFileSync(process.argv[3], JSON.stringify(out));
})();
"""


class NodeTokenizers:
    """The library's Node.js build (npm package tokenizers: the same Rust code)."""
    name = "tokenizers (Node.js)"

    def __init__(self, node, modules):
        self.node, self.env = node, dict(os.environ, NODE_PATH=str(modules))

    def run(self, script, *args):
        result = subprocess.run([self.node, "-e", script, *map(str, args)], capture_output=True, text=True,
                                env=self.env)
        assert result.returncode == 0, result.stderr[-2000:]

    def train(self, corpus, out):
        self.run(NODE_TRAIN, corpus, out)

    def encode(self, path, texts):
        texts_path, out = Path(str(path) + ".texts.json"), Path(str(path) + ".out.json")
        texts_path.write_text(json.dumps(texts))
        self.run(NODE_ENCODE, path, texts_path, out)
        return [tuple(pair) for pair in json.loads(out.read_text())]


@pytest.fixture(scope="module")
def reference():
    try:
        import tokenizers
        return PythonTokenizers(tokenizers)
    except ImportError:
        pass
    node = shutil.which("node")
    if node and (NODE_MODULES / "tokenizers").is_dir():
        return NodeTokenizers(node, NODE_MODULES)
    pytest.skip(f"the tokenizers library is not here: neither its Python package nor its Node.js build in "
                f"{NODE_MODULES} (make test installs that with npm)")


SAMPLES = ["Hello world", "It's 12345 o'clock, isn't it? I'LL do it, you'd've.",
           "  leading\tand   trailing  \n\n\n spaces   ", "def f(x):\n    return x**2  # square\r\n\tif x != 0: pass\n",
           "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, \ud55c\uad6d\uc5b4, "
           "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac, \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
           "emoji \U0001F600\U0001F44D\U0001F3FD, e\u0301 and A\u030a against \u00c5, the ligature \ufb01",
           "<|endoftext|>next<|im_start|>user\n<think>hmm</think>", "a  <mask>  b, x<mask>y, <mask>\n<mask>",
           "3.14159 1e-10 0x1F 1,000,000 \u0663\u0664 \u00b2\u00bd\u2460",
           "\x1c\x1d\x1e\x1f\x85\xa0\u2028\u3000 x", "", " ", "\n", "a" * 300, "=" * 40 + " ---- ****"]
PIECES = [" ", "  ", "\n", "\r\n", "\t", "'s", "'T", "'ll", "0123456789", "abcXYZ", "\u00e9\u00e0\u00fc\u00df",
          "\u65e5\u672c\u8a9e", "\ud55c\uad6d", "\U0001F600", "e\u0301", "\u00a0", "<|endoftext|>", "<think>", "!?.,;:",
          "==", "//", " <mask> ", "<mask>", "\u200b", "\U0001F9D1\u200d\U0001F4BB", "\u0300"]


# Words of the compared texts, not of the training text, given a token of their own.
UNMERGED = ["quixotic", "\u0120zephyr", "\u0120Zephyrs"]


def varied_texts():
    """SAMPLES, random strings of PIECES and of any code points, and the project's own code and docs."""
    rng = random.Random(21)
    texts = list(SAMPLES) + ["quixotic zephyr, Zephyrs! quixotic"]
    texts += ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30))) for _ in range(150)]
    code_point = lambda: rng.choice([rng.randint(0, 0x2FF), rng.randint(0x300, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
    texts += ["".join(chr(code_point()) for _ in range(rng.randint(1, 20))) for _ in range(100)]
    for name in ("README.md", "llmc/dataloader.h", "scripts/attnlog/bpe.py", "docs/telemetry.md"):
        texts.append((ROOT / name).read_text(encoding="utf-8")[:30000])
    return texts


def family_variants(trained):
    """The library's trained tokenizer as GPT-2, Llama 3 and Qwen2 write theirs, with special and
    other added tokens; every byte added to the vocabulary, and words that no merge makes (which
    only ignore_merges finds whole)."""
    vocab = trained["model"]["vocab"]
    for token in bpe.BYTE_CHARS + UNMERGED:
        vocab.setdefault(token, len(vocab))
    n = len(vocab)
    trained["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    trained["added_tokens"] = [added("<|endoftext|>", n), added("<|im_start|>", n + 1),
                               added("<think>", n + 2, special=False), added("</think>", n + 3, special=False),
                               added("\u00e9l\u00e8ve", n + 4, normalized=True),
                               added("<mask>", n + 5, lstrip=True, rstrip=True, single_word=True)]
    llama = json.loads(json.dumps(trained))
    llama["pre_tokenizer"] = split_pre(LLAMA3)
    llama["model"]["ignore_merges"] = True
    qwen = json.loads(json.dumps(trained))
    qwen["pre_tokenizer"] = split_pre(QWEN2)
    qwen["normalizer"] = {"type": "NFC"}
    legacy = json.loads(json.dumps(trained))
    legacy["model"]["merges"] = [" ".join(pair) for pair in legacy["model"]["merges"]]
    return {"gpt2": trained, "llama3": llama, "qwen2": qwen, "legacy_merges": legacy}


def test_same_ids_and_text_as_the_tokenizers_library(reference, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join([(ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/model.md",
                                 "llmc/dataprep.h")] + SAMPLES * 20), encoding="utf-8")
    reference.train(corpus, tmp_path / "trained.json")
    trained = json.loads((tmp_path / "trained.json").read_text(encoding="utf-8"))
    assert len(trained["model"]["merges"]) > 500
    texts = varied_texts()
    for name, tokenizer in family_variants(trained).items():
        path = write(tmp_path / name, tokenizer)
        expected = reference.encode(path, texts)
        tok = bpe.load(path)
        for text, (ids, decoded) in zip(texts, expected):
            assert bpe.encode(tok, text) == ids, (name, reference.name, text[:200])
            assert bpe.decode(tok, ids) == decoded, (name, reference.name, text[:200])


# -- documents and shards ----------------------------------------------------------------------------------------


def test_documents(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"\xef\xbb\xbf\n\nfirst line\r\n  second \n\n\nthird\n \n")
    b.write_bytes(b"one\n\ntwo \t\n")
    assert list(tokenize_hf.documents([a, b], "file")) == ["first line\n  second \n\n\nthird", "one\n\ntwo"]
    assert list(tokenize_hf.documents([a, b], "blank")) == ["first line\n  second", "third", "one", "two"]
    assert list(tokenize_hf.documents([a, b], "line")) == ["first line", "  second", "third", "one", "two"]
    assert list(tokenize_hf.documents([a, b], "line", max_docs=2)) == ["first line", "  second"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nno\xff good\n")
    with pytest.raises(commands.UserError, match=r"bad.txt: line 2 is not UTF-8 text \(byte 0xFF at column 3\)"):
        list(tokenize_hf.documents([bad], "file"))


def test_validation_documents():
    # documents of 9 bytes (10 with the +1) and a fraction of 1/4: the third is the first whose
    # half keeps the validation share below 1/4 of what was read (5 < 7.5), the fourth would not (15 > 10)
    assert tokenize_hf.choose_validation_docs([9, 9, 9, 9], 0.25) == [False, False, True, False]
    assert tokenize_hf.choose_validation_docs([100, 1], 0.01) == [False, True]  # at least one
    assert tokenize_hf.choose_validation_docs([1, 1], 0.99) == [False, True]    # and one for training


def test_document_tokens_follow_the_config(tmp_path):
    tokens = spec(added_tokens=[added("<|begin_of_text|>", 300), added("<|end_of_text|>", 301),
                                added("<|endoftext|>", 302)])
    llama_config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    llama = bpe.load(write(tmp_path / "llama", tokens, llama_config))
    assert tokenize_hf.document_tokens(llama, None, None) == (("<|begin_of_text|>", 300), None,
                                                              "bos_token of tokenizer_config.json")
    qwen = bpe.load(write(tmp_path / "qwen", tokens, {"bos_token": None, "eos_token": {"content": "<|endoftext|>"}}))
    assert tokenize_hf.document_tokens(qwen, None, None) == (None, ("<|endoftext|>", 302),
                                                             "eos_token of tokenizer_config.json")
    no_bos = bpe.load(write(tmp_path / "no_bos", tokens, {"bos_token": "<|begin_of_text|>", "add_bos_token": False,
                                                           "eos_token": "<|end_of_text|>"}))
    assert tokenize_hf.document_tokens(no_bos, None, None)[:2] == (None, ("<|end_of_text|>", 301))
    mapped = write(tmp_path / "mapped", tokens)
    (tmp_path / "mapped" / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    assert tokenize_hf.document_tokens(bpe.load(mapped), None, None) == (("<|endoftext|>", 302), None,
                                                                         "bos_token of special_tokens_map.json")
    assert tokenize_hf.document_tokens(llama, "none", "<|endoftext|>") == (None, ("<|endoftext|>", 302),
                                                                           "--doc-start / --doc-end")
    bare = bpe.load(write(tmp_path / "bare", tokens))
    with pytest.raises(commands.UserError, match="names a bos_token or eos_token; say which special token"):
        tokenize_hf.document_tokens(bare, None, None)
    with pytest.raises(commands.UserError, match="--doc-end: '<eos>' is not a token of"):
        tokenize_hf.document_tokens(bare, None, "<eos>")


def read_shards(pattern, vocab_size):
    """{file name: ids} of the shards, as the training loader reads them."""
    if not READER.exists():
        pytest.fail(f"{READER} not found: build it with make build/test_data")
    result = subprocess.run([str(READER), "read-shards", str(pattern), str(vocab_size)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    shards = {}
    for line in result.stdout.splitlines():
        path, *ids = line.split(" ")
        shards[Path(path).name] = [int(i) for i in ids]
    return shards


def corpus(folder):
    """Three files of documents separated by blank lines: Unicode, digits, white space, code."""
    folder.mkdir()
    rng = random.Random(5)
    files = []
    for k in range(3):
        pieces = PIECES[:16] + [" the", " cat", "\u00e9t\u00e9", "x = 1;"]
        docs = ["".join(rng.choice(pieces) for _ in range(rng.randint(5, 60))) for _ in range(12)]
        files.append(folder / f"part{k}.txt")
        files[-1].write_text("\n\n".join(d.replace("\n", " ").replace("\r", " ").strip() or "x" for d in docs) + "\n")
    return files


def expected_streams(tok, files, start=None, end=None):
    """(train, validation) token streams of the documents, encoded here, as prepare must write them."""
    docs = list(tokenize_hf.documents(files, "blank"))
    is_val = tokenize_hf.choose_validation_docs([len(d.encode("utf-8")) for d in docs], 0.1)
    streams = ([], [])
    for doc, val in zip(docs, is_val):
        marked = ([start] if start is not None else []) + bpe.encode(tok, doc) + ([end] if end is not None else [])
        streams[val].extend(marked)
    return streams


def test_prepare_writes_shards_the_loader_reads(tmp_path, cli):
    folder = tmp_path / "qwen"
    write(folder, spec(extra=["\u0120the", "\u0120c", "at"], merges=["\u0120 c", "a t"], pre=split_pre(QWEN2),
                       normalizer={"type": "NFC"}, added_tokens=[added("<|endoftext|>", 400)]),
          {"bos_token": None, "eos_token": "<|endoftext|>"})
    files = corpus(tmp_path / "text")
    out = tmp_path / "out"
    status, printed, err = cli("prepare", folder, *files, "--out", out, "--docs", "blank", "--val-fraction", "0.1",
                               "--shard-tokens", "300", "--workers", "2")
    assert status == 0, err
    assert "ending with <|endoftext|> (id 400) (eos_token of tokenizer_config.json)" in printed
    tok = bpe.load(folder)
    train, val = expected_streams(tok, files, end=400)
    shards = read_shards(out / "*_*.bin", tok.vocab_size)
    train_shards = [shards[name] for name in sorted(shards) if name.startswith("train_")]
    val_shards = [shards[name] for name in sorted(shards) if name.startswith("val_")]
    assert sum(train_shards, []) == train and sum(val_shards, []) == val
    # 300 tokens a shard; the last takes the remainder when it is under a tenth of that
    assert len(train_shards) == len(train) // 300 + (len(train) % 300 >= 30)
    assert all(len(s) == 300 for s in train_shards[:-1]) and 30 <= len(train_shards[-1]) < 330
    header = (out / "train_000000.bin").read_bytes()[:12]
    assert header == struct.pack("<3i", 20240520, 1, len(train_shards[0]))
    info = (out / "dataset.txt").read_text()
    assert f"vocab_size: {tok.vocab_size}\n" in info and "shards: version 1 (uint16 tokens)" in info
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".bin")) == [
        ".complete", "dataset.txt", "tokenizer.json", "tokenizer_config.json"]
    assert bpe.encode(bpe.load(out), "the cat") == bpe.encode(tok, "the cat")

    # one process writes the same bytes; --force replaces the dataset and its extra shards, keeps other files
    (out / "notes.txt").write_text("mine")
    status, _, err = cli("prepare", folder, *files, "--out", out, "--docs", "blank", "--val-fraction", "0.1",
                         "--shard-tokens", "100000", "--workers", "1", "--force")
    assert status == 0, err
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000000.bin", "val_000000.bin"]
    assert read_shards(out / "train_*.bin", tok.vocab_size)["train_000000.bin"] == train
    assert (out / "notes.txt").read_text() == "mine"
    # a tokenizer.json of another name, without a config: copied as tokenizer.json, the old config gone
    other = tmp_path / "other" / "qwen.json"
    other.parent.mkdir()
    shutil.copyfile(folder / "tokenizer.json", other)
    status, _, err = cli("prepare", other, *files, "--out", out, "--docs", "blank", "--doc-end", "<|endoftext|>",
                         "--workers", "1", "--force")
    assert status == 0, err
    assert (out / "tokenizer.json").read_bytes() == other.read_bytes() and not (out / "tokenizer_config.json").exists()


def test_prepare_large_vocabulary_writes_version_2(tmp_path, cli):
    # an added token of id 70000: the ids need 32 bits
    folder = tmp_path / "llama"
    write(folder, spec(pre=split_pre(LLAMA3), ignore_merges=True, added_tokens=[added("<|begin_of_text|>", 70000)]),
          {"bos_token": "<|begin_of_text|>", "eos_token": None})
    files = corpus(tmp_path / "text")
    out = tmp_path / "out"
    status, _, err = cli("prepare", folder, *files, "--out", out, "--docs", "blank", "--val-fraction", "0.1",
                         "--workers", "1")
    assert status == 0, err
    train, val = expected_streams(bpe.load(folder), files, start=70000)
    shards = read_shards(out / "*.bin", 70001)
    assert shards == {"train_000000.bin": train, "val_000000.bin": val}
    assert train[0] == 70000 and train.count(70000) > 5
    assert (out / "val_000000.bin").read_bytes()[4:8] == (2).to_bytes(4, "little")
    assert "shards: version 2 (uint32 tokens)" in (out / "dataset.txt").read_text()


def test_prepare_errors(tmp_path, cli):
    folder = tmp_path / "tok"
    write(folder, spec(added_tokens=[added("<|endoftext|>", 300)]), {"eos_token": "<|endoftext|>"})
    one = tmp_path / "one.txt"
    one.write_text("a single document\n")
    assert_one_line_error(cli("prepare", folder, one, "--out", tmp_path / "o"), "one.txt: 1 document",
                          "too few to split")
    two = tmp_path / "two.txt"
    two.write_text("first\n\nsecond\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    assert_one_line_error(cli("prepare", folder, two, "--docs", "blank", "--out", busy), f"{busy}: is not empty")
    assert_one_line_error(cli("prepare", folder, two, "--docs", "blank", "--out", tmp_path / "o", "--doc-end", "<eos>"),
                          "--doc-end: '<eos>' is not a token of")
    assert_one_line_error(cli("prepare", folder, tmp_path / "missing.txt", "--out", tmp_path / "o"),
                          "missing.txt: cannot open")
    assert_one_line_error(cli("prepare", folder, two, "--out", tmp_path / "o", "--val-fraction", "1"),
                          "--val-fraction: 1 is not between 0 and 1")
    assert not (tmp_path / "o").exists()
