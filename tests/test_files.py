"""Files are written whole or not at all (a kill leaves the old file), their JSON is standard JSON (an undefined
number is ``null``, read here by a parser that refuses ``NaN``), and output paths do what they say."""

import csv
import dataclasses
import json
import math
import os
import re

import numpy as np
import pytest
from matplotlib.figure import Figure

from captum_cw.errors import InputError
from captum_cw.evaluation import EvaluationConfig, evaluate, runner as runner_module
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.report import aopc_cells, paper_order, write_report
from captum_cw.evaluation.run_folder import read_records
from captum_cw.files import output_path, save_figure, strict_json, write_atomically, write_json
from captum_cw.models import load_model
from captum_cw.sinks.study import sink_study
from conftest import TEST_DATA


def _refuse(constant):
    raise ValueError(f"{constant} is not JSON")


def strict_loads(text):
    r"""A parser that refuses NaN and infinities, as JavaScript's JSON.parse and jq do."""
    return json.loads(text, parse_constant=_refuse)


def _numbers(value):
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    return [value] if isinstance(value, float) or value is None else []


def test_strict_loads_refuses_nan():  # the parser the other tests rely on
    with pytest.raises(ValueError, match="NaN is not JSON"):
        strict_loads(json.dumps({"a": math.nan}))


def test_undefined_numbers_become_null_at_any_depth():
    value = {"a": math.nan, "b": [1.5, -math.inf, (math.inf, 2)], "c": {"d": np.float64("nan"), "e": None},
             "f": "NaN", "g": 3}
    text = strict_json(value, indent=1)
    assert strict_loads(text) == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": None, "e": None}, "f": "NaN",
                                  "g": 3}
    assert json.loads(json.dumps({"old": math.nan}))["old"] != 0  # files written before still read (NaN)


def test_a_write_killed_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")

    def killed(*args):
        raise KeyboardInterrupt  # as if the process died after writing the new file, before replacing the old

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"new": 1})
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary
    monkeypatch.undo()
    assert write_atomically(path, "néw") == path and path.read_bytes() == "néw".encode()


def _records(value):
    def record(example):
        return {"id": f"gsm8k-{example}", "label": None, "clean": {"nll": 1.0}, "results": {"random": {
            mode: {"10": {"delta_nll": value}, "50": {"delta_nll": 0.5}}
            for mode in ("comprehensiveness", "sufficiency")}}}

    return [record(0), record(1)]


CONFIG = EvaluationConfig(task="gsm8k", protocol=ProtocolConfig(metrics=("random",), bins=(10, 50)))


def test_summary_json_is_strict_json(tmp_path):
    summary = write_report(_records(math.nan), CONFIG, tmp_path)
    assert math.isnan(summary["bins"]["random"]["comprehensiveness"]["10"]["delta_nll"]["mean"])  # undefined
    written = strict_loads((tmp_path / "summary.json").read_text())
    assert written["bins"]["random"]["comprehensiveness"]["10"]["delta_nll"]["mean"] is None
    assert written["bins"]["random"]["comprehensiveness"]["50"]["delta_nll"]["mean"] == 0.5
    assert aopc_cells(written) == [("random", "nan [nan, nan]", "nan [nan, nan]")]  # read back, shown as before


def test_undefined_values_read_back_from_a_summary_compare_as_nan():
    def row(mean):
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "n": 2}

    aopc = {metric: {mode: {"delta_nll": row(value)} for mode in ("comprehensiveness", "sufficiency")}
            for metric, value in (("attention", None), ("cw_inter", 0.5))}
    order = paper_order(aopc, "delta_nll")
    assert order["comprehensiveness"]["holds"] is False and order["sufficiency"]["separated"] is False


def test_a_summary_killed_while_it_is_written_leaves_the_old_files(tmp_path, monkeypatch):
    write_report(_records(0.25), CONFIG, tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in ("summary.json", "summary.csv", "curves.png")}
    real_writer = csv.writer

    class KilledWriter:  # the process dies after a few rows of summary.csv
        def __init__(self, handle, *args, **kwargs):
            self.writer, self.rows = real_writer(handle, *args, **kwargs), 0

        def writerow(self, row):
            self.rows += 1
            if self.rows > 3:
                raise KeyboardInterrupt
            self.writer.writerow(row)

    monkeypatch.setattr(csv, "writer", KilledWriter)
    with pytest.raises(KeyboardInterrupt):
        write_report(_records(0.75), CONFIG, tmp_path)
    assert (tmp_path / "summary.csv").read_bytes() == before["summary.csv"]  # whole, the old one
    monkeypatch.undo()
    before = {name: (tmp_path / name).read_bytes() for name in before}  # summary.json was replaced, whole

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)  # dies before any file is replaced
    with pytest.raises(KeyboardInterrupt):
        write_report(_records(0.75), CONFIG, tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)  # no temporary file left


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def test_records_of_unlabelled_examples_are_strict_json_and_read_back(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    real = runner_module.load_examples

    def unlabelled(*args, **kwargs):  # choice examples without an answer: their accuracy is undefined (NaN)
        return [dataclasses.replace(example, label=None) for example in real(*args, **kwargs)]

    monkeypatch.setattr(runner_module, "load_examples", unlabelled)
    config = EvaluationConfig(task="mmlu", limit=2, data_dir=str(TEST_DATA), max_tokens=48,
                              protocol=ProtocolConfig(metrics=("random",), bins=(50,)))
    summary = evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        measures = strict_loads(line)["results"]["random"]["comprehensiveness"]["50"]
        assert measures["accuracy"] is None and math.isfinite(measures["prob_drop"])
    for record in read_records(tmp_path):  # read back: undefined is NaN again, as computed
        assert math.isnan(record["results"]["random"]["comprehensiveness"]["50"]["accuracy"])
    assert math.isnan(summary["aopc"]["random"]["comprehensiveness"]["accuracy"]["mean"])
    written = strict_loads((tmp_path / "summary.json").read_text())
    assert written["aopc"]["random"]["comprehensiveness"]["accuracy"]["mean"] is None
    assert written["aopc"]["random"]["comprehensiveness"]["prob_drop"] == pytest.approx(
        summary["aopc"]["random"]["comprehensiveness"]["prob_drop"])
    strict_loads((tmp_path / "config.json").read_text())


def test_sinks_json_is_strict_json(tiny, tmp_path):
    model, tokenizer = tiny
    texts = ["A text long enough to hold a few tokens.", "Another short text."]
    summary = sink_study(model, tokenizer, texts, tmp_path, threshold=0.999, max_tokens=16, progress=False)
    assert any(math.isnan(n) for n in _numbers(summary["factors_mean_sink_vs_other"]))  # no sink: undefined
    written = strict_loads((tmp_path / "sinks.json").read_text())
    assert written["n_texts"] == 2
    assert [n is None for n in _numbers(written["factors_mean_sink_vs_other"])] == [
        math.isnan(n) for n in _numbers(summary["factors_mean_sink_vs_other"])]


def test_a_view_writes_strict_json_in_its_file_and_its_page(tiny, tmp_path):
    from captum_cw.views import attribution_view, write_html

    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, "The capital of France is")
    view.aggregated["attention"][0, 1] = math.nan  # an undefined score
    view.per_head["attention"][0, 0, 0, 1] = math.inf
    document = strict_loads(view.write_json(tmp_path / "s.json").read_text(encoding="utf-8"))
    assert document["scores"]["attention"]["aggregated"][0][1] is None
    assert document["scores"]["attention"]["per_head"][0][0][0][1] is None
    page = write_html(view, tmp_path / "v.html").read_text(encoding="utf-8")
    strict_loads(re.search(r'<script type="application/json" id="cw-data">(.*?)</script>', page, re.S)[1])


@pytest.mark.parametrize("name, magic", [("f.png", b"\x89PNG"), ("f.pdf", b"%PDF"), ("f.svg", b"<?xml"),
                                         ("deep/f.PNG", b"\x89PNG")])
def test_a_figure_is_saved_in_the_format_its_suffix_names(tmp_path, name, magic):
    figure = Figure(figsize=(1, 1))
    figure.subplots().plot([0, 1])
    assert save_figure(figure, tmp_path / name, dpi=20).read_bytes().startswith(magic)


def test_output_paths(tmp_path):
    folder = tmp_path / "existing.png"
    folder.mkdir()
    a_file = tmp_path / "notes"
    a_file.write_text("")
    png = (".png", ".svg")
    assert output_path(tmp_path / "h.png", png, "d.png", "--out") == tmp_path / "h.png"
    assert output_path(tmp_path / "h.SVG", png, "d.png", "--out") == tmp_path / "h.SVG"
    assert output_path(folder, png, "d.png", "--out") == folder / "d.png"  # an existing folder, whatever its name
    assert output_path(f"{tmp_path}/new/", png, "d.png", "--out") == tmp_path / "new" / "d.png"
    assert output_path(tmp_path / "new", png, "d.png", "--out") == tmp_path / "new" / "d.png"
    assert not (tmp_path / "new").exists()  # nothing is created until written
    with pytest.raises(InputError, match=r"^--out .*h\.jpg has the suffix '\.jpg', which names no format written "
                                         r"here; give a file name ending in \.png, \.svg, or a folder"):
        output_path(tmp_path / "h.jpg", png, "d.png", "--out")
    with pytest.raises(InputError, match="is a file without a suffix"):
        output_path(a_file, png, "d.png", "--out")
