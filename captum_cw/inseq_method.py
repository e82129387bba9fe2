"""
Contribution weights as an inseq attribution method, ``"contribution_weights"``.

Importing this module registers the method (inseq finds its methods among the
subclasses of its registries), so::

    >>> import inseq
    >>> import captum_cw.inseq_method  # registers "contribution_weights"
    >>> model = inseq.load_model("HuggingFaceTB/SmolLM2-135M", "contribution_weights")  # doctest: +SKIP
    >>> out = model.attribute("The capital of France is", generation_args={"max_new_tokens": 3})  # doctest: +SKIP
    >>> out.show()  # doctest: +SKIP

(the hub id needs network; a local folder works the same, as tests/test_inseq.py shows)

inseq 0.7 runs beside transformers 5 when installed without its dependencies
(``pip install --no-deps inseq==0.7.1 jaxtyping wadler-lindig "typeguard<=2.13.3" treescope``,
see docs/INSEQ.md). Decoder-only models of a registered architecture only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from captum._utils.typing import TensorOrTupleOfTensorsGeneric
from inseq.attr.feat.internals_attribution import InternalsAttributionRegistry
from inseq.data import MultiDimensionalFeatureAttributionStepOutput
from inseq.utils.typing import InseqAttribution

from captum_cw import attribution
from captum_cw.errors import InputError
from captum_cw.metrics import deprecated_variant

__all__ = ["ContributionWeightsAttribution"]


class ContributionWeightsAttribution(InternalsAttributionRegistry):
    r"""
    Contribution weights (:class:`captum_cw.ContributionWeights`) of every prefix
    token for every generated token, as inseq's ``"contribution_weights"`` method.

    Like inseq's ``"attention"`` method it needs one forward pass of the whole
    sequence (a final-step method) and does not depend on the attributed function:
    the scores of generated token ``t`` at position ``p`` are the row ``p - 1`` (the
    position that predicts it) of each selected layer, over the keys ``0..p-1``.
    Heads are aggregated as :class:`captum_cw.ContributionWeights` does (summed for
    ``metric="cw_inter"``, so a layer's row sums to 1; averaged for ``"cw_intra"``)
    unless ``per_head=True`` is passed to ``attribute``. inseq's default aggregation
    then averages the layers (and the heads, when kept), which gives
    :class:`captum_cw.TokenContributions` with ``layer_aggregation="mean"``.

    Keyword arguments of ``inseq.load_model(model, "contribution_weights", ...)``:

    Args:
        layers (int or Sequence[int], optional): layers to attribute, in the order
                    wanted (negative counts from the end). Default: all.
        heads (int or Sequence[int], optional): heads to keep. Default: all.
        metric (str, optional): ``"cw_inter"`` or ``"cw_intra"`` (or an alias:
                    ``"inter"``, ``"intra"``). Default: ``"cw_inter"``
        chunk_size (int, optional): query rows computed at once per layer.
                    Default: None (as many as keep one block of scores within
                    :data:`captum_cw.scan.CHUNK_ELEMENTS` numbers)
        verify (bool, optional): run captum_cw's self-check (see
                    :class:`captum_cw.ContributionWeights`). Default: True
        variant (str, optional): deprecated: the former name of ``metric``
                    (``"inter"``, ``"intra"``), with a DeprecationWarning.

    Keyword argument of ``model.attribute(...)``: ``per_head`` (bool, default
    False), keep the head dimension.

    Returns (in ``out.sequence_attributions[i].target_attributions``):
        ``(n_tokens, n_generated, n_layers)``, or ``(n_tokens, n_generated,
        n_layers, n_heads)`` with ``per_head=True``: inseq's layout for
        multi-dimensional scores, layers and heads in the order selected.
    """

    method_name = "contribution_weights"

    class ContributionWeights(InseqAttribution):
        r"""The inseq wrapper (``forward_func`` is inseq's model) of :class:`captum_cw.ContributionWeights`."""

        def __init__(self, forward_func: Any, attributor: attribution.ContributionWeights) -> None:
            super().__init__(forward_func)
            self.attributor = attributor

        @staticmethod
        def has_convergence_delta() -> bool:
            return False

        def attribute(
            self,
            inputs: TensorOrTupleOfTensorsGeneric,
            additional_forward_args: TensorOrTupleOfTensorsGeneric,
            *,
            per_head: bool = False,
        ) -> MultiDimensionalFeatureAttributionStepOutput:
            r"""
            Args:
                inputs (tuple): the embeddings or ids inseq prepared; unused, the ids
                            are taken from ``additional_forward_args``.
                additional_forward_args (tuple): inseq's decoder-only arguments,
                            ``(input_ids (batch, n), target_ids, attributed_fn,
                            attention_mask (batch, n), ...)``; padding is on the left.
                per_head (bool, optional): keep the head dimension. Default: False

            Returns:
                :class:`~inseq.data.MultiDimensionalFeatureAttributionStepOutput` with
                ``target_attributions`` ``(batch, n_key, n_query, n_layers[, n_heads])``
                (key first, as inseq's attention method), float32 on the CPU.
            """
            input_ids, attention_mask = additional_forward_args[0], additional_forward_args[3]
            attributed = self.attributor.attribute(input_ids, attention_mask=attention_mask, per_head=per_head)
            scores = attributed[0] if isinstance(attributed, tuple) else attributed  # ids as a tensor: a tensor
            if per_head:  # [batch, layer, head, query, key] -> [batch, key, query, layer, head]
                scores = scores.permute(0, 4, 3, 1, 2)
            else:  # [batch, layer, query, key] -> [batch, key, query, layer]
                scores = scores.permute(0, 3, 2, 1)
            return MultiDimensionalFeatureAttributionStepOutput(
                source_attributions=None,
                target_attributions=scores.detach().to("cpu").contiguous(),
                _num_dimensions=2 if per_head else 1,  # layers[, heads]
            )

    def __init__(
        self,
        attribution_model: Any,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
        metric: str | None = None,
        chunk_size: int | None = None,
        *,
        verify: bool = True,
        variant: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(attribution_model, **kwargs)
        if attribution_model.is_encoder_decoder:
            raise InputError(
                "contribution_weights supports decoder-only models in inseq: captum_cw attributes self-attention, "
                f"and {type(attribution_model.model).__name__} is an encoder-decoder (its cross-attention is not "
                "supported)."
            )
        # Does not rely on the predicted output (decoding strategy agnostic)
        self.use_predicted_target = False
        # One forward pass of the whole sequence gives the rows of every generation step
        self.is_final_step_method = True
        attributor = attribution.ContributionWeights(attribution_model.model, layers=layers, heads=heads,
                                                     metric=deprecated_variant(metric, variant, self.method_name),
                                                     chunk_size=chunk_size, verify=verify)
        self.method = self.ContributionWeights(attribution_model, attributor)

    def prepare_and_attribute(self, sources: Any, targets: Any, *args: Any, batch_size: int | None = None,
                              **kwargs: Any) -> Any:
        r"""
        inseq's ``prepare_and_attribute``, one text at a time: inseq 0.7.1 lays out
        the rows of a final-step method in padded positions and strips the padding
        of a left-padded batch from them incorrectly (its ``"attention"`` method too),
        so prompts of different lengths batched together got shifted scores. Each
        text gets its own unpadded forward pass instead; ``batch_size`` is ignored.
        """
        return super().prepare_and_attribute(sources, targets, *args, batch_size=1, **kwargs)

    def attribute_step(
        self,
        attribute_fn_main_args: dict[str, Any],
        attribution_args: dict[str, Any],
    ) -> MultiDimensionalFeatureAttributionStepOutput:
        return self.method.attribute(**attribute_fn_main_args, **attribution_args)
