"""One example as token ids with its context, sources, evidence and answer copy as token positions.

Prompt building lives in :func:`encode_example` alone: a chat format (``tokenizer.apply_chat_template``) is
added there and every method and measure follows, since they all read positions from :class:`EncodedExample`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from captum_cw.tasks.context import ContextExample, prompt_text

__all__ = ["EncodedExample", "boolq_examples", "encode_example", "first_token", "with_answer", "with_foil"]


@dataclass(frozen=True)
class EncodedExample:
    r"""
    An example ready for the methods: positions index ``input_ids[0]``.

    Attributes:
        example (ContextExample): what was encoded (a BoolQ example has ``evidence == -1``: unknown).
        input_ids (Tensor): ``(1, n)`` the prompt's ids, special tokens included.
        context (list[int]): positions of the context's tokens (every source's), ascending.
        sources (list[list[int]]): the positions of each source's tokens.
        evidence (list[int]): the evidence source's positions (empty where the evidence is unknown).
        copy (list[int]): positions of the in-context copy of the answer (empty where the context has none).
        target (int): the answer's first token id, explained at the last position.
        candidates (list[int]): each candidate's first token id.
        foil (int or None): a token the target is contrasted with: every method and measure then explains the
                    log-odds ``log p(target) - log p(foil)`` instead of ``log p(target)`` (:func:`with_foil`).
    """

    example: ContextExample
    input_ids: Tensor
    context: list[int]
    sources: list[list[int]]
    evidence: list[int]
    copy: list[int]
    target: int
    candidates: list[int]
    foil: int | None = None

    @property
    def n(self) -> int:
        return int(self.input_ids.shape[1])


def first_token(tokenizer, text: str) -> int:
    r"""The first token id of ``text`` (an answer with its leading space) without special tokens."""
    return int(tokenizer(text, add_special_tokens=False)["input_ids"][0])


def _anchor(prompt: str, start: int, end: int) -> int:
    r"""The character a token stands for: its first non-space character (``" Tom"`` belongs to Tom's source)."""
    stripped = len(prompt[start:end]) - len(prompt[start:end].lstrip())
    return start + stripped if stripped < end - start else start


def _positions_in(offsets: list[tuple[int, int]], prompt: str, spans: list[tuple[int, int]]) -> list[int]:
    r"""Positions of the (non-special) tokens whose anchor character lies in one of ``spans``."""
    found = []
    for position, (start, end) in enumerate(offsets):
        if end > start and any(low <= _anchor(prompt, start, end) < high for low, high in spans):
            found.append(position)
    return found


def encode_example(tokenizer, example: ContextExample, style: str = "plain") -> EncodedExample:
    r"""
    Tokenizes the example's prompt in a style (``captum_cw.tasks.context.prompt_text``: ``"plain"``, ``"facts"``
    or ``"chat"``; special tokens added, or the chat template's own) and maps its sources, evidence and answer
    copy onto token positions through the offsets mapping.

    Args:
        tokenizer: a fast tokenizer (offsets mappings).
        example (ContextExample): the example.
        style (str, optional): the prompt style. Default: ``"plain"``
    Returns:
        :class:`EncodedExample`.
    """
    prompt, spans, templated = prompt_text(example, tokenizer, style)
    encoding = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=not templated)
    offsets = [tuple(pair) for pair in encoding["offset_mapping"]]
    sources = [_positions_in(offsets, prompt, [span]) for span in spans]
    evidence = sources[example.evidence] if example.evidence >= 0 else []
    word = example.answer.strip()
    copies = [(start + found.start(), start + found.end()) for start, end in spans
              for found in re.finditer(re.escape(word), prompt[start:end])] if example.copy else []
    copy = _positions_in(offsets, prompt, copies)
    return EncodedExample(example, torch.tensor([encoding["input_ids"]]), sorted(p for s in sources for p in s),
                          sources, evidence, copy, first_token(tokenizer, example.answer),
                          [first_token(tokenizer, c) for c in example.candidates])


def _sentences(passage: str) -> list[str]:
    r"""A passage split at each sentence end; a part keeps the spaces before it, so the parts join back."""
    return [part for part in re.split(r"(?<=[.!?])(?=\s+\S)", passage.strip()) if part]


def boolq_examples(path: str | Path, n: int) -> list[ContextExample]:
    r"""
    The first ``n`` BoolQ examples of a JSONL file in the hub schema (``question``, ``passage``, ``answer``) as
    context examples: the passage's sentences are the sources, the evidence is unknown (-1) and the answer is the
    label; :func:`with_answer` replaces it by the model's own answer.
    """
    examples = []
    with open(path, encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if len(examples) == n:
                break
            row = json.loads(line)
            question = row["question"].strip().rstrip("?")
            sources = tuple(_sentences(row["passage"]))
            examples.append(ContextExample(f"boolq-{index}", "boolq", sources,
                                           f"\nQuestion: {question[:1].upper()}{question[1:]}?\nAnswer:",
                                           " yes" if row["answer"] else " no", (" yes", " no"), -1, False))
    return examples


def with_answer(example: ContextExample, answer: str) -> ContextExample:
    r"""The example with ``answer`` (one of its candidates) as the answer explained."""
    return replace(example, answer=answer)


def with_foil(encoded: EncodedExample, foil: int) -> EncodedExample:
    r"""The encoded example explained as the log-odds of its target against ``foil`` (another token)."""
    if foil == encoded.target:
        raise ValueError(f"the foil {foil} is the target itself; contrast it with another candidate's token.")
    return replace(encoded, foil=foil)
