"""Hugging Face byte-level BPE tokenizers (tokenizer.json of GPT-2, Llama 3, Qwen2 and Qwen3), in
plain Python with the regex module: the ids the `tokenizers` library gives, and the text back.

    tok = bpe.load("Qwen3-0.6B")              # a tokenizer.json, or the folder that holds one
    ids = bpe.encode(tok, "Hello, world")
    text = bpe.decode(tok, ids)

Encoding goes as in `tokenizers`:
  1. added tokens (special ones such as <|endoftext|> and any other added token) are cut out of
     the text first, leftmost and then longest; those marked normalized: false are found in the
     text as it is, the others in the normalized text (next step);
  2. the normalizer (none, NFC, NFD, NFKC, NFKD, or a Sequence of them) on the rest;
  3. the pre-tokenizer cuts it into words: each Split regex in turn (its matches and the text
     between them become words, or only the text between them when the behavior is Removed),
     then ByteLevel: a space put in front when add_prefix_space, GPT-2's regex when use_regex,
     and every UTF-8 byte written as one printable character (BYTE_CHARS: the byte-to-unicode map
     that GPT-2 introduced, so that a vocabulary of strings holds every byte);
  4. BPE on each word: starting from its byte characters, the adjacent pair that comes first in
     `merges` (lowest rank; the leftmost where one pair occurs twice) is merged, again and again,
     until no adjacent pair is in `merges`. With ignore_merges (Llama 3) a word that is in the
     vocabulary whole is that one token.
What it does not implement (other models, normalizers, pre-tokenizers, split behaviors, BPE
dropout, word prefixes and suffixes) is refused when the file is read, in one line naming the field.
Where `tokenizers` would silently drop a byte that has no token (a vocabulary without all 256
byte characters and no unk_token), encoding stops with an error instead.
"""
import heapq
import json
import os
import unicodedata

import regex

from attnlog.commands import UserError

# The pre-tokenizer regex of GPT-2, which ByteLevel applies when use_regex is true.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")
CACHE_WORDS = 1 << 18  # words whose ids are kept, as tokenizers keeps them
SPLIT_BEHAVIORS = ("Isolated", "Removed")


def byte_chars():
    """The byte-to-unicode map of ByteLevel: printable Latin-1 bytes stand for themselves, the other
    68 (controls, space, soft hyphen, ...) for the code points 256, 257, ... in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = byte_chars()
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}
BYTE_WORD = str.maketrans({b: c for b, c in enumerate(BYTE_CHARS)})  # latin-1 text -> byte characters


class TokenizerError(UserError):
    """A tokenizer.json this module cannot use; the message names the file and the field."""


class Tokenizer:
    """A tokenizer.json read and checked: what encode and decode need."""

    def __init__(self, path):
        self.path = path
        self.vocab = {}           # model token -> id
        self.merges = {}          # (left id, right id) -> (rank, merged id)
        self.ignore_merges = False
        self.unk_id = None        # model.unk_token's id, or None
        self.fuse_unk = False
        self.added = {}           # added token content -> its entry in added_tokens
        self.raw_matcher = None   # regexes finding the added tokens, normalized: false / true
        self.normalized_matcher = None
        self.normalizers = []     # unicodedata forms, in order
        self.pre_steps = []       # ("split", compiled regex, remove matches) or ("bytes", add_prefix_space, use_regex)
        self.decodes = False      # decoder is ByteLevel
        self.id_tokens = {}       # id -> (token string as decoding sees it, special)
        self.cache = {}           # word -> ids

    @property
    def vocab_size(self):
        """One more than the largest id, added tokens included."""
        return max(self.id_tokens) + 1


def field_error(path, field, message):
    return TokenizerError(f"{path}: {field}: {message}")


def find_tokenizer_json(path):
    """path itself, or the tokenizer.json inside the folder path."""
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise TokenizerError(f"{path}: cannot open (No such file or directory)")
    return path


def load(path):
    """Reads a tokenizer.json (or the one in the folder path) and checks every field it uses."""
    path = find_tokenizer_json(path)
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: not a JSON file ({e})") from None
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(spec, dict):
        raise TokenizerError(f"{path}: not a tokenizer.json: the top level is not an object")
    tok = Tokenizer(path)
    read_model(tok, expect(path, spec, "model", dict))
    tok.normalizers = read_normalizer(path, spec.get("normalizer"), "normalizer")
    read_added_tokens(tok, spec.get("added_tokens") or [])
    tok.pre_steps = read_pre_tokenizer(path, spec.get("pre_tokenizer"))
    tok.decodes = read_decoder(path, spec.get("decoder"))
    tok.raw_matcher = added_matcher(tok, normalized=False)
    tok.normalized_matcher = added_matcher(tok, normalized=True)
    return tok


def expect(path, obj, field, kind, name=None):
    """obj[field], which must be of the given type."""
    value = obj.get(field) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        article = "an object" if kind is dict else "a " + kind.__name__
        raise field_error(path, name or field, f"missing or not {article}")
    return value


def read_model(tok, model):
    path = tok.path
    if model.get("type") != "BPE":
        raise field_error(path, "model.type", f"{model.get('type')!r} is not implemented (only BPE)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise field_error(path, "model.dropout", f"{model['dropout']} is not implemented (only null: no BPE dropout)")
    for field in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(field):
            raise field_error(path, f"model.{field}", f"{model[field]!r} is not implemented (only null)")
    if model.get("byte_fallback"):
        raise field_error(path, "model.byte_fallback", "true is not implemented (a byte-level vocabulary needs none)")
    vocab = expect(path, model, "vocab", dict, "model.vocab")
    if not vocab:
        raise field_error(path, "model.vocab", "empty")
    owner = {}
    for token, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise field_error(path, "model.vocab", f"the id of {token!r} is {i!r}, not a non-negative whole number")
        if i in owner:
            raise field_error(path, "model.vocab", f"id {i} is given to both {owner[i]!r} and {token!r}")
        owner[i] = token
    tok.vocab = vocab
    tok.id_tokens = {i: (token, False) for token, i in vocab.items()}
    tok.ignore_merges = bool(model.get("ignore_merges", False))
    tok.fuse_unk = bool(model.get("fuse_unk", False))
    unk = model.get("unk_token")
    if unk is not None:
        if unk not in vocab:
            raise field_error(path, "model.unk_token", f"{unk!r} is not in model.vocab")
        tok.unk_id = vocab[unk]
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise field_error(path, "model.merges", "missing or not a list")
    rank = 0
    for n, merge in enumerate(merges):
        if isinstance(merge, str) and merge.startswith("#version"):
            continue  # the header line of a merges.txt, skipped as tokenizers does
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(s, str) for s in pair):
            raise field_error(path, f"model.merges[{n}]", f"{merge!r} is not two tokens ('a b' or [\"a\", \"b\"])")
        for token in (pair[0], pair[1], pair[0] + pair[1]):
            if token not in vocab:
                raise field_error(path, f"model.merges[{n}]", f"{token!r} is not in model.vocab")
        # a pair listed twice: the last one counts, as in tokenizers
        tok.merges[vocab[pair[0]], vocab[pair[1]]] = (rank, vocab[pair[0] + pair[1]])
        rank += 1


def read_added_tokens(tok, added):
    path = tok.path
    if not isinstance(added, list):
        raise field_error(path, "added_tokens", "not a list")
    for n, entry in enumerate(added):
        name = f"added_tokens[{n}]"
        content = expect(path, entry, "content", str, name + ".content")
        i = expect(path, entry, "id", int, name + ".id")
        if not content or i < 0:
            raise field_error(path, name, f"content {content!r}, id {i}: an added token needs text and an id >= 0")
        if tok.vocab.get(content, i) != i:
            raise field_error(path, name, f"{content!r} has id {i} here but {tok.vocab[content]} in model.vocab")
        token = {"content": content, "id": i, "special": bool(entry.get("special", False)),
                 "normalized": bool(entry.get("normalized", True)), "lstrip": bool(entry.get("lstrip", False)),
                 "rstrip": bool(entry.get("rstrip", False)), "single_word": bool(entry.get("single_word", False))}
        tok.added[content] = token
        decoded_as = normalize(tok, content) if token["normalized"] else content  # as tokenizers decodes it
        tok.id_tokens[i] = (decoded_as, token["special"])


def read_normalizer(path, spec, field):
    """The list of Unicode normal forms the normalizer applies, in order."""
    if spec is None:
        return []
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in NORMALIZERS:
        return [kind]
    if kind == "Sequence":
        parts = expect(path, spec, "normalizers", list, field + ".normalizers")
        return [form for n, part in enumerate(parts)
                for form in read_normalizer(path, part, f"{field}.normalizers[{n}]")]
    raise field_error(path, field + ".type",
                      f"{kind!r} is not implemented (null, {', '.join(NORMALIZERS)} or a Sequence of them)")


def read_pre_tokenizer(path, spec):
    """The pre-tokenizer's steps: any Splits, then one ByteLevel."""
    if not isinstance(spec, dict):
        raise field_error(path, "pre_tokenizer", "missing: a byte-level BPE needs a ByteLevel pre-tokenizer")
    if spec.get("type") == "Sequence":
        parts = expect(path, spec, "pretokenizers", list, "pre_tokenizer.pretokenizers")
        fields = [f"pre_tokenizer.pretokenizers[{n}]" for n in range(len(parts))]
    else:
        parts, fields = [spec], ["pre_tokenizer"]
    steps = []
    for n, (part, field) in enumerate(zip(parts, fields)):
        kind = part.get("type") if isinstance(part, dict) else None
        last = n == len(parts) - 1
        if kind == "Split" and not last:
            steps.append(read_split(path, part, field))
        elif kind == "ByteLevel" and last:
            steps.append(("bytes", bool(part.get("add_prefix_space", True)), bool(part.get("use_regex", True))))
        else:
            raise field_error(path, field + ".type", f"{kind!r} is not implemented here (only Split steps followed by "
                              "one ByteLevel: the pre-tokenizers of byte-level BPE)")
    return steps


def read_split(path, part, field):
    pattern = expect(path, part, "pattern", dict, field + ".pattern")
    if "Regex" in pattern:
        source = expect(path, pattern, "Regex", str, field + ".pattern.Regex")
    else:
        source = regex.escape(expect(path, pattern, "String", str, field + ".pattern.String"))
    try:
        compiled = regex.compile(source)
    except regex.error as e:
        raise field_error(path, field + ".pattern", f"not a regular expression this module reads ({e})") from None
    behavior = part.get("behavior")
    if behavior not in SPLIT_BEHAVIORS:
        raise field_error(path, field + ".behavior",
                          f"{behavior!r} is not implemented (only {' or '.join(SPLIT_BEHAVIORS)})")
    if part.get("invert"):
        raise field_error(path, field + ".invert", "true is not implemented (only false)")
    return ("split", compiled, behavior == "Removed")


def read_decoder(path, spec):
    if spec is None:
        return False
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind != "ByteLevel":
        raise field_error(path, "decoder.type", f"{kind!r} is not implemented (only ByteLevel or null)")
    return True


def normalize(tok, text):
    for form in tok.normalizers:
        text = unicodedata.normalize(form, text)
    return text


def added_matcher(tok, normalized):
    """One regex finding the added tokens with this `normalized` flag, leftmost then longest (at one
    position the longer token is tried first); the normalized ones as the normalizer writes them."""
    contents = {}
    for token in tok.added.values():
        if token["normalized"] == normalized:
            contents[normalize(tok, token["content"]) if normalized else token["content"]] = token
    if not contents:
        return None
    ordered = sorted(contents, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(c) for c in ordered)), contents


WORD_CHAR, SPACE_CHAR = regex.compile(r"\w"), regex.compile(r"\s")


def split_added(tok, text, matcher):
    """text cut into (piece, added token id or None), as tokenizers' AddedVocabulary cuts it: a
    single_word token only where no word character touches it, lstrip / rstrip taking the white
    space on their side into the token."""
    if matcher is None:
        return [(text, None)] if text else []
    pattern, tokens = matcher
    pieces, done = [], 0
    for m in pattern.finditer(text):
        token = tokens[m.group()]
        start, stop = m.span()
        if token["single_word"] and ((start > 0 and WORD_CHAR.match(text, start - 1)) or WORD_CHAR.match(text, stop)):
            continue
        while token["lstrip"] and start > done and SPACE_CHAR.match(text, start - 1):
            start -= 1
        while token["rstrip"] and stop < len(text) and SPACE_CHAR.match(text, stop):
            stop += 1
        if done < start:
            pieces.append((text[done:start], None))
        pieces.append((text[start:stop], token["id"]))
        done = stop
    if done < len(text):
        pieces.append((text[done:], None))
    return pieces


def split_words(step, piece):
    """The words one pre-tokenizer step cuts piece into."""
    kind, a, b = step
    if kind == "split":
        compiled, remove = a, b
        if not remove and not compiled.groups:
            words = compiled.findall(piece)
            if sum(map(len, words)) == len(piece):  # the matches cover the piece, as the usual patterns do
                return words
        words, done = [], 0
        for m in compiled.finditer(piece):
            words.append(piece[done:m.start()])
            if not remove:
                words.append(m.group())
            done = m.end()
        words.append(piece[done:])
        return words
    add_prefix_space, use_regex = a, b
    if add_prefix_space and not piece.startswith(" "):
        piece = " " + piece
    words = GPT2_REGEX.findall(piece) if use_regex else [piece]  # GPT-2's regex matches every character
    return [byte_word(w) for w in words]


def byte_word(word):
    """word's UTF-8 bytes as byte characters."""
    return (word if word.isascii() else word.encode("utf-8").decode("latin-1")).translate(BYTE_WORD)


GPT2_REGEX = regex.compile(GPT2_PATTERN)


def pre_tokenize(tok, piece):
    words = [piece]
    for step in tok.pre_steps:
        words = [w for word in words for w in split_words(step, word) if w]
    return words


def word_symbols(tok, word):
    """The ids of the word's characters before any merge; unknown ones become unk_token (fused
    when fuse_unk) or stop the encoding."""
    ids = []
    for c in word:
        i = tok.vocab.get(c)
        if i is None:
            if tok.unk_id is None:
                raise TokenizerError(f"{tok.path}: model.vocab has no token for the byte 0x{CHAR_BYTES.get(c, 0):02X} "
                                     f"({c!r}) and model.unk_token is null: this text cannot be encoded")
            if tok.fuse_unk and ids and ids[-1] == tok.unk_id:
                continue
            i = tok.unk_id
        ids.append(i)
    return ids


def merge(tok, ids):
    """BPE's merges on a list of ids, in tokenizers' order: the pair of lowest rank first, the
    leftmost of equal ranks first. A heap of candidate merges by (rank, position); an entry whose
    pair has changed since it was pushed is skipped when it comes up."""
    n = len(ids)
    symbol = list(ids)                 # the id starting at each position; None once merged into its left
    right = list(range(1, n)) + [-1]   # next live position
    left = list(range(-1, n - 1))      # previous live position
    heap = []
    for pos in range(n - 1):
        found = tok.merges.get((ids[pos], ids[pos + 1]))
        if found:
            heap.append((found[0], pos, found[1]))
    heapq.heapify(heap)
    while heap:
        _, pos, new = heapq.heappop(heap)
        nxt = right[pos] if symbol[pos] is not None else -1
        if nxt < 0 or tok.merges.get((symbol[pos], symbol[nxt]), (0, None))[1] != new:
            continue
        symbol[pos], symbol[nxt] = new, None
        right[pos] = right[nxt]
        if right[pos] >= 0:
            left[right[pos]] = pos
        for a in (left[pos], pos):
            b = right[a] if a >= 0 else -1
            found = tok.merges.get((symbol[a], symbol[b])) if b >= 0 else None
            if found:
                heapq.heappush(heap, (found[0], a, found[1]))
    return [s for s in symbol if s is not None]


def encode_word(tok, word):
    ids = tok.cache.get(word)
    if ids is None:
        whole = tok.vocab.get(word) if tok.ignore_merges else None
        ids = [whole] if whole is not None else merge(tok, word_symbols(tok, word))
        if len(tok.cache) >= CACHE_WORDS:  # full: start afresh, with the words of the text now coming
            tok.cache.clear()
        if len(word) < 256:
            tok.cache[word] = ids
    return ids


def encode(tok, text):
    """The ids of text, as tokenizers' Tokenizer.encode(text, add_special_tokens=False) gives them."""
    ids = []
    for raw, added_id in split_added(tok, text, tok.raw_matcher):
        if added_id is not None:
            ids.append(added_id)
            continue
        for piece, added_id in split_added(tok, normalize(tok, raw), tok.normalized_matcher):
            if added_id is not None:
                ids.append(added_id)
                continue
            for word in pre_tokenize(tok, piece):
                ids.extend(encode_word(tok, word))
    return ids


def token_id(tok, token):
    """The id of a token given by its text (an added token, or one of the model's vocabulary), or None."""
    if token in tok.added:
        return tok.added[token]["id"]
    return tok.vocab.get(token)


def decode(tok, ids, skip_special=False):
    """The text of ids, as tokenizers' decode gives it: each token's characters back to their bytes
    (a token with a character outside the byte map, such as an added token with a space, as its own
    UTF-8), the bytes read as UTF-8 with U+FFFD for what is not. Ids outside the vocabulary are left
    out, as tokenizers leaves them out; special tokens too with skip_special."""
    if not tok.decodes:
        raise field_error(tok.path, "decoder", "null: this tokenizer does not say how to decode (ByteLevel needed)")
    out = bytearray()
    for i in ids:
        token, special = tok.id_tokens.get(i, (None, False))
        if token is None or (special and skip_special):
            continue
        if all(c in CHAR_BYTES for c in token):
            out.extend(CHAR_BYTES[c] for c in token)
        else:
            out.extend(token.encode("utf-8"))
    return out.decode("utf-8", errors="replace")
