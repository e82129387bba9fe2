"""The real offline models (SmolLM2-135M with GQA, all-MiniLM-L6-v2) against the float64 brute force."""

import dataclasses

import torch

from captum_cw import ContributionWeights, OutputNormalizedAttention, ValueWeightedAttention
from reference import reference_metrics
from tiny_models import FAMILIES

TEXTS = ["The capital of France is Paris, and", "Attention sinks absorb mass."]


def _check(family, model, tokenizer, padding_side):
    tokenizer.padding_side = padding_side
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    reference = reference_metrics(family, model, batch["input_ids"], batch["attention_mask"])
    layers = [0, len(reference["attention"][0]) // 2, -1]
    attributors = {
        "cw_inter": ContributionWeights(model, layers=layers),
        "cw_intra": ContributionWeights(model, layers=layers, metric="cw_intra"),
        "value_weighted": ValueWeightedAttention(model, layers=layers),
        "output_normalized": OutputNormalizedAttention(model, layers=layers),
    }
    for metric, attributor in attributors.items():
        scores = attributor.attribute(batch, per_head=True)
        expected = reference[metric][:, layers].float()
        # rtol 5e-5: float32 against float64 rounds one element in thousands past 1e-5 on some CPUs (3e-5 seen)
        torch.testing.assert_close(scores, expected, rtol=5e-5, atol=1e-6 * max(1.0, expected.abs().max().item()))
    _, delta = attributors["cw_inter"].attribute(batch, return_convergence_delta=True)
    assert (delta < 1e-4).all()


def test_smollm2_matches_brute_force(smollm2):
    model, tokenizer = smollm2
    assert model.config.num_attention_heads == 9 and model.config.num_key_value_heads == 3
    _check(dataclasses.replace(FAMILIES["llama"], build=None), model, tokenizer, "left")


def test_minilm_matches_brute_force(minilm):
    model, tokenizer = minilm
    _check(dataclasses.replace(FAMILIES["bert"], build=None), model, tokenizer, "right")


def test_smollm2_long_input_last_position_only(smollm2):
    model, tokenizer = smollm2
    ids = torch.randint(10, 40000, (1, 600), generator=torch.Generator().manual_seed(0))
    full = ContributionWeights(model, layers=[-1]).attribute(ids, query_positions=[598, 599])
    chunked = ContributionWeights(model, layers=[-1], chunk_size=1).attribute(ids, query_positions=[-1])
    torch.testing.assert_close(chunked[:, :, 0], full[:, :, 1])
    assert full.shape == (1, 1, 2, 600)
