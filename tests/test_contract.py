"""The model is left as it was; bad input gets a clear ValueError; new families can be registered."""

import pytest
import torch
from transformers.modeling_utils import AttentionInterface

from captum_cw import (
    Architecture,
    AttentionWeights,
    ContributionWeights,
    register_architecture,
    registered_architectures,
)
from tiny_models import FAMILIES, example_inputs


@pytest.fixture
def llama():
    """A fresh model per test: the tests below switch its attention implementation, so a shared one would hand
    each test whatever implementation the test before it left."""
    family = FAMILIES["llama"]
    return family.build(), *example_inputs(family)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_outputs_unchanged_and_implementation_restored(llama, implementation):
    model, ids, mask = llama
    model.set_attn_implementation(implementation)
    before = dict(AttentionInterface._global_mapping)
    expected = model(ids, attention_mask=mask).logits
    attributor = ContributionWeights(model)

    observed = {}
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: observed.setdefault("logits", out))
    attributor.attribute(ids, attention_mask=mask)
    hook.remove()
    torch.testing.assert_close(observed["logits"], expected, rtol=0, atol=0)
    assert dict(AttentionInterface._global_mapping) == before
    assert model.config._attn_implementation == implementation
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, expected, rtol=0, atol=0)


def test_implementation_restored_after_an_exception():
    family = FAMILIES["vit"]
    model = family.build()
    pixels, _ = example_inputs(family)
    before = dict(AttentionInterface._global_mapping)
    with pytest.raises(ValueError, match="out of range"):  # only known inside the forward pass for pixels
        AttentionWeights(model).attribute(pixels, query_positions=[10_000])
    assert dict(AttentionInterface._global_mapping) == before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layers": [2]}, "layer 2 is out of range: the model has 2 layers"),
        ({"layers": [-3]}, "layer -3 is out of range"),
        ({"heads": [4]}, "head 4 is out of range: the model has 4 heads"),
        ({"layers": []}, "layer selection is empty"),
        ({"heads": [1, 1]}, "names a head twice"),
        ({"metric": "both"}, "Unknown metric 'both'; choose one of attention"),
        ({"metric": "attention"}, "ContributionWeights computes contribution weights: metric must be one of "
                                  "cw_intra, cw_inter"),
    ],
)
def test_bad_selection(llama, kwargs, message):
    model, _, _ = llama
    with pytest.raises(ValueError, match=message):
        ContributionWeights(model, **kwargs)


def test_bad_inputs(llama):
    model, ids, mask = llama
    attributor = ContributionWeights(model)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        attributor.attribute(ids, attention_mask=mask[:, :-1])
    with pytest.raises(ValueError, match="out of range for a sequence of 9 tokens"):
        attributor.attribute(ids, query_positions=[9])
    with pytest.raises(ValueError, match="query_positions is empty"):
        attributor.attribute(ids, query_positions=[])
    with pytest.raises(ValueError, match="without 'input_ids'"):
        attributor.attribute({"tokens": ids})


def test_model_without_attention_modules():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="Sequential module without a transformers config"):  # named, not dumped
        ContributionWeights(model)


def test_registered_class_missing_from_model(llama):
    model, _, _ = llama
    registered = registered_architectures()["llama"]
    register_architecture("llama", Architecture("RenamedAttention", "o_proj"))
    try:
        with pytest.raises(ValueError, match="no attention module of class 'RenamedAttention'"):
            ContributionWeights(model)
    finally:
        register_architecture("llama", registered)  # whatever it was, for the tests that follow in any order
