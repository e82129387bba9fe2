"""benchmarks/versus.py: paired differences signed so that positive favours the first method, sign tests on the
examples both methods were measured on, rows per run and kind and pooled."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import versus  # benchmarks/ is on the path from the line above

# written apart from versus.py: the measures where a smaller number is the better one (docs/PEERS.md, "Measures":
# sufficiency is the drop with only the top tokens kept)
SMALLER_IS_BETTER = {"suff@1", "suff@3", "suff@5"}


def record(method: str, example: str, *, copy: bool, task: str = "who_lives_where", **values) -> dict:
    return {"model": "m", "example": example, "task": task, "copy": copy, "method": method, **values}


def run_records(count: int, *, copy: bool, comp: float, suff: float, prefix: str = "e") -> list[dict]:
    r"""``count`` examples where ``a``'s comp@1 exceeds ``b``'s by ``comp`` and its suff@1 by ``suff``."""
    records = []
    for i in range(count):
        first = {"comp@1": 1.0 + comp, "suff@1": 2.0 + suff, "lds": 0.5}
        records.append(record("a", f"{prefix}{i}", copy=copy, **first))
        records.append(record("b", f"{prefix}{i}", copy=copy, **{"comp@1": 1.0, "suff@1": 2.0, "lds": 0.5}))
    return records


def row(section: str, run: str, evidence: str) -> dict[str, str]:
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[:2] == [run, evidence]:
            return dict(zip(header, cells))
    raise AssertionError(f"no row {run}, {evidence}")


def test_differences_favour_the_first_and_sufficiency_enters_negated():
    records = run_records(10, copy=True, comp=0.5, suff=0.25)  # a removes more (better), keeps less (worse)
    section = versus.summary_table("m", {"run 1": records}, "a", "b")
    copy = row(section, "run 1", versus.KINDS["copy"])
    assert copy["n"] == "10"
    assert copy["comp@1"] == "**+0.50 (10/0)**"  # 10/0: p = 0.002
    assert copy["suff@1"] == "**-0.25 (0/10)**"
    assert copy["lds"] == "+0.00 (0/0)"  # every pair tied
    assert copy["comp@3"] == "–"  # measured by neither
    records[0]["lds"] = float("nan")  # undefined on one example: left out, not carried into the mean
    nan_row = row(versus.summary_table("m", {"run 1": records}, "a", "b"), "run 1", versus.KINDS["copy"])
    assert nan_row["lds"] == "+0.00 (0/0)"
    assert row(section, "run 1", versus.KINDS["other"])["n"] == "0"


def test_every_measure_is_signed_by_its_own_direction_and_paired_by_example():
    measures = list(versus.MEASURES)
    assert {"pointing", "comp@1", "comp@5", "suff@5", "source_comp@1", "lds"} <= set(measures)
    first, second = [], []
    for i in range(8):  # a is ahead of b by 1 on every measure, each example at its own level
        first.append(record("a", f"e{i}", copy=False, **{name: 10.0 * i + 1.0 for name in measures}))
        second.append(record("b", f"e{i}", copy=False, **{name: 10.0 * i for name in measures}))
    section = versus.summary_table("m", {"run": first + second[::-1]}, "a", "b")  # b's records in another order
    cells = row(section, "run", versus.KINDS["other"])
    for name in measures:
        expected = "**-1.00 (0/8)**" if name in SMALLER_IS_BETTER else "**+1.00 (8/0)**"
        assert cells[name] == expected, name


def test_bold_only_where_the_sign_test_rejects():
    records = run_records(5, copy=False, comp=0.5, suff=0.0)  # 5/0: p = 0.0625
    section = versus.summary_table("m", {"run 1": records}, "a", "b")
    assert row(section, "run 1", versus.KINDS["other"])["comp@1"] == "+0.50 (5/0)"


def test_pairs_are_the_shared_ground_truth_examples_and_runs_pool():
    first = run_records(6, copy=True, comp=1.0, suff=0.0, prefix="c") + run_records(4, copy=False, comp=-1.0,
                                                                                      suff=0.0)
    first.append(record("a", "only-a", copy=True, **{"comp@1": 9.0}))  # b was not measured on it
    first.append(record("a", "boolq-0", copy=False, task="boolq", **{"comp@1": 9.0}))
    first.append(record("b", "boolq-0", copy=False, task="boolq", **{"comp@1": 0.0}))
    first.append(record("c", "c0", copy=True, **{"comp@1": 9.0}))  # another method
    second = run_records(7, copy=True, comp=1.0, suff=0.0, prefix="d")
    section = versus.summary_table("m", {"run 1": first, "run 2": second}, "a", "b")
    assert row(section, "run 1", versus.KINDS["copy"])["n"] == "6"
    assert row(section, "run 1", versus.KINDS["other"])["comp@1"] == "-1.00 (0/4)"
    assert row(section, "all runs", versus.KINDS["copy"])["comp@1"] == "**+1.00 (13/0)**"
    pooled = row(section, "all runs", "all")
    assert pooled["n"] == "17"
    assert pooled["comp@1"] == f"**{(13 - 4) / 17:+.2f} (13/4)**"  # p = 0.049


def write_run(root: Path, folder: str, records: list[dict]) -> None:
    (root / folder / "m").mkdir(parents=True)
    (root / folder / "m" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records),
                                                       encoding="utf-8")


def test_main_writes_the_section_from_the_kept_runs(tmp_path):
    write_run(tmp_path, "peers_heldout", run_records(3, copy=False, comp=0.5, suff=0.0))
    table = tmp_path / "page.md"
    table.write_text("# Page\n\n<!-- versus:m -->\nold\n<!-- /versus:m -->\n\nafter\n", encoding="utf-8")
    versus.main(["--model", "m", "--first", "a", "--second", "b", "--runs-root", str(tmp_path), "--table",
                 str(table)])
    text = table.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith("after\n")
    assert "### m: a against b" in text
    assert f"| {versus.RUNS['peers_heldout']} | {versus.KINDS['other']} | 3 |" in text
    assert versus.RUNS["peers"] not in text  # not kept: left out
    versus.main(["--model", "m", "--first", "b", "--second", "a", "--runs-root", str(tmp_path), "--table",
                 str(table), "--section", "versus-other"])  # another pair, in its own section
    text = table.read_text(encoding="utf-8")
    assert "### m: a against b" in text and "<!-- versus-other:m -->\n### m: b against a" in text


def test_runs_names_the_group_of_runs_read(tmp_path, capsys):
    r"""``--runs sentiment-contrast`` reads the contrast runs and no fact-lookup run; the default reads the reverse."""
    write_run(tmp_path, "peers", run_records(2, copy=True, comp=0.5, suff=0.0))
    write_run(tmp_path, "peers_sentiment_contrast_plain", run_records(4, copy=False, comp=-0.5, suff=0.0))
    versus.main(["--model", "m", "--first", "a", "--second", "b", "--runs-root", str(tmp_path),
                 "--runs", "sentiment-contrast"])
    contrast = capsys.readouterr().out
    plain = row(contrast, versus.CONTRAST_RUNS["peers_sentiment_contrast_plain"], versus.KINDS["other"])
    assert plain["comp@1"] == "-0.50 (0/4)"  # 0/4: p = 0.125, not bold
    assert versus.RUNS["peers"] not in contrast
    versus.main(["--model", "m", "--first", "a", "--second", "b", "--runs-root", str(tmp_path)])
    facts = capsys.readouterr().out
    assert row(facts, versus.RUNS["peers"], versus.KINDS["copy"])["n"] == "2"
    assert versus.CONTRAST_RUNS["peers_sentiment_contrast_plain"] not in facts


@pytest.mark.parametrize(("arguments", "message"), [
    (["--model", "other"], "no kept run of other"),
    (["--model", "m", "--first", "a", "--second", "a"], "both a"),
    (["--model", "m", "--first", "a", "--second", "attnlrpp"], "attnlrpp is measured in no kept run of m"),
])
def test_main_refuses_what_it_cannot_compare_and_leaves_the_page(tmp_path, capsys, arguments, message):
    write_run(tmp_path, "peers", run_records(3, copy=False, comp=0.5, suff=0.0))
    table = tmp_path / "page.md"
    table.write_text("<!-- versus:m -->\nkept\n<!-- /versus:m -->\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        versus.main([*arguments, "--runs-root", str(tmp_path), "--table", str(table)])
    assert message in capsys.readouterr().err
    assert "kept" in table.read_text(encoding="utf-8")
