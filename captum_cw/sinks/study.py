"""The sink study over many texts: aggregates, ``sinks.json`` and plots (behind ``captum-cw sinks``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from captum_cw.errors import InputError
from captum_cw.files import write_json
from captum_cw.models import readable_tokens
from captum_cw.sinks.analysis import analyze_sinks, sink_norm_effect
from captum_cw.sinks.plots import write_plots
from captum_cw.statistics import bootstrap_interval

__all__ = ["sink_study"]


def sink_study(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    out: str | Path,
    threshold: float = 0.3,
    max_tokens: int = 256,
    factor: float = 0.0,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    r"""
    Runs :func:`~captum_cw.sinks.analyze_sinks` and :func:`~captum_cw.sinks.sink_norm_effect` on every
    text, writes ``sinks.json`` (strict JSON: an undefined value is ``null``) and five PNG plots under ``out``,
    and returns the summary. A text of fewer than 2 tokens (no next token to predict) is left out and listed
    under ``"skipped"``.

    ``sinks.json``'s ``"sink_norm_intervention"`` gives the change of perplexity (mean over texts, 95%
    bootstrap interval) for the sink's value norm removed (scaled by ``factor``), for the same removal on the
    matched control token (:func:`~captum_cw.sinks.matched_control`: a non-sink token of the closest mean
    value norm) and for the sink removed from the attention with each row renormalised, and the direct
    changes of the heads' output norms and cosines to the semantic direction for the sink and the control.
    """
    if max_tokens < 2:
        raise InputError(f"max_tokens must be at least 2 (a text needs two tokens to be scored), got {max_tokens}.")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; give a folder for the study's results.")
    out.mkdir(parents=True, exist_ok=True)
    analyses, effects, token_lists, skipped = [], [], [], []
    for index, text in enumerate(tqdm(texts, desc="sinks", disable=not progress)):
        ids = torch.tensor(tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"], dtype=torch.long)
        if len(ids) < 2:
            skipped.append({"text": index, "reason": f"{len(ids)} token(s) after tokenisation; a text needs at "
                                                    "least 2 to be scored"})
            continue
        analyses.append(analyze_sinks(model, ids, threshold))
        effects.append(sink_norm_effect(model, ids, factor=factor, threshold=threshold))
        token_lists.append(readable_tokens(tokenizer, ids.tolist()))
    if not analyses:
        raise InputError(f"none of the {len(texts)} texts has the 2 tokens a sink study needs; give longer texts.")
    summary = {**_summarize(analyses, effects, token_lists, threshold, factor), "skipped": skipped}
    write_json(out / "sinks.json", summary, indent=2)  # NaN (e.g. no interior rows) as null
    write_plots(analyses, effects, token_lists, out, threshold)
    return summary


def _summarize(analyses, effects, token_lists, threshold, factor) -> dict[str, Any]:
    r"""``sinks.json``'s content: where the sinks are, the factors, the anti-alignment, the convexity check and
    the interventions, over every studied text."""
    factors = {name: torch.stack([a.factors[name] for a in analyses]).nanmean(0) for name in analyses[0].factors}
    return {
        "n_texts": len(analyses),
        "threshold": threshold,
        "detection": _detection(analyses, token_lists),
        "factors_per_layer_sink_vs_other": {name: value.tolist() for name, value in factors.items()},
        "factors_mean_sink_vs_other": {name: value.nanmean(0).tolist() for name, value in factors.items()},
        "anti_alignment": {
            "cos_sink_rest_per_layer": torch.stack([a.cos_sink_rest for a in analyses]).mean((0, 2)).tolist(),
            "cos_sink_output_per_layer": torch.stack([a.cos_sink_output for a in analyses]).mean((0, 2)).tolist(),
        },
        "convexity": _convexity(analyses),
        "sink_norm_intervention": _intervention(effects, token_lists, factor),
    }


def _detection(analyses, token_lists) -> dict[str, Any]:
    r"""How often the first token is a sink, how many sinks are later tokens, and the commonest sink tokens."""
    n_layers = analyses[0].received.shape[0]
    sink_tokens: Counter[str] = Counter()
    layers_with_first, later_sinks, all_sinks = 0, 0, 0
    for analysis, tokens in zip(analyses, token_lists):
        for sinks in analysis.sinks:
            layers_with_first += 0 in sinks
            all_sinks += len(sinks)
            later_sinks += sum(position > 0 for position in sinks)
            sink_tokens.update(repr(tokens[position]) for position in sinks)
    return {
        "fraction_of_layers_where_the_first_token_is_a_sink": layers_with_first / (n_layers * len(analyses)),
        "fraction_of_sinks_that_are_not_the_first_token": later_sinks / max(all_sinks, 1),
        "most_common_sink_tokens": sink_tokens.most_common(10),
    }


def _convexity(analyses) -> dict[str, Any]:
    r"""The optimal sink rate ``t*`` against the actual one, over the rows whose sink rate is in (0, 1)."""
    rates = torch.cat([a.sink_rate.flatten() for a in analyses])
    optimal = torch.cat([a.optimal_rate.flatten() for a in analyses])
    interior = (rates > 0) & (rates < 1)
    return {
        "rows": int(interior.sum()),
        "fraction_t_star_below_1": float((optimal[interior] < 1).float().mean()),
        "mean_t_star": float(optimal[interior].mean()),
        "mean_actual_sink_rate": float(rates[interior].mean()),
        "fraction_actual_rate_above_t_star": float((rates[interior] > optimal[interior]).float().mean()),
    }


def _perplexity_change(changes: list[float]) -> dict[str, Any]:
    r"""Mean change of perplexity over the texts with a defined change, with its 95% bootstrap interval."""
    kept = [change for change in changes if change == change]  # texts without a control give NaN
    if not kept:
        return {"mean": None, "ci95": [None, None], "texts": 0}
    return {"mean": sum(kept) / len(kept), "ci95": list(bootstrap_interval(kept)), "texts": len(kept)}


def _intervention(effects, token_lists, factor) -> dict[str, Any]:
    r"""The sink's value norm scaled by ``factor``, the same on the matched control token, and the sink removed
    with renormalised rows: the perplexity changes and the direct changes of the heads' outputs."""
    low = torch.stack([e.low_norm for e in effects])  # [text, layer, head]

    def by_group(values: torch.Tensor) -> dict[str, float]:
        change = values[:, 1] - values[:, 0]  # [text, layer, head]
        return {"low_norm_heads": float(change[low].nanmean()), "other_heads": float(change[~low].nanmean())}

    def direct(name: str) -> dict[str, dict[str, float]]:
        return {"change_of_head_output_norm": by_group(torch.stack([getattr(e, name + "norm") for e in effects])),
                "change_of_cosine_to_semantic_direction": by_group(
                    torch.stack([getattr(e, name + "cosine") for e in effects]))}

    with_control = [e for e in effects if e.control >= 0]
    sink_norm = torch.tensor([e.value_norm[0] for e in with_control])
    control_norm = torch.tensor([e.value_norm[1] for e in with_control])
    return {
        "factor": factor,
        "delta_perplexity": _perplexity_change([e.delta_perplexity for e in effects]),  # the sink's norm removed
        **direct(""),
        "control": {
            "choice": "per text, the token that is a sink in no layer whose mean value norm ||vt|| (over layers "
                      "and heads) is closest to the sink's; its value scaled by the same factor",
            "delta_perplexity": _perplexity_change([e.control_delta_perplexity for e in effects]),
            **direct("control_"),
            "mean_value_norm_sink_vs_control": [float(sink_norm.mean()), float(control_norm.mean())]
            if with_control else [None, None],
            "mean_distance_to_sink": (sum(abs(e.control - e.sink) for e in with_control) / len(with_control)
                                      if with_control else None),
            "most_common_control_tokens": Counter(repr(tokens[e.control]) for e, tokens in zip(effects, token_lists)
                                                  if e.control >= 0).most_common(10),
        },
        "sink_removed_renormalized": {
            "what": "the sink key removed from every row at every layer and head, the other weights rescaled to "
                    "sum to 1 (softmax without the sink)",
            "delta_perplexity": _perplexity_change([e.renormalized_delta_perplexity for e in effects]),
        },
    }
