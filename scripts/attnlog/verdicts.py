"""The research reports' hypotheses (a)-(d) decided on a run, the taxonomy of its heads, and the same
decisions over replicate runs (one configuration, several seeds), all by one rule (RULE):

Each hypothesis is reduced to one or more tests. A test has an effect e, signed so that e > 0 is
the direction the hypothesis claims, an uncertainty u (the half-width of a 95% interval of e) and a
margin m, the dead band: an effect smaller than m counts as no effect. The test is supported when
e - u > m (the whole interval lies beyond the margin in the claimed direction), contradicted when
e + u < -m (the whole interval lies beyond the margin the other way), inconclusive otherwise. A
hypothesis of several tests is supported when all are, contradicted when any is.

The statistics are means over the decision window (analysis.decision_window), never one stats step;
their intervals allow for the autocorrelation of consecutive stats steps, and a statistic that still
trends inside the window is still moving (MOVING; both from analysis.window_trend). A run that has
trained too little, or whose statistics have not settled (training_status), gets no verdicts and no
taxonomy. verdict_path decides the hypotheses again on the run cut short, to show how stable they are.
A measurement of one model state (analysis.is_measurement) is decided on its means over every batch
it measured, with the t-intervals of independent samples and no trend (a line through its batches is
none), and what needs training dynamics is not applicable to it: the hypotheses of OVER_TRAINING, the
settling and the verdicts' path.
"""
import json
import math

import numpy as np

from attnlog.analysis import (AXIS_THRESHOLD, FOCUS_FRACTION, NORM_MARGIN, PERMUTATIONS, SINK_THRESHOLD,
                              WINDOW_FRACTION, axis_ratio, group_curves, has, is_measurement, kv_of_query,
                              mean_interval, offset_or_collapse, option_int, per_kv, rank_correlation, run_until,
                              steps_text, t975, uniform_entropy, values, why_not, window_trend)

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
NOT_APPLICABLE = "not applicable"  # a hypothesis about training, of a measurement of one model state
# The hypotheses that compare training steps, and why a measurement cannot decide them.
OVER_TRAINING = {"d": "it compares k_pr after the warm-up with the end of training, and a measurement is one model "
                      "state"}
CORRELATION_MARGIN = 0.1  # |rho| up to this is no correlation
RELATIVE_MARGIN = NORM_MARGIN  # a statistic within 5% of its reference value has not moved
MIN_TOKENS = 2 ** 16  # training tokens (total batch x steps) below which no verdict is given
MIN_WINDOW_STATS = 5  # stats steps the decision window needs
PATH_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # where verdict_path ends the run, as shares of its stats steps' span
# Options that do not change what a run computes: runs whose header differs only in these (and the
# seed) are replicates of one configuration.
NOT_CONFIGURATION = ("seed", "out", "threads", "profile", "samples", "sample-tokens", "ckpt-every", "keep",
                     "val-every", "val-batches", "data-dir", "allow-changes")
RULE = ("one rule decides every hypothesis: its effect e (signed so that e > 0 is what the hypothesis claims) "
        "is supported when e - u > m, contradicted when e + u < -m, and inconclusive otherwise, where u is "
        "the half-width of e's 95% interval and m the margin below which an effect counts as none (the dead "
        "band); a hypothesis of two tests is supported when both are and contradicted when either is")
MOVING = ("a test whose statistic still trends inside the decision window (a line fitted to its window steps "
          "rises or falls, and the 95% interval of that change, which allows for autocorrelation, excludes 0) "
          "is still moving: it keeps its verdict only when the line's value at the window's last step gets the "
          "same verdict, and is otherwise inconclusive (\"still moving\")")
SETTLING = ("the statistics have settled when the last two quarters of the run agree: no layer's mean k_norm, "
            "attn_entropy or k_pr over the decision window differs from its mean over the quarter before by more "
            f"than {NORM_MARGIN:.0%} of its scale (sqrt(D) for k_norm, the entropy of uniform attention for "
            "attn_entropy, the window mean for k_pr)")


# -- the guards --------------------------------------------------------------------------------------


def training_status(run):
    """Whether the run has trained enough for verdicts: it has left its learning-rate warm-up (its
    last logged step is at or past the warmup option; a run started from a checkpoint warms up again
    from its own step 0), trained on at least MIN_TOKENS tokens (tokens per step x steps, a
    checkpoint's steps counted too, at this run's tokens per step), has MIN_WINDOW_STATS stats
    steps in the decision window ("trained": all these hold), and its statistics have settled
    (unsettled). "enough": all of it. A measurement: measurement_status."""
    if is_measurement(run):
        return measurement_status(run)
    span = run["step_range"]
    last = span[1] if span else None
    init_steps = (run["init"] or {}).get("steps") or 0
    trained = (last + 1 if last is not None else 0) + init_steps
    tokens = trained * run["tokens_per_step"]
    warmup = option_int(run["options"], "warmup")
    reasons = []
    if last is None:
        reasons.append("the log has no step records")
    elif last < warmup:
        reasons.append(f"the run has not left warm-up (last step {last} < warmup {warmup})")
    if tokens < MIN_TOKENS:
        reasons.append(f"{tokens:,} training tokens ({trained} steps x {run['tokens_per_step']:,}), fewer than "
                       f"the {MIN_TOKENS:,} a verdict needs")
    if len(run["window"]) < MIN_WINDOW_STATS:
        reasons.append(f"{len(run['window'])} stats steps in the decision window (the last "
                       f"{WINDOW_FRACTION:.0%} of the run), fewer than {MIN_WINDOW_STATS}")
    moving = unsettled(run) if len(run["window"]) >= MIN_WINDOW_STATS else []
    if moving:
        steps = run["stats_steps"][run["window"]]
        reasons.append(f"the statistics have not settled: over the decision window (steps {steps[0]}-{steps[-1]}) "
                       f"{len(moving)} layer statistics moved by more than {NORM_MARGIN:.0%} of their scale from the "
                       "quarter before (" + ", ".join(moving[:4]) + (", ..." if len(moving) > 4 else "") + ")")
    return {"enough": not reasons, "trained": len(reasons) == bool(moving), "reasons": reasons,
            "tokens_per_step": run["tokens_per_step"],
            "steps_trained": trained, "init_steps": init_steps, "tokens": tokens, "min_tokens": MIN_TOKENS,
            "warmup": warmup, "last_step": last, "window_count": int(len(run["window"])),
            "min_window_count": MIN_WINDOW_STATS, "settled": not moving, "unsettled": moving}


def measurement_status(run):
    """training_status of a measurement: the weights it measured trained on at least MIN_TOKENS
    tokens when their checkpoint records how many (one that does not, such as a pretrained model's,
    is taken as trained), and it measured at least MIN_WINDOW_STATS batches; one model state has
    nothing to settle. The same keys, with tokens None when not recorded, warmup None, and
    measurement True."""
    measured = run["measurement"]
    tokens, batches = measured.get("tokens"), len(run["window"])
    reasons = []
    if tokens is not None and tokens < MIN_TOKENS:
        reasons.append(f"the weights measured had trained on {tokens:,} tokens ({measured.get('step')} steps), fewer "
                       f"than the {MIN_TOKENS:,} a verdict needs")
    if batches < MIN_WINDOW_STATS:
        reasons.append(f"{batches} batches measured, fewer than {MIN_WINDOW_STATS}")
    span = run["step_range"]
    return {"enough": not reasons, "trained": not reasons, "reasons": reasons,
            "tokens_per_step": run["tokens_per_step"], "steps_trained": measured.get("step"), "init_steps": 0,
            "tokens": tokens, "min_tokens": MIN_TOKENS,
            "warmup": None, "last_step": span[1] if span else None, "window_count": batches,
            "min_window_count": MIN_WINDOW_STATS, "settled": True, "unsettled": [], "measurement": True}


def unsettled(run):
    """The layer statistics that have not settled (SETTLING): each layer's mean over its heads of
    k_norm, attn_entropy and k_pr, averaged over the decision window and over the stats steps of the
    quarter before it; one whose two averages differ by more than NORM_MARGIN of its scale has not
    (what the previous quarter of training did, another might still do). ["layer L's NAME +x.x%"],
    the difference as a share of the scale; none without stats steps before the window."""
    steps, w = run["stats_steps"], run["window"]
    before = np.flatnonzero((steps < steps[w[0]]) & (steps >= 2 * steps[w[0]] - steps[-1]))
    scales = {"k_norm": math.sqrt(run["D"]), "attn_entropy": uniform_entropy(run["seq_len"]), "k_pr": None}
    out = []
    for name, scale in scales.items() if len(before) else ():
        if not has(run, name):
            continue
        layer_means = values(run, name).mean(axis=2)
        last, previous = layer_means[w].mean(axis=0), layer_means[before].mean(axis=0)
        for layer, share in enumerate((last - previous) / (scale or last)):
            if abs(share) > NORM_MARGIN:
                out.append(f"layer {layer}'s {name} {100 * share:+.1f}%")
    return out


# -- the rule ----------------------------------------------------------------------------------------


def decide(effect, half_width, margin):
    """(verdict, why) of one test by RULE; an infinite half-width (no interval) decides nothing."""
    if not math.isfinite(effect) or math.isnan(half_width):
        return INCONCLUSIVE, "no data"
    if effect - half_width > margin:
        return SUPPORTED, "decided"
    if effect + half_width < -margin:
        return CONTRADICTED, "decided"
    return INCONCLUSIVE, "within the margin" if abs(effect) <= margin else "uncertain"


def make_test(name, effect, half_width, margin, uncertainty, trend=None):
    """One test: its effect, interval, margin, what the uncertainty is, and its verdict by RULE and
    MOVING. trend: analysis.window_trend of the test's statistic at each window step, in the units
    of the effect (None when the test has none); the line's value at the window's last step, "end",
    is the effect moved by the line's rise from the steps' mean to the last step."""
    verdict, why = decide(effect, half_width, margin)
    moving = bool(trend and trend["moving"])
    end = effect + trend["end"] - trend["mean"] if trend else float("nan")
    if moving and (verdict == INCONCLUSIVE or decide(end, half_width, margin)[0] != verdict):
        verdict, why = INCONCLUSIVE, "still moving"
    shown = ("change", "change_half", "n", "n_eff", "phi")
    return {"name": name, "effect": effect, "half_width": half_width, "low": effect - half_width,
            "high": effect + half_width, "margin": margin, "uncertainty": uncertainty, "verdict": verdict, "why": why,
            "moving": moving, "end": end, "trend": {k: trend[k] for k in shown} if trend else None}


def series_test(name, steps, series, margin, independent=False):
    """A test whose effect is the window mean of series (the effect at each window step). independent:
    the values are independent samples of one state (a measurement's batches), whose mean has the
    t-interval and no trend."""
    if independent:
        mean, half, _ = mean_interval(series)
        return make_test(name, mean, half, margin, "95% t-interval of the mean over the measured batches")
    trend = window_trend(steps, series)
    return make_test(name, trend["mean"], trend["half_width"], margin,
                     "95% interval of the window mean, autocorrelation allowed", trend)


def combine(tests):
    """(verdict, why) of a hypothesis from its tests."""
    verdicts = [t["verdict"] for t in tests]
    if CONTRADICTED in verdicts:
        return CONTRADICTED, "decided"
    if all(v == SUPPORTED for v in verdicts):
        return SUPPORTED, "decided"
    whys = [t["why"] for t in tests if t["verdict"] == INCONCLUSIVE]
    return INCONCLUSIVE, next((w for w in ("still moving", "uncertain") if w in whys), whys[0])


def window_text(run):
    steps, window = run["stats_steps"], run["window"]
    if is_measurement(run):
        return f"means over the {len(window)} measured batches"
    return f"means over the {len(window)} stats steps {steps[window[0]]}-{steps[window[-1]]}"


def interval_text(mean, half, digits=2):
    """"mean +- half", or "mean +- (no interval)" when the window holds too few effective samples."""
    return f"{mean:.{digits}f} \u00b1 " + (f"{half:.3f}" if math.isfinite(half) else "(no interval)")


# -- the hypotheses -----------------------------------------------------------------------------------


def hypothesis_entropy_norm(run):
    """(a) Among the heads of one layer, a larger key norm goes with sharper (lower-entropy)
    attention: the notes' split of heads sharing a gain vector. The units are kv heads, each with the
    mean entropy of the query heads that read it; the layers' differences (depth) are taken out, and
    shown apart: across all kv heads, and between the layers' means."""
    result = {"id": "a", "title": "larger key norm, sharper attention, within a layer",
              "claim": "among the kv heads of one layer, those with a larger k_norm have a lower attn_entropy (the "
                       "mean over the kv head's query heads)",
              "rule": f"e = -rho within layers: Spearman's rho of the kv heads' decision-window means, both quantities "
                      f"centred per layer; u = the 95th percentile of |rho| over {PERMUTATIONS} pairings shuffled "
                      f"only within layers (what chance alone reaches, seeded); m = {CORRELATION_MARGIN}; its trend: "
                      "rho within layers at each window step. Shown, not deciding: rho across all kv heads, which "
                      "includes depth (the differences between layers), and rho between the layers' means (depth "
                      "alone)",
              "statistic": "spearman_rho_within_layers"}
    reason = why_not(run, "k_norm", "attn_entropy")
    if reason:
        return dict(result, tests=[], detail=reason)
    w, layer_of = run["window"], np.repeat(np.arange(run["L"]), run["Hkv"])
    k_norm, entropy = values(run, "k_norm"), per_kv(run, values(run, "attn_entropy"))
    x, y = k_norm[w].mean(axis=0), entropy[w].mean(axis=0)
    within = rank_correlation(x.ravel(), y.ravel(), strata=layer_of)
    across = rank_correlation(x.ravel(), y.ravel())
    layers = rank_correlation(x.mean(axis=1), y.mean(axis=1))
    steps = np.array([rank_correlation(k_norm[i].ravel(), entropy[i].ravel(), strata=layer_of, permutations=0)["rho"]
                      for i in w])
    one_state = is_measurement(run)  # its batches are independent samples of one state: no trend
    trend = window_trend(run["stats_steps"][w], -steps) if np.isfinite(steps).all() and not one_state else None
    test = make_test("-rho within layers", -within["rho"], within["chance"], CORRELATION_MARGIN,
                     "chance level of |rho| under pairings shuffled within layers", trend)
    shown = ("rho", "p", "chance", "n")
    result.update(n_units=x.size, value=within["rho"], p_value=within["p"], chance=within["chance"],
                  across={k: across[k] for k in shown}, layer_means={k: layers[k] for k in shown}, tests=[test],
                  per_step=({"mean": float(steps.mean()), "min": float(steps.min()), "max": float(steps.max()),
                             "steps": len(steps)} if np.isfinite(steps).all() else None))
    depth = (f"across all {x.size} kv heads rho = {across['rho']:+.3f} (chance \u00b1{across['chance']:.3f}), which "
             f"includes depth; between the {run['L']} layers' means rho = {layers['rho']:+.3f} (chance "
             f"\u00b1{layers['chance']:.3f})")
    if not math.isfinite(within["rho"]):
        why = "one kv head per layer: no heads of one layer to compare" if run["Hkv"] == 1 else "constant values"
        return dict(result, detail=f"within layers: n/a ({why}); {depth}")
    return dict(result, detail=f"within layers rho = {within['rho']:+.3f} over {run['L']} layers of {run['Hkv']} kv "
                               f"heads ({window_text(run)}; chance reaches \u00b1{within['chance']:.3f}, p = "
                               f"{within['p']:.3g}); at single {steps_text(run)} of the window it ranged "
                               f"{steps.min():+.2f} to {steps.max():+.2f}; {depth}")


def hypothesis_hierarchy(run):
    """(b) Early layers dampen their keys below sqrt(D), the final layers amplify them above."""
    root = math.sqrt(run["D"])
    result = {"id": "b", "title": "dampened early keys, amplified final keys",
              "claim": f"the early group's k_norm is below sqrt(D) = {root:.2f}, where every key norm starts, and the "
                       "final group's is above it",
              "rule": f"two tests: e = (sqrt(D) - early) / sqrt(D) and e = (final - sqrt(D)) / sqrt(D), each group's "
                      f"mean k_norm over the decision window; u = the 95% interval of that mean allowing for the "
                      f"autocorrelation of the window's stats steps, / sqrt(D); m = {RELATIVE_MARGIN:.0%}",
              "statistic": "group_k_norm"}
    reason = why_not(run, "k_norm")
    if not reason and set(run["groups"]["early"]) & set(run["groups"]["final"]):
        reason = f"{run['L']} layers: the early and final groups overlap"
    if reason:
        return dict(result, tests=[], detail=reason)
    curves = group_curves(run, values(run, "k_norm"))
    w, steps = run["window"], run["stats_steps"][run["window"]]
    one_state = is_measurement(run)
    tests = [series_test("early dampening", steps, (root - curves["early"][w]) / root, RELATIVE_MARGIN, one_state),
             series_test("final amplification", steps, (curves["final"][w] - root) / root, RELATIVE_MARGIN, one_state)]
    early, final = curves["early"][w].mean(), curves["final"][w].mean()
    return dict(result, early=early, final=final, sqrt_head_dim=root, value=[early, final], tests=tests,
                detail=f"early {interval_text(early, tests[0]['half_width'] * root)} "
                       f"({100 * (early / root - 1):+.1f}% from {root:.2f}, {tests[0]['verdict']}), final "
                       f"{interval_text(final, tests[1]['half_width'] * root)} ({100 * (final / root - 1):+.1f}%, "
                       f"{tests[1]['verdict']}); {window_text(run)}")


def hypothesis_axis_aligned(run):
    """(c) Outlier components: some kv heads put most of a key's energy into one dimension."""
    n_heads = run["L"] * run["Hkv"]
    result = {"id": "c", "title": "axis-aligned keys (outlier dimensions)",
              "claim": f"some kv heads are axis-aligned: k_maxabs^2 / k_norm^2 > {AXIS_THRESHOLD}",
              "rule": f"e = share / {AXIS_THRESHOLD} - 1 for the kv head with the largest decision-window mean share; "
                      f"u = the 95% interval of its mean allowing for the autocorrelation of the window's stats "
                      f"steps, / {AXIS_THRESHOLD}; m = {RELATIVE_MARGIN:.0%}",
              "statistic": "largest_axis_share"}
    reason = why_not(run, "k_norm", "k_maxabs")
    if reason:
        return dict(result, tests=[], detail=reason)
    w, ratio = run["window"], axis_ratio(run)
    means = ratio[w].mean(axis=0)
    top = np.unravel_index(np.argmax(means), means.shape)
    t = series_test("largest axis share", run["stats_steps"][w], ratio[w, top[0], top[1]] / AXIS_THRESHOLD - 1,
                    RELATIVE_MARGIN, is_measurement(run))
    share = float(ratio[w, top[0], top[1]].mean())
    aligned = np.argwhere(means > AXIS_THRESHOLD)
    return dict(result, value=len(aligned), of=n_heads, first_step_count=int((ratio[0] > AXIS_THRESHOLD).sum()),
                heads=[[int(l), int(h)] for l, h in aligned], max_ratio=share,
                max_ratio_head=[int(top[0]), int(top[1])], tests=[t],
                detail=f"{len(aligned)} of {n_heads} kv heads above {AXIS_THRESHOLD} ({window_text(run)}); the "
                       f"largest share is {interval_text(share, t['half_width'] * AXIS_THRESHOLD, 3)}, layer {top[0]} "
                       f"kv head {top[1]}")


def reference_index(run):
    """Index of the stats step (d) measures the fall from: the first at or after the end of the
    learning-rate warm-up (option warmup), where the keys start from what the warm-up made of them,
    not from their initialisation; None when no stats step is."""
    later = np.flatnonzero(run["stats_steps"] >= option_int(run["options"], "warmup"))
    return int(later[0]) if len(later) else None


def hypothesis_pr_falls(run):
    """(d) Dimensional collapse: the keys use fewer dimensions as training goes on."""
    result = {"id": "d", "title": "dimensional collapse",
              "claim": "the participation ratio k_pr falls during training",
              "rule": f"e = (reference - window) / reference, the relative fall of the mean k_pr over all layers and "
                      f"kv heads from the reference step, the first stats step at or after the end of the warm-up "
                      f"(option warmup), to the decision window's mean; u = the 95% interval of that mean allowing for "
                      f"the autocorrelation of the window's stats steps, / reference; m = {RELATIVE_MARGIN:.0%}. Shown "
                      "beside it: the fall from the first stats step, and k_erank and k_erank_centered (a fall of "
                      "k_erank alone is an offset shared by the keys, not fewer directions)",
              "statistic": "relative_fall_k_pr"}
    reason = why_not(run, "k_pr")
    ref, w, steps = reference_index(run), run["window"], run["stats_steps"]
    if not reason and (ref is None or ref >= w[0]):
        reason = (f"no stats step before the decision window is past the warm-up (option warmup "
                  f"{option_int(run['options'], 'warmup')}): no reference step")
    if reason:
        return dict(result, tests=[], detail=reason)
    pr = values(run, "k_pr").mean(axis=(1, 2))
    reference, first, last = float(pr[ref]), float(pr[0]), float(pr[w].mean())
    t = series_test("relative fall of k_pr", steps[w], (reference - pr[w]) / reference, RELATIVE_MARGIN)
    extra, more = {}, ""
    for name in ("k_erank", "k_erank_centered", "k_mean_share"):
        if has(run, name):
            curve = values(run, name).mean(axis=(1, 2))
            low = int(np.argmin(curve))
            extra[name.replace("k_", "", 1)] = {"first": float(curve[0]), "last": float(curve[w].mean()),
                                                "lowest": float(curve[low]), "lowest_step": int(steps[low])}
            more += (f"; {name} {curve[0]:.3g} \u2192 {curve[w].mean():.3g} (lowest {curve[low]:.3g} at step "
                     f"{steps[low]})")
    if "erank" in extra and "erank_centered" in extra:
        more += ": " + offset_or_collapse(*([d["first"], d["last"]] for d in (extra["erank"], extra["erank_centered"])))
    return dict(result, reference=reference, reference_step=int(steps[ref]), first=first, last=last,
                value=[reference, last], first_step=int(steps[0]), tests=[t], **extra,
                detail=f"{reference:.2f} at step {steps[ref]} (the end of warm-up), "
                       f"{interval_text(last, t['half_width'] * reference)} "
                       f"({100 * (last - reference) / reference:+.1f}%; {window_text(run)}); from the first stats "
                       f"step, {first:.2f} at step {steps[0]}: {100 * (last - first) / first:+.1f}%{more}")


def hypotheses(run, training):
    """The four hypotheses, each with its verdict and whether a test of it is still moving; all
    inconclusive when the run trained too little or its statistics have not settled. Of a
    measurement, those of OVER_TRAINING are not applicable (no tests, no verdict)."""
    out = []
    for check in (hypothesis_entropy_norm, hypothesis_hierarchy, hypothesis_axis_aligned, hypothesis_pr_falls):
        h = check(run)
        if is_measurement(run) and h["id"] in OVER_TRAINING:  # what it is, without the numbers of one state
            h = {key: h[key] for key in ("id", "title", "claim", "rule", "statistic")}
            h.update(verdict=NOT_APPLICABLE, why=NOT_APPLICABLE, tests=[], moving=False,
                     detail=f"not applicable to a measurement: {OVER_TRAINING[h['id']]}")
            out.append(h)
            continue
        h["moving"] = any(t["moving"] for t in h["tests"])
        if not h["tests"]:
            h.update(verdict=INCONCLUSIVE, why="no data")
        elif not training["enough"]:
            why = "too little training" if not training["trained"] else "not settled"
            for t in h["tests"]:
                t.update(verdict=INCONCLUSIVE, why=why)
            h.update(verdict=INCONCLUSIVE, why=why,
                     detail=f"{why} ({'; '.join(training['reasons'])}); the numbers: {h['detail']}")
        else:
            h["verdict"], h["why"] = combine(h["tests"])
        out.append(h)
    return out


def verdict_path(run, decided=None):
    """The hypotheses decided again on the run cut at PATH_FRACTIONS of its stats steps' span
    (analysis.run_until), each cut with its own decision window and guards: [{"fraction", "end_step",
    "window" [first, last] (null when empty), "enough", "trained" (training_status), "hypotheses"
    {id: {"verdict", "why", "moving", "tests" [{"name", "effect", "half_width", "verdict",
    "moving"}]}}}]. decided: hypotheses(run, training_status(run)) when already had, for the whole run.
    None for a measurement: its batches are one model state."""
    if is_measurement(run):
        return None
    steps, out = run["stats_steps"], []
    for fraction in PATH_FRACTIONS if len(steps) else ():
        end = int(round(steps[0] + fraction * (steps[-1] - steps[0])))
        cut = run if end >= steps[-1] else run_until(run, end)
        training = training_status(cut)
        found = decided if decided is not None and cut is run else hypotheses(cut, training)
        w = cut["stats_steps"][cut["window"]]
        out.append({"fraction": fraction, "end_step": int(cut["stats_steps"][-1]),
                    "window": [int(w[0]), int(w[-1])] if len(w) else None, "enough": training["enough"],
                    "trained": training["trained"],
                    "hypotheses": {h["id"]: {"verdict": h["verdict"], "why": h["why"], "moving": h["moving"],
                                             "tests": [{k: t[k] for k in ("name", "effect", "half_width", "verdict",
                                                                          "moving")} for t in h["tests"]]}
                                   for h in found}})
    return out


# -- the head taxonomy ------------------------------------------------------------------------------------
#
# A key counts as long or short against the other keys of the run, not against sqrt(D): training moves
# almost every key away from its initial length, so a fixed threshold such as 1.05 sqrt(D) ends up
# sorting nearly all heads on one side. The kv heads' decision-window k_norm split into thirds: the top
# third is long, the bottom third short, the middle third neither (a dead band, as the verdicts' margins).
KEY_THIRDS = (1 / 3, 2 / 3)


def taxonomy_rules(run, short=None, long=None):
    """The rules, in words, with this run's thresholds filled in (the key thresholds once known)."""
    h_uniform = uniform_entropy(run["seq_len"])
    focus = FOCUS_FRACTION * h_uniform
    long_text, short_text = ("" if x is None else f" {x:.2f}" for x in (long, short))
    return {
        "static sink": f"attn_sink > {SINK_THRESHOLD}: more than {SINK_THRESHOLD:.0%} of the head's attention "
                       "lands on the first position, whatever the query (the sink threshold of Gu et al. 2024)",
        "semantic retriever": f"not a sink; focused attention, attn_entropy < {focus:.2f} nats "
                              f"({FOCUS_FRACTION} x the {h_uniform:.2f} nats of uniform attention over "
                              f"T = {run['seq_len']}, i.e. fewer than about {math.exp(focus):.0f} tokens "
                              f"effectively); and a long key for this run, k_norm >{long_text} (the top third of "
                              "the run's kv heads)",
        "syntactic gatherer": f"not a sink; diffuse attention, attn_entropy >= {focus:.2f} nats; a short key for "
                              f"this run, k_norm <{short_text} (the bottom third of the run's kv heads); and not "
                              f"axis-aligned, k_maxabs^2 / k_norm^2 <= {AXIS_THRESHOLD}",
        "other": "none of the above: focused heads without a long key, diffuse heads without a short key or "
                 "with an axis-aligned one",
    }


def classify(sink, entropy, k_norm, axis, short, long, focus):
    """The first rule of taxonomy_rules a head meets."""
    if sink > SINK_THRESHOLD:
        return "static sink"
    if entropy < focus and k_norm > long:
        return "semantic retriever"
    if entropy >= focus and k_norm < short and axis <= AXIS_THRESHOLD:
        return "syntactic gatherer"
    return "other"


def diffuse_amplified(heads, focus, amplified):
    """The heads that are no sink and attend diffusely (attn_entropy >= focus) with a key amplified
    beyond (1 + NORM_MARGIN) sqrt(D): against the notes' premise that diffuse heads, the gatherers,
    keep their keys low and amplified keys go with focused attention. {"count", "diffuse" (heads no
    sink and diffuse), "amplified_k_norm", "heads" [[layer, head]], "contradicts_premise" (most
    diffuse heads are amplified)}."""
    diffuse = [h for h in heads if h["class"] != "static sink" and h["attn_entropy"] >= focus]
    members = [[h["layer"], h["head"]] for h in diffuse if h["k_norm"] > amplified]
    return {"count": len(members), "diffuse": len(diffuse), "amplified_k_norm": amplified, "heads": members,
            "contradicts_premise": len(members) > len(diffuse) / 2}


def taxonomy(run, training):
    """Every query head classified by taxonomy_rules on its decision-window means, and the diffuse
    heads with amplified keys counted (diffuse_amplified); none for a run that trained too little
    or whose statistics have not settled (its heads would be sorted by their initialisation or by
    where they happen to be passing)."""
    reason = why_not(run, "k_norm", "k_maxabs", "attn_entropy", "attn_sink")
    if reason is None and run["seq_len"] < 1:
        reason = "the header gives no sequence length"
    if reason is None and not training["enough"]:
        reason = (("too little training (" if not training["trained"] else "the statistics have not settled (")
                  + "; ".join(training["reasons"]) + "): the heads would be sorted by what their initialisation "
                  "gives them, or by where they are passing")
    if reason:
        return {"available": False, "reason": reason, "rules": taxonomy_rules(run)}
    w, kv = run["window"], kv_of_query(run)
    h_uniform = uniform_entropy(run["seq_len"])
    focus, amplified = FOCUS_FRACTION * h_uniform, (1 + NORM_MARGIN) * math.sqrt(run["D"])
    short, long = (float(x) for x in np.quantile(values(run, "k_norm")[w].mean(axis=0), KEY_THIRDS))
    k_norm, axis = values(run, "k_norm@q")[w].mean(axis=0), axis_ratio(run)[w].mean(axis=0)[:, kv]
    entropy, sink = values(run, "attn_entropy")[w].mean(axis=0), values(run, "attn_sink")[w].mean(axis=0)
    heads = []
    for layer in range(run["L"]):
        for h in range(run["H"]):
            cls = classify(sink[layer, h], entropy[layer, h], k_norm[layer, h], axis[layer, h], short, long, focus)
            heads.append({"layer": layer, "head": h, "kv_head": int(kv[h]), "class": cls,
                          "k_norm": float(k_norm[layer, h]), "attn_entropy": float(entropy[layer, h]),
                          "entropy_fraction": float(entropy[layer, h] / h_uniform),
                          "attn_sink": float(sink[layer, h]), "axis_ratio": float(axis[layer, h])})
    rules = taxonomy_rules(run, short, long)
    counts = {cls: sum(h["class"] == cls for h in heads) for cls in rules}
    steps = run["stats_steps"]
    return {"available": True, "window": [int(steps[w[0]]), int(steps[w[-1]])], "step": int(steps[w[-1]]),
            "rules": rules, "counts": counts, "uniform_entropy": h_uniform, "focus_entropy": focus,
            "short_k_norm": short, "long_k_norm": long, "seq_len": run["seq_len"], "heads": heads,
            "diffuse_amplified": diffuse_amplified(heads, focus, amplified)}


# -- replicates: one configuration, several seeds -----------------------------------------------------------


def configuration(summary):
    """What makes runs replicates of each other: the model configuration and every option but those
    of NOT_CONFIGURATION (the seed among them)."""
    options = {k: v for k, v in summary["options"].items() if k not in NOT_CONFIGURATION}
    return json.dumps([summary["config"], options], sort_keys=True)


def replicate_sets(summaries):
    """Indices of the summaries, in sets that share a configuration and hold two seeds or more."""
    sets = {}
    for i, s in enumerate(summaries):
        sets.setdefault(configuration(s), []).append(i)
    return [members for members in sets.values() if len({summaries[i]["options"].get("seed") for i in members}) > 1]


def replicate_verdicts(summaries):
    """The hypotheses decided over replicate runs by RULE: per test, the mean of the runs' effects
    with its 95% t-interval across the runs. A run that trained too little, or repeats a seed already
    counted, is left out, saying why."""
    used, left_out, seeds = [], {}, set()
    for s in summaries:
        seed = s["options"].get("seed", s.get("seed"))
        if seed in seeds:
            left_out[s["label"]] = f"seed {seed} again: not an independent replicate"
        elif not s["training"]["enough"]:
            left_out[s["label"]] = "too little training (" + "; ".join(s["training"]["reasons"]) + ")"
        else:
            used.append(s)
            seeds.add(seed)
    out = {"runs": [s["label"] for s in summaries], "seeds": [s["options"].get("seed") for s in used],
           "counted": [s["label"] for s in used], "left_out": left_out, "hypotheses": {}}
    for key, first in summaries[0]["hypotheses"].items():
        tests = []
        for j, t in enumerate(first["tests"]):
            effects = [s["hypotheses"][key]["tests"][j]["effect"] for s in used
                       if len(s["hypotheses"][key]["tests"]) > j]
            effects = [e for e in effects if e is not None and math.isfinite(e)]
            mean, half, n = mean_interval(effects)
            tests.append(dict(make_test(t["name"], mean, half, t["margin"], f"95% t-interval across {n} seeds"),
                              values=effects, n=n, mean=mean, t=t975(n - 1)))
        h = {"title": first["title"], "tests": tests}
        if not tests or min(t["n"] for t in tests) < 2:
            h.update(verdict=INCONCLUSIVE, why="no data",
                     detail=f"{min([t['n'] for t in tests] or [0])} runs with this statistic past the guards; "
                            "an interval across seeds needs 2")
        else:
            h["verdict"], h["why"] = combine(tests)
            h["detail"] = "; ".join(f"{t['name']}: mean {t['mean']:+.3f} \u00b1 {t['half_width']:.3f} over {t['n']} "
                                    f"seeds (t = {t['t']:.3f}), margin {t['margin']:g}: {t['verdict']}" for t in tests)
        out["hypotheses"][key] = h
    return out
