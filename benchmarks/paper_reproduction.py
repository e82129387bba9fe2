"""The paper's layer-level table on the paper's models, ready for a GPU machine.

    python benchmarks/paper_reproduction.py --data-dir DIR            # all four models, all five tasks
    python benchmarks/paper_reproduction.py --models qwen3-8b --tasks mmlu boolq
    python benchmarks/paper_reproduction.py --report-only              # tables from what has finished

Each model is loaded once by hub id in bfloat16 with ``device_map="auto"`` (accelerate spreads it over the
GPUs there are, or offloads), then every task runs the layer-level protocol with ``--resume`` semantics: a
killed run continues where it stopped, and a finished one is not run again. Results go to
``--out/<model>/<task>``; ``--results`` (default docs/PAPER_REPRODUCTION.md) tabulates the runs that have
examples and says "not run" for the others: no number is written for a run that did not happen.

Expected time per model (an estimate from arithmetic, not a measurement): a 7-8B model costs about
2 x 7.5e9 x 300 = 4.5 TFLOP per 300-token forward; one example of the layer-level protocol runs 61 such
forwards (the clean pass and 6 metrics x 5 bins x 2 modes), about 275 TFLOP, i.e. 1-2 s on one H100/H200 at
150-300 TFLOP/s of bfloat16. 3 x 200 multiple-choice examples (2-4 sequences each) and 2 x 100 texts make about
2,000 sequence-examples: roughly 1-2 hours per model, 4-8 hours for the four; more with offloading.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAPER_MODELS = {
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "deepseek-7b": "deepseek-ai/deepseek-llm-7b-base",
}
LIMITS = {"mmlu": "choice", "winogrande": "choice", "boolq": "choice", "gsm8k": "text", "fineweb_edu": "text"}


def run_model(name: str, source: str, tasks: list[str], args: argparse.Namespace) -> None:
    r"""Loads one model once and runs (or resumes) each task on it."""
    import torch

    from captum_cw.evaluation import EvaluationConfig, evaluate
    from captum_cw.evaluation.protocols import ProtocolConfig
    from captum_cw.models import load_model

    model, tokenizer = load_model(source, dtype=getattr(torch, args.dtype), device_map=args.device_map)
    for task in tasks:
        limit = args.choice_limit if LIMITS[task] == "choice" else args.text_limit
        config = EvaluationConfig(model=source, task=task, limit=limit, data_dir=args.data_dir,
                                  max_tokens=args.max_tokens, dtype=args.dtype,
                                  protocol=ProtocolConfig(protocol="layer", batch_size=args.batch_size))
        out = Path(args.out) / name / task
        evaluate(config, out, resume=(out / "config.json").exists(), model=model, tokenizer=tokenizer,
                 progress=not args.quiet)
    del model


def write_results(names: dict[str, str], tasks: list[str], args: argparse.Namespace) -> str:
    r"""The tables of every finished (or partly finished) run; "not run" where there is none."""
    from captum_cw.evaluation.report import aopc_cells, aopc_header, order_verdict, paper_order

    lines = ["# The paper's layer-level table on the paper's models", "",
             "Written by `python benchmarks/paper_reproduction.py` from the runs under its `--out` folder "
             f"(bfloat16, device_map='{args.device_map}', max {args.max_tokens} tokens). A cell says \"not run\" "
             "where no example has finished: nothing here is estimated.", ""]
    order = ["| model | task | examples | comprehensiveness order | sufficiency order |", "|---|---|---|---|---|"]
    for name, source in names.items():
        lines += [f"## {name} (`{source}`)", ""]
        for task in tasks:
            summary_file = Path(args.out) / name / task / "summary.json"
            if not summary_file.exists():
                lines += [f"### {name}: {task}", "", "not run", ""]
                order.append(f"| {name} | {task} | not run | | |")
                continue
            summary = json.loads(summary_file.read_text())
            header = ["metric", *aopc_header(summary)]
            lines += [f"### {name}: {task} ({summary['n_examples']} examples)", "",
                      "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(cells) + " |" for cells in aopc_cells(summary)]
            lines.append("")
            verdicts = paper_order(summary["aopc"], summary["primary"])
            order.append(f"| {name} | {task} | {summary['n_examples']} | "
                         f"{order_verdict(verdicts['comprehensiveness'])} | {order_verdict(verdicts['sufficiency'])} |")
    lines += ["## The paper's order (attention < value-weighted < output-normalised < CW)", "", *order, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS),
                        help="names from the paper's list, hub ids or local folders")
    parser.add_argument("--tasks", nargs="+", default=list(LIMITS), choices=list(LIMITS))
    parser.add_argument("--choice-limit", type=int, default=200)
    parser.add_argument("--text-limit", type=int, default=100)
    parser.add_argument("--data-dir", default=os.environ.get("CAPTUM_CW_DATA"),
                        help="hub-schema JSONL files (default $CAPTUM_CW_DATA, else the hub)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device-map", default="auto")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "out" / "paper"))
    parser.add_argument("--results", default=str(ROOT / "docs" / "PAPER_REPRODUCTION.md"))
    parser.add_argument("--report-only", action="store_true", help="write the tables, run nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    names = {model if model in PAPER_MODELS else Path(model).name: PAPER_MODELS.get(model, model)
             for model in args.models}
    if not args.report_only:
        for name, source in names.items():
            run_model(name, source, args.tasks, args)
    Path(args.results).write_text(write_results(names, args.tasks, args))
    print(f"written to {args.results}")


if __name__ == "__main__":
    main()
