"""One forward pass that hands each selected layer's geometry, chunk by chunk of query rows, to a callback."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall, capture_attention
from captum_cw.geometry import HeadGeometry

__all__ = ["ModelInputs", "prepare_inputs", "resolve_positions", "scan_geometry"]


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
    if not torch.is_floating_point(main) and main.dim() != 2:
        raise ValueError(f"token ids must have shape (batch, n), got {tuple(main.shape)}.")
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
    rows = torch.as_tensor(positions, dtype=torch.long).flatten()
    if rows.numel() == 0:
        raise ValueError("query_positions is empty; pass at least one position, or None for all.")
    if (rows >= n).any() or (rows < -n).any():
        raise ValueError(f"query_positions {rows.tolist()} out of range for a sequence of {n} tokens.")
    rows = rows % n
    if len(rows.unique()) != len(rows):
        raise ValueError(f"query_positions {positions!r} names a position twice; pass each position once.")
    return rows


def scan_geometry(
    model: nn.Module,
    layers: Sequence[AttentionLayer],
    model_inputs: ModelInputs,
    positional_args: tuple[Any, ...],
    query_positions: Sequence[int] | Tensor | None,
    on_chunk: Callable[[int, Tensor, HeadGeometry], None],
    chunk_size: int = 256,
) -> Any:
    r"""
    Runs ``model`` once and calls ``on_chunk(k, rows, geometry)`` for each selected
    layer (``k`` is its index in ``layers``) and each chunk of query ``rows``.

    Padded query rows get all-zero ``alpha``; so do padded keys.

    Returns:
        The model's own output.
    """
    slot = {id(layer.attention): k for k, layer in enumerate(layers)}
    padding = model_inputs.padding_mask

    def on_call(call: AttentionCall) -> None:
        k = slot[id(call.module)]
        device = call.query.device
        all_rows = resolve_positions(query_positions, call.query.shape[2]).to(device)
        values = call.values()  # [batch, head, key, d_head]
        if padding is not None and padding.shape[1] == values.shape[2]:  # padded keys may hold NaN states
            values = torch.where(padding.to(device)[:, None, :, None], values, 0.0)
        projections = layers[k].head_projections(call.n_heads, call.compute_dtype).to(device)  # [head, d_head, d_model]
        for rows in all_rows.split(chunk_size):
            alpha = call.alpha(rows)  # [batch, head, row, key]
            if padding is not None and padding.shape[1] == alpha.shape[-1]:
                mask = padding.to(device)
                alpha = alpha * mask[:, None, None, :] * mask[:, rows][:, None, :, None]
            on_chunk(k, rows, HeadGeometry(alpha, values, projections))

    with torch.no_grad(), capture_attention(model, [layer.attention for layer in layers], on_call):
        output = model(model_inputs.main, *positional_args, **model_inputs.keyword)
    return output
