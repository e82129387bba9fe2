"""The sink-norm intervention's controls against independent computations: the matched control token, its
norm's removal (zeroing its value rows in the model) and the sink removed with renormalisation (a softmax
computed without the sink)."""

import pytest
import torch
import transformers

from captum_cw.sinks import matched_control, sink_norm_effect
from test_interventions import _layer_run, _projected_values
from tiny_models import FAMILIES, example_inputs


def test_matched_control_by_hand():
    value_norms = torch.tensor([5.0, 1.0, 4.5, 5.3, 2.0, 5.5])
    received = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1, 0.1],
                             [0.2, 0.1, 0.1, 0.5, 0.1, 0.1]])  # key 3 is a sink of layer 1: never a control
    assert matched_control(value_norms, received, sink=0) == 2  # |4.5 - 5| = |5.5 - 5|: the earliest of a tie
    assert matched_control(value_norms, received, sink=0, threshold=0.55) == 3  # 3 is no sink at 0.55: |5.3 - 5|
    assert matched_control(value_norms, received, sink=1) == 4
    assert matched_control(value_norms[:1], received[:, :1], sink=0) == -1  # nothing but the sink


@pytest.fixture(scope="module")
def llama64():
    family = FAMILIES["llama"]
    model = family.build().double()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(family)
    return family, model, ids[0]


def _nll(model, ids):
    with torch.no_grad():
        logits = model(ids[None], use_cache=False).logits[0]
    return torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item()


def test_control_is_the_closest_value_norm_among_non_sinks(llama64):
    family, model, ids = llama64
    runs = [_layer_run(model, family, ids[None], None, layer) for layer in range(2)]
    received = torch.stack([alpha[0].mean((0, 1)) for alpha, *_ in runs])  # [layer, key]
    norms = torch.stack([_projected_values(v, weight, alpha.shape[1])[0].norm(dim=-1).mean(0)
                         for alpha, v, _, weight in runs]).mean(0)  # [key]: mean over heads, then layers
    sink = int(received.mean(0).argmax())
    expected = min((j for j in range(len(ids)) if j != sink and (received[:, j] <= 0.3).all()),
                   key=lambda j: abs(norms[j] - norms[sink]).item())
    effect = sink_norm_effect(model, ids)
    assert (effect.sink, effect.control) == (sink, expected)
    assert effect.value_norm == pytest.approx((norms[sink].item(), norms[expected].item()), rel=1e-9)


def test_control_removal_against_zeroed_value_rows(llama64):
    family, model, ids = llama64
    control = 5
    effect = sink_norm_effect(model, ids, sink=0, control=control)
    assert effect.control == control

    def zero_control_row(module, args, out):  # every head's value of the control: 0, the attention unchanged
        out = out.clone()
        out[:, control] = 0
        return out

    hooks = [m.self_attn.v_proj.register_forward_hook(zero_control_row) for m in model.model.layers]
    try:
        expected = _nll(model, ids)
    finally:
        for hook in hooks:
            hook.remove()
    clean = _nll(model, ids)
    # the NLL is taken in float32 whatever the model's precision
    assert effect.control_nll == pytest.approx(expected, rel=1e-6)
    assert effect.nll[0] == pytest.approx(clean, rel=1e-6)
    assert effect.control_delta_perplexity == pytest.approx(torch.tensor([clean, expected]).exp().diff().item(),
                                                            rel=1e-4)
    # direct effect at layer 1, head 3: o_h - alpha_c vt_c, the cosine to the mean non-sink vt of each row
    alpha, v, _, weight = _layer_run(model, family, ids[None], None, 1)
    vt = _projected_values(v, weight, alpha.shape[1])[0, 3]  # [n, d_model]
    a = alpha[0, 3]  # [query, key]
    out = a @ vt
    after = out - a[:, control, None] * vt[control]
    rows = torch.arange(1, len(ids))  # row 0 sees only the sink
    semantic = torch.stack([vt[1:i + 1].mean(0) for i in rows])
    cos = torch.nn.functional.cosine_similarity
    assert effect.control_norm[0, 1, 3].item() == pytest.approx(out[rows].norm(dim=-1).mean().item(), rel=1e-9)
    assert effect.control_norm[1, 1, 3].item() == pytest.approx(after[rows].norm(dim=-1).mean().item(), rel=1e-9)
    assert effect.control_cosine[1, 1, 3].item() == pytest.approx(cos(after[rows], semantic).mean().item(), rel=1e-9)
    torch.testing.assert_close(effect.control_norm[0], effect.norm[0])  # the same clean run


def _softmax_without(sink):
    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scores = query @ key.transpose(-1, -2) * scaling  # [batch, head, query, key]
        n = scores.shape[-1]
        blocked = ~torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        blocked[:, sink] = True
        weights = scores.masked_fill(blocked, float("-inf")).softmax(-1)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    return attention


def test_positions_out_of_the_sequence_are_refused(llama64):
    _, model, ids = llama64
    with pytest.raises(ValueError, match=r"control must be a position of the sequence, in \[0, 9\), got 9"):
        sink_norm_effect(model, ids, sink=0, control=9)
    with pytest.raises(ValueError, match="sink must be a position"):
        sink_norm_effect(model, ids, sink=-1)


def test_renormalized_removal_is_a_softmax_without_the_sink(llama64):
    family, model, ids = llama64
    sink = 2  # rows 0 and 1 do not see it; every later row keeps other keys
    effect = sink_norm_effect(model, ids, sink=sink)
    transformers.AttentionInterface.register("without_sink", _softmax_without(sink))
    brute = family.build().double()
    brute.set_attn_implementation("without_sink")
    assert effect.renormalized_nll == pytest.approx(_nll(brute, ids), rel=1e-6)
    assert effect.renormalized_nll != pytest.approx(effect.nll[0], rel=1e-6)  # it changed something
    # on one layer only, and on some heads: the softmax without the sink there only
    assert sink_norm_effect(model, ids, sink=sink, layers=[0], heads=[1]).renormalized_nll != pytest.approx(
        effect.renormalized_nll, rel=1e-6)


def test_norm_effect_figure_draws_the_control_beside_the_sink():
    from captum_cw.plotting import sink_norm_effect_figure

    curves = [{"low-norm heads": [0.1 * k, 0.2], "other heads": [0.3, 0.4]} for k in range(3)]
    axes = sink_norm_effect_figure(*curves).axes
    assert [axis.get_title() for axis in axes] == ["low-norm heads", "other heads"]
    drawn = [line.get_ydata().tolist() for line in axes[0].get_lines() if line.get_label()[0] != "_"]
    assert drawn == [[0.0, 0.2], [0.1, 0.2], [0.2, 0.2]]  # before, the sink's removal, the control's
    assert len([line for line in sink_norm_effect_figure(*curves[:2]).axes[0].get_lines()
                if line.get_label()[0] != "_"]) == 2  # without a control: before and after
