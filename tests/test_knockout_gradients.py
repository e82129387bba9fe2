"""Knockout gradients against an independent float64 brute force, their completeness and their errors
(docs/DESIGN.md, "Knockout gradients").

The reference gates keys without the package: the model's own eager attention reads a 4D float mask holding
causality plus ``log s_j`` on each key, differentiated by autograd (and, for the first model, by central finite
differences)."""

from __future__ import annotations

import copy

import pytest
import torch

from captum_cw.errors import InputError, UnsupportedArgumentError
from captum_cw.knockout_gradients import knockout_gradients
from tiny_models import FAMILIES

N = 9
CONTEXT = torch.tensor([[False, True, True, True, True, True, False, False, False]])  # [1, n]
IDS = torch.randint(3, 64, (1, N), generator=torch.Generator().manual_seed(3))  # [1, n]
TARGET = 7


def gated_objective(model, gate: torch.Tensor) -> torch.Tensor:
    r"""log p(TARGET) at the last position with ``log gate`` ``(n,)`` on each key's logits, every layer."""
    causal = torch.full((N, N), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)  # [n, n]
    mask = (causal + gate.log()[None, :])[None, None]  # [1, 1, n, n]
    logits = model(input_ids=IDS, attention_mask=mask).logits[0, -1]
    return logits.log_softmax(-1)[TARGET]


def float64_eager(name: str):
    model = copy.deepcopy(FAMILIES[name].build()).double()
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2"])
def test_midpoint_equals_the_gradient_of_an_independent_gate(name):
    model = float64_eager(name)
    found = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]))
    half = torch.where(CONTEXT[0], 0.5, 1.0).double().requires_grad_()  # [n]
    objective = gated_objective(model, half)
    (gradient,) = torch.autograd.grad(objective, half)
    expected = torch.where(CONTEXT[0], gradient, 0.0)
    torch.testing.assert_close(found.scores[0].double(), expected, rtol=1e-5, atol=1e-7)
    assert float(found.objective[0, 0]) == pytest.approx(float(objective.detach()), rel=1e-6)
    assert found.points.tolist() == [0.5]
    if name == "llama":  # the reference's own derivative, by finite differences (the norms round in float32)
        step = 1e-3
        for j in CONTEXT[0].nonzero().flatten().tolist():
            up, down = half.detach().clone(), half.detach().clone()
            up[j] += step
            down[j] -= step
            with torch.no_grad():
                derivative = (gated_objective(model, up) - gated_objective(model, down)) / (2 * step)
            assert float(found.scores[0, j]) == pytest.approx(float(derivative), rel=1e-3, abs=2e-4), j


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_completeness_with_many_steps(name):
    r"""Many midpoints: the scores sum to log p(prompt) - log p(context masked out of every row), the latter
    read through the model's own padding mask. The gate moves a row's weights most near 0 where the context holds
    most of its attention, so the midpoint rule needs many steps there (llama: 64 steps 7% off, 256 0.5%, 1024
    0.03%)."""
    model = float64_eager(name)
    found = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]), n_steps=256)
    with torch.no_grad():
        whole = model(input_ids=IDS).logits[0, -1].log_softmax(-1)[TARGET]
        without = model(input_ids=IDS, attention_mask=(~CONTEXT).long()).logits[0, -1].log_softmax(-1)[TARGET]
    assert float(found.scores.sum()) == pytest.approx(float(whole - without), rel=1e-2)
    assert bool((found.scores[~CONTEXT] == 0).all())


def test_an_interval_is_integrated_between_its_ends():
    r"""One step on ``(0, 0.1)`` is a tenth of the independent gate's gradient at 0.05; many steps on
    ``(0.25, 1)`` sum to the gated objective's change between its ends."""
    model = float64_eager("llama")
    found = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]),
                               interval=(0.0, 0.1))
    early = torch.where(CONTEXT[0], 0.05, 1.0).double().requires_grad_()  # [n]
    (gradient,) = torch.autograd.grad(gated_objective(model, early), early)
    torch.testing.assert_close(found.scores[0].double(), 0.1 * torch.where(CONTEXT[0], gradient, 0.0), rtol=1e-5,
                               atol=1e-8)
    assert found.points.tolist() == pytest.approx([0.05])
    late = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]), n_steps=128,
                              interval=(0.25, 1.0))
    with torch.no_grad():
        change = gated_objective(model, torch.ones(N, dtype=torch.float64)) - gated_objective(
            model, torch.where(CONTEXT[0], 0.25, 1.0).double())
    assert float(late.scores.sum()) == pytest.approx(float(change), rel=1e-3)


def test_sdpa_and_eager_agree_and_the_model_is_left_unchanged():
    model = FAMILIES["llama"].build()
    before = model(input_ids=IDS).logits
    eager = knockout_gradients(float64_eager("llama").float(), IDS, CONTEXT, torch.tensor([N - 1]),
                               torch.tensor([TARGET]))
    model.set_attn_implementation("sdpa")
    sdpa = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]))
    torch.testing.assert_close(sdpa.scores, eager.scores, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model(input_ids=IDS).logits, before)


def test_a_right_padded_batch_equals_each_example_alone():
    model = float64_eager("llama")
    ids = torch.cat([IDS, IDS[:, [0, 1, 2, 3, 4, 5, 6, 0, 0]]])  # [2, n]: the second is 7 tokens, right-padded
    mask = torch.ones(2, N, dtype=torch.long)
    mask[1, 7:] = 0
    context = CONTEXT.expand(2, -1).clone()
    positions, targets = torch.tensor([N - 1, 6]), torch.tensor([TARGET, 5])
    batched = knockout_gradients(model, ids, context, positions, targets, attention_mask=mask)
    alone = knockout_gradients(model, ids[1:, :7], context[1:, :7], torch.tensor([6]), torch.tensor([5]))
    first = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]))
    torch.testing.assert_close(batched.scores[1, :7], alone.scores[0])
    torch.testing.assert_close(batched.scores[0], first.scores[0])


def test_several_targets_are_explained_as_their_sum():
    model = float64_eager("llama")
    both = knockout_gradients(model, IDS, CONTEXT, torch.tensor([[7, 8]]), torch.tensor([[3, TARGET]]))
    one = knockout_gradients(model, IDS, CONTEXT, torch.tensor([7]), torch.tensor([3]))
    other = knockout_gradients(model, IDS, CONTEXT, torch.tensor([8]), torch.tensor([TARGET]))
    torch.testing.assert_close(both.scores, one.scores + other.scores)


def test_a_foil_is_the_gradient_of_the_log_odds_and_complete_over_the_path():
    r"""With a foil the midpoint is the independent gate's gradient of ``log p(TARGET) - log p(FOIL)``, and many
    steps sum to the log-odds' change between the prompt and the context knocked out."""
    model, foil = float64_eager("llama"), 12
    found = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]),
                               foils=torch.tensor([foil]))
    half = torch.where(CONTEXT[0], 0.5, 1.0).double().requires_grad_()  # [n]
    causal = torch.full((N, N), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)  # [n, n]
    log_probs = model(input_ids=IDS, attention_mask=(causal + half.log()[None, :])[None, None]).logits[0, -1]
    log_probs = log_probs.log_softmax(-1)
    (gradient,) = torch.autograd.grad(log_probs[TARGET] - log_probs[foil], half)
    torch.testing.assert_close(found.scores[0].double(), torch.where(CONTEXT[0], gradient, 0.0), rtol=1e-5,
                               atol=1e-7)
    many = knockout_gradients(model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]), n_steps=256,
                              foils=torch.tensor([foil]))
    with torch.no_grad():
        whole = model(input_ids=IDS).logits[0, -1].log_softmax(-1)
        without = model(input_ids=IDS, attention_mask=(~CONTEXT).long()).logits[0, -1].log_softmax(-1)
    change = (whole[TARGET] - whole[foil]) - (without[TARGET] - without[foil])
    assert float(many.scores.sum()) == pytest.approx(float(change), rel=1e-2)


@pytest.mark.parametrize(("change", "message"), [
    ({"context": CONTEXT.long()}, "context must be a bool tensor"),
    ({"context": CONTEXT[:, :5]}, "context must be a bool tensor"),
    ({"context": torch.zeros_like(CONTEXT)}, "at least one context token"),
    ({"positions": torch.tensor([3])}, "at or after the first target position"),
    ({"positions": torch.tensor([N])}, "out of range"),
    ({"targets": torch.tensor([64])}, "out of range: the model.s output has"),
    ({"targets": torch.tensor([[1, 2]])}, "2 targets per example for 1 positions"),
    ({"n_steps": 0}, "n_steps must be a positive int"),
    ({"n_steps": True}, "n_steps must be a positive int"),
    ({"interval": (0.5, 0.5)}, "interval must be (a, b) with 0 <= a < b <= 1"),
    ({"interval": (-0.1, 1.0)}, "interval must be (a, b) with 0 <= a < b <= 1"),
    ({"interval": (0.0, 1.5)}, "interval must be (a, b) with 0 <= a < b <= 1"),
    ({"interval": "0,1"}, "interval must be (a, b) with 0 <= a < b <= 1"),
    ({"interval": (0.0, True)}, "interval must be (a, b) with 0 <= a < b <= 1"),
    ({"input_ids": IDS.float()}, "input_ids must be a (batch, n) integer tensor"),
    ({"foils": torch.tensor([TARGET])}, "a foil equals its target"),
    ({"foils": torch.tensor([64])}, "foil .*64.* out of range"),
    ({"foils": torch.tensor([[1, 2]])}, "foils of shape (1, 2) for targets of shape (1,)"),
    ({"foils": torch.tensor([1.0])}, "foils must be an integer tensor"),
])
def test_bad_input_is_named(change, message):
    arguments = {"input_ids": IDS, "context": CONTEXT, "positions": torch.tensor([N - 1]),
                 "targets": torch.tensor([TARGET]), **change}
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        knockout_gradients(FAMILIES["llama"].build(), **arguments)


def test_a_module_that_is_no_model_is_refused():
    with pytest.raises(UnsupportedArgumentError, match="without a transformers config"):
        knockout_gradients(torch.nn.Linear(2, 2), IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]))


def test_the_benchmarks_before_path_computes_the_same_scores(monkeypatch):
    r"""benchmarks/bench_knockout.py times the gated capture returning the output alone (the ungated eager kernel
    then runs for its weights as well): the same scores, so its ratio compares like with like, and eager attention
    runs twice per layer there, once now."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench_knockout = importlib.import_module("bench_knockout")
    model = float64_eager("llama")
    layers = len(model.model.layers)
    eager = sys.modules[type(model.model.layers[0].self_attn).__module__]
    calls, original = [], eager.eager_attention_forward
    monkeypatch.setattr(eager, "eager_attention_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    arguments = (model, IDS, CONTEXT, torch.tensor([N - 1]), torch.tensor([TARGET]))
    now = knockout_gradients(*arguments)
    assert len(calls) == layers
    monkeypatch.setattr(bench_knockout.knockout_module, "_gated", bench_knockout.output_only)
    before = knockout_gradients(*arguments)
    assert len(calls) == 3 * layers
    torch.testing.assert_close(before.scores, now.scores, rtol=0, atol=0)
