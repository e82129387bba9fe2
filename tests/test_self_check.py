"""The self-check refuses what the convergence delta cannot see: a recomputation that is not the model's."""

import pytest
import torch
import transformers

from captum_cw import Architecture, AttentionWeights, ContributionWeights, register_architecture
from captum_cw.architectures import _ARCHITECTURES, AttentionLayer, find_attention_layers
from captum_cw.scan import ModelInputs, scan_geometry
from captum_cw.self_check import tolerance
from tiny_models import FAMILIES, example_inputs


def _scan(model, layers, ids, *, verify=True):
    return scan_geometry(model, layers, ModelInputs(ids, {}, None), (), None, lambda k, rows, g: None, verify=verify)


def test_dropout_in_train_mode_is_caught():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.3)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")  # no weights from the kernel: alpha is recomputed
    layers = find_attention_layers(model)
    for layer in layers:
        layer.attention.train()  # dropout on in the attention only: the model itself reads as eval
    ids = torch.randint(0, 64, (2, 12))
    with pytest.raises(ValueError, match="one of its modules.*training mode.*model.eval"):  # refused up front
        ContributionWeights(model).attribute(ids)
    with pytest.raises(ValueError, match=r"Self-check failed at layer 0: the recomputed attention .*dropout"):
        _scan(model, layers, ids)  # the self-check catches it where nothing refused it
    model.set_attn_implementation("eager")  # the kernel's own (dropped-out) weights: consistent with its output
    _scan(model, layers, ids)
    model.eval()
    model.set_attn_implementation("sdpa")
    _scan(model, layers, ids)


def test_a_position_bias_the_recomputation_lacks_is_caught():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    model = transformers.T5EncoderModel(config).eval()
    register_architecture("t5", Architecture("T5Attention", "o"))
    try:
        ids = torch.randint(0, 64, (1, 10))
        with pytest.raises(ValueError, match=r"at layer 0: .* differs from the model's own attention output by"):
            ContributionWeights(model).attribute(ids)
        scores = ContributionWeights(model, verify=False).attribute(ids)  # the documented way out
        assert scores.shape == (1, 2, 10, 10)
    finally:
        del _ARCHITECTURES["t5"]


def test_a_wrong_weight_layout_is_caught():
    model = FAMILIES["llama"].build()  # square W_O (32 x 32): shapes alone cannot tell the layouts apart
    ids, _ = example_inputs(FAMILIES["llama"])
    layers = find_attention_layers(model)
    wrong = [AttentionLayer(layer.index, layer.attention, layer.output_projection, "conv1d") for layer in layers]
    with pytest.raises(ValueError, match=r"layer 0: the head outputs summed through W_O .*weight_layout"):
        _scan(model, wrong, ids)
    _scan(model, wrong, ids, verify=False)
    _scan(model, layers, ids)


def test_a_model_whose_own_attention_output_is_nan_is_named():
    model = FAMILIES["llama"].build()
    ids, mask = example_inputs(FAMILIES["llama"])

    def poison(module, args, output):  # one real token's state turns NaN after layer 0, as a float64 cast of
        hidden = output[0] if isinstance(output, tuple) else output  # a left-padded model makes its padded rows
        hidden[1, 5] = float("nan")  # do (they then reach real tokens)

    handle = model.model.layers[0].register_forward_hook(poison)
    try:
        with pytest.raises(ValueError, match=r"at layer 1: the model's own attention output is NaN or inf on real "
                                             r"tokens.*model\(\.\.\.\) alone"):
            ContributionWeights(model).attribute(ids, attention_mask=mask)
        with pytest.raises(ValueError, match=r"cw_inter scores at layer 1 are NaN or inf"):  # unchecked: not silent
            ContributionWeights(model, verify=False).attribute(ids, attention_mask=mask)
    finally:
        handle.remove()
    ContributionWeights(model).attribute(ids, attention_mask=mask)


def test_an_intervention_that_replaced_the_output_is_caught():
    from captum_cw.interventions import mask_values

    model = FAMILIES["llama"].build()
    ids, _ = example_inputs(FAMILIES["llama"])
    removal = torch.zeros(1, 1, 9, 9, dtype=torch.bool)
    removal[..., 0] = True  # no row reads token 0 at layer 1
    with mask_values(model, {1: removal}), pytest.raises(ValueError, match="at layer 1: .*replaced the attention"):
        AttentionWeights(model).attribute(ids)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama", "gemma3_text", "gpt2", "bert", "vit"])
def test_half_precision_passes_with_room_to_spare(name, dtype):
    import captum_cw.scan

    family = FAMILIES[name]
    model = family.build().to(dtype)
    inputs, mask = example_inputs(family)
    inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
    seen = []
    original = captum_cw.scan.raise_on_mismatch

    def record(checks):
        seen.extend(checks)
        original(checks)

    captum_cw.scan.raise_on_mismatch = record
    try:
        ContributionWeights(model).attribute(inputs, attention_mask=mask)
    finally:
        captum_cw.scan.raise_on_mismatch = original
    worst = max(max(float(c.mixed_error), float(c.projection_error)) for c in seen)
    assert len(seen) == 2 and 0 < worst < tolerance(dtype) / 4


def test_tolerances_by_dtype():
    assert tolerance(torch.float32) == tolerance(torch.float64) == 1e-4
    assert tolerance(torch.float16) == pytest.approx(16 * 2**-10)
    assert tolerance(torch.bfloat16) == pytest.approx(16 * 2**-7)


@pytest.mark.parametrize("implementation, dtype, recomputed", [
    ("eager", torch.float32, False), ("sdpa", torch.float32, True), ("eager", torch.bfloat16, True)])
def test_an_eager_float32_kernel_gives_its_own_weights(monkeypatch, implementation, dtype, recomputed):
    from captum_cw.capture import AttentionCall

    model = FAMILIES["llama"].build().to(dtype)
    model.set_attn_implementation(implementation)
    ids, mask = example_inputs(FAMILIES["llama"])
    calls = []
    original = AttentionCall.alpha
    monkeypatch.setattr(AttentionCall, "alpha", lambda self, rows: calls.append(rows) or original(self, rows))
    scores, delta = ContributionWeights(model).attribute(ids, attention_mask=mask, return_convergence_delta=True)
    assert bool(calls) == recomputed
    assert (delta < 1e-5).all() and (scores[~mask.bool()[:, None, :, None].expand_as(scores)] == 0).all()
