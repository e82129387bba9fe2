"""The self-check: the recomputed attention must reproduce what the model itself computed.

The completeness identities hold by construction for any ``alpha`` and ``W_O``, so they
cannot tell whether ``alpha`` and ``W_O`` are the model's. Three checks on a few query rows
per layer can (docs/DESIGN.md, "Self-check"):

- ``alpha @ V`` recomputed from the call's queries, keys and mask equals the attention
  kernel's own output (catches dropout in train mode, position biases or other terms the
  recomputation lacks, cached keys, an intervention that replaced the output). For a
  half-precision kernel (not flash) that output is the kernel run once more on the call's own
  arguments in float32, held to float32's tolerance, so bfloat16 catches what float32 catches;
- the declared output projection receives that output during the forward pass (catches an
  ``output_projection`` that names another module: ``q_proj``, ``v_proj``, another layer's);
- ``sum_h o_h``, built from that output with ``W_O`` split per head, equals the
  output-projection module applied to it in float32, bias removed (catches a wrong weight
  layout or head split).

Errors are collected as tensors during the forward pass and compared once after it, so a
GPU run pays no host synchronisation per layer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall
from captum_cw.errors import SelfCheckError
from captum_cw.geometry import sum_heads

__all__ = ["LayerCheck", "ProjectionInput", "check_layer", "projection_hooks", "raise_on_mismatch", "tolerance"]

ROWS_CHECKED = 4
_HALF = (torch.float16, torch.bfloat16)


@dataclass
class ProjectionInput:
    r"""What the declared output projection must receive after one attention call: the kernel's output at the
    checked rows. A hook on the projection fills ``error`` the first time the projection runs after the call."""

    expected: Tensor  # [batch, r, head * d_head], the kernel's output in the model's dtype
    rows: Tensor  # [r] query positions
    real: Tensor  # [batch, r] bool, the rows compared
    n_query: int
    error: Tensor | None = None  # 0-dim: max |received - expected| / max |expected|; None: the projection never ran


@dataclass
class LayerCheck:
    r"""Relative errors of one layer's checked rows (0-dim tensors), and the dtypes whose tolerance applies."""

    layer: int
    mixed_error: Tensor  # max |alpha @ V - reference output| / max |reference output|
    projection_error: Tensor  # max |sum_h o_h - (W_O module - bias)| / max |W_O module - bias|, in compute dtype
    dtype: torch.dtype  # the kernel's
    kernel_finite: Tensor  # whether the kernel's own output is finite on the checked real rows
    received: ProjectionInput  # what the declared output projection received
    reference_dtype: torch.dtype  # the mixed check's reference: the kernel's output, or its float32 rerun
    compute_dtype: torch.dtype  # the projection check's


def tolerance(dtype: torch.dtype) -> float:
    r"""Largest relative error accepted for a quantity computed in ``dtype``: 16 units of its rounding (float16:
    0.016, bfloat16: 0.125), and at least 1e-4 (float32 kernels reorder sums)."""
    return max(1e-4, 16 * torch.finfo(dtype).eps)


def _relative_error(recomputed: Tensor, reference: Tensor, real: Tensor) -> Tensor:
    r"""``max |recomputed - reference| / max |reference|`` over the real entries (``real`` broadcasts)."""
    difference = torch.where(real, (recomputed - reference).abs(), 0.0).amax()
    scale = torch.where(real, reference.abs(), 0.0).amax()
    return difference / scale.clamp_min(torch.finfo(scale.dtype).tiny)


@contextmanager
def projection_hooks() -> Iterator[list[RemovableHandle]]:
    r"""
    Holds the hooks :func:`check_layer` puts on output projections during the block's forward pass, and removes
    them when the block ends, also on an exception.

    Returns:
        The list :func:`check_layer` appends its hooks to.
    """
    hooks: list[RemovableHandle] = []
    try:
        yield hooks
    finally:
        for hook in hooks:
            hook.remove()


def _watch_input(projection: nn.Module, received: ProjectionInput, hooks: list[RemovableHandle]) -> None:
    r"""Puts a hook on ``projection`` that compares the first input it receives from now on in this thread with
    ``received.expected``, as a tensor (no host synchronisation). A forward pass of another thread through the
    same module is not this call's."""
    thread = threading.get_ident()

    def compare(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if received.error is None and threading.get_ident() == thread:
            given = next((value for value in (*args, *kwargs.values()) if isinstance(value, Tensor)), None)
            received.error = _input_error(given, received)

    hooks.append(projection.register_forward_pre_hook(compare, with_kwargs=True))


def _input_error(given: Tensor | None, received: ProjectionInput) -> Tensor:
    r"""Relative error of ``given`` (the projection's input) against the kernel output; inf where its size differs."""
    expected = received.expected  # [batch, r, width]
    batch, _, width = expected.shape
    if given is None or given.numel() != batch * received.n_query * width:
        return torch.full((), float("inf"), device=expected.device)
    compute = torch.promote_types(expected.dtype, torch.float32)
    taken = given.detach().reshape(batch, received.n_query, width).index_select(1, received.rows.to(given.device))
    return _relative_error(taken.to(expected.device, compute), expected.to(compute), received.real[:, :, None])


def _reference_output(call: AttentionCall, rows: Tensor) -> Tensor:
    r"""
    What ``alpha @ V`` of the given query rows must reproduce, ``(batch, n_rows, head, d_head)``: the kernel's
    output, or for a half-precision kernel (float16, bfloat16) the same kernel run once more on the call's query,
    key, value and mask in float32, which is the model's computation on its own inputs without half-precision
    rounding, so that the check holds bfloat16 to float32's tolerance. Flash kernels compute in half precision
    only: they, and an output an earlier capture replaced, keep the kernel's output and its dtype's tolerance.
    """
    output = call.output
    if output.dtype not in _HALF or "flash" in call.implementation or call.replaced is not None:
        return output.index_select(1, rows)
    rerun = call.rerun_in(call.compute_dtype, rows)
    return output.index_select(1, rows) if rerun is None else rerun


def _projected(projection: nn.Module, attention_output: Tensor) -> Tensor:
    r"""The output projection's own forward on ``attention_output`` ``(batch, r, head * d_head)``, with its
    floating-point parameters and buffers in that tensor's dtype, less its bias: ``(batch, r, d_model)``."""
    dtype = attention_output.dtype
    state = {name: tensor.detach().to(dtype) if tensor.is_floating_point() else tensor
             for name, tensor in (*projection.named_parameters(), *projection.named_buffers())}
    with torch.no_grad():
        projected = torch.func.functional_call(projection, state, (attention_output,)).to(dtype)
    bias = getattr(projection, "bias", None)
    return projected if bias is None else projected - bias.detach().to(dtype)


def check_layer(
    layer: AttentionLayer,
    call: AttentionCall,
    rows: Tensor,
    alpha: Tensor,
    values: Tensor,
    projections: Tensor,
    padding: Tensor | None,
    hooks: list[RemovableHandle],
) -> LayerCheck:
    r"""
    Measures the checks on a few of the given rows; the output projection's input is compared when it runs,
    later in the forward pass.

    Args:
        layer (AttentionLayer): the layer, for its output projection.
        call (AttentionCall): the attention call, for the kernel's own output.
        rows (Tensor): query positions ``(n_rows,)`` that ``alpha`` holds.
        alpha (Tensor): recomputed weights of those rows ``(batch, head, n_rows, key)``.
        values (Tensor): value vectors per query head ``(batch, head, key, d_head)``.
        projections (Tensor): ``W_O`` per head ``(head, d_head, d_model)``.
        padding (Tensor, optional): ``(batch, n_query)`` bool, True for real tokens;
                    padded rows are not compared (kernels leave anything there).
        hooks (list): from :func:`projection_hooks` around the forward pass, which removes the hook put on the
                    output projection.
    Returns:
        The :class:`LayerCheck`, whose ``received`` error is filled when the output projection runs.
    """
    picked = torch.linspace(0, len(rows) - 1, min(ROWS_CHECKED, len(rows)), device=rows.device).round().long()
    checked = rows[picked]  # [r]
    kernel = call.output.detach().index_select(1, checked)  # [batch, r, head, d_head], the model's dtype
    real = torch.ones(kernel.shape[0], len(checked), dtype=torch.bool, device=kernel.device)  # [batch, r]
    if padding is not None and padding.shape[1] == call.output.shape[1]:
        real = padding.to(kernel.device)[:, checked]
    reference = _reference_output(call, checked).detach()  # [batch, r, head, d_head]
    mixed = alpha.index_select(2, picked) @ values  # [batch, head, r, d_head]
    mixed_error = _relative_error(mixed, reference.transpose(1, 2).to(alpha.dtype), real[:, None, :, None])
    kernel_heads = kernel.transpose(1, 2).to(alpha.dtype)  # [batch, head, r, d_head]
    kernel_finite = torch.where(real[:, None, :, None], kernel_heads.isfinite(), True).all()

    projected = _projected(layer.output_projection, kernel_heads.transpose(1, 2).flatten(2))  # [batch, r, d_model]
    summed = sum_heads(kernel_heads, projections)  # [batch, r, d_model]: sum_h o_h from the kernel's output
    projection_error = _relative_error(summed, projected, real[:, :, None])
    received = ProjectionInput(kernel.flatten(2), checked, real, call.output.shape[1])
    _watch_input(layer.output_projection, received, hooks)  # after _projected, whose call it must not see
    return LayerCheck(layer.index, mixed_error, projection_error, call.output.dtype, kernel_finite, received,
                      reference.dtype, alpha.dtype)


def _received_error(check: LayerCheck) -> Tensor:
    r"""The projection-input error of ``check`` as a float 0-dim tensor, -1 where the projection never ran."""
    error = check.received.error
    return torch.tensor(-1.0) if error is None else error.float()


def raise_on_mismatch(checks: list[LayerCheck]) -> None:
    r"""
    Raises a SelfCheckError naming the first layer whose recomputation does not match the model.

    Raises:
        SelfCheckError: with the layer, the size of the error and its likely causes.
    """
    if not checks:
        return
    errors = torch.stack([torch.stack([c.mixed_error.float(), c.projection_error.float(), c.kernel_finite.float(),
                                       _received_error(c).to(c.mixed_error.device)]).cpu() for c in checks]).tolist()
    for check, (mixed_error, projection_error, kernel_finite, received_error) in zip(checks, errors):
        if not kernel_finite:
            raise SelfCheckError(
                f"Self-check failed at layer {check.layer}: the model's own attention output is NaN or inf on real "
                "tokens, so no scores can describe it. Likely cause: padded rows that the model itself computes as "
                "NaN (e.g. a left-padded model cast to float64 after loading, whose fully masked rows turn into NaN "
                "and reach real tokens at the next layer), or non-finite weights. Check that model(...) alone gives "
                "finite outputs on these inputs, or pass them without padding."
            )
        limit = tolerance(check.reference_dtype)
        if not mixed_error <= limit:  # also catches NaN
            rerun = (f" (its {check.dtype} kernel rerun in {check.reference_dtype})"
                     if check.reference_dtype != check.dtype else "")
            raise SelfCheckError(
                f"Self-check failed at layer {check.layer}: the recomputed attention (alpha @ V) differs from the "
                f"model's own attention output{rerun} by {mixed_error:.3g} (relative; {check.reference_dtype} allows "
                f"{limit:.3g}), "
                "so the scores would not describe this model. Likely causes: dropout (call model.eval()), a "
                "position bias or other score term the recomputation lacks (e.g. T5's relative bias: run such a "
                "family with attn_implementation='eager', whose own weights are then used), cached keys "
                "(past_key_values), or another hook that replaced the attention output. Pass verify=False only if "
                "you know why."
            )
        if not 0 <= received_error <= tolerance(check.dtype):
            found = ("did not run after this layer's attention" if received_error < 0 else
                     f"received an input that differs from it by {received_error:.3g} (relative)")
            raise SelfCheckError(
                f"Self-check failed at layer {check.layer}: its output_projection does not receive the attention "
                f"output (the projection {found}), so W_O is not this layer's. Likely cause: the Architecture's "
                "output_projection names another module (q_proj, v_proj, another layer's projection); point it at "
                "the module the attention output goes into ('o_proj', '^.output.dense' for BERT) in the "
                "register_architecture() entry."
            )
        limit = tolerance(check.compute_dtype)
        if not projection_error <= limit:
            raise SelfCheckError(
                f"Self-check failed at layer {check.layer}: the head outputs summed through W_O differ from the "
                f"output projection applied to the attention output by {projection_error:.3g} (relative; "
                f"{check.compute_dtype} allows {limit:.3g}). Likely cause: a wrong Architecture.weight_layout "
                "('linear' for nn.Linear, 'conv1d' for GPT-2's Conv1D) or output_projection for this family; "
                "fix the register_architecture() entry."
            )
