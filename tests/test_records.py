"""Typed records: one form of bin keys, one definition of a task's kind, and older run folders still resume."""

import json

import pytest

from captum_cw.evaluation import EvaluationConfig, evaluate, load_examples
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.records import bin_key, parse_record, record_kind
from captum_cw.evaluation.report import summarize
from captum_cw.evaluation.runner import read_records
from captum_cw.models import load_model
from captum_cw.tasks import TASKS
from conftest import TEST_DATA

DATA = str(TEST_DATA)


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def test_bin_keys_have_one_form():
    assert bin_key(10) == bin_key(10.0) == bin_key("10.0") == bin_key("10") == "10"
    assert bin_key(12.5) == "12.5" and bin_key(0.1) == "0.1" and bin_key(100) == "100"
    assert bin_key(1e-5) == "1e-05"


def test_older_records_are_read_with_normalised_bins():
    measures = {"prob_drop": 0.5}
    legacy = {"id": "mmlu-0", "label": 1, "clean": {"logliks": [-1.0, -2.0], "prediction": 0},
              "results": {"random": {"comprehensiveness": {"10.0": measures}, "sufficiency": {"10.0": measures}}}}
    record = parse_record(legacy)
    assert record["results"]["random"]["comprehensiveness"] == {"10": measures} and record["label"] == 1
    assert record_kind(record) == "choice" and record_kind({"clean": {"nll": 2.0}}) == "text"
    assert parse_record({"id": "gsm8k-3", "skipped": "1 token(s)"}) == {"id": "gsm8k-3", "skipped": "1 token(s)"}
    for not_a_record in ({"id": "x"}, {"results": {}}, [1, 2]):
        with pytest.raises(ValueError, match="not an evaluation record"):
            parse_record(not_a_record)


def _record(index, bins, drop):
    by_bin = {b: {"prob_drop": drop} for b in bins}
    return {"id": f"mmlu-{index}", "label": 0, "clean": {"logliks": [-1.0, -2.0], "prediction": 0},
            "results": {"random": {"comprehensiveness": by_bin, "sufficiency": by_bin}}}


def test_summaries_refuse_records_of_other_bins_and_of_both_kinds():
    with pytest.raises(ValueError, match="different bins"):
        summarize([_record(0, ["10", "50"], 0.1), _record(1, ["10", "20"], 0.2)])
    summary = summarize([_record(0, ["50", "10"], 0.1), _record(1, ["10", "50"], 0.3)])  # order does not matter
    assert list(summary["bins"]["random"]["comprehensiveness"]) == ["10", "50"]
    assert summary["aopc"]["random"]["comprehensiveness"]["prob_drop"]["mean"] == pytest.approx(0.2)
    text = {"id": "gsm8k-0", "label": None, "clean": {"nll": 2.0},
            "results": {"random": {m: {"10": {"delta_nll": 0.1}, "50": {"delta_nll": 0.2}}
                                   for m in ("comprehensiveness", "sufficiency")}}}
    with pytest.raises(ValueError, match="mix multiple-choice and text"):
        summarize([_record(0, ["10", "50"], 0.1), text])


def test_a_run_resumed_with_other_spellings_of_its_bins_summarises(tiny, tmp_path):
    # the issue: default bins wrote "10", --bins 10 wrote "10.0", the configurations compared equal, and the
    # summary of the resumed run raised KeyError: '10'
    model, tokenizer = tiny
    protocol = ProtocolConfig(metrics=("cw_inter", "random"), bins=(10, 50))
    config = EvaluationConfig(task="mmlu", limit=2, data_dir=DATA, max_tokens=48, protocol=protocol)
    evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    floats = ProtocolConfig(metrics=("cw_inter", "random"), bins=(10.0, 50.0))
    resumed = EvaluationConfig(task="mmlu", limit=3, data_dir=DATA, max_tokens=48, protocol=floats)
    summary = evaluate(resumed, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)
    assert summary["n_examples"] == 3 and list(summary["bins"]["cw_inter"]["sufficiency"]) == ["10", "50"]
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert all(set(json.loads(line)["results"]["random"]["comprehensiveness"]) == {"10", "50"} for line in lines)
    # a folder written before the keys were normalised: its "10.0" keys are read as "10"
    legacy = lines[0].replace('"10"', '"10.0"').replace('"50"', '"50.0"')
    (tmp_path / "records.jsonl").write_text("\n".join([legacy, *lines[1:]]) + "\n")
    assert read_records(tmp_path)[0]["results"] == json.loads(lines[0])["results"]
    again = evaluate(resumed, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)
    assert again["aopc"] == summary["aopc"]


def test_a_configuration_written_before_new_settings_still_resumes(tiny, tmp_path):
    model, tokenizer = tiny
    protocol = ProtocolConfig(metrics=("random",), bins=(50,))
    config = EvaluationConfig(task="gsm8k", limit=1, data_dir=DATA, max_tokens=24, protocol=protocol)
    evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    stored = json.loads((tmp_path / "config.json").read_text())
    for setting in ("soft", "save_rankings"):  # as config.json was before these settings existed
        del stored["protocol"][setting]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    extended = EvaluationConfig(**{**config.__dict__, "limit": 2})
    assert evaluate(extended, tmp_path, resume=True, model=model, tokenizer=tokenizer,
                    progress=False)["n_examples"] == 2
    (tmp_path / "config.json").write_text(json.dumps(stored))
    soft = EvaluationConfig(**{**config.__dict__, "protocol": ProtocolConfig(metrics=("random",), bins=(50,),
                                                                             soft=True)})
    with pytest.raises(ValueError, match="another configuration"):  # a setting that differs from the default
        evaluate(soft, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)


def test_every_task_builds_examples_of_its_kind():
    assert {task.kind for task in TASKS.values()} == {"choice", "text"}
    for name, task in TASKS.items():
        examples = load_examples(name, 3, DATA)
        assert all(example.is_choice == (task.kind == "choice") for example in examples)
        assert not hasattr(task, "extra")
