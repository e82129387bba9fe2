"""Bad input is refused before any work, with a message that says how to fix it (issue #12, item 3)."""

import numpy as np
import pytest
import torch
import transformers
from transformers import DynamicCache

from captum_cw import Architecture, ContributionWeights, register_architecture
from captum_cw.architectures import _ARCHITECTURES
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    return family.build(), *example_inputs(family)


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.zeros(1, 0, dtype=torch.long), "no tokens"),
        (torch.tensor([[1, 2, 64]]), r"range over \[1, 64\] but the model's vocabulary has 64"),
        (torch.tensor([[-1, 2, 3]]), "vocabulary"),
        (torch.tensor([[1.0, 2.0, 3.0]]), "takes token ids"),
    ],
)
def test_bad_token_ids(llama, ids, message):
    model, _, _ = llama
    with pytest.raises(ValueError, match=message):
        ContributionWeights(model).attribute(ids)


def test_integer_pixels_on_a_vision_model():
    model = FAMILIES["vit"].build()
    with pytest.raises(ValueError, match="takes pixel values"):
        ContributionWeights(model).attribute(torch.zeros(1, 3, 16, 16, dtype=torch.long))


@pytest.mark.parametrize("positions", [[0.5], [True], torch.tensor([1.0])])
def test_float_or_bool_query_positions(llama, positions):
    model, ids, _ = llama
    with pytest.raises(ValueError, match="query_positions must be integer positions"):
        ContributionWeights(model).attribute(ids, query_positions=positions)


def test_past_key_values_are_refused(llama):
    model, ids, _ = llama
    with pytest.raises(ValueError, match="past_key_values is not supported"):
        ContributionWeights(model).attribute(ids, additional_forward_args={"past_key_values": DynamicCache()})


def test_training_mode_is_refused(llama):
    model, ids, _ = llama
    model.train()
    try:
        with pytest.raises(ValueError, match=r"training mode.*model.eval\(\)"):
            ContributionWeights(model).attribute(ids)
    finally:
        model.eval()


@pytest.mark.parametrize("chunk_size", [0, -1, 2.5, True, "8"])
def test_bad_chunk_size(llama, chunk_size):
    model, _, _ = llama
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        ContributionWeights(model, chunk_size=chunk_size)


@pytest.mark.parametrize("layers", [np.int64(1), np.array([0, 1]), torch.tensor([1]), torch.tensor(-1), (1,)])
def test_numpy_and_tensor_layer_indices_mean_what_ints_mean(llama, layers):
    model, ids, _ = llama
    expected = ContributionWeights(model, layers=np.asarray(layers).reshape(-1).tolist()).attribute(ids)
    torch.testing.assert_close(ContributionWeights(model, layers=layers).attribute(ids), expected, rtol=0, atol=0)


@pytest.mark.parametrize("layers, message", [
    ([0.0], "layer indices must be integers"), ([True], "layer indices must be integers"),
    (np.array([0.5]), "layer indices must be integers"), (5, "layer 5 is out of range: the model has 2 layers"),
    (-3, "layer -3 is out of range"),
])
def test_bad_layer_indices_are_never_wrapped(llama, layers, message):
    model, _, _ = llama
    with pytest.raises(ValueError, match=message):
        ContributionWeights(model, layers=layers)


def test_misspelt_weight_layout():
    with pytest.raises(ValueError, match="weight_layout must be 'linear'"):
        Architecture("LlamaAttention", "o_proj", weight_layout="Linear")


@pytest.mark.parametrize("family, layout", [("gpt2", "linear"), ("llama", "conv1d")])
def test_weight_layout_contradicting_the_projection_class(family, layout):
    model = FAMILIES[family].build()
    architecture = _ARCHITECTURES[model.config.model_type]
    register_architecture(model.config.model_type, Architecture(architecture.attention,
                                                                architecture.output_projection, layout))
    try:
        with pytest.raises(ValueError, match=f"but its Architecture says weight_layout='{layout}'"):
            ContributionWeights(model)
    finally:
        register_architecture(model.config.model_type, architecture)


def test_flex_attention_is_refused(llama):
    model, ids, _ = llama
    model.config._attn_implementation = "flex_attention"
    try:
        with pytest.raises(ValueError, match="flex_attention.*set_attn_implementation"):
            ContributionWeights(model).attribute(ids)
    finally:
        model.set_attn_implementation("sdpa")


def test_a_family_outside_the_attention_interface_says_so():
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.BloomForCausalLM(config).eval()
    register_architecture("bloom", Architecture("BloomAttention", "dense"))
    try:
        with pytest.raises(ValueError, match="does not call transformers' attention interface.*not supported"):
            ContributionWeights(model)
    finally:
        del _ARCHITECTURES["bloom"]


def test_empty_prompt_in_the_text_front_end():
    from captum_cw.llm import LLMContributionAttribution

    class NoBos:
        def __call__(self, text, **kwargs):
            return {"input_ids": torch.zeros(1, 0, dtype=torch.long)}

    model = FAMILIES["llama"].build()
    with pytest.raises(ValueError, match="the prompt is empty"):
        LLMContributionAttribution(model, NoBos()).attribute("", torch.tensor([3, 4]))
