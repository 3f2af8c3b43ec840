"""The figures of the report (attnlog.report). Each function draws one PNG from plain numpy arrays
and knows nothing about the run log: attnlog.analysis measures, attnlog.run_figures chooses what to
show and writes the captions, this module draws.

Colours follow the research reports on key norms: early layers blue, middle green, final red. Each
group also gets its own line style, so the figures still read in greyscale. Points of single layers
run from light (layer 0) to dark (the last layer). STEP_LABEL names the x axis of every figure over
training (run_figures sets it for a run started from a checkpoint).
"""
import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.colors import BoundaryNorm, Normalize, TwoSlopeNorm  # noqa: E402

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


def group_panels(path, title, steps, panels, groups, same_scale=()):
    """Line plots of layer-group curves over training steps, one panel per entry of panels:
    (panel title, y label, {group: curve [S]}, reference value or None, reference label). The
    panels whose indices are in same_scale get one y range, so that they compare at a glance."""
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.2, 5.4 * len(panels)), 4.6), constrained_layout=True,
                             squeeze=False)
    for ax, (subtitle, ylabel, curves, ref, ref_label) in zip(axes[0], panels):
        _group_lines(ax, steps, curves, groups)
        if ref is not None:
            _reference_line(ax, ref, ref_label)
        ax.set_title(subtitle)
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=9)
    _same_limits([axes[0][i] for i in same_scale])
    fig.suptitle(title)
    _save(fig, path)


def _same_limits(axes, axis="y"):
    """One range for all these axes: the union of theirs."""
    if len(axes) < 2:
        return
    get = (lambda a: a.get_ylim()) if axis == "y" else (lambda a: a.get_xlim())
    low, high = min(get(a)[0] for a in axes), max(get(a)[1] for a in axes)
    for a in axes:
        (a.set_ylim if axis == "y" else a.set_xlim)(low, high)


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


def phase_scatter(path, title, phases, last, xlabel, ylabel, ref=None, ref_label=None, ref_y=None, ref_y_label=None):
    """Points coloured by training phase: phases is a list of (label, x, y); last (label, x, y)
    are the points of the last step, drawn on top with a black edge. ref, ref_y: reference values
    marked on the x and y axes."""
    fig, ax = plt.subplots(figsize=(8, 5.6), constrained_layout=True)
    for (label, x, y), (colour, marker) in zip(phases, PHASE_STYLE):
        ax.scatter(x, y, s=22, color=colour, marker=marker, alpha=0.55, linewidths=0, label=label)
    label, x, y = last
    ax.scatter(x, y, s=46, facecolors="none", edgecolors="black", linewidths=1.1, label=label)
    _references(ax, ref, ref_label, ref_y, ref_y_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=9, loc="best")
    _save(fig, path)


def _references(ax, ref_x, label_x, ref_y, label_y):
    if ref_x is not None:
        ax.axvline(ref_x, color="0.35", linestyle=":", linewidth=1.5, label=label_x)
        _honest_limits(ax, ref_x, "x")
    if ref_y is not None:
        ax.axhline(ref_y, color="0.35", linestyle="--", linewidth=1.2, label=label_y)


def _layer_colours(n_layer):
    """A colour per layer, light (first layer) to dark (last), and the matching colour bar's norm."""
    cmap = plt.get_cmap("viridis_r", n_layer)
    return cmap, BoundaryNorm(np.arange(n_layer + 1) - 0.5, n_layer)


def _grey_legend(ax, **kwargs):
    """A legend whose markers are grey: the points it names take their colours from the layer."""
    legend = ax.legend(**kwargs)
    for handle in getattr(legend, "legend_handles", None) or legend.legendHandles:
        if isinstance(handle, PathCollection):  # the points; lines keep their colours
            handle.set_facecolor("0.6")
    return legend


def _layer_colourbar(fig, ax, n_layer):
    cmap, norm = _layer_colours(n_layer)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer")
    bar.set_ticks(np.arange(n_layer) if n_layer <= 24 else np.arange(0, n_layer, max(1, n_layer // 12)))
    return cmap


def layer_scatter(path, title, points, faint, n_layer, xlabel, ylabel, refs=(None, None, None, None),
                  diagonal=False):
    """Points coloured by layer: points (x, y, layer, legend label) drawn large; faint (the same) or
    None drawn small and pale beneath them. refs: (x reference, its label, y reference, its label).
    diagonal: the line y = x."""
    fig, ax = plt.subplots(figsize=(8.4, 5.8), constrained_layout=True)
    cmap = _layer_colourbar(fig, ax, n_layer)
    if faint is not None:
        x, y, layer, label = faint
        ax.scatter(x, y, s=14, color=cmap(np.asarray(layer)), alpha=0.4, linewidths=0, label=label)
    x, y, layer, label = points
    ax.scatter(x, y, s=60, color=cmap(np.asarray(layer)), edgecolors="black", linewidths=0.7, zorder=3, label=label)
    if diagonal:
        low, high = min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])
        ax.plot([low, high], [low, high], color="0.35", linestyle=":", linewidth=1.5, label="y = x")
    _references(ax, *refs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _grey_legend(ax, fontsize=9, loc="best")
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
                red, green, blue, _ = image.cmap(image.norm(values[r, c]))
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # the cell's luminance
                ax.text(c, r, fmt.format(values[r, c]), ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
    ax.set_xticks(np.arange(cols))
    ax.set_yticks(np.arange(rows))
    ax.grid(False)
    return fig.colorbar(image, ax=ax, label=colour_label)


def lines_and_heatmap(path, title, steps, left, right):
    """Left: curves over training; right: an annotated heatmap. left: (panel title, y label, {label:
    curve [S]} drawn in black (up to four, each its own line style) or, for layer groups, in the
    groups' styles, groups or None, y limits or None, reference value or None, its label). right:
    (panel title, values [rows, cols], x label, colour map, vmin, vmax, colour bar label, reference
    on the colour bar or None, number format)."""
    subtitle, ylabel, curves, groups, ylim, ref, ref_label = left
    fig, (ax, heat) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True,
                                   gridspec_kw={"width_ratios": [1.2, 1]})
    if groups is not None:
        _group_lines(ax, steps, curves, groups)
    else:
        for (label, curve), style in zip(curves.items(), ("-", "--", ":", "-.")):
            ax.plot(steps, curve, color="black", linestyle=style, marker="o" if len(steps) <= 30 else None,
                    markersize=3.5, label=label)
    if ref is not None:
        _reference_line(ax, ref, ref_label)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(subtitle)
    ax.legend(fontsize=9)
    subtitle, table, xlabel, cmap, vmin, vmax, bar_label, bar_ref, fmt = right
    bar = _annotated_heatmap(fig, heat, table, cmap, vmin, vmax, bar_label, fmt)
    if bar_ref is not None:
        bar.ax.axhline(bar_ref, color="#00a0ff", linewidth=2.5)
    heat.set_xlabel(xlabel)
    heat.set_ylabel("layer")
    heat.set_title(subtitle)
    fig.suptitle(title)
    _save(fig, path)


def layer_heatmaps(path, title, steps, panels):
    """One panel per entry, each a layer x step heatmap: (panel title, values [S, L], colour bar label,
    colour map, vmin, vmax, centre (a diverging scale centred there) or None, reference value marked
    on the colour bar or None)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.8), constrained_layout=True,
                             squeeze=False)
    for ax, (subtitle, table, bar_label, cmap, vmin, vmax, centre, ref) in zip(axes[0], panels):
        norm = TwoSlopeNorm(vcenter=centre, vmin=vmin, vmax=vmax) if centre is not None else Normalize(vmin, vmax)
        mesh = ax.pcolormesh(_edges(steps), _edges(np.arange(table.shape[1])), table.T, cmap=cmap, norm=norm,
                             shading="flat")
        bar = fig.colorbar(mesh, ax=ax, label=bar_label)
        if ref is not None:
            bar.ax.axhline(ref, color="#00a0ff" if centre is None else "black", linewidth=2.5)
        ax.set_yticks(np.arange(table.shape[1]) if table.shape[1] <= 24 else
                      np.arange(0, table.shape[1], max(1, table.shape[1] // 12)))
        ax.invert_yaxis()
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel("layer")
        ax.set_title(subtitle)
        ax.grid(False)
    fig.suptitle(title)
    _save(fig, path)


def logit_figure(path, title, steps, observed, ceiling, groups, points, n_layer):
    """Left: each layer group's largest logit (solid) and its ceiling estimate (dotted, same colour)
    over training; right: (x ceiling, y observed, layer, label) per query head, coloured by layer,
    with the line y = x."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5), constrained_layout=True)
    _group_lines(left, steps, observed, groups)
    for name, curve in ceiling.items():
        left.plot(steps, curve, color=GROUP_STYLE[name][0], linestyle=":", linewidth=1.6)
    left.plot([], [], color="0.3", linestyle=":", label="dotted: ceiling estimate")
    left.set_xlabel(STEP_LABEL)
    left.set_ylabel("logit q . k / sqrt(D)")
    left.set_title("largest logit (solid) and mean ||q|| ||k|| / sqrt(D) (dotted)")
    left.legend(fontsize=9)
    cmap = _layer_colourbar(fig, right, n_layer)
    x, y, layer, label = points
    right.scatter(x, y, s=46, color=cmap(np.asarray(layer)), edgecolors="black", linewidths=0.6, label=label)
    low, high = min(right.get_xlim()[0], right.get_ylim()[0]), max(right.get_xlim()[1], right.get_ylim()[1])
    right.plot([low, high], [low, high], color="0.35", linestyle=":", linewidth=1.5, label="y = x: at the ceiling")
    right.set_xlabel("ceiling estimate, mean ||q|| x mean ||k|| / sqrt(D)")
    right.set_ylabel("largest logit attn_logit_max")
    right.set_title("each query head")
    _grey_legend(right, fontsize=9, loc="upper left")
    fig.suptitle(title)
    _save(fig, path)


def gain_figure(path, title, steps, final_q, final_k, final_step, rms, groups):
    """Top: every layer's g_q and g_k at the last step (layer x dimension, one colour scale centred
    on 1); bottom: the RMS gain of each layer group over training, for q and for k on one scale.
    rms: {"q": {group: [S]}, "k": {group: [S]}}."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.6), constrained_layout=True)
    norm = _gain_norm(final_q, final_k)
    for ax, gains, name in zip(axes[0], (final_q, final_k), ("g_q", "g_k")):
        mesh = ax.pcolormesh(_edges(np.arange(gains.shape[1])), _edges(np.arange(gains.shape[0])), gains,
                             cmap="RdBu_r", norm=norm, shading="flat")
        ax.set_xlabel("dimension of the head")
        ax.set_ylabel("layer")
        ax.invert_yaxis()
        ax.set_title(f"{name} at step {final_step}")
        ax.grid(False)
    fig.colorbar(mesh, ax=axes[0].tolist(), label="gain (1 = initial value)")
    for ax, name in zip(axes[1], ("q", "k")):
        _group_lines(ax, steps, rms[name], groups)
        _reference_line(ax, 1.0, "1, the initial gain")
        ax.set_xlabel(STEP_LABEL)
        ax.set_ylabel(f"RMS of g_{name} over dimensions")
        ax.set_title(f"g_{name}: RMS gain by layer group")
        ax.legend(fontsize=9)
    _same_limits(list(axes[1]))
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
