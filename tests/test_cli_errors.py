"""Every user error of the command line exits 2 with one line on stderr and no traceback (unless --debug)."""

import json

import pytest
import torch

from captum_cw.cli import main
from conftest import TEST_DATA


def _fails(capsys, argv):
    r"""Runs the command, which must exit 2; returns the error's one line (after any progress bars)."""
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2, err
    *progress, line, end = err.split("\n")
    assert end == "" and all("it/s]" in bar for bar in progress) and "Traceback" not in err, err
    return line + "\n"


def _evaluate(model, out, *extra):
    return ["evaluate", "--model", str(model), "--task", "gsm8k", "--limit", "1", "--data-dir", str(TEST_DATA),
            "--bins", "50", "--metrics", "random", "--max-tokens", "16", "--out", str(out), *extra]


@pytest.mark.parametrize("argument, value, message", [
    ("--limit", "0", "argument --limit: must be at least 1, got 0"),
    ("--limit", "-1", "argument --limit: must be at least 1, got -1"),
    ("--limit", "ten", "argument --limit: 'ten' is not an integer"),
    ("--batch-size", "0", "argument --batch-size: must be at least 1, got 0"),
    ("--ig-steps", "0", "argument --ig-steps: must be at least 1, got 0"),
    ("--max-tokens", "0", "argument --max-tokens: must be at least 2, got 0"),
    ("--max-tokens", "-5", "argument --max-tokens: must be at least 2, got -5"),
    ("--seed", "-1", "argument --seed: must be at least 0, got -1"),
    ("--bins", "0", "argument --bins: must be a percentage in (0, 100], got 0.0"),
    ("--bins", "150", "argument --bins: must be a percentage in (0, 100], got 150.0"),
    ("--bins", "nan", "argument --bins: must be a finite number, got nan"),
    ("--device", "gpu0", "argument --device: 'gpu0' is not a device (e.g. cpu, cuda, cuda:1, mps)"),
])
def test_numbers_and_devices_are_checked_when_parsed(capsys, tmp_path, argument, value, message):
    err = _fails(capsys, _evaluate("no-model-needed", tmp_path / "out", argument, value))
    assert err == f"captum-cw evaluate: error: {message} (see captum-cw evaluate --help)\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argument, value, message", [
    ("--threshold", "2", "argument --threshold: must be between 0 and 1 (exclusive), got 2.0"),
    ("--threshold", "0", "argument --threshold: must be between 0 and 1 (exclusive), got 0.0"),
    ("--factor", "-1", "argument --factor: must be at least 0, got -1.0"),
    ("--limit", "0", "argument --limit: must be at least 1, got 0"),
    ("--max-tokens", "1", "argument --max-tokens: must be at least 2, got 1"),
])
def test_sink_arguments_are_checked_when_parsed(capsys, tmp_path, argument, value, message):
    err = _fails(capsys, ["sinks", "--out", str(tmp_path), argument, value])
    assert err.startswith(f"captum-cw sinks: error: {message} ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_cuda(capsys, tmp_path):
    for command in (["attribute", "text"], _evaluate("m", tmp_path), ["sinks", "--out", str(tmp_path)]):
        err = _fails(capsys, [*command, "--device", "cuda"])
        assert "argument --device: cuda asks for CUDA, but torch sees no CUDA device here; use --device cpu" in err


def test_an_unknown_model_names_the_known_ones(capsys, tmp_path):
    err = _fails(capsys, _evaluate(tmp_path / "no-such-model", tmp_path / "out"))
    assert err.startswith(f"captum-cw evaluate: error: no local folder or offline model named "
                          f"'{tmp_path / 'no-such-model'}'; known offline models: smollm2-135m, ")
    assert "hub ids need network" in err


def test_bad_data_stops_before_the_model_loads(capsys, tmp_path):
    (tmp_path / "boolq_validation.jsonl").write_text('{"question": "q", "passage": "p", "answer": "false"}\n')
    argv = ["evaluate", "--model", str(tmp_path / "not-loaded"), "--task", "boolq", "--data-dir", str(tmp_path),
            "--out", str(tmp_path / "out")]
    err = _fails(capsys, argv)
    assert err.startswith(f"captum-cw evaluate: error: {tmp_path / 'boolq_validation.jsonl'}:1: boolq field 'answer' "
                          "must be true or false")
    with pytest.raises(ValueError, match="must be true or false"):  # --debug: the exception and its traceback
        main([*argv, "--debug"])


def test_out_must_be_a_folder(capsys, tiny_llm_dir, tmp_path):
    a_file = tmp_path / "results"
    a_file.write_text("")
    err = _fails(capsys, _evaluate(tiny_llm_dir, a_file))
    assert err == f"captum-cw evaluate: error: {a_file} is a file; give a folder for the run's results.\n"
    err = _fails(capsys, ["sinks", "--model", str(tiny_llm_dir), "--data-dir", str(TEST_DATA), "--limit", "1",
                          "--out", str(a_file)])
    assert err == f"captum-cw sinks: error: {a_file} is a file; give a folder for the study's results.\n"


def test_layers_out_of_range_stop_before_anything_is_written(capsys, tiny_llm_dir, tmp_path):
    err = _fails(capsys, _evaluate(tiny_llm_dir, tmp_path, "--layers", "5"))
    assert err == "captum-cw evaluate: error: layer 5 is out of range: the model has 2 layers (0..1).\n"
    assert not (tmp_path / "config.json").exists()
    assert main(_evaluate(tiny_llm_dir, tmp_path, "--layers", "-1")) == 0  # counts from the end
    assert json.loads((tmp_path / "config.json").read_text())["protocol"]["layers"] == [-1]


def test_a_run_where_no_example_can_be_scored(capsys, tiny_llm_dir, tmp_path):
    (tmp_path / "fineweb_edu_sample.jsonl").write_text('{"text": "Hi"}\n{"text": ""}\n')
    err = _fails(capsys, ["evaluate", "--model", str(tiny_llm_dir), "--task", "fineweb_edu", "--data-dir",
                          str(tmp_path), "--out", str(tmp_path / "out")])
    assert err == ("captum-cw evaluate: error: none of the 2 examples could be scored; give longer texts or more "
                   "examples.\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["n_examples"] == 0 and [entry["id"] for entry in summary["skipped"]] == ["fineweb_edu-0",
                                                                                          "fineweb_edu-1"]


def test_attribute_reports_the_file_it_wrote(capsys, tiny_llm_dir, tmp_path):
    assert main(["attribute", "The capital of France is", "--model", str(tiny_llm_dir),
                 "--out", str(tmp_path / "heatmap")]) == 0
    written = tmp_path / "heatmap" / "captum_cw_heatmap.png"  # no suffix: a folder, not heatmap.png
    assert capsys.readouterr().out.endswith(f"heatmap written to {written}\n")
    assert written.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "heatmap.png").exists()


def test_a_captum_cw_error_that_is_a_type_error_exits_2(capsys, monkeypatch, tmp_path):
    from captum_cw import cli
    from captum_cw.errors import UnsupportedArgumentError

    def refuse(*args, **kwargs):
        raise UnsupportedArgumentError("the model is a function, not a module; pass the model itself.")

    monkeypatch.setattr(cli, "load_model", refuse)
    monkeypatch.chdir(tmp_path)
    err = _fails(capsys, ["attribute", "x", "--json", "scores.json"])  # refused before anything is written
    assert err == "captum-cw attribute: error: the model is a function, not a module; pass the model itself.\n"
    with pytest.raises(TypeError):  # --debug: the exception itself
        main(["attribute", "x", "--json", "scores.json", "--debug"])


def test_task_and_source_choices_come_from_the_task_registry(monkeypatch):
    from captum_cw.cli import build_parser
    from captum_cw.tasks import SOURCES, TASKS, Task

    def choices(command: str, flag: str) -> list[str]:
        commands = next(action for action in build_parser()._actions if action.dest == "command").choices
        return list(commands[command]._option_string_actions[flag].choices)

    for command in ("evaluate", "sinks"):
        assert choices(command, "--task") == list(TASKS) and choices(command, "--source") == list(SOURCES)
    # a task registered in captum_cw.tasks is offered without touching cli.py
    monkeypatch.setitem(TASKS, "new_task", Task("new_task", ("hub/id",), "test", "new.jsonl", TASKS["gsm8k"].build,
                                                "text"))
    assert "new_task" in choices("sinks", "--task") and "new_task" in choices("evaluate", "--task")
