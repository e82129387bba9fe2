"""Families outside the registry are discovered from the model's structure; the self-check vouches for them."""

import warnings

import pytest
import torch
import transformers

from captum_cw import Architecture, AttentionWeights, ContributionWeights, find_attention_layers, register_architecture
from captum_cw.architectures import _ANNOUNCED, _ARCHITECTURES, _discover
from reference import reference_metrics
from tiny_models import FAMILIES, UNREGISTERED, example_inputs


def assert_matches(actual, expected):
    expected = expected.float()
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6 * max(scale, 1.0))


def _find_quietly(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return find_attention_layers(model)


def _t5_encoder():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return transformers.T5EncoderModel(config).eval()


def test_unregistered_families_are_not_in_the_registry():
    assert not set(UNREGISTERED) & set(_ARCHITECTURES)
    assert "t5" not in _ARCHITECTURES


@pytest.mark.parametrize("name", sorted(UNREGISTERED))
def test_discovered_family_matches_brute_force(name):
    family = UNREGISTERED[name]
    model = family.build()
    inputs, mask = example_inputs(family)
    reference = reference_metrics(family, model, inputs, mask)
    layers = _find_quietly(model)
    assert [type(layer.attention).__name__ for layer in layers] == [family.attention_class] * 2
    assert all(layer.discovered for layer in layers)
    for layer in layers:
        assert layer.output_projection is family.projection(model, layer.attention)
    for implementation in family.implementations:
        model.set_attn_implementation(implementation)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scores = ContributionWeights(model, metric="cw_intra").attribute(inputs, attention_mask=mask, per_head=True)
            factors = ContributionWeights(model).attribute_factors(inputs, attention_mask=mask)
        assert_matches(scores, reference["cw_intra"])
        assert_matches(factors.attention, reference["attention"])
        assert_matches(factors.relative_norm, reference["relative_norm_inter"])
        assert_matches(factors.cosine, reference["cosine_inter"])


def test_discovery_is_announced_once_per_model_type():
    model = UNREGISTERED["starcoder2"].build()
    _ANNOUNCED.discard("starcoder2")
    with pytest.warns(UserWarning) as record:
        ContributionWeights(model)
    messages = [str(warning.message) for warning in record if "captum_cw" in str(warning.message)]
    assert messages == [
        "captum_cw: discovered 2 attention layers of class Starcoder2Attention with output projection 'o_proj' "
        "for model_type 'starcoder2'; the self-check of each attribute() call (verify=True) vouches for them. "
        "register_architecture('starcoder2', Architecture('Starcoder2Attention', 'o_proj')) to silence this."
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ContributionWeights(model)


def test_sibling_projection_is_discovered():
    model = UNREGISTERED["xlm-roberta"].build()
    layers = _find_quietly(model)
    expected = [layer.attention.output.dense for layer in model.encoder.layer]
    assert [layer.output_projection for layer in layers] == expected


def test_registration_takes_precedence_over_discovery():
    family = UNREGISTERED["starcoder2"]
    model = family.build()
    ids, mask = example_inputs(family)
    register_architecture("starcoder2", Architecture("Starcoder2Attention", "o_proj"))
    _ANNOUNCED.discard("starcoder2")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            attributor = ContributionWeights(model)
        assert not any(layer.discovered for layer in attributor.attention_layers)
        scores, delta = attributor.attribute(ids, attention_mask=mask, return_convergence_delta=True)
        assert scores.shape == (2, 2, 9, 9) and (delta.abs() < 1e-5).all()
    finally:
        del _ARCHITECTURES["starcoder2"]


def test_position_bias_of_a_discovered_family_is_refused_by_the_self_check():
    # T5's relative position bias enters the scores beside the mask, so alpha recomputed from the queries,
    # keys and mask lacks it (in eager the kernel returns its own weights, bias included, and those are used)
    model = _t5_encoder()
    model.set_attn_implementation("sdpa")
    ids, mask = example_inputs(FAMILIES["bert"])
    layers = _find_quietly(model)
    assert [type(layer.attention).__name__ for layer in layers] == ["T5Attention"] * 2
    assert [layer.output_projection for layer in layers] == [layer.attention.o for layer in layers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attributor = AttentionWeights(model)
    with pytest.raises(ValueError, match="Self-check failed at layer 0: the recomputed attention"):
        attributor.attribute(ids, attention_mask=mask)


def test_cross_attention_is_left_out():
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, is_decoder=True, add_cross_attention=True)
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()
    layers = _find_quietly(model)
    assert [layer.attention for layer in layers] == [layer.attention.self for layer in model.encoder.layer]

    seq2seq = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4))
    decoder = seq2seq.get_decoder()  # the whole seq2seq model is refused (tests/test_silent_setups.py)
    layers = _find_quietly(decoder)  # the decoder's self-attention, not its EncDecAttention
    assert [layer.attention for layer in layers] == [block.layer[0].SelfAttention for block in decoder.block]


def test_family_outside_the_attention_interface():
    # Bloom still computes attention in its own module as of transformers 5.25 (which moved Falcon onto the interface)
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.BloomForCausalLM(config).eval()
    with pytest.raises(ValueError, match="Unsupported architecture 'bloom': its attention \\(BloomAttention\\) "
                                         "does not call transformers' attention interface.*not supported"):
        ContributionWeights(model)


def test_no_usual_projection_explains_registration():
    model = UNREGISTERED["starcoder2"].build()
    for layer in model.model.layers:
        layer.self_attn.add_module("proj_out", layer.self_attn.o_proj)
        del layer.self_attn.o_proj
    with pytest.raises(ValueError, match="found 2 attention modules of class Starcoder2Attention but no output "
                                         "projection.*register_architecture\\('starcoder2'"):
        ContributionWeights(model)


def test_several_attention_classes_are_not_guessed():
    model = torch.nn.ModuleDict({name: family.build() for name, family in UNREGISTERED.items()})
    with pytest.raises(ValueError, match="several classes \\(Starcoder2Attention, XLMRobertaSelfAttention\\).*"
                                         "register_architecture"):
        find_attention_layers(model)


def test_model_without_attention_explains_registration():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="model is a Sequential module without a transformers config"):
        ContributionWeights(model)  # not a transformers model at all: refused before discovery
    model.config = transformers.PretrainedConfig()
    model.config.model_type = "toy"
    with pytest.raises(ValueError, match="Unsupported architecture 'toy': captum_cw found no module that "
                                         "calls transformers' attention interface.*register_architecture"):
        ContributionWeights(model)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_discovery_agrees_with_the_registry(name):
    """Had the registered families not been registered, discovery would have found the same layers."""
    model = FAMILIES[name].build()
    registered = find_attention_layers(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        discovered = _discover(model, [name])
    assert [(layer.attention, layer.output_projection, layer.weight_layout) for layer in discovered] == [
        (layer.attention, layer.output_projection, layer.weight_layout) for layer in registered]
