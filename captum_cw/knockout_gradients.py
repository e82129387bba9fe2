"""Knockout gradients: each context token's part of a target along the path that knocks the context out.

Every attention row ``i`` reads key ``j`` with weight ``alpha_ij``. Gate each context token's key by ``s_j`` in
every layer and renormalise the row, ``w_ij = s_j alpha_ij / sum_k s_k alpha_ik`` (``log s_j`` added to the key's
logits, in the model's own attention kernel): ``s = 1`` is the model as it is, ``s_j -> 0`` reads as if token
``j`` were deleted from the prompt (it keeps its position). Integrated Gradients along the straight path
``s = t`` on the context, ``t`` from 0 to 1, splits ``f(whole prompt) - f(context knocked out)`` over the
context tokens::

    score[j] = integral_0^1 d f / d s_j (s = t on the context) dt      (midpoint rule, ``n_steps`` points)

One step reads the gradient at ``t = 1/2``: the first-order account of the model with every context token half
present, the point around which random half-ablations of the context scatter (ContextCite's LDS ablations).
In contribution-weight terms, one layer and row give

    d f / d s_j = alpha_ij / Z_i * (<g_i, vt_j> - <g_i, o_i>),  Z_i = sum_k s_k alpha_ik

with ``g_i`` the target's gradient at the layer's attention output ``o_i`` and ``alpha_ij vt_j`` token ``j``'s
term of it: the target-aware contribution of :mod:`captum_cw.target_contributions`, less the token's attention
share of the whole output's part (docs/DESIGN.md, "Knockout gradients"). One forward pass with the autograd
graph and one backward pass per step, through every layer (the gates of one layer change the queries, keys
and values of the next).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captum_cw.architectures import find_attention_layers
from captum_cw.capture import AttentionCall, capture_attention
from captum_cw.errors import InputError, UnsupportedSetupError, require_model
from captum_cw.target_contributions import checked_foils, target_objective

__all__ = ["KnockoutGradients", "knockout_gradients"]


@dataclass(frozen=True)
class KnockoutGradients:
    r"""
    What :func:`knockout_gradients` computed.

    Attributes:
        scores (Tensor): ``(batch, n)`` float32, each context token's part of the targets' summed
                    log-probability (with foils, log-odds; 0 outside the context).
        objective (Tensor): ``(batch, n_steps)`` the targets' summed log-probability (log-odds) at each path point.
        points (Tensor): ``(n_steps,)`` the gates ``t`` the gradient was read at.
    """

    scores: Tensor
    objective: Tensor
    points: Tensor


def _checked(input_ids: Tensor, context: Tensor, positions: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int):
        raise InputError("input_ids must be a (batch, n) integer tensor of token ids.")
    if not isinstance(context, Tensor) or context.shape != input_ids.shape or context.dtype != torch.bool:
        raise InputError(f"context must be a bool tensor shaped like input_ids {tuple(input_ids.shape)} (True on "
                         "the tokens to attribute), got "
                         f"{tuple(context.shape) if isinstance(context, Tensor) else type(context).__name__}.")
    if not bool(context.any(1).all()):
        raise InputError("every example needs at least one context token (context is all False in a row).")
    positions, targets = positions.reshape(len(input_ids), -1), targets.reshape(len(input_ids), -1)  # [batch, t]
    if positions.shape != targets.shape:
        raise InputError(f"{targets.shape[1]} targets per example for {positions.shape[1]} positions; pass one "
                         "position per target.")
    n = input_ids.shape[1]
    if bool(((positions < 0) | (positions >= n)).any()):
        raise InputError(f"target positions {positions.tolist()} out of range for {n} tokens.")
    if bool((context & (torch.arange(n, device=context.device) >= positions.min(1).values[:, None])).any()):
        raise InputError("a context token at or after the first target position: the targets must be read after "
                         "the whole context (a token cannot be knocked out of its own prediction).")
    return positions, targets


def _checked_interval(interval: tuple[float, float]) -> tuple[float, float]:
    if (not isinstance(interval, (tuple, list)) or len(interval) != 2
            or not all(isinstance(end, (int, float)) and not isinstance(end, bool) for end in interval)
            or not 0.0 <= interval[0] < interval[1] <= 1.0):
        raise InputError(f"interval must be (a, b) with 0 <= a < b <= 1 (the part of the path from knocked out, 0, "
                         f"to present, 1), got {interval!r}.")
    return float(interval[0]), float(interval[1])


def _gated(log_gate: Tensor) -> Callable[[AttentionCall], tuple[Tensor, Tensor | None]]:
    r"""An attention capture that reruns the model's kernel with ``log_gate`` ``(batch, n)`` added to each key's
    logits in every row (the mask's own entries kept), queries, keys and values as the model computed them; the
    rerun's output and weights replace the call's (the ungated kernel never runs)."""
    def on_call(call: AttentionCall) -> tuple[Tensor, Tensor | None]:
        if call.implementation not in ("eager", "sdpa") or call.rerun is None:
            raise UnsupportedSetupError(f"knockout_gradients gates the attention mask of eager or sdpa attention, "
                                        f"not {call.implementation!r}: load the model with attn_implementation="
                                        "\"eager\".")
        dtype = call.query.dtype
        if call.mask is not None and call.mask.dim() == 4 and call.mask.is_floating_point():
            base = call.mask.to(dtype)  # [batch or 1, 1, query, key]
        else:  # a bool mask, or none (causality left to the kernel): the allowed keys, as the model reads them
            allowed = call.allowed_keys(torch.arange(call.query.shape[2], device=call.query.device))
            base = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
        mask = base + log_gate[:, None, None, -call.key.shape[2]:].to(dtype)  # [batch, 1, query, key]
        output, weights = call.rerun(call.query, call.key, call.value, mask)[:2]
        return output, weights
    return on_call


def knockout_gradients(
    model: nn.Module,
    input_ids: Tensor,
    context: Tensor,
    positions: Tensor,
    targets: Tensor,
    attention_mask: Tensor | None = None,
    n_steps: int = 1,
    interval: tuple[float, float] = (0.0, 1.0),
    foils: Tensor | None = None,
) -> KnockoutGradients:
    r"""
    Integrated Gradients of the targets' log-probability (with foils, log-odds) along the path that gates the
    context tokens' keys in every layer, from knocked out (0) to present (1), by the midpoint rule.

    Args:
        model (nn.Module): a causal language model of a supported architecture.
        input_ids (Tensor): ``(batch, n)`` token ids.
        context (Tensor): ``(batch, n)`` bool, True on the tokens to attribute (at least one per example, all
                    before the first target position). The other tokens (template, question) stay present.
        positions (Tensor): ``(batch,)`` or ``(batch, n_targets)`` long, where each target is read.
        targets (Tensor): shaped like ``positions``, each target token; several targets of an example are
                    explained together, as the sum of their log-probabilities.
        attention_mask (Tensor, optional): ``(batch, n)``, 1 for real tokens. Default: None
        n_steps (int, optional): path points; 1 reads the gradient at the interval's midpoint only. Default: 1
        interval (tuple of float, optional): ``(a, b)``, ``0 <= a < b <= 1``: the part of the path integrated.
                    ``(0, 0.1)`` reads the first tenth, from knocked out, where the gradient lies when the context
                    holds most of its rows' attention (docs/DESIGN.md, "Knockout gradients"). Default: (0.0, 1.0)
        foils (Tensor, optional): shaped like ``targets``, a token to contrast each target with: the path then
                    explains ``log p(target) - log p(foil)`` (why the target rather than the foil). Default: None
    Returns:
        :class:`KnockoutGradients`; with many steps the scores of an example sum to ``f(t = b) - f(t = a)``, over
        the whole path ``f(prompt) - f(context knocked out)`` (the completeness of Integrated Gradients).
    """
    require_model(model, "knockout_gradients")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise InputError(f"n_steps must be a positive int, got {n_steps!r}.")
    start, end = _checked_interval(interval)
    device = next(model.parameters()).device
    input_ids, context = input_ids.to(device), context.to(device)
    if foils is not None:
        foils = checked_foils(foils, targets.to(device)).reshape(len(input_ids), -1)  # [batch, t]
    positions, targets = _checked(input_ids, context, positions.to(device), targets.to(device))
    layers = find_attention_layers(model)
    batch, n = input_ids.shape
    points = start + (end - start) * (torch.arange(n_steps, dtype=torch.float64) + 0.5) / n_steps  # midpoints
    scores = torch.zeros(batch, n, dtype=torch.float32, device=device)
    objectives = []
    for point in points.tolist():
        gate = torch.where(context, point, 1.0).float().requires_grad_()  # [batch, n]
        with torch.enable_grad(), capture_attention(model, [layer.attention for layer in layers],
                                                    _gated(gate.log())):
            logits = getattr(model(input_ids=input_ids, attention_mask=attention_mask), "logits", None)
            if not isinstance(logits, Tensor) or logits.dim() != 3:
                raise UnsupportedSetupError(f"{type(model).__name__} returns no (batch, n, vocab) logits; use a "
                                            "causal language model (AutoModelForCausalLM).")
            objective = target_objective(logits, positions, targets, foils).sum(1)  # [batch]
            (gradient,) = torch.autograd.grad(objective.sum(), gate)  # [batch, n]
        scores += torch.where(context, gradient, 0.0) * ((end - start) / n_steps)
        objectives.append(objective.detach())
    return KnockoutGradients(scores=scores, objective=torch.stack(objectives, 1), points=points.float())
