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
import zlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import attnlog  # noqa: E402

SCRIPT = ROOT / "scripts" / "report.py"
TRAIN_BIN = Path(os.environ.get("TRAIN_BIN", ROOT / "train"))
PREPARE_BIN = Path(os.environ.get("PREPARE_DATA_BIN", ROOT / "prepare_data"))

# The tiny run: 6 layers, 4 query heads reading 2 key/value heads (GQA), D = 64, T = 64.
LAYERS, HEADS, KV_HEADS, D, T, STEPS = 6, 4, 2, 64, 64, 30
TRAIN_ARGS = ["--n-layer", LAYERS, "--n-head", HEADS, "--n-kv-head", KV_HEADS, "--d-ff", 128, "--max-seq-len", T,
              "-b", 4, "-x", STEPS, "-s", 2, "-v", 10, "--val-batches", 2, "--samples", 0]
FIGURES = ["key_norm_evolution.png", "outlier_magnitude.png", "latent_redundancy.png", "key_magnitude_profile.png",
           "norm_divergence.png", "entropy_norm_scatter.png", "effective_rank.png", "gamma_heatmap.png",
           "qk_ratio.png", "sink_rate.png", "loss.png"]
COMPARED = ["k_norm", "k_maxabs", "k_cos", "k_pr", "attn_entropy"]
TELEMETRY = 3


def run(argv, what):
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        pytest.fail(f"{what} failed with status {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def report(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(result, *parts):
    assert result.returncode == 2, (result.stdout, result.stderr)
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
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from elsewhere
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
    assert summary["loss"]["last10_mean"] == pytest.approx(loss[-10:].mean(), rel=1e-6)
    assert summary["loss"]["val_last"] == pytest.approx(val[-1]) and summary["loss"]["val_last_step"] == val_steps[-1]
    assert f"{loss[-10:].mean():.3f} (mean of the last 10 steps)" in text
    assert "None: the log is intact" in text


def test_group_means_at_the_last_step(made, log):
    _, summary, text, _ = made
    q_norm, k_norm = last(log, "q_norm"), last(log, "k_norm")
    for metric in ("k_norm", "k_maxabs", "k_cos", "k_pr", "k_erank", "attn_entropy", "attn_sink"):
        for group in GROUPS:
            assert summary["last_step"][metric][group] == pytest.approx(group_mean(last(log, metric), group)), metric
    ratio = q_norm / k_norm[:, KV_OF]
    for group in GROUPS:
        assert summary["last_step"]["qk_ratio"][group] == pytest.approx(group_mean(ratio, group))
    first = log.metric("k_norm")[1][0].astype(float)
    curve = ", ".join(f"{g} {group_mean(first, g):.2f} \u2192 {group_mean(k_norm, g):.2f}" for g in GROUPS)
    assert curve.replace(", ", "; ") in text  # the caption of key_norm_evolution.png


def test_sink_rate(made, log):
    _, summary, text, _ = made
    sink = log.metric("attn_sink")[1]
    assert summary["sink_rate"]["last"] == pytest.approx(np.mean(sink[-1] > 0.3))
    assert summary["sink_rate"]["first"] == pytest.approx(np.mean(sink[0] > 0.3))
    assert f"{100 * np.mean(sink[0] > 0.3):.0f}% \u2192 {100 * np.mean(sink[-1] > 0.3):.0f}%" in text


def test_hypothesis_a_spearman(made, log):
    _, summary, text, _ = made
    x = last(log, "k_norm")[:, KV_OF].ravel()  # each query head gets its kv head's key norm
    y = last(log, "attn_entropy").ravel()
    rho = spearman(x, y)
    h = summary["hypotheses"]["a"]
    assert h["n_heads"] == LAYERS * HEADS
    assert h["value"] == pytest.approx(rho, abs=1e-9)
    assert 0 < h["p_value"] <= 1
    assert h["verdict"] == ("supported" if rho < 0 and h["p_value"] < 0.05 else "not supported")
    assert f"rho = {rho:+.3f}" in text
    row = next(line for line in text.splitlines() if line.startswith("| (a)"))
    assert row.endswith(f"**{h['verdict']}** |")


def test_ranks_average_ties():
    sys.path.insert(0, str(ROOT / "scripts"))
    import analysis as module
    assert module.ranks([3, 1, 3, 2, 3]).tolist() == [4, 1, 4, 2, 4]
    assert module.ranks([5, 5]).tolist() == [1.5, 1.5]
    x, y = [1, 2, 2, 3, 5, 4], [6, 5, 5, 4, 1, 2]
    assert module.spearman(x, y)[0] == pytest.approx(spearman(x, y))
    assert module.spearman(x, y)[1] < 0.05  # a perfect inverse order is no accident
    assert np.isnan(module.spearman([1, 1, 1], [1, 2, 3])[0])


def test_hypothesis_b_norm_hierarchy(made, log):
    _, summary, text, _ = made
    k_norm = last(log, "k_norm")
    early, final = group_mean(k_norm, "early"), group_mean(k_norm, "final")
    h = summary["hypotheses"]["b"]
    assert (h["early"], h["final"]) == (pytest.approx(early), pytest.approx(final))
    # Every norm starts at sqrt(D) = 8: a group counts as dampened or amplified beyond 5% of it.
    assert h["verdict"] == ("supported" if early < 0.95 * 8 and final > 1.05 * 8 else "not supported")
    assert f"early {early:.2f}" in text and f"final {final:.2f}" in text


def test_hypothesis_c_axis_aligned_heads(made, log):
    _, summary, _, _ = made
    share = (last(log, "k_maxabs") / last(log, "k_norm")) ** 2
    h = summary["hypotheses"]["c"]
    assert h["value"] == int((share > 0.5).sum()) and h["of"] == LAYERS * KV_HEADS
    assert h["max_ratio"] == pytest.approx(share.max())
    assert h["verdict"] == ("supported" if (share > 0.5).any() else "not supported")


def test_hypothesis_d_participation_ratio(made, log):
    _, summary, _, _ = made
    pr = log.metric("k_pr")[1].astype(float)
    first, final = pr[0].mean(), pr[-1].mean()
    h = summary["hypotheses"]["d"]
    assert (h["first"], h["last"]) == (pytest.approx(first), pytest.approx(final))
    assert h["verdict"] == ("supported" if final < first else "not supported")


def test_taxonomy(made, log):
    _, summary, text, _ = made
    k_norm = last(log, "k_norm")[:, KV_OF]
    share = ((last(log, "k_maxabs") / last(log, "k_norm")) ** 2)[:, KV_OF]
    entropy, sink = last(log, "attn_entropy"), last(log, "attn_sink")
    focus = 0.5 * np.mean(np.log(np.arange(1, T + 1)))  # half the entropy of uniform causal attention
    expected = {}
    for layer in range(LAYERS):
        for h in range(HEADS):
            if sink[layer, h] > 0.3:
                cls = "static sink"
            elif entropy[layer, h] < focus and k_norm[layer, h] > 1.05 * 8:
                cls = "semantic retriever"
            elif entropy[layer, h] >= focus and k_norm[layer, h] <= 1.05 * 8 and share[layer, h] <= 0.5:
                cls = "syntactic gatherer"
            else:
                cls = "other"
            expected[(layer, h)] = cls
    tax = summary["taxonomy"]
    assert tax["available"] and tax["step"] == int(log.metric("k_norm")[0][-1])
    assert {(x["layer"], x["head"]): x["class"] for x in tax["heads"]} == expected
    counts = {cls: list(expected.values()).count(cls) for cls in tax["rules"]}
    assert tax["counts"] == counts and sum(counts.values()) == LAYERS * HEADS
    for cls, rule in tax["rules"].items():  # each rule is written next to its class, with its count
        assert f"| {cls} | {rule} | {counts[cls]} |" in text


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
    assert summary["figures"]["skipped"] == {"effective_rank.png": "the log has no k_erank",
                                             "sink_rate.png": "the log has no attn_sink"}
    assert summary["figures"]["made"] == [f for f in FIGURES if f not in ("effective_rank.png", "sink_rate.png")]
    assert not (tmp_path / "out" / "sink_rate.png").exists()
    assert "metrics missing from the log: k_erank, attn_sink" in text
    assert "skipped `sink_rate.png`: the log has no attn_sink" in text
    assert summary["taxonomy"]["available"] is False and "attn_sink" in summary["taxonomy"]["reason"]
    assert summary["sink_rate"]["last"] is None
    assert all(summary["hypotheses"][k]["verdict"] != "not enough data" for k in "abcd")


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
    import analysis
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
    assert all(h["verdict"] == "not enough data" for h in summary["hypotheses"].values())


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
        x, y = k_norm[:, KV_OF].ravel(), last(log, "attn_entropy").ravel()
        assert row["final_loss"] == pytest.approx(loss[-10:].mean(), rel=1e-6)
        assert row["val_loss"] == pytest.approx(log.val_loss()[1][-1])
        assert row["k_norm"] == {g: pytest.approx(group_mean(k_norm, g)) for g in GROUPS}
        assert row["sink_rate"] == pytest.approx(np.mean(last(log, "attn_sink") > 0.3))
        assert row["spearman"] == pytest.approx(spearman(x, y), abs=1e-9)
        assert f"| {row['label']} | {row['last_step']} | {row['final_loss']:.3f} |" in text
    assert comparison["runs"][1]["last_step"] < comparison["runs"][0]["last_step"]
    assert "Problems of short/run: the log ends at step" in text


def test_comparison_with_a_run_lacking_a_metric(log_path, tmp_path):
    (tmp_path / "older").mkdir()
    older = tmp_path / "older" / "run.attnlog"
    older.write_bytes(without_metrics(log_path.read_bytes(), {"k_cos"}))
    result = report(log_path, older, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["comparison"]["figures"]["made"] == [f"compare_{m}.png" for m in COMPARED]
    assert "Not in the figure (no k_cos): older/run." in (tmp_path / "out" / "report.md").read_text()
