"""From scores to removal sets: bins, ranking, ties and the keys that may be removed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from captum_cw.errors import InputError

__all__ = ["DEFAULT_BINS", "MODES", "aopc", "key_ranks", "normalized_scores", "ranked_positions",
           "removal_from_ranking", "removal_from_ranks", "soft_removal", "top_k_count"]

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
        raise InputError(f"bins are percentages in (0, 100], got {percent}.")
    return torch.ceil(n_eligible.double() * percent / 100 - 1e-9).long()


def key_ranks(scores: Tensor, eligible: Tensor, *, absolute: bool = False) -> Tensor:
    r"""
    Each key's rank in its row, 0 for the most important: by score, highest first (by ``|score|`` with
    ``absolute``), ties broken by position (earlier key first); ineligible keys rank after every eligible one.
    Computed once per metric, it gives the removal sets of every bin and mode (:func:`removal_from_ranks`).

    Args:
        scores (Tensor): ``(..., n_key)`` scores on the clean run.
        eligible (Tensor): bool ``(..., n_key)``, broadcastable to ``scores``.
        absolute (bool, optional): rank by absolute value. Default: False
    Returns:
        Long tensor ``(..., n_key)``.
    """
    eligible = eligible.expand_as(scores)
    keys = scores.abs() if absolute else scores
    keys = keys.masked_fill(~eligible, float("-inf"))
    order = keys.argsort(dim=-1, descending=True, stable=True)  # [..., key]: keys in rank order
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


def removal_from_ranks(ranks: Tensor, eligible: Tensor, percent: float, mode: str) -> Tensor:
    r"""
    The keys to remove from each row for one bin, from :func:`key_ranks`: ``"comprehensiveness"``
    removes the top ``percent`` of the eligible keys, ``"sufficiency"`` all the other eligible keys.

    Returns:
        Bool tensor shaped like ``ranks``, True for the keys to remove.
    """
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    eligible = eligible.expand_as(ranks)
    top = ranks < top_k_count(eligible.sum(-1, keepdim=True), percent)
    return eligible & (top if mode == "comprehensiveness" else ~top)


def removal_from_ranking(
    scores: Tensor,
    eligible: Tensor,
    percent: float,
    mode: str,
    *,
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
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    return removal_from_ranks(key_ranks(scores, eligible, absolute=absolute), eligible, percent, mode)


def ranked_positions(ranks: Tensor, eligible: Tensor) -> list:
    r"""
    The eligible keys of each row in rank order, most important first, as nested lists of positions:
    ``ranks`` ``(..., n_key)`` from :func:`key_ranks` and ``eligible`` ``(n_key,)`` give lists shaped ``(...)``
    of ``eligible.sum()`` positions each.
    """
    order = ranks.argsort(dim=-1)[..., : int(eligible.sum())]  # eligible keys rank first
    return order.cpu().tolist()


def normalized_scores(scores: Tensor, eligible: Tensor, *, absolute: bool = False) -> Tensor:
    r"""
    Scores min-max normalised to ``[0, 1]`` over each row's eligible keys (``|score|`` with ``absolute``):
    the row's top key gets 1, its lowest 0; a row whose eligible scores are all equal gets 1 on each (as hard
    ranking puts every one of them in the top). Ineligible keys get 0.

    Returns:
        Float tensor shaped like ``scores``.
    """
    eligible = eligible.expand_as(scores)
    keys = (scores.abs() if absolute else scores).float()
    high = keys.masked_fill(~eligible, float("-inf")).amax(-1, keepdim=True)
    low = keys.masked_fill(~eligible, float("inf")).amin(-1, keepdim=True)
    spread = high - low
    flat = ~(spread > 0)  # a constant row (or a row with one or no eligible key)
    normalized = (keys - low) / torch.where(flat, 1.0, spread)
    return torch.where(eligible, torch.where(flat, 1.0, normalized), 0.0)


def soft_removal(scores: Tensor, eligible: Tensor, mode: str, *, absolute: bool = False) -> Tensor:
    r"""
    The share of each term removed by soft comprehensiveness or sufficiency (Zhao & Aletras, 2023).

    Zhao & Aletras perturb the input instead of removing the top-k tokens: each element of token ``j``'s
    embedding is kept with probability ``q_j``, where ``s_j`` is its attribution normalised to ``[0, 1]``
    and ``q_j = 1 - s_j`` for soft comprehensiveness (the important tokens mostly go), ``q_j = s_j`` for soft
    sufficiency (mostly they alone stay); there are no bins. We take the expectation of their Bernoulli mask,
    which makes the removal deterministic: key ``j`` keeps ``q_j`` of its term ``alpha_ij vt_j`` in row ``i``
    (layer level, :func:`~captum_cw.interventions.scale_values`), or of its value at every layer or its
    embedding (input level). ``s`` is :func:`normalized_scores` of the row (min-max over its eligible keys);
    ineligible keys are kept whole.

    Args:
        scores (Tensor): ``(..., n_key)`` scores on the clean run.
        eligible (Tensor): bool ``(..., n_key)``, broadcastable to ``scores``.
        mode (str): ``"comprehensiveness"`` or ``"sufficiency"``.
        absolute (bool, optional): normalise ``|score|``. Default: False
    Returns:
        Float tensor ``(..., n_key)`` in ``[0, 1]``: the share removed, ``1 - q_j`` on eligible keys, else 0.
    """
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    s = normalized_scores(scores, eligible, absolute=absolute)
    return s if mode == "comprehensiveness" else torch.where(eligible.expand_as(s), 1 - s, 0.0)


def aopc(drops_by_bin: Sequence[float]) -> float:
    r"""Area over the perturbation curve: the mean drop over the bins (DeYoung et al., 2020)."""
    return float(sum(drops_by_bin) / len(drops_by_bin)) if drops_by_bin else math.nan
