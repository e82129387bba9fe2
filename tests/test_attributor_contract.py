"""One contract for every attributor (as Captum's tests/attr/test_hook_removal.py holds every method to one),
through the public API only, on tiny random models: a decoder with grouped-query attention and an encoder.

Every attributor returns float32 scores shaped as documented, on the model's device; padding scores exactly 0;
each row of a padded batch equals the row of its example run unpadded; a returned delta is the one
``compute_convergence_delta`` gives; and afterwards no hook is left on any module, the attention implementation
and the architecture, attention-function and metric registries are as they were, and the model computes the same
logits."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers
from torch import Tensor, nn
from transformers.modeling_utils import AttentionInterface

import captum_cw
from captum_cw import (
    AttentionWeights,
    ContributionWeights,
    OutputNormalizedAttention,
    TokenContributions,
    ValueWeightedAttention,
    registered_architectures,
)
from captum_cw.llm import LLMContributionAttribution
from conftest import require
from tiny_models import FAMILIES, example_inputs

FAMILY_NAMES = ["llama", "bert"]  # llama: a decoder, 4 query heads sharing 2 key/value heads; bert: an encoder
TARGET = 5  # a vocabulary id of the tiny models, for the attributors that explain one


@dataclass(frozen=True)
class Method:
    r"""How to build one attributor and what its :meth:`attribute` returns for ``(ids, mask)``."""

    name: str
    build: Callable[[nn.Module], object]
    scores: Callable[[object, Tensor, Tensor], Tensor]
    shape: Callable[[Tensor, int], tuple[int, ...]]  # (ids [batch, n], n_layers) -> the documented shape
    per_token: bool  # (batch, n) scores of the tokens, rather than (batch, layers, query, key) rows
    decoder_only: bool = False  # needs logits (a target)


def _rows(attributor, ids: Tensor, mask: Tensor) -> Tensor:
    return attributor.attribute(ids, attention_mask=mask)


def _row_shape(ids: Tensor, layers: int) -> tuple[int, ...]:
    return (len(ids), layers, ids.shape[1], ids.shape[1])  # [batch, layer, query, key]


def _token_shape(ids: Tensor, layers: int) -> tuple[int, ...]:
    return tuple(ids.shape)  # [batch, n]


def _token_method(aggregation: str, target: int | None = None) -> Method:
    def scores(attributor, ids: Tensor, mask: Tensor) -> Tensor:
        return attributor.attribute(ids, target=target, attention_mask=mask)

    name = f"TokenContributions-{aggregation}" + ("" if target is None else "-target")
    return Method(name, lambda model: TokenContributions(model, layer_aggregation=aggregation), scores,
                  _token_shape, per_token=True, decoder_only=target is not None)


METHODS = [
    Method("ContributionWeights-inter", lambda model: ContributionWeights(model, variant="inter"), _rows,
           _row_shape, per_token=False),
    Method("ContributionWeights-intra", lambda model: ContributionWeights(model, variant="intra"), _rows,
           _row_shape, per_token=False),
    Method("AttentionWeights", AttentionWeights, _rows, _row_shape, per_token=False),
    Method("ValueWeightedAttention", ValueWeightedAttention, _rows, _row_shape, per_token=False),
    Method("OutputNormalizedAttention", OutputNormalizedAttention, _rows, _row_shape, per_token=False),
    *[_token_method(aggregation) for aggregation in ("last", "mean", "magnitude", "rollout")],
    *[_token_method(aggregation, TARGET) for aggregation in ("last", "mean", "magnitude")],  # rollout refuses one
]
CASES = [pytest.param(method, family, id=f"{method.name}-{family}")
         for method in METHODS for family in FAMILY_NAMES if not (method.decoder_only and family != "llama")]


def _model_and_inputs(family: str) -> tuple[nn.Module, Tensor, Tensor]:
    tiny = FAMILIES[family]
    ids, mask = example_inputs(tiny)  # [2, 9]; the second example padded by 3 (left for llama, right for bert)
    assert mask is not None
    return tiny.build(), ids, mask


def _logits(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    with torch.no_grad():
        output = model(ids, attention_mask=mask)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def _leftovers(model: nn.Module) -> list[str]:
    r"""Every hook still registered on a module of ``model``, or globally on all modules."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    found = [f"{name or 'model'}.{kind}" for name, module in model.named_modules() for kind in kinds
             if getattr(module, kind)]
    globals_ = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                "_global_backward_pre_hooks")
    return found + [kind for kind in globals_ if getattr(nn.modules.module, kind)]


def _settings(model: nn.Module) -> tuple:
    r"""What an attributor may change only while it runs: the implementation and the three registries."""
    return (model.config._attn_implementation, dict(AttentionInterface._global_mapping),
            registered_architectures(), {name: captum_cw.get_metric(name) for name in captum_cw.metric_names()})


@pytest.mark.parametrize("method, family", CASES)
def test_shape_dtype_device_and_zero_padding(method, family):
    model, ids, mask = _model_and_inputs(family)
    scores = method.scores(method.build(model), ids, mask)
    assert scores.shape == method.shape(ids, model.config.num_hidden_layers)
    assert scores.dtype == torch.float32 and scores.device == next(model.parameters()).device
    assert torch.isfinite(scores).all()
    padding = ~mask.bool()  # [batch, n]
    if method.per_token:
        assert (scores[padding] == 0).all()
    else:
        rows = scores.movedim(1, 2)  # [batch, query, layer, key]
        assert (rows[padding] == 0).all() and (scores.movedim(-1, 1)[padding] == 0).all()  # padded queries, keys
    assert scores[~padding.any(-1)].abs().sum() > 0  # an unpadded example is not all 0


@pytest.mark.parametrize("method, family", CASES)
def test_batch_rows_equal_unpadded_runs(method, family):
    model, ids, mask = _model_and_inputs(family)
    attributor = method.build(model)
    batch = method.scores(attributor, ids, mask)
    for example, (example_ids, real) in enumerate(zip(ids, mask.bool())):
        alone = method.scores(attributor, example_ids[real][None], torch.ones(1, int(real.sum()), dtype=mask.dtype))
        row = batch[example, real] if method.per_token else batch[example][..., real, :][..., real]
        torch.testing.assert_close(row, alone[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", [m for m in METHODS if not m.per_token], ids=lambda m: m.name)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_delta_agrees_with_compute_convergence_delta(method, family):
    model, ids, mask = _model_and_inputs(family)
    attributor = method.build(model)
    if not attributor.has_convergence_delta():
        with pytest.raises(TypeError, match="no completeness identity"):
            attributor.attribute(ids, attention_mask=mask, return_convergence_delta=True)
        return
    scores, delta = attributor.attribute(ids, attention_mask=mask, return_convergence_delta=True)
    assert delta.shape == (len(ids),) and delta.dtype == torch.float32
    torch.testing.assert_close(attributor.compute_convergence_delta(scores, ids, attention_mask=mask), delta,
                               rtol=0, atol=1e-6)
    assert (delta < 1e-4).all()  # the identity holds on these models


@pytest.mark.parametrize("method, family", CASES)
def test_leaves_no_hooks_settings_or_outputs_changed(method, family):
    model, ids, mask = _model_and_inputs(family)
    assert _leftovers(model) == []
    settings, logits = _settings(model), _logits(model, ids, mask)
    method.scores(method.build(model), ids, mask)
    assert _leftovers(model) == []
    assert _settings(model) == settings
    torch.testing.assert_close(_logits(model, ids, mask), logits, rtol=0, atol=0)


# the text front end and the inseq method take text: a tiny Llama (GQA) with SmolLM2's tokenizer
PROMPTS = ["The capital of France is", "Hi"]
CONTINUATIONS = [" Paris.", " there"]


@pytest.fixture(scope="module")
def tiny_text(tiny_llm_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir).eval()
    return model, transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)


def _text_logits(model: nn.Module, tokenizer) -> Tensor:
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("variant", ["inter", "intra", "attention"])
@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
def test_text_front_end(tiny_text, variant, aggregation):
    model, tokenizer = tiny_text
    settings, logits = _settings(model), _text_logits(model, tokenizer)
    explainer = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation, metric=variant)
    results = explainer.attribute(PROMPTS, CONTINUATIONS)  # one padded pass
    for prompt, continuation, result in zip(PROMPTS, CONTINUATIONS, results):
        n_prompt = len(tokenizer(prompt)["input_ids"])
        n_target = len(tokenizer(continuation, add_special_tokens=False)["input_ids"])
        assert result.token_attr.shape == (n_target, n_prompt) and result.seq_attr.shape == (n_prompt,)
        assert result.token_attr.dtype == torch.float32 and result.token_attr.device == model.device
        alone = explainer.attribute(prompt, continuation)
        torch.testing.assert_close(result.token_attr, alone.token_attr, rtol=0, atol=1e-5)
        torch.testing.assert_close(result.output_probs, alone.output_probs, rtol=0, atol=1e-5)
    assert _leftovers(model) == [] and _settings(model) == settings
    torch.testing.assert_close(_text_logits(model, tokenizer), logits, rtol=0, atol=0)


def test_inseq_method(tiny_llm_dir):
    inseq = require("inseq")
    importlib.import_module("captum_cw.inseq_method")  # registers "contribution_weights"
    wrapped = inseq.load_model(str(tiny_llm_dir), "contribution_weights")
    model, tokenizer = wrapped.model, wrapped.tokenizer
    settings, logits = _settings(model), _text_logits(model, tokenizer)
    texts = [prompt + continuation for prompt, continuation in zip(PROMPTS, CONTINUATIONS)]
    batch = wrapped.attribute(PROMPTS, texts, show_progress=False).sequence_attributions
    for prompt, text, sequence in zip(PROMPTS, texts, batch):
        scores = sequence.target_attributions  # [n, n_generated, layer]
        n = len(sequence.target)
        assert scores.shape[0] == n and scores.shape[2] == model.config.num_hidden_layers
        assert scores.dtype == torch.float32
        alone = wrapped.attribute(prompt, text, show_progress=False).sequence_attributions[0].target_attributions
        torch.testing.assert_close(scores, alone, rtol=0, atol=1e-5, equal_nan=True)
    assert _leftovers(model) == [] and _settings(model) == settings
    torch.testing.assert_close(_text_logits(model, tokenizer), logits, rtol=0, atol=0)
