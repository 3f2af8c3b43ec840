"""Probes of a checkpoint's attention heads, run through the PyTorch twin of the model
(attnlog.model_torch) in float64 on the CPU: a library and a command line (`attnlog-probe`, or
/usr/bin/python3 scripts/probe.py from the checkout).

    attnlog-probe sweep CKPT [--scale 0.25,0.5,1,2,4]   attention logits times s: entropy, peak, |logit|, loss
    attnlog-probe svd CKPT [--top K]                    singular values and angles of each head's W_Q^T W_K,
                                                        beside those of random weights (chance)
    attnlog-probe ablate CKPT                           the loss with each head's output zeroed, and with it
                                                        replaced by its mean, in turn
    attnlog-probe pattern CKPT --text TEXT --layer L --head H [--tokenizer PATH]    one head's attention

Each prints a table and writes a figure into --out (default: the checkpoint's folder), named after
the checkpoint and the probe (model_sweep.png, model_pattern_L2_H1.png, ...); --json PATH also
writes the table's numbers. Errors print one line `error: ...` and exit with status 1 (attnlog.commands).

Validation data (sweep, ablate): the first --batches N batches of --batch B sequences of --seq-len
T tokens (default: the checkpoint's max_seq_len) that ./train's validation reads; without
--batches, as many as hold EVAL_TOKENS tokens (all there are when the shards hold fewer), the
number the report's head ablation evaluates too. The shards --data/val_*.bin are taken in name
order, each cut into windows of B*T+1 tokens at offsets 0, B*T, 2*B*T, ... (llmc/dataloader.h,
unshuffled): inputs are a window's first B*T tokens, targets the same shifted by one. The loss is
the mean of the sequences' mean cross-entropies, as ./train's; a difference of losses (an
ablation's, a scale's against s = 1) comes with its standard error over the sequences.

    from attnlog.probe import load_checkpoint, validation_batches, sweep
    c, params = load_checkpoint("runs/x/model.ckpt")          # float64 parameters
    result = sweep(params, c, validation_batches("data/brown", 2, 2, 256, c.vocab_size), [0.5, 1, 2])
"""
import argparse
import glob
import itertools
import json
import math
import os

import numpy as np
import torch

from attnlog import figures  # the Agg backend and the house style of the report's figures
import matplotlib.pyplot as plt  # noqa: E402  (after figures, which chose the backend)
from attnlog.commands import DEFAULT_DATA, ArgumentParser, UserError, positive_int, run
from attnlog.document import plus_minus
from attnlog.model_torch import forward, read_checkpoint

SHARD_MAGIC, SHARD_HEADER_BYTES = 20240520, 256 * 4
SHARD_TOKEN_TYPES = {1: "<u2", 2: "<u4"}  # version 1: uint16 ids (llm.c's format); version 2: uint32
# Validation tokens the probes (sweep, ablate) and the report's head ablation evaluate unless told
# otherwise. On a d6 model (800 steps; 64 sequences of 256 tokens) the standard error of a head's
# ablation effect is then 0.0005 nats (the median over its 24 heads), half the median effect, and
# 15 of the 24 effects are more than twice theirs (4 at 2,048 tokens). The intact loss's own
# standard error is 0.034 nats (0.14 at 1,024 tokens, which put two evaluations of a model 0.15 apart).
EVAL_TOKENS = 16384
CHANCE_DRAWS = 200  # heads of random weights behind each chance baseline of svd


class ProbeError(UserError):
    """An input the probes cannot use; str(error) is one line naming the file or the option."""


# -- inputs --------------------------------------------------------------------------------------------

def load_checkpoint(path, device="cpu"):
    """(Config, {name: float64 tensor on the device}) of a checkpoint; raises CheckpointError."""
    c, params, _ = read_checkpoint(path)
    return c, {name: t.double().to(device) for name, t in params.items()}


def read_shard(path):
    """The token ids of a shard: a header of 256 int32 (magic, version, token count), then the ids."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ProbeError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) < SHARD_HEADER_BYTES:
        raise ProbeError(f"{path}: truncated: {len(data)} bytes, shorter than the shard header")
    magic, version, count = (int(v) for v in np.frombuffer(data, "<i4", 3))
    if magic != SHARD_MAGIC:
        raise ProbeError(f"{path}: not a token shard: magic number {magic}, expected {SHARD_MAGIC}")
    if version not in SHARD_TOKEN_TYPES:
        raise ProbeError(f"{path}: unknown shard version {version} (1 = uint16 tokens, 2 = uint32 tokens)")
    expected = SHARD_HEADER_BYTES + count * (2 if version == 1 else 4)
    if count < 0 or len(data) != expected:
        raise ProbeError(f"{path}: {len(data)} bytes, but the header says {count} tokens ({expected} bytes)")
    return np.frombuffer(data, SHARD_TOKEN_TYPES[version], count, SHARD_HEADER_BYTES).astype(np.int64)


def validation_windows(data_dir, B, T, vocab_size):
    """./train's validation batches, in order, as long as the shards last: (tokens [B, T], targets [B, T])."""
    paths = sorted(glob.glob(os.path.join(glob.escape(data_dir), "val_*.bin")))
    if not paths:
        raise ProbeError(f"{data_dir}: no validation shard (val_*.bin)")
    span = B * T
    for path in paths:
        ids = read_shard(path)
        outside = np.flatnonzero(ids >= vocab_size)
        if outside.size:
            raise ProbeError(f"{path}: token id {ids[outside[0]]} at position {outside[0]} is outside the "
                             f"checkpoint's vocabulary (vocab_size {vocab_size})")
        for start in range(0, ids.size - span, span):  # every window of span + 1 tokens that fits
            window = torch.from_numpy(ids[start:start + span + 1])
            yield window[:-1].view(B, T), window[1:].view(B, T)


def validation_batches(data_dir, n_batches, B, T, vocab_size):
    """The first n_batches validation batches of ./train: [(tokens [B, T], targets [B, T])]."""
    batches = list(itertools.islice(validation_windows(data_dir, B, T, vocab_size), n_batches))
    if len(batches) < n_batches:
        raise ProbeError(f"{data_dir}: the validation shards hold {len(batches)} windows of B*T+1 = {B * T + 1} "
                         f"tokens, fewer than --batches {n_batches}")
    return batches


def evaluation_batches(data_dir, B, T, vocab_size, tokens=EVAL_TOKENS):
    """The first validation batches that hold `tokens` tokens (the last may pass that), or all there
    are when the shards hold fewer; at least one."""
    batches = list(itertools.islice(validation_windows(data_dir, B, T, vocab_size), -(-tokens // (B * T))))
    if not batches:
        raise ProbeError(f"{data_dir}: the validation shards hold no window of B*T+1 = {B * T + 1} tokens")
    return batches


def encode(tokenizer_path, text, c):
    """(ids, pieces) of text, after the tokenizer's BOS as every document of the shards begins."""
    import sentencepiece  # only this probe needs the tokenizer
    if not os.path.isfile(tokenizer_path):
        raise ProbeError(f"{tokenizer_path}: no such file")
    try:
        sp = sentencepiece.SentencePieceProcessor(model_file=tokenizer_path)
    except (OSError, RuntimeError):
        raise ProbeError(f"{tokenizer_path}: not a SentencePiece model") from None
    ids = sp.encode(text)
    if not ids:
        raise ProbeError("--text: empty: it has no tokens")
    ids = ([sp.bos_id()] if sp.bos_id() >= 0 else []) + ids
    if len(ids) > c.max_seq_len:
        raise ProbeError(f"--text: {len(ids)} tokens (BOS included), more than max_seq_len {c.max_seq_len}")
    if max(ids) >= c.vocab_size:
        raise ProbeError(f"{tokenizer_path}: piece id {max(ids)} is outside the checkpoint's vocabulary "
                         f"(vocab_size {c.vocab_size}): not this model's tokenizer")
    return ids, [sp.id_to_piece(i) for i in ids]


# -- probes ------------------------------------------------------------------------------------------

def sequence_losses(params, c, batches, **options):
    """The mean cross-entropy of each sequence of the batches, in order [batches x B]; options go to
    model_torch.forward (ablate=...)."""
    with torch.no_grad():
        return np.concatenate([per_sequence(forward(params, c, tokens, **options)[0], targets)
                               for tokens, targets in batches])


def per_sequence(logits, targets):
    """The mean cross-entropy of each sequence [B] of logits [B, T, V] against targets [B, T]."""
    each = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), reduction="none")
    return each.view(targets.shape).mean(1).cpu().numpy()


def mean_loss(params, c, batches, **options):
    """The loss over the batches: the mean of the sequences' losses."""
    return float(sequence_losses(params, c, batches, **options).mean())


def standard_error(samples):
    """The standard error of the mean of samples [..., n] over its last axis, the n taken as
    independent (a sequence's loss depends on its own tokens); NaN for fewer than 2."""
    n = samples.shape[-1]
    return samples.std(axis=-1, ddof=1) / math.sqrt(n) if n > 1 else np.full(samples.shape[:-1], np.nan)


def sweep(params, c, batches, scales):
    """Every head's attention logits multiplied by s, for each s of scales: per layer and head the
    mean over all query rows of the attention entropy (nats) and of the peak probability, as
    docs/telemetry.md defines them, and the mean |logit| over the causal entries, [S, L, H] each;
    and the loss, [S], with the standard error of its difference from the loss at s = 1 (NaN when 1
    is not among the scales). s = 0 is uniform causal attention; s = 1 the model as trained."""
    shape = (len(scales), c.n_layer, c.n_head)
    entropy, maxp, score_abs = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    B, T = batches[0][0].shape
    causal = torch.ones(T, T, dtype=torch.bool, device=batches[0][0].device).tril()
    rows, entries = len(batches) * B * T, len(batches) * B * int(causal.sum())
    losses = np.zeros((len(scales), len(batches) * B))  # [S, sequences]
    for i, s in enumerate(scales):
        for b, (tokens, targets) in enumerate(batches):
            taps = {}
            with torch.no_grad():
                losses[i, b * B:(b + 1) * B] = per_sequence(forward(params, c, tokens, None, taps,
                                                                    logit_scale=float(s))[0], targets)
            for l in range(c.n_layer):
                att, scores = taps[l]["att"], taps[l]["scores"]  # [B, H, T, T]
                entropy[i, l] -= torch.xlogy(att, att).sum(-1).sum((0, 2)).cpu().numpy() / rows  # 0 ln 0 = 0
                maxp[i, l] += att.max(-1).values.sum((0, 2)).cpu().numpy() / rows
                score_abs[i, l] += scores[:, :, causal].abs().sum((0, 2)).cpu().numpy() / entries
    one = losses[list(scales).index(1)] if 1 in scales else np.full(losses.shape[1], np.nan)
    return {"scales": np.array(scales, dtype=float), "entropy": entropy, "maxp": maxp, "score_abs": score_abs,
            "loss": losses.mean(1), "loss_change_se": standard_error(losses - one), "sequences": losses.shape[1]}


def effective_rank(sv):
    """Roy & Vetterli: exp of the entropy of the singular values divided by their sum (0 for none)."""
    p = sv / sv.sum()
    return math.exp(-torch.xlogy(p, p).sum().item()) if sv.sum() > 0 else 0.0


def row_space(X):
    """U and S of the thin SVD U S Vh of X [D, C], and the rows of Vh that span X's row space."""
    U, S, Vh = torch.linalg.svd(X, full_matrices=False)
    rank = int((S > S[0] * max(X.shape) * torch.finfo(X.dtype).eps).sum()) if S[0] > 0 else 0
    return U, S, Vh[:rank]


def svd_probe(params, c):
    """The bilinear form of each query head's attention logit before RoPE.

    Head h of layer l scores (g_q * q^) . (g_k * k^) / sqrt(D), where q = W_Q,h x and k = W_K,kv y
    (W_Q,h, W_K,kv: the head's D rows of wq and of its kv head kv = h // (H / Hkv) in wk; x, y: the
    layer's attention input after its RMSNorm and attn_norm gain), ^ is the q or k norm and g its
    gain. The norm divides each query and key by a per-token scalar, which changes lengths but no
    direction, and RoPE turns the pairs (i, i + D/2) by the offset's angles; so, up to those two,
    the logit is x^T M_h y with M_h = A_h^T B_h [C, C], A_h = diag(g_q) W_Q,h, B_h = diag(g_k) W_K,kv.

    With the thin SVDs A_h = Ua Sa Va and B_h = Ub Sb Vb (Va, Vb orthonormal rows), M_h = Va^T
    (Sa Ua^T Ub Sb) Vb: its singular values are exactly those of the D x D core in the brackets.
    The principal cosines between the row spaces of A_h and B_h (what queries and keys read from
    the residual stream) are the singular values of Va Vb^T, over min(rank A_h, rank B_h) pairs
    (NaN beyond). The orthogonality of W_Q and W_K, as the research notes measure it, comes from the
    cosines between the rows of W_Q,h and of W_K,kv [D, D]: the mean and the largest |cosine|, and
    the mean of the diagonal (row i of each, the pair that meets in score component i). Beside
    each cosine statistic, chance_<name> and chance_<name>_se: its value for heads of random weights
    (chance_cosines), the baseline a head's number means something against.
    """
    L, H, D = c.n_layer, c.n_head, c.head_dim
    group = H // c.n_kv_head
    out = {name: np.zeros((L, H)) for name in ("effective_rank",) + COSINE_STATISTICS}
    out["singular_values"] = np.zeros((L, H, D))
    out["principal_cosines"] = np.full((L, H, D), np.nan)
    ones = torch.ones(D, dtype=torch.float64)  # --qk-norm plain holds the gains at 1; none has no norm
    for l in range(L):
        g_q, g_k = ((params[f"layers.{l}.q_gain"], params[f"layers.{l}.k_gain"]) if c.qk_norm == "gain"
                    else (ones, ones))
        for h in range(H):
            W_q = params[f"layers.{l}.wq"][h * D:(h + 1) * D]
            W_k = params[f"layers.{l}.wk"][(h // group) * D:(h // group + 1) * D]
            head = score_form(W_q, W_k, g_q, g_k)
            out["singular_values"][l, h] = head["singular_values"]
            out["principal_cosines"][l, h, :len(head["principal_cosines"])] = head["principal_cosines"]
            for name in ("effective_rank",) + COSINE_STATISTICS:
                out[name][l, h] = head[name]
    out.update({f"chance_{name}": value for name, value in chance_cosines(D, c.d_model).items()})
    return out


COSINE_STATISTICS = ("cos_mean", "cos_max", "qk_row_cos_abs_mean", "qk_row_cos_abs_max", "qk_row_cos_diag_mean")


def score_form(W_q, W_k, g_q, g_k):
    """svd_probe's numbers of one head, W_Q,h and W_K,kv [D, C] with gains g_q, g_k [D]."""
    Ua, Sa, basis_a = row_space(g_q[:, None] * W_q)
    Ub, Sb, basis_b = row_space(g_k[:, None] * W_k)
    sv = torch.linalg.svdvals(Sa[:, None] * (Ua.T @ Ub) * Sb[None, :])
    cosines = torch.linalg.svdvals(basis_a @ basis_b.T).clamp(max=1.0)  # rounding can pass 1
    row_cos = (W_q / W_q.norm(dim=1, keepdim=True)) @ (W_k / W_k.norm(dim=1, keepdim=True)).T
    return {"singular_values": sv.numpy(), "effective_rank": effective_rank(sv), "principal_cosines": cosines.numpy(),
            "cos_mean": cosines.mean().item() if len(cosines) else np.nan,
            "cos_max": cosines.max().item() if len(cosines) else np.nan,
            "qk_row_cos_abs_mean": row_cos.abs().mean().item(), "qk_row_cos_abs_max": row_cos.abs().max().item(),
            "qk_row_cos_diag_mean": row_cos.diagonal().mean().item()}


def chance_cosines(D, C, draws=CHANCE_DRAWS, seed=0):
    """What svd_probe's cosines are by chance: their mean over `draws` heads of random weights, W_Q
    and W_K [D, C] of independent standard normal entries (rows of random directions, row spaces
    uniformly random D-dimensional subspaces of the C-dimensional residual stream), a fixed seed.
    {name: mean} and {name_se: its standard error} for each of COSINE_STATISTICS. For D = 64 of
    C = 256 the mean principal cosine is 0.436; D = C gives 1, the two spaces being the same."""
    generator = torch.Generator().manual_seed(seed)
    ones = torch.ones(D, dtype=torch.float64)
    heads = [score_form(torch.randn(D, C, generator=generator, dtype=torch.float64),
                        torch.randn(D, C, generator=generator, dtype=torch.float64), ones, ones) for _ in range(draws)]
    values = {name: np.array([head[name] for head in heads]) for name in COSINE_STATISTICS}
    return dict({name: v.mean() for name, v in values.items()},
                **{f"{name}_se": standard_error(v) for name, v in values.items()})


def head_means(params, c, batches):
    """[L, H, D]: each head's attention output (before the output projection) averaged over every
    position of every sequence of the batches."""
    total = torch.zeros(c.n_layer, c.n_head, c.head_dim, dtype=torch.float64, device=batches[0][0].device)
    for tokens, _ in batches:
        taps = {}
        with torch.no_grad():
            forward(params, c, tokens, taps=taps)
        for l in range(c.n_layer):
            total[l] += taps[l]["y"].sum((0, 2))
    return total / (len(batches) * batches[0][0].numel())


def ablate(params, c, batches):
    """The intact model's loss, and [L, H] the increase of the loss when one head's attention output
    (before the output projection) is replaced, one head at a time: by zeros ("increase",
    zero-ablation) or by its mean over every position of the batches ("mean_increase",
    mean-ablation, which keeps what the head adds on average and removes only what depends on the
    input). Each with its standard error over the sequences (standard_error of the per-sequence
    differences, "increase_se", "mean_increase_se"; "loss_se" for the intact loss)."""
    layer_inputs = [{} for _ in batches]  # per batch, each layer's input: an ablation runs from its layer on
    intact = np.concatenate([sequence_losses(params, c, [batch], inputs=inputs)
                             for batch, inputs in zip(batches, layer_inputs)])
    means = head_means(params, c, batches)
    zeros = torch.zeros(c.head_dim, dtype=torch.float64, device=batches[0][0].device)
    out = {"loss": float(intact.mean()), "loss_se": float(standard_error(intact)), "sequences": len(intact)}

    def ablated(l, h, fill):  # each sequence's loss with head h of layer l replaced by fill
        return np.concatenate([sequence_losses(params, c, [batch], ablate={(l, h): fill}, start=(l, inputs[l]))
                               for batch, inputs in zip(batches, layer_inputs)])

    for name, fill in (("increase", lambda l, h: zeros), ("mean_increase", lambda l, h: means[l, h])):
        change = np.array([[ablated(l, h, fill(l, h)) - intact
                            for h in range(c.n_head)] for l in range(c.n_layer)])  # [L, H, sequences]
        out[name], out[f"{name}_se"] = change.mean(-1), standard_error(change)
    return out


def attention_pattern(params, c, tokens, layer, head):
    """The attention probabilities [T, T] of one query head on one sequence of token ids."""
    if not 0 <= layer < c.n_layer:
        raise ProbeError(f"--layer {layer}: the checkpoint has layers 0..{c.n_layer - 1}")
    if not 0 <= head < c.n_head:
        raise ProbeError(f"--head {head}: the checkpoint has query heads 0..{c.n_head - 1}")
    taps = {}
    with torch.no_grad():
        forward(params, c, torch.as_tensor(tokens, dtype=torch.long).view(1, -1), taps=taps)
    return taps[layer]["att"][0, head].numpy()


# -- figures -----------------------------------------------------------------------------------------

def save(fig, path):
    fig.savefig(path, dpi=figures.DPI)
    plt.close(fig)


def heatmap(fig, ax, values, colour_label, fmt, **style):
    """values [L, H] as an image, each cell labelled with its number while the cells are big enough."""
    image = ax.imshow(values, aspect="auto", **style)
    if values.size <= 200:
        for (r, col), value in np.ndenumerate(values):
            red, green, blue, _ = image.cmap(image.norm(value))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # the cell's luminance
            ax.text(col, r, fmt.format(value), ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    ax.set(xticks=np.arange(values.shape[1]), yticks=np.arange(values.shape[0]), xlabel="query head", ylabel="layer")
    ax.grid(False)
    fig.colorbar(image, ax=ax, label=colour_label)


def sweep_figure(path, title, result, T):
    """Entropy against log2 s, a panel per layer and a line per head, and the loss against log2 s."""
    scales, entropy, loss = result["scales"], result["entropy"], result["loss"]
    L, H = entropy.shape[1:]
    shown = scales > 0  # s = 0 has no logarithm: it is the uniform line
    x = np.log2(scales[shown])
    cols = min(4, L + 1)
    rows = -(-(L + 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), constrained_layout=True, squeeze=False,
                             sharex=True)
    uniform = np.log(np.arange(1, T + 1)).mean()  # mean_t ln(t + 1): every row uniform over its past
    for l, ax in enumerate(axes.flat[:L]):
        for h in range(H):
            ax.plot(x, entropy[shown, l, h], marker="o", markersize=3.5, label=f"head {h}")
        ax.axhline(uniform, color="0.35", linestyle=":", label="uniform (s = 0)")
        ax.set(title=f"layer {l}", ylabel="attention entropy (nats)")
    axes.flat[0].legend(fontsize=8)
    axes.flat[L].plot(x, loss[shown], color="black", marker="o", markersize=3.5)
    axes.flat[L].set(title="loss", ylabel="validation loss (nats)")
    for ax in axes.flat[L + 1:]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("log2 s (attention logits times s)")
    fig.suptitle(title)
    save(fig, path)


def svd_figure(path, title, result):
    """Heatmaps of the effective rank and the mean principal cosine, and the singular value spectra."""
    sv = result["singular_values"]
    L, H, D = sv.shape
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    heatmap(fig, axes[0], result["effective_rank"], "effective rank of M_h", "{:.1f}", cmap="viridis", vmin=1, vmax=D)
    axes[0].set_title("effective rank of W_Q,h^T W_K (gains in)")
    heatmap(fig, axes[1], result["cos_mean"], "mean cosine", "{:.2f}", cmap="magma", vmin=0, vmax=1)
    axes[1].set_title(f"principal angles of the query and key row spaces\n(mean cosine; random weights: "
                      f"{result['chance_cos_mean']:.3f})")
    colours = plt.cm.viridis(np.linspace(0, 0.9, L))
    for l in range(L):
        for h in range(H):
            axes[2].semilogy(np.arange(1, D + 1), sv[l, h] / sv[l, h, 0], color=colours[l], linewidth=1,
                             label=f"layer {l}" if h == 0 else None)
    axes[2].set(xlabel="index i", ylabel="sigma_i / sigma_1", title="singular values, a line per head")
    axes[2].legend(fontsize=8)
    fig.suptitle(title)
    save(fig, path)


def ablate_figure(path, title, result):
    """The loss increase of each head, zeroed and mean-ablated, on one colour scale."""
    increases = (result["increase"], result["mean_increase"])
    bound = max(max(np.abs(v).max() for v in increases), 1e-12)
    L, H = result["increase"].shape
    fig, axes = plt.subplots(1, 2, figsize=(2 * max(5.0, 1.1 * H + 2.5), max(3.5, 0.45 * L + 1.5)),
                             constrained_layout=True)
    for ax, values, how in zip(axes, increases, ("zeroed", "replaced by its mean")):
        heatmap(fig, ax, values, "loss increase (nats)", "{:+.3f}", cmap="RdBu_r", vmin=-bound, vmax=bound)
        ax.set_title(f"one head's output {how}")
    fig.suptitle(f"{title}\nintact loss {result['loss']:.4f} ± {result['loss_se']:.4f} over "
                 f"{result['sequences']} sequences")
    save(fig, path)


def pattern_figure(path, title, att, pieces):
    n = len(pieces)
    fig, ax = plt.subplots(figsize=(max(5.5, 0.28 * n + 2.5), max(5.0, 0.28 * n + 2)), constrained_layout=True)
    image = ax.imshow(att, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(np.arange(n), pieces, rotation=90, fontsize=8 if n <= 40 else 5)
    ax.set_yticks(np.arange(n), pieces, fontsize=8 if n <= 40 else 5)
    ax.set(xlabel="key (attended) token", ylabel="query token", title=title)
    ax.grid(False)
    fig.colorbar(image, ax=ax, label="attention probability")
    save(fig, path)


# -- command line ------------------------------------------------------------------------------------

def scale_list(text):
    """'1,0.5,2' -> [0.5, 1.0, 2.0]: finite numbers >= 0, in increasing order."""
    try:
        scales = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not all(math.isfinite(s) and s >= 0 for s in scales):
        raise argparse.ArgumentTypeError(f"{text!r}: every scale must be a finite number >= 0")
    return sorted(set(scales))


def data_batches(args, c):
    """The batches the options ask for, on --device, and their sequence length."""
    T = args.seq_len or c.max_seq_len
    if T > c.max_seq_len:
        raise ProbeError(f"--seq-len {T}: longer than the checkpoint's max_seq_len {c.max_seq_len}")
    if args.batches is None:
        batches = evaluation_batches(args.data, args.batch, T, c.vocab_size)
    else:
        batches = validation_batches(args.data, args.batches, args.batch, T, c.vocab_size)
    return [(tokens.to(args.device), targets.to(args.device)) for tokens, targets in batches], T


def checked_device(name):
    """--device: "cpu", or "cuda" where this PyTorch has a CUDA device."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ProbeError("--device cuda: this PyTorch has no CUDA device (use --device cpu)")
    return name


def output_path(args, probe):
    out = args.out or os.path.dirname(os.path.abspath(args.checkpoint))
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, f"{os.path.splitext(os.path.basename(args.checkpoint))[0]}_{probe}.png")


def tokens_used(batches):
    """'16 x 2 x 512 = 16384 tokens, 32 sequences': what the losses were evaluated on."""
    n, (B, T) = len(batches), batches[0][0].shape
    return f"{n} x {B} x {T} = {n * B * T} tokens, {n * B} sequences"


def print_table(columns, rows):
    """Right-aligned columns as wide as their longest entry; floats with 4 decimals."""
    cells = [columns] + [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print(" ".join(cell.rjust(width) for cell, width in zip(row, widths)))


def finish(args, probe, figure_path, result):
    """Writes --json (NaN as null) and says where the files went."""
    print(f"wrote {figure_path}")
    if args.json:
        document = {"probe": probe, "checkpoint": args.checkpoint}
        for name, value in result.items():
            array = np.asarray(value)
            document[name] = (np.where(np.isnan(array), None, array) if array.dtype.kind == "f" else array).tolist()
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
        print(f"wrote {args.json}")


def command_sweep(args):
    c, params = load_checkpoint(args.checkpoint, checked_device(args.device))
    batches, T = data_batches(args, c)
    r = sweep(params, c, batches, args.scale)
    one = r["loss"][list(args.scale).index(1)] if 1 in args.scale else None
    for s, loss, se in zip(r["scales"], r["loss"], r["loss_change_se"]):
        change = f" ({plus_minus(loss - one, se)} against s = 1)" if one is not None and s != 1 else ""
        print(f"s = {s:g}: validation loss {loss:.4f}{change}")
    print(f"{tokens_used(batches)}; ± one standard error over the sequences")
    print_table(["s", "layer", "head", "entropy", "maxp", "|logit|"],
                [[f"{r['scales'][i]:g}", l, h, entropy, r["maxp"][i, l, h], r["score_abs"][i, l, h]]
                 for (i, l, h), entropy in np.ndenumerate(r["entropy"])])
    path = output_path(args, "sweep")
    sweep_figure(path, f"{args.checkpoint}: attention logits times s ({tokens_used(batches)})", r, T)
    finish(args, "sweep", path, dict(r, batches=len(batches), batch=args.batch, seq_len=T))


def command_svd(args):
    c, params = load_checkpoint(args.checkpoint)
    r = svd_probe(params, c)
    top = min(args.top, c.head_dim)
    columns = ["cos_mean", "cos_max", "qk|cos|", "qk|cos|max", "qk_diag"]
    print_table(["layer", "head", "kv"] + [f"sigma_{i + 1}" for i in range(top)] + ["erank"] + columns,
                [[l, h, h // (c.n_head // c.n_kv_head)] + list(r["singular_values"][l, h, :top]) +
                 [erank] + [r[name][l, h] for name in COSINE_STATISTICS]
                 for (l, h), erank in np.ndenumerate(r["effective_rank"])] +
                [["chance", "", ""] + [""] * top + [""] + [r[f"chance_{name}"] for name in COSINE_STATISTICS]])
    print(f"chance: the mean over {CHANCE_DRAWS} heads of random weights (W_Q, W_K of {c.head_dim} x {c.d_model} "
          "standard normal entries): the cosines of unrelated subspaces of these sizes; mean principal cosine "
          f"{r['chance_cos_mean']:.4f} ± {r['chance_cos_mean_se']:.4f}, observed over the heads "
          f"{np.nanmean(r['cos_mean']):.4f}")
    path = output_path(args, "svd")
    svd_figure(path, f"{args.checkpoint}: the score form W_Q,h^T diag(g_q g_k) W_K of each head", r)
    finish(args, "svd", path, r)


def command_ablate(args):
    c, params = load_checkpoint(args.checkpoint, checked_device(args.device))
    batches, T = data_batches(args, c)
    r = ablate(params, c, batches)
    print(f"intact validation loss {r['loss']:.4f} ± {r['loss_se']:.4f} ({tokens_used(batches)})")
    print_table(["layer", "head", "zeroed", "± se", "mean", "± se"],
                [[l, h, v, r["increase_se"][l, h], r["mean_increase"][l, h], r["mean_increase_se"][l, h]]
                 for (l, h), v in np.ndenumerate(r["increase"])])
    print("the loss increase with the head's output zeroed, and replaced by its mean over these tokens; "
          "± one standard error over the sequences")
    top = zip(*np.unravel_index(np.argsort(-r["increase"], axis=None)[:5], r["increase"].shape))
    print("the heads the loss needs most: " +
          ", ".join(f"layer {l} head {h} ({plus_minus(r['increase'][l, h], r['increase_se'][l, h])})" for l, h in top))
    path = output_path(args, "ablate")
    ablate_figure(path, args.checkpoint, r)
    finish(args, "ablate", path, dict(r, batches=len(batches), batch=args.batch, seq_len=T))


def command_pattern(args):
    c, params = load_checkpoint(args.checkpoint)
    ids, pieces = encode(args.tokenizer or os.path.join(args.data, "tokenizer.model"), args.text, c)
    att = attention_pattern(params, c, ids, args.layer, args.head)
    top = att.argmax(axis=1)
    print_table(["t", "query", "j", "most attended", "p"],
                [[t, repr(pieces[t]), j, repr(pieces[j]), float(att[t, j])] for t, j in enumerate(top)])
    path = output_path(args, f"pattern_L{args.layer}_H{args.head}")
    pattern_figure(path, f"{args.checkpoint}: layer {args.layer}, head {args.head}", att, pieces)
    finish(args, "pattern", path, {"layer": args.layer, "head": args.head, "tokens": ids, "pieces": pieces,
                                   "attention": att, "most_attended": top})


def command_line():
    parser = ArgumentParser(description="Probes of a checkpoint's attention heads.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared = ArgumentParser(add_help=False)
    shared.add_argument("checkpoint", metavar="CKPT", help="a checkpoint of ./train")
    shared.add_argument("--out", metavar="DIR", help="folder of the figure (default: the checkpoint's)")
    shared.add_argument("--json", metavar="PATH", help="also write the table's numbers here as JSON")
    shared.add_argument("--data", metavar="DIR", default=DEFAULT_DATA,
                        help="folder of val_*.bin and tokenizer.model (default: data/brown of the repository)")
    data = ArgumentParser(add_help=False)
    data.add_argument("--batches", type=positive_int,
                      help=f"validation batches (default: as many as hold {EVAL_TOKENS} tokens)")
    data.add_argument("--batch", type=positive_int, default=2, help="sequences per batch (default 2)")
    data.add_argument("--seq-len", type=positive_int, help="tokens per sequence (default: max_seq_len)")
    data.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                      help="where PyTorch computes, in float64 (default cpu; cuda for models the size of d22)")
    sweep_parser = commands.add_parser("sweep", parents=[shared, data], help="attention logits times s")
    sweep_parser.add_argument("--scale", type=scale_list, default=[0.25, 0.5, 1.0, 2.0, 4.0],
                              help="comma-separated factors s >= 0 (default 0.25,0.5,1,2,4)")
    svd_parser = commands.add_parser("svd", parents=[shared], help="singular values of the heads' score forms")
    svd_parser.add_argument("--top", type=positive_int, default=4, help="singular values in the table (default 4)")
    commands.add_parser("ablate", parents=[shared, data], help="the loss with each head zeroed, and mean-ablated")
    pattern_parser = commands.add_parser("pattern", parents=[shared], help="one head's attention on a text")
    pattern_parser.add_argument("--text", required=True, help="the text to run")
    pattern_parser.add_argument("--layer", type=int, required=True)
    pattern_parser.add_argument("--head", type=int, required=True, help="the query head")
    pattern_parser.add_argument("--tokenizer", metavar="PATH",
                                help="SentencePiece model (default: tokenizer.model in --data)")
    return parser


COMMANDS = {"sweep": command_sweep, "svd": command_svd, "ablate": command_ablate, "pattern": command_pattern}


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    return run(lambda args: COMMANDS[args.command](args), command_line().parse_args, argv)
