"""Soft comprehensiveness and sufficiency (Zhao & Aletras, 2023): scaled terms, normalised scores, and the
evaluator's soft measures against a brute-force pipeline on a tiny model."""

import pytest
import torch

from captum_cw import AttentionWeights, ContributionWeights
from captum_cw.evaluation import load_examples
from captum_cw.evaluation.protocols import ProtocolConfig, evaluate_example
from captum_cw.evaluation.ranking import normalized_scores, soft_removal
from captum_cw.evaluation.sequences import compare, encode
from captum_cw.interventions import mask_values, scale_values
from captum_cw.models import load_model
from conftest import TEST_DATA
from test_interventions import _layer_run, _projected_values
from tiny_models import FAMILIES, example_inputs

DATA = str(TEST_DATA)


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("heads", ["each", "shared"])
def test_scaled_output_keeps_the_scaled_terms(renormalize, heads):
    family = FAMILIES["llama"]
    model = family.build().double()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(family)
    layer = 1
    alpha, v, clean, weight = _layer_run(model, family, ids, None, layer)
    batch, n_heads, n, _ = alpha.shape
    vt = _projected_values(v, weight, n_heads)  # [batch, head, n, d_model]
    generator = torch.Generator().manual_seed(0)
    scale = torch.rand(batch, n_heads if heads == "each" else 1, n, n, generator=generator, dtype=torch.float64)
    with scale_values(model, {layer: scale}, renormalize=renormalize):
        _, _, scaled, _ = _layer_run(model, family, ids, None, layer)
    kept = alpha * scale  # [batch, head, row, key]: the share of each term kept
    if renormalize:
        kept = kept / kept.sum(-1, keepdim=True)
    expected = clean - torch.einsum("bhij,bhjm->bim", alpha, vt) + torch.einsum("bhij,bhjm->bim", kept, vt)
    # transformers' eager softmax runs in float32 even for a float64 model: its alpha is float32-exact, and
    # renormalising divides that float32 error by the kept weight (about half the row here)
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=5e-6 if renormalize else 1e-7)


def test_scales_of_zero_and_one_remove_as_masking_does():
    family = FAMILIES["llama"]
    model = family.build()
    ids, mask = example_inputs(family)
    removal = torch.rand(2, 1, 9, 9, generator=torch.Generator().manual_seed(1)) < 0.3
    with torch.no_grad():
        with mask_values(model, {0: removal, -1: removal}):
            masked = model(ids, attention_mask=mask).logits
        with scale_values(model, {0: 1 - removal.float(), -1: 1 - removal.float()}):
            scaled = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(scaled, masked, rtol=0, atol=1e-6)


def _min_max(values: list[float]) -> list[float]:
    """The definition: (x - min) / (max - min) over the row's eligible keys, all 1 when they are equal."""
    low, high = min(values), max(values)
    return [1.0] * len(values) if high == low else [(x - low) / (high - low) for x in values]


def _normalized_by_hand(scores: torch.Tensor, eligible: torch.Tensor, *, absolute: bool = False) -> torch.Tensor:
    out = torch.zeros(scores.shape, dtype=torch.float64)
    flat_scores, flat_eligible, flat_out = scores.reshape(-1, scores.shape[-1]), eligible.expand_as(scores).reshape(
        -1, scores.shape[-1]), out.view(-1, scores.shape[-1])
    for row in range(flat_scores.shape[0]):
        keys = [j for j in range(flat_scores.shape[1]) if flat_eligible[row, j]]
        if keys:
            values = [abs(float(flat_scores[row, j])) if absolute else float(flat_scores[row, j]) for j in keys]
            for j, value in zip(keys, _min_max(values)):
                flat_out[row, j] = value
    return out


def test_normalised_scores_and_soft_shares_on_hand_made_numbers():
    scores = torch.tensor([[2.0, -1.0, 0.5, 9.0], [3.0, 3.0, 3.0, 0.0], [-4.0, 1.0, 2.0, 7.0]])
    eligible = torch.tensor([[True, True, True, False], [True, True, True, False], [True, False, False, False]])
    s = normalized_scores(scores, eligible)
    torch.testing.assert_close(s, torch.tensor([[1.0, 0.0, 0.5, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(soft_removal(scores, eligible, "comprehensiveness"), s)  # the share removed is s
    torch.testing.assert_close(soft_removal(scores, eligible, "sufficiency"),
                               torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    absolute = normalized_scores(scores, eligible, absolute=True)
    torch.testing.assert_close(absolute[0], torch.tensor([1.0, 1 / 3, 0.0, 0.0]))  # |2|, |-1|, |0.5| over [0.5, 2]
    random = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    allowed = torch.rand(3, 5, 7, generator=torch.Generator().manual_seed(1)) < 0.6
    for absolute in (False, True):
        torch.testing.assert_close(normalized_scores(random, allowed, absolute=absolute).double(),
                                   _normalized_by_hand(random, allowed, absolute=absolute), rtol=1e-6, atol=1e-7)


def _logliks(model, encoded, contexts):
    """Each choice's log-likelihood, scored by hand, with a context manager per sequence around its forward."""
    values = []
    for choice in encoded.choices:
        ids = encoded.sequences[choice.sequence]
        with torch.no_grad(), contexts(choice.sequence):
            log_probs = model(ids[None]).logits[0].log_softmax(-1)
        values.append(sum(float(log_probs[choice.start + t, token]) for t, token in enumerate(choice.tokens)))
    return values


def _expected(clean, perturbed, label):
    as_measured = {"logliks": perturbed, "prediction": max(range(len(perturbed)), key=perturbed.__getitem__)}
    return compare({"logliks": clean, "prediction": max(range(len(clean)), key=clean.__getitem__)}, as_measured,
                   label)


@pytest.mark.parametrize("task", ["mmlu", "winogrande"])
def test_layer_level_soft_measures_match_a_brute_force_pipeline(tiny, task):
    model, tokenizer = tiny
    encoded = encode(load_examples(task, 1, DATA)[0], tokenizer, max_tokens=64)
    record = evaluate_example(model, encoded, ProtocolConfig(metrics=("cw_inter",), bins=(20,), soft=True,
                                                             batch_size=2))
    clean = _logliks(model, encoded, lambda s: torch.no_grad())
    for mode in ("comprehensiveness", "sufficiency"):
        scales = []
        for s, ids in enumerate(encoded.sequences):
            n = len(ids)
            scores = ContributionWeights(model).attribute(ids[None])[0]  # [layer, n, n], from the public attributor
            eligible = torch.ones(n, n, dtype=torch.bool).tril() & ~encoded.special[s][None, :]
            normalised = _normalized_by_hand(scores, eligible)
            kept = 1 - normalised if mode == "comprehensiveness" else normalised
            scales.append(torch.where(eligible, kept, 1.0).float())  # [layer, n, n]; other keys stay whole

        def scaled(s, scales=scales):
            return scale_values(model, {layer: scales[s][layer][None, None] for layer in range(len(scales[s]))})

        expected = _expected(clean, _logliks(model, encoded, scaled), encoded.example.label)
        for measure, value in expected.items():
            assert record["soft"]["cw_inter"][mode][measure] == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize("removal", ["knockout", "deletion"])
def test_input_level_soft_measures_match_a_brute_force_pipeline(tiny, removal):
    model, tokenizer = tiny
    encoded = encode(load_examples("mmlu", 2, DATA)[1], tokenizer, max_tokens=64)
    config = ProtocolConfig(protocol="input", metrics=("attention_mean",), bins=(50,), soft=True, removal=removal)
    record = evaluate_example(model, encoded, config)
    ids = encoded.sequences[0]  # MMLU: one sequence, its last row predicts every choice
    n = len(ids)
    clean = _logliks(model, encoded, lambda s: torch.no_grad())
    scores = AttentionWeights(model).attribute(ids[None])[0][:, -1].mean(0)  # [n]: mean over layers of the last row
    eligible = ~encoded.special[0]
    normalised = _normalized_by_hand(scores, eligible)  # [n]
    for mode in ("comprehensiveness", "sufficiency"):
        kept = torch.where(eligible, 1 - normalised if mode == "comprehensiveness" else normalised, 1.0).float()
        if removal == "knockout":  # every row but the token's own keeps kept[j] of key j's term, at every layer
            scale = torch.where(torch.eye(n, dtype=torch.bool), 1.0, kept[None, :])[None, None]
            perturbed = _logliks(model, encoded, lambda s: scale_values(model, {0: scale, 1: scale}))
        else:  # the embeddings scaled
            with torch.no_grad():
                embeddings = model.get_input_embeddings()(ids[None]) * kept[None, :, None]
                log_probs = model(inputs_embeds=embeddings).logits[0].log_softmax(-1)
            perturbed = [float(log_probs[c.start, c.tokens[0]]) for c in encoded.choices]
        expected = _expected(clean, perturbed, encoded.example.label)
        for measure, value in expected.items():
            assert record["soft"]["attention_mean"][mode][measure] == pytest.approx(value, abs=1e-4)
