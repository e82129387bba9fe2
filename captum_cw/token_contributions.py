"""Input-shaped scores: how much each input token feeds the output at one position, for a whole batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from captum.attr import Attribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_cw.attribution import attributor_for
from captum_cw.errors import InputError, refuse_captum_arguments, refuse_noisy_token_ids, require_model
from captum_cw.exclusions import Exclusion, check_exclusion, excluded_tokens
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers, in_forward_order, over_layers
from captum_cw.metrics import ATTENTION, CW_INTER
from captum_cw.positions import Positions
from captum_cw.scan import ModelInputs, untuple
from captum_cw.scoring import PreparedCall, prepare_call, score_metrics
from captum_cw.target_contributions import TARGET_ROWS, target_scores

__all__ = ["TokenContributions"]

Position = int | Sequence[int] | Tensor | None


def _is_causal(attributor: Any) -> bool:
    return bool(getattr(attributor.attention_layers[0].attention, "is_causal", True))


def _example_positions(position: Position, padding: Tensor | None, batch: int, n: int, *, causal: bool) -> Tensor:
    r"""
    One query position per example, ``(batch,)`` long, as indices into the padded rows
    (:class:`~captum_cw.positions.Positions`). None: the last real token for causal models, the first one
    otherwise.
    """
    if position is None and not causal:  # the first real token of each example
        real = torch.ones(batch, n, dtype=torch.bool) if padding is None else padding.cpu()
        return real.int().argmax(-1)
    return Positions.one_per_example(-1 if position is None else position).rows(padding, batch, n)[:, 0]


class TokenContributions(Attribution):
    r"""
    How much each input token feeds a model's output at one position: one score
    per input token, shaped like the inputs, for a whole padded batch.

    Each selected layer gives the token-level scores of ``metric`` (heads
    aggregated as that metric does: summed for inter-head contribution weights,
    averaged otherwise); ``layer_aggregation`` turns the layers into one score per
    token: ``"last"`` (the deepest selected layer), ``"mean"`` (their mean),
    ``"magnitude"`` (the mean of their absolute values) or ``"rollout"``
    (:func:`captum_cw.layer_aggregation.rollout`, selected layers composed in
    forward order). Without a ``target`` the scores explain the
    attention outputs at ``position`` (the same for every class); with one, each
    token's first-order part of the target's log-probability through each layer's
    attention output (:mod:`captum_cw.target_contributions`): ``alpha <vt, g>``
    with ``g`` the target's gradient at the layer's attention output, instead of
    ``alpha <vt, o> / ||o||^2``.

    Args:
        model (nn.Module): a transformers model of a supported architecture.
        layers (int or Sequence[int], optional): layers to use. Default: all.
        heads (int or Sequence[int], optional): heads to use. Default: all.
        metric (str, optional): any registered per-head metric, by name or alias
                    (:func:`captum_cw.metrics.metric_names`): ``"cw_inter"``, ``"cw_intra"``,
                    ``"attention"``, ``"value_weighted"``, ``"output_normalized"``.
                    Default: ``"cw_inter"``
        layer_aggregation (str, optional): ``"last"``, ``"mean"``, ``"magnitude"`` or
                    ``"rollout"``. Default: ``"mean"``
        position (int or Sequence[int], optional): the default position to explain,
                    as in :meth:`attribute`. Default: None
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run the self-check (see :class:`ContributionWeights`).
                    Default: True
        target_rows (str, optional): with a target, ``"explained"`` (the
                    explained position's row of each layer) or ``"all"`` (every row
                    that reads the token: the first-order effect of knocking it out).
                    Default: ``"explained"``
        exclude (str, Sequence[int] or Tensor, optional): tokens whose score is set
                    to 0, so that a ranking leaves them out: ``"first"``,
                    ``"special"`` or ``"sinks"`` (:data:`EXCLUSIONS`), positions
                    shared by the batch (:class:`~captum_cw.positions.Positions`:
                    negative ones count back from each example's last real token),
                    or a bool ``(batch, n)`` mask (:func:`captum_cw.exclusions.excluded_tokens`).
                    Default: None: measured on SmolLM2 plain prompts (docs/PEERS.md,
                    "Excluding the sink"), excluding the first token or the sinks
                    lowers pointing without a target (0.35 to 0.20, the sink being
                    the top token in every example) and leaves it within the
                    interval with one (0.62 to 0.60)

    Examples::

        >>> explainer = TokenContributions(model)  # a causal LM: explains each last real token
        >>> batch = tokenizer(["Paris is in", "The capital of Italy is"], return_tensors="pt", padding=True)
        >>> explainer.attribute(batch).shape  # like batch["input_ids"]; padding is exactly 0
        torch.Size([2, 5])
        >>> paris = tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
        >>> explainer.attribute(batch, target=paris).shape  # each token's part of log p(" Paris")
        torch.Size([2, 5])
    """

    def __init__(
        self,
        model: nn.Module,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        metric: str = CW_INTER.name,
        layer_aggregation: str = "mean",
        position: Position = None,
        chunk_size: int | None = None,
        *,
        verify: bool = True,
        target_rows: str = "explained",
        exclude: Exclusion = None,
        **captum_arguments: Any,
    ) -> None:
        require_model(model, "TokenContributions")
        refuse_captum_arguments("TokenContributions", captum_arguments)
        if layer_aggregation not in LAYER_AGGREGATIONS:
            raise InputError(f"layer_aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, "
                             f"got {layer_aggregation!r}.")
        if target_rows not in TARGET_ROWS:
            raise InputError(f"target_rows must be one of {', '.join(TARGET_ROWS)}, got {target_rows!r}.")
        check_exclusion(exclude)
        super().__init__(model)
        self.model = model
        self.attributor = attributor_for(metric, model, layers, heads, chunk_size, verify=verify)
        self.metric = self.attributor.metric.name  # the name, also when an alias was given
        self.layer_aggregation = layer_aggregation
        self.position = position
        self.target_rows = target_rows
        self.exclude = exclude

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
        exclude: Exclusion = None,
        foil: Any = None,
        **captum_arguments: Any,
    ) -> Tensor | tuple[Tensor]:
        r"""
        Args:
            inputs (Tensor, BatchEncoding or tuple): token ids ``(batch, n)`` (or a
                        tokenizer's BatchEncoding), or pixel values
                        ``(batch, channels, height, width)`` of a vision model. A
                        one-tensor tuple gives a one-tensor tuple back.
            target (int, Sequence[int] or Tensor, optional): the token (a language
                        model's vocabulary id, read at ``position``) or class (a
                        classifier's) to explain, one for the batch or one per example.
                        Each token then gets its first-order part of the target's
                        log-probability through the selected layers' attention outputs
                        (one forward and one backward pass), aggregated over layers by
                        ``layer_aggregation`` (``"mean"``: their mean, the token's
                        first-order part of the target over the layers divided by their
                        number; ``"last"``: the deepest;
                        ``"magnitude"``: the mean of their absolute values, a ranking of
                        how much the token moves the target, of no sign and with no sum;
                        ``"rollout"`` does not apply). None: the scores of
                        ``metric``, which explain the attention output and are the same
                        for every class. Default: None
            attention_mask (Tensor, optional): ``(batch, n)``, 1 for real tokens, 0 for
                        padding (left or right). Default: None (from ``inputs``)
            additional_forward_args (dict or tuple, optional): extra model arguments.
            position (int, Sequence[int] or Tensor, optional): the position whose
                        output to explain. ``p >= 0`` indexes the row as given; ``p < 0``
                        counts back from each example's last real token. One per example
                        as a sequence or ``(batch,)`` tensor. Default: the constructor's,
                        else the last real token of each example for causal models and
                        the first token (e.g. [CLS]) for encoders and vision models.
            exclude (str, Sequence[int] or Tensor, optional): as in the constructor;
                        overrides it. Default: the constructor's
            foil (int, Sequence[int] or Tensor, optional): with ``target``, the token or
                        class to contrast it with, like ``target`` one for the batch or
                        one per example: the scores then explain the log-odds
                        ``log p(target) - log p(foil)``, why the target rather than the
                        foil (the target's scores less the foil's). Default: None

        Returns:
            *Tensor* float32 ``(batch, n)``, like the token ids: padded tokens are
            exactly 0 and every row equals the row of the example run unpadded. For
            pixel inputs, ``(batch, channels, height, width)``: each pixel gets the
            score of its patch (the class token has no pixels, so its own score is
            not in the map). Excluded tokens are exactly 0. A tuple if ``inputs`` was one.
        """
        refuse_captum_arguments("TokenContributions.attribute", captum_arguments,
                                ("inputs", "target", "attention_mask", "additional_forward_args", "position",
                                 "exclude", "foil"))
        is_tuple, main = untuple(inputs)
        refuse_noisy_token_ids(self.model, main, "TokenContributions.attribute")
        position = self.position if position is None else position
        exclude = self.exclude if exclude is None else exclude
        check_exclusion(exclude)
        if foil is not None and target is None:
            raise InputError("foil is what a target is contrasted with: pass target too, or leave foil out.")
        if target is not None and self.layer_aggregation == "rollout":
            raise InputError("layer_aggregation='rollout' composes attention-like scores through the layers; a "
                             "target's first-order parts add up over layers instead: use 'mean', 'last' or "
                             "'magnitude'.")
        call = prepare_call(self.model, main, attention_mask, additional_forward_args, Positions(None))
        score = self._token_scores if call.inputs.is_text else self._pixel_scores
        scores = score(call, position, target, exclude, foil)
        return (scores,) if is_tuple else scores

    def _layer_scores(self, call: PreparedCall, positions: Positions, *, with_attention: bool
                      ) -> tuple[Tensor, Tensor | None]:
        r"""Token-level scores of the selected layers in forward order at ``positions``, ``(batch, layers, k, n)``,
        and with ``with_attention`` the attention of the same rows (mean over heads, same shape) from the same
        pass."""
        attributor = self.attributor
        metrics = [attributor.metric] + ([ATTENTION] if with_attention else [])
        found = score_metrics(self.model, attributor.scope, replace(call, positions=positions),
                              list(dict.fromkeys(metrics)))
        attention = found.scores[ATTENTION.name] if with_attention else None
        return (in_forward_order(found.scores[attributor.metric.name], attributor.layers),
                None if attention is None else in_forward_order(attention, attributor.layers))

    def _aggregate(self, scores: Tensor, rows: Tensor) -> Tensor:
        r"""One score per key for row ``rows[b]`` of each example: ``(batch, n)``."""
        return aggregate_layers(scores, rows[:, None], self.layer_aggregation)[:, 0]

    def _target_scores(self, model_inputs: ModelInputs, positional: tuple[Any, ...], positions: Tensor,
                       target: Any, foil: Any) -> tuple[Tensor, Tensor]:
        r"""Each token's first-order part of the target, layers aggregated, ``(batch, n)``, and the explained
        row's attention per layer (mean over heads) ``(batch, layers, n)``, for the sinks."""
        batch = len(positions)
        targets = _example_targets(target, batch)
        foils = None if foil is None else _example_targets(foil, batch, "foil")
        attributor = self.attributor
        layers = [attributor.attention_layers[index] for index in attributor.layers]
        heads = None if attributor.heads == list(range(attributor.n_heads)) else attributor.heads
        found = target_scores(self.model, layers, heads, model_inputs, positional, positions, targets,
                              self.target_rows, foils=foils, verify=attributor.verify)
        per_layer = in_forward_order(found.scores, attributor.layers)  # [batch, layer, n]
        scores = over_layers(per_layer, self.layer_aggregation, 1)
        return scores, in_forward_order(found.attention, attributor.layers)

    def _token_scores(self, call: PreparedCall, position: Position, target: Any, exclude: Exclusion,
                      foil: Any) -> Tensor:
        model_inputs = call.inputs
        batch, n = model_inputs.main.shape
        padding = model_inputs.padding_mask
        positions = _example_positions(position, padding, batch, n, causal=_is_causal(self.attributor))
        attention = None  # [batch, layer, n] the explained rows' attention, for exclude="sinks"
        if target is not None:
            result, attention = self._target_scores(model_inputs, call.positional,
                                                    positions.to(model_inputs.main.device), target, foil)
        elif self.layer_aggregation == "rollout":  # every row of every layer
            scores, attended = self._layer_scores(call, Positions(None), with_attention=exclude == "sinks")
            result = self._aggregate(scores, positions.to(scores.device))
            if attended is not None:
                index = positions.to(scores.device)[:, None, None, None].expand(-1, attended.shape[1], 1, n)
                attention = attended.gather(2, index)[:, :, 0]
        else:  # only each example's own row
            scores, attended = self._layer_scores(call, Positions.one_per_example(positions),
                                                 with_attention=exclude == "sinks")
            result = self._aggregate(scores, torch.zeros(batch, dtype=torch.long, device=scores.device))
            if attended is not None:
                attention = attended[:, :, 0]
        excluded = excluded_tokens(exclude, model_inputs.main, padding, self.model, attention)
        if padding is not None:
            excluded = excluded | ~padding.to(excluded.device)
        return torch.where(excluded.to(result.device), 0.0, result)

    def _pixel_scores(self, call: PreparedCall, position: Position, target: Any, exclude: Exclusion,
                      foil: Any) -> Tensor:
        model_inputs = call.inputs
        batch, _, height, width = model_inputs.main.shape
        if exclude is not None:
            raise InputError("exclude applies to tokens of a text; pixel inputs have patches, whose scores are all "
                             "shown: leave exclude out.")
        patch = getattr(self.model.config, "patch_size", None)
        if not isinstance(patch, int):
            raise InputError(f"{type(self.model).__name__} has no integer config.patch_size, so patch scores cannot "
                             "be mapped onto pixels; use ContributionWeights for token-level scores.")
        grid = (height // patch, width // patch)
        if position is not None and not isinstance(position, int):
            raise InputError("for pixel inputs, position must be one int shared by the batch (default 0, the class "
                             "token).")
        row = 0 if position is None else position
        if target is not None:
            rows = torch.full((batch,), row, dtype=torch.long, device=model_inputs.main.device)
            tokens, _ = self._target_scores(model_inputs, call.positional, rows, target, foil)  # [batch, n]
        else:
            scores, _ = self._layer_scores(call, Positions.shared([row]), with_attention=False)
            tokens = self._aggregate(scores, torch.zeros(batch, dtype=torch.long, device=scores.device))  # [batch, n]
        if tokens.shape[1] != 1 + grid[0] * grid[1]:
            raise InputError(f"{tokens.shape[1]} tokens do not make one class token and a {grid[0]}x{grid[1]} patch "
                             "grid; this vision model's token layout is not supported by TokenContributions.")
        patches = tokens[:, 1:].reshape(batch, 1, *grid)  # [batch, 1, rows, cols] in the patch embedding's order
        pixels = patches.repeat_interleave(patch, 2).repeat_interleave(patch, 3)
        pixels = F.pad(pixels, (0, width - pixels.shape[3], 0, height - pixels.shape[2]))  # uncovered edges: 0
        return pixels.expand_as(model_inputs.main).contiguous()


def _example_targets(target: Any, batch: int, name: str = "target") -> Tensor:
    r"""One target (or foil) per example, ``(batch,)`` long, from an int or one int per example."""
    given = torch.as_tensor(target)
    if given.dtype == torch.bool or given.is_floating_point() or given.is_complex():
        raise InputError(f"{name} must be a token id or class index (int), or one per example, got {given.dtype} "
                         f"{target!r}.")
    if given.dim() == 0:
        given = given.expand(batch)
    if given.shape != (batch,):
        raise InputError(f"{name} has shape {tuple(given.shape)}; pass an int or one {name} per example ({batch},).")
    return given.long()
