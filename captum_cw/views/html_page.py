"""The HTML view: one self-contained page of an :class:`~captum_cw.views.model.AttributionView`.

The page's markup, CSS and JavaScript are package data (``templates/page.html``, ``page.css``, ``page.js``);
:func:`render_html` fills the markup's ``$fields`` (:class:`string.Template`) with the escaped text, the static
token strips and the scores as JSON, which the script draws as heatmaps.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.files import strict_json
from captum_cw.plotting import display_token
from captum_cw.views.model import METRIC_LABELS, AttributionView, aggregation_label, attribution_view, write_view

__all__ = ["TEMPLATES", "html_view", "index_ranges", "render_html", "write_html"]

TEMPLATES = ("page.html", "page.css", "page.js")
"""The page's files in ``captum_cw/views/templates`` (package data): its markup with ``$fields``, style, script."""


@cache
def _template(name: str) -> str:
    r"""The text of one of :data:`TEMPLATES`, read from the installed package."""
    return (resources.files("captum_cw.views") / "templates" / name).read_text(encoding="utf-8")


def index_ranges(indices: Sequence[int]) -> str:
    r"""Sorted indices as runs: ``[0, 1, 2, 5]`` -> ``"0–2, 5"``."""
    spans, start = [], None
    for k, index in enumerate(indices):
        start = index if start is None else start
        if k + 1 == len(indices) or indices[k + 1] != index + 1:
            spans.append(str(start) if start == index else f"{start}–{index}")
            start = None
    return ", ".join(spans)


# ------------------------------------------------------------------------------------- the static token strips


def _colour(value: float, limit: float) -> str:
    if limit <= 0:
        return "#ffffff"
    t = max(-1.0, min(1.0, value / limit))
    end = (178, 24, 43) if t >= 0 else (33, 102, 172)  # RdBu's ends, as the PNG heatmap
    return "rgb({},{},{})".format(*(round(255 + (e - 255) * abs(t)) for e in end))


def _chip(token: str, title: str, value: float, limit: float, *, sink: bool, excluded: bool = False) -> str:
    cls = "tok" + (" sink" if sink else "") + (" excluded" if excluded else "")
    text = f"{html.escape(display_token(token)) or '&nbsp;'}</span>"
    if excluded:  # left out of the ranking: marked, not coloured
        return f'<span class="{cls}" title="{html.escape(title)}">{text}'
    ink = ";color:#fff" if limit > 0 and abs(value) > 0.55 * limit else ""  # dark cells get white text
    return f'<span class="{cls}" style="background:{_colour(value, limit)}{ink}" title="{html.escape(title)}">{text}'


def _limit(values: Tensor, sinks: set[int], excluded: set[int]) -> float:
    r"""The colour scale's end: the largest |score| of the keys that are neither sinks (a sink's large score would
    leave every other key white; sinks saturate instead) nor excluded, or of the keys not excluded when that is
    0."""
    others = [key for key in range(len(values)) if key not in sinks and key not in excluded]
    limit = float(values[others].abs().max()) if others else 0.0
    shown = [key for key in range(len(values)) if key not in excluded]
    return limit if limit > 0 or not shown else float(values[shown].abs().max())


def _token_strips(view: AttributionView) -> str:
    r"""Static token strips (one per metric) of each explained position and, for several, of their sum."""
    choices = [(str(r), [r]) for r in range(len(view.positions))]
    if len(view.positions) > 1:
        choices.insert(0, ("sum", list(range(len(view.positions)))))
    sinks = set(view.sinks())
    blocks = []
    for choice, rows in choices:
        lines = []
        excluded = set(view.excluded_keys(rows))
        for metric in view.metrics:
            values = view.aggregated[metric][rows].sum(0)  # [key]
            limit = _limit(values, sinks, excluded)
            chips = "".join(
                _chip(token, f"{token!r} · position {key} · {metric} = {float(value):.6g}"
                      + (" · sink" if key in sinks else "") + (f" · excluded ({view.exclude})" if key in excluded
                                                               else ""),
                      float(value), limit, sink=key in sinks, excluded=key in excluded)
                for key, (token, value) in enumerate(zip(view.tokens, values)))
            lines.append(f'<div class="strip"><span class="metric">{METRIC_LABELS.get(metric, metric)}</span>'
                         f'<span class="chips">{chips}</span></div>')
        hidden = "" if choice == choices[0][0] else " hidden"
        blocks.append(f'<div class="strips" data-row="{choice}"{hidden}>{"".join(lines)}</div>')
    return "".join(blocks)


# ------------------------------------------------------------------------------------ what the script draws


def _round(value: Any) -> Any:
    if isinstance(value, list):
        return [_round(v) for v in value]
    return float(f"{value:.6g}")


def _heatmap_data(view: AttributionView) -> dict[str, Any]:
    r"""The scores the page's script draws as per-layer and per-head heatmaps (6 significant digits)."""
    return {
        "tokens": view.tokens, "positions": view.positions, "layers": view.layers, "heads": view.heads,
        "metrics": view.metrics, "labels": {m: METRIC_LABELS.get(m, m) for m in view.metrics},
        "threshold": view.threshold, "sinks": view.sinks(), "excluded": view.excluded,
        "per_layer": {m: _round(view.per_layer[m].tolist()) for m in view.metrics},
        "per_head": {m: _round(view.per_head[m].tolist()) for m in view.metrics},
    }


def _script_json(data: Any) -> str:
    r"""``data`` as JSON that cannot end its ``<script>`` element (``<``, ``>`` and ``&`` escaped)."""
    text = strict_json(data, ensure_ascii=False, separators=(",", ":"))  # JSON.parse refuses NaN
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# ------------------------------------------------------------------------------------------ the page's text


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


def _position_options(view: AttributionView) -> str:
    r"""The ``<option>`` elements of the position menu: each explained position and, for several, their sum."""
    rows = [(str(r), f"position {p} {view.tokens[p]!r}" + (f" → {view.target_tokens[r]!r}" if view.target_tokens
                                                            else "")) for r, p in enumerate(view.positions)]
    if len(rows) > 1:
        rows.insert(0, ("sum", f"sum over the {len(rows)} positions"))
    return "".join(f'<option value="{value}">{html.escape(label)}</option>' for value, label in rows)


def render_html(view: AttributionView) -> str:
    r"""One self-contained HTML page (inline CSS and JavaScript, no network) of an :class:`AttributionView`:
    the tokens coloured by each metric's aggregated score, per-layer heatmaps of every metric for the explained
    position(s), per-head heatmaps of one layer (click a layer), sinks marked, exact values on hover."""
    title = f"captum_cw: {view.model}" if view.model else "captum_cw"
    sinks = ", ".join(f"{view.tokens[k]!r} ({k})" for k in view.sinks()) or "none"
    excluded = ", ".join(f"{view.tokens[k]!r} ({k})" for k in view.excluded_keys()) or "none"
    return Template(_template("page.html")).substitute(
        title=html.escape(title),
        text=html.escape(view.text),
        target="" if view.target is None else " <b>Target:</b> " + html.escape(view.target),
        explained=html.escape(_explained(view)),
        layers=index_ranges(view.layers),
        heads=index_ranges(view.heads),
        threshold=f"{view.threshold:g}",
        sinks=html.escape(sinks),
        excluded="" if view.exclude is None else (f" &nbsp; <b>Excluded</b> ({html.escape(view.exclude)}, "
                                                  f"marked, not coloured): {html.escape(excluded)}"),
        position_options=_position_options(view),
        aggregation=html.escape(aggregation_label(view.aggregation, view.layers)),
        token_strips=_token_strips(view),
        data=_script_json(_heatmap_data(view)),
        css=_template("page.css"),
        js=_template("page.js"),
    )


def html_view(model: nn.Module, tokenizer: PreTrainedTokenizerBase, text: str, target: str | None = None,
              **options: Any) -> str:
    r"""The HTML page of :func:`render_html` for a text; ``options`` are those of :func:`attribution_view`."""
    return render_html(attribution_view(model, tokenizer, text, target, **options))


def write_html(view: AttributionView | str, path: str | Path) -> Path:
    r"""Writes an :class:`AttributionView` (or a page from :func:`html_view`) to ``path``, a ``.html`` file or a
    folder (see :func:`~captum_cw.views.model.view_path`); returns the file written."""
    return write_view(path, "html", view if isinstance(view, str) else render_html(view))
