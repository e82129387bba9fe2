"""One metric registry: every metric from one forward pass equals its own attributor; a new metric is one entry."""

import dataclasses

import pytest
import torch

from captum_cw.attribution import MetricAttribution, attribute_metrics, attributor_for
from captum_cw.metrics import METRICS, Metric, get_metric, register_metric
from reference import reference_metrics
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    return family, family.build(), *example_inputs(family)


def _selected_reference(family, model, ids, mask, layers, heads, rows, per_head):
    r"""The float64 reference of every metric for these layers, heads and query rows, heads reduced as each
    metric is documented to reduce them (summed for inter-head contribution weights, averaged for the others)."""
    found = {}
    for name, scores in reference_metrics(family, model, ids, mask).items():  # [batch, layer, head, n, n]
        if name in METRICS:
            selected = scores[:, layers][:, :, heads][:, :, :, rows]  # [batch, layer, head, row, key]
            reduce = torch.sum if name == "cw_inter" else torch.mean
            found[name] = (selected if per_head else reduce(selected, 2)).float()
    return found


@pytest.mark.parametrize("per_head", [False, True])
def test_one_pass_equals_each_attributor(llama, per_head):
    family, model, ids, mask = llama
    forwards = []
    hook = model.register_forward_hook(lambda *args: forwards.append(1))
    found = attribute_metrics(model, ids, attention_mask=mask, layers=[1, 0], heads=[2, 0, 3],
                              query_positions=[-1, 3], per_head=per_head)
    hook.remove()
    assert len(forwards) == 1 and set(found.scores) == set(METRICS)
    n = ids.shape[1]
    reference = _selected_reference(family, model, ids, mask, [1, 0], [2, 0, 3], [n - 1, 3], per_head)
    assert set(reference) == set(METRICS)
    for name, expected in reference.items():
        torch.testing.assert_close(found.scores[name], expected, rtol=1e-4, atol=1e-5, msg=name)
    assert set(found.deltas) == {"attention", "cw_intra", "cw_inter"}  # the metrics with a completeness identity
    for name, delta in found.deltas.items():  # the largest gap to the reference's own row sums, per example
        gap = (found.scores[name].sum(-1) - reference[name].sum(-1)).abs().flatten(1).amax(1)
        torch.testing.assert_close(delta, gap, rtol=0, atol=1e-5, msg=name)


def test_a_new_metric_is_one_entry(llama):
    family, model, ids, mask = llama
    squared = Metric("attention_squared", "attention squared", lambda geometry: geometry.alpha.square(), "mean")
    register_metric(squared)
    try:
        scores = attributor_for("attention_squared", model).attribute(ids, attention_mask=mask, per_head=True)
        expected = reference_metrics(family, model, ids, mask)["attention"].square()
        torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-6)
        assert not MetricAttribution(model, "attention_squared").has_convergence_delta()
        assert "attention_squared" in attribute_metrics(model, ids, attention_mask=mask).scores
    finally:
        del METRICS["attention_squared"]


def test_registry_errors(llama):
    _, model, ids, _ = llama
    with pytest.raises(ValueError, match="Unknown metric 'gradient'; choose one of attention, value_weighted"):
        get_metric("gradient")
    with pytest.raises(ValueError, match="each once"):
        attribute_metrics(model, ids, ["cw_inter", "cw_inter"])
    with pytest.raises(ValueError, match="head_reduction must be"):
        dataclasses.replace(METRICS["attention"], head_reduction="max")
