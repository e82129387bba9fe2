"""Heatmaps of token scores, with token labels that stay readable at a few hundred tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from captum_cw.files import output_path, save_figure

__all__ = ["display_token", "heatmap_path", "layer_token_heatmaps", "plot_layer_token_heatmaps", "token_ticks"]

MAX_WIDTH = 24.0  # inches: wider figures stack their panels and thin out the token labels
LABEL_SPACING = 1.9  # a tick label needs this many times its font size (in points) between neighbours
SINK_COLOUR = "#d55e00"
HEATMAP_FORMATS = (".png", ".pdf", ".svg")
DEFAULT_HEATMAP = "captum_cw_heatmap.png"  # the heatmap's name in a folder, and captum-cw attribute's default
CLIP_RATIO = 2.0  # marked tokens leave the colour scale when they exceed every other score this many times


def display_token(token: str, limit: int | None = None) -> str:
    r"""A decoded token as one printable line: newlines and tabs become ``↵`` and ``⇥``; cut to ``limit``
    characters (with ``…``) when given."""
    shown = token.replace("\r", "").replace("\n", "↵").replace("\t", "⇥")
    return shown if limit is None or len(shown) <= limit else shown[: limit - 1] + "…"


def token_ticks(axis: Axes, tokens: Sequence[str], width: float, fontsize: float = 8,
                marked: Sequence[int] = ()) -> int:
    r"""
    Token labels on the x axis of ``axis``, as many as fit: every ``k``-th token (counted back from the last,
    which is labelled, as is every ``marked`` one) when one label per token would collide, each thinned-out
    label with its position; a minor tick per token.

    Args:
        axis (Axes): the axes whose columns are the tokens.
        tokens (Sequence[str]): the labels.
        width (float): the axes' width in inches (roughly).
        fontsize (float, optional): the labels' size in points. Default: 8
        marked (Sequence[int], optional): positions labelled in any case, in bold orange with ``▼`` (sinks).
    Returns:
        ``k``, 1 when every token is labelled.
    """
    n = len(tokens)
    every = max(1, math.ceil(LABEL_SPACING * fontsize / 72 / max(width / max(n, 1), 1e-6)))
    chosen = set(marked)
    shown = sorted({j for j in range(n) if (n - 1 - j) % every == 0} | (chosen & set(range(n))))
    if every > 1:  # a marked label may crowd its neighbour: drop the neighbour
        shown = [j for j in shown if j in chosen or not any(0 < abs(j - m) < every for m in chosen)]
    labels = [("▼" if j in chosen else "") + (display_token(tokens[j], 12).strip() or "␣")
              + (f" ({j})" if every > 1 else "") for j in shown]
    axis.set_xticks(shown, labels, rotation=90, fontsize=fontsize)
    if every > 1:
        axis.set_xticks(range(n), minor=True)
    for label, j in zip(axis.get_xticklabels(), shown):
        if j in chosen:
            label.set_color(SINK_COLOUR)
            label.set_fontweight("bold")
    return every


def heatmap_path(path: str | Path, flag: str = "path") -> Path:
    r"""Where :func:`plot_layer_token_heatmaps` writes: ``path`` when it ends in ``.png``, ``.pdf`` or ``.svg``;
    ``captum_cw_heatmap.png`` inside it when it is a folder (one that exists, ends in ``/`` or has no suffix);
    any other suffix raises an :class:`~captum_cw.errors.InputError` naming ``flag`` (see
    :func:`captum_cw.files.output_path`)."""
    return output_path(path, HEATMAP_FORMATS, DEFAULT_HEATMAP, flag)


def plot_layer_token_heatmaps(
    panels: dict[str, Tensor],
    tokens: Sequence[str],
    path: str | Path,
    title: str = "",
    layers: Sequence[int] | None = None,
    marked: Sequence[int] = (),
) -> Path:
    r"""
    Heatmaps of ``(n_layers, n_tokens)`` score matrices, one per metric, with a diverging colour map centred on
    0 (contribution weights can be negative). Side by side while that fits in 24 inches; otherwise stacked, at
    most 24 inches wide, with every k-th token labelled (see :func:`token_ticks`). When the ``marked`` tokens
    (sinks) score over twice as high as any other, the colour scale leaves them out (they saturate, the colour
    bar says up to what), so a sink does not turn every other token white.

    Args:
        panels (dict[str, Tensor]): metric name -> scores ``(n_layers, n_tokens)``.
        tokens (Sequence[str]): the token labels.
        path (str or Path): where to write the image (atomically): a ``.png``, ``.pdf`` or ``.svg`` file, or
                    a folder to write ``captum_cw_heatmap.png`` in (see :func:`heatmap_path`).
        title (str, optional): figure title.
        layers (Sequence[int], optional): the layer index of each row, for the y axis. Default: 0, 1, ...
        marked (Sequence[int], optional): token positions to mark (sinks): always labelled, in orange, and
                    left out of the colour scale when they dwarf the rest.
    Returns:
        The path written.
    """
    path = heatmap_path(path)
    figure = layer_token_heatmaps(panels, tokens, title, layers, marked)
    return save_figure(figure, path, dpi=120)


def layer_token_heatmaps(
    panels: dict[str, Tensor],
    tokens: Sequence[str],
    title: str = "",
    layers: Sequence[int] | None = None,
    marked: Sequence[int] = (),
) -> Figure:
    r"""The figure :func:`plot_layer_token_heatmaps` writes (same arguments, without ``path``)."""
    n_layers, n_tokens = next(iter(panels.values())).shape
    n_panels = len(panels)
    side_by_side = 2 + 0.45 * n_tokens * n_panels <= MAX_WIDTH
    if side_by_side:
        figure = Figure(figsize=(2 + 0.45 * n_tokens * n_panels, 1.5 + 0.18 * n_layers), layout="constrained")
        axes = figure.subplots(1, n_panels, squeeze=False)[0]
        axis_width = 0.45 * n_tokens
    else:
        width = min(2 + 0.45 * n_tokens, MAX_WIDTH)
        figure = Figure(figsize=(width, n_panels * (1.9 + 0.18 * n_layers) + (0.4 if title else 0)),
                        layout="constrained")
        axes = figure.subplots(n_panels, 1, squeeze=False)[:, 0]
        axis_width = width - 2.2  # y labels and colour bar
    rows = list(layers) if layers is not None else list(range(n_layers))
    row_step = max(1, math.ceil(n_layers / 16))  # at most ~16 layer labels
    for axis, (name, scores) in zip(axes, panels.items()):
        values = scores.detach().float().cpu().numpy()
        others = [j for j in range(n_tokens) if j not in set(marked)]
        peak = abs(values).max()
        limit = abs(values[:, others]).max() if others else 0.0
        limit = max(limit if 0 < limit < peak / CLIP_RATIO else peak, 1e-12)
        image = axis.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        axis.set_title(name)
        token_ticks(axis, tokens, axis_width, 8, marked)
        axis.set_yticks(range(0, n_layers, row_step), [str(rows[k]) for k in range(0, n_layers, row_step)],
                        fontsize=8)
        axis.set_ylabel("layer")
        bar = figure.colorbar(image, ax=axis, fraction=0.04 if side_by_side else 0.02, pad=0.01)
        if peak > limit * (1 + 1e-6):
            bar.set_label(f"▼ tokens saturate (up to {peak:.2g})", fontsize=8)
    if title:
        figure.suptitle(title)
    return figure
