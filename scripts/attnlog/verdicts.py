"""The research reports' hypotheses (a)-(d) decided on a run, the taxonomy of its heads, and the same
decisions over replicate runs (one configuration, several seeds), all by one rule (RULE):

Each hypothesis is reduced to one or more tests. A test has an effect e, signed so that e > 0 is
the direction the hypothesis claims, an uncertainty u (the half-width of a 95% interval of e) and a
margin m, the dead band: an effect smaller than m counts as no effect. The test is supported when
e - u > m (the whole interval lies beyond the margin in the claimed direction), contradicted when
e + u < -m (the whole interval lies beyond the margin the other way), inconclusive otherwise. A
hypothesis of several tests is supported when all are, contradicted when any is.

The statistics are means over the decision window (analysis.decision_window), never one stats step,
and a run that has trained too little (training_status) gets no verdicts and no taxonomy. A
measurement of one model state (analysis.is_measurement) is decided on its means over every batch
it measured, and the hypotheses that compare training steps (OVER_TRAINING) are not applicable to it.
"""
import json
import math

import numpy as np

from attnlog.analysis import (AXIS_THRESHOLD, FOCUS_FRACTION, NORM_MARGIN, PERMUTATIONS, SINK_THRESHOLD,
                              WINDOW_FRACTION, axis_ratio, group_curves, has, is_measurement, kv_of_query,
                              mean_interval, offset_or_collapse, option_int, per_kv, rank_correlation, steps_text, t975,
                              uniform_entropy, values, why_not)

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
NOT_APPLICABLE = "not applicable"  # a hypothesis about training, of a measurement of one model state
# The hypotheses that compare training steps, and why a measurement cannot decide them.
OVER_TRAINING = {"d": "it compares k_pr at the first stats step with the end of training, and a measurement is one "
                      "model state"}
CORRELATION_MARGIN = 0.1  # |rho| up to this is no correlation
RELATIVE_MARGIN = NORM_MARGIN  # a statistic within 5% of its reference value has not moved
MIN_TOKENS = 2 ** 16  # training tokens (total batch x steps) below which no verdict is given
MIN_WINDOW_STATS = 5  # stats steps the decision window needs
# Options that do not change what a run computes: runs whose header differs only in these (and the
# seed) are replicates of one configuration.
NOT_CONFIGURATION = ("seed", "out", "threads", "profile", "samples", "sample-tokens", "ckpt-every", "keep",
                     "val-every", "val-batches", "data-dir", "allow-changes")
RULE = ("one rule decides every hypothesis: its effect e (signed so that e > 0 is what the hypothesis claims) "
        "is supported when e - u > m, contradicted when e + u < -m, and inconclusive otherwise, where u is "
        "the half-width of e's 95% interval and m the margin below which an effect counts as none (the dead "
        "band); a hypothesis of two tests is supported when both are and contradicted when either is")


# -- the guards --------------------------------------------------------------------------------------


def training_status(run):
    """Whether the run has trained enough for verdicts: it has left its learning-rate warm-up (its
    last logged step is at or past the warmup option; a run started from a checkpoint warms up again
    from its own step 0), trained on at least MIN_TOKENS tokens (tokens per step x steps, a
    checkpoint's steps counted too, at this run's tokens per step), and has MIN_WINDOW_STATS stats
    steps in the decision window. A measurement: measurement_status."""
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
    return {"enough": not reasons, "reasons": reasons, "tokens_per_step": run["tokens_per_step"],
            "steps_trained": trained, "init_steps": init_steps, "tokens": tokens, "min_tokens": MIN_TOKENS,
            "warmup": warmup, "last_step": last, "window_count": int(len(run["window"])),
            "min_window_count": MIN_WINDOW_STATS}


def measurement_status(run):
    """training_status of a measurement: the weights it measured trained on at least MIN_TOKENS
    tokens when their checkpoint records how many (one that does not, such as a pretrained model's,
    is taken as trained), and it measured at least MIN_WINDOW_STATS batches. The same keys, with
    tokens None when not recorded, warmup None, and measurement True."""
    measured = run["measurement"]
    tokens, batches = measured.get("tokens"), len(run["window"])
    reasons = []
    if tokens is not None and tokens < MIN_TOKENS:
        reasons.append(f"the weights measured had trained on {tokens:,} tokens ({measured['step']} steps), fewer than "
                       f"the {MIN_TOKENS:,} a verdict needs")
    if batches < MIN_WINDOW_STATS:
        reasons.append(f"{batches} batches measured, fewer than {MIN_WINDOW_STATS}")
    span = run["step_range"]
    return {"enough": not reasons, "reasons": reasons, "tokens_per_step": run["tokens_per_step"],
            "steps_trained": measured["step"], "init_steps": 0, "tokens": tokens, "min_tokens": MIN_TOKENS,
            "warmup": None, "last_step": span[1] if span else None, "window_count": batches,
            "min_window_count": MIN_WINDOW_STATS, "measurement": True}


# -- the rule ----------------------------------------------------------------------------------------


def decide(effect, half_width, margin):
    """(verdict, why) of one test by RULE."""
    if not (math.isfinite(effect) and math.isfinite(half_width)):
        return INCONCLUSIVE, "no data"
    if effect - half_width > margin:
        return SUPPORTED, "decided"
    if effect + half_width < -margin:
        return CONTRADICTED, "decided"
    return INCONCLUSIVE, "within the margin" if abs(effect) <= margin else "uncertain"


def make_test(name, effect, half_width, margin, uncertainty):
    """One test: its effect, interval, margin, what the uncertainty is, and its verdict."""
    verdict, why = decide(effect, half_width, margin)
    return {"name": name, "effect": effect, "half_width": half_width, "low": effect - half_width,
            "high": effect + half_width, "margin": margin, "uncertainty": uncertainty, "verdict": verdict, "why": why}


def combine(tests):
    """(verdict, why) of a hypothesis from its tests."""
    verdicts = [t["verdict"] for t in tests]
    if CONTRADICTED in verdicts:
        return CONTRADICTED, "decided"
    if all(v == SUPPORTED for v in verdicts):
        return SUPPORTED, "decided"
    whys = [t["why"] for t in tests if t["verdict"] == INCONCLUSIVE]
    return INCONCLUSIVE, "uncertain" if "uncertain" in whys else whys[0]


def window_text(run):
    steps, window = run["stats_steps"], run["window"]
    if is_measurement(run):
        return f"means over the {len(window)} measured batches"
    return f"means over the {len(window)} stats steps {steps[window[0]]}-{steps[window[-1]]}"


# -- the hypotheses -----------------------------------------------------------------------------------


def hypothesis_entropy_norm(run):
    """(a) A larger key norm goes with sharper (lower-entropy) attention, across independent units:
    the kv heads, each with the mean entropy of the query heads that read it."""
    result = {"id": "a", "title": "larger key norm, sharper attention",
              "claim": "across kv heads, k_norm and attn_entropy (the mean over the kv head's query heads) are "
                       "negatively correlated",
              "rule": f"e = -rho, Spearman's rho across kv heads of their decision-window means; u = the 95th "
                      f"percentile of |rho| over {PERMUTATIONS} random pairings (what chance alone reaches, "
                      f"seeded); m = {CORRELATION_MARGIN}. Also shown, not deciding: rho within layers (both "
                      "centred per layer, pairings shuffled within layers), and rho at each window step",
              "statistic": "spearman_rho_kv_heads"}
    reason = why_not(run, "k_norm", "attn_entropy")
    if reason:
        return dict(result, tests=[], detail=reason)
    w = run["window"]
    k_norm, entropy = values(run, "k_norm"), per_kv(run, values(run, "attn_entropy"))
    x, y = k_norm[w].mean(axis=0).ravel(), entropy[w].mean(axis=0).ravel()
    across = rank_correlation(x, y)
    within = rank_correlation(x, y, strata=np.repeat(np.arange(run["L"]), run["Hkv"]))
    steps = [rank_correlation(k_norm[i].ravel(), entropy[i].ravel(), permutations=0)["rho"] for i in w]
    within_test = make_test("-rho within layers", -within["rho"], within["chance"], CORRELATION_MARGIN, "chance level")
    result.update(n_units=len(x), value=across["rho"], p_value=across["p"], chance=across["chance"],
                  within={"rho": within["rho"], "p": within["p"], "chance": within["chance"], "n": within["n"],
                          "verdict": within_test["verdict"]},
                  per_step={"mean": float(np.mean(steps)), "min": float(np.min(steps)), "max": float(np.max(steps)),
                            "steps": len(steps)},
                  tests=[make_test("-rho across kv heads", -across["rho"], across["chance"], CORRELATION_MARGIN,
                              "chance level of |rho| under random pairings")])
    if not math.isfinite(across["rho"]):
        return dict(result, detail=f"{len(x)} kv heads: too few, or constant values")
    within_text = (f"within layers rho = {within['rho']:+.3f} (chance \u00b1{within['chance']:.3f}, "
                   f"{within_test['verdict']})" if math.isfinite(within["rho"]) else
                   "within layers: n/a (one kv head per layer)")
    return dict(result, detail=f"rho = {across['rho']:+.3f} across {len(x)} kv heads ({window_text(run)}; chance "
                               f"reaches \u00b1{across['chance']:.3f}, p = {across['p']:.3g}); {within_text}; "
                               f"at single {steps_text(run)} rho ranged {min(steps):+.2f} to {max(steps):+.2f}")


def hypothesis_hierarchy(run):
    """(b) Early layers dampen their keys below sqrt(D), the final layers amplify them above."""
    root = math.sqrt(run["D"])
    result = {"id": "b", "title": "dampened early keys, amplified final keys",
              "claim": f"the early group's k_norm is below sqrt(D) = {root:.2f}, where every key norm starts, and the "
                       "final group's is above it",
              "rule": f"two tests: e = (sqrt(D) - early) / sqrt(D) and e = (final - sqrt(D)) / sqrt(D), each group's "
                      f"mean k_norm over the decision window; u = the 95% t-interval of that mean over the window's "
                      f"stats steps, / sqrt(D); m = {RELATIVE_MARGIN:.0%}",
              "statistic": "group_k_norm"}
    reason = why_not(run, "k_norm")
    if not reason and set(run["groups"]["early"]) & set(run["groups"]["final"]):
        reason = f"{run['L']} layers: the early and final groups overlap"
    if reason:
        return dict(result, tests=[], detail=reason)
    curves = group_curves(run, values(run, "k_norm"))
    (early, e_half, _), (final, f_half, _) = (mean_interval(curves[g][run["window"]]) for g in ("early", "final"))
    tests = [make_test(name, effect / root, half / root, RELATIVE_MARGIN, "window t-interval") for name, effect, half
             in (("early dampening", root - early, e_half), ("final amplification", final - root, f_half))]
    return dict(result, early=early, final=final, sqrt_head_dim=root, value=[early, final], tests=tests,
                detail=f"early {early:.2f} \u00b1 {e_half:.3f} ({100 * (early / root - 1):+.1f}% from {root:.2f}, "
                       f"{tests[0]['verdict']}), final {final:.2f} \u00b1 {f_half:.3f} "
                       f"({100 * (final / root - 1):+.1f}%, {tests[1]['verdict']}); {window_text(run)}")


def hypothesis_axis_aligned(run):
    """(c) Outlier components: some kv heads put most of a key's energy into one dimension."""
    n_heads = run["L"] * run["Hkv"]
    result = {"id": "c", "title": "axis-aligned keys (outlier dimensions)",
              "claim": f"some kv heads are axis-aligned: k_maxabs^2 / k_norm^2 > {AXIS_THRESHOLD}",
              "rule": f"e = share / {AXIS_THRESHOLD} - 1 for the kv head with the largest decision-window mean share; "
                      f"u = the 95% t-interval of its mean over the window's stats steps, / {AXIS_THRESHOLD}; "
                      f"m = {RELATIVE_MARGIN:.0%}",
              "statistic": "largest_axis_share"}
    reason = why_not(run, "k_norm", "k_maxabs")
    if reason:
        return dict(result, tests=[], detail=reason)
    ratio = axis_ratio(run)
    means = ratio[run["window"]].mean(axis=0)
    top = np.unravel_index(np.argmax(means), means.shape)
    share, half, _ = mean_interval(ratio[run["window"], top[0], top[1]])
    aligned = np.argwhere(means > AXIS_THRESHOLD)
    t = make_test("largest axis share", share / AXIS_THRESHOLD - 1, half / AXIS_THRESHOLD, RELATIVE_MARGIN,
             "window t-interval")
    return dict(result, value=len(aligned), of=n_heads, first_step_count=int((ratio[0] > AXIS_THRESHOLD).sum()),
                heads=[[int(l), int(h)] for l, h in aligned], max_ratio=share,
                max_ratio_head=[int(top[0]), int(top[1])], tests=[t],
                detail=f"{len(aligned)} of {n_heads} kv heads above {AXIS_THRESHOLD} ({window_text(run)}); the "
                       f"largest share is {share:.3f} \u00b1 {half:.3f}, layer {top[0]} kv head {top[1]}")


def hypothesis_pr_falls(run):
    """(d) Dimensional collapse: the keys use fewer dimensions as training goes on."""
    result = {"id": "d", "title": "dimensional collapse",
              "claim": "the participation ratio k_pr falls during training",
              "rule": f"e = (first - window) / first, the relative fall of the mean k_pr over all layers and kv heads "
                      f"from the first stats step to the decision window's mean; u = the 95% t-interval of that "
                      f"mean over the window's stats steps, / first; m = {RELATIVE_MARGIN:.0%}. Shown beside it: "
                      "k_erank and k_erank_centered (a fall of k_erank alone is an offset shared by the keys, "
                      "not fewer directions)",
              "statistic": "relative_fall_k_pr"}
    reason = why_not(run, "k_pr")
    if reason:
        return dict(result, tests=[], detail=reason)
    w = run["window"]
    pr = values(run, "k_pr").mean(axis=(1, 2))
    first, (last, half, _) = float(pr[0]), mean_interval(pr[w])
    t = make_test("relative fall of k_pr", (first - last) / first, half / first, RELATIVE_MARGIN, "window t-interval")
    extra, more = {}, ""
    for name in ("k_erank", "k_erank_centered", "k_mean_share"):
        if has(run, name):
            curve = values(run, name).mean(axis=(1, 2))
            extra[name.replace("k_", "", 1)] = {"first": float(curve[0]), "last": float(curve[w].mean())}
            more += f"; {name} {curve[0]:.3g} \u2192 {curve[w].mean():.3g}"
    if "erank" in extra and "erank_centered" in extra:
        more += ": " + offset_or_collapse(*([d["first"], d["last"]] for d in (extra["erank"], extra["erank_centered"])))
    return dict(result, first=first, last=last, value=[first, last], first_step=int(run["stats_steps"][0]),
                tests=[t], **extra,
                detail=f"{first:.2f} at step {run['stats_steps'][0]}, {last:.2f} \u00b1 {half:.2f} "
                       f"({100 * (last - first) / first:+.1f}%; {window_text(run)}){more}")


def hypotheses(run, training):
    """The four hypotheses, each with its verdict; all inconclusive when the run trained too little.
    Of a measurement, those of OVER_TRAINING are not applicable: no tests, no verdict."""
    out = []
    for check in (hypothesis_entropy_norm, hypothesis_hierarchy, hypothesis_axis_aligned, hypothesis_pr_falls):
        h = check(run)
        if is_measurement(run) and h["id"] in OVER_TRAINING:  # what it is, without the numbers of one state
            h = {key: h[key] for key in ("id", "title", "claim", "rule", "statistic")}
            h.update(verdict=NOT_APPLICABLE, why=NOT_APPLICABLE, tests=[],
                     detail=f"not applicable to a measurement: {OVER_TRAINING[h['id']]}")
        elif not h["tests"]:
            h.update(verdict=INCONCLUSIVE, why="no data")
        elif not training["enough"]:
            for t in h["tests"]:
                t.update(verdict=INCONCLUSIVE, why="too little training")
            h.update(verdict=INCONCLUSIVE, why="too little training",
                     detail=f"too little training ({'; '.join(training['reasons'])}); the numbers: {h['detail']}")
        else:
            h["verdict"], h["why"] = combine(h["tests"])
        out.append(h)
    return out


# -- the head taxonomy ------------------------------------------------------------------------------------


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


def taxonomy(run, training):
    """Every query head classified by taxonomy_rules on its decision-window means; none for a run
    that trained too little (its heads would be classified by their initialisation)."""
    reason = why_not(run, "k_norm", "k_maxabs", "attn_entropy", "attn_sink")
    if reason is None and run["seq_len"] < 1:
        reason = "the header gives no sequence length"
    if reason is None and not training["enough"]:
        reason = ("too little training (" + "; ".join(training["reasons"]) + "): the heads would be sorted by "
                  "what their initialisation gives them")
    rules = taxonomy_rules(run)
    if reason:
        return {"available": False, "reason": reason, "rules": rules}
    w, kv = run["window"], kv_of_query(run)
    h_uniform = uniform_entropy(run["seq_len"])
    focus, amplified = FOCUS_FRACTION * h_uniform, (1 + NORM_MARGIN) * math.sqrt(run["D"])
    k_norm, axis = values(run, "k_norm@q")[w].mean(axis=0), axis_ratio(run)[w].mean(axis=0)[:, kv]
    entropy, sink = values(run, "attn_entropy")[w].mean(axis=0), values(run, "attn_sink")[w].mean(axis=0)
    heads = []
    for layer in range(run["L"]):
        for h in range(run["H"]):
            cls = classify(sink[layer, h], entropy[layer, h], k_norm[layer, h], axis[layer, h], amplified, focus)
            heads.append({"layer": layer, "head": h, "kv_head": int(kv[h]), "class": cls,
                          "k_norm": float(k_norm[layer, h]), "attn_entropy": float(entropy[layer, h]),
                          "entropy_fraction": float(entropy[layer, h] / h_uniform),
                          "attn_sink": float(sink[layer, h]), "axis_ratio": float(axis[layer, h])})
    counts = {cls: sum(h["class"] == cls for h in heads) for cls in rules}
    steps = run["stats_steps"]
    return {"available": True, "window": [int(steps[w[0]]), int(steps[w[-1]])], "step": int(steps[w[-1]]),
            "rules": rules, "counts": counts, "uniform_entropy": h_uniform, "focus_entropy": focus,
            "amplified_k_norm": amplified, "seq_len": run["seq_len"], "heads": heads}


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
           "left_out": left_out, "hypotheses": {}}
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
