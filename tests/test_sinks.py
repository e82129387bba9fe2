"""Sink analysis on hand-computed cases and against brute force."""

import pytest
import torch

from captum_cw import ContributionWeights
from captum_cw.sinks import analyze_sinks, optimal_sink_rate, scale_sink_values, sink_norm_effect
from test_interventions import _layer_run
from tiny_models import FAMILIES, example_inputs


def test_three_token_head_minimum_in_closed_form():
    # a head reads a sink s and two tokens a, b with weights (0.5, 0.3, 0.2); keeping a:b = 3:2,
    # o(t) = t s + (1 - t) u with u = 0.6 a + 0.4 b = (1, 1); s = (-1, 1) gives ||o(t)||^2 = 4t^2 - 4t + 2,
    # minimal at t* = 1/2 with ||o|| = 1; the actual rate is 0.5 too, so the head sits at its minimum
    sink, a, b = torch.tensor([-1.0, 1.0]), torch.tensor([1.0, 0.0]), torch.tensor([1.0, 2.5])
    rest = (0.3 * a + 0.2 * b) / 0.5
    torch.testing.assert_close(rest, torch.tensor([1.0, 1.0]))
    t_star, norm = optimal_sink_rate(sink, rest)
    assert t_star.item() == pytest.approx(0.5) and norm.item() == pytest.approx(1.0)
    actual = 0.5 * sink + 0.3 * a + 0.2 * b
    assert actual.norm().item() == pytest.approx(norm.item())  # this head already sits at its minimum


def test_convex_minimum_in_closed_form():
    # sink anti-aligned with the rest: ||t s + (1-t) u||^2 is minimal at t* = <u - s, u> / ||s - u||^2
    sink, rest = torch.tensor([-1.0, 0.0]), torch.tensor([2.0, 1.0])
    t_star, norm = optimal_sink_rate(sink, rest)
    assert t_star.item() == pytest.approx(0.7)
    assert norm.item() == pytest.approx(0.1**0.5)
    grid = torch.linspace(0, 1, 10001)[:, None]
    assert (grid * sink + (1 - grid) * rest).norm(dim=-1).min().item() == pytest.approx(norm.item(), abs=1e-4)
    # aligned: the minimum sits at the boundary t* = 0 (clipped)
    t_star, _ = optimal_sink_rate(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]))
    assert t_star.item() == 0.0
    # equal vectors: no curvature, t* = 0 instead of NaN
    t_star, norm = optimal_sink_rate(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]))
    assert t_star.item() == 0.0 and torch.isfinite(norm)


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    model = family.build()
    ids, _ = example_inputs(family)
    return family, model, ids[0]


def test_analysis_matches_brute_force(llama):
    family, model, ids = llama
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(ids[None], output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    analysis = analyze_sinks(model, ids, threshold=0.2)
    received = torch.stack([a[0].mean((0, 1)) for a in attentions])
    torch.testing.assert_close(analysis.received, received, rtol=1e-5, atol=1e-6)
    assert analysis.sinks == [(r > 0.2).nonzero().flatten().tolist() for r in received]
    assert analysis.received[:, 0].min() > 0.1  # the first token of a causal model collects mass
    rate = analysis.sink_rate
    assert (analysis.optimal_rate >= 0).all() and (analysis.optimal_rate <= 1).all()
    # the minimum of a convex function is no larger than its value at the actual sink rate
    assert (analysis.optimal_norm <= analysis.output_norm + 1e-5).all()
    strongest = received.argmax(-1)
    for layer, position in enumerate(strongest.tolist()):
        torch.testing.assert_close(rate[layer], attentions[layer][0, :, :, position], rtol=1e-5, atol=1e-6)
    cw = ContributionWeights(model, metric="cw_intra").attribute(ids[None], per_head=True)[0]  # [l, h, q, k]
    for layer, sinks in enumerate(analysis.sinks):
        if sinks:
            visible = attentions[layer][0][:, :, sinks] > 0
            expected = cw[layer][:, :, sinks][visible].mean()
            torch.testing.assert_close(analysis.factors["cw"][layer, 0], expected, rtol=1e-4, atol=1e-6)


def test_first_token_method(llama):
    _, model, ids = llama
    analysis = analyze_sinks(model, ids, method="first")
    assert analysis.sinks == [[0], [0]]
    with pytest.raises(ValueError, match="method must be"):
        analyze_sinks(model, ids, method="last")


def test_scaling_the_sink_value_removes_exactly_its_term():
    family = FAMILIES["llama"]
    model = family.build().double()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(family)
    alpha, v, clean, weight = _layer_run(model, family, ids, None, 1)
    batch, heads, n, _ = alpha.shape
    w_o = weight.reshape(heads, -1, weight.shape[1])
    v = v.reshape(batch, n, -1, w_o.shape[1]).transpose(1, 2).repeat_interleave(
        heads // (v.shape[-1] // w_o.shape[1]), dim=1)
    vt = torch.einsum("bhnd,hdm->bhnm", v, w_o)
    with scale_sink_values(model, 0, factor=0.25, layers=[1], heads=[0, 2]):
        _, _, scaled, _ = _layer_run(model, family, ids, None, 1)
    kept = torch.zeros(heads, dtype=torch.double)
    kept[[0, 2]] = 1
    expected = clean - 0.75 * torch.einsum("bhi,h,bhm->bim", alpha[:, :, :, 0], kept, vt[:, :, 0])
    torch.testing.assert_close(scaled, expected, rtol=1e-6, atol=1e-7)


def test_sink_norm_effect_against_brute_force(llama):
    family, model, ids = llama
    effect = sink_norm_effect(model, ids, sink=0, factor=0.0)
    with torch.no_grad():
        clean = model(ids[None]).logits[0]
        with scale_sink_values(model, 0, 0.0):
            scaled = model(ids[None]).logits[0]
    nll = [torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item() for logits in (clean, scaled)]
    assert effect.nll == pytest.approx(tuple(nll), rel=1e-5)
    assert effect.delta_perplexity == pytest.approx(torch.tensor(nll).exp().diff().item(), rel=1e-4)
    # brute-force direct effect at layer 0, head 1, from materialised projected values
    model64 = family.build().double()
    model64.set_attn_implementation("eager")
    alpha, v, _, weight = _layer_run(model64, family, ids[None], None, 0)
    heads, n = alpha.shape[1], alpha.shape[-1]
    w_o = weight.reshape(heads, -1, weight.shape[1])
    v = v.reshape(1, n, -1, w_o.shape[1]).transpose(1, 2).repeat_interleave(heads // (v.shape[-1] // w_o.shape[1]), 1)
    vt = torch.einsum("bhnd,hdm->bhnm", v, w_o)[0, 1]  # [n, d_model]
    a = alpha[0, 1]  # [query, key]
    out = a @ vt
    after = out - a[:, :1] * vt[:1]
    rows = torch.arange(1, n)  # row 0 sees only the sink
    semantic = torch.stack([vt[1:i + 1].mean(0) for i in rows])
    cos = torch.nn.functional.cosine_similarity
    assert effect.norm[0, 0, 1].item() == pytest.approx(out[rows].norm(dim=-1).mean().item(), rel=1e-4)
    assert effect.norm[1, 0, 1].item() == pytest.approx(after[rows].norm(dim=-1).mean().item(), rel=1e-4)
    assert effect.cosine[0, 0, 1].item() == pytest.approx(cos(out[rows], semantic).mean().item(), rel=1e-4)
    assert effect.cosine[1, 0, 1].item() == pytest.approx(cos(after[rows], semantic).mean().item(), rel=1e-4)
    assert effect.low_norm.shape == (2, heads) and effect.low_norm.any(-1).all()
    only_head_1 = sink_norm_effect(model, ids, sink=0, factor=0.0, heads=[1])
    torch.testing.assert_close(only_head_1.norm[1, :, 1], effect.norm[1, :, 1])
    torch.testing.assert_close(only_head_1.norm[1, :, 0], only_head_1.norm[0, :, 0])  # untouched head


@pytest.mark.slow  # a CLI subprocess
def test_sinks_command_writes_numbers_and_plots(tiny_llm_dir, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from conftest import TEST_DATA

    result = subprocess.run(
        [sys.executable, "-m", "captum_cw.cli", "sinks", "--model", str(tiny_llm_dir), "--task", "fineweb_edu",
         "--limit", "2", "--data-dir", str(TEST_DATA), "--max-tokens", "48", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TQDM_DISABLE": "1"},
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "sinks.json").read_text())
    assert summary["n_texts"] == 2
    assert 0 <= summary["convexity"]["fraction_t_star_below_1"] <= 1
    intervention = summary["sink_norm_intervention"]
    for removal in (intervention, intervention["control"], intervention["sink_removed_renormalized"]):
        low, high = removal["delta_perplexity"]["ci95"]
        assert low <= removal["delta_perplexity"]["mean"] <= high and removal["delta_perplexity"]["texts"] == 2
    assert set(intervention["control"]["change_of_head_output_norm"]) == {"low_norm_heads", "other_heads"}
    for name in ("received", "factors", "alignment", "convexity", "norm_effect"):
        assert (tmp_path / f"sinks_{name}.png").read_bytes()[:4] == b"\x89PNG"
