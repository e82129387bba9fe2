"""Statistics over examples: intervals of a mean and of a proportion, rank correlations and paired tests.

Nothing here knows about models, records or tasks: values in, numbers out. The evaluation's summaries
(``evaluation/report.py``, ``evaluation/agreement.py``) and the sink study (``sinks/study.py``) use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from captum_cw.errors import InputError

__all__ = ["Interval", "PairedComparison", "bootstrap_interval", "kendall_tau", "mean_interval", "paired_comparison",
           "sign_test", "spearman_rho", "wilcoxon_signed_rank", "wilson_interval"]


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


def sign_test(wins: int, losses: int) -> float:
    r"""
    Two-sided exact sign test: the probability, under a fair coin, of a split of ``wins + losses`` pairs at
    least as uneven as the one seen (ties are left out before). 1 for no pairs.
    """
    n = wins + losses
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    r"""The ranks 1..n of ``values`` ``(n,)``, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):  # ties share the mean of their ranks
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def wilcoxon_signed_rank(differences: Sequence[float]) -> float:
    r"""
    Two-sided Wilcoxon signed-rank test of paired differences around 0, by the normal approximation: zero
    differences are dropped (Wilcoxon's method), tied absolute differences get their mean rank and the variance
    its tie correction ``- sum(t^3 - t) / 48``; no continuity correction (``scipy.stats.wilcoxon(differences,
    method="approx")``). NaN when no difference is non-zero.
    """
    data = np.asarray(differences, dtype=float)
    data = data[data != 0]
    n = len(data)
    if n == 0:
        return float("nan")
    ranks = _average_ranks(np.abs(data))
    positive = float(ranks[data > 0].sum())
    statistic = min(positive, n * (n + 1) / 2 - positive)
    _, ties = np.unique(np.abs(data), return_counts=True)
    variance = n * (n + 1) * (2 * n + 1) / 24 - float((ties ** 3 - ties).sum()) / 48
    z = (statistic - n * (n + 1) / 4) / math.sqrt(variance)
    return math.erfc(abs(z) / math.sqrt(2))


class PairedComparison(TypedDict):
    r"""How often one method beats another over the same examples, and whether by chance."""

    n: int  # pairs
    wins: int  # pairs where the first is better
    ties: int
    win_rate: float  # wins / n (ties count as no win)
    win_low: float  # the win rate's 95% Wilson interval
    win_high: float
    sign_p: float  # two-sided exact sign test (ties left out)
    wilcoxon_p: float  # two-sided Wilcoxon signed-rank test (normal approximation)
    mean_difference: float  # mean of first - second, oriented so that > 0 favours the first


def paired_comparison(first: Sequence[float], second: Sequence[float], *, higher_is_better: bool = True
                      ) -> PairedComparison:
    r"""
    Pairs ``first[i]`` with ``second[i]`` (two methods on the same example): the share of pairs the first wins
    with its Wilson interval, the sign test and the Wilcoxon signed-rank test of their differences.

    Args:
        first, second (sequence of float): ``(n,)`` values of the two methods, example by example.
        higher_is_better (bool, optional): whether the larger value wins. Default: True
    Returns:
        A :class:`PairedComparison`.
    """
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"paired values need two sequences of the same length, got {a.shape} and {b.shape}; "
                         "pass one value per example of each method.")
    differences = a - b if higher_is_better else b - a  # [n]: > 0 where the first wins
    wins, losses = int((differences > 0).sum()), int((differences < 0).sum())
    n = len(differences)
    low, high = wilson_interval(wins, n)
    return {"n": n, "wins": wins, "ties": n - wins - losses, "win_rate": wins / n if n else float("nan"),
            "win_low": low, "win_high": high, "sign_p": sign_test(wins, losses),
            "wilcoxon_p": wilcoxon_signed_rank(differences),
            "mean_difference": float(differences.mean()) if n else float("nan")}


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
