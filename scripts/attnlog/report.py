"""Turns the trainer's run log into the figures and findings of the research reports on attention
keys (what the trainer measures: docs/telemetry.md). What it presents is computed by
attnlog.analysis (statistics), attnlog.verdicts (verdicts, taxonomy, replicates) and
attnlog.summary (summary.json), drawn by attnlog.run_figures; this module writes the report.

    attnlog-report RUN.attnlog [MORE.attnlog ...] [-o OUTDIR] [--layer N] [--label NAME ...]
    attnlog-report --follow RUN.attnlog [--interval SECONDS] [--idle SECONDS]
        renders the report again whenever the log of a training run grows, until the run has ended

(or /usr/bin/python3 scripts/report.py from the checkout). Writes into OUTDIR (default: a report/
folder beside the first log):
    *.png          the figures of the first run (names as in the reports: key_norm_evolution.png, ...)
    compare_*.png  with several logs: each run's layer-group curves overlaid
    report.md      configuration, figures with captions computed from the run, the reports'
                   hypotheses checked on it, a taxonomy of the heads, the research notes' claims
                   beside what the run shows (attnlog.claims), problems found in the log
    report.html    the same, one self-contained file (figures embedded, long tables folded away)
    summary.json   every number of the report, for programs (its keys: summary.summarise)

Needs numpy, matplotlib and Python-Markdown (Debian: python3-numpy python3-matplotlib
python3-markdown; dev/install_deps.sh report). A log that cannot be read, a missing file or a bad
option ends with one line `error: ...` on stderr and exit status 1 (attnlog.commands). A damaged or
cut log still gives every figure its intact records allow; the report says what was skipped and why.
"""
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import attnlog
from attnlog import claims, figures
from attnlog.analysis import ReportError, load_run
from attnlog.commands import DEFAULT_DATA, ArgumentParser, UserError, run
from attnlog.document import code, to_html, to_markdown
from attnlog.run_figures import GROUPS, draw_comparison, draw_figures
from attnlog.summary import json_ready, summarise
from attnlog.reader import measurement_text
from attnlog.verdicts import (CONTRADICTED, INCONCLUSIVE, MOVING, NOT_APPLICABLE, OVER_TRAINING, RULE, SETTLING,
                              SUPPORTED, replicate_sets, replicate_verdicts)

# -- the report's blocks (attnlog.document writes them out as Markdown and HTML) ---------------------

# How the single-run intervals and trends are had (attnlog.analysis, window_trend), for the report.
METHOD = ("Consecutive stats steps are not independent samples, so an interval that counts each window step as "
          "one is too narrow: each statistic's window steps are taken as a straight line (it may still drift) "
          "plus first-order autoregressive noise, whose coefficient phi (from the lag-1 autocorrelation of the "
          "line's residuals, made median-unbiased for the window's length) gives the effective number of samples, "
          "n_eff = n (1 - phi) / (1 + phi); the 95% intervals of the window mean and of the line's change across "
          "the window use n_eff, with n_eff - 2 degrees of freedom, and a window of fewer than 3 effective "
          "samples gives no interval. What the line explains is no uncertainty of the mean but a trend, shown as "
          "the change across the window. A block bootstrap would need more window steps than a run has.")


def number(x, fmt="{:.2f}"):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def run_blocks(summary, made, skipped):
    """The report of one run."""
    s, blocks = summary, []
    cfg = s["config"]
    loss = s["loss"]
    processes = f" x {s['num_processes']} processes (data parallel)" if s["num_processes"] > 1 else ""
    measured = s["measurement"]
    blocks.append(("p", f"Log {code(s['log'])}, created {s['created']}, {s['backend']} backend on "
                        f"{s['device']}{processes}, seed {s['seed']}. Model: {cfg.get('n_layer')} layers, {cfg.get('n_head')} "
                        f"query heads, {cfg.get('n_kv_head')} key/value heads, head_dim D = {s['head_dim']} "
                        f"(sqrt(D) = {s['sqrt_head_dim']:.2f}), d_model {cfg.get('d_model')}, sequence length "
                        f"{s['seq_len']}, {variant_text(s['variant'])}. "
                        + ("Batches measured" if measured else "Steps recorded") + f": {loss['steps_recorded']}"
                        + (f" ({loss['first_step']}..{loss['last_step']})" if loss['steps_recorded'] else "")
                        + ("" if measured else f"; stats steps: {s['stats_steps']['count']}"
                           + (f" ({s['stats_steps']['first']}..{s['stats_steps']['last']})"
                              if s['stats_steps']['count'] else "")) + "."))
    if s["reduced"]:
        left = s["reduced"].get("left_out", [])
        blocks.append(("p", f"The log is a reduced copy of {code(s['reduced']['from'])} (`attnlog reduce`): its "
                            f"statistics are rounded to {s['reduced']['significant_bits']} significant bits, a "
                            f"relative change of at most 2^-{s['reduced']['significant_bits']}."
                            + (" Left out of the copy, as every read of the original leaves them out: "
                               + "; ".join(left) + "." if left else "")))
    if s["init"]:
        blocks.append(("p", started_text(s["init"])))
    overlap = len({layer for layers in s["groups"].values() for layer in layers}) < 6
    groups = ("Layer groups: " + ", ".join(f"{g} = {figures.layer_span(l)}" for g, l in s["groups"].items())
              + (" (with fewer than 6 layers the groups share layers)" if overlap else ""))
    if measured:
        blocks.append(("p", measured_text(s)))
        blocks.append(("p", groups + f". Mean loss over the batches {number(loss['mean'], '{:.3f}')}."))
        blocks += not_applicable_blocks(s)
    else:
        blocks.append(("p", groups + f". Final training loss {number(loss['last10_mean'], '{:.3f}')} (mean of the "
                       f"last 10 steps), validation loss {number(loss['val_last'], '{:.3f}')}"
                       + (f" at step {loss['val_last_step']}." if loss["val_last_step"] is not None else ".")))
        blocks.append(("p", training_text(s)))
    blocks.append(("p", doc_start_text(s["doc_starts"])))

    blocks.append(("h2", "Problems and missing data"))
    if problem_lines(s) or skipped:
        items = problem_lines(s) + [f"skipped {code(name)}: {why}" for name, why in skipped.items()]
        blocks.append(("list", items))
    else:
        blocks.append(("p", "None: the log is intact and has every metric this report uses."))

    if s["notes"]:
        blocks.append(("p", "Notes the trainer wrote into the log:"))
        blocks.append(("list", [f"step {step}: {text}" for step, text in s["notes"]]))

    blocks.append(("h2", "The reports' hypotheses, checked on this run"))
    blocks.append(("p", f"Verdicts are {SUPPORTED}, {CONTRADICTED} or {INCONCLUSIVE}: {RULE}. Each effect is taken "
                        + ("from the means over every measured batch, its interval from their spread; the hypotheses "
                           f"about training are {NOT_APPLICABLE} to one model state." if measured else
                           "from the decision window's means, never from one stats step. " + METHOD
                           + f" Then {MOVING}.")))
    rows = [[f"({h['id']}) {h['title']}", h["claim"], h.get("detail", ""), tests_text(h["tests"]),
             verdict_text(h)] for h in s["hypotheses"].values()]
    blocks.append(("table", ["hypothesis", "claim", "what this run shows",
                             "effect e \u00b1 u (margin m); change across the window", "verdict"], rows))
    blocks.append(("list", [f"({h['id']}) decided as: {h['rule']}." for h in s["hypotheses"].values()]))
    blocks += path_blocks(s["path"])

    blocks.append(("h2", "Head taxonomy"))
    tax = s["taxonomy"]
    if not tax["available"]:
        blocks.append(("p", f"Not available: {tax['reason']}."))
    else:
        over = (f"the {s['window']['count']} measured batches" if measured else
                f"steps {tax['window'][0]}-{tax['window'][1]} (the decision window)")
        blocks.append(("p", f"Every query head, by its means over {over}, placed by the first rule it meets (top to "
                            "bottom). Key statistics "
                            "are those of the head's kv head. A key is long or short against the other keys of this "
                            f"run: the top third of its kv heads' k_norm (above {tax['long_k_norm']:.2f}) or the "
                            f"bottom third (below {tax['short_k_norm']:.2f}), not against sqrt(D), which training "
                            "moves almost every key away from."))
        rows = []
        for cls, rule in tax["rules"].items():
            members = [h for h in tax["heads"] if h["class"] == cls]
            names = ", ".join(f"L{h['layer']}H{h['head']}" for h in members) or "none"
            rows.append([cls, rule, str(tax["counts"][cls]), names])
        blocks.append(("table", ["class", "rule", "heads", "which (L = layer, H = query head)"], rows))
        blocks.append(("p", diffuse_amplified_text(tax["diffuse_amplified"])))

    if "ablation" in s:
        blocks += ablation_blocks(s["ablation"], tax)
    blocks += claims.claim_blocks(s["claims"])
    blocks.append(("h2", "Figures"))
    if not s["training"]["enough"]:
        blocks.append(("p", "The captions state the numbers only: the run trained too little for them to be read "
                            "as findings (see the training above)."))
    for i, (name, caption) in enumerate(made, 1):
        blocks.append(("figure", name, f"Figure {i} ({name}). {caption}"))

    blocks.append(("h2", "Configuration"))
    blocks.append(("table", ["model field", "value"], [[k, code(v)] for k, v in cfg.items()]))
    blocks.append(("table", ["option", "value"], [[k, code(v)] for k, v in s["options"].items()]))
    return blocks


def variant_text(variant):
    """"QK-norm `gain`, frozen: nothing" and the like, and the kinds weight decay took where they are
    not the default (the matrices)."""
    frozen = ", ".join(variant["frozen"]) or "nothing"
    decay = variant.get("decay", "matrices")
    return f"QK-norm {code(variant['qk_norm'])}, frozen: {frozen}" + ("" if decay == "matrices" else f", weight decay on: {decay}")


def started_text(init):
    if init.get("pretrained"):
        return (f"This run fine-tunes the pretrained Hugging Face checkpoint {code(init['checkpoint'])} "
                f"({init['pretrained']}, -e). Its steps count from 0 at that point; the pretraining before it "
                "is no number of this run's steps, so the notes' claims about a point of training are not "
                "compared, and the warm-up and the training tokens are this run's own.")
    if init["steps"] is None:
        return (f"This run started from the weights of {code(init['checkpoint'])} (-e); the log does not say how "
                "long they had trained. Its steps count from 0 at that point.")
    return (f"This run started from the weights of {code(init['checkpoint'])} (-e), which had trained "
            f"{init['steps']} steps. Its steps count from 0 at that point: step s of this report is step "
            f"{init['steps']} + s of the weights' training. The step axes of the figures are this run's, and so "
            f"is the warm-up; the training tokens count the {init['steps']} steps before it too.")


def measured_text(s):
    """What a measurement measured, and whether its weights had trained enough for verdicts."""
    t = s["training"]
    text = (f"**A measurement, not a training run**: {measurement_text(s['measurement'])}. Every statistic is of "
            f"this one model state, averaged over the {s['window']['count']} batches measured; their variation "
            "is the data's. ")
    if t["enough"]:
        return text + "Enough for verdicts: " + (
            f"weights trained on at least {t['min_tokens']:,} tokens" if t["tokens"] is not None else
            "the checkpoint does not say how long its weights trained (a pretrained model's), so they are taken as "
            "trained") + f", and at least {t['min_window_count']} batches measured."
    return text + "**Too little for verdicts**: " + "; ".join(t["reasons"]) + "."


def not_applicable_blocks(s):
    """What a measurement cannot show, in place of verdicts on it."""
    na = s["not_applicable"]
    items = [f"hypothesis ({key}) {s['hypotheses'][key]['title']}: {OVER_TRAINING[key]}" for key in na["hypotheses"]]
    items.append("the figures that follow training steps (trends, first-to-last changes, training phases): "
                 + ", ".join(code(name) for name in na["figures"]))
    items.append("the guard's warm-up and settling, the trend of a statistic across the window and the verdicts' "
                 "path (a measurement trains nothing: the weights' own training counts), and the decision window as "
                 "the last quarter of the steps (a measurement's is every batch it measured, which the rules below "
                 "call its decision window)")
    items.append("the claims of the research notes about change during training (their section says so)")
    return [("h2", f"{NOT_APPLICABLE.capitalize()} to a measurement"),
            ("p", "These need training dynamics, which a measurement of one model state does not have:"),
            ("list", items)]


def training_text(s):
    t, w = s["training"], s["window"]
    text = (f"Training: {t['tokens']:,} tokens ({t['steps_trained']} steps x {t['tokens_per_step']:,} tokens"
            + (f", the {t['init_steps']} steps of the checkpoint included" if t["init_steps"] else "")
            + f"), warm-up {t['warmup']} steps. " + epochs_text(s["data"]) + " ")
    if w["count"]:
        text += (f"Verdicts and the taxonomy use the decision window: the {w['count']} stats steps from step "
                 f"{w['first']} to step {w['last']}, the last {w['fraction']:.0%} of the stats steps' span. ")
    text += (f"A guard decides whether the run gets verdicts and a head taxonomy at all: it must be past warm-up, "
             f"have trained on at least {t['min_tokens']:,} tokens, have {t['min_window_count']} stats steps in the "
             f"window, and have settled ({SETTLING}). ")
    if t["enough"]:
        return text + "This run passes: its verdicts and taxonomy are given."
    return text + f"**{guard_text(t)}**: " + "; ".join(t["reasons"]) + "."


def guard_text(training):
    if not training["trained"]:
        return "Too little training for verdicts"
    return "No verdicts: the statistics have not settled"


def epochs_text(data):
    """How often the run saw its training data, and where the size of the data comes from."""
    if data["epochs"] is None:
        return f"How often it saw each training token is not known: {data['source']}."
    return (f"The training shards hold {data['train_tokens']:,} tokens ({data['source']}), so the "
            f"{data['tokens_seen']:,} tokens of this log's steps are {data['epochs']:.2f} epochs"
            + (": the run saw its training text more than once, and its losses and statistics are those of "
               "repeated data" if data["epochs"] > 1 else "") + ".")


def doc_start_text(d):
    """Attention on document starts beside attention on the window's first token (summary's doc_starts)."""
    if d is None:
        return "Attention on document starts: not measured (the log has no attn_doc_start)."
    if d["eot"] is None:
        return ("Attention on document starts: the run knew no end-of-text token (no tokenizer, no --eot), so "
                "attn_doc_start is 0 throughout.")
    w = {name: value["window_mean"] for name, value in d.items() if name != "eot"}
    text = (f"Attention on document starts (the positions after the end-of-text token, id {d['eot']}), mean over "
            f"every query head and the decision window: attn_doc_start {w['attn_doc_start']:.3f}, beside attn_sink "
            f"{w['attn_sink']:.3f} on the window's first position, wherever in a document the window begins.")
    if "visible" in w:
        text += (f" {w['visible']:.0%} of the queries had a document start in view (the others count 0 in "
                 f"attn_doc_start); over those alone the mass on document starts is "
                 f"{number(w['per_visible_query'], '{:.3f}')}.")
    return text


def problem_lines(s):
    """The problems of a run's log, and too little training for verdicts when it is so."""
    if s["training"]["enough"]:
        return list(s["problems"])
    reasons = "; ".join(s["training"]["reasons"])
    return s["problems"] + [f"{guard_text(s['training']).lower()} or a head taxonomy: {reasons}"]


def tests_text(tests):
    """'name: e +- u (m, n_eff); change across the window' for each test of a hypothesis."""
    return "; ".join(f"{t['name']}: {number(t['effect'], '{:+.3f}')} \u00b1 {half_text(t['half_width'])} "
                     f"(m = {t['margin']:g}" + trend_text(t) for t in tests) or "n/a"


def half_text(half):
    return "no interval" if half is not None and math.isinf(half) else number(half, "{:.3g}")


def trend_text(test):
    """'); over n steps (x effective): change +c +- h, still moving' of a test with a trend, else ')'."""
    trend = test["trend"]
    if trend is None or trend["n"] < 3:
        return ")"
    return (f"); over {trend['n']} steps ({number(trend['n_eff'], '{:.1f}')} effective): change "
            f"{number(trend['change'], '{:+.3g}')} \u00b1 {half_text(trend['change_half'])}"
            + (", **still moving**" if test["moving"] else ", no trend"))


def says_moving(h):
    """Whether the report says a hypothesis is still moving: not where its verdict already rests on the
    run's guard (too little training, statistics not settled), which says more."""
    return bool(h.get("moving")) and h.get("why") not in ("too little training", "not settled")


def verdict_text(h):
    return f"**{h['verdict']}**" + (" (still moving)" if says_moving(h) else "")


def path_blocks(path):
    """The verdicts' path over the run: the hypotheses decided again with the run cut short."""
    if not path:
        return []
    blocks = [("p", "**The verdicts' path.** The same hypotheses decided with the run ending earlier, each with "
                    "the decision window and the guard of that shorter run: a verdict that holds at every end is "
                    "stable; one that changes depends on how long the run was.")]
    header = ["hypothesis"] + [f"to step {p['end_step']} ({p['fraction']:.0%})" for p in path]
    rows = [["window, guard"] + [(f"{p['window'][0]}-{p['window'][1]}" if p["window"] else "none")
                                 + ("" if p["enough"] else ", too little training" if not p["trained"] else
                                    ", not settled") for p in path]]
    for key in path[-1]["hypotheses"]:
        cells = []
        for p in path:
            h = p["hypotheses"][key]
            effects = ", ".join(f"{number(t['effect'], '{:+.3f}')} \u00b1 {half_text(t['half_width'])}"
                                for t in h["tests"])
            cells.append(f"{h['verdict']}" + (", moving" if h["moving"] else "") + (f" ({effects})" if effects else ""))
        rows.append([f"({key})"] + cells)
    return blocks + [("table", header, rows)]


def diffuse_amplified_text(group):
    """The diffuse heads with amplified keys, and what they say of the notes' premise."""
    if not group["diffuse"]:
        return "No head that is not a sink attends diffusely here."
    heads = ", ".join(f"L{l}H{h}" for l, h in group["heads"]) or "none"
    verdict = ("most diffuse heads have amplified keys: this contradicts the notes' premise that diffuse heads, the "
               "gatherers, keep their keys low (about 5 against sqrt(D) = 8 in the notes) and that amplified keys go "
               "with focused attention" if group["contradicts_premise"] else
               "most diffuse heads do not have amplified keys, as the notes' premise has it")
    return (f"**Diffuse but amplified:** {group['count']} of the {group['diffuse']} query heads that are no sink and "
            f"attend diffusely have a key amplified beyond {group['amplified_k_norm']:.2f} (1.05 x sqrt(D)): "
            f"{verdict}. These heads: {heads}.")


def comparison_blocks(summaries, made, skipped, replicates):
    blocks = [("h2", "Comparison of the runs")]
    rows = []
    for s in summaries:
        k = s["last_step"].get("k_norm", {})
        rho = s["hypotheses"]["a"].get("value")
        rows.append([s["label"], s["variant"]["qk_norm"], ", ".join(s["variant"]["frozen"]) or "nothing",
                     s["variant"].get("decay", "matrices"),
                     str(s["loss"]["last_step"]), number(s["loss"]["last10_mean"], "{:.3f}"),
                     number(s["loss"]["val_last"], "{:.3f}")]
                    + [number(k.get(g)) for g in GROUPS]
                    + [number(s["sink_rate"]["last"], "{:.0%}"), number(rho, "{:+.3f}")])
    blocks.append(("table", ["run", "qk-norm", "frozen", "weight decay", "last step", "final loss (mean of last 10)", "val loss",
                             "k_norm early", "k_norm middle", "k_norm final", "sink rate", "rho within layers (a)"],
                   rows))
    blocks.append(("table", ["run"] + [f"({i})" for i in "abcd"],
                   [[s["label"]] + [s["hypotheses"][i]["verdict"] for i in "abcd"] for s in summaries]))
    runs = "; ".join(f"{s['label']} = {code(s['log'])}" for s in summaries)
    blocks.append(("p", "Group values are at each run's last stats step; rho (a) is within layers, over each "
                        "run's decision window. The hypotheses (a)-(d), and the rules that decide them, are set out "
                        f"in the first run's section below. Runs: {runs}."))
    for s in summaries:
        if problem_lines(s):
            blocks.append(("p", f"Problems of {s['label']}: " + "; ".join(problem_lines(s)) + "."))
    for rep in replicates:
        blocks += replicate_blocks(rep)
    if skipped:
        blocks.append(("list", [f"skipped {code(n)}: {why}" for n, why in skipped.items()]))
    for name, caption in made:
        blocks.append(("figure", name, f"{name}. {caption}"))
    return blocks


def replicate_blocks(rep):
    """The verdicts over the seeds of one configuration."""
    blocks = [("h3", "Replicates: " + ", ".join(rep["runs"]))]
    left = "".join(f" Left out: {label}, {why}." for label, why in rep["left_out"].items())
    blocks.append(("p", f"These {len(rep['runs'])} runs differ only in their seed (and options that do not change "
                        f"what a run computes). Seeds counted: {', '.join(map(str, rep['seeds'])) or 'none'}.{left} "
                        "Each test's effect is taken from every counted run (its decision-window value), and the "
                        "verdict applies the same rule to their mean and its 95% t-interval across the seeds, "
                        "mean \u00b1 t_0.975(n-1) x sd / sqrt(n)."))
    rows = []
    for key, h in rep["hypotheses"].items():
        for t in h["tests"] or [{"name": "n/a", "values": [], "n": 0}]:
            rows.append([f"({key}) {h['title']}", t["name"], ", ".join(f"{v:+.3f}" for v in t["values"]) or "none",
                         f"{number(t.get('mean'), '{:+.3f}')} \u00b1 {number(t.get('half_width'), '{:.3f}')}"
                         + (f" (n = {t['n']}, t = {t['t']:.3f})" if t["n"] > 1 else ""),
                         f"{t['margin']:g}" if "margin" in t else "", t.get("verdict", ""), f"**{h['verdict']}**"])
    blocks.append(("table", ["hypothesis", "test", "effect of each seed", "mean \u00b1 95% half-width", "margin",
                             "test's verdict", "verdict over the seeds"], rows))
    return blocks + claims.replicate_claim_blocks(rep["claims"])


# -- command line ----------------------------------------------------------------------------------


def make_report(paths, outdir, layer, refresh=None, labels=(), checkpoint=None, data=None):
    """labels: the names of the first runs (--label), in order; the others are named by
    attnlog.run_labels (folder/file stem). checkpoint: the first run's weights, whose heads are
    then ablated one at a time on the validation batches of data (attnlog.probe's ablate)."""
    if len(labels) > len(paths):
        raise ReportError(f"--label given {len(labels)} times for {len(paths)} logs: one label per log, in order")
    runs = [load_run(p, label) for p, label in zip(paths, attnlog.run_labels(paths, labels))]
    primary = runs[0]
    if layer is not None and not 0 <= layer < primary["L"]:
        raise ReportError(f"--layer {layer}: the model of {primary['path']} has layers 0..{primary['L'] - 1}")
    outdir.mkdir(parents=True, exist_ok=True)
    opts = {"layer": layer}
    made, skipped = draw_figures(primary, outdir, opts)
    summary = summarise(primary, made, skipped, opts)
    if checkpoint:
        summary["ablation"] = head_ablation(checkpoint, data, primary)
    blocks = [("h1", f"Attention-key report: {primary['label']}")]
    if len(runs) > 1:
        summaries = [summary] + [summarise(r) for r in runs[1:]]
        compare_made, compare_skipped = draw_comparison(runs, outdir)
        replicates = [replicate_verdicts([summaries[i] for i in members]) for members in replicate_sets(summaries)]
        by_label = {s["label"]: s for s in summaries}
        for rep in replicates:
            rep["claims"] = claims.replicate_claims([by_label[label]["claims"] for label in rep["counted"]],
                                                    rep["counted"])
        blocks += comparison_blocks(summaries, compare_made, compare_skipped, replicates)
        blocks.append(("h2", f"The first run in detail: {primary['label']}"))
        summary["comparison"] = {
            "figures": {"made": [n for n, _ in compare_made], "skipped": compare_skipped},
            "runs": [{"label": s["label"], "log": s["log"], "last_step": s["loss"]["last_step"],
                      "final_loss": s["loss"]["last10_mean"], "val_loss": s["loss"]["val_last"],
                      "k_norm": s["last_step"].get("k_norm"), "sink_rate": s["sink_rate"]["last"],
                      "spearman": s["hypotheses"]["a"].get("value"),
                      "verdicts": {i: s["hypotheses"][i]["verdict"] for i in "abcd"},
                      "problems": s["problems"]} for s in summaries],
            "replicates": replicates}
    blocks += run_blocks(summary, made, skipped)
    write_whole(outdir / "report.md", to_markdown(blocks))
    write_whole(outdir / "report.html", to_html(blocks, blocks[0][1], outdir, refresh))
    text = json.dumps(json_ready(summary), indent=1, ensure_ascii=False, allow_nan=False)
    write_whole(outdir / "summary.json", text + "\n")
    return summary


def head_ablation(checkpoint, data, run):
    """Each head's ablation (attnlog.probe's ablate: zeroed, and replaced by its mean) on the first
    probe.EVAL_TOKENS validation tokens (all there are when fewer), in sequences of 2 x the run's
    length, as attnlog-probe ablate evaluates by default; PyTorch is needed for this only."""
    from attnlog import probe
    c, params = probe.load_checkpoint(checkpoint)
    if (c.n_layer, c.n_head) != (run["L"], run["H"]):
        raise ReportError(f"--checkpoint {checkpoint}: {c.n_layer} layers of {c.n_head} heads, but the log's model "
                          f"has {run['L']} of {run['H']}")
    T = min(run["seq_len"], c.max_seq_len)
    batches = probe.evaluation_batches(data, 2, T, c.vocab_size)
    result = probe.ablate(params, c, batches)
    return dict({"checkpoint": str(checkpoint), "batches": len(batches), "batch": 2, "seq_len": T},
                **{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in result.items()})


def ablation_blocks(ablation, taxonomy):
    """The heads' loss increases, zeroed and mean-ablated, beside their taxonomy classes."""
    zero, mean = np.array(ablation["increase"]), np.array(ablation["mean_increase"])
    se = np.concatenate([np.ravel(ablation["increase_se"]), np.ravel(ablation["mean_increase_se"])])
    tokens = ablation["batches"] * ablation["batch"] * ablation["seq_len"]
    noise = ("one sequence gives no standard error" if np.isnan(se).all() else
             f"the standard error of an increase, over the {ablation['sequences']} sequences taken as independent, "
             f"is {np.nanmedian(se):.4f} (median; at most {np.nanmax(se):.4f}): an increase within two of its "
             "standard errors of 0 may be noise")
    both = lambda l, h: f"{zero[l, h]:+.4f} / {mean[l, h]:+.4f}"  # noqa: E731
    blocks = [("h2", "Head ablation"),
              ("p", f"The weights of {code(ablation['checkpoint'])}: the validation loss is {ablation['loss']:.4f} "
                    f"± {number(ablation['loss_se'], '{:.4f}')} on {tokens} tokens ({ablation['batches']} batches of "
                    f"{ablation['batch']} x {ablation['seq_len']}). A head's figures are how much the loss "
                    "rises when that one head's attention output is zeroed, and when it is replaced by its mean over "
                    "these tokens (scripts/probe.py ablate): zeroing also removes what the head adds on average, the "
                    "mean keeps that and removes only what depends on the input. So each class of the taxonomy can be "
                    f"read against what its heads do for the loss; {noise}.")]
    if taxonomy["available"]:
        rows = []
        for cls in taxonomy["rules"]:
            members = [(h["layer"], h["head"]) for h in taxonomy["heads"] if h["class"] == cls]
            rows.append([cls, str(len(members)),
                         number(np.mean([zero[m] for m in members]) if members else None, "{:+.4f}"),
                         number(np.mean([mean[m] for m in members]) if members else None, "{:+.4f}"),
                         ", ".join(f"L{l}H{h} {both(l, h)}" for l, h in members) or "none"])
        blocks.append(("table", ["class", "heads", "mean increase, zeroed", "mean increase, mean-ablated",
                                 "each head (zeroed / mean-ablated)"], rows))
    else:
        blocks.append(("table", ["layer"] + [f"H{h} (zeroed / mean-ablated)" for h in range(zero.shape[1])],
                       [[str(l)] + [both(l, h) for h in range(zero.shape[1])] for l in range(zero.shape[0])]))
    return blocks


def write_whole(path, text):
    """Writes a file so that a reader (a browser reloading the report) never sees half of it: into
    a file beside it, then renamed over it."""
    part = path.with_name(f".{path.name}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except OSError as e:  # a full disk names no file
        raise OSError(e.errno, e.strerror, str(path)) from None


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    return run(report, parse, argv)


def parse(argv):
    parser = ArgumentParser(description="Figures and findings of the attention-key reports from run logs. With "
                            "several logs, the first is reported in full and all are compared.")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="run log(s) written by ./train (.attnlog)")
    parser.add_argument("-o", "--out", metavar="OUTDIR", help="output folder (default: report/ beside the first log)")
    parser.add_argument("--layer", type=int, metavar="N", help="the layer of norm_divergence.png and the "
                        "left of gamma_heatmap.png (default: the layer whose kv heads' norms differ most at the end)")
    parser.add_argument("--label", action="append", default=[], metavar="NAME", help="the name of a run in "
                        "comparisons, once per log in the order given (default: the log's folder/file stem)")
    parser.add_argument("--follow", action="store_true", help="follow one run while it trains: render the report "
                        "again whenever its log grows, until the run has ended")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="with --follow: how often to look at the log's size (default 2)")
    parser.add_argument("--idle", type=float, default=600.0, metavar="SECONDS",
                        help="with --follow: stop when the log has not grown (or, missing, not appeared) for this "
                        "long (default 600)")
    parser.add_argument("--checkpoint", metavar="CKPT",
                        help="the first run's checkpoint: report the loss increase when each head is ablated, beside "
                        "the head taxonomy (needs PyTorch)")
    parser.add_argument("--data", default=DEFAULT_DATA, metavar="DIR",
                        help="with --checkpoint: the folder of the validation shards (default: the default corpus)")
    args = parser.parse_args(argv)
    if args.follow and len(args.logs) != 1:
        parser.error(f"--follow follows one log, not {len(args.logs)}")
    if args.follow and args.checkpoint:
        parser.error("--checkpoint is for a finished run (its final weights): leave it out with --follow")
    if not (args.interval > 0 and args.idle > 0):
        parser.error("--interval and --idle take a number of seconds above 0")
    return args


def report(args):
    """The report the command line asks for; the exit status."""
    outdir = Path(args.out) if args.out else Path(args.logs[0]).parent / "report"
    if args.follow:
        render = lambda refresh: make_report(args.logs, outdir, args.layer, refresh, args.label)  # noqa: E731
        return follow(args.logs[0], outdir, render, args.interval, args.idle)
    say_done(outdir, make_report(args.logs, outdir, args.layer, labels=args.label, checkpoint=args.checkpoint,
                                 data=args.data))
    return 0


def planned_steps(log):
    """The number of steps the run plans: option steps of the header, or of the latest note of a
    resumed run ("resumed at ...; run: {...}"), which may train for longer; a measurement's option
    measure, its batches."""
    options = log.header.get("options")
    if log.measurement:
        return int(options["measure"])
    for _, text in log.notes():
        members = text.partition("; run: ")[2]
        try:
            options = json.loads(members)["options"] if members else options
        except (ValueError, TypeError, KeyError):
            pass
    try:
        return int(options["steps"])
    except (TypeError, KeyError, ValueError):
        return None


def progress(path):
    """(last step of the step records or None, planned steps or None, whether the validation loss of
    the last planned step is in, whether the log has any validation loss) of a run log."""
    log = attnlog.open_log(path)
    planned = planned_steps(log)
    steps = log.scalars(log.scalar_names()[0])[0] if log.scalar_names() else np.zeros(0, np.int64)
    val_steps = log.val_loss()[0] if "val" in log.record_types else np.zeros(0, np.int64)
    last = int(steps[-1]) if len(steps) else None
    return last, planned, planned is not None and planned - 1 in val_steps, len(val_steps) > 0


def follow(path, outdir, render, interval, idle):
    """Renders the report of a run while it trains, again whenever its log grows (its size, looked
    at every interval seconds), with a tag that makes an open browser tab reload it; then once more,
    without the tag, when the run has ended or the log has not grown for idle seconds. The run has
    ended when its step records reach the last planned step and the validation loss of that step,
    written after it, is in too (for a run without validation: and the log did not grow over the
    last interval). A log that does not exist yet is waited for. Returns the exit status."""
    refresh = max(1, math.ceil(interval))
    size, changed, at_last = -1, time.monotonic(), False  # size: None while the log does not exist
    try:
        while True:
            try:
                now = os.stat(path).st_size
            except FileNotFoundError:
                now = None
            grew = now != size
            if grew:
                size, changed = now, time.monotonic()
                if size is None:
                    print(f"waiting for {path}", flush=True)
            if size is not None and (grew or at_last):
                last, planned, final_val, any_val = progress(path)
                at_last = None not in (last, planned) and last >= planned - 1
                if at_last and (final_val or not (any_val or grew)):
                    say_done(outdir, render(None))
                    print(f"the run has ended: the log holds step {last}, the last of the {planned} planned")
                    return 0
                if grew and render_again(render, refresh, size):
                    done = "no step yet" if last is None else f"step {last}" + (f" of {planned}" if planned else "")
                    print(f"{outdir}/report.html: {done}; reloads every {refresh} s", flush=True)
            if time.monotonic() - changed >= idle:
                if size is None:
                    raise ReportError(f"{path}: does not exist, and did not appear in {idle:g} s")
                say_done(outdir, render(None))
                print(f"stopped following: {path} has not grown for {idle:g} s (the run stopped early, or stalls)")
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        print("stopped following: interrupted")
        return 130


def render_again(render, refresh, size):
    """Renders the report of a run that is still training; a failure on a log caught mid-record is
    reported and left for the next render, an unreadable log or an unwritable folder ends following."""
    try:
        render(refresh)
        return True
    except (UserError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 (the next render may well succeed)
        print(f"warning: the report of the log at {size} bytes failed ({type(e).__name__}: {e}); "
              "trying again when it grows", file=sys.stderr, flush=True)
        return False


def say_done(outdir, summary):
    """Where the report went, and its verdicts and problems, on stdout."""
    figs = summary["figures"]
    compared = summary["comparison"]["figures"]["made"] if "comparison" in summary else []
    print(f"{outdir}/report.md, report.html, summary.json: {len(figs['made'])} figures"
          + (f", {len(figs['skipped'])} skipped" if figs["skipped"] else "")
          + (f", {len(compared)} comparison figures" if compared else ""))
    for h in summary["hypotheses"].values():
        moving = ", still moving" if says_moving(h) else ""
        print(f"  ({h['id']}) {h['title']}: {h['verdict']}{moving}" + (f" ({h['detail']})" if h.get("detail") else ""))
    for rep in summary.get("comparison", {}).get("replicates", []):
        print(f"  over the seeds {', '.join(map(str, rep['seeds']))} of {', '.join(rep['runs'])}:")
        for key, h in rep["hypotheses"].items():
            print(f"    ({key}) {h['title']}: {h['verdict']} ({h['detail']})")
    for problem in problem_lines(summary):
        print(f"  problem: {problem}")


if __name__ == "__main__":
    sys.exit(main())
