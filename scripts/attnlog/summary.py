"""The machine-readable summary of a run's report, written as summary.json (summarise, whose
docstring is its schema): what attnlog.analysis computes from the run and attnlog.verdicts decides
on it, as plain values. report.md is written from it, so both show the same numbers.
"""
import math

import numpy as np

from attnlog import verdicts
from attnlog.analysis import (SINK_THRESHOLD, WINDOW_FRACTION, divergence_layer, group_curves, has, is_measurement,
                              isotropic_pr, option_int, qk_ratio, sink_rate, uniform_entropy, uniform_sink, values)
from attnlog.run_figures import not_applicable_figures


SUMMARISED = ("k_norm", "k_maxabs", "k_cos", "k_pr", "k_erank", "k_mean_share", "k_erank_centered", "q_norm",
              "attn_entropy", "attn_sink", "attn_maxp", "attn_logit_max")


def group_means(run, pick):
    """{statistic: {group: value}}, value = pick(group curve [S]) for every statistic of SUMMARISED
    the log has, and qk_ratio."""
    out = {m: {g: float(pick(c)) for g, c in group_curves(run, values(run, m)).items()}
           for m in SUMMARISED if has(run, m)}
    if has(run, "q_norm", "k_norm"):
        out["qk_ratio"] = {g: float(pick(c)) for g, c in group_curves(run, qk_ratio(run)).items()}
    return out


def loss_summary(run):
    steps, loss = run["loss"]
    val_steps, val = run["val"]
    out = {"steps_recorded": int(len(steps)), "first_step": None, "last_step": None, "last": None,
           "last10_mean": None, "mean": None, "val_last_step": None, "val_last": None}
    if len(steps):
        out.update(first_step=int(steps[0]), last_step=int(steps[-1]), last=float(loss[-1]),
                   last10_mean=float(loss[-10:].mean()), mean=float(loss.mean()))
    if len(val):
        out.update(val_last_step=int(val_steps[-1]), val_last=float(val[-1]))
    return out


def completeness(run):
    """Lines about what the log lacks: damage found by the reader, an early end, missing metrics."""
    lines = list(run["problems"])
    measuring = is_measurement(run)
    planned = option_int(run["options"], "measure" if measuring else "steps")
    unit = "batches" if measuring else "steps"
    span = run["step_range"]  # (first, last) step of any intact record, or None
    if planned and span is None:
        lines.append(f"the log has no step records (the run planned {planned} {unit}): the run stopped before "
                     "its first step ended, or the log was cut")
    elif planned and span[1] + 1 < planned:
        lines.append(f"the log ends at step {span[1]} of the {planned} {unit} the run planned (steps count "
                     "from 0): the run stopped early, is still running, or the log was cut")
    if run["missing"]:
        lines.append(f"metrics missing from the log: {', '.join(run['missing'])}")
    return lines


def summarise(run, made=None, skipped=None, opts=None):
    """The machine-readable summary of one run, written as summary.json; report.md is written from
    it, so both show the same numbers. Its keys (null where the log lacks the data; steps are the
    log's, counted from 0 at the start of this log, also for a run started from a checkpoint):
    log, label, created, backend, device, num_processes, seed, config, options
                      the run, from the log's header
    head_dim, sqrt_head_dim, seq_len     D, sqrt(D) (the initial key norm), T of the training rows
    baselines         {"uniform_entropy", "uniform_sink", "isotropic_pr"}: uniform causal attention's
                       mean entropy (mean of ln(t+1)) and mean weight on position 0 (mean of 1/(t+1)),
                       over t < T; the participation ratio of isotropic Gaussian keys, (D+2)/3
    init              {"checkpoint", "steps"}: the weights this run started from (-e) and how many steps
                       they had trained before this log's step 0 (null if the log does not say); or null
    measurement       a measurement's log (./train --measure; analysis.is_measurement): the header's
                       {"checkpoint", "step", "run_id", "tokens"} of the weights it measured (the last two
                       when recorded); its steps are the batches measured, its window all of them;
                       null for a training run
    not_applicable    {"figures": [file], "hypotheses": [id]}: what needs training dynamics, which a
                       measurement does not have (empty lists for a training run)
    groups            {"early": [layers], "middle": [...], "final": [...]}
    stats_steps       {"count", "first", "last"}: the steps with telemetry
    window            {"first", "last", "count", "fraction"}: the decision window, the stats steps in the
                       last `fraction` of the stats steps' span; verdicts and taxonomy use its means
    training          verdicts.training_status: {"enough", "reasons" [text], "tokens_per_step",
                       "steps_trained", "init_steps", "tokens", "min_tokens", "warmup", "last_step",
                       "window_count", "min_window_count"}; of a measurement verdicts.measurement_status
                       (the checkpoint's steps and tokens, null when not recorded; warmup null;
                       "measurement": true)
    loss              {"steps_recorded", "first_step", "last_step", "last", "last10_mean", "mean" (of every
                       step), "val_last_step", "val_last"}
    problems          [text]: damage the reader found, an early end, missing metrics (too little training
                       is not among them: see training)
    missing_metrics   [name]: metrics this report uses that the log lacks
    notes             [[step, text]]: the notes the trainer wrote (a resumed run, a -e start)
    first_step, last_step, window_mean   {statistic: {group: mean over the group's layers and heads}}
                       at the first/last stats step and averaged over the decision window, for k_norm
                       k_maxabs k_cos k_pr k_erank k_mean_share k_erank_centered q_norm attn_entropy
                       attn_sink attn_maxp attn_logit_max qk_ratio (those the log has)
    sink_rate         {"threshold", "first", "last"}: share of query heads with attn_sink > threshold
    hypotheses        {"a"|"b"|"c"|"d": verdicts.hypotheses: {"id", "title", "claim", "rule",
                       "statistic", "verdict" ("supported" | "contradicted" | "inconclusive" | "not
                       applicable": of a measurement, verdicts.OVER_TRAINING), "why" ("decided" |
                       "within the margin" | "uncertain" | "too little training" | "no data" | "not
                       applicable"), "detail", "tests": [{"name", "effect", "half_width", "low", "high",
                       "margin", "uncertainty" (what half_width is), "verdict", "why"}] (empty without
                       data), and per hypothesis (decision-window means):
                       a: value (Spearman's rho across kv heads), n_units (kv heads), p_value (two-sided,
                          permutations), chance (95th percentile of |rho| under random pairings), within
                          {rho, p, chance, n, verdict} (within layers), per_step {mean, min, max, steps}
                          (rho at each window step);
                       b: early, final (group k_norm), value [early, final], sqrt_head_dim;
                       c: value (kv heads above the axis threshold), of, heads [[layer, kv_head]],
                          first_step_count, max_ratio, max_ratio_head [layer, kv_head];
                       d: first (mean k_pr at the first stats step), last (window mean), value [first,
                          last], first_step, erank, erank_centered, mean_share ({first, last} of k_erank,
                          k_erank_centered, k_mean_share, when the log has them)}
    taxonomy          {"available", "window" [first, last], "step", "rules" {class: text}, "counts"
                       {class: n}, "uniform_entropy", "focus_entropy", "amplified_k_norm", "seq_len",
                       "heads": [{"layer", "head", "kv_head", "class", "k_norm", "attn_entropy",
                       "entropy_fraction", "attn_sink", "axis_ratio"}]} (window means), or
                       {"available": false, "reason", "rules"}
    norm_divergence_layer   {"layer", "why"}
    figures           {"made": [file], "skipped": {file: why}}
    comparison        (several logs, added by attnlog.report) {"figures": {...}, "runs": [{"label", "log",
                       "last_step", "final_loss" (mean of the last 10 steps), "val_loss", "k_norm" {group:
                       value}, "sink_rate", "spearman" (hypothesis a's rho), "verdicts" {id: verdict},
                       "problems"}], "replicates": [verdicts.replicate_verdicts, one per set of runs that
                       differ only in their seed: {"runs", "seeds", "left_out" {label: why}, "hypotheses"
                       {id: {"title", "verdict", "why", "detail", "tests": [{"name", "values", "n",
                       "mean" (also as "effect"), "t", "half_width", "low", "high", "margin",
                       "uncertainty", "verdict", "why"}]}}}]}
    """
    stats_steps, window = run["stats_steps"], run["window"]
    root = math.sqrt(run["D"])
    training = verdicts.training_status(run)
    out = {
        "log": run["path"], "label": run["label"],
        "created": run["header"].get("created"), "backend": run["header"].get("backend"),
        "device": run["header"].get("device"), "num_processes": run["header"].get("num_processes", 1),
        "seed": run["header"].get("seed"),
        "config": run["config"], "options": run["options"],
        "head_dim": run["D"], "sqrt_head_dim": root, "seq_len": run["seq_len"],
        "baselines": {"uniform_entropy": uniform_entropy(run["seq_len"]), "uniform_sink": uniform_sink(run["seq_len"]),
                      "isotropic_pr": isotropic_pr(run["D"])},
        "init": run["init"], "variant": run["variant"], "measurement": run.get("measurement"),
        "not_applicable": {"figures": not_applicable_figures(run),
                           "hypotheses": sorted(verdicts.OVER_TRAINING) if is_measurement(run) else []},
        "groups": run["groups"],
        "stats_steps": {"count": int(len(stats_steps)),
                        "first": int(stats_steps[0]) if len(stats_steps) else None,
                        "last": int(stats_steps[-1]) if len(stats_steps) else None},
        "window": {"first": int(stats_steps[window[0]]) if len(window) else None,
                   "last": int(stats_steps[window[-1]]) if len(window) else None,
                   "count": int(len(window)), "fraction": WINDOW_FRACTION},
        "training": training,
        "loss": loss_summary(run),
        "problems": completeness(run),
        "notes": [[step, text] for step, text in run["notes"]],
        "missing_metrics": run["missing"],
        "first_step": group_means(run, lambda c: c[0]) if len(stats_steps) else {},
        "last_step": group_means(run, lambda c: c[-1]) if len(stats_steps) else {},
        "window_mean": group_means(run, lambda c: c[window].mean()) if len(stats_steps) else {},
        "sink_rate": {"threshold": SINK_THRESHOLD,
                      "first": float(sink_rate(run)[0]) if has(run, "attn_sink") else None,
                      "last": float(sink_rate(run)[-1]) if has(run, "attn_sink") else None},
        "hypotheses": {h["id"]: h for h in verdicts.hypotheses(run, training)},
        "taxonomy": verdicts.taxonomy(run, training),
    }
    if has(run, "k_norm"):
        layer, why = divergence_layer(run, opts["layer"] if opts else None)
        out["norm_divergence_layer"] = {"layer": layer, "why": why}
    if made is not None:
        out["figures"] = {"made": [name for name, _ in made], "skipped": skipped}
    return out


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
