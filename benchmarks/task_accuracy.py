"""What the bundled models can answer: each ground-truth context task's accuracy per prompt style and distractors.

    python benchmarks/task_accuracy.py --model smollm2-135m --out benchmarks/runs/task_accuracy/smollm2-135m \\
        --table docs/PEERS.md

One forward per example (``captum_cw.tasks.context``, candidate-set scoring: the argmax over the candidates'
first tokens, chance one over their number). Beside accuracy with its Wilson interval it analyses the instances:
accuracy by where the evidence stands (first, middle or last source) and, for the wrong answers, whose answer the
model gave (the first or the last source's: a bias to a position rather than a reading of the question), and how
often it gives its most frequent answer (a constant answer is a guess whatever its accuracy). Results
go to ``OUT/results.jsonl``, one line per setting (its examples' records), written when the setting is done (a line
torn by a kill is dropped); a rerun skips the settings already there, ``--report-only`` rewrites the table
(between ``<!-- task-accuracy:MODEL -->`` markers of ``--table``) from the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_methods import encode_example  # the benchmarks folder is on the path from here on
from peers import write_section

from captum_cw.statistics import wilson_interval
from captum_cw.tasks.context import CONTEXT_TASKS, context_examples

__all__ = ["answer", "main", "per_answer", "position_of", "read_results", "summary_table"]


def position_of(index: int, count: int) -> str:
    r"""Where source ``index`` of ``count`` stands: ``"first"``, ``"last"`` or ``"middle"``."""
    return "first" if index == 0 else "last" if index == count - 1 else "middle"


def answer(model, tokenizer, example, style: str) -> dict:
    r"""The model's pick among the example's candidates and where the evidence and the picked answer's source
    stand: one record (``unscorable`` where two candidates share their first token in this tokenizer, as the
    digits of ``induction`` do in SmolLM2's, which splits off the space)."""
    encoded = encode_example(tokenizer, example, style)
    if len(set(encoded.candidates)) < len(encoded.candidates):
        return {"example": example.id, "task": example.task, "unscorable": True}
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids.to(next(model.parameters()).device)).logits[0, -1]  # [vocab]
    picked = int(torch.argmax(logits[encoded.candidates]))
    count = len(example.sources)
    per_source = CONTEXT_TASKS[example.task].per_source  # candidate k is source k's answer
    return {"example": example.id, "task": example.task, "candidates": len(example.candidates),
            "picked": example.candidates[picked], "correct": example.candidates[picked] == example.answer,
            "evidence_at": position_of(example.evidence, count),
            "picked_at": position_of(picked, count) if per_source else None}


def _percent(hits: int, total: int) -> str:
    if not total:
        return "–"
    low, high = wilson_interval(hits, total)
    return f"{hits / total:.2f} [{low:.2f}, {high:.2f}]"


def per_answer(rows: Sequence[dict], task: str, distractors: int) -> str:
    r"""``"positive 20/20, negative 10/20"``: hits over examples per expected answer, for a task whose examples all
    have the same two candidates (the expected answer is the pick where correct, the other candidate where not);
    ``"–"`` for any other task."""
    if CONTEXT_TASKS[task].per_source or rows[0]["candidates"] != 2:
        return "–"
    pair = context_examples(task, 1, 0, distractors)[0].candidates
    expected = [r["picked"] if r["correct"] else next(c for c in pair if c != r["picked"]) for r in rows]
    return ", ".join(f"{answer.strip()} {sum(r['correct'] for r, e in zip(rows, expected) if e == answer)}/"
                     f"{expected.count(answer)}" for answer in pair)


def summary_table(records: Sequence[dict], model_name: str) -> str:
    r"""The Markdown section of one model: a row per task, prompt style and distractor count."""
    lines = [f"<!-- task-accuracy:{model_name} -->", "",
             f"{model_name}: accuracy [95% Wilson interval] against chance; by where the evidence stands; and of "
             "the wrong answers, the share that is the first or the last source's answer; the share of examples "
             "given the model's most frequent answer (1.00: the same answer whatever the context); for a task with "
             "the same two candidates everywhere, the accuracy on each answer (a prior for one answer shows as "
             "high accuracy on it alone).", "",
             "| task | style | distractors | n | accuracy | chance | evidence first | evidence middle | "
             "evidence last | wrong: first source's | wrong: last source's | most frequent answer | "
             "accuracy per answer |",
             "|" + "---|" * 13]
    settings = sorted({(r["task"], r["style"], r["distractors"]) for r in records})
    for task, style, distractors in settings:
        rows = [r for r in records if (r["task"], r["style"], r["distractors"]) == (task, style, distractors)]
        if any(r.get("unscorable") for r in rows):
            lines.append(f"| {task} | {style} | {distractors} | {len(rows)} | not scorable: candidates share "
                         f"their first token | | | | | | | | |")
            continue
        hits = sum(r["correct"] for r in rows)
        by_position = [_percent(sum(r["correct"] for r in rows if r["evidence_at"] == at),
                                sum(r["evidence_at"] == at for r in rows)) for at in ("first", "middle", "last")]
        wrong = [r for r in rows if not r["correct"] and r["picked_at"] is not None]
        picked = [f"{sum(r['picked_at'] == at for r in wrong)} of {len(wrong)}" if wrong else "–"
                  for at in ("first", "last")]
        modal = Counter(r["picked"] for r in rows).most_common(1)[0]
        accuracy = _percent(hits, len(rows))
        if wilson_interval(hits, len(rows))[0] >= 0.8:
            accuracy = f"**{accuracy}**"
        lines.append(f"| {task} | {style} | {distractors} | {len(rows)} | {accuracy} | "
                     f"{1 / rows[0]['candidates']:.2f} | {' | '.join(by_position)} | {' | '.join(picked)} | "
                     f"{modal[1] / len(rows):.2f} | {per_answer(rows, task, distractors)} |")
    lines.append(f"<!-- /task-accuracy:{model_name} -->")
    return "\n".join(lines) + "\n"


def read_results(path: Path) -> list[dict]:
    r"""The example records of a results file; a setting's line torn by a killed run is dropped whole."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            records += json.loads(line)["rows"]
        except (json.JSONDecodeError, KeyError):
            continue
    return records


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", nargs="+", default=list(CONTEXT_TASKS), choices=list(CONTEXT_TASKS))
    parser.add_argument("--styles", nargs="+", default=["plain", "auto"], choices=["plain", "facts", "chat", "auto"],
                        help="auto: chat where the tokenizer has a chat template, else facts")
    parser.add_argument("--distractors", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--n", type=int, default=40, help="examples per setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="folder of results.jsonl")
    parser.add_argument("--table", help="Markdown file whose section for this model is rewritten")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    records = read_results(path)
    if not args.report_only:
        from captum_cw.models import load_model

        model, tokenizer = load_model(args.model)
        auto = "chat" if getattr(tokenizer, "chat_template", None) else "facts"
        styles = list(dict.fromkeys(auto if style == "auto" else style for style in args.styles))
        seeds = {r["seed"] for r in records}
        if seeds - {args.seed}:
            raise SystemExit(f"{out} holds examples of seed {sorted(seeds)}, not {args.seed}; use another --out.")
        done = Counter((r["task"], r["style"], r["distractors"]) for r in records)
        for setting, count in done.items():
            if count != args.n:
                raise SystemExit(f"{out} holds {count} examples of {setting}, not --n {args.n}; use another --out.")
        settings = [(task, style, d) for task in args.tasks for style in styles for d in args.distractors
                    if (task, style, d) not in done]
        for task, style, distractors in tqdm(settings, desc=f"{args.model} settings"):
            examples = context_examples(task, args.n, args.seed, distractors)
            rows = [{**answer(model, tokenizer, example, style), "style": style, "distractors": distractors,
                     "seed": args.seed} for example in examples]
            torn = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
            with open(path, "a", encoding="utf-8") as results:
                results.write("\n" * bool(torn) + json.dumps({"rows": rows}) + "\n")
                results.flush()
                os.fsync(results.fileno())
            records += rows
    section = summary_table(records, args.model)
    if args.table:
        write_section(Path(args.table), section, args.model, marker="task-accuracy")
    print(section)


if __name__ == "__main__":
    main()
