"""From scores to removal sets: bins, ranking, ties and the keys that may be removed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["DEFAULT_BINS", "MODES", "aopc", "top_k_count", "removal_from_ranking"]

DEFAULT_BINS: tuple[float, ...] = (1, 5, 10, 20, 50)
MODES = ("comprehensiveness", "sufficiency")


def top_k_count(n_eligible: Tensor, percent: float) -> Tensor:
    r"""
    How many keys make the top ``percent`` of ``n_eligible`` keys: ``ceil(percent / 100 * n)``,
    so every non-empty row keeps or loses at least one key for any positive bin.

    Args:
        n_eligible (Tensor): eligible keys per row, long, any shape.
        percent (float): the bin, in ``(0, 100]``.
    """
    if not 0 < percent <= 100:
        raise ValueError(f"bins are percentages in (0, 100], got {percent}.")
    return torch.ceil(n_eligible.double() * percent / 100 - 1e-9).long()


def removal_from_ranking(
    scores: Tensor,
    eligible: Tensor,
    percent: float,
    mode: str,
    absolute: bool = False,
) -> Tensor:
    r"""
    The keys to remove from each row for one bin.

    Keys are ranked by score, highest first (by ``|score|`` with ``absolute``);
    ties are broken by position, earlier key first. Only eligible keys are ranked
    or removed (a causal row's past keys, minus special tokens).

    Args:
        scores (Tensor): ``(..., n_key)`` scores on the clean run.
        eligible (Tensor): bool ``(..., n_key)``, broadcastable to ``scores``.
        percent (float): the bin.
        mode (str): ``"comprehensiveness"`` removes the top ``percent``;
                    ``"sufficiency"`` keeps only the top ``percent`` (removes the rest).
        absolute (bool, optional): rank by absolute value. Default: False
    Returns:
        Bool tensor ``(..., n_key)``, True for the keys to remove.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    eligible = eligible.expand_as(scores)
    keys = scores.abs() if absolute else scores
    keys = keys.masked_fill(~eligible, float("-inf"))
    order = keys.argsort(dim=-1, descending=True, stable=True)  # [..., key]
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    top = rank < top_k_count(eligible.sum(-1, keepdim=True), percent)
    return eligible & (top if mode == "comprehensiveness" else ~top)


def aopc(drops_by_bin: Sequence[float]) -> float:
    r"""Area over the perturbation curve: the mean drop over the bins (DeYoung et al., 2020)."""
    return float(sum(drops_by_bin) / len(drops_by_bin)) if drops_by_bin else math.nan
