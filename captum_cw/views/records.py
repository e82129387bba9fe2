"""Records for captum's ``visualization.visualize_text``: one per row of scores, from a tensor, captum's
``LLMAttributionResult`` or an :class:`~captum_cw.views.model.AttributionView`."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import torch
from captum.attr import LLMAttributionResult, visualization
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from captum_cw.errors import InputError
from captum_cw.plotting import display_token
from captum_cw.views.model import METRIC_LABELS, AttributionView

__all__ = ["text_records"]

def _per_row(value: Any, n_rows: int, what: str) -> list[Any]:
    if isinstance(value, (str, int, float)) or value is None:
        return [value] * n_rows
    values = list(value)
    if len(values) != n_rows:
        raise InputError(f"{what} has {len(values)} entries for {n_rows} rows of scores; give one per row or one "
                         "for all.")
    return values


def _refuse_summed_scores(scores: Tensor, tokens: Sequence[str] | Sequence[Sequence[str]]) -> None:
    r"""
    Refuses scores summed over the tokens: ``(batch,)`` (Captum's ``attributions.sum(dim=-1)``) or
    ``(batch, 1)`` where one score per token is expected, told apart from one row ``(n,)`` by the tokens given.
    """
    per_row_tokens = not all(isinstance(token, str) for token in tokens)
    n_tokens = len(tokens[0]) if per_row_tokens and len(tokens) else len(tokens)
    if scores.dim() == 1:
        summed = n_tokens > 1 and ((len(tokens) == len(scores)) if per_row_tokens else (len(scores) != n_tokens))
    else:
        summed = scores.dim() == 2 and scores.shape[1] == 1 and n_tokens > 1
    if summed:
        batch = scores.shape[0]
        raise InputError(f"text_records: {n_tokens} tokens for {scores.numel()} scores: got {tuple(scores.shape)}, "
                         f"expected ({batch}, {n_tokens}): do not sum over tokens (Captum's attributions.sum(dim=-1) "
                         "sums embedding dimensions; TokenContributions already gives one score per token); for one "
                         "row, give one token per score.")


def _score_rows(attributions: Any, tokens: Sequence[str] | Sequence[Sequence[str]]) -> Tensor:
    r"""The scores as ``(rows, n)`` float32 on the CPU, checked against the tokens."""
    scores = torch.as_tensor(attributions).detach().float().cpu()
    _refuse_summed_scores(scores, tokens)
    if scores.dim() == 1:
        scores = scores[None]
    if scores.dim() != 2:
        raise InputError(f"attributions must be (n,) or (rows, n), got shape {tuple(scores.shape)}.")
    return scores  # [row, token]


def _readable(tokens: Sequence[str], tokenizer: PreTrainedTokenizerBase | None) -> list[str]:
    r"""Raw tokens as text (``'ĠParis'`` -> ``' Paris'``) with ``tokenizer``; as they are without one."""
    return [tokenizer.convert_tokens_to_string([t]) for t in tokens] if tokenizer is not None else list(tokens)


def _record(words: Sequence[str], row: Tensor, pred: Any, prob: Any, true: Any, attr: Any, *,
            normalize: bool) -> visualization.VisualizationDataRecord:
    r"""One record of ``row``, ``(n,)`` scores of the ``n`` words; ``attr_score`` is the raw sum."""
    if len(words) != len(row):
        raise InputError(f"{len(words)} tokens for {len(row)} scores; give one token per score.")
    peak = float(row.abs().max()) if len(row) else 0.0
    shown = row / peak if normalize and peak > 0 else row
    # visualize_text writes the words into HTML as they are
    words_html = [html.escape(display_token(word), quote=False) for word in words]
    return visualization.VisualizationDataRecord(shown, float(prob), pred, true, attr, float(row.sum()), words_html,
                                                 None)


def _view_records(view: AttributionView, *, normalize: bool) -> list[visualization.VisualizationDataRecord]:
    r"""One record per metric and explained position: the aggregated scores, labelled with the target token (or
    the predicted one) and its probability."""
    scores = torch.stack([view.aggregated[metric][r] for metric in view.metrics
                          for r in range(len(view.positions))])  # [metric * position, key]
    labels = [view.target_tokens[r] if view.target_tokens else (view.predicted[r] if view.predicted else "")
              for _ in view.metrics for r in range(len(view.positions))]
    probs = [view.target_probs[r] if view.target_probs else 0.0 for _ in view.metrics
             for r in range(len(view.positions))]
    classes = [f"{METRIC_LABELS.get(metric, metric)} @ {position}" for metric in view.metrics
               for position in view.positions]
    return text_records(scores, view.tokens, pred_class=labels, pred_prob=probs, true_class=view.target or "",
                        attr_class=classes, normalize=normalize)


def _result_records(result: LLMAttributionResult, tokenizer: PreTrainedTokenizerBase | None, *,
                    normalize: bool) -> list[visualization.VisualizationDataRecord]:
    r"""One record per target token (its ``token_attr`` row), or one of ``seq_attr`` when ``token_attr`` is None."""
    words = _readable(result.input_tokens, tokenizer)
    if result.token_attr is None:
        return text_records(result.seq_attr, words, pred_class="".join(result.output_tokens),
                            attr_class="sum over the target", normalize=normalize)
    outputs = _readable(result.output_tokens, tokenizer)
    output_probs = result.output_probs.tolist() if result.output_probs is not None else 0.0
    return text_records(result.token_attr, words, pred_class=outputs, pred_prob=output_probs,
                        attr_class=[f"target token {k}" for k in range(len(outputs))], normalize=normalize)


def text_records(
    attributions: Tensor | LLMAttributionResult | AttributionView,
    tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    pred_class: Any = "",
    pred_prob: Any = 0.0,
    true_class: Any = "",
    attr_class: Any = "",
    normalize: bool = True,
) -> list[visualization.VisualizationDataRecord]:
    r"""
    Records for captum's ``visualization.visualize_text``, one per row of scores.

    Args:
        attributions: one of
                    - a Tensor ``(n,)`` or ``(rows, n)``: e.g. :class:`~captum_cw.TokenContributions` output, one
                      row per example;
                    - captum's ``LLMAttributionResult`` (from :class:`~captum_cw.llm.LLMContributionAttribution`):
                      one record per target token (its ``token_attr`` row, the target token as predicted class
                      with its probability), or one for ``seq_attr`` when ``token_attr`` is None;
                    - an :class:`AttributionView`: one record per metric and explained position.
        tokens (Sequence[str] or Sequence[Sequence[str]], optional): the words, shared by all rows or one list per
                    row; needed for a Tensor.
        tokenizer (PreTrainedTokenizerBase, optional): makes raw tokens readable (``'ĠParis'`` -> ``' Paris'``)
                    with ``convert_tokens_to_string``.
        pred_class, pred_prob, true_class, attr_class (optional): the record's labels, one for all rows or one
                    per row (ignored for a result or a view, which carry their own).
        normalize (bool, optional): divide each row by its largest absolute score, so the scores use
                    ``visualize_text``'s whole colour range [-1, 1]; ``attr_score`` is always the raw sum.
                    Default: True
    Returns:
        list of ``VisualizationDataRecord``; ``visualize_text(records)`` renders them.
    """
    if isinstance(attributions, AttributionView):
        return _view_records(attributions, normalize=normalize)
    if isinstance(attributions, LLMAttributionResult):
        return _result_records(attributions, tokenizer, normalize=normalize)
    if tokens is None:
        raise InputError("tokens are needed for a tensor of scores: pass the words, one list for all rows or one "
                         "per row.")
    scores = _score_rows(attributions, tokens)  # [row, token]
    shared = all(isinstance(token, str) for token in tokens)
    token_rows = [list(tokens)] * len(scores) if shared else _per_row(tokens, len(scores), "tokens")
    labels = (_per_row(value, len(scores), name) for value, name in (
        (pred_class, "pred_class"), (pred_prob, "pred_prob"), (true_class, "true_class"), (attr_class, "attr_class")))
    return [_record(_readable(words, tokenizer), row, pred, prob, true, attr, normalize=normalize)
            for words, row, pred, prob, true, attr in zip(token_rows, scores, *labels)]
