"""benchmarks/lds_anatomy.py: the Banzhaf values and the subset runs behind the LDS ceiling, against definitions."""

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captum_cw.tasks.context import context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from lds_anatomy import banzhaf, subset_logprobs, summary_table  # benchmarks/ is on the path from the line above
from peer_methods import encode_example
from peer_methods.measures import lds, lds_ablations, lds_masks


def test_banzhaf_is_each_source_mean_effect_over_the_subsets_of_the_others():
    rng = np.random.default_rng(0)
    weights, pair = rng.normal(size=4), 1.5  # an additive game plus an interaction of sources 0 and 2
    value = {s: float(np.dot(weights, s) + pair * s[0] * s[2]) for s in itertools.product((False, True), repeat=4)}
    expected = weights + np.array([pair / 2, 0.0, pair / 2, 0.0])  # the partner is present in half the subsets
    np.testing.assert_allclose(banzhaf(value), expected, atol=1e-12)
    additive = {s: float(np.dot(weights, s)) for s in value}
    np.testing.assert_allclose(banzhaf(additive), weights, atol=1e-12)  # an additive game's own weights


@pytest.fixture(scope="module")
def encoded(smollm2):
    _, tokenizer = smollm2
    return encode_example(tokenizer, context_examples("who_lives_where", 3, 0, 2)[2])


def test_subsets_give_the_lds_ablations_own_log_probabilities(smollm2, encoded):
    model, _ = smollm2
    value = subset_logprobs(model, encoded)
    assert len(value) == 2 ** len(encoded.sources)
    masks, logprobs = lds_ablations(model, encoded, 6, seed=3)
    np.testing.assert_array_equal(masks, lds_masks(len(encoded.sources), 6, 3))
    np.testing.assert_allclose([value[tuple(mask.tolist())] for mask in masks], logprobs, atol=1e-4)
    full = tuple([True] * len(encoded.sources))
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids).logits[0, -1].double()
    assert value[full] == pytest.approx(float(logits.log_softmax(-1)[encoded.target]), abs=1e-4)
    # the Banzhaf values reach the LDS of an additive model of these ablations at least as well as a constant
    assert lds(banzhaf(value), (masks, logprobs)) > lds(np.ones(len(encoded.sources)), (masks, logprobs))


def test_the_table_reads_lds_distractor_signs_and_the_evidence_share_off_the_rows():
    def row(task, evidence, scores, lds_value):
        indicator = [float(k == evidence) for k in range(len(scores))]
        return {"id": task, "task": task, "evidence only": {"lds": 0.5, "distractors_positive": 0.0,
                                                           "source_scores": indicator},
                "m": {"lds": lds_value, "distractors_positive": float(np.mean(np.delete(scores, evidence) > 0)),
                      "source_scores": scores}}
    rows = [row("a", 0, [3.0, -1.0, 0.0], 0.8), row("a", 2, [1.0, 1.0, 2.0], 0.6), row("b", 1, [0.0, 1.0], 0.1)]
    table = summary_table(rows, "model")
    assert "| | a (n 2) | b (n 1) |" in table
    # task a: LDS (0.8 + 0.6) / 2; distractors positive (0 + 1) / 2; evidence share (3/4 + 2/4) / 2
    assert "| m | 0.70 / 0.50 / 0.62 | 0.10 / 0.00 / 1.00 |" in table
    assert "| evidence only | 0.50 / 0.00 / 1.00 | 0.50 / 0.00 / 1.00 |" in table
