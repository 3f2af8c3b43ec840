"""The figures of the report (attnlog.report). Each function draws one PNG from plain numpy arrays
and knows nothing about the run log: attnlog.analysis measures, attnlog.run_figures chooses what to
show and writes the captions, this module draws.

Colours follow the research reports on key norms: early layers blue, middle green, final red. Each
group also gets its own line style, so the figures still read in greyscale. Points of single layers
take the colour and marker of their band of consecutive layers (at most 8 bands, so that neighbours
of a deep model are told apart by colour, not by a shade). STEP_LABEL names the x axis of every
figure over training (run_figures sets it for a run started from a checkpoint); that axis has whole
steps only. Legends that could cover points stand beside the plot.
"""
import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import Normalize, TwoSlopeNorm  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

GROUP_STYLE = {"early": ("#1f77b4", "-"), "middle": ("#2ca02c", "--"), "final": ("#d62728", "-.")}
PHASE_STYLE = [("#1f77b4", "o"), ("#ff7f0e", "s"), ("#d62728", "^")]  # early, mid, late training
RUN_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
BAND_STYLE = [("#1f77b4", "o"), ("#ff7f0e", "s"), ("#2ca02c", "^"), ("#d62728", "D"), ("#9467bd", "v"),
              ("#8c564b", "P"), ("#e377c2", "X"), ("#17becf", "*")]  # one per band of layers
FEW_STEPS = 30  # curves of this many points or fewer mark each point
DPI = 110
STEP_LABEL = "training step"

plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.titlesize": 13,
                     "axes.grid": True, "grid.alpha": 0.3})


def layer_span(layers):
    """[0, 1] -> 'layers 0-1', [3] -> 'layer 3'."""
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"


def _step_axis(ax, steps):
    """The x axis of a figure over training: whole steps only, and a single step as one tick (not
    fractions of a step around it)."""
    ax.set_xlabel(STEP_LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(np.unique(steps)) == 1:
        ax.set_xticks([steps[0]])


def _layer_ticks(ax, n_layer, axis="y"):
    """Every layer a tick of its own (every few for a deep model): whole layers, never 2.5."""
    ticks = np.arange(n_layer) if n_layer <= 24 else np.arange(0, n_layer, max(1, n_layer // 12))
    (ax.set_yticks if axis == "y" else ax.set_xticks)(ticks)


def _outside_legend(ax, **kwargs):
    """A legend beside the plot, where it cannot cover a point."""
    return ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kwargs)


def _shared_legend(axes):
    """One legend beside the last of these panels, naming what any of them draws (once each)."""
    named = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            named.setdefault(label, handle)
    return axes[-1].legend(named.values(), named.keys(), fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                           borderaxespad=0)


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
    marker = "o" if len(steps) <= FEW_STEPS else None
    for name, curve in curves.items():
        colour, style = GROUP_STYLE[name]
        ax.plot(steps, curve, color=colour, linestyle=style, marker=marker, markersize=3.5,
                linewidth=1.8, label=f"{name} ({layer_span(groups[name])})")


def group_panels(path, title, steps, panels, groups, same_scale=()):
    """Line plots of layer-group curves over training steps, one panel per entry of panels:
    (panel title, y label, {group: curve [S]}, reference value or None, reference label). The
    panels whose indices are in same_scale get one y range, so that they compare at a glance."""
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.2, 5.4 * len(panels)) + 2.6, 4.6), constrained_layout=True,
                             squeeze=False)
    for ax, (subtitle, ylabel, curves, ref, ref_label) in zip(axes[0], panels):
        _group_lines(ax, steps, curves, groups)
        if ref is not None:
            _reference_line(ax, ref, ref_label)
        ax.set_title(subtitle)
        _step_axis(ax, steps)
        ax.set_ylabel(ylabel)
    _shared_legend(axes[0])
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
    _outside_legend(ax)
    ax.set_title(title)
    _save(fig, path)


def profile_panels(path, title, panels):
    """Small panels, one per statistic, each its value by layer: panels is a list of (statistic's
    name, per_head [L, cols] drawn as dots, per_layer [L] drawn as a line, half [L] the half-width of
    a band around the line or None, reference value or None, its label)."""
    ncols = min(4, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.3 * ncols + 2.5, 3.4 * nrows), constrained_layout=True,
                             squeeze=False)
    for ax, (name, per_head, per_layer, half, ref, ref_label) in zip(axes.flat, panels):
        layers = np.arange(len(per_layer))
        ax.scatter(np.repeat(layers, per_head.shape[1]), per_head.ravel(), s=12, color="0.6", zorder=2,
                   label="single heads")
        ax.plot(layers, per_layer, color="black", marker="o", markersize=3.5, linewidth=1.6, zorder=3,
                label="mean over the layer's heads")
        if half is not None:
            ax.fill_between(layers, per_layer - half, per_layer + half, color="#1f77b4", alpha=0.3, linewidth=0,
                            zorder=1, label="its 95% interval")
        if ref is not None:
            _reference_line(ax, ref, "dotted: the reference in the title")
        ax.set_title(name if ref is None else f"{name} (dotted: {ref_label})")
        ax.set_xlabel("layer")
        _layer_ticks(ax, len(layers), "x")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    _shared_legend(list(axes.flat[:len(panels)]))
    fig.suptitle(title)
    _save(fig, path)


def head_maps(path, title, panels):
    """Annotated layer x head heatmaps side by side: panels is a list of (panel title, values [L, cols],
    x label, colour map, vmin, vmax, colour bar label, reference marked on the colour bar or None)."""
    layers = max(table.shape[0] for _, table, *_ in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), max(4.2, 1.6 + 0.32 * layers)),
                             constrained_layout=True, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        _layer_heatmap(fig, ax, *panel)
    fig.suptitle(title)
    _save(fig, path)


def heads_over_steps(path, title, steps, values, ref, ref_label, ylabel, head_label="kv head"):
    """One line per head: values [S, heads]."""
    fig, ax = plt.subplots(figsize=(9.6, 4.8), constrained_layout=True)
    heads = values.shape[1]
    colours = plt.get_cmap("tab10" if heads <= 10 else "tab20")
    marker = "o" if len(steps) <= FEW_STEPS else None
    for h in range(heads):
        ax.plot(steps, values[:, h], color=colours(h % colours.N), marker=marker, markersize=3,
                linewidth=1.6, label=f"{head_label} {h}")
    _reference_line(ax, ref, ref_label)
    _step_axis(ax, steps)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _outside_legend(ax, ncol=1 if heads <= 8 else 2)
    _save(fig, path)


def phase_scatter(path, title, phases, last, xlabel, ylabel, ref=None, ref_label=None, ref_y=None, ref_y_label=None):
    """Points coloured by training phase: phases is a list of (label, x, y); last (label, x, y)
    are the points of the last step, drawn on top with a black edge. ref, ref_y: reference values
    marked on the x and y axes."""
    fig, ax = plt.subplots(figsize=(10, 5.6), constrained_layout=True)
    for (label, x, y), (colour, marker) in zip(phases, PHASE_STYLE):
        ax.scatter(x, y, s=22, color=colour, marker=marker, alpha=0.55, linewidths=0, label=label)
    label, x, y = last
    ax.scatter(x, y, s=46, facecolors="none", edgecolors="black", linewidths=1.1, label=label)
    _references(ax, ref, ref_label, ref_y, ref_y_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _outside_legend(ax)
    _save(fig, path)


def _references(ax, ref_x, label_x, ref_y, label_y):
    if ref_x is not None:
        ax.axvline(ref_x, color="0.35", linestyle=":", linewidth=1.5, label=label_x)
        _honest_limits(ax, ref_x, "x")
    if ref_y is not None:
        ax.axhline(ref_y, color="0.35", linestyle="--", linewidth=1.2, label=label_y)


def layer_bands(n_layer):
    """Consecutive layers in at most len(BAND_STYLE) bands of nearly equal size: [(layers, (colour,
    marker))]. A model of up to 8 layers gets a band per layer."""
    split = np.array_split(np.arange(n_layer), min(n_layer, len(BAND_STYLE)))
    return [(band, style) for band, style in zip(split, BAND_STYLE)]


def band_label(band):
    return layer_span(list(band))


def _band_scatter(ax, bands, x, y, layer, **kwargs):
    """Points in the colour and marker of their layer's band."""
    x, y, layer = np.asarray(x), np.asarray(y), np.asarray(layer)
    for band, (colour, marker) in bands:
        pick = np.isin(layer, band)
        ax.scatter(x[pick], y[pick], color=colour, marker=marker, **kwargs)


def _band_legend(ax, bands, kinds, **kwargs):
    """A legend beside the plot: one entry per band of layers, then the kinds of points
    ((label, size, with a black edge)) in grey, then the lines already drawn."""
    for band, (colour, marker) in bands:
        ax.scatter([], [], color=colour, marker=marker, s=40, label=band_label(band))
    for label, size, edged in kinds:
        ax.scatter([], [], color="0.6", s=size, edgecolors="black" if edged else "none", label=label)
    return _outside_legend(ax, **kwargs)


def _layer_fits(ax, bands, x, y, layer):
    """For each layer with two or more points, its least-squares line over its own x range, thin,
    in the band's colour: the relation within a layer, apart from the differences between layers."""
    for band, (colour, _) in bands:
        for l in band:
            lx, ly = x[layer == l], y[layer == l]
            if len(lx) > 1 and np.ptp(lx) > 0:
                slope, intercept = np.polyfit(lx, ly, 1)
                ends = np.array([lx.min(), lx.max()])
                ax.plot(ends, slope * ends + intercept, color=colour, linewidth=1.1, alpha=0.8, zorder=2)


def layer_scatter(path, title, points, faint, n_layer, xlabel, ylabel, refs=(None, None, None, None), fits=False):
    """Points coloured by band of layers (layer_bands): points (x, y, layer, legend label) drawn large;
    faint (the same) or None drawn small and pale beneath them. refs: (x reference, its label, y
    reference, its label). fits: each layer's own least-squares line through its large points."""
    fig, ax = plt.subplots(figsize=(9.6, 5.8), constrained_layout=True)
    bands, kinds = layer_bands(n_layer), []
    if faint is not None:
        x, y, layer, label = faint
        _band_scatter(ax, bands, x, y, layer, s=14, alpha=0.4, linewidths=0)
        kinds.append((label, 14, False))
    x, y, layer, label = points
    _band_scatter(ax, bands, x, y, layer, s=60, edgecolors="black", linewidths=0.7, zorder=3)
    kinds.insert(0, (label, 60, True))
    if fits:
        _layer_fits(ax, bands, np.asarray(x), np.asarray(y), np.asarray(layer))
        ax.plot([], [], color="0.3", linewidth=1.1, label="each layer's least-squares line")
    _references(ax, *refs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _band_legend(ax, bands, kinds)
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
    _step_axis(left, steps)
    left.set_ylabel("dimension of the head")
    left.set_title(f"layer {layer}: g_k over training")
    left.grid(False)
    mesh = right.pcolormesh(_edges(dims), _edges(np.arange(final_gains.shape[0])), final_gains,
                            cmap="RdBu_r", norm=norm, shading="flat")
    right.set_xlabel("dimension of the head")
    right.set_ylabel("layer")
    _layer_ticks(right, final_gains.shape[0])
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
    fig, (ax, heat) = plt.subplots(1, 2, figsize=(15, 4.8), constrained_layout=True,
                                   gridspec_kw={"width_ratios": [1.2, 1]})
    if groups is not None:
        _group_lines(ax, steps, curves, groups)
    else:
        for (label, curve), style in zip(curves.items(), ("-", "--", ":", "-.")):
            ax.plot(steps, curve, color="black", linestyle=style, marker="o" if len(steps) <= FEW_STEPS else None,
                    markersize=3.5, label=label)
    if ref is not None:
        _reference_line(ax, ref, ref_label)
    if ylim is not None:
        ax.set_ylim(*ylim)
    _step_axis(ax, steps)
    ax.set_ylabel(ylabel)
    ax.set_title(subtitle)
    _outside_legend(ax)
    _layer_heatmap(fig, heat, *right)
    fig.suptitle(title)
    _save(fig, path)


def _layer_heatmap(fig, ax, subtitle, table, xlabel, cmap, vmin, vmax, bar_label, bar_ref, fmt="{:.2f}"):
    """A layer x head annotated heatmap in ax, a reference (or None) marked on its colour bar."""
    bar = _annotated_heatmap(fig, ax, table, cmap, vmin, vmax, bar_label, fmt)
    if bar_ref is not None:
        bar.ax.axhline(bar_ref, color="#00a0ff", linewidth=2.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.set_title(subtitle)


def layer_heatmaps(path, title, steps, panels):
    """One panel per entry, each a layer x step heatmap: (panel title, values [S, L], colour bar label,
    colour map, vmin, vmax, centre (a diverging scale centred there) or None, values marked on the
    colour bar (a list, maybe empty))."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.8), constrained_layout=True,
                             squeeze=False)
    for ax, (subtitle, table, bar_label, cmap, vmin, vmax, centre, marks) in zip(axes[0], panels):
        norm = TwoSlopeNorm(vcenter=centre, vmin=vmin, vmax=vmax) if centre is not None else Normalize(vmin, vmax)
        mesh = ax.pcolormesh(_edges(steps), _edges(np.arange(table.shape[1])), table.T, cmap=cmap, norm=norm,
                             shading="flat")
        bar = fig.colorbar(mesh, ax=ax, label=bar_label)
        for mark in marks:
            bar.ax.axhline(mark, color="#00a0ff" if centre is None else "black", linewidth=2.5)
        _layer_ticks(ax, table.shape[1])
        ax.invert_yaxis()
        _step_axis(ax, steps)
        ax.set_ylabel("layer")
        ax.set_title(subtitle)
        ax.grid(False)
    fig.suptitle(title)
    _save(fig, path)


def logit_figure(path, title, steps, observed, ceiling, groups, points, n_layer):
    """Left: each layer group's largest logit (solid) and its ceiling estimate (dotted, same colour)
    over training; right: (x ceiling, y observed, layer, label) per query head, coloured by band of
    layers, with the line y = x."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(17, 5), constrained_layout=True)
    _group_lines(left, steps, observed, groups)
    for name, curve in ceiling.items():
        left.plot(steps, curve, color=GROUP_STYLE[name][0], linestyle=":", linewidth=1.6)
    left.plot([], [], color="0.3", linestyle=":", label="dotted: ceiling estimate")
    _step_axis(left, steps)
    left.set_ylabel("logit q . k / sqrt(D)")
    left.set_title("largest logit (solid) and mean ||q|| ||k|| / sqrt(D) (dotted)")
    _outside_legend(left)
    bands = layer_bands(n_layer)
    x, y, layer, label = points
    _band_scatter(right, bands, x, y, layer, s=46, edgecolors="black", linewidths=0.6, zorder=3)
    low, high = min(right.get_xlim()[0], right.get_ylim()[0]), max(right.get_xlim()[1], right.get_ylim()[1])
    right.plot([low, high], [low, high], color="0.35", linestyle=":", linewidth=1.5, label="y = x: at the ceiling")
    right.set_xlabel("ceiling estimate, mean ||q|| x mean ||k|| / sqrt(D)")
    right.set_ylabel("largest logit attn_logit_max")
    right.set_title("each query head")
    _band_legend(right, bands, [(label, 46, True)])
    fig.suptitle(title)
    _save(fig, path)


def gain_figure(path, title, steps, final_q, final_k, final_step, rms, groups):
    """Top: every layer's g_q and g_k at the last step (layer x dimension, one colour scale centred
    on 1); bottom: the RMS gain of each layer group over training, for q and for k on one scale.
    rms: {"q": {group: [S]}, "k": {group: [S]}}."""
    fig, axes = plt.subplots(2, 2, figsize=(15, 8.6), constrained_layout=True)
    norm = _gain_norm(final_q, final_k)
    for ax, gains, name in zip(axes[0], (final_q, final_k), ("g_q", "g_k")):
        mesh = ax.pcolormesh(_edges(np.arange(gains.shape[1])), _edges(np.arange(gains.shape[0])), gains,
                             cmap="RdBu_r", norm=norm, shading="flat")
        ax.set_xlabel("dimension of the head")
        ax.set_ylabel("layer")
        _layer_ticks(ax, gains.shape[0])
        ax.invert_yaxis()
        ax.set_title(f"{name} at step {final_step}")
        ax.grid(False)
    fig.colorbar(mesh, ax=axes[0].tolist(), label="gain (1 = initial value)")
    for ax, name in zip(axes[1], ("q", "k")):
        _group_lines(ax, steps, rms[name], groups)
        _reference_line(ax, 1.0, "1, the initial gain")
        _step_axis(ax, steps)
        ax.set_ylabel(f"RMS of g_{name} over dimensions")
        ax.set_title(f"g_{name}: RMS gain by layer group")
    _shared_legend(list(axes[1]))
    _same_limits(list(axes[1]))
    fig.suptitle(title)
    _save(fig, path)


def gains_by_wavelength(path, title, wavelength, panels, context, context_label):
    """One panel per (panel title, gains [L, D]): every layer's gain of each dimension against the
    wavelength of the dimension's RoPE pair, on a log scale, coloured by band of layers; black: the
    mean over layers and the pair's two dimensions; dashed: the training context."""
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 5.2), constrained_layout=True, sharey=True, squeeze=False)
    bands = layer_bands(panels[0][1].shape[0])
    pairs = np.unique(wavelength)
    for ax, (subtitle, gains) in zip(axes[0], panels):
        layer = np.repeat(np.arange(gains.shape[0]), gains.shape[1])
        _band_scatter(ax, bands, np.tile(wavelength, gains.shape[0]), gains.ravel(), layer, s=14, alpha=0.55,
                      linewidths=0)
        ax.plot(pairs, [gains[:, wavelength == w].mean() for w in pairs], color="black", linewidth=2,
                label="mean over layers")
        ax.axvline(context, color="0.25", linestyle="--", linewidth=1.5, label=context_label)
        ax.axhline(1.0, color="0.35", linestyle=":", linewidth=1.5, label="1, the initial gain")
        ax.set_xscale("log")
        ax.set_xlabel("wavelength of the dimension's RoPE pair (positions)")
        ax.set_title(subtitle)
    axes[0][0].set_ylabel("gain at the last stats step")
    _band_legend(axes[0][-1], bands, [])
    fig.suptitle(title)
    _save(fig, path)


def loss_figure(path, title, steps, loss, val_steps, val_loss, what=("training loss", "step")):
    """The loss of every step and its moving average, and the validation loss; what: the loss's name
    in the legend and what a step is (a measurement's are batches)."""
    name, unit = what
    fig, ax = plt.subplots(figsize=(10, 4.6), constrained_layout=True)
    few = len(loss) <= FEW_STEPS  # each point marked, and not faint: nothing else shows them
    ax.plot(steps, loss, color="#1f77b4", alpha=1 if few else 0.35, linewidth=1, marker="o" if few else None,
            markersize=4, label=f"{name} (each {unit})")
    if len(loss) >= 20:  # a moving average shows the trend through the batch-to-batch noise
        width = max(5, len(loss) // 25)
        smooth = np.convolve(loss, np.ones(width) / width, mode="valid")
        ax.plot(steps[width - 1:], smooth, color="#1f77b4", linewidth=2,
                label=f"{name} ({width}-{unit} mean)")
    if len(val_loss):
        ax.plot(val_steps, val_loss, color="#d62728", marker="o", markersize=6, linewidth=1.8,
                label="validation loss")
    _step_axis(ax, np.concatenate([steps, val_steps]))
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title)
    _outside_legend(ax)
    _save(fig, path)


def compare_figure(path, title, ylabel, runs, ref=None, ref_label=None):
    """One panel per layer group, one line per run: runs is a list of (label, steps, {group: curve})."""
    fig, axes = plt.subplots(1, 3, figsize=(17.5, 4.6), constrained_layout=True, sharey=True)
    groups = ("early", "middle", "final")
    for ax, group in zip(axes, groups):
        for i, (label, steps, curves) in enumerate(runs):
            if group in curves:
                ax.plot(steps, curves[group], color=RUN_COLOURS[i % len(RUN_COLOURS)], linewidth=1.8,
                        marker="o" if len(steps) <= FEW_STEPS else None, markersize=3, label=label)
    # Only now the limits: the panels share them, and fixing them before every panel is drawn
    # would cut off a curve that goes beyond the first panel's.
    for ax, group in zip(axes, groups):
        if ref is not None:
            _reference_line(ax, ref, ref_label)
        ax.set_title(f"{group} layers")
        _step_axis(ax, np.concatenate([steps for _, steps, _ in runs]))
    _shared_legend(list(axes))
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title)
    _save(fig, path)
