"""What the attention-key reports compute from a run log, for scripts/report.py to present: the run
loaded into numpy arrays (load_run), the quantities derived from the logged statistics
(docs/telemetry.md), rank statistics, the reports' hypotheses checked on the run, a taxonomy of
the heads, and the machine-readable summary (summarise, which also gives summary.json's schema).
Needs numpy.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnlog  # noqa: E402

# The thresholds of the derived quantities (docs/telemetry.md, "Derived in Python").
SINK_THRESHOLD = 0.3  # attn_sink above this makes a head a sink (Gu et al. 2024)
AXIS_THRESHOLD = 0.5  # k_maxabs^2 / k_norm^2 above this: one component holds most of the key's energy
FOCUS_FRACTION = 0.5  # entropy below this fraction of uniform attention's counts as focused
NORM_MARGIN = 0.05  # a key is amplified when its norm is more than 5% above sqrt(D), its initial value
SIGNIFICANCE = 0.05  # one-sided permutation p-value needed to call a correlation negative
PERMUTATIONS = 10000

# The telemetry metrics this report reads; a log without one of them loses the figures that need it.
USED_METRICS = ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "q_norm", "attn_entropy", "attn_sink", "g_k"]
# The dims a metric's columns may have in the header's telemetry table (the rows are layers), and the
# field of the model configuration that sizes each.
COLUMN_SIZES = {"kv_head": "n_kv_head", "q_head": "n_head", "dim": "head_dim"}
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
    metrics, missing, columns = {}, [], {}
    for name in USED_METRICS:
        if name not in log.metric_names():
            missing.append(name)
            continue
        field = log.record_types["telemetry"].fields[name]
        dims, shape = field.get("dims"), list(field["shape"])
        known = isinstance(dims, list) and len(dims) == 2 and dims[0] == "layer" and dims[1] in COLUMN_SIZES
        expected = [n_layer, int(config[COLUMN_SIZES[dims[1]]])] if known else None
        if not known:
            problems.append(f"{name} has dims {json.dumps(dims)}, not layer by one of {', '.join(COLUMN_SIZES)}: "
                            "left out")
        elif shape != expected:
            problems.append(f"{name} has shape {shape}, not the {expected} the model configuration implies: left out")
        else:
            columns[name] = dims[1]
        if name not in columns:
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
        "metrics": metrics, "columns": columns, "missing": missing,
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
    """[S, L, cols] float64 array of a metric. Appending '@q' asks for it per query head: each query
    head gets its kv head's value of a metric the header gives per kv head."""
    if name.endswith("@q"):
        per_kv = run["columns"][name[:-2]] == "kv_head"
        return values(run, name[:-2])[:, :, kv_of_query(run)] if per_kv else values(run, name[:-2])
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
    first, last = float(pr[0]), float(pr[-1])
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


# -- the summary -----------------------------------------------------------------------------------


def divergence_layer(run, layer_option):
    """The layer whose kv heads' k_norm differ most at the last step, unless --layer chose one."""
    if layer_option is not None:
        return layer_option, "chosen with --layer"
    k_norm = values(run, "k_norm")
    if run["Hkv"] == 1:  # nothing can diverge: show the layer whose key norm moved most
        return int(np.argmax(np.abs(k_norm[-1, :, 0] - k_norm[0, :, 0]))), "the layer whose key norm changed most"
    return int(np.argmax(np.ptp(k_norm[-1], axis=1))), "the layer whose kv heads differ most at the end"


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
    """The machine-readable summary of one run, written as summary.json; report.md is written from
    it, so both show the same numbers. Its keys (null where the log lacks the data; steps are the
    log's, counted from 0):
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
    comparison        (several logs, added by report.py) {"figures": {...}, "runs": [{"label", "log", "last_step",
                       "final_loss" (mean of the last 10 steps), "val_loss", "k_norm" {group: value},
                       "sink_rate", "spearman", "verdicts" {id: verdict}, "problems"}]}
    """
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


