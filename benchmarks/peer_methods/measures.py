"""What a method's scores are worth on one example: pointing, evidence mass, comprehensiveness, sufficiency, LDS.

Every removal deletes tokens from the input ids (the model reads the prompt without them); the target is the
log-probability of the answer's first token at the last position, or with a foil (``EncodedExample.foil``) its
log-odds against the foil's token. Token-level scores are ``(n,)`` over the prompt's positions (only the
context's count); source-level scores are ``(sources,)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .encoding import EncodedExample

__all__ = ["KS", "explained_value", "kept_sources", "lds", "lds_ablations", "lds_masks", "lds_seed", "measure",
           "ranking", "source_scores", "spearman", "target_logprobs", "tied_top_share", "without"]

KS = (1, 3, 5)  # comp@k and suff@k: tokens removed or kept


LOGITS_BUDGET = 2**28  # logits (rows x width x vocab) per forward of target_logprobs: 1 GiB in float32


def explained_value(log_probs: torch.Tensor, target: int, foil: int | None = None) -> torch.Tensor:
    r"""``(batch,)`` what is explained, read from ``(batch, vocab)`` log-probabilities: ``log p(target)``, or with
    ``foil`` the log-odds ``log p(target) - log p(foil)``."""
    return log_probs[:, target] if foil is None else log_probs[:, target] - log_probs[:, foil]


@torch.no_grad()
def target_logprobs(model: nn.Module, rows: Sequence[Sequence[int]], target: int, foil: int | None = None,
                    batch_size: int = 16) -> np.ndarray:
    r"""
    The log-probability of ``target`` after each row of ids (rows of any lengths, run right-padded); with ``foil``
    the log-odds ``log p(target) - log p(foil)``.

    Returns:
        ``(len(rows),)`` float64.
    """
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    width = max((len(row) for row in rows), default=1)
    batch_size = max(1, min(batch_size, LOGITS_BUDGET // (width * vocab)))  # [b, width, vocab] logits fit
    values = []
    for start in range(0, len(rows), batch_size):
        chunk = [list(row) for row in rows[start:start + batch_size]]
        width = max(len(row) for row in chunk)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in chunk], device=device)  # [b, width]
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in chunk], device=device)
        logits = model(input_ids=ids, attention_mask=mask).logits  # [b, width, vocab]
        last = torch.tensor([len(row) - 1 for row in chunk], device=device)
        rows_logits = logits[torch.arange(len(chunk), device=device), last].double()  # [b, vocab]
        values.append(explained_value(rows_logits.log_softmax(-1), target, foil).cpu().numpy())
    return np.concatenate(values)


def without(encoded: EncodedExample, removed: Sequence[int]) -> list[int]:
    r"""The prompt's ids with the tokens at ``removed`` deleted."""
    gone = set(removed)
    return [int(t) for p, t in enumerate(encoded.input_ids[0].tolist()) if p not in gone]


def source_scores(encoded: EncodedExample, scores: np.ndarray, level: str) -> np.ndarray:
    r"""Scores per source: token scores summed over each source's tokens, source scores as they are."""
    if level == "source":
        return np.asarray(scores, dtype=float)
    return np.array([float(np.sum(scores[positions])) for positions in encoded.sources])


def tied_top_share(values: np.ndarray, good: np.ndarray) -> float:
    r"""The share of ``good`` among the top-scoring items, ties included: pointing under random tie-breaking."""
    top = values == values.max()
    return float((top & good).sum() / top.sum())


def ranking(values: np.ndarray) -> np.ndarray:
    r"""Indices by descending value, ties in index order."""
    return np.argsort(-values, kind="stable")


def spearman(first: np.ndarray, second: np.ndarray) -> float:
    r"""Spearman's correlation with average ranks for ties (NaN where either side is constant)."""
    def ranks(values: np.ndarray) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        ranked = np.empty(len(values))
        ranked[order] = np.arange(len(values), dtype=float)
        for value in np.unique(values):  # ties share their mean rank
            ranked[values == value] = ranked[values == value].mean()
        return ranked
    a, b = ranks(np.asarray(first, dtype=float)), ranks(np.asarray(second, dtype=float))
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def lds_seed(example_id: str) -> int:
    r"""The seed of an example's LDS ablations: the same for every method and run, apart from the methods' own."""
    return int.from_bytes(hashlib.sha256(f"lds:{example_id}".encode()).digest()[:4], "little")


def lds_ablations(model: nn.Module, encoded: EncodedExample, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r"""
    ``count`` random source ablations at keep rate 0.5 and the target log-probability under each: the ground
    truth of the LDS, shared by every method on the example.

    Returns:
        ``(masks (count, sources) bool: kept, logprobs (count,))``.
    """
    masks = lds_masks(len(encoded.sources), count, seed)
    return masks, target_logprobs(model, [kept_sources(encoded, mask) for mask in masks], encoded.target,
                                  encoded.foil)


def lds_masks(sources: int, count: int, seed: int) -> np.ndarray:
    r"""``(count, sources)`` bool: which sources each of :func:`lds_ablations`'s ablations keeps (rate 0.5)."""
    return np.random.default_rng(seed).random((count, sources)) < 0.5


def kept_sources(encoded: EncodedExample, kept: Sequence[bool]) -> list[int]:
    r"""The prompt's ids with the tokens of every source not ``kept`` deleted."""
    return without(encoded, [p for s, keep in enumerate(kept) if not keep for p in encoded.sources[s]])


def lds(per_source: np.ndarray, ablations: tuple[np.ndarray, np.ndarray]) -> float:
    r"""ContextCite's LDS: the Spearman correlation between the summed ``(sources,)`` scores of the kept sources and
    the target log-probability, over :func:`lds_ablations`'s ablations."""
    masks, logprobs = ablations
    return spearman(masks.astype(float) @ per_source, logprobs)


def measure(model: nn.Module, encoded: EncodedExample, scores: np.ndarray, level: str, full: float,
            ablations: tuple[np.ndarray, np.ndarray] | None) -> dict[str, float | None]:
    r"""
    Every measure of one method on one example.

    Args:
        model (nn.Module): the model.
        encoded (EncodedExample): the example.
        scores (ndarray): ``(n,)`` token scores or ``(sources,)`` source scores.
        level (str): ``"token"`` or ``"source"``.
        full (float): the target log-probability (with a foil, log-odds) on the whole prompt.
        ablations (tuple, optional): :func:`lds_ablations`'s masks and log-probabilities.
    Returns:
        ``pointing``, ``evidence_mass`` (None where the evidence is unknown), ``comp@k``, ``suff@k`` (None for
        source-level methods), ``source_comp@1`` and ``lds`` (drops are ``full`` minus the ablated log-probability).
    """
    per_source = source_scores(encoded, scores, level)
    evidence_known = encoded.example.evidence >= 0
    result: dict[str, float | None] = {"pointing": None, "evidence_mass": None}
    if evidence_known:
        if level == "source":
            is_evidence = np.arange(len(per_source)) == encoded.example.evidence
            result["pointing"] = tied_top_share(per_source, is_evidence)
            positive = np.clip(per_source, 0, None)
        else:
            context = np.asarray(encoded.context)
            is_evidence = np.isin(context, encoded.evidence)
            result["pointing"] = tied_top_share(scores[context], is_evidence)
            positive = np.clip(scores[context], 0, None)
        result["evidence_mass"] = float(positive[is_evidence].sum() / positive.sum()) if positive.sum() > 0 else None
    rows, names = [], []
    if level == "token":
        context = np.asarray(encoded.context)
        order = context[ranking(scores[context])]
        for k in KS:
            rows.append(without(encoded, order[:k].tolist()))
            names.append(f"comp@{k}")
            rows.append(without(encoded, order[k:].tolist()))
            names.append(f"suff@{k}")
    rows.append(without(encoded, encoded.sources[int(ranking(per_source)[0])]))
    names.append("source_comp@1")
    drops = full - target_logprobs(model, rows, encoded.target, encoded.foil)
    result.update({name: None for k in KS for name in (f"comp@{k}", f"suff@{k}")})
    result.update({name: float(drop) for name, drop in zip(names, drops)})
    if ablations is not None:
        result["lds"] = lds(per_source, ablations)
    return result
