"""Faithfulness curves of an evaluation summary (``curves.png``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from captum_cw.files import save_figure

__all__ = ["plot_curves"]


def plot_curves(summary: Mapping[str, Any], path: str | Path, title: str = "",
                modes: Sequence[str] = ("comprehensiveness", "sufficiency")) -> None:
    r"""
    Writes the faithfulness curves of an evaluation summary: the drop of the primary measure against the bin,
    one line per metric with its 95% interval, one panel per mode; a NaN point is left out.

    Args:
        summary (Mapping): as :func:`captum_cw.evaluation.report.summarize` returns it (``"primary"``,
                    ``"bins"``, ``"aopc"``).
        path (str or Path): where to write the image (atomically; its suffix picks the format).
        title (str, optional): figure title.
        modes (Sequence[str], optional): the panels, in order. Default: comprehensiveness, sufficiency
    """
    measure = summary["primary"]
    figure = Figure(figsize=(5.5 * len(modes), 4))
    axes = figure.subplots(1, len(modes), squeeze=False)[0]
    for axis, mode in zip(axes, modes):
        for metric, by_mode in summary["bins"].items():
            bins = list(by_mode[mode])
            x = [float(b) for b in bins]
            mean = [by_mode[mode][b][measure]["mean"] for b in bins]
            low = [by_mode[mode][b][measure]["ci_low"] for b in bins]
            high = [by_mode[mode][b][measure]["ci_high"] for b in bins]
            aopc = summary["aopc"][metric][mode][measure]["mean"]
            finite = [k for k, value in enumerate(mean) if math.isfinite(value)]  # a NaN has no place on a curve
            if not finite:
                continue
            axis.plot([x[k] for k in finite], [mean[k] for k in finite], marker="o",
                      label=f"{metric} (AOPC {aopc:.3g})")
            axis.fill_between([x[k] for k in finite], [low[k] for k in finite], [high[k] for k in finite],
                              alpha=0.15)
        if axis.lines:
            axis.set_xscale("log")
            axis.legend(fontsize=7)
        axis.set_xlabel("k (% of keys removed)" if mode == "comprehensiveness" else "k (% of keys kept)")
        axis.set_ylabel(measure)
        axis.set_title(f"{mode} ({'higher' if mode == 'comprehensiveness' else 'lower'} is more faithful)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    save_figure(figure, path, dpi=110)
