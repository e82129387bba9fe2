"""benchmarks/paper_reproduction.py end to end on a tiny model: bfloat16, device_map="auto", resumable, and no
number written for a run that did not happen."""

import importlib.util
import json
from pathlib import Path

from conftest import TEST_DATA

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "paper_reproduction.py"


def _script():
    spec = importlib.util.spec_from_file_location("paper_reproduction", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    table = (tmp_path / "table.md").read_text()
    assert f"### {name}: mmlu (2 examples)" in table and "cw_inter" in table

    records = tmp_path / "runs" / name / "mmlu" / "records.jsonl"
    before = records.read_text()
    script.main(arguments)  # finished runs are resumed, not run again
    assert records.read_text() == before

    script.main(["--models", "mistral-7b", *arguments[2:], "--report-only"])
    table = (tmp_path / "table.md").read_text()
    assert "### mistral-7b: mmlu" in table and "not run" in table and "cw_inter" not in table
