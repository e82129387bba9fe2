"""Exclusions: the tokens a ranking leaves out (the first token, special tokens, attention sinks), with one meaning
for every entry point that takes ``exclude`` (:class:`~captum_cw.TokenContributions`, the text front end, the views
and the faithfulness protocols)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from captum_cw.errors import InputError
from captum_cw.positions import Positions

__all__ = ["EXCLUSIONS", "SINK_THRESHOLD", "Exclusion", "check_exclusion", "excluded_tokens", "sink_keys",
           "special_ids"]

Exclusion = str | Sequence[int] | Tensor | None

EXCLUSIONS = ("first", "special", "sinks")
r"""Named exclusions: ``"first"`` (each example's first real token), ``"special"`` (tokens whose id is the
model's BOS, EOS or padding id), ``"sinks"`` (the special tokens and every token that takes more than
:data:`SINK_THRESHOLD` of the explained position's attention, mean over heads and the selected layers:
:func:`sink_keys`)."""
SINK_THRESHOLD = 0.3  # as captum_cw.sinks detects sinks (Gu et al., 2024)


def check_exclusion(exclude: Exclusion, *, named_only: bool = False) -> None:
    r"""
    Refuses an unknown named exclusion (an :class:`~captum_cw.errors.InputError` listing :data:`EXCLUSIONS`);
    with ``named_only``, anything but a name or None too (positions and masks are checked by
    :func:`excluded_tokens`, which knows the batch).
    """
    if exclude is None or (isinstance(exclude, str) and exclude in EXCLUSIONS):
        return
    if isinstance(exclude, str) or named_only:
        also = "" if named_only else ", positions, or a bool (batch, n) mask"
        raise InputError(f"exclude must be one of {', '.join(EXCLUSIONS)}{also}; got {exclude!r}.")


def special_ids(model: nn.Module) -> list[int]:
    r"""The model's BOS, EOS and padding ids, from its configuration (and generation configuration)."""
    ids: set[int] = set()
    for config in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None)
            ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
    return sorted(i for i in ids if isinstance(i, int))


def sink_keys(attention: Tensor, threshold: float = SINK_THRESHOLD) -> Tensor:
    r"""
    The attention sinks of explained rows: the keys whose attention, mean over the layers given, exceeds
    ``threshold``.

    Args:
        attention (Tensor): ``(..., layers, n)``: each explained row's attention per layer (mean over heads).
        threshold (float, optional): the share of the row's attention above which a key is a sink.
                    Default: :data:`SINK_THRESHOLD`
    Returns:
        bool ``(..., n)``.
    """
    return attention.mean(-2) > threshold


def excluded_tokens(exclude: Exclusion, ids: Tensor, padding: Tensor | None, model: nn.Module,
                    attention: Tensor | None = None, threshold: float = SINK_THRESHOLD) -> Tensor:
    r"""
    The tokens an exclusion leaves out of a ranking.

    Args:
        exclude (str, Sequence[int] or Tensor, optional): a name of :data:`EXCLUSIONS`; positions shared by the
                    batch (:class:`~captum_cw.positions.Positions`: negative ones count back from each example's
                    last real token); a bool ``(batch, n)`` mask; or None (nothing).
        ids (Tensor): ``(batch, n)`` token ids.
        padding (Tensor, optional): ``(batch, n)`` bool, True for real tokens. Default: all real.
        model (nn.Module): the model, for its special ids (:func:`special_ids`).
        attention (Tensor, optional): for ``"sinks"``, the explained rows' attention per layer (mean over heads),
                    ``(batch, layers, n)`` for one row per example or ``(batch, rows, layers, n)``
                    (:func:`sink_keys`). Needed by ``"sinks"`` (an InputError without it).
        threshold (float, optional): for ``"sinks"``. Default: :data:`SINK_THRESHOLD`
    Returns:
        bool ``(batch, n)``, or ``(batch, rows, n)`` for ``"sinks"`` with attention per row: True where excluded.
    """
    check_exclusion(exclude)
    batch, n = ids.shape
    real = torch.ones(batch, n, dtype=torch.bool, device=ids.device) if padding is None else padding.to(ids.device)
    if exclude is None:
        return torch.zeros(batch, n, dtype=torch.bool, device=ids.device)
    if exclude == "first":
        return torch.zeros_like(real).scatter_(1, real.int().argmax(-1, keepdim=True), True)
    if exclude in ("special", "sinks"):
        special = torch.isin(ids, torch.tensor(special_ids(model), dtype=ids.dtype, device=ids.device)) & real
        if exclude == "special":
            return special
        if attention is None:
            raise InputError("exclude='sinks' needs the explained rows' attention to find the sinks.")
        sinks = sink_keys(attention, threshold).to(ids.device)  # [batch, (rows,) n]
        return (special if sinks.dim() == 2 else special[:, None]) | sinks
    given = torch.as_tensor(exclude, device=ids.device)
    if given.dtype == torch.bool:
        if given.shape != (batch, n):
            raise InputError(f"exclude mask has shape {tuple(given.shape)}; pass a bool ({batch}, {n}) mask like the "
                             "ids, or positions.")
        return given
    if given.is_floating_point() or given.dim() != 1:
        raise InputError(f"exclude positions must be a list of ints, got {exclude!r}.")
    rows = Positions.shared(given, "exclude positions", allow_padding=True).rows(padding, batch, n)  # [batch, k]
    return torch.zeros(batch, n, dtype=torch.bool).scatter_(1, rows, True).to(ids.device)
