"""How far Integrated Gradients is from converged on the evaluator's examples, by the number of steps.

    python benchmarks/ig_convergence.py --examples 2 --steps 20 50 100 200

For the first examples of each multiple-choice task, the IG scores that the input-level protocol
ranks (pad-token baseline, log-likelihood of the predicted answer) at each number of steps: their
completeness gap |sum of attributions - (f(x) - f(baseline))| and how well their ranking agrees
with the one at the most steps (Spearman, and the overlap of the top 10% tokens). Writes
docs/IG_CONVERGENCE.md and a plot next to it.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch
from matplotlib.figure import Figure
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from captum_cw.evaluation import load_examples
from captum_cw.evaluation.protocols import ProtocolConfig, _integrated_gradients, measure_unperturbed
from captum_cw.evaluation.sequences import encode
from captum_cw.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def top_overlap(scores: torch.Tensor, reference: torch.Tensor, percent: float = 10) -> float:
    r"""Share of the reference's top ``percent`` tokens that ``scores`` also puts in its top ``percent``."""
    count = max(1, math.ceil(percent / 100 * len(scores)))
    return len(set(scores.topk(count).indices.tolist()) & set(reference.topk(count).indices.tolist())) / count


def measure_example(model, encoded, steps: list[int], batch_size: int) -> list[dict]:
    r"""One row per number of steps: completeness gap and agreement with the most steps."""
    clean = measure_unperturbed(model, encoded)
    runs = {}
    for count in steps:
        config = ProtocolConfig(protocol="input", ig_steps=count, batch_size=batch_size)
        runs[count] = _integrated_gradients(model, encoded, clean, config)
    reference = runs[max(steps)][0]
    rows = []
    for count, (scores, completeness) in runs.items():
        rows.append({"steps": count, "n": len(scores), "output_change": completeness["output_change"],
                     "gap": completeness["attribution_sum"] - completeness["output_change"],
                     "spearman": float(spearmanr(scores, reference).statistic),
                     "top10": top_overlap(scores, reference)})
    return rows


def write(results: dict[str, list[dict]], args) -> None:
    steps, path, model = sorted(args.steps), Path(args.results), args.model
    most = max(steps)
    lines = ["# Convergence of Integrated Gradients on " + model, "",
             "IG as the input-level protocol runs it: embeddings, pad-token baseline, log-likelihood of the predicted",
             f"answer. Gap: sum of attributions - (f(x) - f(baseline)), 0 when converged. Agreement with {most} steps:",
             "Spearman correlation of the token scores and overlap of the top 10% tokens.", "",
             f"Reproduce: `python benchmarks/ig_convergence.py --tasks {' '.join(args.tasks)} --examples "
             f"{args.examples} --steps {' '.join(map(str, steps))} --max-tokens {args.max_tokens}`", "",
             "| example | tokens | f(x) - f(baseline) | " + " | ".join(f"gap @{s}" for s in steps) + " | "
             + " | ".join(f"Spearman / top-10% @{s}" for s in steps if s != most) + " |",
             "|---" * (3 + len(steps) + len(steps) - 1) + "|"]
    for example, rows in results.items():
        by_steps = {row["steps"]: row for row in rows}
        lines.append(f"| {example} | {rows[0]['n']} | {rows[0]['output_change']:.3f} | "
                     + " | ".join(f"{by_steps[s]['gap']:.3f}" for s in steps) + " | "
                     + " | ".join(f"{by_steps[s]['spearman']:.2f} / {by_steps[s]['top10']:.2f}" for s in steps
                                  if s != most) + " |")
    plot = path.parent / "faithfulness" / "ig_convergence.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for example, rows in results.items():
        axis.plot([r["steps"] for r in rows], [abs(r["gap"]) / max(abs(r["output_change"]), 1e-12) for r in rows],
                  marker="o", label=example)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("IG steps")
    axis.set_ylabel("|gap| / |f(x) - f(baseline)|")
    axis.set_title(f"IG completeness on {model}")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(plot, dpi=110)
    lines += ["", f"![IG completeness by steps](faithfulness/{plot.name})", ""]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("CAPTUM_CW_DATA", str(ROOT.parent / "shared" / "data")),
                        help="JSONL files in the hub schema (default: $CAPTUM_CW_DATA, else ../shared/data)")
    parser.add_argument("--tasks", nargs="+", default=["mmlu", "winogrande", "boolq"])
    parser.add_argument("--examples", type=int, default=2, help="per task")
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 50, 100, 200])
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--results", default=str(ROOT / "docs" / "IG_CONVERGENCE.md"))
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    results = {}
    examples = [example for task in args.tasks for example in load_examples(task, args.examples, args.data_dir)]
    for example in tqdm(examples, desc="IG convergence"):
        encoded = encode(example, tokenizer, args.max_tokens)
        results[example.id] = measure_example(model, encoded, sorted(args.steps), args.batch_size)
        write(results, args)
    print(Path(args.results).read_text())


if __name__ == "__main__":
    main()
