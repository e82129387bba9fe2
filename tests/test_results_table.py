"""benchmarks/faithfulness_table.py --report-only: the tables of docs/RESULTS.md from finished runs."""

import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from captum_cw.evaluation import EvaluationConfig, evaluate
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.report import order_verdict, summarize
from captum_cw.evaluation.runner import read_records
from captum_cw.models import load_model
from conftest import TEST_DATA

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "faithfulness_table.py"


def make_runs(model_dir: Path, out: Path, runs: dict[str, tuple[str, int]]) -> None:
    r"""Evaluation runs of the tiny model under ``out``: folder name -> (protocol, limit)."""
    model, tokenizer = load_model(str(model_dir))
    for folder, (protocol, limit) in runs.items():
        metrics = ("cw_inter", "random") if protocol == "layer" else ("ig", "cw_last", "random")
        protocol_config = ProtocolConfig(protocol=protocol, metrics=metrics, bins=(10, 50), ig_steps=2)
        config = EvaluationConfig(task=folder.split("_")[0], limit=limit, data_dir=str(TEST_DATA), max_tokens=32,
                                  protocol=protocol_config)
        evaluate(config, out / folder, model=model, tokenizer=tokenizer, progress=False,
                 resume=(out / folder / "config.json").exists())


@pytest.mark.slow  # the benchmark script in a subprocess
def test_report_only_tabulates_the_first_examples_and_keeps_the_observations(tiny_llm_dir, tmp_path):
    make_runs(tiny_llm_dir, tmp_path, {"mmlu": ("layer", 2), "gsm8k": ("layer", 1), "mmlu_input": ("input", 2)})
    results = tmp_path / "RESULTS.md"
    results.write_text("old tables\n\n## What this shows\n\nhand-written findings\n")

    command = [sys.executable, str(SCRIPT), "--report-only", "--out", str(tmp_path), "--results", str(results),
               "--tasks", "mmlu", "gsm8k", "--choice-limit", "1", "--text-limit", "5", "--input-limit", "2"]
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    text = results.read_text()
    assert "old tables" not in text and text.rstrip().endswith("## What this shows\n\nhand-written findings")
    assert "### SmolLM2-135M: mmlu (1 examples;" in text and "### SmolLM2-135M: gsm8k (1 texts;" in text
    assert "### SmolLM2-135M: mmlu (2 examples;" in text
    first = read_records(tmp_path / "mmlu")[0]["results"]["cw_inter"]["comprehensiveness"]
    aopc = (first["10"]["prob_drop"] + first["50"]["prob_drop"]) / 2  # one example: the interval collapses to it
    assert f"| cw_inter | {aopc:.4f} [{aopc:.4f}, {aopc:.4f}] |" in text
    input_section = text[text.index("## Input level"):]
    assert "| ig |" in input_section and "By comprehensiveness, most faithful first:" in input_section
    checks = [record["ig_completeness"] for record in read_records(tmp_path / "mmlu_input")]
    gap = statistics.median(abs(c["attribution_sum"] - c["output_change"]) for c in checks)
    assert f"IG completeness (2 of 2 examples record it): median |sum of attributions - (f(x) - f(baseline))| = " \
           f"{gap:.3g}," in input_section
    assert sorted(p.name for p in (tmp_path / "faithfulness").iterdir()) == [
        "gsm8k.json", "gsm8k.png", "mmlu.json", "mmlu.png", "mmlu_input.json", "mmlu_input.png"]
    assert "![mmlu, input level](faithfulness/mmlu_input.png)" in input_section
    session = json.loads((tmp_path / "mmlu" / "config.json").read_text())["sessions"][0]
    assert (f"Computed (the run's config.json): from record 1 ({session['started'][:10]}): "
            f"{session['device_names'][0]} (cpu), float32, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, captum_cw {session['captum_cw']}.") in text
    assert session["captum_cw"] == importlib.metadata.version("captum_cw")
    assert "Side by side" not in text  # only with --side-by-side

    # a second model's tables in their own file, then the side-by-side section of the first file from both
    second = tmp_path / "RESULTS_OTHER.md"
    command = [sys.executable, str(SCRIPT), "--report-only", "--out", str(tmp_path), "--model", "other-model",
               "--results", str(second), "--plots", str(tmp_path / "faithfulness" / "other-model"),
               "--tasks", "mmlu", "--choice-limit", "2", "--input-limit", "0", "--side-by-side", str(results)]
    for _ in range(2):  # the section is replaced, not appended twice
        completed = subprocess.run(command, capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
    assert "### other-model: mmlu (2 examples;" in second.read_text()
    text = results.read_text()
    assert text.count("## Side by side") == 1 and "hand-written findings" in text
    section = text[text.index("## Side by side"):]
    for model, n in (("SmolLM2-135M", 1), ("other-model", 2)):
        summary = summarize(read_records(tmp_path / "mmlu")[:n])
        order = summary["paper_order"]
        row = next(line for line in section.splitlines() if line.startswith(f"| mmlu | {model} |"))
        check = summary["choice_check"]
        clean = f"accuracy {check['accuracy']:.3f}" + (" (at chance)" if check["at_chance"] else "")
        assert row == (f"| mmlu | {model} | {n} | {clean} | {order_verdict(order['comprehensiveness'])} | "
                       f"{order_verdict(order['sufficiency'])} |")
    assert "| gsm8k | SmolLM2-135M | 1 | NLL" in section and "| gsm8k | other-model | not run |" in section
    assert "| mmlu_input" not in section and "| winogrande | SmolLM2-135M | not run |" in section


@pytest.mark.slow  # the benchmark script in a subprocess
def test_a_table_kept_from_more_examples_than_its_run_folder_holds_stays(tiny_llm_dir, tmp_path):
    runs = tmp_path / "runs"
    make_runs(tiny_llm_dir, runs, {"mmlu": ("layer", 2), "mmlu_input": ("input", 2)})
    results = tmp_path / "RESULTS.md"
    kept = tmp_path / "faithfulness" / "mmlu.json"

    def report(limit: int = 5) -> tuple[str, str]:
        command = [sys.executable, str(SCRIPT), "--report-only", "--out", str(runs), "--results", str(results),
                   "--tasks", "mmlu", "--choice-limit", str(limit), "--input-limit", "5"]
        completed = subprocess.run(command, capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
        return results.read_text(), completed.stderr

    first, _ = report()
    assert "### SmolLM2-135M: mmlu (2 examples;" in first and "Integrated Gradients: 2 steps on" in first
    assert "| cw_last |" in first[first.index("## Input level"):]
    settings = json.loads(kept.read_text())["settings"]
    assert settings["max_tokens"] == 32 and settings["protocol"]["metrics"] == ["cw_inter", "random"]
    drawn = kept.with_suffix(".png").stat().st_mtime_ns

    moved = tmp_path / "moved"
    runs.rename(moved)  # the run folders are gone (another machine): the kept tables stay as they were
    text, notes = report()
    assert text == first and f"{runs / 'mmlu'} does not exist; the table kept in {kept} (2 examples) stays" in notes
    assert kept.with_suffix(".png").stat().st_mtime_ns == drawn  # the kept plot is not redrawn

    moved.rename(runs)
    records = runs / "mmlu" / "records.jsonl"
    records.write_text(records.read_text().splitlines(keepends=True)[0])  # a restarted run: 1 of 2 examples
    text, notes = report()
    assert text == first and notes.count("has 1 of the first 5 examples finished; the table kept in") == 1
    old_format = json.loads(kept.read_text())
    del old_format["settings"]  # a summary kept before settings were: taken to match
    kept.write_text(json.dumps(old_format))
    assert report()[0] == first
    assert "### SmolLM2-135M: mmlu (1 examples;" in report(limit=1)[0]  # a lower limit shrinks the table

    make_runs(tiny_llm_dir, runs, {"mmlu": ("layer", 3)})  # the run goes past the kept table: it is rebuilt
    text, _ = report()
    assert "### SmolLM2-135M: mmlu (3 examples;" in text and kept.with_suffix(".png").stat().st_mtime_ns != drawn
    assert text[text.index("## Input level"):] == first[first.index("## Input level"):]

    other = json.loads(kept.read_text())
    other["settings"]["max_tokens"], other["summary"]["n_examples"] = 64, 200
    kept.write_text(json.dumps(other))  # kept from a run with other settings: the run's table replaces it
    text, notes = report()
    assert "### SmolLM2-135M: mmlu (3 examples;" in text and "was run with other settings than the table" in notes


def test_a_kept_summary_of_another_model_is_named(tmp_path):
    folder = tmp_path / "faithfulness"
    folder.mkdir()
    (folder / "mmlu.json").write_text('{"model": "other", "task": "mmlu", "protocol": "layer", "summary": {}}')
    (folder / "mmlu_input.json").write_text('{"model": "sm')  # unread: no input level asked for
    command = [sys.executable, str(SCRIPT), "--report-only", "--out", str(tmp_path / "runs"),
               "--results", str(tmp_path / "RESULTS.md"), "--tasks", "mmlu", "--input-limit", "0"]
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode != 0
    assert "summarises other on mmlu at the layer level, not smollm2-135m on mmlu" in completed.stderr
    assert "give this model its own --plots" in completed.stderr
    (folder / "mmlu.json").unlink()
    completed = subprocess.run(command, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


def load_script():
    spec = importlib.util.spec_from_file_location("faithfulness_table", SCRIPT)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


def test_the_provenance_line_names_each_environment_from_its_first_record():
    table = load_script()

    def session(before, started, torch_release="2.13.0+cpu", names=("x86_64",), devices=("cpu",)):
        return {"started": f"{started}T05:00:00+00:00", "records_before": before, "devices": list(devices),
                "device_names": list(names), "dtype": "float32", "torch": torch_release,
                "transformers": "5.25.0", "captum_cw": "0.1.0", "python": "3.12.1"}

    assert table.provenance_line(None, 5) is None and table.provenance_line([], 5) is None
    cpu = "x86_64 (cpu), float32, torch 2.13.0+cpu, transformers 5.25.0, captum_cw 0.1.0"
    gpu = "NVIDIA H200 (cuda:0), float32, torch 2.13.0, transformers 5.25.0, captum_cw 0.1.0"
    h200 = {"torch_release": "2.13.0", "names": ["NVIDIA H200"], "devices": ["cuda:0"]}
    sessions = [session(15, "2026-12-05"), session(40, "2026-12-05"),  # the same environment: one entry
                session(90, "2026-12-06", **h200),
                session(120, "2026-12-07"), session(120, "2026-12-08", **h200)]  # the CPU session wrote nothing
    assert table.provenance_line(sessions, 200) == (
        f"Computed (the run's config.json): records 1-15: not recorded; from record 16 (2026-12-05): {cpu}; "
        f"from record 91 (2026-12-06): {gpu}.")  # the last three sessions: one environment from record 91
    assert table.provenance_line(sessions, 90) == (  # a table of the first 90 records: the GPU's are not in it
        f"Computed (the run's config.json): records 1-15: not recorded; from record 16 (2026-12-05): {cpu}.")
    assert table.provenance_line([session(0, "2026-12-05")], 1) == (
        f"Computed (the run's config.json): from record 1 (2026-12-05): {cpu}.")


def test_runs_compute_on_the_device_asked_for(monkeypatch, capsys, tmp_path):
    table = load_script()
    commands = []
    monkeypatch.setattr(table.subprocess, "run", lambda command, check: commands.append(command))
    monkeypatch.setattr(table, "write_results", lambda args: "")
    for extra in ([], ["--device", "cpu"]):
        argv = [str(SCRIPT), "--out", str(tmp_path), "--tasks", "mmlu", "--input-limit", "0", *extra]
        monkeypatch.setattr(sys, "argv", argv)
        table.main()
    assert "--device" not in commands[0] and commands[1][commands[1].index("--device") + 1] == "cpu"

    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "gpu0"])
    with pytest.raises(SystemExit):
        table.main()
    assert "'gpu0' is not a device" in capsys.readouterr().err


def test_the_reproduce_line_runs_each_protocol_with_the_settings_it_started_with(monkeypatch, tmp_path):
    table = load_script()
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--out", str(tmp_path)])
    captured = {}  # the arguments as the script's own parser makes them
    monkeypatch.setattr(table, "write_results", lambda parsed: captured.setdefault("args", parsed) and "")
    monkeypatch.setattr(table, "run", lambda *a: None)
    table.main()
    args = captured["args"]
    command = (f"python benchmarks/faithfulness_table.py --out {os.path.relpath(tmp_path, SCRIPT.parents[1])} "
               "--choice-limit 200 --text-limit 100 --input-limit 200 --max-tokens 192 --ig-steps 50")
    assert table.reproduce_line(args).startswith(f"Reproduce: `{command}` (runs resume")
    for folder, soft in (("mmlu", False), ("boolq_input", True)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps({"protocol": {"soft": soft, "save_rankings": soft}}))
    assert table.reproduce_line(args).startswith(f"Reproduce: `{command} --protocols layer`, then `{command} "
                                                 "--protocols input --soft --save-rankings` (runs resume")
    args.input_limit = 0  # no input level: the layer level's command alone
    assert "--protocols" not in table.reproduce_line(args)
