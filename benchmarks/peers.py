"""Context attribution against its peers: every method on the same correctly answered examples, in one process.

    python benchmarks/peers.py --model smollm2-135m --tasks who_lives_where,yes_no --n 60 --distractors 2 \\
        --out benchmarks/runs/peers/smollm2-135m --table docs/PEERS.md

Methods are :data:`peer_methods.METHODS` (``--methods`` picks some; a peer that is not installed is skipped
with its reason). An example counts only where the model answers it: the argmax over the candidates' first
tokens is the answer's. ``--boolq-data FILE`` adds BoolQ passages (hub schema), the model's own yes/no answer
as the target; their evidence is unknown, so they give no pointing. ``--contrast`` explains the log-odds of the
answer against the model's strongest other candidate (the other answer of a two-way task) instead of its
log-probability, in every method and every measure ("why this answer rather than that one"; the records'
``target_logprob`` is then the log-odds). Results go to ``OUT/results.jsonl``, one line per example and method,
flushed as written: rerunning the command skips what is done. The table of each model replaces its own section
of ``--table`` (between ``<!-- peers:MODEL -->`` markers; ``--section`` names another, so one file holds several
runs), the rest of the file is kept. ``--report-only`` writes the table from the results so far (the same in any
environment: it lists no missing peer). docs/PEERS.md says what each measure is and what was changed in each peer
to run offline.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_methods import (  # the benchmarks folder is on the path from here on
    METHODS,
    EncodedExample,
    boolq_examples,
    encode_example,
    lds_ablations,
    lds_seed,
    measure,
    target_logprobs,
    unavailable,
    with_answer,
    with_foil,
)

from captum_cw.statistics import mean_interval, wilson_interval
from captum_cw.tasks.context import ContextExample, context_examples

__all__ = ["answered", "answered_examples", "answered_in", "contrasted", "main", "run_example", "sign_test",
           "summary_table"]

MEASURES = ("pointing", "evidence_mass", "comp@1", "comp@3", "comp@5", "suff@1", "suff@3", "suff@5",
            "source_comp@1", "lds", "time_ratio")
PAIRED = ("pointing", "comp@1", "source_comp@1", "lds")  # sign-tested against the reference method


def _clock(model) -> float:
    r"""The time, after the model's device has finished its queued work (GPU kernels run asynchronously)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def answered(model, encoded: EncodedExample) -> tuple[list[int], float]:
    r"""The candidates (their first tokens' indices in ``encoded.candidates``) from the model's pick down, and the
    seconds of one forward on the prompt, the median of three (the unit of the time ratios)."""
    device = next(model.parameters()).device
    seconds = []
    with torch.no_grad():
        for _ in range(3):
            start = _clock(model)
            logits = model(input_ids=encoded.input_ids.to(device)).logits[0, -1]  # [vocab]
            seconds.append(_clock(model) - start)
    order = torch.argsort(logits[encoded.candidates], descending=True, stable=True)
    return order.tolist(), sorted(seconds)[1]


def contrasted(encoded: EncodedExample, order: Sequence[int]) -> EncodedExample:
    r"""``encoded`` explained against the strongest other candidate (``order``: :func:`answered`'s) whose first token
    differs from the answer's; stops with a reason where there is none."""
    foil = next((encoded.candidates[k] for k in order[1:] if encoded.candidates[k] != encoded.target), None)
    if foil is None:
        raise SystemExit(f"{encoded.example.id}: every other candidate starts with the answer's token, so "
                         "--contrast has no foil; leave --contrast out for this task.")
    return with_foil(encoded, foil)


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_results(path: Path) -> list[dict]:
    r"""The records of a results file (a torn last line, from a killed run, is dropped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def run_example(model, tokenizer, example: ContextExample, methods: Sequence[str], done: set[tuple[str, str]],
                lds_count: int, path: Path, model_name: str, style: str = "plain", *, contrast: bool = False) -> None:
    r"""Scores and measures every method of ``methods`` not yet done on ``example``, one record each; an example
    the model gets wrong gets one ``"answered"`` record with ``correct: false``. With ``contrast`` the target is
    the log-odds of the answer against the model's strongest other candidate."""
    encoded = encode_example(tokenizer, example, style)
    order, forward_seconds = answered(model, encoded)
    choice = order[0]
    if example.task == "boolq":  # the model's own answer is the target
        encoded = encode_example(tokenizer, with_answer(example, example.candidates[choice]), style)
    base = {"model": model_name, "example": example.id, "task": example.task, "copy": example.copy}
    correct = encoded.candidates[choice] == encoded.target
    if (example.id, "answered") not in done:
        _append(path, {**base, "method": "answered", "correct": correct})
        done.add((example.id, "answered"))
    if not correct:
        return
    todo = [name for name in methods if (example.id, name) not in done]
    if not todo:
        return
    if contrast:
        encoded = contrasted(encoded, order)
    full = float(target_logprobs(model, [encoded.input_ids[0].tolist()], encoded.target, encoded.foil)[0])
    ablations = lds_ablations(model, encoded, lds_count, lds_seed(example.id)) if lds_count else None
    for name in todo:
        method = METHODS[name]
        start = _clock(model)
        scores, forwards = method.score(model, tokenizer, encoded)
        seconds = _clock(model) - start
        values = measure(model, encoded, scores, method.level, full, ablations)
        _append(path, {**base, "method": name, "level": method.level, "target_logprob": full, **values,
                       "forwards": forwards, "seconds": seconds, "time_ratio": seconds / forward_seconds})
        done.add((example.id, name))


def sign_test(first: Iterable[float], second: Iterable[float]) -> tuple[int, int, float]:
    r"""
    The paired sign test: wins of ``first`` over ``second``, losses, and the exact two-sided binomial p-value
    (ties dropped).
    """
    pairs = [(a, b) for a, b in zip(first, second) if a is not None and b is not None
             and not (math.isnan(a) or math.isnan(b))]
    wins, losses = sum(a > b for a, b in pairs), sum(a < b for a, b in pairs)
    n = wins + losses
    if n == 0:
        return 0, 0, float("nan")
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return wins, losses, min(1.0, 2 * tail)


def _cell(values: list[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "–"
    interval = mean_interval(values)
    return f"{interval['mean']:.3g} [{interval['ci_low']:.3g}, {interval['ci_high']:.3g}]"


def _paired_cell(records: dict[str, dict], reference: dict[str, dict], measure_name: str) -> str:
    shared = sorted(set(records) & set(reference))
    wins, losses, p = sign_test([records[e].get(measure_name) for e in shared],
                                [reference[e].get(measure_name) for e in shared])
    return "–" if wins + losses == 0 else f"{wins}/{losses}, p={p:.2g}"


def _group_table(records: list[dict], methods: Sequence[str], reference: str) -> list[str]:
    by_method: dict[str, dict[str, dict]] = {}
    for record in records:
        by_method.setdefault(record["method"], {})[record["example"]] = record
    header = ["method", "n", *MEASURES, *(f"vs {reference}: {m} (wins/losses)" for m in PAIRED)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in methods:
        rows = by_method.get(name, {})
        if not rows:
            continue
        cells = [_cell([row.get(m) for row in rows.values()]) for m in MEASURES]
        paired = [_paired_cell(rows, by_method.get(reference, {}), m) if name != reference else "ref."
                  for m in PAIRED]
        lines.append("| " + " | ".join([name, str(len(rows)), *cells, *paired]) + " |")
    return lines


GROUPS = {"all ground-truth tasks": lambda r: r["task"] != "boolq",
          "copy tasks (the answer's words stand in the evidence)": lambda r: r["task"] != "boolq" and r["copy"],
          "evidence that is not the answer string": lambda r: r["task"] != "boolq" and not r["copy"],
          "BoolQ (the model's own answer; evidence unknown)": lambda r: r["task"] == "boolq"}


def summary_table(records: list[dict], model_name: str, methods: Sequence[str], reference: str,
                  skipped: dict[str, str], marker: str = "peers") -> str:
    r"""The Markdown section of one model (between ``<!-- marker:model_name -->`` comments): accuracy per task, then
    one table per group of tasks."""
    lines = [f"<!-- {marker}:{model_name} -->", f"### {model_name}", ""]
    answers = [r for r in records if r["method"] == "answered"]
    for task in sorted({r["task"] for r in answers}):
        hits = [r["correct"] for r in answers if r["task"] == task]
        low, high = wilson_interval(sum(hits), len(hits))
        lines.append(f"- {task}: answered {sum(hits)} of {len(hits)} ({sum(hits) / len(hits):.0%}, 95% "
                     f"[{low:.0%}, {high:.0%}]); the methods are measured on those answered")
    lines += [f"- {name}: not run: {reason}" for name, reason in skipped.items()]
    scored = [r for r in records if r["method"] != "answered"]
    for title, keep in GROUPS.items():
        group = [r for r in scored if keep(r)]
        if group:
            lines += ["", f"**{title}** (mean [95% bootstrap interval]; sign test against {reference})", ""]
            lines += _group_table(group, methods, reference)
    lines.append(f"<!-- /{marker}:{model_name} -->")
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str, model_name: str, marker: str = "peers") -> None:
    r"""Replaces ``model_name``'s section of ``path``, between ``<!-- marker:model_name -->`` and its closing
    comment (appends it where absent); the rest is kept."""
    start, end = f"<!-- {marker}:{model_name} -->", f"<!-- /{marker}:{model_name} -->"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if start in text and end in text:
        text = text[:text.index(start)] + section.rstrip("\n") + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def examples_of(args) -> list[ContextExample]:
    r"""The examples of ``--tasks`` (``task`` or ``task:distractors``), the tasks interleaved (so that a run
    stopped early covers each alike), then BoolQ's."""
    per_task = []
    for spec in filter(None, args.tasks.split(",")):
        task, _, distractors = spec.partition(":")
        count = int(distractors) if distractors else args.distractors
        per_task.append(context_examples(task, args.n, args.seed, count))
    examples = [example for group in itertools.zip_longest(*per_task) for example in group if example is not None]
    if args.boolq_data:
        examples += boolq_examples(args.boolq_data, args.boolq_n)
    return examples


def answered_examples(folder: Path, tasks: str, n: int) -> tuple[list[ContextExample], str]:
    r"""The examples of ``tasks`` (``--tasks``; the first ``n`` of each, the run's seed) the model answered in the
    run ``folder``, and the run's prompt style (:func:`answered_in` with one group)."""
    examples, settings = answered_in(folder, [(tasks, n)])
    return examples, settings["style"]


def answered_in(folder: Path, groups: Sequence[tuple[str, int]]) -> tuple[list[ContextExample], dict]:
    r"""The examples of each ``(tasks, n)`` group (``--tasks`` and ``--n`` of one command of the run, the run's seed)
    the model answered in the run ``folder``, and the run's settings. Refuses a folder without a run, and a run whose
    answered examples (BoolQ's aside) are not all among them (one made with other tasks, distractors or ``--n``,
    whose ids name other examples)."""
    if not (folder / "settings.json").exists():
        raise SystemExit(f"no peers run in {folder}; run benchmarks/peers.py --out {folder} first")
    answered = {r["example"] for r in read_results(folder / "results.jsonl") if r["method"] == "answered"
                and r["correct"] and r.get("task") != "boolq"}
    settings = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
    examples = [e for tasks, n in groups for e in examples_of(parse_args(
                ["--tasks", tasks, "--n", str(n), "--seed", str(settings["seed"]), "--out", str(folder)]))
                if e.id in answered]
    if len(examples) != len(answered):
        named = ", ".join(f"the first {n} of {tasks}" for tasks, n in groups)
        raise SystemExit(f"{folder} holds answered examples beyond {named}: "
                         f"{sorted(answered - {e.id for e in examples})[:3]}")
    return examples, settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="smollm2-135m",
                        help="a bundled model's name or a local folder; several, comma-separated, run one after "
                             "the other, each into OUT/MODEL")
    parser.add_argument("--tasks", default="who_lives_where,key_value,where_question,country_of_city,yes_no",
                        help="comma-separated captum_cw.tasks.context tasks")
    parser.add_argument("--n", type=int, default=60, help="examples per task (before keeping those answered)")
    parser.add_argument("--distractors", type=int, default=2,
                        help="sources besides the evidence, for tasks given without ':N' in --tasks")
    parser.add_argument("--style", default="plain", choices=["plain", "facts", "chat", "auto"],
                        help="prompt style (captum_cw.tasks.context.PROMPT_STYLES); auto: chat where the tokenizer "
                             "has a chat template, else facts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contrast", action="store_true",
                        help="explain the log-odds of the answer against the model's strongest other candidate "
                             "(log p(answer) - log p(foil)) instead of log p(answer), in every method and measure")
    parser.add_argument("--boolq-data", help="BoolQ JSONL (question, passage, answer)")
    parser.add_argument("--boolq-n", type=int, default=60)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated; of {', '.join(METHODS)}")
    parser.add_argument("--reference", default="cw_mean", help="the method the sign tests compare against")
    parser.add_argument("--lds-ablations", type=int, default=32, help="random source ablations of the LDS (0: none)")
    parser.add_argument("--out", required=True, help="folder of results.jsonl (of OUT/MODEL/ for several models)")
    parser.add_argument("--table", help="Markdown file whose section for this model is rewritten")
    parser.add_argument("--section", default="peers",
                        help="the section's marker in --table (<!-- SECTION:MODEL -->), so one file holds several runs")
    parser.add_argument("--device", default=None)
    parser.add_argument("--report-only", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    # a report runs nothing: which peers this environment lacks is no part of its table
    skipped = {} if args.report_only else {m: reason for m in names if (reason := unavailable(METHODS[m])) is not None}
    runnable = [m for m in names if m not in skipped]
    for name, reason in skipped.items():
        print(f"{name}: not run: {reason}", file=sys.stderr)
    models = [m for m in args.model.split(",") if m]
    for model_source in models:
        out = Path(args.out) / Path(model_source).name if len(models) > 1 else Path(args.out)
        run_model(model_source, out, runnable, args)
        if args.table:
            ordered = [name for name in METHODS if name in names]  # the registry's order, whatever --methods says
            section = summary_table(read_results(out / "results.jsonl"), Path(model_source).name, ordered,
                                    args.reference, skipped, args.section)
            write_section(Path(args.table), section, Path(model_source).name, args.section)


def check_settings(out: Path, settings: dict) -> None:
    r"""Keeps the settings that decide what an example id means (its prompt style, the generator's seed) and what
    its records measure (``"target": "contrast"`` for ``--contrast``; absent for log p(answer)) in
    ``out/settings.json``, and refuses to add results made under other settings to a folder."""
    path = out / "settings.json"
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored != settings:
            raise SystemExit(f"{out} holds results made with {stored}, not {settings}; use another --out.")
    else:
        path.write_text(json.dumps(settings) + "\n", encoding="utf-8")


def run_model(model_source: str, out: Path, methods: Sequence[str], args: argparse.Namespace) -> None:
    r"""Every example of ``args`` on one model, into ``out/results.jsonl`` (what is there already is skipped)."""
    from captum_cw.models import load_model

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    if args.report_only:
        return
    from captum_cw.evaluation.run_folder import locked

    with locked(out):  # a second run on the folder stops at once instead of appending the same records twice
        model, tokenizer = load_model(model_source, device=args.device)
        style = args.style if args.style != "auto" else ("chat" if getattr(tokenizer, "chat_template", None)
                                                         else "facts")
        check_settings(out, {"style": style, "seed": args.seed, **({"target": "contrast"} if args.contrast else {})})
        done = {(r["example"], r["method"]) for r in read_results(path)}
        for example in tqdm(examples_of(args), desc=f"{Path(model_source).name} ({style})"):
            run_example(model, tokenizer, example, methods, done, args.lds_ablations, path,
                        Path(model_source).name, style, contrast=args.contrast)


if __name__ == "__main__":
    main()
