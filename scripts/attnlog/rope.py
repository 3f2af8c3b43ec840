"""The q and k gains against the RoPE frequency of each dimension. RoPE here turns the pair of
dimensions (i, i + D/2), i < D/2, by the angle t * theta^(-2i/D) at position t (docs/model.md,
rotate-half), so the pair completes a turn every 2 pi theta^(2i/D) positions: its wavelength. A pair
whose wavelength is shorter than the training context turns within the rows the model sees; a longer
one never completes a turn there. Needs numpy.
"""
import math

import numpy as np

from attnlog.analysis import has, values


def wavelengths(head_dim, theta):
    """[D]: the wavelength, in positions, of the RoPE pair each dimension belongs to."""
    pair = np.arange(head_dim) % (head_dim // 2)
    return 2 * math.pi * theta ** (2 * pair / head_dim)


def rope_theta(run):
    """The model's RoPE base from the header's configuration, or None."""
    try:
        theta = float(run["config"]["rope_theta"])
    except (KeyError, TypeError, ValueError):
        return None
    return theta if theta > 1 else None


def why_no_rope_gains(run):
    """Why the gains cannot be set against RoPE wavelengths, or None when they can."""
    if not has(run, "g_q", "g_k"):
        return "the log has no g_q or g_k"
    if rope_theta(run) is None:
        return "the header gives no rope_theta"
    if run["seq_len"] < 1:
        return "the header gives no sequence length"
    return None


def split_means(gains, short):
    """Per layer, the mean gain of the dimensions with short (True) and with long wavelengths:
    ([L] or None, [L] or None), None where no dimension is of that kind."""
    return tuple(gains[:, pick].mean(axis=1) if pick.any() else None for pick in (short, ~short))


def rope_gains(run):
    """The gains of the last stats step split by wavelength against the training context T:
    {"available", "reason" (when not), "theta", "context", "step", "wavelength" [D], "short_dims",
    "long_dims" (dimension counts), and for "q" and "k": {"layers": {"short": [L], "long": [L]},
    "groups": {group: {"short", "long"}}}}, a mean gain of the dimensions whose pair's wavelength is
    below T (short) and of those at or above it (long); null where there are none."""
    reason = why_no_rope_gains(run)
    if reason:
        return {"available": False, "reason": reason}
    wave = wavelengths(run["D"], rope_theta(run))
    short = wave < run["seq_len"]
    out = {"available": True, "theta": rope_theta(run), "context": run["seq_len"],
           "step": int(run["stats_steps"][-1]), "wavelength": wave.tolist(), "short_dims": int(short.sum()),
           "long_dims": int((~short).sum())}
    for name in ("q", "k"):
        by_layer = dict(zip(("short", "long"), split_means(values(run, f"g_{name}")[-1], short)))
        groups = {g: {kind: None if v is None else float(v[layers].mean()) for kind, v in by_layer.items()}
                  for g, layers in run["groups"].items()}
        out[name] = {"layers": {kind: None if v is None else v.tolist() for kind, v in by_layer.items()},
                     "groups": groups}
    return out
