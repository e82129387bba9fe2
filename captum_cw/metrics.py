"""The per-head metrics, each defined once: a name, its per-head scores, how heads are aggregated, and its
completeness identity (docs/DESIGN.md, "Metrics"). Attributors, the evaluator, the command line, the tests
and the benchmarks all read :data:`METRICS`; a new metric is one :func:`register_metric` call plus its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from captum_cw.errors import InputError
from captum_cw.geometry import HeadGeometry

__all__ = ["Metric", "METRICS", "get_metric", "register_metric"]


@dataclass(frozen=True)
class Metric:
    r"""
    One per-head metric.

    Args:
        name (str): its key, e.g. ``"cw_inter"``.
        label (str): how tables and plots name it.
        per_head (Callable): ``HeadGeometry -> (batch, head, row, key)`` scores.
        head_reduction (str): ``"sum"`` or ``"mean"``: how token-level scores
                    aggregate heads.
        row_totals (Callable, optional): ``HeadGeometry -> (batch, head, row)``,
                    what each head's row sums to over the keys by the metric's
                    completeness identity, computed without the scores; None if it
                    has none (then it has no convergence delta).
    """

    name: str
    label: str
    per_head: Callable[[HeadGeometry], Tensor]
    head_reduction: Literal["sum", "mean"]
    row_totals: Callable[[HeadGeometry], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.head_reduction not in ("sum", "mean"):
            raise InputError(f"head_reduction must be 'sum' or 'mean', got {self.head_reduction!r}.")


def _reads(geometry: HeadGeometry) -> Tensor:
    r"""1 for rows that read any key, 0 for padded rows: ``(batch, head, row)``."""
    return (geometry.alpha.sum(-1) > 0).to(geometry.alpha.dtype)


def _reads_a_nonzero_output(geometry: HeadGeometry) -> Tensor:
    return _reads(geometry) * (geometry.head_output_norms.squeeze(-1) > 0)


METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> None:
    r"""Adds (or replaces) a metric; every entry point that takes metric names then knows it."""
    METRICS[metric.name] = metric


def get_metric(name: str) -> Metric:
    r"""The registered metric called ``name``; a ValueError lists the known ones otherwise."""
    if name not in METRICS:
        raise InputError(f"Unknown metric {name!r}; choose one of {', '.join(METRICS)}.")
    return METRICS[name]


for _metric in (
    Metric("attention", "attention", lambda g: g.alpha, "mean", _reads),
    Metric("value_weighted", "value-weighted", HeadGeometry.value_weighted, "mean"),
    Metric("output_normalized", "output-normalised", HeadGeometry.output_normalized, "mean"),
    Metric("cw_intra", "CW (intra-head)", HeadGeometry.cw_intra, "mean", _reads_a_nonzero_output),
    Metric("cw_inter", "CW (inter-head)", HeadGeometry.cw_inter, "sum", lambda g: g.inter_shares),
):
    register_metric(_metric)
