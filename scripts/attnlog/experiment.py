"""An experiment of several configurations, each trained with several seeds, read from the folder
that keeps its runs: one run per subfolder, its log run.attnlog (or run.attnlog.xz, as `attnlog
reduce` keeps it) and a MANIFEST of how it was made, as docs/runs/d22 holds them. Runs whose model
and options differ only in the seed are one configuration (attnlog.verdicts.configuration). For
each configuration it gives the research notes' claims over the seeds (attnlog.claims), the
statistics of its runs side by side with the other configurations', the hypotheses decided over
the seeds (attnlog.verdicts), and what the runs looked like after one pass over the training data.
Every number comes from each run's summary (attnlog.summary, as the run's report gives it); this
module only gathers them across runs.

    /usr/bin/python3 scripts/experiment.py FOLDER [-o OUTDIR]

Writes into OUTDIR (default: report/ inside FOLDER):
    results.md         the tables, with how each number was had (docs/research.md quotes them)
    results.json       the same numbers, for programs
    key_norm.png       each configuration's mean key norm by layer group over training: the mean
                       over its seeds, the seeds' range shaded
    attn_entropy.png   the same for the attention entropy
A folder without runs, or a log that cannot be read, ends with one line `error: ...` on stderr and
exit status 1 (attnlog.commands).
"""
import functools
import json
import math
import re
from pathlib import Path

import numpy as np

from attnlog import claims, figures, verdicts
from attnlog.analysis import group_curves, load_run, uniform_entropy, uniform_sink, values
from attnlog.commands import ArgumentParser, UserError, run
from attnlog.document import code, plain, plus_minus, to_markdown
from attnlog.layout import QK_NORMS
from attnlog.report import epochs_text, number, variant_text, write_whole
from attnlog.summary import json_ready, summarise

import matplotlib.pyplot as plt  # after attnlog.figures, which has chosen the backend that writes files only

LOG_NAMES = ("run.attnlog", "run.attnlog.xz")
SEED_SUFFIX = re.compile(r"_seed\d+$")  # a run folder's name is its configuration's, then _seed<N>
GROUPS = ("early", "middle", "final")
# The gains a claim's metric reads, by the parameter kind that holds them.
GAIN_KIND = {"g_q": "q_gain", "g_k": "k_gain"}
# The statistics set side by side, each over its decision window: (metric of summary's window_mean,
# what it is).
COMPARED = [("k_norm", "key norm"), ("q_norm", "query norm"), ("qk_ratio", "||q|| / ||k||"),
            ("attn_entropy", "attention entropy (nats)"), ("attn_maxp", "largest attention probability"),
            ("attn_sink", "attention on the first position"), ("attn_doc_start", "attention on document starts"),
            ("k_pr", "participation ratio of the keys"), ("k_cos", "mean cosine between keys")]
# What the first pass over the training data is set beside the end of the runs with: (metric, group).
FIRST_PASS = [("k_norm", "early"), ("k_norm", "middle"), ("k_norm", "final"), ("attn_entropy", "early"),
              ("attn_entropy", "final"), ("k_pr", "middle"), ("k_cos", "final")]


# -- the runs ----------------------------------------------------------------------------------------


def find_runs(folder):
    """[(label, log path, manifest)] of every subfolder of folder that holds a run log, by name with
    its numbers in their order (gain_seed7 before gain_seed42); the label is the subfolder's name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder")
    found = []
    natural = lambda p: [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", p.name)]
    for sub in sorted((p for p in folder.iterdir() if p.is_dir()), key=natural):
        logs = [sub / name for name in LOG_NAMES if (sub / name).is_file()]
        if len(logs) > 1:
            raise UserError(f"{sub}: holds both {' and '.join(LOG_NAMES)}; which one is the run is not clear")
        if logs:
            found.append((sub.name, logs[0], read_manifest(sub / "MANIFEST")))
    if not found:
        raise UserError(f"{folder}: no subfolder holds a {' or '.join(LOG_NAMES)}")
    return found


def read_manifest(path):
    """{key: value} of a MANIFEST's "key: value" lines (the first of a repeated key), {} without one."""
    manifest = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            key, colon, value = line.partition(": ")
            if colon:
                manifest.setdefault(key.strip(), value.strip())
    return manifest


def configurations(summaries):
    """[{"name", "variant", "members" [index into summaries]}]: the runs grouped by configuration,
    the default first (learnt gains, weight decay on the matrices), then by QK-norm variant. A
    configuration is named after its runs' folders without _seed<N>, where they agree."""
    sets = {}
    for i, s in enumerate(summaries):
        sets.setdefault(verdicts.configuration(s), []).append(i)
    out, taken = [], set()
    for members in sets.values():
        stems = {SEED_SUFFIX.sub("", summaries[i]["label"]) for i in members}
        variant = summaries[members[0]]["variant"]
        name = stems.pop() if len(stems) == 1 else plain(variant_text(variant))
        if name in taken:  # two configurations of one variant: each named by its runs
            name = ", ".join(summaries[i]["label"] for i in members)
        taken.add(name)
        out.append({"name": name, "variant": variant, "members": members})
    return sorted(out, key=lambda c: (c["variant"].get("decay", "matrices") != "matrices",
                                      QK_NORMS.index(c["variant"]["qk_norm"]) if c["variant"]["qk_norm"] in QK_NORMS
                                      else len(QK_NORMS), len(c["variant"]["frozen"])))


def spread(sample):
    """{"mean", "sd", "low", "high", "n"} of the finite values of a sample over seeds: sd with n - 1
    in the denominator (None for fewer than 2 values; everything None for none)."""
    finite = np.array([v for v in sample if v is not None and math.isfinite(v)], np.float64)
    if not len(finite):
        return {"mean": None, "sd": None, "low": None, "high": None, "n": 0}
    return {"mean": float(finite.mean()), "sd": float(finite.std(ddof=1)) if len(finite) > 1 else None,
            "low": float(finite.min()), "high": float(finite.max()), "n": int(len(finite))}


# -- the notes' claims over the seeds ------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def notes_claims():
    """{id: claim} of claims.json, read once."""
    return {c["id"]: c for c in claims.load_claims()["claims"]}


def claims_over_seeds(members, variant):
    """claims.replicate_claims over these summaries, every run counted (a claim is one stats step's
    value, not a verdict, so the guard against too little training does not leave a run out). A claim
    about learnt gains is not applicable to runs that do not learn them (plain, none, --freeze): what
    it reads of their gains is no order the training chose."""
    rows = claims.replicate_claims([s["claims"] for s in members], [s["label"] for s in members])
    for row in rows:
        kinds = {GAIN_KIND[m["metric"]] for m in notes_claims()[row["id"]].get("measures", ())
                 if m.get("metric") in GAIN_KIND}
        if kinds and kinds <= set(variant["frozen"]):
            row.update(outcome=claims.NOT_APPLICABLE, why=f"the runs do not learn {', '.join(sorted(kinds))}",
                       values={}, steps=[], mean=[], sd=[], low=[], high=[], reproduced=0, decided=0)
    return rows


def value_text(value, shown):
    """A claim's value as claims.json's rule shows its bounds (STATISTICS' third member): a change
    as a signed percentage, a share as a percentage, else 3 significant digits (a whole number
    as it is)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if shown == "change":
        return f"{value:+.1%}"
    if shown == "share":
        return f"{value:.0%}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:#.3g}".rstrip(".")


def sd_text(sd, shown):
    return "n/a" if sd is None else value_text(sd, shown).lstrip("+")


def claim_shows(claim_id):
    """[how each measure's value is shown] of a claim (value_text)."""
    return [claims.STATISTICS[m["statistic"]][2] for m in notes_claims()[claim_id].get("measures", ())]


def seeds_cell(row, seed_of):
    shows = claim_shows(row["id"])
    return "; ".join(f"{seed_of[label]}: " + ", ".join(value_text(v, s) for v, s in zip(vals, shows))
                     for label, vals in row["values"].items()) or "none"


def spread_cell(row):
    """mean ± sd (lowest to highest) of each measure, "; " between measures."""
    parts = []
    for mean, sd, low, high, shown in zip(row["mean"], row["sd"], row["low"], row["high"], claim_shows(row["id"])):
        text = value_text(mean, shown)
        if sd is not None:
            text += f" \u00b1 {sd_text(sd, shown)} ({value_text(low, shown)} to {value_text(high, shown)})"
        parts.append(text)
    return "; ".join(parts) or "none"


def count_cell(row, runs):
    """In how many of the runs the claim reproduces; where it was decided in none, why."""
    if not row["decided"]:
        return row["outcome"] + (f": {row['why']}" if row["why"] else "")
    if row["decided"] < runs:
        return row["why"]
    return f"{row['reproduced']} of {row['decided']}"


def quotes_cell(claim_id):
    """The passages of the notes a claim comes from, each after its note's number (000_... is 000)."""
    return " \u2026 ".join(f"{s['note'][:3]}: \u201c{s['quote']}\u201d" for s in notes_claims()[claim_id]["sources"])


def claim_blocks(config):
    """One configuration's claims over its seeds, one row per claim."""
    n = len(config["runs"])
    rows = [[row["claim"], quotes_cell(row["id"]),
             (row["at"] or "") + (f"; logged step {', '.join(map(str, row['steps']))}" if row["steps"] else ""),
             seeds_cell(row, config["seed_of"]), spread_cell(row), row["rule"], count_cell(row, n)]
            for row in config["claims"]]
    return [("h3", f"{config['name']}: {n} runs, seeds {', '.join(map(str, config['seeds']))}"),
            ("table", ["claim", "the note says", "at", "each seed", "mean \u00b1 sd (range)", "reproduces when",
                       "reproduces in"], rows)]


def claims_side_by_side(configs):
    """Every claim in every configuration: mean ± sd and in how many runs it reproduces."""
    rows = []
    for i, row in enumerate(configs[0]["claims"]):
        cells = [row["claim"]]
        for config in configs:
            theirs = config["claims"][i]
            if not theirs["decided"]:
                cells.append(theirs["outcome"])
                continue
            shows = claim_shows(theirs["id"])
            means = "; ".join(value_text(m, s) + ("" if sd is None else f" \u00b1 {sd_text(sd, s)}")
                              for m, sd, s in zip(theirs["mean"], theirs["sd"], shows))
            cells.append(f"{means} ({count_cell(theirs, len(config['runs']))})")
        rows.append(cells)
    return ("table", ["claim"] + [c["name"] for c in configs], rows)


# -- the configurations side by side -------------------------------------------------------------------


def window_gain_rms(run):
    """{group: the RMS of g_k over the head's dimensions, averaged over the group's layers and the
    decision window} of a run."""
    rms = np.sqrt((values(run, "g_k") ** 2).mean(axis=2, keepdims=True))  # [S, L, 1]
    return {g: float(c[run["window"]].mean()) for g, c in group_curves(run, rms).items()}


def largest_window_sink(run):
    """The largest attn_sink of any query head, its mean over the decision window."""
    return float(values(run, "attn_sink")[run["window"]].mean(axis=0).max())


def first_pass_step(run):
    """The step at which the run had trained on as many tokens as its training shards hold (as
    claims.claim_step places a claim made after that many tokens), or None when the log does not say
    how many they hold."""
    tokens = run["train_tokens"]["tokens"]
    return claims.claim_step(run, {"tokens": tokens})[0] if tokens else None


def first_pass_index(run):
    """The index of the stats step nearest first_pass_step (within claims.STEP_SLACK), or None."""
    return claims.nearest_stats_step(run, first_pass_step(run))


def configuration_numbers(runs, summaries):
    """The numbers of one configuration over its seeds, each a spread(): "statistics" {metric:
    {group}}, the decision-window means; "gain_rms" {group}; "largest_sink", "sink_rate" (at the
    last stats step); "val_loss", "train_loss" (mean of the last 10 steps), "gap" (val - train);
    "passes" (tokens seen / training tokens); "first_pass" {"steps" [the step each run ended its first
    pass at], "stats_steps" [the stats step nearest it], metric: {group: {"first_pass", "end"}}}: the
    statistics at those stats steps and at the last."""
    out = {"statistics": {}, "first_pass": {"steps": [first_pass_step(r) for r in runs]}}
    for metric, _ in COMPARED:
        out["statistics"][metric] = {g: spread([s["window_mean"].get(metric, {}).get(g) for s in summaries])
                                     for g in GROUPS}
    gains = [window_gain_rms(r) for r in runs]
    out["gain_rms"] = {g: spread([x[g] for x in gains]) for g in GROUPS}
    out["largest_sink"] = spread([largest_window_sink(r) for r in runs])
    out["sink_rate"] = spread([s["sink_rate"]["last"] for s in summaries])
    val, train = [s["loss"]["val_last"] for s in summaries], [s["loss"]["last10_mean"] for s in summaries]
    out["val_loss"], out["train_loss"] = spread(val), spread(train)
    out["gap"] = spread([v - t for v, t in zip(val, train) if None not in (v, t)])
    out["passes"] = spread([s["data"]["epochs"] for s in summaries])
    firsts = [first_pass_index(r) for r in runs]
    out["first_pass"]["stats_steps"] = [None if i is None else int(r["stats_steps"][i]) for r, i in zip(runs, firsts)]
    for metric, group in FIRST_PASS:
        curves = [group_curves(r, values(r, metric))[group] for r in runs]
        out["first_pass"].setdefault(metric, {})[group] = {
            "first_pass": spread([None if i is None else float(c[i]) for c, i in zip(curves, firsts)]),
            "end": spread([float(c[-1]) for c in curves])}
    return out


def mean_sd(x, fmt="{:#.3g}"):
    """mean ± sd of a spread(), in fmt."""
    if x["mean"] is None:
        return "n/a"
    show = lambda v: fmt.format(v).rstrip(".")  # noqa: E731 (#.3g keeps a point after a whole number)
    return show(x["mean"]) + ("" if x["sd"] is None else f" \u00b1 {show(x['sd'])}")


def statistics_blocks(configs, layers, window, seq_len):
    names = [c["name"] for c in configs]
    rows = []
    for metric, what in COMPARED:
        for g in GROUPS:
            rows.append([f"{what}, {g} ({figures.layer_span(layers[g])})"]
                        + [mean_sd(c["numbers"]["statistics"][metric][g]) for c in configs])
    for g in GROUPS:
        rows.append([f"RMS of the key gain g_k, {g}"] + [mean_sd(c["numbers"]["gain_rms"][g]) for c in configs])
    rows.append(["largest attention on the first position of any query head"]
                + [mean_sd(c["numbers"]["largest_sink"]) for c in configs])
    rows.append(["share of query heads with attn_sink above 0.3 (last stats step)"]
                + [mean_sd(c["numbers"]["sink_rate"], "{:.0%}") for c in configs])
    return [("h2", "The configurations side by side"),
            ("p", f"Each run's mean over its decision window (the stats steps {window}), then their mean \u00b1 "
                  "standard deviation across the configuration's seeds. The statistics are those of the log "
                  "(docs/telemetry.md): keys after the k norm and its gain, before RoPE, so with `plain` after the "
                  "norm alone and with `none` as projected. A key or query held by the norm alone has the norm "
                  f"sqrt(D). Uniform causal attention over the training context of {seq_len} positions has the "
                  f"entropy {uniform_entropy(seq_len):.2f} nats and puts {uniform_sink(seq_len):.4f} on the first "
                  "position. The gain's RMS over the head's dimensions scales the length of a normalised key; the "
                  "variants without learnt gains hold it at 1."),
            ("table", ["statistic (decision-window mean)"] + names, rows)]


def dampening_blocks(configs, summaries_of):
    """Hypothesis (b) seed by seed: the early and the final layers' key norm over the decision window,
    the verdict of each run and over the seeds."""
    rows = []
    for c in configs:
        runs = summaries_of(c)
        each = lambda g: ", ".join(f"{s['seed']}: {s['window_mean']['k_norm'][g]:.2f}" for s in runs)  # noqa: E731
        below = sum(s["window_mean"]["k_norm"]["early"] < s["sqrt_head_dim"] * (1 - verdicts.RELATIVE_MARGIN)
                    for s in runs)
        per_seed = ", ".join(f"{s['seed']}: {s['hypotheses']['b']['verdict']}" for s in runs)
        rows.append([c["name"], each("early"), f"{below} of {len(runs)}", each("final"), per_seed,
                     c["hypotheses"]["hypotheses"]["b"]["verdict"]])
    return [("p", "**Dampened early keys.** The early and final layers' mean key norm of each run over its decision "
                  "window, whether the early one lies more than 5% below sqrt(D) (the margin of hypothesis (b)), and "
                  "the verdict on (b) of each run and over the seeds (below)."),
            ("table", ["configuration", "early layers, each seed", "early more than 5% below sqrt(D)",
                       "final layers, each seed", "(b) each seed", "(b) over the seeds"], rows)]


def guard_word(training):
    """Why a run gets no verdicts, in a few words (its report's guard gives the details)."""
    if training["enough"]:
        return "passes"
    return "statistics not settled" if training["trained"] else "too little training"


def guard_text(training):
    """guard_word, and the layer statistics that had not settled (the first three)."""
    moved = training["unsettled"]
    if training["enough"] or not moved:
        return guard_word(training)
    statistics = f"{len(moved)} layer statistic" + ("s" if len(moved) > 1 else "")
    return (f"{guard_word(training)}: {statistics} moved by more than 5% of their scale ("
            + ", ".join(moved[:3]) + (", ..." if len(moved) > 3 else "") + ")")


def verdict_blocks(configs, summaries_of):
    rows = []
    for c in configs:
        rep = c["hypotheses"]
        cells = [c["name"]]
        for key, h in rep["hypotheses"].items():
            effects = "; ".join(f"{t['mean']:+.3f} \u00b1 {t['half_width']:.3f}" for t in h["tests"] if t["n"] > 1)
            seeds = ", ".join(f"{s['seed']}: {s['hypotheses'][key]['verdict']}" for s in summaries_of(c))
            cells.append(f"**{h['verdict']}**" + (f", e = {effects}" if effects else "") + f" (each seed: {seeds})")
        left = ", ".join(f"{s['label']} ({guard_word(s['training'])})" for s in summaries_of(c)
                         if s["label"] in rep["left_out"])
        cells.append(f"{len(rep['counted'])} of {len(rep['runs'])}" + (f"; left out: {left}" if left else ""))
        rows.append(cells)
    titles = [f"({k}) {h['title']}" for k, h in configs[0]["hypotheses"]["hypotheses"].items()]
    return [("h2", "The hypotheses over the seeds"),
            ("p", "The hypotheses (a)-(d) of docs/research.md decided over the seeds of each configuration by the "
                  "one rule: e is the mean of the runs' effects \u00b1 the half-width of its 95% t-interval across "
                  "the seeds (two effects for (b): the early layers' dampening, the final layers' amplification); "
                  "beside it each run's own verdict. Runs that did not pass the guard (too little training, or "
                  "statistics not settled) are left out of the verdict over the seeds, which needs two runs."),
            ("table", ["configuration"] + titles + ["runs counted"], rows)]


def repetition_blocks(configs, summaries):
    """The passes over the training data, the losses on it and on held-out text, and the statistics
    after the first pass beside those at the end."""
    data = summaries[configs[0]["members"][0]]["data"]
    alike = all(s["data"] == data for s in summaries)
    rows = []
    for c in configs:
        x = c["numbers"]
        ends = {(step, stats) for step, stats in zip(x["first_pass"]["steps"], x["first_pass"]["stats_steps"])
                if step is not None}
        rows.append([c["name"], mean_sd(x["passes"], "{:.2f}"),
                     ", ".join(f"{step} ({'no stats step near' if stats is None else stats})"
                               for step, stats in sorted(ends, key=lambda end: end[0])) or "not known",
                     mean_sd(x["train_loss"], "{:.3f}"), mean_sd(x["val_loss"], "{:.3f}"), mean_sd(x["gap"], "{:.3f}")])
    blocks = [("h2", "Repetition of the training data"),
              ("p", epochs_text(data) + (" So it is in every run here." if alike else
                                         f" So it is in {summaries[configs[0]['members'][0]]['label']}; the others "
                                         "differ (their passes below).")
                    + " The training loss (the mean of the last 10 steps) is measured on batches of that text, the "
                    "validation loss on held-out text; their difference is what the repetition shows in the loss."),
              ("table", ["configuration", "passes over the training tokens", "end of the first pass: step "
                         "(nearest stats step)", "training loss", "validation loss", "validation - training"], rows)]
    header = ["configuration"] + [f"{metric} {g}" for metric, g in FIRST_PASS]
    rows = []
    for c in configs:
        x = c["numbers"]["first_pass"]
        rows.append([c["name"]] + [f"{mean_sd(x[m][g]['first_pass'])} \u2192 {mean_sd(x[m][g]['end'])}"
                                   for m, g in FIRST_PASS])
    blocks.append(("p", "The layer groups' statistics at the stats step nearest the end of the first pass, and at the "
                        "last stats step (mean \u00b1 sd over the seeds): what the runs had reached on text seen once, "
                        "and where the later passes took them."))
    blocks.append(("table", header, rows))
    return blocks


# -- the figures -------------------------------------------------------------------------------------


def notes_marks(run, metric):
    """[(step, value, claim id)]: the notes' values of a layer group's mean of metric ("about x" of a
    claim with one group_mean measure of one group), at the step the claim speaks of."""
    marks = []
    for c in notes_claims().values():
        ms = c.get("measures", ())
        if len(ms) == 1 and ms[0]["statistic"] == "group_mean" and ms[0]["metric"] == metric \
                and ms[0]["layers"] in GROUPS and "about" in ms[0]["rule"]:
            step = claims.claim_step(run, c["at"])[0]
            if step is not None:
                marks.append((step, ms[0]["rule"]["about"], ms[0]["layers"]))
    return marks


def draw_configurations(path, metric, ylabel, configs, runs_of, ref, ref_label):
    """One panel per configuration (each its own y scale): each layer group's curve of metric, the mean
    over the seeds, their range shaded; the end of the first pass over the data dotted; the notes'
    values of the groups marked. Returns the caption's numbers: {name: {group: (mean at the last
    stats step)}}."""
    fig, axes = plt.subplots(1, len(configs), figsize=(4.2 * len(configs) + 1.8, 4.0), constrained_layout=True,
                             squeeze=False)
    ends = {}
    for ax, c in zip(axes[0], configs):
        runs = runs_of(c)
        steps = runs[0]["stats_steps"]
        if any(len(r["stats_steps"]) != len(steps) or (r["stats_steps"] != steps).any() for r in runs):
            raise UserError(f"{c['name']}: its runs logged statistics at different steps; no mean over the seeds")
        ends[c["name"]] = {}
        for g in GROUPS:
            curves = np.array([group_curves(r, values(r, metric))[g] for r in runs])
            colour, style = figures.GROUP_STYLE[g]
            ax.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=colour, alpha=0.2, linewidth=0)
            ax.plot(steps, curves.mean(axis=0), color=colour, linestyle=style, linewidth=1.6,
                    label=f"{g} ({figures.layer_span(runs[0]['groups'][g])})")
            ends[c["name"]][g] = float(curves.mean(axis=0)[-1])
        for step, value, group in notes_marks(runs[0], metric):
            ax.plot([step], [value], marker="*", markersize=11, color=figures.GROUP_STYLE[group][0],
                    markeredgecolor="black", linestyle="none", label="the notes' value")
        first = first_pass_index(runs[0])
        if first is not None:
            ax.axvline(steps[first], color="0.5", linestyle=":", linewidth=1.2, label="end of the first pass")
        if ref is not None:
            ax.axhline(ref, color="0.35", linestyle="--", linewidth=1.0, label=ref_label)
        ax.set_title(f"{c['name']} ({len(runs)} seeds)")
        ax.set_xlabel(figures.STEP_LABEL)
    axes[0][0].set_ylabel(ylabel)
    named = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            named.setdefault(label, handle)
    axes[0][-1].legend(named.values(), named.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       borderaxespad=0)
    fig.savefig(path, dpi=figures.DPI)
    plt.close(fig)
    return ends


def figure_blocks(outdir, configs, runs_of, head_dim, seq_len):
    uniform = uniform_entropy(seq_len)
    drawn = [("key_norm.png", "k_norm", "mean key norm", math.sqrt(head_dim), f"sqrt(D) = {math.sqrt(head_dim):.2f}"),
             ("attn_entropy.png", "attn_entropy", "attention entropy (nats)", uniform,
              f"uniform attention, {uniform:.2f}")]
    blocks = [("h2", "Figures")]
    for name, metric, ylabel, ref, ref_label in drawn:
        ends = draw_configurations(outdir / name, metric, ylabel, configs, runs_of, ref, ref_label)
        last = "; ".join(f"{c}: " + ", ".join(f"{g} {v:.2f}" for g, v in e.items()) for c, e in ends.items())
        blocks.append(("figure", name, f"{ylabel.capitalize()} by layer group, one panel per configuration, each on "
                                       f"its own scale: the mean over the seeds, their range shaded; {ref_label} "
                                       "dashed, the end of the first pass over the training data dotted, and stars "
                                       "where the notes give a group's value. At the last stats step: "
                                       f"{last}."))
    return blocks


# -- the document ------------------------------------------------------------------------------------


PROBES = ("sweep", "svd", "ablate")  # scripts/probe.py's probes whose --json a run's probes/ folder keeps


def read_probes(folder, found, configs):
    """[{"run", "configuration", probe: its JSON}] of every run whose folder keeps a probe's
    probes/<probe>.json, in the runs' order."""
    config_of = {label: c["name"] for c in configs for label in c["runs"]}
    out = []
    for label, _, _ in found:
        kept = {}
        for probe in PROBES:
            path = Path(folder) / label / "probes" / f"{probe}.json"
            if path.is_file():
                try:
                    kept[probe] = json.loads(path.read_text())
                except (OSError, ValueError) as e:
                    raise UserError(f"{path}: not a probe's JSON ({e})") from None
        if kept:
            out.append(dict(kept, run=label, configuration=config_of[label]))
    return out


def group_mean(table, layers):
    """The mean over the heads of the layers of a [L, H] table (None: NaN), None where none is finite."""
    values = np.array([[np.nan if v is None else v for v in table[l]] for l in layers], float)
    return float(np.nanmean(values)) if np.isfinite(values).any() else None


def probe_blocks(probed, groups):
    """The probes of the runs' final checkpoints that their folders keep: the loss with the attention
    logits scaled (sweep), the heads' score forms against chance (svd), and the loss without each
    head (ablate)."""
    if not probed:
        return []
    spans = {g: f"{g} ({figures.layer_span(groups[g])})" for g in GROUPS}
    blocks = [("h2", "The probes of the final checkpoints"),
              ("p", f"{code('scripts/probe.py')} on the final checkpoint of a run, where its folder keeps the "
                    f"probe's output ({code('probes/<probe>.json')}, with its table and figure). Each loss difference "
                    "comes with its standard error over the validation sequences the probe evaluated.")]
    swept = [p for p in probed if "sweep" in p]
    if swept:
        scales = sorted({s for p in swept for s in p["sweep"]["scales"]})
        rows = []
        for p in swept:
            r = p["sweep"]
            at = dict(zip(r["scales"], zip(r["loss"], r["loss_change_se"])))
            one = at.get(1, (None, None))[0]
            rows.append([p["run"], p["configuration"], f"{r['sequences']} x {r['seq_len']}",
                         "" if one is None else f"{one:.4f}"] +
                        ["" if s not in at or s == 1 or one is None else plus_minus(at[s][0] - one, at[s][1])
                         for s in scales if s != 1])
        blocks += [("p", "**Attention logits times s** (`sweep`): the validation loss at s = 1 and its change at "
                         "each other s."),
                   ("table", ["run", "configuration", "sequences x tokens", "loss at s = 1"] +
                    [f"s = {s:g}" for s in scales if s != 1], rows)]
    svds = [p for p in probed if "svd" in p]
    if svds:
        rows = []
        for p in svds:
            r = p["svd"]
            rows.append([p["run"], p["configuration"]] +
                        [number(group_mean(r["effective_rank"], groups[g]), "{:.1f}") for g in GROUPS] +
                        [f"{number(group_mean(r[name], range(len(r[name]))), '{:.3f}')} (chance "
                         f"{r[f'chance_{name}']:.3f} ± {r[f'chance_{name}_se']:.3f})"
                         for name in ("cos_mean", "qk_row_cos_abs_mean")])
        blocks += [("p", "**The heads' score forms** (`svd`): the effective rank of W_Q,h^T diag(g_q g_k) W_K, "
                         "the mean over each layer group's heads; the mean principal cosine between the row spaces "
                         "of W_Q,h and W_K, and the mean |cosine| between their rows, over every head, each "
                         "beside its value for random weights (chance)."),
                   ("table", ["run", "configuration"] + [f"effective rank, {spans[g]}" for g in GROUPS] +
                    ["principal cosine", "|cosine| of W_Q and W_K rows"], rows)]
    ablated = [p for p in probed if "ablate" in p]
    if ablated:
        rows = []
        for p in ablated:
            r = p["ablate"]
            zeroed = np.array([[np.nan if v is None else v for v in row] for row in r["increase"]], float)
            top = np.argsort(-np.nan_to_num(zeroed, nan=-np.inf), axis=None)[:3]
            needed = ", ".join(f"{l}.{h} ({plus_minus(r['increase'][l][h], r['increase_se'][l][h])})"
                               for l, h in zip(*np.unravel_index(top, zeroed.shape)))
            rows.append([p["run"], p["configuration"], f"{r['loss']:.4f} ± {r['loss_se']:.4f}"] +
                        [number(group_mean(r[name], groups[g]), "{:+.4f}") for name in ("increase", "mean_increase")
                         for g in GROUPS] + [needed])
        blocks += [("p", "**Each head removed** (`ablate`): the intact validation loss, the mean increase of the "
                         "loss over each layer group's heads with a head's output zeroed and with it replaced by its "
                         "mean, and the three heads (layer.head) whose zeroing raises the loss most."),
                   ("table", ["run", "configuration", "intact loss"] +
                    [f"{what}, {spans[g]}" for what in ("zeroed", "mean-ablated") for g in GROUPS] +
                    ["the heads the loss needs most"], rows)]
    return blocks


def runs_blocks(folder_name, summaries, manifests, configs):
    rows = []
    for c in configs:
        for i in c["members"]:
            s, manifest = summaries[i], manifests[i]
            rows.append([s["label"], c["name"], plain(variant_text(s["variant"])), str(s["seed"]),
                         manifest.get("commit", "not recorded"), f"{s['backend']}, {s['device']}",
                         f"{s['loss']['last_step']}",
                         f"{s['loss']['val_last']:.3f}" if s["loss"]["val_last"] is not None else "n/a",
                         guard_text(s["training"])])
    return [("h2", "The runs"),
            ("p", f"The run logs kept in {code(folder_name)}, one folder each, grouped into configurations: runs "
                  "whose model and options differ only in the seed. The commit is the MANIFEST's; the device and "
                  "everything else the log's. The guard is the report's (docs/research.md): a run that does not "
                  "pass it gets no verdicts, its statistics still moving from the quarter before the decision "
                  "window."),
            ("table", ["run", "configuration", "variant", "seed", "made at", "backend, device", "last step",
                       "validation loss", "the report's guard"], rows)]


def make_experiment(folder, outdir):
    """Reads every run of folder, writes results.md, results.json and the figures into outdir, and
    returns results.json's content."""
    found = find_runs(folder)
    runs = [load_run(path, label) for label, path, _ in found]
    summaries = [summarise(r) for r in runs]
    configs = configurations(summaries)
    first = summaries[configs[0]["members"][0]]
    if len({(s["head_dim"], s["seq_len"], json.dumps(s["groups"])) for s in summaries}) > 1:
        raise UserError(f"{folder}: its runs differ in head_dim, sequence length or layer groups; they are "
                        "not one experiment")
    for c in configs:
        members = [summaries[i] for i in c["members"]]
        c["runs"] = [s["label"] for s in members]
        c["seeds"] = [s["seed"] for s in members]
        c["seed_of"] = {s["label"]: s["seed"] for s in members}
        c["claims"] = claims_over_seeds(members, c["variant"])
        c["hypotheses"] = verdicts.replicate_verdicts(members)
        c["numbers"] = configuration_numbers([runs[i] for i in c["members"]], members)
    summaries_of = lambda c: [summaries[i] for i in c["members"]]  # noqa: E731
    runs_of = lambda c: [runs[i] for i in c["members"]]  # noqa: E731
    outdir.mkdir(parents=True, exist_ok=True)
    window = ", ".join(sorted({f"{s['window']['first']}-{s['window']['last']}" for s in summaries}))
    name = Path(folder).resolve().name
    blocks = [("h1", f"The {name} runs: the notes' claims over seeds and configurations"),
              ("p", f"Made by {code('scripts/experiment.py')} from the run logs of this folder, each read as "
                    f"{code('scripts/report.py')} reads it (docs/research.md says how). Every table here is made "
                    "again by that command.")]
    blocks += runs_blocks(name, summaries, [m for _, _, m in found], configs)
    blocks += [("h2", "The notes' claims, seed by seed"),
               ("p", "Each claim of the research notes (scripts/attnlog/claims.json) beside the runs of a "
                     "configuration: the value of every seed at the logged stats step nearest the claim's point of "
                     "training, for the same layer group, their mean \u00b1 standard deviation across the seeds "
                     "(range), and in how many of the runs it reproduces by the rule beside it. A claim about the "
                     "learnt gains is not applicable to a variant that holds them at 1.")]
    for c in configs:
        blocks += claim_blocks(c)
    blocks += [("h3", "Every configuration"),
               ("p", "Each claim's mean \u00b1 sd across the seeds and, in brackets, in how many runs it reproduces."),
               claims_side_by_side(configs)]
    blocks += statistics_blocks(configs, first["groups"], window, first["seq_len"])
    blocks += dampening_blocks(configs, summaries_of)
    blocks += verdict_blocks(configs, summaries_of)
    blocks += repetition_blocks(configs, summaries)
    probed = read_probes(folder, found, configs)
    blocks += probe_blocks(probed, first["groups"])
    blocks += figure_blocks(outdir, configs, runs_of, first["head_dim"], first["seq_len"])
    write_whole(outdir / "results.md", to_markdown(blocks))
    results = {"folder": name, "window": window,
               "runs": [{"label": s["label"], "log": str(Path(path).relative_to(folder)), "seed": s["seed"],
                         "variant": s["variant"], "manifest": manifest, "val_loss": s["loss"]["val_last"],
                         "guard": s["training"]["enough"],
                         "verdicts": {k: h["verdict"] for k, h in s["hypotheses"].items()}}
                        for s, (_, path, manifest) in zip(summaries, found)],
               "configurations": [{k: c[k] for k in ("name", "variant", "runs", "seeds", "claims", "hypotheses",
                                                     "numbers")} for c in configs],
               "probes": probed}
    write_whole(outdir / "results.json", json.dumps(json_ready(results), indent=1, ensure_ascii=False) + "\n")
    return results


# -- command line ------------------------------------------------------------------------------------


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    return run(experiment, parse, argv)


def parse(argv):
    parser = ArgumentParser(description="The research notes' claims over the seeds of every "
                            "configuration kept in a folder of runs, the configurations side by side, and the "
                            "repetition of the training data.")
    parser.add_argument("folder", metavar="FOLDER", help="the folder of the runs: one subfolder per run, holding "
                        f"{' or '.join(LOG_NAMES)}")
    parser.add_argument("-o", "--out", metavar="OUTDIR", help="output folder (default: report/ inside FOLDER)")
    return parser.parse_args(argv)


def experiment(args):
    outdir = Path(args.out) if args.out else Path(args.folder) / "report"
    results = make_experiment(Path(args.folder), outdir)
    print(f"{outdir}/results.md, results.json, key_norm.png, attn_entropy.png: {len(results['runs'])} runs in "
          f"{len(results['configurations'])} configurations")
    for c in results["configurations"]:
        decided = [row for row in c["claims"] if row["decided"]]
        every = sum(row["reproduced"] == row["decided"] for row in decided)
        some = sum(0 < row["reproduced"] < row["decided"] for row in decided)
        over = ", ".join(f"({k}) {h['verdict']}" for k, h in c["hypotheses"]["hypotheses"].items())
        print(f"  {c['name']} (seeds {', '.join(map(str, c['seeds']))}): of {len(decided)} claims decided, "
              f"{every} reproduce in every run, {some} in some, {len(decided) - every - some} in none; over the "
              f"seeds {over}")
    return 0
