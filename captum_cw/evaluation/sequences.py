"""Token sequences of an example and how its performance is read off the logits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from captum_cw.tasks import Example

__all__ = ["Choice", "EncodedExample", "choice_logliks", "compare", "encode", "measure", "scoring_problem",
           "text_nll"]


@dataclass(frozen=True)
class Choice:
    sequence: int  # which sequence holds it
    start: int  # the row whose logits predict its first token
    tokens: tuple[int, ...]


@dataclass
class EncodedExample:
    r"""Token ids of the sequences an example needs, and where its choices are scored."""

    example: Example
    sequences: list[Tensor]  # each (n_s,) long
    choices: list[Choice]  # empty for text
    special: list[Tensor]  # each (n_s,) bool: special tokens, never removed unless asked

    def rows_needed(self, sequence: int) -> int:
        r"""How many last positions' logits the measure reads (``logits_to_keep``)."""
        n = len(self.sequences[sequence])
        starts = [choice.start for choice in self.choices if choice.sequence == sequence]
        return n - min(starts) if starts else n


def encode(example: Example, tokenizer: PreTrainedTokenizerBase, max_tokens: int = 512) -> EncodedExample:
    r"""
    Tokenises an example. Choices that share a context and continue it by a single
    token share one sequence (the context); others get context + continuation.
    Text is cut to ``max_tokens`` tokens from the right; a context from the left, after the
    special tokens the tokenizer puts in front (e.g. ``<bos>``, whose loss turns a model's
    first-token sink off), so the question and its answer stay and so does the prefix.
    """
    special_ids = set(tokenizer.all_special_ids)
    sequences: list[Tensor] = []
    choices: list[Choice] = []
    if not example.is_choice:
        ids = tokenizer(example.contexts[0], truncation=True, max_length=max_tokens)["input_ids"]
        sequences.append(torch.tensor(ids))
    else:
        by_context: dict[str, list[int]] = {}
        for index, context in enumerate(example.contexts):
            by_context.setdefault(context, []).append(index)
        placed: dict[int, Choice] = {}
        for context, indices in by_context.items():
            context_ids = _keep_last(tokenizer(context)["input_ids"], max_tokens, special_ids)
            continuations = {i: tokenizer(example.continuations[i], add_special_tokens=False)["input_ids"]
                             for i in indices}
            if all(len(tokens) == 1 for tokens in continuations.values()):
                sequences.append(torch.tensor(context_ids))
                for i in indices:
                    placed[i] = Choice(len(sequences) - 1, len(context_ids) - 1, tuple(continuations[i]))
            else:
                for i in indices:
                    sequences.append(torch.tensor(context_ids + continuations[i]))
                    placed[i] = Choice(len(sequences) - 1, len(context_ids) - 1, tuple(continuations[i]))
        choices = [placed[i] for i in range(len(example.contexts))]
    special = [torch.tensor([int(t) in special_ids for t in ids.tolist()]) for ids in sequences]
    return EncodedExample(example, sequences, choices, special)


def _keep_last(ids: list[int], max_tokens: int, special_ids: set[int]) -> list[int]:
    r"""The last ``max_tokens`` ids of ``ids``, with the special tokens that lead it kept in front."""
    prefix = 0
    while prefix < len(ids) and ids[prefix] in special_ids:
        prefix += 1
    prefix = min(prefix, max_tokens - 1)
    return ids[:prefix] + ids[prefix:][len(ids) - max_tokens:] if len(ids) > max_tokens else ids


def scoring_problem(encoded: EncodedExample) -> str | None:
    r"""
    Why an encoded example cannot be scored, or None when it can: a text needs two tokens (its
    next-token NLL averages over the ``n - 1`` predicted ones); a choice needs a context token to
    predict from and a continuation token to score.
    """
    if not encoded.choices:
        n = len(encoded.sequences[0])
        return None if n >= 2 else f"{n} token(s) after tokenisation; a text needs at least 2 to be scored"
    for index, choice in enumerate(encoded.choices):
        if choice.start < 0:
            return f"choice {index} has an empty context after tokenisation"
        if not choice.tokens:
            return f"choice {index} has an empty continuation after tokenisation"
    return None


def choice_logliks(encoded: EncodedExample, logits: Sequence[Tensor | None]) -> Tensor:
    r"""
    Log-likelihood of each choice's continuation.

    Args:
        logits (Sequence[Tensor or None]): per sequence, ``(batch, kept_rows, vocab)`` for its
                    last ``rows_needed`` positions; None for a sequence no choice of ``encoded`` reads.
    Returns:
        Tensor ``(batch, n_choices)``.
    """
    columns = []
    for choice in encoded.choices:
        n = len(encoded.sequences[choice.sequence])
        sequence_logits = logits[choice.sequence]
        if sequence_logits is None:
            raise ValueError(f"no logits for sequence {choice.sequence}, which a choice of {encoded.example.id} reads.")
        first = choice.start - (n - sequence_logits.shape[1])
        rows = sequence_logits[:, first:first + len(choice.tokens)].float().log_softmax(-1)
        tokens = torch.tensor(choice.tokens, device=rows.device)
        columns.append(rows.gather(-1, tokens[None, :, None].expand(rows.shape[0], -1, 1)).sum((1, 2)))
    return torch.stack(columns, 1)


def text_nll(sequence: Tensor, logits: Tensor) -> Tensor:
    r"""Mean next-token NLL ``(batch,)`` from logits ``(batch, n, vocab)`` of all positions."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    targets = sequence[1:].to(log_probs.device)
    return -log_probs.gather(-1, targets[None, :, None].expand(log_probs.shape[0], -1, 1)).squeeze(-1).mean(1)


def measure(encoded: EncodedExample, logits: list[Tensor]) -> list[dict[str, float]]:
    r"""Per batch entry: ``logliks`` and ``prediction`` for choices, ``nll`` for text."""
    if not encoded.choices:
        return [{"nll": float(value)} for value in text_nll(encoded.sequences[0], logits[0])]
    logliks = choice_logliks(encoded, logits)
    return [{"logliks": row.tolist(), "prediction": int(row.argmax())} for row in logliks]


def compare(clean: dict, perturbed: dict, label: int | None) -> dict[str, float]:
    r"""
    How much a perturbation hurt. Choices: ``prob_drop`` and ``logprob_drop`` of the
    originally predicted answer (probabilities normalised over the choices, ERASER's
    m(x)_j) and ``accuracy`` after it; text: ``delta_nll`` and ``delta_ppl``.
    """
    if "nll" in clean:
        return {"delta_nll": perturbed["nll"] - clean["nll"],
                "delta_ppl": math.exp(perturbed["nll"]) - math.exp(clean["nll"])}
    predicted = clean["prediction"]
    clean_log = torch.tensor(clean["logliks"], dtype=torch.float64).log_softmax(0)[predicted]
    new_log = torch.tensor(perturbed["logliks"], dtype=torch.float64).log_softmax(0)[predicted]
    return {
        "prob_drop": float(clean_log.exp() - new_log.exp()),
        "logprob_drop": float(clean_log - new_log),
        "accuracy": float(perturbed["prediction"] == label) if label is not None else math.nan,
    }
