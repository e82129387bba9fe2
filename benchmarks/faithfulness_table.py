"""Runs the faithfulness evaluation of every metric on the five tasks and writes docs/RESULTS.md.

    python benchmarks/faithfulness_table.py --data-dir ../shared/data --choice-limit 200 --text-limit 100

Each task's raw results stay in --out (resumable: rerun the same command to continue).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"mmlu": "choice", "winogrande": "choice", "boolq": "choice", "gsm8k": "text", "fineweb_edu": "text"}


def run(task: str, limit: int, args) -> dict:
    out = Path(args.out) / task
    command = [sys.executable, "-m", "captum_cw.cli", "evaluate", "--model", args.model, "--task", task,
               "--limit", str(limit), "--data-dir", args.data_dir, "--max-tokens", str(args.max_tokens),
               "--batch-size", str(args.batch_size), "--out", str(out)]
    if (out / "config.json").exists():
        command.append("--resume")
    subprocess.run(command, check=True)
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--choice-limit", type=int, default=200)
    parser.add_argument("--text-limit", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--out", default=str(ROOT / "out" / "faithfulness"))
    parser.add_argument("--results", default=str(ROOT / "docs" / "RESULTS.md"))
    args = parser.parse_args()

    lines = [
        "# Faithfulness of token rankings (layer-level value masking, all layers at once)",
        "",
        f"Model: {args.model}, float32, CPU. AOPC over bins {{1, 5, 10, 20, 50}}% with 95% bootstrap intervals.",
        "Comprehensiveness: higher is more faithful; sufficiency: lower is more faithful. Measure: drop in the",
        "probability of the originally predicted answer (multiple choice) or increase in NLL (text).",
        "",
        "Reproduce: `python benchmarks/faithfulness_table.py --choice-limit "
        f"{args.choice_limit} --text-limit {args.text_limit} --max-tokens {args.max_tokens}`",
        "",
    ]
    for task in args.tasks:
        limit = args.choice_limit if TASKS[task] == "choice" else args.text_limit
        summary = run(task, limit, args)
        measure = summary["primary"]
        clean = summary.get("clean_accuracy") or summary.get("clean_nll")
        lines += [f"## {task} ({summary['n_examples']} examples; clean "
                  f"{'accuracy' if 'clean_accuracy' in summary else 'NLL'} {clean['mean']:.3f})", "",
                  f"| metric | comprehensiveness AOPC ({measure}) | sufficiency AOPC ({measure}) |", "|---|---|---|"]
        for metric, modes in summary["aopc"].items():
            cells = [f"{modes[m][measure]['mean']:.4f} [{modes[m][measure]['ci_low']:.4f}, "
                     f"{modes[m][measure]['ci_high']:.4f}]" for m in ("comprehensiveness", "sufficiency")]
            lines.append(f"| {metric} | {cells[0]} | {cells[1]} |")
        order = summary["paper_order"]
        lines += ["", "Paper's order attention < value-weighted < output-normalised < CW (inter): "
                  f"comprehensiveness {'holds' if order['comprehensiveness']['holds'] else 'does not hold'}, "
                  f"sufficiency {'holds' if order['sufficiency']['holds'] else 'does not hold'}.", ""]
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
