"""benchmarks/two_way_target.py: each reading is the model's own log p(answer) and log-odds on the prompt it names,
and a kept file's summary is its records' means."""

import json
import sys
from pathlib import Path

import pytest
import torch

from captum_cw.tasks.context import context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import peers  # benchmarks/ is on the path from the line above
import two_way_target
from peer_methods import encode_example


def test_each_reading_is_the_model_on_the_prompt_it_names(smollm2):
    model, tokenizer = smollm2
    example = context_examples("review_sentiment", 1, seed=0, distractors=2)[0]
    encoded = encode_example(tokenizer, example, "chat")
    values = two_way_target.readings(model, encoded)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)

    answer = tokenizer(example.answer, add_special_tokens=False).input_ids[0]
    other = tokenizer(next(c for c in example.candidates if c != example.answer), add_special_tokens=False).input_ids[0]
    ids = encoded.input_ids[0].tolist()
    evidence = set(encoded.sources[example.evidence])
    context = {p for source in encoded.sources for p in source}
    without_evidence = [t for p, t in enumerate(ids) if p not in evidence]
    assert example.sources[example.evidence].strip() in tokenizer.decode(ids)
    assert example.sources[example.evidence].strip() not in tokenizer.decode(without_evidence)
    for name, kept in (("whole prompt", ids), ("evidence deleted", without_evidence),
                       ("every source deleted", [t for p, t in enumerate(ids) if p not in context])):
        expected = logprobs(kept)
        assert values[name]["logprob"] == pytest.approx(float(expected[answer]), abs=1e-4)
        assert values[name]["logodds"] == pytest.approx(float(expected[answer] - expected[other]), abs=1e-4)
    assert values["whole prompt"]["logodds"] > 0  # the model answers this example


def test_a_two_way_reading_refuses_more_candidates(smollm2):
    model, tokenizer = smollm2
    encoded = encode_example(tokenizer, context_examples("who_lives_where", 1, seed=0, distractors=2)[0], "chat")
    with pytest.raises(ValueError, match="has 3 candidates; a two-way answer has 2"):
        two_way_target.readings(model, encoded)


def test_the_report_reads_a_kept_file(tmp_path, capsys):
    def reading(logprob, logodds):
        return {"logprob": logprob, "logodds": logodds}

    records = [{"example": f"e{i}", "answer": " negative",
                "readings": {"whole prompt": reading(-3.0, 2.0), "evidence deleted": reading(-3.0 - i, 1.0 - 2 * i),
                             "every source deleted": reading(-5.0, 0.0)}} for i in range(2)]
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps(records), encoding="utf-8")
    run = tmp_path / "runs" / "smollm2-135m"
    run.mkdir(parents=True)
    peers = [{"example": "e0", "method": "answered", "correct": True},
             {"example": "e0", "method": "m", "pointing": 0.0, "source_comp@1": 0.5, "lds": 0.25},
             {"example": "e1", "method": "m", "pointing": 1.0, "source_comp@1": 2.0, "lds": None},
             {"example": "e1", "method": "nan", "pointing": 1.0, "source_comp@1": 2.0, "lds": float("nan")},
             {"example": "e9", "method": "m", "pointing": 1.0, "source_comp@1": 9.0, "lds": 1.0}]  # not read
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in peers), encoding="utf-8")
    two_way_target.main(["--model", "smollm2-135m", "--out", str(kept), "--runs", str(tmp_path / "runs"),
                         "--report-only"])
    printed = capsys.readouterr().out
    assert "answer ' negative', 2 answered examples" in printed
    assert "logprob: whole prompt -3.00, evidence deleted -3.50, every source deleted -5.00; deleting the evidence " \
           "drops it by 0.50" in printed
    assert "logodds: whole prompt 2.00, evidence deleted 0.00, every source deleted 0.00; deleting the evidence " \
           "drops it by 2.00" in printed
    assert "the other label picked once the evidence is deleted: 50%" in printed
    assert "the evidence decides the pick on 1 of 2" in printed  # e1: the log-odds falls below 0 without it
    assert "m: pointing 1.00 / 0.00, source_comp@1 2.00 / 0.50, lds nan / 0.25" in printed
    assert "nan: pointing 1.00 / nan, source_comp@1 2.00 / nan, lds nan / nan" in printed
    with pytest.raises(SystemExit, match="no peers run of gemma-3-270m"):
        two_way_target.main(["--model", "gemma-3-270m", "--out", str(kept), "--runs", str(tmp_path / "runs"),
                             "--report-only"])


def test_the_answered_examples_are_the_runs_and_a_foreign_run_is_refused(tmp_path):
    examples = context_examples("review_sentiment", 40, seed=1, distractors=2)
    run = tmp_path / "smollm2-135m"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({"style": "chat", "seed": 1}), encoding="utf-8")
    answered = [{"example": e.id, "method": "answered", "correct": k % 3 != 0} for k, e in enumerate(examples)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in answered), encoding="utf-8")
    found, style = peers.answered_examples(run, "review_sentiment:2", 40)
    assert style == "chat"
    assert found == [e for k, e in enumerate(examples) if k % 3 != 0]  # the same examples: the run's seed
    with open(run / "results.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps({"example": "review_sentiment-45", "method": "answered", "correct": True}) + "\n")
    with pytest.raises(SystemExit, match="beyond the first 40 of review_sentiment:2"):
        peers.answered_examples(run, "review_sentiment:2", 40)
    with pytest.raises(SystemExit, match="no peers run"):
        peers.answered_examples(tmp_path / "gemma-3-270m", "review_sentiment:2", 40)
