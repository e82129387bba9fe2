"""AttentionCall.alpha on hand-made queries, keys and masks, against the softmax written out."""

import math

import pytest
import torch

from captum_cw.capture import AttentionCall

BATCH, HEADS, KV_HEADS, N, D = 2, 4, 2, 5, 3


def _call(mask, implementation="eager", is_causal=True) -> AttentionCall:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(BATCH, HEADS, N, D, generator=generator)
    key = torch.randn(BATCH, KV_HEADS, N, D, generator=generator)
    value = torch.randn(BATCH, KV_HEADS, N, D, generator=generator)
    return AttentionCall(None, query, key, value, torch.zeros(BATCH, N, HEADS, D), mask, implementation,
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
