"""AttentionCall.alpha on hand-made queries, keys and masks, against the softmax written out."""

import math

import pytest
import torch

from captum_cw.capture import AttentionCall

BATCH, HEADS, KV_HEADS, N, D = 2, 4, 2, 5, 3


def _call(mask, implementation="eager", *, is_causal=True) -> AttentionCall:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(BATCH, HEADS, N, D, generator=generator)
    key = torch.randn(BATCH, KV_HEADS, N, D, generator=generator)
    value = torch.randn(BATCH, KV_HEADS, N, D, generator=generator)
    return AttentionCall(None, query, key, value, lambda: (torch.zeros(BATCH, N, HEADS, D),), mask, implementation,
                         D**-0.5, None, None, is_causal)


def _written_out(call: AttentionCall, allowed: torch.Tensor) -> torch.Tensor:
    r"""alpha[b, h, i, j] = exp(s_ij) / sum over allowed j' of exp(s_ij'), 0 where j is not allowed."""
    alpha = torch.zeros(BATCH, HEADS, N, N, dtype=torch.float64)
    for b in range(BATCH):
        for h in range(HEADS):
            key = call.key[b, h // (HEADS // KV_HEADS)].double()
            for i in range(N):
                scores = [float(call.query[b, h, i].double() @ key[j]) * call.scaling for j in range(N)]
                kept = [j for j in range(N) if allowed[b, i, j]]
                total = sum(math.exp(scores[j]) for j in kept)
                for j in kept:
                    alpha[b, h, i, j] = math.exp(scores[j]) / total
    return alpha


def test_causal_alpha_matches_the_softmax_written_out():
    call = _call(None, implementation="sdpa")
    causal = torch.ones(N, N, dtype=torch.bool).tril().expand(BATCH, N, N)
    alpha = call.alpha(torch.arange(N))
    torch.testing.assert_close(alpha.double(), _written_out(call, causal), atol=1e-6, rtol=0)


@pytest.mark.parametrize("as_bool", [True, False])
def test_a_row_without_allowed_keys_is_zero_not_nan(as_bool):
    allowed = torch.ones(BATCH, N, N, dtype=torch.bool).tril()
    allowed[0, 2] = False  # batch 0, row 2 may read nothing (a padded query)
    allowed[1, 4, :2] = False
    mask = allowed[:, None] if as_bool else torch.where(allowed[:, None], 0.0, torch.finfo(torch.float32).min)
    call = _call(mask)
    alpha = call.alpha(torch.arange(N))
    assert not alpha.isnan().any()
    assert (alpha[0, :, 2] == 0).all()
    torch.testing.assert_close(alpha.double(), _written_out(call, allowed), atol=1e-6, rtol=0)
    rows = torch.tensor([2, 4])
    torch.testing.assert_close(call.alpha(rows), alpha[:, :, rows])


# --- thread and nesting safety of the registry patch ---

import sys  # noqa: E402
import threading  # noqa: E402

from transformers.modeling_utils import AttentionInterface  # noqa: E402

from captum_cw import ContributionWeights  # noqa: E402
from captum_cw.architectures import find_attention_layers  # noqa: E402
from captum_cw.capture import capture_attention  # noqa: E402
from tiny_models import FAMILIES, example_inputs  # noqa: E402


def _registry() -> dict:
    return dict(AttentionInterface._global_mapping)


@pytest.mark.parametrize("same_model", [False, True])
def test_two_threads_attribute_at_once(same_model):
    models = [FAMILIES["llama"].build(), FAMILIES["qwen2"].build()]
    if same_model:
        models[1] = models[0]
    for model in models:
        model.set_attn_implementation("sdpa")
    ids, mask = example_inputs(FAMILIES["llama"])
    expected = [ContributionWeights(model).attribute(ids, attention_mask=mask) for model in models]
    before = _registry()
    failures, results = [], {0: [], 1: []}
    start = threading.Barrier(2)

    def work(k):
        start.wait()
        try:
            for _ in range(15):
                results[k].append(ContributionWeights(models[k]).attribute(ids, attention_mask=mask))
        except Exception as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    for k in (0, 1):
        assert len(results[k]) == 15
        for scores in results[k]:
            torch.testing.assert_close(scores, expected[k], rtol=0, atol=0)
    assert _registry() == before
    models[0](ids, attention_mask=mask)  # the model still runs after the captures are gone


def test_interleaved_and_nested_captures_route_calls_and_restore_the_registry():
    model = FAMILIES["llama"].build()
    model.set_attn_implementation("sdpa")
    ids, _ = example_inputs(FAMILIES["llama"])
    first, second = [layer.attention for layer in find_attention_layers(model)]
    before = _registry()
    seen = {"outer": [], "inner": []}
    outer = capture_attention(model, [first, second], lambda call: seen["outer"].append(call.module))
    inner = capture_attention(model, [second], lambda call: seen["inner"].append(call.module))
    outer.__enter__()
    inner.__enter__()
    model(ids)
    assert seen == {"outer": [first, second], "inner": [second]}
    outer.__exit__(None, None, None)  # exits out of order: inner stays active
    model(ids)
    assert seen["outer"] == [first, second] and seen["inner"] == [second, second]
    inner.__exit__(None, None, None)
    assert _registry() == before
    expected = model(ids).logits
    with capture_attention(model, [first], lambda call: None):
        with pytest.raises(RuntimeError, match="boom"), capture_attention(model, [first], _boom):
            model(ids)
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert _registry() == before


def _boom(call):
    raise RuntimeError("boom")


def test_nested_replacements_compose_outermost_first():
    model = FAMILIES["llama"].build()
    ids, _ = example_inputs(FAMILIES["llama"])
    attention = find_attention_layers(model)[0].attention
    seen = []
    with capture_attention(model, [attention], lambda call: call.output * 2):
        with capture_attention(model, [attention], lambda call: seen.append(call.output.clone())):
            doubled = model(ids).logits
    with capture_attention(model, [attention], lambda call: seen.append(call.output.clone())):
        plain = model(ids).logits
    torch.testing.assert_close(seen[0], seen[1] * 2)
    assert not torch.allclose(doubled, plain)


def test_a_replacement_with_weights_skips_the_eager_kernel_and_returns_its_weights(monkeypatch):
    model = FAMILIES["llama"].build()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(FAMILIES["llama"])
    attention = find_attention_layers(model)[0].attention
    module = sys.modules[type(attention).__module__]
    original, runs = module.eager_attention_forward, []

    def counted(*arguments, **kwargs):
        runs.append(kwargs.get("attention_mask", arguments[4] if len(arguments) > 4 else None))
        return original(*arguments, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", counted)

    def halved_first_key(call):  # gate key 0 by 1/2 in every row: weights differ from the ungated kernel's
        gate = torch.zeros(call.key.shape[2])
        gate[0] = math.log(0.5)
        return call.rerun(call.query, call.key, call.value, call.mask + gate)[:2]

    with capture_attention(model, [attention], halved_first_key):
        gated = model(ids, output_attentions=True)
    assert len(runs) == 2  # the rerun in layer 0 and layer 1's plain call: layer 0's own kernel never ran
    plain = model(ids, output_attentions=True)
    weights, plain_weights = gated.attentions[0], plain.attentions[0]  # [batch, head, query, key]
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    expected = plain_weights.clone()
    expected[..., 0] *= 0.5
    expected /= expected.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected)


def test_a_later_plain_replacement_drops_the_given_weights_and_none_keeps_them():
    model = FAMILIES["llama"].build()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(FAMILIES["llama"])
    attention = find_attention_layers(model)[0].attention
    plain = model(ids, output_attentions=True).attentions[0]  # [batch, head, query, key]
    uniform = lambda call: (call.output, torch.full_like(plain, 0.25))  # noqa: E731
    with capture_attention(model, [attention], uniform):
        with capture_attention(model, [attention], lambda call: None):
            kept = model(ids, output_attentions=True).attentions[0]
        with capture_attention(model, [attention], lambda call: call.output * 1.0):
            dropped = model(ids, output_attentions=True).attentions[0]
    torch.testing.assert_close(kept, torch.full_like(plain, 0.25))
    torch.testing.assert_close(dropped, plain)
