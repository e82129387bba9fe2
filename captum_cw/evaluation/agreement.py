"""Rank agreement between metrics: Kendall's tau and Spearman's rho of the rankings kept by ``--save-rankings``.

A ranking is a list of token positions, most important first, over the positions a metric may remove (the
same set for every metric of an example); rankings never tie (ties in scores are broken by position), so
tau-a and tau-b coincide. A record's ``rankings`` hold one ranking per metric at the input level, and one per
sequence, layer (and head) at the layer level; two metrics' agreement on an example is the mean over these.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from captum_cw.evaluation.records import Record
from captum_cw.statistics import Interval, kendall_tau, spearman_rho

__all__ = ["kendall_tau", "leaves", "rank_agreement", "spearman_rho"]


def leaves(ranking: Any) -> list[list[int]]:
    r"""The rankings (lists of positions) inside a record's nested ranking lists, in order."""
    if not ranking or not isinstance(ranking[0], list):
        return [ranking]
    return [leaf for part in ranking for leaf in leaves(part)]


def _example_agreement(first: Any, second: Any) -> tuple[float, float]:
    r"""Mean tau and rho over the rankings of one example (those of at least two positions), NaN if none."""
    pairs = [(a, b) for a, b in zip(leaves(first), leaves(second), strict=True) if len(a) >= 2]
    if not pairs:
        return math.nan, math.nan
    taus, rhos = [], []
    for m in sorted({len(a) for a, _ in pairs}):  # rankings of one length at a time, as one batch
        a = np.array([a for a, _ in pairs if len(a) == m])
        b = np.array([b for a, b in pairs if len(a) == m])
        taus.append(kendall_tau(a, b))
        rhos.append(spearman_rho(a, b))
    return float(np.concatenate(taus).mean()), float(np.concatenate(rhos).mean())


def rank_agreement(records: Sequence[Record], interval) -> dict[str, dict[str, dict[str, Interval]]]:
    r"""
    Agreement of every pair of metrics whose rankings the records keep.

    Args:
        records: the records (those without ``rankings`` are left out).
        interval (Callable): values -> :class:`~captum_cw.statistics.Interval` (the report's bootstrap).
    Returns:
        ``{"kendall": {a: {b: interval}}, "spearman": {...}}`` for each pair ``a`` before ``b`` in the
        records' metric order; ``n`` counts the examples with at least one ranking of two positions.
    """
    kept = [r for r in records if "rankings" in r]
    if not kept:
        return {}
    metrics = list(kept[0]["rankings"])
    result: dict[str, dict[str, dict[str, Interval]]] = {"kendall": {}, "spearman": {}}
    for a, b in itertools.combinations(metrics, 2):
        values = [_example_agreement(r["rankings"][a], r["rankings"][b]) for r in kept]
        values = [v for v in values if not math.isnan(v[0])]
        result["kendall"].setdefault(a, {})[b] = interval([tau for tau, _ in values])
        result["spearman"].setdefault(a, {})[b] = interval([rho for _, rho in values])
    return result
