"""Layer and head selections: indices in range, each once, never wrapped modulo the count."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from captum_cw.errors import InputError

__all__ = ["select_indices"]


def _index(value: Any, what: str) -> int:
    r"""A Python int from an int, a NumPy integer or a one-element integer tensor; never from a bool or float."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{what} indices must be integers, got {value!r} ({type(value).__name__}).")
    return int(value)


def select_indices(selected: Any, size: int, what: str) -> list[int]:
    r"""Indices in ``[0, size)`` from None (all), an index, or a sequence / array / tensor of indices;
    negative indices count from the end, and nothing is wrapped modulo ``size``."""
    if selected is None:
        return list(range(size))
    if isinstance(selected, Tensor) or hasattr(selected, "__array__"):  # tensors, NumPy arrays and scalars
        array = torch.as_tensor(selected)
        selected = array.item() if array.dim() == 0 else array.flatten().tolist()
    indices = [_index(index, what) for index in ([selected] if not isinstance(selected, Iterable) else selected)]
    if not indices:
        raise InputError(f"The {what} selection is empty; pass None for all {size} {what}s.")
    for index in indices:
        if not -size <= index < size:
            raise InputError(f"{what} {index} is out of range: the model has {size} {what}s (0..{size - 1}).")
    resolved = [index % size for index in indices]
    if len(set(resolved)) != len(resolved):
        raise InputError(f"The {what} selection {indices} names a {what} twice.")
    return resolved
