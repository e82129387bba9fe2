"""Contribution weights as inseq's "contribution_weights" method (captum_cw/inseq_method.py): registration on
import, and inseq's scores equal to captum_cw's for every generated token, forced or generated, batched or not."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from conftest import require

inseq = require("inseq")

import captum_cw.inseq_method  # noqa: E402  (registers "contribution_weights")
from captum_cw import ContributionWeights, TokenContributions  # noqa: E402
from reference import reference_metrics  # noqa: E402
from tiny_models import FAMILIES  # noqa: E402


def close(actual, expected):
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def inseq_tiny(tiny_llm_dir):
    """inseq's own loading of the two-layer random Llama folder (tests/conftest.py), by path."""
    return inseq.load_model(str(tiny_llm_dir), "contribution_weights")


def _ids(sequence) -> torch.Tensor:
    return torch.tensor([[token.id for token in sequence.target]])  # [1, n] the whole sequence inseq attributed


def _check_steps(sequence, expected: torch.Tensor) -> None:
    r"""Generated token ``g`` at position ``p`` has row ``p - 1`` of ``expected`` ``(layer, [head,] query, key)``."""
    scores = sequence.target_attributions  # [n, n_generated, layer, (head)]
    n, generated = scores.shape[:2]
    assert n == _ids(sequence).shape[1]
    for g in range(generated):
        p = n - generated + g
        row = expected[..., p - 1, :p]  # [layer, (head), key]
        close(scores[:p, g], row.movedim(-1, 0))
        assert scores[p:, g].isnan().all()  # keys after the prefix: inseq's padding


def test_registered_when_the_module_is_imported():
    code = ("import inseq; before = 'contribution_weights' in inseq.list_feature_attribution_methods(); "
            "import captum_cw.inseq_method; print(before, 'contribution_weights' in "
            "inseq.list_feature_attribution_methods())")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "True"]


def test_forced_target_equals_brute_force_and_token_contributions(inseq_tiny):
    out = inseq_tiny.attribute("The capital of France is", "The capital of France is Paris, of course",
                               show_progress=False)
    sequence = out.sequence_attributions[0]
    ids = _ids(sequence)
    assert sequence.target_attributions.shape[1:] == (4, 2)  # 4 generated tokens, 2 layers
    brute = reference_metrics(FAMILIES["llama"], inseq_tiny.model, ids, None)["cw_inter"].sum(2)[0]
    _check_steps(sequence, brute)  # [layer, query, key], heads summed
    _check_steps(sequence, ContributionWeights(inseq_tiny.model).attribute(ids)[0])
    # inseq's aggregation (mean over layers) is TokenContributions' layer_aggregation="mean"; by default inseq then
    # divides each step by its L1 norm, which is not 1 when some contributions are negative
    aggregated = out.aggregate(normalize=False).sequence_attributions[0].target_attributions  # [n, n_generated]
    n = ids.shape[1]
    positions = torch.arange(n - 4, n) - 1
    expected = TokenContributions(inseq_tiny.model).attribute(ids.expand(4, n), position=positions)  # [4, n]
    close(aggregated.T.nan_to_num(), expected)
    normalized = out.aggregate().sequence_attributions[0].target_attributions.T.nan_to_num()
    close(normalized, expected / expected.abs().sum(-1, keepdim=True))


def test_load_arguments_and_per_head(tiny_llm_dir):
    model = inseq.load_model(str(tiny_llm_dir), "contribution_weights", layers=[-1, 0], heads=[3, 1], metric="intra")
    with pytest.warns(DeprecationWarning, match="contribution_weights: variant= is deprecated; pass metric="):
        deprecated = inseq.load_model(str(tiny_llm_dir), "contribution_weights", variant="intra")
    assert deprecated.attribution_method.method.attributor.metric.name == "cw_intra"
    out = model.attribute("Rome is the capital city of", generation_args={"max_new_tokens": 3}, per_head=True,
                          show_progress=False)
    sequence = out.sequence_attributions[0]
    assert sequence.target_attributions.shape[2:] == (2, 2)  # layers, heads
    expected = ContributionWeights(model.model, layers=[-1, 0], heads=[3, 1], metric="cw_intra").attribute(
        _ids(sequence), per_head=True)[0]  # [layer, head, query, key]
    _check_steps(sequence, expected)


def test_prompts_of_different_lengths_each_get_their_own_unpadded_scores(inseq_tiny):
    # generated together (left padding); inseq 0.7.1 would shift the shorter prompt's rows in one padded batch
    out = inseq_tiny.attribute(["The capital of France is", "Hi"], generation_args={"max_new_tokens": 2},
                               batch_size=2, show_progress=False)
    assert len(out.sequence_attributions) == 2
    for sequence in out.sequence_attributions:
        ids = _ids(sequence)
        _check_steps(sequence, ContributionWeights(inseq_tiny.model).attribute(ids)[0])


def test_encoder_decoder_models_are_refused():
    model = SimpleNamespace(is_encoder_decoder=True, model=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="decoder-only"):
        captum_cw.inseq_method.ContributionWeightsAttribution(model)
