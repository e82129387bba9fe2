"""The cost of the knockout gradients against one forward pass, and what replacing eager's weights saved.

    python benchmarks/bench_knockout.py [--repeats 11] [--lengths 64 256]

On both bundled models (eager attention, float32), on random ids, the runs take turns in each repeat: a forward
pass (no autograd graph), :func:`captum_cw.knockout_gradients` as it is (each layer's gated kernel returns the
output and its weights, so the ungated kernel never runs), and the same with the capture returning the output alone,
as before 2026-12-07 (the dispatcher then ran the ungated eager kernel as well, only for its weights). Writes its
section of benchmarks/RESULTS.md (between ``<!-- bench-knockout:eager -->`` markers) and prints it.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import interleaved_times, ratio_cell
from peers import write_section

from captum_cw import knockout_gradients
from captum_cw.models import load_model

knockout_module = importlib.import_module("captum_cw.knockout_gradients")  # the package's name is the function
GATED = knockout_module._gated  # the gated capture as it is: (output, weights)

HERE = Path(__file__).resolve().parent


def output_only(log_gate: torch.Tensor) -> Callable:
    r"""The gated capture returning the output alone (the replacement before the weights were returned too)."""
    gated = GATED(log_gate)
    return lambda call: gated(call)[0]


def timed_rows(model_name: str, lengths: list[int], repeats: int) -> list[str]:
    r"""One table row per length: seconds of each run and the ratios to the forward pass."""
    model, _ = load_model(model_name, attn_implementation="eager")
    generator = torch.Generator().manual_seed(0)
    rows = []
    for n in lengths:
        ids = torch.randint(1000, 20000, (1, n), generator=generator)  # [1, n]
        context = torch.zeros(1, n, dtype=torch.bool)
        context[0, 1:n - 8] = True  # the last 8 tokens stand for the question
        position, target = torch.tensor([n - 1]), torch.tensor([42])

        def forward() -> None:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)

        def knockout() -> None:
            knockout_gradients(model, ids, context, position, target, interval=(0.0, 0.1))

        def knockout_output_only() -> None:
            knockout_module._gated = output_only
            try:
                knockout()
            finally:
                knockout_module._gated = GATED

        times = interleaved_times({"forward": forward, "knockout": knockout, "before": knockout_output_only},
                                  repeats)
        median = {name: statistics.median(values) for name, values in times.items()}
        rows.append(f"| {model_name} | {n} | {median['forward']:.3f} | {median['knockout']:.3f} | "
                    f"{ratio_cell(times['knockout'], times['forward'])} | {median['before']:.3f} | "
                    f"{ratio_cell(times['before'], times['forward'])} | "
                    f"{ratio_cell(times['knockout'], times['before'])} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    lines = ["<!-- bench-knockout:eager -->",
             "## Knockout gradients (eager, float32): cost against a forward pass, and the second kernel run saved",
             "",
             f"`python benchmarks/bench_knockout.py --repeats {args.repeats} --lengths "
             f"{' '.join(map(str, args.lengths))}`: random ids, one target, the runs taking turns in each repeat; "
             "medians of the per-repeat ratios (interquartile range; ratio of the fastest runs). *before*: the gated "
             "capture returned the output alone, so eager's ungated kernel ran as well, only for its weights.",
             "",
             "| model | n | forward (s) | knockout (s) | knockout / forward | before (s) | before / forward "
             "| knockout / before |",
             "|---|---|---|---|---|---|---|---|"]
    for model_name in args.models:
        lines += timed_rows(model_name, args.lengths, args.repeats)
    lines.append("<!-- /bench-knockout:eager -->")
    write_section(Path(args.out), "\n".join(lines) + "\n", "eager", marker="bench-knockout")


if __name__ == "__main__":
    main()
