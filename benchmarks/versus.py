"""One method against another, measure by measure, over every kept peers run of a model.

    python benchmarks/versus.py --model gemma-3-270m --first cw_knockout_early --second attnlrp --table docs/PEERS.md

Reads the runs of ``benchmarks/peers.py`` kept under ``--runs-root`` (the folders :data:`RUNS` names, the fact
lookups, or with ``--runs sentiment-contrast`` :data:`CONTRAST_RUNS`, each holding ``MODEL/results.jsonl``; one
not kept is left out) and compares the two methods on the ground-truth examples both
were measured on (BoolQ's are left out: no evidence is known there). Per run and kind of evidence (copy task or
not), and pooled over the runs, each cell gives the mean paired difference, first minus second, signed so that a
positive difference favours the first (sufficiency, where lower is better, enters negated), and the wins and
losses of the first in the paired sign test (ties dropped), in bold where its two-sided p-value is below 0.05. The
table replaces the ``<!-- versus:MODEL -->`` section of ``--table`` (``--section`` names another marker, so that one
page holds several pairs); it reads kept records only, so it is the same in any environment.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import (  # the benchmarks folder is on the path from here on
    MEASURES as RECORDED,
    read_results,
    sign_test,
    write_section,
)

__all__ = ["CONTRAST_RUNS", "GROUPS", "KINDS", "LOWER_IS_BETTER", "MEASURES", "RUNS", "main", "paired",
           "summary_table"]

RUNS = {"peers": "3-4 sources, seed 0", "peers_heldout": "3-4 sources, seed 1",
        "peers_many": "6-8 sources, seed 0", "peers_many_heldout": "6-8 sources, seed 1"}  # folder: label
CONTRAST_RUNS = {"peers_sentiment_contrast": "contrast, own format, seed 0",
                 "peers_sentiment_contrast_heldout": "contrast, own format, seed 1",
                 "peers_sentiment_contrast_plain": "contrast, plain format, seed 0"}  # the review_sentiment runs
GROUPS = {"fact-lookups": RUNS, "sentiment-contrast": CONTRAST_RUNS}  # --runs: the folders read
MEASURES = tuple(name for name in RECORDED if name != "time_ratio")  # every measure a run records but its cost
LOWER_IS_BETTER = ("suff@1", "suff@3", "suff@5")
KINDS = {"copy": "copy task", "other": "evidence not the answer string"}


def paired(records: list[dict], first: str, second: str) -> list[tuple[dict, dict]]:
    r"""The ``(first's record, second's record)`` of every ground-truth example both methods were measured on, in
    the order of the examples' names."""
    by_method: dict[str, dict[str, dict]] = {first: {}, second: {}}
    for record in records:
        if record["method"] in by_method and record["task"] != "boolq":
            by_method[record["method"]][record["example"]] = record
    shared = sorted(set(by_method[first]) & set(by_method[second]))
    return [(by_method[first][example], by_method[second][example]) for example in shared]


def _cell(pairs: list[tuple[dict, dict]], measure: str) -> str:
    sign = -1.0 if measure in LOWER_IS_BETTER else 1.0
    differences = [sign * (a[measure] - b[measure]) for a, b in pairs
                   if a.get(measure) is not None and b.get(measure) is not None]
    differences = [difference for difference in differences if not math.isnan(difference)]  # an undefined LDS
    if not differences:
        return "–"
    wins, losses, p = sign_test(differences, [0.0] * len(differences))
    text = f"{sum(differences) / len(differences):+.2f} ({wins}/{losses})"
    return f"**{text}**" if p < 0.05 else text


def summary_table(model_name: str, runs: dict[str, list[dict]], first: str, second: str,
                  marker: str = "versus") -> str:
    r"""The ``marker:MODEL`` section: one row per run and kind of evidence, then the runs pooled per kind and
    overall; ``runs`` maps each run's label to its records."""
    rows: list[tuple[str, str, list[tuple[dict, dict]]]] = []
    pooled: dict[str, list[tuple[dict, dict]]] = {kind: [] for kind in KINDS}
    for label, records in runs.items():
        pairs_of_run = paired(records, first, second)
        for kind, kind_label in KINDS.items():
            pairs = [(a, b) for a, b in pairs_of_run if a["copy"] == (kind == "copy")]
            pooled[kind] += pairs
            rows.append((label, kind_label, pairs))
    rows += [("all runs", KINDS[kind], pairs) for kind, pairs in pooled.items()]
    rows.append(("all runs", "all", [pair for pairs in pooled.values() for pair in pairs]))
    lines = [f"<!-- {marker}:{model_name} -->", f"### {model_name}: {first} against {second}", "",
             "| run | evidence | n | " + " | ".join(MEASURES) + " |", "|---|---|---|" + "---|" * len(MEASURES)]
    for label, kind_label, pairs in rows:
        cells = [_cell(pairs, measure) for measure in MEASURES]
        lines.append(f"| {label} | {kind_label} | {len(pairs)} | " + " | ".join(cells) + " |")
    lines.append(f"<!-- /{marker}:{model_name} -->")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the model's folder name in each run")
    parser.add_argument("--first", default="cw_knockout_early", help="the method whose wins are counted")
    parser.add_argument("--second", default="attnlrp", help="the method it is compared with")
    parser.add_argument("--runs", default="fact-lookups", choices=sorted(GROUPS),
                        help="which kept runs to read: " + "; ".join(f"{name}: {', '.join(folders)}"
                                                                    for name, folders in GROUPS.items()))
    parser.add_argument("--runs-root", default=str(Path(__file__).resolve().parent / "runs"),
                        help="the folder holding the runs")
    parser.add_argument("--table", help="a Markdown file whose SECTION:MODEL section to write")
    parser.add_argument("--section", default="versus", help="the section's marker (versus: <!-- versus:MODEL -->)")
    args = parser.parse_args(argv)
    folders = GROUPS[args.runs]
    runs = {label: read_results(Path(args.runs_root) / folder / args.model / "results.jsonl")
            for folder, label in folders.items()}
    runs = {label: records for label, records in runs.items() if records}
    if not runs:
        parser.error(f"no kept run of {args.model} under {args.runs_root} (looked in {', '.join(folders)})")
    if args.first == args.second:
        parser.error(f"--first and --second are both {args.first}: name two methods")
    measured = {record["method"] for records in runs.values() for record in records} - {"answered"}
    for name in (args.first, args.second):
        if name not in measured:
            parser.error(f"{name} is measured in no kept run of {args.model}; these are: {', '.join(sorted(measured))}")
    section = summary_table(args.model, runs, args.first, args.second, args.section)
    print(section)
    if args.table:
        write_section(Path(args.table), section, args.model, marker=args.section)


if __name__ == "__main__":
    main()
