"""Every metric on every supported family equals a float64 brute force of its definition.

The first eight families run the whole (metric x implementation x selection) matrix by default; the
thirteen later cases (twelve families, Falcon in two layouts) run one case each by default and the whole
matrix with ``-m slow``.
"""

import functools

import pytest
import torch

from captum_cw import ContributionWeights
from captum_cw.attribution import attributor_for
from reference import reference_metrics
from tiny_models import FAMILIES, example_inputs

PAPER_METRICS = ("attention", "value_weighted", "output_normalized", "cw_intra", "cw_inter")  # the brute force's


def assert_matches(actual, expected):
    expected = expected.float()
    scale = expected.abs().max().item()
    # rtol 5e-5: float32 against float64, where a row's head output is short (intra-head CW divides by ||o_h||^2)
    # one element in a thousand misses 1e-5 by rounding alone, depending on the CPU's kernels (2e-5 seen)
    torch.testing.assert_close(actual, expected, rtol=5e-5, atol=1e-6 * max(scale, 1.0))


EXHAUSTIVE = ("bert", "gemma3_text", "gpt2", "llama", "mistral", "qwen2", "qwen3", "vit")
ONE_CASE = sorted(set(FAMILIES) - set(EXHAUSTIVE))


@functools.cache
def _case(name):
    family = FAMILIES[name]
    model = family.build()
    inputs, mask = example_inputs(family)
    return family, model, inputs, mask, reference_metrics(family, model, inputs, mask)


@pytest.fixture(scope="module", params=[
    name if name in EXHAUSTIVE else pytest.param(name, marks=pytest.mark.slow) for name in sorted(FAMILIES)
])
def family_case(request):
    return _case(request.param)


def _fastest_implementation(family):
    return "sdpa" if "sdpa" in family.implementations else family.implementations[0]


@pytest.mark.parametrize("name", ONE_CASE)
def test_registered_family_matches_brute_force(name):
    """The default run's case for the later families: per-head CW (intra) in every implementation the
    family supports, with padding, and the inter factors (attention, relative norm, cosine)."""
    family, model, inputs, mask, reference = _case(name)
    for implementation in family.implementations:
        model.set_attn_implementation(implementation)
        scores = ContributionWeights(model, metric="cw_intra").attribute(inputs, attention_mask=mask, per_head=True)
        assert_matches(scores, reference["cw_intra"])
    factors = ContributionWeights(model).attribute_factors(inputs, attention_mask=mask)
    assert_matches(factors.attention, reference["attention"])
    assert_matches(factors.relative_norm, reference["relative_norm_inter"])
    assert_matches(factors.cosine, reference["cosine_inter"])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("metric", PAPER_METRICS)
def test_per_head_scores_match_brute_force(family_case, implementation, metric):
    family, model, inputs, mask, reference = family_case
    if implementation not in family.implementations:
        pytest.skip(f"{family.name} does not support {implementation} in transformers")
    model.set_attn_implementation(implementation)
    scores = attributor_for(metric, model).attribute(inputs, attention_mask=mask, per_head=True)
    assert scores.shape == reference[metric].shape
    assert_matches(scores, reference[metric])


@pytest.mark.parametrize("metric", PAPER_METRICS)
def test_selection_and_head_aggregation(family_case, metric):
    family, model, inputs, mask, reference = family_case
    model.set_attn_implementation(_fastest_implementation(family))
    n = reference[metric].shape[-1]
    batch = reference[metric].shape[0]
    last = [n - 1] * batch if mask is None else (n - 1 - mask.flip(-1).int().argmax(-1)).tolist()
    # real tokens in every example (left padding: 3..8, right padding: 0..5); -5 counts back from each last one
    rows = [[5, 3, end - 4] for end in last]
    attributor = attributor_for(metric, model, layers=[1, 0], heads=[3, 1], chunk_size=2)
    scores = attributor.attribute(inputs, attention_mask=mask, query_positions=[5, 3, -5])
    expected = torch.stack([reference[metric][b, [1, 0]][:, [3, 1]][:, :, rows[b]] for b in range(batch)])
    expected = expected.sum(2) if metric == "cw_inter" else expected.mean(2)
    assert scores.shape == (expected.shape[0], 2, 3, n)
    assert_matches(scores, expected)


def test_factors_match_brute_force(family_case):
    family, model, inputs, mask, reference = family_case
    factors = ContributionWeights(model).attribute_factors(inputs, attention_mask=mask)
    assert_matches(factors.attention, reference["attention"])
    assert_matches(factors.relative_norm, reference["relative_norm_inter"])
    assert_matches(factors.cosine, reference["cosine_inter"])
