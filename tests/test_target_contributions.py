"""Target-aware contributions against a float64 brute force, their completeness identity and their first-order
meaning (docs/DESIGN.md section 1, "Target-aware contributions").

The reference materialises ``vt[h, j] = v[h, j] W_O[h]`` for every head, reads ``alpha`` from the model's own eager
attention, and takes the target's gradient at each output projection's output by autograd, all in float64."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from captum_cw import TokenContributions
from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError
from captum_cw.interventions import scale_values
from captum_cw.scan import prepare_inputs
from captum_cw.target_contributions import target_scores
from tiny_models import FAMILIES, example_inputs

DECODERS = ["llama", "gemma3_text", "gpt2"]  # grouped heads; a post-attention norm; Conv1D with a bias


def reference(family_name: str, model, ids, target, position, rows: str, only_row: int | None = None,
              foil=None, **kwargs) -> torch.Tensor:
    r"""``(n_layers, n)``: ``sum_h alpha[h,i,j] <vt[h,j], g[i]>`` summed over the explained rows ``i`` (explained)
    or over every row (all), ``g`` the gradient of the targets' summed log-probability, from materialised vectors
    in float64 on one unpadded example; ``target`` and ``position`` are an int or equally long lists; with
    ``only_row`` the terms of that explained row alone; with ``foil`` (like ``target``) ``g`` is the gradient of
    the summed log-odds ``log p(target) - log p(foil)``."""
    family = FAMILIES[family_name]
    model = copy.deepcopy(model).double()
    model.set_attn_implementation("eager")
    attentions = [m for m in model.modules() if type(m).__name__ == family.attention_class]
    values, projected, hooks = [], [], []
    for attention in attentions:
        hooks.append(attention.get_submodule(family.value_path).register_forward_hook(
            lambda mod, args, out, a=attention: values.append(family.value_of(a, out))))
        hooks.append(family.projection(model, attention).register_forward_hook(
            lambda mod, args, out: projected.append(out)))
    output = model(ids, output_attentions=True, **kwargs)
    for hook in hooks:
        hook.remove()
    targets, positions = torch.tensor(target).reshape(-1), torch.tensor(position).reshape(-1)
    log_probs = output.logits[0, positions].log_softmax(-1)  # [t, vocab]
    objective = log_probs.gather(-1, targets[:, None]).sum()
    if foil is not None:
        objective = objective - log_probs.gather(-1, torch.tensor(foil).reshape(-1)[:, None]).sum()
    gradients = torch.autograd.grad(objective, projected)
    layers = []
    for layer, attention in enumerate(attentions):
        alpha = output.attentions[layer][0].detach()  # [head, n, n]
        heads, n, _ = alpha.shape
        weight = family.projection_weight(family.projection(model, attention)).detach()
        w_o = weight.reshape(heads, -1, weight.shape[1])  # [head, d, d_model]
        v = values[layer][0].detach().reshape(n, -1, w_o.shape[1]).transpose(0, 1)  # [kv_head, n, d]
        vt = torch.einsum("hnd,hdm->hnm", v.repeat_interleave(heads // v.shape[0], 0), w_o)  # [head, n, d_model]
        g = gradients[layer][0]  # [n, d_model]
        dots = torch.einsum("km,hjm->hkj", g, vt)  # <vt[h, j], g[k]>: [head, row, key]
        terms = (alpha * dots).sum(0)  # [row, key]
        explained = positions if only_row is None else torch.tensor([only_row])
        layers.append(terms[explained].sum(0) if rows == "explained" else terms.sum(0))
    return torch.stack(layers)


def _per_layer(model, ids, mask, target, positions, rows, foil=None):
    model_inputs, positional = prepare_inputs(model, ids, mask, None, torch.device("cpu"))
    layers = find_attention_layers(model)
    foils = None if foil is None else torch.as_tensor(foil).expand(len(positions))
    return target_scores(model, layers, None, model_inputs, positional, positions, torch.as_tensor(target).expand(
        len(positions)), rows, foils=foils)


@pytest.mark.parametrize("foil", [None, 12])
@pytest.mark.parametrize("rows", ["explained", "all"])
@pytest.mark.parametrize("name", DECODERS)
def test_each_layer_matches_the_float64_brute_force_on_a_padded_batch(name, rows, foil):
    r"""With a foil, the gradient is the log-odds' (the brute force's own, not the difference of two runs)."""
    model = FAMILIES[name].build()
    ids, mask = example_inputs(FAMILIES[name])
    target = 7
    positions = torch.tensor([ids.shape[1] - 1, ids.shape[1] - 2])  # the second example's last but one
    found = _per_layer(model, ids, mask, target, positions, rows, foil)
    for b in range(len(ids)):
        real = mask[b].bool()
        own = int(positions[b]) - int((~real[: positions[b]]).sum())  # the position among its real tokens
        position_ids = FAMILIES[name].position_ids(real.nonzero().flatten())  # as the padded batch numbers them
        kwargs = {} if position_ids is None else {"position_ids": position_ids}
        expected = reference(name, model, ids[b, real][None], target, own, rows, foil=foil,
                             **kwargs)  # [layer, n_real]
        scale = expected.abs().max()
        torch.testing.assert_close(found.scores[b][:, real].double(), expected, atol=2e-5 * scale, rtol=1e-3)
        assert bool((found.scores[b][:, ~real] == 0).all())  # padding reads nothing


@pytest.mark.parametrize("rows", ["explained", "all"])
@pytest.mark.parametrize("name", DECODERS)
def test_a_layers_scores_sum_to_the_gradient_times_its_attention_output(name, rows):
    model = FAMILIES[name].build()
    ids, mask = example_inputs(FAMILIES[name])
    found = _per_layer(model, ids, mask, 5, torch.tensor([8, 8]), rows)
    totals = found.scores.sum(-1)  # [batch, layer]
    terms = found.scores.abs().sum(-1).max()  # float32 sums of terms that cancel: their size sets the rounding
    torch.testing.assert_close(totals, found.totals, atol=1e-5 * terms, rtol=1e-4)
    assert bool((found.totals.abs() > 0).any())


@pytest.mark.parametrize("name", DECODERS)
def test_a_score_is_the_first_order_effect_of_removing_the_token_from_the_row(name):
    r"""Keeping ``1 -+ eps`` of token j's term in row i of layer l (the evaluator's value masking, scaled) changes
    the target's log-probability by ``-+eps s_l[j]`` up to O(eps^2); the central difference cancels that term."""
    model = FAMILIES[name].build().double()
    ids = example_inputs(FAMILIES[name])[0][:1]
    n, target, eps = ids.shape[1], 11, 1e-2  # the interventions round at about 1e-7: eps well above it
    found = _per_layer(model, ids, None, target, torch.tensor([n - 1]), "explained")

    def log_prob(scales=None):
        with torch.no_grad():
            if scales is None:
                return float(model(ids).logits[0, -1].log_softmax(-1)[target])
            with scale_values(model, scales):
                return float(model(ids).logits[0, -1].log_softmax(-1)[target])

    for layer, key in [(0, 2), (1, 5), (1, n - 1)]:
        kept = []
        for sign in (1, -1):
            scale = torch.ones(1, 1, n, n, dtype=torch.float64)
            scale[0, 0, n - 1, key] = 1 - sign * eps
            kept.append(log_prob({layer: scale}))
        change = (kept[0] - kept[1]) / (2 * eps)
        assert change == pytest.approx(-float(found.scores[0, layer, key]), rel=5e-4, abs=1e-6)


def test_token_contributions_with_a_target_aggregates_the_layers_and_keeps_padding_at_zero():
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])
    per_layer = _per_layer(model, ids, mask, [3, 9], torch.tensor([8, 8]), "explained").scores
    mean = TokenContributions(model).attribute(ids, attention_mask=mask, target=[3, 9])
    last = TokenContributions(model, layer_aggregation="last").attribute(ids, attention_mask=mask, target=[3, 9])
    torch.testing.assert_close(mean, per_layer.mean(1) * mask)
    torch.testing.assert_close(last, per_layer[:, -1] * mask)
    magnitude = TokenContributions(model, layer_aggregation="magnitude").attribute(ids, attention_mask=mask,
                                                                                   target=[3, 9])
    torch.testing.assert_close(magnitude, per_layer.abs().mean(1) * mask)
    assert (magnitude >= 0).all() and not torch.allclose(magnitude, mean.abs())  # signs no longer cancel
    unpadded = TokenContributions(model).attribute(ids[1:, 3:], target=9)
    torch.testing.assert_close(mean[1:, 3:], unpadded, atol=1e-6, rtol=1e-4)


def test_a_foil_gives_the_log_odds_the_targets_scores_less_the_foils():
    r"""The log-odds are linear in the gradient: with a foil the scores (and their identity's total) are the
    target's less the foil's, per example, and the objective is the difference of the two log-probabilities."""
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])
    positions = torch.tensor([8, 8])
    contrast = _per_layer(model, ids, mask, [3, 9], positions, "explained", foil=[12, 4])
    target = _per_layer(model, ids, mask, [3, 9], positions, "explained")
    foil = _per_layer(model, ids, mask, [12, 4], positions, "explained")
    torch.testing.assert_close(contrast.scores, target.scores - foil.scores, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(contrast.totals, target.totals - foil.totals, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(contrast.objective, target.objective - foil.objective)
    explained = TokenContributions(model).attribute(ids, attention_mask=mask, target=[3, 9], foil=[12, 4])
    torch.testing.assert_close(explained, contrast.scores.mean(1) * mask)


@pytest.mark.parametrize("foil, message", [
    (3, "a foil equals its target"), ([1, 2, 3], "one foil per example"), (10_000, "foil .* out of range"),
    (1.5, "foil must be a token id"),
])
def test_a_bad_foil_is_refused(foil, message):
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])
    with pytest.raises(InputError, match=message):
        TokenContributions(model).attribute(ids, attention_mask=mask, target=3, foil=foil)
    with pytest.raises(InputError, match="pass target too"):
        TokenContributions(model).attribute(ids, attention_mask=mask, foil=4)


def test_a_classifier_target_is_a_class():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_labels=3, pad_token_id=0)
    model = transformers.LlamaForSequenceClassification(config).eval()
    ids = torch.randint(3, 64, (1, 7))
    scores = TokenContributions(model).attribute(ids, target=2)
    layers = find_attention_layers(model)
    found = _per_layer(model, ids, None, 2, torch.tensor([6]), "explained")
    torch.testing.assert_close(scores, found.scores.mean(1))
    with torch.no_grad():
        assert float(found.objective) == pytest.approx(float(model(ids).logits[0].log_softmax(-1)[2]), abs=1e-5)
    assert len(layers) == 2
    against = _per_layer(model, ids, None, 2, torch.tensor([6]), "explained", foil=0)  # class 2 rather than 0
    other = _per_layer(model, ids, None, 0, torch.tensor([6]), "explained")
    torch.testing.assert_close(TokenContributions(model).attribute(ids, target=2, foil=0),
                               (found.scores - other.scores).mean(1), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(against.objective, found.objective - other.objective)


@pytest.mark.parametrize("bad, message", [
    (1.5, "token id or class index"), ([1, 2, 3], "one target per example"), (10_000, "out of range"),
])
def test_a_bad_target_is_refused(bad, message):
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])
    with pytest.raises(InputError, match=message):
        TokenContributions(model).attribute(ids, attention_mask=mask, target=bad)


def test_rollout_has_no_target():
    model = FAMILIES["llama"].build()
    with pytest.raises(InputError, match="rollout"):
        TokenContributions(model, layer_aggregation="rollout").attribute(torch.tensor([[3, 4, 5]]), target=1)


def test_excluded_tokens_are_zero():
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])
    plain = TokenContributions(model).attribute(ids, attention_mask=mask)
    first = TokenContributions(model, exclude="first").attribute(ids, attention_mask=mask)
    assert float(first[0, 0]) == 0 and float(first[1, 3]) == 0  # each example's first real token
    kept = torch.ones_like(plain, dtype=torch.bool)
    kept[0, 0] = kept[1, 3] = False
    torch.testing.assert_close(first[kept], plain[kept])
    positions = TokenContributions(model).attribute(ids, attention_mask=mask, exclude=[4, -1])
    assert bool((positions[:, [4, 8]] == 0).all())
    with pytest.raises(InputError, match="exclude must be one of"):
        TokenContributions(model, exclude="bos")


def test_sinks_are_the_tokens_that_take_most_of_the_explained_rows_attention():
    model = FAMILIES["llama"].build()
    ids = example_inputs(FAMILIES["llama"])[0][:1]
    from captum_cw import AttentionWeights

    attention = AttentionWeights(model).attribute(ids, query_positions=[-1])[0, :, 0]  # [layer, key]
    sinks = attention.mean(0) > 0.3
    for target in (None, 4):
        scores = TokenContributions(model, exclude="sinks").attribute(ids, target=target)
        plain = TokenContributions(model).attribute(ids, target=target)
        torch.testing.assert_close(scores[0], torch.where(sinks, 0.0, plain[0]))


def test_a_model_without_logits_has_no_target():
    from captum_cw.errors import UnsupportedSetupError

    model = FAMILIES["bert"].build()  # a BertModel: hidden states, no head
    ids, mask = example_inputs(FAMILIES["bert"])
    with pytest.raises(UnsupportedSetupError, match="returns no logits"):
        TokenContributions(model).attribute(ids, attention_mask=mask, target=1)
