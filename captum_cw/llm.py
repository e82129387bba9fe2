"""Text front end: contribution weights of a prompt for a target string, as captum's LLMAttributionResult."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from captum.attr import LLMAttributionResult, TextTokenInput
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.attribution import AttentionWeights, ContributionWeights

__all__ = ["LLMContributionAttribution", "LAYER_AGGREGATIONS", "aggregate_layers"]

LAYER_AGGREGATIONS = ("last", "mean", "rollout")


def aggregate_layers(scores: Tensor, rows: Tensor, aggregation: str) -> Tensor:
    r"""
    One score per key for each wanted query row, from per-layer token-level scores.

    Args:
        scores (Tensor): ``(n_layers, n, n)`` token-level scores of every query row
                    (for ``"last"`` and ``"mean"`` only the wanted rows need be set).
        rows (Tensor): the wanted query rows ``(n_rows,)``.
        aggregation (str): ``"last"`` (the last layer's row), ``"mean"`` (mean over
                    layers) or ``"rollout"``: ``R = A_L' ... A_1'`` with
                    ``A' = (A + I) / 2`` (Abnar & Zuidema, 2020), which follows
                    contributions through the residual stream; rows of ``A`` that
                    sum to 1 (attention, inter-head CW) keep rows of ``R`` summing to 1.
    Returns:
        Tensor ``(n_rows, n)``.
    """
    if aggregation == "last":
        return scores[-1, rows]
    if aggregation == "mean":
        return scores[:, rows].mean(0)
    if aggregation == "rollout":
        identity = torch.eye(scores.shape[-1], device=scores.device, dtype=scores.dtype)
        rollout = identity
        for layer_scores in scores:  # first layer first
            rollout = ((layer_scores + identity) / 2) @ rollout
        return rollout[rows]
    raise ValueError(f"layer aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, got {aggregation!r}.")


class LLMContributionAttribution:
    r"""
    Contribution weights of each prompt token for each token of a target string.

    For target token ``t`` the query row is the position that predicts it (the
    token before it). Heads are aggregated as :class:`ContributionWeights` does
    (sum for inter-head, mean for intra-head); layers by ``layer_aggregation``
    (see :func:`aggregate_layers`). ``token_attr[t, j]`` is the score of prompt
    token ``j`` for target token ``t``; ``seq_attr`` is its sum over target
    tokens, as captum's ``LLMAttribution`` sums over the target sequence.

    Args:
        model (nn.Module): a causal language model of a registered architecture.
        tokenizer (PreTrainedTokenizerBase): its tokenizer.
        layer_aggregation (str, optional): ``"last"``, ``"mean"`` or ``"rollout"``.
                    Default: ``"mean"``
        variant (str, optional): ``"inter"``, ``"intra"``, or ``"attention"`` for
                    the raw-attention baseline. Default: ``"inter"``
        layers (Sequence[int], optional): layers to use. Default: all.
        heads (Sequence[int], optional): heads to use. Default: all.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        layer_aggregation: str = "mean",
        variant: str = "inter",
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
    ) -> None:
        if layer_aggregation not in LAYER_AGGREGATIONS:
            raise ValueError(f"layer_aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, "
                             f"got {layer_aggregation!r}.")
        self.model = model
        self.tokenizer = tokenizer
        self.layer_aggregation = layer_aggregation
        if variant == "attention":
            self.attributor = AttentionWeights(model, layers=layers, heads=heads)
        else:
            self.attributor = ContributionWeights(model, layers=layers, heads=heads, variant=variant)

    def _prompt(self, inp: str | TextTokenInput) -> tuple[Tensor, Tensor]:
        r"""Prompt ids ``(n,)`` and the positions that are interpretable features."""
        if isinstance(inp, TextTokenInput):
            ids = inp.inp_tensor[0]
            keep = inp.itp_mask[0] if inp.itp_mask is not None else torch.ones_like(ids, dtype=torch.bool)
            return ids, keep.nonzero().flatten()
        if isinstance(inp, str):
            ids = self.tokenizer(inp, return_tensors="pt")["input_ids"][0]
            return ids, torch.arange(len(ids))
        raise ValueError(f"inp must be a string or captum's TextTokenInput, got {type(inp).__name__}.")

    def attribute(self, inp: str | TextTokenInput, target: str | Tensor) -> LLMAttributionResult:
        r"""
        Args:
            inp (str or TextTokenInput): the prompt.
            target (str or Tensor): the continuation to explain, as text or token ids.
        Returns:
            captum's ``LLMAttributionResult`` with ``seq_attr`` ``(n_prompt_tokens,)``,
            ``token_attr`` ``(n_target_tokens, n_prompt_tokens)`` and
            ``output_probs`` ``(n_target_tokens,)``.
        """
        prompt_ids, features = self._prompt(inp)
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty: the first target token needs a position before it that "
                             "predicts it; pass a non-empty prompt (or a tokenizer that adds a BOS token).")
        if isinstance(target, str):
            target_ids = self.tokenizer(target, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        else:
            target_ids = torch.as_tensor(target).flatten()
        if len(target_ids) == 0:
            raise ValueError("target is empty; pass at least one target token.")
        ids = torch.cat([prompt_ids, target_ids.to(prompt_ids.device)])[None]  # [1, n]
        n_prompt = len(prompt_ids)
        rows = torch.arange(len(target_ids)) + n_prompt - 1  # the positions that predict each target token
        wanted = None if self.layer_aggregation == "rollout" else rows
        scores, _, output = self.attributor.attribute_with_output(ids, query_positions=wanted)
        scores = scores[0]  # [layer, query, key]
        if wanted is not None:  # rows were computed only for the wanted positions: index them 0..len-1
            full = scores.new_zeros(scores.shape[0], ids.shape[1], ids.shape[1])
            full[:, rows] = scores
            scores = full
        token_scores = aggregate_layers(scores, rows.to(scores.device), self.layer_aggregation)  # [target, n]
        token_attr = token_scores[:, features.to(token_scores.device)].cpu()  # [target, feature]
        log_probs = torch.log_softmax(output.logits[0, rows].float(), dim=-1)
        probs = log_probs.gather(-1, target_ids[:, None].to(log_probs.device)).exp().flatten().cpu()
        tokens = self.tokenizer.convert_ids_to_tokens(prompt_ids[features].tolist())
        return LLMAttributionResult(
            input_tokens=tokens,
            output_tokens=self.tokenizer.convert_ids_to_tokens(target_ids.tolist()),
            seq_attr=token_attr.sum(0),
            token_attr=token_attr,
            output_probs=probs,
        )
