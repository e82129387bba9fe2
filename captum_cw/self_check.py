"""The self-check: the recomputed attention must reproduce what the model itself computed.

The completeness identities hold by construction for any ``alpha`` and ``W_O``, so they
cannot tell whether ``alpha`` and ``W_O`` are the model's. Two checks on a few query rows
per layer can (docs/DESIGN.md, "Self-check"):

- ``alpha @ V`` recomputed from the call's queries, keys and mask equals the attention
  kernel's own output (catches dropout in train mode, position biases or other terms the
  recomputation lacks, cached keys, an intervention that replaced the output);
- ``sum_h o_h``, built from that output with ``W_O`` split per head, equals the
  output-projection module applied to it, bias removed (catches a wrong weight layout or
  head split).

Errors are collected as tensors during the forward pass and compared once after it, so a
GPU run pays no host synchronisation per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall
from captum_cw.geometry import sum_heads

__all__ = ["LayerCheck", "check_layer", "raise_on_mismatch", "tolerance"]

ROWS_CHECKED = 4


@dataclass
class LayerCheck:
    r"""Relative errors of one layer's checked rows (0-dim tensors) and the kernel's dtype."""

    layer: int
    mixed_error: Tensor  # max |alpha @ V - kernel output| / max |kernel output|
    projection_error: Tensor  # max |sum_h o_h - (W_O module - bias)| / max |W_O module - bias|
    dtype: torch.dtype
    kernel_finite: Tensor  # whether the kernel's own output is finite on the checked real rows


def tolerance(dtype: torch.dtype) -> float:
    r"""Largest relative error accepted for a kernel that computes in ``dtype``: 16 units of its
    rounding (float16: 0.016, bfloat16: 0.125), and at least 1e-4 (float32 kernels reorder sums)."""
    return max(1e-4, 16 * torch.finfo(dtype).eps)


def _relative_error(recomputed: Tensor, reference: Tensor, real: Tensor) -> Tensor:
    r"""``max |recomputed - reference| / max |reference|`` over the real entries (``real`` broadcasts)."""
    difference = torch.where(real, (recomputed - reference).abs(), 0.0).amax()
    scale = torch.where(real, reference.abs(), 0.0).amax()
    return difference / scale.clamp_min(torch.finfo(scale.dtype).tiny)


def check_layer(
    layer: AttentionLayer,
    call: AttentionCall,
    rows: Tensor,
    alpha: Tensor,
    values: Tensor,
    projections: Tensor,
    padding: Tensor | None,
) -> LayerCheck:
    r"""
    Measures both checks on a few of the given rows.

    Args:
        layer (AttentionLayer): the layer, for its output projection.
        call (AttentionCall): the attention call, for the kernel's own output.
        rows (Tensor): query positions ``(n_rows,)`` that ``alpha`` holds.
        alpha (Tensor): recomputed weights of those rows ``(batch, head, n_rows, key)``.
        values (Tensor): value vectors per query head ``(batch, head, key, d_head)``.
        projections (Tensor): ``W_O`` per head ``(head, d_head, d_model)``.
        padding (Tensor, optional): ``(batch, n_query)`` bool, True for real tokens;
                    padded rows are not compared (kernels leave anything there).
    """
    picked = torch.linspace(0, len(rows) - 1, min(ROWS_CHECKED, len(rows)), device=rows.device).round().long()
    checked = rows[picked]  # [r]
    kernel = call.output.detach().index_select(1, checked)  # [batch, r, head, d_head], the model's dtype
    real = torch.ones(kernel.shape[0], len(checked), dtype=torch.bool, device=kernel.device)  # [batch, r]
    if padding is not None and padding.shape[1] == call.output.shape[1]:
        real = padding.to(kernel.device)[:, checked]
    kernel_heads = kernel.transpose(1, 2).to(alpha.dtype)  # [batch, head, r, d_head]
    mixed = alpha.index_select(2, picked) @ values  # [batch, head, r, d_head]
    mixed_error = _relative_error(mixed, kernel_heads, real[:, None, :, None])
    kernel_finite = torch.where(real[:, None, :, None], kernel_heads.isfinite(), True).all()

    projection = layer.output_projection
    with torch.no_grad():
        projected = projection(kernel.flatten(2)).to(alpha.dtype)  # [batch, r, d_model]
    bias = getattr(projection, "bias", None)
    if bias is not None:
        projected = projected - bias.detach().to(alpha.dtype)
    summed = sum_heads(kernel_heads, projections)  # [batch, r, d_model]: sum_h o_h from the kernel's output
    projection_error = _relative_error(summed, projected, real[:, :, None])
    return LayerCheck(layer.index, mixed_error, projection_error, call.output.dtype, kernel_finite)


def raise_on_mismatch(checks: list[LayerCheck]) -> None:
    r"""
    Raises a ValueError naming the first layer whose recomputation does not match the model.

    Raises:
        ValueError: with the layer, the size of the error and its likely causes.
    """
    if not checks:
        return
    errors = torch.stack([torch.stack([c.mixed_error.float(), c.projection_error.float(), c.kernel_finite.float()])
                          .cpu() for c in checks]).tolist()
    for check, (mixed_error, projection_error, kernel_finite) in zip(checks, errors):
        limit = tolerance(check.dtype)
        if not kernel_finite:
            raise ValueError(
                f"Self-check failed at layer {check.layer}: the model's own attention output is NaN or inf on real "
                "tokens, so no scores can describe it. Likely cause: padded rows that the model itself computes as "
                "NaN (e.g. a left-padded model cast to float64 after loading, whose fully masked rows turn into NaN "
                "and reach real tokens at the next layer), or non-finite weights. Check that model(...) alone gives "
                "finite outputs on these inputs, or pass them without padding."
            )
        if not mixed_error <= limit:  # also catches NaN
            raise ValueError(
                f"Self-check failed at layer {check.layer}: the recomputed attention (alpha @ V) differs from the "
                f"model's own attention output by {mixed_error:.3g} (relative; {check.dtype} allows {limit:.3g}), "
                "so the scores would not describe this model. Likely causes: dropout (call model.eval()), a "
                "position bias or other score term the recomputation lacks (e.g. T5's relative bias: run such a "
                "family with attn_implementation='eager', whose own weights are then used), cached keys "
                "(past_key_values), or another hook that replaced the attention output. Pass verify=False only if "
                "you know why."
            )
        if not projection_error <= limit:
            raise ValueError(
                f"Self-check failed at layer {check.layer}: the head outputs summed through W_O differ from the "
                f"output projection applied to the attention output by {projection_error:.3g} (relative; "
                f"{check.dtype} allows {limit:.3g}). Likely cause: a wrong Architecture.weight_layout "
                "('linear' for nn.Linear, 'conv1d' for GPT-2's Conv1D) or output_projection for this family; "
                "fix the register_architecture() entry."
            )
