"""The figures of scripts/report.py. Each function draws one PNG from plain numpy arrays and knows
nothing about the run log: analysis.py measures, report.py chooses what to show, this module draws.

Colours follow the research reports on key norms: early layers blue, middle green, final red. Each
group also gets its own line style, so the figures still read in greyscale.
"""
import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

GROUP_STYLE = {"early": ("#1f77b4", "-"), "middle": ("#2ca02c", "--"), "final": ("#d62728", "-.")}
PHASE_STYLE = [("#1f77b4", "o"), ("#ff7f0e", "s"), ("#d62728", "^")]  # early, mid, late training
RUN_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
DPI = 110
STEP_LABEL = "training step"

plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.titlesize": 13,
                     "axes.grid": True, "grid.alpha": 0.3})


def layer_span(layers):
    """[0, 1] -> 'layers 0-1', [3] -> 'layer 3'."""
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"


def _save(fig, path):
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _reference_line(ax, value, label):
    ax.axhline(value, color="0.35", linestyle=":", linewidth=1.5, label=label)
    _honest_limits(ax, value, "y")


def _honest_limits(ax, ref, axis, margin=0.05):
    """Widens an axis to at least ref +- 5%: a drift of a fraction of a percent must not fill the
    whole plot and look like a big change."""
    get, set_ = (ax.get_ylim, ax.set_ylim) if axis == "y" else (ax.get_xlim, ax.set_xlim)
    low, high = get()
    set_(min(low, ref * (1 - margin)), max(high, ref * (1 + margin)))


def _group_lines(ax, steps, curves, groups):
    """One line per layer group; markers only when there are few points to see."""
    marker = "o" if len(steps) <= 30 else None
    for name, curve in curves.items():
        colour, style = GROUP_STYLE[name]
        ax.plot(steps, curve, color=colour, linestyle=style, marker=marker, markersize=3.5,
                linewidth=1.8, label=f"{name} ({layer_span(groups[name])})")


def group_panels(path, title, steps, panels, groups):
    """Line plots of layer-group curves over training steps, one panel per entry of panels:
    (panel title, y label, {group: curve [S]}, reference value or None, reference label)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), constrained_layout=True,
                             squeeze=False)
    for ax, (subtitle, ylabel, curves, ref, ref_label) in zip(axes[0], panels):
        _group_lines(ax, steps, curves, groups)
        if ref is not None:
            _reference_line(ax, ref, ref_label)
        ax.set_title(subtitle)
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=9)
    fig.suptitle(title)
    _save(fig, path)


def layer_profile(path, title, per_layer, per_head, groups, ref, ref_label, ylabel):
    """Bars that grow from the reference value ref up or down to each layer's value (coloured by
    the layer's group, grey outside the groups); dots: the single key/value heads of each layer."""
    n_layer = len(per_layer)
    colour = ["0.65"] * n_layer
    for name in ("early", "middle", "final"):  # later groups win where small models overlap
        for layer in groups[name]:
            colour[layer] = GROUP_STYLE[name][0]
    fig, ax = plt.subplots(figsize=(max(7.5, 0.42 * n_layer + 4.5), 4.6), constrained_layout=True)
    x = np.arange(n_layer)
    ax.bar(x, per_layer - ref, bottom=ref, color=colour, edgecolor="black", linewidth=0.5, zorder=2)
    heads = per_head.shape[1]
    if heads > 1:
        jitter = (np.arange(heads) - (heads - 1) / 2) * min(0.5 / heads, 0.12)
        ax.scatter((x[:, None] + jitter[None, :]).ravel(), per_head.ravel(), s=14, color="black",
                   zorder=3, label="single key/value head")
    ax.axhline(ref, color="0.2", linestyle=":", linewidth=1.5, label=ref_label)
    # The legend explains the colours: one patch per group, drawn empty.
    for name in ("early", "middle", "final"):
        if GROUP_STYLE[name][0] in colour:
            ax.bar([0], [0], bottom=ref, color=GROUP_STYLE[name][0], label=f"{name} ({layer_span(groups[name])})")
    if "0.65" in colour:
        ax.bar([0], [0], bottom=ref, color="0.65", label="other layers")
    low, high = min(per_head.min(), ref), max(per_head.max(), ref)
    pad = 0.08 * (high - low) + 1e-9
    ax.set_ylim(low - pad, high + pad)
    _honest_limits(ax, ref, "y")
    ax.set_xticks(x)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    _save(fig, path)


def heads_over_steps(path, title, steps, values, ref, ref_label, ylabel, head_label="kv head"):
    """One line per head: values [S, heads]."""
    fig, ax = plt.subplots(figsize=(8, 4.8), constrained_layout=True)
    heads = values.shape[1]
    colours = plt.get_cmap("tab10" if heads <= 10 else "tab20")
    marker = "o" if len(steps) <= 30 else None
    for h in range(heads):
        ax.plot(steps, values[:, h], color=colours(h % colours.N), marker=marker, markersize=3,
                linewidth=1.6, label=f"{head_label} {h}")
    _reference_line(ax, ref, ref_label)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=9, ncol=1 if heads <= 8 else 2, loc="best")
    _save(fig, path)


def phase_scatter(path, title, phases, last, xlabel, ylabel, ref=None, ref_label=None):
    """Points coloured by training phase: phases is a list of (label, x, y); last (label, x, y)
    are the points of the last step, drawn on top with a black edge."""
    fig, ax = plt.subplots(figsize=(8, 5.6), constrained_layout=True)
    for (label, x, y), (colour, marker) in zip(phases, PHASE_STYLE):
        ax.scatter(x, y, s=22, color=colour, marker=marker, alpha=0.55, linewidths=0, label=label)
    label, x, y = last
    ax.scatter(x, y, s=46, facecolors="none", edgecolors="black", linewidths=1.1, label=label)
    if ref is not None:
        ax.axvline(ref, color="0.35", linestyle=":", linewidth=1.5, label=ref_label)
        _honest_limits(ax, ref, "x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=9, loc="best")
    _save(fig, path)


def _edges(values):
    """Cell edges for pcolormesh around sorted centres (training steps need not be evenly spaced)."""
    values = np.asarray(values, float)
    if len(values) == 1:
        return np.array([values[0] - 0.5, values[0] + 0.5])
    mids = (values[1:] + values[:-1]) / 2
    return np.concatenate([[2 * values[0] - mids[0]], mids, [2 * values[-1] - mids[-1]]])


def _gain_norm(*arrays):
    """A diverging colour scale centred on 1, the gain's initial value: red amplifies, blue dampens."""
    low = min(float(np.min(a)) for a in arrays)
    high = max(float(np.max(a)) for a in arrays)
    reach = max(1 - low, high - 1, 0.05)  # at least +-5%, so that noise does not look saturated
    return TwoSlopeNorm(vcenter=1.0, vmin=1 - reach, vmax=1 + reach)


def gain_heatmaps(path, title, steps, layer_gains, layer, final_gains, final_step):
    """Left: one layer's gain vector over steps (dimension x step); right: every layer's gain at
    the last step (layer x dimension)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1, 1.25]})
    norm = _gain_norm(layer_gains, final_gains)
    dims = np.arange(layer_gains.shape[1])
    left.pcolormesh(_edges(steps), _edges(dims), layer_gains.T, cmap="RdBu_r", norm=norm, shading="flat")
    left.set_xlabel(STEP_LABEL)
    left.set_ylabel("dimension of the head")
    left.set_title(f"layer {layer}: g_k over training")
    left.grid(False)
    mesh = right.pcolormesh(_edges(dims), _edges(np.arange(final_gains.shape[0])), final_gains,
                            cmap="RdBu_r", norm=norm, shading="flat")
    right.set_xlabel("dimension of the head")
    right.set_ylabel("layer")
    right.set_yticks(np.arange(final_gains.shape[0]))
    right.invert_yaxis()
    right.set_title(f"every layer's g_k at step {final_step}")
    right.grid(False)
    fig.colorbar(mesh, ax=right, label="gain g_k (1 = initial value)")
    fig.suptitle(title)
    _save(fig, path)


def _annotated_heatmap(fig, ax, values, cmap, vmin, vmax, colour_label, fmt="{:.2f}"):
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    rows, cols = values.shape
    if rows * cols <= 200:  # numbers only while the cells are big enough to hold them
        for r in range(rows):
            for c in range(cols):
                shade = (values[r, c] - vmin) / (vmax - vmin or 1)
                ax.text(c, r, fmt.format(values[r, c]), ha="center", va="center", fontsize=8,
                        color="white" if shade > 0.6 else "black")
    ax.set_xticks(np.arange(cols))
    ax.set_yticks(np.arange(rows))
    ax.grid(False)
    fig.colorbar(image, ax=ax, label=colour_label)


def sink_figure(path, title, steps, rate, last_sink, last_step, threshold):
    """Left: the fraction of query heads above the sink threshold over steps; right: attn_sink of
    every layer and query head at the last step."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1.2, 1]})
    left.plot(steps, 100 * rate, color="black", marker="o" if len(steps) <= 30 else None, markersize=3.5)
    left.set_ylim(-3, 103)
    left.set_xlabel(STEP_LABEL)
    left.set_ylabel(f"query heads with attn_sink > {threshold} (%)")
    left.set_title("sink rate")
    _annotated_heatmap(fig, right, last_sink, "magma_r", 0.0, 1.0, "attention mass on position 0")
    right.set_xlabel("query head")
    right.set_ylabel("layer")
    right.set_title(f"attn_sink at step {last_step}")
    fig.suptitle(title)
    _save(fig, path)


def loss_figure(path, title, steps, loss, val_steps, val_loss):
    fig, ax = plt.subplots(figsize=(8, 4.6), constrained_layout=True)
    ax.plot(steps, loss, color="#1f77b4", alpha=0.35, linewidth=1, label="training loss (each step)")
    if len(loss) >= 20:  # a moving average shows the trend through the batch-to-batch noise
        width = max(5, len(loss) // 25)
        smooth = np.convolve(loss, np.ones(width) / width, mode="valid")
        ax.plot(steps[width - 1:], smooth, color="#1f77b4", linewidth=2,
                label=f"training loss ({width}-step mean)")
    if len(val_loss):
        ax.plot(val_steps, val_loss, color="#d62728", marker="o", markersize=6, linewidth=1.8,
                label="validation loss")
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title)
    ax.legend(fontsize=9)
    _save(fig, path)


def compare_figure(path, title, ylabel, runs, ref=None, ref_label=None):
    """One panel per layer group, one line per run: runs is a list of (label, steps, {group: curve})."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True, sharey=True)
    for ax, group in zip(axes, ("early", "middle", "final")):
        for i, (label, steps, curves) in enumerate(runs):
            if group in curves:
                ax.plot(steps, curves[group], color=RUN_COLOURS[i % len(RUN_COLOURS)], linewidth=1.8,
                        marker="o" if len(steps) <= 30 else None, markersize=3, label=label)
        if ref is not None:
            _reference_line(ax, ref, ref_label)
        ax.set_title(f"{group} layers")
        ax.set_xlabel(STEP_LABEL)
        ax.legend(fontsize=9)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    _save(fig, path)
