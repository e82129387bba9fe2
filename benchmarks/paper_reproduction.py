"""The paper's experiments on the paper's four models, ready for a GPU machine: faithfulness at the layer level
on multiple choice (with each model's accuracy against chance) and on text (ΔNLL and ΔPPL), and the sink study.

    python benchmarks/paper_reproduction.py --plan                          # what would run, and its GPU time
    python benchmarks/paper_reproduction.py --data-dir DIR                  # all four models, every task
    python benchmarks/paper_reproduction.py --model-dir /models --models qwen3-8b --tasks mmlu boolq sinks
    python benchmarks/paper_reproduction.py --report-only                   # tables from what has finished

The models are the **base** (pre-trained) checkpoints of the paper's four families (`PAPER_MODELS`); a name is
loaded from ``--model-dir/<name>`` where that folder exists, else from the hub, in bfloat16 with
``device_map="auto"``. Multiple-choice rows are a seeded sample (``--sample stratified``: MMLU round-robin over its
57 subjects, Winogrande and BoolQ a random sample; the seed is ``--sample-seed``), never the first rows of a file.
Every run resumes: a killed run continues where it stopped and a finished one is not run again. Results go to
``--out/<model>/<task>`` (``sinks`` to ``--out/<model>/sinks``); ``--results`` (default
docs/PAPER_REPRODUCTION.md) tabulates the runs that have examples and says "not run" for the others: no number is
written for a run that did not happen.

``--plan`` prints the expected GPU time (arithmetic, not a measurement: 2 x parameters x tokens FLOP per forward,
one clean forward plus metrics x bins x 2 modes per sequence, at ``--tflops``); the same estimate is printed
before a run starts. The tests run the whole recipe on the bundled SmolLM2 with two examples per task
(tests/test_paper_reproduction.py), so the recipe cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the paper's four families, base checkpoints (the post-trained variants, e.g. Qwen3-8B, answer otherwise)
PAPER_MODELS = {
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "qwen3-8b": "Qwen/Qwen3-8B-Base",
    "deepseek-7b": "deepseek-ai/deepseek-llm-7b-base",
}
PARAMETERS = {"mistral-7b": 7.2e9, "llama-3.1-8b": 8.0e9, "qwen3-8b": 8.2e9, "deepseek-7b": 6.9e9}
# task -> (kind, sequences scored per example: the continuations of a multiple-choice item)
TASKS = {"mmlu": ("choice", 4), "mmlu_cloze": ("choice", 4), "winogrande": ("choice", 2), "boolq": ("choice", 2),
         "gsm8k": ("text", 1), "fineweb_edu": ("text", 1), "sinks": ("sinks", 1)}
LAYER_PROTOCOL_FORWARDS = 1 + 6 * 5 * 2  # the clean pass, then 6 metrics x 5 bins x (comprehensiveness, sufficiency)
SINK_STUDY_FORWARDS = 4  # the analysis, the sink's and the control's norm removal, the renormalised removal


def model_source(name: str, model_dir: str | None) -> str:
    r"""Where ``name`` loads from: ``model_dir/name`` if that folder exists, the paper's hub id, else ``name``."""
    if model_dir is not None and (Path(model_dir) / name).is_dir():
        return str(Path(model_dir) / name)
    return PAPER_MODELS.get(name, name)


def examples_of(task: str, args: argparse.Namespace) -> int:
    kind = TASKS[task][0]
    return {"choice": args.choice_limit, "text": args.text_limit, "sinks": args.sink_limit}[kind]


def expected_gpu_hours(name: str, tasks: list[str], args: argparse.Namespace) -> float:
    r"""The arithmetic estimate of one model's GPU time in hours (upper bound: every text at --max-tokens)."""
    parameters = PARAMETERS.get(name, 8e9)
    forwards = sum(examples_of(task, args) * TASKS[task][1]
                   * (SINK_STUDY_FORWARDS if task == "sinks" else LAYER_PROTOCOL_FORWARDS) for task in tasks)
    flop = 2 * parameters * args.max_tokens * forwards
    return flop / (args.tflops * 1e12) / 3600


def plan_lines(names: dict[str, str], tasks: list[str], args: argparse.Namespace) -> list[str]:
    lines = [f"{len(names)} model(s) x {len(tasks)} task(s); sample {args.sample} (seed {args.sample_seed}); "
             f"{args.dtype}, device_map={args.device_map}, max {args.max_tokens} tokens; expected GPU time at "
             f"{args.tflops:g} TFLOP/s (arithmetic, upper bound):"]
    total = 0.0
    for name, source in names.items():
        hours = expected_gpu_hours(name, tasks, args)
        total += hours
        counts = ", ".join(f"{task} {examples_of(task, args)}" for task in tasks)
        lines.append(f"  {name} ({source}): {counts}: {hours:.1f} h")
    lines.append(f"  total: {total:.1f} h")
    return lines


def run_model(name: str, source: str, tasks: list[str], args: argparse.Namespace) -> None:
    r"""Loads one model once and runs (or resumes) each task on it."""
    import torch

    from captum_cw.evaluation import EvaluationConfig, evaluate, load_examples
    from captum_cw.evaluation.protocols import ProtocolConfig
    from captum_cw.models import load_model
    from captum_cw.sinks.study import sink_study

    dtype = getattr(torch, args.dtype)
    device_map = None if args.device_map == "none" else args.device_map
    model, tokenizer = load_model(source, dtype=dtype, device_map=device_map)
    for task in tasks:
        out = Path(args.out) / name / task
        if task == "sinks":
            if not (out / "sinks.json").exists():
                texts = [example.contexts[0]
                         for example in load_examples("fineweb_edu", args.sink_limit, args.data_dir, None)]
                sink_study(model, tokenizer, texts, out, max_tokens=args.max_tokens, progress=not args.quiet)
            continue
        config = EvaluationConfig(model=source, task=task, limit=examples_of(task, args), data_dir=args.data_dir,
                                  sample=args.sample if TASKS[task][0] == "choice" else "first",
                                  sample_seed=args.sample_seed, max_tokens=args.max_tokens, dtype=args.dtype,
                                  protocol=ProtocolConfig(protocol="layer", batch_size=args.batch_size))
        evaluate(config, out, resume=(out / "config.json").exists(), model=model, tokenizer=tokenizer,
                 progress=not args.quiet)
    del model


def _interval(cell: dict) -> str:
    return f"{cell['mean']:.4g} [{cell['ci_low']:.4g}, {cell['ci_high']:.4g}]"


def overview_row(name: str, task: str, summary: dict) -> str:
    r"""One row of the overview: examples, accuracy against chance (multiple choice) or clean NLL (text), and
    CW (inter-head) against attention on the primary measure (and ΔPPL for text)."""
    from captum_cw.evaluation.report import order_verdict, paper_order

    if "choice_check" in summary:
        check = summary["choice_check"]
        quality = (f"accuracy {check['accuracy']:.3f} [{check['accuracy_low']:.3f}, {check['accuracy_high']:.3f}] "
                   f"vs chance {check['chance']:.2f}{' (at chance)' if check['at_chance'] else ''}")
    else:
        quality = f"clean NLL {_interval(summary['clean_nll'])}"
    measures = [summary["primary"]] + (["delta_ppl"] if summary["primary"] == "delta_nll" else [])
    cells = []
    for measure in measures:
        for mode in ("comprehensiveness", "sufficiency"):
            pair = [summary["aopc"].get(metric, {}).get(mode, {}).get(measure) for metric in ("cw_inter", "attention")]
            cells.append(" vs ".join(_interval(cell) if cell else "-" for cell in pair))
    cells += [""] * (4 - len(cells))
    verdicts = paper_order(summary["aopc"], summary["primary"])
    return (f"| {name} | {task} | {summary['n_examples']} | {quality} | " + " | ".join(cells)
            + f" | {order_verdict(verdicts['comprehensiveness'])} | {order_verdict(verdicts['sufficiency'])} |")


def _perplexity_change(cell: dict | None) -> str:
    if not cell:
        return "-"
    low, high = cell["ci95"]
    return f"{cell['mean']:+.3g} [{low:+.3g}, {high:+.3g}]"


def sink_row(name: str, study: dict) -> str:
    r"""One row of the sink table: detection, the sink's attention and contribution, and the norm removal's change
    of perplexity beside its matched control and the renormalised removal (``sinks.json`` of the sink study)."""
    detection = study["detection"]
    factors = study["factors_mean_sink_vs_other"]
    intervention = study["sink_norm_intervention"]
    removals = (intervention.get("delta_perplexity"), intervention.get("control", {}).get("delta_perplexity"),
                intervention.get("sink_removed_renormalized", {}).get("delta_perplexity"))
    return (f"| {name} | {detection['fraction_of_layers_where_the_first_token_is_a_sink']:.2f} / "
            f"{detection['fraction_of_sinks_that_are_not_the_first_token']:.2f} | "
            f"{factors['attention'][0]:.3f} / {factors['cw'][0]:.3f} | "
            + " | ".join(_perplexity_change(cell) for cell in removals) + " |")


def write_results(names: dict[str, str], tasks: list[str], args: argparse.Namespace) -> str:
    r"""The tables of every finished (or partly finished) run; "not run" where there is none."""
    from captum_cw.evaluation.report import aopc_cells, aopc_header, choice_line

    lines = ["# The paper's experiments on the paper's models", "",
             "Written by `python benchmarks/paper_reproduction.py` from the runs under its `--out` folder: base "
             f"checkpoints, {args.dtype}, device_map='{args.device_map}', max {args.max_tokens} tokens; multiple "
             f"choice on a {args.sample} sample (seed {args.sample_seed}; MMLU stratified over its 57 subjects), "
             "text on the first rows. The layer-level protocol (value masking at every layer, bins 1/5/10/20/50%) "
             "is this project's reading of the paper, whose summaries give no protocol details. A cell says "
             "\"not run\" where no example has finished: nothing here is estimated.", ""]
    overview = ["| model | task | examples | accuracy / clean NLL | comprehensiveness, CW vs attention | "
                "sufficiency, CW vs attention | text: comprehensiveness ΔPPL | text: sufficiency ΔPPL | "
                "paper's order, comprehensiveness | paper's order, sufficiency |", "|" + "---|" * 10]
    sinks = ["| model | layers whose sink is the first token / sinks that are later tokens | "
             "sink attention / contribution (intra CW) | "
             "ΔPPL, sink's value norm removed | ΔPPL, matched control removed | ΔPPL, sink removed and renormalised |",
             "|---|---|---|---|---|---|"]
    for name, source in names.items():
        lines += [f"## {name} (`{source}`)", ""]
        for task in tasks:
            folder = Path(args.out) / name / task
            if task == "sinks":
                if (folder / "sinks.json").exists():
                    sinks.append(sink_row(name, json.loads((folder / "sinks.json").read_text())))
                else:
                    sinks.append(f"| {name} | not run | | | | |")
                continue
            if not (folder / "summary.json").exists():
                lines += [f"### {name}: {task}", "", "not run", ""]
                overview.append(f"| {name} | {task} | not run |" + " |" * 7)
                continue
            summary = json.loads((folder / "summary.json").read_text())
            header = ["metric", *aopc_header(summary)]
            lines += [f"### {name}: {task} ({summary['n_examples']} examples)", ""]
            if sentence := choice_line(summary):
                lines += [sentence[0].upper() + sentence[1:], ""]
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(cells) + " |" for cells in aopc_cells(summary)]
            lines.append("")
            overview.append(overview_row(name, task, summary))
    lines += ["## Overview", "", *overview, ""]
    if "sinks" in tasks:
        lines += ["## Sinks (FineWeb-Edu texts)", "", *sinks, ""]
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS),
                        help="names from the paper's list, hub ids or local folders")
    parser.add_argument("--model-dir", help="a folder holding local copies, one sub-folder per paper model name")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--choice-limit", type=int, default=200)
    parser.add_argument("--text-limit", type=int, default=100)
    parser.add_argument("--sink-limit", type=int, default=30)
    parser.add_argument("--sample", default="stratified", choices=["stratified", "random", "first"])
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--data-dir", default=os.environ.get("CAPTUM_CW_DATA"),
                        help="hub-schema JSONL files (default $CAPTUM_CW_DATA, else the hub)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device-map", default="auto", help="accelerate's device map; none: the default device")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tflops", type=float, default=200.0, help="sustained bfloat16 TFLOP/s for --plan")
    parser.add_argument("--out", default=str(ROOT / "out" / "paper"))
    parser.add_argument("--results", default=str(ROOT / "docs" / "PAPER_REPRODUCTION.md"))
    parser.add_argument("--plan", action="store_true", help="print the runs and their expected GPU time, run nothing")
    parser.add_argument("--report-only", action="store_true", help="write the tables, run nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    names = {model if model in PAPER_MODELS else Path(model).name: model_source(model, args.model_dir)
             for model in args.models}
    print("\n".join(plan_lines(names, args.tasks, args)))
    if args.plan:
        return
    if not args.report_only:
        for name, source in names.items():
            run_model(name, source, args.tasks, args)
    Path(args.results).write_text(write_results(names, args.tasks, args))
    print(f"written to {args.results}")


if __name__ == "__main__":
    main()
