"""What a Captum user tries first (porting a LayerIntegratedGradients script) gets one line that says what to do
instead: Captum's keyword arguments, a forward function or a layer module in place of the model, noise on token
ids, token scores summed away, and a pickled checkpoint that could run code."""

import os
import re

import pytest
import torch
import transformers
from captum.attr import NoiseTunnel
from captum.metrics import sensitivity_max

from captum_cw import (
    AttentionWeights,
    ContributionWeights,
    OutputNormalizedAttention,
    TokenContributions,
    ValueWeightedAttention,
)
from captum_cw.attribution import MetricAttribution
from captum_cw.errors import InputError, UnsupportedArgumentError
from captum_cw.llm import LLMContributionAttribution
from captum_cw.models import load_model
from captum_cw.views import text_records
from tiny_models import FAMILIES


@pytest.fixture(scope="module")
def llama():
    return FAMILIES["llama"].build()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))


def _one_line_without_module_dump(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and "in_features" not in message and len(message) < 400, message
    return message


# -------------------------------------------------------------------------------- Captum's keyword arguments

# argument -> a phrase of what the message must say instead of "unexpected keyword argument"
CAPTUM_KEYWORDS = {
    "baselines": "need no baseline",
    "n_steps": "no path integral",
    "internal_batch_size": "chunk_size=",
    "method": "no integral to approximate",
    "target": "query_positions=",
    "feature_mask": "its own score",
    "attribute_to_layer_input": "layers are chosen by index",
}


@pytest.mark.parametrize("argument", CAPTUM_KEYWORDS)
@pytest.mark.parametrize("attributor", [ContributionWeights, AttentionWeights, ValueWeightedAttention])
def test_captum_keywords_of_attribute_say_what_to_do_instead(llama, ids, attributor, argument):
    with pytest.raises(UnsupportedArgumentError) as error:
        attributor(llama).attribute(ids, **{argument: 1})
    assert isinstance(error.value, TypeError)  # what Python raises for a keyword a function does not take
    message = _one_line_without_module_dump(error)
    assert message.startswith(f"{attributor.__name__}.attribute does not take {argument}=")
    assert CAPTUM_KEYWORDS[argument] in message


def test_an_unknown_keyword_is_named_with_what_attribute_takes(llama, ids):
    with pytest.raises(UnsupportedArgumentError, match="unexpected keyword argument 'query_position'; it takes "
                                                       "inputs, attention_mask, .*query_positions"):
        ContributionWeights(llama).attribute(ids, query_position=[-1])


def test_captum_keywords_of_the_constructors_say_what_to_do_instead(llama):
    with pytest.raises(UnsupportedArgumentError, match="does not take multiply_by_inputs=.*not gradients"):
        ContributionWeights(llama, multiply_by_inputs=False)
    with pytest.raises(UnsupportedArgumentError, match="does not take device_ids="):
        AttentionWeights(llama, device_ids=[0])
    with pytest.raises(UnsupportedArgumentError, match="LLMContributionAttribution does not take attr_target="):
        LLMContributionAttribution(llama, None, attr_target="log_prob")


def test_the_text_front_end_refuses_captum_keywords_before_any_work(llama):
    explainer = LLMContributionAttribution(llama, None)  # no tokenizer: nothing may be tokenized before the check
    with pytest.raises(UnsupportedArgumentError, match=r"LLMContributionAttribution.attribute does not take "
                                                       r"n_steps=.*no path integral"):
        explainer.attribute("a prompt", " a target", n_steps=50)
    with pytest.raises(UnsupportedArgumentError, match="does not take use_cached_outputs="):
        explainer.attribute("a prompt", " a target", use_cached_outputs=False)


@pytest.mark.parametrize("attributor", [ValueWeightedAttention, OutputNormalizedAttention])
def test_a_delta_where_there_is_no_identity_is_an_unsupported_argument(llama, ids, attributor):
    with pytest.raises(UnsupportedArgumentError, match="no completeness identity"):
        attributor(llama).attribute(ids, return_convergence_delta=True)
    scores, delta = ContributionWeights(llama).attribute(ids, return_convergence_delta=True)  # where there is one
    assert scores.shape == (2, 2, 6, 6) and float(delta.max()) < 1e-4


def test_the_typed_arguments_still_work_beside_the_refused_ones(llama, ids):
    cw = ContributionWeights(llama, layers=[-1])
    scores = cw.attribute(ids, query_positions=[-1], per_head=True)
    assert scores.shape == (2, 1, 4, 1, 6)
    assert cw.attribute.__wrapped__(cw, ids, query_positions=[-1]).shape == (2, 1, 1, 6)  # captum's wrappers


# ------------------------------------------------------------------------- the model, not a function or a layer


def _forward_functions(model):
    return {"lambda": lambda x: model(x).logits, "bound forward": model.forward}


@pytest.mark.parametrize("kind", ["lambda", "bound forward"])
@pytest.mark.parametrize("owner", [ContributionWeights, AttentionWeights, ValueWeightedAttention,
                                   lambda f: MetricAttribution(f, "cw_inter"),
                                   lambda f: LLMContributionAttribution(f, None)])
def test_a_forward_function_in_place_of_the_model_is_named(llama, kind, owner):
    with pytest.raises(UnsupportedArgumentError) as error:  # was: AttributeError 'function' has no 'modules'
        owner(_forward_functions(llama)[kind])
    message = _one_line_without_module_dump(error)
    assert "not a forward function" in message and "attention modules" in message
    if kind == "bound forward":
        assert "pass the LlamaForCausalLM itself" in message


def test_a_captum_attribution_in_place_of_the_model_is_named(llama):
    from captum.attr import FeatureAblation

    with pytest.raises(UnsupportedArgumentError, match="model is a captum FeatureAblation: pass the transformers "
                                                       "model itself"):
        LLMContributionAttribution(FeatureAblation(llama), None)  # captum's LLMAttribution(FeatureAblation(...))


@pytest.mark.parametrize("owner", [ContributionWeights, AttentionWeights,
                                   lambda model: LLMContributionAttribution(model, None)])
def test_a_layer_module_in_place_of_the_model_is_named_by_its_class_only(llama, owner):
    layer = llama.model.layers[1]
    with pytest.raises(UnsupportedArgumentError) as error:  # was: accepted, failing later inside the layer
        owner(layer)
    message = _one_line_without_module_dump(error)
    assert "model is a LlamaDecoderLayer module without a transformers config" in message


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("which", [0, 1])
def test_a_layer_module_as_layers_names_its_index(family, which):
    model = FAMILIES[family].build()
    blocks = model.model.layers if family == "llama" else model.encoder.layer
    attention = blocks[which].self_attn if family == "llama" else blocks[which].attention
    for module in (blocks[which], attention):  # the decoder layer, or the attention module inside it
        with pytest.raises(UnsupportedArgumentError) as error:  # was: a ValueError printing the whole module
            ContributionWeights(model, module)  # LayerIntegratedGradients(model, layer), ported
        message = _one_line_without_module_dump(error)
        assert f"layers holds a {type(module).__name__} module" in message
        assert f"pass layers=[{which}]" in message


def test_a_module_list_as_layers_names_each_index(llama):
    with pytest.raises(UnsupportedArgumentError, match=r"pass layers=\[1\] "):
        ContributionWeights(llama, llama.model.layers[1:])  # a ModuleList slice
    with pytest.raises(UnsupportedArgumentError, match=r"pass layers=\[0, 1\] "):
        ContributionWeights(llama, list(llama.model.layers))


def test_a_module_as_heads_is_refused_in_one_line(llama):
    with pytest.raises(UnsupportedArgumentError) as error:
        ContributionWeights(llama, heads=llama.model.layers[0].self_attn)
    assert "pass heads as indices" in _one_line_without_module_dump(error)


# ------------------------------------------------------------------------- noise: pixels yes, token ids no


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_noise_tunnel_and_sensitivity_on_token_ids_say_why_they_cannot_work(family):
    model = FAMILIES[family].build()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    cw = ContributionWeights(model)
    explain = {
        "NoiseTunnel": lambda: NoiseTunnel(cw).attribute(ids, nt_type="smoothgrad", nt_samples=2, stdevs=0.1),
        "sensitivity_max": lambda: sensitivity_max(cw.attribute, ids, n_perturb_samples=2),
    }
    for run in explain.values():
        with pytest.raises(InputError) as error:  # was: "pass the tokenizer's input_ids" (they were passed)
            run()
        message = _one_line_without_module_dump(error)
        assert "Noise on token ids has no meaning" in message and "pixel inputs of a vision model" in message


def test_noise_tunnel_and_sensitivity_work_on_the_pixels_of_a_vit():
    model = FAMILIES["vit"].build()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    for attributor in (ContributionWeights(model), TokenContributions(model)):
        plain = attributor.attribute(pixels)
        # without noise, the tunnel's mean over samples is the plain attribution (computed without the tunnel)
        still = NoiseTunnel(attributor).attribute(pixels, nt_type="smoothgrad", nt_samples=3, stdevs=0.0)
        torch.testing.assert_close(still, plain)
        noisy = NoiseTunnel(attributor).attribute(pixels, nt_type="smoothgrad", nt_samples=3, stdevs=0.5)
        assert noisy.shape == plain.shape and noisy.isfinite().all() and not torch.equal(noisy, plain)
        sensitivity = sensitivity_max(attributor.attribute, pixels, n_perturb_samples=2)
        assert sensitivity.shape == (2,) and (sensitivity >= 0).all() and sensitivity.isfinite().all()


# --------------------------------------------------------------------- TokenContributions (token_contributions.py)


def test_token_contributions_names_itself_for_a_forward_function(llama):
    with pytest.raises(UnsupportedArgumentError, match="^TokenContributions: model is"):
        TokenContributions(lambda x: llama(x).logits)


def test_token_contributions_refuses_captum_keywords(llama, ids):
    with pytest.raises(UnsupportedArgumentError, match="TokenContributions.attribute does not take baselines="):
        TokenContributions(llama).attribute(ids, baselines=ids * 0)
    with pytest.raises(UnsupportedArgumentError, match="does not take return_convergence_delta=.*no completeness"):
        TokenContributions(llama).attribute(ids, return_convergence_delta=True)


def test_token_contributions_says_why_noise_on_ids_cannot_work(llama, ids):
    with pytest.raises(InputError, match="Noise on token ids has no meaning"):
        NoiseTunnel(TokenContributions(llama)).attribute(ids, nt_type="smoothgrad", nt_samples=2, stdevs=0.1)


# ------------------------------------------------------------- token scores summed away: (batch,) for (batch, n)

TOKENS = ["The", " capital", " of", " France", " is"]


@pytest.mark.parametrize("tokens", [TOKENS, [TOKENS, TOKENS]], ids=["shared tokens", "tokens per row"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_scores_summed_over_the_tokens_are_refused_with_the_shapes(tokens, keepdim):
    scores = torch.rand(2, 5, generator=torch.Generator().manual_seed(0))  # (batch, n) as TokenContributions
    summed = scores.sum(dim=-1, keepdim=keepdim)  # Captum's idiom for (batch, n, d) embeddings attributions
    shown = "(2, 1)" if keepdim else "(2,)"
    with pytest.raises(InputError, match=rf"got {re.escape(shown)}, expected \(2, 5\).*: do not sum over tokens"):
        text_records(summed, tokens)


def test_the_shapes_text_records_takes_still_give_one_record_per_row(llama, ids):
    scores = TokenContributions(llama).attribute(ids)  # (2, 6)
    tokens = [f"t{j}" for j in range(6)]
    assert [list(record.word_attributions.shape) for record in text_records(scores, tokens)] == [[6], [6]]
    assert len(text_records(scores[0], tokens)) == 1  # one row (n,)
    assert len(text_records(scores, [tokens, tokens])) == 2
    assert len(text_records(torch.tensor([0.5]), ["only"])) == 1  # one token, one score: not a summed batch


# ------------------------------------------------------------------------------ a pickle that could run code


def _folder_with_a_malicious_pickle(folder, marker):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]",
                                         pad_token="[UNK]").save_pretrained(folder)
    (folder / "model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"model.embed_tokens.weight": Payload()}, folder / "pytorch_model.bin")


def test_a_malicious_pickle_is_refused_in_one_line_and_the_command_exits_2(tmp_path, capsys):
    from captum_cw import cli

    folder, marker = tmp_path / "model", tmp_path / "ran"
    _folder_with_a_malicious_pickle(folder, marker)
    with pytest.raises(InputError) as error:  # was: torch's UnpicklingError, advising weights_only=False
        load_model(str(folder))
    message = _one_line_without_module_dump(error)
    assert re.match(rf"refused to unpickle pytorch_model.bin of {re.escape(str(folder))} \(it imports \w+\.system\)",
                    message)
    assert "convert it to safetensors" in message.lower() and not marker.exists()
    with pytest.raises(SystemExit) as exit_status:
        cli.main(["attribute", "a a", "--model", str(folder)])
    assert exit_status.value.code == 2 and not marker.exists()
    assert "refused to unpickle" in capsys.readouterr().err
