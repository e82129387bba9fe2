"""Target-aware contributions: each token's first-order part of a target's log-probability, read through the
attention outputs (docs/DESIGN.md section 1, "Target-aware contributions").

Contribution weights project each token's weighted, projected value ``alpha_ij vt_j`` on the attention output
``o_i``; they explain the attention output, whatever the model then makes of it. Projecting the same vectors on
the gradient of a target instead, ``g_i = d log p(target) / d a_i`` with ``a_i`` the layer's attention output at
row ``i``, gives each token's first-order part of the target::

    s_l[j] = sum_h alpha[h, i, j] <vt[h, j], g_l[i]>          (rows="explained": the explained row i)
    s_l[j] = sum_k sum_h alpha[h, k, j] <vt[h, j], g_l[k]>    (rows="all": every row k that reads token j)

Removing token ``j``'s term from row ``i`` of layer ``l`` (the evaluator's value masking) changes the target's
log-probability by ``-s_l[j]`` to first order; with ``rows="all"`` the sum over every row is the first-order
effect of knocking token ``j`` out of the layer (the input-level knockout). Over the keys, ``s_l`` sums to
``<o_l[i], g_l[i]>`` (resp. its sum over the rows), the gradient times the layer's attention output: the
completeness identity :func:`target_scores` reports. One forward pass with the autograd graph and one backward
pass: about three forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall, capture_attention
from captum_cw.errors import InputError, UnsupportedSetupError
from captum_cw.geometry import HeadGeometry
from captum_cw.positions import Positions
from captum_cw.scan import ModelInputs, scan_geometry

__all__ = ["TARGET_ROWS", "TargetScores", "checked_foils", "target_objective", "target_scores"]

TARGET_ROWS = ("explained", "all")


@dataclass
class TargetScores:
    r"""
    What :func:`target_scores` computed for a batch.

    Attributes:
        scores (Tensor): ``(batch, n_layers, n)`` float32, each layer's first-order part of the targets' summed
                    log-probability (with foils, log-odds) per token, layers in the order given.
        per_target (Tensor or None): ``(batch, n_targets, n_layers, n)`` with ``rows="explained"``: the part of
                    ``scores`` that passes through each target's own row (they sum to ``scores``); None otherwise.
        totals (Tensor): ``(batch, n_layers)`` what each layer's scores sum to by the identity, computed from the
                    layer's own attention output (its output projection's output less its bias) and the gradient,
                    not from the scores.
        objective (Tensor): ``(batch, n_targets)`` each target's log-probability (with foils, its log-odds against
                    its foil).
        attention (Tensor): ``(batch, n_layers, n)`` the explained rows' attention weights, mean over heads and
                    the targets' rows.
        output (Any): the model's output.
    """

    scores: Tensor
    per_target: Tensor | None
    totals: Tensor
    objective: Tensor
    attention: Tensor
    output: Any


def target_objective(logits: Tensor, positions: Tensor, targets: Tensor, foils: Tensor | None = None) -> Tensor:
    r"""
    Each target's log-probability, or with ``foils`` its log-odds against each foil: ``(batch, n_targets)``.

    Args:
        logits (Tensor): ``(batch, n, vocab)`` of a language model (read at ``positions``) or ``(batch, classes)``
                    of a classifier.
        positions (Tensor): ``(batch, n_targets)`` long, where each target is read.
        targets (Tensor): ``(batch, n_targets)`` long, the tokens or classes.
        foils (Tensor, optional): shaped like ``targets``, the token or class each target is contrasted with:
                    ``log p(target) - log p(foil)`` at the same position (the difference of their logits), the
                    question "why this rather than that". Default: None (the log-probability)
    """
    if logits.dim() == 3:
        rows = logits[torch.arange(len(positions), device=logits.device)[:, None], positions]  # [batch, t, vocab]
    else:
        rows = logits[:, None].expand(-1, targets.shape[1], -1)  # [batch, t, classes]
    for name, tokens in (("target", targets), ("foil", foils)):
        if tokens is not None and not bool(((tokens >= 0) & (tokens < rows.shape[-1])).all()):
            raise InputError(f"{name} {tokens.tolist()} out of range: the model's output has {rows.shape[-1]} "
                             "entries per position (token ids of its vocabulary, or classes).")
    log_probs = rows.float().log_softmax(-1)  # [batch, t, vocab]
    objective = log_probs.gather(-1, targets[..., None]).squeeze(-1)  # [batch, t]
    if foils is None:
        return objective
    return objective - log_probs.gather(-1, checked_foils(foils, targets)[..., None]).squeeze(-1)


def checked_foils(foils: Tensor, targets: Tensor) -> Tensor:
    r"""
    ``foils`` as long, on the targets' device, after refusing a shape other than the targets' and a foil equal to
    its target (their log-odds would be 0 whatever the input).

    Args:
        foils (Tensor): the foils, shaped like ``targets``.
        targets (Tensor): the targets, as given.
    """
    if not isinstance(foils, Tensor) or foils.dtype == torch.bool or foils.is_floating_point() or foils.is_complex():
        raise InputError(f"foils must be an integer tensor of token ids or classes shaped like the targets, got "
                         f"{foils!r}.")
    if foils.shape != targets.shape:
        raise InputError(f"foils of shape {tuple(foils.shape)} for targets of shape {tuple(targets.shape)}: pass one "
                         "foil per target.")
    foils = foils.to(targets.device).long()
    if bool((foils == targets).any()):
        raise InputError("a foil equals its target, so their log-odds is 0 whatever the input: contrast the target "
                         "with another token or class.")
    return foils


def _requiring_grad(model: nn.Module, model_inputs: ModelInputs) -> Any:
    r"""A hook that makes the input embeddings require grad (a frozen model has no graph otherwise), or None for
    pixel inputs, which then require grad themselves."""
    if not model_inputs.is_text:
        model_inputs.main = model_inputs.main.detach().requires_grad_()
        return None
    get_embeddings: Any = getattr(model, "get_input_embeddings")
    embeddings: nn.Module = get_embeddings()

    def require_grad(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        return output if output.requires_grad else output.detach().requires_grad_()

    return embeddings.register_forward_hook(require_grad)


class _DifferentiatedPass(NamedTuple):
    r"""What :func:`_differentiated_pass` keeps of its forward and backward pass, layers keyed by their index in
    ``layers``."""

    explained: dict[int, HeadGeometry]  # the explained rows' geometry
    projected: dict[int, Tensor]  # the output projection's output [batch, n, d_model]
    values: dict[int, Tensor]  # the value vectors the kernel read [batch, kv_head, n, d_head]
    gradients: tuple[Tensor | None, ...]  # of the objective: each projected output, then (rows="all") each values
    objective: Tensor  # [batch, n_targets] each target's log-probability (or log-odds against its foil)
    output: Any  # the model's output


def _differentiated_pass(model: nn.Module, layers: Sequence[AttentionLayer], model_inputs: ModelInputs,
                         positional: tuple[Any, ...], wanted: Tensor, positions: Tensor, targets: Tensor,
                         foils: Tensor | None, *, rows: str, verify: bool) -> _DifferentiatedPass:
    r"""One forward pass with the autograd graph, keeping the geometry of the ``wanted`` rows and each layer's
    attention output (and value vectors), and one backward pass of the targets' objective to them."""
    explained: dict[int, HeadGeometry] = {}
    projected: dict[int, Tensor] = {}  # layer -> its output projection's output [batch, n, d_model]
    values: dict[int, Tensor] = {}  # layer -> the value vectors the kernel read [batch, kv_head, n, d_head]

    def keep_geometry(k: int, chunk_rows: Tensor, geometry: HeadGeometry) -> None:
        explained[k] = geometry  # one chunk: the explained rows are few

    def keep_values(call: AttentionCall) -> None:
        values[index_of[id(call.module)]] = call.value

    index_of = {id(layer.attention): k for k, layer in enumerate(layers)}
    hooks = [layer.output_projection.register_forward_hook(
        lambda module, args, output, k=k: projected.__setitem__(k, output)) for k, layer in enumerate(layers)]
    embedding_hook = _requiring_grad(model, model_inputs)
    try:
        with capture_attention(model, [layer.attention for layer in layers], keep_values):
            explained_rows = Positions.shared(wanted, allow_padding=True)  # each example reads its own among them
            output = scan_geometry(model, layers, model_inputs, positional, explained_rows, keep_geometry,
                                   chunk_size=len(wanted), verify=verify, grad=True)
        logits = getattr(output, "logits", None)
        if not isinstance(logits, Tensor):
            raise UnsupportedSetupError(f"{type(model).__name__} returns no logits, so a target has nothing to be "
                                        "read from: use a model with a language-modelling or classification head "
                                        "(e.g. AutoModelForCausalLM), or leave target out.")
        with torch.enable_grad():
            objective = target_objective(logits, positions, targets, foils)
        differentiated = [projected[k] for k in range(len(layers))]
        if rows == "all":
            differentiated += [values[k] for k in range(len(layers))]
        gradients = torch.autograd.grad(objective.sum(), differentiated, allow_unused=True)
    finally:
        for hook in hooks:
            hook.remove()
        if embedding_hook is not None:
            embedding_hook.remove()
    return _DifferentiatedPass(explained, projected, values, gradients, objective, output)


def target_scores(
    model: nn.Module,
    layers: Sequence[AttentionLayer],
    heads: Sequence[int] | None,
    model_inputs: ModelInputs,
    positional: tuple[Any, ...],
    positions: Tensor,
    targets: Tensor,
    rows: str = "explained",
    *,
    foils: Tensor | None = None,
    verify: bool = True,
) -> TargetScores:
    r"""
    Each token's first-order part of the target's log-probability (with foils, its log-odds) through each selected
    layer's attention output, from one forward pass with the autograd graph and one backward pass.

    Args:
        model (nn.Module): the model (its parameters need not require grad).
        layers (Sequence[AttentionLayer]): the layers to score.
        heads (Sequence[int], optional): the heads summed (``rows="explained"`` only); None for all.
        model_inputs (ModelInputs), positional (tuple): the prepared model call.
        positions (Tensor): ``(batch,)`` or ``(batch, n_targets)`` long, where each target is read (the explained
                    rows).
        targets (Tensor): shaped like ``positions``, each target token or class; several targets of an example
                    (a response) are explained together, as the sum of their log-probabilities.
        rows (str, optional): ``"explained"`` (the explained row) or ``"all"`` (every row). Default: ``"explained"``
        foils (Tensor, optional): shaped like ``targets``, a token or class to contrast each target with: the
                    scores then explain ``log p(target) - log p(foil)`` (:func:`target_objective`), which is linear in
                    the gradient, so they equal the target's scores less the foil's. Default: None
        verify (bool, optional): run the self-check. Default: True
    Returns:
        :class:`TargetScores`.
    """
    if rows not in TARGET_ROWS:
        raise InputError(f"rows must be one of {', '.join(TARGET_ROWS)}, got {rows!r}.")
    if rows == "all" and heads is not None:
        raise UnsupportedSetupError("rows='all' reads the gradient of the value vectors, which grouped heads share; "
                                    "it sums every head: pass heads=None, or rows='explained' for a head subset.")
    device = model_inputs.main.device
    if foils is not None:
        foils = checked_foils(foils, targets.to(device)).reshape(len(targets), -1)  # [batch, t]
    positions, targets = positions.to(device).reshape(len(positions), -1), targets.to(device).reshape(
        len(targets), -1)  # [batch, t]
    if positions.shape != targets.shape:
        raise InputError(f"{targets.shape[1]} targets per example for {positions.shape[1]} positions; pass one "
                         "position per target.")
    wanted = positions.unique()  # the explained rows of the batch, sorted
    slot = torch.searchsorted(wanted, positions)  # [batch, t] each target's row among them
    found = _differentiated_pass(model, layers, model_inputs, positional, wanted, positions, targets, foils,
                                 rows=rows, verify=verify)
    explained, projected, values, gradients = found.explained, found.projected, found.values, found.gradients
    batch = torch.arange(len(positions), device=device)[:, None]  # [batch, 1]
    per_layer, per_target, totals, attention = [], [], [], []
    for k, layer in enumerate(layers):
        alpha = explained[k].alpha.transpose(1, 2)[batch, slot].transpose(1, 2)  # [batch, head, t, key]
        attention.append(alpha.mean((1, 2)).float())
        gradient = _zero_if_unused(gradients[k], projected[k]).float()  # [batch, n, d_model]
        attention_output = projected[k].detach().float()
        bias = getattr(layer.output_projection, "bias", None)
        if bias is not None:
            attention_output = attention_output - bias.detach().float()
        if rows == "explained":
            direction = gradient[batch, positions][:, None]  # [batch, 1, t, d_model]
            single = HeadGeometry(alpha, explained[k].values, explained[k].head_projections)
            head_scores = single.projected_on(direction.to(alpha.dtype))  # [batch, head, t, key]
            if heads is not None:
                head_scores = head_scores[:, list(heads)]
            per_target.append(head_scores.sum(1).float())  # [batch, t, key]
            per_layer.append(per_target[-1].sum(1))  # [batch, key]
            totals.append((attention_output[batch, positions] * gradient[batch, positions]).sum((1, 2)))
        else:
            value_gradient = _zero_if_unused(gradients[len(layers) + k], values[k]).float()
            per_layer.append((values[k].detach().float() * value_gradient).sum((1, 3)))  # [batch, key]
            totals.append((attention_output * gradient).sum((1, 2)))
    return TargetScores(torch.stack(per_layer, 1), torch.stack(per_target, 2) if per_target else None,
                        torch.stack(totals, 1), found.objective.detach(), torch.stack(attention, 1), found.output)


def _zero_if_unused(gradient: Tensor | None, like: Tensor) -> Tensor:
    r"""The gradient, or zeros where the tensor did not reach the target (e.g. a layer after the last read)."""
    return torch.zeros_like(like) if gradient is None else gradient
