"""Value masking is exact: the masked layer output is the clean one minus the removed terms."""

import pytest
import torch

from captum_cw.interventions import knockout_tokens, mask_values, scale_values
from tiny_models import FAMILIES, example_inputs


def _layer_run(model, family, ids, mask, layer):
    """alpha, v per head and the projected attention output of one layer (float64 brute force)."""
    attention = [m for m in model.modules() if type(m).__name__ == family.attention_class][layer]
    projection = family.projection(model, attention)
    seen = {}

    def keep(name, transform=lambda out: out):
        def hook(module, args, out):  # returns None: the model's own output stays
            seen.setdefault(name, transform(out))

        return hook

    hooks = [
        attention.get_submodule(family.value_path).register_forward_hook(
            keep("v", lambda out: family.value_of(attention, out))),
        projection.register_forward_hook(keep("out")),
    ]
    with torch.no_grad():
        output = model(ids, attention_mask=mask, output_attentions=True)
    for hook in hooks:
        hook.remove()
    weight = family.projection_weight(projection)
    return output.attentions[layer], seen["v"], seen["out"], weight


def _projected_values(v, weight, n_heads):
    """vt[h, j] = v[h, j] @ W_O[h] ``(batch, head, n, d_model)`` from the value projection's output
    ``(batch, n, kv_heads * d)`` and W_O ``(heads * d, d_model)``, each KV head repeated for its query heads."""
    batch, n = v.shape[:2]
    w_o = weight.reshape(n_heads, -1, weight.shape[1])  # [head, d, d_model]
    v = v.reshape(batch, n, -1, w_o.shape[1]).transpose(1, 2).repeat_interleave(
        n_heads // (v.shape[-1] // w_o.shape[1]), dim=1)  # [batch, head, n, d]
    return torch.einsum("bhnd,hdm->bhnm", v, w_o)

@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_masked_output_is_clean_minus_removed_terms(name, renormalize):
    family = FAMILIES[name]
    model = family.build().double()
    model.set_attn_implementation("eager")
    ids, _ = example_inputs(family)
    mask = None
    layer = 1
    alpha, v, clean, weight = _layer_run(model, family, ids, mask, layer)
    batch, heads, n, _ = alpha.shape
    vt = _projected_values(v, weight, heads)  # [batch, head, n, d_model]

    removal = torch.zeros(batch, heads, n, n, dtype=torch.bool)
    removal[0, 1, -1, [0, 3]] = True  # one head, one row, two keys
    removal[1, :, 5, 2] = True  # every head
    with mask_values(model, {layer: removal}, renormalize=renormalize):
        _, _, masked, _ = _layer_run(model, family, ids, mask, layer)

    kept = alpha.masked_fill(removal, 0.0)
    if renormalize:
        kept = kept / kept.sum(-1, keepdim=True)
        expected = clean - torch.einsum("bhij,bhjm->bim", alpha, vt) + torch.einsum("bhij,bhjm->bim", kept, vt)
    else:
        expected = clean - torch.einsum("bhij,bhjm->bim", alpha * removal, vt)
    untouched = torch.ones(batch, n, dtype=torch.bool)
    untouched[0, -1] = untouched[1, 5] = False
    # transformers' eager softmax runs in float32 even for a float64 model: its alpha is float32-exact
    torch.testing.assert_close(masked[~untouched], expected[~untouched], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(masked[untouched], clean[untouched], rtol=0, atol=1e-12)


def test_nothing_removed_changes_nothing_and_model_is_restored():
    family = FAMILIES["llama"]
    model = family.build()
    ids, mask = example_inputs(family)
    with torch.no_grad():
        clean = model(ids, attention_mask=mask).logits
        removal = torch.zeros(2, 1, 9, 9, dtype=torch.bool)
        with mask_values(model, {0: removal, 1: removal}):
            same = model(ids, attention_mask=mask).logits
        after = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(same[real], clean[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, clean, rtol=0, atol=0)


def test_knockout_removes_the_token_everywhere():
    family = FAMILIES["llama"]
    model = family.build()
    ids, _ = example_inputs(family)
    ids = ids[:1]
    tokens = torch.zeros(1, 9, dtype=torch.bool)
    tokens[0, 2] = True
    with torch.no_grad(), knockout_tokens(model, tokens):
        knocked = model(ids).logits
        # positions before the knocked-out token cannot read it anyway
    with torch.no_grad():
        clean = model(ids).logits
    torch.testing.assert_close(knocked[0, :3], clean[0, :3], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(knocked[0, 3:], clean[0, 3:])


def test_bad_removal_masks():
    family = FAMILIES["llama"]
    model = family.build()
    ids, _ = example_inputs(family)
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        with mask_values(model, {5: torch.zeros(1, 1, 9, 9, dtype=torch.bool)}):
            pass
    with pytest.raises(ValueError, match="removal mask has shape"):
        with torch.no_grad(), mask_values(model, {0: torch.zeros(2, 1, 8, 8, dtype=torch.bool)}):
            model(ids)


def test_an_intervention_on_every_row_skips_the_kernel_and_matches_it(monkeypatch):
    from transformers.modeling_utils import AttentionInterface

    family = FAMILIES["llama"]
    model = family.build()
    model.set_attn_implementation("sdpa")
    ids, _ = example_inputs(family)
    n, n_layers = ids.shape[1], model.config.num_hidden_layers
    kernel = AttentionInterface._global_mapping["sdpa"]
    calls = []
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    every_row = torch.zeros(1, 1, n, n, dtype=torch.bool)
    every_row[..., 0] = True  # no row reads token 0 (row 0 reads nothing)
    last_row = every_row & (torch.arange(n) == n - 1)[:, None]
    with torch.no_grad():
        with mask_values(model, {0: every_row}):
            model(ids)  # the first time, the kernel runs once to check that the recomputation reproduces it
            calls.clear()
            skipped = model(ids).logits
        assert len(calls) == n_layers - 1  # layer 0's output came from the kept terms alone
        calls.clear()
        with mask_values(model, {0: last_row}):
            model(ids)
        assert len(calls) == n_layers  # one row changes: the kernel's other rows are kept
        model.set_attn_implementation("eager")  # the kernel's output, less the removed terms
        with mask_values(model, {0: every_row & ~last_row}), mask_values(model, {0: last_row}):
            corrected = model(ids).logits
    torch.testing.assert_close(skipped, corrected, rtol=1e-5, atol=1e-5)


def test_nested_removals_add_up_when_the_inner_one_changes_every_row():
    family = FAMILIES["llama"]
    model = family.build().double()
    ids, _ = example_inputs(family)
    n = ids.shape[1]
    every_row = torch.zeros(1, 1, n, n, dtype=torch.bool)
    every_row[..., 0] = True  # every row loses key 0: the inner capture could rebuild the output itself
    some_rows = torch.zeros(1, 1, n, n, dtype=torch.bool)
    some_rows[..., 1:, 1] = True
    with torch.no_grad():
        with mask_values(model, {0: every_row | some_rows}):
            union = model(ids).logits
        with mask_values(model, {0: some_rows}), mask_values(model, {0: every_row}):
            nested = model(ids).logits  # the inner removal starts from the outer one's output
    torch.testing.assert_close(nested, union)


def test_a_kernel_the_recomputation_does_not_reproduce_keeps_its_own_output():
    from transformers import AutoModelForCausalLM, GptOssConfig

    torch.manual_seed(0)
    config = GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                          num_experts_per_tok=1, layer_types=["full_attention"] * 2, initializer_range=0.2)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 2)  # learned sink logits: alpha @ V alone is not the kernel's output
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    almost_all = torch.ones(1, 1, 9, 9)
    almost_all[..., 0] = 1 - 1e-6  # every row keeps all but a millionth of key 0's term
    with torch.no_grad():
        clean = model(ids).logits
        with scale_values(model, {0: almost_all}):
            scaled = model(ids).logits
    torch.testing.assert_close(scaled, clean, rtol=0, atol=1e-4)


def test_a_removal_mask_for_another_batch_size_is_refused():
    family = FAMILIES["llama"]
    model = family.build()
    ids, _ = example_inputs(family)
    n = ids.shape[1]
    with pytest.raises(ValueError, match="expected \\(2 or 1"):
        with torch.no_grad(), mask_values(model, {0: torch.zeros(3, 1, n, n, dtype=torch.bool)}):
            model(ids)
