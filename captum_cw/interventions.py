"""Causal interventions on attention: remove chosen keys from chosen query rows by masking their values.

Removing key ``j`` from row ``i`` of head ``h`` at layer ``l`` subtracts ``alpha[h,i,j] * v[h,j]``
from the head's mixed value, so the layer output ``o_i`` loses exactly ``alpha[h,i,j] * vt[h,j]``
(docs/DESIGN.md section 2). By default the remaining weights are not renormalised; with
``renormalize=True`` they are rescaled to sum to 1 again.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from captum_cw.architectures import find_attention_layers
from captum_cw.capture import AttentionCall, capture_attention, take_rows
from captum_cw.errors import InputError
from captum_cw.selection import select_indices
from captum_cw.self_check import tolerance

__all__ = ["mask_values", "knockout_tokens", "scale_values"]


@contextmanager
def mask_values(
    model: nn.Module,
    removals: Mapping[int, Tensor],
    *,
    renormalize: bool = False,
) -> Iterator[None]:
    r"""
    Inside the ``with`` block, every forward pass of ``model`` runs with the given
    keys removed from the given query rows.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        removals (Mapping[int, Tensor]): layer index (negative counts from the end)
                    -> bool tensor of the keys to remove, ``(batch, n_heads or 1,
                    n_query, n_key)``; a head dimension of 1 removes the key from
                    every head.
        renormalize (bool, optional): rescale the kept weights of each row to sum
                    to 1 (a row left with no weight becomes 0). Default: False

    Interventions are for forward passes: the removed terms (and, where every row changes, the whole
    attention output of the layer) are computed from detached queries, keys and values, so gradients
    taken inside the block do not flow through the intervened layers' attention.

    Examples::

        >>> ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
        >>> n = ids.shape[1]
        >>> removal = torch.zeros(1, 1, n, n, dtype=torch.bool)
        >>> removal[0, 0, -1, 0] = True  # the last row no longer reads token 0
        >>> with mask_values(model, {5: removal}):
        ...     logits = model(ids).logits
    """
    with _removed_shares(model, removals, renormalize=renormalize):
        yield


@contextmanager
def scale_values(
    model: nn.Module,
    scales: Mapping[int, Tensor],
    *,
    renormalize: bool = False,
) -> Iterator[None]:
    r"""
    Inside the ``with`` block, row ``i`` of head ``h`` at a given layer keeps only ``scale[h, i, j]`` of
    each key's term: its mixed value becomes ``sum_j scale_hij alpha_hij v_hj``, so the layer output
    ``o_i`` loses ``(1 - scale_hij) alpha_hij vt_hj``. A scale of 1 keeps a key, 0 removes it as
    :func:`mask_values` does.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        scales (Mapping[int, Tensor]): layer index (negative counts from the end) -> float tensor
                    ``(batch, n_heads or 1, n_query, n_key)`` of the share of each term kept, in ``[0, 1]``.
        renormalize (bool, optional): rescale the kept weights ``scale * alpha`` of each row to sum to 1.
                    Default: False
    """
    with _removed_shares(model, {layer: 1 - scale for layer, scale in scales.items()}, renormalize=renormalize):
        yield


@contextmanager
def _removed_shares(model: nn.Module, removals: Mapping[int, Tensor], *, renormalize: bool) -> Iterator[None]:
    r"""The share of each key's term removed, bool (all or nothing) or float in [0, 1], per layer (mask_values)."""
    layers = find_attention_layers(model)
    indices = select_indices(list(removals), len(layers), "layer")  # in range, each layer once (-1 and n - 1 alike)
    by_module = {id(layers[index].attention): removal for index, removal in zip(indices, removals.values())}

    def on_call(call: AttentionCall) -> Tensor | None:
        removal = by_module[id(call.module)].to(call.query.device)
        n_query, n_key = call.query.shape[2], call.key.shape[2]
        batch = call.query.shape[0]
        if (removal.dim() != 4 or removal.shape[-2:] != (n_query, n_key) or removal.shape[1] not in (1, call.n_heads)
                or removal.shape[0] not in (1, batch)):
            raise InputError(
                f"removal mask has shape {tuple(removal.shape)}; expected ({batch} or 1, {call.n_heads} or 1, "
                f"{n_query}, {n_key}) for this input."
            )
        rows = (removal != 0).flatten(0, 1).any(0).any(-1).nonzero().flatten()  # rows that lose a key
        if len(rows) == 0:
            return None
        alpha = call.alpha(rows)  # [batch, head, row, key]
        every_row = len(rows) == n_query
        if every_row and call.replaced is None and _recomputes_exactly(call, alpha):
            # the layer-level protocol's case: mix the kept terms, the kernel need not run
            kept = alpha * (1 - removal.to(alpha.dtype))  # a head dimension of 1 broadcasts
            mixed = call.mix(kept)  # [batch, head, row, d_head]
        else:  # the output as it stands (the kernel's, or an outer capture's), less the removed terms
            removed = alpha * take_rows(removal, 2, rows)
            kept = alpha - removed
            mixed = take_rows(call.output, 1, rows).transpose(1, 2).to(alpha.dtype) - call.mix(removed)
        if renormalize:
            total = kept.sum(-1, keepdim=True)  # [batch, head, row, 1]
            mixed = torch.where(total > 0, mixed / torch.where(total > 0, total, 1.0), 0.0)
        mixed = mixed.transpose(1, 2)  # [batch, row, head, d_head]
        return mixed if every_row else call.output.index_copy(1, rows, mixed.to(call.output.dtype))

    with capture_attention(model, [layers[index].attention for index in indices], on_call):
        yield


# modules whose recomputed alpha @ V reproduces their kernel, per (implementation, dtype, device type): checked
# once per process on the first intervention that would rely on it (docs/DESIGN.md, "Capture")
_EXACT: weakref.WeakKeyDictionary[nn.Module, dict[tuple, bool]] = weakref.WeakKeyDictionary()


def _recomputes_exactly(call: AttentionCall, alpha: Tensor) -> bool:
    r"""
    Whether ``alpha @ V`` recomputed for every row (``alpha`` ``(batch, head, n_query, key)``) equals the
    kernel's output within the self-check's tolerance: only then may an intervention build the whole output
    from the recomputation. A kernel with terms the recomputation lacks (learned sink logits, a position
    bias outside the mask) keeps its own output, less the removed terms.
    """
    key = (call.implementation, call.query.dtype, call.query.device.type)
    known = _EXACT.setdefault(call.module, {})
    if key not in known:
        kernel = call.output.detach().transpose(1, 2).to(alpha.dtype)  # runs the kernel: [batch, head, row, d_head]
        real = torch.isfinite(kernel).all(-1, keepdim=True) & (alpha.sum(-1, keepdim=True) > 0)  # rows with keys
        difference = torch.where(real, (call.mix(alpha) - kernel).abs(), 0.0).amax()
        scale = torch.where(real, kernel.abs(), 0.0).amax().clamp_min(torch.finfo(alpha.dtype).tiny)
        known[key] = bool(difference / scale <= tolerance(call.query.dtype))
    return known[key]


@contextmanager
def knockout_tokens(model: nn.Module, tokens: Tensor, *, renormalize: bool = False) -> Iterator[None]:
    r"""
    Removes input tokens from the context at every layer and head: no query row
    (other than the token's own) reads their values.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        tokens (Tensor): bool ``(batch, n)``, True for the tokens to knock out.
        renormalize (bool, optional): as in :func:`mask_values`. Default: False
    """
    n = tokens.shape[1]
    removal = tokens[:, None, None, :] & ~torch.eye(n, dtype=torch.bool, device=tokens.device)  # [b, 1, q, k]
    layers = range(len(find_attention_layers(model)))
    with mask_values(model, {layer: removal for layer in layers}, renormalize=renormalize):
        yield
