"""Tests of what the report sets beside the research notes: their claims against the run
(attnlog.claims and its claims.json), the q and k gains against the RoPE wavelength of each
dimension (attnlog.rope), and the figures and captions (attnlog.run_figures, attnlog.figures), on
constructed runs whose right answers are known. The figures are inspected as matplotlib objects.

    /usr/bin/python3 -m pytest -q test/test_claims.py
"""
import json
import math
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection, QuadMesh

from attnlog import analysis, claims, figures, rope, run_figures, summary, verdicts
from attnlog.document import to_markdown
from attnlog.report import run_blocks
from tolerance import close

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT.parent / "shared" / "seeds"  # the research notes, where the repository sits beside them
# Values the tests and the package compute from the same float64 numbers in other orders.
SAME_F64 = dict(rtol=1e-12, atol=1e-12)

# -- a run built from arrays -------------------------------------------------------------------------------

KV_METRICS = {"k_norm": 8.0, "k_maxabs": 2.6, "k_pr": 22.0, "k_cos": 0.1, "k_erank": 40.0, "k_mean_share": 0.2,
              "k_erank_centered": 40.0}
Q_METRICS = {"q_norm": 8.0, "attn_entropy": None, "attn_sink": 0.02, "attn_maxp": 0.1, "attn_logit_max": 5.0}
DIM_METRICS = {"g_q": 1.0, "g_k": 1.0}


def full_run(steps, layers=6, heads=4, kv=2, head_dim=64, seq_len=64, warmup=0, tokens_per_step=10 ** 6,
             theta=10000.0, **given):
    """A run as analysis.load_run returns it, every metric the report reads set from given arrays
    (name=array broadcast to [S, L, cols]) or plain defaults (attn_entropy: 0.8 of uniform attention's);
    the training loss of every step up to the last stats step, one validation loss at its end."""
    steps = np.asarray(steps)
    sizes = {"kv_head": kv, "q_head": heads, "dim": head_dim}
    metrics, columns = {}, {}
    for names, column in ((KV_METRICS, "kv_head"), (Q_METRICS, "q_head"), (DIM_METRICS, "dim")):
        for name, default in names.items():
            value = given.pop(name, 0.8 * analysis.uniform_entropy(seq_len) if default is None else default)
            table = np.broadcast_to(np.asarray(value, float), (len(steps), layers, sizes[column])).copy()
            metrics[name], columns[name] = (steps, table), column
    assert not given, given
    loss_steps = np.arange(int(steps[-1]) + 1)
    return {"path": "constructed.attnlog", "label": "constructed", "problems": [], "notes": [],
            "header": {"created": "2026-01-01T00:00:00Z", "backend": "cpu", "device": "cpu", "seed": 1},
            "config": {"n_layer": layers, "n_head": heads, "n_kv_head": kv, "head_dim": head_dim,
                       "d_model": heads * head_dim, "max_seq_len": seq_len, "rope_theta": theta},
            "options": {"warmup": str(warmup), "seed": "1"}, "step_range": (0, int(steps[-1])),
            "L": layers, "H": heads, "Hkv": kv, "D": head_dim, "metrics": metrics, "columns": columns, "missing": [],
            "loss": (loss_steps, np.linspace(8.0, 5.0, len(loss_steps))), "val": (steps[-1:], np.array([5.5])),
            "stats_steps": steps, "window": analysis.decision_window(steps), "groups": analysis.layer_groups(layers),
            "seq_len": seq_len, "tokens_per_step": tokens_per_step, "init": None,
            "train_tokens": {"tokens": None, "source": "constructed"}, "doc_view": None, "measurement": None,
            "variant": {"qk_norm": "gain", "frozen": []}}


# -- the notes' claims ----------------------------------------------------------------------------------------


def test_claims_file_is_whole_and_quotes_its_notes():
    """Every claim once, citing notes the file lists, with a known statistic and rule; every note has
    a claim; each passage is the note's own words (where the notes are at hand)."""
    data = claims.load_claims()
    ids = [c["id"] for c in data["claims"]]
    assert len(ids) == len(set(ids))
    files = [n["file"] for n in data["notes"]]
    cited = {s["note"] for c in data["claims"] for s in c["sources"]}
    assert cited == set(files)
    for c in data["claims"]:
        assert c["sources"] and all(s["quote"] for s in c["sources"]), c["id"]
        if "not_applicable" in c:
            assert "measures" not in c, c["id"]
            continue
        assert set(c["at"]) <= {"step", "tokens"} and len(c["at"]) == 1 and isinstance(c["dynamics"], bool)
        for m in c["measures"]:
            assert m["statistic"] in claims.STATISTICS, c["id"]
            if "beyond_chance" not in m["rule"]:
                claims.rule_range(m["rule"])  # a rule the module knows
    if not NOTES.is_dir():
        pytest.skip(f"the research notes are not at {NOTES}")
    for c in data["claims"]:
        for s in c["sources"]:
            assert s["quote"] in (NOTES / s["note"]).read_text(encoding="utf-8", errors="replace"), (c["id"], s)


def test_rules():
    def meets(rule, value, **extra):
        return claims.meets(rule, dict(extra, value=value))
    assert meets({"about": 5.3, "relative": 0.1}, 5.83) and not meets({"about": 5.3, "relative": 0.1}, 5.84)
    assert meets({"about": 5.3, "relative": 0.1}, 4.77) and not meets({"about": 5.3, "relative": 0.1}, 4.76)
    assert meets({"between": [9.5, 9.8], "relative": 0.1}, 8.56)
    assert not meets({"between": [9.5, 9.8], "relative": 0.1}, 8.54)
    assert meets({"near": 0.05, "absolute": 0.05}, 0.099) and not meets({"near": 0.05, "absolute": 0.05}, 0.101)
    assert meets({"above": 0.5}, 0.51) and not meets({"above": 0.5}, 0.5)
    assert meets({"below": -0.05}, -0.06) and not meets({"below": -0.05}, -0.05)
    assert meets({"at_least": 1}, 1) and not meets({"at_least": 1}, 0)
    assert meets({"at_most": 0.1}, 0.1) and not meets({"at_most": 0.1}, 0.11)
    assert meets({"beyond_chance": "negative"}, -0.2, chance=0.16)
    assert not meets({"beyond_chance": "negative"}, -0.1, chance=0.16)
    assert not meets({"about": 1, "relative": 1}, math.nan)
    assert claims.rule_text({"about": 5.3, "relative": 0.1}, None) == "within \u00b110% of 5.3 (4.77 to 5.83)"
    assert claims.rule_text({"below": -0.05}, "change") == "below -5%"
    assert claims.rule_text({"at_most": 0.1}, "share") == "at most 10%"


STEPS = np.arange(0, 1001, 10)  # the notes' 1000 steps, a stats step every 10
L22, HEADS22, T22 = 22, 8, 2048


def ramp(start, end, at_100=7.1):
    """[S]: start until step 0, down to at_100 by step 100, to end by step 300, end after."""
    return np.interp(STEPS, [0, 100, 300], [start, at_100, end])


def notes_like_run():
    """A d22-shaped run built to meet the notes' claims (all but the key-gain knob, which excludes the
    focus peak): its numbers, set here, are the claims' right answers."""
    u = analysis.uniform_entropy(T22)
    after = (STEPS >= 300)[:, None, None]
    target = np.empty((L22, HEADS22))
    target[:4] = 5.3  # layers 0-3
    target[4:] = np.linspace(8.6, 9.9, L22 - 4)[:, None]  # layers 4-21 rise with depth
    target += (np.arange(HEADS22) - 3.5) * 0.1  # within each layer, longer keys with the head's index
    target[2, 0] = 5.0  # a gatherer
    target[10] = [3.0] * 4 + [15.0] * 4  # a middle layer whose mean hides sinks and gatherers
    target[15, 0] = 12.0  # a sink
    k_norm = np.stack([ramp(8.0, t) for t in target.ravel()], axis=1).reshape(len(STEPS), L22, HEADS22)
    base = np.interp(np.arange(L22), [0, L22 - 1], [0.8 * u, 0.6 * u])[:, None] - 0.1 * (np.arange(HEADS22) - 3.5)
    base[2, 0], base[15, 0] = 0.9 * u, 0.05 * u
    entropy = np.where(after, base, 0.9 * u)
    sink = np.full((len(STEPS), L22, HEADS22), 0.02)
    sink[STEPS >= 300, 15, 0] = 0.7
    deep = [10, 11, 20, 21]
    maxabs = np.full((len(STEPS), L22, HEADS22), 2.6)
    maxabs[:, deep] = np.where(((STEPS >= 100) & (STEPS < 300))[:, None, None], 9.0,
                               np.where(after, 0.95 * k_norm[:, deep], 2.6))
    cos = np.full((len(STEPS), L22, HEADS22), 0.7)
    cos[:, :2] = 0.05
    pr = np.full((len(STEPS), L22, HEADS22), 24.0)
    pr[STEPS >= 300, 10:12] = 11.0
    profile = np.linspace(0.3, -0.1, 64)
    profile[[0, 10, 15]] = 0.5  # the golden dimensions
    g_k = 1 + np.minimum(STEPS / 300, 1)[:, None, None] * profile[None, None, :] * np.ones((1, L22, 1))
    q_norm = np.interp(STEPS, [0, 300], [8.0, 9.6])[:, None, None]
    return full_run(STEPS, layers=L22, heads=HEADS22, kv=HEADS22, seq_len=T22, tokens_per_step=8192, k_norm=k_norm,
                    attn_entropy=entropy, attn_sink=sink, k_maxabs=maxabs, k_cos=cos, k_pr=pr, g_k=g_k, q_norm=q_norm)


def rows_by_id(table):
    return {row["id"]: row for note in table["notes"] for row in note["rows"]}


def spearman(x, y):
    """Pearson's r of the ranks, ties given their mean rank (computed here without the package)."""
    def ranks(v):
        return np.array([(v < a).sum() + ((v == a).sum() + 1) / 2 for a in v])
    return float(np.corrcoef(ranks(np.asarray(x)), ranks(np.asarray(y)))[0, 1])


def test_claims_of_a_run_made_to_meet_them():
    run = notes_like_run()
    table = claims.claim_table(run)
    rows = rows_by_id(table)
    outcomes = {i: r["outcome"] for i, r in rows.items()}
    expected = {i: "reproduces" for i in outcomes}
    expected.update({"key-gain-knob": "does not reproduce", "scale-uniform": "not applicable",
                     "qk-weights-orthogonal": "not applicable"})
    assert outcomes == expected
    assert table["counts"] == {"reproduces": len(rows) - 3, "does not reproduce": 1, "not applicable": 2,
                               "not reached": 0, "no data": 0}
    k_norm = run["metrics"]["k_norm"][1]
    end, i980, i490 = len(STEPS) - 1, list(STEPS).index(980), list(STEPS).index(490)
    # the step named, the step compared: 1000; 8M tokens / 8192 = step 977 -> 980; 4M -> 488 -> 490
    assert (rows["early-norm-5.3"]["step"], rows["middle-norm-9.3"]["step"], rows["pr-middle-11"]["step"]) == \
        (1000, 980, 490)
    assert rows["middle-norm-9.3"]["at"] == "8,000,000 tokens (step 977)"
    assert rows["early-norm-5.3"]["values"] == [close(k_norm[end, :2].mean(), **SAME_F64)]
    assert rows["middle-norm-9.3"]["values"] == [close(k_norm[i980, 10:12].mean(), **SAME_F64)]
    assert rows["final-above-middle"]["values"] == [close(k_norm[i980, 20:].mean() / k_norm[i980, 10:12].mean() - 1,
                                                          **SAME_F64)]
    assert rows["initial-dip-7.1"]["values"] == [close(7.1, **SAME_F64)] and "at step 100" in \
        rows["initial-dip-7.1"]["observed"]
    entropy = run["metrics"]["attn_entropy"][1][i490]
    centred = lambda a: (a - a.mean(axis=1, keepdims=True)).ravel()  # noqa: E731
    assert rows["within-layer-norm-entropy"]["values"] == [close(spearman(centred(k_norm[i490]), centred(entropy)),
                                                                 atol=1e-9)]
    assert rows["sink-heads"]["values"] == [1] and rows["gatherer-heads"]["values"][0] >= 1
    assert rows["coordinates-fixed-by-200"]["values"] == [close(1.0, **SAME_F64)]
    assert rows["golden-dimensions"]["values"] == [1.0] and rows["middle-heads-split"]["values"] == [12.0]
    assert rows["focus-peak"]["values"][0] == close(0.2, **SAME_F64)
    assert rows["profile-rising-4-21"]["values"][0] > 0.9
    assert rows["few-layers-at-8"]["values"] == [0.0]
    # the same claim, cited by two notes, is computed once and shown under both with each note's passage
    by_note = {n["file"]: {r["id"]: r for r in n["rows"]} for n in table["notes"]}
    sink = [by_note[f]["sink-heads"] for f in ("002_7607d19f99c723d3.txt", "004_fa7954ba49957b24.txt")]
    assert sink[0]["values"] == sink[1]["values"] and sink[0]["quotes"] != sink[1]["quotes"]


def test_claims_of_a_run_that_stays_at_initialisation():
    run = full_run(STEPS, layers=L22, heads=HEADS22, kv=HEADS22, seq_len=T22, tokens_per_step=8192)
    rows = rows_by_id(claims.claim_table(run))
    assert rows["heads-start-at-8"]["outcome"] == "reproduces" and rows["early-norm-5.3"]["outcome"] == \
        "does not reproduce"
    assert rows["early-norm-5.3"]["values"] == [8.0] and rows["early-norm-falls"]["values"] == [0.0]
    assert rows["within-layer-norm-entropy"]["outcome"] == "does not reproduce"  # constant: no correlation
    assert rows["few-layers-at-8"]["values"] == [1.0] and rows["few-layers-at-8"]["outcome"] == "does not reproduce"


def test_claims_a_short_run_does_not_reach():
    run = full_run(np.arange(12), layers=L22, heads=HEADS22, kv=HEADS22, seq_len=T22, tokens_per_step=8192)
    rows = rows_by_id(claims.claim_table(run))
    assert rows["early-norm-5.3"]["outcome"] == "not reached" and rows["early-norm-5.3"]["step"] is None
    assert "0-11" in rows["early-norm-5.3"]["why"]
    assert rows["pr-middle-11"]["outcome"] == "not reached"
    assert rows["heads-start-at-8"]["outcome"] == "reproduces" and rows["pr-start-24"]["step"] == 0
    # 200 is more than 10% away from 11; a log ending at 190 does not reach step 200 either
    assert rows["coordinates-fixed-by-200"]["outcome"] == "not reached"
    assert claims.nearest_stats_step(run, 12) == 11 and claims.nearest_stats_step(run, 13) is None


def test_claims_without_the_dynamics_of_training():
    """A caller can say the log is a measurement: claims about change are then not applicable, the
    others compare with the state measured."""
    run = notes_like_run()
    table = claims.claim_table(run, dynamics=False)
    rows = rows_by_id(table)
    assert table["dynamics"] is False and table["why_static"] == claims.MEASUREMENT
    for cid in ("early-norm-falls", "initial-dip-7.1", "heads-start-at-8", "focus-peak", "coordinates-fixed-by-200"):
        assert rows[cid]["outcome"] == "not applicable" and claims.MEASUREMENT in rows[cid]["why"], cid
    assert rows["early-norm-5.3"]["outcome"] == "reproduces" and rows["early-norm-5.3"]["step"] == 1000
    assert rows["pr-middle-11"]["step"] == 1000  # the last stats step, whatever step the claim names
    text = to_markdown(claims.claim_blocks(table))
    assert "No dynamics of training" in text
    started = dict(run, init={"checkpoint": "w.ckpt", "steps": None})
    assert claims.claim_table(started)["dynamics"] is False


def test_claims_need_the_notes_model_and_the_data():
    small = full_run(STEPS, head_dim=32, layers=6, tokens_per_step=8192)
    rows = rows_by_id(claims.claim_table(small))
    assert rows["early-norm-5.3"]["outcome"] == "not applicable" and "head_dim 64, this one 32" in \
        rows["early-norm-5.3"]["why"]
    assert rows["early-norm-falls"]["outcome"] == "does not reproduce" and rows["early-norm-falls"]["values"] == [0.0]
    assert "n_layer 22, this one 6" in rows["profile-rising-4-21"]["why"]
    run = full_run(STEPS, layers=L22, heads=HEADS22, kv=HEADS22, seq_len=T22)
    del run["metrics"]["k_cos"]
    rows = rows_by_id(claims.claim_table(run))
    assert rows["deep-cosine-0.5"]["outcome"] == "no data" and "k_cos" in rows["deep-cosine-0.5"]["why"]


def test_claims_in_the_report_and_summary():
    run = notes_like_run()
    s = summary.summarise(run, [], {}, {"layer": None})
    text = to_markdown(run_blocks(s, [], {}))
    json.dumps(summary.json_ready(s), allow_nan=False)
    assert "## The notes' claims beside this run" in text
    assert "### Research Report: The Attention Civil War (002_7607d19f99c723d3.txt)" in text
    row = next(line for line in text.splitlines() if line.startswith("| after 1000 steps the early layers"))
    assert "step 1000; logged step 1000" in row and "within \u00b110% of 5.3 (4.77 to 5.83)" in row
    assert row.endswith("| **reproduces** |")
    assert s["claims"]["counts"]["reproduces"] == 27


# -- the gains against RoPE wavelength ------------------------------------------------------------------------


def test_wavelengths_are_those_of_the_models_rope():
    """The wavelength of each dimension, against the angle the PyTorch model's RoPE turns it by in one
    position: dimensions i and i + D/2 turn together (rotate-half)."""
    torch = pytest.importorskip("torch")
    from attnlog import model_torch
    D, theta = 64, 10000.0
    cos, sin = model_torch.rope_tables(SimpleNamespace(head_dim=D, rope_theta=theta, rope_factor=0.0), 2, torch.float64)
    for d in range(D):
        x = torch.zeros(1, 2, 1, D, dtype=torch.float64)
        x[..., d] = 1.0
        turned = model_torch.rope(x, cos, sin)[0, 1, 0]
        pair = d % (D // 2)
        angle = math.atan2(abs(float(turned[pair + D // 2 if d < D // 2 else pair])), float(turned[d]))
        # cos and sin are float32 values (as the C++ forms them), each within 6e-8 (relative for sin,
        # absolute for cos, which is near 1): the angle within about 1.2e-7 of its size
        assert rope.wavelengths(D, theta)[d] == close(2 * math.pi / angle, rtol=1e-6), d
    assert rope.wavelengths(D, theta)[0] == close(2 * math.pi, **SAME_F64)
    assert rope.wavelengths(D, theta)[31] == close(2 * math.pi * theta ** (62 / 64), **SAME_F64)


def test_gains_split_by_wavelength():
    """Dimensions whose pair turns within T = 2048 (pairs i < 21 for D = 64, theta = 10000) set to 1.25,
    the others to 0.9 (and the q gains the other way round)."""
    short = np.array([2 * math.pi * 10000 ** (2 * (d % 32) / 64) < 2048 for d in range(64)])
    assert short.sum() == 42 and short[:21].all() and not short[21:32].any()
    g_k = np.where(short, 1.25, 0.9)
    g_q = np.where(short, 0.9, 1.25)
    run = full_run(STEPS, layers=L22, heads=HEADS22, kv=HEADS22, seq_len=T22, g_k=g_k, g_q=g_q)
    r = rope.rope_gains(run)
    assert r["available"] and (r["short_dims"], r["long_dims"], r["context"], r["step"]) == (42, 22, 2048, 1000)
    for g in ("early", "middle", "final"):
        assert r["k"]["groups"][g] == {"short": close(1.25, **SAME_F64), "long": close(0.9, **SAME_F64)}
        assert r["q"]["groups"][g] == {"short": close(0.9, **SAME_F64), "long": close(1.25, **SAME_F64)}
    assert run_figures.wavelength_split(r, "k") == "short" and run_figures.wavelength_split(r, "q") == "long"
    flat = rope.rope_gains(full_run(STEPS, seq_len=T22))
    assert run_figures.wavelength_split(flat, "k") is None
    every_pair_short = rope.rope_gains(full_run(STEPS, seq_len=10 ** 6))
    assert every_pair_short["long_dims"] == 0 and every_pair_short["k"]["groups"]["early"]["long"] is None
    no_theta = full_run(STEPS)
    del no_theta["config"]["rope_theta"]
    assert rope.rope_gains(no_theta) == {"available": False, "reason": "the header gives no rope_theta"}


# -- the figures, as matplotlib objects -------------------------------------------------------------------------


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """draw(run) -> ({file: (figure, caption)}, {file: why skipped}): the report's figures of a run,
    kept open to be inspected instead of written."""
    kept = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: kept.__setitem__(Path(path).name, fig))

    def draw(run):
        plt.close("all")  # those of an earlier call stay readable, closed
        made, skipped = run_figures.draw_figures(run, tmp_path, {"layer": None})
        return {name: (kept[name], caption) for name, caption in made}, skipped
    yield draw
    plt.close("all")


def test_layer_ticks_are_whole_layers(drawn):
    out, _ = drawn(full_run(STEPS, layers=L22))
    fig, _ = out["gains_q_k.png"]
    heatmaps = [ax for ax in fig.axes if ax.get_ylabel() == "layer" and any(isinstance(c, QuadMesh)
                                                                              for c in ax.collections)]
    assert len(heatmaps) == 2
    for ax in heatmaps:
        assert list(ax.get_yticks()) == list(range(L22))
    fig, _ = out["gamma_heatmap.png"]
    assert list(fig.axes[1].get_yticks()) == list(range(L22))


def test_layer_bands_tell_neighbouring_layers_apart(drawn):
    bands = figures.layer_bands(22)
    assert [len(b) for b, _ in bands] == [3, 3, 3, 3, 3, 3, 2, 2]
    assert np.concatenate([b for b, _ in bands]).tolist() == list(range(22))
    assert len({style for _, style in bands}) == 8
    assert [list(b) for b, _ in figures.layer_bands(6)] == [[i] for i in range(6)]
    out, _ = drawn(full_run(STEPS, layers=L22, heads=8, kv=8, k_norm=np.linspace(7, 9, 8)))
    fig, caption = out["entropy_norm_by_layer.png"]
    ax = fig.axes[0]
    points = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    colours = [tuple(c.get_facecolor()[0]) for c in points]
    assert len(points) == 8 and len(set(colours)) == 8 and sum(len(c.get_offsets()) for c in points) == 22 * 8
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [f"layers {b[0]}-{b[-1]}" for b, _ in bands] == [lab for lab in labels if lab.startswith("layers")]
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # beside the plot
    assert len(ax.lines) >= 22  # each layer's own line through its heads
    assert "query head" not in caption and not any("query" in lab for lab in labels)  # no GQA here
    gqa, _ = drawn(full_run(STEPS, heads=4, kv=2))
    assert "the query heads reading it" in gqa["entropy_norm_by_layer.png"][1]


def sink_panel(fig):
    """The attn_sink heatmap's mesh and its colour bar's axes."""
    bar = next(ax for ax in fig.axes if ax.get_ylabel().startswith("mass on position 0"))
    (mesh,) = [c for ax in fig.axes if ax.get_title().startswith("attn_sink") for c in ax.collections]
    return mesh, bar


def test_sink_heatmap_scale_is_fixed(drawn):
    """Noise around uniform attention's 1/T (T = 256: 0.024) stays pale: the scale runs 0 to the sink
    threshold 0.3, uniform attention and the threshold marked; a real sink widens it."""
    T = 256
    rng = np.random.default_rng(0)
    noise = analysis.uniform_sink(T) * (1 + 0.5 * rng.uniform(-1, 1, (len(STEPS), 6, 4)))
    out, _ = drawn(full_run(STEPS, seq_len=T, attn_sink=noise))
    mesh, bar = sink_panel(out["layer_heatmaps.png"][0])
    assert (mesh.norm.vmin, mesh.norm.vmax) == (0.0, 0.3)
    assert sorted(line.get_ydata()[0] for line in bar.lines) == [close(analysis.uniform_sink(T), **SAME_F64), 0.3]
    noise[-1, 3] = 0.6  # every head of layer 3 a sink at the last step
    out, _ = drawn(full_run(STEPS, seq_len=T, attn_sink=noise))
    assert sink_panel(out["layer_heatmaps.png"][0])[0].norm.vmax == 0.6


def step_axes(fig):
    return [ax for ax in fig.axes if ax.get_xlabel() == figures.STEP_LABEL]


def overlapping_labels(fig):
    """Pairs of tick labels of one axis that overlap on the page (of a figure drawn)."""
    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [(t.get_text(), t.get_window_extent()) for t in axis.get_ticklabels() if t.get_visible() and
                     t.get_text()]
            found += [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]
    return found


def covered_points(fig):
    """Points (markers, scatter points) of any panel that lie under any legend (of a figure drawn)."""
    legends = [ax.get_legend().get_window_extent() for ax in fig.axes if ax.get_legend() is not None]
    covered = []
    for ax in fig.axes:
        shown = [line.get_xydata() for line in ax.lines if line.get_marker() not in ("None", None, "")]
        shown += [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
        for xy in shown:
            for x, y in ax.transData.transform(np.asarray(xy, float)):
                if ax.get_window_extent().contains(x, y) and any(box.contains(x, y) for box in legends):
                    covered.append((ax.get_title(), x, y))
    return covered


def drawn_cleanly(fig):
    """(overlapping tick labels, covered points) of a figure, drawn first."""
    fig.canvas.draw()
    return overlapping_labels(fig), covered_points(fig)


def one_step(run, step):
    """The run as a log of the one stats step `step` (and that step's training loss) would give it."""
    i = list(run["stats_steps"]).index(step)
    steps = run["stats_steps"][i:i + 1]
    return dict(run, stats_steps=steps, window=analysis.decision_window(steps), step_range=(step, step),
                metrics={name: (steps, table[i:i + 1]) for name, (_, table) in run["metrics"].items()},
                loss=(steps, np.array([6.3])), val=(steps, np.array([6.4])))


@pytest.mark.parametrize("step", [0, 1000])
def test_a_one_step_log_draws_cleanly(drawn, step):
    """One stats step of a 22-layer model (at step 0, or one late step): whole-step ticks, the step
    itself as the tick, no labels on top of each other, no legend over a point, the training loss
    drawn as a point."""
    run = one_step(notes_like_run(), step)
    pr = np.full((1, L22, HEADS22), 22.0)
    pr[:, :2], pr[:, 10:12], pr[:, 20:] = 20.0, 21.4, 23.5  # as the d22 run's end: around the line of 22
    run["metrics"]["k_pr"] = (run["stats_steps"], pr)
    out, skipped = drawn(run)
    assert "loss.png" in out and skipped == {}
    for name, (fig, _) in out.items():
        for ax in step_axes(fig):
            assert [float(t) for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] == [step], name
        assert drawn_cleanly(fig) == ([], []), name
    (line,) = [line for line in out["loss.png"][0].axes[0].lines if line.get_label().startswith("training loss")]
    assert line.get_marker() == "o" and line.get_alpha() == 1 and list(line.get_xdata()) == [step]


def test_a_long_run_of_many_layers_draws_cleanly(drawn):
    run = notes_like_run()
    out, _ = drawn(run)
    for name, (fig, _) in out.items():
        for ax in step_axes(fig):
            assert all(float(t).is_integer() for t in ax.get_xticks()), name
        assert drawn_cleanly(fig) == ([], []), name


# -- captions: transients, and reading only what the guard allows -------------------------------------------------


def test_transients():
    steps = np.arange(0, 100, 10)
    assert run_figures.transient(np.array([52.9, 30, 5.0, 8, 12, 15, 17, 19, 20, 20.2]), steps) == (5.0, 20)
    assert run_figures.transient(np.linspace(52.9, 20.2, 10), steps) is None  # monotone: nothing beyond its ends
    # beyond both ends by 24% of the larger end is not a transient; by 26% is
    assert run_figures.transient(np.array([1.0, 1.24, 1.0] + [1.0] * 7), steps) is None
    assert run_figures.transient(np.array([1.0, 1.26, 1.0] + [1.0] * 7), steps) == (1.26, 10)
    assert run_figures.transient(np.array([0.1, 0.99, 0.5, 0.4] + [0.4] * 6), steps) == (0.99, 10)


def test_captions_name_large_transients(drawn):
    """k_cos at 0.99 for steps 10-20 and back to 0.4, k_erank down to 5 by step 40 then fourfold up:
    the captions say so, not only first -> last; a monotone k_pr gets no such words."""
    cos = np.interp(STEPS, [0, 10, 20, 100, 1000], [0.2, 0.99, 0.99, 0.4, 0.4])[:, None, None]
    erank = np.interp(STEPS, [0, 40, 1000], [52.0, 5.0, 20.0])[:, None, None]
    pr = np.interp(STEPS, [0, 1000], [22.0, 18.0])[:, None, None]
    out, _ = drawn(full_run(STEPS, k_cos=cos, k_erank=erank, k_pr=pr))
    cos_caption, rank_caption = out["latent_redundancy.png"][1], out["effective_rank.png"][1]
    assert "early 0.200 \u2192 0.990 at step 10 \u2192 0.400" in cos_caption
    assert "early k_cos reaches 0.990 at step 10, then ends at 0.400" in cos_caption
    assert "early 52.0 \u2192 5.0 at step 40 \u2192 20.0" in rank_caption
    assert "early k_erank falls to 5.0 by step 40, then rises 4.0-fold to 20.0" in rank_caption
    assert "early 22.0 \u2192 18.0;" in rank_caption and "k_pr falls" not in rank_caption
    assert "k_erank falls to 5.0 by step 40" in out["key_offset.png"][1]


READINGS = {"latent_redundancy.png": "semantic convergence", "axis_share.png": "the reports' axis-aligned keys",
            "key_offset.png": "rank beyond 5%", "gains_wavelength.png": "g_k is"}


def test_captions_read_the_numbers_only_when_the_guard_allows(drawn):
    """A run the guard (verdicts.training_status) lets have verdicts gets captions that say what the
    numbers mean; one of 12 steps inside its warm-up, with keys as alike as a warm-up makes them
    (cosine 0.99), gets the numbers alone, and the report says why."""
    cos = np.full((len(STEPS), 6, 2), 0.99)
    enough = full_run(STEPS, k_cos=cos)
    assert verdicts.training_status(enough)["enough"]
    out, _ = drawn(enough)
    for name, words in READINGS.items():
        assert words in out[name][1], name
    short = full_run(np.arange(12), warmup=40, k_cos=0.99)
    assert not verdicts.training_status(short)["enough"]
    out, _ = drawn(short)
    for name, words in READINGS.items():
        assert words not in out[name][1], name
    assert "0.990 \u2192 0.990" in out["latent_redundancy.png"][1]  # the numbers stay
    s = summary.summarise(short, [(n, c) for n, (_, c) in out.items()], {}, {"layer": None})
    text = to_markdown(run_blocks(s, [(n, c) for n, (_, c) in out.items()], {}))
    assert "The captions state the numbers only" in text and "semantic convergence" not in text


def claim_row(claim_id, outcome, values=(), step=None, why=""):
    return {"id": claim_id, "claim": f"claim {claim_id}", "at": "step 1000", "step": step, "observed": "",
            "rule": "within +-10% of 5.3", "values": list(values), "outcome": outcome, "why": why, "quotes": []}


def test_claims_over_replicates():
    """Each claim over three runs: the values of the runs where it was decided, by label; mean, sd and
    range of the finite ones per measure; reproduces in all, none, or some (mixed) of those runs."""
    tables = [{"notes": [{"rows": rows}]} for rows in (
        [claim_row("a", "reproduces", [5.0, 1.0], 1000), claim_row("b", "not reached", why="the log's stats steps are 0-11")],
        [claim_row("a", "does not reproduce", [8.0, float("nan")], 1000), claim_row("b", "not reached", why="x")],
        [claim_row("a", "not reached", why="y"), claim_row("b", "not reached", why="z")])]
    a, b = claims.replicate_claims(tables, ["s1", "s2", "s3"])
    assert a["values"] == {"s1": [5.0, 1.0], "s2": [8.0, a["values"]["s2"][1]]} and math.isnan(a["values"]["s2"][1])
    assert a["outcomes"] == {"s1": "reproduces", "s2": "does not reproduce", "s3": "not reached"}
    assert (a["decided"], a["reproduced"], a["outcome"]) == (2, 1, "mixed")
    assert a["why"] == "in 1 of 2 runs where it was decided; 1 not reached"
    assert a["mean"] == [6.5, 1.0] and a["sd"] == [close(math.sqrt(4.5), **SAME_F64), None]
    assert (a["low"], a["high"], a["steps"]) == ([5.0, 1.0], [8.0, 1.0], [1000])
    assert (b["outcome"], b["why"], b["decided"], b["values"], b["mean"]) == \
        ("not reached", "the log's stats steps are 0-11", 0, {}, [])
    one = claims.replicate_claims(tables[:1], ["s1"])[0]
    assert (one["outcome"], one["why"], one["sd"]) == ("reproduces", "in 1 of 1 runs", [None, None])
    text = to_markdown(claims.replicate_claim_blocks([a, b]))
    assert "| claim a | step 1000; logged step 1000 | s1: 5.00; 1.00, s2: 8.00; nan | 6.50; 1.00 \u00b1 2.12; n/a " \
           "(5.00; 1.00 to 8.00; 1.00) | within +-10% of 5.3 | **mixed**: in 1 of 2 runs where it was decided; " \
           "1 not reached |" in text
    assert "| claim b | step 1000 | none | n/a |" not in text and "| claim b | step 1000 | none |  |" in text
