"""The figures of a run's report and their captions: which figures a log allows (FIGURES; of a
measurement of one model state, MEASUREMENT_FIGURES), each drawn with attnlog.figures from the
numbers attnlog.analysis derives, with a caption written from the run's own values; and the figures
that compare several runs. A caption says what its
numbers mean only when the run has trained enough for verdicts (verdicts.training_status): those of a
run too short state the numbers alone.
"""
import math

import numpy as np

from attnlog import figures
from attnlog.analysis import (AXIS_THRESHOLD, NORM_MARGIN, SINK_THRESHOLD, axis_ratio, divergence_layer, group_curves,
                              has, is_measurement, isotropic_pr, logit_ceiling, mean_interval, offset_or_collapse,
                              per_kv, qk_ratio, rank_correlation, sink_rate, uniform_entropy, uniform_sink, values,
                              why_not)
from attnlog.rope import rope_gains, why_no_rope_gains
from attnlog.verdicts import training_status

GROUPS = ("early", "middle", "final")
COMPARED = [("k_norm", "mean key norm k_norm"), ("k_maxabs", "mean largest key component k_maxabs"),
            ("k_cos", "mean cosine similarity of key pairs k_cos"),
            ("k_pr", "participation ratio k_pr (dimensions)"), ("attn_entropy", "attention entropy (nats)")]


def group_change(curves, fmt="{:.2f}"):
    """'early 8.00 -> 6.12, middle ..., final ...'."""
    return "; ".join(f"{g} {fmt.format(c[0])} \u2192 {fmt.format(c[-1])}" for g, c in curves.items())


# A curve that goes beyond both its first and its last value by more than this share of the larger
# of the two (in absolute value) has a transient that first -> last would hide.
TRANSIENT = 0.25


def transient(curve, steps):
    """(extreme value, its step) of a curve's largest excursion beyond both its ends, when it is larger
    than TRANSIENT of the larger end; else None."""
    first, last = float(curve[0]), float(curve[-1])
    low, high = int(np.argmin(curve)), int(np.argmax(curve))
    beyond = {low: min(first, last) - curve[low], high: curve[high] - max(first, last)}
    i = max(beyond, key=beyond.get)
    return (float(curve[i]), int(steps[i])) if beyond[i] > TRANSIENT * max(abs(first), abs(last)) else None


def path_text(curve, steps, fmt="{:.2f}"):
    """'52.5 -> 2.9 at step 20 -> 20.8': first -> last, through the extreme of a transient if any."""
    t = transient(curve, steps)
    via = f" \u2192 {fmt.format(t[0])} at step {t[1]}" if t else ""
    return f"{fmt.format(curve[0])}{via} \u2192 {fmt.format(curve[-1])}"


def group_path(curves, steps, fmt="{:.2f}"):
    """'early 8.00 -> 6.12; middle 52.5 -> 2.9 at step 20 -> 20.8; ...' (path_text of each group)."""
    return "; ".join(f"{g} {path_text(c, steps, fmt)}" for g, c in curves.items())


def transients_text(curves, steps, what, fmt="{:.2f}"):
    """A sentence naming each group's transient, or '' when no group has one."""
    parts = []
    for g, c in curves.items():
        t = transient(c, steps)
        if t is None:
            continue
        value, step = t
        if value < min(c[0], c[-1]):
            after = f", then rises {c[-1] / value:.1f}-fold to {fmt.format(c[-1])}" if value > 0 else ""
            parts.append(f"{g} {what} falls to {fmt.format(value)} by step {step}{after}")
        else:
            parts.append(f"{g} {what} reaches {fmt.format(value)} at step {step}, then ends at {fmt.format(c[-1])}")
    if not parts:
        return ""
    return (f" Transients larger than the change from first to last (beyond both by more than {TRANSIENT:.0%} of "
            "the larger): " + "; ".join(parts) + ".")


def interpreted(opts, text):
    """text, which says what numbers mean, only when the run trained enough to read them so."""
    return text if opts["interpret"] else ""


def span(run):
    steps = run["stats_steps"]
    return f"from step {steps[0]} to step {steps[-1]}"


def window_span(run):
    steps, w = run["stats_steps"], run["window"]
    return f"the {len(w)} measured batches" if is_measurement(run) else f"steps {steps[w[0]]}-{steps[w[-1]]}"


def one_state(run, array):
    """(table, words) of the model's one state that a figure shows of an [S, ...] array: a
    measurement's mean over its batches, else the last stats step."""
    if is_measurement(run):
        return window_mean(run, array), f"averaged over {window_span(run)}"
    return array[-1], f"at step {run['stats_steps'][-1]}"


def window_mean(run, array):
    """The mean over the decision window of an [S, ...] array."""
    return array[run["window"]].mean(axis=0)


def layer_of(table):
    """The layer index of every value of an [L, cols] table, flattened as table.ravel() is."""
    return np.repeat(np.arange(table.shape[0]), table.shape[1])


def step_label(run):
    """The x axis of every figure over training; a run started from a checkpoint says how its steps
    relate to the weights' whole training, a measurement that its steps are batches."""
    if is_measurement(run):
        return "measured batch (the log's step; every batch with the same weights)"
    init = run["init"]
    if init is None:
        return "training step"
    if init.get("pretrained"):
        return "step of this run (from the pretrained weights)"
    before = f"{init['steps']} steps" if init["steps"] is not None else "an unknown number of steps"
    return f"step of this run (its weights had trained {before} before its step 0)"


# -- the run's figures -------------------------------------------------------------------------------


def figure_key_norm(run, path, opts):
    curves = group_curves(run, values(run, "k_norm"))
    root = math.sqrt(run["D"])
    figures.group_panels(path, "Key norm by layer group", run["stats_steps"],
                         [("mean ||k|| after k_norm and its gain, before RoPE", "mean key L2 norm k_norm",
                           curves, root, f"sqrt(D) = {root:.2f}, the initial norm")], run["groups"])
    return (f"Mean key norm of each layer group, {span(run)}: {group_change(curves)}. The dotted line is "
            f"sqrt(D) = {root:.2f}, the norm of a key whose components have unit mean square (gain 1).")


def figure_layer_heatmaps(run, path, opts):
    steps, root, T = run["stats_steps"], math.sqrt(run["D"]), run["seq_len"]
    k_norm = values(run, "k_norm").mean(axis=2)
    entropy, sink = values(run, "attn_entropy").mean(axis=2), values(run, "attn_sink").mean(axis=2)
    reach = max(np.abs(k_norm - root).max(), 0.05 * root)
    h_uniform, s_uniform = uniform_entropy(T), uniform_sink(T)
    sink_top = max(SINK_THRESHOLD, float(sink.max()))  # fixed from 0 to the sink threshold at least
    figures.layer_heatmaps(path, "Every layer over training", steps, [
        ("k_norm, mean over the layer's kv heads", k_norm, f"k_norm (centred on sqrt(D) = {root:.2f})", "RdBu_r",
         root - reach, root + reach, root, []),
        ("attn_entropy, mean over the layer's query heads", entropy,
         f"nats (line: uniform attention, {h_uniform:.2f})", "viridis", 0.0, 1.04 * max(entropy.max(), h_uniform), None,
         [h_uniform]),
        ("attn_sink, mean over the layer's query heads", sink,
         f"mass on position 0 (lines: uniform {s_uniform:.3g}, sink threshold {SINK_THRESHOLD})", "magma_r", 0.0,
         sink_top, None, [s_uniform, SINK_THRESHOLD])])
    low, high = int(np.argmin(k_norm[-1])), int(np.argmax(k_norm[-1]))
    sharp = int(np.argmin(entropy[-1]))
    return (f"Left to right: each layer's mean k_norm, mean attention entropy and mean attn_sink (the mean over "
            f"its query heads of the attention on position 0, not the share of sink heads), {span(run)}; one row "
            f"per layer, layer 0 at the top. At step {steps[-1]} the shortest keys are layer {low}'s "
            f"({k_norm[-1, low]:.2f}), the longest layer {high}'s ({k_norm[-1, high]:.2f}); the sharpest "
            f"attention is layer {sharp}'s ({entropy[-1, sharp]:.2f} nats); mean attn_sink ranges "
            f"{sink[-1].min():.3f}-{sink[-1].max():.3f}. Lines on the colour bars: uniform causal attention over "
            f"T = {T}, entropy {h_uniform:.2f} nats (mean of ln(t+1)) and mass on position 0 {s_uniform:.3g} "
            f"(mean of 1/(t+1)); and the sink threshold {SINK_THRESHOLD}. The attn_sink scale is fixed from 0 to "
            f"{sink_top:.3g} (at least the threshold), so that values near uniform attention's stay pale rather "
            "than show as hot spots.")


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


def figure_axis_share(run, path, opts):
    share = axis_ratio(run)
    curves, final = group_curves(run, share), window_mean(run, share)
    l, h = np.unravel_index(np.argmax(final), final.shape)
    figures.lines_and_heatmap(path, "Axis share: the key energy in its largest component", run["stats_steps"],
                              ("(k_maxabs / k_norm)^2 by layer group", "share of the squared key norm", curves,
                               run["groups"], (0, 1), AXIS_THRESHOLD, f"{AXIS_THRESHOLD}: axis-aligned above"),
                              (f"every kv head, mean over {window_span(run)}", final, "kv head", "magma_r", 0.0, 1.0,
                               f"share (line: {AXIS_THRESHOLD})", AXIS_THRESHOLD, "{:.2f}"))
    above = int((final > AXIS_THRESHOLD).sum())
    return (f"The share (k_maxabs / k_norm)^2 of a key's squared norm in its largest component (from the means over "
            f"tokens), {span(run)}: {group_change(curves, '{:.3f}')}. Right: every kv head, averaged over the "
            f"decision window ({window_span(run)}); the largest is layer {l}, kv head {h}, {final[l, h]:.3f}. "
            f"{above} of {final.size} kv heads are above {AXIS_THRESHOLD}, where one component holds most of the "
            "energy" + interpreted(opts, " (the reports' axis-aligned keys)") + ".")


def figure_cos(run, path, opts):
    curves = group_curves(run, values(run, "k_cos"))
    figures.group_panels(path, "Latent redundancy: how alike the keys are", run["stats_steps"],
                         [("mean cosine similarity over pairs of distinct keys", "mean pairwise cosine k_cos",
                           curves, None, None)], run["groups"])
    above, steps = [g for g, c in curves.items() if c[-1] > 0.5], run["stats_steps"]
    return (f"Mean cosine similarity between keys per group, {span(run)}: {group_path(curves, steps, '{:.3f}')}."
            + transients_text(curves, steps, "k_cos", "{:.3f}")
            + interpreted(opts, f" Above 0.5 at the end (the reports' 'semantic convergence'): {', '.join(above)}."
                          if above else " No group ends above 0.5, the reports' mark of 'semantic convergence'."))


def figure_profile(run, path, opts):
    last, when = one_state(run, values(run, "k_norm"))
    per_layer, root = last.mean(axis=1), math.sqrt(run["D"])
    figures.layer_profile(path, f"Key magnitude profile {when}", per_layer, last, run["groups"], root,
                          f"sqrt(D) = {root:.2f}", "mean key L2 norm k_norm")
    below = [i for i, v in enumerate(per_layer) if v < root]
    return (f"Mean k_norm of every layer {when} (bars; dots are single kv heads). Lowest: layer "
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


def kv_correlations(run):
    """(k_norm [L, Hkv], entropy [L, Hkv], rho across kv heads, rho within layers) of the
    decision-window means, each kv head with the mean entropy of its query heads: hypothesis (a)."""
    x = window_mean(run, values(run, "k_norm"))
    y = window_mean(run, per_kv(run, values(run, "attn_entropy")))
    return x, y, rank_correlation(x.ravel(), y.ravel()), rank_correlation(x.ravel(), y.ravel(), layer_of(x))


def correlation_text(across, within):
    if not math.isfinite(across["rho"]):
        return "too few kv heads, or constant values, for a rank correlation"
    text = f"rho = {across['rho']:+.3f} across the {across['n']} kv heads (p = {across['p']:.3g}; chance " \
           f"reaches \u00b1{across['chance']:.3f})"
    if math.isfinite(within["rho"]):
        text += f", {within['rho']:+.3f} within layers (p = {within['p']:.3g})"
    return text


def figure_scatter(run, path, opts):
    x, y, steps = values(run, "k_norm@q"), values(run, "attn_entropy"), run["stats_steps"]
    parts = [(f"{name} training (steps {steps[idx[0]]}-{steps[idx[-1]]})", x[idx].ravel(), y[idx].ravel())
             for name, idx in phases(len(steps))]
    root, h_uniform = math.sqrt(run["D"]), uniform_entropy(run["seq_len"])
    figures.phase_scatter(path, "Entropy against key norm, one point per query head and stats step", parts,
                          (f"step {steps[-1]} (last)", x[-1].ravel(), y[-1].ravel()),
                          "k_norm of the head's kv head", "attention entropy (nats)", root, f"sqrt(D) = {root:.2f}",
                          h_uniform, f"uniform attention, {h_uniform:.2f} nats")
    _, _, across, within = kv_correlations(run)
    shared = ("Query heads that share a kv head share its key norm, so the correlation is taken over kv heads"
              if run["H"] > run["Hkv"] else "The correlation over heads")
    return (f"Each point is one {'query ' if run['H'] > run['Hkv'] else ''}head at one stats step "
            f"({x.shape[1] * x.shape[2]} heads x {len(steps)} steps), "
            f"coloured by training phase; circled: the last step. Entropy at the last step ranges from "
            f"{y[-1].min():.2f} to {y[-1].max():.2f} nats (uniform causal attention: {h_uniform:.2f}), key norm "
            f"from {x[-1].min():.2f} to {x[-1].max():.2f}. {shared} (decision-window means, {window_span(run)}): "
            f"{correlation_text(across, within)}.")


def figure_scatter_by_layer(run, path, opts):
    x, y, across, within = kv_correlations(run)
    qx = window_mean(run, values(run, "k_norm@q"))
    qy = window_mean(run, values(run, "attn_entropy"))
    root, h_uniform = math.sqrt(run["D"]), uniform_entropy(run["seq_len"])
    gqa = run["H"] > run["Hkv"]
    figures.layer_scatter(path, f"Entropy against key norm by layer, means over {window_span(run)}",
                          (x.ravel(), y.ravel(), layer_of(x), "kv head (entropy: mean of its query heads)" if gqa
                           else "head"),
                          (qx.ravel(), qy.ravel(), layer_of(qy), "query head") if gqa else None,
                          run["L"], f"k_norm of the {'kv ' if gqa else ''}head", "attention entropy (nats)",
                          (root, f"sqrt(D) = {root:.2f}", h_uniform, f"uniform attention, {h_uniform:.2f} nats"),
                          fits=run["Hkv"] > 1)
    means = y.mean(axis=1)
    bands = ", ".join(figures.band_label(band) for band, _ in figures.layer_bands(run["L"]))
    units = ("Each kv head's key norm against the mean attention entropy of the query heads reading it (large points; "
             "small: single query heads)" if gqa else "Each head's key norm against its attention entropy")
    fits = (" Thin lines: each layer's least-squares line through its own heads, the relation within a layer apart "
            "from the differences between layers." if run["Hkv"] > 1 else "")
    return (f"{units}, averaged over the decision window ({window_span(run)}), in the colour and marker of their "
            f"band of layers ({bands}).{fits} {correlation_text(across, within)}: the within-layer figure takes "
            f"out what differs between layers, so a trend across layers alone does not make it. Mean entropy by "
            f"layer: " + ", ".join(f"{i}: {v:.2f}" for i, v in enumerate(means)) + ".")


def figure_rank(run, path, opts):
    pr, er = group_curves(run, values(run, "k_pr")), group_curves(run, values(run, "k_erank"))
    iso = isotropic_pr(run["D"])
    figures.group_panels(path, f"Effective rank of the keys (D = {run['D']})", run["stats_steps"],
                         [("participation ratio of a key's components", "k_pr (dimensions)", pr, iso,
                           f"(D+2)/3 = {iso:.1f}: isotropic Gaussian keys"),
                          ("effective rank of the keys matrix (Roy & Vetterli)", "k_erank (dimensions)", er,
                           None, None)], run["groups"])
    steps = run["stats_steps"]
    return (f"Left, the participation ratio (how many components a key spreads over), {span(run)}: "
            f"{group_path(pr, steps, '{:.1f}')}; the dotted line, (D+2)/3 = {iso:.1f}, is what isotropic Gaussian keys "
            f"give, so a value near it says nothing about collapse. Right, the effective rank of all keys of a head "
            f"together: {group_path(er, steps, '{:.1f}')}. Both can reach D = {run['D']}."
            + transients_text(pr, steps, "k_pr", "{:.1f}") + transients_text(er, steps, "k_erank", "{:.1f}"))


def figure_offset(run, path, opts):
    er, centred = group_curves(run, values(run, "k_erank")), group_curves(run, values(run, "k_erank_centered"))
    share = group_curves(run, values(run, "k_mean_share"))
    figures.group_panels(path, "Fewer directions, or one shared offset?", run["stats_steps"],
                         [("effective rank of the keys", "k_erank (dimensions)", er, None, None),
                          ("effective rank once their mean is removed", "k_erank_centered (dimensions)", centred,
                           None, None),
                          ("share of the keys' energy in their mean", "k_mean_share", share, None, None)],
                         run["groups"], same_scale=(0, 1))
    steps = run["stats_steps"]
    lines = [f"{g}: k_erank {path_text(er[g], steps, '{:.1f}')}, centred {path_text(centred[g], steps, '{:.1f}')}, "
             f"mean share {path_text(share[g], steps)}"
             + interpreted(opts, f" ({offset_or_collapse((er[g][0], er[g][-1]), (centred[g][0], centred[g][-1]))})")
             for g in GROUPS]
    return (f"k_erank beside k_erank_centered (the same rank with each head's mean key removed) and k_mean_share "
            f"(the share of the keys' energy in that mean), {span(run)}. A common offset lowers k_erank and raises "
            f"k_mean_share while k_erank_centered stays high; keys that really use fewer directions lower both "
            f"ranks. " + "; ".join(lines) + "." + transients_text(er, steps, "k_erank", "{:.1f}")
            + transients_text(centred, steps, "k_erank_centered", "{:.1f}"))


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


def figure_gains(run, path, opts):
    g_q, g_k, steps = values(run, "g_q"), values(run, "g_k"), run["stats_steps"]
    rms = {name: group_curves(run, np.sqrt((g ** 2).mean(axis=2, keepdims=True)))
           for name, g in (("q", g_q), ("k", g_k))}
    figures.gain_figure(path, "The q and k norm gains side by side", steps, g_q[-1], g_k[-1], steps[-1], rms,
                        run["groups"])
    return (f"Top: the gains g_q (query norm) and g_k (key norm) of every layer and dimension at step {steps[-1]}, on "
            f"one colour scale (red amplifies, blue dampens). Bottom: the root mean square of each layer group's "
            f"gains, which scales the normalised vector's length (sqrt(D) x RMS gain), {span(run)}: g_q "
            f"{group_change(rms['q'], '{:.3f}')}; g_k {group_change(rms['k'], '{:.3f}')}.")


def figure_rope_gains(run, path, opts):
    r, D = rope_gains(run), run["D"]
    T, short = r["context"], r["short_dims"]
    figures.gains_by_wavelength(path, f"The q and k gains against the wavelength of their RoPE pair, step {r['step']}",
                                np.array(r["wavelength"]), [("g_q", values(run, "g_q")[-1]),
                                                            ("g_k", values(run, "g_k")[-1])],
                                T, f"training context T = {T}")
    means = "; ".join(f"g_{name} " + ", ".join(f"{g} {gain_text(v['short'])} / {gain_text(v['long'])}"
                                               for g, v in r[name]["groups"].items()) for name in ("q", "k"))
    return (f"Each layer's gain of every dimension at step {r['step']} (points, in the colour and marker of their band "
            f"of layers) against the wavelength 2 pi theta^(2i/D) of the dimension's RoPE pair: dimensions i and "
            f"i + D/2 turn together (theta = {r['theta']:g}, D = {D}); black, the mean over layers. Dashed: the "
            f"training context T = {T}; {short} of the {D} dimensions (the pairs i < {short // 2}) turn within it. "
            f"Mean gain of those / of the others, by layer group: {means}."
            + interpreted(opts, " " + wavelength_reading(r)))


def gain_text(x):
    return "n/a" if x is None else f"{x:.3f}"


def wavelength_split(r, name):
    """"short" when in every layer group the g_name of the pairs that turn within the context exceed
    the others' by more than NORM_MARGIN, "long" for the reverse, else None."""
    splits = [v["short"] / v["long"] - 1 for v in r[name]["groups"].values() if None not in (v["short"], v["long"])]
    if splits and min(splits) > NORM_MARGIN:
        return "short"
    if splits and max(splits) < -NORM_MARGIN:
        return "long"
    return None


def wavelength_reading(r):
    """What the gains' split by wavelength says, read from the layer groups' means."""
    said = {"short": f"higher for the pairs that turn within the context, by more than {NORM_MARGIN:.0%} in every "
                     "layer group",
            "long": f"higher for the slower pairs, by more than {NORM_MARGIN:.0%} in every layer group",
            None: f"not split by wavelength beyond {NORM_MARGIN:.0%} in every layer group"}
    text = f"g_q is {said[wavelength_split(r, 'q')]}; g_k is {said[wavelength_split(r, 'k')]}."
    if wavelength_split(r, "k") == "short":
        text += (" The dimensions the key gains amplify are those of the fast RoPE pairs: the notes' 'golden "
                 "dimensions' may be RoPE frequencies rather than features the model chose.")
    return text


def figure_qk(run, path, opts):
    curves = group_curves(run, qk_ratio(run))
    q_curves, k_curves = group_curves(run, values(run, "q_norm")), group_curves(run, values(run, "k_norm"))
    q, k = values(run, "q_norm").mean(axis=(1, 2)), values(run, "k_norm").mean(axis=(1, 2))
    root = math.sqrt(run["D"])
    figures.group_panels(path, "Who turns the volume knob: ||q||, ||k|| and their ratio", run["stats_steps"],
                         [("mean ||q|| of the query heads", "q_norm", q_curves, root, f"sqrt(D) = {root:.2f}"),
                          ("mean ||k|| of the kv heads", "k_norm", k_curves, root, f"sqrt(D) = {root:.2f}"),
                          ("mean over query heads of q_norm / k_norm of its kv head", "||q|| / ||k||", curves,
                           1.0, "equal norms")], run["groups"], same_scale=(0, 1))
    return (f"Left and middle, on one scale: the query and key norms by group, {span(run)}: ||q|| "
            f"{group_change(q_curves)}; ||k|| {group_change(k_curves)}. Right: their ratio, "
            f"{group_change(curves, '{:.3f}')}. Over all layers, mean ||q|| went {q[0]:.2f} \u2192 {q[-1]:.2f} "
            f"and mean ||k|| {k[0]:.2f} \u2192 {k[-1]:.2f}.")


def figure_logits(run, path, opts):
    observed, ceiling = values(run, "attn_logit_max"), logit_ceiling(run)
    obs, ceil = window_mean(run, observed), window_mean(run, ceiling)
    ratio = obs / ceil
    figures.logit_figure(path, "The largest attention logit against a ceiling estimated from the mean norms",
                         run["stats_steps"], group_curves(run, observed), group_curves(run, ceiling), run["groups"],
                         (ceil.ravel(), obs.ravel(), layer_of(obs), f"query head, means over {window_span(run)}"),
                         run["L"])
    l, h = np.unravel_index(np.argmax(ratio), ratio.shape)
    return (f"attn_logit_max, the largest logit q . k / sqrt(D) of any row of the step's batch, against mean ||q|| x "
            f"mean ||k|| / sqrt(D) (of the head and its kv head): what a logit would be if a query and a key of "
            f"mean length pointed the same way. It is an estimate from the means, not a bound: the longest queries "
            f"and keys are longer than the means, so a head can exceed it. Over the decision window the ratio "
            f"largest logit / estimate has median {np.median(ratio):.2f} across query heads (from {ratio.min():.2f} "
            f"to {ratio.max():.2f}, the highest layer {l}, query head {h}); near 1 or above, the head's largest "
            f"logits come from a query and key that are nearly parallel.")


def figure_maxp(run, path, opts):
    maxp, steps, T = values(run, "attn_maxp"), run["stats_steps"], run["seq_len"]
    curves, final, base = group_curves(run, maxp), window_mean(run, maxp), uniform_sink(T)
    figures.lines_and_heatmap(path, "Peak attention probability", steps,
                              ("mean over rows of max_j p_tj, by layer group", "attn_maxp", curves, run["groups"],
                               (0, 1), base, f"uniform attention, {base:.3f}"),
                              (f"every query head, mean over {window_span(run)}", final, "query head", "viridis",
                               0.0, 1.0, f"attn_maxp (line: uniform, {base:.3f})", base, "{:.2f}"))
    l, h = np.unravel_index(np.argmax(final), final.shape)
    return (f"The mean over rows of the largest attention probability, by group, {span(run)}: "
            f"{group_change(curves, '{:.3f}')}. Right: every query head over the decision window; the most peaked "
            f"is layer {l}, query head {h} ({final[l, h]:.2f}). Uniform causal attention over T = {T} gives "
            f"{base:.3f} (mean of 1/(t+1)); 1 is attention on a single key.")


def figure_sinks(run, path, opts):
    sink, rate, steps, T = values(run, "attn_sink"), sink_rate(run), run["stats_steps"], run["seq_len"]
    base = uniform_sink(T)
    curves = {f"sink rate (query heads with attn_sink > {SINK_THRESHOLD})": 100 * rate}
    doc = has(run, "attn_doc_start")
    if doc:  # beside the first position, the document starts (positions after the end-of-text token)
        mean_sink, mean_doc = sink.mean(axis=(1, 2)), values(run, "attn_doc_start").mean(axis=(1, 2))
        curves.update({"attn_sink, mean over heads (% of attention)": 100 * mean_sink,
                       "attn_doc_start, mean over heads (% of attention)": 100 * mean_doc})
    figures.lines_and_heatmap(path, "Attention sinks: attention mass on the first position", steps,
                              ("sink rate" + (" and attention on the first position and document starts" if doc else ""),
                               "%", curves, None, (-3, 103), None, None),
                              (f"attn_sink at step {steps[-1]}", sink[-1], "query head", "magma_r", 0.0, 1.0,
                               f"attention mass on position 0 (line: uniform, {base:.3f})", base, "{:.2f}"))
    l, h = np.unravel_index(np.argmax(sink[-1]), sink[-1].shape)
    text = (f"Left: share of the {run['L'] * run['H']} query heads with attn_sink > {SINK_THRESHOLD}, "
            f"{span(run)}: {100 * rate[0]:.0f}% \u2192 {100 * rate[-1]:.0f}%.")
    if doc:
        text += (f" Dashed: attn_sink averaged over every query head, {100 * mean_sink[0]:.1f}% \u2192 "
                 f"{100 * mean_sink[-1]:.1f}% of the attention; dotted: attn_doc_start, the attention on document "
                 f"starts (the positions after the end-of-text token; position 0 is attn_sink's), "
                 f"{100 * mean_doc[0]:.1f}% \u2192 {100 * mean_doc[-1]:.1f}%.")
    return text + (f" Right: attn_sink of every head at step {steps[-1]}; the strongest sink is layer {l}, query head "
                   f"{h} ({sink[-1][l, h]:.2f} of its attention on position 0). Uniform causal attention over T = {T} "
                   f"puts {base:.3f} there (mean of 1/(t+1)).")


def figure_loss(run, path, opts):
    steps, loss = run["loss"]
    val_steps, val = run["val"]
    if is_measurement(run):
        figures.loss_figure(path, "Loss of each measured batch", steps, loss.astype(float), val_steps,
                            val.astype(float), ("loss", "batch"))
        mean, half, n = mean_interval(loss)
        spread = f" \u00b1 {half:.3f} (95% interval over the batches)" if n > 1 else ""
        return (f"Loss of each of the {n} batches measured with the same weights (logged as steps {steps[0]} to "
                f"{steps[-1]}): mean {mean:.3f}{spread}, from {loss.min():.3f} to {loss.max():.3f}. Its variation is "
                "the data's, not training's.")
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
    ("layer_heatmaps.png", ["k_norm", "attn_entropy", "attn_sink"], figure_layer_heatmaps),
    ("outlier_magnitude.png", ["k_maxabs", "k_norm"], figure_outliers),
    ("axis_share.png", ["k_maxabs", "k_norm"], figure_axis_share),
    ("latent_redundancy.png", ["k_cos"], figure_cos),
    ("key_magnitude_profile.png", ["k_norm"], figure_profile),
    ("norm_divergence.png", ["k_norm"], figure_divergence),
    ("entropy_norm_scatter.png", ["k_norm", "attn_entropy"], figure_scatter),
    ("entropy_norm_by_layer.png", ["k_norm", "attn_entropy"], figure_scatter_by_layer),
    ("effective_rank.png", ["k_pr", "k_erank"], figure_rank),
    ("key_offset.png", ["k_erank", "k_erank_centered", "k_mean_share"], figure_offset),
    ("gamma_heatmap.png", ["g_k"], figure_gamma),
    ("gains_q_k.png", ["g_q", "g_k"], figure_gains),
    ("gains_wavelength.png", ["g_q", "g_k"], figure_rope_gains),
    ("qk_ratio.png", ["q_norm", "k_norm"], figure_qk),
    ("logit_ceiling.png", ["attn_logit_max", "q_norm", "k_norm"], figure_logits),
    ("attn_maxp.png", ["attn_maxp"], figure_maxp),
    ("sink_rate.png", ["attn_sink"], figure_sinks),
    ("loss.png", [], figure_loss),
]


# -- a measurement: one model state -------------------------------------------------------------------

# The statistics of layer_profiles.png, each with its reference value (a function of the run) and
# that value's name, or None.
PROFILED = [("k_norm", lambda r: math.sqrt(r["D"]), "sqrt(D)"), ("q_norm", lambda r: math.sqrt(r["D"]), "sqrt(D)"),
            ("k_maxabs", None, None), ("k_cos", None, None),
            ("k_pr", lambda r: isotropic_pr(r["D"]), "(D+2)/3: isotropic keys"), ("k_erank", None, None),
            ("k_erank_centered", None, None), ("k_mean_share", None, None),
            ("attn_entropy", lambda r: uniform_entropy(r["seq_len"]), "uniform attention"),
            ("attn_sink", lambda r: uniform_sink(r["seq_len"]), "uniform attention"),
            ("attn_maxp", lambda r: uniform_sink(r["seq_len"]), "uniform attention"), ("attn_logit_max", None, None)]


def layer_means(run, name):
    """([L, cols] the mean over the window of every head, [L] of every layer, [L] the half-width of
    the 95% t-interval of a layer's mean over the window's steps, or None) of a metric."""
    table = values(run, name)[run["window"]]
    per_layer = table.mean(axis=2)
    half = np.array([mean_interval(per_layer[:, layer])[1] for layer in range(run["L"])])
    return table.mean(axis=0), per_layer.mean(axis=0), half if np.isfinite(half).all() else None


def figure_layer_profiles(run, path, opts):
    panels = []
    for name, ref, ref_name in PROFILED:
        if has(run, name):
            value = ref(run) if ref else None
            panels.append((name, *layer_means(run, name), value, f"{ref_name}, {value:.2f}" if ref else None))
    figures.profile_panels(path, f"Every statistic by layer, means over {window_span(run)}", panels)
    k_norm, entropy = layer_means(run, "k_norm")[1], layer_means(run, "attn_entropy")[1]
    return (f"Each statistic of {len(panels)} by layer, averaged over {window_span(run)} (one model state): the "
            f"line is the mean over the layer's heads, the band its 95% interval over the batches (the data's "
            f"variation; none with fewer than 2 batches), the dots single heads; dotted, a reference where there is "
            f"one. Shortest keys: layer {np.argmin(k_norm)} ({k_norm.min():.2f}); longest: layer {np.argmax(k_norm)} "
            f"({k_norm.max():.2f}); sharpest attention: layer {np.argmin(entropy)} ({entropy.min():.2f} nats).")


def figure_head_maps(run, path, opts):
    T = run["seq_len"]
    sink, entropy, maxp = (window_mean(run, values(run, n)) for n in ("attn_sink", "attn_entropy", "attn_maxp"))
    axis = window_mean(run, axis_ratio(run))
    h_uniform, s_uniform = uniform_entropy(T), uniform_sink(T)
    figures.head_maps(path, f"Every head, means over {window_span(run)}", [
        (f"attn_sink (sink heads: > {SINK_THRESHOLD})", sink, "query head", "magma_r", 0.0, 1.0,
         f"attention mass on position 0 (line: uniform, {s_uniform:.3f})", s_uniform),
        ("attn_entropy", entropy, "query head", "viridis", 0.0, 1.04 * max(entropy.max(), h_uniform),
         f"nats (line: uniform attention, {h_uniform:.2f})", h_uniform),
        ("attn_maxp", maxp, "query head", "viridis", 0.0, 1.0, f"peak probability (line: uniform, {s_uniform:.3f})",
         s_uniform),
        ("(k_maxabs / k_norm)^2", axis, "kv head", "magma_r", 0.0, 1.0, f"axis share (line: {AXIS_THRESHOLD})",
         AXIS_THRESHOLD)])
    sinks = [f"layer {l} head {h} ({sink[l, h]:.2f})" for l, h in np.argwhere(sink > SINK_THRESHOLD)]
    l, h = np.unravel_index(np.argmin(entropy), entropy.shape)
    return (f"Every query head's attn_sink, attn_entropy and attn_maxp, and every kv head's axis share, averaged over "
            f"{window_span(run)}. Sink heads (attn_sink > {SINK_THRESHOLD}): "
            + (", ".join(sinks) if sinks else "none") + f". The sharpest head is layer {l}, query head {h} "
            f"({entropy[l, h]:.2f} nats; uniform causal attention over T = {T}: {h_uniform:.2f}); "
            f"{int((axis > AXIS_THRESHOLD).sum())} of {axis.size} kv heads are axis-aligned (share above "
            f"{AXIS_THRESHOLD}).")


# The figures of a measurement: its one model state by layer and by head, and the loss of each batch.
# The figures of FIGURES that follow training steps are not applicable to it (not_applicable_figures).
MEASUREMENT_FIGURES = [
    ("layer_profiles.png", ["k_norm", "attn_entropy"], figure_layer_profiles),
    ("head_maps.png", ["attn_sink", "attn_entropy", "attn_maxp", "k_maxabs", "k_norm"], figure_head_maps),
    ("key_magnitude_profile.png", ["k_norm"], figure_profile),
    ("entropy_norm_by_layer.png", ["k_norm", "attn_entropy"], figure_scatter_by_layer),
    ("gains_wavelength.png", ["g_q", "g_k"], figure_rope_gains),
    ("loss.png", [], figure_loss),
]


def not_applicable_figures(run):
    """The figures of a training run's report that a measurement has none of: they follow training."""
    if not is_measurement(run):
        return []
    drawn = {name for name, _, _ in MEASUREMENT_FIGURES}
    return [name for name, _, _ in FIGURES if name not in drawn]


def draw_figures(run, outdir, opts):
    """Draws what the log allows: ([(file, caption)], {file: why it was skipped}). The captions read
    the numbers only when verdicts.training_status lets the run have verdicts."""
    made, skipped = [], {}
    opts = dict(opts, interpret=training_status(run)["enough"])
    default, figures.STEP_LABEL = figures.STEP_LABEL, step_label(run)
    try:
        for name, needs, draw in MEASUREMENT_FIGURES if is_measurement(run) else FIGURES:
            reason = why_not(run, *needs) if needs else (None if len(run["loss"][0]) else "the log has no step records")
            if reason is None and {"attn_entropy", "attn_sink", "attn_maxp"} & set(needs) and run["seq_len"] < 1:
                reason = "the header gives no sequence length"
            if reason is None and draw is figure_rope_gains:
                reason = why_no_rope_gains(run)
            if reason:
                skipped[name] = reason
                continue
            made.append((name, draw(run, str(outdir / name), opts)))
    finally:
        figures.STEP_LABEL = default
    return made, skipped


# -- several runs --------------------------------------------------------------------------------------


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
