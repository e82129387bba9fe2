"""TokenContributions against a float64 brute force: input-shaped, batched, padding-exact, per-example positions."""

import pytest
import torch
import transformers
from captum.attr import NoiseTunnel
from captum.metrics import infidelity, sensitivity_max

from captum_cw import TokenContributions
from captum_cw.layer_aggregation import rollout
from reference import reference_metrics
from tiny_models import FAMILIES, example_inputs


def _brute_force(family, model, ids, mask, positions, aggregation, metric="cw_inter", layers=(0, 1)):
    r"""Scores of each example's key tokens for its position, from the float64 reference, written out."""
    per_head = reference_metrics(family, model, ids, mask)[metric]  # [batch, layer, head, n, n]
    token_level = per_head.sum(2) if metric == "cw_inter" else per_head.mean(2)  # [batch, layer, n, n]
    token_level = token_level[:, list(layers)]
    n = token_level.shape[-1]
    result = torch.zeros(len(positions), n, dtype=torch.float64)
    for b, position in enumerate(positions):
        if aggregation == "last":
            result[b] = token_level[b, layers.index(max(layers)), position]
        elif aggregation == "mean":
            result[b] = token_level[b, :, position].mean(0)
        elif aggregation == "magnitude":
            result[b] = token_level[b, :, position].abs().mean(0)
        else:  # rollout: R = prod over layers (first applied first) of (A + I) / 2
            product = torch.eye(n, dtype=torch.float64)
            for layer in sorted(range(len(layers)), key=lambda k: layers[k]):
                product = (token_level[b, layer] + torch.eye(n, dtype=torch.float64)) / 2 @ product
            result[b] = product[position]
    return result


def _right_padded_llama():
    family = FAMILIES["llama"]
    ids, _ = example_inputs(family)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    return family, family.build(), ids, mask


@pytest.mark.parametrize("aggregation", ["last", "mean", "magnitude", "rollout"])
@pytest.mark.parametrize("setup", ["llama_left", "llama_right", "bert_right"])
def test_default_positions_match_the_brute_force(setup, aggregation):
    if setup == "llama_right":
        family, model, ids, mask = _right_padded_llama()
    else:
        family = FAMILIES[setup.split("_")[0]]
        model = family.build()
        ids, mask = example_inputs(family)
    scores = TokenContributions(model, layer_aggregation=aggregation).attribute(ids, attention_mask=mask)
    real = mask.bool()
    if family.kind == "decoder":  # the last real token of each example
        positions = [int(row.nonzero().max()) for row in real]
    else:  # the first token
        positions = [int(row.nonzero().min()) for row in real]
    expected = _brute_force(family, model, ids, mask, positions, aggregation)
    assert scores.shape == ids.shape and scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), expected, rtol=1e-4, atol=1e-5)
    assert (scores[~real] == 0).all()


@pytest.mark.parametrize("aggregation", ["mean", "rollout"])
def test_every_row_equals_its_unpadded_run(aggregation):
    family, model, ids, mask = _right_padded_llama()
    explainer = TokenContributions(model, layer_aggregation=aggregation)
    batched = explainer.attribute(ids, attention_mask=mask, position=[-2, -1])
    for b in range(2):
        real = mask[b].bool()
        alone = explainer.attribute(ids[b][real][None], position=-2 if b == 0 else -1)
        torch.testing.assert_close(batched[b][real], alone[0], rtol=1e-5, atol=1e-6)


def test_positions_per_example_and_from_the_end():
    family, model, ids, mask = _right_padded_llama()
    explainer = TokenContributions(model, metric="attention", layers=[1], layer_aggregation="last")
    scores = explainer.attribute(ids, attention_mask=mask, position=torch.tensor([3, -2]))
    expected = _brute_force(family, model, ids, mask, [3, 3], "last", metric="attention", layers=(1,))
    torch.testing.assert_close(scores.double(), expected, rtol=1e-4, atol=1e-5)  # -2 is token 3 of a 5-token row
    torch.testing.assert_close(explainer.attribute(ids, attention_mask=mask, position=3), scores)
    assert TokenContributions(model, position=3).position == 3


@pytest.mark.parametrize("position, message", [
    (9, "position 9 of example 0 is not one of its real tokens"),
    ([0, 6], "position 6 of example 1 is not one of its real tokens"),  # a padded token
    (-6, "position -6 of example 1"),
    (0.5, "position must be an int"),
    ([0, 1, 2], r"one position per example \(2,\)"),
])
def test_bad_positions(position, message):
    _, model, ids, mask = _right_padded_llama()
    with pytest.raises(ValueError, match=message):
        TokenContributions(model).attribute(ids, attention_mask=mask, position=position)


def test_a_target_under_right_padding_equals_each_unpadded_run():
    _, model, ids, mask = _right_padded_llama()
    scores = TokenContributions(model).attribute(ids, target=[1, 2], attention_mask=mask)
    for b, target in enumerate([1, 2]):
        real = mask[b].bool()
        alone = TokenContributions(model).attribute(ids[b, real][None], target=target)
        torch.testing.assert_close(scores[b, real], alone[0], atol=1e-6, rtol=1e-4)
        assert bool((scores[b, ~real] == 0).all())


def test_tuple_inputs_give_a_tuple_and_bad_options_are_refused():
    _, model, ids, mask = _right_padded_llama()
    (scores,) = TokenContributions(model).attribute((ids,), attention_mask=mask)
    torch.testing.assert_close(scores, TokenContributions(model).attribute(ids, attention_mask=mask))
    with pytest.raises(ValueError, match="tuple of 2 tensors"):
        TokenContributions(model).attribute((ids, mask))
    with pytest.raises(ValueError, match="layer_aggregation must be one of"):
        TokenContributions(model, layer_aggregation="max")
    with pytest.raises(ValueError, match="Unknown metric"):
        TokenContributions(model, metric="gradient")


def test_rollout_keeps_signed_rows_summing_to_one():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    scores = scores - scores.mean(-1, keepdim=True) + 1 / 5  # signed rows that sum to 1
    result = rollout(scores)
    torch.testing.assert_close(result.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    expected = torch.eye(5, dtype=torch.float64)
    for layer in range(3):
        expected = 0.5 * (scores[1, layer] + torch.eye(5, dtype=torch.float64)) @ expected
    torch.testing.assert_close(result[1], expected)


@pytest.fixture(scope="module")
def vit():
    family = FAMILIES["vit"]
    model = family.build()
    return family, model, example_inputs(family)[0]


def test_pixel_inputs_get_their_patch_score(vit):
    family, model, pixels = vit
    scores = TokenContributions(model, layer_aggregation="last").attribute(pixels)
    assert scores.shape == pixels.shape
    expected = _brute_force(family, model, pixels, None, [0, 0], "last")  # [batch, 17]: class token + 4x4 patches
    patch = model.config.patch_size
    for row in range(4):
        for col in range(4):
            block = scores[:, :, row * patch:(row + 1) * patch, col * patch:(col + 1) * patch]
            torch.testing.assert_close(block.double(), expected[:, 1 + row * 4 + col, None, None, None]
                                       .expand_as(block), rtol=1e-4, atol=1e-5)


def test_captum_wrappers_on_a_vision_transformer(vit):
    _, model, pixels = vit
    explainer = TokenContributions(model)
    smoothed = NoiseTunnel(explainer).attribute(pixels, nt_samples=3, stdevs=0.05, nt_type="smoothgrad")
    assert smoothed.shape == pixels.shape and torch.isfinite(smoothed).all()
    attributions = explainer.attribute(pixels)

    def class_token_output(inputs):
        return model(inputs).last_hidden_state[:, 0].sum(-1)

    def perturb(inputs):
        noise = torch.randn_like(inputs) * 0.01
        return noise, inputs - noise

    assert torch.isfinite(infidelity(class_token_output, perturb, pixels, attributions, n_perturb_samples=4)).all()
    assert torch.isfinite(sensitivity_max(explainer.attribute, pixels, n_perturb_samples=2)).all()


def test_an_encoder_classifier_explains_its_cls_token():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=3)
    model = transformers.BertForSequenceClassification(config).eval()
    ids, mask = example_inputs(FAMILIES["bert"])
    scores = TokenContributions(model, layers=[-1], layer_aggregation="last").attribute(ids, attention_mask=mask)
    assert scores.shape == ids.shape and (scores[~mask.bool()] == 0).all()
    torch.testing.assert_close(scores.sum(-1), torch.ones(2))  # the [CLS] row of inter-head CW sums to 1
