"""One forward pass that hands each selected layer's geometry, chunk by chunk of query rows, to a callback."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall, capture_attention, take_rows
from captum_cw.geometry import HeadGeometry
from captum_cw.self_check import LayerCheck, check_layer, projection_hooks, raise_on_mismatch

__all__ = ["CHUNK_ELEMENTS", "ModelInputs", "check_inputs", "prepare_inputs", "resolve_positions", "scan_geometry"]

CHUNK_ELEMENTS = 2**24
r"""Numbers in one ``(batch, head, row, key)`` block when the chunk size is not given (at least one row): n = 512
with 9 heads is one chunk, n = 8192 chunks of 227 rows. A chunk holds a few such blocks at once (alpha, the
scores, their product), about 4-5 x 64 MiB in float32 and twice that in float64. Larger chunks spend less on
per-chunk work; the block bounds memory at long n."""


@dataclass
class ModelInputs:
    r"""What the model is called with, plus the padding mask that attribution needs."""

    main: Tensor  # [batch, n] token ids, or pixel values
    keyword: dict[str, Any]  # everything else passed to the model, attention_mask included
    padding_mask: Tensor | None  # [batch, n] bool, True = real token; None when nothing is padded

    @property
    def is_text(self) -> bool:
        return not torch.is_floating_point(self.main)


def prepare_inputs(
    inputs: Tensor | Mapping[str, Any],
    attention_mask: Tensor | None,
    additional_forward_args: Mapping[str, Any] | Sequence[Any] | None,
    device: torch.device,
) -> tuple[ModelInputs, tuple[Any, ...]]:
    r"""
    Normalises captum-style arguments into a model call.

    Returns:
        The :class:`ModelInputs` and the positional ``additional_forward_args``.
    """
    keyword: dict[str, Any] = {}
    if isinstance(inputs, Mapping):
        keyword = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values")}
        main = inputs.get("input_ids", inputs.get("pixel_values"))
        if main is None:
            raise ValueError("inputs is a mapping without 'input_ids' or 'pixel_values'; pass the token ids or pixels.")
        if attention_mask is None:
            attention_mask = keyword.pop("attention_mask", None)
        else:
            keyword.pop("attention_mask", None)
    elif isinstance(inputs, Tensor):
        main = inputs
    else:
        raise ValueError(
            "inputs must be a tensor of token ids / pixel values or a tokenizer's BatchEncoding, "
            f"got {type(inputs).__name__}."
        )
    if not torch.is_floating_point(main) and main.dim() == 1:
        main = main.unsqueeze(0)
    positional: tuple[Any, ...] = ()
    if isinstance(additional_forward_args, Mapping):
        keyword.update(additional_forward_args)
    elif additional_forward_args is not None:
        positional = tuple(additional_forward_args) if isinstance(additional_forward_args, (tuple, list)) else (
            additional_forward_args,
        )
    main = main.to(device)
    padding_mask = None
    if attention_mask is not None:
        if attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
        if main.is_floating_point() or attention_mask.shape != main.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but inputs have shape "
                f"{tuple(main.shape)}; pass one 0/1 entry per token, shape (batch, n)."
            )
        attention_mask = attention_mask.to(device)
        keyword["attention_mask"] = attention_mask
        padding_mask = attention_mask.bool()
    keyword = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in keyword.items()}
    return ModelInputs(main, keyword, padding_mask), positional


def resolve_positions(positions: Sequence[int] | Tensor | None, n: int) -> Tensor:
    r"""Query positions as a long tensor in ``[0, n)``; negative positions count from the end."""
    if positions is None:
        return torch.arange(n)
    given = torch.as_tensor(positions)
    if given.numel() == 0:
        raise ValueError("query_positions is empty; pass at least one position, or None for all.")
    if given.dtype == torch.bool or given.is_floating_point() or given.is_complex():
        raise ValueError(f"query_positions must be integer positions, got {given.dtype} {positions!r}; "
                         "pass e.g. [-1] for the last row.")
    rows = given.long().flatten()
    if (rows >= n).any() or (rows < -n).any():
        raise ValueError(f"query_positions {rows.tolist()} out of range for a sequence of {n} tokens.")
    rows = rows % n
    if len(rows.unique()) != len(rows):
        raise ValueError(f"query_positions {positions!r} names a position twice; pass each position once.")
    return rows


def check_inputs(model: nn.Module, model_inputs: ModelInputs) -> None:
    r"""
    Refuses, before any forward pass, inputs that would fail late or give wrong scores.

    Raises:
        ValueError: for a model in training mode, cached keys, token ids that are
                    empty, not integers or outside the vocabulary, or integer pixels.
    """
    if any(module.training for module in model.modules()):
        raise ValueError("The model (or one of its modules) is in training mode: dropout would make its attention "
                         "random and differ from the recomputed one. Call model.eval() first.")
    if model_inputs.keyword.get("past_key_values") is not None:
        raise ValueError("past_key_values is not supported: cached keys have no query rows to attribute. Pass the "
                         "whole sequence (prompt and continuation) as inputs instead.")
    main, expects = model_inputs.main, getattr(model, "main_input_name", "input_ids")
    if expects == "input_ids" and main.is_floating_point():
        raise ValueError(f"inputs are {main.dtype}, but {type(model).__name__} takes token ids: pass the "
                         "tokenizer's input_ids (integers).")
    if expects == "pixel_values" and not main.is_floating_point():
        raise ValueError(f"inputs are {main.dtype}, but {type(model).__name__} takes pixel values: pass the "
                         "image processor's pixel_values (floating point).")
    if main.is_floating_point():
        return
    if main.dim() != 2:
        raise ValueError(f"token ids must have shape (batch, n), got {tuple(main.shape)}.")
    if main.numel() == 0:
        raise ValueError(f"inputs have no tokens (shape {tuple(main.shape)}); pass at least one token per example.")
    get_embeddings: Any = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    vocabulary = getattr(embeddings, "num_embeddings", None)
    if vocabulary is not None:
        low, high = main.aminmax()
        if low < 0 or high >= vocabulary:
            raise ValueError(f"token ids range over [{int(low)}, {int(high)}] but the model's vocabulary has "
                             f"{vocabulary} entries; encode the text with this model's own tokenizer.")


def kernel_rows(call: AttentionCall, rows: Tensor) -> tuple[Tensor, Tensor] | None:
    r"""
    ``alpha`` ``(batch, head, row, key)`` and mixed values ``(batch, head, row, d_head)`` of ``rows`` as the
    attention kernel itself computed them, when it returned its weights in the dtype of the recomputation
    (eager in float32 or float64), else None. Taking them saves recomputing the scores, the softmax and
    ``alpha @ V``; the self-check still compares the two with the kernel's output (docs/DESIGN.md,
    "Self-check").
    """
    weights = call.weights
    if weights is None or weights.dtype != call.compute_dtype or weights.shape[-2:] != (
            call.query.shape[2], call.key.shape[2]) or weights.shape[1] != call.n_heads:
        return None
    alpha = take_rows(weights.detach(), 2, rows)  # [batch, head, row, key]
    mixed = take_rows(call.output.detach(), 1, rows).transpose(1, 2)  # [batch, head, row, d_head]
    return alpha, mixed


def scan_geometry(
    model: nn.Module,
    layers: Sequence[AttentionLayer],
    model_inputs: ModelInputs,
    positional_args: tuple[Any, ...],
    query_positions: Sequence[int] | Tensor | None,
    on_chunk: Callable[[int, Tensor, HeadGeometry], None],
    chunk_size: int | None = None,
    verify: bool = True,
) -> Any:
    r"""
    Runs ``model`` once and calls ``on_chunk(k, rows, geometry)`` for each selected
    layer (``k`` is its index in ``layers``) and each chunk of query ``rows``
    (``chunk_size`` rows; None: as many as keep ``alpha`` within :data:`CHUNK_ELEMENTS`).

    Padded query rows get all-zero ``alpha``; so do padded keys. With ``verify``,
    a few rows of each layer's first chunk go through the self-check
    (:mod:`captum_cw.self_check`), which raises after the forward pass if the
    recomputation does not reproduce the model.

    Returns:
        The model's own output.
    """
    slot = {id(layer.attention): k for k, layer in enumerate(layers)}
    padding = model_inputs.padding_mask
    checks: list[LayerCheck] = []

    def on_call(call: AttentionCall) -> None:
        k = slot[id(call.module)]
        device = call.query.device
        all_rows = resolve_positions(query_positions, call.query.shape[2]).to(device)
        values = call.values()  # [batch, head, key, d_head]
        if padding is not None and padding.shape[1] == values.shape[2]:  # padded keys may hold NaN states
            values = torch.where(padding.to(device)[:, None, :, None], values, 0.0)
        projections = layers[k].head_projections(call.n_heads, call.compute_dtype).to(device)  # [head, d_head, d_model]
        per_chunk = chunk_size or max(1, CHUNK_ELEMENTS // (values.shape[0] * call.n_heads * values.shape[2]))
        for chunk, rows in enumerate(all_rows.split(per_chunk)):
            alpha, mixed = kernel_rows(call, rows) or (call.alpha(rows), None)  # [b, head, row, key], [.., d_head]
            if padding is not None and padding.shape[1] == alpha.shape[-1]:
                mask = padding.to(device)
                real_rows = mask[:, rows][:, None, :, None]  # [batch, 1, row, 1]
                alpha = alpha * mask[:, None, None, :] * real_rows
                mixed = None if mixed is None else torch.where(real_rows, mixed, 0.0)
            if verify and chunk == 0:
                checks.append(check_layer(layers[k], call, rows, alpha, values, projections, padding, hooks))
            on_chunk(k, rows, HeadGeometry(alpha, values, projections, mixed))

    with torch.no_grad(), projection_hooks() as hooks, capture_attention(model, [x.attention for x in layers], on_call):
        output = model(model_inputs.main, *positional_args, **model_inputs.keyword)
    raise_on_mismatch(checks)
    return output
