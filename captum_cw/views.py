"""Views of the scores: captum ``visualize_text`` records, a self-contained HTML page, JSON and CSV.

:func:`attribution_view` scores one text (and optionally a target continuation) with every metric the views
show, per layer and per head, for the positions explained; :func:`render_html` / :func:`write_html` turn the
result into one HTML file (inline CSS and JavaScript, no network) and :func:`text_records` into the records of
``captum.attr.visualization.visualize_text``.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from captum.attr import LLMAttributionResult, visualization
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.attribution import attribute_metrics, attributor_for
from captum_cw.errors import InputError
from captum_cw.files import output_path, strict_json, write_atomically
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers
from captum_cw.metrics import ATTENTION, CW_INTER, CW_INTRA, deprecated_variant, get_metric
from captum_cw.models import readable_tokens
from captum_cw.plotting import display_token

__all__ = ["METRIC_LABELS", "VIEW_FILES", "AttributionView", "attribution_scores", "attribution_view", "html_view",
           "index_ranges", "readable_tokens", "render_html", "text_records", "view_path", "write_html"]

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
        aggregation (str): how ``aggregated`` combines the layers: ``"last"``, ``"mean"`` or ``"rollout"``.
        threshold (float): attention above which a key is marked as a sink.
        per_head (dict[str, Tensor]): metric -> ``(n_layers, n_heads, n_positions, n_keys)``.
        per_layer (dict[str, Tensor]): metric -> ``(n_layers, n_positions, n_keys)``, heads summed (inter-head CW)
                    or averaged (the others).
        aggregated (dict[str, Tensor]): metric -> ``(n_positions, n_keys)``, layers combined by ``aggregation``.
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

    def to_dict(self) -> dict[str, Any]:
        r"""The JSON document of ``captum-cw attribute --json`` (schema in README, "Views")."""
        return {
            "model": self.model, "text": self.text, "target": self.target,
            "tokens": self.tokens, "token_ids": self.token_ids, "positions": self.positions,
            "predicted": self.predicted, "target_tokens": self.target_tokens, "target_probs": self.target_probs,
            "layers": self.layers, "heads": self.heads, "aggregation": self.aggregation,
            "threshold": self.threshold, "sinks": self.sinks(), "sinks_per_layer": self.sinks_per_layer(),
            "scores": {metric: {"aggregated": self.aggregated[metric].tolist(),
                                "per_layer": self.per_layer[metric].tolist(),
                                "per_head": self.per_head[metric].tolist()} for metric in self.metrics},
        }

    def write_json(self, path: str | Path) -> Path:
        r"""Writes :meth:`to_dict` as strict JSON (an undefined number is ``null``) to ``path``, a ``.json`` file
        or a folder (see :func:`view_path`); returns the file written."""
        return _write(path, "json", strict_json(self.to_dict(), ensure_ascii=False))

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
        return _write(path, "csv", text.getvalue())


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


def _write(path: str | Path, kind: str, text: str) -> Path:
    r"""Writes ``text`` to the file :func:`view_path` names, atomically, creating its folder; returns the file."""
    path = view_path(path, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, text)


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
        aggregation (str, optional): ``"last"``, ``"mean"`` or ``"rollout"`` over the layers. Default: ``"mean"``
        position (int, optional): without a target, the position to explain (negative counts from the end).
                    Default: the last token.
        threshold (float, optional): attention above which a key is marked as a sink, in (0, 1). Default: 0.3
        model_name (str, optional): a name for titles.
        variants (Sequence[str], optional): deprecated: the former name of ``metrics`` (``"inter"``, ``"intra"``),
                    with a DeprecationWarning.
    Returns:
        :class:`AttributionView`.
    """
    if aggregation not in LAYER_AGGREGATIONS:
        raise InputError(f"aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, got {aggregation!r}.")
    given = deprecated_variant(metrics, variants, "attribution_view", ("metrics", "variants"))
    if isinstance(given, str):  # one metric
        given = (given,)
    shown = _DEFAULT_METRICS if given is None else tuple(get_metric(metric).name for metric in given)
    if not shown:
        raise InputError("metrics is empty; name at least one metric, or leave it out for the default.")
    if not 0 < threshold < 1:
        raise InputError(f"threshold is a share of the attention mass, in (0, 1), got {threshold}.")
    if target is not None and position is not None:
        raise InputError("give a position or a target, not both: with a target, the positions that predict its "
                         "tokens are explained.")
    prompt = tokenizer(text, return_tensors="pt")["input_ids"][0]
    if len(prompt) == 0:
        raise InputError("the text has no tokens; give a non-empty text.")
    target_ids = None
    if target is not None:
        target_ids = tokenizer(target, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        if len(target_ids) == 0:
            raise InputError("the target has no tokens; give a non-empty target.")
        ids = torch.cat([prompt, target_ids])
        rows = list(range(len(prompt) - 1, len(ids) - 1))  # the positions that predict each target token
    else:
        ids, n = prompt, len(prompt)
        chosen = -1 if position is None else position
        if isinstance(chosen, bool) or not isinstance(chosen, int):
            raise InputError(f"position must be an int, got {type(chosen).__name__}.")
        if not -n <= chosen < n:
            raise InputError(f"position {chosen} is outside the text's {n} tokens (0..{n - 1}; negative positions "
                             "count from the end).")
        rows = [chosen % n]
    probe = attributor_for(ATTENTION.name, model, layers, heads)  # resolves and checks the indices
    layer_list, head_list = sorted(probe.layers), sorted(probe.heads)
    causal = bool(getattr(probe.attention_layers[0].attention, "is_causal", True))
    computed = list(dict.fromkeys([*shown, ATTENTION.name]))
    wanted = None if aggregation == "rollout" else rows  # rollout follows every row through the layers
    scores, output = attribution_scores(model, ids[None], computed, wanted, layer_list, head_list)
    n_keys = max(rows) + 1 if causal else len(ids)  # keys no explained position can read are left out
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
    predicted, target_probs = [], None
    if getattr(output, "logits", None) is not None:
        logits = output.logits[0, rows].float().cpu()  # [row, vocab]
        predicted = readable_tokens(tokenizer, logits.argmax(-1).tolist())
        if target_ids is not None:
            target_probs = logits.softmax(-1).gather(-1, target_ids[:, None]).flatten().tolist()
    return AttributionView(
        model=model_name, text=text, target=target, token_ids=ids[:n_keys].tolist(),
        tokens=readable_tokens(tokenizer, ids[:n_keys].tolist()), n_tokens=len(ids), positions=rows,
        predicted=predicted,
        target_tokens=None if target_ids is None else readable_tokens(tokenizer, target_ids.tolist()),
        target_probs=target_probs, layers=layer_list, heads=head_list, n_layers=len(probe.attention_layers),
        n_heads=probe.n_heads, aggregation=aggregation,
        threshold=threshold, per_head=per_head, per_layer=per_layer, aggregated=aggregated,
    )


# ---------------------------------------------------------------------------------------------- visualize_text


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


def _record_word(token: str) -> str:
    return html.escape(display_token(token), quote=False)  # visualize_text writes the words into HTML as they are


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
        view = attributions
        scores = torch.stack([view.aggregated[metric][r] for metric in view.metrics
                              for r in range(len(view.positions))])
        labels = [view.target_tokens[r] if view.target_tokens else (view.predicted[r] if view.predicted else "")
                  for _ in view.metrics for r in range(len(view.positions))]
        probs = [view.target_probs[r] if view.target_probs else 0.0 for _ in view.metrics
                 for r in range(len(view.positions))]
        classes = [f"{METRIC_LABELS.get(metric, metric)} @ {position}" for metric in view.metrics
                   for position in view.positions]
        return text_records(scores, view.tokens, pred_class=labels, pred_prob=probs, true_class=view.target or "",
                            attr_class=classes, normalize=normalize)
    if isinstance(attributions, LLMAttributionResult):
        result = attributions
        words = [tokenizer.convert_tokens_to_string([t]) if tokenizer else t for t in result.input_tokens]
        if result.token_attr is None:
            return text_records(result.seq_attr, words, pred_class="".join(result.output_tokens),
                                attr_class="sum over the target", normalize=normalize)
        outputs = [tokenizer.convert_tokens_to_string([t]) if tokenizer else t for t in result.output_tokens]
        output_probs = result.output_probs.tolist() if result.output_probs is not None else 0.0
        return text_records(result.token_attr, words, pred_class=outputs, pred_prob=output_probs,
                            attr_class=[f"target token {k}" for k in range(len(outputs))], normalize=normalize)
    scores = torch.as_tensor(attributions).detach().float().cpu()
    if tokens is None:
        raise InputError("tokens are needed for a tensor of scores: pass the words, one list for all rows or one "
                         "per row.")
    _refuse_summed_scores(scores, tokens)
    if scores.dim() == 1:
        scores = scores[None]
    if scores.dim() != 2:
        raise InputError(f"attributions must be (n,) or (rows, n), got shape {tuple(scores.shape)}.")
    shared = all(isinstance(token, str) for token in tokens)
    token_rows = [list(tokens)] * len(scores) if shared else _per_row(tokens, len(scores), "tokens")
    records = []
    columns = zip(token_rows, scores, *(_per_row(value, len(scores), name) for value, name in (
        (pred_class, "pred_class"), (pred_prob, "pred_prob"), (true_class, "true_class"), (attr_class, "attr_class"))))
    for words, row, pred, prob, true, attr in columns:
        if tokenizer is not None:
            words = [tokenizer.convert_tokens_to_string([t]) for t in words]
        if len(words) != len(row):
            raise InputError(f"{len(words)} tokens for {len(row)} scores; give one token per score.")
        peak = float(row.abs().max()) if len(row) else 0.0
        shown = row / peak if normalize and peak > 0 else row
        records.append(visualization.VisualizationDataRecord(shown, float(prob), pred, true, attr, float(row.sum()),
                                               [_record_word(w) for w in words], None))
    return records


# ---------------------------------------------------------------------------------------------------- HTML view


def _round(value: Any) -> Any:
    if isinstance(value, list):
        return [_round(v) for v in value]
    return float(f"{value:.6g}")


def _colour(value: float, limit: float) -> str:
    if limit <= 0:
        return "#ffffff"
    t = max(-1.0, min(1.0, value / limit))
    end = (178, 24, 43) if t >= 0 else (33, 102, 172)  # RdBu's ends, as the PNG heatmap
    return "rgb({},{},{})".format(*(round(255 + (e - 255) * abs(t)) for e in end))


def _chip(token: str, title: str, value: float, limit: float, sink: bool) -> str:
    cls = "tok sink" if sink else "tok"
    ink = ";color:#fff" if limit > 0 and abs(value) > 0.55 * limit else ""  # dark cells get white text
    return (f'<span class="{cls}" style="background:{_colour(value, limit)}{ink}" title="{html.escape(title)}">'
            f"{html.escape(display_token(token)) or '&nbsp;'}</span>")


def _limit(values: Tensor, sinks: set[int]) -> float:
    r"""The colour scale's end: the largest |score| of the keys that are not sinks (a sink's large score would
    leave every other key white; sinks saturate instead), or of all keys when that is 0."""
    others = [key for key in range(len(values)) if key not in sinks]
    limit = float(values[others].abs().max()) if others else 0.0
    return limit if limit > 0 else float(values.abs().max())


def _token_strips(view: AttributionView) -> str:
    r"""Static token strips (one per metric) of each explained position and, for several, of their sum."""
    choices = [(str(r), [r]) for r in range(len(view.positions))]
    if len(view.positions) > 1:
        choices.insert(0, ("sum", list(range(len(view.positions)))))
    sinks = set(view.sinks())
    blocks = []
    for choice, rows in choices:
        lines = []
        for metric in view.metrics:
            values = view.aggregated[metric][rows].sum(0)  # [key]
            limit = _limit(values, sinks)
            chips = "".join(
                _chip(token, f"{token!r} · position {key} · {metric} = {float(value):.6g}"
                      + (" · sink" if key in sinks else ""), float(value), limit, key in sinks)
                for key, (token, value) in enumerate(zip(view.tokens, values)))
            lines.append(f'<div class="strip"><span class="metric">{METRIC_LABELS.get(metric, metric)}</span>'
                         f'<span class="chips">{chips}</span></div>')
        hidden = "" if choice == choices[0][0] else " hidden"
        blocks.append(f'<div class="strips" data-row="{choice}"{hidden}>{"".join(lines)}</div>')
    return "".join(blocks)


def _script_json(data: Any) -> str:
    text = strict_json(data, ensure_ascii=False, separators=(",", ":"))  # JSON.parse refuses NaN
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _explained(view: AttributionView) -> str:
    parts = []
    for r, position in enumerate(view.positions):
        token = repr(view.tokens[position]) if position < len(view.tokens) else ""
        if view.target_tokens is not None:
            prob = f" (p = {view.target_probs[r]:.3g})" if view.target_probs else ""
            parts.append(f"position {position} {token} → target {view.target_tokens[r]!r}{prob}")
        else:
            predicted = f" → predicts {view.predicted[r]!r}" if view.predicted else ""
            parts.append(f"position {position} {token}{predicted}")
    return "; ".join(parts)


def index_ranges(indices: Sequence[int]) -> str:
    r"""Sorted indices as runs: ``[0, 1, 2, 5]`` -> ``"0–2, 5"``."""
    spans, start = [], None
    for k, index in enumerate(indices):
        start = index if start is None else start
        if k + 1 == len(indices) or indices[k + 1] != index + 1:
            spans.append(str(start) if start == index else f"{start}–{index}")
            start = None
    return ", ".join(spans)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:20px 28px;color:#1b1b1b}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:22px 0 6px}
.meta{color:#333;margin:2px 0}.meta b{color:#000}.note{color:#555;font-size:12.5px;margin:4px 0 8px}
.controls{margin:10px 0;display:flex;gap:18px;flex-wrap:wrap;align-items:center}
select{font-size:13px}
.strip{display:flex;align-items:flex-start;margin:4px 0}
.metric{flex:0 0 170px;font-weight:600;font-size:13px;padding-top:3px}
.chips{line-height:2.1;flex:1 1 auto;min-width:0}
.tok{display:inline-block;line-height:1.3;white-space:pre;padding:2px 1px;margin:0 1px;border-radius:3px;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;border:1px solid #ddd}
.tok.sink{border:2px solid #e08a00}
#layers,#heads{display:flex;flex-wrap:wrap;column-gap:40px}
.panel{max-width:100%;min-width:0}
.hm-wrap{overflow-x:auto;margin:6px 0 14px;padding-bottom:4px}
.hm-title{font-weight:600;font-size:13px;margin:10px 0 2px}
.hm{display:grid;gap:0;width:max-content}
.hm .rl{font-size:11px;text-align:right;padding-right:6px;white-space:nowrap;position:sticky;left:0;background:#fff;
cursor:pointer;line-height:1}
.hm .rl.sel{font-weight:700;color:#b2182b}
.hm .col{font:11px/1 ui-monospace,Menlo,Consolas,monospace;writing-mode:vertical-rl;transform:rotate(180deg);
white-space:pre;overflow:visible;text-align:left;padding:2px 0;height:84px}
.hm .col.sink{background:#ffe2b0;font-weight:700}
.hm .c{border-right:1px solid rgba(255,255,255,.35);border-bottom:1px solid rgba(255,255,255,.35)}
.hm .c.s{box-shadow:inset 0 0 0 2px #111}
.legend{display:flex;align-items:center;gap:6px;font-size:11.5px;color:#333;margin:2px 0}
.bar{width:160px;height:10px;background:linear-gradient(90deg,#2166ac,#fff,#b2182b);border:1px solid #bbb}
.key{display:inline-block;width:12px;height:12px;vertical-align:middle;margin:0 3px}
"""

_JS = r"""
const D = JSON.parse(document.getElementById("cw-data").textContent);
const K = D.tokens.length;
const shown = t => t.replace(/\r/g, "").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
const short = t => t.length > 11 ? t.slice(0, 10) + "\u2026" : t;  // column labels: 11 characters at most
const sinkKeys = new Set(D.sinks);
function colour(v, lim) {
  if (!(lim > 0)) return "#fff";
  const t = Math.max(-1, Math.min(1, v / lim)), end = t >= 0 ? [178, 24, 43] : [33, 102, 172];
  return "rgb(" + end.map(e => Math.round(255 + (e - 255) * Math.abs(t))).join(",") + ")";
}
function pick(rowsByKey, sel) {  // rowsByKey: [row][key] -> [key], summed over rows for "sum"
  if (sel !== "sum") return rowsByKey[+sel];
  return rowsByKey[0].map((_, j) => rowsByKey.reduce((s, row) => s + row[j], 0));
}
function meanRows(rowsByKey, sel) {
  if (sel !== "sum") return rowsByKey[+sel];
  return pick(rowsByKey, "sum").map(v => v / rowsByKey.length);
}
function cellWidth() {  // fit the window (labels thinned out below 12 px), or 12 px per token and scroll
  const avail = Math.max(300, Math.min(window.innerWidth, 1600) - 140);
  const least = document.getElementById("width").value === "fit" ? 3 : 12;
  return Math.max(least, Math.min(40, Math.floor(avail / K)));
}
function grid(title, rowLabels, matrix, sinkMask, scale, onRow, selected) {
  const w = cellWidth(), every = Math.ceil(13 / w), wrap = document.createElement("div");
  wrap.className = "panel";
  const clip = scale !== "all";  // leave the sink keys out of the scale: they saturate instead
  const peak = m => {
    const kept = Math.max(0, ...m.map((v, j) => clip && sinkKeys.has(j) ? 0 : Math.abs(v)));
    return kept > 0 ? kept : Math.max(0, ...m.map(Math.abs));
  };
  const gridLimit = Math.max(0, ...matrix.map(peak));
  const perRow = scale === "row";
  const head = document.createElement("div");
  head.className = "hm-title"; head.textContent = title; wrap.appendChild(head);
  const legend = document.createElement("div"); legend.className = "legend";
  legend.innerHTML = perRow ? '<span class="bar"></span> each row scaled to its own largest |score|'
    + (clip ? " (sinks left out)" : "")
    : '<span>' + (-gridLimit).toPrecision(3) + '</span><span class="bar"></span><span>+' + gridLimit.toPrecision(3)
      + '</span>' + (clip && sinkKeys.size ? " (sinks left out of the scale)" : "");
  wrap.appendChild(legend);
  const box = document.createElement("div"); box.className = "hm-wrap";
  const g = document.createElement("div"); g.className = "hm";
  g.style.gridTemplateColumns = "64px repeat(" + K + ", " + w + "px)";
  g.appendChild(document.createElement("div"));
  D.tokens.forEach((t, j) => {
    const c = document.createElement("div");
    c.className = sinkKeys.has(j) ? "col sink" : "col";
    c.textContent = sinkKeys.has(j) ? "\u25bc" + short(shown(t)) : ((K - 1 - j) % every === 0 ? short(shown(t)) : "");
    c.title = j + ": " + JSON.stringify(t) + (sinkKeys.has(j) ? " (sink)" : "");
    g.appendChild(c);
  });
  matrix.forEach((values, r) => {
    const label = document.createElement("div");
    label.className = "rl" + (selected === r ? " sel" : ""); label.textContent = rowLabels[r];
    label.style.height = Math.max(12, Math.min(w, 18)) + "px";
    if (onRow) { label.onclick = () => onRow(r); label.title = "show this layer's heads"; }
    g.appendChild(label);
    const lim = perRow ? peak(values) : gridLimit;
    values.forEach((v, j) => {
      const c = document.createElement("div");
      c.className = sinkMask && sinkMask[r][j] > D.threshold ? "c s" : "c";
      c.style.background = colour(v, lim);
      c.title = rowLabels[r] + " \u00b7 " + JSON.stringify(D.tokens[j]) + " (" + j + ") \u00b7 " + title
        + " = " + v.toPrecision(6) + (sinkMask ? " \u00b7 attention " + sinkMask[r][j].toPrecision(3) : "");
      g.appendChild(c);
    });
  });
  box.appendChild(g); wrap.appendChild(box);
  return wrap;
}
const state = {row: document.getElementById("row").value, layer: D.layers.length - 1};
function render() {
  const sel = state.row, scale = document.getElementById("scale").value;
  document.querySelectorAll(".strips").forEach(s => { s.hidden = s.dataset.row !== sel; });
  const layers = document.getElementById("layers"); layers.innerHTML = "";
  const attention = D.per_layer.attention.map(l => meanRows(l, sel));
  D.metrics.forEach(m => {
    const matrix = D.per_layer[m].map(l => pick(l, sel));
    layers.appendChild(grid(D.labels[m], D.layers.map(l => "layer " + l), matrix, attention, scale,
      r => { state.layer = r; render(); }, state.layer));
  });
  const heads = document.getElementById("heads"); heads.innerHTML = "";
  document.getElementById("head-layer").textContent = D.layers[state.layer];
  const headAttention = D.per_head.attention[state.layer].map(h => meanRows(h, sel));
  D.metrics.forEach(m => {
    const matrix = D.per_head[m][state.layer].map(h => pick(h, sel));
    heads.appendChild(grid(D.labels[m] + ", layer " + D.layers[state.layer], D.heads.map(h => "head " + h),
      matrix, headAttention, scale, null, -1));
  });
}
document.getElementById("row").onchange = e => { state.row = e.target.value; render(); };
document.getElementById("scale").onchange = render;
document.getElementById("width").onchange = render;
render();
"""


def render_html(view: AttributionView) -> str:
    r"""One self-contained HTML page (inline CSS and JavaScript, no network) of an :class:`AttributionView`:
    the tokens coloured by each metric's aggregated score, per-layer heatmaps of every metric for the explained
    position(s), per-head heatmaps of one layer (click a layer), sinks marked, exact values on hover."""
    data = {
        "tokens": view.tokens, "positions": view.positions, "layers": view.layers, "heads": view.heads,
        "metrics": view.metrics, "labels": {m: METRIC_LABELS.get(m, m) for m in view.metrics},
        "threshold": view.threshold, "sinks": view.sinks(),
        "per_layer": {m: _round(view.per_layer[m].tolist()) for m in view.metrics},
        "per_head": {m: _round(view.per_head[m].tolist()) for m in view.metrics},
    }
    rows = [(str(r), f"position {p} {view.tokens[p]!r}" + (f" → {view.target_tokens[r]!r}" if view.target_tokens
                                                            else "")) for r, p in enumerate(view.positions)]
    if len(rows) > 1:
        rows.insert(0, ("sum", f"sum over the {len(rows)} positions"))
    options = "".join(f'<option value="{value}">{html.escape(label)}</option>' for value, label in rows)
    aggregation = {"mean": "mean over layers", "last": f"last layer ({view.layers[-1]})",
                   "rollout": "rollout over layers"}[view.aggregation]
    sink_tokens = ", ".join(f"{view.tokens[k]!r} ({k})" for k in view.sinks()) or "none"
    title = f"captum_cw: {view.model}" if view.model else "captum_cw"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="meta"><b>Text:</b> {html.escape(view.text)}{'' if view.target is None else
    ' <b>Target:</b> ' + html.escape(view.target)}</p>
<p class="meta"><b>Explained:</b> {html.escape(_explained(view))}</p>
<p class="meta"><b>Layers:</b> {index_ranges(view.layers)} &nbsp; <b>Heads:</b> {index_ranges(view.heads)}
&nbsp; <b>Sinks</b> (attention &gt; {view.threshold:g}, mean over heads, layers and explained positions):
{html.escape(sink_tokens)}</p>
<div class="controls">
<label>Position: <select id="row">{options}</select></label>
<label>Colour scale: <select id="scale"><option value="grid">one per heatmap, sinks left out</option>
<option value="all">one per heatmap, sinks included</option>
<option value="row">one per row, sinks left out</option></select></label>
<label>Columns: <select id="width"><option value="fit">fit the window</option>
<option value="label">a label for every token (scroll)</option></select></label>
</div>
<p class="note">Red: positive, blue: negative, white: 0. Hover a token or cell for its exact value. The colour
scales leave the sink keys out (they saturate), so the other tokens stay visible.
<span class="tok sink">&nbsp;▼&nbsp;</span> sink key; <span class="key" style="box-shadow:inset 0 0 0 2px #111">
</span> cell where that layer's (head's) attention exceeds {view.threshold:g}: a sink takes much attention
but contributes little.</p>
<h2>Scores per token ({html.escape(aggregation)})</h2>
{_token_strips(view)}
<h2>Per layer</h2>
<p class="note">Rows: layers, columns: tokens (in a long text, every k-th token is labelled; hover any column).
Click a layer to show its heads below.</p>
<div id="layers"></div>
<h2>Per head: layer <span id="head-layer"></span></h2>
<div id="heads"></div>
<script type="application/json" id="cw-data">{_script_json(data)}</script>
<script>{_JS}</script>
</body></html>
"""


def html_view(model: nn.Module, tokenizer: PreTrainedTokenizerBase, text: str, target: str | None = None,
              **options: Any) -> str:
    r"""The HTML page of :func:`render_html` for a text; ``options`` are those of :func:`attribution_view`."""
    return render_html(attribution_view(model, tokenizer, text, target, **options))


def write_html(view: AttributionView | str, path: str | Path) -> Path:
    r"""Writes an :class:`AttributionView` (or a page from :func:`html_view`) to ``path``, a ``.html`` file or a
    folder (see :func:`view_path`); returns the file written."""
    return _write(path, "html", view if isinstance(view, str) else render_html(view))
