"""./train -e DIR: a Hugging Face checkpoint directory (Qwen3ForCausalLM, LlamaForCausalLM) as the model.

A tiny Qwen3 (untied embeddings, an attention 512 wide over a residual stream of 96) and a tiny
Llama (tied, Llama 3 RoPE scaling, sharded), both with 2 layers, head_dim 128 and grouped-query
attention, are written here in the Hugging Face layout with random weights: config.json, and
safetensors files written by hand with numpy. build/hf_logits loads them as ./train -e does
(llmc/hf_checkpoint.h) and returns the CPU backend's logits, which must equal those of a float64
implementation of the two architectures written here from transformers' definitions; where
transformers is installed, those of its own models too. ./train -e DIR trains from them; the
round trips through scripts/export_hf.py keep every bit; every kind of damage is one line.
"""
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import attnlog
from attnlog import export_hf, model_torch
from test_train_cli import TRAIN, assert_one_line_error, run
from tolerance import assert_close

ROOT = Path(__file__).resolve().parent.parent
HF_LOGITS = Path(os.environ.get("HF_LOGITS_BIN", ROOT / "build" / "hf_logits"))
EXPORT = ROOT / "scripts" / "export_hf.py"

# The CPU backend runs in float32 from the same weights the float64 implementation reads. Logits of
# magnitude up to ~5 come through two layers of float32 sums of at most 512 terms (sqrt(K) u = 1e-6
# relative each) and RoPE angles of up to 23 radians rounded to float32 (1e-6 rad): 1e-6 off RMS,
# the largest of the 15,360 logits of a model 5.3e-6 off (measured; at position 0, where RoPE does
# nothing, already 2.3e-6). 1e-5 is the bound asked of the import; a weight in the wrong place, the
# halves of RoPE taken as interleaved pairs or the Llama 3 scaling left out move the logits by far
# more (checked below).
LOGITS_ATOL = 1e-5
# transformers computes in float32 too, its RoPE angles in float32 (up to 2e-6 rad off): 1e-4.
TRANSFORMERS_ATOL = 1e-4

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 384, "hidden_size": 96,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
    "torch_dtype": "bfloat16",
}
# head_dim left out: hidden_size / num_attention_heads = 128, LlamaConfig's default.
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 320, "hidden_size": 256,
    "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "hidden_act": "silu", "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64},
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
    "torch_dtype": "float32",
}
B, T = 2, 24


# -- the Hugging Face layout, written by hand -------------------------------------------------------

def head_dim(config):
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def hf_shapes(config):
    """{name: shape} of every tensor of the checkpoint (head_dim filled in where config.json leaves it out)."""
    return export_hf.hf_shapes(dict(config, head_dim=head_dim(config)))


def random_weights(config, seed):
    """float32 weights that keep the activations and logits near unit scale: matrices, the
    embedding too, N(0, 1/fan_in) with fan_in the second dimension; norm weights 1 + N(0, 0.2^2)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in hf_shapes(config).items():
        w = 1 + 0.2 * rng.standard_normal(shape) if len(shape) == 1 else rng.standard_normal(shape) / np.sqrt(shape[1])
        weights[name] = w.astype(np.float32)
    return weights


def encode(values, dtype):
    """(little-endian bytes, the float64 values they hold) of float32 values stored as dtype."""
    values = np.asarray(values, np.float32)
    if dtype == "F32":
        stored = values.astype("<f4")
    elif dtype == "F16":
        stored = values.astype("<f2")
    else:
        stored = export_hf.bfloat16_bits(values)
        return stored.tobytes(), (stored.astype("<u4") << 16).view("<f4").astype(np.float64)
    return stored.tobytes(), stored.astype(np.float64)


def safetensors_bytes(header, data):
    """A safetensors file: u64 header length, the JSON header padded with spaces to 8 bytes, the data."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors(path, tensors):
    """{name: (dtype, shape, bytes)} into one file, in order."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    Path(path).write_bytes(safetensors_bytes(header, data))


def write_checkpoint_dir(folder, config, weights, dtype_of=lambda name: "F32", shards=1):
    """config.json and the weights (sharded into model-0000k-of-0000n.safetensors with an index when
    shards > 1); returns the float64 values the files hold, by name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    encoded = {name: (dtype_of(name), w.shape, *encode(w, dtype_of(name))) for name, w in weights.items()}
    names = list(encoded)
    if shards == 1:
        write_safetensors(folder / "model.safetensors", {n: encoded[n][:3] for n in names})
    else:
        weight_map = {}
        for k, part in enumerate(np.array_split(np.arange(len(names)), shards)):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(folder / file, {names[i]: encoded[names[i]][:3] for i in part})
            weight_map.update({names[i]: file for i in part})
        index = {"metadata": {"total_size": sum(len(e[2]) for e in encoded.values())}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return {name: e[3].reshape(e[1]) for name, e in encoded.items()}


# -- the two architectures, in float64, from transformers' definitions -------------------------------

def rope_inv_freq(config, scaled=True):
    """The inverse frequencies of RoPE: theta^(-2i/D), and with rope_scaling of type llama3 those of
    transformers' _compute_llama3_parameters: wavelengths above original/low_freq_factor divided by
    factor, below original/high_freq_factor kept, between them interpolated."""
    D = head_dim(config)
    inv = 1.0 / config["rope_theta"] ** (np.arange(0, D, 2) / D)
    s = config.get("rope_scaling")
    if not scaled or not s:
        return inv
    factor, low, high, old = (s[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"))
    wavelen = 2 * np.pi / inv
    scaled_inv = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled_inv / factor + smooth * scaled_inv
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return np.where(medium, smoothed, scaled_inv)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate(x, cos, sin, pairing):
    """RoPE on [..., T, D]: transformers' rotate_half turns (x[i], x[i + D/2]) together; "interleaved"
    turns (x[2i], x[2i + 1]), the other convention, for the checks that the test tells them apart."""
    half = x.shape[-1] // 2
    if pairing == "interleaved":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
        return out
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)


def reference_logits(config, weights, tokens, pairing="half", scaled=True):
    """Qwen3ForCausalLM's or LlamaForCausalLM's logits [B, T, V], eager attention, float64."""
    Bt, Tt = tokens.shape
    H, Hkv, D, eps = config["num_attention_heads"], config["num_key_value_heads"], head_dim(config), config["rms_norm_eps"]
    qk_norm = config["architectures"] == ["Qwen3ForCausalLM"]
    angles = np.arange(Tt)[:, None] * rope_inv_freq(config, scaled)[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    causal = np.triu(np.full((Tt, Tt), -np.inf), 1)
    x = weights["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        w = lambda module: weights[f"model.layers.{i}.{module}.weight"]  # noqa: E731
        h = rms_norm(x, w("input_layernorm"), eps)
        q = (h @ w("self_attn.q_proj").T).reshape(Bt, Tt, H, D).transpose(0, 2, 1, 3)
        k = (h @ w("self_attn.k_proj").T).reshape(Bt, Tt, Hkv, D).transpose(0, 2, 1, 3)
        v = (h @ w("self_attn.v_proj").T).reshape(Bt, Tt, Hkv, D).transpose(0, 2, 1, 3)
        if qk_norm:
            q, k = rms_norm(q, w("self_attn.q_norm"), eps), rms_norm(k, w("self_attn.k_norm"), eps)
        q, k = rotate(q, cos, sin, pairing), rotate(k, cos, sin, pairing)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)  # kv head j serves query heads j*g..
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D) + causal
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + (p @ v).transpose(0, 2, 1, 3).reshape(Bt, Tt, H * D) @ w("self_attn.o_proj").T
        h = rms_norm(x, w("post_attention_layernorm"), eps)
        gate, up = h @ w("mlp.gate_proj").T, h @ w("mlp.up_proj").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w("mlp.down_proj").T
    head = weights["model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"]
    return rms_norm(x, weights["model.norm.weight"], eps) @ head.T


# -- running the import -----------------------------------------------------------------------------

def cpp_logits(folder, tokens, ckpt=None):
    """The CPU backend's logits for the checkpoint directory (and its weights as a checkpoint of
    ./train into ckpt, when given)."""
    if not HF_LOGITS.exists():
        pytest.fail(f"{HF_LOGITS} is missing: run make build/hf_logits")
    folder = Path(folder)
    (folder.parent / "tokens.i32").write_bytes(tokens.astype("<i4").tobytes())
    r = run([HF_LOGITS, folder, *tokens.shape, folder.parent / "tokens.i32", folder.parent / "logits.f32",
             *([ckpt] if ckpt else [])])
    assert r.returncode == 0, r.stderr
    V = json.loads((folder / "config.json").read_text())["vocab_size"]
    return np.fromfile(folder.parent / "logits.f32", "<f4").reshape(*tokens.shape, V)


def tokens_for(config, seed=7):
    return np.random.default_rng(seed).integers(0, config["vocab_size"], (B, T))


MODELS = {
    # Qwen3 as published: bfloat16, one file.
    "qwen3": (QWEN3, lambda name: "BF16", 1),
    # Llama in two shards, the matrices in float16 and the norms in float32.
    "llama": (LLAMA, lambda name: "F32" if "norm" in name else "F16", 2),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, tmp_path_factory):
    """(name, config, folder, the float64 values its files hold)."""
    config, dtype_of, shards = MODELS[request.param]
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    values = write_checkpoint_dir(folder, config, random_weights(config, seed=len(request.param)), dtype_of, shards)
    return request.param, config, folder, values


# -- tests ------------------------------------------------------------------------------------------

def test_logits_equal_the_float64_implementation(model):
    name, config, folder, values = model
    tokens = tokens_for(config)
    want = reference_logits(config, values, tokens)
    assert 2 < np.abs(want).max() < 10  # logits of the scale of a model's
    assert_close(cpp_logits(folder, tokens), want, atol=LOGITS_ATOL)


def test_the_reference_tells_the_conventions_apart(model):
    """The comparison above would fail for an import that paired RoPE's dimensions the other way
    or left out the Llama 3 scaling: each moves the logits by far more than the tolerance."""
    name, config, folder, values = model
    tokens = tokens_for(config)
    want = reference_logits(config, values, tokens)
    assert np.abs(reference_logits(config, values, tokens, pairing="interleaved") - want).max() > 1000 * LOGITS_ATOL
    if config.get("rope_scaling"):
        assert np.abs(reference_logits(config, values, tokens, scaled=False) - want).max() > 1000 * LOGITS_ATOL


def write_shard(path, ids):
    """A token shard as llmc/dataloader.h reads it: 256 int32 (magic, version 1, count, zeros), uint16 ids."""
    header = np.zeros(256, "<i4")
    header[:3] = [20240520, 1, len(ids)]
    Path(path).write_bytes(header.tobytes() + np.asarray(ids, "<u2").tobytes())


def train_from(folder, out, shard, *extra):
    return run([TRAIN, "-e", folder, "-i", shard, "-b", B, "-t", T, "--shuffle", 0, "--threads", 2, "--device", "cpu",
                "-o", out, *extra])


def test_train_starts_from_the_checkpoint(model, tmp_path):
    """./train -e DIR takes the model from config.json and the weights from the files: the loss of
    its first step is that of the float64 implementation on the first batch, its log says where
    the weights came from, and its checkpoint holds config.json's configuration."""
    name, config, folder, values = model
    ids = np.random.default_rng(11).integers(0, config["vocab_size"], B * T * 3 + 1)
    write_shard(tmp_path / "train.bin", ids)
    r = train_from(folder, tmp_path / "run", tmp_path / "train.bin", "-x", 2, "-s", 1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"weights: {folder} ({config['architectures'][0]}" in r.stdout
    assert "peak memory:" in r.stdout and "estimated before allocating" in r.stdout
    log = attnlog.open_log(tmp_path / "run" / "run.attnlog")
    logits = reference_logits(config, values, ids[:B * T].reshape(B, T))
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    targets = ids[1:B * T + 1].reshape(B, T)
    want = -np.take_along_axis(logp, targets[..., None], -1).mean()
    _, loss = log.scalars("loss")
    assert_close(loss[0], want, rtol=1e-5)  # a float32 mean of float32 cross-entropies
    notes = [text for _, text in log.notes()]
    assert any(text.startswith(f"started from the Hugging Face checkpoint {folder} ({config['architectures'][0]}")
               for text in notes), notes
    c, params, _ = model_torch.read_checkpoint(tmp_path / "run" / "model.ckpt")
    assert (c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.d_model, c.d_ff, c.max_seq_len) == (
        config["vocab_size"], config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
        head_dim(config), config["hidden_size"], config["intermediate_size"], config["max_position_embeddings"])
    assert c.qk_norm == ("gain" if name == "qwen3" else "none")
    assert bool(c.tied_embeddings) == config["tie_word_embeddings"] and ("lm_head" in params) != c.tied_embeddings
    assert np.float32(c.rope_theta) == np.float32(config["rope_theta"])
    assert np.float32(c.norm_eps) == np.float32(config["rms_norm_eps"])
    scaling = config["rope_scaling"] or {}
    assert (c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_pos) == (
        scaling.get("factor", 0), scaling.get("low_freq_factor", 0), scaling.get("high_freq_factor", 0),
        scaling.get("original_max_position_embeddings", 0))


# -- bad input: one line naming the file and what is wrong ------------------------------------------

SMALL = dict(QWEN3, vocab_size=16, hidden_size=8, intermediate_size=12, num_attention_heads=2, num_key_value_heads=1,
             head_dim=4, max_position_embeddings=32)


def read_file(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def damage_file(folder, change):
    """Rewrites folder/model.safetensors with change(header, data) -> (header, data) or raw bytes."""
    path = folder / "model.safetensors"
    result = change(*read_file(path))
    path.write_bytes(result if isinstance(result, bytes) else safetensors_bytes(*result))


def offsets(header, name, begin, end):
    header[name]["data_offsets"] = [begin, end]
    return header


def with_entry(header, name, **entry):
    header[name] = dict(header[name], **entry)
    return header


def moved_last(header, by):
    """The header with its last tensor's data `by` bytes later, leaving a hole before it."""
    last = max((e for e in header.values() if "data_offsets" in e), key=lambda e: e["data_offsets"][0])
    last["data_offsets"] = [o + by for o in last["data_offsets"]]
    return header


def without(header, data, name):
    """The file without one tensor, the data after it moved up."""
    begin, end = header.pop(name)["data_offsets"]
    for entry in header.values():
        if "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    return header, data[:begin] + data[end:]


def with_tensor(header, data, name, values):
    header[name] = {"dtype": "F32", "shape": list(values.shape), "data_offsets": [len(data), len(data) + 4 * values.size]}
    return header, data + values.astype("<f4").tobytes()


def raw_header(text, data):
    text = text.encode()
    return struct.pack("<Q", len(text)) + text + data


NORM = "model.layers.0.input_layernorm.weight"  # [8] at bytes [512, 544) of the data
FILE_DAMAGE = {
    "shorter than 8 bytes": (lambda h, d: b"\x10\x00\x00", "truncated: 3 bytes"),
    "header past the end": (lambda h, d: struct.pack("<Q", 1 << 40) + b"{}", "header's length 1099511627776 runs past the end"),
    "header not JSON": (lambda h, d: raw_header('{"a": [1, 2', d), "the header is not a JSON object"),
    "data truncated": (lambda h, d: safetensors_bytes(h, d)[:-4], "run past the file's"),
    "offsets overlap": (lambda h, d: (offsets(h, NORM, 480, 512), d), "overlap"),
    "offsets reversed": (lambda h, d: (offsets(h, NORM, 544, 512), d), "end before they begin"),
    "offsets past the data": (lambda h, d: (offsets(h, NORM, 10**9, 10**9 + 32), d), "run past the file's"),
    "offsets and shape disagree": (lambda h, d: (with_entry(h, NORM, shape=[9]), d), "span 32 bytes; shape [9] of F32 is 36"),
    "shape beyond the file": (lambda h, d: (with_entry(h, NORM, shape=[2**40, 2**40]), d), "needs more bytes than the file"),
    "a size not a number": (lambda h, d: (with_entry(h, NORM, shape=[-8]), d), "holds -8, not a size"),
    "unknown dtype": (lambda h, d: (with_entry(h, NORM, dtype="I64", shape=[4]), d), 'dtype "I64"'),
    "bytes of no tensor": (lambda h, d: (h, d + bytes(16)), "the last 16 bytes of the file belong to no tensor"),
    "a hole": (lambda h, d: (moved_last(h, 8), d + bytes(8)), "belong to no tensor"),
    "a name twice": (lambda h, d: raw_header(json.dumps(h)[:-1] + ', "%s": %s}' % (NORM, json.dumps(
        dict(h[NORM], data_offsets=[len(d), len(d) + 32]))), d + bytes(32)), "is named twice"),
    "a NaN weight": (lambda h, d: (h, d[:516] + struct.pack("<f", float("nan")) + d[520:]), "holds nan at element 1"),
    "a transposed matrix": (lambda h, d: (with_entry(h, "model.layers.1.mlp.gate_proj.weight", shape=[8, 12]), d),
                            "has shape [8, 12]; config.json implies [12, 8]"),
    "an unknown tensor": (lambda h, d: with_tensor(h, d, "model.layers.0.self_attn.rotary_emb.inv_freq", np.ones(2)),
                          "unknown tensor model.layers.0.self_attn.rotary_emb.inv_freq"),
    "a missing tensor": (lambda h, d: without(h, d, "model.layers.1.mlp.up_proj.weight"),
                         "model.layers.1.mlp.up_proj.weight is missing"),
}


@pytest.fixture
def small(tmp_path):
    """A small Qwen3 checkpoint in float32, and a shard of tokens to train on."""
    write_checkpoint_dir(tmp_path / "hf", SMALL, random_weights(SMALL, seed=3))
    write_shard(tmp_path / "train.bin", np.arange(200) % SMALL["vocab_size"])
    return tmp_path / "hf", tmp_path / "train.bin"


def test_the_small_checkpoint_trains(small, tmp_path):
    folder, shard = small
    r = train_from(folder, tmp_path / "run", shard, "-x", 1, "-t", 8)
    assert r.returncode == 0, r.stdout + r.stderr


def test_measure_a_pretrained_model(small, tmp_path):
    """--measure of a Hugging Face directory: its header names the directory and no step, run or tokens
    (the directory records none); its first batch is step 0 of a run started from the same weights."""
    folder, shard = small
    measured = train_from(folder, tmp_path / "measure", shard, "--measure", 2, "-t", 8)
    trained = train_from(folder, tmp_path / "run", shard, "-x", 1, "-t", 8)
    assert measured.returncode == 0 and trained.returncode == 0, measured.stderr + trained.stderr
    log = attnlog.open_log(tmp_path / "measure" / "run.attnlog")
    run_log = attnlog.open_log(tmp_path / "run" / "run.attnlog")
    assert log.measurement == {"checkpoint": str(folder)} and log.notes() == []
    assert list(log.scalars("loss")[0]) == [0, 1] and log.scalars("loss")[1][0] == run_log.scalars("loss")[1][0]
    for name in run_log.metric_names():
        assert np.array_equal(log.metric(name)[1][0], run_log.metric(name)[1][0]), name


@pytest.mark.parametrize("damage", sorted(FILE_DAMAGE))
def test_damaged_safetensors(small, tmp_path, damage):
    folder, shard = small
    change, message = FILE_DAMAGE[damage]
    damage_file(folder, change)
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "-t", 8), str(folder / "model.safetensors"), message)
    assert not (tmp_path / "run").exists()


def config_with(**changes):
    return dict(SMALL, **changes)


CONFIG_DAMAGE = {
    "another architecture": (config_with(architectures=["MistralForCausalLM"]), "architectures [\"MistralForCausalLM\"]"),
    "two architectures": (config_with(architectures=["Qwen3ForCausalLM", "LlamaForCausalLM"]), "not a list of one name"),
    "attention biases": (config_with(attention_bias=True), "attention_bias true"),
    "MLP biases": (config_with(mlp_bias=True), "mlp_bias true"),
    "a sliding window": (config_with(use_sliding_window=True, sliding_window=16), "use_sliding_window true"),
    "sliding layers": (config_with(layer_types=["full_attention", "sliding_attention"]), "layer_types holds \"sliding_attention\""),
    "another RoPE scaling": (config_with(rope_scaling={"rope_type": "yarn", "factor": 4.0}), 'rope_scaling.rope_type "yarn"'),
    "llama3 scaling without its factor": (config_with(rope_scaling={"type": "llama3", "low_freq_factor": 1.0}),
                                          "rope_scaling.factor is missing"),
    "scaling factors out of order": (config_with(rope_scaling=dict(LLAMA["rope_scaling"], high_freq_factor=0.5)),
                                     "rope_scaling.low_freq_factor and rope_scaling.high_freq_factor must be"),
    "experts": (config_with(num_experts=8), "num_experts 8"),
    "another activation": (config_with(hidden_act="gelu"), 'hidden_act "gelu"'),
    "dropout": (config_with(attention_dropout=0.1), "attention_dropout"),
    "partial RoPE": (config_with(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "a size missing": ({k: v for k, v in SMALL.items() if k != "hidden_size"}, "hidden_size is missing"),
    "a size not whole": (config_with(intermediate_size=12.5), "intermediate_size 12.5 is not a whole number"),
    "heads not a multiple": (config_with(num_attention_heads=3, num_key_value_heads=2),
                             "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    "no epsilon": (config_with(rms_norm_eps=0), "rms_norm_eps must be a finite positive number"),
    "tie not a flag": (config_with(tie_word_embeddings="yes"), 'tie_word_embeddings "yes" is not true or false'),
    "not JSON": ("{'architectures': 1}", "not a JSON object"),
}


@pytest.mark.parametrize("damage", sorted(CONFIG_DAMAGE))
def test_config_it_does_not_implement(small, tmp_path, damage):
    folder, shard = small
    config, message = CONFIG_DAMAGE[damage]
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "-t", 8), str(folder / "config.json"), message)


def shard_into_two(folder):
    """The small checkpoint as two shards and an index; returns the index."""
    header, data = read_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    config = json.loads((folder / "config.json").read_text())
    values = {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], "<f4").reshape(e["shape"])
              for name, e in header.items() if name != "__metadata__"}
    write_checkpoint_dir(folder, config, values, shards=2)
    return json.loads((folder / "model.safetensors.index.json").read_text())


def test_sharded_checkpoint_loads_as_one_file(small, tmp_path):
    folder, shard = small
    tokens = tokens_for(SMALL)[:, :8]
    whole = cpp_logits(folder, tokens)
    shard_into_two(folder)
    assert np.array_equal(cpp_logits(folder, tokens), whole)


SECOND = "model-00002-of-00002.safetensors"
INDEX_DAMAGE = {
    "a shard missing": (lambda index, folder: (folder / SECOND).unlink(), SECOND, "cannot open"),
    "a file outside the folder": (lambda index, folder: index["weight_map"].update({NORM: "../model.safetensors"}),
                                  "model.safetensors.index.json", "not a file of this directory"),
    "a tensor in another shard": (lambda index, folder: index["weight_map"].update({NORM: SECOND}),
                                  "model-00001-of-00002.safetensors", f"holds tensor {NORM}, which"),
    "a tensor the index leaves out": (lambda index, folder: index["weight_map"].pop(NORM),
                                      "model-00001-of-00002.safetensors", "places nowhere"),
    "no weight_map": (lambda index, folder: index.pop("weight_map"), "model.safetensors.index.json", "weight_map"),
}


@pytest.mark.parametrize("damage", sorted(INDEX_DAMAGE))
def test_damaged_shards(small, tmp_path, damage):
    folder, shard = small
    index = shard_into_two(folder)
    change, file, message = INDEX_DAMAGE[damage]
    change(index, folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "-t", 8), file, message)


def test_a_tied_lm_head_must_be_the_embedding(tmp_path):
    """A tied model's file may hold lm_head.weight too: read when it is the embedding, refused when not."""
    config = dict(SMALL, tie_word_embeddings=True)
    weights = random_weights(config, seed=5)
    tokens = tokens_for(config)[:, :8]
    write_checkpoint_dir(tmp_path / "a", config, weights)
    write_checkpoint_dir(tmp_path / "b", config, dict(weights, **{"lm_head.weight": weights["model.embed_tokens.weight"]}))
    assert np.array_equal(cpp_logits(tmp_path / "b", tokens), cpp_logits(tmp_path / "a", tokens))
    other = weights["model.embed_tokens.weight"].copy()
    other[3, 5] += 1
    write_checkpoint_dir(tmp_path / "c", config, dict(weights, **{"lm_head.weight": other}))
    write_shard(tmp_path / "train.bin", np.arange(200) % config["vocab_size"])
    assert_one_line_error(train_from(tmp_path / "c", tmp_path / "run", tmp_path / "train.bin", "-t", 8),
                          str(tmp_path / "c" / "model.safetensors"), "lm_head.weight differs from model.embed_tokens.weight")


def test_options_that_conflict_with_the_checkpoint(small, tmp_path):
    folder, shard = small
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "--n-layer", 3), "--n-layer 3 does not match",
                          str(folder), "which has 2")
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "--qk-norm", "none"), "--qk-norm none does not match")
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "-m", "d6"), "leave the preset out")
    assert_one_line_error(train_from(folder, tmp_path / "run", shard, "-t", 64), "-t (--seq-len) 64 is above", "32")
    r = run([TRAIN, "-r", folder, "-i", shard, "--device", "cpu", "-o", tmp_path / "run"])
    assert_one_line_error(r, "-r (--resume)", str(folder), "is a directory")
    assert_one_line_error(train_from(folder / "model.safetensors", tmp_path / "run", shard), "-e (--init)",
                          str(folder / "model.safetensors"), "give the directory that holds it")
    (folder / "model.safetensors").unlink()
    assert_one_line_error(train_from(folder, tmp_path / "run", shard), str(folder),
                          "neither model.safetensors nor model.safetensors.index.json")
    (folder / "config.json").unlink()
    assert_one_line_error(train_from(folder, tmp_path / "run", shard), str(folder), "without config.json")
    assert not (tmp_path / "run").exists()


# -- round trips through scripts/export_hf.py: every bit kept ----------------------------------------

def export(ckpt, out, *extra):
    r = subprocess.run(["/usr/bin/python3", EXPORT, ckpt, out, *extra], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def import_to_checkpoint(folder, ckpt):
    """The weights ./train -e takes from folder, as a checkpoint of ./train."""
    config = json.loads((Path(folder) / "config.json").read_text())
    cpp_logits(folder, tokens_for(config)[:, :4], ckpt)
    return model_torch.read_checkpoint(ckpt)


def config_fields(c):
    return {k: v for k, v in vars(c).items()}


def assert_same_checkpoint(a, b):
    """Two checkpoints of the same configuration and the same parameters, bit for bit."""
    (ca, pa, _), (cb, pb, _) = model_torch.read_checkpoint(a), model_torch.read_checkpoint(b)
    assert config_fields(ca) == config_fields(cb)
    assert list(pa) == list(pb)
    for name in pa:
        assert pa[name].numpy().tobytes() == pb[name].numpy().tobytes(), name


def test_import_export_import_keeps_every_bit(model, tmp_path):
    """Imported, exported in float32 and imported again: the same checkpoint; the export holds the
    very values the original files hold; and the bfloat16 export of a bfloat16 model its very bytes."""
    name, config, folder, values = model
    c, params, _ = import_to_checkpoint(folder, tmp_path / "first.ckpt")
    export(tmp_path / "first.ckpt", tmp_path / "exported")
    import_to_checkpoint(tmp_path / "exported", tmp_path / "second.ckpt")
    assert_same_checkpoint(tmp_path / "first.ckpt", tmp_path / "second.ckpt")
    exported = stored_tensors(tmp_path / "exported" / "model.safetensors")
    assert set(exported) == set(values)
    for tensor, (dtype, shape, raw) in exported.items():
        assert dtype == "F32" and shape == list(values[tensor].shape), tensor
        assert np.array_equal(np.frombuffer(raw, "<f4").reshape(shape), values[tensor]), tensor
    exported_config = json.loads((tmp_path / "exported" / "config.json").read_text())
    for field in ("architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                  "tie_word_embeddings"):
        assert exported_config[field] == config[field], field
    assert exported_config["head_dim"] == head_dim(config)
    assert (exported_config["rope_scaling"] or {}) == ({"rope_type": "llama3", **config["rope_scaling"]}
                                                        if config["rope_scaling"] else {})
    if name == "qwen3":  # stored in bfloat16
        export(tmp_path / "first.ckpt", tmp_path / "bf16", "--dtype", "bfloat16")
        assert stored_tensors(tmp_path / "bf16" / "model.safetensors") == stored_tensors(folder / "model.safetensors")


def stored_tensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    header, data = read_file(path)
    return {name: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
            for name, e in header.items() if name != "__metadata__"}


REFERENCE = ROOT / "build" / "ref"


@pytest.mark.parametrize("name", ["trained", "qwen3", "llama3", "none"])
def test_export_import_keeps_every_bit(tmp_path, name):
    """A checkpoint of ./train (test/reference.py's: Qwen3 with tied and untied embeddings, Llama
    with and without Llama 3 RoPE scaling), exported in float32 and imported: the same checkpoint."""
    ckpt = REFERENCE / f"{name}.ckpt"
    if not ckpt.exists():
        pytest.fail(f"{ckpt} is missing: run make build/ref/debug_state.bin")
    export(ckpt, tmp_path / "hf")
    import_to_checkpoint(tmp_path / "hf", tmp_path / "imported.ckpt")
    c, params, _ = model_torch.read_checkpoint(ckpt)
    model_torch.write_checkpoint(str(tmp_path / "original.ckpt"), c, params)  # without the run's records
    assert_same_checkpoint(tmp_path / "original.ckpt", tmp_path / "imported.ckpt")


def float32_argument(transformers, torch):
    """The keyword that makes transformers build or load a model in float32: `dtype` from 4.56 on
    (version 5 loads a checkpoint's own dtype by default), `torch_dtype` before."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": torch.float32} if (major, minor) >= (4, 56) else {"torch_dtype": torch.float32}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_models_give_the_same_logits(tmp_path, name):
    """Where transformers is installed: the tiny model built by transformers itself from the same
    config (no download), given the random weights and saved with save_pretrained, imports with its
    logits."""
    try:
        import torch
        import transformers
    except ImportError:
        pytest.skip("transformers is not installed: its own Qwen3 and Llama were not compared "
                    "(the float64 implementation stood in for them)")
    config = MODELS[name][0]
    settings = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **settings)
    hf_config.architectures = config["architectures"]
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager",
                                                     **float32_argument(transformers, torch))
    assert type(model).__name__ == config["architectures"][0]
    weights = {k: torch.from_numpy(v) for k, v in random_weights(config, seed=1).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied: the embedding
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    tokens = tokens_for(config)
    with torch.no_grad():
        theirs = model.eval()(torch.from_numpy(tokens)).logits.numpy()
    assert_close(cpp_logits(tmp_path / "hf", tokens), theirs, atol=TRANSFORMERS_ATOL)


def test_a_model_too_large_for_the_memory_is_refused_before_loading(tmp_path):
    """The memory check before allocating names the directory the model comes from: 64M parameters
    (a 128 MB file of bfloat16 zeros) need 1 GB with their gradients and AdamW state, more than an
    address-space limit of 1 GB leaves."""
    import resource
    config = dict(SMALL, vocab_size=8 << 20, num_hidden_layers=1, tie_word_embeddings=True)
    header, offset = {}, 0
    for name, shape in hf_shapes(config).items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors").write_bytes(safetensors_bytes(header, bytes(offset)))
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    write_shard(tmp_path / "train.bin", np.arange(200))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = subprocess.run([str(a) for a in (TRAIN, "-e", tmp_path / "hf", "-i", tmp_path / "train.bin", "-t", 8, "--device",
                                         "cpu", "-o", tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                       preexec_fn=limit)
    assert_one_line_error(r, f"the model of {tmp_path / 'hf'}: the weights, gradients and AdamW state need 1.1 GB",
                          "the address-space limit (ulimit -v")
