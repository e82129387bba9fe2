"""benchmarks/deletion_order.py: the three deletions remove the tokens they name, ranks 2-3 are read off the
scores, and a kept file's summary is its records' means."""

import json
import sys
from pathlib import Path

import numpy as np

from captum_cw.tasks.context import context_examples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import deletion_order  # benchmarks/ is on the path from the line above
from peer_methods import encode_example


def test_the_deletions_remove_the_copy_the_evidence_words_and_the_other_cities(smollm2):
    _, tokenizer = smollm2
    for example in context_examples("who_lives_where", 5, seed=0, distractors=2):
        encoded = encode_example(tokenizer, example, "chat")
        ids = encoded.input_ids[0].tolist()
        words = {name: [tokenizer.decode([ids[p]]).strip() for p in positions]
                 for name, positions in deletion_order.deletions(encoded).items()}
        person, city = example.sources[example.evidence].strip().removesuffix(".").split(" lives in ")
        assert "".join(words["copy"]) == city
        assert words["copy + evidence words"] == [*words["copy"], person, "lives"]
        others = [source.strip().removesuffix(".").split(" lives in ")[1] for k, source in enumerate(example.sources)
                  if k != example.evidence]
        added = words["copy + other cities"][len(words["copy"]):]
        assert len(added) == 2 and all(any(other.startswith(word) for other in others) for word in added)
        assert not set(deletion_order.deletions(encoded)["copy + other cities"][len(encoded.copy):]) & set(
            encoded.evidence)


def test_ranks_two_and_three_are_named_by_what_they_are(smollm2):
    _, tokenizer = smollm2
    encoded = encode_example(tokenizer, context_examples("who_lives_where", 1, seed=0, distractors=2)[0], "chat")
    other_city = deletion_order.deletions(encoded)["copy + other cities"][-1]
    evidence_word = next(p for p in encoded.evidence if p not in encoded.copy)
    outside = next(p for p in range(encoded.n) if p not in encoded.context)
    scores = np.zeros(encoded.n)
    scores[encoded.copy[0]], scores[other_city], scores[evidence_word] = 3.0, 2.0, 1.0
    scores[outside] = 10.0  # not a context token: never ranked
    assert deletion_order.rank_kinds(encoded, scores) == ["other city", "evidence"]
    scores[evidence_word] = 5.0
    assert deletion_order.rank_kinds(encoded, scores) == ["evidence", "other city"]  # the copy is now second


def test_the_report_reads_a_kept_file(tmp_path, capsys):
    records = [{"example": f"e{i}", "drops": {"copy": 2.0 * i, "copy + evidence words": 1.0,
                                              "copy + other cities": 3.0},
                "ranked": {"m": ["evidence", "other city"] if i else ["other", "other"]}} for i in range(2)]
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps(records), encoding="utf-8")
    deletion_order.main(["--model", "smollm2-135m", "--out", str(kept), "--report-only"])
    printed = capsys.readouterr().out
    assert "copy: 1.00" in printed and "copy + other cities: 3.00" in printed
    assert "m, ranks 2-3: evidence 25%, other city 25%, other 50%" in printed
