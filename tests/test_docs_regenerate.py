"""Every table in docs/ regenerates byte for byte from the run folders kept in benchmarks/runs/ (issue #26 item 5).

Each results page's generator runs in report-only mode on copies (the page, its kept summaries, its run folders),
never on docs/ itself, and its text must equal the committed page:

- ``RESULTS*.md`` pages: ``benchmarks/faithfulness_table.py`` with the options of the page's own "Reproduce:" line
  (and ``--side-by-side`` where the page holds that section), run from a mirror of the repository's layout in a
  temporary folder so that the paths the page prints are the repository's; the summaries it keeps as JSON next to
  the plots must match the committed ones too. Needs the task files in the hub schema, in the folder
  ``$CAPTUM_CW_DATA`` names (MMLU's subjects are read from them); skipped without them.
- ``<!-- peers:MODEL -->`` sections (and ``peers-heldout``, ``peers-many``, ``peers-many-heldout``,
  ``peers-sentiment``, ``peers-sentiment-heldout``, ``peers-sentiment-plain``, each ``peers-sentiment*`` also with
  ``-contrast``): ``benchmarks/peers.py`` on ``benchmarks/runs/peers/MODEL`` (``peers_heldout``, ``peers_many``,
  ``peers_many_heldout``, ``peers_sentiment``, ``peers_sentiment_heldout``, ``peers_sentiment_plain``,
  ``peers_sentiment_contrast*``), against the reference method the section names; ``<!-- layers:MODEL -->``
  sections: ``benchmarks/layer_pointing.py`` on ``benchmarks/runs/layer_pointing/MODEL``;
  ``<!-- task-accuracy:MODEL -->`` sections: ``benchmarks/task_accuracy.py`` on
  ``benchmarks/runs/task_accuracy/MODEL``; ``<!-- yes-no-binding:MODEL -->`` sections:
  ``benchmarks/yes_no_binding.py`` on ``benchmarks/runs/yes_no_binding/MODEL``; ``<!-- versus:MODEL -->`` (and
  ``versus-ablation``) sections: ``benchmarks/versus.py`` on the four peers runs of MODEL, for the two methods the
  section names; ``versus-contrast`` and ``versus-contrast-target``: the same on its sentiment contrast runs.
- docs/PAPER_REPRODUCTION.md: ``benchmarks/paper_reproduction.py`` on ``benchmarks/runs/paper`` (none kept yet:
  every cell says "not run").

benchmarks/RESULTS.md is left out: it holds timings measured on one machine, which no report can regenerate. The
other pages of docs/ (DESIGN, SINKS, IG_CONVERGENCE, INSEQ) have no report-only generator; every page is still
read for the ``benchmarks/runs/...`` folders it cites, which must exist. Pages, sections and folders are found
when the tests run, so runs and pages added later are checked as they are.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import versus  # benchmarks/ is on the path from the line above: the folders each --runs reads

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RUNS = REPO / "benchmarks" / "runs"
DATA = Path(os.environ["CAPTUM_CW_DATA"]) if "CAPTUM_CW_DATA" in os.environ else None
REPRODUCE = re.compile(r"^Reproduce: `python benchmarks/faithfulness_table\.py ([^`]*)`", re.MULTILINE)
SECTION_RUNS = {"peers": "peers", "peers-heldout": "peers_heldout", "peers-many": "peers_many",
                "peers-many-heldout": "peers_many_heldout", "peers-sentiment": "peers_sentiment",
                "peers-sentiment-heldout": "peers_sentiment_heldout",
                "peers-sentiment-plain": "peers_sentiment_plain",
                "peers-sentiment-contrast": "peers_sentiment_contrast",
                "peers-sentiment-contrast-heldout": "peers_sentiment_contrast_heldout",
                "peers-sentiment-contrast-plain": "peers_sentiment_contrast_plain",
                "layers": "layer_pointing", "task-accuracy": "task_accuracy",
                "yes-no-binding": "yes_no_binding", "versus": "peers",
                "versus-ablation": "peers", "versus-contrast": "peers_sentiment_contrast",
                "versus-contrast-target": "peers_sentiment_contrast"}  # kind: runs folder (versus: the first it reads)
VERSUS_RUNS = {"versus": "fact-lookups", "versus-ablation": "fact-lookups", "versus-contrast": "sentiment-contrast",
               "versus-contrast-target": "sentiment-contrast"}  # kind: versus.py --runs
SECTION = re.compile(rf"^<!-- ({'|'.join(map(re.escape, SECTION_RUNS))}):([\w.-]+) -->$", re.MULTILINE)  # a line
PEERS_KINDS = ("peers", "peers-heldout", "peers-many", "peers-many-heldout", "peers-sentiment",
               "peers-sentiment-heldout", "peers-sentiment-plain", "peers-sentiment-contrast",
               "peers-sentiment-contrast-heldout", "peers-sentiment-contrast-plain")  # peers.py's --section
SIDE_BY_SIDE = "## Side by side: the paper's order per model"
# tables whose run folders were lost before the runs were kept; their kept summaries stand until they are rerun
# (issue #26: "Gemma's layer-level MC run folders are cited but not kept"). Remove an entry once its folder is kept.
NOT_KEPT: set[str] = set()  # empty since 2026-12-06: Gemma's three lost layer-level runs were rerun and are kept


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def faithfulness_pages() -> list[Path]:
    return [page for page in pages() if REPRODUCE.search(page.read_text(encoding="utf-8"))]


def section_pages() -> list[Path]:
    return [page for page in pages() if SECTION.search(page.read_text(encoding="utf-8"))]


def reproduce_options(page: Path) -> list[str]:
    r"""The options of the page's first "Reproduce:" command, with ``--results`` the page itself."""
    match = REPRODUCE.search(page.read_text(encoding="utf-8"))
    assert match, f"{page.name} has no Reproduce line"
    options = shlex.split(match.group(1))
    return options if "--results" in options else [*options, "--results", f"docs/{page.name}"]


def option(options: list[str], name: str, default: str) -> str:
    return options[options.index(name) + 1] if name in options else default


def assert_same(committed: Path, regenerated: Path) -> None:
    r"""Fails with a short unified diff where the regenerated file differs from the committed one."""
    before, after = committed.read_text(encoding="utf-8"), regenerated.read_text(encoding="utf-8")
    if before != after:
        diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), f"{committed.relative_to(REPO)}",
                                         "regenerated", n=1, lineterm=""))
        shown = "\n".join(line[:200] for line in diff[:40]) + ("\n..." if len(diff) > 40 else "")
        pytest.fail(f"{committed.relative_to(REPO)} does not regenerate from its runs:\n{shown}")


def run_script(script: str, arguments: list[str], cwd: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, script, *arguments], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{Path(script).name} failed:\n{done.stderr[-3000:]}"


def copy_folder(source: Path, target: Path) -> None:
    r"""A copy of ``source`` at ``target`` (an empty folder where ``source`` is not kept)."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.png"))
    else:
        target.mkdir(parents=True)


def regenerate_faithfulness(page: Path, mirror: Path) -> Path:
    r"""Runs the page's Reproduce command with ``--report-only`` in ``mirror``, a copy of the repository's layout
    (the script, the model's run folders, the page, the summaries under docs/faithfulness/); returns the copy."""
    options = reproduce_options(page)
    model = option(options, "--model", "smollm2-135m")
    out = option(options, "--out", f"benchmarks/runs/{model}")
    (mirror / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "faithfulness_table.py", mirror / "benchmarks")
    copy_folder(REPO / out, mirror / out)
    copy_folder(DOCS / "faithfulness", mirror / "docs" / "faithfulness")
    results = option(options, "--results", "")
    shutil.copy(page, mirror / results)
    side_by_side = ["--side-by-side", results] if SIDE_BY_SIDE in page.read_text(encoding="utf-8") else []
    run_script("benchmarks/faithfulness_table.py", [*options, *side_by_side, "--report-only", "--data-dir", str(DATA)],
               mirror)
    return mirror / results


@pytest.mark.slow
@pytest.mark.parametrize("page", faithfulness_pages(), ids=lambda page: page.name)
def test_faithfulness_page_regenerates(page: Path, tmp_path: Path) -> None:
    if DATA is None or not (DATA / "mmlu_test.jsonl").exists():
        pytest.skip(f"needs the task files: set CAPTUM_CW_DATA to a folder of hub-schema JSONL files (now {DATA})")
    regenerated = regenerate_faithfulness(page, tmp_path)
    assert_same(page, regenerated)
    for summary in sorted((tmp_path / "docs" / "faithfulness").rglob("*.json")):
        committed = DOCS / summary.relative_to(tmp_path / "docs")
        assert committed.exists(), f"{page.name}: the summary {committed.relative_to(REPO)} is not committed"
        assert_same(committed, summary)


def regenerate_sections(page: Path, folder: Path, runs: Path = RUNS) -> Path:
    r"""Rewrites every peers, layers, task-accuracy, yes-no-binding and versus section of a copy of ``page`` in
    ``folder`` from copies of the run folders under ``runs``; returns the copy."""
    text = page.read_text(encoding="utf-8")
    table = folder / page.name
    shutil.copy(page, table)
    for kind, model in SECTION.findall(text):
        if kind == "task-accuracy":
            accuracy = folder / "task_accuracy" / model
            copy_folder(runs / "task_accuracy" / model, accuracy)
            run_script(str(REPO / "benchmarks" / "task_accuracy.py"), ["--report-only", "--model", model, "--out",
                                                                       str(accuracy), "--table", str(table)], folder)
            continue
        if kind == "yes-no-binding":
            if not (runs / "yes_no_binding" / model).is_dir():
                continue  # a partial copy of the runs (test_a_changed_record_changes_the_page): the section stays
            binding = folder / "yes_no_binding" / model
            copy_folder(runs / "yes_no_binding" / model, binding)
            run_script(str(REPO / "benchmarks" / "yes_no_binding.py"), ["--report-only", "--model", model, "--out",
                                                                         str(binding), "--table", str(table)], folder)
            continue
        if kind in VERSUS_RUNS:
            section = text[text.index(f"<!-- {kind}:{model} -->"):text.index(f"<!-- /{kind}:{model} -->")]
            heading = re.search(rf"^### {re.escape(model)}: ([\w.-]+) against ([\w.-]+)$", section, re.MULTILINE)
            assert heading, f"{page.name}: the {kind}:{model} section names no methods"
            kept = [run for run in versus.GROUPS[VERSUS_RUNS[kind]] if (runs / run / model).is_dir()]
            if not kept:
                continue  # a partial copy of the runs (test_a_changed_record_changes_the_page): the section stays
            for run in kept:
                if not (folder / run / model).exists():
                    copy_folder(runs / run / model, folder / run / model)
            run_script(str(REPO / "benchmarks" / "versus.py"), ["--model", model, "--first", heading.group(1),
                                                                 "--second", heading.group(2), "--runs-root",
                                                                 str(folder), "--runs", VERSUS_RUNS[kind],
                                                                 "--table", str(table), "--section", kind], folder)
            continue
        peers = folder / "peers" / model  # the layer sections read the main peers run too
        if not peers.exists():
            copy_folder(runs / "peers" / model, peers)
        if kind in PEERS_KINDS:
            run = folder / SECTION_RUNS[kind] / model
            if not run.exists():
                copy_folder(runs / SECTION_RUNS[kind] / model, run)
            section = text[text.index(f"<!-- {kind}:{model} -->"):text.index(f"<!-- /{kind}:{model} -->")]
            references = set(re.findall(r"sign test against ([\w.-]+)\)", section))
            assert len(references) <= 1, f"{page.name}: the {model} section mixes references {references}"
            reference = ["--reference", references.pop()] if references else []
            run_script(str(REPO / "benchmarks" / "peers.py"), ["--report-only", "--model", model, *reference,
                                                               "--out", str(run), "--table", str(table),
                                                               "--section", kind], folder)
        else:
            layers = folder / "layer_pointing" / model
            copy_folder(runs / "layer_pointing" / model, layers)
            run_script(str(REPO / "benchmarks" / "layer_pointing.py"),
                       ["--report-only", "--model", model, "--peers", str(peers), "--out", str(layers),
                        "--table", str(table)], folder)
    return table


@pytest.mark.parametrize("page", section_pages(), ids=lambda page: page.name)
def test_peers_sections_regenerate(page: Path, tmp_path: Path) -> None:
    assert_same(page, regenerate_sections(page, tmp_path))


@pytest.mark.slow
def test_a_changed_record_changes_the_page(tmp_path: Path) -> None:
    r"""The comparison can fail: one number changed in a copy of a peers run's records changes the page."""
    sections = [(page, model) for page in section_pages()
                for kind, model in SECTION.findall(page.read_text(encoding="utf-8")) if kind == "peers"]
    if not sections:
        pytest.skip("no page has a peers section")
    page, model = sections[0]
    runs = tmp_path / "runs"
    copy_folder(RUNS / "peers" / model, runs / "peers" / model)
    results = runs / "peers" / model / "results.jsonl"
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    changed = next(record for record in records if isinstance(record.get("pointing"), (int, float)))
    changed["pointing"] = 0.5 if changed["pointing"] != 0.5 else 0.25
    results.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    (tmp_path / "out").mkdir()
    regenerated = regenerate_sections(page, tmp_path / "out", runs)
    assert regenerated.read_text(encoding="utf-8") != page.read_text(encoding="utf-8")


def test_paper_reproduction_page_regenerates(tmp_path: Path) -> None:
    page = DOCS / "PAPER_REPRODUCTION.md"
    copy_folder(RUNS / "paper", tmp_path / "paper")
    shutil.copy(page, tmp_path / page.name)
    run_script(str(REPO / "benchmarks" / "paper_reproduction.py"),
               ["--report-only", "--out", str(tmp_path / "paper"), "--results", str(tmp_path / page.name)], tmp_path)
    assert_same(page, tmp_path / page.name)


def cited_folders() -> list[str]:
    r"""Every ``benchmarks/runs/...`` path the pages of docs/ cite, but placeholders (``benchmarks/runs/MODEL/``)."""
    cited = {match.rstrip(".,;:") for page in pages()
             for match in re.findall(r"benchmarks/runs/[\w./-]*", page.read_text(encoding="utf-8"))}
    return sorted(path for path in cited if not any(part.isupper() for part in Path(path).parts))


@pytest.mark.parametrize("path", cited_folders())
def test_cited_run_folder_is_kept(path: str) -> None:
    assert (REPO / path).exists(), f"docs/ cite {path}, which is not in the repository"


def tables() -> dict[str, Path]:
    r"""``{"PAGE: task, protocol level": run folder}`` for every table of the faithfulness pages, and
    ``{"PAGE: peers|layers|task-accuracy MODEL": run folder}`` for every generated section."""
    found = {}
    for page in faithfulness_pages():
        options = reproduce_options(page)
        out = REPO / option(options, "--out", f"benchmarks/runs/{option(options, '--model', 'smollm2-135m')}")
        protocol = None
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith("## "):
                protocol = "layer" if line.startswith("## Layer level") else "input" if line.startswith(
                    "## Input level") else None
            elif protocol and (heading := re.match(r"### [^:]+: (.+?) \(\d+ (?:examples|texts)", line)):
                name = heading.group(1).replace(" ", "_") + ("_input" if protocol == "input" else "")
                found[f"{page.name}: {heading.group(1)}, {protocol} level"] = out / name
    for page in section_pages():
        for kind, model in SECTION.findall(page.read_text(encoding="utf-8")):
            found[f"{page.name}: {kind} {model}"] = RUNS / SECTION_RUNS[kind] / model
    return found


@pytest.mark.parametrize("table", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="run folder lost"))
                                   if name in NOT_KEPT else name for name in tables()])
def test_every_table_has_its_run_folder(table: str) -> None:
    folder = tables()[table]
    records = folder / ("results.jsonl" if folder.parent.name in SECTION_RUNS.values() else "records.jsonl")
    assert records.exists(), f"{table} comes from {folder.relative_to(REPO)}, which is not kept"
