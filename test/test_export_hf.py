"""scripts/export_hf.py: the export of a checkpoint is a Qwen3 or Llama model with the checkpoint's logits.

The safetensors file is read back by a reader written here from the format's specification and run
by Qwen3 and Llama as transformers defines them, implemented here from config.json and the Hugging
Face names alone; where transformers is installed, by its own Qwen3ForCausalLM and LlamaForCausalLM
too. The checkpoints are those of test/reference.py (the pretrained models' shapes among them:
head_dim 128, an attention wider than d_model, untied embeddings, Llama 3 RoPE scaling): the test
build's build/ref/, or made here.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlog import commands, export_hf, model_torch
from reference import read_tensorfile
from test_hf_import import float32_argument, rope_inv_freq
from tolerance import assert_close, assert_within

ROOT = Path(__file__).resolve().parent.parent


# Two float32 implementations of the same model (model_torch.py, and Qwen3 as transformers writes
# it, its RoPE angles formed in float32 where model_torch forms them in float64), from the same
# float32 weights. Logits up to 17 come through three layers of float32 sums (sqrt(K) u32 = 1e-6
# relative each) and through RoPE angles of up to 63 radians rounded to float32 (4e-6 rad), which
# move the scores (up to ~10) by 4e-5 at most: within 1e-4 absolute (9e-6 measured). A misplaced
# weight (a transposed matrix, the halves of RoPE swapped) moves the logits by far more.
LOGITS_ATOL = 1e-4

EXPORT = ROOT / "scripts" / "export_hf.py"
TOKENIZER = ROOT / "data" / "brown" / "tokenizer.model"
# Our name of each Qwen3 per-layer module's weight (docs/model.md; transformers' Qwen3DecoderLayer).
OURS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv",
        "self_attn.q_norm": "q_gain", "self_attn.k_norm": "k_gain", "self_attn.o_proj": "wo",
        "post_attention_layernorm": "mlp_norm", "mlp.gate_proj": "w1", "mlp.up_proj": "w3", "mlp.down_proj": "w2"}


def run_export(*args):
    return subprocess.run([sys.executable, str(EXPORT), *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def assert_one_line_error(result, *parts):
    assert result.returncode == commands.USER_ERROR, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(part in lines[0] for part in parts), (parts, lines[0])


def our_names(c):
    """{Hugging Face name: our name} of every tensor of the export: lm_head only when untied (else it
    is the embedding), the q and k norms only for Qwen3 (Llama has none)."""
    names = {"model.embed_tokens.weight": "wte", "model.norm.weight": "final_norm"}
    names.update({f"model.layers.{i}.{module}.weight": f"layers.{i}.{ours}" for i in range(c.n_layer)
                  for module, ours in OURS.items() if c.qk_norm != "none" or not module.endswith("_norm")})
    if not c.tied_embeddings:
        names["lm_head.weight"] = "lm_head"
    return names


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """The folder of the reference checkpoints."""
    built = ROOT / "build" / "ref"
    if all((built / f"{name}.ckpt").exists() for name in ("trained", "plain", "none", "qwen3", "llama3")):
        return built
    out = tmp_path_factory.mktemp("ref")
    made = subprocess.run([sys.executable, str(ROOT / "test" / "reference.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")))
    assert made.returncode == 0, made.stdout + made.stderr
    return out


@pytest.fixture(scope="module")
def trained(ref):
    """Config, params, a batch of random tokens as long as the model takes and their logits."""
    c, params, _ = model_torch.read_checkpoint(ref / "trained.ckpt")
    tokens = torch.randint(0, c.vocab_size, (2, c.max_seq_len), generator=torch.Generator().manual_seed(7))
    logits, _ = model_torch.forward(params, c, tokens)
    return c, params, tokens, logits


@pytest.fixture(scope="module")
def exported(ref, tmp_path_factory):
    """{dtype: (folder, stdout)}: the float32 export finds the tokenizer beside the checkpoint, the
    bfloat16 one is given it."""
    base = tmp_path_factory.mktemp("export")
    (base / "run").mkdir()
    shutil.copy(ref / "trained.ckpt", base / "run" / "model.ckpt")
    if TOKENIZER.exists():
        shutil.copy(TOKENIZER, base / "run" / "tokenizer.model")
    results = {"float32": run_export(base / "run" / "model.ckpt", base / "float32"),
               "bfloat16": run_export(ref / "trained.ckpt", base / "bfloat16", "--dtype", "bfloat16",
                                      *(["--tokenizer", TOKENIZER] if TOKENIZER.exists() else []))}
    assert all(r.returncode == 0 for r in results.values()), [r.stderr for r in results.values()]
    return {dtype: (base / dtype, result.stdout) for dtype, result in results.items()}


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file: a u64 header length N, N bytes of JSON,
    then the data, which the header's [begin, end) offsets must cover exactly, without gaps."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    assert 8 + n <= len(raw) and (8 + n) % 8 == 0, "the data must start 8-byte aligned"
    header = json.loads(raw[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    data, end, tensors = raw[8 + n:], 0, {}
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        begin, stop = entry["data_offsets"]
        width = {"F32": 4, "BF16": 2}[entry["dtype"]]
        assert begin == end and stop - begin == width * math.prod(entry["shape"]), name
        tensors[name] = (entry["dtype"], entry["shape"], data[begin:stop])
        end = stop
    assert end == len(data), "bytes after the last tensor"
    return tensors


def read_export(folder):
    """config.json and the weights as float32 tensors (a bfloat16 is the upper half of a float32)."""
    weights = {}
    for name, (dtype, shape, raw) in read_safetensors(folder / "model.safetensors").items():
        values = np.frombuffer(raw, "<f4") if dtype == "F32" else np.frombuffer(raw, "<u2").astype("<u4") << 16
        weights[name] = torch.from_numpy(values.view("<f4").astype(np.float32).reshape(shape))
    return json.loads((folder / "config.json").read_text()), weights


def bfloat16_value(bits):
    """The float64 value of bfloat16 bit patterns, with 2^128 in place of infinity."""
    value = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.nan_to_num(value, posinf=2.0**128, neginf=-(2.0**128))


def nearest_even_bfloat16(values):
    """bfloat16 bits of float32 values by comparing, in float64, the distances to the neighbours below
    and above in magnitude; a tie goes to the even one. The neighbour above the largest finite
    bfloat16 is 2^128, which rounds to infinity."""
    x = np.asarray(values, np.float32)
    below = x.view(np.uint32).astype(np.int64) >> 16
    above = below + 1
    lower, upper = np.abs(x - bfloat16_value(below)), np.abs(bfloat16_value(above) - x)
    return np.where((lower < upper) | ((lower == upper) & (below % 2 == 0)), below, above).astype(np.uint16)


def test_safetensors_holds_every_tensor_exactly(exported, trained, tmp_path):
    c, params, _, _ = trained
    names = our_names(c)
    for dtype, code in (("float32", "F32"), ("bfloat16", "BF16")):
        tensors = read_safetensors(exported[dtype][0] / "model.safetensors")
        assert set(tensors) == set(names)
        for name, (stored, shape, raw) in tensors.items():
            ours = params[names[name]].numpy()
            assert stored == code and shape == list(ours.shape), name
            want = ours.astype("<f4") if dtype == "float32" else nearest_even_bfloat16(ours).astype("<u2")
            assert raw == want.tobytes(), name

    # Hand-rounded cases: 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7, 1 + 2^-7 + 2^-8
    # halfway between 1 + 2^-7 (odd) and 1 + 2^-6; the largest float32 is past the largest bfloat16.
    cases = {1.0: 0x3F80, 1 + 2**-8: 0x3F80, 1 + 2**-8 + 2**-9: 0x3F81, 1 + 2**-7 + 2**-8: 0x3F82,
             -(1 + 2**-8): 0xBF80, float(np.nextafter(np.float32(1 + 2**-8), np.float32(2))): 0x3F81,
             -0.0: 0x8000, 2.0**-149: 0x0000, float(np.finfo(np.float32).max): 0x7F80}
    values = np.array(list(cases), np.float32)
    assert list(nearest_even_bfloat16(values)) == list(cases.values())
    export_hf.write_safetensors(str(tmp_path / "cases.safetensors"), {"cases": torch.from_numpy(values)}, "bfloat16")
    _, _, raw = read_safetensors(tmp_path / "cases.safetensors")["cases"]
    assert list(np.frombuffer(raw, "<u2")) == list(cases.values())


def rms_norm(x, weight, eps):
    """Qwen3RMSNorm: normalised in float32, the weight applied in the input's type."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    """[B, Hkv, T, D] -> [B, Hkv * n_rep, T, D]: kv head j serves query heads j * n_rep ... j * n_rep + n_rep - 1."""
    B, Hkv, T, D = x.shape
    return x[:, :, None].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


def hf_logits(config, weights, tokens):
    """Qwen3ForCausalLM's or LlamaForCausalLM's logits (eager attention, no cache) from config.json
    and the named weights: the two differ only by Qwen3's RMSNorm of each query and key head."""
    B, T = tokens.shape
    H, Hkv, D, eps = (config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"))
    assert not config["attention_bias"] and config["hidden_act"] == "silu" and not config.get("use_sliding_window")
    qk_norm = config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["architectures"] in (["Qwen3ForCausalLM"], ["LlamaForCausalLM"])
    linear = torch.nn.functional.linear
    # The rotary embedding: the inverse frequencies (Llama 3's scaled, if so) rounded to float32 as
    # transformers keeps them, angles in float32, each frequency used twice.
    inv_freq = torch.from_numpy(rope_inv_freq(config)).float()
    angles = torch.arange(T).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    causal = torch.full((T, T), float("-inf")).triu(1)
    x = weights["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        w = lambda module: weights[f"model.layers.{i}.{module}.weight"]  # noqa: E731
        h = rms_norm(x, w("input_layernorm"), eps)
        q = linear(h, w("self_attn.q_proj")).view(B, T, H, D)
        k = linear(h, w("self_attn.k_proj")).view(B, T, Hkv, D)
        if qk_norm:
            q, k = rms_norm(q, w("self_attn.q_norm"), eps), rms_norm(k, w("self_attn.k_norm"), eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = linear(h, w("self_attn.v_proj")).view(B, T, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
        attn = torch.softmax(q @ k.transpose(2, 3) * D**-0.5 + causal, dim=-1, dtype=torch.float32)
        x = x + linear((attn @ v).transpose(1, 2).reshape(B, T, H * D), w("self_attn.o_proj"))
        h = rms_norm(x, w("post_attention_layernorm"), eps)
        x = x + linear(torch.nn.functional.silu(linear(h, w("mlp.gate_proj"))) * linear(h, w("mlp.up_proj")),
                       w("mlp.down_proj"))
    head = weights["model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"]
    return linear(rms_norm(x, weights["model.norm.weight"], eps), head)


def test_qwen3_of_the_export_gives_the_checkpoints_logits(exported, trained):
    _, _, tokens, logits = trained
    config, weights = read_export(exported["float32"][0])
    assert_close(hf_logits(config, weights, tokens).numpy(), logits.numpy(), atol=LOGITS_ATOL)


def transformers_model(folder, architecture):
    """transformers' own model loaded from the export, in float32 and eval mode; skips where
    transformers is not installed."""
    try:
        import transformers
    except ImportError:
        pytest.skip("transformers is not installed: AutoModelForCausalLM did not load the export "
                    "(the Qwen3 and Llama written here stood in for it)")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                                    **float32_argument(transformers, torch))
    assert type(model).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def transformers_logits(folder, tokens, architecture):
    """The logits of transformers' own model loaded from the export; skips where it is not installed."""
    with torch.no_grad():
        return transformers_model(folder, architecture)(tokens).logits


def test_transformers_loads_the_export(exported, trained):
    _, _, tokens, logits = trained
    theirs = transformers_logits(exported["float32"][0], tokens, "Qwen3ForCausalLM")
    assert_close(theirs.numpy(), logits.numpy(), atol=LOGITS_ATOL)


PRETRAINED_SHAPES = [("qwen3", "Qwen3ForCausalLM"), ("llama3", "LlamaForCausalLM"), ("none", "LlamaForCausalLM"),
                     ("plain", "Qwen3ForCausalLM")]


def export_and_run(ref, tmp_path, name):
    """Exports the reference checkpoint `name`: (config, weights, tokens, the checkpoint's logits)."""
    c, params, _ = model_torch.read_checkpoint(ref / f"{name}.ckpt")
    result = run_export(ref / f"{name}.ckpt", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    config, weights = read_export(tmp_path / "out")
    tokens = torch.randint(0, c.vocab_size, (2, c.max_seq_len), generator=torch.Generator().manual_seed(5))
    want, _ = model_torch.forward(params, c, tokens)
    return c, config, weights, result.stdout, tokens, want


@pytest.mark.parametrize("name, architecture", PRETRAINED_SHAPES)
def test_pretrained_shapes_export_with_their_logits(ref, tmp_path, name, architecture):
    """A Qwen3 with untied embeddings and an attention wider than d_model, a Llama with Llama 3 RoPE
    scaling and one without: each exports as its architecture, with lm_head and rope_scaling where
    it has them, and gives the checkpoint's logits."""
    c, config, weights, stdout, tokens, want = export_and_run(ref, tmp_path, name)
    count = sum(t.numel() for t in weights.values())  # Llama's unused gains are not written
    assert stdout.splitlines()[-1].endswith(f"{architecture}, float32, {count:,} parameters")
    assert config["architectures"] == [architecture] and set(weights) == set(our_names(c))
    assert (config["hidden_size"], config["head_dim"], config["tie_word_embeddings"]) == (c.d_model, c.head_dim,
                                                                                          c.tied_embeddings)
    scaling = config["rope_scaling"]
    assert (scaling is None) == (c.rope_factor == 0)
    if scaling:
        assert scaling == {"rope_type": "llama3", "factor": c.rope_factor, "low_freq_factor": c.rope_low_freq_factor,
                           "high_freq_factor": c.rope_high_freq_factor,
                           "original_max_position_embeddings": c.rope_original_max_pos}
        assert config["rope_parameters"] == dict(scaling, rope_theta=config["rope_theta"])
    assert_close(hf_logits(config, weights, tokens).numpy(), want.numpy(), atol=LOGITS_ATOL)


@pytest.mark.parametrize("name, architecture", PRETRAINED_SHAPES)
def test_transformers_loads_the_pretrained_shapes(ref, tmp_path, name, architecture):
    _, _, _, _, tokens, want = export_and_run(ref, tmp_path, name)
    theirs = transformers_logits(tmp_path / "out", tokens, architecture)
    assert_close(theirs.numpy(), want.numpy(), atol=LOGITS_ATOL)


def greedy(next_logits, prompt, steps):
    """prompt [1, T] continued by `steps` tokens, each the argmax of next_logits(tokens) [1, T, V]; and
    the smallest lead of the chosen logit over the runner-up."""
    tokens, lead = prompt, math.inf
    for _ in range(steps):
        last = next_logits(tokens)[0, -1]
        top = torch.topk(last, 2).values
        lead = min(lead, float(top[0] - top[1]))
        tokens = torch.cat([tokens, last.argmax().view(1, 1)], dim=1)
    return tokens[0, prompt.shape[1]:].tolist(), lead


@pytest.mark.parametrize("name", ["trained", "plain", "qwen3"])
def test_transformers_continues_as_the_checkpoint(ref, tmp_path, name):
    """The export's greedy continuation is the checkpoint's: from the Qwen3 written here, and where
    transformers is installed from its own generation (gain: the trained state; plain; the untied
    Qwen3 shape, whose continuation is not one token repeated as the tied models' are)."""
    c, params, _ = model_torch.read_checkpoint(ref / f"{name}.ckpt")
    result = run_export(ref / f"{name}.ckpt", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    batch = read_tensorfile(ref / "debug_state.bin")["tokens"]  # a pattern with noise, which the trained state learnt
    prompt = torch.from_numpy(batch[:1, :16].astype(np.int64))
    steps = c.max_seq_len - prompt.shape[1]
    with torch.no_grad():
        ours, lead = greedy(lambda tokens: model_torch.forward(params, c, tokens)[0], prompt, steps)
        config, weights = read_export(tmp_path / "out")
        assert greedy(lambda tokens: hf_logits(config, weights, tokens), prompt, steps)[0] == ours
    assert lead > 100 * LOGITS_ATOL  # every choice clear by far more than the logits may differ
    model = transformers_model(tmp_path / "out", "Qwen3ForCausalLM")
    with torch.no_grad():
        theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps,
                                min_new_tokens=steps, do_sample=False, pad_token_id=0)
    assert theirs[0, prompt.shape[1]:].tolist() == ours


def test_config_is_the_checkpoints(exported, trained):
    c, _, _, _ = trained
    for dtype, (folder, stdout) in exported.items():
        config = json.loads((folder / "config.json").read_text())
        expected = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": c.vocab_size,
                    "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layer,
                    "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head, "head_dim": c.head_dim,
                    "hidden_act": "silu", "max_position_embeddings": c.max_seq_len, "rope_scaling": None,
                    "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
                    "use_sliding_window": False, "layer_types": ["full_attention"] * c.n_layer, "torch_dtype": dtype}
        assert {key: config[key] for key in expected} == expected
        assert np.float32(config["rms_norm_eps"]) == np.float32(c.norm_eps)
        assert np.float32(config["rope_theta"]) == np.float32(c.rope_theta)
        text = (folder / "config.json").read_text()
        assert '"rms_norm_eps": 1e-05' in text and '"rope_theta": 10000.0' in text  # the shortest decimals
        # The summary line, last; the embedding counts once, being the output layer too.
        assert f"{dtype}, {model_torch.num_params(c):,} parameters" in stdout.splitlines()[-1]
    # Other float32 values of the checkpoint's fields, written as their shortest decimals.
    for eps, theta in ((1e-6, 500000.0), (3e-7, 1000000.0), (2e-5, 12345.678)):
        other = model_torch.Config(c.vocab_size, c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.d_ff, c.max_seq_len,
                                   float(np.float32(theta)), float(np.float32(eps)))
        config = export_hf.hf_config(other, "float32", with_tokenizer=False)
        assert (config["rms_norm_eps"], config["rope_theta"]) == (eps, theta)


def test_qk_norm_plain_exports_with_unit_norm_weights(ref, tmp_path):
    """A --qk-norm plain model is Qwen3 with q_norm and k_norm weights 1: written as 1 even where the
    checkpoint holds other values at the unused gains, the export gives the checkpoint's logits."""
    c, params, _ = model_torch.read_checkpoint(ref / "plain.ckpt")
    params = {name: t * 3 if name.endswith("_gain") else t for name, t in params.items()}
    model_torch.write_checkpoint(str(tmp_path / "plain.ckpt"), c, params)
    result = run_export(tmp_path / "plain.ckpt", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    config, weights = read_export(tmp_path / "out")
    assert all(torch.all(t == 1) for name, t in weights.items() if name.endswith(("q_norm.weight", "k_norm.weight")))
    tokens = torch.randint(0, c.vocab_size, (2, c.max_seq_len), generator=torch.Generator().manual_seed(3))
    want, _ = model_torch.forward(params, c, tokens)
    assert_close(hf_logits(config, weights, tokens).numpy(), want.numpy(), atol=LOGITS_ATOL)


def test_bad_checkpoint_or_outdir_leaves_nothing(ref, tmp_path):
    raw = bytearray((ref / "trained.ckpt").read_bytes())
    raw[256 + 1000] ^= 0x10  # one bit of a weight
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(raw)
    out = tmp_path / "out"
    out.mkdir()
    assert_one_line_error(run_export(damaged, out), str(damaged), "damaged")
    assert_one_line_error(run_export(tmp_path / "missing.ckpt", out), "missing.ckpt")
    assert list(out.iterdir()) == []
    assert_one_line_error(run_export(ref / "trained.ckpt", damaged / "out"), str(damaged / "out"))


def test_failed_write_leaves_no_partial_model(ref, tmp_path, monkeypatch):
    convert, calls = export_hf.bfloat16_bits, []

    def disk_full_at_the_fifth_tensor(values):
        calls.append(values.shape)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return convert(values)

    monkeypatch.setattr(export_hf, "bfloat16_bits", disk_full_at_the_fifth_tensor)
    with pytest.raises(OSError):
        export_hf.export(str(ref / "trained.ckpt"), str(tmp_path), "bfloat16")
    assert len(calls) == 5 and list(tmp_path.iterdir()) == []


def test_bfloat16_logits_are_close(exported, trained):
    _, _, tokens, logits = trained
    config, weights = read_export(exported["bfloat16"][0])
    rounded = hf_logits(config, weights, tokens)
    # bfloat16 keeps 8 significant bits: each weight moves by at most 2^-8 (0.39%) of itself, about
    # 0.16% RMS. On this checkpoint weights moved at random by a relative RMS e move the logits (up
    # to 17.2) by up to ~60 e (0.14 for e = 0.23%), so the rounding by ~0.1: 0.097 measured, 0.56% of
    # the largest logit. The bound is 1% of it, 1.8 times that; weights off by 1.6% RMS at random
    # move the logits by 1.3, eight times the bound, and misread bytes by far more. Rounding so
    # small keeps the top token too.
    assert_within((rounded - logits).abs().max().item(), 0.01 * logits.abs().max().item(), "bfloat16 logits")
    assert (rounded.argmax(-1) == logits.argmax(-1)).float().mean().item() > 0.95


def test_tokenizer_is_exported(exported):
    if not TOKENIZER.exists():
        pytest.skip(f"{TOKENIZER} is missing (./train prepares it): the tokenizer's export was not checked")
    for folder, _ in exported.values():
        assert (folder / "tokenizer.model").read_bytes() == TOKENIZER.read_bytes()
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        assert settings["tokenizer_class"] == "LlamaTokenizer"
        # prepare_data puts BOS before every document and nothing after it.
        assert settings["add_bos_token"] is True and settings["add_eos_token"] is False
    folder = exported["float32"][0]
    try:
        import sentencepiece
    except ImportError:
        pytest.skip("sentencepiece is not installed: the copied tokenizer's encoding was not checked")
    original = sentencepiece.SentencePieceProcessor(model_file=str(TOKENIZER))
    copied = sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    sentence = "The jury said it did find that many of Georgia's 1,200 registration laws are outmoded."
    assert copied.encode(sentence) == original.encode(sentence) and len(original.encode(sentence)) > 10
    config = json.loads((folder / "config.json").read_text())
    for piece, token_id in (("bos_token", config["bos_token_id"]), ("eos_token", config["eos_token_id"])):
        assert copied.id_to_piece(token_id) == settings[piece]
    assert copied.id_to_piece(copied.unk_id()) == settings["unk_token"]


def test_forward_emulates_the_gpus_bf16_storage(ref):
    """model_torch.forward's store, given a rounding to bf16, rounds what the CUDA backend stores in
    bf16 (the rotated queries and keys, the logits) and not the keys after their norm, which the GPU
    keeps in float32 for the statistics; test/reference.py writes the statistics of that emulation."""
    from reference import round_bf16
    c, params, _ = model_torch.read_checkpoint(ref / "trained.ckpt")
    tokens = torch.from_numpy(read_tensorfile(ref / "debug_state.bin")["tokens"].astype(np.int64))
    p = {n: round_bf16(t.double()) for n, t in params.items()}
    taps = {}
    logits, _ = model_torch.forward(p, c, tokens, taps=taps, store=round_bf16)
    exact, _ = model_torch.forward({n: t.double() for n, t in params.items()}, c, tokens)
    assert torch.equal(logits, round_bf16(logits)) and torch.equal(taps[0]["kr"], round_bf16(taps[0]["kr"]))
    assert not torch.equal(taps[0]["k"], round_bf16(taps[0]["k"]))
    assert 0 < (logits - exact).abs().max() < 0.05 * exact.abs().max()  # bf16's rounding, not another model
    debug = read_tensorfile(ref / "debug_trained.bin")
    assert all(f"bf16.stat.{name}" in debug for name in ("k_erank", "k_norm", "attn_entropy"))
    assert not np.array_equal(debug["bf16.stat.k_erank"], debug["stat.k_erank"])
