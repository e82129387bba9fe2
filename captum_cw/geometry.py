"""Pure tensor functions: the geometry the per-head metrics are built from, and the three-factor decomposition.

Notation (docs/DESIGN.md section 1), all float32 and for a chunk of query rows:
``alpha`` is ``(batch, head, row, key)``, ``values`` the value vectors ``v[h, j]``
``(batch, head, key, d_head)``, ``head_projections`` the per-head slices ``W_O[h]``
``(head, d_head, d_model)``. The projected values ``vt[h, j] = v[h, j] @ W_O[h]``
are never materialised: every inner product with them goes through ``W_O[h]``
first, so the cost per head is that of one ``Q K^T`` product.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import torch
from torch import Tensor

from captum_cw.errors import InputError

__all__ = ["HeadGeometry", "safe_divide", "sum_heads"]



def safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    r"""``numerator / denominator`` where the denominator is non-zero, else 0 (never NaN or inf)."""
    nonzero = denominator != 0
    return torch.where(nonzero, numerator / torch.where(nonzero, denominator, 1.0), 0.0)


def sum_heads(mixed_values: Tensor, head_projections: Tensor) -> Tensor:
    r"""``sum_h mixed_values[h] @ W_O[h]`` as one ``(row, head * d_head) x (head * d_head, d_model)`` product:
    ``(batch, row, d_model)`` from ``(batch, head, row, d_head)`` and ``(head, d_head, d_model)``."""
    heads, d_head, d_model = head_projections.shape
    return mixed_values.transpose(1, 2).flatten(2) @ head_projections.reshape(heads * d_head, d_model)


class HeadGeometry:
    r"""
    The geometry of one attention layer for a chunk of query rows.

    Args:
        alpha (Tensor): attention weights ``(batch, head, row, key)``.
        values (Tensor): value vectors per query head ``(batch, head, key, d_head)``.
        head_projections (Tensor): ``W_O`` per head ``(head, d_head, d_model)``.
        mixed_values (Tensor, optional): ``alpha @ values`` when it is already known,
                    e.g. the attention kernel's own float32 output, checked against
                    the recomputation by the self-check. Default: recomputed.
    """

    def __init__(self, alpha: Tensor, values: Tensor, head_projections: Tensor,
                 mixed_values: Tensor | None = None) -> None:
        self.alpha = alpha  # [batch, head, row, key]
        self.values = values  # [batch, head, key, d_head]
        self.head_projections = head_projections  # [head, d_head, d_model]
        if mixed_values is not None:
            self.mixed_values = mixed_values  # [batch, head, row, d_head]; fills the cached property

    @cached_property
    def mixed_values(self) -> Tensor:
        r"""``sum_j alpha[h,i,j] v[h,j]``: ``(batch, head, row, d_head)``."""
        return self.alpha @ self.values

    @cached_property
    def head_outputs(self) -> Tensor:
        r"""``o_h[h, i] = sum_j alpha[h,i,j] vt[h,j]``: ``(batch, head, row, d_model)``."""
        return torch.einsum("bhrd,hdm->bhrm", self.mixed_values, self.head_projections)

    @cached_property
    def layer_output(self) -> Tensor:
        r"""``o[i] = sum_h o_h[h, i]`` (without the output bias): ``(batch, row, d_model)``."""
        return sum_heads(self.mixed_values, self.head_projections)

    @cached_property
    def value_norms(self) -> Tensor:
        r"""``||vt[h, j]||`` via the Gram matrix ``W_O[h] W_O[h]^T``: ``(batch, head, 1, key)``."""
        gram = self.head_projections @ self.head_projections.transpose(-1, -2)  # [head, d_head, d_head]
        squared = torch.einsum("bhkd,hde,bhke->bhk", self.values, gram, self.values)
        return squared.clamp_min(0).sqrt().unsqueeze(2)

    @cached_property
    def head_output_norms(self) -> Tensor:
        r"""``||o_h[h, i]||``: ``(batch, head, row, 1)``."""
        return self.head_outputs.norm(dim=-1, keepdim=True)

    @cached_property
    def layer_output_norms(self) -> Tensor:
        r"""``||o[i]||``: ``(batch, 1, row, 1)``."""
        return self.layer_output.norm(dim=-1)[:, None, :, None]

    def _pull_back(self, direction: Tensor) -> Tensor:
        r"""``W_O[h] direction[h|1, i]``: ``(batch, head, row, d_head)``, so that ``<direction, vt[h, j]>``
        is its dot product with ``v[h, j]``. A direction shared by all heads (inter-head) is one product with a
        transposed view of ``W_O``, which BLAS reads as it lies, without a copy per chunk."""
        heads, d_head, d_model = self.head_projections.shape
        if direction.shape[1] == 1:  # one direction for all heads: (row, d_model) x (d_model, head * d_head)
            pulled = direction.squeeze(1) @ self.head_projections.reshape(heads * d_head, d_model).t()
            return pulled.unflatten(-1, (heads, d_head)).transpose(1, 2)  # [batch, head, row, d_head], a view
        return direction @ self.head_projections.transpose(-1, -2)  # per head: (row, d_model) x (d_model, d_head)

    def _dots(self, direction: Tensor) -> Tensor:
        r"""``<direction[h, i], vt[h, j]>`` for a direction ``(batch, head|1, row, d_model)``."""
        return self._pull_back(direction) @ self.values.transpose(-1, -2)  # [batch, head, row, key]

    def projected_on(self, direction: Tensor) -> Tensor:
        r"""``alpha[h,i,j] <direction[i], vt[h,j]>``, each key's weighted projected value projected on a direction
        ``(batch, 1, row, d_model)`` shared by the heads (e.g. a target's gradient): ``(batch, head, row, key)``."""
        return self._dots(direction) * self.alpha

    @cached_property
    def inter_dots(self) -> Tensor:
        r"""``<o[i], vt[h, j]>``: ``(batch, head, row, key)``."""
        return self._dots(self.layer_output.unsqueeze(1))

    @cached_property
    def intra_dots(self) -> Tensor:
        r"""``<o_h[h, i], vt[h, j]>``: ``(batch, head, row, key)``."""
        return self._dots(self.head_outputs)

    @cached_property
    def _inter_direction(self) -> Tensor:
        r"""``W_O[h] o[i] / ||o[i]||^2``, 0 where ``o[i] = 0``: ``(batch, head, row, d_head)``. Dividing before
        the product works on ``(row, d_model)`` rather than on the ``(head, row, key)`` result. (Through the Gram
        matrix ``W_O W_O^T`` one product would do, but ``||o||^2 = m G m^T`` then cancels like the heads do and
        loses its precision where they nearly cancel: docs/DESIGN.md section 1, "Cost".)"""
        return self._pull_back(safe_divide(self.layer_output.unsqueeze(1), self.layer_output_norms.square()))

    @cached_property
    def inter_shares(self) -> Tensor:
        r"""``<o[i], o_h[h, i]> / ||o[i]||^2``, each head's share of the layer output: ``(batch, head, row)``;
        summed over heads it is 1 wherever ``o[i] != 0``."""
        return (self._inter_direction * self.mixed_values).sum(-1)

    def value_weighted(self) -> Tensor:
        r"""``alpha ||vt||`` per head: ``(batch, head, row, key)``."""
        return self.alpha * self.value_norms

    def output_normalized(self) -> Tensor:
        r"""``alpha ||vt|| / ||o_h||`` per head (0 where ``o_h = 0``): ``(batch, head, row, key)``."""
        return safe_divide(self.alpha * self.value_norms, self.head_output_norms)

    def cw_intra(self) -> Tensor:
        r"""``alpha <o_h, vt> / ||o_h||^2`` per head (0 where ``o_h = 0``): ``(batch, head, row, key)``; the
        output is divided by its squared norm before the product, as for :meth:`cw_inter`."""
        direction = self._pull_back(safe_divide(self.head_outputs, self.head_output_norms.square()))
        return (direction @ self.values.transpose(-1, -2)).mul_(self.alpha)  # in place: a new tensor

    def cw_inter(self) -> Tensor:
        r"""``alpha <o, vt> / ||o||^2`` per head (0 where ``o = 0``): ``(batch, head, row, key)``."""
        return (self._inter_direction @ self.values.transpose(-1, -2)).mul_(self.alpha)

    def decomposition(self, output: Literal["layer", "head"]) -> tuple[Tensor, Tensor, Tensor]:
        r"""
        The three factors of ``cw = alpha * (||vt|| / ||o||) * cos(o, vt)``.

        Args:
            output (str): what ``o`` is: ``"layer"``, the layer output (inter-head contribution weights), or
                        ``"head"``, the head output (intra-head); a metric's
                        :attr:`~captum_cw.metrics.Metric.projected_on`.
        Returns:
            ``(alpha, relative_norm, cosine)``, each ``(batch, head, row, key)``.
        """
        if output == "layer":
            output_norms, dots = self.layer_output_norms, self.inter_dots
        elif output == "head":
            output_norms, dots = self.head_output_norms, self.intra_dots
        else:
            raise InputError(f"output must be 'layer' or 'head', got {output!r}.")
        relative_norm = safe_divide(self.value_norms, output_norms).expand_as(self.alpha)
        cosine = safe_divide(dots, output_norms * self.value_norms)
        return self.alpha, relative_norm, cosine
