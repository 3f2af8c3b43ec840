"""Tests of scripts/probe.py: its numbers against the statistics test/reference.py computes from their
definitions, against derivations by hand and against explicitly formed matrices; and its command
line end to end, on a validation shard and a tokenizer written here.

    /usr/bin/python3 -m pytest -q test/test_probe.py

The checkpoint is the reference's trained state (3 layers, 4 query heads reading 2 kv heads, D = 64,
vocabulary 320, T = 64) from build/ref, which make test writes; without it the reference runs into a
temporary folder first (about 10 s).
"""
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import reference
from attnlog import commands, probe
from attnlog.model_torch import Config, forward, init_params
from tolerance import assert_close, assert_within, close

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = ROOT / "scripts" / "probe.py"
SCALES = [0, 0.25, 0.5, 1, 2, 4]
SENTENCES = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
             "all that glitters is not gold", "the early bird catches the worm", "actions speak louder than words"]


def write_shard(path, ids, version=1):
    """A token shard as llmc/dataloader.h reads it: 256 int32 (magic, version, count, zeros), the ids."""
    header = np.zeros(256, "<i4")
    header[:3] = [20240520, version, len(ids)]
    Path(path).write_bytes(header.tobytes() + np.asarray(ids, {1: "<u2", 2: "<u4"}[version]).tobytes())


# -- fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory):
    built = ROOT / "build" / "ref"
    if (built / "trained.ckpt").exists() and (built / "debug_trained.bin").exists():
        return built
    out = tmp_path_factory.mktemp("ref")
    subprocess.run([sys.executable, str(ROOT / "test" / "reference.py"), "--out", str(out)], check=True,
                   capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")))
    return out


@pytest.fixture(scope="module")
def checkpoint(ref_dir):
    return str(ref_dir / "trained.ckpt")


@pytest.fixture(scope="module")
def trained(checkpoint):
    return probe.load_checkpoint(checkpoint)


@pytest.fixture(scope="module")
def logged(ref_dir):
    """The reference's batch, loss and statistics of the trained state, from their definitions."""
    return reference.read_tensorfile(ref_dir / "debug_trained.bin")


@pytest.fixture(scope="module")
def batch(logged):
    return [(torch.from_numpy(logged["tokens"]).long(), torch.from_numpy(logged["targets"]).long())]


@pytest.fixture(scope="module")
def swept(trained, batch):
    c, params = trained
    return probe.sweep(params, c, batch, SCALES)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, logged):
    """A validation shard of the reference's structured tokens (ids < 320) and a SentencePiece model
    of 60 pieces (within the checkpoint's vocabulary), as --data expects them."""
    import sentencepiece
    folder = tmp_path_factory.mktemp("data")
    write_shard(folder / "val_000000.bin", np.tile(logged["tokens"].ravel(), 3))
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 20), model_writer=model,
                                             vocab_size=60, hard_vocab_limit=False, model_type="bpe", unk_id=0,
                                             bos_id=1, eos_id=2, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return folder


# -- sweep -----------------------------------------------------------------------------------------------

def test_sweep_at_scale_one_is_the_logged_telemetry(swept, logged):
    # Both are float64 forward passes of the same weights (the sweep scales the logits itself,
    # the reference forms the full attention matrix): the same numbers up to float64 rounding
    # (1e-16), which three layers of sharp attention (scores up to 9.6) amplify to a few 1e-12.
    # 1e-10 relative leaves thirty times that, and is far below what a wrong scale or gain moves.
    one = SCALES.index(1)
    assert_close(swept["entropy"][one], logged["stat.attn_entropy"], rtol=1e-10)
    assert_close(swept["maxp"][one], logged["stat.attn_maxp"], rtol=1e-10)
    assert swept["loss"][one] == close(logged["loss"][0], rtol=1e-10)


def test_sweep_at_scale_zero_is_uniform_causal_attention(swept):
    # Every logit 0: row t spreads 1/(t+1) over its t+1 positions, entropy ln(t+1), peak 1/(t+1).
    T = 64
    entropy = math.fsum(math.log(t + 1) for t in range(T)) / T  # 3.2057531169...
    peak = math.fsum(1 / (t + 1) for t in range(T)) / T
    # Exact logits (all 0): float64 sums of 64 terms, a few 1e-16 relative; 1e-12 leaves room.
    assert_close(swept["entropy"][0], entropy, rtol=1e-12)
    assert_close(swept["maxp"][0], peak, rtol=1e-12)
    assert np.all(swept["score_abs"][0] == 0)


def test_sweep_logit_size_is_linear_in_the_scale(swept):
    # Exactly so in layer 0, whose input the scale cannot reach; the deeper layers read what the
    # scaled attention of the layers below wrote, so their logits change by more than the factor.
    one = swept["score_abs"][SCALES.index(1)]
    assert np.all(one > 0)
    # One float64 multiplication apart (s is a power of two or 0: exact): 1e-12 leaves room for a
    # scale applied before a sum rather than after.
    for s, score_abs in zip(SCALES, swept["score_abs"]):
        assert_close(score_abs[0], s * one[0], rtol=1e-12)
    # ...and the deeper layers are off by more than 1e-3 (a difference, not a tolerance).
    assert not np.allclose(swept["score_abs"][-1, 1:], 4 * one[1:], rtol=1e-3)


def test_sweep_entropy_falls_as_the_scale_grows(swept):
    # d/ds of the entropy of softmax(s x) is -s Var_p(x): negative for s > 0 unless x is constant.
    assert np.all(np.diff(swept["entropy"], axis=0) < 0)
    assert np.all(np.diff(swept["maxp"], axis=0) > 0)


def test_sweep_leaves_a_head_of_constant_logits_uniform(trained, batch, swept):
    # With its W_Q rows zero, head 1 of layer 0 scores every key 0 at every scale.
    c, params = trained
    flat = dict(params)
    flat["layers.0.wq"] = params["layers.0.wq"].clone()
    flat["layers.0.wq"][64:128] = 0
    result = probe.sweep(flat, c, batch, SCALES)
    # Logits exactly 0 at every scale: the uniform rows of scale 0, up to a few 1e-16.
    assert_close(result["entropy"][:, 0, 1], swept["entropy"][0, 0, 1], rtol=1e-12)
    assert np.all(np.diff(result["entropy"][:, 0, 0]) < 0)


# -- svd -------------------------------------------------------------------------------------------------

def tiny_params(qk_norm="gain"):
    """One kv head of D = 2 read by two query heads, C = 4, in two layers. e1..e4 are the unit vectors of
    the residual stream; every W_K is [e1; e2]."""
    c = Config(vocab_size=8, n_layer=2, n_head=2, n_kv_head=1, head_dim=2, d_ff=4, max_seq_len=4, qk_norm=qk_norm)
    params = {name: t.double() for name, t in init_params(c, 0).items()}
    r = 1 / math.sqrt(2)
    rows = {0: [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
            1: [[1, 0, 0, 0], [0, r, r, 0], [0, 0, 0, 2], [-1, -1, 0, 0]]}
    for l in (0, 1):
        params[f"layers.{l}.wq"] = torch.tensor(rows[l], dtype=torch.float64)
        params[f"layers.{l}.wk"] = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64)
    params["layers.0.q_gain"] = torch.tensor([3.0, 1.0], dtype=torch.float64)
    params["layers.0.k_gain"] = torch.tensor([2.0, 1.0], dtype=torch.float64)
    return c, params


def erank(*sv):
    p = np.array(sv) / sum(sv)
    return math.exp(-(p * np.log(p)).sum())


def test_svd_of_a_hand_built_model():
    c, params = tiny_params()
    result = probe.svd_probe(params, c)
    r = 1 / math.sqrt(2)
    # Layer 0, gains g_q = (3, 1), g_k = (2, 1).
    #   head 0, W_Q = W_K: M = W_K^T diag(6, 1) W_K, singular values (6, 1), effective rank
    #     exp(ln 7 - (6/7) ln 6) = 1.50699; the same row space: principal cosines (1, 1); the row
    #     cosines are the identity: mean |cos| 2/4, max 1, diagonal mean 1.
    #   head 1, W_Q = [e3; e4]: M = 6 e3 e1^T + e4 e2^T, singular values (6, 1) again, but the row
    #     spaces are orthogonal: principal cosines (0, 0), every row cosine 0.
    # Layer 1, gains 1.
    #   head 0, W_Q = [e1; (e2 + e3)/sqrt 2]: M maps e1 to e1 and e2 to (e2 + e3)/sqrt 2, so its
    #     singular values are (1, 1), blind to the tilt, which the principal cosines (1, 1/sqrt 2)
    #     and the row cosines diag(1, 1/sqrt 2) show.
    #   head 1, W_Q = [2 e4; -e1 - e2]: M^T M = 4 e1 e1^T + 2 e2 e2^T, singular values (2, sqrt 2);
    #     the spans share (e1 + e2)/sqrt 2 and e4 is orthogonal to both of W_K's rows: cosines (1, 0);
    #     row cosines [[0, 0], [-r, -r]] with r = 1/sqrt 2: mean |cos| r/2, max r, diagonal mean -r/2.
    expected = {
        (0, 0): ([6, 1], [1, 1], (0.5, 1, 1)),
        (0, 1): ([6, 1], [0, 0], (0, 0, 0)),
        (1, 0): ([1, 1], [1, r], ((1 + r) / 4, 1, (1 + r) / 2)),
        (1, 1): ([2, math.sqrt(2)], [1, 0], (r / 2, r, -r / 2)),
    }
    # The helper against the decimal expansion: a few float64 operations, 1e-15 relative.
    assert erank(6, 1) == close(1.5069930657725379, rtol=1e-15)
    # Matrices of small integers and 1/sqrt 2: float64 SVDs and QRs of 4 x 4 matrices are backward
    # stable, within ~10 u64 (2e-15) of the exact values relative to the largest singular value (6);
    # 1e-12 relative and absolute leaves a hundred times that. A swapped gain or row errs by 0.1 or more.
    for (l, h), (sv, cosines, row_cos) in expected.items():
        assert_close(result["singular_values"][l, h], sv, rtol=1e-12, atol=1e-12)
        assert result["effective_rank"][l, h] == close(erank(*sv), rtol=1e-12)
        assert_close(result["principal_cosines"][l, h], cosines, atol=1e-12)
        assert result["cos_mean"][l, h] == close(np.mean(cosines), atol=1e-12)
        assert result["cos_max"][l, h] == close(max(cosines), atol=1e-12)
        got = [result[name][l, h] for name in ("qk_row_cos_abs_mean", "qk_row_cos_abs_max", "qk_row_cos_diag_mean")]
        assert_close(got, row_cos, atol=1e-12)


def test_svd_without_gains_ignores_the_stored_gains():
    # --qk-norm plain holds the gains at 1 whatever the checkpoint stores: layer 0's heads have (1, 1).
    c, params = tiny_params("plain")
    # As above: float64 SVDs of small exact matrices.
    assert_close(probe.svd_probe(params, c)["singular_values"][0], [[1, 1], [1, 1]], rtol=1e-12)


def test_svd_of_the_trained_model_matches_the_explicit_matrix(trained):
    c, params = trained
    result = probe.svd_probe(params, c)
    D, group = c.head_dim, c.n_head // c.n_kv_head
    for l in range(c.n_layer):
        g_q, g_k = params[f"layers.{l}.q_gain"], params[f"layers.{l}.k_gain"]
        for h in range(c.n_head):
            A = g_q[:, None] * params[f"layers.{l}.wq"][h * D:(h + 1) * D]
            B = g_k[:, None] * params[f"layers.{l}.wk"][h // group * D:(h // group + 1) * D]
            M = A.T @ B  # [C, C], of rank D
            sv = torch.linalg.svdvals(M).numpy()
            # Two float64 routes to the singular values (the probe's D x D factors, the explicit
            # C x C product): each backward stable, within ~C u64 sigma_1 = 3e-14 sigma_1 in absolute
            # terms, so the smallest of 64 (here 8e-3 sigma_1) within ~4e-12 relative; 1e-9 relative.
            assert_close(result["singular_values"][l, h], sv[:D], rtol=1e-9)
            # M has rank D: the rest is rounding, ~C u64 = 3e-14 of sigma_1.
            assert_within(sv[D:].max(), 1e-12 * sv[0], "singular values of M beyond D")
            assert result["effective_rank"][l, h] == close(reference.effective_rank(M), rtol=1e-9)
            # Principal cosines the textbook way: orthonormal bases by QR, the singular values of their product.
            # Cosines of O(1) from orthonormal bases: absolute errors of ~D u64; 1e-9 leaves room.
            cosines = torch.linalg.svdvals(torch.linalg.qr(A.T)[0].T @ torch.linalg.qr(B.T)[0]).numpy()
            assert_close(result["principal_cosines"][l, h], cosines, atol=1e-9)


def test_chance_of_one_dimension_is_the_mean_cosine_of_random_directions():
    # D = 1: each statistic is |cos| of two independent random directions of R^C (the diagonal mean
    # its sign-keeping cosine), whose mean is Gamma(C/2) / (sqrt(pi) Gamma((C+1)/2)) exactly:
    # 32 / (35 pi) = 0.29103 for C = 8.
    C = 8
    exact = math.exp(math.lgamma(C / 2) - math.lgamma((C + 1) / 2)) / math.sqrt(math.pi)
    assert exact == close(32 / (35 * math.pi), rtol=1e-14)
    chance = probe.chance_cosines(1, C, draws=10000)
    # A Monte Carlo mean of 10000 draws: within 4 of its standard errors, 0.0022 (the seed is fixed;
    # a wrong dimension, 7 or 9, moves the mean by about 0.02, nine standard errors).
    for name in ("cos_mean", "cos_max", "qk_row_cos_abs_mean", "qk_row_cos_abs_max"):
        assert abs(chance[name] - exact) < 4 * chance[f"{name}_se"], (name, chance[name], exact)
    assert abs(chance["qk_row_cos_diag_mean"]) < 4 * chance["qk_row_cos_diag_mean_se"]
    assert chance["cos_mean_se"] < 0.005


def test_chance_of_subspaces_that_fill_the_space_is_one():
    # D = C: both row spaces are the whole space, every principal cosine 1 (up to float64 rounding).
    chance = probe.chance_cosines(4, 4, draws=20)
    assert chance["cos_mean"] == close(1.0, rtol=1e-12) and chance["cos_max"] == close(1.0, rtol=1e-12)


def wachter_mean_cosine(a, b, points=20000):
    """The mean cosine of the principal angles between random subspaces of a n and b n dimensions
    (a <= b, a + b <= 1) as n grows: Wachter's law of their squared cosines, density
    sqrt((x - lo)(hi - x)) / (2 pi a x (1 - x)) on [lo, hi], lo and hi = (sqrt(a(1-b)) -/+ sqrt(b(1-a)))^2;
    integrated over x = mid - half cos(theta), which takes the square roots at the ends away."""
    lo, hi = ((math.sqrt(a * (1 - b)) + sign * math.sqrt(b * (1 - a))) ** 2 for sign in (-1, 1))
    theta = (np.arange(points) + 0.5) * math.pi / points  # the midpoint rule
    x = (lo + hi) / 2 - (hi - lo) / 2 * np.cos(theta)
    density_dx = ((hi - lo) / 2 * np.sin(theta)) ** 2 / (2 * math.pi * a * x * (1 - x))
    return float(np.sum(np.sqrt(x) * density_dx) * math.pi / points)


def test_chance_of_64_of_256_dimensions_is_wachters_law():
    # The limit of large C of the mean principal cosine of random 64- and 64-dimensional subspaces of
    # a 256-dimensional space, 0.43599; the chance baseline, by 200 random heads, lies within 0.002
    # of it: its Monte Carlo standard error is 0.0003, and the mean at C = 256 differs from the limit
    # by less than 0.001 (0.4356 +- 0.0003 measured with 50 draws at C = 256 and at C = 512).
    assert wachter_mean_cosine(0.25, 0.25) == close(0.43599, atol=1e-5)
    chance = probe.chance_cosines(64, 256)
    assert abs(chance["cos_mean"] - wachter_mean_cosine(0.25, 0.25)) < 0.002
    assert chance["cos_mean_se"] < 0.001


def test_svd_reports_the_chance_of_the_heads_shape(trained):
    c, params = trained
    result = probe.svd_probe(params, c)
    chance = probe.chance_cosines(c.head_dim, c.d_model)
    for name in probe.COSINE_STATISTICS:
        assert result[f"chance_{name}"] == chance[name] and result[f"chance_{name}_se"] == chance[f"{name}_se"]


# -- ablate ----------------------------------------------------------------------------------------------

def test_ablate(trained, batch, logged):
    c, params = trained
    result = probe.ablate(params, c, batch)
    # float64 forward passes of the same weights (as in the sweep above): a few 1e-12 relative.
    assert result["loss"] == close(logged["loss"][0], rtol=1e-10)
    assert result["increase"].shape == (c.n_layer, c.n_head)
    assert np.all(result["increase"] != 0)
    # Zeroing a head's output is zeroing its columns of wo: the same loss.
    D = c.head_dim
    cut = dict(params)
    cut["layers.1.wo"] = params["layers.1.wo"].clone()
    cut["layers.1.wo"][:, 2 * D:3 * D] = 0
    # The same float64 loss computed twice and a difference of losses of ~2.5: its absolute error,
    # ~1e-15, is relative to an increase of ~1e-2 at worst, ~1e-13; 1e-9 relative.
    assert probe.mean_loss(cut, c, batch) - result["loss"] == close(result["increase"][1, 2], rtol=1e-9)
    # A head whose output projection is already zero has nothing left to remove, zeroed or mean-ablated.
    again = probe.ablate(cut, c, batch)
    assert again["increase"][1, 2] == 0.0 and again["mean_increase"][1, 2] == 0.0


def test_pass_from_a_layer_is_the_whole_pass(trained, batch):
    """forward from layer l's input (start) gives the whole pass's logits bit for bit, with head 1 of
    layer l ablated too: what ablate relies on when it skips the layers before the ablated one."""
    c, params = trained
    tokens, _ = batch[0]
    inputs = {}
    with torch.no_grad():
        whole = forward(params, c, tokens, inputs=inputs)[0]
        assert sorted(inputs) == list(range(c.n_layer))
        for l in range(c.n_layer):
            assert torch.equal(forward(params, c, tokens, start=(l, inputs[l]))[0], whole)
            cut = {(l, 1): torch.zeros(c.head_dim, dtype=torch.float64)}
            ablated = forward(params, c, tokens, ablate=cut)[0]
            assert not torch.equal(ablated, whole)
            assert torch.equal(forward(params, c, tokens, start=(l, inputs[l]), ablate=cut)[0], ablated)


def constant_head_model():
    """Random weights of 2 layers of 2 heads (one kv head each, D = 4, C = 8) whose embeddings all have
    the norm sqrt(C) and first coordinate 1: layer 0's normed input has first coordinate
    kappa = attn_norm[0] / sqrt(1 + eps) at every token. Head 0 of layer 0 reads only that
    coordinate (its W_V is u e1^T): its values, and so its output, are u kappa at every position.
    (config, params, kappa, batches of random tokens)."""
    c = Config(vocab_size=16, n_layer=2, n_head=2, n_kv_head=2, head_dim=4, d_ff=8, max_seq_len=8)
    params = {name: t.double() for name, t in init_params(c, 3).items()}
    generator = torch.Generator().manual_seed(5)
    rest = torch.randn(16, 7, generator=generator, dtype=torch.float64)
    params["wte"] = torch.cat([torch.ones(16, 1, dtype=torch.float64),
                               rest / rest.norm(dim=1, keepdim=True) * math.sqrt(7)], dim=1)
    params["layers.0.attn_norm"] = torch.linspace(0.5, 1.5, 8, dtype=torch.float64)
    kappa = params["layers.0.attn_norm"][0].item() / math.sqrt(1 + c.norm_eps)
    params["layers.0.wv"] = params["layers.0.wv"].clone()
    params["layers.0.wv"][0:4] = 0
    params["layers.0.wv"][0:4, 0] = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    batches = [(torch.randint(0, 16, (2, 8), generator=generator), torch.randint(0, 16, (2, 8), generator=generator))
               for _ in range(3)]
    return c, params, kappa, batches


def test_mean_ablation_of_a_constant_head_changes_nothing():
    # Head 0 of layer 0 writes the same vector at every position: its mean is that vector, so
    # mean-ablation leaves the model as it was, while zeroing it, as zeroing its W_V rows does, removes it.
    c, params, _, batches = constant_head_model()
    result = probe.ablate(params, c, batches)
    # The mean of 48 equal vectors is the vector to within a few u64 (1e-16 of values of ~5): the
    # loss, ~7, moves by ~1e-15 at most; 1e-12 absolute. Zeroing moves it by 0.018.
    assert abs(result["mean_increase"][0, 0]) < 1e-12 and abs(result["mean_increase_se"][0, 0]) < 1e-12
    assert abs(result["increase"][0, 0]) > 1e-3
    silent = dict(params, **{"layers.0.wv": params["layers.0.wv"].clone()})
    silent["layers.0.wv"][0:4] = 0
    # Two float64 routes to the same zero output: the same losses but for rounding, 1e-12 absolute.
    assert probe.mean_loss(silent, c, batches) - result["loss"] == close(result["increase"][0, 0], atol=1e-12)


def test_mean_ablation_is_the_head_writing_its_mean():
    # Head 1 of layer 0 made to write its mean m at every position through the constant coordinate
    # (W_V = m e1^T / kappa) gives the mean-ablated loss, computed the other way.
    c, params, kappa, batches = constant_head_model()
    result = probe.ablate(params, c, batches)
    m = probe.head_means(params, c, batches)[0, 1]
    taps, total = {}, torch.zeros(4, dtype=torch.float64)
    for tokens, _ in batches:  # the mean from its definition: the head's outputs summed over 3 x 2 x 8 positions
        forward(params, c, tokens, taps=taps)
        total += taps[0]["y"][:, 1].sum((0, 1))
    assert_close(m.numpy(), (total / 48).numpy(), rtol=1e-14, atol=1e-15)  # the same sum, maybe in another order
    constant = dict(params, **{"layers.0.wv": params["layers.0.wv"].clone()})
    constant["layers.0.wv"][4:8] = 0
    constant["layers.0.wv"][4:8, 0] = m / kappa
    # Two float64 routes (the vector put in, the vector made by the weights, one rounding apart):
    # losses of ~7 that agree to ~1e-15; 1e-12 absolute against an increase of ~2e-4.
    assert probe.mean_loss(constant, c, batches) - result["loss"] == close(result["mean_increase"][0, 1], atol=1e-12)
    assert abs(result["mean_increase"][0, 1]) > 1e-5


def test_ablation_standard_errors_are_those_of_the_sequences():
    # Each sequence on its own (a batch of one, forward's own loss): the increase is the mean of the
    # per-sequence differences, its standard error their standard deviation over sqrt(6).
    c, params, _, batches = constant_head_model()
    result = probe.ablate(params, c, batches)
    means = probe.head_means(params, c, batches)
    sequences = [(tokens[i:i + 1], targets[i:i + 1]) for tokens, targets in batches for i in range(2)]
    loss = lambda x, y, **options: forward(params, c, x, y, **options)[1].item()  # noqa: E731
    intact = np.array([loss(x, y) for x, y in sequences])
    assert result["sequences"] == 6 and result["loss"] == close(intact.mean(), rtol=1e-13)
    assert result["loss_se"] == close(intact.std(ddof=1) / math.sqrt(6), rtol=1e-10)
    for l, h in [(0, 1), (1, 0)]:
        for name, fill in (("increase", torch.zeros(4, dtype=torch.float64)), ("mean_increase", means[l, h])):
            change = np.array([loss(x, y, ablate={(l, h): fill}) for x, y in sequences]) - intact
            # Means and standard deviations of six float64 differences of ~1e-3 between losses of ~7:
            # ~1e-15 absolute each, relative to increases and deviations of ~1e-4 or more: 1e-9.
            assert result[name][l, h] == close(change.mean(), rtol=1e-9, atol=1e-13)
            assert result[f"{name}_se"][l, h] == close(change.std(ddof=1) / math.sqrt(6), rtol=1e-9)
    one = probe.ablate(params, c, [(batches[0][0][:1], batches[0][1][:1])])
    assert np.isnan(one["loss_se"]) and np.isnan(one["increase_se"]).all()


# -- pattern ---------------------------------------------------------------------------------------------

def test_attention_pattern(trained, logged):
    c, params = trained
    tokens = torch.from_numpy(logged["tokens"][1]).long()
    att = probe.attention_pattern(params, c, tokens, 2, 3)
    # Rows of a float64 softmax over at most 64 keys sum to 1 within ~64 u64 = 1e-14.
    assert_close(att.sum(axis=1), 1, rtol=1e-12)
    assert np.all(np.triu(att, 1) == 0)
    taps = {}
    with torch.no_grad():
        forward(params, c, tokens[None], taps=taps)
    np.testing.assert_array_equal(att, taps[2]["att"][0, 3].numpy())
    with pytest.raises(probe.ProbeError, match="--head 4"):
        probe.attention_pattern(params, c, tokens, 2, 4)


def test_encode_takes_up_to_max_seq_len_tokens(trained, data_dir):
    c, _ = trained
    tokenizer = str(data_dir / "tokenizer.model")
    ids, pieces = probe.encode(tokenizer, " ".join(["the"] * 63), c)
    assert len(ids) == 64 and pieces[0] == "<s>" and set(pieces[1:]) == {"\u2581the"}
    with pytest.raises(probe.ProbeError, match="--text: 65 tokens"):
        probe.encode(tokenizer, " ".join(["the"] * 64), c)


# -- data ------------------------------------------------------------------------------------------------

def test_validation_batches_walk_the_shards_as_the_trainer(tmp_path):
    # B = 2, T = 4: windows of 9 tokens at offsets 0, 8, ...: two in a shard of 20 tokens, one in 9.
    first, second = np.arange(100, 120), np.arange(200, 209)
    write_shard(tmp_path / "val_000000.bin", first, version=2)
    write_shard(tmp_path / "val_000001.bin", second)
    write_shard(tmp_path / "train_000000.bin", np.arange(50))
    batches = probe.validation_batches(str(tmp_path), 3, 2, 4, 320)
    for (tokens, targets), window in zip(batches, [first[0:9], first[8:17], second[0:9]]):
        np.testing.assert_array_equal(tokens.numpy(), window[:-1].reshape(2, 4))
        np.testing.assert_array_equal(targets.numpy(), window[1:].reshape(2, 4))
    with pytest.raises(probe.ProbeError, match="3 windows of B\\*T\\+1 = 9 tokens, fewer than --batches 4"):
        probe.validation_batches(str(tmp_path), 4, 2, 4, 320)
    with pytest.raises(probe.ProbeError, match="val_000000.bin: token id 119 at position 19 is outside"):
        probe.validation_batches(str(tmp_path), 1, 2, 4, 119)
    (tmp_path / "val_000000.bin").write_bytes((tmp_path / "val_000000.bin").read_bytes()[:-1])
    with pytest.raises(probe.ProbeError, match="val_000000.bin: 1103 bytes, but the header says 20 tokens"):
        probe.validation_batches(str(tmp_path), 1, 2, 4, 320)


# -- the command line ------------------------------------------------------------------------------------

def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def assert_png(path):
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"


def test_cli_sweep(checkpoint, trained, data_dir, tmp_path):
    result = run("sweep", checkpoint, "--data", data_dir, "--scale", "2,0.5,1", "--out", tmp_path,
                 "--json", tmp_path / "sweep.json")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": validation loss ")[0] for line in lines[:3]] == ["s = 0.5", "s = 1", "s = 2"]
    assert lines[0].endswith(" against s = 1)") and "against" not in lines[1] and "±" in lines[2]
    # The shard holds 3 x 256 tokens: 5 windows of 2 x 64 + 1, fewer than probe.EVAL_TOKENS, so all of them.
    assert lines[3] == "5 x 2 x 64 = 640 tokens, 10 sequences; ± one standard error over the sequences"
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["s", "layer", "head"])
    assert len([line for line in lines[header + 1:] if not line.startswith("wrote")]) == 3 * 3 * 4
    assert_png(tmp_path / "trained_sweep.png")
    document = json.loads((tmp_path / "sweep.json").read_text())
    assert document["scales"] == [0.5, 1, 2]
    assert (document["batches"], document["batch"], document["seq_len"], document["sequences"]) == (5, 2, 64, 10)
    c, params = trained
    batches = probe.validation_batches(str(data_dir), 5, 2, 64, c.vocab_size)
    # The same float64 computation, written to JSON with 17 significant digits and read back.
    assert document["loss"][1] == close(probe.mean_loss(params, c, batches), rtol=1e-12)
    assert document["loss_change_se"][1] == 0 and document["loss_change_se"][0] > 0


def test_cli_svd(checkpoint, tmp_path):
    result = run("svd", checkpoint, "--out", tmp_path, "--json", tmp_path / "svd.json")
    assert result.returncode == 0, result.stderr
    assert "sigma_1" in result.stdout and "erank" in result.stdout
    lines = result.stdout.splitlines()
    chance = probe.chance_cosines(64, 256)
    # The table's last row: the chance of each cosine column, 4 decimals.
    assert lines[1 + 3 * 4].split() == ["chance"] + [f"{chance[name]:.4f}" for name in probe.COSINE_STATISTICS]
    assert f"mean principal cosine {chance['cos_mean']:.4f} ± {chance['cos_mean_se']:.4f}" in lines[2 + 3 * 4]
    assert_png(tmp_path / "trained_svd.png")
    document = json.loads((tmp_path / "svd.json").read_text())
    assert np.array(document["singular_values"]).shape == (3, 4, 64)
    assert document["chance_cos_mean"] == chance["cos_mean"]


def test_cli_ablate(checkpoint, data_dir, tmp_path):
    result = run("ablate", checkpoint, "--data", data_dir, "--batches", 1, "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("intact validation loss ")
    assert lines[0].endswith(" (1 x 2 x 64 = 128 tokens, 2 sequences)")
    assert lines[1].split() == ["layer", "head", "zeroed", "±", "se", "mean", "±", "se"]
    assert len(lines) == 2 + 3 * 4 + 3  # the table, what it shows, the heads the loss needs most, the figure
    assert lines[-2].startswith("the heads the loss needs most: layer ")
    assert_png(tmp_path / "trained_ablate.png")


def test_cli_pattern(checkpoint, data_dir, tmp_path):
    import sentencepiece
    text = "the lazy dog catches the early bird"
    result = run("pattern", checkpoint, "--data", data_dir, "--text", text, "--layer", 1, "--head", 2,
                 "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert_png(tmp_path / "trained_pattern_L1_H2.png")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(data_dir / "tokenizer.model"))
    pieces = ["<s>"] + sp.encode(text, out_type=str)
    rows = result.stdout.splitlines()[1:1 + len(pieces)]
    assert [row.split()[1] for row in rows] == [repr(piece) for piece in pieces]


@pytest.mark.parametrize("args, names", [
    (["svd", "missing.ckpt"], "missing.ckpt: cannot read"),
    (["sweep", "CKPT", "--data", "no/such/folder"], "no/such/folder: no validation shard (val_*.bin)"),
    (["sweep", "CKPT", "--data", "DATA", "--scale", "1,x"], "--scale: '1,x' is not a comma-separated list"),
    (["sweep", "CKPT", "--data", "DATA", "--scale", "-1"], "--scale: '-1': every scale must be"),
    (["ablate", "CKPT", "--data", "DATA", "--seq-len", "65"], "--seq-len 65: longer than the checkpoint's max_seq_len"),
    (["pattern", "CKPT", "--data", "DATA", "--text", "the dog", "--layer", "3", "--head", "0"], "--layer 3"),
    (["pattern", "CKPT", "--data", "DATA", "--text", "the dog", "--layer", "0", "--head", "-1"], "--head -1"),
    (["pattern", "CKPT", "--data", "DATA", "--text", "", "--layer", "0", "--head", "0"], "--text: empty"),
    (["pattern", "CKPT", "--data", "DATA", "--text", " ".join(SENTENCES * 2), "--layer", "0", "--head", "0"],
     "tokens (BOS included), more than max_seq_len 64"),
    (["pattern", "CKPT", "--tokenizer", "no.model", "--text", "the dog", "--layer", "0", "--head", "0"],
     "no.model: no such file"),
])
def test_cli_errors(args, names, checkpoint, data_dir, capsys):
    argv = [{"CKPT": checkpoint, "DATA": str(data_dir)}.get(a, a) for a in args]
    assert probe.main(argv) == commands.USER_ERROR
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ") and names in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this PyTorch has a CUDA device")
def test_cli_cuda_without_a_device(checkpoint, data_dir, capsys):
    assert probe.main(["ablate", checkpoint, "--data", str(data_dir), "--device", "cuda"]) == commands.USER_ERROR
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --device cuda: this PyTorch has no CUDA device (use --device cpu)\n", err


def test_cli_error_exit_status(tmp_path):
    result = run("sweep", tmp_path / "missing.ckpt")
    assert result.returncode == commands.USER_ERROR
    assert result.stderr == f"error: {tmp_path / 'missing.ckpt'}: cannot read (No such file or directory)\n"
