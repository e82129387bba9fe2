"""Captum attributors: contribution weights and the attention baselines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, overload

import torch
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_cw.architectures import AttentionLayer, find_attention_layers
from captum_cw.errors import (
    InputError,
    UnsupportedArgumentError,
    UnsupportedSetupError,
    refuse_captum_arguments,
    refuse_noisy_token_ids,
    require_model,
)
from captum_cw.metrics import (
    ATTENTION,
    CW_INTER,
    OUTPUT_NORMALIZED,
    VALUE_WEIGHTED,
    Metric,
    deprecated_variant,
    get_metric,
    metric_names,
)
from captum_cw.positions import Positions
from captum_cw.scan import untuple
from captum_cw.scoring import (
    ContributionFactors,
    Scope,
    Scores,
    convergence_delta,
    prepare_call,
    score_factors,
    score_metrics,
)
from captum_cw.selection import select_indices

__all__ = [
    "MetricAttribution",
    "MetricScores",
    "attribute_metrics",
    "ContributionWeights",
    "AttentionWeights",
    "ValueWeightedAttention",
    "OutputNormalizedAttention",
    "ContributionFactors",
    "attributor_for",
]

def _count_heads(layer: AttentionLayer) -> int:
    module = layer.attention
    for name in ("num_attention_heads", "num_heads"):
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    return int(getattr(module, "config").num_attention_heads)


_ATTRIBUTE_ARGUMENTS = ("inputs", "attention_mask", "additional_forward_args", "query_positions", "per_head",
                       "return_convergence_delta")
"""What :meth:`MetricAttribution.attribute` takes, named when it is given another keyword argument."""


def _refuse_module_selection(layers: Sequence[AttentionLayer], selection: object, argument: str, owner: str) -> None:
    r"""
    Refuses a module where layer (or head) indices are expected, as a port of ``LayerIntegratedGradients(model,
    layer)`` passes it, naming the index of the attention layer it holds where there is one.
    """
    given = list(selection) if isinstance(selection, (list, tuple, nn.ModuleList)) else [selection]
    modules = [item for item in given if isinstance(item, nn.Module)]
    if not modules:
        return
    found = [[k for k, layer in enumerate(layers) if any(sub is layer.attention for sub in module.modules())]
             for module in modules]
    hint = (f"pass {argument}={[held[0] for held in found]} (the index of the attention layer in each module)"
            if argument == "layers" and all(len(held) == 1 for held in found) else f"pass {argument} as indices")
    raise UnsupportedArgumentError(f"{owner}: {argument} holds a {type(modules[0]).__name__} module; captum_cw "
                                   f"selects {argument} by index, not by module: {hint}.")


class MetricScores(NamedTuple):
    r"""Several metrics from one forward pass: scores and deltas keyed by metric name, and the model's output."""

    scores: dict[str, Tensor]  # each (batch, n_layers, [n_heads,] n_query, n_key)
    deltas: dict[str, Tensor]  # each (batch,), for the metrics with a completeness identity
    output: Any


class MetricAttribution(Attribution):
    r"""
    The scores of any registered per-head metric (:func:`captum_cw.metrics.metric_names`)
    for the selected layers, heads and query rows; :class:`ContributionWeights` and
    the baselines are this class with their metric fixed.

    Args:
        model (nn.Module): a transformers model of a supported architecture.
        metric (str): a registered metric's name or alias, e.g. ``"cw_inter"``.
        layers (int or Sequence[int], optional): layers to attribute, in the order
                    wanted (negative counts from the end). Default: all.
        heads (int or Sequence[int], optional): heads to keep. Default: all.
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run the self-check (see :class:`ContributionWeights`).
                    Default: True
        **captum_arguments: Captum constructor arguments (``multiply_by_inputs``,
                    ``device_ids``) are refused with an
                    :class:`~captum_cw.errors.UnsupportedArgumentError` that says why; so
                    are a forward function or a layer module in place of ``model``
                    and a module in ``layers`` or ``heads``.
    """

    def __init__(
        self,
        model: nn.Module,
        metric: str,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        chunk_size: int | None = None,
        *,
        verify: bool = True,
        **captum_arguments: Any,
    ) -> None:
        owner = type(self).__name__
        require_model(model, owner)
        refuse_captum_arguments(owner, captum_arguments)
        self.metric: Metric = get_metric(metric)
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise InputError(f"chunk_size must be a positive int (query rows per block) or None (sized by "
                             f"CHUNK_ELEMENTS), got {chunk_size!r}.")
        super().__init__(model)
        self.model = model
        self.attention_layers = find_attention_layers(model)
        _refuse_module_selection(self.attention_layers, layers, "layers", owner)
        _refuse_module_selection(self.attention_layers, heads, "heads", owner)
        self.n_heads = _count_heads(self.attention_layers[0])
        self.layers = select_indices(layers, len(self.attention_layers), "layer")
        self.heads = select_indices(heads, self.n_heads, "head")
        self.chunk_size = chunk_size
        self.verify = verify

    def has_convergence_delta(self) -> bool:
        return self.metric.row_totals is not None

    @property
    def scope(self) -> Scope:
        r"""The selected layers and heads and how their rows are computed, as :mod:`captum_cw.scoring` takes them."""
        return Scope(tuple(self.attention_layers[index] for index in self.layers), tuple(self.layers),
                     tuple(self.heads), self.chunk_size, self.verify)

    def score(
        self,
        inputs: Tensor | Mapping[str, Any],
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        query_positions: Positions | Sequence[int] | Tensor | None = None,
        metrics: Sequence[Metric] | None = None,
        *,
        per_head: bool = False,
        scores: bool = True,
    ) -> Scores:
        r"""
        The scoring core's result for these inputs (:func:`captum_cw.scoring.score_metrics`): the scores of
        ``metrics`` (default: this attributor's metric), what their rows must sum to and the model's output, from
        one forward pass.

        Args:
            query_positions (Positions, Sequence[int] or Tensor, optional): as :meth:`attribute` takes them, or a
                        :class:`~captum_cw.positions.Positions` (e.g. one row per example).
            Others: as :meth:`attribute`; ``scores=False`` computes the expected row sums only.
        Returns:
            :class:`~captum_cw.scoring.Scores`.
        """
        call = prepare_call(self.model, inputs, attention_mask, additional_forward_args,
                            Positions.shared(query_positions))
        return score_metrics(self.model, self.scope, call, [self.metric] if metrics is None else metrics,
                             per_head=per_head, scores=scores)

    @overload
    def attribute(self, inputs: Tensor | Mapping[str, Any] | tuple[Tensor], attention_mask: Tensor | None = ...,
                  additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = ...,
                  query_positions: Sequence[int] | Tensor | None = ..., *, per_head: bool = ...,
                  return_convergence_delta: Literal[False] = ..., **captum_arguments: Any
                  ) -> Tensor | tuple[Tensor]: ...

    @overload
    def attribute(self, inputs: Tensor | Mapping[str, Any] | tuple[Tensor], attention_mask: Tensor | None = ...,
                  additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = ...,
                  query_positions: Sequence[int] | Tensor | None = ..., *, per_head: bool = ...,
                  return_convergence_delta: Literal[True], **captum_arguments: Any
                  ) -> tuple[Tensor | tuple[Tensor], Tensor]: ...

    @log_usage()
    def attribute(
        self,
        inputs: Tensor | Mapping[str, Any] | tuple[Tensor],
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        query_positions: Sequence[int] | Tensor | None = None,
        *,
        per_head: bool = False,
        return_convergence_delta: bool = False,
        **captum_arguments: Any,
    ) -> Tensor | tuple[Tensor] | tuple[Tensor | tuple[Tensor], Tensor]:
        r"""
        Scores of every selected layer, head and query row over all keys.

        Args:
            inputs (Tensor, BatchEncoding or tuple): token ids ``(batch, n)`` or, for
                        vision models, pixel values ``(batch, channels, height, width)``.
                        A tokenizer's ``BatchEncoding`` (or any dict with
                        ``input_ids``/``pixel_values``) is accepted; its other
                        entries are passed to the model. A one-tensor tuple, as
                        captum passes inputs, gives a one-tensor tuple back.
            attention_mask (Tensor, optional): ``(batch, n)`` with 1 for real tokens
                        and 0 for padding (left or right). Padded keys and the rows
                        of padded queries are exactly 0 in the result.
                        Default: None (taken from ``inputs`` if it is a dict)
            additional_forward_args (dict or tuple, optional): extra arguments for
                        the model: a dict is passed as keyword arguments, a tuple
                        positionally after ``inputs`` (named after the parameters of
                        ``model.forward`` it fills). An ``attention_mask`` among them
                        is the attention mask. Cached keys are refused.
                        Default: None
            query_positions (Sequence[int] or Tensor, optional): the query rows to
                        attribute (:class:`~captum_cw.positions.Positions`: ``p >= 0``
                        indexes the padded row, ``p < 0`` counts back from each
                        example's last real token, so ``[-1]`` is every example's
                        last real token under left or right padding). Only these
                        rows are computed, in chunks, so attributing the last
                        position of a long input costs O(n) memory per head. A
                        position that is padding in some example is refused.
                        Default: None (all n rows)
            per_head (bool, optional): keep the head dimension instead of
                        aggregating the selected heads (sum for inter-head
                        contribution weights, mean for the other metrics).
                        Default: False
            return_convergence_delta (bool, optional): also return the completeness
                        gap. Only for metrics with a completeness identity
                        (attention and contribution weights); the others raise an
                        :class:`~captum_cw.errors.UnsupportedArgumentError` (a TypeError).
                        Default: False
            **captum_arguments: refused with an
                        :class:`~captum_cw.errors.UnsupportedArgumentError` (a TypeError)
                        that says what to do instead: Captum's ``baselines``,
                        ``n_steps``, ``method``, ``internal_batch_size``, ``target``...
                        (:data:`captum_cw.errors.CAPTUM_ARGUMENTS`) have no meaning here.

        Returns:
            *Tensor* or (*Tensor*, *Tensor*):
            - **attributions** (*Tensor*): ``(batch, n_layers, n_heads, n_query, n_key)``
                        if ``per_head`` else ``(batch, n_layers, n_query, n_key)``,
                        layers and heads in the order selected, query rows in the
                        order of ``query_positions``, float32 whatever the model's
                        dtype, on the device of the model's first parameter.
            - **delta** (*Tensor*, returned if return_convergence_delta=True):
                        ``(batch,)``, the largest deviation of a returned row's sum
                        over the keys from what the identity says it sums to, over
                        all returned layers, heads and rows. A row of one head sums
                        to 1 for attention and intra-head contribution weights (0 for
                        padded rows and zero outputs); an inter-head row of head
                        ``h`` sums to its share ``<o_i, o_h,i> / ||o_i||^2`` of the
                        layer output, so the rows of a head subset ``S`` sum to
                        ``<o_i, sum_(h in S) o_h,i> / ||o_i||^2``, which is 1 for all
                        heads. Heads aggregated by mean sum to the mean of theirs.
                        The expected sums are computed from the head outputs, not
                        from the scores. :meth:`compute_convergence_delta` gives the
                        same number for any attributions tensor.
        """
        refuse_captum_arguments(f"{type(self).__name__}.attribute", captum_arguments, _ATTRIBUTE_ARGUMENTS)
        if return_convergence_delta and not self.has_convergence_delta():
            raise UnsupportedArgumentError(
                f"{type(self).__name__} has no completeness identity (its rows do not sum to 1), so it has no "
                "convergence delta; call attribute() with return_convergence_delta=False."
            )
        is_tuple, main = untuple(inputs)
        scores, delta, _ = self.attribute_with_output(
            main, attention_mask, additional_forward_args, query_positions, per_head=per_head
        )
        returned = (scores,) if is_tuple else scores
        return (returned, delta) if return_convergence_delta else returned

    def compute_convergence_delta(
        self,
        attributions: Tensor | tuple[Tensor],
        inputs: Tensor | Mapping[str, Any] | tuple[Tensor],
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        query_positions: Sequence[int] | Tensor | None = None,
    ) -> Tensor:
        r"""
        The completeness gap of ``attributions`` for these inputs, as :meth:`attribute`
        defines its delta: the largest ``|row sum - expected row sum|`` per example.
        Runs one forward pass (scores are not recomputed).

        Args:
            attributions (Tensor): what :meth:`attribute` returned for the same
                        arguments, ``(batch, n_layers, [n_heads,] n_query, n_key)``.
            inputs, attention_mask, additional_forward_args, query_positions: as
                        given to :meth:`attribute`.
        Returns:
            Tensor ``(batch,)``.
        """
        if not self.has_convergence_delta():
            raise UnsupportedSetupError(f"{type(self).__name__} has no completeness identity, so it has no "
                                        "convergence delta; use ContributionWeights or AttentionWeights for one.")
        scores: Tensor = untuple(attributions)[1]
        main = untuple(inputs)[1]
        if scores.dim() not in (4, 5):
            raise InputError(f"attributions must be (batch, n_layers, [n_heads,] n_query, n_key) as attribute() "
                             f"returns them, got shape {tuple(scores.shape)}.")
        expected = self.score(main, attention_mask, additional_forward_args, query_positions,
                              per_head=scores.dim() == 5, scores=False).expected[self.metric.name]
        if expected.shape != scores.shape[:-1]:
            raise InputError(f"attributions have shape {tuple(scores.shape)} but these inputs and selections "
                             f"give rows {tuple(expected.shape)}; pass the arguments attribute() was called with.")
        return convergence_delta(scores.to(expected.device, torch.float32), expected)

    def attribute_with_output(
        self,
        inputs: Tensor | Mapping[str, Any],
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        query_positions: Sequence[int] | Tensor | None = None,
        *,
        per_head: bool = False,
    ) -> tuple[Tensor, Tensor, Any]:
        r"""
        As :meth:`attribute`, from the same single forward pass also returning the
        completeness gap ``(batch,)`` (zeros for metrics without the identity) and
        the model's own output (e.g. its logits).

        Returns:
            ``(attributions, delta, model_output)``.
        """
        refuse_noisy_token_ids(self.model, inputs, f"{type(self).__name__}.attribute")
        found = self.score(inputs, attention_mask, additional_forward_args, query_positions, per_head=per_head)
        scores = found.scores[self.metric.name]
        delta = found.deltas()[self.metric.name] if self.has_convergence_delta() else scores.new_zeros(len(scores))
        return scores, delta, found.output


class _FixedMetricAttribution(MetricAttribution):
    metric_name: ClassVar[str]

    def __init__(
        self,
        model: nn.Module,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        chunk_size: int | None = None,
        *,
        verify: bool = True,
        **captum_arguments: Any,
    ) -> None:
        super().__init__(model, self.metric_name, layers, heads, chunk_size, verify=verify, **captum_arguments)


class ContributionWeights(MetricAttribution):
    r"""
    Contribution weights (Cunningham & Muca Cirone, 2026): the projection of each
    key's weighted, projected value vector onto the attention output,
    ``c_ij = alpha_ij <o_i, vt_j> / ||o_i||^2``.

    ``metric="cw_inter"`` (alias ``"inter"``) projects on the layer output
    ``o_i = sum_h o_h,i`` (rows sum to 1 over heads and keys; heads are aggregated
    by sum), ``metric="cw_intra"`` (alias ``"intra"``) on each head's own output
    (rows sum to 1 per head; heads aggregated by mean).

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        layers (int or Sequence[int], optional): layers to attribute, in the order
                    wanted (negative counts from the end). Default: all.
        heads (int or Sequence[int], optional): heads to keep. Default: all.
        metric (str, optional): a contribution-weight metric (one with
                    :attr:`~captum_cw.metrics.Metric.projected_on`), by name or alias:
                    ``"cw_inter"`` or ``"cw_intra"``. Default: ``"cw_inter"``
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run the self-check (:mod:`captum_cw.self_check`):
                    on a few rows per layer, the recomputed ``alpha @ V`` must equal
                    the attention kernel's own output and ``sum_h o_h`` the output
                    projection applied to it, else a ValueError names the layer.
                    It costs about 1% of ``attribute``; pass False only for a model
                    whose mismatch you understand. Default: True
        variant (str, optional): deprecated: the former name of ``metric``
                    (``"inter"``, ``"intra"``), with a DeprecationWarning.

    Examples::

        >>> cw = ContributionWeights(model, layers=[-1])
        >>> scores = cw.attribute(tokenizer("Paris is in", return_tensors="pt"), query_positions=[-1])
        >>> scores.shape  # (batch, n_layers, n_query, n_key)
        torch.Size([1, 1, 1, 3])
    """

    def __init__(
        self,
        model: nn.Module,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        metric: str | None = None,
        chunk_size: int | None = None,
        *,
        verify: bool = True,
        variant: str | None = None,
        **captum_arguments: Any,
    ) -> None:
        given = deprecated_variant(metric, variant, type(self).__name__)
        chosen = CW_INTER if given is None else get_metric(given)
        if chosen.projected_on is None:
            contribution_weights = [name for name in metric_names() if get_metric(name).projected_on is not None]
            raise InputError(f"ContributionWeights computes contribution weights: metric must be one of "
                             f"{', '.join(contribution_weights)} (or an alias), got {chosen.name!r}; "
                             f"attributor_for({chosen.name!r}, model) gives its attributor.")
        super().__init__(model, chosen.name, layers, heads, chunk_size, verify=verify, **captum_arguments)
        self.projected_on: Literal["layer", "head"] = chosen.projected_on  # what the factors divide by

    def attribute_factors(
        self,
        inputs: Tensor | Mapping[str, Any],
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        query_positions: Sequence[int] | Tensor | None = None,
    ) -> ContributionFactors:
        r"""
        The three-factor decomposition ``cw = attention * relative_norm * cosine``
        (``relative_norm = ||vt_j|| / ||o_i||``, ``cosine = cos(o_i, vt_j)``) for
        the selected layers and heads, with ``o`` as the metric defines it
        (:attr:`~captum_cw.metrics.Metric.projected_on`).

        Args: as :meth:`attribute`.

        Returns:
            :class:`ContributionFactors` of three tensors
            ``(batch, n_layers, n_heads, n_query, n_key)``; their product is the
            ``per_head=True`` attribution.
        """
        call = prepare_call(self.model, inputs, attention_mask, additional_forward_args,
                            Positions.shared(query_positions))
        return score_factors(self.model, self.scope, call, self.projected_on)


class AttentionWeights(_FixedMetricAttribution):
    r"""
    Raw attention weights ``alpha_ij`` (heads aggregated by mean), recomputed in
    float32 from the model's own queries, keys and masks under any attention
    implementation.

    Args:
        model (nn.Module): a transformers model of a registered architecture.
        layers (int or Sequence[int], optional): layers to attribute. Default: all.
        heads (int or Sequence[int], optional): heads to keep. Default: all.
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run the self-check, as in :class:`ContributionWeights`. Default: True
    """

    metric_name = ATTENTION.name


class ValueWeightedAttention(_FixedMetricAttribution):
    r"""
    Value-weighted attention ``alpha_ij ||vt_j||`` (Kobayashi et al., 2020), with
    ``vt_j = v_j W_O[h]`` the projected value; heads aggregated by mean.

    Args: as :class:`AttentionWeights`.
    """

    metric_name = VALUE_WEIGHTED.name


class OutputNormalizedAttention(_FixedMetricAttribution):
    r"""
    Output-normalised value-weighted attention ``alpha_ij ||vt_j|| / ||o_h,i||``;
    heads aggregated by mean. Within one head and row it ranks keys exactly as
    :class:`ValueWeightedAttention` does; it differs once heads are aggregated.

    Args: as :class:`AttentionWeights`.
    """

    metric_name = OUTPUT_NORMALIZED.name



def attributor_for(
    metric: str,
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    chunk_size: int | None = None,
    *,
    verify: bool = True,
) -> MetricAttribution:
    r"""The attributor of a registered metric by name or alias: its named class where it has one
    (:class:`ContributionWeights` for the contribution weights)."""
    name = get_metric(metric).name
    if get_metric(name).projected_on is not None:
        return ContributionWeights(model, layers, heads, name, chunk_size, verify=verify)
    named = {cls.metric_name: cls for cls in _FixedMetricAttribution.__subclasses__()}
    if name in named:
        return named[name](model, layers, heads, chunk_size, verify=verify)
    return MetricAttribution(model, name, layers, heads, chunk_size, verify=verify)


def attribute_metrics(
    model: nn.Module,
    inputs: Tensor | Mapping[str, Any],
    metrics: Sequence[str] | None = None,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
    additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
    query_positions: Sequence[int] | Tensor | None = None,
    *,
    per_head: bool = False,
    chunk_size: int | None = None,
    verify: bool = True,
) -> MetricScores:
    r"""
    Several metrics from one forward pass, each exactly as its attributor's
    :meth:`~MetricAttribution.attribute` would return it.

    Args:
        metrics (Sequence[str], optional): registered metric names or aliases; the
                    results are keyed by name. Default: all registered at the time
                    of the call.
        Others: as :class:`MetricAttribution` and :meth:`MetricAttribution.attribute`.

    Returns:
        :class:`MetricScores`: ``scores[name]`` ``(batch, n_layers, [n_heads,] n_query,
        n_key)``, ``deltas[name]`` ``(batch,)`` for the metrics with a completeness
        identity, and the model's output.

    Examples::

        >>> batch = tokenizer(["Paris is in", "Rome is in"], return_tensors="pt")
        >>> found = attribute_metrics(model, batch, ["cw_inter", "attention"], query_positions=[-1])
        >>> found.scores["cw_inter"].shape  # (batch, n_layers, n_query, n_key)
        torch.Size([2, 30, 1, 3])
        >>> bool((found.deltas["cw_inter"] < 1e-4).all())  # rows sum to 1
        True
    """
    chosen = [get_metric(name) for name in (metric_names() if metrics is None else metrics)]
    if not chosen or len({metric.name for metric in chosen}) != len(chosen):
        raise InputError(f"metrics must name at least one metric, each once; got {[m.name for m in chosen]!r}.")
    attributor = MetricAttribution(model, chosen[0].name, layers, heads, chunk_size, verify=verify)
    found = attributor.score(inputs, attention_mask, additional_forward_args, query_positions, chosen,
                             per_head=per_head)
    return MetricScores(found.scores, found.deltas(), found.output)
