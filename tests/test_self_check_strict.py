"""The self-check catches what passed it before: an output projection that is another module whose shapes fit,
and, in half precision, a score term the recomputation lacks that float32 catches (issue #27)."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

import captum_cw.scan
from captum_cw import ContributionWeights
from captum_cw.architectures import AttentionLayer, find_attention_layers
from captum_cw.capture import AttentionCall
from captum_cw.errors import SelfCheckError
from captum_cw.scan import ModelInputs, scan_geometry
from captum_cw.self_check import _reference_output, tolerance
from tiny_models import FAMILIES, example_inputs


def _scan(model, layers, ids, mask=None):
    padding = None if mask is None else mask.bool()
    keyword = {} if mask is None else {"attention_mask": mask}
    return scan_geometry(model, layers, ModelInputs(ids, keyword, padding), (), None, lambda k, rows, g: None)


def _declared(layers, projection):
    r"""The layers with ``projection(k, layer)`` declared as their output projection, weight layout unchanged."""
    return [AttentionLayer(layer.index, layer.attention, projection(k, layer), layer.weight_layout)
            for k, layer in enumerate(layers)]


def _pre_hooks(model):
    return sum(len(module._forward_pre_hooks) for module in model.modules())


WRONG_PROJECTIONS = {  # modules whose weights fit W_O's shape, so that the W_O split alone passes
    ("llama", "q_proj"): lambda layers: lambda k, layer: layer.attention.q_proj,
    ("llama", "v_proj"): lambda layers: lambda k, layer: layer.attention.v_proj,  # GQA: (32 -> 16), still splits
    ("llama", "next layer's o_proj"): lambda layers: lambda k, layer: layers[(k + 1) % 2].output_projection,
    ("gpt2", "c_attn"): lambda layers: lambda k, layer: layer.attention.c_attn,  # Conv1D, as c_proj
    ("gpt2", "next layer's c_proj"): lambda layers: lambda k, layer: layers[(k + 1) % 2].output_projection,
    ("bert", "query"): lambda layers: lambda k, layer: layer.attention.query,
    ("bert", "next layer's output.dense"): lambda layers: lambda k, layer: layers[(k + 1) % 2].output_projection,
}


@pytest.mark.parametrize("name, wrong", list(WRONG_PROJECTIONS))
def test_an_output_projection_that_does_not_receive_the_attention_output_is_caught(name, wrong):
    family = FAMILIES[name]
    model = family.build()
    ids, mask = example_inputs(family)
    layers = find_attention_layers(model)
    declared = _declared(layers, WRONG_PROJECTIONS[name, wrong](layers))
    hooks_before = _pre_hooks(model)
    with pytest.raises(SelfCheckError, match=r"layer 0: its output_projection does not receive the attention "
                                             r"output .*register_architecture"):
        _scan(model, declared, ids, mask)
    assert _pre_hooks(model) == hooks_before  # the hooks left with the pass
    _scan(model, layers, ids, mask)  # the declared projections of the registry (BERT's sibling one) pass
    assert _pre_hooks(model) == hooks_before


def test_the_projection_hooks_are_removed_when_the_forward_pass_fails():
    model = FAMILIES["llama"].build()
    ids, _ = example_inputs(FAMILIES["llama"])
    layers = find_attention_layers(model)

    def fail(module, args, output):
        raise RuntimeError("a failure in the middle of the pass")

    handle = model.model.layers[0].register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="middle of the pass"):
            _scan(model, layers, ids)
    finally:
        handle.remove()
    assert _pre_hooks(model) == 0


def _biased_sdpa(scale):
    r"""sdpa with a position bias ``scale * (key - query)`` the recomputation lacks (recent keys favoured)."""

    def kernel(module, query, key, value, attention_mask, **kwargs):
        n_query, n_key = query.shape[2], key.shape[2]
        rows = torch.arange(n_query)[:, None] + (n_key - n_query)  # [query, 1]
        keys = torch.arange(n_key)[None, :]  # [1, key]
        allowed = keys <= rows if attention_mask is None else attention_mask
        if allowed.dtype != torch.bool:
            allowed = allowed > torch.finfo(allowed.dtype).min / 2
        scores = torch.where(allowed, scale * (keys - rows).to(query.dtype), torch.finfo(query.dtype).min)
        return sdpa_attention_forward(module, query, key, value, scores, **{**kwargs, "is_causal": False})

    return kernel


def _mixed_errors(model, ids, mask):
    r"""The mixed check's errors of each layer, after the self-check passed."""
    seen = []
    original = captum_cw.scan.raise_on_mismatch

    def record(checks):
        seen.extend(checks)
        original(checks)

    captum_cw.scan.raise_on_mismatch = record
    try:
        ContributionWeights(model).attribute(ids, attention_mask=mask)
    finally:
        captum_cw.scan.raise_on_mismatch = original
    return [float(check.mixed_error) for check in seen]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_missing_score_term_is_caught_in_half_precision_as_in_float32(monkeypatch, dtype):
    family = FAMILIES["llama"]
    model = family.build().to(dtype)
    model.set_attn_implementation("sdpa")
    ids, mask = example_inputs(family)
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", _biased_sdpa(0.04))
    seen = []
    monkeypatch.setattr(captum_cw.scan, "raise_on_mismatch", seen.extend)
    model32 = family.build()
    model32.set_attn_implementation("sdpa")
    ContributionWeights(model32).attribute(ids, attention_mask=mask)  # float32, errors recorded only
    assert 0.02 < max(float(check.mixed_error) for check in seen) < 0.1 < tolerance(torch.bfloat16)  # bf16 let ~5% by
    monkeypatch.undo()
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", _biased_sdpa(0.04))
    with pytest.raises(SelfCheckError, match=r"layer 0: the recomputed attention .* differs from the model's own "
                                             r"attention output.* by 0\.0[2-9].*allows 0\.0001"):
        ContributionWeights(model).attribute(ids, attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_plain_half_precision_models_pass(name, dtype):
    family = FAMILIES[name]
    model = family.build().to(dtype)
    inputs, mask = example_inputs(family)
    inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
    for implementation in family.implementations:
        model.set_attn_implementation(implementation)
        errors = _mixed_errors(model, inputs, mask)  # the self-check passed: no false alarm
        assert len(errors) == 2 and max(errors) < tolerance(torch.float32) / 4, implementation


def test_a_flash_kernel_is_compared_with_its_own_half_precision_output():
    query = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    output = torch.randn(1, 3, 2, 4, dtype=torch.bfloat16)
    reruns = []

    def call(implementation):
        return AttentionCall(None, query, query, query, lambda: (output, None), None, implementation, 0.5, None, None,
                             True, rerun=lambda *arguments: reruns.append(arguments) or (output.float(), None))

    rows = torch.tensor([0, 2])
    assert (_reference_output(call("flash_attention_2"), rows) == output[:, rows]).all() and not reruns  # no float32
    assert _reference_output(call("sdpa"), rows).dtype == torch.float32
    assert [argument.dtype for argument in reruns[0][:3]] == [torch.float32] * 3 and reruns[0][3] is None


@pytest.mark.parametrize("padded", [True, False])
def test_the_float32_rerun_runs_the_checked_rows_alone_only_with_a_4d_mask(monkeypatch, padded):
    family = FAMILIES["llama"]
    model = family.build().to(torch.bfloat16)
    model.set_attn_implementation("sdpa")
    ids, mask = example_inputs(family)
    ids, mask = (ids, mask) if padded else (ids[:1, 2:], None)  # unpadded: sdpa gets no mask, causal by row count
    rows_run = []
    original = AttentionInterface._global_mapping["sdpa"]

    def counting(module, query, *args, **kwargs):
        rows_run.append((query.dtype, query.shape[2]))
        return original(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", counting)
    ContributionWeights(model).attribute(ids, attention_mask=mask)
    reruns = [n_rows for dtype, n_rows in rows_run if dtype == torch.float32]
    assert reruns == ([4, 4] if padded else [ids.shape[1]] * 2)
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", _biased_sdpa(0.04))
    with pytest.raises(SelfCheckError, match=r"layer 0: the recomputed attention .*allows 0\.0001"):
        ContributionWeights(model).attribute(ids, attention_mask=mask)
