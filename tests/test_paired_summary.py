"""Summaries compare CW with every other metric example by example: win rates, sign and Wilcoxon tests."""

import numpy as np
import pytest
from scipy import stats

from captum_cw.evaluation.report import paired_cells, paired_reversals, summarize, summary_lines
from captum_cw.statistics import wilson_interval

BINS = ("10", "50")
MODES = ("comprehensiveness", "sufficiency")


def _text_records(values):
    r"""Text records from ``values[metric][mode]``: ``(examples, bins)`` delta NLLs; delta PPL is their exp - 1."""
    n = len(next(iter(next(iter(values.values())).values())))
    return [{"id": f"gsm8k-{i}", "label": None, "clean": {"nll": 2.0},
             "results": {metric: {mode: {b: {"delta_nll": float(by_mode[mode][i][k]),
                                             "delta_ppl": float(np.expm1(by_mode[mode][i][k]))}
                                         for k, b in enumerate(BINS)} for mode in MODES}
                         for metric, by_mode in values.items()}}
            for i in range(n)]


def test_text_summaries_test_cw_against_each_metric_on_both_measures():
    rng = np.random.default_rng(0)
    values = {m: {mode: rng.normal(shift, 1, (40, 2)) for mode in MODES}
              for m, shift in (("attention", 0.0), ("cw_inter", 0.3), ("random", -0.2))}
    summary = summarize(_text_records(values))
    assert summary["paired"]["reference"] == "cw_inter"
    assert set(summary["paired"]["measures"]) == {"delta_nll", "delta_ppl"}
    for measure, transform in (("delta_nll", lambda x: x), ("delta_ppl", np.expm1)):
        for metric in ("attention", "random"):
            for mode in MODES:
                cw, other = (transform(values[m][mode]).mean(1) for m in ("cw_inter", metric))  # [example] AOPCs
                differences = cw - other if mode == "comprehensiveness" else other - cw
                wins = int((differences > 0).sum())
                row = summary["paired"]["measures"][measure][metric][mode]
                assert (row["n"], row["wins"], row["win_rate"]) == (40, wins, wins / 40)
                assert (row["win_low"], row["win_high"]) == pytest.approx(wilson_interval(wins, 40))
                assert row["sign_p"] == pytest.approx(stats.binomtest(wins, 40).pvalue)
                assert row["wilcoxon_p"] == pytest.approx(stats.wilcoxon(differences, method="approx").pvalue)
    rows = paired_cells(summary)
    assert [row[:2] for row in rows] == [("attention", "delta_nll"), ("attention", "delta_ppl"),
                                         ("random", "delta_nll"), ("random", "delta_ppl")]
    row = summary["paired"]["measures"]["delta_ppl"]["random"]["sufficiency"]
    assert rows[3][5] == f"{row['win_rate']:.2f} [{row['win_low']:.2f}, {row['win_high']:.2f}]"
    lines = summary_lines(summary, "gsm8k")
    start = next(i for i, line in enumerate(lines) if line.startswith("cw_inter against each metric"))
    assert lines[start + 2].split()[:2] == ["attention", "delta_nll"] and len(lines[start + 1].split()) > 8


def test_a_mean_that_hides_a_reversal_is_said():
    # cw_inter loses on 16 of 20 texts by a little and wins on 4 by a lot: its mean is the better one
    cw = np.array([[0.0, 0.0]] * 16 + [[10.0, 10.0]] * 4)
    attention = np.full((20, 2), 0.1)
    values = {"attention": {m: attention for m in MODES}, "cw_inter": {"comprehensiveness": cw,
                                                                       "sufficiency": attention}}
    summary = summarize(_text_records(values))
    row = summary["paired"]["measures"]["delta_nll"]["attention"]["comprehensiveness"]
    assert (row["wins"], row["ties"], row["mean_difference"]) == (4, 0, pytest.approx((4 * 9.9 - 16 * 0.1) / 20))
    low, high = wilson_interval(4, 20)
    assert high < 0.5
    sentences = paired_reversals(summary)
    assert sentences[0] == ("comprehensiveness (delta_nll): cw_inter's mean AOPC is more faithful than attention's, "
                            f"but cw_inter is more faithful on 20% of the texts (95% interval [{low:.0%}, {high:.0%}]) "
                            f"and less on 80%; sign test p = {stats.binomtest(4, 20).pvalue:.3f}.")
    assert len(sentences) == 2  # delta_ppl reverses too; sufficiency ties on every text
    assert summary["paired"]["measures"]["delta_nll"]["attention"]["sufficiency"]["ties"] == 20
    assert f"reversal: {sentences[0]}" in summary_lines(summary, "gsm8k")


@pytest.mark.parametrize("wins, n", [(1, 5), (9, 20)])
def test_a_split_that_cannot_be_told_from_even_reverses_nothing(wins, n):
    # cw_inter's mean is the better one and it wins fewer than half the texts, but the win rate's interval holds 50%
    cw = np.array([[0.0, 0.0]] * (n - wins) + [[10.0, 10.0]] * wins)
    attention = np.full((n, 2), 0.1)
    values = {"attention": {m: attention for m in MODES}, "cw_inter": {m: cw for m in MODES}}
    summary = summarize(_text_records(values))
    row = summary["paired"]["measures"]["delta_nll"]["attention"]["comprehensiveness"]
    assert row["mean_difference"] > 0 and row["win_rate"] < 0.5 and row["win_low"] < 0.5 < row["win_high"]
    assert paired_reversals(summary) == []


def test_ties_do_not_make_a_reversal():
    # cw_inter ties on 12 of 20 texts, wins 4 by a lot and loses 4 by a little: its win rate is 20% but nothing
    # reverses
    cw = np.array([[0.1, 0.1]] * 12 + [[10.0, 10.0]] * 4 + [[0.0, 0.0]] * 4)
    attention = np.full((20, 2), 0.1)
    values = {"attention": {m: attention for m in MODES}, "cw_inter": {"comprehensiveness": cw,
                                                                       "sufficiency": attention}}
    summary = summarize(_text_records(values))
    row = summary["paired"]["measures"]["delta_nll"]["attention"]["comprehensiveness"]
    assert (row["wins"], row["ties"], row["win_rate"]) == (4, 12, 0.2) and paired_reversals(summary) == []


def _choice_record(index, drops, label):
    return {"id": f"mmlu-{index}", "label": label, "clean": {"logliks": [-1.0, -2.0], "prediction": 0},
            "results": {metric: {mode: {b: {"prob_drop": drop, "logprob_drop": 2 * drop, "accuracy": 1.0}
                                        for b in BINS} for mode in MODES}
                        for metric, drop in drops.items()}}


def test_choice_summaries_compare_on_all_examples_and_on_those_answered_correctly():
    records = [_choice_record(i, {"cw_inter": 0.1 * i, "attention": 0.25}, label=i % 2) for i in range(6)]
    summary = summarize(records)
    every = summary["paired"]["measures"]["prob_drop"]["attention"]["comprehensiveness"]
    assert (every["wins"], every["ties"]) == (3, 0)  # 0.3, 0.4, 0.5 > 0.25
    correct = summary["correct"]["paired"]["measures"]["logprob_drop"]["attention"]["comprehensiveness"]
    assert (correct["n"], correct["wins"]) == (3, 1)  # examples 0, 2, 4: only 0.4 > 0.25
    assert paired_cells(summary, "correct")[0][:2] == ("attention", "prob_drop")
    assert "paired" not in summarize([_choice_record(i, {"attention": 0.1, "random": 0.2}, 0) for i in range(3)])
    assert summarize([_choice_record(i, {"cw_last": 0.1 * i, "ig": 0.2}, 0) for i in range(3)])["paired"][
        "reference"] == "cw_last"


def test_measures_that_disagree_text_by_text_are_said():
    # as SmolLM2 on GSM8K: cw_inter's comprehensiveness wins every text by delta NLL and loses 15 of 20 by delta PPL
    nll = {"attention": [1.0] * 20, "cw_inter": [2.0] * 20}
    ppl = {"attention": [5.0] * 20, "cw_inter": [1.0] * 15 + [9.0] * 5}
    records = [{"id": f"gsm8k-{i}", "label": None, "clean": {"nll": 2.0},
                "results": {m: {"comprehensiveness": {"50": {"delta_nll": nll[m][i], "delta_ppl": ppl[m][i]}},
                                "sufficiency": {"50": {"delta_nll": 1.0, "delta_ppl": 1.0}}}  # ties throughout
                            for m in nll}} for i in range(20)]
    sentences = paired_reversals(summarize(records))
    low, high = wilson_interval(5, 20)
    assert (f"comprehensiveness: cw_inter is more faithful than attention on 100% of the texts by delta_nll but on "
            f"25% by delta_ppl (95% intervals [{wilson_interval(20, 20)[0]:.0%}, 100%] and [{low:.0%}, {high:.0%}]).") \
        in sentences
    assert not any(sentence.startswith("sufficiency") for sentence in sentences)
