"""Layer indices are never wrapped modulo the layer count: negative ones count from the end, others raise."""

import pytest
import torch

from captum_cw.evaluation.protocols import ProtocolConfig, chosen_layers
from captum_cw.interventions import mask_values
from captum_cw.sinks import scale_sink_values, sink_norm_effect
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]  # two layers
    ids, _ = example_inputs(family)
    return family.build(), ids[:1]


def test_protocol_layers_count_from_the_end_and_never_wrap():
    assert chosen_layers(ProtocolConfig(), 2) == [0, 1]
    assert chosen_layers(ProtocolConfig(layers=(-1,)), 2) == [1]
    assert chosen_layers(ProtocolConfig(layers=(0, -1)), 2) == [0, 1]
    for layers in ((5,), (2,), (-3,)):
        with pytest.raises(ValueError, match=f"layer {layers[0]} is out of range: the model has 2 layers"):
            chosen_layers(ProtocolConfig(layers=layers), 2)
    with pytest.raises(ValueError, match="names a layer twice"):
        chosen_layers(ProtocolConfig(layers=(1, -1)), 2)


def test_sink_interventions_refuse_layers_out_of_range(llama):
    model, ids = llama
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        with scale_sink_values(model, 0, 0.0, layers=[5]):
            pass
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        sink_norm_effect(model, ids[0], sink=0, layers=[2])
    with torch.no_grad():
        with scale_sink_values(model, 0, 0.0, layers=[-1]):
            last = model(ids).logits
        with scale_sink_values(model, 0, 0.0, layers=[1]):
            torch.testing.assert_close(model(ids).logits, last)
    effect = sink_norm_effect(model, ids[0], sink=0, layers=[-1])
    assert effect.norm.shape[1] == 1


def test_mask_values_names_each_layer_once(llama):
    model, ids = llama
    removal = torch.zeros(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
    with pytest.raises(ValueError, match="names a layer twice"):
        with mask_values(model, {1: removal, -1: removal}):
            pass
    with pytest.raises(ValueError, match="layer -3 is out of range"):
        with mask_values(model, {-3: removal}):
            pass
