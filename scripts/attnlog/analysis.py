"""What the attention-key reports compute from a run log, for attnlog.report to present: the run
loaded into numpy arrays (load_run), the quantities derived from the logged statistics
(docs/telemetry.md, "Derived in Python"), the decision window, rank correlations with permutation
nulls, t-intervals. The hypotheses, the guards against too little training, the head taxonomy and
the verdicts over replicate runs are in attnlog.verdicts, built on this module; the machine-readable
summary of a run (summary.json) in attnlog.summary, built on both. Needs numpy.
"""
import functools
import glob
import json
import math
import re
from pathlib import Path

import numpy as np

import attnlog
from attnlog.commands import DEFAULT_DATA, UserError
from attnlog.layout import MATRICES, PARAM_KINDS, QK_NORMS, decayed_kinds, frozen_kinds, frozen_mask

# The thresholds of the derived quantities (docs/telemetry.md, "Derived in Python").
SINK_THRESHOLD = 0.3  # attn_sink above this makes a head a sink (Gu et al. 2024)
AXIS_THRESHOLD = 0.5  # k_maxabs^2 / k_norm^2 above this: one component holds most of the key's energy
FOCUS_FRACTION = 0.5  # entropy below this fraction of uniform attention's counts as focused
NORM_MARGIN = 0.05  # a key is amplified when its norm is more than 5% above sqrt(D), its initial value
WINDOW_FRACTION = 0.25  # the decision window: the stats steps in the last quarter of the logged steps
PERMUTATIONS = 10000
SHARD_MAGIC = 20240520  # the first int32 of a token shard (llmc/dataloader.h)

# The telemetry metrics this report reads; a log without one of them loses the figures that need it.
USED_METRICS = ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "k_mean_share", "k_erank_centered", "q_norm",
                "attn_entropy", "attn_sink", "attn_doc_start", "attn_maxp", "attn_logit_max", "g_q", "g_k"]
# The dims a metric's columns may have in the header's telemetry table (the rows are layers), and the
# field of the model configuration that sizes each.
COLUMN_SIZES = {"kv_head": "n_kv_head", "q_head": "n_head", "dim": "head_dim"}
# The note ./train writes at step 0 of a run started with -e CHECKPOINT.
INIT_NOTE = re.compile(r"started from the weights of (.*), trained for (\d+) steps")
HF_INIT_NOTE = re.compile(r"started from the Hugging Face checkpoint (.*) \(([A-Za-z0-9_]+), (.*) weights;")


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
    doc_view = step_value(log, "doc_start_visible", stats_steps) if "attn_doc_start" in metrics else None
    measurement = log.measurement
    return {
        "path": str(path), "label": label, "header": log.header, "config": config, "options": options,
        "problems": problems, "notes": log.notes(), "step_range": log.step_range(),
        "L": n_layer, "H": n_head, "Hkv": n_kv, "D": head_dim,
        "metrics": metrics, "columns": columns, "missing": missing, "doc_view": doc_view,
        "loss": finite_only(*loss, "training loss", problems),
        "val": finite_only(*val, "validation loss", problems),
        "stats_steps": stats_steps,
        "window": np.arange(len(stats_steps)) if measurement else decision_window(stats_steps),
        "groups": layer_groups(n_layer),
        "seq_len": seq_len, "tokens_per_step": tokens_per_step(options, seq_len),
        "init": None if measurement else started_from(options, log.notes()),
        "train_tokens": training_data_size(log.header, options),
        "variant": model_variant(config, options),
        "measurement": measurement,
    }


def step_value(log, name, stats_steps):
    """[S] float64: a telemetry field of one value per step (shape []) at each stats step, or None
    when the log lacks it at any of them."""
    field = log.record_types["telemetry"].fields.get(name)
    if field is None or list(field["shape"]) != []:
        return None
    steps, table = log.metric(name)
    if not np.isin(stats_steps, steps).all():
        return None
    return table[np.searchsorted(steps, stats_steps)].astype(np.float64)


def is_measurement(run):
    """Whether the log is a measurement of one model state (./train --measure; the reader's
    log.measurement names the checkpoint and its step): its steps are the batches measured with the
    same weights, so whatever needs training dynamics (trends over the steps, changes from the first
    step to the last, the verdicts that compare steps, the guard against too little training of the
    log's own steps) does not apply, and its decision window is every batch."""
    return run.get("measurement") is not None


def steps_text(run):
    """What the log's steps are, in a plural noun: the measured batches of a measurement, else the
    stats steps of a training run."""
    return "measured batches" if is_measurement(run) else "stats steps"


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


def training_data_size(header, options):
    """{"tokens", "source"}: the tokens of the run's training shards, one epoch. The header's
    train_tokens; for a log written before it, the token counts in the headers of the shards its train
    option matches now (as given, then from the checkout, where ./train keeps the default corpus),
    which may not be the shards the run read; tokens None when neither is found."""
    if isinstance(header.get("train_tokens"), int):
        return {"tokens": header["train_tokens"], "source": "the log's header"}
    pattern = str(options.get("train", ""))
    for base in (Path.cwd(), Path(DEFAULT_DATA).parent.parent) if pattern else ():
        paths = sorted(glob.glob(str(base / pattern)))
        counts = [shard_tokens(p) for p in paths]
        if paths and None not in counts:
            return {"tokens": sum(counts), "source": f"counted now in the {len(paths)} shard(s) matching "
                    f"{base / pattern}: the log does not record it, and they may not be the shards the run read"}
    return {"tokens": None,
            "source": f"the log does not record it, and no shard matches {pattern or 'its train option'} here"}


def shard_tokens(path):
    """The token count a shard's header gives (magic, version, count: int32 each), or None."""
    try:
        with open(path, "rb") as f:
            magic, version, count = np.frombuffer(f.read(12).ljust(12, b"\0"), "<i4")
    except OSError:
        return None
    return int(count) if magic == SHARD_MAGIC and version in (1, 2) and count >= 0 else None


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


def model_variant(config, options):
    """{"qk_norm", "frozen", "decay"}: how queries and keys were normalised (logs written before the
    variants have no qk_norm: gain), the parameter kinds the run held fixed, those asked for with
    --freeze and the gains a variant without them leaves at 1, and the kinds that took weight decay
    in words: "matrices" (the default, and logs written before --decay), "all", "none" or the kinds."""
    index = config.get("qk_norm", 0)
    qk_norm = QK_NORMS[index] if isinstance(index, int) and 0 <= index < len(QK_NORMS) else f"unknown ({index})"
    asked = [kind for kind in str(options.get("freeze", "")).split(",") if kind in PARAM_KINDS]
    return {"qk_norm": qk_norm, "frozen": frozen_kinds(frozen_mask(asked), qk_norm),
            "decay": decay_words(str(options.get("decay", "matrices")))}


def decay_words(decay):
    """--decay's value in the fewest words: "matrices", "all", "none", or the kinds it names."""
    try:
        kinds = decayed_kinds(decay)
    except ValueError:
        return f"unknown ({decay})"
    named = {"matrices": [k for k in PARAM_KINDS if k in MATRICES], "all": list(PARAM_KINDS), "none": []}
    return next((word for word, group in named.items() if kinds == group), ", ".join(kinds))


def started_from(options, notes):
    """For a run started from another run's weights (-e): {"checkpoint", "steps"}, the steps the
    weights had trained before this log's step 0 (None when the log does not say); from a Hugging
    Face checkpoint also "pretrained", its architecture and the dtypes of its weights (its
    pretraining is no number of this trainer's steps: None); else None."""
    for _, text in notes:
        match = INIT_NOTE.match(text)
        if match:
            return {"checkpoint": match.group(1), "steps": int(match.group(2))}
        match = HF_INIT_NOTE.match(text)
        if match:
            return {"checkpoint": match.group(1), "steps": None,
                    "pretrained": f"{match.group(2)}, {match.group(3)} weights"}
    init = options.get("init")
    return {"checkpoint": str(init), "steps": None} if init else None


def decision_window(stats_steps):
    """Indices of the stats steps the verdicts and the taxonomy average over: those in the last
    WINDOW_FRACTION of the span from the first to the last stats step."""
    if len(stats_steps) == 0:
        return np.zeros(0, np.int64)
    first, last = float(stats_steps[0]), float(stats_steps[-1])
    return np.flatnonzero(stats_steps >= last - WINDOW_FRACTION * (last - first))


def run_until(run, last_step):
    """The run as if its log ended after last_step: its steps, statistics and losses up to there, and
    the decision window of that shorter run."""
    stats = run["stats_steps"] <= last_step
    loss, val = ((steps[steps <= last_step], series[steps <= last_step]) for steps, series in (run["loss"], run["val"]))
    span = run["step_range"]
    return dict(run, metrics={name: (steps[stats], table[stats]) for name, (steps, table) in run["metrics"].items()},
                stats_steps=run["stats_steps"][stats], window=decision_window(run["stats_steps"][stats]), loss=loss,
                val=val, step_range=(span[0], min(span[1], last_step)) if span else None)


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


# -- a statistic's path over the decision window: autocorrelation and trend -------------------------
#
# The stats steps of a window are no independent samples: the noise of a statistic at one stats step
# carries over to the next, so a t-interval that counts each step as a sample is too narrow. The
# window's series is modelled as a straight line (the statistic may still drift) plus AR(1) noise,
# u_t = phi u_(t-1) + e_t, the simplest noise with autocorrelation: n stats steps then tell as much
# about the mean as n_eff = n (1 - phi) / (1 + phi) independent ones would, and the slope's standard
# error grows by the same factor (Bretherton et al. 1999; Santer et al. 2000 for trends), with n_eff - 2
# degrees of freedom. phi comes from the lag-1 autocorrelation of the residuals of the line, which in
# a short series is biased low (by about 2/n at phi = 0 and 9/n at phi = 0.9), which would overstate
# n_eff; so it is taken median-unbiased (Andrews 1993): the phi whose simulated series give that
# autocorrelation as their median. Not a block bootstrap: a window holds 20-30 stats steps, too few
# for blocks long enough to carry the autocorrelation; not a sum over many lags: at this length the
# autocorrelations beyond lag 1 are mostly noise.

AR_GRID = np.linspace(0.0, 0.99, 100)  # the phi a median-unbiased estimate chooses among
AR_SERIES = 500  # simulated series per phi


def lag1_autocorrelation(residuals):
    """sum u_t u_(t+1) / sum u_t^2 along the last axis (0 for series that are all 0)."""
    total = (residuals * residuals).sum(axis=-1)
    lagged = (residuals[..., :-1] * residuals[..., 1:]).sum(axis=-1)
    return np.divide(lagged, total, out=np.zeros_like(lagged), where=total > 0)


def line_residuals(series):
    """What is left of each series (along the last axis, equally spaced) after its least-squares line."""
    n = series.shape[-1]
    x = np.arange(n) - (n - 1) / 2
    centred = series - series.mean(axis=-1, keepdims=True)
    slope = centred.dot(x) / (x @ x)  # dot: matmul of an array of series with a vector is slow
    return centred - slope[..., None] * x


@functools.lru_cache(maxsize=None)
def lag1_medians(n):
    """[len(AR_GRID)]: the median lag-1 autocorrelation of the line residuals of AR_SERIES simulated
    stationary AR(1) series of n steps, for each phi of AR_GRID; the same shocks for every phi (seeded
    by n: the same answer every time), made non-decreasing in phi."""
    shocks = np.random.default_rng(n).standard_normal((AR_SERIES, n))
    medians = []
    for phi in np.array_split(AR_GRID, max(1, n // 50)):  # a few phi at a time bound the memory
        noise = np.empty((len(phi), AR_SERIES, n))
        noise[:, :, 0] = shocks[:, 0] / np.sqrt(1 - phi * phi)[:, None]
        for t in range(1, n):
            noise[:, :, t] = phi[:, None] * noise[:, :, t - 1] + shocks[:, t]
        medians.extend(np.median(lag1_autocorrelation(line_residuals(noise)), axis=1))
    return np.maximum.accumulate(medians)


def ar1_coefficient(autocorrelation, n):
    """The median-unbiased phi in [0, 0.99] of n steps whose line residuals have this lag-1
    autocorrelation. Negative autocorrelation counts as none: n_eff never exceeds n."""
    return float(np.interp(autocorrelation, lag1_medians(n), AR_GRID))


def window_trend(steps, series):
    """A statistic's series over the decision window as a line plus AR(1) noise: {"mean", "half_width"
    (of the mean's 95% interval), "n", "phi", "n_eff", "slope" (per step), "change" (the line's rise
    from the window's first step to its last), "change_half" (its 95% half-width), "moving" (the
    change's interval excludes 0: still trending), "end" (the line at the last step)}. Fewer than 3
    steps: mean only. Fewer than 3 effective samples: infinite half-widths (no interval)."""
    y, x = np.asarray(series, float), np.asarray(steps, float)
    n = len(y)
    out = {"mean": float(y.mean()) if n else float("nan"), "half_width": float("nan"), "n": n, "phi": float("nan"),
           "n_eff": float("nan"), "slope": float("nan"), "change": float("nan"), "change_half": float("nan"),
           "moving": False, "end": float("nan")}
    if n < 3:
        return out
    dx = x - x.mean()
    slope = float(dx @ (y - y.mean()) / (dx @ dx))
    residuals = y - y.mean() - slope * dx
    variance = float(residuals @ residuals) / (n - 2)
    phi = ar1_coefficient(float(lag1_autocorrelation(residuals)), n) if variance > 0 else 0.0  # on its line: no noise
    n_eff = n * (1 - phi) / (1 + phi)
    t = t975(math.floor(n_eff - 2)) if n_eff >= 3 else math.inf
    span = float(x[-1] - x[0])
    change, change_half = slope * span, t * math.sqrt(variance / (dx @ dx) * n / n_eff) * span
    return dict(out, half_width=t * math.sqrt(variance / n_eff), phi=phi, n_eff=n_eff, slope=slope, change=change,
                change_half=change_half, moving=bool(abs(change) > change_half),
                end=out["mean"] + slope * float(x[-1] - x.mean()))


# -- the layer of a figure ---------------------------------------------------------------------------


def divergence_layer(run, layer_option):
    """The layer whose kv heads' k_norm differ most at the last step, unless --layer chose one."""
    if layer_option is not None:
        return layer_option, "chosen with --layer"
    k_norm = values(run, "k_norm")
    if run["Hkv"] == 1:  # nothing can diverge: show the layer whose key norm moved most
        return int(np.argmax(np.abs(k_norm[-1, :, 0] - k_norm[0, :, 0]))), "the layer whose key norm changed most"
    return int(np.argmax(np.ptp(k_norm[-1], axis=1))), "the layer whose kv heads differ most at the end"
