"""Rankings kept by --save-rankings, and rank agreement between metrics (Kendall, Spearman) against scipy."""

import numpy as np
import pytest
import torch
from scipy import stats

from captum_cw import ContributionWeights
from captum_cw.evaluation import load_examples
from captum_cw.evaluation.agreement import leaves, rank_agreement
from captum_cw.evaluation.protocols import ProtocolConfig, evaluate_example
from captum_cw.evaluation.report import agreement_matrix, summarize
from captum_cw.evaluation.sequences import encode
from captum_cw.models import load_model
from captum_cw.statistics import kendall_tau, spearman_rho
from conftest import TEST_DATA

DATA = str(TEST_DATA)


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def test_kendall_and_spearman_match_scipy():
    rng = np.random.default_rng(0)
    for m in (2, 3, 7, 40):
        positions = rng.choice(100, size=m, replace=False)  # any positions, the same set for both rankings
        first = np.stack([rng.permutation(positions) for _ in range(5)])
        second = np.stack([rng.permutation(positions) for _ in range(5)])
        for a, b, tau, rho in zip(first, second, kendall_tau(first, second), spearman_rho(first, second)):
            rank_a = {int(p): r for r, p in enumerate(a)}  # scipy gets each position's rank under both
            rank_b = {int(p): r for r, p in enumerate(b)}
            x = [rank_a[p] for p in sorted(rank_a)]
            y = [rank_b[p] for p in sorted(rank_a)]
            assert tau == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
            assert rho == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert kendall_tau(np.array([3, 1, 2]), np.array([3, 1, 2]))[0] == 1
    assert spearman_rho(np.array([3, 1, 2]), np.array([2, 1, 3]))[0] == -1


def _interval(values):
    return {"mean": float(np.mean(values)) if values else float("nan"), "ci_low": 0.0, "ci_high": 0.0,
            "n": len(values)}


def test_rank_agreement_averages_rankings_then_examples():
    assert leaves([[[1, 2]], [[3, 4, 5]]]) == [[1, 2], [3, 4, 5]] and leaves([4, 2]) == [[4, 2]]
    records = [
        {"rankings": {"a": [[[0, 1, 2], [5]]], "b": [[[0, 1, 2], [5]]], "c": [[[2, 1, 0], [5]]]}},  # 1, 1, -1
        {"rankings": {"a": [[[0, 1, 2, 3], [1, 0]]], "b": [[[1, 0, 2, 3], [1, 0]]], "c": [[[3, 2, 1, 0], [0, 1]]]}},
        {"id": "no-rankings"},  # left out
    ]
    agreement = rank_agreement(records, _interval)
    tau_ab_second = (2 / 3 + 1) / 2  # one swapped pair of six, and an identical pair of two
    assert agreement["kendall"]["a"]["b"]["mean"] == pytest.approx((1 + tau_ab_second) / 2)
    assert agreement["kendall"]["a"]["c"]["mean"] == pytest.approx(-1)
    assert agreement["spearman"]["a"]["b"]["mean"] == pytest.approx((1 + (1 - 6 * 2 / (4 * 15) + 1) / 2) / 2)
    assert agreement["kendall"]["a"]["b"]["n"] == 2 and set(agreement["kendall"]) == {"a", "b"}
    assert rank_agreement([{"id": "x"}], _interval) == {}


def _ranked_by_hand(scores, eligible):
    """Eligible positions by score, highest first, ties by position."""
    return sorted((j for j in range(len(scores)) if eligible[j]), key=lambda j: (-float(scores[j]), j))


@pytest.mark.parametrize("granularity", ["token", "head"])
def test_layer_level_rankings_are_the_last_rows_of_each_metric(tiny, granularity):
    model, tokenizer = tiny
    encoded = encode(load_examples("winogrande", 1, DATA)[0], tokenizer, max_tokens=64)  # two sequences
    config = ProtocolConfig(metrics=("cw_inter", "random"), bins=(50,), save_rankings=True, granularity=granularity)
    record = evaluate_example(model, encoded, config)
    rankings = record["rankings"]["cw_inter"]
    assert len(rankings) == len(encoded.sequences)
    for s, ids in enumerate(encoded.sequences):
        per_head = granularity == "head"
        scores = ContributionWeights(model).attribute(ids[None], per_head=per_head)[0]  # [layer, (head,) n, n]
        eligible = ~encoded.special[s]
        for layer in range(scores.shape[0]):
            if per_head:
                for head in range(scores.shape[1]):
                    assert rankings[s][layer][head] == _ranked_by_hand(scores[layer, head, -1], eligible)
            else:
                assert rankings[s][layer] == _ranked_by_hand(scores[layer, -1], eligible)
        random = record["rankings"]["random"][s]
        assert all(sorted(leaf) == sorted(rankings[s][0] if not per_head else rankings[s][0][0])
                   for leaf in leaves(random))


def test_input_level_rankings_and_the_summary_agreement(tiny):
    model, tokenizer = tiny
    examples = [encode(e, tokenizer, max_tokens=48) for e in load_examples("boolq", 3, DATA)]
    config = ProtocolConfig(protocol="input", metrics=("ig", "cw_last", "random"), bins=(50,), ig_steps=3,
                            save_rankings=True)
    records = [evaluate_example(model, encoded, config) for encoded in examples]
    for encoded, record in zip(examples, records):
        ids = encoded.sequences[encoded.choices[record["clean"]["prediction"]].sequence]
        choice = encoded.choices[record["clean"]["prediction"]]
        scores = ContributionWeights(model).attribute(ids[None])[0][-1, choice.start]  # last layer, predicting row
        shared = min(c.start + 1 for c in encoded.choices)  # boolq: one context for both answers
        eligible = torch.zeros(len(ids), dtype=torch.bool)
        eligible[:shared] = ~encoded.special[0][:shared]
        assert record["rankings"]["cw_last"] == _ranked_by_hand(scores, eligible)
        assert sorted(record["rankings"]["ig"]) == sorted(record["rankings"]["cw_last"])
    summary = summarize(records)
    by_hand = [stats.kendalltau(*[[r["rankings"][m].index(p) for p in sorted(r["rankings"]["ig"])]
                                  for m in ("ig", "cw_last")]).statistic for r in records]
    assert summary["rank_agreement"]["kendall"]["ig"]["cw_last"]["mean"] == pytest.approx(np.mean(by_hand))
    assert summary["rank_agreement"]["kendall"]["ig"]["cw_last"]["n"] == 3
    by_hand = [stats.kendalltau(*[[r["rankings"][m].index(p) for p in sorted(r["rankings"]["ig"])]
                                  for m in ("cw_last", "random")]).statistic for r in records]
    header, *rows = agreement_matrix(summary)
    assert header == ["", "ig", "cw_last", "random"] and [row[0] for row in rows] == header[1:]
    assert [rows[i][i + 1] for i in range(3)] == ["1", "1", "1"]  # each ranking with itself
    assert rows[1][3] == rows[2][2] == f"{np.mean(by_hand):.3f}"  # symmetric, whichever way the pair is stored
    assert agreement_matrix({"aopc": {"ig": {}}}) == []  # no rankings kept
