"""The view model: every score ``captum-cw attribute`` shows for one text, and its JSON and CSV files.

:func:`attribution_view` scores one text (and optionally a target continuation) with every metric the views
show, per layer and per head, for the positions explained, into an :class:`AttributionView`;
:func:`view_path` and :func:`write_view` say where a view's file goes and write it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.attribution import attribute_metrics, attributor_for
from captum_cw.errors import InputError
from captum_cw.exclusions import check_exclusion, excluded_tokens
from captum_cw.files import output_path, strict_json, write_atomically
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers
from captum_cw.metrics import ATTENTION, CW_INTER, CW_INTRA, deprecated_variant, get_metric
from captum_cw.models import readable_tokens
from captum_cw.positions import Positions

__all__ = ["METRIC_LABELS", "VIEW_FILES", "AttributionView", "aggregation_label", "attribution_scores",
           "attribution_view", "view_path", "write_view"]

def aggregation_label(aggregation: str, layers: Sequence[int], selection: str = "") -> str:
    r"""How a view's layers were combined, in words (``selection``: the layers chosen, appended where said)."""
    return {"mean": f"mean over layers{selection}", "last": f"last layer ({layers[-1]})",
            "magnitude": f"mean magnitude over layers{selection}",
            "rollout": f"rollout over layers{selection}"}[aggregation]


METRIC_LABELS = {CW_INTER.name: "contribution (inter)", CW_INTRA.name: "contribution (intra)",
                 ATTENTION.name: ATTENTION.label}
_DEFAULT_METRICS = (CW_INTER.name, CW_INTRA.name)  # what attribution_view shows by default, besides attention


def attribution_scores(
    model: nn.Module,
    ids: Tensor,
    metrics: Sequence[str],
    rows: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> tuple[dict[str, Tensor], Any]:
    r"""
    Per-head scores of every metric for the wanted query rows, and the model's output, from one forward pass
    (:func:`captum_cw.attribution.attribute_metrics`). Every score the views, the command line and their
    files show comes from here.

    Args:
        model (nn.Module): a transformers model of a registered (or discovered) architecture.
        ids (Tensor): ``(1, n)`` token ids.
        metrics (Sequence[str]): per-head metrics (``"cw_inter"``, ``"cw_intra"``, ``"attention"``, ...).
        rows (Sequence[int], optional): the query rows; None for every row.
        layers, heads (Sequence[int], optional): absolute indices; None for all.
    Returns:
        ``(scores, output)``: metric -> ``(n_layers, n_heads, n_rows, n)`` float32, and the model output.
    """
    found = attribute_metrics(model, ids, list(metrics), layers, heads, query_positions=rows, per_head=True)
    return {metric: found.scores[metric][0].cpu() for metric in metrics}, found.output  # [layer, head, row, key]


@dataclass
class AttributionView:
    r"""
    Everything the views show for one text, made by :func:`attribution_view`.

    Attributes:
        model (str): the model's name, for titles.
        text (str): the text; target (str or None): the continuation explained.
        token_ids (list[int]), tokens (list[str]): the keys (every token an explained position can read), decoded
                    one by one.
        n_tokens (int): the tokens of the text (and target), keys or not.
        positions (list[int]): the explained query positions (with a target: the positions that predict its tokens).
        predicted (list[str]): the model's most likely next token at each position (empty without logits).
        target_tokens (list[str] or None), target_probs (list[float] or None): the target's tokens, one per
                    position, and the model's probability of each.
        layers (list[int]), heads (list[int]): the layers and heads used, in model order.
        n_layers (int), n_heads (int): how many the model has.
        aggregation (str): how ``aggregated`` combines the layers: ``"last"``, ``"mean"``, ``"magnitude"`` or
                    ``"rollout"``.
        threshold (float): attention above which a key is marked as a sink.
        per_head (dict[str, Tensor]): metric -> ``(n_layers, n_heads, n_positions, n_keys)``.
        per_layer (dict[str, Tensor]): metric -> ``(n_layers, n_positions, n_keys)``, heads summed (inter-head CW)
                    or averaged (the others).
        aggregated (dict[str, Tensor]): metric -> ``(n_positions, n_keys)``, layers combined by ``aggregation``.
        exclude (str or None): the exclusion asked for (:data:`captum_cw.exclusions.EXCLUSIONS`).
        excluded (list[list[int]]): per explained position, the keys ``exclude`` leaves out of a ranking
                    (:func:`captum_cw.exclusions.excluded_tokens`; ``"sinks"`` with ``threshold``); the scores keep
                    their values, the views mark these keys instead of colouring them. Empty without ``exclude``.
    """

    model: str
    text: str
    target: str | None
    token_ids: list[int]
    tokens: list[str]
    n_tokens: int
    positions: list[int]
    predicted: list[str]
    target_tokens: list[str] | None
    target_probs: list[float] | None
    layers: list[int]
    heads: list[int]
    n_layers: int
    n_heads: int
    aggregation: str
    threshold: float
    per_head: dict[str, Tensor]
    per_layer: dict[str, Tensor]
    aggregated: dict[str, Tensor]
    exclude: str | None = None
    excluded: list[list[int]] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        return list(self.aggregated)

    def sinks_per_layer(self) -> list[list[int]]:
        r"""Per layer, the keys whose attention (mean over heads and explained positions) exceeds ``threshold``."""
        received = self.per_layer[ATTENTION.name].mean(1)  # [layer, key]
        return [(layer > self.threshold).nonzero().flatten().tolist() for layer in received]

    def sinks(self) -> list[int]:
        r"""The keys whose attention, averaged also over layers, exceeds ``threshold``."""
        return (self.per_layer[ATTENTION.name].mean((0, 1)) > self.threshold).nonzero().flatten().tolist()

    def excluded_keys(self, rows: Sequence[int] | None = None) -> list[int]:
        r"""The keys excluded at any of the explained positions ``rows`` (indices into :attr:`positions`; default:
        all of them), sorted."""
        chosen = self.excluded if rows is None else [self.excluded[r] for r in rows if r < len(self.excluded)]
        return sorted({key for keys in chosen for key in keys})

    def to_dict(self) -> dict[str, Any]:
        r"""The JSON document of ``captum-cw attribute --json`` (schema in README, "Views")."""
        return {
            "model": self.model, "text": self.text, "target": self.target,
            "tokens": self.tokens, "token_ids": self.token_ids, "positions": self.positions,
            "predicted": self.predicted, "target_tokens": self.target_tokens, "target_probs": self.target_probs,
            "layers": self.layers, "heads": self.heads, "aggregation": self.aggregation,
            "threshold": self.threshold, "sinks": self.sinks(), "sinks_per_layer": self.sinks_per_layer(),
            "exclude": self.exclude, "excluded": self.excluded,
            "scores": {metric: {"aggregated": self.aggregated[metric].tolist(),
                                "per_layer": self.per_layer[metric].tolist(),
                                "per_head": self.per_head[metric].tolist()} for metric in self.metrics},
        }

    def write_json(self, path: str | Path) -> Path:
        r"""Writes :meth:`to_dict` as strict JSON (an undefined number is ``null``) to ``path``, a ``.json`` file
        or a folder (see :func:`view_path`); returns the file written."""
        return write_view(path, "json", strict_json(self.to_dict(), ensure_ascii=False))

    def csv_rows(self) -> list[list[Any]]:
        r"""Long-format rows ``metric, level, layer, head, position, key, token, score`` (header first)."""
        rows: list[list[Any]] = [["metric", "level", "layer", "head", "position", "key", "token", "score"]]
        for metric in self.metrics:
            for r, position in enumerate(self.positions):
                for key, token in enumerate(self.tokens):
                    rows.append([metric, "aggregated", self.aggregation, "", position, key, token,
                                 float(self.aggregated[metric][r, key])])
                for k, layer in enumerate(self.layers):
                    for key, token in enumerate(self.tokens):
                        rows.append([metric, "layer", layer, "", position, key, token,
                                     float(self.per_layer[metric][k, r, key])])
                    for h, head in enumerate(self.heads):
                        for key, token in enumerate(self.tokens):
                            rows.append([metric, "head", layer, head, position, key, token,
                                         float(self.per_head[metric][k, h, r, key])])
        return rows

    def write_csv(self, path: str | Path) -> Path:
        r"""Writes :meth:`csv_rows` to ``path``, a ``.csv`` file or a folder (see :func:`view_path`); returns the
        file written."""
        text = io.StringIO(newline="")
        csv.writer(text).writerows(self.csv_rows())
        return write_view(path, "csv", text.getvalue())


VIEW_FILES: dict[str, tuple[tuple[str, ...], str]] = {
    "html": ((".html", ".htm"), "captum_cw.html"),
    "json": ((".json",), "captum_cw.json"),
    "csv": ((".csv",), "captum_cw.csv"),
}
"""Per format of a view, the suffixes its file may have and its file's name inside a folder."""


def view_path(path: str | Path, kind: str, flag: str = "path") -> Path:
    r"""
    The file a view of format ``kind`` (``"html"``, ``"json"`` or ``"csv"``) goes to: ``path`` when its suffix is
    the format's; ``captum_cw.<kind>`` inside it when it is a folder (one that exists, ends in ``/`` or has no
    suffix). Any other suffix raises an :class:`~captum_cw.errors.InputError` naming ``flag``.
    """
    suffixes, name = VIEW_FILES[kind]
    return output_path(path, suffixes, name, flag)


def write_view(path: str | Path, kind: str, text: str) -> Path:
    r"""Writes ``text``, a view of format ``kind``, to the file :func:`view_path` names, atomically, creating its
    folder; returns the file."""
    path = view_path(path, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, text)


@dataclass(frozen=True)
class _ExplainedText:
    r"""The tokens a view scores and the query positions it explains."""

    ids: Tensor  # [n]: the text's tokens, then the target's
    rows: list[int]  # the explained query positions
    target_ids: Tensor | None  # [n_target]: the target's tokens, None without a target


def _shown_metrics(metrics: Sequence[str] | str | None, variants: Sequence[str] | None) -> tuple[str, ...]:
    r"""The registered names of the metrics a view shows (``variants``: the deprecated former argument)."""
    given = deprecated_variant(metrics, variants, "attribution_view", ("metrics", "variants"))
    if isinstance(given, str):  # one metric
        given = (given,)
    shown = _DEFAULT_METRICS if given is None else tuple(get_metric(metric).name for metric in given)
    if not shown:
        raise InputError("metrics is empty; name at least one metric, or leave it out for the default.")
    return shown


def _check_options(aggregation: str, threshold: float) -> None:
    if aggregation not in LAYER_AGGREGATIONS:
        raise InputError(f"aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, got {aggregation!r}.")
    if not 0 < threshold < 1:
        raise InputError(f"threshold is a share of the attention mass, in (0, 1), got {threshold}.")


def _explained_text(tokenizer: PreTrainedTokenizerBase, text: str, target: str | None,
                    position: int | None) -> _ExplainedText:
    r"""Tokenizes the text (and target) and resolves the explained positions: those that predict the target's
    tokens, or ``position`` (default: the last token; negative counts from the end)."""
    if target is not None and position is not None:
        raise InputError("give a position or a target, not both: with a target, the positions that predict its "
                         "tokens are explained.")
    prompt = tokenizer(text, return_tensors="pt")["input_ids"][0]
    if len(prompt) == 0:
        raise InputError("the text has no tokens; give a non-empty text.")
    if target is not None:
        target_ids = tokenizer(target, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        if len(target_ids) == 0:
            raise InputError("the target has no tokens; give a non-empty target.")
        ids = torch.cat([prompt, target_ids])
        return _ExplainedText(ids, list(range(len(prompt) - 1, len(ids) - 1)), target_ids)  # each predicts one
    explained = Positions.shared(-1 if position is None else position, "position").rows(None, 1, len(prompt))
    if explained.shape[1] != 1:  # [1, k]
        raise InputError(f"position must be one int, got {position!r}.")
    return _ExplainedText(prompt, [int(explained[0, 0])], None)


def _scores_per_level(
    scores: dict[str, Tensor], rows: list[int], aggregation: str, n_keys: int
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    r"""
    Each metric's per-head scores reduced to the three levels a view shows, for the explained ``rows`` and the
    first ``n_keys`` keys.

    Args:
        scores (dict[str, Tensor]): metric -> ``(n_layers, n_heads, n_rows, n)``: the explained rows, or every
                    row for ``"rollout"`` (which follows every row through the layers).
    Returns:
        ``(per_head, per_layer, aggregated)``: metric -> ``(n_layers, n_heads, len(rows), n_keys)``,
        ``(n_layers, len(rows), n_keys)`` (heads summed for inter-head CW, averaged otherwise) and
        ``(len(rows), n_keys)`` (layers combined by ``aggregation``).
    """
    per_head, per_layer, aggregated = {}, {}, {}
    for metric, values in scores.items():  # values: [layer, head, row, key]
        reduce = torch.sum if get_metric(metric).head_reduction == "sum" else torch.mean
        layer_values = reduce(values, 1)  # [layer, row, key]: heads summed (inter-head CW) or averaged
        # rollout: every row, the explained ones picked; otherwise only the explained rows are there
        picked = torch.tensor(rows) if aggregation == "rollout" else torch.arange(len(rows))
        combined = aggregate_layers(layer_values, picked.to(layer_values.device), aggregation)  # [row, key]
        if aggregation == "rollout":
            values, layer_values = values[:, :, rows], layer_values[:, rows]
        per_head[metric], per_layer[metric] = values[..., :n_keys], layer_values[..., :n_keys]
        aggregated[metric] = combined[..., :n_keys]  # [row, key]
    return per_head, per_layer, aggregated


def _predictions(output: Any, explained: _ExplainedText,
                 tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], list[float] | None]:
    r"""The most likely next token at each explained position (empty without logits) and, with a target, the
    probability of each of its tokens."""
    if getattr(output, "logits", None) is None:
        return [], None
    logits = output.logits[0, explained.rows].float().cpu()  # [row, vocab]
    predicted = readable_tokens(tokenizer, logits.argmax(-1).tolist())
    if explained.target_ids is None:
        return predicted, None
    return predicted, logits.softmax(-1).gather(-1, explained.target_ids[:, None]).flatten().tolist()


def attribution_view(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    target: str | None = None,
    *,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    metrics: Sequence[str] | None = None,
    aggregation: str = "mean",
    position: int | None = None,
    threshold: float = 0.3,
    model_name: str = "",
    variants: Sequence[str] | None = None,
    exclude: str | None = None,
) -> AttributionView:
    r"""
    Contribution weights (or other metrics) and attention of every key for the explained positions, per head, per
    layer and with layers aggregated.

    Args:
        model (nn.Module): a transformers model of a registered (or discovered) architecture.
        tokenizer (PreTrainedTokenizerBase): its tokenizer.
        text (str): the text (the prompt when ``target`` is given).
        target (str, optional): a continuation appended to the text; the positions that predict its tokens are
                    explained (as :class:`captum_cw.llm.LLMContributionAttribution` does). Default: None
        layers, heads (int or Sequence[int], optional): the layers and heads to use (negative indices count from
                    the end); shown in model order. Default: all.
        metrics (Sequence[str], optional): registered metrics, by name or alias; attention is always computed
                    too (the baseline, and what marks the sinks). Default: ``"cw_inter"``, ``"cw_intra"``
        aggregation (str, optional): ``"last"``, ``"mean"``, ``"magnitude"`` or ``"rollout"`` over the layers.
                    Default: ``"mean"``
        position (int, optional): without a target, the position to explain (negative counts from the end).
                    Default: the last token.
        threshold (float, optional): attention above which a key is marked as a sink, in (0, 1). Default: 0.3
        model_name (str, optional): a name for titles.
        variants (Sequence[str], optional): deprecated: the former name of ``metrics`` (``"inter"``, ``"intra"``),
                    with a DeprecationWarning.
        exclude (str, optional): ``"first"``, ``"special"`` or ``"sinks"``: the keys to mark as left out of the
                    ranking at each explained position, with :class:`~captum_cw.TokenContributions`' meaning
                    (:func:`captum_cw.exclusions.excluded_tokens`; ``"sinks"`` uses ``threshold`` on each
                    position's attention, mean over heads and the layers used). Default: None
    Returns:
        :class:`AttributionView`.
    """
    shown = _shown_metrics(metrics, variants)
    _check_options(aggregation, threshold)
    check_exclusion(exclude, named_only=True)
    explained = _explained_text(tokenizer, text, target, position)
    ids, rows = explained.ids, explained.rows
    probe = attributor_for(ATTENTION.name, model, layers, heads)  # resolves and checks the indices
    layer_list, head_list = sorted(probe.layers), sorted(probe.heads)
    causal = bool(getattr(probe.attention_layers[0].attention, "is_causal", True))
    computed = list(dict.fromkeys([*shown, ATTENTION.name]))
    wanted = None if aggregation == "rollout" else rows  # rollout follows every row through the layers
    scores, output = attribution_scores(model, ids[None], computed, wanted, layer_list, head_list)
    n_keys = max(rows) + 1 if causal else len(ids)  # keys no explained position can read are left out
    per_head, per_layer, aggregated = _scores_per_level(scores, rows, aggregation, n_keys)
    predicted, target_probs = _predictions(output, explained, tokenizer)
    attention = per_layer[ATTENTION.name].transpose(0, 1)[None]  # [1, position, layer, key]
    excluded = excluded_tokens(exclude, ids[None, :n_keys], None, model, attention, threshold)  # [1, (position,) key]
    excluded = excluded[0].expand(len(rows), n_keys)  # [position, key]
    target_ids = explained.target_ids
    return AttributionView(
        model=model_name, text=text, target=target, token_ids=ids[:n_keys].tolist(),
        tokens=readable_tokens(tokenizer, ids[:n_keys].tolist()), n_tokens=len(ids), positions=rows,
        predicted=predicted,
        target_tokens=None if target_ids is None else readable_tokens(tokenizer, target_ids.tolist()),
        target_probs=target_probs, layers=layer_list, heads=head_list, n_layers=len(probe.attention_layers),
        n_heads=probe.n_heads, aggregation=aggregation,
        threshold=threshold, per_head=per_head, per_layer=per_layer, aggregated=aggregated, exclude=exclude,
        excluded=[row.nonzero().flatten().tolist() for row in excluded] if exclude is not None else [],
    )
