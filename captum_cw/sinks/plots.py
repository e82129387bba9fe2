"""The sink study's five figures: what each shows, reduced over the texts, and the file it goes to. The drawing
itself is :mod:`captum_cw.plotting.sinks`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from captum_cw.files import save_figure
from captum_cw.plotting import (
    sink_alignment_figure,
    sink_convexity_figure,
    sink_factors_figure,
    sink_norm_effect_figure,
    sink_received_figure,
)
from captum_cw.sinks.analysis import SinkAnalysis, SinkNormEffect

__all__ = ["FACTORS", "write_plots"]

FACTORS = ("attention", "relative_norm", "cosine", "cw")  # the panels of sinks_factors.png, in order


def write_plots(analyses: Sequence[SinkAnalysis], effects: Sequence[SinkNormEffect], token_lists: Sequence[list[str]],
                out: Path, threshold: float = 0.3) -> None:
    r"""
    Writes ``sinks_received.png`` (the first text), ``sinks_factors.png``, ``sinks_alignment.png``,
    ``sinks_convexity.png`` and ``sinks_norm_effect.png`` (means over the texts; the sink's removal beside the
    control token's) under ``out``.
    """
    first = analyses[0]
    save_figure(sink_received_figure(first.received, first.sinks, token_lists[0], threshold),
                out / "sinks_received.png", dpi=110)
    factors = {name: torch.stack([a.factors[name] for a in analyses]).nanmean(0) for name in FACTORS}  # [layer, 2]
    save_figure(sink_factors_figure(factors), out / "sinks_factors.png", dpi=110)
    alignment = sink_alignment_figure(torch.stack([a.cos_sink_rest for a in analyses]).mean((0, 2)),  # [layer]
                                      torch.stack([a.cos_sink_output for a in analyses]).mean((0, 2)))
    save_figure(alignment, out / "sinks_alignment.png", dpi=110)
    convexity = sink_convexity_figure(torch.cat([a.sink_rate.flatten() for a in analyses]),
                                      torch.cat([a.optimal_rate.flatten() for a in analyses]))
    save_figure(convexity, out / "sinks_convexity.png", dpi=110)
    low = torch.stack([e.low_norm for e in effects])  # [text, layer, head]

    def by_group(cosine: torch.Tensor) -> dict[str, torch.Tensor]:  # [text, layer, head] -> group: [layer]
        return {group: torch.where(mask, cosine, torch.nan).nanmean((0, 2))
                for group, mask in (("low-norm heads", low), ("other heads", ~low))}

    cosine = torch.stack([e.cosine for e in effects])  # [text, 2, layer, head]
    control = torch.stack([e.control_cosine[1] for e in effects])  # [text, layer, head]
    save_figure(sink_norm_effect_figure(by_group(cosine[:, 0]), by_group(cosine[:, 1]), by_group(control)),
                out / "sinks_norm_effect.png", dpi=110)
