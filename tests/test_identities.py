"""The identities of docs/DESIGN.md section 1, the completeness delta, precision and robustness."""

import pytest
import torch

from captum_cw import AttentionWeights, ContributionWeights, ValueWeightedAttention
from captum_cw.errors import UnsupportedArgumentError
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    model = family.build()
    return model, *example_inputs(family)


def _real_rows(mask, n_layers):
    return mask.bool()[:, None, :].expand(-1, n_layers, -1)  # [batch, layer, query]


def test_intra_rows_sum_to_one_per_head(llama):
    model, ids, mask = llama
    scores = ContributionWeights(model, metric="cw_intra").attribute(ids, attention_mask=mask, per_head=True)
    sums = scores.sum(-1)  # [batch, layer, head, query]
    real = mask.bool()[:, None, None, :].expand_as(sums)
    torch.testing.assert_close(sums[real], torch.ones_like(sums[real]), rtol=0, atol=1e-5)
    assert (sums[~real] == 0).all()


def test_inter_rows_sum_to_one_over_heads_and_keys(llama):
    model, ids, mask = llama
    scores, delta = ContributionWeights(model).attribute(ids, attention_mask=mask, return_convergence_delta=True)
    sums = scores.sum(-1)  # heads already summed: [batch, layer, query]
    real = _real_rows(mask, sums.shape[1])
    torch.testing.assert_close(sums[real], torch.ones_like(sums[real]), rtol=0, atol=1e-5)
    assert delta.shape == (ids.shape[0],)
    assert (delta < 1e-5).all()
    per_head = ContributionWeights(model, heads=[0]).attribute(ids, attention_mask=mask)
    assert not torch.allclose(per_head.sum(-1)[real], torch.ones_like(per_head.sum(-1)[real]))


def test_delta_reports_a_broken_identity(llama, monkeypatch):
    import dataclasses

    from captum_cw import metrics

    model, ids, mask = llama
    original = metrics.get_metric("cw_inter")
    broken = dataclasses.replace(original, per_head=lambda geometry: original.per_head(geometry) * 1.5)
    monkeypatch.setitem(metrics._REGISTERED, "cw_inter", broken)  # register_metric never replaces one
    _, delta = ContributionWeights(model).attribute(ids, attention_mask=mask, return_convergence_delta=True)
    torch.testing.assert_close(delta, torch.full_like(delta, 0.5), rtol=0, atol=1e-4)


def test_three_factor_decomposition_and_negative_values(llama):
    model, ids, mask = llama
    for metric in ("cw_inter", "cw_intra"):
        attributor = ContributionWeights(model, metric=metric)
        factors = attributor.attribute_factors(ids, attention_mask=mask)
        scores = attributor.attribute(ids, attention_mask=mask, per_head=True)
        torch.testing.assert_close(factors.attention * factors.relative_norm * factors.cosine, scores,
                                   rtol=1e-5, atol=1e-6)
        assert (factors.cosine.abs() <= 1 + 1e-6).all()
        assert (scores < 0).any(), "destructive interference should give negative contributions"


def test_masked_keys_and_padded_rows_are_exactly_zero(llama):
    model, ids, mask = llama
    scores = ContributionWeights(model).attribute(ids, attention_mask=mask)
    padded = ~mask.bool()
    assert (scores[1][:, :, padded[1]] == 0).all()  # padded keys
    assert (scores[1][:, padded[1], :] == 0).all()  # padded query rows
    future = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
    assert (scores[:, :, future] == 0).all()  # causal


def test_zero_output_norm_gives_zero_not_nan(llama):
    model, ids, mask = llama
    layer = model.model.layers[0].self_attn
    saved = layer.o_proj.weight.data.clone()
    layer.o_proj.weight.data.zero_()
    try:
        for metric in ("cw_inter", "cw_intra"):
            scores = ContributionWeights(model, layers=[0], metric=metric).attribute(ids, attention_mask=mask)
            assert torch.isfinite(scores).all() and (scores == 0).all()
    finally:
        layer.o_proj.weight.data.copy_(saved)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_are_scored_in_float32(llama, dtype):
    model, ids, mask = llama
    reference = ContributionWeights(model).attribute(ids, attention_mask=mask)
    half = FAMILIES["llama"].build().to(dtype)
    scores = ContributionWeights(half).attribute(ids, attention_mask=mask)
    assert scores.dtype == torch.float32
    assert torch.isfinite(scores).all()
    torch.testing.assert_close(scores, reference, rtol=0, atol=0.05)


def test_batch_encoding_and_dict_inputs(llama):
    model, ids, mask = llama
    expected = AttentionWeights(model).attribute(ids, attention_mask=mask)
    torch.testing.assert_close(AttentionWeights(model).attribute({"input_ids": ids, "attention_mask": mask}), expected)
    from transformers import BatchEncoding

    encoding = BatchEncoding({"input_ids": ids, "attention_mask": mask})
    torch.testing.assert_close(AttentionWeights(model).attribute(encoding), expected)


def test_value_weighted_has_no_delta(llama):
    model, ids, mask = llama
    with pytest.raises(UnsupportedArgumentError, match="no completeness identity"):  # a TypeError, as Captum's
        ValueWeightedAttention(model).attribute(ids, return_convergence_delta=True)

