"""Statistics over examples: intervals of a mean and of a proportion, and rank correlations.

Nothing here knows about models, records or tasks: values in, numbers out. The evaluation's summaries
(``evaluation/report.py``, ``evaluation/agreement.py``) and the sink study (``sinks/study.py``) use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

__all__ = ["Interval", "bootstrap_interval", "kendall_tau", "mean_interval", "spearman_rho", "wilson_interval"]


class Interval(TypedDict):
    r"""A mean over examples with its 95% bootstrap interval."""

    mean: float
    ci_low: float
    ci_high: float
    n: int


def bootstrap_interval(values: Sequence[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    r"""95% percentile bootstrap interval of the mean (NaNs for no values)."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def mean_interval(values: Sequence[float], seed: int = 0) -> Interval:
    r"""The mean of ``values`` with its 95% bootstrap interval (:func:`bootstrap_interval`) and their number."""
    low, high = bootstrap_interval(values, seed)
    return {"mean": float(np.mean(values)) if len(values) else float("nan"), "ci_low": low, "ci_high": high,
            "n": len(values)}


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    r"""95% Wilson score interval of a proportion ``successes / n`` (sound at 0, 1 and small ``n``)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _ranks(rankings: np.ndarray) -> np.ndarray:
    r"""``(batch, m)`` position lists -> each position's rank ``(batch, m)``, positions in sorted order."""
    return np.argsort(rankings, axis=-1, kind="stable")  # [b, i]: the rank of the i-th smallest position


def kendall_tau(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    r"""
    Kendall's tau between pairs of rankings of the same positions: (concordant - discordant pairs) /
    (m (m - 1) / 2). Rankings never tie, so tau-a and tau-b coincide.

    Args:
        first, second (ndarray): ``(batch, m)`` rankings (positions, most important first), m >= 2.
    Returns:
        ``(batch,)``.
    """
    a, b = _ranks(np.atleast_2d(first)), _ranks(np.atleast_2d(second))
    m = a.shape[-1]
    upper = np.triu(np.ones((m, m), dtype=bool), 1)
    signs = np.sign(a[:, :, None] - a[:, None, :]) * np.sign(b[:, :, None] - b[:, None, :])  # [batch, m, m]
    return signs[:, upper].sum(-1) / (m * (m - 1) / 2)


def spearman_rho(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    r"""Spearman's rho between pairs of rankings ``(batch, m)``: ``1 - 6 sum d^2 / (m (m^2 - 1))``."""
    a, b = _ranks(np.atleast_2d(first)), _ranks(np.atleast_2d(second))
    m = a.shape[-1]
    return 1 - 6 * ((a - b).astype(float) ** 2).sum(-1) / (m * (m * m - 1))
