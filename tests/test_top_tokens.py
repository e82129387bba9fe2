"""benchmarks/top_tokens.py: each method's top context token and its comp@1, checked against the scores and a
deletion computed here, on the examples a kept run answered."""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from captum_cw.tasks.context import context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import top_tokens  # benchmarks/ is on the path from the line above
from peer_methods import METHODS, encode_example


def test_the_top_token_and_its_drop_are_the_methods_and_the_models(smollm2):
    model, tokenizer = smollm2
    encoded = encode_example(tokenizer, context_examples("job_of_description", 1, seed=0, distractors=2)[0], "chat")
    ids = encoded.input_ids[0].tolist()

    @torch.no_grad()
    def logprob(row: list[int]) -> float:
        return float(model(input_ids=torch.tensor([row])).logits[0, -1].double().log_softmax(-1)[encoded.target])

    found = top_tokens.top_token(model, tokenizer, encoded, "random", logprob(ids))
    scores = METHODS["random"].score(model, tokenizer, encoded)[0]
    context = encoded.context
    top = max(context, key=lambda p: (scores[p], -p))  # the first of the highest, as the runs rank
    drop = logprob(ids) - logprob(ids[:top] + ids[top + 1:])
    assert found["token"] == tokenizer.decode([ids[top]]).strip()
    assert found["evidence"] == (top in encoded.evidence)
    assert np.isclose(found["drop"], drop, atol=1e-4)


def test_main_keeps_the_answered_non_copy_examples_and_reports_where_tops_differ(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({"style": "chat", "seed": 0}), encoding="utf-8")
    answered = ["job_of_description-0", "who_lives_where-0"]
    (run / "results.jsonl").write_text("".join(json.dumps({"example": e, "method": "answered", "correct": True})
                                               + "\n" for e in answered), encoding="utf-8")
    out = tmp_path / "top.json"
    top_tokens.main(["--run", str(run), "--model", "smollm2-135m", "--tasks", "who_lives_where:2,job_of_description:2",
                     "--n", "2", "--non-copy", "--methods", "answer_copy,random", "--out", str(out)])
    records = json.loads(out.read_text(encoding="utf-8"))
    assert [r["example"] for r in records] == ["job_of_description-0"]  # answered, and not a copy task
    assert set(records[0]["top"]) == {"answer_copy", "random"}
    capsys.readouterr()
    top_tokens.main(["--run", str(run), "--model", "smollm2-135m", "--out", str(out), "--report-only"])
    printed = capsys.readouterr().out
    assert printed.startswith("1 examples; mean drop")
    differ = records[0]["top"]["answer_copy"]["token"] != records[0]["top"]["random"]["token"]
    assert ("job_of_description-0" in printed) == differ
