"""The scoring core: from the rows one forward pass captures to the public result (docs/DESIGN.md, "Scoring").

Every attributor goes through here: :func:`prepare_call` checks the inputs and positions before the pass;
:func:`score_metrics` slots each chunk of rows into place, reduces the heads as each metric does, refuses NaN and
computes what each row must sum to by the metric's identity; :func:`convergence_delta` compares the two;
:func:`score_factors` does the same slotting for the three factors of contribution weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from captum_cw.architectures import AttentionLayer
from captum_cw.errors import InputError, UnsupportedArchitectureError
from captum_cw.geometry import HeadGeometry
from captum_cw.metrics import Metric
from captum_cw.positions import Positions, RowLayout
from captum_cw.scan import ModelInputs, check_inputs, prepare_inputs, scan_geometry

__all__ = [
    "ContributionFactors",
    "PreparedCall",
    "Scope",
    "Scores",
    "convergence_delta",
    "prepare_call",
    "score_factors",
    "score_metrics",
]


class ContributionFactors(NamedTuple):
    r"""The three factors of ``cw = attention * relative_norm * cosine``, each
    ``(batch, n_layers, n_heads, n_query, n_key)``."""

    attention: Tensor
    relative_norm: Tensor
    cosine: Tensor


@dataclass(frozen=True)
class Scope:
    r"""
    What a forward pass scores: the selected attention layers of a model, their heads, and how rows are computed.

    Attributes:
        layers (tuple[AttentionLayer, ...]): the selected layers, in the order the result has them.
        layer_indices (tuple[int, ...]): their indices among the model's attention layers (for messages).
        heads (tuple[int, ...]): the selected heads, in the order the result has them.
        chunk_size (int, optional): query rows computed at once per layer; None: sized by
                    :data:`captum_cw.scan.CHUNK_ELEMENTS`.
        verify (bool): run the self-check.
    """

    layers: tuple[AttentionLayer, ...]
    layer_indices: tuple[int, ...]
    heads: tuple[int, ...]
    chunk_size: int | None = None
    verify: bool = True

    def selected_heads(self, per_head: Tensor) -> Tensor:
        r"""The selected heads of ``(batch, head, row, ...)`` values; no copy when all are selected in order."""
        if list(self.heads) == list(range(per_head.shape[1])):
            return per_head
        return per_head.index_select(1, torch.tensor(self.heads, device=per_head.device))


@dataclass(frozen=True)
class PreparedCall:
    r"""A checked model call and the positions it scores (:func:`prepare_call`)."""

    inputs: ModelInputs
    positional: tuple[Any, ...]  # the positional model arguments that could not be named
    positions: Positions


@dataclass(frozen=True)
class Scores:
    r"""
    What :func:`score_metrics` returns for one forward pass.

    Attributes:
        scores (dict[str, Tensor]): by metric name, ``(batch, n_layers, [n_heads,] n_query, n_key)`` float32
                    (empty with ``scores=False``).
        expected (dict[str, Tensor]): for the metrics with a completeness identity, what each row of the scores
                    must sum to, ``(batch, n_layers, [n_heads,] n_query)``, computed from the head outputs.
        output (Any): the model's own output.
    """

    scores: dict[str, Tensor]
    expected: dict[str, Tensor]
    output: Any

    def deltas(self) -> dict[str, Tensor]:
        r"""The completeness gap ``(batch,)`` of each metric with an identity (:func:`convergence_delta`)."""
        return {name: convergence_delta(self.scores[name], totals) for name, totals in self.expected.items()}


def prepare_call(
    model: nn.Module,
    inputs: Tensor | Mapping[str, Any],
    attention_mask: Tensor | None,
    additional_forward_args: Mapping[str, Any] | Sequence[Any] | None,
    positions: Positions,
) -> PreparedCall:
    r"""
    The model call, its inputs checked (:func:`captum_cw.scan.check_inputs`) and, for token inputs, the
    positions resolved against the padding, before any forward pass.

    Raises:
        InputError, UnsupportedSetupError: as :func:`captum_cw.scan.prepare_inputs` and
                    :meth:`captum_cw.positions.Positions.rows` raise them.
    """
    device = next(model.parameters()).device
    model_inputs, positional = prepare_inputs(model, inputs, attention_mask, additional_forward_args, device)
    check_inputs(model, model_inputs, positional)
    if model_inputs.is_text:
        positions.rows(model_inputs.padding_mask, *model_inputs.main.shape)
    return PreparedCall(model_inputs, positional, positions)


class _Stitcher:
    r"""Writes each chunk of rows of each layer into its place in ``(batch, n_layers, ..., n_query, ...)``."""

    def __init__(self, call: PreparedCall, n_layers: int) -> None:
        self.call = call
        self.n_layers = n_layers
        self.device = call.inputs.main.device
        self.layout: RowLayout | None = None
        self.slot_of_row = torch.empty(0, dtype=torch.long)  # [n] each row's slot, -1 where it is not computed
        self.filled: dict[str, Tensor] = {}

    def begin(self, geometry: HeadGeometry) -> None:
        r"""Lays the rows out at the first chunk, once the sequence length is known."""
        if self.layout is not None:
            return
        batch, n = geometry.alpha.shape[0], geometry.alpha.shape[-1]
        self.layout = self.call.positions.layout(self.call.inputs.padding_mask, batch, n)
        computed = self.layout.computed.to(self.device)
        self.slot_of_row = torch.full((n,), -1, dtype=torch.long, device=self.device)
        self.slot_of_row[computed] = torch.arange(len(computed), device=self.device)

    def put(self, name: str, k: int, rows: Tensor, values: Tensor, row_dim: int) -> None:
        r"""Writes ``values`` ``(batch, ..., row, ...)`` of layer ``k``'s ``rows`` along ``row_dim``."""
        assert self.layout is not None, "begin() lays the rows out first"
        if name not in self.filled:
            shape = list(values.shape)
            shape[row_dim] = len(self.layout.computed)
            self.filled[name] = torch.zeros((shape[0], self.n_layers, *shape[1:]), device=self.device)
        slots = self.slot_of_row[rows.to(self.device)]
        self.filled[name][:, k].index_copy_(row_dim, slots, values.to(self.device, torch.float32))

    def result(self, name: str, row_dim: int) -> Tensor:
        r"""The stitched values of ``name``: each example's own rows where examples read different rows."""
        values = self.filled[name]
        if self.layout is None or self.layout.slots is None:
            return values
        slots = self.layout.slots.to(self.device)  # [batch, k]
        shape = [len(slots)] + [1] * (values.dim() - 1)
        shape[row_dim] = slots.shape[1]
        expanded = list(values.shape)
        expanded[row_dim] = slots.shape[1]
        return values.take_along_dim(slots.reshape(shape).expand(expanded), dim=row_dim)


def _scan(model: nn.Module, scope: Scope, call: PreparedCall, on_chunk: Any) -> Any:
    r"""Runs the pass, refusing selected layers whose attention was not captured."""
    seen: set[int] = set()

    def record(k: int, rows: Tensor, geometry: HeadGeometry) -> None:
        seen.add(k)
        on_chunk(k, rows, geometry)

    output = scan_geometry(model, scope.layers, call.inputs, call.positional, call.positions, record,
                           scope.chunk_size, verify=scope.verify)
    if len(seen) != len(scope.layers):
        missing = [scope.layer_indices[k] for k in range(len(scope.layers)) if k not in seen]
        raise UnsupportedArchitectureError(
            f"Layers {missing} ran no attention through transformers' attention interface in this forward pass, "
            "so no attention weights could be captured. Their attention module is not called by the model's "
            "forward with these inputs (e.g. a custom forward that skips layers)."
        )
    return output


def _reduce_heads(per_head: Tensor, metric: Metric) -> Tensor:
    r"""Aggregates the head dimension of ``(batch, head, row, ...)`` as the metric does (sum or mean)."""
    return per_head.sum(1) if metric.head_reduction == "sum" else per_head.mean(1)


def score_metrics(
    model: nn.Module,
    scope: Scope,
    call: PreparedCall,
    metrics: Sequence[Metric],
    *,
    per_head: bool = False,
    scores: bool = True,
) -> Scores:
    r"""
    One forward pass for several metrics: their scores (if ``scores``) and, for those with a completeness
    identity, what each row must sum to.

    Args:
        model (nn.Module): the model.
        scope (Scope): the layers and heads to score.
        call (PreparedCall): the checked call and positions (:func:`prepare_call`).
        metrics (Sequence[Metric]): the metrics, each once.
        per_head (bool, optional): keep the head dimension instead of reducing it as each metric does.
                    Default: False
        scores (bool, optional): compute the scores; False computes the expected row sums only. Default: True
    Returns:
        :class:`Scores`, rows in the order of the positions (each example's own rows where they differ).
    Raises:
        InputError: for scores that are NaN or inf (the model's own attention is not finite).
    """
    stitcher = _Stitcher(call, len(scope.layers))

    def on_chunk(k: int, rows: Tensor, geometry: HeadGeometry) -> None:
        stitcher.begin(geometry)
        for metric in metrics:
            if metric.row_totals is not None:
                totals = scope.selected_heads(metric.row_totals(geometry))  # [batch, head, row]
                stitcher.put(f"expected {metric.name}", k, rows,
                             totals if per_head else _reduce_heads(totals, metric), row_dim=-1)
            if scores:
                values = scope.selected_heads(metric.per_head(geometry))  # [batch, head, row, key]
                stitcher.put(metric.name, k, rows, values if per_head else _reduce_heads(values, metric), row_dim=-2)

    output = _scan(model, scope, call, on_chunk)
    found = {metric.name: stitcher.result(metric.name, -2) for metric in metrics if scores}
    for name, values in found.items():
        finite = values.isfinite().flatten(2).all(-1).all(0)  # [n_layers]
        if not bool(finite.all()):
            layer = scope.layer_indices[int((~finite).nonzero()[0])]
            raise InputError(f"{name} scores at layer {layer} are NaN or inf: the model's own attention there is "
                             "not finite on these inputs (run model(...) alone to see it). No scores returned.")
    expected = {metric.name: stitcher.result(f"expected {metric.name}", -1) for metric in metrics
                if metric.row_totals is not None}
    return Scores(found, expected, output)


def convergence_delta(attributions: Tensor, expected: Tensor) -> Tensor:
    r"""
    Largest ``|row sum - expected row sum|`` per example.

    Args:
        attributions (Tensor): ``(batch, n_layers, [n_heads,] n_query, n_key)``.
        expected (Tensor): ``(batch, n_layers, [n_heads,] n_query)``, as :class:`Scores` holds it.
    Returns:
        Tensor ``(batch,)``.
    """
    return (attributions.sum(-1) - expected).abs().flatten(1).amax(1)


def score_factors(model: nn.Module, scope: Scope, call: PreparedCall, projected_on: Literal["layer", "head"]
                  ) -> ContributionFactors:
    r"""
    The three factors of contribution weights ``cw = attention * relative_norm * cosine`` for the selected layers,
    heads and rows, with ``o`` the output ``projected_on`` names (``"layer"``: inter-head, ``"head"``:
    intra-head); padded keys and rows are 0 in every factor.

    Returns:
        :class:`ContributionFactors`, each ``(batch, n_layers, n_heads, n_query, n_key)``.
    """
    stitcher = _Stitcher(call, len(scope.layers))
    padding = call.inputs.padding_mask

    def on_chunk(k: int, rows: Tensor, geometry: HeadGeometry) -> None:
        stitcher.begin(geometry)
        for name, factor in zip(ContributionFactors._fields, geometry.decomposition(projected_on)):
            selected = scope.selected_heads(factor).to(stitcher.device, torch.float32)  # [batch, head, row, key]
            if padding is not None:
                selected = selected * (padding[:, None, rows, None] & padding[:, None, None, :])
            stitcher.put(name, k, rows, selected, row_dim=-2)

    _scan(model, scope, call, on_chunk)
    return ContributionFactors(*(stitcher.result(name, -2) for name in ContributionFactors._fields))
