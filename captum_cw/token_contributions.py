"""Input-shaped scores: how much each input token feeds the output at one position, for a whole batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_cw.attribution import _untuple, attributor_for
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers, in_forward_order
from captum_cw.scan import ModelInputs, check_inputs, prepare_inputs

__all__ = ["TokenContributions"]

Position = int | Sequence[int] | Tensor | None


def _is_causal(attributor: Any) -> bool:
    return bool(getattr(attributor.attention_layers[0].attention, "is_causal", True))


def _example_positions(position: Position, padding: Tensor | None, batch: int, n: int, causal: bool) -> Tensor:
    r"""
    One query position per example, ``(batch,)`` long, as indices into the padded rows.

    None: the last real token for causal models, the first one otherwise. An int
    ``p >= 0`` is an index into the row as given; ``p < 0`` counts back from the end
    of each example's real tokens (``-1`` is the last real token, under left or right
    padding). A sequence or tensor gives one such position per example.
    """
    real = padding if padding is not None else torch.ones(batch, n, dtype=torch.bool)
    real = real.cpu()
    last = n - 1 - real.flip(-1).int().argmax(-1)  # [batch] index of the last real token
    first = real.int().argmax(-1)  # [batch]
    if position is None:
        return last if causal else first
    given = torch.as_tensor(position)
    if given.dtype == torch.bool or given.is_floating_point() or given.is_complex():
        raise ValueError(f"position must be an int or one int per example, got {given.dtype} {position!r}.")
    if given.dim() == 0:
        given = given.expand(batch)
    if given.shape != (batch,):
        raise ValueError(f"position has shape {tuple(given.shape)}; pass an int or one position per example "
                         f"({batch},).")
    positions = torch.where(given < 0, last + 1 + given, given).long()
    outside = (positions < 0) | (positions >= n)
    if outside.any() or not real[torch.arange(batch), positions.clamp(0, n - 1)].all():
        bad = int((outside | ~real[torch.arange(batch), positions.clamp(0, n - 1)]).nonzero()[0])
        raise ValueError(f"position {given[bad].item()} of example {bad} is not one of its real tokens "
                         f"({int(first[bad])}..{int(last[bad])}); negative positions count back from its last "
                         "real token.")
    return positions


class TokenContributions(Attribution):
    r"""
    How much each input token feeds a model's output at one position: one score
    per input token, shaped like the inputs, for a whole padded batch.

    Each selected layer gives the token-level scores of ``metric`` (heads
    aggregated as that metric does: summed for inter-head contribution weights,
    averaged otherwise); ``layer_aggregation`` turns the layers into one score per
    token: ``"last"`` (the deepest selected layer), ``"mean"`` (their mean) or
    ``"rollout"`` (:func:`captum_cw.layer_aggregation.rollout`, selected layers
    composed in forward order). Contribution weights do not depend on a class, so
    there is no ``target``: what is explained is the output at ``position``.

    Args:
        model (nn.Module): a transformers model of a supported architecture.
        layers (int or Sequence[int], optional): layers to use. Default: all.
        heads (int or Sequence[int], optional): heads to use. Default: all.
        metric (str, optional): any per-head metric: ``"cw_inter"``, ``"cw_intra"``,
                    ``"attention"``, ``"value_weighted"``, ``"output_normalized"``.
                    Default: ``"cw_inter"``
        layer_aggregation (str, optional): ``"last"``, ``"mean"`` or ``"rollout"``.
                    Default: ``"mean"``
        position (int or Sequence[int], optional): the default position to explain,
                    as in :meth:`attribute`. Default: None
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run the self-check (see :class:`ContributionWeights`).
                    Default: True

    Examples::

        >>> explainer = TokenContributions(model)  # a causal LM: explains each last real token
        >>> batch = tokenizer(["Paris is in", "The capital of Italy is"], return_tensors="pt", padding=True)
        >>> explainer.attribute(batch).shape  # like batch["input_ids"]; padding is exactly 0
        torch.Size([2, 5])
    """

    def __init__(
        self,
        model: nn.Module,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        metric: str = "cw_inter",
        layer_aggregation: str = "mean",
        position: Position = None,
        chunk_size: int | None = None,
        verify: bool = True,
    ) -> None:
        if layer_aggregation not in LAYER_AGGREGATIONS:
            raise ValueError(f"layer_aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, "
                             f"got {layer_aggregation!r}.")
        super().__init__(model)
        self.model = model
        self.attributor = attributor_for(metric, model, layers, heads, chunk_size, verify)
        self.metric = metric
        self.layer_aggregation = layer_aggregation
        self.position = position

    def has_convergence_delta(self) -> bool:
        return False  # layers are aggregated; the per-layer identities are ContributionWeights' delta

    @log_usage()
    def attribute(
        self,
        inputs: Tensor | Mapping[str, Any] | tuple[Tensor],
        target: Any = None,
        attention_mask: Tensor | None = None,
        additional_forward_args: Mapping[str, Any] | Sequence[Any] | None = None,
        position: Position = None,
    ) -> Tensor | tuple[Tensor]:
        r"""
        Args:
            inputs (Tensor, BatchEncoding or tuple): token ids ``(batch, n)`` (or a
                        tokenizer's BatchEncoding), or pixel values
                        ``(batch, channels, height, width)`` of a vision model. A
                        one-tensor tuple gives a one-tensor tuple back.
            target: must be None. Contribution weights decompose the attention output
                        at ``position`` and do not depend on a class; to explain a
                        class logit end to end, use captum's IntegratedGradients.
            attention_mask (Tensor, optional): ``(batch, n)``, 1 for real tokens, 0 for
                        padding (left or right). Default: None (from ``inputs``)
            additional_forward_args (dict or tuple, optional): extra model arguments.
            position (int, Sequence[int] or Tensor, optional): the position whose
                        output to explain. ``p >= 0`` indexes the row as given; ``p < 0``
                        counts back from each example's last real token. One per example
                        as a sequence or ``(batch,)`` tensor. Default: the constructor's,
                        else the last real token of each example for causal models and
                        the first token (e.g. [CLS]) for encoders and vision models.

        Returns:
            *Tensor* float32 ``(batch, n)``, like the token ids: padded tokens are
            exactly 0 and every row equals the row of the example run unpadded. For
            pixel inputs, ``(batch, channels, height, width)``: each pixel gets the
            score of its patch (the class token has no pixels, so its own score is
            not in the map). A tuple if ``inputs`` was one.
        """
        if target is not None:
            raise ValueError(
                "TokenContributions has no target: contribution weights explain the attention output at a position "
                "and are the same for every class. Pass position= (the token whose output to explain, e.g. 0 for "
                "[CLS]); for a class logit end to end, use captum.attr.IntegratedGradients."
            )
        is_tuple, main = _untuple(inputs)
        position = self.position if position is None else position
        model_inputs, positional = prepare_inputs(self.model, main, attention_mask, additional_forward_args,
                                                  self.attributor._input_device)
        check_inputs(self.model, model_inputs, positional)
        score = self._token_scores if model_inputs.is_text else self._pixel_scores
        scores = score(main, model_inputs, additional_forward_args, position)
        return (scores,) if is_tuple else scores

    def _layer_scores(self, inputs, attention_mask, additional_forward_args, rows) -> Tensor:
        r"""Token-level scores of the selected layers in forward order: ``(batch, layers, n_rows, n)``."""
        scores, _, _ = self.attributor._rows_with_output(inputs, attention_mask, additional_forward_args, rows, False,
                                                         padded_rows=True)  # each example picks its own rows
        return in_forward_order(scores, self.attributor.layers)

    def _aggregate(self, scores: Tensor, rows: Tensor) -> Tensor:
        r"""One score per key for row ``rows[b]`` of each example: ``(batch, n)``."""
        return aggregate_layers(scores, rows[:, None], self.layer_aggregation)[:, 0]

    def _token_scores(self, inputs, model_inputs: ModelInputs, additional_forward_args, position: Position) -> Tensor:
        batch, n = model_inputs.main.shape
        padding = model_inputs.padding_mask
        positions = _example_positions(position, padding, batch, n, _is_causal(self.attributor))
        mask = model_inputs.keyword.get("attention_mask")
        if self.layer_aggregation == "rollout":  # every row of every layer
            scores = self._layer_scores(inputs, mask, additional_forward_args, None)
            result = self._aggregate(scores, positions.to(scores.device))
        else:  # only the rows asked for, once each
            rows, slot = positions.unique(return_inverse=True)
            scores = self._layer_scores(inputs, mask, additional_forward_args, rows)
            result = self._aggregate(scores, slot.to(scores.device))
        if padding is not None:
            result = torch.where(padding.to(result.device), result, 0.0)
        return result

    def _pixel_scores(self, inputs, model_inputs: ModelInputs, additional_forward_args, position: Position) -> Tensor:
        batch, _, height, width = model_inputs.main.shape
        patch = getattr(self.model.config, "patch_size", None)
        if not isinstance(patch, int):
            raise ValueError(f"{type(self.model).__name__} has no integer config.patch_size, so patch scores cannot "
                             "be mapped onto pixels; use ContributionWeights for token-level scores.")
        grid = (height // patch, width // patch)
        if position is not None and not isinstance(position, int):
            raise ValueError("for pixel inputs, position must be one int shared by the batch (default 0, the class "
                             "token).")
        row = 0 if position is None else position
        scores = self._layer_scores(inputs, None, additional_forward_args, [row])
        tokens = self._aggregate(scores, torch.zeros(batch, dtype=torch.long, device=scores.device))  # [batch, n]
        if tokens.shape[1] != 1 + grid[0] * grid[1]:
            raise ValueError(f"{tokens.shape[1]} tokens do not make one class token and a {grid[0]}x{grid[1]} patch "
                             "grid; this vision model's token layout is not supported by TokenContributions.")
        patches = tokens[:, 1:].reshape(batch, 1, *grid)  # [batch, 1, rows, cols] in the patch embedding's order
        pixels = patches.repeat_interleave(patch, 2).repeat_interleave(patch, 3)
        pixels = F.pad(pixels, (0, width - pixels.shape[3], 0, height - pixels.shape[2]))  # uncovered edges: 0
        return pixels.expand_as(model_inputs.main).contiguous()
