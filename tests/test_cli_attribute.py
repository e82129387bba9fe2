"""``captum-cw attribute``: target, position, layers, heads, metrics, aggregation, and the HTML, JSON and CSV
files, on the two-layer random Llama (fast); user errors exit 2 with one line."""

import csv
import json

import pytest
import torch
import transformers

from captum_cw.attribution import ContributionWeights
from captum_cw.cli import main
from captum_cw.llm import LLMContributionAttribution

TEXT = "The capital of France is"


def _run(capsys, model_dir, tmp_path, *extra):
    assert main(["attribute", TEXT, "--model", str(model_dir), "--out", str(tmp_path / "heat.png"), *extra]) == 0
    return capsys.readouterr().out


def _fails(capsys, argv):
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    err = capsys.readouterr().err
    assert exit_status.value.code == 2, err
    *progress, line, end = err.split("\n")
    assert end == "" and all("it/s]" in bar for bar in progress) and "Traceback" not in err, err
    return line


def test_target_writes_json_csv_and_html(capsys, tiny_llm_dir, tmp_path):
    out = _run(capsys, tiny_llm_dir, tmp_path, "--target", " Paris", "--json", str(tmp_path / "s.json"),
               "--csv", str(tmp_path / "s.csv"), "--html", str(tmp_path / "v.html"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)
    n = len(tokenizer(TEXT)["input_ids"])
    assert out.startswith("Scores of each token for the position that predicts the target ' Paris' (p: ' Paris' ")
    assert "contribution (inter)" in out and "contribution (intra)" in out and "attention" in out
    for name in ("heatmap", "HTML", "JSON", "CSV"):
        assert f"{name} written to " in out
    document = json.loads((tmp_path / "s.json").read_text())
    assert document["positions"] == [n - 1] and document["target_tokens"] == [" Paris"]
    assert document["tokens"] == [tokenizer.decode([t]) for t in tokenizer(TEXT)["input_ids"]]
    assert set(document["scores"]) == {"cw_inter", "cw_intra", "attention"}
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir).eval()
    front_end = LLMContributionAttribution(model, tokenizer).attribute(TEXT, " Paris")  # mean over layers
    torch.testing.assert_close(torch.tensor(document["scores"]["cw_inter"]["aggregated"]), front_end.token_attr)
    with (tmp_path / "s.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 3 * (n + 2 * n + 2 * 4 * n)
    page = (tmp_path / "v.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "France" in page


def test_layers_heads_metric_aggregation_and_position(capsys, tiny_llm_dir, tmp_path):
    out = _run(capsys, tiny_llm_dir, tmp_path, "--layers", "-1", "--heads", "2", "0", "--metric", "intra",
               "--aggregation", "last", "--position", "2", "--json", str(tmp_path / "s.json"))
    first = out.splitlines()[0]
    assert first.startswith("Scores of each token for position 2 (' of'; next token predicted: ")
    assert first.endswith("last layer (1), heads 0, 2:")
    assert "contribution (intra)" in out and "contribution (inter)" not in out
    document = json.loads((tmp_path / "s.json").read_text())
    assert document["layers"] == [1] and document["heads"] == [0, 2] and document["positions"] == [2]
    assert list(document["scores"]) == ["cw_intra", "attention"] and len(document["tokens"]) == 3
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir).eval()
    ids = transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)(TEXT, return_tensors="pt")["input_ids"]
    expected = ContributionWeights(model, layers=[1], heads=[0, 2], metric="cw_intra").attribute(
        ids, query_positions=[2])
    torch.testing.assert_close(torch.tensor(document["scores"]["cw_intra"]["aggregated"]), expected[0, -1, :, :3])


def test_rollout_of_the_last_position(capsys, tiny_llm_dir, tmp_path):
    out = _run(capsys, tiny_llm_dir, tmp_path, "--aggregation", "rollout", "--metric", "cw_inter")
    assert out.splitlines()[0].endswith("), rollout over layers:")
    table = [line.removesuffix("  sink").split()[-2:] for line in out.splitlines()[2:] if line.strip().startswith("'")]
    assert len(table) == 5
    for column in (0, 1):  # inter-head CW and attention rows sum to 1, and so do their rollouts
        assert sum(float(cells[column]) for cells in table) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("extra, message", [
    (["--target", " Paris", "--position", "1"], "give --position or --target, not both"),
    (["--position", "9"], "position [9] out of range for a sequence of 5 tokens"),
    (["--layers", "2"], "layer 2 is out of range: the model has 2 layers (0..1)"),
    (["--heads", "0", "0"], "names a head twice"),
    (["--target", ""], "the target has no tokens"),
])
def test_user_errors_exit_2_with_one_line(capsys, tiny_llm_dir, tmp_path, extra, message):
    line = _fails(capsys, ["attribute", TEXT, "--model", str(tiny_llm_dir), "--out", str(tmp_path / "h.png"),
                           *extra])
    assert line.startswith("captum-cw attribute: error: ") and message in line, line


@pytest.mark.parametrize("flag, name", [("--json", "captum_cw.json"), ("--csv", "captum_cw.csv"),
                                        ("--html", "captum_cw.html")])
def test_a_view_flag_alone_writes_its_file_in_a_folder_and_no_heatmap(capsys, tiny_llm_dir, tmp_path, monkeypatch,
                                                                      flag, name):
    monkeypatch.chdir(tmp_path)  # where the default heatmap would go
    folder = tmp_path / "views"
    folder.mkdir()
    assert main(["attribute", TEXT, "--model", str(tiny_llm_dir), flag, str(folder)]) == 0
    out = capsys.readouterr().out
    assert (folder / name).stat().st_size > 0 and f"written to {folder / name}\n" in out
    assert "heatmap" not in out and not list(tmp_path.rglob("*.png"))  # asked for another format: no PNG


@pytest.mark.parametrize("out, written", [
    ("heat.pdf", "heat.pdf"), ("heat.svg", "heat.svg"), ("HEAT.PNG", "HEAT.PNG"),
    ("plots/", "plots/captum_cw_heatmap.png"),  # a folder, created
    ("new", "new/captum_cw_heatmap.png"),  # no suffix: a folder, not new.png
])
def test_out_writes_the_format_its_suffix_names_or_into_a_folder(capsys, tiny_llm_dir, tmp_path, out, written):
    assert main(["attribute", TEXT, "--model", str(tiny_llm_dir), "--out", str(tmp_path) + "/" + out,
                 "--json", str(tmp_path / "s.json")]) == 0
    magic = {".pdf": b"%PDF", ".svg": b"<?xml", ".png": b"\x89PNG"}[(tmp_path / written).suffix.lower()]
    assert (tmp_path / written).read_bytes().startswith(magic)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        [written, "s.json"])
    assert f"heatmap written to {tmp_path / written}\n" in capsys.readouterr().out


def test_an_existing_folder_gets_the_heatmap_inside(capsys, tiny_llm_dir, tmp_path):
    folder = tmp_path / "plots.d"  # a folder whose name has a suffix
    folder.mkdir()
    assert main(["attribute", TEXT, "--model", str(tiny_llm_dir), "--out", str(folder)]) == 0
    assert (folder / "captum_cw_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "plots.png").exists()


def test_without_output_flags_the_default_heatmap_is_written(capsys, tiny_llm_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["attribute", TEXT, "--model", str(tiny_llm_dir)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["captum_cw_heatmap.png"]
    assert f"heatmap written to {tmp_path / 'captum_cw_heatmap.png'}\n" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value, accepted", [
    ("--out", "heat.jpg", "'.jpg', which names no format written here; give a file name ending in .png, .pdf, .svg"),
    ("--out", "scores.json", "'.json', which names no format written here; give a file name ending in .png"),
    ("--json", "scores.txt", "'.txt', which names no format written here; give a file name ending in .json, or"),
    ("--csv", "scores.json", "'.json', which names no format written here; give a file name ending in .csv, or"),
    ("--html", "view.png", "'.png', which names no format written here; give a file name ending in .html, .htm,"),
])
def test_a_suffix_of_another_format_is_refused_before_the_model_loads(capsys, tmp_path, monkeypatch, flag, value,
                                                                      accepted):
    monkeypatch.chdir(tmp_path)
    line = _fails(capsys, ["attribute", TEXT, "--model", "no-such-model", flag, value])
    assert line.startswith(f"captum-cw attribute: error: {flag} {value} has the suffix {accepted}"), line
    assert not list(tmp_path.iterdir())


def test_a_file_without_suffix_is_not_taken_for_a_folder(capsys, tmp_path):
    (tmp_path / "notes").write_text("mine")
    line = _fails(capsys, ["attribute", TEXT, "--model", "no-such-model", "--out", str(tmp_path / "notes")])
    assert line.startswith(f"captum-cw attribute: error: --out {tmp_path / 'notes'} is a file without a suffix")
    assert (tmp_path / "notes").read_text() == "mine"


def test_any_metric_and_the_deprecated_variant(capsys, tiny_llm_dir, tmp_path):
    _run(capsys, tiny_llm_dir, tmp_path, "--metric", "value_weighted", "cw", "--json", str(tmp_path / "s.json"))
    assert list(json.loads((tmp_path / "s.json").read_text())["scores"]) == ["value_weighted", "cw_inter", "attention"]
    assert main(["attribute", TEXT, "--model", str(tiny_llm_dir), "--variant", "intra", "--json",
                 str(tmp_path / "v.json")]) == 0
    assert "--variant is deprecated; use --metric cw_intra" in capsys.readouterr().err
    assert list(json.loads((tmp_path / "v.json").read_text())["scores"]) == ["cw_intra", "attention"]
    line = _fails(capsys, ["attribute", TEXT, "--metric", "cw_inter", "--variant", "inter"])
    assert line == "captum-cw attribute: error: give --metric only; --variant is its deprecated former name."


@pytest.mark.parametrize("extra, message", [
    (["--aggregation", "max"], "argument --aggregation: invalid choice: 'max'"),
    (["--metric", "both"], "argument --metric: Unknown metric 'both'; choose one of attention"),
    (["--variant", "both"], "argument --variant: Unknown metric 'both'"),
    (["--position", "last"], "argument --position: invalid int value: 'last'"),
    (["--exclude", "bos"], "argument --exclude: invalid choice: 'bos'"),
])
def test_bad_arguments_exit_2_when_parsed(capsys, extra, message):
    line = _fails(capsys, ["attribute", TEXT, *extra])
    assert message in line, line


def test_a_target_of_several_tokens_sums_its_positions(capsys, tiny_llm_dir, tmp_path):
    out = _run(capsys, tiny_llm_dir, tmp_path, "--target", " Paris is", "--json", str(tmp_path / "s.json"))
    assert out.startswith("Scores of each token for the 2 positions that predict the target ' Paris is' (p: ")
    assert "summed over them, mean over layers:" in out.splitlines()[0]
    document = json.loads((tmp_path / "s.json").read_text())
    assert document["positions"] == [4, 5] and document["target_tokens"] == [" Paris", " is"]
    aggregated = torch.tensor(document["scores"]["attention"]["aggregated"])  # [position, key]
    france = [line for line in out.splitlines() if line.strip().startswith("' France'")][0]
    assert float(france.split()[-1]) == pytest.approx(float(aggregated[:, 3].sum()), abs=1e-4)


def test_exclude_marks_the_excluded_tokens_in_the_table_json_and_page(capsys, tiny_llm_dir, tmp_path):
    out = _run(capsys, tiny_llm_dir, tmp_path, "--exclude", "first", "--json", str(tmp_path / "v.json"),
               "--html", str(tmp_path / "v.html"))
    rows = [line for line in out.splitlines() if line.startswith(" ") and "'" in line]
    assert rows[0].endswith("excluded") and not any(row.endswith("excluded") for row in rows[1:])
    assert "excluded (--exclude first)" in out
    document = json.loads((tmp_path / "v.json").read_text())
    assert document["exclude"] == "first" and document["excluded"] == [[0]]
    assert 'class="tok excluded"' in (tmp_path / "v.html").read_text(encoding="utf-8")
