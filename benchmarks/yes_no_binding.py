"""Whether a model reads a yes/no question's supporting sentence, or only matches the asked city in the context.

    python benchmarks/yes_no_binding.py --model gemma-3-270m --out benchmarks/runs/yes_no_binding/gemma-3-270m \\
        --table docs/PEERS.md

Both bundled models give one answer to every yes/no question (docs/PEERS.md, the task table), but the answer's
log-odds ``log p(yes) - log p(no)`` may still move with the evidence, and then a contrast of the two would be a
target to explain. Each ``yes_no`` example is asked three ways, the context unchanged: about the city its evidence
states for the asked person (*stated*, the answer yes), about a distractor's city (*another's*: the city stands in
the context, bound to someone else; no) and about a city no source names (*absent*: no). A model that reads the
supporting sentence raises the log-odds from *another's* to *stated*; one that only matches the city raises it
from *absent* to both alike. One forward per question; the per-example log-odds go to ``OUT/results.jsonl``
(JSON lines), the table to ``--table`` between ``<!-- yes-no-binding:MODEL -->`` markers (``--report-only``
rewrites it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_methods import encode_example  # the benchmarks folder is on the path from here on
from peers import write_section

from captum_cw.statistics import mean_interval
from captum_cw.tasks.context import CITIES, ContextExample, context_examples

__all__ = ["QUESTION_KINDS", "asked_three_ways", "log_odds", "main", "summary_table"]

QUESTION_KINDS = ("stated", "another's", "absent")


def _person_and_city(source: str) -> tuple[str, str]:
    name, city = source.strip().removesuffix(".").split(" lives in ")
    return name, city


def asked_three_ways(example: ContextExample) -> dict[str, ContextExample]:
    r"""The example with its question about the evidence's city, a distractor's city and a city no source names
    (drawn at random, seeded by the example's id) (:data:`QUESTION_KINDS`), the context and everything else
    unchanged."""
    name, stated = _person_and_city(example.sources[example.evidence])
    others = [_person_and_city(source)[1] for k, source in enumerate(example.sources) if k != example.evidence]
    named = {_person_and_city(source)[1] for source in example.sources}
    unnamed = sorted(city for city in CITIES if city not in named)
    absent = unnamed[random.Random(example.id).randrange(len(unnamed))]  # drawn per example, reproducibly
    asked = {"stated": stated, "another's": others[0], "absent": absent}
    return {kind: dataclasses.replace(example, question=example.question.replace(
                f"Does {name} live in {example.question.split(' live in ')[1].split('?')[0]}?",
                f"Does {name} live in {city}?"), answer=" yes" if kind == "stated" else " no")
            for kind, city in asked.items()}


def log_odds(model, tokenizer, example: ContextExample, style: str) -> float:
    r"""``log p(" yes") - log p(" no")`` at the end of the example's prompt (first tokens)."""
    encoded = encode_example(tokenizer, example, style)
    yes, no = encoded.candidates  # yes_no's candidates: (" yes", " no")
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids.to(next(model.parameters()).device)).logits[0, -1]  # [vocab]
    log_probabilities = logits.float().log_softmax(-1)
    return float(log_probabilities[yes] - log_probabilities[no])


def _cell(values: np.ndarray) -> str:
    interval = mean_interval(values.tolist())
    return f"{interval['mean']:.2f} [{interval['ci_low']:.2f}, {interval['ci_high']:.2f}]"


def summary_table(model_name: str, records: list[dict]) -> str:
    r"""The section of one model: per style and distractors, the mean log-odds of each question kind and the two
    shifts that tell reading from matching, with 95% intervals and the share of examples the shift is positive on."""
    lines = [f"<!-- yes-no-binding:{model_name} -->", "",
             f"{model_name}: log p(yes) - log p(no) (nats), mean [95% bootstrap interval]; a shift's share: the "
             "examples it is positive on.", "",
             "| style | distractors | n | stated | another's | absent | stated - another's (reading) | share "
             "| another's - absent (matching) | share | answered yes (stated / another's / absent) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    settings = sorted({(r["style"], r["distractors"]) for r in records})
    for style, distractors in settings:
        rows = [r for r in records if (r["style"], r["distractors"]) == (style, distractors)]
        values = {kind: np.array([r["log_odds"][kind] for r in rows]) for kind in QUESTION_KINDS}
        reading, matching = values["stated"] - values["another's"], values["another's"] - values["absent"]
        cells = [_cell(values[kind]) for kind in QUESTION_KINDS]
        yes = " / ".join(f"{np.mean(values[kind] > 0):.2f}" for kind in QUESTION_KINDS)
        lines.append(f"| {style} | {distractors} | {len(rows)} | {' | '.join(cells)} | "
                     f"{_cell(reading)} | {np.mean(reading > 0):.2f} | "
                     f"{_cell(matching)} | {np.mean(matching > 0):.2f} | {yes} |")
    lines.append(f"<!-- /yes-no-binding:{model_name} -->")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="gemma-3-270m", help="a bundled model's name (captum_cw.models)")
    parser.add_argument("--styles", default="auto,plain", help="prompt styles; auto: chat where the tokenizer has "
                        "a chat template, else facts")
    parser.add_argument("--distractors", default="1,2,3")
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="a folder; its results.jsonl holds one line per example")
    parser.add_argument("--table", help="a Markdown file whose yes-no-binding:MODEL section to write")
    parser.add_argument("--report-only", action="store_true", help="rewrite the table from --out, no model run")
    args = parser.parse_args(argv)
    out = Path(args.out) / "results.jsonl"
    if not args.report_only:
        from captum_cw.models import load_model

        model, tokenizer = load_model(args.model)
        auto = "chat" if getattr(tokenizer, "chat_template", None) else "facts"
        out.parent.mkdir(parents=True, exist_ok=True)
        records = []
        for style in [auto if s == "auto" else s for s in args.styles.split(",")]:
            for distractors in map(int, args.distractors.split(",")):
                examples = context_examples("yes_no", args.n, args.seed, distractors)
                for example in tqdm(examples, desc=f"{args.model} {style} {distractors}"):
                    records.append({"example": example.id, "style": style, "distractors": distractors,
                                    "log_odds": {kind: log_odds(model, tokenizer, asked, style)
                                                 for kind, asked in asked_three_ways(example).items()}})
        temporary = out.with_suffix(".tmp")
        temporary.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        temporary.replace(out)  # a killed run leaves the previous results whole
    if not out.exists():
        raise SystemExit(f"{out} does not exist: run without --report-only first.")
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
    section = summary_table(args.model, records)
    print(section)
    if args.table:
        write_section(Path(args.table), section, args.model, marker="yes-no-binding")


if __name__ == "__main__":
    main()
