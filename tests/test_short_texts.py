"""Texts too short to score are skipped with their reason: no NaN reaches a summary or a plot."""

import json
import math

import pytest

from captum_cw.evaluation import EvaluationConfig, evaluate
from captum_cw.evaluation.protocols import ProtocolConfig
from captum_cw.evaluation.report import summarize
from captum_cw.evaluation.run_folder import read_records
from captum_cw.models import load_model
from captum_cw.plotting import plot_curves
from captum_cw.sinks.study import sink_study

TEXTS = ["A text long enough to be scored by its next tokens.", "", "Hi", "Another text that can be scored."]


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def _run(tiny, data, out, *, resume=False):
    model, tokenizer = tiny
    config = EvaluationConfig(task="fineweb_edu", limit=4, data_dir=str(data), max_tokens=16,
                              protocol=ProtocolConfig(metrics=("cw_inter", "random"), bins=(50,)))
    return evaluate(config, out, resume=resume, model=model, tokenizer=tokenizer, progress=False)


def test_texts_too_short_to_score_are_skipped_with_their_reason(tiny, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "fineweb_edu_sample.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "out"
    summary = _run(tiny, data, out)
    assert summary["n_examples"] == 2
    assert [entry["id"] for entry in summary["skipped"]] == ["fineweb_edu-1", "fineweb_edu-2"]
    assert all("a text needs at least 2 to be scored" in entry["reason"] for entry in summary["skipped"])
    written = (out / "summary.json").read_text()
    assert "NaN" not in written and json.loads(written)["skipped"] == summary["skipped"]
    assert all(math.isfinite(row["mean"]) for modes in summary["aopc"].values() for measures in modes.values()
               for row in measures.values())
    assert (out / "curves.png").exists()
    assert [r["id"] for r in read_records(out)] == ["fineweb_edu-0", "fineweb_edu-3"]  # scored ones only
    resumed = _run(tiny, data, out, resume=True)
    assert resumed["skipped"] == summary["skipped"] and resumed["aopc"] == summary["aopc"]


def test_the_sink_study_skips_them_too(tiny, tmp_path):
    model, tokenizer = tiny
    summary = sink_study(model, tokenizer, TEXTS, tmp_path, max_tokens=16, progress=False)
    assert summary["n_texts"] == 2 and [entry["text"] for entry in summary["skipped"]] == [1, 2]
    assert math.isfinite(summary["sink_norm_intervention"]["delta_perplexity"]["mean"])
    with pytest.raises(ValueError, match="none of the 2 texts has the 2 tokens a sink study needs"):
        sink_study(model, tokenizer, TEXTS[1:3], tmp_path, progress=False)


def test_a_curve_leaves_out_what_is_not_a_number(tmp_path):
    def record(value):
        return {"id": "gsm8k-0", "clean": {"nll": 1.0}, "results": {"random": {
            mode: {"10": {"delta_nll": value}, "50": {"delta_nll": 0.5}} for mode in ("comprehensiveness",
                                                                                      "sufficiency")}}}

    plot_curves(summarize([record(0.1)]), tmp_path / "finite.png")
    plot_curves(summarize([record(math.nan)]), tmp_path / "one_nan.png")  # a NaN point is left out
    summary = summarize([record(math.nan)])
    for modes in summary["bins"].values():
        for bins in modes.values():
            bins["50"]["delta_nll"]["mean"] = math.nan
    plot_curves(summary, tmp_path / "all_nan.png")  # an empty panel instead of a crash on its log scale
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in ("finite.png", "one_nan.png",
                                                                           "all_nan.png"))
