"""The machine-readable summary of a run's report, written as summary.json (summarise, whose
docstring is its schema): what attnlog.analysis computes from the run and attnlog.verdicts decides
on it, as plain values. report.md is written from it, so both show the same numbers.
"""
import math

import numpy as np

from attnlog import claims, rope, verdicts
from attnlog.analysis import (SINK_THRESHOLD, WINDOW_FRACTION, divergence_layer, group_curves, has, is_measurement,
                              isotropic_pr, option_int, qk_ratio, sink_rate, uniform_entropy, uniform_sink, values)
from attnlog.run_figures import not_applicable_figures


SUMMARISED = ("k_norm", "k_maxabs", "k_cos", "k_pr", "k_erank", "k_mean_share", "k_erank_centered", "q_norm",
              "attn_entropy", "attn_sink", "attn_doc_start", "attn_maxp", "attn_logit_max")


def group_means(run, pick):
    """{statistic: {group: value}}, value = pick(group curve [S]) for every statistic of SUMMARISED
    the log has, and qk_ratio."""
    out = {m: {g: float(pick(c)) for g, c in group_curves(run, values(run, m)).items()}
           for m in SUMMARISED if has(run, m)}
    if has(run, "q_norm", "k_norm"):
        out["qk_ratio"] = {g: float(pick(c)) for g, c in group_curves(run, qk_ratio(run)).items()}
    return out


def doc_start_summary(run):
    """Attention on document starts beside attention on the window's first token, over every query
    head: {"eot", "attn_sink", "attn_doc_start", "visible", "per_visible_query"}, each {"first",
    "last", "window_mean"}; or None for a log without attn_doc_start."""
    if not has(run, "attn_doc_start", "attn_sink"):
        return None
    eot = option_int(run["options"], "eot", -1)
    sink, doc = values(run, "attn_sink").mean(axis=(1, 2)), values(run, "attn_doc_start").mean(axis=(1, 2))
    series = {"attn_sink": sink, "attn_doc_start": doc}
    if run["doc_view"] is not None:  # queries without a start in view add 0 to attn_doc_start
        visible = run["doc_view"]
        series.update(visible=visible, per_visible_query=np.divide(doc, visible, out=np.full_like(doc, np.nan),
                                                                   where=visible > 0))
    window = run["window"]
    out = {name: {"first": float(c[0]), "last": float(c[-1]), "window_mean": float(c[window].mean())}
           for name, c in series.items()}
    return dict(out, eot=eot if eot >= 0 else None)


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


def data_summary(run):
    """How often the run saw its training data: the tokens of this log's steps over the tokens the
    training shards hold (epochs)."""
    span = run["step_range"]
    seen = (span[1] + 1) * run["tokens_per_step"] if span else 0
    unique = run["train_tokens"]["tokens"]
    return {"train_tokens": unique, "source": run["train_tokens"]["source"], "tokens_seen": seen,
            "epochs": seen / unique if unique else None}


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
    reduced           {"from", "significant_bits"}: the log is a copy made by `attnlog reduce`, its
                       telemetry rounded to that precision; null for a log as the trainer wrote it
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
                       "window_count", "min_window_count", "trained" (all but settling hold), "settled"
                       (verdicts.SETTLING), "unsettled" [text: the layer statistics still moving beyond
                       the margin]}; of a measurement verdicts.measurement_status (the checkpoint's steps
                       and tokens, null when not recorded; warmup null; "measurement": true)
    data              {"train_tokens" (the training shards' tokens, one epoch; null if unknown), "source"
                       (where that number comes from), "tokens_seen" (this log's steps x tokens per
                       step), "epochs" (tokens_seen / train_tokens, null if unknown)}
    loss              {"steps_recorded", "first_step", "last_step", "last", "last10_mean", "mean" (of every
                       step), "val_last_step", "val_last"}
    problems          [text]: damage the reader found, an early end, missing metrics (too little training
                       is not among them: see training)
    missing_metrics   [name]: metrics this report uses that the log lacks
    notes             [[step, text]]: the notes the trainer wrote (a resumed run, a -e start)
    first_step, last_step, window_mean   {statistic: {group: mean over the group's layers and heads}}
                       at the first/last stats step and averaged over the decision window, for k_norm
                       k_maxabs k_cos k_pr k_erank k_mean_share k_erank_centered q_norm attn_entropy
                       attn_sink attn_doc_start attn_maxp attn_logit_max qk_ratio (those the log has)
    sink_rate         {"threshold", "first", "last"}: share of query heads with attn_sink > threshold
    doc_starts        {"eot": the end-of-text token (null: the run knew none), and for each of "attn_sink",
                       "attn_doc_start" (means over every query head), "visible" (doc_start_visible: the
                       share of queries with a document start in view) and "per_visible_query"
                       (attn_doc_start / visible: the mean over those queries alone): {"first", "last",
                       "window_mean"}}; visible and per_visible_query only when the log has
                       doc_start_visible; null for a log without attn_doc_start
    hypotheses        {"a"|"b"|"c"|"d": verdicts.hypotheses: {"id", "title", "claim", "rule",
                       "statistic", "verdict" ("supported" | "contradicted" | "inconclusive" | "not
                       applicable": of a measurement, verdicts.OVER_TRAINING), "why" ("decided" | "within
                       the margin" | "uncertain" | "still moving" | "too little training" | "not settled" |
                       "no data" | "not applicable"), "moving" (a test is still moving:
                       verdicts.MOVING), "detail", "tests": [{"name", "effect", "half_width" (infinite,
                       null in JSON, when the window holds fewer than 3 effective samples), "low", "high",
                       "margin", "uncertainty" (what half_width is), "verdict", "why", "moving", "end"
                       (the effect the window's trend line reaches at its last step), "trend" ({"change"
                       (the line's rise across the window, in the effect's units), "change_half" (its 95%
                       half-width), "n" (window steps), "n_eff" (their effective number), "phi" (the
                       AR(1) coefficient)} or null)}]
                       (empty without data), and per hypothesis (decision-window means):
                       a: value (Spearman's rho within layers, deciding), n_units (kv heads), p_value
                          (two-sided, permutations within layers), chance (95th percentile of |rho| under
                          them), across {rho, p, chance, n} (all kv heads: includes depth), layer_means
                          {rho, p, chance, n} (the layers' means: depth alone), per_step {mean, min, max,
                          steps} (rho within layers at each window step; null without it);
                       b: early, final (group k_norm), value [early, final], sqrt_head_dim;
                       c: value (kv heads above the axis threshold), of, heads [[layer, kv_head]],
                          first_step_count, max_ratio, max_ratio_head [layer, kv_head];
                       d: reference (mean k_pr at the reference step, the first stats step at or after
                          the warm-up), reference_step, first (at the first stats step), first_step, last
                          (window mean), value [reference, last], erank, erank_centered, mean_share
                          ({first, last, lowest, lowest_step} of k_erank, k_erank_centered, k_mean_share,
                          when the log has them)}
    path              verdicts.verdict_path: the hypotheses decided again with the run ending at 25%, 50%,
                       75% and 100% of its stats steps' span: [{"fraction", "end_step", "window" [first,
                       last], "enough", "trained", "hypotheses" {id: {"verdict", "why", "moving", "tests": [{"name",
                       "effect", "half_width", "verdict", "moving"}]}}}]; null for a measurement
    taxonomy          {"available", "window" [first, last], "step", "rules" {class: text}, "counts"
                       {class: n}, "uniform_entropy", "focus_entropy", "short_k_norm", "long_k_norm"
                       (the thirds of the kv heads' k_norm that make a key short or long), "seq_len",
                       "heads": [{"layer", "head", "kv_head", "class", "k_norm", "attn_entropy",
                       "entropy_fraction", "attn_sink", "axis_ratio"}], "diffuse_amplified" {"count",
                       "diffuse", "amplified_k_norm", "heads" [[layer, head]], "contradicts_premise"}}
                       (window means), or {"available": false, "reason", "rules"}
    norm_divergence_layer   {"layer", "why"}
    rope_gains        rope.rope_gains: {"available", "theta", "context" (T), "step" (the last stats step),
                       "wavelength" [D] (of each dimension's RoPE pair), "short_dims", "long_dims", "q"|"k":
                       {"layers": {"short": [L], "long": [L]}, "groups": {group: {"short", "long"}}}}, the mean
                       gain of the dimensions whose pair's wavelength is below T and of the others; or
                       {"available": false, "reason"}
    claims            claims.claim_table: the research notes' claims beside this run, {"file", "dynamics",
                       "why_static", "counts" {outcome: n}, "notes": [{"file", "title", "rows": [{"id", "claim",
                       "quotes" [text], "at", "step" (the logged step compared), "observed", "rule", "values",
                       "outcome" ("reproduces" | "does not reproduce" | "not applicable" | "not reached" |
                       "no data"), "why"}]}]}
    figures           {"made": [file], "skipped": {file: why}}
    comparison        (several logs, added by attnlog.report) {"figures": {...}, "runs": [{"label", "log",
                       "last_step", "final_loss" (mean of the last 10 steps), "val_loss", "k_norm" {group:
                       value}, "sink_rate", "spearman" (hypothesis a's rho within layers), "verdicts" {id:
                       verdict}, "problems"}], "replicates": [verdicts.replicate_verdicts, one per set of runs that
                       differ only in their seed: {"runs", "seeds", "counted" (the runs' labels whose
                       seeds count), "left_out" {label: why}, "hypotheses" {id: {"title", "verdict", "why",
                       "detail", "tests": [{"name", "values", "n", "mean" (also as "effect"), "t",
                       "half_width", "low", "high", "margin", "uncertainty", "verdict", "why"}]}},
                       "claims": claims.replicate_claims over the counted runs}]}
    """
    stats_steps, window = run["stats_steps"], run["window"]
    root = math.sqrt(run["D"])
    training = verdicts.training_status(run)
    decided = verdicts.hypotheses(run, training)
    out = {
        "log": run["path"], "label": run["label"],
        "created": run["header"].get("created"), "backend": run["header"].get("backend"),
        "device": run["header"].get("device"), "num_processes": run["header"].get("num_processes", 1),
        "seed": run["header"].get("seed"), "reduced": run["header"].get("reduced"),
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
        "data": data_summary(run),
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
        "doc_starts": doc_start_summary(run),
        "hypotheses": {h["id"]: h for h in decided},
        "path": verdicts.verdict_path(run, decided),
        "taxonomy": verdicts.taxonomy(run, training),
    }
    if has(run, "k_norm"):
        layer, why = divergence_layer(run, opts["layer"] if opts else None)
        out["norm_divergence_layer"] = {"layer": layer, "why": why}
    out["rope_gains"] = rope.rope_gains(run)
    out["claims"] = claims.claim_table(run)
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
