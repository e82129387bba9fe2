"""Captum's contract for the delta: it describes the rows returned (head subsets included), and
compute_convergence_delta gives the same number; checked against the float64 brute force."""

import pytest
import torch
from captum.attr import NoiseTunnel

from captum_cw import AttentionWeights, ContributionWeights, ValueWeightedAttention
from reference import reference_metrics
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    model = family.build()
    return family, model, *example_inputs(family)


def test_a_head_subset_sums_to_its_share_of_the_layer_output(llama):
    family, model, ids, mask = llama
    attributor = ContributionWeights(model, heads=[0, 1])
    scores, delta = attributor.attribute(ids, attention_mask=mask, return_convergence_delta=True)
    reference = reference_metrics(family, model, ids, mask)["cw_inter"]  # [batch, layer, head, n, n]
    share = reference[:, :, [0, 1]].sum((2, 4))  # <o, o_0 + o_1> / ||o||^2 by the definition: [batch, layer, n]
    torch.testing.assert_close(scores.sum(-1).double(), share, rtol=0, atol=1e-5)
    assert (share[mask.bool()[:, None].expand_as(share)] - 1).abs().max() > 0.1  # a subset is not the whole
    assert (delta < 1e-5).all()
    torch.testing.assert_close(attributor.compute_convergence_delta(scores, ids, attention_mask=mask), delta,
                               rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda model: ContributionWeights(model),
    lambda model: ContributionWeights(model, heads=[3, 1], layers=[1]),
    lambda model: ContributionWeights(model, metric="cw_intra", heads=[2]),
    lambda model: AttentionWeights(model, heads=[0, 2]),
])
@pytest.mark.parametrize("per_head", [False, True])
def test_compute_convergence_delta_equals_attributes_delta_and_sees_a_change(llama, make, per_head):
    _, model, ids, mask = llama
    attributor = make(model)
    scores, delta = attributor.attribute(ids, attention_mask=mask, query_positions=[-1, 4], per_head=per_head,
                                         return_convergence_delta=True)
    recomputed = attributor.compute_convergence_delta(scores, ids, attention_mask=mask, query_positions=[-1, 4])
    torch.testing.assert_close(recomputed, delta, rtol=0, atol=0)
    assert (delta < 1e-5).all()
    changed = scores.clone()
    changed[1, ..., -1, :] *= 1.5  # example 1's last row (a real token): its sums move by half of themselves
    moved = attributor.compute_convergence_delta(changed, ids, attention_mask=mask, query_positions=[-1, 4])
    assert moved[0] < 1e-5 and moved[1] > 0.05


def test_delta_arguments_are_checked(llama):
    _, model, ids, mask = llama
    attributor = ContributionWeights(model)
    scores = attributor.attribute(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="pass the arguments attribute"):
        attributor.compute_convergence_delta(scores, ids, attention_mask=mask, query_positions=[-1])
    with pytest.raises(ValueError, match="attributions must be"):
        attributor.compute_convergence_delta(scores[0], ids, attention_mask=mask)
    with pytest.raises(ValueError, match="no completeness identity"):
        ValueWeightedAttention(model).compute_convergence_delta(scores, ids, attention_mask=mask)


def test_tuple_inputs_and_captum_wrappers(llama):
    _, model, ids, mask = llama
    attributor = ContributionWeights(model, layers=[-1])
    (scores,), delta = attributor.attribute((ids,), attention_mask=mask, return_convergence_delta=True)
    torch.testing.assert_close(scores, attributor.attribute(ids, attention_mask=mask))
    assert attributor.attribute.__wrapped__  # wrapped as captum's attributors are (NoiseTunnel calls this)
    vit = FAMILIES["vit"].build()
    pixels, _ = example_inputs(FAMILIES["vit"])
    smoothed, deltas = NoiseTunnel(ContributionWeights(vit)).attribute(
        pixels, nt_samples=2, stdevs=0.05, return_convergence_delta=True)
    assert smoothed.shape == (2, 2, 17, 17) and deltas.shape == (4,) and (deltas < 1e-5).all()
