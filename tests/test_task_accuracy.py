"""benchmarks/task_accuracy.py: each record is the model's own pick, the table counts them, runs resume."""

import json
import sys
from pathlib import Path

import pytest
import torch

from captum_cw.statistics import wilson_interval
from captum_cw.tasks.context import context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import task_accuracy  # benchmarks/ is on the path from the line above


def test_records_are_the_models_picks_and_the_table_counts_them(smollm2, tmp_path, monkeypatch):
    model, tokenizer = smollm2
    monkeypatch.setattr("captum_cw.models.load_model", lambda name: smollm2)
    out, table = tmp_path / "run", tmp_path / "PAGE.md"
    table.write_text("# Page\n\nkept\n", encoding="utf-8")
    args = ["--tasks", "who_lives_where", "yes_no", "--styles", "plain", "--distractors", "2", "--n", "5",
            "--out", str(out), "--table", str(table)]
    task_accuracy.main(args)
    records = task_accuracy.read_results(out / "results.jsonl")
    assert len(records) == 10
    for example, record in zip(context_examples("who_lives_where", 5, 0, 2), records[:5]):
        ids = tokenizer(example.prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        firsts = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in example.candidates]
        picked = int(torch.argmax(logits[firsts]))
        assert record["correct"] == (picked == example.evidence)
        assert record["picked_at"] == task_accuracy.position_of(picked, 3)
        assert record["evidence_at"] == task_accuracy.position_of(example.evidence, 3)
    assert all(r["picked_at"] is None for r in records[5:])  # yes/no answers are no source's
    page = table.read_text(encoding="utf-8")
    assert page.startswith("# Page\n\nkept\n") and "<!-- /task-accuracy:smollm2-135m -->" in page
    hits = sum(r["correct"] for r in records[:5])
    low, high = wilson_interval(hits, 5)
    assert f"| who_lives_where | plain | 2 | 5 | {hits / 5:.2f} [{low:.2f}, {high:.2f}] | 0.33 |" in page
    modal = max(sum(r["picked"] == p for r in records[5:]) for p in (" yes", " no"))
    expected = [e.answer for e in context_examples("yes_no", 5, 0, 2)]
    per_answer = ", ".join(f"{a.strip()} {sum(r['correct'] for r, e in zip(records[5:], expected) if e == a)}/"
                           f"{expected.count(a)}" for a in (" yes", " no"))
    assert page.splitlines()[-2].endswith(f"| {modal / 5:.2f} | {per_answer} |")  # yes_no, the table's last row

    with open(out / "results.jsonl", "a", encoding="utf-8") as results:  # a setting torn by a kill
        results.write('{"rows": [{"task": "key_value"')
    assert len(task_accuracy.read_results(out / "results.jsonl")) == 10
    monkeypatch.setattr(task_accuracy, "answer", lambda *a: (_ for _ in ()).throw(AssertionError("rerun")))
    task_accuracy.main(args)  # both settings are done: nothing runs
    task_accuracy.main([*args, "--report-only"])
    assert table.read_text(encoding="utf-8") == page
    for other in (["--n", "6"], ["--seed", "1"]):  # a folder holds one sample: another is refused, not mixed in
        with pytest.raises(SystemExit, match="use another --out"):
            task_accuracy.main([*args, *other])
    monkeypatch.undo()
    monkeypatch.setattr("captum_cw.models.load_model", lambda name: smollm2)
    task_accuracy.main([*args[:6], "1", *args[7:]])  # a new setting lands on its own line after the torn one
    assert len(task_accuracy.read_results(out / "results.jsonl")) == 20
    last = json.loads((out / "results.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert last["rows"][0]["distractors"] == 1


def test_position_of_names_first_middle_last():
    assert [task_accuracy.position_of(k, 4) for k in range(4)] == ["first", "middle", "middle", "last"]
    assert [task_accuracy.position_of(k, 2) for k in range(2)] == ["first", "last"]


def test_unscorable_settings_are_named_not_counted():
    rows = [{"task": "induction", "style": "plain", "distractors": 1, "unscorable": True}]
    assert "not scorable: candidates share their first token" in task_accuracy.summary_table(rows, "m")


def test_accuracy_per_answer_counts_each_expected_answer():
    def row(picked: str, *, correct: bool) -> dict:
        return {"task": "review_sentiment", "candidates": 2, "picked": picked, "correct": correct}

    # expected: positive, positive, negative (picked positive: wrong), negative
    rows = [row(" positive", correct=True), row(" positive", correct=True), row(" positive", correct=False),
            row(" negative", correct=True)]
    assert task_accuracy.per_answer(rows, "review_sentiment", 2) == "positive 2/2, negative 1/2"
    assert task_accuracy.per_answer([row(" yes", correct=False)], "yes_no", 1) == "yes 0/0, no 0/1"
    assert task_accuracy.per_answer([{**row(" Paris", correct=True), "candidates": 2}], "who_lives_where", 1) == "–"
