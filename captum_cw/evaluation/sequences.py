"""Token sequences of an example and how its performance is read off the logits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from captum_cw.tasks import Example

__all__ = ["Choice", "EncodedExample", "compare", "encode", "measure", "measure_reads", "scoring_problem",
           "sequence_reads", "text_nll"]


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


def _continuation_loglik(encoded: EncodedExample, choice: Choice, logits: Tensor) -> Tensor:
    r"""Log-likelihood ``(batch,)`` of a choice's continuation from its sequence's last ``kept_rows`` logits."""
    first = choice.start - (len(encoded.sequences[choice.sequence]) - logits.shape[1])
    rows = logits[:, first:first + len(choice.tokens)].float().log_softmax(-1)
    tokens = torch.tensor(choice.tokens, device=rows.device)
    return rows.gather(-1, tokens[None, :, None].expand(rows.shape[0], -1, 1)).sum((1, 2))


def text_nll(sequence: Tensor, logits: Tensor) -> Tensor:
    r"""Mean next-token NLL ``(batch,)`` from logits ``(batch, n, vocab)`` of all positions."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    targets = sequence[1:].to(log_probs.device)
    return -log_probs.gather(-1, targets[None, :, None].expand(log_probs.shape[0], -1, 1)).squeeze(-1).mean(1)


def sequence_reads(encoded: EncodedExample, sequence: int, logits: Tensor) -> Tensor:
    r"""
    What the measures read from one sequence's logits, so that a batch keeps this instead of
    ``(batch, kept_rows, vocab)`` logits (with a large vocabulary, gigabytes per batch).

    Args:
        logits (Tensor): ``(batch, kept_rows, vocab)``, the sequence's last ``rows_needed`` positions.
    Returns:
        Tensor ``(batch, k)``: a text's next-token NLL (``k = 1``), or the log-likelihood of each
        choice that this sequence holds, in choice order.
    """
    if not encoded.choices:
        return text_nll(encoded.sequences[sequence], logits)[:, None]
    held = [choice for choice in encoded.choices if choice.sequence == sequence]
    return torch.stack([_continuation_loglik(encoded, choice, logits) for choice in held], 1)


def measure_reads(encoded: EncodedExample, reads: Sequence[Tensor]) -> list[dict[str, float]]:
    r"""
    Per batch entry: ``logliks`` and ``prediction`` for choices, ``nll`` for text, from every
    sequence's :func:`sequence_reads` ``(batch, k_s)``.
    """
    if not encoded.choices:
        return [{"nll": float(value)} for value in reads[0][:, 0]]
    held = [0] * len(encoded.sequences)  # per sequence, the choices placed so far
    columns = []
    for choice in encoded.choices:
        columns.append(reads[choice.sequence][:, held[choice.sequence]])
        held[choice.sequence] += 1
    logliks = torch.stack(columns, 1)
    return [{"logliks": row.tolist(), "prediction": int(row.argmax())} for row in logliks]


def measure(encoded: EncodedExample, logits: Sequence[Tensor]) -> list[dict[str, float]]:
    r"""Per batch entry: :func:`measure_reads` of every sequence's logits ``(batch, kept_rows, vocab)``."""
    return measure_reads(encoded, [sequence_reads(encoded, s, values) for s, values in enumerate(logits)])


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
