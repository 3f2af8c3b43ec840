#!/usr/bin/python3
"""Turns the trainer's run log into the figures and findings of the research reports on attention
keys (what the trainer measures: docs/telemetry.md).

    /usr/bin/python3 scripts/report.py RUN.attnlog [MORE.attnlog ...] [-o OUTDIR] [--layer N]

Writes into OUTDIR (default: a report/ folder beside the first log):
    *.png          the figures of the first run (names as in the reports: key_norm_evolution.png, ...)
    compare_*.png  with several logs: each run's layer-group curves overlaid
    report.md      configuration, figures with captions computed from the run, the reports'
                   hypotheses checked on it, a taxonomy of the heads, problems found in the log
    report.html    the same, one self-contained file (figures embedded)
    summary.json   every number of the report, for programs

summary.json (null where the log lacks the data; steps are the log's, counted from 0):
    log, label, created, backend, device, seed, config, options   the run, from the log's header
    head_dim, sqrt_head_dim, seq_len     D, sqrt(D) (the initial key norm), T of the training rows
    groups            {"early": [layers], "middle": [...], "final": [...]}
    stats_steps       {"count", "first", "last"}: the steps with telemetry
    loss              {"steps_recorded", "first_step", "last_step", "last", "last10_mean",
                       "val_last_step", "val_last"}
    problems          [text]: damage the reader found, an early end, missing metrics
    missing_metrics   [name]: metrics this report uses that the log lacks
    notes             [[step, text]]: the notes the trainer wrote (e.g. where a resumed run resumed)
    first_step, last_step   {statistic: {group: mean over the group's layers and heads}} at the
                       first/last stats step, for k_norm k_maxabs k_cos k_pr k_erank q_norm
                       attn_entropy attn_sink qk_ratio
    sink_rate         {"threshold", "first", "last"}: share of query heads with attn_sink > threshold
    hypotheses        {"a"|"b"|"c"|"d": {"id", "title", "claim", "rule", "statistic", "verdict"
                       ("supported" | "not supported" | "not enough data"), "detail", "value", "step",
                       and per hypothesis: a: n_heads, p_value; b: early, final, sqrt_head_dim;
                       c: of, heads [[layer, kv_head]], first_step_count, max_ratio, max_ratio_head;
                       d: first, last, first_step}}
    taxonomy          {"available", "step", "rules" {class: text}, "counts" {class: n},
                       "uniform_entropy", "focus_entropy", "amplified_k_norm", "seq_len",
                       "heads": [{"layer", "head", "kv_head", "class", "k_norm", "attn_entropy",
                       "entropy_fraction", "attn_sink", "axis_ratio"}]} or {"available": false, "reason"}
    norm_divergence_layer   {"layer", "why"}
    figures           {"made": [file], "skipped": {file: why}}
    comparison        (several logs) {"figures": {...}, "runs": [{"label", "log", "last_step",
                       "final_loss" (mean of the last 10 steps), "val_loss", "k_norm" {group: value},
                       "sink_rate", "spearman", "verdicts" {id: verdict}, "problems"}]}

Needs numpy and matplotlib (Debian's /usr/bin/python3 has both). A log that cannot be read, a
missing file or a bad option ends with one line on stderr and exit status 2. A damaged or cut log
still gives every figure its intact records allow; the report says what was skipped and why.
"""
import argparse
import base64
import html
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnlog  # noqa: E402
import figures  # noqa: E402

# The thresholds of the derived quantities (docs/telemetry.md, "Derived in Python").
SINK_THRESHOLD = 0.3  # attn_sink above this makes a head a sink (Gu et al. 2024)
AXIS_THRESHOLD = 0.5  # k_maxabs^2 / k_norm^2 above this: one component holds most of the key's energy
FOCUS_FRACTION = 0.5  # entropy below this fraction of uniform attention's counts as focused
NORM_MARGIN = 0.05  # a key is amplified when its norm is more than 5% above sqrt(D), its initial value
SIGNIFICANCE = 0.05  # one-sided permutation p-value needed to call a correlation negative
PERMUTATIONS = 10000

# The telemetry metrics this report reads; a log without one of them loses the figures that need it.
USED_METRICS = ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "q_norm", "attn_entropy", "attn_sink", "g_k"]
GROUPS = ("early", "middle", "final")
COMPARED = [("k_norm", "mean key norm k_norm"), ("k_maxabs", "mean largest key component k_maxabs"),
            ("k_cos", "mean cosine similarity of key pairs k_cos"),
            ("k_pr", "participation ratio k_pr (dimensions)"), ("attn_entropy", "attention entropy (nats)")]
SUPPORTED, NOT_SUPPORTED, NO_DATA = "supported", "not supported", "not enough data"


class ReportError(Exception):
    """A user error that is not about the log itself (e.g. --layer out of range): one line."""


# -- reading a run ---------------------------------------------------------------------------------


def load_run(path, label):
    """Everything the report needs from one log, as a dict of plain values and numpy arrays."""
    log = attnlog.open_log(path)
    config = log.config
    try:
        n_layer, n_head, n_kv, head_dim = (int(config[k]) for k in ("n_layer", "n_head", "n_kv_head", "head_dim"))
    except (KeyError, TypeError, ValueError):
        raise ReportError(f"{path}: the header's model configuration lacks n_layer, n_head, n_kv_head "
                          "or head_dim") from None
    if min(n_layer, n_head, n_kv, head_dim) < 1 or n_head % n_kv:
        raise ReportError(f"{path}: the header's model configuration is inconsistent "
                          f"(n_layer={n_layer}, n_head={n_head}, n_kv_head={n_kv}, head_dim={head_dim})")
    problems = list(log.problems)
    counts = log.record_counts()  # a record type without records contributes no data
    columns = {"q_norm": n_head, "attn_entropy": n_head, "attn_sink": n_head, "g_k": head_dim}
    metrics, missing = {}, []
    for name in USED_METRICS:
        if name not in log.metric_names():
            missing.append(name)
            continue
        shape = tuple(log.record_types["telemetry"].fields[name]["shape"])
        if shape != (n_layer, columns.get(name, n_kv)):
            problems.append(f"{name} has shape {list(shape)}, not the [{n_layer}, {columns.get(name, n_kv)}] "
                            "the model configuration implies: left out")
            missing.append(name)
        elif counts.get("telemetry"):
            steps, table = log.metric(name)
            metrics[name] = (steps, table.astype(np.float64))
    metrics = finite_steps(metrics, problems)
    empty = (np.zeros(0, np.int64), np.zeros(0))
    loss = log.scalars("loss") if "loss" in log.scalar_names() and counts.get("step") else empty
    val = log.val_loss() if counts.get("val") else empty
    options = log.header.get("options") if isinstance(log.header.get("options"), dict) else {}
    return {
        "path": str(path), "label": label, "header": log.header, "config": config, "options": options,
        "problems": problems, "notes": log.notes(), "step_range": log.step_range(),
        "L": n_layer, "H": n_head, "Hkv": n_kv, "D": head_dim,
        "metrics": metrics, "missing": missing,
        "loss": finite_only(*loss, "training loss", problems),
        "val": finite_only(*val, "validation loss", problems),
        "stats_steps": next(iter(metrics.values()))[0] if metrics else np.zeros(0, np.int64),
        "groups": layer_groups(n_layer),
        "seq_len": sequence_length(options, config),
    }


def finite_steps(metrics, problems):
    """Leaves out the stats steps where a metric holds NaN or infinity (a diverged run), saying so:
    every later computation then sees finite numbers only."""
    if not metrics:
        return metrics
    bad = np.zeros(len(next(iter(metrics.values()))[0]), bool)
    names = []
    for name, (_, table) in metrics.items():
        here = ~np.isfinite(table).all(axis=(1, 2))
        if here.any():
            names.append(name)
        bad |= here
    if not bad.any():
        return metrics
    steps = next(iter(metrics.values()))[0][bad]
    problems.append(f"{bad.sum()} stats steps hold values that are not finite ({', '.join(names)}; steps "
                    f"{steps[0]}..{steps[-1]}): they are left out of every figure and statistic")
    return {name: (s[~bad], table[~bad]) for name, (s, table) in metrics.items()}


def finite_only(steps, series, what, problems):
    """(steps, values) without the values that are NaN or infinite, saying so."""
    series = series.astype(np.float64)
    good = np.isfinite(series)
    if not good.all():
        problems.append(f"the {what} is not finite at {(~good).sum()} steps (the first: step {steps[~good][0]}): "
                        "those steps are left out")
    return steps[good], series[good]


def sequence_length(options, config):
    """T of the training sequences: the seq-len option, where 0 (or absent) means max_seq_len."""
    try:
        seq_len = int(options.get("seq-len", 0))
        return seq_len if seq_len > 0 else int(config.get("max_seq_len", 0))
    except (TypeError, ValueError):
        return 0


def layer_groups(n_layer):
    """early = the first two layers, middle = the two around L/2, final = the last two
    (telemetry.md). Models with fewer than 6 layers get overlapping groups."""
    mid = n_layer // 2
    spans = {"early": [0, 1], "middle": [mid - 1, mid], "final": [n_layer - 2, n_layer - 1]}
    return {g: sorted({min(max(i, 0), n_layer - 1) for i in layers}) for g, layers in spans.items()}


def kv_of_query(run):
    """The key/value head each query head reads: h // (n_head / n_kv_head) (GQA)."""
    return np.arange(run["H"]) // (run["H"] // run["Hkv"])


def values(run, name):
    """[S, L, cols] float64 array of a metric. Per-key/value-head metrics may be asked for per query
    head by appending '@q' (each query head gets its kv head's value)."""
    if name.endswith("@q"):
        return values(run, name[:-2])[:, :, kv_of_query(run)]
    return run["metrics"][name][1].astype(np.float64)


def qk_ratio(run):
    """||q|| / ||k|| of every query head, its kv head's k_norm in the denominator: [S, L, H]."""
    return values(run, "q_norm") / values(run, "k_norm@q")


def group_curves(run, array):
    """{group: [S] mean over the group's layers and all heads} of an [S, L, cols] array."""
    return {g: array[:, layers, :].mean(axis=(1, 2)) for g, layers in run["groups"].items()}


def sink_rate(run):
    """[S]: fraction of all query heads (all layers) whose attn_sink is above the threshold."""
    return (values(run, "attn_sink") > SINK_THRESHOLD).mean(axis=(1, 2))


def axis_ratio(run):
    """[S, L, Hkv] k_maxabs^2 / k_norm^2: the share of a key's energy in its largest component
    (computed from the means over tokens, so it approximates the mean share)."""
    return (values(run, "k_maxabs") / values(run, "k_norm")) ** 2


def uniform_entropy(seq_len):
    """Mean entropy (nats) of uniform causal attention over T positions: row t spreads over t+1
    keys, H_t = ln(t+1), averaged over t = 0..T-1 as attn_entropy is."""
    return float(np.log(np.arange(1, seq_len + 1)).mean()) if seq_len > 0 else float("nan")


def has(run, *names):
    return all(n in run["metrics"] for n in names) and len(run["stats_steps"]) > 0


def why_not(run, *names):
    """Why a figure or statistic that needs these metrics cannot be had, or None when it can."""
    missing = [n for n in names if n in run["missing"]]
    if missing:
        return f"the log has no {', '.join(missing)}"
    if len(run["stats_steps"]) == 0:
        return "the log has no telemetry records: statistics were off, or the run ended before the first"
    return None


# -- statistics ------------------------------------------------------------------------------------


def ranks(x):
    """Ranks 1..n; tied values share the mean of the ranks they occupy."""
    x = np.asarray(x, float)
    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]  # where each run of equal values begins
    run_id = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(x)] - 1
    result = np.empty(len(x))
    result[order] = ((first + last) / 2 + 1)[run_id]
    return result


def spearman(x, y):
    """Spearman's rank correlation and the one-sided permutation p-value of its being this
    negative by chance: the share of random pairings of the same values with rho <= the observed."""
    rx, ry = ranks(x), ranks(y)
    if len(rx) < 3 or rx.std() == 0 or ry.std() == 0:
        return float("nan"), float("nan")
    cx, cy = rx - rx.mean(), ry - ry.mean()
    scale = len(rx) * rx.std() * ry.std()
    rho = float(cx @ cy / scale)
    rng, as_low = np.random.default_rng(0), 0  # seeded: the same log always gives the same p
    for start in range(0, PERMUTATIONS, 1000):  # in blocks, to bound the memory for many heads
        shuffled = rng.permuted(np.tile(cy, (min(1000, PERMUTATIONS - start), 1)), axis=1)
        as_low += np.count_nonzero(shuffled @ cx / scale <= rho + 1e-12)
    return rho, (as_low + 1) / (PERMUTATIONS + 1)


def finite(x):
    """A float for JSON: NaN and infinities become None."""
    x = float(x)
    return x if math.isfinite(x) else None


def json_ready(value):
    """The summary with every float that JSON cannot hold (NaN, infinity) turned into None."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return finite(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def first_last(curve):
    return float(curve[0]), float(curve[-1])


# -- the hypotheses of the reports -----------------------------------------------------------------


def hypothesis_entropy_norm(run):
    """(a) Across heads, a larger key norm goes with sharper (lower-entropy) attention."""
    result = {"id": "a", "title": "larger key norm, sharper attention",
              "claim": "across query heads, k_norm (of the head's kv head) and attn_entropy are negatively "
                       "correlated at the last stats step",
              "rule": f"supported when Spearman's rho < 0 and its one-sided permutation p-value "
                      f"({PERMUTATIONS} permutations) is below {SIGNIFICANCE}",
              "statistic": "spearman_rho"}
    reason = why_not(run, "k_norm", "attn_entropy")
    if reason:
        return dict(result, verdict=NO_DATA, detail=reason)
    x, y = values(run, "k_norm@q")[-1].ravel(), values(run, "attn_entropy")[-1].ravel()
    rho, p = spearman(x, y)
    result.update(step=int(run["stats_steps"][-1]), n_heads=len(x), value=finite(rho), p_value=finite(p))
    if not math.isfinite(rho):
        return dict(result, verdict=NO_DATA, detail=f"{len(x)} heads, too few or constant values")
    verdict = SUPPORTED if rho < 0 and p < SIGNIFICANCE else NOT_SUPPORTED
    detail = f"rho = {rho:+.3f} over {len(x)} query heads at step {result['step']}, p = {p:.3g}"
    if rho < 0 and p >= SIGNIFICANCE:
        detail += " (negative, but no stronger than random pairings give)"
    return dict(result, verdict=verdict, detail=detail)


def hypothesis_hierarchy(run):
    """(b) Early layers dampen their keys below sqrt(D), the final layers amplify them above. sqrt(D)
    is also where every norm starts, so a norm counts as moved only beyond NORM_MARGIN."""
    root = math.sqrt(run["D"])
    low, high = (1 - NORM_MARGIN) * root, (1 + NORM_MARGIN) * root
    result = {"id": "b", "title": "dampened early keys, amplified final keys",
              "claim": f"at the last stats step the early group's k_norm is below sqrt(D) = {root:.2f} and "
                       "the final group's is above it",
              "rule": f"supported when the early group's mean k_norm is below {low:.2f} and the final group's "
                      f"above {high:.2f}: every norm starts at sqrt(D), so one within {NORM_MARGIN:.0%} of it "
                      "has not moved far enough to count as dampened or amplified",
              "statistic": "group_k_norm"}
    reason = why_not(run, "k_norm")
    if reason:
        return dict(result, verdict=NO_DATA, detail=reason)
    curves = group_curves(run, values(run, "k_norm"))
    early, final = float(curves["early"][-1]), float(curves["final"][-1])
    result.update(step=int(run["stats_steps"][-1]), early=early, final=final, sqrt_head_dim=root,
                  value=[early, final])
    if set(run["groups"]["early"]) & set(run["groups"]["final"]):
        return dict(result, verdict=NO_DATA, detail=f"{run['L']} layers: the early and final groups overlap")

    def where(x):
        return "dampened" if x < low else "amplified" if x > high else f"within {NORM_MARGIN:.0%} of {root:.2f}"

    verdict = SUPPORTED if early < low and final > high else NOT_SUPPORTED
    return dict(result, verdict=verdict, detail=f"early {early:.2f} ({where(early)}), final {final:.2f} "
                                                f"({where(final)}) at step {result['step']}")


def hypothesis_axis_aligned(run):
    """(c) Outlier components: some heads put most of a key's energy into one dimension."""
    n_heads = run["L"] * run["Hkv"]
    result = {"id": "c", "title": "axis-aligned keys (outlier dimensions)",
              "claim": f"by the end some kv heads are axis-aligned: k_maxabs^2 / k_norm^2 > {AXIS_THRESHOLD}",
              "rule": "supported when at least one kv head is axis-aligned at the last stats step",
              "statistic": "axis_aligned_count"}
    reason = why_not(run, "k_norm", "k_maxabs")
    if reason:
        return dict(result, verdict=NO_DATA, detail=reason)
    ratio = axis_ratio(run)
    aligned = np.argwhere(ratio[-1] > AXIS_THRESHOLD)
    count, at_start = len(aligned), int((ratio[0] > AXIS_THRESHOLD).sum())
    top = np.unravel_index(np.argmax(ratio[-1]), ratio[-1].shape)
    result.update(step=int(run["stats_steps"][-1]), value=count, of=n_heads, first_step_count=at_start,
                  heads=[[int(l), int(h)] for l, h in aligned], max_ratio=float(ratio[-1][top]),
                  max_ratio_head=[int(top[0]), int(top[1])])
    detail = f"{count} of {n_heads} kv heads at step {result['step']}"
    if len(ratio) > 1:
        detail += f" ({at_start} at step {int(run['stats_steps'][0])})"
    detail += f"; the largest share is {ratio[-1][top]:.2f}, layer {top[0]} kv head {top[1]}"
    return dict(result, verdict=SUPPORTED if count > 0 else NOT_SUPPORTED, detail=detail)


def hypothesis_pr_falls(run):
    """(d) Dimensional collapse: the keys use fewer dimensions as training goes on."""
    result = {"id": "d", "title": "dimensional collapse",
              "claim": "the participation ratio k_pr falls during training",
              "rule": "supported when the mean k_pr over all layers and kv heads is lower at the last stats "
                      "step than at the first",
              "statistic": "mean_k_pr"}
    reason = why_not(run, "k_pr")
    if reason:
        return dict(result, verdict=NO_DATA, detail=reason)
    if len(run["stats_steps"]) < 2:
        return dict(result, verdict=NO_DATA, detail="only one stats step")
    pr = values(run, "k_pr").mean(axis=(1, 2))
    first, last = first_last(pr)
    result.update(first=first, last=last, value=[first, last], first_step=int(run["stats_steps"][0]),
                  step=int(run["stats_steps"][-1]))
    change = (last - first) / first
    return dict(result, verdict=SUPPORTED if last < first else NOT_SUPPORTED,
                detail=f"{first:.2f} at step {result['first_step']}, {last:.2f} at step {result['step']} "
                       f"({100 * change:+.1f}%)")


def hypotheses(run):
    return [hypothesis_entropy_norm(run), hypothesis_hierarchy(run), hypothesis_axis_aligned(run),
            hypothesis_pr_falls(run)]


# -- the head taxonomy -----------------------------------------------------------------------------


def taxonomy_rules(run):
    """The rules, in words, with this run's thresholds filled in."""
    root, h_uniform = math.sqrt(run["D"]), uniform_entropy(run["seq_len"])
    focus, amplified = FOCUS_FRACTION * h_uniform, (1 + NORM_MARGIN) * root
    return {
        "static sink": f"attn_sink > {SINK_THRESHOLD}: more than {SINK_THRESHOLD:.0%} of the head's attention "
                       "lands on the first position, whatever the query (the sink threshold of Gu et al. 2024)",
        "semantic retriever": f"not a sink; focused attention, attn_entropy < {focus:.2f} nats "
                              f"({FOCUS_FRACTION} x the {h_uniform:.2f} nats of uniform attention over "
                              f"T = {run['seq_len']}, i.e. fewer than about {math.exp(focus):.0f} tokens "
                              f"effectively); and an amplified key, k_norm > {amplified:.2f} "
                              f"({1 + NORM_MARGIN:g} x sqrt(D))",
        "syntactic gatherer": f"not a sink; diffuse attention, attn_entropy >= {focus:.2f} nats; a key that is "
                              f"not amplified, k_norm <= {amplified:.2f}; and not axis-aligned, "
                              f"k_maxabs^2 / k_norm^2 <= {AXIS_THRESHOLD}",
        "other": "none of the above: focused heads without an amplified key, or diffuse heads with an "
                 "amplified or axis-aligned key",
    }


def classify(sink, entropy, k_norm, axis, amplified, focus):
    """The first rule of taxonomy_rules a head meets."""
    if sink > SINK_THRESHOLD:
        return "static sink"
    if entropy < focus and k_norm > amplified:
        return "semantic retriever"
    if entropy >= focus and k_norm <= amplified and axis <= AXIS_THRESHOLD:
        return "syntactic gatherer"
    return "other"


def taxonomy(run):
    """Every query head at the last stats step, classified by taxonomy_rules."""
    reason = why_not(run, "k_norm", "k_maxabs", "attn_entropy", "attn_sink")
    if reason is None and run["seq_len"] < 1:
        reason = "the header gives no sequence length"
    rules = taxonomy_rules(run)
    if reason:
        return {"available": False, "reason": reason, "rules": rules}
    h_uniform = uniform_entropy(run["seq_len"])
    focus, amplified = FOCUS_FRACTION * h_uniform, (1 + NORM_MARGIN) * math.sqrt(run["D"])
    k_norm, axis = values(run, "k_norm@q")[-1], axis_ratio(run)[-1][:, kv_of_query(run)]
    entropy, sink = values(run, "attn_entropy")[-1], values(run, "attn_sink")[-1]
    heads = []
    for layer in range(run["L"]):
        for h in range(run["H"]):
            cls = classify(sink[layer, h], entropy[layer, h], k_norm[layer, h], axis[layer, h], amplified, focus)
            heads.append({"layer": layer, "head": h, "kv_head": int(kv_of_query(run)[h]), "class": cls,
                          "k_norm": float(k_norm[layer, h]), "attn_entropy": float(entropy[layer, h]),
                          "entropy_fraction": float(entropy[layer, h] / h_uniform),
                          "attn_sink": float(sink[layer, h]), "axis_ratio": float(axis[layer, h])})
    counts = {cls: sum(h["class"] == cls for h in heads) for cls in rules}
    return {"available": True, "step": int(run["stats_steps"][-1]), "rules": rules, "counts": counts,
            "uniform_entropy": h_uniform, "focus_entropy": focus, "amplified_k_norm": amplified,
            "seq_len": run["seq_len"], "heads": heads}


# -- figures and their captions --------------------------------------------------------------------


def group_change(curves, fmt="{:.2f}"):
    """'early 8.00 -> 6.12, middle ..., final ...'."""
    return "; ".join(f"{g} {fmt.format(c[0])} \u2192 {fmt.format(c[-1])}" for g, c in curves.items())


def span(run):
    steps = run["stats_steps"]
    return f"from step {steps[0]} to step {steps[-1]}"


def figure_key_norm(run, path, opts):
    curves = group_curves(run, values(run, "k_norm"))
    root = math.sqrt(run["D"])
    figures.group_panels(path, "Key norm by layer group", run["stats_steps"],
                         [("mean ||k|| after k_norm and its gain, before RoPE", "mean key L2 norm k_norm",
                           curves, root, f"sqrt(D) = {root:.2f}, the initial norm")], run["groups"])
    return (f"Mean key norm of each layer group, {span(run)}: {group_change(curves)}. The dotted line is "
            f"sqrt(D) = {root:.2f}, the norm of a key whose components have unit mean square (gain 1).")


def figure_outliers(run, path, opts):
    maxabs = values(run, "k_maxabs")
    curves = group_curves(run, maxabs)
    last = maxabs[-1]
    l, h = np.unravel_index(np.argmax(last), last.shape)
    share = (last[l, h] / values(run, "k_norm")[-1][l, h]) ** 2
    figures.group_panels(path, "Outlier magnitude: the largest key component", run["stats_steps"],
                         [("mean over keys of max_i |k_i|", "mean largest |component| k_maxabs", curves, None, None)],
                         run["groups"])
    return (f"Mean largest absolute key component per group, {span(run)}: {group_change(curves)}. At the last "
            f"step the largest is layer {l}, kv head {h}: {last[l, h]:.2f}, whose square is {share:.0%} of "
            f"the squared key norm ({AXIS_THRESHOLD:.0%} would make it axis-aligned).")


def figure_cos(run, path, opts):
    curves = group_curves(run, values(run, "k_cos"))
    figures.group_panels(path, "Latent redundancy: how alike the keys are", run["stats_steps"],
                         [("mean cosine similarity over pairs of distinct keys", "mean pairwise cosine k_cos",
                           curves, None, None)], run["groups"])
    above = [g for g, c in curves.items() if c[-1] > 0.5]
    return (f"Mean cosine similarity between keys per group, {span(run)}: {group_change(curves, '{:.3f}')}. "
            + (f"Above 0.5 at the end (the reports' 'semantic convergence'): {', '.join(above)}."
               if above else "No group ends above 0.5, the reports' mark of 'semantic convergence'."))


def figure_profile(run, path, opts):
    last = values(run, "k_norm")[-1]
    per_layer, root = last.mean(axis=1), math.sqrt(run["D"])
    step = run["stats_steps"][-1]
    figures.layer_profile(path, f"Key magnitude profile at step {step}", per_layer, last, run["groups"], root,
                          f"sqrt(D) = {root:.2f}", "mean key L2 norm k_norm")
    below = [i for i, v in enumerate(per_layer) if v < root]
    return (f"Mean k_norm of every layer at step {step} (bars; dots are single kv heads). Lowest: layer "
            f"{np.argmin(per_layer)} ({per_layer.min():.2f}); highest: layer {np.argmax(per_layer)} "
            f"({per_layer.max():.2f}). {len(below)} of {run['L']} layers are below sqrt(D) = {root:.2f}"
            + (f": {', '.join(map(str, below))}." if below else "."))


def divergence_layer(run, layer_option):
    """The layer whose kv heads' k_norm differ most at the last step, unless --layer chose one."""
    if layer_option is not None:
        return layer_option, "chosen with --layer"
    k_norm = values(run, "k_norm")
    if run["Hkv"] == 1:  # nothing can diverge: show the layer whose key norm moved most
        return int(np.argmax(np.abs(k_norm[-1, :, 0] - k_norm[0, :, 0]))), "the layer whose key norm changed most"
    return int(np.argmax(np.ptp(k_norm[-1], axis=1))), "the layer whose kv heads differ most at the end"


def figure_divergence(run, path, opts):
    k_norm = values(run, "k_norm")
    layer, why = divergence_layer(run, opts["layer"])
    heads, root = k_norm[:, layer, :], math.sqrt(run["D"])
    figures.heads_over_steps(path, f"Norm divergence of the kv heads of layer {layer}", run["stats_steps"], heads,
                             root, f"sqrt(D) = {root:.2f}", "mean key L2 norm k_norm")
    if run["Hkv"] == 1:
        return (f"Layer {layer} ({why}) has a single kv head: its k_norm goes from {heads[0, 0]:.2f} to "
                f"{heads[-1, 0]:.2f}; with one kv head per layer there is nothing to diverge.")
    lo, hi = int(np.argmin(heads[-1])), int(np.argmax(heads[-1]))
    return (f"k_norm of each kv head of layer {layer} ({why}). At step {run['stats_steps'][-1]} they range "
            f"from {heads[-1, lo]:.2f} (kv head {lo}) to {heads[-1, hi]:.2f} (kv head {hi}), a spread of "
            f"{heads[-1, hi] - heads[-1, lo]:.2f}; at step {run['stats_steps'][0]} the spread was "
            f"{np.ptp(heads[0]):.2f}.")


def phases(n_steps):
    """The stats steps split into three consecutive, nearly equal parts: early, mid, late training."""
    return [(name, idx) for name, idx in zip(("early", "mid", "late"), np.array_split(np.arange(n_steps), 3))
            if len(idx)]


def figure_scatter(run, path, opts):
    x, y, steps = values(run, "k_norm@q"), values(run, "attn_entropy"), run["stats_steps"]
    parts = [(f"{name} training (steps {steps[idx[0]]}-{steps[idx[-1]]})", x[idx].ravel(), y[idx].ravel())
             for name, idx in phases(len(steps))]
    root = math.sqrt(run["D"])
    figures.phase_scatter(path, "Entropy against key norm, one point per query head and stats step", parts,
                          (f"step {steps[-1]} (last)", x[-1].ravel(), y[-1].ravel()),
                          "k_norm of the head's kv head", "attention entropy (nats)", root, f"sqrt(D) = {root:.2f}")
    rho, p = spearman(x[-1].ravel(), y[-1].ravel())
    corr = (f"Spearman's rho across the {x[-1].size} heads at the last step is {rho:+.3f} (permutation p = {p:.3g})"
            if math.isfinite(rho) else "At the last step the values are too few or constant for a rank correlation")
    return (f"Each point is one query head at one stats step ({x.shape[1] * x.shape[2]} heads x {len(steps)} steps), "
            f"coloured by training phase; circled: the last step. Entropy at the last step ranges from "
            f"{y[-1].min():.2f} to {y[-1].max():.2f} nats, key norm from {x[-1].min():.2f} to {x[-1].max():.2f}. "
            f"{corr}.")


def figure_rank(run, path, opts):
    pr, er = group_curves(run, values(run, "k_pr")), group_curves(run, values(run, "k_erank"))
    figures.group_panels(path, f"Effective rank of the keys (D = {run['D']})", run["stats_steps"],
                         [("participation ratio of a key's components", "k_pr (dimensions)", pr, None, None),
                          ("effective rank of the keys matrix (Roy & Vetterli)", "k_erank (dimensions)", er,
                           None, None)], run["groups"])
    return (f"Left, the participation ratio (how many components a key spreads over), {span(run)}: "
            f"{group_change(pr, '{:.1f}')}. Right, the effective rank of all keys of a head together: "
            f"{group_change(er, '{:.1f}')}. Both can reach D = {run['D']}.")


def figure_gamma(run, path, opts):
    gains, steps = values(run, "g_k"), run["stats_steps"]
    if opts["layer"] is not None or has(run, "k_norm"):
        layer, why = divergence_layer(run, opts["layer"])  # the layer of norm_divergence.png
    else:  # no key norms: the layer whose gains moved furthest from 1
        layer, why = int(np.argmax(np.abs(gains[-1] - 1).mean(axis=1))), "the layer whose gains moved most"
    figures.gain_heatmaps(path, "k_norm gain g_k: which dimensions are amplified", steps, gains[:, layer, :], layer,
                          gains[-1], steps[-1])
    final = gains[-1, layer]
    top = np.argsort(final)[::-1][:3]
    l, d = np.unravel_index(np.argmax(gains[-1]), gains[-1].shape)
    return (f"Left: layer {layer}'s gain of every dimension over training ({why}; 1 at initialisation). At step "
            f"{steps[-1]} its gains range from {final.min():.2f} to {final.max():.2f}; the largest are "
            + ", ".join(f"dimension {i} ({final[i]:.2f})" for i in top)
            + f". Right: every layer at step {steps[-1]}; the largest gain of all is {gains[-1][l, d]:.2f} "
              f"(layer {l}, dimension {d}). Red amplifies, blue dampens.")


def figure_qk(run, path, opts):
    curves = group_curves(run, qk_ratio(run))
    q, k = values(run, "q_norm").mean(axis=(1, 2)), values(run, "k_norm").mean(axis=(1, 2))
    figures.group_panels(path, "Who turns the volume knob: ||q|| / ||k||", run["stats_steps"],
                         [("mean over query heads of q_norm / k_norm of its kv head", "||q|| / ||k||", curves,
                           1.0, "equal norms")], run["groups"])
    return (f"Mean ratio of query norm to key norm per group, {span(run)}: {group_change(curves, '{:.3f}')}. Over all "
            f"layers, mean ||q|| went {q[0]:.2f} \u2192 {q[-1]:.2f} and mean ||k|| {k[0]:.2f} \u2192 {k[-1]:.2f}.")


def figure_sinks(run, path, opts):
    sink, rate, steps = values(run, "attn_sink"), sink_rate(run), run["stats_steps"]
    figures.sink_figure(path, "Attention sinks: attention mass on the first position", steps, rate, sink[-1],
                        steps[-1], SINK_THRESHOLD)
    l, h = np.unravel_index(np.argmax(sink[-1]), sink[-1].shape)
    return (f"Left: share of the {run['L'] * run['H']} query heads with attn_sink > {SINK_THRESHOLD}, "
            f"{span(run)}: {100 * rate[0]:.0f}% \u2192 {100 * rate[-1]:.0f}%. Right: attn_sink of every head at "
            f"step {steps[-1]}; the strongest sink is layer {l}, query head {h} ({sink[-1][l, h]:.2f} of its "
            f"attention on position 0).")


def figure_loss(run, path, opts):
    steps, loss = run["loss"]
    val_steps, val = run["val"]
    figures.loss_figure(path, "Loss", steps, loss.astype(float), val_steps, val.astype(float))
    tail = loss[-10:].mean()
    text = (f"Training loss of every step, {steps[0]} to {steps[-1]}: {loss[0]:.3f} at the first step, "
            f"{tail:.3f} averaged over the last {min(10, len(loss))}.")
    if len(val):
        text += f" Validation loss: {val[0]:.3f} at step {val_steps[0]}, {val[-1]:.3f} at step {val_steps[-1]}."
    else:
        text += " The log has no validation loss."
    return text


# name, what it needs, how to draw it
FIGURES = [
    ("key_norm_evolution.png", ["k_norm"], figure_key_norm),
    ("outlier_magnitude.png", ["k_maxabs", "k_norm"], figure_outliers),
    ("latent_redundancy.png", ["k_cos"], figure_cos),
    ("key_magnitude_profile.png", ["k_norm"], figure_profile),
    ("norm_divergence.png", ["k_norm"], figure_divergence),
    ("entropy_norm_scatter.png", ["k_norm", "attn_entropy"], figure_scatter),
    ("effective_rank.png", ["k_pr", "k_erank"], figure_rank),
    ("gamma_heatmap.png", ["g_k"], figure_gamma),
    ("qk_ratio.png", ["q_norm", "k_norm"], figure_qk),
    ("sink_rate.png", ["attn_sink"], figure_sinks),
    ("loss.png", [], figure_loss),
]


def draw_figures(run, outdir, opts):
    """Draws what the log allows: ([(file, caption)], {file: why it was skipped})."""
    made, skipped = [], {}
    for name, needs, draw in FIGURES:
        reason = why_not(run, *needs) if needs else (None if len(run["loss"][0]) else "the log has no step records")
        if reason:
            skipped[name] = reason
            continue
        made.append((name, draw(run, str(outdir / name), opts)))
    return made, skipped


def draw_comparison(runs, outdir):
    """compare_<metric>.png for each compared statistic: ([(file, caption)], {file: why skipped})."""
    made, skipped = [], {}
    same_d = len({r["D"] for r in runs}) == 1
    for metric, label in COMPARED:
        have = [r for r in runs if has(r, metric)]
        name = f"compare_{metric}.png"
        if not have:
            skipped[name] = f"no log has {metric}"
            continue
        curves = [(r["label"], r["stats_steps"], group_curves(r, values(r, metric))) for r in have]
        ref = math.sqrt(runs[0]["D"]) if metric == "k_norm" and same_d else None
        figures.compare_figure(str(outdir / name), f"{label}: the runs compared", label, curves, ref,
                               f"sqrt(D) = {ref:.2f}" if ref else None)
        ends = "; ".join(f"{lab}: " + ", ".join(f"{g} {c[g][-1]:.2f}" for g in GROUPS) for lab, _, c in curves)
        lacking = [r["label"] for r in runs if not has(r, metric)]
        made.append((name, f"{label} by layer group, one line per run. At each run's last stats step: {ends}."
                     + (f" Not in the figure (no {metric}): {', '.join(lacking)}." if lacking else "")))
    return made, skipped


# -- the summary -----------------------------------------------------------------------------------


def at_step(run, index):
    """Group means of every statistic at one stats step (index 0: first, -1: last)."""
    out = {}
    for metric in ("k_norm", "k_maxabs", "k_cos", "k_pr", "k_erank", "q_norm", "attn_entropy", "attn_sink"):
        if has(run, metric):
            out[metric] = {g: float(c[index]) for g, c in group_curves(run, values(run, metric)).items()}
    if has(run, "q_norm", "k_norm"):
        out["qk_ratio"] = {g: float(c[index]) for g, c in group_curves(run, qk_ratio(run)).items()}
    return out


def loss_summary(run):
    steps, loss = run["loss"]
    val_steps, val = run["val"]
    out = {"steps_recorded": int(len(steps)), "first_step": None, "last_step": None, "last": None,
           "last10_mean": None, "val_last_step": None, "val_last": None}
    if len(steps):
        out.update(first_step=int(steps[0]), last_step=int(steps[-1]), last=float(loss[-1]),
                   last10_mean=float(loss[-10:].mean()))
    if len(val):
        out.update(val_last_step=int(val_steps[-1]), val_last=float(val[-1]))
    return out


def completeness(run):
    """Lines about what the log lacks: damage found by the reader, an early end, missing metrics."""
    lines = list(run["problems"])
    try:
        planned = int(run["options"].get("steps", 0))
    except (TypeError, ValueError):
        planned = 0
    span = run["step_range"]  # (first, last) step of any intact record, or None
    if planned and span is None:
        lines.append(f"the log has no step records (the run planned {planned} steps): the run stopped before "
                     "its first step ended, or the log was cut")
    elif planned and span[1] + 1 < planned:
        lines.append(f"the log ends at step {span[1]} of the {planned} steps the run planned (steps count "
                     "from 0): the run stopped early, is still running, or the log was cut")
    if run["missing"]:
        lines.append(f"metrics missing from the log: {', '.join(run['missing'])}")
    return lines


def summarise(run, made=None, skipped=None, opts=None):
    """The machine-readable summary of one run (schema at the top of this file); report.md is
    written from it, so both show the same numbers."""
    stats_steps = run["stats_steps"]
    root = math.sqrt(run["D"])
    out = {
        "log": run["path"], "label": run["label"],
        "created": run["header"].get("created"), "backend": run["header"].get("backend"),
        "device": run["header"].get("device"), "seed": run["header"].get("seed"),
        "config": run["config"], "options": run["options"],
        "head_dim": run["D"], "sqrt_head_dim": root, "seq_len": run["seq_len"],
        "groups": run["groups"],
        "stats_steps": {"count": int(len(stats_steps)),
                        "first": int(stats_steps[0]) if len(stats_steps) else None,
                        "last": int(stats_steps[-1]) if len(stats_steps) else None},
        "loss": loss_summary(run),
        "problems": completeness(run),
        "notes": [[step, text] for step, text in run["notes"]],
        "missing_metrics": run["missing"],
        "first_step": at_step(run, 0) if len(stats_steps) else {},
        "last_step": at_step(run, -1) if len(stats_steps) else {},
        "sink_rate": {"threshold": SINK_THRESHOLD,
                      "first": float(sink_rate(run)[0]) if has(run, "attn_sink") else None,
                      "last": float(sink_rate(run)[-1]) if has(run, "attn_sink") else None},
        "hypotheses": {h["id"]: h for h in hypotheses(run)},
        "taxonomy": taxonomy(run),
    }
    if has(run, "k_norm"):
        layer, why = divergence_layer(run, opts["layer"] if opts else None)
        out["norm_divergence_layer"] = {"layer": layer, "why": why}
    if made is not None:
        out["figures"] = {"made": [name for name, _ in made], "skipped": skipped}
    return out


# -- writing the report ----------------------------------------------------------------------------
# The report is a list of blocks, written out twice: as Markdown and as HTML.
#   ("h1"|"h2"|"h3"|"p", text)  ("list", [text])  ("table", [header], [[cell]])  ("figure", file, caption)
# Text may hold **bold** and `code`.


def number(x, fmt="{:.2f}"):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def code(text):
    return "`" + str(text).replace("`", "'") + "`"


def run_blocks(summary, made, skipped):
    """The report of one run."""
    s, blocks = summary, []
    cfg = s["config"]
    loss = s["loss"]
    blocks.append(("p", f"Log {code(s['log'])}, created {s['created']}, {s['backend']} backend on "
                        f"{s['device']}, seed {s['seed']}. Model: {cfg.get('n_layer')} layers, {cfg.get('n_head')} "
                        f"query heads, {cfg.get('n_kv_head')} key/value heads, head_dim D = {s['head_dim']} "
                        f"(sqrt(D) = {s['sqrt_head_dim']:.2f}), d_model {cfg.get('d_model')}, sequence length "
                        f"{s['seq_len']}. Steps recorded: {loss['steps_recorded']}"
                        + (f" ({loss['first_step']}..{loss['last_step']})" if loss['steps_recorded'] else "")
                        + f"; stats steps: {s['stats_steps']['count']}"
                        + (f" ({s['stats_steps']['first']}..{s['stats_steps']['last']})"
                           if s['stats_steps']['count'] else "") + "."))
    overlap = len({layer for layers in s["groups"].values() for layer in layers}) < 6
    blocks.append(("p", "Layer groups: " + ", ".join(f"{g} = {figures.layer_span(l)}" for g, l in s["groups"].items())
                   + (" (with fewer than 6 layers the groups share layers)" if overlap else "")
                   + f". Final training loss {number(loss['last10_mean'], '{:.3f}')} (mean of the last 10 steps), "
                     f"validation loss {number(loss['val_last'], '{:.3f}')}"
                   + (f" at step {loss['val_last_step']}." if loss["val_last_step"] is not None else ".")))

    blocks.append(("h2", "Problems and missing data"))
    if s["problems"] or skipped:
        items = list(s["problems"])
        items += [f"skipped {code(name)}: {why}" for name, why in skipped.items()]
        blocks.append(("list", items))
    else:
        blocks.append(("p", "None: the log is intact and has every metric this report uses."))

    if s["notes"]:
        blocks.append(("p", "Notes the trainer wrote into the log:"))
        blocks.append(("list", [f"step {step}: {text}" for step, text in s["notes"]]))

    blocks.append(("h2", "The reports' hypotheses, checked on this run"))
    rows = [[f"({h['id']}) {h['title']}", h["claim"], h["detail"] if "detail" in h else "", f"**{h['verdict']}**"]
            for h in s["hypotheses"].values()]
    blocks.append(("table", ["hypothesis", "claim", "what this run shows", "verdict"], rows))
    blocks.append(("list", [f"({h['id']}) decided as: {h['rule']}." for h in s["hypotheses"].values()]))

    blocks.append(("h2", "Head taxonomy"))
    tax = s["taxonomy"]
    if not tax["available"]:
        blocks.append(("p", f"Not available: {tax['reason']}."))
    else:
        blocks.append(("p", f"Every query head at step {tax['step']}, placed by the first rule it meets (top to "
                            "bottom). Key statistics are those of the head's kv head."))
        rows = []
        for cls, rule in tax["rules"].items():
            members = [h for h in tax["heads"] if h["class"] == cls]
            names = ", ".join(f"L{h['layer']}H{h['head']}" for h in members) or "none"
            rows.append([cls, rule, str(tax["counts"][cls]), names])
        blocks.append(("table", ["class", "rule", "heads", "which (L = layer, H = query head)"], rows))

    blocks.append(("h2", "Figures"))
    for i, (name, caption) in enumerate(made, 1):
        blocks.append(("figure", name, f"Figure {i} ({name}). {caption}"))

    blocks.append(("h2", "Configuration"))
    blocks.append(("table", ["model field", "value"], [[k, code(v)] for k, v in cfg.items()]))
    blocks.append(("table", ["option", "value"], [[k, code(v)] for k, v in s["options"].items()]))
    return blocks


def comparison_blocks(summaries, made, skipped):
    blocks = [("h2", "Comparison of the runs")]
    rows = []
    for s in summaries:
        k = s["last_step"].get("k_norm", {})
        rho = s["hypotheses"]["a"].get("value")
        rows.append([s["label"], str(s["loss"]["last_step"]), number(s["loss"]["last10_mean"], "{:.3f}"),
                     number(s["loss"]["val_last"], "{:.3f}")]
                    + [number(k.get(g)) for g in GROUPS]
                    + [number(s["sink_rate"]["last"], "{:.0%}"), number(rho, "{:+.3f}")])
    blocks.append(("table", ["run", "last step", "final loss (mean of last 10)", "val loss", "k_norm early",
                             "k_norm middle", "k_norm final", "sink rate", "Spearman rho (a)"], rows))
    blocks.append(("table", ["run"] + [f"({i})" for i in "abcd"],
                   [[s["label"]] + [s["hypotheses"][i]["verdict"] for i in "abcd"] for s in summaries]))
    runs = "; ".join(f"{s['label']} = {code(s['log'])}" for s in summaries)
    blocks.append(("p", "Group values are at each run's last stats step. The hypotheses (a)-(d), and the rules "
                        f"that decide them, are set out in the first run's section below. Runs: {runs}."))
    for s in summaries:
        if s["problems"]:
            blocks.append(("p", f"Problems of {s['label']}: " + "; ".join(s["problems"]) + "."))
    if skipped:
        blocks.append(("list", [f"skipped {code(n)}: {why}" for n, why in skipped.items()]))
    for name, caption in made:
        blocks.append(("figure", name, f"{name}. {caption}"))
    return blocks


def inline_md(text):
    return str(text).replace("|", "\\|")


def to_markdown(blocks):
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + block[1] + "\n")
        elif kind == "p":
            out.append(block[1] + "\n")
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in block[1]) + "\n")
        elif kind == "table":
            header, rows = block[1], block[2]
            lines = ["| " + " | ".join(inline_md(h) for h in header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(inline_md(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines) + "\n")
        elif kind == "figure":
            out.append(f"![{block[1]}]({block[1]})\n\n*{block[2]}*\n")
    return "\n".join(out)


def inline_html(text):
    text = html.escape(str(text), quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


STYLE = """body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #eee; }
figure { margin: 2em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.95em; color: #333; margin-top: 0.4em; }
code { background: #f3f3f3; padding: 0 0.2em; }"""


def to_html(blocks, title, outdir):
    body = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3", "p"):
            body.append(f"<{kind}>{inline_html(block[1])}</{kind}>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{inline_html(h)}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in block[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "figure":
            data = base64.b64encode((outdir / block[1]).read_bytes()).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(block[1])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{inline_html(block[2])}</figcaption></figure>")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# -- command line ----------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        print(f"error: {message} (see {self.prog} -h)", file=sys.stderr)
        sys.exit(2)


def run_labels(paths):
    """Short names for the runs: folder/file (the trainer names every log run.attnlog, so the folder
    is what tells runs apart); the same file given twice gets a number."""
    labels = [f"{Path(p).resolve().parent.name}/{Path(p).stem}" for p in paths]
    seen = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} ({seen[label]})"
    return labels


def make_report(paths, outdir, layer):
    runs = [load_run(p, label) for p, label in zip(paths, run_labels(paths))]
    primary = runs[0]
    if layer is not None and not 0 <= layer < primary["L"]:
        raise ReportError(f"--layer {layer}: the model of {primary['path']} has layers 0..{primary['L'] - 1}")
    outdir.mkdir(parents=True, exist_ok=True)
    opts = {"layer": layer}
    made, skipped = draw_figures(primary, outdir, opts)
    summary = summarise(primary, made, skipped, opts)
    blocks = [("h1", f"Attention-key report: {primary['label']}")]
    if len(runs) > 1:
        summaries = [summary] + [summarise(r) for r in runs[1:]]
        compare_made, compare_skipped = draw_comparison(runs, outdir)
        blocks += comparison_blocks(summaries, compare_made, compare_skipped)
        blocks.append(("h2", f"The first run in detail: {primary['label']}"))
        summary["comparison"] = {
            "figures": {"made": [n for n, _ in compare_made], "skipped": compare_skipped},
            "runs": [{"label": s["label"], "log": s["log"], "last_step": s["loss"]["last_step"],
                      "final_loss": s["loss"]["last10_mean"], "val_loss": s["loss"]["val_last"],
                      "k_norm": s["last_step"].get("k_norm"), "sink_rate": s["sink_rate"]["last"],
                      "spearman": s["hypotheses"]["a"].get("value"),
                      "verdicts": {i: s["hypotheses"][i]["verdict"] for i in "abcd"},
                      "problems": s["problems"]} for s in summaries]}
    blocks += run_blocks(summary, made, skipped)
    (outdir / "report.md").write_text(to_markdown(blocks), encoding="utf-8")
    (outdir / "report.html").write_text(to_html(blocks, blocks[0][1], outdir), encoding="utf-8")
    text = json.dumps(json_ready(summary), indent=1, ensure_ascii=False, allow_nan=False)
    (outdir / "summary.json").write_text(text + "\n", encoding="utf-8")
    return summary


def main(argv=None):
    parser = Parser(prog="report.py", description="Figures and findings of the attention-key reports from "
                    "run logs. With several logs, the first is reported in full and all are compared.")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="run log(s) written by ./train (.attnlog)")
    parser.add_argument("-o", "--out", metavar="OUTDIR", help="output folder (default: report/ beside the first log)")
    parser.add_argument("--layer", type=int, metavar="N", help="the layer of norm_divergence.png and the "
                        "left of gamma_heatmap.png (default: the layer whose kv heads' norms differ most at the end)")
    args = parser.parse_args(argv)
    outdir = Path(args.out) if args.out else Path(args.logs[0]).parent / "report"
    try:
        summary = make_report(args.logs, outdir, args.layer)
    except (attnlog.LogError, ReportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or outdir}: cannot write ({e.strerror})", file=sys.stderr)
        return 2
    try:
        say_done(outdir, summary)
    except BrokenPipeError:  # the reader of the output (head, less) stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def say_done(outdir, summary):
    """Where the report went, and its verdicts and problems, on stdout."""
    figs = summary["figures"]
    compared = summary["comparison"]["figures"]["made"] if "comparison" in summary else []
    print(f"{outdir}/report.md, report.html, summary.json: {len(figs['made'])} figures"
          + (f", {len(figs['skipped'])} skipped" if figs["skipped"] else "")
          + (f", {len(compared)} comparison figures" if compared else ""))
    for h in summary["hypotheses"].values():
        print(f"  ({h['id']}) {h['title']}: {h['verdict']}" + (f" ({h['detail']})" if h.get("detail") else ""))
    for problem in summary["problems"]:
        print(f"  problem: {problem}")


if __name__ == "__main__":
    sys.exit(main())
