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


@pytest.mark.parametrize("per_head", [False, True])
def test_one_pass_equals_each_attributor(llama, per_head):
    _, model, ids, mask = llama
    forwards = []
    hook = model.register_forward_hook(lambda *args: forwards.append(1))
    found = attribute_metrics(model, ids, attention_mask=mask, layers=[1, 0], heads=[2, 0, 3],
                              query_positions=[-1, 3], per_head=per_head)
    hook.remove()
    assert len(forwards) == 1 and set(found.scores) == set(METRICS)
    for name in METRICS:
        attributor = attributor_for(name, model, layers=[1, 0], heads=[2, 0, 3])
        if attributor.has_convergence_delta():
            scores, delta = attributor.attribute(ids, attention_mask=mask, query_positions=[-1, 3],
                                                 per_head=per_head, return_convergence_delta=True)
            torch.testing.assert_close(found.deltas[name], delta, rtol=0, atol=0)
        else:
            scores = attributor.attribute(ids, attention_mask=mask, query_positions=[-1, 3], per_head=per_head)
            assert name not in found.deltas
        torch.testing.assert_close(found.scores[name], scores, rtol=0, atol=0)


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
