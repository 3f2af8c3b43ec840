"""The PyTorch reference of docs/model.md and docs/telemetry.md.

The model is attnlog.model_torch (scripts/attnlog/model_torch.py); the statistics here are computed from their definitions in
float64 (pairwise cosines from the full N x N matrix, the effective rank from an SVD). It runs
on PyTorch 1.13 on the CPU.

    PYTHONPATH=scripts python3 test/reference.py --out DIR

builds a small configuration from a seed, writes its weights as a checkpoint (DIR/model.ckpt,
the format of llmc/checkpoint.h) and a debug state (DIR/debug_state.bin, the format of
test/tensorfile.h): the batch, the logits, the loss, every gradient (and the size of the terms each
gain's gradient sums), every statistic, and the
losses, final parameters and final second moments of a few AdamW steps. The same for the --qk-norm variants (DIR/plain.ckpt,
DIR/debug_plain.bin, DIR/none.ckpt, DIR/debug_none.bin), for --freeze wk,k_gain (DIR/debug_freeze.bin,
from model.ckpt), for --decay all (DIR/debug_decay_all.bin, from model.ckpt), and for two models of the shapes of pretrained ones (head_dim 128, an attention
width other than d_model): a Qwen3 with untied embeddings (DIR/qwen3.ckpt, DIR/debug_qwen3.bin) and a
Llama with Llama 3 RoPE scaling (DIR/llama3.ckpt, DIR/debug_llama3.bin). Then a trained state whose deeper layers' keys are close to low rank
(DIR/trained.ckpt, DIR/debug_trained.bin; no AdamW steps). The C++ and CUDA tests compare against
all of them.
"""
import argparse
import copy
import math
import os
import struct
import sys

import numpy as np
import torch

from attnlog.layout import CONFIG_FIELDS, decayed_kinds, frozen_kinds, frozen_mask
from attnlog.model_torch import Config, forward, init_params, make_optimizer, num_params, tensor_shapes, write_checkpoint

# ------------------------------------------------------------------------------------------------
# Statistics, straight from telemetry.md's definitions, in float64

KEY_STATISTICS = ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "k_mean_share", "k_erank_centered"]


def effective_rank(M):
    """Roy & Vetterli's effective rank of a matrix, from its singular values (an SVD of M itself,
    not of a Gram matrix)."""
    sv = torch.linalg.svdvals(M)
    prob = sv / sv.sum()
    prob = prob[prob > 0]
    return torch.exp(-(prob * prob.log()).sum()).item()


def key_statistics(K):
    """K: [N, D] keys of one head. Returns the KEY_STATISTICS, in that order."""
    K = K.double()
    N = K.shape[0]
    norms = K.norm(dim=1)
    sq = K.pow(2).sum(1)
    pr = sq.pow(2) / K.pow(4).sum(1)
    U = K / norms[:, None]
    cos = U @ U.T  # every pair, the diagonal excluded below
    k_cos = (cos.sum() - cos.diagonal().sum()) / (N * (N - 1))
    mean = K.mean(0)
    mean_share = mean.pow(2).sum() / sq.mean()
    return [norms.mean().item(), K.abs().max(1).values.mean().item(), pr.mean().item(), k_cos.item(), effective_rank(K),
            mean_share.item(), effective_rank(K - mean)]


def document_starts(tokens, eot):
    """[B, T] booleans: position s starts a document when s > 0 and the token before it, at s - 1,
    is the end-of-text token (telemetry.md); position 0 never does."""
    starts = torch.zeros(tokens.shape, dtype=torch.bool)
    starts[:, 1:] = tokens[:, :-1] == eot
    return starts


def attention_statistics(qr, kr, c, starts):
    """qr [B, T, H, D], kr [B, T, Hkv, D] after RoPE, starts [B, T] the document starts. Per query
    head: entropy, sink, maxp, logit max, mass on document starts, from the full attention matrix
    in float64."""
    B, T, H, D = qr.shape
    group = H // c.n_kv_head
    q = qr.double().transpose(1, 2)
    k = kr.double().transpose(1, 2).repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)  # [B, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s_masked = s.masked_fill(~causal, float("-inf"))
    p = torch.softmax(s_masked, dim=-1)
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    entropy = -plogp.sum(-1)  # [B, H, T]
    on_starts = (p * starts[:, None, None, :]).sum(-1)  # [B, H, T]: p_ts = 0 for s > t
    out = []
    for h in range(H):
        logit_max = s[:, h][causal.expand(B, T, T)].max().item()
        out.append([entropy[:, h].mean().item(), p[:, h, :, 0].mean().item(),
                    p[:, h].max(-1).values.mean().item(), logit_max, on_starts[:, h].mean().item()])
    return out


ATTENTION_STATISTICS = ["attn_entropy", "attn_sink", "attn_maxp", "attn_logit_max", "attn_doc_start"]


def telemetry(p, c, taps, tokens):
    """Every statistic of telemetry.md as float64 arrays [L, cols] (doc_start_visible: one value)."""
    L, H, Hkv = c.n_layer, c.n_head, c.n_kv_head
    starts = document_starts(tokens, EOT)
    stats = {name: np.zeros((L, Hkv)) for name in KEY_STATISTICS}
    stats.update({name: np.zeros((L, H)) for name in ["q_norm"] + ATTENTION_STATISTICS})
    stats["doc_start_visible"] = np.array((starts.cumsum(1) > 0).double().mean().item())  # a start s <= t
    stats["g_q"] = np.zeros((L, c.head_dim))
    stats["g_k"] = np.zeros((L, c.head_dim))
    for l in range(L):
        t = taps[l]
        for h in range(Hkv):
            K = t["k"][:, :, h, :].reshape(-1, c.head_dim)
            for name, value in zip(KEY_STATISTICS, key_statistics(K)):
                stats[name][l, h] = value
        att = attention_statistics(t["qr"], t["kr"], c, starts)
        for h in range(H):
            Q = t["q"][:, :, h, :].reshape(-1, c.head_dim).double()
            stats["q_norm"][l, h] = Q.norm(dim=1).mean().item()
            for name, value in zip(ATTENTION_STATISTICS, att[h]):
                stats[name][l, h] = value
        stats["g_q"][l] = p[f"layers.{l}.q_gain"].detach().double().numpy()
        stats["g_k"][l] = p[f"layers.{l}.k_gain"].detach().double().numpy()
    return stats


# ------------------------------------------------------------------------------------------------
# The learning-rate schedule (model.md): warm-up + cosine decay; AdamW is model_torch.make_optimizer


def lr_at_step(step, total, warmup, peak, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    if total <= warmup + 1:
        return peak
    progress = min(1.0, (step - warmup) / (total - 1 - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------------------------------------
# Files

TF_MAGIC = b"ATTNTNSR"
TF_DTYPES = {np.dtype("<f4"): 0, np.dtype("<i4"): 1, np.dtype("<f8"): 2}


def write_tensorfile(path, tensors):
    """A list of named arrays: magic, u32 version, u32 count, then per tensor u16 name length, name,
    u8 dtype (0 f32, 1 i32, 2 f64), u8 ndim, i64 dims, little-endian data."""
    with open(path + ".tmp", "wb") as f:
        f.write(TF_MAGIC + struct.pack("<II", 1, len(tensors)))
        for name, arr in tensors:
            arr = np.ascontiguousarray(arr)
            arr = arr.astype(arr.dtype.newbyteorder("<"))
            code = TF_DTYPES[arr.dtype]
            enc = name.encode()
            f.write(struct.pack("<H", len(enc)) + enc + struct.pack("<BB", code, arr.ndim))
            f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
            f.write(arr.tobytes())
    os.replace(path + ".tmp", path)


def read_tensorfile(path):
    """{name: array} of a file write_tensorfile wrote."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != TF_MAGIC:
        raise ValueError(f"{path}: not a tensor file")
    (count,) = struct.unpack_from("<I", data, 12)
    offset, tensors = 16, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        name = data[offset + 2:offset + 2 + length].decode()
        code, ndim = struct.unpack_from("<BB", data, offset + 2 + length)
        offset += 4 + length
        shape = struct.unpack_from(f"<{ndim}q", data, offset)
        offset += 8 * ndim
        dtype = next(d for d, c in TF_DTYPES.items() if c == code)
        n = int(np.prod(shape))
        tensors[name] = np.frombuffer(data, dtype, n, offset).reshape(shape).copy()
        offset += n * dtype.itemsize
    return tensors


# ------------------------------------------------------------------------------------------------
# The batch's documents

EOT = 1  # the end-of-text token (the corpus' BOS id, which prepare_data puts before every document)
# Where the batch holds it, (sequence, position) of the inputs: document starts mid-window, two in
# a row (an empty document), one at the last position (the next sequence's position 0 is no start),
# one at position 0 (a start at 1), and a sequence without one.
EOT_AT = [(0, 7), (0, 38), (0, 39), (1, 63), (2, 0), (2, 29)]


def with_document_ends(seq):
    """(tokens, targets) of the sequences seq [B, T + 1], the end-of-text token at EOT_AT and
    nowhere else."""
    seq = seq.clone()
    seq[seq == EOT] = EOT + 1
    for b, t in EOT_AT:
        seq[b, t] = EOT
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# ------------------------------------------------------------------------------------------------

def gain_gradient_terms(params32, c, tokens, targets):
    """The size of the terms each gain's gradient sums, in the grads' layout (zero for the other
    parameters). A gain g scales a normalised x^ (y = x^ g), so its gradient element i sums one term
    dL/dy_i x^_i per position (and per head, for the queries' and keys' gains), terms that largely
    cancel: its float32 error follows their magnitudes, not the gradient's own size. Each gain is
    given one copy per position (and head) here, whose gradients are those terms; the sum of their
    absolute values is returned, and their plain sum (the gradient, as a check)."""
    B, T = tokens.shape
    p = {n: t.double() for n, t in params32.items()}
    spread = {}
    for n, t in p.items():
        kind = n.split(".")[-1]
        if kind in ("attn_norm", "mlp_norm", "final_norm"):
            spread[n] = t.expand(B, T, -1).clone().requires_grad_(True)
        elif kind in ("q_gain", "k_gain") and c.qk_norm == "gain":
            heads = c.n_head if kind == "q_gain" else c.n_kv_head
            spread[n] = t.expand(B, T, heads, -1).clone().requires_grad_(True)
    _, loss = forward({**p, **spread}, c, tokens, targets)
    loss.backward()

    def per_element(of):  # each spread gain's terms combined per element, in the grads' layout
        return np.concatenate([of(spread[n].grad).reshape(-1, shape[-1]).sum(0).numpy() if n in spread
                               else np.zeros(int(np.prod(shape))) for n, shape in tensor_shapes(c)])
    return per_element(torch.abs), per_element(lambda t: t)


def exact_state(params32, c, tokens, targets):
    """One forward/backward in float64 from float32 weights: the exact answer the float32 backends
    approximate. Returns (the float64 parameters, the tensors to write)."""
    p = {n: t.double().requires_grad_(True) for n, t in params32.items()}
    taps = {}
    logits, loss = forward(p, c, tokens, targets, taps)
    loss.backward()
    # Parameters the variant does not use (the gains of --qk-norm plain and none) get no gradient.
    grads = np.concatenate([(p[n].grad if p[n].grad is not None else torch.zeros_like(p[n])).numpy().reshape(-1)
                            for n, _ in tensor_shapes(c)])
    terms, summed = gain_gradient_terms(params32, c, tokens, targets)
    gains = terms > 0
    if not np.allclose(summed[gains], grads[gains], rtol=1e-9, atol=1e-12 * np.abs(grads).max()):
        raise AssertionError("reference: the gains' gradients summed term by term are not the gradients")
    tensors = [
        ("config", np.array([getattr(c, f) for f in CONFIG_FIELDS], dtype="<i4")),
        ("tokens", tokens.numpy().astype("<i4")),
        ("eot", np.array([EOT], dtype="<i4")),
        ("targets", targets.numpy().astype("<i4")),
        ("logits", logits.detach().numpy().astype("<f8")),
        ("loss", np.array([loss.item()], dtype="<f8")),
        ("grads", grads.astype("<f8")),
        ("grad_terms", terms.astype("<f8")),
    ]
    tensors += [("stat." + name, value.astype("<f8")) for name, value in telemetry(p, c, taps, tokens).items()]
    # The statistics as the CUDA backend's bf16 weights and stored activations leave them (the same
    # float64 arithmetic otherwise): near a low-rank state the rounding moves some of them (the
    # effective rank) by more than the arithmetic's own error, so the GPU is compared with these.
    taps16 = {}
    with torch.no_grad():
        forward({n: round_bf16(t.detach()) for n, t in p.items()}, c, tokens, None, taps16, store=round_bf16)
    tensors += [("bf16.stat." + name, value.astype("<f8")) for name, value in telemetry(p, c, taps16, tokens).items()]
    return p, tensors


def round_bf16(t):
    """t rounded to bfloat16 (to nearest, ties to even), in t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


def adamw_steps(p, c, tokens, targets, steps, lr_of_step, weight_decay, clip, frozen=(), decay="matrices"):
    """AdamW steps on float64 master weights, the kinds in `frozen` held fixed and left out of the
    gradient norm, weight decay on the kinds --decay's value `decay` names; returns the losses and
    gradient norms of the steps, and the second moments (AdamW's v, before bias correction) of every
    parameter at the end, zero where frozen."""
    opt, free = make_optimizer(p, weight_decay, frozen_kinds(frozen_mask(frozen), c.qk_norm), decayed_kinds(decay))
    losses, norms = [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        _, step_loss = forward(p, c, tokens, targets)
        step_loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(free, clip).item())
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)
        opt.step()
        losses.append(step_loss.item())
    v = np.concatenate([(opt.state[p[n]]["exp_avg_sq"] if p[n] in opt.state else torch.zeros_like(p[n]))
                        .detach().numpy().reshape(-1) for n, _ in tensor_shapes(c)])
    return losses, norms, v


def variant(c, **fields):
    """A copy of the configuration c with some fields changed."""
    cv = copy.copy(c)
    for name, value in fields.items():
        setattr(cv, name, value)
    return cv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the checkpoints and debug states")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--steps", type=int, default=10, help="AdamW steps whose losses are recorded")
    ap.add_argument("--train-steps", type=int, default=20, help="AdamW steps (lr 2e-2) to the trained state")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    # Several layers, GQA on (4 query heads share 2 key/value heads), D = 64, a vocabulary that is
    # not a multiple of 128, short sequences.
    c = Config(vocab_size=320, n_layer=3, n_head=4, n_kv_head=2, head_dim=64, d_ff=192, max_seq_len=64)
    B, T = 4, 64
    lr, warmup, floor_frac, weight_decay, clip = 3e-3, 3, 0.1, 0.1, 1.0

    params32 = init_params(c, args.seed)
    # Tokens with structure (a repeating pattern plus noise) so attention has something to find.
    g = torch.Generator().manual_seed(args.seed + 1)
    pattern = torch.randint(0, c.vocab_size, (16,), generator=g)
    seq = pattern.repeat(B * (T + 1) // 16 + 1)[: B * (T + 1)].view(B, T + 1).clone()
    noise = torch.rand(B, T + 1, generator=g) < 0.3
    seq[noise] = torch.randint(0, c.vocab_size, (int(noise.sum()),), generator=g)
    tokens, targets = with_document_ends(seq)
    os.makedirs(args.out, exist_ok=True)

    # The initial state, and AdamW steps from it with the trainer's schedule; then the same for the
    # other --qk-norm variants (plain.ckpt, none.ckpt) and for --freeze wk,k_gain (the same weights);
    # then for two models of the shapes of pretrained ones, 2 layers of head_dim 128, GQA, with an
    # attention width (4 x 128) other than d_model (192): a Qwen3 with untied embeddings
    # (qwen3.ckpt), and a Llama (qk-norm none) with Llama 3 RoPE scaling, each of its bands of
    # frequencies present: kept, blended, slowed (llama3.ckpt). (With three layers and untied
    # embeddings, or the scaling, the steps are so sensitive that PyTorch's own float32 steps stray
    # from float64 by 1e-4: the comparison would measure float32, not the backend.) The two
    # pretrained shapes step at a third of the learning rate: at 3e-3 their losses spike (Llama's
    # gradient norm reaches 20 at step 8), and there a 2^-9 nudge of the initial weights moves
    # Llama's losses by 0.06, so the GPU's bf16 rounding decides the spike's height; at 1e-3 the
    # same nudge moves them by 2e-4 and the steps compare the backends again.
    def schedule_of(lr):
        return lambda step: lr_at_step(step, args.steps, warmup, lr, lr * floor_frac)
    wide = Config(vocab_size=320, n_layer=2, n_head=4, n_kv_head=2, head_dim=128, d_ff=192, max_seq_len=64, d_model=192)
    qwen3 = variant(wide, tied_embeddings=False)
    llama3 = variant(wide, qk_norm="none", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                     rope_original_max_pos=32)
    # --decay all (every kind decayed, the gains too, as torch.optim.AdamW(model.parameters()) does)
    # at five times the weight decay, so that the gains' decay (lr x 0.5 a step) moves them well past
    # what the checks allow: a backend that left the gains undecayed would fail them.
    cases = [("model.ckpt", "debug_state.bin", c, [], lr, "matrices", weight_decay),
             ("plain.ckpt", "debug_plain.bin", variant(c, qk_norm="plain"), [], lr, "matrices", weight_decay),
             ("none.ckpt", "debug_none.bin", variant(c, qk_norm="none"), [], lr, "matrices", weight_decay),
             (None, "debug_freeze.bin", c, ["wk", "k_gain"], lr, "matrices", weight_decay),
             (None, "debug_decay_all.bin", c, [], lr, "all", 5 * weight_decay),
             ("qwen3.ckpt", "debug_qwen3.bin", qwen3, [], lr / 3, "matrices", weight_decay),
             ("llama3.ckpt", "debug_llama3.bin", llama3, [], lr / 3, "matrices", weight_decay)]
    for ckpt, debug, cv, frozen, peak, decay, decay_rate in cases:
        weights = init_params(cv, args.seed)  # params32 where the shapes are c's
        if ckpt:
            write_checkpoint(os.path.join(args.out, ckpt), cv, weights)
        p, tensors = exact_state(weights, cv, tokens, targets)
        losses, norms, adam_v = adamw_steps(p, cv, tokens, targets, args.steps, schedule_of(peak), decay_rate, clip, frozen,
                                            decay)
        hyper = np.array([args.steps, warmup, peak, floor_frac, decay_rate, clip], dtype="<f8")
        final = np.concatenate([p[n].detach().numpy().reshape(-1) for n, _ in tensor_shapes(cv)])
        tensors += [
            ("hyper", hyper),
            ("freeze", np.array([frozen_mask(frozen)], dtype="<i4")),
            ("decay", np.array([frozen_mask(decayed_kinds(decay))], dtype="<i4")),
            ("step_losses", np.array(losses, dtype="<f8")),
            ("step_grad_norms", np.array(norms, dtype="<f8")),
            ("final_params", final.astype("<f8")),
            ("final_adam_v", adam_v.astype("<f8")),
        ]
        write_tensorfile(os.path.join(args.out, debug), tensors)
        if ckpt == "model.ckpt":
            loss, first_losses = dict(tensors)["loss"][0], losses

    # A trained state: a few steps at a high learning rate on the same batch take the deeper
    # layers' keys close to low rank (effective rank about 4 of 64, up to two thirds of their energy in a
    # common direction), where statistics computed carelessly lose their digits.
    p = {n: t.double().requires_grad_(True) for n, t in params32.items()}
    adamw_steps(p, c, tokens, targets, args.train_steps, lambda step: 2e-2, weight_decay, clip)
    trained32 = {n: t.detach().float() for n, t in p.items()}
    write_checkpoint(os.path.join(args.out, "trained.ckpt"), c, trained32)
    _, trained = exact_state(trained32, c, tokens, targets)
    write_tensorfile(os.path.join(args.out, "debug_trained.bin"), trained)
    trained = dict(trained)
    erank = trained["stat.k_erank"]
    print(f"reference: {num_params(c)} parameters, loss {loss:.6f}, {args.steps} AdamW steps to loss {first_losses[-1]:.6f}; "
          f"trained state: loss {trained['loss'][0]:.6f}, k_erank {erank.min():.2f}..{erank.max():.2f}; wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
