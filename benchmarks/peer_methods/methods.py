"""The registry of compared methods: a name -> how it scores one example's context, at token or source level.

A method is ``fn(model, tokenizer, encoded) -> (scores, forwards)``: ``scores`` is ``(n,)`` over the prompt's
positions (token level; only the context's are read) or ``(sources,)`` (source level), ``forwards`` the model
passes it ran (a backward counts as one more). Adding a method is one :func:`register` call, e.g. the
target-aware contribution weights::

    register(PeerMethod("cw_target", my_function, "token"))
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from captum_cw import TokenContributions
from captum_cw.knockout_gradients import knockout_gradients
from captum_cw.sources import KNOCKOUT_INTERVAL

from .encoding import EncodedExample
from .measures import explained_value

__all__ = ["METHODS", "PeerMethod", "register", "unavailable"]

Scorer = Callable[[nn.Module, object, EncodedExample], tuple[np.ndarray, int]]


@dataclass(frozen=True)
class PeerMethod:
    r"""
    A compared method.

    Attributes:
        name (str): its registry name.
        score (callable): ``(model, tokenizer, encoded) -> (scores, forwards)``.
        level (str): ``"token"`` or ``"source"``.
        needs (tuple[str, ...]): modules it imports (an optional peer); absent ones skip it with a reason.
    """

    name: str
    score: Scorer
    level: str = "token"
    needs: tuple[str, ...] = ()


METHODS: dict[str, PeerMethod] = {}


def register(method: PeerMethod) -> PeerMethod:
    r"""Adds ``method`` to :data:`METHODS` (a name already there is replaced)."""
    METHODS[method.name] = method
    return method


def unavailable(method: PeerMethod) -> str | None:
    r"""Why ``method`` cannot run here (a missing optional peer), or None."""
    missing = [module for module in method.needs if importlib.util.find_spec(module) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (pip install -e .[peers], see docs/PEERS.md)"
    return None


_EXPLAINERS: dict[tuple, TokenContributions] = {}


def token_contributions(metric: str, layer_aggregation: str, target_rows: str | None = None) -> Scorer:
    r"""A scorer of :class:`captum_cw.TokenContributions` at the last position (one explainer per model); with
    ``target_rows``, its target-aware form for the answer's token (one forward and one backward pass)."""
    def score(model: nn.Module, tokenizer, encoded: EncodedExample) -> tuple[np.ndarray, int]:
        key = (id(model), metric, layer_aggregation, target_rows)
        if key not in _EXPLAINERS:
            _EXPLAINERS[key] = TokenContributions(model, metric=metric, layer_aggregation=layer_aggregation,
                                                  target_rows=target_rows or "explained")
        device = next(model.parameters()).device
        target, foil = (None, None) if target_rows is None else (encoded.target, encoded.foil)
        row = _EXPLAINERS[key].attribute(encoded.input_ids.to(device), target=target, foil=foil)[0]  # [n]
        return row.detach().double().cpu().numpy(), 1 if target_rows is None else 2
    return score


def knockout(interval: tuple[float, float], n_steps: int = 1) -> Scorer:
    r"""Knockout gradients (:func:`captum_cw.knockout_gradients.knockout_gradients`): the target's gradient with
    respect to the context tokens' key gates in every layer, integrated over ``interval`` of the path by the
    midpoint rule with ``n_steps`` points (one forward and one backward pass each)."""
    def score(model: nn.Module, tokenizer, encoded: EncodedExample) -> tuple[np.ndarray, int]:
        device = next(model.parameters()).device
        context = torch.zeros(encoded.input_ids.shape, dtype=torch.bool)  # [1, n]
        context[0, encoded.context] = True
        foils = None if encoded.foil is None else torch.tensor([encoded.foil])
        found = knockout_gradients(model, encoded.input_ids.to(device), context, torch.tensor([encoded.n - 1]),
                                   torch.tensor([encoded.target]), interval=interval, n_steps=n_steps, foils=foils)
        return found.scores[0].double().cpu().numpy(), 2 * n_steps
    return score


def _seed(encoded: EncodedExample) -> int:
    return int.from_bytes(hashlib.sha256(encoded.example.id.encode()).digest()[:4], "little")


def random_scores(model: nn.Module, tokenizer, encoded: EncodedExample) -> tuple[np.ndarray, int]:
    r"""Uniform random scores, seeded by the example's id (the same on every run)."""
    return np.random.default_rng(_seed(encoded)).random(encoded.n), 0


def answer_copy(model: nn.Module, tokenizer, encoded: EncodedExample) -> tuple[np.ndarray, int]:
    r"""The trivial baseline: 1 on the tokens of the in-context copy of the answer, 0 elsewhere."""
    scores = np.zeros(encoded.n)
    scores[encoded.copy] = 1.0
    return scores, 0


def _logprob_of(model: nn.Module, target: int, foil: int | None = None) -> Callable[..., torch.Tensor]:
    r"""The forward function of the Captum methods: ``log p(target)`` at the last position, or with ``foil`` the
    log-odds ``log p(target) - log p(foil)``, ``(batch,)``."""
    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # the output layer on the last position only: [batch, n, vocab] logits of a long passage fill the memory
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1).logits[:, -1]
        return explained_value(logits.float().log_softmax(-1), target, foil)  # [batch]
    return forward


def feature_ablation(model: nn.Module, tokenizer, encoded: EncodedExample) -> tuple[np.ndarray, int]:
    r"""
    Captum's FeatureAblation over the context tokens, one at a time, each ablated by attention mask 0 (the
    token stays in place, with its position, but no query reads it); the drop in the target log-probability.
    """
    from captum.attr import FeatureAblation

    device = next(model.parameters()).device
    ids = encoded.input_ids.to(device)  # [1, n]
    context = torch.tensor(encoded.context, device=device)
    forward = _logprob_of(model, encoded.target, encoded.foil)

    def masked(context_mask: torch.Tensor) -> torch.Tensor:  # [batch, c] 1 kept, 0 ablated
        mask = torch.ones(context_mask.shape[0], ids.shape[1], dtype=torch.long, device=device)
        mask[:, context] = context_mask.long()
        return forward(ids.expand(len(mask), -1), mask)

    with torch.no_grad():
        ones = torch.ones(1, len(context), device=device)
        scores = FeatureAblation(masked).attribute(ones, baselines=0.0, perturbations_per_eval=16)[0]  # [c]
    result = np.zeros(encoded.n)
    result[encoded.context] = scores.double().cpu().numpy()
    return result, len(encoded.context) + 1


IG_TOKENS = 4096  # tokens (steps x prompt length) per backward pass of Integrated Gradients


def integrated_gradients(model: nn.Module, tokenizer, encoded: EncodedExample, steps: int = 50) -> tuple[
        np.ndarray, int]:
    r"""
    Captum's LayerIntegratedGradients on the input embeddings, ``steps`` steps, the baseline the pad token's
    embedding on the context tokens (the rest of the prompt as it is); attributions summed over the hidden size.
    """
    from captum.attr import LayerIntegratedGradients

    device = next(model.parameters()).device
    ids = encoded.input_ids.to(device)  # [1, n]
    baseline = ids.clone()
    baseline[0, encoded.context] = tokenizer.pad_token_id
    explainer = LayerIntegratedGradients(_logprob_of(model, encoded.target, encoded.foil),
                                         model.get_input_embeddings())
    batch = max(1, min(steps, IG_TOKENS // encoded.n))  # steps per backward: a long passage's activations are large
    scores = explainer.attribute(ids, baselines=baseline, n_steps=steps, internal_batch_size=batch)  # [1, n, d]
    return scores[0].sum(-1).detach().double().cpu().numpy(), 2 * steps


for _name, _metric, _aggregation in (("cw_mean", "cw_inter", "mean"), ("cw_last", "cw_inter", "last"),
                                     ("cw_rollout", "cw_inter", "rollout"), ("cw_intra_mean", "cw_intra", "mean"),
                                     ("value_weighted_mean", "value_weighted", "mean"),
                                     ("output_normalized_mean", "output_normalized", "mean"),
                                     ("attention_mean", "attention", "mean"), ("attention_last", "attention", "last"),
                                     ("attention_rollout", "attention", "rollout")):
    register(PeerMethod(_name, token_contributions(_metric, _aggregation)))
for _name, _aggregation, _rows in (("cw_target", "mean", "explained"), ("cw_target_last", "last", "explained"),
                                   ("cw_target_all", "mean", "all"), ("cw_target_magnitude", "magnitude", "explained")):
    register(PeerMethod(_name, token_contributions("cw_inter", _aggregation, _rows)))
register(PeerMethod("cw_knockout", knockout((0.0, 1.0))))  # read at t = 1/2
register(PeerMethod("cw_knockout_early", knockout(KNOCKOUT_INTERVAL)))  # SourceContributions' reading, t = 0.05
register(PeerMethod("cw_knockout_path", knockout((0.0, 1.0), 4)))  # the whole path: t = 1/8, 3/8, 5/8, 7/8
register(PeerMethod("random", random_scores))
register(PeerMethod("answer_copy", answer_copy))
register(PeerMethod("feature_ablation", feature_ablation))
register(PeerMethod("integrated_gradients", integrated_gradients))
