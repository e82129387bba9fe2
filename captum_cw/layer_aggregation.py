"""Layer aggregation: one score per key from the token-level scores of several layers."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LAYER_AGGREGATIONS", "rollout"]

LAYER_AGGREGATIONS = ("last", "mean", "rollout")


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
        scores (Tensor): ``(batch, n_layers, n, n)`` token-level scores of every
                    query row, layers in forward order (first layer first).
    Returns:
        Tensor ``(batch, n, n)``.
    """
    n = scores.shape[-1]
    identity = torch.eye(n, device=scores.device, dtype=scores.dtype)
    result = identity.expand(scores.shape[0], n, n)
    for layer in scores.unbind(1):  # [batch, n, n], first layer first
        result = ((layer + identity) / 2) @ result
    return result
