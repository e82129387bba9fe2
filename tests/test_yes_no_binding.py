"""benchmarks/yes_no_binding.py: the three questions differ in the city alone, log-odds are the model's, the
table's shifts are the per-example differences."""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from captum_cw.tasks.context import CITIES, context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import yes_no_binding  # benchmarks/ is on the path from the line above


def test_the_three_questions_ask_about_the_stated_another_and_no_ones_city():
    for example in context_examples("yes_no", 20, seed=3, distractors=2):
        asked = yes_no_binding.asked_three_ways(example)
        assert list(asked) == list(yes_no_binding.QUESTION_KINDS)
        facts = [source.strip().removesuffix(".").split(" lives in ") for source in example.sources]
        name, stated = facts[example.evidence]
        cities = {kind: question.question.split(" live in ")[1].split("?")[0] for kind, question in asked.items()}
        assert cities["stated"] == stated
        assert cities["another's"] in {city for k, (_, city) in enumerate(facts) if k != example.evidence}
        assert cities["absent"] in CITIES and cities["absent"] not in {city for _, city in facts}
        for kind, question in asked.items():
            assert question.sources == example.sources
            assert question.question == example.question.replace(example.question.split(" live in ")[1]
                                                                  .split("?")[0], cities[kind])
            assert f"Does {name} live in" in question.question
            assert question.answer == (" yes" if kind == "stated" else " no")


def test_log_odds_are_the_models_and_the_table_reports_their_shifts(smollm2, tmp_path, monkeypatch):
    model, tokenizer = smollm2
    example = context_examples("yes_no", 1, seed=0, distractors=1)[0]
    question = yes_no_binding.asked_three_ways(example)["another's"]
    ids = tokenizer(question.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        log_probabilities = model(input_ids=ids).logits[0, -1].log_softmax(-1)
    yes, no = (tokenizer(word, add_special_tokens=False)["input_ids"][0] for word in (" yes", " no"))
    expected = float(log_probabilities[yes] - log_probabilities[no])
    assert abs(yes_no_binding.log_odds(model, tokenizer, question, "plain") - expected) < 1e-4

    monkeypatch.setattr("captum_cw.models.load_model", lambda name: smollm2)
    out, table = tmp_path / "run", tmp_path / "PAGE.md"
    table.write_text("# Page\n", encoding="utf-8")
    yes_no_binding.main(["--model", "smollm2-135m", "--styles", "plain", "--distractors", "1", "--n", "4",
                         "--out", str(out), "--table", str(table)])
    records = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4 and records[0]["log_odds"]["another's"] == yes_no_binding.log_odds(
        model, tokenizer, question, "plain")
    reading = np.array([r["log_odds"]["stated"] - r["log_odds"]["another's"] for r in records])
    page = table.read_text(encoding="utf-8")
    row = next(line for line in page.splitlines() if line.startswith("| plain | 1 | 4 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[6].startswith(f"{reading.mean():.2f} [") and cells[7] == f"{np.mean(reading > 0):.2f}"
    matching = np.array([r["log_odds"]["another's"] - r["log_odds"]["absent"] for r in records])
    assert cells[8].startswith(f"{matching.mean():.2f} [") and cells[9] == f"{np.mean(matching > 0):.2f}"
    yes = [np.mean([r["log_odds"][kind] > 0 for r in records]) for kind in yes_no_binding.QUESTION_KINDS]
    assert cells[10] == " / ".join(f"{share:.2f}" for share in yes)
    yes_no_binding.main(["--model", "smollm2-135m", "--out", str(out), "--table", str(table), "--report-only"])
    assert table.read_text(encoding="utf-8") == page
