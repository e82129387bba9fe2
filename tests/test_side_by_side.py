"""benchmarks/faithfulness_table.py: the side-by-side section of the paper's order per model, from kept summaries."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "faithfulness_table.py"
spec = importlib.util.spec_from_file_location("faithfulness_table", SCRIPT)
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)

HOLDS = {"holds": True, "separated": False}
FAILS = {"holds": False, "separated": False}


def keep(folder: Path, name: str, model: str, task: str, protocol: str = "layer", n: int = 7) -> None:
    summary = {"n_examples": n, "clean_nll": {"mean": 2.5}, "paper_order": {"comprehensiveness": HOLDS,
                                                                              "sufficiency": FAILS}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"model": model, "task": task, "protocol": protocol, "summary": summary}))


def test_rows_per_task_and_model(tmp_path):
    keep(tmp_path / "faithfulness", "gsm8k.json", "smollm2-135m", "gsm8k")
    keep(tmp_path / "faithfulness" / "b", "gsm8k.json", "b-model", "gsm8k", n=3)
    keep(tmp_path / "faithfulness" / "b", "mmlu_input.json", "b-model", "mmlu", protocol="input")
    lines = table.side_by_side(tmp_path / "faithfulness")
    rows = [line for line in lines if line.startswith("| gsm8k") or line.startswith("| mmlu")]
    assert rows == ["| mmlu | SmolLM2-135M | not run |  |  |  |", "| mmlu | b-model | not run |  |  |  |",
                    "| gsm8k | SmolLM2-135M | 7 | NLL 2.500 | holds by the means (intervals overlap) | does not hold |",
                    "| gsm8k | b-model | 3 | NLL 2.500 | holds by the means (intervals overlap) | does not hold |"]


def test_unreadable_and_duplicate_summaries_are_named(tmp_path):
    folder = tmp_path / "faithfulness"
    keep(folder, "gsm8k.json", "m", "gsm8k")
    (folder / "broken.json").write_text('{"model": "m", "ta')
    with pytest.raises(SystemExit, match="broken.json is not a readable summary"):
        table.side_by_side(folder)
    (folder / "broken.json").unlink()
    keep(folder / "old", "gsm8k.json", "m", "gsm8k", n=2)
    with pytest.raises(SystemExit, match="both summarise m on gsm8k"):
        table.side_by_side(folder)


def test_the_section_is_replaced_in_place_and_nothing_else_moves(tmp_path):
    keep(tmp_path / "faithfulness", "gsm8k.json", "m", "gsm8k")
    results = tmp_path / "RESULTS.md"
    mention = f"Prose that quotes the heading: {table.SIDE_BY_SIDE} and goes on."
    results.write_text(f"# Title\n\n{mention}\n\n## What this shows\n\nfindings\n\n{table.SIDE_BY_SIDE}\n\nold rows\n\n"
                       "# Appendix\n\nkept\n")
    table.write_side_by_side(results)
    first = results.read_text()
    assert mention in first and "old rows" not in first and first.count("| gsm8k | m | 7 |") == 1
    assert first.endswith("\n\n# Appendix\n\nkept\n") and first.index("findings") < first.index("| gsm8k | m |")
    table.write_side_by_side(results)
    assert results.read_text() == first

    last = tmp_path / "LAST.md"
    last.write_text("text\n")
    table.write_side_by_side(last)
    appended = last.read_text()
    table.write_side_by_side(last)
    assert last.read_text() == appended and appended.startswith(f"text\n\n{table.SIDE_BY_SIDE}\n")
    assert appended.endswith("|\n") and not appended.endswith("\n\n")
    fresh = tmp_path / "FRESH.md"
    table.write_side_by_side(fresh)
    assert fresh.read_text().startswith(table.SIDE_BY_SIDE)


def test_a_model_without_finished_runs_leaves_its_results_file_alone(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text("tables of runs whose folders are gone\n")
    args = table.argparse.Namespace(model="smollm2-135m", out=str(tmp_path / "runs"), results=str(results),
                                    plots=None, tasks=list(table.TASKS), choice_limit=2, text_limit=2,
                                    input_limit=2, max_tokens=32, ig_steps=2, soft=False, save_rankings=False)
    table.write_results(args)
    assert results.read_text() == "tables of runs whose folders are gone\n"
    assert "is left as it is" in capsys.readouterr().err
