"""Setups that used to return wrong numbers or a bare traceback are refused before any work, with a
captum_cw error that says what to do instead (issue #27)."""

import re
import warnings

import pytest
import torch
import transformers
from torch import nn
from transformers import DynamicCache

from captum_cw import (
    Architecture,
    AttentionWeights,
    ContributionWeights,
    TokenContributions,
    attribute_metrics,
    find_attention_layers,
    register_architecture,
)
from captum_cw.architectures import _ANNOUNCED, _ARCHITECTURES
from captum_cw.errors import InputError, UnsupportedArchitectureError, UnsupportedSetupError
from captum_cw.sinks import analyze_sinks, sink_norm_effect
from reference import reference_metrics
from tiny_models import FAMILIES, UNREGISTERED, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    return family.build(), *example_inputs(family)


@pytest.fixture(scope="module")
def bert():
    family = FAMILIES["bert"]  # right padded: example 1's real tokens are positions 0..5 of 9
    model = family.build()
    ids, mask = example_inputs(family)
    return model, ids, mask, reference_metrics(family, model, ids, mask)


def _quietly(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


# case 1: cached keys in any form


def _prefix_cache(model, ids):
    with torch.no_grad():
        return model(ids[:, :4], use_cache=True).past_key_values  # a DynamicCache of 4 positions


@pytest.mark.parametrize("how", ["cache=", "past_key_value=", "positional", "inputs dict"])
def test_a_cache_in_any_form_is_refused(llama, how):
    model, ids, _ = llama
    cache = _prefix_cache(model, ids)
    continuation = ids[:, 4:]
    attributor = ContributionWeights(model)
    call = {
        "cache=": lambda: attributor.attribute(continuation, additional_forward_args={"cache": cache}),
        "past_key_value=": lambda: attributor.attribute(continuation,
                                                        additional_forward_args={"past_key_value": cache}),
        # LlamaForCausalLM.forward(input_ids, attention_mask, position_ids, cache, ...)
        "positional": lambda: attributor.attribute(continuation, additional_forward_args=(None, None, cache)),
        "inputs dict": lambda: attributor.attribute({"input_ids": continuation, "cache": cache}),
    }[how]
    with pytest.raises(UnsupportedSetupError, match="Pass the whole sequence"):
        call()


def test_an_empty_cache_object_is_refused_too(llama):
    model, ids, _ = llama
    with pytest.raises(UnsupportedSetupError, match="DynamicCache is not supported"):
        ContributionWeights(model).attribute(ids, additional_forward_args={"use_cache": True, "x": DynamicCache()})


# case 3: one attention module applied several times (ALBERT)


def test_shared_layers_are_refused():
    torch.manual_seed(0)
    config = transformers.AlbertConfig(vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                       num_attention_heads=4, intermediate_size=64)
    model = transformers.AlbertModel(config, add_pooling_layer=False).eval()
    attributor = _quietly(lambda: ContributionWeights(model))
    assert len(attributor.attention_layers) == 1  # one module, run 3 times
    with pytest.raises(UnsupportedSetupError, match=r"'albert'.*ran more than once.*shared layers \(ALBERT\)"):
        attributor.attribute(torch.arange(3, 10)[None])


# case 6: a query position on padding


def test_a_query_position_on_padding_is_refused(bert):
    model, ids, mask, _ = bert
    positions = [2, 7]
    message = "query position 7 is padding in example 1 \\(whose real tokens are positions 0 to 5\\)"
    with pytest.raises(InputError, match=message):
        ContributionWeights(model).attribute(ids, attention_mask=mask, query_positions=positions)
    with pytest.raises(InputError, match=message):
        ContributionWeights(model).attribute_factors(ids, attention_mask=mask, query_positions=positions)
    with pytest.raises(InputError, match=message):
        attribute_metrics(model, ids, ["attention"], attention_mask=mask, query_positions=positions)


def test_left_padding_refuses_the_first_position_and_keeps_the_last(llama):
    model, ids, mask = llama  # example 1 is left padded: real tokens 3..8
    with pytest.raises(InputError, match="query position 0 is padding in example 1 .*positions 3 to 8"):
        ContributionWeights(model).attribute(ids, attention_mask=mask, query_positions=[0])
    scores = ContributionWeights(model).attribute(ids, attention_mask=mask, query_positions=[-1])
    assert scores.shape == (2, 2, 1, 9)


def test_a_negative_query_position_counts_back_from_each_examples_last_real_token(bert):
    model, ids, mask, reference = bert  # right padded: the last real tokens are 8 and 5
    scores, delta = ContributionWeights(model).attribute(ids, attention_mask=mask, query_positions=[-2, -1],
                                                         return_convergence_delta=True)
    expected = reference["cw_inter"].sum(2)  # [batch, layer, n, n]
    own_rows = torch.stack([expected[0][:, [7, 8]], expected[1][:, [4, 5]]])
    torch.testing.assert_close(scores, own_rows.float(), rtol=1e-5, atol=1e-6)
    assert float(delta.max()) < 1e-5
    factors = ContributionWeights(model).attribute_factors(ids, attention_mask=mask, query_positions=[-1])
    torch.testing.assert_close(factors.attention.sum(2)[1, :, 0], reference["attention"][1, :, :, 5].sum(1).float()
                               , rtol=1e-5, atol=1e-6)


def test_per_example_positions_still_pick_each_examples_own_row(bert):
    model, ids, mask, reference = bert  # the last real tokens are 8 and 5: row 8 is padding in example 1
    scores = TokenContributions(model, layer_aggregation="last", position=-1).attribute(ids, attention_mask=mask)
    last = reference["cw_inter"][:, -1].sum(1)  # [batch, n, n]
    torch.testing.assert_close(scores, torch.stack([last[0, 8], last[1, 5]]).float(), rtol=1e-5, atol=1e-6)


# case 7: a batch where the sink analysis takes one sequence


def test_the_sink_analysis_refuses_a_batch(llama):
    model, ids, _ = llama
    with pytest.raises(InputError, match=r"analyze_sinks takes one sequence.*got shape \(2, 9\).*loop over the batch"):
        analyze_sinks(model, ids)
    with pytest.raises(InputError, match=r"sink_norm_effect takes one sequence.*\(2, 9\)"):
        sink_norm_effect(model, ids)
    assert analyze_sinks(model, ids[:1]).received.shape == (2, 9)


# cases 8 and 9: encoder-decoder models


def _t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)).eval()


def _bart():
    torch.manual_seed(0)
    return transformers.BartModel(transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)).eval()


def _whisper():
    torch.manual_seed(0)
    return transformers.WhisperModel(transformers.WhisperConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1)).eval()


@pytest.mark.parametrize("build", [_t5, _bart, _whisper], ids=["t5", "bart", "whisper"])
def test_encoder_decoder_models_are_refused(build):
    model = build()
    with pytest.raises(UnsupportedArchitectureError, match="encoder-decoder models are not supported: attribute "
                                                           r"the encoder alone \(model.get_encoder\(\)"):
        _quietly(lambda: find_attention_layers(model))


@pytest.mark.parametrize("build", [_t5, _bart], ids=["t5", "bart"])
def test_the_encoder_alone_matches_its_own_attention_weights(build, bert):
    _, ids, mask, _ = bert  # right padded
    encoder = build().get_encoder()
    encoder.set_attn_implementation("eager")
    scores, delta = _quietly(lambda: AttentionWeights(encoder)).attribute(ids, attention_mask=mask, per_head=True,
                                                                          return_convergence_delta=True)
    with torch.no_grad():
        own = torch.stack(encoder(ids, attention_mask=mask, output_attentions=True).attentions, 1)
    real = mask.bool()
    own = own * (real[:, None, None, :, None] & real[:, None, None, None, :])  # padded rows and keys are 0
    torch.testing.assert_close(scores, own, rtol=1e-5, atol=1e-6)
    assert (delta < 1e-5).all()


# case 10: the attention mask in additional_forward_args


@pytest.mark.parametrize("how", ["dict", "positional"])
def test_an_attention_mask_in_additional_forward_args_is_the_mask(bert, how):
    model, ids, mask, reference = bert
    extra = {"attention_mask": mask} if how == "dict" else (mask,)  # BertModel.forward(input_ids, attention_mask)
    scores = ContributionWeights(model, metric="cw_intra").attribute(ids, additional_forward_args=extra, per_head=True)
    torch.testing.assert_close(scores, reference["cw_intra"].float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["dict", "positional"])
def test_token_contributions_read_a_mask_in_additional_forward_args(how):
    family = FAMILIES["llama"]
    model = family.build()
    ids, _ = example_inputs(family)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # right padded: example 1's last real token is position 5
    reference = reference_metrics(family, model, ids, mask)["cw_inter"][:, -1].sum(1)  # [batch, n, n]
    expected = torch.stack([reference[0, 8], reference[1, 5]]).float()
    extra = {"attention_mask": mask} if how == "dict" else (mask,)  # LlamaForCausalLM.forward(input_ids, mask)
    scores = TokenContributions(model, layer_aggregation="last").attribute(ids, additional_forward_args=extra)
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6)


def test_two_different_attention_masks_are_refused(bert):
    model, ids, mask, _ = bert
    with pytest.raises(InputError, match="two different attention masks"):
        ContributionWeights(model).attribute(ids, attention_mask=torch.ones_like(mask),
                                             additional_forward_args={"attention_mask": mask})
    ContributionWeights(model).attribute(ids, attention_mask=mask, additional_forward_args=(mask,))  # the same


# bare tracebacks that are now one captum_cw error


@pytest.mark.parametrize("positions", ["1", ["1"], [None]])
def test_query_positions_that_are_not_numbers(llama, positions):
    model, ids, _ = llama
    with pytest.raises(InputError, match="query_positions must be int"):
        ContributionWeights(model).attribute(ids, query_positions=positions)


def test_a_misspelt_output_projection_names_the_path_and_the_children(llama):
    model, _, _ = llama
    original = _ARCHITECTURES["llama"]
    register_architecture("llama", Architecture("LlamaAttention", "o_prj"))
    try:
        with pytest.raises(UnsupportedArchitectureError, match=r"'o_prj' registered for 'llama' is not a submodule "
                                                               r"of LlamaAttention \(its children: q_proj, k_proj, "
                                                               r"v_proj, o_proj\)"):
            ContributionWeights(model)
    finally:
        register_architecture("llama", original)


@pytest.mark.parametrize("shape", [(3, 16, 16), (1, 2, 3, 16, 16), (2, 1, 16, 16)])
def test_pixel_values_of_the_wrong_shape(shape):
    model = FAMILIES["vit"].build()
    with pytest.raises(InputError, match=r"pixel values must have shape \(batch, 3, height, width\)"):
        ContributionWeights(model).attribute(torch.zeros(shape))
    with pytest.raises(InputError, match="pixel values must have shape"):
        TokenContributions(model).attribute(torch.zeros(shape))


def test_three_dimensional_token_ids(llama):
    model, ids, mask = llama
    with pytest.raises(InputError, match=r"token ids must have shape \(batch, n\)"):
        TokenContributions(model).attribute(ids[None], attention_mask=mask[None])


class _Wrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids, attention_mask=attention_mask)


def test_the_discovery_warnings_suggestion_silences_it_for_a_wrapper():
    wrapper = _Wrapper(UNREGISTERED["starcoder2"].build())
    _ANNOUNCED.discard("starcoder2")
    try:
        with pytest.warns(UserWarning, match="captum_cw: discovered") as record:
            find_attention_layers(wrapper)
        suggestion = re.search(r"register_architecture\(.*?\)\)", str(record[0].message)).group(0)
        eval(suggestion, {"register_architecture": register_architecture, "Architecture": Architecture})
        _ANNOUNCED.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            attributor = ContributionWeights(wrapper)
        assert not any(layer.discovered for layer in attributor.attention_layers)
    finally:
        _ARCHITECTURES.pop("starcoder2", None)


def test_a_wrapper_around_a_registered_model_is_not_discovered(llama):
    model, _, _ = llama
    _ANNOUNCED.discard("_Wrapper")  # the wrapper's class name, which the lookup used to fall back to
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layers = find_attention_layers(_Wrapper(model))
    assert [layer.attention for layer in layers] == [layer.self_attn for layer in model.model.layers]
