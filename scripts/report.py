#!/usr/bin/python3
"""Turns the trainer's run log into the figures and findings of the research reports on attention
keys (what the trainer measures: docs/telemetry.md). What it presents is computed by
scripts/analysis.py; this script draws the figures and writes the report.

    /usr/bin/python3 scripts/report.py RUN.attnlog [MORE.attnlog ...] [-o OUTDIR] [--layer N]

Writes into OUTDIR (default: a report/ folder beside the first log):
    *.png          the figures of the first run (names as in the reports: key_norm_evolution.png, ...)
    compare_*.png  with several logs: each run's layer-group curves overlaid
    report.md      configuration, figures with captions computed from the run, the reports'
                   hypotheses checked on it, a taxonomy of the heads, problems found in the log
    report.html    the same, one self-contained file (figures embedded)
    summary.json   every number of the report, for programs (its keys: analysis.summarise)

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
from analysis import (AXIS_THRESHOLD, SINK_THRESHOLD, ReportError, divergence_layer, group_curves,  # noqa: E402
                      has, json_ready, load_run, qk_ratio, sink_rate, spearman, summarise, values, why_not)

GROUPS = ("early", "middle", "final")
COMPARED = [("k_norm", "mean key norm k_norm"), ("k_maxabs", "mean largest key component k_maxabs"),
            ("k_cos", "mean cosine similarity of key pairs k_cos"),
            ("k_pr", "participation ratio k_pr (dimensions)"), ("attn_entropy", "attention entropy (nats)")]


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
