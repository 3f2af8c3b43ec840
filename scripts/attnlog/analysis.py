"""What the attention-key reports compute from a run log, for scripts/report.py to present: the run
loaded into numpy arrays (load_run), the quantities derived from the logged statistics
(docs/telemetry.md, "Derived in Python"), the decision window, rank correlations with permutation
nulls, t-intervals, and the machine-readable summary (summarise, whose docstring is summary.json's
schema). The hypotheses, the guards against too little training, the head taxonomy and the
verdicts over replicate runs are in scripts/verdicts.py. Needs numpy.
"""
import json
import math
import re

import numpy as np

import attnlog
from attnlog.commands import UserError

# The thresholds of the derived quantities (docs/telemetry.md, "Derived in Python").
SINK_THRESHOLD = 0.3  # attn_sink above this makes a head a sink (Gu et al. 2024)
AXIS_THRESHOLD = 0.5  # k_maxabs^2 / k_norm^2 above this: one component holds most of the key's energy
FOCUS_FRACTION = 0.5  # entropy below this fraction of uniform attention's counts as focused
NORM_MARGIN = 0.05  # a key is amplified when its norm is more than 5% above sqrt(D), its initial value
WINDOW_FRACTION = 0.25  # the decision window: the stats steps in the last quarter of the logged steps
PERMUTATIONS = 10000

# The telemetry metrics this report reads; a log without one of them loses the figures that need it.
USED_METRICS = ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "k_mean_share", "k_erank_centered", "q_norm",
                "attn_entropy", "attn_sink", "attn_maxp", "attn_logit_max", "g_q", "g_k"]
# The dims a metric's columns may have in the header's telemetry table (the rows are layers), and the
# field of the model configuration that sizes each.
COLUMN_SIZES = {"kv_head": "n_kv_head", "q_head": "n_head", "dim": "head_dim"}
# The note ./train writes at step 0 of a run started with -e CHECKPOINT.
INIT_NOTE = re.compile(r"started from the weights of (.*), trained for (\d+) steps")


class ReportError(UserError):
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
    seq_len = sequence_length(options, config)
    stats_steps = next(iter(metrics.values()))[0] if metrics else np.zeros(0, np.int64)
    return {
        "path": str(path), "label": label, "header": log.header, "config": config, "options": options,
        "problems": problems, "notes": log.notes(), "step_range": log.step_range(),
        "L": n_layer, "H": n_head, "Hkv": n_kv, "D": head_dim,
        "metrics": metrics, "columns": columns, "missing": missing,
        "loss": finite_only(*loss, "training loss", problems),
        "val": finite_only(*val, "validation loss", problems),
        "stats_steps": stats_steps, "window": decision_window(stats_steps),
        "groups": layer_groups(n_layer),
        "seq_len": seq_len, "tokens_per_step": tokens_per_step(options, seq_len),
        "init": started_from(options, log.notes()),
        "variant": model_variant(config, options),
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


def option_int(options, name, default=0):
    try:
        return int(options.get(name, default))
    except (TypeError, ValueError):
        return default


def sequence_length(options, config):
    """T of the training sequences: the seq-len option, where 0 (or absent) means max_seq_len."""
    seq_len = option_int(options, "seq-len")
    return seq_len if seq_len > 0 else option_int(config, "max_seq_len")


def tokens_per_step(options, seq_len):
    """Tokens of one optimiser step: the total-batch option, where 0 (or absent) means one
    micro-batch of batch x seq_len."""
    total = option_int(options, "total-batch")
    return total if total > 0 else option_int(options, "batch") * seq_len


QK_NORMS = ("gain", "plain", "none")  # config.h's QkNorm, by the number the header's config holds
PARAM_KINDS = ("wte", "attn_norm", "wq", "wk", "wv", "q_gain", "k_gain", "wo", "mlp_norm", "w1", "w3", "w2",
               "final_norm")  # config.h's ParamKind, in layout order


def model_variant(config, options):
    """{"qk_norm", "frozen"}: how queries and keys were normalised (logs written before the variants
    have no qk_norm: gain) and the parameter kinds the run held fixed, those asked for with --freeze
    and the gains a variant without them leaves at 1."""
    index = config.get("qk_norm", 0)
    qk_norm = QK_NORMS[index] if isinstance(index, int) and 0 <= index < len(QK_NORMS) else f"unknown ({index})"
    frozen = set(str(options.get("freeze", "")).split(",")) | ({"q_gain", "k_gain"} if qk_norm != "gain" else set())
    return {"qk_norm": qk_norm, "frozen": [k for k in PARAM_KINDS if k in frozen]}


def started_from(options, notes):
    """For a run started from another run's weights (-e): {"checkpoint", "steps"}, the steps the
    weights had trained before this log's step 0 (None when the log does not say); else None."""
    for _, text in notes:
        match = INIT_NOTE.match(text)
        if match:
            return {"checkpoint": match.group(1), "steps": int(match.group(2))}
    init = options.get("init")
    return {"checkpoint": str(init), "steps": None} if init else None


def decision_window(stats_steps):
    """Indices of the stats steps the verdicts and the taxonomy average over: those in the last
    WINDOW_FRACTION of the span from the first to the last stats step."""
    if len(stats_steps) == 0:
        return np.zeros(0, np.int64)
    first, last = float(stats_steps[0]), float(stats_steps[-1])
    return np.flatnonzero(stats_steps >= last - WINDOW_FRACTION * (last - first))


def layer_groups(n_layer):
    """early = the first two layers, middle = the two around L/2, final = the last two
    (telemetry.md). Models with fewer than 6 layers get overlapping groups."""
    mid = n_layer // 2
    spans = {"early": [0, 1], "middle": [mid - 1, mid], "final": [n_layer - 2, n_layer - 1]}
    return {g: sorted({min(max(i, 0), n_layer - 1) for i in layers}) for g, layers in spans.items()}


# -- derived quantities ----------------------------------------------------------------------------


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


def per_kv(run, array):
    """[S, L, Hkv]: the mean over the query heads that read each kv head of an [S, L, H] array."""
    return array.reshape(array.shape[0], run["L"], run["Hkv"], run["H"] // run["Hkv"]).mean(axis=3)


def qk_ratio(run):
    """||q|| / ||k|| of every query head, its kv head's k_norm in the denominator: [S, L, H]."""
    return values(run, "q_norm") / values(run, "k_norm@q")


def logit_ceiling(run):
    """[S, L, H] mean ||q|| x mean ||k|| / sqrt(D): an estimate, from the means, of the largest logit
    a query and key of these lengths can give (reached when they point the same way)."""
    return values(run, "q_norm") * values(run, "k_norm@q") / math.sqrt(run["D"])


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


def uniform_sink(seq_len):
    """Mean attention on position 0 (and mean largest probability) of uniform causal attention over
    T positions: 1/(t+1) averaged over t = 0..T-1."""
    return float((1.0 / np.arange(1, seq_len + 1)).mean()) if seq_len > 0 else float("nan")


def isotropic_pr(head_dim):
    """Participation ratio of an isotropic Gaussian key in D dimensions, E(sum k^2)^2 / E sum k^4 =
    (D^2 + 2D) / 3D = (D + 2) / 3: what k_pr reads for keys without preferred components."""
    return (head_dim + 2) / 3


def offset_or_collapse(erank, centred):
    """What a change of the keys' effective rank is, from (first, last) of k_erank and of
    k_erank_centered: a fall of k_erank with the centred rank falling less than half as much is an
    offset shared by the keys; a fall of the centred rank too (beyond NORM_MARGIN) is fewer directions."""
    fall, fall_centred = 1 - erank[1] / erank[0], 1 - centred[1] / centred[0]
    if fall_centred > NORM_MARGIN:
        return "fewer directions, not only a shared offset"
    if fall > NORM_MARGIN and fall_centred < fall / 2:
        return "an offset shared by the keys rather than fewer directions"
    return "no fall of the rank beyond 5%"


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


def rank_correlation(x, y, strata=None, permutations=PERMUTATIONS):
    """Spearman's rho of x and y and its permutation null (PERMUTATIONS random pairings, seeded: the
    same values always give the same p). With strata (a label per value, e.g. its layer) x and y are
    first centred within each stratum and the pairings shuffle only within strata: the correlation
    within layers, with the differences between layers taken out. Returns {"rho", "n", "p" (two-sided:
    the share of pairings with |rho| at least as large), "p_negative" (one-sided, rho this low),
    "chance" (the 95th percentile of |rho| over the pairings: what chance alone reaches)}; with
    permutations=0 only rho."""
    x, y = np.array(x, float), np.array(y, float)  # copies: centring within strata changes them
    groups = [np.arange(len(x))] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for idx in groups if strata is not None else ():
        x[idx], y[idx] = x[idx] - x[idx].mean(), y[idx] - y[idx].mean()
    nan = {"rho": float("nan"), "n": len(x), "p": float("nan"), "p_negative": float("nan"), "chance": float("nan")}
    if len(x) < 3:
        return nan
    cx, cy = ranks(x) - (len(x) + 1) / 2, ranks(y) - (len(y) + 1) / 2
    if not (cx.any() and cy.any()):  # constant values: no order to correlate
        return nan
    scale = math.sqrt((cx @ cx) * (cy @ cy))
    rho = float(cx @ cy / scale)
    if permutations == 0:
        return dict(nan, rho=rho)
    rng, null = np.random.default_rng(0), []
    for start in range(0, permutations, 1000):  # in blocks, to bound the memory for many heads
        shuffled = np.tile(cy, (min(1000, permutations - start), 1))
        for idx in groups:
            shuffled[:, idx] = rng.permuted(shuffled[:, idx], axis=1)
        null.append(shuffled @ cx / scale)
    null = np.concatenate(null)
    return {"rho": rho, "n": len(x), "p": float((np.count_nonzero(np.abs(null) >= abs(rho) - 1e-12) + 1)
                                                / (permutations + 1)),
            "p_negative": float((np.count_nonzero(null <= rho + 1e-12) + 1) / (permutations + 1)),
            "chance": float(np.quantile(np.abs(null), 0.95))}


def spearman(x, y):
    """Spearman's rank correlation and the one-sided permutation p-value of its being this
    negative by chance: the share of random pairings of the same values with rho <= the observed."""
    result = rank_correlation(x, y)
    return result["rho"], result["p_negative"]


# t_0.975 with 1..30 degrees of freedom (two-sided 95%), from the tables of Student's t.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def t975(df):
    """The 97.5% quantile of Student's t with df degrees of freedom: the table above up to 30, the
    Cornish-Fisher expansion around the normal quantile beyond (error below 1e-4 there)."""
    if df < 1:
        return float("nan")
    if df <= len(T975):
        return T975[int(df) - 1]
    z = 1.959963985
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def mean_interval(sample):
    """(mean, half-width of its 95% t-interval, n) of a sample: t_0.975(n-1) x sd / sqrt(n), the
    sd with n-1 in the denominator; the half-width is NaN for fewer than 2 values."""
    sample = np.asarray(sample, float)
    n = len(sample)
    if n == 0:
        return float("nan"), float("nan"), 0
    half = t975(n - 1) * float(sample.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
    return float(sample.mean()), half, n


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


# -- the summary -----------------------------------------------------------------------------------


def divergence_layer(run, layer_option):
    """The layer whose kv heads' k_norm differ most at the last step, unless --layer chose one."""
    if layer_option is not None:
        return layer_option, "chosen with --layer"
    k_norm = values(run, "k_norm")
    if run["Hkv"] == 1:  # nothing can diverge: show the layer whose key norm moved most
        return int(np.argmax(np.abs(k_norm[-1, :, 0] - k_norm[0, :, 0]))), "the layer whose key norm changed most"
    return int(np.argmax(np.ptp(k_norm[-1], axis=1))), "the layer whose kv heads differ most at the end"


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
    planned = option_int(run["options"], "steps")
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
    log's, counted from 0 at the start of this log, also for a run started from a checkpoint):
    log, label, created, backend, device, num_processes, seed, config, options
                      the run, from the log's header
    head_dim, sqrt_head_dim, seq_len     D, sqrt(D) (the initial key norm), T of the training rows
    baselines         {"uniform_entropy", "uniform_sink", "isotropic_pr"}: uniform causal attention's
                       mean entropy (mean of ln(t+1)) and mean weight on position 0 (mean of 1/(t+1)),
                       over t < T; the participation ratio of isotropic Gaussian keys, (D+2)/3
    init              {"checkpoint", "steps"}: the weights this run started from (-e) and how many steps
                       they had trained before this log's step 0 (null if the log does not say); or null
    groups            {"early": [layers], "middle": [...], "final": [...]}
    stats_steps       {"count", "first", "last"}: the steps with telemetry
    window            {"first", "last", "count", "fraction"}: the decision window, the stats steps in the
                       last `fraction` of the stats steps' span; verdicts and taxonomy use its means
    training          verdicts.training_status: {"enough", "reasons" [text], "tokens_per_step",
                       "steps_trained", "init_steps", "tokens", "min_tokens", "warmup", "last_step",
                       "window_count", "min_window_count"}
    loss              {"steps_recorded", "first_step", "last_step", "last", "last10_mean",
                       "val_last_step", "val_last"}
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
                       "statistic", "verdict" ("supported" | "contradicted" | "inconclusive"), "why"
                       ("decided" | "within the margin" | "uncertain" | "too little training" |
                       "no data"), "detail", "tests": [{"name", "effect", "half_width", "low", "high",
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
    comparison        (several logs, added by report.py) {"figures": {...}, "runs": [{"label", "log",
                       "last_step", "final_loss" (mean of the last 10 steps), "val_loss", "k_norm" {group:
                       value}, "sink_rate", "spearman" (hypothesis a's rho), "verdicts" {id: verdict},
                       "problems"}], "replicates": [verdicts.replicate_verdicts, one per set of runs that
                       differ only in their seed: {"runs", "seeds", "left_out" {label: why}, "hypotheses"
                       {id: {"title", "verdict", "why", "detail", "tests": [{"name", "values", "n",
                       "mean" (also as "effect"), "t", "half_width", "low", "high", "margin",
                       "uncertainty", "verdict", "why"}]}}}]}
    """
    from attnlog import verdicts  # built on this module

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
        "init": run["init"], "variant": run["variant"],
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
