"""Tests of scripts/report.py (and scripts/analysis.py, which computes its numbers) on a log written
by the real trainer: a tiny model trained for a few seconds on the repository's own text. The
numbers report.py writes (summary.json, report.md) are checked against values computed here,
independently, from the log.

    /usr/bin/python3 -m pytest -q test/test_report.py

The trainer and the data tool must be built first (make train prepare_data); TRAIN_BIN and
PREPARE_DATA_BIN name other builds of them.
"""
import json
import os
import re
import struct
import subprocess
import sys
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import attnlog
from attnlog import analysis, commands
from tolerance import assert_close, close

ROOT = Path(__file__).resolve().parent.parent


SCRIPT = ROOT / "scripts" / "report.py"
TRAIN_BIN = Path(os.environ.get("TRAIN_BIN", ROOT / "train"))
PREPARE_BIN = Path(os.environ.get("PREPARE_DATA_BIN", ROOT / "prepare_data"))

# The tiny run: 6 layers, 4 query heads reading 2 key/value heads (GQA), D = 64, T = 64.
LAYERS, HEADS, KV_HEADS, D, T, STEPS = 6, 4, 2, 64, 64, 30
TRAIN_ARGS = ["--n-layer", LAYERS, "--n-head", HEADS, "--n-kv-head", KV_HEADS, "--d-ff", 128, "--max-seq-len", T,
              "-b", 4, "-x", STEPS, "-s", 2, "-v", 10, "--val-batches", 2, "--samples", 0]
# The same model trained past the guards against too little training (-u 20 of 300 steps, 76,800 tokens).
TRAINED_STEPS = 300
TRAINED_ARGS = ["--n-layer", LAYERS, "--n-head", HEADS, "--n-kv-head", KV_HEADS, "--d-ff", 128, "--max-seq-len", T,
                "-b", 4, "-x", TRAINED_STEPS, "-u", 20, "-s", 5, "-v", 50, "--val-batches", 2, "--samples", 0,
                "--threads", 1]
FIGURES = ["key_norm_evolution.png", "layer_heatmaps.png", "outlier_magnitude.png", "axis_share.png",
           "latent_redundancy.png", "key_magnitude_profile.png", "norm_divergence.png", "entropy_norm_scatter.png",
           "entropy_norm_by_layer.png", "effective_rank.png", "key_offset.png", "gamma_heatmap.png", "gains_q_k.png",
           "gains_wavelength.png", "qk_ratio.png", "logit_ceiling.png", "attn_maxp.png", "sink_rate.png", "loss.png"]
COMPARED = ["k_norm", "k_maxabs", "k_cos", "k_pr", "attn_entropy"]
TELEMETRY = 3

# Tolerances. report.py and this file compute the same numbers from the same float32 values of the
# log, in float64 but in other orders, or one side averaging float32 values in float32 (numpy's
# pairwise mean of a float32 array: ~log2(n) u32, a few 1e-7 relative): LOGGED, 1e-6 relative
# (16 u32, the resolution of the logged values) and 1e-12 absolute for values that are 0. A wrong
# step, group or head changes them at the second digit or sooner.
LOGGED = dict(rtol=1e-6, atol=1e-12)
# Spearman's correlations: of exact ranks, in float64 on both sides: ~n u64 (1e-14) for the few
# dozen units here; 1e-9 absolute. A rank off by one changes rho by ~1e-3 or more.
RHO = dict(atol=1e-9)
# The same float64 formula of the same exact inputs on both sides: a few u64 (1e-16) relative.
SAME_F64 = dict(rtol=1e-12, atol=1e-12)


def run(argv, what):
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(f"{what} failed with status {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def report(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(result, *parts):
    assert result.returncode == commands.USER_ERROR, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


# -- the run and its report, made once -----------------------------------------------------------------


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    for binary, rule in ((TRAIN_BIN, "make train (or set TRAIN_BIN)"),
                         (PREPARE_BIN, "make prepare_data (or set PREPARE_DATA_BIN)")):
        if not binary.exists():
            pytest.fail(f"{binary} not found: build it with {rule}")
    tmp = tmp_path_factory.mktemp("tiny")
    texts = sorted(str(p) for p in list(ROOT.glob("llmc/*.h")) + list(ROOT.glob("docs/*.md")))
    run([PREPARE_BIN, "--out", tmp / "data", "--vocab", 512, "--max-docs", 40, *texts], "prepare_data")
    run([TRAIN_BIN, "-i", tmp / "data" / "train_*.bin", "-j", tmp / "data" / "val_*.bin", *TRAIN_ARGS,
         "-o", tmp / "run"], "the trainer")
    return tmp / "run" / "run.attnlog"


@pytest.fixture(scope="module")
def made(log_path):
    """report.py run with its defaults: (output folder, summary.json, report.md, stdout)."""
    result = report(log_path)
    assert result.returncode == 0, result.stderr
    outdir = log_path.parent / "report"
    summary = json.loads((outdir / "summary.json").read_text())
    return outdir, summary, (outdir / "report.md").read_text(), result.stdout


@pytest.fixture(scope="module")
def log(log_path):
    return attnlog.open_log(log_path)


# -- what the tests compute themselves ---------------------------------------------------------------


def ranks(v):
    """Rank = values below + (values equal + 1) / 2: ties get the mean of their ranks."""
    v = np.asarray(v, float)
    return np.array([(v < a).sum() + ((v == a).sum() + 1) / 2 for a in v])


def spearman(x, y):
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def within_layers(x, y):
    """Spearman's rho of [L, units] x and y after centring both per layer (row)."""
    return spearman((x - x.mean(axis=1, keepdims=True)).ravel(), (y - y.mean(axis=1, keepdims=True)).ravel())


GROUPS = {"early": [0, 1], "middle": [LAYERS // 2 - 1, LAYERS // 2], "final": [LAYERS - 2, LAYERS - 1]}
KV_OF = np.arange(HEADS) // (HEADS // KV_HEADS)


def last(log, name):
    return log.metric(name)[1][-1].astype(float)


def group_mean(table, group):
    return float(np.mean([table[layer, h] for layer in GROUPS[group] for h in range(table.shape[1])]))


# -- a single run ------------------------------------------------------------------------------------


def test_log_is_the_tiny_run(log):
    assert log.problems == []
    assert {k: log.config[k] for k in ("n_layer", "n_head", "n_kv_head", "head_dim")} == \
        {"n_layer": LAYERS, "n_head": HEADS, "n_kv_head": KV_HEADS, "head_dim": D}
    assert log.scalars("loss")[0].tolist() == list(range(STEPS))
    assert len(log.metric("k_norm")[0]) >= 10


def test_every_figure_is_made(made):
    outdir, summary, text, _ = made
    assert summary["figures"] == {"made": FIGURES, "skipped": {}}
    for name in FIGURES:
        data = (outdir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000, name
        assert f"![{name}]({name})" in text


def test_html_is_self_contained(made):
    outdir, _, _, _ = made
    page = (outdir / "report.html").read_text()
    assert page.count('<img alt="') == len(FIGURES)
    assert page.count('src="data:image/png;base64,') == len(FIGURES)
    assert not re.search(r'(src|href)="(?!data:|#)', page)  # nothing fetched from elsewhere
    assert "<link" not in page and "<script" not in page


def test_summary_describes_the_run(made, log):
    _, summary, text, _ = made
    assert summary["config"] == log.config and summary["options"] == log.header["options"]
    assert summary["groups"] == GROUPS
    assert summary["sqrt_head_dim"] == 8.0 and summary["seq_len"] == T
    steps = log.metric("k_norm")[0]
    assert summary["stats_steps"] == {"count": len(steps), "first": int(steps[0]), "last": int(steps[-1])}
    assert summary["problems"] == [] and summary["missing_metrics"] == []
    loss_steps, loss = log.scalars("loss")
    val_steps, val = log.val_loss()
    assert summary["loss"]["last_step"] == STEPS - 1
    assert summary["loss"]["last10_mean"] == close(loss[-10:].mean(), **LOGGED)
    assert summary["loss"]["val_last"] == close(val[-1], **LOGGED) and summary["loss"]["val_last_step"] == val_steps[-1]
    assert f"{loss[-10:].mean():.3f} (mean of the last 10 steps)" in text


def test_group_means_at_the_last_step(made, log):
    _, summary, text, _ = made
    q_norm, k_norm = last(log, "q_norm"), last(log, "k_norm")
    for metric in ("k_norm", "k_maxabs", "k_cos", "k_pr", "k_erank", "attn_entropy", "attn_sink"):
        for group in GROUPS:
            assert summary["last_step"][metric][group] == close(group_mean(last(log, metric), group), **LOGGED), metric
    ratio = q_norm / k_norm[:, KV_OF]
    for group in GROUPS:
        assert summary["last_step"]["qk_ratio"][group] == close(group_mean(ratio, group), **LOGGED)
    first = log.metric("k_norm")[1][0].astype(float)
    curve = ", ".join(f"{g} {group_mean(first, g):.2f} \u2192 {group_mean(k_norm, g):.2f}" for g in GROUPS)
    assert curve.replace(", ", "; ") in text  # the caption of key_norm_evolution.png


def test_sink_rate(made, log):
    _, summary, text, _ = made
    sink = log.metric("attn_sink")[1]
    assert summary["sink_rate"]["last"] == close(np.mean(sink[-1] > 0.3), **LOGGED)
    assert summary["sink_rate"]["first"] == close(np.mean(sink[0] > 0.3), **LOGGED)
    assert f"{100 * np.mean(sink[0] > 0.3):.0f}% \u2192 {100 * np.mean(sink[-1] > 0.3):.0f}%" in text


@pytest.fixture(scope="module")
def lines_run(tmp_path_factory):
    """A short run of the tiny model on the lines of docs/*.md, each a document of a few dozen tokens,
    so that most windows hold document starts: (log, summary.json, report.md)."""
    tmp = tmp_path_factory.mktemp("lines")
    texts = sorted(str(p) for p in ROOT.glob("docs/*.md"))
    run([PREPARE_BIN, "--out", tmp / "data", "--vocab", 512, "--docs", "line", *texts], "prepare_data")
    run([TRAIN_BIN, "-i", tmp / "data" / "train_*.bin", "-j", tmp / "data" / "val_*.bin", "--n-layer", LAYERS,
         "--n-head", HEADS, "--n-kv-head", KV_HEADS, "--d-ff", 128, "--max-seq-len", T, "-b", 4, "-x", 10, "-s", 2,
         "-v", 0, "--val-batches", 1, "--samples", 0, "-o", tmp / "run"], "the trainer")
    result = report(tmp / "run" / "run.attnlog")
    assert result.returncode == 0, result.stderr
    outdir = tmp / "run" / "report"
    return (attnlog.open_log(tmp / "run" / "run.attnlog"), json.loads((outdir / "summary.json").read_text()),
            (outdir / "report.md").read_text())


def test_doc_starts_beside_the_sink(lines_run):
    """attn_doc_start beside attn_sink, means over every query head, and the share of queries that
    see a document start (prepare_data's BOS before every document is the end-of-text token)."""
    log, summary, text = lines_run
    steps, sink = log.metric("attn_sink")
    doc, visible = log.metric("attn_doc_start")[1].mean(axis=(1, 2)), log.metric("doc_start_visible")[1]
    d, w = summary["doc_starts"], window(steps)
    assert d["eot"] == int(log.header["options"]["eot"]) == 1  # SentencePiece's BOS id
    assert d["attn_sink"]["window_mean"] == close(sink.mean(axis=(1, 2))[w].mean(), **LOGGED)
    assert d["attn_doc_start"]["first"] == close(doc[0], **LOGGED)
    assert d["attn_doc_start"]["window_mean"] == close(doc[w].mean(), **LOGGED)
    assert d["visible"]["last"] == close(visible[-1], **LOGGED)
    assert 0 < visible.max() < 1 and (doc > 0).any()  # the run's windows hold document starts
    ratio = doc[w] / visible[w] if (visible[w] > 0).all() else None  # the mean over the queries that see one
    assert d["per_visible_query"]["window_mean"] == (None if ratio is None else close(ratio.mean(), **LOGGED))
    assert (f"attn_doc_start {doc[w].mean():.3f}, beside attn_sink {sink.mean(axis=(1, 2))[w].mean():.3f}" in text
            and f"{visible[w].mean():.0%} of the queries had a document start in view" in text)
    assert "attn_doc_start, the attention on document starts" in text  # the line in sink_rate.png


def test_hypothesis_a_spearman(made, log):
    """The 30-step run: the correlation is computed per kv head over the decision window, and the
    verdict is inconclusive, the run being too short (inside its warm-up of 40 steps)."""
    _, summary, text, _ = made
    x, y = window_kv_means(log)
    h = summary["hypotheses"]["a"]
    assert h["n_units"] == LAYERS * KV_HEADS
    assert h["value"] == close(within_layers(x, y), **RHO)
    assert h["across"]["rho"] == close(spearman(x.ravel(), y.ravel()), **RHO)
    assert 0 < h["p_value"] <= 1
    assert (h["verdict"], h["why"]) == ("inconclusive", "too little training")
    assert f"rho = {h['value']:+.3f}" in text
    row = next(line for line in text.splitlines() if line.startswith("| (a)"))
    assert row.endswith("**inconclusive** |")  # a verdict that rests on the guard: no "still moving" beside it


def test_ranks_average_ties():
    from attnlog import analysis as module
    assert module.ranks([3, 1, 3, 2, 3]).tolist() == [4, 1, 4, 2, 4]
    assert module.ranks([5, 5]).tolist() == [1.5, 1.5]
    x, y = [1, 2, 2, 3, 5, 4], [6, 5, 5, 4, 1, 2]
    assert module.spearman(x, y)[0] == close(spearman(x, y), **RHO)
    assert module.spearman(x, y)[1] < 0.05  # a perfect inverse order is no accident
    assert np.isnan(module.spearman([1, 1, 1], [1, 2, 3])[0])


def test_too_little_training(made, log):
    """The 30-step run has not left its warm-up (40 steps) and trained on 30 x 256 tokens: every verdict
    is inconclusive, saying why, and there is no head taxonomy."""
    _, summary, text, stdout = made
    training = summary["training"]
    assert training["enough"] is False and training["tokens"] == STEPS * 4 * T
    assert training["reasons"][:2] == [f"the run has not left warm-up (last step {STEPS - 1} < warmup 40)",
                                       f"{STEPS * 4 * T:,} training tokens ({STEPS} steps x {4 * T}), fewer than the "
                                       "65,536 a verdict needs"]
    for key, h in summary["hypotheses"].items():
        if key == "d":  # no stats step past the warm-up: no reference step to measure a fall from
            assert (h["verdict"], h["why"]) == ("inconclusive", "no data") and "no reference step" in h["detail"]
            continue
        assert (h["verdict"], h["why"]) == ("inconclusive", "too little training")
        assert h["detail"].startswith("too little training (the run has not left warm-up")
        assert f"({key}) {h['title']}: inconclusive (too little training" in stdout
    assert summary["taxonomy"]["available"] is False
    assert summary["taxonomy"]["reason"].startswith("too little training")
    assert "Not available: too little training" in text
    assert "too little training for verdicts or a head taxonomy" in text and "None: the log is intact" not in text


def test_norm_divergence_layer(made, log):
    _, summary, text, _ = made
    k_norm = last(log, "k_norm")
    layer = int(np.argmax(k_norm.max(axis=1) - k_norm.min(axis=1)))
    assert summary["norm_divergence_layer"]["layer"] == layer
    assert f"k_norm of each kv head of layer {layer}" in text


def test_stdout_names_the_outcomes(made):
    _, summary, _, stdout = made
    assert "report.md" in stdout
    for key, h in summary["hypotheses"].items():
        assert f"({key}) {h['title']}: {h['verdict']}" in stdout


# -- logs with something wrong ------------------------------------------------------------------------


def frames(data):
    """(offset, type, step, payload length) of every record, read as docs/log_format.md lays them out."""
    pos = 20 + struct.unpack_from("<I", data, 12)[0]
    out = []
    while pos + 24 <= len(data):
        rtype, _, length, step = struct.unpack_from("<HHIq", data, pos + 4)
        out.append((pos, rtype, step, length))
        pos += 24 + length
    return out


def test_truncated_log(log_path, tmp_path):
    data = log_path.read_bytes()
    telemetry = [f for f in frames(data) if f[1] == TELEMETRY]
    cut_at, _, cut_step, _ = telemetry[len(telemetry) // 2]
    cut = tmp_path / "cut.attnlog"
    cut.write_bytes(data[:cut_at + 100])  # a crash in the middle of writing a telemetry record
    result = report(cut, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    text = (tmp_path / "out" / "report.md").read_text()
    assert summary["figures"]["made"] == FIGURES  # everything before the cut is still drawn
    assert summary["stats_steps"]["last"] < cut_step
    torn = f"torn tail: {len(data[:cut_at + 100]) - cut_at} bytes at offset {cut_at} ignored"
    assert torn in summary["problems"] and torn in text
    assert f"of the {STEPS} steps the run planned" in text
    assert "torn tail" in result.stdout


def without_metrics(data, drop):
    """The log as an older trainer that did not measure `drop` would have written it: the metrics
    left out of the header's record table and of every telemetry payload."""
    n = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20:20 + n])
    table = next(t for t in header["records"] if t["type"] == TELEMETRY)
    keep, offset = [], 0
    for field in table["fields"]:
        size = 4 * int(np.prod(field["shape"]))
        if field["name"] not in drop:
            keep.append((offset, size))
        offset += size
    table["fields"] = [f for f in table["fields"] if f["name"] not in drop]
    text = json.dumps(header).encode()
    out = bytearray(b"ATTNLOG\0" + struct.pack("<III", 1, len(text), zlib.crc32(text)) + text)
    for pos, rtype, step, length in frames(data):
        payload = data[pos + 20:pos + 20 + length]
        if rtype == TELEMETRY:
            payload = b"".join(payload[o:o + s] for o, s in keep)
        body = struct.pack("<HHIq", rtype, 0, len(payload), step) + payload
        out += b"\xffREC" + body + struct.pack("<I", zlib.crc32(body))
    return bytes(out)


def test_log_without_some_metrics(log_path, tmp_path):
    older = tmp_path / "older.attnlog"
    older.write_bytes(without_metrics(log_path.read_bytes(), {"k_erank", "attn_sink"}))
    assert attnlog.open_log(older).problems == []  # a well-formed log, just without them
    result = report(older, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    text = (tmp_path / "out" / "report.md").read_text()
    assert summary["missing_metrics"] == ["k_erank", "attn_sink"]
    skipped = {"layer_heatmaps.png": "the log has no attn_sink", "effective_rank.png": "the log has no k_erank",
               "key_offset.png": "the log has no k_erank", "sink_rate.png": "the log has no attn_sink"}
    assert summary["figures"]["skipped"] == skipped
    assert summary["figures"]["made"] == [f for f in FIGURES if f not in skipped]
    assert not (tmp_path / "out" / "sink_rate.png").exists()
    assert "metrics missing from the log: k_erank, attn_sink" in text
    assert "skipped `sink_rate.png`: the log has no attn_sink" in text
    assert summary["taxonomy"]["available"] is False and "attn_sink" in summary["taxonomy"]["reason"]
    assert summary["sink_rate"]["last"] is None
    assert all(summary["hypotheses"][k]["why"] != "no data" for k in "abc")  # they need neither; (d), still in
    assert "no reference step" in summary["hypotheses"]["d"]["detail"]  # warm-up, has no reference step


def test_log_before_doc_starts(log_path, tmp_path):
    """A log written before attn_doc_start and doc_start_visible: read as before, every figure made
    (sink_rate.png without the line of document starts), the report saying they were not measured."""
    older = tmp_path / "older.attnlog"
    older.write_bytes(without_metrics(log_path.read_bytes(), {"attn_doc_start", "doc_start_visible"}))
    result = report(older, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    text = (tmp_path / "out" / "report.md").read_text()
    assert summary["missing_metrics"] == ["attn_doc_start"] and summary["doc_starts"] is None
    assert summary["figures"] == {"made": FIGURES, "skipped": {}}
    assert "Attention on document starts: not measured (the log has no attn_doc_start)." in text
    assert "the attention on document starts" not in text


def with_payloads(data, change):
    """The log with every record's payload passed through change(type, step, payload), checksums
    made to match."""
    out = bytearray(data[:20 + struct.unpack_from("<I", data, 12)[0]])
    for pos, rtype, step, length in frames(data):
        payload = change(rtype, step, data[pos + 20:pos + 20 + length])
        body = struct.pack("<HHIq", rtype, 0, len(payload), step) + payload
        out += b"\xffREC" + body + struct.pack("<I", zlib.crc32(body))
    return bytes(out)


def test_diverged_run(log_path, tmp_path):
    at = attnlog.open_log(log_path).record_types["telemetry"].fields["k_norm"]["offset"]  # in the payload

    def diverge(rtype, step, payload):
        if rtype == 1 and step >= 25:  # the loss, first field of a step record
            return struct.pack("<f", float("nan")) + payload[4:]
        if rtype == TELEMETRY and step >= 20:  # k_norm overflows
            return payload[:at] + struct.pack("<f", float("inf")) + payload[at + 4:]
        return payload

    diverged = tmp_path / "diverged.attnlog"
    diverged.write_bytes(with_payloads(log_path.read_bytes(), diverge))
    result = report(diverged, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "out" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in summary.json"))
    assert summary["figures"]["made"] == FIGURES
    assert summary["stats_steps"]["last"] < 20
    assert summary["loss"]["last_step"] == 24
    problems = " ".join(summary["problems"])
    assert "not finite (k_norm; steps 20..29)" in problems and "training loss is not finite at 5 steps" in problems
    assert "the log ends" not in problems  # its records go on to the last step


def test_metric_shapes_follow_the_header(log_path, tmp_path):
    """A metric's shape is checked against the model configuration through the dims the header's
    table gives it; one that does not fit is left out, saying why."""
    from attnlog import analysis
    data = log_path.read_bytes()
    n = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20:20 + n])
    fields = {f["name"]: f for t in header["records"] if t["type"] == TELEMETRY for f in t["fields"]}
    fields["q_norm"]["shape"] = fields["q_norm"]["shape"][::-1]  # as many values, in another shape
    fields["k_cos"]["dims"] = ["layer", "token"]
    text = json.dumps(header).encode()
    odd = tmp_path / "odd.attnlog"
    odd.write_bytes(b"ATTNLOG\0" + struct.pack("<III", 1, len(text), zlib.crc32(text)) + text + data[20 + n:])
    run = analysis.load_run(odd, "odd")
    assert run["problems"] == [
        'k_cos has dims ["layer", "token"], not layer by one of kv_head, q_head, dim: left out',
        f"q_norm has shape [{HEADS}, {LAYERS}], not the [{LAYERS}, {HEADS}] the model configuration implies: left out"]
    assert run["missing"] == ["k_cos", "q_norm"]
    kept = [name for name in analysis.USED_METRICS if name not in run["missing"]]
    assert run["columns"] == {name: fields[name]["dims"][1] for name in kept}


def test_log_without_telemetry(log_path, tmp_path):
    names = [f["name"] for f in attnlog.open_log(log_path).record_types["telemetry"].fields.values()]
    bare = tmp_path / "bare.attnlog"
    bare.write_bytes(without_metrics(log_path.read_bytes(), set(names) - {"g_q"}))
    result = report(bare, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["figures"]["made"] == ["loss.png"]
    assert all((h["verdict"], h["why"]) == ("inconclusive", "no data") for h in summary["hypotheses"].values())


def test_log_without_records(log_path, tmp_path):
    data = log_path.read_bytes()
    empty = tmp_path / "empty.attnlog"  # a run that died before its first step ended
    empty.write_bytes(data[:20 + struct.unpack_from("<I", data, 12)[0]])
    result = report(empty, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["figures"]["made"] == [] and len(summary["figures"]["skipped"]) == len(FIGURES)
    assert summary["loss"]["last_step"] is None and summary["stats_steps"]["count"] == 0
    assert f"the log has no step records (the run planned {STEPS} steps)" in summary["problems"][0]
    assert "no telemetry records" in (tmp_path / "out" / "report.md").read_text()


# -- user errors: one line, status 2, no traceback ---------------------------------------------------


def test_missing_file(tmp_path):
    assert_one_line_error(report(tmp_path / "absent.attnlog"), "absent.attnlog", "cannot open")


def test_not_a_log(tmp_path):
    text = tmp_path / "loss.csv"
    text.write_text("step,loss\n0,8.0\n")
    assert_one_line_error(report(text), "not a run log")


def test_truncated_header(log_path, tmp_path):
    stub = tmp_path / "stub.attnlog"
    stub.write_bytes(log_path.read_bytes()[:100])
    assert_one_line_error(report(stub), "truncated header")


def test_newer_format_version(log_path, tmp_path):
    data = bytearray(log_path.read_bytes())
    struct.pack_into("<I", data, 8, 2)
    newer = tmp_path / "newer.attnlog"
    newer.write_bytes(bytes(data))
    assert_one_line_error(report(newer), "format version 2 is newer")


def test_bad_options(log_path, tmp_path):
    assert_one_line_error(report(log_path, "--layer", 99, "-o", tmp_path / "a"), "--layer 99", "0..5")
    assert_one_line_error(report(log_path, "--layer", "two"), "--layer")
    assert_one_line_error(report(log_path, "--colour", "red"), "--colour")
    assert_one_line_error(report(), "LOG")
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    assert_one_line_error(report(log_path, "-o", blocker / "out"), "cannot write")


# -- several runs ------------------------------------------------------------------------------------


def test_comparison(log_path, tmp_path):
    data = log_path.read_bytes()
    telemetry = [f for f in frames(data) if f[1] == TELEMETRY]
    (tmp_path / "short").mkdir()
    short = tmp_path / "short" / "run.attnlog"  # the same run, cut after its first third
    short.write_bytes(data[:telemetry[len(telemetry) // 3][0]])
    out = tmp_path / "out"
    result = report(log_path, short, "-o", out, "--layer", 2)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    text = (out / "report.md").read_text()
    comparison = summary["comparison"]
    assert comparison["figures"]["made"] == [f"compare_{m}.png" for m in COMPARED]
    for m in COMPARED:
        assert (out / f"compare_{m}.png").read_bytes()[:4] == b"\x89PNG"
    assert summary["figures"]["made"] == FIGURES  # the first run is reported in full
    assert summary["norm_divergence_layer"] == {"layer": 2, "why": "chosen with --layer"}
    labels = [r["label"] for r in comparison["runs"]]
    assert labels == [f"{log_path.parent.name}/run", "short/run"]  # same file names: told apart
    for row, path in zip(comparison["runs"], (log_path, short)):
        log = attnlog.open_log(path)
        loss, k_norm = log.scalars("loss")[1], last(log, "k_norm")
        x, y = window_kv_means(log)
        assert row["final_loss"] == close(loss[-10:].mean(), **LOGGED)
        assert row["val_loss"] == close(log.val_loss()[1][-1], **LOGGED)
        assert row["k_norm"] == {g: close(group_mean(k_norm, g), **LOGGED) for g in GROUPS}
        assert row["sink_rate"] == close(np.mean(last(log, "attn_sink") > 0.3), **LOGGED)
        assert row["spearman"] == close(within_layers(x, y), **RHO)
        assert f"| {row['label']} | gain | nothing | matrices | {row['last_step']} | {row['final_loss']:.3f} |" in text
    assert comparison["runs"][1]["last_step"] < comparison["runs"][0]["last_step"]
    assert "Problems of short/run: the log ends at step" in text
    assert comparison["replicates"] == []  # one seed twice is no replicate


def test_variant_and_frozen_kinds_are_reported(log_path, tmp_path):
    """A run with --qk-norm plain and --freeze wv is reported as such, its unused gains counted as
    frozen, beside the default run; one with --decay all says that its gains took weight decay."""
    data = log_path.parent.parent / "data"
    for name, args in {"plain": ["--qk-norm", "plain", "--freeze", "wv"], "decayed": ["--decay", "all"]}.items():
        run([TRAIN_BIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TRAIN_ARGS, "-x", 4, *args,
             "-o", tmp_path / name], "the trainer")
    out = tmp_path / "out"
    result = report(log_path, tmp_path / "plain" / "run.attnlog", tmp_path / "decayed" / "run.attnlog", "-o", out)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    text = (out / "report.md").read_text()
    assert summary["variant"] == {"qk_norm": "gain", "frozen": [], "decay": "matrices"}
    assert "QK-norm `gain`, frozen: nothing." in text
    assert "| plain/run | plain | wv, q_gain, k_gain | matrices | 3 |" in text
    assert "| decayed/run | gain | nothing | all | 3 |" in text
    decayed = report(tmp_path / "decayed" / "run.attnlog", "-o", tmp_path / "one")
    assert decayed.returncode == 0, decayed.stderr
    assert "QK-norm `gain`, frozen: nothing, weight decay on: all." in (tmp_path / "one" / "report.md").read_text()


def test_labels(log_path, tmp_path):
    result = report(log_path, log_path, "-o", tmp_path / "out", "--label", "first")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["label"] for r in summary["comparison"]["runs"]] == ["first", f"{log_path.parent.name}/run"]
    assert summary["label"] == "first"
    assert "# Attention-key report: first" in (tmp_path / "out" / "report.md").read_text()
    assert_one_line_error(report(log_path, "--label", "a", "--label", "b", "-o", tmp_path / "x"),
                          "--label given 2 times for 1 logs")


def test_comparison_with_a_run_lacking_a_metric(log_path, tmp_path):
    (tmp_path / "older").mkdir()
    older = tmp_path / "older" / "run.attnlog"
    older.write_bytes(without_metrics(log_path.read_bytes(), {"k_cos"}))
    result = report(log_path, older, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["comparison"]["figures"]["made"] == [f"compare_{m}.png" for m in COMPARED]
    assert "Not in the figure (no k_cos): older/run." in (tmp_path / "out" / "report.md").read_text()


# -- a run trained past the guards, two seeds -----------------------------------------------------------


def window(steps):
    """The decision window: the stats steps in the last quarter of their span."""
    return steps >= steps[-1] - 0.25 * (steps[-1] - steps[0])


def window_kv_means(log, window=window):
    """Decision-window means of k_norm [L, Hkv] and of the entropy of each kv head's query heads."""
    steps, k_norm = log.metric("k_norm")
    entropy = log.metric("attn_entropy")[1].astype(float)
    per_kv = entropy.reshape(len(steps), LAYERS, KV_HEADS, HEADS // KV_HEADS).mean(axis=3)
    w = window(steps)
    return k_norm[w].astype(float).mean(axis=0), per_kv[w].mean(axis=0)


def rule(effect, half, margin):
    """docs/research.md: the one rule every verdict follows."""
    return "supported" if effect - half > margin else "contradicted" if effect + half < -margin else "inconclusive"


def moving_rule(test):
    """The rule, and a test still moving keeps its verdict only if the value its line reaches at the
    window's last step gets the same one (docs/research.md); half-widths that JSON holds as null are
    infinite (no interval)."""
    half = np.inf if test["half_width"] is None else test["half_width"]
    verdict = rule(test["effect"], half, test["margin"])
    if test["moving"] and (verdict == "inconclusive" or rule(test["end"], half, test["margin"]) != verdict):
        return "inconclusive"
    return verdict


def verdict_cell(h):
    """docs/research.md: "still moving" beside a verdict, unless the verdict rests on the run's guard."""
    moving = h["moving"] and h["why"] not in ("too little training", "not settled")
    return f"**{h['verdict']}**" + (" (still moving)" if moving else "")


@pytest.fixture(scope="module")
def trained_paths(log_path):
    """The tiny model trained for 300 steps past a warm-up of 20 (76,800 tokens, 16 stats steps in the
    decision window), with two seeds; run.attnlog made settled (settled), the log as trained kept as
    as_trained.attnlog beside it."""
    data, paths = log_path.parent.parent / "data", []
    for seed in (1337, 7):
        out = log_path.parent.parent / f"trained_{seed}"
        run([TRAIN_BIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TRAINED_ARGS, "--seed", seed,
             "-o", out], "the trainer")
        (out / "run.attnlog").rename(out / "as_trained.attnlog")
        (out / "run.attnlog").write_bytes(settled((out / "as_trained.attnlog").read_bytes()))
        paths.append(out / "run.attnlog")
    return paths


def quarter_before_window_as(data, sources):
    """The log with the telemetry of the quarter of stats steps before its decision window replaced, in
    order, by that of the stats steps sources(steps) names, every other record as it was."""
    records = [(step, data[pos + 20:pos + 20 + length]) for pos, rtype, step, length in frames(data)
               if rtype == TELEMETRY]
    steps = np.array([step for step, _ in records])
    start = steps[window(steps)][0]
    before = steps[(steps < start) & (steps >= 2 * start - steps[-1])]
    copy, payloads = dict(zip(before.tolist(), sources(steps).tolist())), dict(records)
    return with_payloads(data, lambda rtype, step, payload: payloads[copy[step]] if rtype == TELEMETRY and step in copy
                         else payload)


def unsettled(data):
    """The log with the quarter before its decision window made of the run's first stats steps: the
    statistics of a model barely trained, as a run whose last two quarters disagree. Whether the log
    as trained has settled depends on its corpus (the repository's own files, which change), so the
    test that needs a run that has not makes one."""
    return quarter_before_window_as(data, lambda steps: steps)  # zip stops at the quarter's length


def settled(data):
    """The log with the quarter before its decision window made of the window's own stats steps: its
    last two quarters then agree, as the guard asks of statistics that have settled. The tiny model's
    do not within minutes of training (its keys' participation ratio keeps falling), and the verdicts,
    the taxonomy and the replicates need a run that passes the guard; they read the decision window,
    which is the trainer's own."""
    return quarter_before_window_as(data, lambda steps: steps[window(steps)])


@pytest.fixture(scope="module")
def trained(trained_paths):
    """report.py on the first seed's log: (output folder, summary.json, report.md, stdout, the log)."""
    result = report(trained_paths[0])
    assert result.returncode == 0, result.stderr
    outdir = trained_paths[0].parent / "report"
    return (outdir, json.loads((outdir / "summary.json").read_text()), (outdir / "report.md").read_text(),
            result.stdout, attnlog.open_log(trained_paths[0]))


def test_trained_run_passes_the_guards(trained):
    outdir, summary, text, _, log = trained
    steps = log.metric("k_norm")[0]
    assert summary["training"]["enough"] and summary["training"]["reasons"] == []
    assert summary["training"]["tokens"] == TRAINED_STEPS * 4 * T
    assert summary["window"] == {"first": int(steps[window(steps)][0]), "last": TRAINED_STEPS - 1,
                                 "count": int(window(steps).sum()), "fraction": 0.25}
    assert summary["problems"] == [] and "None: the log is intact" in text
    assert summary["figures"] == {"made": FIGURES, "skipped": {}}
    for name in FIGURES:
        assert (outdir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for words in ("(D+2)/3 = 22.0", "Uniform causal attention over T = 64", "It is an estimate from the means",
                  "not the share of sink heads", "k_erank beside k_erank_centered", "are above 0.5"):
        assert words in text, words


def test_trained_run_has_settled(trained):
    _, summary, text, _, _ = trained
    assert summary["training"]["settled"] and summary["training"]["unsettled"] == []
    assert "This run passes: its verdicts and taxonomy are given." in text


def test_a_run_that_has_not_settled(trained_paths, tmp_path):
    """The 300-step log made unsettled (unsettled): some layer's statistics move by more than 5%
    between the last two quarters (each recomputed here), so no verdicts and no taxonomy."""
    path = tmp_path / "unsettled.attnlog"
    path.write_bytes(unsettled((trained_paths[0].parent / "as_trained.attnlog").read_bytes()))
    result = report(path, "-o", tmp_path)
    assert result.returncode == 0, result.stderr
    summary, log = json.loads((tmp_path / "summary.json").read_text()), attnlog.open_log(path)
    steps = log.metric("k_norm")[0]
    start = steps[window(steps)][0]
    before = (steps < start) & (steps >= 2 * start - steps[-1])
    moved = []
    for name, scale in (("k_norm", 8), ("attn_entropy", np.mean(np.log(np.arange(1, T + 1)))), ("k_pr", None)):
        layers = log.metric(name)[1].astype(float).mean(axis=2)
        last, previous = layers[window(steps)].mean(axis=0), layers[before].mean(axis=0)
        moved += [f"layer {l}'s {name} {100 * d:+.1f}%" for l, d in enumerate((last - previous) / (scale or last))
                  if abs(d) > 0.05]
    training = summary["training"]
    assert moved and training["unsettled"] == moved and training["trained"] and not training["enough"]
    assert all(h["why"] == "not settled" for h in summary["hypotheses"].values())
    assert summary["taxonomy"]["available"] is False
    assert "**No verdicts: the statistics have not settled**" in (tmp_path / "report.md").read_text()


def test_epochs(trained, trained_paths):
    """The header's train_tokens is what the training shards hold; the report divides the tokens of the
    run's steps by it."""
    _, summary, text, _, log = trained
    shards = sorted((trained_paths[0].parent.parent / "data").glob("train_*.bin"))
    tokens = sum(int(np.fromfile(p, "<i4", 3)[2]) for p in shards)
    data = summary["data"]
    assert log.header["train_tokens"] == data["train_tokens"] == tokens and data["source"] == "the log's header"
    assert data["tokens_seen"] == TRAINED_STEPS * 4 * T and data["epochs"] == close(TRAINED_STEPS * 4 * T / tokens,
                                                                                    **SAME_F64)
    assert f"The training shards hold {tokens:,} tokens (the log's header), so the {TRAINED_STEPS * 4 * T:,} tokens " \
           f"of this log's steps are {data['epochs']:.2f} epochs" in text


def with_header(data, edit):
    """The log with its header changed by edit(header), the preamble's length and CRC made to match."""
    n = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20:20 + n])
    edit(header)
    text = json.dumps(header).encode()
    return b"ATTNLOG\0" + struct.pack("<III", 1, len(text), zlib.crc32(text)) + text + data[20 + n:]


def test_epochs_of_a_log_without_train_tokens(trained_paths, tmp_path):
    """A log written before train_tokens: the shards its train option names are counted as found now,
    saying so; where none is found, the epochs are unknown, saying why."""
    data = trained_paths[0].read_bytes()
    shards = sorted((trained_paths[0].parent.parent / "data").glob("train_*.bin"))
    tokens = sum(int(np.fromfile(p, "<i4", 3)[2]) for p in shards)
    old = tmp_path / "old.attnlog"
    old.write_bytes(with_header(data, lambda h: h.pop("train_tokens")))
    assert report(old, "-o", tmp_path / "old").returncode == 0
    found = json.loads((tmp_path / "old" / "summary.json").read_text())["data"]
    assert found["train_tokens"] == tokens and found["source"].startswith(f"counted now in the {len(shards)} shard")
    assert "they may not be the shards the run read" in found["source"]

    def elsewhere(header):
        header.pop("train_tokens")
        header["options"]["train"] = str(tmp_path / "gone" / "train_*.bin")
    old.write_bytes(with_header(data, elsewhere))
    assert report(old, "-o", tmp_path / "gone").returncode == 0
    summary = json.loads((tmp_path / "gone" / "summary.json").read_text())
    assert summary["data"]["train_tokens"] is None and summary["data"]["epochs"] is None
    assert "How often it saw each training token is not known: the log does not record it, and no shard " \
           "matches" in (tmp_path / "gone" / "report.md").read_text()


def test_path_in_the_report(trained):
    _, summary, text, _, _ = trained
    path = summary["path"]
    assert [p["fraction"] for p in path] == [0.25, 0.5, 0.75, 1] and path[-1]["end_step"] == TRAINED_STEPS - 1
    assert {k: v["verdict"] for k, v in path[-1]["hypotheses"].items()} == \
        {k: h["verdict"] for k, h in summary["hypotheses"].items()}
    assert "**The verdicts' path.**" in text and f"| to step {TRAINED_STEPS - 1} (100%) |" in text


def test_trained_hypothesis_a(trained):
    _, summary, text, _, log = trained
    x, y = window_kv_means(log)
    rho = spearman(x.ravel(), y.ravel())
    within = spearman((x - x.mean(axis=1, keepdims=True)).ravel(), (y - y.mean(axis=1, keepdims=True)).ravel())
    h = summary["hypotheses"]["a"]
    assert h["n_units"] == LAYERS * KV_HEADS and h["value"] == close(within, **RHO)
    assert h["across"]["rho"] == close(rho, **RHO)
    assert h["layer_means"]["rho"] == close(spearman(x.mean(axis=1), y.mean(axis=1)), **RHO)
    (t,) = h["tests"]
    assert t["effect"] == close(-within, **RHO) and t["half_width"] == h["chance"] and t["margin"] == 0.1
    assert 0 < h["chance"] < 1 and t["verdict"] in (rule(-within, h["chance"], 0.1), "inconclusive")
    row = next(line for line in text.splitlines() if line.startswith("| (a)"))
    assert row.endswith(f"{verdict_cell(h)} |") and f"within layers rho = {within:+.3f} over {LAYERS} layers" in row
    assert f"across all {LAYERS * KV_HEADS} kv heads rho = {rho:+.3f}" in row and "which includes depth" in row


def test_trained_hypothesis_b(trained):
    """The effects are the window means; their intervals and trends those of the series of effects."""
    from attnlog.analysis import window_trend
    _, summary, text, _, log = trained
    steps, k_norm = log.metric("k_norm")
    w = window(steps)
    h = summary["hypotheses"]["b"]
    for t, group, sign in zip(h["tests"], ("early", "final"), (-1, 1)):
        series = np.array([sign * (group_mean(table, group) - 8) / 8 for table in k_norm[w].astype(float)])
        trend = window_trend(steps[w], series)
        assert h[group] == close(np.mean([group_mean(table, group) for table in k_norm[w]]), **LOGGED)
        assert t["effect"] == close(series.mean(), **LOGGED)
        if np.isinf(trend["half_width"]):  # no interval: null in JSON
            assert t["half_width"] is None
        else:
            assert t["half_width"] == close(trend["half_width"], **LOGGED)
        assert t["trend"]["change"] == close(trend["change"], **LOGGED) and t["moving"] == trend["moving"]
        assert t["verdict"] == moving_rule(t)
    verdicts = [t["verdict"] for t in h["tests"]]
    assert h["verdict"] == ("contradicted" if "contradicted" in verdicts else
                            "supported" if verdicts == ["supported"] * 2 else "inconclusive")
    assert f"early {h['early']:.2f}" in text and f"final {h['final']:.2f}" in text


def test_trained_hypothesis_c(trained):
    _, summary, _, _, log = trained
    steps, maxabs = log.metric("k_maxabs")
    share = (maxabs.astype(float) / log.metric("k_norm")[1]) ** 2
    means = share[window(steps)].mean(axis=0)
    top = np.unravel_index(np.argmax(means), means.shape)
    mean = share[window(steps), top[0], top[1]].mean()
    h = summary["hypotheses"]["c"]
    assert h["value"] == int((means > 0.5).sum()) and h["of"] == LAYERS * KV_HEADS
    assert h["max_ratio"] == close(mean, **LOGGED) and h["max_ratio_head"] == [int(top[0]), int(top[1])]
    assert h["tests"][0]["effect"] == close(mean / 0.5 - 1, **LOGGED)
    assert h["verdict"] == moving_rule(h["tests"][0])


def test_trained_hypothesis_d(trained):
    _, summary, _, _, log = trained
    steps, pr = log.metric("k_pr")
    pr = pr.astype(float).mean(axis=(1, 2))
    mean = pr[window(steps)].mean()
    h = summary["hypotheses"]["d"]
    ref = int(np.flatnonzero(steps >= 20)[0])  # the first stats step at or after the warm-up of 20 steps
    assert (h["reference_step"], h["reference"]) == (steps[ref], close(pr[ref], **LOGGED))
    assert (h["first"], h["last"]) == (close(pr[0], **LOGGED), close(mean, **LOGGED))
    assert h["tests"][0]["effect"] == close((pr[ref] - mean) / pr[ref], **LOGGED)
    assert h["verdict"] == moving_rule(h["tests"][0])
    assert "k_erank_centered" in h["detail"] and set(h) >= {"erank", "erank_centered", "mean_share"}


def test_taxonomy(trained):
    _, summary, text, _, log = trained
    w = window(log.metric("k_norm")[0])

    def mean(name):
        return log.metric(name)[1][w].astype(float).mean(axis=0)

    short, long = np.quantile(mean("k_norm"), [1 / 3, 2 / 3])  # thirds of the kv heads' key norms
    k_norm = mean("k_norm")[:, KV_OF]
    share = (log.metric("k_maxabs")[1].astype(float) / log.metric("k_norm")[1].astype(float))[w] ** 2
    share = share.mean(axis=0)[:, KV_OF]
    entropy, sink = mean("attn_entropy"), mean("attn_sink")
    focus = 0.5 * np.mean(np.log(np.arange(1, T + 1)))  # half the entropy of uniform causal attention
    expected, diffuse_amplified = {}, []
    for layer in range(LAYERS):
        for h in range(HEADS):
            if sink[layer, h] > 0.3:
                cls = "static sink"
            elif entropy[layer, h] < focus and k_norm[layer, h] > long:
                cls = "semantic retriever"
            elif entropy[layer, h] >= focus and k_norm[layer, h] < short and share[layer, h] <= 0.5:
                cls = "syntactic gatherer"
            else:
                cls = "other"
            expected[(layer, h)] = cls
            if cls != "static sink" and entropy[layer, h] >= focus and k_norm[layer, h] > 1.05 * 8:
                diffuse_amplified.append([layer, h])
    tax = summary["taxonomy"]
    assert tax["available"] and tax["step"] == TRAINED_STEPS - 1 and tax["window"][1] == TRAINED_STEPS - 1
    assert {(x["layer"], x["head"]): x["class"] for x in tax["heads"]} == expected
    counts = {cls: list(expected.values()).count(cls) for cls in tax["rules"]}
    assert tax["counts"] == counts and sum(counts.values()) == LAYERS * HEADS
    for cls, rule_text in tax["rules"].items():  # each rule is written next to its class, with its count
        assert f"| {cls} | {rule_text} | {counts[cls]} |" in text
    assert (tax["short_k_norm"], tax["long_k_norm"]) == (close(short, **LOGGED), close(long, **LOGGED))
    assert tax["diffuse_amplified"]["heads"] == diffuse_amplified
    assert f"**Diffuse but amplified:** {len(diffuse_amplified)} of the {tax['diffuse_amplified']['diffuse']}" in text


def test_replicates(trained_paths, trained, tmp_path):
    """Two seeds of one configuration: per test, the mean of the runs' effects and its 95% t-interval
    (t = 12.706 for 2 runs) decide the verdict over the seeds."""
    second = report(trained_paths[1], "-o", tmp_path / "second")
    assert second.returncode == 0, second.stderr
    summaries = [trained[1], json.loads((tmp_path / "second" / "summary.json").read_text())]
    result = report(*trained_paths, "-o", tmp_path / "both", "--label", "seed 1337", "--label", "seed 7")
    assert result.returncode == 0, result.stderr
    both = json.loads((tmp_path / "both" / "summary.json").read_text())
    text = (tmp_path / "both" / "report.md").read_text()
    (rep,) = both["comparison"]["replicates"]
    assert rep["runs"] == ["seed 1337", "seed 7"] and rep["seeds"] == ["1337", "7"] and rep["left_out"] == {}
    assert rep["counted"] == rep["runs"]
    for key, h in rep["hypotheses"].items():
        for j, t in enumerate(h["tests"]):
            effects = [s["hypotheses"][key]["tests"][j]["effect"] for s in summaries]
            mean, half = np.mean(effects), 12.706 * np.std(effects, ddof=1) / np.sqrt(2)
            assert t["values"] == close(effects, **LOGGED) and t["n"] == 2 and t["t"] == 12.706
            assert (t["mean"], t["half_width"]) == (close(mean, **LOGGED), close(half, **LOGGED))
            assert t["verdict"] == rule(mean, half, t["margin"])
    assert "### Replicates: seed 1337, seed 7" in text
    assert "over the seeds 1337, 7 of seed 1337, seed 7:" in result.stdout
    # the notes' claims over the seeds: each run's values, their mean, sd and range, and in how many
    # runs the claim reproduces
    rows = {row["id"]: row for s in summaries for note in s["claims"]["notes"] for row in note["rows"]}
    assert [c["id"] for c in rep["claims"]] == list(rows)
    decided_somewhere = 0
    for claim in rep["claims"]:
        per_run = [{row["id"]: row for note in s["claims"]["notes"] for row in note["rows"]}[claim["id"]]
                   for s in summaries]
        decided = [(label, row) for label, row in zip(rep["counted"], per_run)
                   if row["outcome"] in ("reproduces", "does not reproduce")]
        assert claim["outcomes"] == {label: row["outcome"] for label, row in zip(rep["counted"], per_run)}
        assert claim["values"] == {label: close(row["values"], **LOGGED) for label, row in decided}
        assert claim["decided"] == len(decided)
        if not decided:
            assert (claim["outcome"], claim["why"]) == (per_run[0]["outcome"], per_run[0]["why"])
            continue
        decided_somewhere += 1
        values = np.array([row["values"] for _, row in decided])
        assert np.isfinite(values).all()
        assert claim["mean"] == close(values.mean(axis=0).tolist(), **LOGGED)
        assert claim["sd"] == (close(values.std(axis=0, ddof=1).tolist(), **LOGGED) if len(decided) > 1
                               else [None] * values.shape[1])
        reproduced = sum(row["outcome"] == "reproduces" for _, row in decided)
        assert claim["reproduced"] == reproduced and claim["why"].startswith(f"in {reproduced} of {len(decided)} runs")
        assert claim["outcome"] == ("reproduces" if reproduced == len(decided) else
                                    "does not reproduce" if reproduced == 0 else "mixed")
        assert f"| {claim['claim']} |" in text and f"**{claim['outcome']}**: {claim['why']} |" in text
        assert f"{decided[0][0]}: {decided[0][1]['values'][0]:#.3g}" in text  # each value beside its run's label
    assert decided_somewhere >= 5
    assert "| claim | at | each run | mean \u00b1 sd (range) | reproduces when | over the runs |" in text


def test_twelve_step_run(log_path, tmp_path):
    """A run of 12 steps gives only inconclusive verdicts and no taxonomy, whatever its numbers."""
    data = log_path.parent.parent / "data"
    run([TRAIN_BIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TRAIN_ARGS, "-x", 12, "--threads", 1,
         "-o", tmp_path / "run"], "the trainer")
    result = report(tmp_path / "run" / "run.attnlog")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text())
    text = (tmp_path / "run" / "report" / "report.md").read_text()
    assert [h["verdict"] for h in summary["hypotheses"].values()] == ["inconclusive"] * 4
    assert [h["why"] for h in summary["hypotheses"].values()] == ["too little training"] * 3 + ["no data"]
    assert summary["taxonomy"]["available"] is False and "syntactic gatherer | not a sink" not in text
    assert "None: the log is intact" not in text and "the run has not left warm-up (last step 11 < warmup 40)" in text
    for key, h in list(summary["hypotheses"].items())[:3]:  # (d) has no reference step after the warm-up
        assert f"({key}) {h['title']}: inconclusive (too little training" in result.stdout


def test_started_from_a_checkpoint(log_path, tmp_path):
    """A run started with -e from the 30-step run's weights: the log's note is read, the report says
    where its steps start, and the check for too little training counts the checkpoint's steps."""
    data, checkpoint = log_path.parent.parent / "data", log_path.parent / "model.ckpt"
    run([TRAIN_BIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin", *TRAIN_ARGS, "-x", 12, "--threads", 1,
         "-e", checkpoint, "-o", tmp_path / "run"], "the trainer")
    result = report(tmp_path / "run" / "run.attnlog")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text())
    text = (tmp_path / "run" / "report" / "report.md").read_text()
    assert summary["init"] == {"checkpoint": str(checkpoint), "steps": STEPS}
    assert summary["training"]["init_steps"] == STEPS and summary["training"]["steps_trained"] == STEPS + 12
    assert summary["training"]["tokens"] == (STEPS + 12) * 4 * T
    assert f"which had trained {STEPS} steps. Its steps count from 0 at that point" in text
    assert f"the {STEPS} steps of the checkpoint included" in text
    assert "the run has not left warm-up (last step 11 < warmup 40)" in text  # its own warm-up, from its step 0
    from attnlog import analysis
    assert analysis.started_from({"init": "w.ckpt"}, []) == {"checkpoint": "w.ckpt", "steps": None}
    assert analysis.started_from({"init": ""}, [(0, "resumed at step 5")]) is None


def test_started_from_a_hugging_face_checkpoint():
    """The note ./train -e DIR writes for a Hugging Face directory (llmc/run_dir.h) names the
    directory, its architecture and dtypes; the report says the run fine-tunes a pretrained model,
    the figures' step axis starts from it, and the claims about a point of training are set aside."""
    from attnlog import analysis, claims, report, run_figures
    note = ("started from the Hugging Face checkpoint /m/Qwen3-0.6B (Qwen3ForCausalLM, bfloat16 weights; this "
            "log's steps count from 0 at that point)")
    init = analysis.started_from({"init": "/m/Qwen3-0.6B"}, [(0, note)])
    assert init == {"checkpoint": "/m/Qwen3-0.6B", "steps": None, "pretrained": "Qwen3ForCausalLM, bfloat16 weights"}
    text = report.started_text(init)
    assert "fine-tunes the pretrained Hugging Face checkpoint `/m/Qwen3-0.6B` (Qwen3ForCausalLM, bfloat16 weights" in text
    assert run_figures.step_label({"init": init, "measurement": None}) == "step of this run (from the pretrained weights)"
    assert claims.run_dynamics({"init": init, "measurement": None}) == (
        False, "the run fine-tunes a pretrained checkpoint, whose pretraining is no step of this log")


# -- the verdict rule, on constructed data -------------------------------------------------------------


def constructed_run(k_norm, entropy, steps=None, **metrics):
    """A run as analysis.load_run returns it, from arrays: k_norm [S, L, Hkv], attn_entropy [S, L, H] and
    any other metric (name=array); enough training for verdicts."""
    from attnlog import analysis
    steps = np.arange(len(k_norm)) * 10 if steps is None else np.asarray(steps)
    arrays = dict(metrics, k_norm=k_norm, attn_entropy=entropy)
    return {"L": k_norm.shape[1], "Hkv": k_norm.shape[2], "H": entropy.shape[2], "D": 64, "seq_len": T,
            "metrics": {name: (steps, np.asarray(a, float)) for name, a in arrays.items()},
            "columns": {name: "q_head" if name.startswith("attn") else "kv_head" for name in arrays},
            "missing": [m for m in analysis.USED_METRICS if m not in arrays], "stats_steps": steps,
            "window": analysis.decision_window(steps),
            "groups": analysis.layer_groups(k_norm.shape[1]), "init": None, "options": {"warmup": "0"},
            "step_range": (0, int(steps[-1])), "tokens_per_step": 10 ** 6, "loss": (steps, np.zeros(len(steps))),
            "val": (steps[-1:], np.zeros(1))}


def correlated(sign, layers=6, kv=4, heads=4, steps=20, seed=0):
    """k_norm and entropy with entropy = 10 + sign * k_norm (+ small noise), or independent (sign 0)."""
    rng = np.random.default_rng(seed)
    k_norm = np.broadcast_to(rng.uniform(6, 10, (1, layers, kv)), (steps, layers, kv)) + \
        0.01 * rng.standard_normal((steps, layers, kv))
    per_q = np.repeat(k_norm, heads // kv, axis=2)
    entropy = (10 + sign * per_q if sign else rng.uniform(1, 3, (1, layers, heads))) + \
        0.05 * rng.standard_normal((steps, layers, heads))
    return k_norm, entropy


def test_three_way_verdicts_of_a_correlation():
    from attnlog import verdicts
    for sign, expected in ((-1, "supported"), (1, "contradicted"), (0, "inconclusive")):
        run = constructed_run(*correlated(sign))
        h = verdicts.hypotheses(run, verdicts.training_status(run))[0]
        assert h["verdict"] == expected, (sign, h["detail"])
        assert h["n_units"] == 6 * 4
    again = verdicts.hypothesis_entropy_norm(constructed_run(*correlated(0)))
    assert again["p_value"] == verdicts.hypothesis_entropy_norm(constructed_run(*correlated(0)))["p_value"]


def test_per_kv_head_units():
    """8 query heads reading 2 kv heads in each of 6 layers: 12 independent units, each kv head with the
    mean entropy of its 4 query heads."""
    from attnlog import verdicts
    k_norm, entropy = correlated(-1, layers=6, kv=2, heads=8)
    h = verdicts.hypothesis_entropy_norm(constructed_run(k_norm, entropy))
    assert h["n_units"] == 12 and h["across"]["n"] == 12
    per_kv = entropy.reshape(20, 6, 2, 4).mean(axis=3)
    w = slice(15, 20)  # steps 150..190: the last quarter of 0..190
    x, y = k_norm[w].mean(axis=0), per_kv[w].mean(axis=0)
    assert h["across"]["rho"] == close(spearman(x.ravel(), y.ravel()), **RHO)
    assert h["value"] == close(within_layers(x, y), **RHO)


def test_one_dead_band_for_every_hypothesis():
    from attnlog import verdicts
    assert verdicts.decide(0.2, 0.05, 0.1) == ("supported", "decided")
    assert verdicts.decide(-0.2, 0.05, 0.1) == ("contradicted", "decided")
    assert verdicts.decide(0.12, 0.05, 0.1) == ("inconclusive", "uncertain")  # beyond the margin, not its interval
    assert verdicts.decide(0.08, 0.001, 0.1) == ("inconclusive", "within the margin")
    assert verdicts.decide(float("nan"), 0.1, 0.1) == ("inconclusive", "no data")
    flat = np.full((20, 6, 4), 8.0)
    entropy = np.full((20, 6, 4), 2.0)
    for fall, expected in ((0.041, "inconclusive"), (0.10, "supported"), (-0.10, "contradicted")):
        pr = np.concatenate([np.full((1, 6, 4), 22.0), np.full((19, 6, 4), 22.0 * (1 - fall))])
        h = verdicts.hypothesis_pr_falls(constructed_run(flat, entropy, k_pr=pr))
        assert verdicts.combine(h["tests"])[0] == expected, fall  # (d): a fall of 4.1% is no collapse
    for early, final, expected in ((0.96, 1.04, "inconclusive"), (0.9, 1.1, "supported"), (1.1, 1.1, "contradicted")):
        k_norm = flat.copy()
        k_norm[:, :2], k_norm[:, -2:] = 8 * early, 8 * final
        h = verdicts.hypothesis_hierarchy(constructed_run(k_norm, entropy))
        assert verdicts.combine(h["tests"])[0] == expected, (early, final)  # (b): the same 5% margin


def test_t_interval_by_hand():
    from attnlog import analysis
    mean, half, n = analysis.mean_interval([0.1, 0.3, 0.2])
    assert (mean, n) == (close(0.2, **SAME_F64), 3) and half == close(4.303 * 0.1 / np.sqrt(3), **SAME_F64)
    assert analysis.t975(1) == 12.706 and analysis.t975(30) == 2.042
    # Against a table's three decimals (+-5e-4), the expansion's own error being below 1e-4.
    assert analysis.t975(40) == close(2.021, atol=1e-3) and analysis.t975(120) == close(1.980, atol=1e-3)
    assert np.isnan(analysis.mean_interval([0.5])[1])


# -- autocorrelation, trends, within-layer structure, the guard, the path: constructed runs -------------


def ar1(phi, n, rng, count=1):
    """count stationary AR(1) series of n steps with unit innovations: u_t = phi u_(t-1) + e_t."""
    shocks = rng.standard_normal((count, n))
    series = np.empty_like(shocks)
    series[:, 0] = shocks[:, 0] / np.sqrt(1 - phi ** 2)
    for t in range(1, n):
        series[:, t] = phi * series[:, t - 1] + shocks[:, t]
    return series


def naive_half(sample):
    """The t-interval that counts every window step as an independent sample."""
    n = len(sample)
    return {29: 2.045, 39: 2.023}[n - 1] * np.std(sample, ddof=1) / np.sqrt(n)


def test_autocorrelated_series_without_trend():
    """AR(1) noise with phi = 0.8 around a constant: no trend is flagged, and the interval of the mean
    is wider than the naive t-interval; over 300 such series it holds the true mean (0) far more often
    than the naive one, which counts each step as a sample (about 50% of the time at phi = 0.8)."""
    from attnlog.analysis import window_trend
    rng = np.random.default_rng(3)
    steps = np.arange(40) * 10
    trend = window_trend(steps, ar1(0.8, 40, rng)[0])
    assert not trend["moving"] and abs(trend["change"]) < trend["change_half"]
    assert trend["half_width"] > naive_half(ar1(0.8, 40, np.random.default_rng(3))[0])
    assert 0.5 < trend["phi"] < 0.99 and trend["n_eff"] < 40 / 3
    series = ar1(0.8, 30, rng, 300)
    trends = [window_trend(steps[:30], s) for s in series]
    covered = np.mean([abs(t["mean"]) <= t["half_width"] for t in trends])
    naive = np.mean([abs(s.mean()) <= naive_half(s) for s in series])
    assert covered >= 0.85 and naive <= 0.65, (covered, naive)
    assert np.mean([t["moving"] for t in trends]) <= 0.12  # a 5% test that autocorrelation makes a little liberal


def test_trending_series_is_moving():
    """A line rising by 1 across the window under AR(1) noise of sd 0.1: still moving, the change
    found within its interval, and the line's end value half the change above the mean."""
    from attnlog.analysis import window_trend
    steps = np.arange(30) * 10
    series = steps / steps[-1] + 0.1 * np.sqrt(1 - 0.5 ** 2) * ar1(0.5, 30, np.random.default_rng(4))[0]
    trend = window_trend(steps, series)
    assert trend["moving"] and abs(trend["change"] - 1) < trend["change_half"] < 0.3
    assert trend["end"] == close(trend["mean"] + trend["change"] / 2, **SAME_F64)


def test_window_trend_by_hand():
    """Residuals of the line with negative lag-1 autocorrelation: phi = 0, n_eff = n, and the intervals
    are the t-intervals of least squares with n - 2 degrees of freedom."""
    from attnlog.analysis import window_trend
    steps, series = np.arange(6) * 10.0, np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]) + 0.01 * np.arange(6)
    trend = window_trend(steps, series)
    x = steps - steps.mean()
    slope = x @ (series - series.mean()) / (x @ x)
    residuals = series - series.mean() - slope * x
    variance = residuals @ residuals / 4
    assert (trend["phi"], trend["n_eff"]) == (0.0, 6.0)
    assert trend["half_width"] == close(2.776 * np.sqrt(variance / 6), **SAME_F64)
    assert trend["change"] == close(slope * 50, **SAME_F64)
    assert trend["change_half"] == close(2.776 * np.sqrt(variance / (x @ x)) * 50, **SAME_F64)
    short = window_trend(steps[:2], series[:2])
    assert short["mean"] == 0.505 and np.isnan(short["half_width"]) and not short["moving"]
    smooth = window_trend(np.arange(20.0), np.cumsum(np.random.default_rng(0).standard_normal(20)))
    assert smooth["n_eff"] < 3 and smooth["half_width"] == np.inf  # a random walk: no interval


def test_a_moving_test_keeps_its_verdict_only_if_its_end_does():
    from attnlog import verdicts
    trend = {"moving": True, "mean": 0.0, "change": 0.04, "change_half": 0.01, "n": 20, "n_eff": 10.0, "phi": 0.3}
    away = verdicts.make_test("t", 0.10, 0.01, 0.05, "u", dict(trend, end=0.02))  # rising further: supported
    assert (away["verdict"], away["why"], away["moving"], away["end"]) == ("supported", "decided", True,
                                                                           close(0.12, **SAME_F64))
    back = verdicts.make_test("t", 0.07, 0.01, 0.05, "u", dict(trend, end=-0.02))  # falling into the dead band
    assert (back["verdict"], back["why"], back["end"]) == ("inconclusive", "still moving", close(0.05, **SAME_F64))
    settled = verdicts.make_test("t", 0.07, 0.01, 0.05, "u", dict(trend, moving=False, end=-0.02))
    assert (settled["verdict"], settled["why"]) == ("supported", "decided")
    assert verdicts.decide(0.2, float("inf"), 0.1) == ("inconclusive", "uncertain")  # no interval, no decision
    assert verdicts.combine([away, back]) == ("inconclusive", "still moving")


def layered(within, between, layers=12, kv=4, heads=8, steps=20, seed=0):
    """k_norm [S, L, kv] and attn_entropy [S, L, heads]: each layer's mean key norm and entropy
    related across layers with slope `between` (0: independent), and its kv heads' deviations from
    the layer's means related with slope `within` (0: independent); small noise at each step."""
    rng = np.random.default_rng(seed)
    layer_norm = rng.uniform(6, 10, layers)
    layer_entropy = 3 + (between * (layer_norm - 8) if between else rng.uniform(-1, 1, layers))
    deviation = rng.uniform(-1, 1, (layers, kv))
    deviation -= deviation.mean(axis=1, keepdims=True)  # the layer's mean is its own
    head_entropy = within * deviation if within else rng.uniform(-1, 1, (layers, kv))
    head_entropy -= head_entropy.mean(axis=1, keepdims=True)
    k_norm = (layer_norm[:, None] + deviation)[None] + 0.01 * rng.standard_normal((steps, layers, kv))
    entropy = np.repeat((layer_entropy[:, None] + head_entropy)[None], heads // kv, axis=2)
    return k_norm, entropy + 0.01 * rng.standard_normal((steps, layers, heads))


def test_within_layer_relation_without_depth():
    """Heads of a layer with longer keys attend more sharply, the layers' means unrelated: (a) is
    supported within layers, and the layers' means show no relation."""
    from attnlog import verdicts
    run = constructed_run(*layered(within=-1, between=0))
    h = verdicts.hypotheses(run, verdicts.training_status(run))[0]
    assert h["verdict"] == "supported" and h["value"] < -0.9 and h["p_value"] < 0.001, h["detail"]
    assert abs(h["layer_means"]["rho"]) < h["layer_means"]["chance"]
    assert "which includes depth" in h["detail"]


def test_depth_without_a_within_layer_relation():
    """Deep layers with longer keys and sharper attention, the heads of each layer unrelated: across
    all kv heads rho is strongly negative (depth), the layers' means perfectly so, but within layers
    there is nothing beyond chance, and (a) is inconclusive."""
    from attnlog import verdicts
    run = constructed_run(*layered(within=0, between=-1))
    h = verdicts.hypotheses(run, verdicts.training_status(run))[0]
    assert h["verdict"] == "inconclusive" and abs(h["value"]) < h["chance"], h["detail"]
    assert h["across"]["rho"] < -0.5 and h["across"]["p"] < 0.001 and h["layer_means"]["rho"] == close(-1, **RHO)


def test_within_layer_null_shuffles_only_within_layers():
    """The permutation null of rho within layers keeps every head in its layer: with two layers of
    three heads each, only (3!)^2 = 36 pairings exist, so the smallest two-sided p is near 2/36."""
    from attnlog.analysis import rank_correlation
    x, y = np.array([1.0, 2, 3, 11, 12, 13]), np.array([3.0, 2, 1, 13, 12, 11])
    within = rank_correlation(x, y, strata=np.array([0, 0, 0, 1, 1, 1]))
    assert within["rho"] == close(-1, **RHO) and within["p"] == close(2 / 36, atol=0.01)
    assert rank_correlation(x, y)["rho"] > 0  # across both layers, depth makes it positive


def trending(rise, steps=80, layers=6, kv=4):
    """k_norm rising by `rise` x sqrt(D) across the decision window (the last quarter of 80 stats
    steps) in every layer, flat before it, with small noise."""
    from attnlog.analysis import decision_window
    rng = np.random.default_rng(5)
    s = np.arange(steps) * 10
    start = s[decision_window(s)[0]]
    path = 8 * (1 + rise * np.clip((s - start) / (s[-1] - start), 0, 1))
    k_norm = path[:, None, None] + 0.002 * rng.standard_normal((steps, layers, kv))
    return constructed_run(k_norm, np.full((steps, layers, 8), 2.0), steps=s)


def test_guard_asks_whether_the_statistics_have_settled():
    """Keys growing by 20% of sqrt(D) across the window, flat before it: the window's mean is 10% above
    the quarter before, so no verdicts and no taxonomy, saying that the statistics have not settled;
    growing by 2%: they have (the growth is only still moving)."""
    from attnlog import verdicts
    run = trending(0.20)
    training = verdicts.training_status(run)
    assert not training["enough"] and training["trained"] and not training["settled"]
    assert training["unsettled"][0] == "layer 0's k_norm +10.0%" and len(training["unsettled"]) == 6
    assert "the statistics have not settled" in training["reasons"][0] and "from the quarter before" in \
        training["reasons"][0]
    with_all = dict(run, metrics=dict(run["metrics"], k_maxabs=run["metrics"]["k_norm"],
                                      attn_sink=run["metrics"]["attn_entropy"]), missing=[])
    assert verdicts.taxonomy(with_all, training)["reason"].startswith("the statistics have not settled")
    assert [h["why"] for h in verdicts.hypotheses(run, training)] == ["not settled", "not settled", "no data",
                                                                      "no data"]  # (c), (d): no k_maxabs, k_pr
    settled = verdicts.training_status(trending(0.02))
    assert settled["enough"] and settled["unsettled"] == []
    (b,) = [h for h in verdicts.hypotheses(trending(0.02), settled) if h["id"] == "b"]
    assert b["moving"] and all(t["moving"] for t in b["tests"])


def test_reference_step_is_the_end_of_warmup():
    """k_pr rising from 22 to 24 during a warm-up of 40 steps, then falling to 21.6: 10% below the
    reference at the end of warm-up (supported), though only 1.8% below the first step."""
    from attnlog import verdicts
    s = np.arange(80) * 10
    pr = np.where(s <= 40, 22 + 2 * s / 40, 21.6 + 2.4 * np.exp(-(s - 40) / 60))[:, None, None] * np.ones((1, 6, 4))
    pr[5:] += 0.01 * np.random.default_rng(7).standard_normal(pr[5:].shape)  # noise after the reference step
    run = constructed_run(np.full((80, 6, 4), 8.0), np.full((80, 6, 4), 2.0), steps=s, k_pr=pr)
    run["options"] = {"warmup": "40"}
    h = verdicts.hypothesis_pr_falls(run)
    assert (h["reference_step"], h["reference"], h["first"]) == (40, 24.0, 22.0)
    assert h["tests"][0]["effect"] == close(1 - h["last"] / 24, **SAME_F64) and h["tests"][0]["verdict"] == "supported"
    assert "24.00 at step 40 (the end of warm-up)" in h["detail"] and "from the first stats step" in h["detail"]
    run["options"] = {"warmup": "700"}  # no stats step past the warm-up before the window
    assert verdicts.hypothesis_pr_falls(run)["tests"] == []


def test_verdict_path():
    """Keys of the final layers that grow from step 500 to 800 of 1190: (b) is supported only when the
    run's window is past that growth; at 75% the growth ends inside the window, whose statistics have
    not settled; every end of the path has its own window."""
    from attnlog import verdicts
    s = np.arange(120) * 10
    k_norm = np.full((120, 6, 4), 8.0)
    k_norm[:, :2] = 7.2  # early keys dampened throughout
    k_norm[:, -2:] = 8 + 1.2 * np.clip((s - 500) / 300, 0, 1)[:, None, None]  # final keys: 8 -> 9.2
    run = constructed_run(k_norm + 0.01 * np.random.default_rng(2).standard_normal(k_norm.shape),
                          np.full((120, 6, 4), 2.0), steps=s)
    path = verdicts.verdict_path(run)
    assert [p["end_step"] for p in path] == [290, 590, 890, 1190] and [p["fraction"] for p in path] == [0.25, 0.5,
                                                                                                          0.75, 1]
    assert [p["window"] for p in path] == [[220, 290], [450, 590], [670, 890], [900, 1190]]
    assert [p["enough"] for p in path] == [True, True, False, True]
    assert [p["hypotheses"]["b"]["why"] for p in path] == ["within the margin", "within the margin", "not settled",
                                                         "decided"]
    assert [p["hypotheses"]["b"]["verdict"] for p in path] == ["inconclusive"] * 3 + ["supported"]
    final = verdicts.hypotheses(run, verdicts.training_status(run))
    assert {h["id"]: h["verdict"] for h in final} == {k: v["verdict"] for k, v in path[-1]["hypotheses"].items()}


def test_taxonomy_thresholds_are_the_runs():
    """Every key amplified (9 to 12 > 1.05 x 8): long and short are the thirds of the run's kv heads,
    and the diffuse heads with amplified keys are counted and named, against the notes' premise."""
    from attnlog import verdicts
    rng = np.random.default_rng(6)
    k_norm = np.broadcast_to(rng.uniform(9, 12, (1, 6, 4)), (20, 6, 4)).copy()
    entropy = np.broadcast_to(rng.uniform(0.5, 4, (1, 6, 4)), (20, 6, 4)).copy()  # one query head per kv head
    run = constructed_run(k_norm, entropy, k_maxabs=0.1 * k_norm, attn_sink=np.full((20, 6, 4), 0.01))
    tax = verdicts.taxonomy(run, verdicts.training_status(run))
    short, long = np.quantile(k_norm[0], [1 / 3, 2 / 3])
    assert (tax["short_k_norm"], tax["long_k_norm"]) == (close(short, **SAME_F64), close(long, **SAME_F64))
    focus = 0.5 * np.mean(np.log(np.arange(1, T + 1)))
    for head in tax["heads"]:
        k, e = k_norm[0, head["layer"], head["head"]], entropy[0, head["layer"], head["head"]]
        expected = ("semantic retriever" if e < focus and k > long else
                    "syntactic gatherer" if e >= focus and k < short else "other")
        assert head["class"] == expected
    diffuse = [[l, h] for l in range(6) for h in range(4) if entropy[0, l, h] >= focus]
    group = tax["diffuse_amplified"]
    assert group["heads"] == diffuse and group["count"] == group["diffuse"] == len(diffuse) > 0
    assert group["contradicts_premise"] and group["amplified_k_norm"] == 8.4

# -- the HTML and Markdown pages: contents, anchors, collapsed lists, empty values ---------------------


class Page(HTMLParser):
    """The elements of an HTML page: ids, their tags, links, and for each element the tags it lies in."""
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self, text):
        super().__init__()
        self.open, self.ids, self.links, self.elements = [], [], [], []  # elements: (tag, attrs, inside, text)
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append([tag, attrs, [t for t, _ in self.open], ""])
        if "id" in attrs:
            self.ids.append((tag, attrs["id"]))
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag not in self.VOID:
            self.open.append((tag, self.elements[-1]))

    def handle_endtag(self, tag):
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, element in self.open:
            element[3] += data


def github_anchor(heading, seen):
    """GitHub's anchor of a Markdown heading: marks dropped, lower case, punctuation dropped, spaces
    to hyphens, -1, -2, ... for a repeat (seen counts the slugs so far)."""
    slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").replace("**", "").lower()).replace(" ", "-")
    seen[slug] = seen.get(slug, -1) + 1
    return f"{slug}-{seen[slug]}" if seen[slug] else slug


def test_html_contents_and_anchors(made):
    outdir, _, _, _ = made
    page = Page((outdir / "report.html").read_text())
    ids = [i for _, i in page.ids]
    assert len(ids) == len(set(ids))  # unique
    headings = [e for e in page.elements if e[0] in ("h2", "h3")]
    assert headings and all("id" in e[1] for e in headings)
    toc = [e[1]["href"] for e in page.elements if e[0] == "a" and "nav" in e[2]]
    assert toc == ["#" + e[1]["id"] for e in headings]  # every heading, in order
    assert all(link[1:] in ids for link in page.links if link.startswith("#"))
    nav = next(i for i, e in enumerate(page.elements) if e[0] == "nav")
    assert nav < page.elements.index(headings[0])  # at the top


def test_markdown_contents(made):
    _, _, text, _ = made
    headings = re.findall(r"^(#{1,3}) (.+)$", text, re.M)
    seen = {}
    anchors = {title: github_anchor(title, seen) for _, title in headings}
    links = re.findall(r"^\s*- \[(.+?)\]\(#(.+?)\)$", text, re.M)
    assert [(title, anchors[title]) for level, title in headings if level != "#"] == links
    assert text.index("**Contents**") < text.index("\n## ")
    assert "| option | value |" in text and "|---|---|" in text  # tables stay tables


def test_long_tables_collapsed_and_empty_values(made, log):
    outdir, _, text, _ = made
    page = Page((outdir / "report.html").read_text())
    options = log.header["options"]
    empty = [name for name, value in options.items() if value == ""]
    assert empty  # -e and -r were not given
    tables = [e for e in page.elements if e[0] == "table"]
    option_table = next(e for e in tables if e[3].startswith("optionvalue"))
    assert "details" in option_table[2]
    summaries = [e[3] for e in page.elements if e[0] == "summary"]
    assert f"{len(options)} rows: option, value" in summaries
    for name in empty:
        assert f"<tr><td>{name}</td><td></td></tr>" in (outdir / "report.html").read_text()
        assert f"| {name} |  |" in text
    assert "``" not in text and "<code></code>" not in (outdir / "report.html").read_text()


def test_html_blocks():
    from attnlog import document
    blocks = [("h1", "Title"), ("h2", "Same"), ("h3", "Part `one`"), ("h2", "Same"), ("p", "text"),
              ("list", [f"item {i}" for i in range(12)]), ("list", ["short", "list"]),
              ("table", ["a", "b"], [["x", "L0H0, L0H1, L0H2, L0H3, L1H0, L1H1, L1H2, L1H3, L2H0"]])]
    page = Page(document.to_html(blocks, "Title", Path("."), refresh=3))
    assert [i for _, i in page.ids] == ["title", "same", "part-one", "same-1"]
    assert [e[1]["href"] for e in page.elements if e[0] == "a"] == ["#same", "#part-one", "#same-1"]
    lists = [e for e in page.elements if e[0] == "ul" and "nav" not in e[2]]
    assert ["details" in e[2] for e in lists] == [True, False]  # 12 items collapsed, 2 not
    assert [e[3] for e in page.elements if e[0] == "summary"] == ["12 items", "L0H0, L0H1, L0H2, \u2026 (9 in all)"]
    assert [e[1] for e in page.elements if e[0] == "meta" and "http-equiv" in e[1]] == \
        [{"http-equiv": "refresh", "content": "3"}]
    assert "http-equiv" not in document.to_html(blocks, "Title", Path("."))
    text = document.to_markdown(blocks)
    assert "- [Same](#same)\n  - [Part one](#part-one)\n- [Same](#same-1)\n" in text


def test_html_shows_text_as_it_is():
    """What Markdown would read as markup (a note's data globs, a Windows path, a tag, a line break,
    a | in a table's code) shows in report.html as the text it is; **bold** and `code` are marks."""
    from attnlog import document
    note = 'step 9: resumed; run: {"train": "data/train_*.bin", "val": "val_*.bin", "dir": "C:\\runs\\"} <b>x</b>'
    blocks = [("h1", "Run _a_"), ("list", [note, "a **bold** `co*de_` word"]),
              ("table", ["option", "value"], [["data", document.code("a|b\nnext")]])]
    page = Page(document.to_html(blocks, "Run", Path(".")))
    texts = lambda tag: [e[3] for e in page.elements if e[0] == tag]  # noqa: E731
    assert texts("h1") == ["Run _a_"] and texts("li") == [note, "a bold co*de_ word"] and texts("strong") == ["bold"]
    assert texts("td") == ["data", "a|b next"] and texts("code") == ["co*de_", "a|b next"]


# -- export of a real run ------------------------------------------------------------------------------


def test_export_of_a_real_run(log_path, log, tmp_path):
    """Both formats of a trained run's log: every value the reader's float32 (pandas.read_csv's
    defaults for the CSV), each query head beside the kv head it reads, the npz a fraction of the CSV."""
    import pandas
    for kind in ("csv", "npz"):
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "attnlog.py"), "export", log_path,
                                 "-o", tmp_path / f"run.{kind}"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    frame = pandas.read_csv(tmp_path / "run.csv")
    with np.load(tmp_path / "run.npz") as f:
        npz = dict(f)
    expected = {name: log.scalars(name)[1] for name in log.scalar_names()}
    expected["val_loss"] = log.val_loss()[1]
    expected.update({name: log.metric(name)[1] for name in log.metric_names()})
    assert len(frame) == len(npz["value"]) == sum(v.size for v in expected.values())
    metric_codes = {name: code for code, name in enumerate(npz["metric_names"].tolist())}
    for name, array in expected.items():  # the exact float32 values, not a rounding of them
        bits = array.ravel().view(np.uint32)
        from_csv = frame.value[frame.metric == name].to_numpy().astype(np.float32)
        assert np.array_equal(from_csv.view(np.uint32), bits), name
        assert np.array_equal(npz["value"][npz["metric"] == metric_codes[name]].view(np.uint32), bits), name
    queries = frame[frame.head_kind == "q_head"]
    assert len(queries) and KV_HEADS < HEADS  # grouped-query attention: HEADS // KV_HEADS query heads a kv head
    assert (queries.kv_head == queries["head"] // (HEADS // KV_HEADS)).all()
    assert ((frame.head_kind == "scalar") == (frame.layer == -1)).all()
    assert (frame.kv_head[frame.head_kind == "dim"] == -1).all()
    assert (tmp_path / "run.npz").stat().st_size < (tmp_path / "run.csv").stat().st_size / 10


# -- following a run while it trains -------------------------------------------------------------------


# How long a follow test waits for report.py before it calls it hung: rendering takes seconds on an
# idle machine and many times that on a loaded one; only a hang takes this long.
FOLLOW_DEADLINE_S = 300


def follow(log, outdir, *args):
    return subprocess.Popen([sys.executable, str(SCRIPT), "--follow", str(log), "-o", str(outdir), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


REFRESH = '<meta http-equiv="refresh"'


def test_follow_a_growing_log(log_path, tmp_path):
    """A log that grows in pieces, cut anywhere (torn tails): rendered while it grows, with the reload
    tag, and a last time without it when its last step and that step's validation loss are in."""
    data = log_path.read_bytes()
    records = frames(data)
    growing, outdir = tmp_path / "run.attnlog", tmp_path / "live"
    first = records[len(records) // 3][0] + 50  # a third of the records and part of one more
    growing.write_bytes(data[:first])
    proc = follow(growing, outdir, "--interval", 0.2, "--idle", 60)
    try:
        deadline = time.monotonic() + FOLLOW_DEADLINE_S
        while not (outdir / "summary.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        summary = json.loads((outdir / "summary.json").read_text())
        assert REFRESH in (outdir / "report.html").read_text()
        assert summary["loss"]["last_step"] < STEPS - 1
        assert any(p.startswith("torn tail") for p in summary["problems"])
        final_val = records[-1][0]  # the validation loss of the last step, the last record
        for cut in (first + (final_val - first) // 2, final_val + 7, len(data)):  # it torn, then whole
            with open(growing, "ab") as f:
                f.write(data[growing.stat().st_size:cut])
            time.sleep(0.5)
        out, err = proc.communicate(timeout=FOLLOW_DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"the run has ended: the log holds step {STEPS - 1}, the last of the {STEPS} planned" in out
    page = (outdir / "report.html").read_text()
    summary = json.loads((outdir / "summary.json").read_text())
    assert REFRESH not in page
    assert summary["loss"]["last_step"] == STEPS - 1 and summary["loss"]["val_last_step"] == STEPS - 1
    assert not [p for p in summary["problems"] if "torn" in p or "ends at step" in p]
    assert not [p for p in outdir.iterdir() if p.name.endswith(".part")]


def test_follow_a_training_run(log_path, tmp_path):
    data = log_path.parent.parent / "data"
    train = subprocess.Popen([str(a) for a in [TRAIN_BIN, "-i", data / "train_*.bin", "-j", data / "val_*.bin",
                                               *TRAIN_ARGS, "--threads", 1, "-o", tmp_path / "live"]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = follow(tmp_path / "live" / "run.attnlog", tmp_path / "out", "--interval", 1, "--idle", 60)
    try:
        out, err = proc.communicate(timeout=FOLLOW_DEADLINE_S)
        assert train.wait(timeout=FOLLOW_DEADLINE_S) == 0, train.stderr.read()
    finally:
        proc.kill()
        train.kill()
    assert proc.returncode == 0, err
    assert f"the run has ended: the log holds step {STEPS - 1}" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["loss"]["last_step"] == STEPS - 1 and summary["loss"]["val_last_step"] == STEPS - 1
    assert summary["stats_steps"]["last"] == STEPS - 1
    assert not [p for p in summary["problems"] if "torn" in p or "ends at step" in p]
    assert REFRESH not in (tmp_path / "out" / "report.html").read_text()


def test_follow_stops_when_the_log_stops_growing(log_path, tmp_path):
    data = log_path.read_bytes()
    stalled = tmp_path / "run.attnlog"
    stalled.write_bytes(data[:frames(data)[-1][0]])  # the last step in, its validation loss not yet
    proc = follow(stalled, tmp_path / "out", "--interval", 0.2, "--idle", 1)
    out, err = proc.communicate(timeout=FOLLOW_DEADLINE_S)
    assert proc.returncode == 0, err
    assert f"stopped following: {stalled} has not grown for 1 s" in out and "has ended" not in out
    assert REFRESH not in (tmp_path / "out" / "report.html").read_text()


def test_follow_a_run_without_validation(log_path, tmp_path):
    data = log_path.read_bytes()
    header_end = 20 + struct.unpack_from("<I", data, 12)[0]
    no_val = tmp_path / "run.attnlog"  # ends with the last step's records; no validation loss anywhere
    no_val.write_bytes(data[:header_end] + b"".join(data[pos:pos + 24 + n] for pos, rtype, _, n in frames(data)
                                                     if rtype != 2))
    proc = follow(no_val, tmp_path / "out", "--interval", 0.2, "--idle", 60)
    out, err = proc.communicate(timeout=FOLLOW_DEADLINE_S)
    assert proc.returncode == 0, err
    assert f"the run has ended: the log holds step {STEPS - 1}" in out


# Follows a log, two thirds of a run's records, that a run started over cuts to a third right after
# the reader opened it, the worst moment: report.py --follow with attnlog.open_log wrapped to cut the file then. In a
# child process, so that a reader dying of SIGBUS shows as a failed test.
FOLLOW_A_RESTART = """
import os, sys
import attnlog
from attnlog import commands
from attnlog import report
path, cut, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opened = attnlog.open_log
def open_then_cut(p):
    log = opened(p)
    if os.path.getsize(path) > cut:
        os.truncate(path, cut)
    return log
attnlog.open_log = open_then_cut
sys.exit(report.main(["--follow", path, "-o", outdir, "--interval", "0.2", "--idle", "1"]))
"""


def test_follow_a_log_cut_short_while_read(log_path, tmp_path):
    data = log_path.read_bytes()
    records = frames(data)
    cut = records[len(records) // 3][0]
    restarted = tmp_path / "run.attnlog"
    restarted.write_bytes(data[:records[2 * len(records) // 3][0]])
    result = subprocess.run([sys.executable, "-c", FOLLOW_A_RESTART, str(restarted), str(cut), str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=FOLLOW_DEADLINE_S,
                            env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")))
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr}"
    assert restarted.stat().st_size == cut
    assert f"stopped following: {restarted} has not grown for 1 s" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["loss"]["last_step"] == max(step for pos, rtype, step, _ in records
                                                  if pos < cut and rtype == 1)


def test_follow_options(log_path, tmp_path):
    assert_one_line_error(report("--follow", log_path, log_path), "--follow follows one log")
    assert_one_line_error(report("--follow", log_path, "--interval", 0), "--interval")
    assert_one_line_error(report("--follow", tmp_path / "absent.attnlog", "--idle", 0.5, "--interval", 0.1),
                          "absent.attnlog", "did not appear")


@pytest.mark.parametrize("which", ["tiny", "trained"])
def test_head_ablation(which, log_path, trained_paths, tmp_path):
    """With the run's checkpoint, the report gives each head's loss increase when it is zeroed and
    when it is mean-ablated (probe.py's numbers on the validation tokens probe.py evaluates by
    default), each with its standard error: grouped by the taxonomy's classes when there is a
    taxonomy (the trained run), else as a layer x head table (the tiny run)."""
    from attnlog import probe
    path = log_path if which == "tiny" else trained_paths[0]
    data, ckpt, out = log_path.parent.parent / "data", path.parent / "model.ckpt", tmp_path / "out"
    result = report(path, "--checkpoint", ckpt, "--data", data, "-o", out)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    ablation, taxonomy = summary["ablation"], summary["taxonomy"]
    c, params = probe.load_checkpoint(str(ckpt))
    batches = probe.evaluation_batches(str(data), 2, T, c.vocab_size)
    assert (ablation["batches"], ablation["batch"], ablation["seq_len"]) == (len(batches), 2, T)
    assert ablation["sequences"] == 2 * len(batches) >= 2
    # probe.EVAL_TOKENS tokens, or all the validation windows there are when they hold fewer.
    windows = len(list(probe.validation_windows(str(data), 2, T, c.vocab_size)))
    assert len(batches) == min(probe.EVAL_TOKENS // (2 * T), windows)
    want = probe.ablate(params, c, batches)
    # probe.py's own float64 code on the same batches (through JSON's 17 digits): the same numbers
    # but for the order of a few sums. The increases are differences of losses of ~2.5, whose
    # rounding (~1e-15) is relative to increases down to ~1e-4: 1e-9 relative, 1e-12 for zeros;
    # their standard errors, of the same differences, alike.
    assert ablation["loss"] == close(want["loss"], **SAME_F64)
    for name in ("increase", "mean_increase", "increase_se", "mean_increase_se"):
        assert_close(ablation[name], want[name], rtol=1e-9, atol=1e-12)
    text = (out / "report.md").read_text()
    cells = {(l, h): f"{v:+.4f} / {want['mean_increase'][l, h]:+.4f}" for (l, h), v in np.ndenumerate(want["increase"])}
    assert f"{want['loss']:.4f} ± {want['loss_se']:.4f} on {len(batches) * 2 * T} tokens" in text
    se = np.concatenate([want["increase_se"].ravel(), want["mean_increase_se"].ravel()])
    assert f"is {np.median(se):.4f} (median; at most {se.max():.4f})" in text
    assert taxonomy["available"] == (which == "trained")
    if taxonomy["available"]:
        assert all(f"L{h['layer']}H{h['head']} {cells[h['layer'], h['head']]}" in text for h in taxonomy["heads"])
    else:
        for l in range(LAYERS):
            assert "| " + " | ".join([str(l)] + [cells[l, h] for h in range(HEADS)]) + " |" in text
    wrong = report(path, "--checkpoint", path, "-o", tmp_path / "bad")
    assert_one_line_error(wrong, "not a checkpoint")


# -- a measurement of one model state (./train --measure) -------------------------------------------------

MEASURED_BATCHES = 6
MEASUREMENT_FIGURES = ["layer_profiles.png", "head_maps.png", "key_magnitude_profile.png", "entropy_norm_by_layer.png",
                       "gains_wavelength.png", "loss.png"]


def every_batch(steps):
    """A measurement's decision window: every batch it measured, all of one model state."""
    return np.ones(len(steps), bool)


def measure(log_path, checkpoint, out):
    """The checkpoint's weights measured on MEASURED_BATCHES batches of the tiny data, and the report of
    it: (output folder, summary.json, report.md, stdout, the log)."""
    data = log_path.parent.parent / "data"
    run([TRAIN_BIN, "-i", data / "train_*.bin", "-e", checkpoint, "--measure", MEASURED_BATCHES, "-b", 4,
         "--samples", 0, "--threads", 1, "-o", out], "the measurement")
    result = report(out / "run.attnlog")
    assert result.returncode == 0, result.stderr
    return (out / "report", json.loads((out / "report" / "summary.json").read_text()),
            (out / "report" / "report.md").read_text(), result.stdout, attnlog.open_log(out / "run.attnlog"))


@pytest.fixture(scope="module")
def measured(log_path, trained_paths):
    """The trained run's final weights (300 steps, 76,800 tokens) measured."""
    return measure(log_path, trained_paths[0].parent / "model.ckpt", log_path.parent.parent / "measured")


def test_measurement_report_is_of_one_model_state(measured, trained_paths, log_path):
    from attnlog import analysis
    outdir, summary, text, stdout, log = measured
    assert log.measurement == {"checkpoint": str(trained_paths[0].parent / "model.ckpt"), "step": TRAINED_STEPS,
                               "run_id": attnlog.open_log(trained_paths[0]).header["run_id"],
                               "tokens": TRAINED_STEPS * 4 * T}
    assert analysis.is_measurement(analysis.load_run(outdir.parent / "run.attnlog", "m"))
    assert not analysis.is_measurement(analysis.load_run(log_path, "tiny"))
    assert summary["measurement"] == log.measurement and summary["init"] is None
    training = summary["training"]
    assert training["measurement"] and training["enough"] and training["reasons"] == []
    assert training["tokens"] == TRAINED_STEPS * 4 * T and training["warmup"] is None
    assert summary["window"] == {"first": 0, "last": MEASURED_BATCHES - 1, "count": MEASURED_BATCHES, "fraction": 0.25}
    assert summary["figures"] == {"made": MEASUREMENT_FIGURES, "skipped": {}} and summary["problems"] == []
    assert training["settled"] and training["trained"]
    assert summary["not_applicable"] == {"figures": [f for f in FIGURES if f not in MEASUREMENT_FIGURES],
                                         "hypotheses": ["d"]}
    assert sorted(p.name for p in outdir.glob("*.png")) == sorted(MEASUREMENT_FIGURES)
    steps, loss = log.scalars("loss")
    assert summary["loss"]["mean"] == close(loss.astype(float).mean(), **LOGGED)
    for words in ("**A measurement, not a training run**: the weights of step 300 of run",
                  f"Batches measured: {MEASURED_BATCHES} (0..{MEASURED_BATCHES - 1}).", "## Not applicable to a measurement",
                  "`key_norm_evolution.png`", f"averaged over the {MEASURED_BATCHES} measured batches",
                  f"Mean k_norm of every layer averaged over the {MEASURED_BATCHES} measured batches"):
        assert words in text, words
    captions = [line for line in text.splitlines() if line.startswith("*Figure")]
    assert len(captions) == len(MEASUREMENT_FIGURES)
    assert not [c for c in captions if "training step" in c or "from step" in c]
    assert "(d) dimensional collapse: not applicable (not applicable to a measurement" in stdout


def t_interval(sample):
    """Mean and 95% half-width of MEASURED_BATCHES independent values: t_0.975 with 5 degrees of freedom,
    2.571 (the tables of Student's t), x sd / sqrt(n)."""
    sample = np.asarray(sample, float)
    assert len(sample) == MEASURED_BATCHES
    return sample.mean(), 2.571 * sample.std(ddof=1) / np.sqrt(len(sample))


def test_measurement_verdicts_use_every_batch(measured):
    """(a)-(c) and the taxonomy are decided on the means over every measured batch, the batches taken as
    independent samples of one model state (t-intervals, no trend); (d), a change over training, is not
    applicable."""
    _, summary, text, _, log = measured
    h = summary["hypotheses"]
    x, y = window_kv_means(log, every_batch)
    rho = within_layers(x, y)
    assert h["a"]["value"] == close(rho, **RHO) and h["a"]["verdict"] == rule(-rho, h["a"]["chance"], 0.1)
    steps, k_norm = log.metric("k_norm")
    for t, group, sign in zip(h["b"]["tests"], ("early", "final"), (-1, 1)):
        mean, half = t_interval([sign * (group_mean(table, group) - 8) / 8 for table in k_norm.astype(float)])
        assert t["effect"] == close(mean, **LOGGED) and t["half_width"] == close(half, **LOGGED)
        assert t["verdict"] == rule(mean, half, 0.05) and not t["moving"] and t["trend"] is None
    # In float64 from the logged float32 values, as the report computes it: a quotient rounded to
    # float32 errs by ~6e-8 of a share, ~1e-5 of the interval's width when the batches agree to 1%.
    share = (log.metric("k_maxabs")[1].astype(float) / k_norm.astype(float)) ** 2
    means = share.mean(axis=0)
    top = np.unravel_index(np.argmax(means), means.shape)
    (t,) = h["c"]["tests"]
    mean, half = t_interval(share[:, top[0], top[1]] / 0.5 - 1)
    assert h["c"]["max_ratio"] == close(share[:, top[0], top[1]].mean(), **LOGGED)
    assert (t["effect"], t["half_width"]) == (close(mean, **LOGGED), close(half, **LOGGED))
    assert t["verdict"] == rule(mean, half, 0.05) and not t["moving"]
    assert h["d"]["verdict"] == h["d"]["why"] == "not applicable" and h["d"]["tests"] == [] and "value" not in h["d"]
    assert "| **not applicable** |" in text and summary["path"] is None
    sink = log.metric("attn_sink")[1].astype(float).mean(axis=0)
    tax = summary["taxonomy"]
    assert tax["available"] and tax["window"] == [0, MEASURED_BATCHES - 1]
    assert [x["attn_sink"] for x in tax["heads"]] == close(sink.ravel().tolist(), **LOGGED)
    assert f"by its means over the {MEASURED_BATCHES} measured batches" in text
    assert summary["claims"]["dynamics"] is False and "the log is a measurement" in summary["claims"]["why_static"]


def test_measurement_of_barely_trained_weights(log_path, tmp_path):
    """The 30-step run's weights (7,680 tokens): no verdicts and no taxonomy, the reason being their
    training, not the measurement's; (d) stays not applicable."""
    _, summary, text, _, _ = measure(log_path, log_path.parent / "model.ckpt", tmp_path / "m")
    reason = f"the weights measured had trained on {STEPS * 4 * T:,} tokens ({STEPS} steps), fewer than the 65,536"
    assert summary["training"]["reasons"] == [reason + " a verdict needs"]
    assert [h["verdict"] for h in summary["hypotheses"].values()] == ["inconclusive"] * 3 + ["not applicable"]
    assert summary["taxonomy"]["available"] is False and reason in text


def test_compared_runs_share_limits_that_hold_every_curve(tmp_path, monkeypatch):
    """compare_figure's panels share one y axis: a run whose middle layers rise above every value of
    the early panel is drawn whole, not cut off at the limits the early panel alone would set."""
    import matplotlib.pyplot as plt
    from attnlog import figures
    steps = np.arange(10) * 10
    runs = [("low", steps, {"early": np.full(10, 8.0), "middle": np.full(10, 8.0), "final": np.full(10, 8.0)}),
            ("high", steps, {"early": np.linspace(2, 14, 10), "middle": np.linspace(2, 18, 10),
                             "final": np.linspace(2, 16, 10)})]
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault("axes", fig.axes))
    figures.compare_figure(str(tmp_path / "c.png"), "t", "k_norm", runs, ref=8.0, ref_label="sqrt(D)")
    for ax in drawn["axes"][:3]:
        low, high = ax.get_ylim()
        assert low <= 2 and high >= 18
    plt.close("all")


def test_decay_words():
    """--decay's value as the report names it: a group when it is one, else the kinds in layout order."""
    assert analysis.decay_words("matrices") == "matrices" and analysis.decay_words("gains,matrices") == "all"
    assert analysis.decay_words("k_gain,wq") == "wq, k_gain" and analysis.decay_words("none") == "none"
    assert analysis.decay_words("bias") == "unknown (bias)"


def test_reduced_log_reports_as_the_full_one(trained_paths, trained, tmp_path):
    """A copy made by attnlog reduce (16 significant bits, xz) gives the same verdicts, with effects
    within the rounding, and its report says that it is a reduced copy."""
    packed = tmp_path / "run.attnlog.xz"
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "attnlog.py"), "reduce", trained_paths[0], "-o", packed],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    result = report(packed, "-o", tmp_path / "report")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    full = trained[1]
    assert summary["reduced"] == {"from": "run.attnlog", "significant_bits": 16} and full["reduced"] is None
    for key, h in summary["hypotheses"].items():
        assert h["verdict"] == full["hypotheses"][key]["verdict"]
        assert len(h["tests"]) == len(full["hypotheses"][key]["tests"])
        for t, f in zip(h["tests"], full["hypotheses"][key]["tests"]):
            assert t["effect"] == pytest.approx(f["effect"], rel=1e-3, abs=1e-4)
    assert ([row["outcome"] for note in summary["claims"]["notes"] for row in note["rows"]]
            == [row["outcome"] for note in full["claims"]["notes"] for row in note["rows"]])
    assert ("The log is a reduced copy of `run.attnlog` (`attnlog reduce`): its statistics are rounded to 16 significant "
            "bits" in (tmp_path / "report" / "report.md").read_text())
