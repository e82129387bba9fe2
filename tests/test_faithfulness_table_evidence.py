"""benchmarks/faithfulness_table.py: sampled runs and their tables, which rows a table holds, and the paired tests."""

import argparse
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

from captum_cw.evaluation.report import summarize
from captum_cw.tasks import load_examples
from conftest import TEST_DATA

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "faithfulness_table.py"
MODES = ("comprehensiveness", "sufficiency")


def load_script():
    spec = importlib.util.spec_from_file_location("faithfulness_table", SCRIPT)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


table = load_script()


def _args(tmp_path, **changes):
    settings = {"model": "smollm2-135m", "out": str(tmp_path / "runs"), "results": str(tmp_path / "RESULTS.md"),
                "plots": None, "data_dir": str(TEST_DATA), "sample": "first", "sample_seed": 0}
    return argparse.Namespace(**{**settings, **changes})


def _record(task, index, drops):
    return {"id": f"{task}-{index}", "label": None, "clean": {"nll": 2.0},
            "results": {metric: {mode: {b: {"delta_nll": drop, "delta_ppl": 2 * drop} for b in ("10", "50")}
                                 for mode in MODES} for metric, drop in drops.items()}}


def test_sampled_runs_have_their_own_folders_and_names(tmp_path):
    first = _args(tmp_path)
    assert table.run_folder("mmlu", "layer", first) == tmp_path / "runs" / "mmlu"
    stratified = _args(tmp_path, sample="stratified")
    assert table.run_folder("mmlu", "layer", stratified) == tmp_path / "runs" / "mmlu_stratified"
    assert table.run_folder("boolq", "input", _args(tmp_path, sample="random", sample_seed=2)) == \
        tmp_path / "runs" / "boolq_random2_input"
    assert table.task_label("mmlu", stratified) == "mmlu stratified"
    # a task without strata takes a random sample when asked for a stratified one, and says so
    assert table.run_folder("winogrande", "layer", stratified) == tmp_path / "runs" / "winogrande_random"


def test_each_table_says_which_rows_it_holds():
    assert table.sample_line("mmlu", 200, None) == "Rows: the first 200 of mmlu_test.jsonl, in the file's order."
    assert table.sample_line("mmlu", 200, {"sample": "stratified", "sample_seed": 0}) == (
        "Rows: 200 of mmlu_test.jsonl, a seeded stratified sample (seed 0), round-robin over its subjects, each "
        "shuffled.")
    assert table.sample_line("boolq", 50, {"sample": "random", "sample_seed": 3}) == (
        "Rows: 50 of boolq_validation.jsonl, a seeded random sample (seed 3).")
    assert table.sample_line("boolq", 50, {"sample": "stratified", "sample_seed": 0}) == (
        "Rows: 50 of boolq_validation.jsonl, a seeded random sample (seed 0).")


def test_a_table_of_mmlu_says_how_its_rows_spread_over_the_subjects(tmp_path):
    rows = [json.loads(line) for line in (TEST_DATA / "mmlu_test.jsonl").read_text().splitlines()]
    args = _args(tmp_path)
    first = table.strata_counts("mmlu", [{"id": f"mmlu-{i}"} for i in range(4)], args)
    assert first == {"moral_scenarios": 4} and all(row["subject"] == "moral_scenarios" for row in rows[:4])
    assert table.sample_line("mmlu", 4, None, first) == (
        "Rows: the first 4 of mmlu_test.jsonl, in the file's order; all of one subject, moral_scenarios.")
    ids = [e.id for e in load_examples("mmlu", 12, TEST_DATA, sample="stratified")]
    spread = table.strata_counts("mmlu_cloze", [{"id": i} for i in ids], args)
    assert spread == dict(sorted(Counter(rows[int(i.split("-")[1])]["subject"] for i in ids).items()))
    assert table.sample_line("mmlu", 12, {"sample": "stratified", "sample_seed": 0}, spread).endswith(
        f"; {len(spread)} subjects, 1 to {max(spread.values())} rows each.")
    assert table.strata_counts("gsm8k", [{"id": "gsm8k-0"}], args) is None  # no strata
    assert table.strata_counts("mmlu", [{"id": "mmlu-0"}], _args(tmp_path, data_dir=str(tmp_path))) is None


def test_a_sampled_run_is_tabulated_in_its_sample_order(tmp_path):
    folder = tmp_path / "runs" / "gsm8k_random"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"sample": "random", "sample_seed": 3}))
    order = [example.id for example in load_examples("gsm8k", None, TEST_DATA, sample="random", seed=3)]
    finished = order[:6]  # the run's first six examples, written in any order
    (folder / "records.jsonl").write_text("".join(json.dumps(_record("gsm8k", int(i.split("-")[1]), {"random": 0.1}))
                                                  + "\n" for i in sorted(finished)))
    args = _args(tmp_path, sample="random", sample_seed=3)
    records = table.sampled_records(folder, "gsm8k", table.run_config(folder), 4, args)
    assert [r["id"] for r in records] == order[:4]


def test_the_table_holds_cw_against_each_metric_and_says_where_the_mean_reverses(tmp_path):
    cw = [0.0] * 16 + [10.0] * 4  # cw_inter loses 16 of 20 texts by a little and wins 4 by a lot
    records = [_record("gsm8k", i, {"attention": 0.1, "cw_inter": drop}) for i, drop in enumerate(cw)]
    kept = {"task": "gsm8k", "settings": {"sample": "first"}, "summary": summarize(records)}
    lines = table.task_table("gsm8k", "layer", kept, _args(tmp_path))
    assert "Rows: the first 20 of gsm8k_test.jsonl, in the file's order." in lines
    header = lines.index("| metric | measure | comprehensiveness wins | sign p | Wilcoxon p | sufficiency wins | "
                         "sign p | Wilcoxon p |")
    assert lines[header + 2].startswith("| attention | delta_nll | 0.20 [0.08, 0.42] | 0.012 |")
    assert lines[header + 3].startswith("| attention | delta_ppl | 0.20 [0.08, 0.42] | 0.012 |")
    reversals = [line for line in lines if line.startswith("> **Reversal:** ")]
    assert len(reversals) == 4  # both measures, both modes: cw_inter's mean is better, its texts mostly worse
    assert "cw_inter is more faithful on 20% of the texts" in reversals[0]


def test_side_by_side_lists_a_variant_or_a_sample_once_it_has_run(tmp_path):
    summary = {"n_examples": 4, "clean_nll": {"mean": 2.5},
               "paper_order": {mode: {"holds": True, "separated": False} for mode in MODES}}
    folder = tmp_path / "faithfulness"
    folder.mkdir()
    for name, task in (("gsm8k", "gsm8k"), ("mmlu_cloze", "mmlu_cloze"), ("mmlu_stratified", "mmlu stratified")):
        (folder / f"{name}.json").write_text(json.dumps({"model": "m", "task": task, "protocol": "layer",
                                                         "summary": summary}))
    tasks = [line.split(" | ")[0][2:] for line in table.side_by_side(folder) if line.startswith("| ")][1:]
    assert tasks == [*table.DEFAULT_TASKS, "mmlu stratified", "mmlu_cloze"]
    assert "mmlu_cloze" not in table.DEFAULT_TASKS and "mmlu" in table.DEFAULT_TASKS


def test_sampled_runs_are_asked_for_with_their_sample(monkeypatch, tmp_path):
    commands = []
    monkeypatch.setattr(table.subprocess, "run", lambda command, check: commands.append(command))
    monkeypatch.setattr(table, "write_results", lambda args: "")
    argv = [str(SCRIPT), "--out", str(tmp_path), "--tasks", "mmlu_cloze", "--input-limit", "0", "--sample",
            "stratified", "--sample-seed", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    table.main()
    (command,) = commands
    assert command[command.index("--task") + 1] == "mmlu_cloze"
    assert command[command.index("--sample") + 1] == "stratified" and command[command.index("--sample-seed") + 1] == "1"
    assert command[command.index("--out") + 1] == str(tmp_path / "mmlu_cloze_stratified1")
    args = table.argparse.Namespace(**{**vars(_args(tmp_path)), "sample": "stratified", "sample_seed": 1,
                                       "choice_limit": 200, "text_limit": 100, "input_limit": 0,
                                       "max_tokens": 192, "ig_steps": 50, "soft": False, "save_rankings": False})
    assert "--sample stratified --sample-seed 1" in table.reproduce_line(args)



def test_a_table_at_chance_says_its_rankings_explain_guesses(tmp_path):
    records = [{"id": f"boolq-{i}", "label": i % 2, "clean": {"logliks": [-1.0, -2.0], "prediction": 0},
                "results": {m: {mode: {"50": {"prob_drop": 0.1 * i}} for mode in MODES}
                            for m in ("attention", "cw_inter")}} for i in range(6)]
    kept = {"task": "boolq", "settings": None, "summary": summarize(records)}  # always answers "no": at chance
    lines = table.task_table("boolq", "layer", kept, _args(tmp_path))
    assert any(line.startswith("> At chance, the rankings below explain the model's guesses") for line in lines)
    for i in range(6):
        records[i]["clean"]["prediction"] = records[i]["label"]  # every answer right: above chance
    kept["summary"] = summarize(records * 6)  # 36 right answers: the accuracy's interval is above chance
    assert not any(line.startswith("> At chance") for line in table.task_table("boolq", "layer", kept,
                                                                                 _args(tmp_path)))
