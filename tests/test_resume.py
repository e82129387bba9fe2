"""Safe resuming: atomic repairs that keep whole records, other data or weights refused, one run per folder."""

import copy
import fcntl
import json
import os
import re

import pytest
import torch
import transformers

from captum_cw.evaluation import EvaluationConfig, evaluate
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.run_folder import (
    check_model,
    config_defaults,
    locked,
    model_fingerprint,
    read_records,
    repair_tail,
    tokens_fingerprint,
)
from captum_cw.models import load_model
from captum_cw.tasks import load_examples
from conftest import TEST_DATA
from tiny_models import FAMILIES

RECORD = {"id": "mmlu-0", "label": 1, "clean": {}, "results": {}}


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def _config(data_dir, task="gsm8k", limit=2):
    return EvaluationConfig(task=task, limit=limit, data_dir=str(data_dir), max_tokens=16,
                            protocol=ProtocolConfig(metrics=("cw_inter", "random"), bins=(50,)))


def _run(tiny, config, out, *, resume=False, model=None):
    model_, tokenizer = tiny
    return evaluate(config, out, resume=resume, model=model or model_, tokenizer=tokenizer, progress=False)


def _copy_data(tmp_path, task_file="gsm8k_test.jsonl"):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / task_file).write_text((TEST_DATA / task_file).read_text())
    return folder


def test_a_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "records.jsonl"
    second = {**RECORD, "id": "mmlu-1"}
    path.write_text(json.dumps(RECORD) + "\n" + json.dumps(second))
    repair_tail(path)
    assert path.read_text() == json.dumps(RECORD) + "\n" + json.dumps(second) + "\n"
    skipped = {"id": "mmlu-2", "skipped": "too short"}
    with open(path, "a") as handle:
        handle.write(json.dumps(skipped))
    repair_tail(path)
    assert [r["id"] for r in read_records(tmp_path, include_skipped=True)] == ["mmlu-0", "mmlu-1", "mmlu-2"]


def test_a_torn_line_is_cut_atomically(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    for torn in ('{"id": "mmlu-1", "resu', '{"id": "mmlu-1"}', "[1, 2]"):  # unfinished, or valid JSON but no record
        path.write_text(json.dumps(RECORD) + "\n" + torn)
        repair_tail(path)
        assert path.read_text() == json.dumps(RECORD) + "\n"
    path.write_text(json.dumps(RECORD) + "\n" + '{"id": "mmlu-1", "resu')
    before = path.read_bytes()

    def killed(*args):
        raise KeyboardInterrupt  # as if the process died while it replaced the file

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        repair_tail(path)
    assert path.read_bytes() == before  # the file is whole, never emptied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl"]  # no temporary file left


def test_resume_keeps_a_record_that_lost_its_newline(tiny, tmp_path):
    config = _config(TEST_DATA)
    _run(tiny, config, tmp_path)
    records = tmp_path / "records.jsonl"
    records.write_text(records.read_text().rstrip("\n"))
    summary = _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)
    assert summary["n_examples"] == 3
    assert [json.loads(line)["id"] for line in records.read_text().splitlines()] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]


def test_each_session_keeps_its_environment_and_a_run_stored_without_sessions_resumes(tiny, tmp_path):
    _run(tiny, _config(TEST_DATA, limit=1), tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    first = stored["sessions"]
    assert len(first) == 1 and first[0]["records_before"] == 0
    assert first[0]["devices"] == ["cpu"] and first[0]["dtype"] == "float32"
    assert (first[0]["torch"], first[0]["transformers"]) == (torch.__version__, transformers.__version__)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", first[0]["started"])
    _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)
    sessions = json.loads((tmp_path / "config.json").read_text())["sessions"]
    assert sessions[0] == first[0] and sessions[1]["records_before"] == 1
    _run(tiny, _config(TEST_DATA, limit=2), tmp_path, resume=True)  # nothing left to compute: no session
    assert json.loads((tmp_path / "config.json").read_text())["sessions"] == sessions
    del stored["sessions"]  # written before sessions were kept: resumes, and its list starts with this session
    (tmp_path / "config.json").write_text(json.dumps(stored))
    _run(tiny, _config(TEST_DATA, limit=4), tmp_path, resume=True)
    sessions = json.loads((tmp_path / "config.json").read_text())["sessions"]
    assert [s["records_before"] for s in sessions] == [3]
    assert len(read_records(tmp_path)) == 4


def test_resume_refuses_changed_data_at_the_same_path(tiny, tmp_path):
    data = _copy_data(tmp_path)
    out = tmp_path / "out"
    _run(tiny, _config(data), out)
    stored = json.loads((out / "config.json").read_text())["fingerprint"]["data"]
    assert stored["examples"] == 2 and len(stored["sha256"]) == 64
    assert _run(tiny, _config(data, limit=3), out, resume=True)["n_examples"] == 3  # the same data, extended
    rows = (data / "gsm8k_test.jsonl").read_text().splitlines()
    rows[1] = json.dumps({**json.loads(rows[1]), "question": "How many?"})
    (data / "gsm8k_test.jsonl").write_text("\n".join(rows) + "\n")
    for limit in (1, 4):  # a smaller limit still checks every example already recorded
        with pytest.raises(ValueError, match=r"the data changed since .* \(its first 3 examples differ\); use a "
                                             r"new --out for the new data\."):
            _run(tiny, _config(data, limit=limit), out, resume=True)
    (data / "gsm8k_test.jsonl").write_text("\n".join(rows[:2]) + "\n")
    with pytest.raises(ValueError, match=r"only 2 examples are left of the 3"):
        _run(tiny, _config(data, limit=4), out, resume=True)


def test_a_run_resumes_on_a_copy_of_its_data_elsewhere_and_not_on_other_data(tiny, tmp_path):
    data = _copy_data(tmp_path)
    out = tmp_path / "out"
    _run(tiny, _config(data), out)
    moved = tmp_path / "elsewhere"  # another machine's copy of the same files
    data.rename(moved)
    assert _run(tiny, _config(moved, limit=3), out, resume=True)["n_examples"] == 3
    rows = (moved / "gsm8k_test.jsonl").read_text().splitlines()
    other = tmp_path / "other"
    other.mkdir()
    (other / "gsm8k_test.jsonl").write_text("\n".join([rows[1], rows[0], *rows[2:]]) + "\n")
    with pytest.raises(ValueError, match=r"the data changed since"):
        _run(tiny, _config(other, limit=3), out, resume=True)
    stored = json.loads((out / "config.json").read_text())
    del stored["fingerprint"]["data"]  # a run from before data fingerprints: only its folder tells the data
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=r"another configuration \(data_dir differ"):
        _run(tiny, _config(other, limit=3), out, resume=True)
    assert _run(tiny, _config(moved, limit=3), out, resume=True)["n_examples"] == 3


def test_resume_refuses_other_weights(tiny, tmp_path):
    model, _ = tiny
    _run(tiny, _config(TEST_DATA), tmp_path)
    retrained = copy.deepcopy(model)
    with torch.no_grad():
        retrained.model.layers[1].mlp.down_proj.weight.add_(0.01)
    with pytest.raises(ValueError, match=r"the model's weights changed since .*; use a new --out for the new model\."):
        _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True, model=retrained)
    retrained = copy.deepcopy(model)
    retrained.config.rope_theta = 1.0
    with pytest.raises(ValueError, match=r"the model's configuration changed \(rope_theta\) since"):
        _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True, model=retrained)
    assert _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)["n_examples"] == 3


def test_resume_refuses_an_edit_of_a_weight_the_sampled_hash_skips(tiny, tmp_path):
    model, _ = tiny
    _run(tiny, _config(TEST_DATA), tmp_path)
    edited = copy.deepcopy(model)
    weight = edited.model.layers[1].mlp.down_proj.weight  # the sampled hash reads every (numel // 64)-th value
    assert weight.numel() // 64 > 1
    with torch.no_grad():
        weight.view(-1)[1] += 0.5  # in place, between two sampled values
    assert model_fingerprint(edited)["weights_sha256"] == model_fingerprint(model)["weights_sha256"]
    with pytest.raises(ValueError, match=r"the model's weights changed since"):
        _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True, model=edited)
    assert _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)["n_examples"] == 3


def test_a_run_stored_with_the_sampled_weight_hash_only_resumes_and_gains_the_full_one(tiny, tmp_path):
    model, _ = tiny
    _run(tiny, _config(TEST_DATA), tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    full = stored["fingerprint"]["model"].pop("weights_sha256_all")  # as runs before the full hash stored it
    (tmp_path / "config.json").write_text(json.dumps(stored))
    retrained = copy.deepcopy(model)
    with torch.no_grad():
        retrained.model.layers[1].mlp.down_proj.weight.view(-1)[0] += 0.5  # a sampled value
    with pytest.raises(ValueError, match=r"the model's weights changed since"):
        _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True, model=retrained)
    assert _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)["n_examples"] == 3
    assert json.loads((tmp_path / "config.json").read_text())["fingerprint"]["model"]["weights_sha256_all"] == full


def test_the_full_weight_hash_reads_every_byte_of_each_dtype():
    import hashlib

    model = FAMILIES["llama"].build().to(torch.bfloat16)  # bfloat16 has no numpy dtype: its bytes as int16
    expected = hashlib.sha256()
    for name, parameter in model.named_parameters():
        expected.update(f"{name}:{tuple(parameter.shape)}:{parameter.dtype};".encode())
        expected.update(parameter.detach().view(torch.int16).numpy().tobytes())
    assert model_fingerprint(model)["weights_sha256_all"] == expected.hexdigest()


def test_resume_refuses_another_tokenization(tiny, tmp_path):
    # a transformers release once converted a GGUF tokenizer otherwise (no <bos>, other pieces): same text,
    # same weights, other inputs; the run must not mix records of both
    model, tokenizer = tiny
    _run(tiny, _config(TEST_DATA), tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    examples = load_examples("gsm8k", 2, str(TEST_DATA))
    assert stored["fingerprint"]["tokens"] == tokens_fingerprint(examples, tokenizer, 16)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["Question:"])
    assert tokens_fingerprint(examples, other, 16) != stored["fingerprint"]["tokens"]
    release = transformers.__version__
    message = rf"the tokenizer changed since .*: its first 2 examples tokenize otherwise .* under transformers " \
              rf"{re.escape(release)} \(pip install transformers=={re.escape(release)}\)"
    with pytest.raises(ValueError, match=message):
        _run((model, other), _config(TEST_DATA, limit=3), tmp_path, resume=True)
    assert len(read_records(tmp_path)) == 2

    del stored["fingerprint"]["tokens"]  # a run stored before tokens were fingerprinted resumes, and gains one
    (tmp_path / "config.json").write_text(json.dumps(stored))
    assert _run(tiny, _config(TEST_DATA, limit=3), tmp_path, resume=True)["n_examples"] == 3
    assert json.loads((tmp_path / "config.json").read_text())["fingerprint"]["tokens"]["examples"] == 3


def test_a_release_that_adds_a_setting_and_runs_stored_before_still_resume(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    before = model_fingerprint(model)
    assert before["config"]["num_attention_heads"] == model.config.num_attention_heads
    config_class = type(model.config)
    original = config_class.__init__

    def with_new_setting(self, *args, new_setting=7, **kwargs):  # what a later transformers release might add
        original(self, *args, **kwargs)
        self.new_setting = new_setting

    monkeypatch.setattr(config_class, "__init__", with_new_setting)
    upgraded = copy.deepcopy(model)
    upgraded.config.new_setting = 7
    after, defaults = model_fingerprint(upgraded), config_defaults(upgraded)
    assert after["config_sha256"] != before["config_sha256"] and defaults["new_setting"] == 7
    check_model(tmp_path, {"fingerprint": {"model": before}}, after, defaults)  # added at its default: resumes
    with pytest.raises(ValueError, match=r"configuration changed \(new_setting\)"):
        check_model(tmp_path, {"fingerprint": {"model": before}}, after)  # no defaults known: refused
    upgraded.config.new_setting = 8  # not the default
    with pytest.raises(ValueError, match=r"configuration changed \(new_setting\)"):
        check_model(tmp_path, {"fingerprint": {"model": before}}, model_fingerprint(upgraded), defaults)
    upgraded.config.new_setting, upgraded.config.rms_norm_eps = 7, 0.25  # a default a release changed
    with pytest.raises(ValueError, match=r"configuration changed \(rms_norm_eps\)"):
        check_model(tmp_path, {"fingerprint": {"model": before}}, model_fingerprint(upgraded), defaults)

    stored_whole = {"config_sha256": before["config_sha256"], "weights_sha256": before["weights_sha256"]}
    check_model(tmp_path, {"fingerprint": {"model": stored_whole}}, before)  # a run stored before configurations
    with pytest.raises(ValueError, match=r"the model's configuration changed since"):
        check_model(tmp_path, {"fingerprint": {"model": stored_whole}}, after, defaults)


def test_nested_configurations_are_compared_setting_by_setting(tmp_path):
    weights = {"weights_sha256": "w"}
    before = {"config": {"text_config": {"heads": 4}, "removed": 1}, **weights}
    now = {"config": {"text_config": {"heads": 4, "added": 2}, "removed": 1}, **weights}
    check_model(tmp_path, {"fingerprint": {"model": before}}, now, {"text_config": {"added": 2}})
    with pytest.raises(ValueError, match=r"configuration changed \(text_config.added\)"):
        check_model(tmp_path, {"fingerprint": {"model": before}}, now, {"text_config": {"added": 3}})
    with pytest.raises(ValueError, match=r"configuration changed \(removed\)"):
        check_model(tmp_path, {"fingerprint": {"model": before}}, {"config": {"text_config": {"heads": 4}}, **weights})


def test_a_second_run_on_the_same_folder_is_refused(tiny, tmp_path):
    with locked(tmp_path):
        with pytest.raises(ValueError, match=rf"{tmp_path} is in use by another run \(process {os.getpid()} holds "):
            _run(tiny, _config(TEST_DATA), tmp_path)
    assert not (tmp_path / "records.jsonl").exists()
    _run(tiny, _config(TEST_DATA), tmp_path)
    with open(tmp_path / ".lock") as handle:  # released when the run ends
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_records_without_their_configuration_are_not_mixed_in(tiny, tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps({**RECORD, "id": "gsm8k-0"}) + "\n")
    with pytest.raises(ValueError, match="holds records but no config.json to check them against"):
        _run(tiny, _config(TEST_DATA), tmp_path, resume=True)
