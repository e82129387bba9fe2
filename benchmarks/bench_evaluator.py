"""Examples per minute of the evaluator vs a naive loop (one full forward per metric and per variant).

    python benchmarks/bench_evaluator.py [--examples 3] [--device cuda] [--dtype bfloat16] [--batch-size 16]

Appends its table to benchmarks/RESULTS.md. All runs use the same examples, side by side in one process.
The floor row runs the evaluator's forwards alone (clean pass and batched variants, no scores, no
interventions): no schedule of the same forwards beats it on the machine at hand.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from captum_cw import AttentionWeights, ContributionWeights, OutputNormalizedAttention, ValueWeightedAttention
from captum_cw.evaluation import load_examples
from captum_cw.evaluation.protocols import (
    LAYER_METRICS,
    ProtocolConfig,
    _measure_variants,
    evaluate_example,
    measure_unperturbed,
)
from captum_cw.evaluation.ranking import MODES, removal_from_ranking
from captum_cw.evaluation.sequences import encode, measure
from captum_cw.interventions import mask_values
from captum_cw.models import load_model

HERE = Path(__file__).resolve().parent
ATTRIBUTORS = {"attention": AttentionWeights, "value_weighted": ValueWeightedAttention,
               "output_normalized": OutputNormalizedAttention,
               "cw_intra": lambda m: ContributionWeights(m, variant="intra"), "cw_inter": ContributionWeights}


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
                    scores = ATTRIBUTORS[metric](model).attribute(ids[None])[0][:, None]
                for mode in MODES:
                    for percent in config.bins:
                        masks = removal_from_ranking(scores, eligible, percent, mode)
                        with mask_values(model, {k: masks[k][None] for k in range(len(masks))}):
                            logits = model(ids[None]).logits
        measure(encoded, [logits[:, -encoded.rows_needed(0):]])


def floor(model, encoded, config: ProtocolConfig, n_variants: int) -> None:
    """The evaluator's forwards alone: its clean pass and its batched variants, with nothing removed."""
    measure_unperturbed(model, encoded)
    _measure_variants(model, encoded, [[{}] * n_variants], config)


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
    runs = {
        "naive": lambda encoded: naive(model, encoded, config),
        "evaluator": lambda encoded: evaluate_example(model, encoded, config),
        "floor": lambda encoded: floor(model, encoded, config, n_variants),
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
        f"| evaluator: one clean pass for all metrics, variants batched by {config.batch_size} | "
        f"{per_minute['evaluator']:.2f} ({slow / fast:.2f}x) |",
        f"| floor: the evaluator's forwards alone, no scores, no interventions | {per_minute['floor']:.2f} "
        f"({slow / least:.2f}x) |",
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
    print(text)
    with open(HERE / "RESULTS.md", "a") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
