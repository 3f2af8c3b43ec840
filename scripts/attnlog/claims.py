"""The research notes' claims set beside a run: the report's section "The notes' claims beside this
run". Each claim is written once, in claims.json beside this module, with the notes and passages it
comes from, the point of training it speaks of (a step, or a number of training tokens) and its
measures: a statistic of the log, taken at the logged stats step nearest that point, and the rule
its value must meet. A claim reproduces when every measure meets its rule. Needs numpy.
"""
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

from attnlog.analysis import (SINK_THRESHOLD, axis_ratio, has, is_measurement, per_kv, qk_ratio, rank_correlation,
                              uniform_entropy, values)
from attnlog.document import code

CLAIMS_FILE = Path(__file__).with_name("claims.json")
REPRODUCES, FAILS = "reproduces", "does not reproduce"
NOT_APPLICABLE, NOT_REACHED, NO_DATA = "not applicable", "not reached", "no data"
OUTCOMES = (REPRODUCES, FAILS, NOT_APPLICABLE, NOT_REACHED, NO_DATA)
STEP_SLACK = 0.1  # the logged step may lie this fraction of the claim's step away from it
MEASUREMENT = "the log is a measurement, not a record of training"


def load_claims(path=CLAIMS_FILE):
    return json.loads(Path(path).read_text(encoding="utf-8"))


# -- what a measure looks at ------------------------------------------------------------------------


DERIVED = {"axis_share": (("k_maxabs", "k_norm"), axis_ratio), "qk_ratio": (("q_norm", "k_norm"), qk_ratio)}


def metric_table(run, metric):
    """[S, L, cols] of a logged metric or of a derived one (DERIVED)."""
    return DERIVED[metric][1](run) if metric in DERIVED else values(run, metric)


def layer_list(run, spec):
    """The layers a measure names: "all", a group, or a list of groups and layer indices."""
    if spec == "all":
        return list(range(run["L"]))
    out = set()
    for item in [spec] if isinstance(spec, str) else spec:
        out.update(run["groups"][item] if isinstance(item, str) else [item])
    return sorted(out)


def layer_text(spec):
    if spec == "all":
        return "all layers"
    if isinstance(spec, str):
        return spec
    if all(isinstance(item, str) for item in spec):
        return " + ".join(spec)
    return f"layers {spec[0]}-{spec[-1]}"


def curve(run, metric, spec):
    """[S]: the mean of a metric over the layers of spec and all their heads (or dimensions)."""
    return metric_table(run, metric)[:, layer_list(run, spec), :].mean(axis=(1, 2))


# -- the statistics: each (run, i the stats step's index, the measure) -> {"value", "text"} ----------


def group_mean(run, i, m):
    value = curve(run, m["metric"], m["layers"])[i]
    return {"value": value, "text": f"{layer_text(m['layers'])} {m['metric']} {value:#.3g}"}


def relative_change(run, i, m):
    c, steps = curve(run, m["metric"], m["layers"]), run["stats_steps"]
    value = c[i] / c[0] - 1
    return {"value": value, "text": f"{layer_text(m['layers'])} {m['metric']} {c[0]:#.3g} at step {steps[0]} "
                                    f"\u2192 {c[i]:#.3g} ({value:+.1%})"}


def relative_difference(run, i, m):
    a, b = curve(run, m["metric"], m["layers"])[i], curve(run, m["metric"], m["minus"])[i]
    return {"value": a / b - 1, "text": f"{m['metric']} {layer_text(m['layers'])} {a:#.3g} against "
                                        f"{layer_text(m['minus'])} {b:#.3g} ({a / b - 1:+.1%})"}


def lowest_until(run, i, m):
    """The lowest value of the curve over the stats steps up to the claim's step."""
    c, steps = curve(run, m["metric"], m["layers"])[:i + 1], run["stats_steps"]
    j = int(np.argmin(c))
    return {"value": c[j], "text": f"{layer_text(m['layers'])} {m['metric']}: lowest {c[j]:#.3g} at step {steps[j]} "
                                   f"(of steps {steps[0]}-{steps[i]})"}


def layer_trend(run, i, m):
    """Pearson's r of each layer's mean against its index, from layer from_layer to the last."""
    per_layer = metric_table(run, m["metric"])[i].mean(axis=1)[m["from_layer"]:]
    if np.ptp(per_layer) == 0:  # no order to correlate
        return {"value": math.nan, "text": f"{m['metric']} {per_layer[0]:#.3g} in every layer from {m['from_layer']}"}
    r = float(np.corrcoef(np.arange(len(per_layer)), per_layer)[0, 1])
    return {"value": r, "text": f"Pearson r = {r:+.2f} of {m['metric']} against depth over layers "
                                f"{m['from_layer']}-{run['L'] - 1} ({per_layer.min():#.3g} to {per_layer.max():#.3g})"}


def share_of_layers_near_init(run, i, m):
    per_layer = values(run, "k_norm")[i].mean(axis=1) / math.sqrt(run["D"])
    near = int((np.abs(per_layer - 1) <= m["margin"]).sum())
    return {"value": near / run["L"], "text": f"{near} of {run['L']} layers within \u00b1{m['margin']:.0%} of "
                                              f"sqrt(D) = {math.sqrt(run['D']):.2f}"}


def largest_departure_from_init(run, i, m):
    k_norm = values(run, "k_norm")[i] / math.sqrt(run["D"])
    value = float(np.abs(k_norm - 1).max())
    return {"value": value, "text": f"kv heads' k_norm {k_norm.min() * math.sqrt(run['D']):.3f} to "
                                    f"{k_norm.max() * math.sqrt(run['D']):.3f}, at most {value:.2%} from sqrt(D)"}


def kv_entropy(run, i):
    """[L, Hkv]: each kv head's attention entropy, the mean of its query heads'."""
    return per_kv(run, values(run, "attn_entropy")[i:i + 1])[0]


def heads_in_region(run, i, m):
    """The kv heads whose k_norm and entropy (as a fraction of uniform attention's) lie in the
    measure's ranges (None: open)."""
    k_norm, fraction = values(run, "k_norm")[i], kv_entropy(run, i) / uniform_entropy(run["seq_len"])
    inside = np.ones(k_norm.shape, bool)
    for array, (low, high) in ((k_norm, m["k_norm"]), (fraction, m["entropy_fraction"])):
        inside &= (array >= (-np.inf if low is None else low)) & (array <= (np.inf if high is None else high))
    n = int(inside.sum())
    return {"value": n, "text": f"{n} of {k_norm.size} kv heads (k_norm {k_norm.min():.2f} to {k_norm.max():.2f}; "
                                f"entropy {fraction.min():.0%} to {fraction.max():.0%} of uniform attention's)"}


def within_layer_rho(run, i, m):
    """Spearman's rho of kv heads' k_norm and entropy with both centred per layer, and the 95th
    percentile of |rho| when the pairings are shuffled within layers (analysis.rank_correlation)."""
    x, y = values(run, "k_norm")[i], kv_entropy(run, i)
    result = rank_correlation(x.ravel(), y.ravel(), strata=np.repeat(np.arange(run["L"]), run["Hkv"]))
    return {"value": result["rho"], "chance": result["chance"],
            "text": f"rho = {result['rho']:+.3f} within layers over {x.size} kv heads (chance reaches "
                    f"\u00b1{result['chance']:.3f})"}


def largest_sink(run, i, m):
    sink = values(run, "attn_sink")[i]
    layer, head = np.unravel_index(np.argmax(sink), sink.shape)
    return {"value": sink[layer, head], "text": f"largest attn_sink {sink[layer, head]:.3f} (layer {layer}, query head "
                                                f"{head}); {int((sink > SINK_THRESHOLD).sum())} of {sink.size} heads "
                                                f"above {SINK_THRESHOLD}"}


def gain_order_kept(run, i, m):
    """The mean over layers of Spearman's rho between the gains at the claim's step and at the last."""
    gains, last = metric_table(run, m["metric"]), run["stats_steps"][-1]
    rhos = [rank_correlation(gains[i, layer], gains[-1, layer], permutations=0)["rho"] for layer in range(run["L"])]
    value = float(np.mean(rhos))
    return {"value": value, "text": f"{m['metric']} at step {run['stats_steps'][i]} against step {last}: Spearman rho "
                                    f"{value:.3f} (mean over layers; {min(rhos):.2f} to {max(rhos):.2f})"}


def named_dims_in_top(run, i, m):
    """The share of the named dimensions among the top fraction of the layers' mean gain."""
    mean = metric_table(run, m["metric"])[i].mean(axis=0)
    rank = np.empty(len(mean), int)
    rank[np.argsort(-mean, kind="stable")] = np.arange(1, len(mean) + 1)
    top = math.ceil(m["top"] * len(mean))
    share = float(np.mean([rank[d] <= top for d in m["dims"]]))
    ranks = ", ".join(f"{d}: {rank[d]}" for d in m["dims"])
    return {"value": share, "text": f"ranks of dimensions by mean {m['metric']} ({ranks}) of {len(mean)}; the top "
                                    f"{m['top']:.0%} is ranks 1-{top}"}


def largest_head_spread(run, i, m):
    k_norm = values(run, "k_norm")[i]
    layers = layer_list(run, m["layers"])
    spreads = np.ptp(k_norm[layers], axis=1)
    j = int(np.argmax(spreads))
    return {"value": float(spreads[j]), "text": f"largest spread {spreads[j]:.2f}: layer {layers[j]}'s kv heads "
                                                f"{k_norm[layers[j]].min():.2f} to {k_norm[layers[j]].max():.2f}"}


# name: (function, metrics it needs beyond the measure's own "metric", how its rule's bounds are
# shown: "change" a signed percentage, "share" a percentage, None a plain number)
STATISTICS = {
    "group_mean": (group_mean, (), None),
    "relative_change": (relative_change, (), "change"),
    "relative_difference": (relative_difference, (), "change"),
    "lowest_until": (lowest_until, (), None),
    "layer_trend": (layer_trend, (), None),
    "share_of_layers_near_init": (share_of_layers_near_init, ("k_norm",), "share"),
    "largest_departure_from_init": (largest_departure_from_init, ("k_norm",), "change"),
    "heads_in_region": (heads_in_region, ("k_norm", "attn_entropy"), None),
    "within_layer_rho": (within_layer_rho, ("k_norm", "attn_entropy"), None),
    "largest_sink": (largest_sink, ("attn_sink",), None),
    "gain_order_kept": (gain_order_kept, (), None),
    "named_dims_in_top": (named_dims_in_top, (), "share"),
    "largest_head_spread": (largest_head_spread, ("k_norm",), None),
}


def needed_metrics(measure):
    metric = measure.get("metric")
    own = DERIVED[metric][0] if metric in DERIVED else (metric,) if metric else ()
    return tuple(own) + STATISTICS[measure["statistic"]][1]


# -- the rules ---------------------------------------------------------------------------------------------


def rule_range(rule):
    """(low, high, low included, high included) of a rule: a value reproduces the claim inside."""
    if "about" in rule:
        return rule["about"] * (1 - rule["relative"]), rule["about"] * (1 + rule["relative"]), True, True
    if "between" in rule:
        low, high = rule["between"]
        return low * (1 - rule["relative"]), high * (1 + rule["relative"]), True, True
    if "near" in rule:
        return rule["near"] - rule["absolute"], rule["near"] + rule["absolute"], True, True
    for kind, bounds in ONE_SIDED.items():
        if kind in rule:
            return bounds(rule[kind])
    raise ValueError(f"claims.json: unknown rule {rule}")


# The rules with one bound: (low, high, low included, high included) of a bound x.
ONE_SIDED = {"above": lambda x: (x, math.inf, False, True), "below": lambda x: (-math.inf, x, True, False),
             "at_least": lambda x: (x, math.inf, True, True), "at_most": lambda x: (-math.inf, x, True, True)}


def meets(rule, result):
    value = result["value"]
    if not math.isfinite(value):
        return False
    if "beyond_chance" in rule:  # a negative rank correlation stronger than chance reaches
        return value < -result["chance"]
    low, high, low_in, high_in = rule_range(rule)
    return (value >= low if low_in else value > low) and (value <= high if high_in else value < high)


def rule_text(rule, shown):
    """The rule in words; shown: STATISTICS' way of showing its bounds."""
    if "beyond_chance" in rule:
        return "rho below minus the chance level (the 95th percentile of |rho| over pairings shuffled within layers)"
    show = {"change": lambda x: f"{x:+.0%}" if x else "0", "share": lambda x: f"{x:.0%}"}.get(shown, lambda x: f"{x:g}")
    low, high, _, _ = rule_range(rule)
    span = f" ({low:#.3g} to {high:#.3g})"
    if "about" in rule:
        return f"within \u00b1{rule['relative']:.0%} of {show(rule['about'])}" + span
    if "between" in rule:
        return f"from {show(rule['between'][0])} to {show(rule['between'][1])}, \u00b1{rule['relative']:.0%}" + span
    if "near" in rule:
        return f"within \u00b1{show(rule['absolute']).lstrip('+')} of {show(rule['near'])}"
    kind = next(k for k in ONE_SIDED if k in rule)
    return f"{kind.replace('_', ' ')} {show(rule[kind])}"


# -- a claim set beside a run -------------------------------------------------------------------------------


def claim_step(run, at):
    """(the step of this log a claim's point of training is, how the claim names it): a number of
    training tokens is the step at which this run had trained that many; a run started from a
    checkpoint counts the checkpoint's steps before its own step 0."""
    before = (run["init"] or {}).get("steps") or 0
    if "tokens" in at:
        step = round(at["tokens"] / run["tokens_per_step"]) if run["tokens_per_step"] > 0 else None
        named = f"{at['tokens']:,} tokens" + (f" (step {step})" if step is not None else "")
    else:
        step, named = at["step"], f"step {at['step']}"
    return (None if step is None else step - before), named


def nearest_stats_step(run, step):
    """The index of the stats step nearest step, or None when none lies within STEP_SLACK of it."""
    steps = run["stats_steps"]
    if step is None or step < 0 or not len(steps):
        return None
    i = int(np.argmin(np.abs(steps - step)))
    return i if abs(int(steps[i]) - step) <= STEP_SLACK * step else None


def run_dynamics(run):
    """(whether the log records training from its step 0 on, why not): a measurement records none (its
    steps are batches of one model state), and a run started from weights whose training the log does
    not state has no known step for a claim's point of training."""
    if is_measurement(run):
        return False, MEASUREMENT
    if run["init"] is not None and run["init"].get("pretrained"):
        return False, "the run fine-tunes a pretrained checkpoint, whose pretraining is no step of this log"
    if run["init"] is not None and run["init"]["steps"] is None:
        return False, "the run started from a checkpoint whose steps the log does not state"
    return True, None


def assess(run, claim, dynamics, why_static):
    """One claim beside the run: {"id", "claim", "at", "step", "observed", "rule", "values", "outcome", "why"}."""
    row = {"id": claim["id"], "claim": claim["claim"], "at": None, "step": None, "observed": "", "rule": "",
           "values": [], "outcome": NOT_APPLICABLE, "why": ""}
    if "not_applicable" in claim:
        return dict(row, why=claim["not_applicable"])
    measures = claim["measures"]
    row["rule"] = "; ".join(rule_text(m["rule"], STATISTICS[m["statistic"]][2]) for m in measures)
    model = {"head_dim": run["D"], "n_layer": run["L"]}
    differs = [f"the notes' model has {k} {v}, this one {model[k]}" for k, v in claim.get("requires", {}).items()
               if model[k] != v]
    if differs:
        return dict(row, why="; ".join(differs))
    if claim["dynamics"] and not dynamics:
        return dict(row, why=f"needs the dynamics of training, and {why_static}")
    lacking = sorted({name for m in measures for name in needed_metrics(m) if not has(run, name)})
    if lacking:
        return dict(row, outcome=NO_DATA, why=f"the log has no {', '.join(lacking)}")
    steps = run["stats_steps"]
    if dynamics:
        step, row["at"] = claim_step(run, claim["at"])
        i = nearest_stats_step(run, step)
        if i is None or (claim_needs_later(claim) and i == len(steps) - 1):
            return dict(row, outcome=NOT_REACHED, why=f"the log's stats steps are {steps[0]}-{steps[-1]}")
    else:
        i, row["at"] = len(steps) - 1, "the measured state (the last stats step)"
    results = [STATISTICS[m["statistic"]][0](run, i, m) for m in measures]
    reproduced = all(meets(m["rule"], r) for m, r in zip(measures, results))
    return dict(row, step=int(steps[i]), observed="; ".join(r["text"] for r in results),
                values=[float(r["value"]) for r in results], outcome=REPRODUCES if reproduced else FAILS)


def claim_needs_later(claim):
    """A claim that compares its step with the end of the run needs stats steps after it."""
    return any(m["statistic"] == "gain_order_kept" for m in claim.get("measures", ()))


def claim_table(run, dynamics=None, why_static=MEASUREMENT, path=CLAIMS_FILE):
    """Every claim of the notes beside the run, by note: {"file", "dynamics", "why_static", "counts"
    {outcome: n}, "notes": [{"file", "title", "rows": [assess's row + "quotes" [text]]}]}. dynamics:
    whether the log records training (None: run_dynamics decides); when it does not, a claim that
    needs the dynamics of training is not applicable, and the others compare with the log's last
    stats step, the state it measured (why_static says why there are no dynamics)."""
    data = load_claims(path)
    if dynamics is None:
        dynamics, why = run_dynamics(run)
        why_static = why or why_static
    rows = {c["id"]: assess(run, c, dynamics, why_static) for c in data["claims"]}
    notes = []
    for note in data["notes"]:
        cited = [(c, [s["quote"] for s in c["sources"] if s["note"] == note["file"]]) for c in data["claims"]]
        notes.append({"file": note["file"], "title": note["title"],
                      "rows": [dict(rows[c["id"]], quotes=quotes) for c, quotes in cited if quotes]})
    counts = Counter(row["outcome"] for row in rows.values())
    return {"file": Path(path).name, "dynamics": dynamics, "why_static": None if dynamics else why_static,
            "counts": {outcome: counts[outcome] for outcome in OUTCOMES}, "notes": notes}


MIXED = "mixed"  # over replicates: reproduces in some runs and not in others


def replicate_claims(tables, labels):
    """Every claim over replicate runs, from their claim_tables (labels: the runs' names, in the same
    order): [{"id", "claim", "at", "rule", "steps", "values" {label: [value of each measure]} of the
    runs where it was decided (reproduces or not), "outcomes" {label: outcome} of every run, "mean",
    "sd", "low", "high" (per measure, over the finite values of those runs; null where there are
    none, sd where there are fewer than 2), "reproduced", "decided", "outcome", "why"}], in the order
    the notes cite them. The claim reproduces over the seeds when it does in every run where it was
    decided, does not when it does in none, and is mixed otherwise; where it was decided in no run,
    the first run's outcome and reason stand."""
    rows = {}
    for label, table in zip(labels, tables):
        for note in table["notes"]:
            for row in note["rows"]:
                rows.setdefault(row["id"], {})[label] = row
    out = []
    for claim_id, runs in rows.items():
        first = next(iter(runs.values()))
        decided = {label: row for label, row in runs.items() if row["outcome"] in (REPRODUCES, FAILS)}
        reproduced = sum(row["outcome"] == REPRODUCES for row in decided.values())
        if not decided:
            outcome, why = first["outcome"], first["why"]
        else:
            outcome = REPRODUCES if reproduced == len(decided) else FAILS if reproduced == 0 else MIXED
            rest = Counter(row["outcome"] for row in runs.values() if row["outcome"] not in (REPRODUCES, FAILS))
            why = f"in {reproduced} of {len(decided)} runs" + (
                " where it was decided; " + ", ".join(f"{n} {what}" for what, n in rest.items()) if rest else "")
        spread = {key: [] for key in ("mean", "sd", "low", "high")}
        for values in zip(*(row["values"] for row in decided.values())):  # one measure over the runs
            finite = np.array([v for v in values if math.isfinite(v)], np.float64)
            spread["mean"].append(float(finite.mean()) if len(finite) else None)
            spread["sd"].append(float(finite.std(ddof=1)) if len(finite) > 1 else None)
            spread["low"].append(float(finite.min()) if len(finite) else None)
            spread["high"].append(float(finite.max()) if len(finite) else None)
        out.append(dict({"id": claim_id, "claim": first["claim"], "at": first["at"], "rule": first["rule"],
                         "steps": sorted({row["step"] for row in decided.values()}),
                         "values": {label: row["values"] for label, row in decided.items()},
                         "outcomes": {label: row["outcome"] for label, row in runs.items()}},
                        **spread, reproduced=reproduced, decided=len(decided), outcome=outcome, why=why))
    return out


# -- the report's section ------------------------------------------------------------------------------------


def claim_blocks(table):
    """The report's blocks (attnlog.document) of claim_table's result."""
    counts = ", ".join(f"{n} {outcome}" for outcome, n in table["counts"].items() if n)
    blocks = [("h2", "The notes' claims beside this run"),
              ("p", f"Each claim of the research notes, written once in {code('scripts/attnlog/' + table['file'])} "
                    "with the passages it comes from, beside what this run shows for the same layers at the logged "
                    "stats step nearest the claim's step (a claim made after a number of training tokens: the step "
                    "at which this run had trained as many; a logged step more than 10% away from it does not count). "
                    "It reproduces when every value meets the rule beside it. Claims about the notes' model of "
                    f"head_dim 64 are not applicable to another head_dim. Over all claims: {counts}.")]
    if not table["dynamics"]:
        blocks.append(("p", f"No dynamics of training: {table['why_static']}. Claims about change during training are "
                            "not applicable; the others are compared with the last stats step."))
    for note in table["notes"]:
        blocks.append(("h3", f"{note['title']} ({note['file']})"))
        rows = [[row["claim"], " \u2026 ".join(f"\u201c{q}\u201d" for q in row["quotes"]),
                 (row["at"] or "") + (f"; logged step {row['step']}" if row["step"] is not None else ""),
                 row["observed"] or "", row["rule"], outcome_text(row)] for row in note["rows"]]
        blocks.append(("table", ["claim", "the note says", "at", "this run", "reproduces when", "outcome"], rows))
    return blocks


def replicate_claim_blocks(rows):
    """The report's table of replicate_claims' result."""
    def measures(values):
        return "; ".join("n/a" if v is None else f"{v:#.3g}" for v in values)

    table = []
    for row in rows:
        spread = measures(row["mean"])
        if any(v is not None for v in row["sd"]):
            spread += f" \u00b1 {measures(row['sd'])} ({measures(row['low'])} to {measures(row['high'])})"
        each = ", ".join(f"{label}: {measures(values)}" for label, values in row["values"].items())
        shown = f"**{row['outcome']}**" if row["outcome"] in (REPRODUCES, FAILS, MIXED) else row["outcome"]
        table.append([row["claim"], (row["at"] or "") + (f"; logged step {', '.join(map(str, row['steps']))}"
                                                         if row["steps"] else ""),
                      each or "none", spread, row["rule"], shown + (f": {row['why']}" if row["why"] else "")])
    return [("p", "The research notes' claims over these runs: the claim's value in each run where it was decided, "
                  "their mean \u00b1 standard deviation across those runs (range; values that are not finite left "
                  "out), and in how many runs the claim reproduces: in all of them, it reproduces; in none, it "
                  "does not; otherwise it is mixed. Several values are the claim's measures, in order."),
            ("table", ["claim", "at", "each run", "mean \u00b1 sd (range)", "reproduces when", "over the runs"],
             table)]


def outcome_text(row):
    shown = f"**{row['outcome']}**" if row["outcome"] in (REPRODUCES, FAILS) else row["outcome"]
    return shown + (f": {row['why']}" if row["why"] else "")
