"""Source-level context attribution: which sources of a context (sentences, passages, chat messages) made the
model give a response, from one forward and one backward pass.

Each source gets the sum of its tokens' scores for the response's log-probability: by default their target-aware
contributions (:mod:`captum_cw.target_contributions`), the first-order change of ``log p(response)`` if the
source's value vectors were masked out of the rows that predict the response, at every layer; with
``method="knockout"`` their knockout gradients (:mod:`captum_cw.knockout_gradients`), read near the knocked-out
end of the path (every source's key gate at 0.05), which predict what removing several sources at once does.
ContextCite asks the same question of a surrogate model fitted on 32-64 ablated forward passes.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError, require_model
from captum_cw.files import write_atomically
from captum_cw.knockout_gradients import knockout_gradients
from captum_cw.scan import prepare_inputs
from captum_cw.selection import select_indices
from captum_cw.target_contributions import TARGET_ROWS, target_objective, target_scores
from captum_cw.tasks.context import token_sources

__all__ = ["KNOCKOUT_INTERVAL", "SOURCE_METHODS", "SourceAttribution", "SourceContributions"]

SOURCE_METHODS = ("contributions", "knockout")
KNOCKOUT_INTERVAL = (0.0, 0.1)
r"""Where ``method="knockout"`` reads the path: one step at gate 0.05, where a row that puts most of its attention on
the context has lost about half of it (at 1/2 it keeps nearly all; docs/DESIGN.md, "Knockout gradients"), chosen on
docs/PEERS.md's examples and confirmed on held-out ones."""

Source = str | Mapping[str, str]  # a text, or a chat message {"role": ..., "content": ...}


@dataclass
class SourceAttribution:
    r"""
    What :meth:`SourceContributions.attribute` found.

    Attributes:
        sources (list[str]): the sources' texts, in order.
        query (str): the question asked after them.
        response (str): the response explained (given, or generated).
        response_tokens (list[str]): its tokens.
        scores (Tensor): ``(n_sources,)`` each source's part of the response's log-probability, or with a foil
                    of its log-odds against the foil (first-order, or its knockout gradient).
        token_scores (Tensor): ``(n_response_tokens, n_sources)`` the part that passes through the row predicting
                    each response token (the rows sum to ``scores``); NaN where the method has no such split
                    (``method="knockout"``, ``target_rows="all"``, a foil where either response has several tokens).
        log_probs (Tensor): ``(n_response_tokens,)`` the model's log-probability of each response token.
        prompt (str): the prompt as the model read it (chat template included).
        foil (str or None): the response it was contrasted with: ``scores`` then explain ``log p(response) -
                    log p(foil)``.
        foil_log_probs (Tensor or None): ``(n_foil_tokens,)`` the log-probability of each foil token.
    """

    sources: list[str]
    query: str
    response: str
    response_tokens: list[str]
    scores: Tensor
    token_scores: Tensor
    log_probs: Tensor
    prompt: str
    foil: str | None = None
    foil_log_probs: Tensor | None = None

    def explained(self) -> str:
        r"""What the scores explain, in words: the response's log-probability, or its log-odds against the foil."""
        log_p = float(self.log_probs.sum())
        if self.foil is None or self.foil_log_probs is None:
            return f"{self.response!r} (log p = {log_p:.3f})"
        log_odds = log_p - float(self.foil_log_probs.sum())
        return f"{self.response!r} rather than {self.foil!r} (log-odds = {log_odds:.3f})"

    def legend(self) -> str:
        r"""What the colours of :meth:`to_html` mean."""
        if self.foil is None:
            return ("Red: the source supports the response (removing it would lower its log-probability, to first "
                    "order); blue: it works against it.")
        return (f"Red: the source supports the response over {self.foil!r} (removing it would lower their "
                "log-odds, to first order); blue: it supports the foil.")

    def ranking(self) -> list[int]:
        r"""The sources' indices, most supporting first."""
        return sorted(range(len(self.sources)), key=lambda k: -float(self.scores[k]))

    def to_text(self, width: int = 70) -> str:
        r"""A table of the sources by score, most supporting first."""
        lines = [f"Response: {self.explained()}",
                 f"{'score':>9}  source"]
        for k in self.ranking():
            text = " ".join(self.sources[k].split())
            lines.append(f"{float(self.scores[k]):>9.4f}  [{k}] {text[:width]}{'...' if len(text) > width else ''}")
        return "\n".join(lines)

    def to_html(self) -> str:
        r"""A self-contained HTML page: the sources highlighted by score (red supports the response, blue works
        against it), the query and the response; exact values on hover."""
        limit = float(self.scores.abs().max()) or 1.0
        spans = []
        for k, (source, score) in enumerate(zip(self.sources, self.scores.tolist())):
            shade = round(255 * (1 - min(1.0, abs(score) / limit)))
            colour = f"rgb(255,{shade},{shade})" if score >= 0 else f"rgb({shade},{shade},255)"
            spans.append(f'<span class="source" style="background:{colour}" title="source {k}: {score:.6g}">'
                         f"{html.escape(source)}</span>")
        rows = "".join(f"<tr><td>{float(self.scores[k]):.4f}</td><td>{k}</td><td>{html.escape(self.sources[k])}"
                       "</td></tr>" for k in self.ranking())
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>captum_cw: sources</title><style>'
            "body{font:14px/1.5 system-ui,sans-serif;margin:20px 28px;max-width:60em}"
            ".source{padding:1px 2px;border-radius:3px;border:1px solid #ddd}"
            "td{padding:2px 8px;vertical-align:top}td:first-child{text-align:right;font-family:monospace}"
            "</style></head><body><h1>Which sources made the model say this?</h1>"
            f"<p>{' '.join(spans)}</p><p><b>Query:</b> {html.escape(self.query)}</p>"
            f"<p><b>Response:</b> {html.escape(self.explained())}</p>"
            f"<p>{html.escape(self.legend())}</p>"
            f"<table><tr><th>score</th><th>#</th><th>source</th></tr>{rows}</table></body></html>\n"
        )

    def write_html(self, path: str | Path) -> Path:
        path = Path(path)
        write_atomically(path, self.to_html())
        return path


class SourceContributions:
    r"""
    Which sources of a context made the model give a response: one score per source for the whole response
    and per response token, from one forward and one backward pass.

    Args:
        model (nn.Module): a causal language model of a supported architecture.
        tokenizer (PreTrainedTokenizerBase): its (fast) tokenizer.
        layers (int or Sequence[int], optional): layers whose attention outputs are read. Default: all.
        chat (bool, optional): put the sources and the query in the user's message through the tokenizer's chat
                    template. Default: None (when the tokenizer has a chat template)
        target_rows (str, optional): ``"explained"`` (the rows that predict the response) or ``"all"`` (every
                    row that reads a source token; no per-token split). Default: ``"explained"``
        method (str, optional): ``"contributions"`` (the first-order target-aware contributions at the model as
                    it is) or ``"knockout"`` (knockout gradients: the response's gradient with respect to the
                    sources' key gates in every layer, with every gate at 0.05, :data:`KNOCKOUT_INTERVAL`; it
                    predicts removing several sources at once better, docs/PEERS.md; no per-token split, all
                    layers, one more forward pass for the log-probabilities). Default: ``"contributions"``

    Examples::

        >>> explainer = SourceContributions(model, tokenizer)
        >>> found = explainer.attribute(["Anna lives in Paris.", "Tom lives in Rome."], "Where does Tom live?",
        ...                             "Tom lives in Rome")
        >>> found.ranking()[0]  # the source that supports the answer most
        1
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        layers: int | Sequence[int] | None = None,
        *,
        chat: bool | None = None,
        target_rows: str = "explained",
        method: str = "contributions",
    ) -> None:
        require_model(model, "SourceContributions")
        if target_rows not in TARGET_ROWS:
            raise InputError(f"target_rows must be one of {', '.join(TARGET_ROWS)}, got {target_rows!r}.")
        if method not in SOURCE_METHODS:
            raise InputError(f"method must be one of {', '.join(SOURCE_METHODS)}, got {method!r}.")
        if method == "knockout" and (layers is not None or target_rows != "explained"):
            raise InputError("method='knockout' gates the sources in every layer and every row: leave layers and "
                             "target_rows at their defaults.")
        self.model = model
        self.tokenizer = tokenizer
        self.attention_layers = find_attention_layers(model)
        self.layers = select_indices(layers, len(self.attention_layers), "layer")
        self.chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
        if self.chat and not getattr(tokenizer, "chat_template", None):
            raise InputError(f"chat=True, but {type(tokenizer).__name__} has no chat template; pass chat=False.")
        self.target_rows = target_rows
        self.method = method

    def _prompt(self, sources: list[str], query: str) -> tuple[str, list[tuple[int, int]]]:
        r"""The prompt text and each source's character span in it."""
        context = " ".join(sources)
        if self.chat:
            content = f"{context}\n\n{query}"
            text = str(self.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                          add_generation_prompt=True, tokenize=False))
            start = text.index(content)
        else:
            text, start = f"{context}\n\n{query}\n", 0
        spans = []
        for source in sources:
            spans.append((start, start + len(source)))
            start += len(source) + 1
        return text, spans

    def attribute(
        self,
        sources: Sequence[Source],
        query: str,
        response: str | None = None,
        max_new_tokens: int = 20,
        foil: str | None = None,
    ) -> SourceAttribution:
        r"""
        Args:
            sources (Sequence[str or dict]): the context, split into sources: texts (sentences, passages), or chat
                        messages ``{"role", "content"}`` whose contents are the sources.
            query (str): the question or instruction that follows them.
            response (str, optional): the response to explain. Default: None (the model's greedy response, up to
                        ``max_new_tokens`` tokens)
            max_new_tokens (int, optional): for a generated response. Default: 20
            foil (str, optional): a response to contrast it with (another answer): the scores then explain
                        ``log p(response) - log p(foil)``, why the response rather than the foil: one attribution
                        pass where both are one token, else the response's scores less the foil's (two passes).
                        Default: None
        Returns:
            :class:`SourceAttribution`.
        """
        texts = [source["content"] if isinstance(source, Mapping) else source for source in sources]
        if not texts or not all(isinstance(text, str) and text.strip() for text in texts):
            raise InputError("sources must be a non-empty list of non-empty texts (or chat messages with content).")
        text, spans = self._prompt(texts, query)
        encoded = self.tokenizer(text, return_offsets_mapping=True, add_special_tokens=not self.chat)
        prompt_ids = list(encoded["input_ids"])
        source_of = token_sources(text, [tuple(pair) for pair in encoded["offset_mapping"]], spans)
        if foil is not None and (not isinstance(foil, str) or not foil.strip()):
            raise InputError(f"foil must be a non-empty text (another response), got {foil!r}.")
        foil_ids = None if foil is None else self._response_ids(prompt_ids, foil, max_new_tokens)
        response_ids = self._response_ids(prompt_ids, response, max_new_tokens)
        if foil_ids == response_ids:
            raise InputError(f"the foil {foil!r} is the response itself; contrast it with another response.")
        membership = torch.zeros(len(prompt_ids), len(texts))  # [token, source]
        for position, source in enumerate(source_of):
            if source >= 0:
                membership[position, source] = 1.0
        one_pass = foil_ids is not None and len(foil_ids) == len(response_ids) == 1  # two one-token answers
        per_token, token_scores, log_probs, foil_log_probs = self._scores(
            prompt_ids, response_ids, membership, foil_ids[0] if one_pass and foil_ids else None)
        if foil_ids is not None and not one_pass:  # the response's scores less the foil's
            foil_scores, _, foil_log_probs, _ = self._scores(prompt_ids, foil_ids, membership)
            per_token = per_token - foil_scores
            token_scores = torch.full_like(token_scores, float("nan"))  # no shared token rows
        return SourceAttribution(
            sources=texts, query=query, response=str(self.tokenizer.decode(response_ids)),
            response_tokens=list(self.tokenizer.convert_ids_to_tokens(response_ids)), scores=per_token @ membership,
            token_scores=token_scores, log_probs=log_probs, prompt=text,
            foil=None if foil_ids is None else str(self.tokenizer.decode(foil_ids)), foil_log_probs=foil_log_probs)

    def _scores(self, prompt_ids: list[int], response_ids: list[int], membership: Tensor,
                foil: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        r"""Each prompt token's score for ``log p(response)`` ``(n_prompt,)``, the part through the row predicting
        each response token, split into sources ``(t, n_sources)`` (NaN where the method has none), and the response
        tokens' log-probabilities ``(t,)``; with ``foil``, a token to contrast a one-token response with, the scores
        explain their log-odds and the fourth value is the foil's log-probability ``(1,)``."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids + response_ids], device=device)  # [1, n + t]
        positions = torch.arange(len(prompt_ids) - 1, ids.shape[1] - 1, device=device)[None]  # [1, t] predicting rows
        targets = torch.tensor([response_ids], device=device)  # [1, t]
        foils = None if foil is None else torch.tensor([[foil]], device=device)  # [1, 1]
        n = len(prompt_ids)
        no_split = torch.full((len(response_ids), membership.shape[1]), float("nan"))
        if self.method == "knockout":
            context = torch.zeros(1, ids.shape[1], dtype=torch.bool, device=device)  # [1, n + t]
            context[0, :n] = membership.sum(1) > 0
            per_token = knockout_gradients(self.model, ids, context, positions, targets, interval=KNOCKOUT_INTERVAL,
                                           foils=foils).scores[0, :n].cpu()  # [n]
            return (per_token, no_split, *self._log_probs(ids, positions, targets, foils))
        model_inputs, positional = prepare_inputs(self.model, ids, None, None, ids.device)
        layers = [self.attention_layers[index] for index in self.layers]
        found = target_scores(self.model, layers, None, model_inputs, positional, positions, targets,
                              self.target_rows, foils=foils)
        per_token = found.scores[0].sum(0).cpu()[:n]  # [n]: summed over layers
        token_scores = (found.per_target[0].sum(1).cpu()[:, :n] @ membership if found.per_target is not None
                        else no_split)
        if foils is None:
            return per_token, token_scores, found.objective[0].cpu(), None
        return (per_token, token_scores, *self._read_log_probs(found.output.logits.detach(), positions, targets, foils))

    @torch.no_grad()
    def _log_probs(self, ids: Tensor, positions: Tensor, targets: Tensor, foils: Tensor | None) -> tuple[
            Tensor, Tensor | None]:
        r"""``(t,)`` each response token's log-probability, and each foil's where there are foils (one forward
        pass)."""
        return self._read_log_probs(self.model(input_ids=ids).logits, positions, targets, foils)

    @staticmethod
    def _read_log_probs(logits: Tensor, positions: Tensor, targets: Tensor, foils: Tensor | None) -> tuple[
            Tensor, Tensor | None]:
        r"""From ``(1, n + t, vocab)`` logits: ``(t,)`` each response token's log-probability, and each foil's."""
        return (target_objective(logits, positions, targets)[0].cpu(),
                None if foils is None else target_objective(logits, positions, foils)[0].cpu())

    def _response_ids(self, prompt_ids: list[int], response: str | None, max_new_tokens: int) -> list[int]:
        if response is not None:
            ids = list(self.tokenizer(response, add_special_tokens=False)["input_ids"])
            if not ids:
                raise InputError("the response has no tokens; give a non-empty response, or None to generate one.")
            return ids
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
        device = next(self.model.parameters()).device
        prompt = torch.tensor([prompt_ids], device=device)
        generate: Any = getattr(self.model, "generate")
        with torch.no_grad():
            generated = generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=max_new_tokens, temperature=None, top_p=None, top_k=None)
        ids = generated[0, len(prompt_ids):].tolist()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ids = ids[: ids.index(eos)] if eos in ids else ids
        if not ids:
            raise InputError("the model generated no response (it ended at once); pass the response to explain.")
        return ids
