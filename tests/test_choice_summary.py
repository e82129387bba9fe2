"""Multiple choice that means something: accuracy against chance, the most frequent answer, AOPCs over the
examples answered correctly, and warnings where the numbers cannot be trusted."""

import math

import numpy as np
import pytest

from captum_cw.cli import main
from captum_cw.evaluation.report import aopc_cells, choice_check, summarize, summary_lines
from captum_cw.statistics import bootstrap_interval, wilson_interval
from captum_cw.tasks import TASKS, load_examples
from conftest import TEST_DATA


def test_wilson_interval_is_the_score_test_region():
    z = 1.959964
    for successes, n in ((5, 10), (0, 10), (10, 10), (3, 40), (47, 200)):
        grid = np.linspace(0, 1, 200001)
        inside = grid[np.abs(successes / n - grid) <= z * np.sqrt(grid * (1 - grid) / n)]  # the definition
        low, high = wilson_interval(successes, n)
        assert low == pytest.approx(inside.min(), abs=1e-5) and high == pytest.approx(inside.max(), abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # the textbook values


def _record(index, label, prediction, n_choices, comprehensiveness, sufficiency):
    logliks = [-2.0] * n_choices
    logliks[prediction] = -1.0
    results = {"cw_inter": {"comprehensiveness": {"10": {"prob_drop": comprehensiveness[0]},
                                                  "50": {"prob_drop": comprehensiveness[1]}},
                            "sufficiency": {"10": {"prob_drop": sufficiency[0]}, "50": {"prob_drop": sufficiency[1]}}}}
    soft = {"cw_inter": {"comprehensiveness": {"prob_drop": comprehensiveness[0] / 2},
                         "sufficiency": {"prob_drop": sufficiency[0] / 2}}}
    return {"id": f"mmlu-{index}", "label": label, "clean": {"logliks": logliks, "prediction": prediction},
            "results": results, "soft": soft}


def test_accuracy_against_chance_and_the_correct_examples_on_hand_made_records():
    rng = np.random.default_rng(0)
    records = []
    for index in range(40):  # 40 four-way questions, answered right when index % 4 == 0 or index < 12
        label = index % 4
        prediction = label if index % 4 == 0 or index < 12 else (label + 1) % 4
        records.append(_record(index, label, prediction, 4, rng.random(2), rng.random(2)))
    check = choice_check(records)
    correct = [r for r in records if r["clean"]["prediction"] == r["label"]]
    k = len(correct)
    assert k == 12 + 7 and check["accuracy"] == k / 40
    assert (check["accuracy_low"], check["accuracy_high"]) == pytest.approx(wilson_interval(k, 40))
    assert check["chance"] == 0.25 and check["majority_label_share"] == 0.25
    predictions = [r["clean"]["prediction"] for r in records]
    top = max(set(predictions), key=predictions.count)
    assert check["most_frequent_answer"] == top and check["most_frequent_share"] == predictions.count(top) / 40
    assert check["at_chance"] is False  # 19 of 40 is above 1 in 4
    summary = summarize(records)
    assert summary["correct"]["n_examples"] == k
    for mode in ("comprehensiveness", "sufficiency"):
        by_hand = [np.mean([r["results"]["cw_inter"][mode][b]["prob_drop"] for b in ("10", "50")]) for r in correct]
        row = summary["correct"]["aopc"]["cw_inter"][mode]["prob_drop"]
        assert row["mean"] == pytest.approx(np.mean(by_hand)) and row["n"] == k
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(bootstrap_interval(by_hand))
        soft = summary["correct"]["soft"]["cw_inter"][mode]["prob_drop"]
        assert soft["mean"] == pytest.approx(np.mean([r["soft"]["cw_inter"][mode]["prob_drop"] for r in correct]))
    assert summary["warnings"] == ["only 19 examples answered correctly: below 30 the intervals of their AOPCs "
                                   "are unreliable."]
    all_cells, correct_cells = aopc_cells(summary), aopc_cells(summary, "correct")
    assert len(all_cells[0]) == len(correct_cells[0]) == 5  # metric, two AOPCs, two soft measures
    mean = summary["correct"]["aopc"]["cw_inter"]["comprehensiveness"]["prob_drop"]["mean"]
    assert correct_cells[0][1].startswith(f"{mean:.4f} [")


def test_models_at_chance_are_flagged():
    # two-way questions: 11 of 20 right is inside chance's reach (Wilson low end below 0.5)
    guessing = [_record(i, i % 2, 0 if i < 11 else 1 - i % 2, 2, (0.1, 0.2), (0.3, 0.4)) for i in range(20)]
    check = choice_check(guessing)
    assert check["chance"] == 0.5 and check["accuracy_low"] < 0.5 and check["at_chance"] is True
    warnings = summarize(guessing)["warnings"]
    assert warnings[0] == "only 20 examples: below 30 the 95% intervals are unreliable."
    assert warnings[1].startswith("the model is at chance: clean accuracy")
    assert "is not above chance (0.500)" in warnings[1]
    # right 34 times of 36 but always answering 0: the answers do not depend on the question
    constant = [_record(i, 0 if i < 34 else 1, 0, 4, (0.1, 0.2), (0.3, 0.4)) for i in range(36)]
    check = choice_check(constant)
    assert check["accuracy_low"] > 0.25 and check["most_frequent_share"] == 1 and check["at_chance"] is True
    assert summarize(constant)["warnings"] == ["the model is at chance: it gives answer 0 to 100% of the examples."]
    named = summarize(constant, answers=TASKS["mmlu"].answers)
    assert named["choice_check"]["most_frequent_answer_name"] == "A"
    assert named["warnings"] == ["the model is at chance: it gives answer A to 100% of the examples."]
    assert "the model's most frequent answer (A) makes 100% of its predictions" in "\n".join(
        summary_lines(named, "mmlu"))
    assert "most_frequent_answer_name" not in choice_check(constant, answers=())
    answering_1 = [_record(0, 1, 1, 2, (0.1, 0.2), (0.3, 0.4))]
    assert "most_frequent_answer_name" not in choice_check(answering_1, answers=("A",))  # 1 has no name
    mixed_chance = [_record(0, 0, 0, 4, (0, 0), (0, 0)), _record(1, 1, 1, 2, (0, 0), (0, 0))]
    assert choice_check(mixed_chance)["chance"] == pytest.approx((0.25 + 0.5) / 2)
    nobody_right = [_record(i, 1, 0, 2, (0.1, 0.2), (0.3, 0.4)) for i in range(3)]
    summary = summarize(nobody_right)
    assert summary["correct"] == {"n_examples": 0, "aopc": {}} and aopc_cells(summary, "correct") == []
    assert not any("The 0 examples" in line for line in summary_lines(summary, "mmlu"))


def test_the_command_line_prints_the_checks(tiny_llm_dir, tmp_path, capsys):
    argv = ["evaluate", "--model", str(tiny_llm_dir), "--task", "boolq", "--limit", "3", "--data-dir",
            str(TEST_DATA), "--bins", "10", "50", "--max-tokens", "40", "--soft", "--save-rankings",
            "--metrics", "cw_inter", "attention", "random", "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "boolq: 3 examples; AOPC of prob_drop (95% bootstrap interval)"
    assert printed[1] == "warning: only 3 examples: below 30 the 95% intervals are unreliable."
    clean = next(line for line in printed if line.startswith("Clean accuracy "))
    assert "against chance 0.500" in clean and any(f"most frequent answer ({a})" in clean for a in ("no", "yes"))
    header = next(line for line in printed if line.strip().startswith("metric") and "soft sufficiency" in line)
    assert "comprehensiveness AOPC (prob_drop)" in header and "soft comprehensiveness (prob_drop)" in header
    agreement = printed.index("Rank agreement with cw_inter (mean over examples, 95% bootstrap interval):")
    assert printed[agreement + 2].split()[0] == "attention" and printed[agreement + 3].split()[0] == "random"
    assert printed[-1] == f"written to {tmp_path}"
    for line in printed[agreement + 2:agreement + 4]:  # metric, tau [low, high], rho [low, high]
        words = line.split()
        assert math.isfinite(float(words[1])) and math.isfinite(float(words[4]))


@pytest.mark.parametrize("task", [name for name, task in TASKS.items() if task.kind == "choice"])
def test_every_choice_task_names_each_of_its_choices(task):
    names = TASKS[task].answers
    assert len(set(names)) == len(names) and all(names)
    for example in load_examples(task, data_dir=TEST_DATA):
        assert len(example.continuations) == len(names)
    if task in ("mmlu", "boolq"):  # the names are the answers the model writes
        assert [c.strip() for c in example.continuations] == list(names)
