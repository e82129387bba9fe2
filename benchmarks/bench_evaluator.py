"""Examples per minute of the evaluator vs a naive loop (one full forward per metric and per variant).

    python benchmarks/bench_evaluator.py [--examples 3] [--device cuda] [--dtype bfloat16] [--batch-size 16]

Appends its table to benchmarks/RESULTS.md. All runs use the same examples, side by side in one process,
taking turns on each example. The floor row runs the evaluator's forwards alone: its clean pass and as many
variant forwards as the evaluator ran (variants whose removals coincide share one), batched the same way,
with no scores, no ranking and no interventions: no schedule of the same forwards beats it on the machine
at hand. The evaluator's throughput is given as a share of the floor's (target: at least 90%).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from captum_cw import MetricAttribution
from captum_cw.evaluation import load_examples, protocols
from captum_cw.evaluation.protocols import LAYER_METRICS, ProtocolConfig, evaluate_example, measure_unperturbed
from captum_cw.evaluation.ranking import MODES, removal_from_ranking
from captum_cw.evaluation.sequences import encode, measure
from captum_cw.interventions import mask_values
from captum_cw.models import load_model

HERE = Path(__file__).resolve().parent


def naive(model, encoded, config: ProtocolConfig) -> None:
    """The straightforward loop: a forward per metric for the scores, a forward per variant."""
    device = next(model.parameters()).device
    for ids in encoded.sequences:
        ids = ids.to(device)
        n = len(ids)
        eligible = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        with torch.no_grad():
            model(ids[None])  # clean
            for metric in config.metrics:
                if metric == "random":
                    scores = torch.rand(len(model.model.layers), 1, n, n, device=device)
                else:
                    scores = MetricAttribution(model, metric).attribute(ids[None])[0][:, None]
                for mode in MODES:
                    for percent in config.bins:
                        masks = removal_from_ranking(scores, eligible, percent, mode)
                        with mask_values(model, {k: masks[k][None] for k in range(len(masks))}):
                            logits = model(ids[None]).logits
        measure(encoded, [logits[:, -encoded.rows_needed(0):]])


def floor(model, encoded, config: ProtocolConfig, n_variants: int) -> None:
    """The evaluator's forwards alone: its clean pass and ``n_variants`` variant rows batched as it batches them,
    with nothing scored, ranked or removed."""
    measure_unperturbed(model, encoded)
    ids = encoded.sequences[0].to(next(model.parameters()).device)
    with torch.no_grad():
        for first in range(0, n_variants, config.batch_size):
            rows = min(config.batch_size, n_variants - first)
            protocols._forward(model, ids.expand(rows, -1), encoded.rows_needed(0))


class CountingForward:
    """Counts the variant rows the evaluator's forwards run (its clean pass does not go through ``_forward``)."""

    def __init__(self):
        self.rows = 0
        self.forward = protocols._forward

    def __call__(self, model, ids, keep):
        self.rows += ids.shape[0]
        return self.forward(model, ids, keep)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=3)
    parser.add_argument("--data-dir",
                        default=os.environ.get("CAPTUM_CW_DATA", str(HERE.parents[1] / "shared" / "data")),
                        help="JSONL files in the hub schema (default: $CAPTUM_CW_DATA, else ../shared/data)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch-size", type=int, default=ProtocolConfig.batch_size)
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m", device=args.device, dtype=getattr(torch, args.dtype))
    examples = [encode(e, tokenizer, 256) for e in load_examples("mmlu", args.examples, args.data_dir)]
    config = ProtocolConfig(metrics=LAYER_METRICS, batch_size=args.batch_size)
    n_variants = len(config.metrics) * len(MODES) * len(config.bins)
    layer_configs = {reuse: ProtocolConfig(metrics=LAYER_METRICS, layers=(20,), reuse_clean=reuse,
                                           batch_size=args.batch_size) for reuse in (False, True)}
    counter = CountingForward()
    protocols._forward = counter
    ran = {}  # variant rows the evaluator ran per example: the floor runs as many

    def evaluator(encoded):
        counter.rows = 0
        evaluate_example(model, encoded, config)
        ran[id(encoded)] = counter.rows

    runs = {
        "naive": lambda encoded: naive(model, encoded, config),
        "evaluator": evaluator,
        "floor": lambda encoded: floor(model, encoded, config, ran[id(encoded)]),
        "layer 20": lambda encoded: evaluate_example(model, encoded, layer_configs[False]),
        "layer 20, reuse": lambda encoded: evaluate_example(model, encoded, layer_configs[True]),
    }
    evaluate_example(model, examples[0], config)  # warm-up
    seconds = dict.fromkeys(runs, 0.0)
    for encoded in examples:  # runs interleaved per example, so that a change in the machine's load hits all
        for name, run in runs.items():
            start = time.perf_counter()
            run(encoded)
            seconds[name] += time.perf_counter() - start
    per_minute = {name: 60 * len(examples) / value for name, value in seconds.items()}
    slow, fast, least = seconds["naive"], seconds["evaluator"], seconds["floor"]
    forwards = sum(ran.values()) / len(examples)
    mean_tokens = sum(len(e.sequences[0]) for e in examples) / len(examples)
    text = "\n".join([
        "",
        f"## Faithfulness evaluator vs a naive loop (SmolLM2 {args.dtype} on {args.device}, MMLU, "
        f"{args.examples} examples, "
        f"{mean_tokens:.0f} tokens on average, 6 metrics x 5 bins x 2 modes = {n_variants} variants each)",
        "",
        "| run | examples per minute |",
        "|---|---|",
        f"| naive: one forward per metric and per variant | {per_minute['naive']:.2f} |",
        f"| evaluator: one clean pass for all metrics, one ranking per metric, variants batched by "
        f"{config.batch_size} | {per_minute['evaluator']:.2f} ({slow / fast:.2f}x; {least / fast:.0%} of the floor) |",
        f"| floor: the evaluator's forwards alone ({forwards:.0f} variant rows per example), no scores, no ranking, "
        f"no interventions | {per_minute['floor']:.2f} ({slow / least:.2f}x) |",
        "",
        "Intervening at layer 20 only (of 30):",
        "",
        "| run | examples per minute |",
        "|---|---|",
        f"| evaluator, every variant runs all 30 blocks | {per_minute['layer 20']:.2f} |",
        f"| evaluator, variants reuse the clean output of blocks 0-19 | {per_minute['layer 20, reuse']:.2f} "
        f"({seconds['layer 20'] / seconds['layer 20, reuse']:.2f}x) |",
        "",
    ])
    text += (f"\nReproduce: `python benchmarks/bench_evaluator.py --examples {args.examples}` (rewrites this section; "
             f"{time.strftime('%Y-%m-%d')}). The runs take turns on each example, so a change in the machine's load "
             "hits them alike.\n")
    print(text)
    replace_section(HERE / "RESULTS.md", text.strip("\n"))


def replace_section(path: Path, section: str) -> None:
    """Puts ``section`` (starting with its ``## `` heading) in place of the file's section of that heading, or at
    the end; the other sections stay as they are."""
    lines = path.read_text().splitlines() if path.exists() else []
    heading = section.splitlines()[0].split("(")[0]
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), len(lines))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    kept_after = [""] + lines[end:] if end < len(lines) else []
    path.write_text("\n".join(lines[:start] + section.splitlines() + kept_after) + "\n")


if __name__ == "__main__":
    main()
