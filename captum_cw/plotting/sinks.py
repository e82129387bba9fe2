"""Figures of the sink study (``captum-cw sinks``), from numbers already reduced over texts.

:mod:`captum_cw.sinks.plots` reduces the study's measurements and names the files; these functions only draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from captum_cw.plotting.heatmaps import token_ticks

__all__ = ["sink_alignment_figure", "sink_convexity_figure", "sink_factors_figure", "sink_norm_effect_figure",
           "sink_received_figure"]


def _layer_axis(axis) -> None:
    r"""Labels the x axis as layers, with whole-number ticks only (no layer 2.5)."""
    axis.set_xlabel("layer")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def sink_received_figure(received: ArrayLike, sinks: Sequence[Sequence[int]], tokens: Sequence[str],
                         threshold: float) -> Figure:
    r"""
    Received attention mass per layer and key of one text: log colour scale, sinks outlined and marked, token
    labels thinned out to fit (every k-th, with its position).

    Args:
        received (array): ``(n_layers, n)`` received attention mass of each key.
        sinks (Sequence[Sequence[int]]): the sink positions of each layer.
        tokens (Sequence[str]): the ``n`` token labels.
        threshold (float): the received mass above which a key is a sink.
    """
    received = np.asarray(received)  # [layer, key]
    width = min(4 + 0.3 * len(tokens), 16)  # at most 16 inches: labels thin out instead (every k-th token)
    figure = Figure(figsize=(width, 6), layout="constrained")
    axis = figure.subplots()
    floor = max(float(received[received > 0].min()) if (received > 0).any() else 1e-4, 1e-4)
    # log scale: the sinks take ~0.5 of the mass and the other keys ~1/n, which a linear scale shows as one colour
    image = axis.imshow(received.clip(floor, None), aspect="auto", cmap="viridis", interpolation="nearest",
                        norm=LogNorm(vmin=floor, vmax=max(float(received.max()), floor * 10)))
    above = received > threshold
    if above.any() and not above.all():  # outline the cells above the threshold: the sinks of each layer
        axis.contour(above, levels=[0.5], colors="#ff3b30", linewidths=1.2)
    marked = sorted({position for layer in sinks for position in layer})
    token_ticks(axis, tokens, width - 2.5, 7, marked)
    axis.set_ylabel("layer")
    axis.set_title(f"received attention mass per key (first text, {len(tokens)} tokens)\nred outline: above "
                   f"{threshold:g} (sinks, ▼)", fontsize=10)
    figure.colorbar(image, ax=axis, pad=0.01, label="mean attention received (log scale)")
    return figure


def sink_factors_figure(factors: Mapping[str, ArrayLike]) -> Figure:
    r"""
    The three-factor decomposition, sinks against the other tokens, one panel per factor.

    Args:
        factors (Mapping[str, array]): factor name -> ``(n_layers, 2)`` means of [sinks, other tokens]
                    (NaN where a layer has no sink: a gap in the line).
    """
    figure = Figure(figsize=(4 * len(factors), 3.8), layout="constrained")
    axes = figure.subplots(1, len(factors), squeeze=False)[0]
    for axis, (name, values) in zip(axes, factors.items()):
        values = np.asarray(values)  # [layer, 2]
        axis.plot(values[:, 0], marker="o", label="sinks")
        axis.plot(values[:, 1], marker="o", label="other tokens")
        axis.set_title(name)
        _layer_axis(axis)
        axis.axhline(0, color="grey", lw=0.5)
    axes[0].legend()
    axes[0].set_ylabel("mean over heads, rows, keys")
    figure.suptitle("three-factor decomposition (intra-head): sinks vs other tokens (gaps: layers without a sink)")
    return figure


def sink_alignment_figure(cos_sink_rest: ArrayLike, cos_sink_output: ArrayLike) -> Figure:
    r"""
    Anti-alignment of the sink's projected value per layer.

    Args:
        cos_sink_rest (array): ``(n_layers,)`` mean cos(vt_sink, the non-sink mix).
        cos_sink_output (array): ``(n_layers,)`` mean cos(vt_sink, o_h).
    """
    figure = Figure(figsize=(7, 3.5), layout="constrained")
    axis = figure.subplots()
    axis.plot(np.asarray(cos_sink_rest), marker="o", label="cos(vt_sink, non-sink mix)")
    axis.plot(np.asarray(cos_sink_output), marker="o", label="cos(vt_sink, o_h)")
    axis.axhline(0, color="grey", lw=0.5)
    _layer_axis(axis)
    axis.set_ylabel("mean cosine")
    axis.legend()
    axis.set_title("anti-alignment of the sink's projected value")
    return figure


def sink_convexity_figure(rates: ArrayLike, optimal: ArrayLike) -> Figure:
    r"""
    The norm-minimising sink rate ``t*`` against the actual one, as a 2-D histogram over rows (the rows number
    in the hundreds of thousands, which a scatter plot paints as one blot).

    Args:
        rates (array): ``(n_rows,)`` actual sink rates ``alpha_s``.
        optimal (array): ``(n_rows,)`` the ``t*`` of each row.
    """
    rates, optimal = np.asarray(rates), np.asarray(optimal)
    figure = Figure(figsize=(5.6, 4.6), layout="constrained")
    axis = figure.subplots()
    *_, image = axis.hist2d(rates, optimal, bins=50, range=[[0, 1], [0, 1]], norm=LogNorm(), cmap="viridis", cmin=1)
    figure.colorbar(image, ax=axis, label="rows (log scale)")
    axis.plot([0, 1], [0, 1], color="grey", lw=0.8)
    axis.set_xlabel("actual sink rate alpha_s")
    axis.set_ylabel("t* minimising ||o_h(t)||")
    axis.set_title(f"convexity: norm-minimising sink rate\n({len(rates):,} rows; below the diagonal: t* < alpha_s)",
                   fontsize=10)
    return figure


def sink_norm_effect_figure(before: Mapping[str, ArrayLike], after: Mapping[str, ArrayLike],
                            control: Mapping[str, ArrayLike] | None = None) -> Figure:
    r"""
    The cosine of the heads' outputs to the semantic direction per layer, one panel per head group: before
    any removal (a pale band), after removing the sink's value norm (solid) and, as a control, after removing the
    value norm of a matched non-sink token instead (dotted).

    Args:
        before, after (Mapping[str, array]): head group (``"low-norm heads"``, ``"other heads"``) ->
                    ``(n_layers,)`` mean cosine.
        control (Mapping[str, array], optional): the same after the control's removal. Default: None (not drawn)
    """
    figure = Figure(figsize=(5 * len(before) + 1, 3.8), layout="constrained")
    axes = figure.subplots(1, len(before), squeeze=False, sharey=True)[0]
    for axis, group in zip(axes, before):
        # before: a broad pale band, so that a curve that does not move (the control, often) shows on top of it
        axis.plot(np.asarray(before[group]), "-", color="grey", lw=4, alpha=0.35, label="before")
        axis.plot(np.asarray(after[group]), "-", marker="o", markersize=3, color="C3", label="sink's norm removed")
        if control is not None:
            axis.plot(np.asarray(control[group]), ":", marker="s", markersize=3, color="C0",
                      label="control token's norm removed")
        axis.set_title(group)
        _layer_axis(axis)
        axis.axhline(0, color="grey", lw=0.5)
    axes[0].set_ylabel("cos(o_h, semantic direction)")
    axes[0].legend(fontsize=8)
    figure.suptitle("removing a value norm: the sink's vs a matched non-sink token's (means over texts)")
    return figure
