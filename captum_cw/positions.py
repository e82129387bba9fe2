"""Positions: which rows of a (padded) batch to read, with one meaning of a negative index everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from captum_cw.errors import InputError

__all__ = ["Positions"]  # RowLayout: what Positions.layout returns, read by the scoring core


def _real_tokens(padding: Tensor | None, batch: int, n: int) -> Tensor:
    r"""``(batch, n)`` bool on the CPU, True for real tokens (all of them without a padding mask)."""
    return torch.ones(batch, n, dtype=torch.bool) if padding is None else padding.bool().cpu()


def _integer_tensor(given: object, name: str) -> Tensor:
    r"""``given`` as an integer tensor, refusing strings, floats, bools and anything not a number."""
    if isinstance(given, (str, bytes)):
        raise InputError(f"{name} must be int positions, got the string {given!r}; pass e.g. [-1] for the last row.")
    try:
        values = torch.as_tensor(given)
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"{name} must be int positions, got {given!r}; pass e.g. [-1] for the last row.") from None
    if values.numel() == 0:
        raise InputError(f"{name} is empty; pass at least one position, or None for all.")
    if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
        raise InputError(f"{name} must be integer positions, got {values.dtype} {given!r}; pass e.g. [-1] for the "
                         "last row.")
    return values.long().cpu()


@dataclass(frozen=True, eq=False)
class Positions:
    r"""
    Positions of a batch of token sequences, as every entry point takes them (``query_positions``, ``position``,
    the rows of the text front end), in the spirit of TransformerLens's ``Slice``: one object that turns what a
    caller gave into row indices of the padded batch.

    One meaning of an index: ``p >= 0`` is an index into the row as given (padding included); ``p < 0`` counts back
    from the end of each example's real tokens, so ``-1`` is an example's last real token under left or right
    padding, and the last token without padding (Python's meaning there). A position that is not a real token of
    an example is refused, unless ``allow_padding`` (its row is then all 0).

    Build one with :meth:`shared` (the same positions for every example) or :meth:`one_per_example`.

    Attributes:
        given (Tensor or None): ``(k,)`` positions shared by the batch, or ``(batch,)`` one per example
                    (``per_example``); None for every position.
        per_example (bool): ``given`` holds one position per example.
        name (str): the argument's name, for error messages.
        allow_padding (bool): positions on padding give all-zero rows instead of an error.
    """

    given: Tensor | None
    per_example: bool = False
    name: str = "query_positions"
    allow_padding: bool = False

    @classmethod
    def shared(cls, positions: Positions | int | Sequence[int] | Tensor | None, name: str = "query_positions", *,
               allow_padding: bool = False) -> Positions:
        r"""The same positions (each once) for every example; None for all of them."""
        if isinstance(positions, Positions):
            return positions
        if positions is None:
            return cls(None, name=name, allow_padding=allow_padding)
        given = _integer_tensor(positions, name).flatten()
        if len(given.unique()) != len(given):
            raise InputError(f"{name} {positions!r} names a position twice; pass each position once.")
        return cls(given, name=name, allow_padding=allow_padding)

    @classmethod
    def one_per_example(cls, positions: int | Sequence[int] | Tensor, name: str = "position") -> Positions:
        r"""One position per example: an int for all of them, or a sequence or ``(batch,)`` tensor."""
        values = torch.as_tensor(positions)
        if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
            raise InputError(f"{name} must be an int or one int per example, got {values.dtype} {positions!r}.")
        return cls(values.long().cpu(), per_example=True, name=name)

    def rows(self, padding: Tensor | None, batch: int, n: int) -> Tensor:
        r"""
        The padded rows each example reads: ``(batch, k)`` long on the CPU (``k = n`` for every position).

        Args:
            padding (Tensor, optional): ``(batch, n)`` bool, True for real tokens; None when nothing is padded.
            batch (int), n (int): the batch's shape.
        Raises:
            InputError: for positions outside the sequence or, unless ``allow_padding``, on padding.
        """
        real = _real_tokens(padding, batch, n)
        if self.given is None:
            return torch.arange(n).expand(batch, n)
        last = n - 1 - real.flip(-1).int().argmax(-1)  # [batch] each example's last real token
        if self.per_example:
            given = self.given.expand(batch) if self.given.dim() == 0 else self.given
            if given.shape != (batch,):
                raise InputError(f"{self.name} has shape {tuple(given.shape)}; pass an int or one position per "
                                 f"example ({batch},).")
            given = given[:, None]  # [batch, 1]
        else:
            if bool(((self.given >= n) | (self.given < -n)).any()):
                raise InputError(f"{self.name} {self.given.tolist()} out of range for a sequence of {n} tokens.")
            given = self.given.expand(batch, -1)  # [batch, k]
        rows = torch.where(given < 0, last[:, None] + 1 + given, given)
        self._refuse_outside(given, rows, real)
        return rows

    def _refuse_outside(self, given: Tensor, rows: Tensor, real: Tensor) -> None:
        r"""Refuses a row outside the sequence or, unless ``allow_padding``, outside an example's real tokens,
        naming the first such example and its real range."""
        n = real.shape[1]
        inside = (rows >= 0) & (rows < n)
        if not bool(inside.all()) and not self.per_example:
            example, slot = (int(i) for i in (~inside).nonzero()[0])
            raise InputError(f"{self.name} {int(given[example, slot])} is outside example {example}'s {n} positions; "
                             "negative positions count back from its last real token.")
        if self.allow_padding:
            return
        on_real = inside & real.gather(1, rows.clamp(0, n - 1))
        if bool(on_real.all()):
            return
        example, slot = (int(i) for i in (~on_real).nonzero()[0])
        tokens = real[example].nonzero().flatten()
        first, last = (int(tokens[0]), int(tokens[-1])) if len(tokens) else (0, -1)
        if self.per_example:
            raise InputError(f"{self.name} {int(given[example, slot])} of example {example} is not one of its real "
                             f"tokens ({first}..{last}); negative positions count back from its last real token.")
        where = (f"whose real tokens are positions {first} to {last}" if len(tokens) else "which has no real token")
        raise InputError(f"query position {int(rows[example, slot])} is padding in example {example} ({where}), so "
                         "its row would be all 0; pass positions of real tokens, or attribute that example alone.")

    def layout(self, padding: Tensor | None, batch: int, n: int) -> RowLayout:
        r"""Which rows a forward pass computes for these positions and where each example's rows are among them.
        A ``padding`` mask that does not cover ``n`` positions (another sequence of the model) is not used."""
        if padding is not None and padding.shape[-1] != n:
            padding = None
        rows = self.rows(padding, batch, n)  # [batch, k]
        if bool((rows == rows[:1]).all()):
            return RowLayout(rows[0], None)
        computed = rows.unique()  # sorted
        return RowLayout(computed, torch.searchsorted(computed, rows))

    def computed_rows(self, padding: Tensor | None, batch: int, n: int) -> Tensor:
        r"""The rows a forward pass computes, ``(u,)``: :attr:`RowLayout.computed`."""
        return self.layout(padding, batch, n).computed


class RowLayout(NamedTuple):
    r"""
    The rows of a batch that one forward pass computes, and each example's among them.

    Attributes:
        computed (Tensor): ``(u,)`` long padded rows: the positions in the order given when every example reads
                    the same rows, else the sorted union of the examples' rows.
        slots (Tensor or None): ``(batch, k)`` where each example's rows are in ``computed``; None when every
                    example reads all of ``computed`` in order.
    """

    computed: Tensor
    slots: Tensor | None
