"""Layer aggregation: one score per key from the token-level scores of several layers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from captum_cw.errors import InputError

__all__ = ["LAYER_AGGREGATIONS", "aggregate_layers", "in_forward_order", "over_layers", "rollout"]

LAYER_AGGREGATIONS = ("last", "mean", "magnitude", "rollout")


def over_layers(scores: Tensor, aggregation: str, dim: int) -> Tensor:
    r"""
    The per-layer scores of ``scores`` along ``dim`` reduced to one: ``"last"`` (the last layer's), ``"mean"``
    (their mean) or ``"magnitude"`` (the mean of their absolute values: how much a token moves the output
    through each layer, in either direction; signed parts of opposite sign in different layers no longer
    cancel, and no sum identity holds).
    """
    if aggregation not in ("last", "mean", "magnitude"):
        raise InputError(f"over_layers reduces by 'last', 'mean' or 'magnitude', got {aggregation!r} (rollout "
                         f"composes the layers: aggregate_layers).")
    if aggregation == "last":
        return scores.select(dim, -1)
    return (scores.abs() if aggregation == "magnitude" else scores).mean(dim)


def rollout(scores: Tensor) -> Tensor:
    r"""
    Attention rollout (Abnar & Zuidema, 2020) of token-level scores, also for signed ones.

    ``R = A_L' ... A_2' A_1'`` with ``A' = (A + I) / 2``: half of each position's
    update comes through the residual stream, half through the scores. Row ``i``
    of ``R`` scores every input token for position ``i`` after the last layer.
    Where every ``A`` has rows summing to 1 (attention, inter-head contribution
    weights), the rows of ``R`` sum to 1 as well; negative contribution weights
    stay signed and can cancel along paths. Because the factors multiply, a key
    that takes most of the mass in many layers (an attention sink) compounds:
    on SmolLM2-135M (30 layers, first-token sinks) rollout gives the first token
    nearly all of the mass and the others ~1e-5, which says more about the sink
    than about the prompt. Prefer ``"mean"`` or ``"last"`` there.

    Args:
        scores (Tensor): ``(..., n_layers, n, n)`` token-level scores of every
                    query row, layers in forward order (first layer first).
    Returns:
        Tensor ``(..., n, n)``.
    """
    n = scores.shape[-1]
    identity = torch.eye(n, device=scores.device, dtype=scores.dtype)
    result = identity.expand(*scores.shape[:-3], n, n)
    for layer in scores.unbind(-3):  # [..., n, n], first layer first
        result = ((layer + identity) / 2) @ result
    return result


def aggregate_layers(scores: Tensor, rows: Tensor, aggregation: str) -> Tensor:
    r"""
    One score per key for each wanted query row, from per-layer token-level scores: the one place
    where ``"last"``, ``"mean"``, ``"magnitude"`` and ``"rollout"`` are defined.

    Args:
        scores (Tensor): ``(..., n_layers, n_rows_in, n)`` token-level scores, first layer first
                    (for ``"rollout"`` every query row, ``n_rows_in = n``; for the others
                    only the wanted rows need be set, or be there).
        rows (Tensor): the wanted rows, indices into ``n_rows_in``: ``(n_rows,)`` for every leading
                    index alike, or ``(..., n_rows)`` one set per leading index (e.g. per example).
        aggregation (str): ``"last"`` (the last layer's row), ``"mean"`` (mean over
                    layers), ``"magnitude"`` (mean of the absolute values over layers, :func:`over_layers`)
                    or ``"rollout"`` (:func:`rollout`).
    Returns:
        Tensor ``(..., n_rows, n)``.
    """
    if aggregation not in LAYER_AGGREGATIONS:
        raise InputError(f"layer aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, got {aggregation!r}.")
    if aggregation == "rollout":
        combined = rollout(scores)  # [..., n, n]: every row is composed through the layers
    elif rows.dim() == 1:  # the same rows everywhere: picked first, so only those are averaged
        return over_layers(scores[..., rows, :], aggregation, -3)  # [..., layer, row, n] -> [..., row, n]
    else:
        combined = over_layers(scores, aggregation, -3)  # [..., n_rows_in, n]
    if rows.dim() == 1:
        return combined[..., rows, :]
    return combined.gather(-2, rows[..., None].expand(*rows.shape, combined.shape[-1]))


def in_forward_order(scores: Tensor, layers: Sequence[int]) -> Tensor:
    r"""
    ``scores`` with its layer axis (dim 1) sorted by layer index, as :func:`aggregate_layers` wants them.

    Args:
        scores (Tensor): ``(batch, n_layers, ...)``, layer ``k`` of the axis being model layer ``layers[k]``.
        layers (Sequence[int]): the model layer of each entry of the axis (non-negative indices).
    """
    order = sorted(range(len(layers)), key=layers.__getitem__)
    return scores if order == list(range(len(order))) else scores[:, order]
