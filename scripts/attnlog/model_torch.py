"""The model of docs/model.md in plain PyTorch, and the one loader of the trainer's checkpoints.

The same model ./train trains, written to be read: the attention matrix is materialised, every
intermediate is a named tensor. test/reference.py checks the C++ and CUDA backends against it; the
probes (probe.py) and the export (export_hf.py) run checkpoints through it. It runs on PyTorch
1.13 and later, on the CPU.

    c, params, info = read_checkpoint("runs/x/model.ckpt")   # Config, {name: float32 tensor}, header
    logits, loss = forward(params, c, tokens, targets)
"""
import math
import os
import struct
import zlib

import numpy as np
import torch

from attnlog.commands import UserError
from attnlog.layout import CONFIG_FIELDS, LAYER_TENSORS, MATRICES, PARAM_KINDS, QK_NORMS, frozen_kinds, frozen_mask

# ------------------------------------------------------------------------------------------------
# Configuration and parameter layout (llmc/config.h; the names: attnlog.layout)


class Config:
    """The model's configuration. qk_norm: RMSNorm of each query and key head with learnable gains
    (gain, the default), without gains (plain: held at 1, not trained), or no normalisation (none).
    d_model: the residual stream's width, n_head * head_dim unless given. tied_embeddings: wte is
    also the output projection; else lm_head is. rope_factor > 0: Llama 3's RoPE frequency scaling
    with the other rope_ fields (rope_inv_freq)."""

    def __init__(self, vocab_size, n_layer, n_head, n_kv_head, head_dim, d_ff, max_seq_len,
                 rope_theta=10000.0, norm_eps=1e-5, qk_norm="gain", d_model=None, tied_embeddings=True,
                 rope_factor=0.0, rope_low_freq_factor=0.0, rope_high_freq_factor=0.0, rope_original_max_pos=0):
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm {qk_norm!r} is not one of {QK_NORMS}")
        self.vocab_size, self.n_layer, self.n_head, self.n_kv_head = vocab_size, n_layer, n_head, n_kv_head
        self.head_dim, self.d_ff, self.max_seq_len = head_dim, d_ff, max_seq_len
        self.d_model = n_head * head_dim if d_model is None else d_model
        self.rope_theta, self.norm_eps, self.qk_norm = rope_theta, norm_eps, qk_norm
        self.tied_embeddings = bool(tied_embeddings)
        self.rope_factor, self.rope_low_freq_factor = rope_factor, rope_low_freq_factor
        self.rope_high_freq_factor, self.rope_original_max_pos = rope_high_freq_factor, rope_original_max_pos


def tensor_shapes(c):
    """(name, shape) of every parameter tensor in layout order."""
    D, C, F = c.head_dim, c.d_model, c.d_ff
    per_layer = {"attn_norm": (C,), "wq": (c.n_head * D, C), "wk": (c.n_kv_head * D, C),
                 "wv": (c.n_kv_head * D, C), "q_gain": (D,), "k_gain": (D,), "wo": (C, c.n_head * D),
                 "mlp_norm": (C,), "w1": (F, C), "w3": (F, C), "w2": (C, F)}
    out = [("wte", (c.vocab_size, C))]
    for l in range(c.n_layer):
        out += [(f"layers.{l}.{name}", per_layer[name]) for name in LAYER_TENSORS]
    out.append(("final_norm", (C,)))
    if not c.tied_embeddings:
        out.append(("lm_head", (c.vocab_size, C)))
    return out


def num_params(c):
    return sum(int(np.prod(s)) for _, s in tensor_shapes(c))


def make_optimizer(p, weight_decay, frozen, decayed=MATRICES):
    """The trainer's AdamW (model.md) over the parameters whose kind is not in `frozen` (names of
    parameter kinds): weight decay on the kinds in `decayed` (--decay: by default the matrices); the
    learning rate is set per step."""
    free = {n: t for n, t in p.items() if n.split(".")[-1] not in frozen}
    decay = [t for n, t in free.items() if n.split(".")[-1] in decayed]
    no_decay = [t for n, t in free.items() if n.split(".")[-1] not in decayed]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1.0, betas=(0.9, 0.95), eps=1e-8)
    return opt, list(free.values())


def init_params(c, seed):
    """Initialisation of model.md: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)), gains 1."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in tensor_shapes(c):
        short = name.split(".")[-1]
        if short.endswith("norm") or short.endswith("gain"):
            params[name] = torch.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * c.n_layer) if short in ("wo", "w2") else 0.02
            params[name] = torch.randn(shape, generator=g) * std
    return params


# ------------------------------------------------------------------------------------------------
# The model

def rmsnorm(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def qk_norm(x, gain, c):
    """The per-head norm of the queries or keys [B, T, heads, D] that --qk-norm chooses."""
    if c.qk_norm == "none":
        return x
    return rmsnorm(x, gain if c.qk_norm == "gain" else 1.0, c.norm_eps)


def rope_inv_freq(c):
    """The inverse frequency f_i = theta^(-2i/D) of each pair, in float64. With Llama 3's scaling
    (rope_factor > 0), in the words of its definition: pairs whose wavelength 2 pi / f is shorter
    than original_max_pos / high_freq_factor keep f, those longer than original_max_pos /
    low_freq_factor take f / factor, and in between f is interpolated between the two with the
    weight s = (original_max_pos / wavelength - low) / (high - low) on f. Here as one formula: s,
    clamped to [0, 1], weighs f against f / factor everywhere."""
    f = c.rope_theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
    if not c.rope_factor:
        return f
    low, high = c.rope_low_freq_factor, c.rope_high_freq_factor
    s = ((c.rope_original_max_pos * f / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)
    return s * f + (1 - s) * f / c.rope_factor


def rope_tables(c, T, dtype):
    """cos and sin of t * f_i, formed in float64 and rounded to float32 as the C++ does."""
    angle = torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(c)[None, :]
    return angle.cos().float().to(dtype), angle.sin().float().to(dtype)


def rope(x, cos, sin):
    """Rotate-half RoPE on x [B, T, heads, D]: (x_i, x_{i+D/2}) turns by angle[t, i]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def keep(t):
    """The identity: forward's default for `store`."""
    return t


def forward(p, c, tokens, targets=None, taps=None, logit_scale=None, ablate=(), store=keep, inputs=None, start=None):
    """Logits [B, T, V] and the mean cross-entropy (None without targets).

    taps, if a dict, receives per layer l a dict: the queries and keys after their norms and before
    RoPE ("q", "k": the points where telemetry measures), after RoPE ("qr", "kr"), the attention
    logits with the causal mask applied ("scores", [B, H, T, T], -inf above the diagonal) and
    probabilities ("att"), and each head's attention output before the output projection ("y", [B, H, T, D]).
    logit_scale, if given, multiplies the attention logits: a number, or a tensor [L, H] per head.
    ablate: (layer, head) pairs whose attention output is replaced before the output projection: by
    zeros, or, when ablate is a dict, by its value for the pair, a vector [D] at every position.
    store: applied to every activation where the CUDA backend stores one in bf16 (llmc/activations.h:
    the residual stream, the norms' outputs, qkv, the rotated queries and keys, at head_dim 64 the
    attention's unnormalised probabilities as its tensor-core kernel multiplies them with the values
    (the kernels of other head_dims keep them in float32), its output, the MLP's products, the
    logits); with a rounding to bf16 (and bf16 weights) it emulates that backend's
    rounding. The keys and queries after their norms stay as computed: the GPU keeps them in float32.
    inputs, if a dict, receives per layer l the residual stream at its input [B, T, C]; start, a pair
    (l, that input), runs from layer l on, the layers before it skipped: the same numbers as the
    whole pass, for less work when only layer l and those after it change (an ablation of layer l).
    """
    B, T = tokens.shape
    H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
    cos, sin = (t.to(tokens.device) for t in rope_tables(c, T, p["wte"].dtype))
    first, x = start if start is not None else (0, store(p["wte"][tokens]))
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    for l in range(first, c.n_layer):
        if inputs is not None:
            inputs[l] = x
        w = lambda name: p[f"layers.{l}.{name}"]
        h = store(rmsnorm(x, w("attn_norm"), c.norm_eps))
        q = store(h @ w("wq").T).view(B, T, H, D)
        k = store(h @ w("wk").T).view(B, T, Hkv, D)
        v = store(h @ w("wv").T).view(B, T, Hkv, D)
        q, k = qk_norm(q, w("q_gain"), c), qk_norm(k, w("k_gain"), c)
        qr, kr = store(rope(q, cos, sin)), store(rope(k, cos, sin))
        group = H // Hkv
        kr_h = kr.transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, T, D]: head h reads h // group
        v_h = v.transpose(1, 2).repeat_interleave(group, dim=1)
        s = (qr.transpose(1, 2) @ kr_h.transpose(-1, -2)) / math.sqrt(D)
        if logit_scale is not None:
            scale = logit_scale[l].to(s.dtype)[None, :, None, None] if torch.is_tensor(logit_scale) else logit_scale
            s = s * scale
        s = s.masked_fill(~causal, float("-inf"))
        att = torch.softmax(s, dim=-1)
        if store is keep or D != 64:
            y = att @ v_h  # [B, H, T, D]
        else:  # the tensor-core kernel (D = 64) multiplies the values with exp(s - max) in bf16, the sum divides
            unnormalised = torch.exp(s - s.amax(dim=-1, keepdim=True))
            y = (store(unnormalised) @ v_h) / unnormalised.sum(dim=-1, keepdim=True)
        if taps is not None:
            taps[l] = {"q": q.detach(), "k": k.detach(), "qr": qr.detach(), "kr": kr.detach(),
                       "scores": s.detach(), "att": att.detach(), "y": y.detach()}
        for layer, head in ablate:
            if layer == l:
                y = y.clone()  # the taps keep the output as it was
                y[:, head] = ablate[layer, head] if isinstance(ablate, dict) else 0.0
        y = store(y.transpose(1, 2).reshape(B, T, H * D))
        x = store(x + y @ w("wo").T)
        h = store(rmsnorm(x, w("mlp_norm"), c.norm_eps))
        x = store(x + store(torch.nn.functional.silu(store(h @ w("w1").T)) * store(h @ w("w3").T)) @ w("w2").T)
    x = store(rmsnorm(x, p["final_norm"], c.norm_eps))
    logits = store(x @ p["wte" if c.tied_embeddings else "lm_head"].T)
    if targets is None:
        return logits, None
    return logits, torch.nn.functional.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))


# ------------------------------------------------------------------------------------------------
# Checkpoints (docs/checkpoint_format.md)

CKPT_MAGIC = b"ATTNCKPT"
CKPT_HEADER = 256
CKPT_VERSION = 5


class CheckpointError(UserError):
    """A checkpoint that cannot be read or is not a valid one; str(error) is one line naming the file."""


class CheckpointInfo:
    """What a checkpoint's header says beyond the configuration; decayed: the mask of the kinds that
    took weight decay (--decay)."""

    def __init__(self, step, frozen, data_position, has_optimizer_state, decayed=frozen_mask(MATRICES)):
        self.step, self.frozen, self.data_position = step, frozen, data_position
        self.has_optimizer_state, self.decayed = has_optimizer_state, decayed


def write_checkpoint(path, c, params, step=0, frozen=0):
    """A checkpoint of these float32 weights, without AdamW moments or a recorded run; the frozen
    kinds recorded are `frozen` (a mask) and those the variant holds at 1, as ./train records them."""
    frozen = frozen_mask(frozen_kinds(frozen, c.qk_norm))
    flat = np.concatenate([params[n].detach().float().numpy().reshape(-1) for n, _ in tensor_shapes(c)])
    payload = flat.astype("<f4").tobytes()
    head = bytearray(CKPT_HEADER)
    head[0:8] = CKPT_MAGIC
    struct.pack_into("<II", head, 8, CKPT_VERSION, CKPT_HEADER)
    struct.pack_into("<8i", head, 16, *[getattr(c, f) for f in CONFIG_FIELDS])
    struct.pack_into("<ff", head, 48, c.rope_theta, c.norm_eps)
    struct.pack_into("<qIIqq", head, 56, step, 0, 0, flat.size, 0)
    struct.pack_into("<I", head, 88, zlib.crc32(payload))
    struct.pack_into("<iI", head, 156, QK_NORMS.index(c.qk_norm), frozen)
    struct.pack_into("<Ifffi", head, 200, 0 if c.tied_embeddings else 1, c.rope_factor, c.rope_low_freq_factor,
                     c.rope_high_freq_factor, c.rope_original_max_pos)
    struct.pack_into("<I", head, 92, zlib.crc32(bytes(head[96:]), zlib.crc32(bytes(head[:92]))))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        f.write(payload)
    os.replace(tmp, path)


def read_checkpoint(path):
    """(Config, {name: float32 tensor}, CheckpointInfo) of a checkpoint file. Checks the magic, the
    version, both checksums, the configuration and the size; raises CheckpointError naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None

    def bad(what):
        return CheckpointError(f"{path}: {what}")

    if len(data) < CKPT_HEADER or data[:8] != CKPT_MAGIC:
        raise bad("not a checkpoint")
    version, header_bytes = struct.unpack_from("<II", data, 8)
    if not 1 <= version <= CKPT_VERSION or header_bytes != CKPT_HEADER:
        raise bad(f"checkpoint format version {version} is not one this reader knows (1 to {CKPT_VERSION})")
    (crc_header,) = struct.unpack_from("<I", data, 92)
    if zlib.crc32(data[96:CKPT_HEADER], zlib.crc32(data[:92])) != crc_header:
        raise bad("checkpoint header is damaged (checksum mismatch)")

    ints = struct.unpack_from("<8i", data, 16)
    theta, eps = struct.unpack_from("<ff", data, 48)
    step, flags, dtype, P, position, crc_payload = struct.unpack_from("<qIIqqI", data, 56)
    # bytes a version did not define read as zero: version 1 had no qk_norm and frozen kinds
    variant, frozen = struct.unpack_from("<iI", data, 156) if version >= 2 else (0, 0)
    # version 4 added untied embeddings and the RoPE scaling: before it, tied and none
    untied, *rope = struct.unpack_from("<Ifffi", data, 200) if version >= 4 else (0, 0.0, 0.0, 0.0, 0)
    # version 5 added the kinds whose weight decay differs from the default (--decay)
    (decay_changed,) = struct.unpack_from("<I", data, 220) if version >= 5 else (0,)
    if not 0 <= variant < len(QK_NORMS) or (frozen | decay_changed) >> len(PARAM_KINDS) or untied > 1:
        raise bad(f"checkpoint's qk_norm {variant}, frozen mask {frozen:#x}, weight decay mask {decay_changed:#x} or "
                  f"untied flag {untied} is not one this reader knows")
    if min(ints) < 1 or ints[2] % ints[3] or ints[4] % 2 or dtype != 0:
        raise bad("checkpoint holds an impossible configuration")
    c = Config(ints[0], ints[1], ints[2], ints[3], ints[4], ints[6], ints[7], theta, eps, QK_NORMS[variant],
               d_model=ints[5], tied_embeddings=not untied, rope_factor=rope[0], rope_low_freq_factor=rope[1],
               rope_high_freq_factor=rope[2], rope_original_max_pos=rope[3])
    if P != num_params(c):
        raise bad("checkpoint parameter count does not match its configuration")
    copies = 3 if flags & 1 else 1
    if len(data) != CKPT_HEADER + 4 * P * copies:
        raise bad(f"checkpoint is {len(data)} bytes, expected {CKPT_HEADER + 4 * P * copies}")
    if zlib.crc32(memoryview(data)[CKPT_HEADER:]) != crc_payload:  # a view: a d22 checkpoint is 0.9 GB
        raise bad("checkpoint data is damaged (checksum mismatch)")
    flat = np.frombuffer(data, dtype="<f4", count=P, offset=CKPT_HEADER)
    params, off = {}, 0
    for name, shape in tensor_shapes(c):
        n = int(np.prod(shape))
        params[name] = torch.from_numpy(flat[off:off + n].astype(np.float32)).view(shape)
        off += n
    return c, params, CheckpointInfo(step, frozen, position, bool(flags & 1), decay_changed ^ frozen_mask(MATRICES))
