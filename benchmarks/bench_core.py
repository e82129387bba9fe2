"""Speed and memory of the core attributors on SmolLM2-135M, side by side in one run.

    python benchmarks/bench_core.py [--repeats 11] [--lengths 128 512 2048]

Writes its sections of benchmarks/RESULTS.md (and prints them), keeping the evaluator benchmark's. In the CW vs
forward table the five runs (sdpa and eager forwards, CW on each, CW on sdpa without the self-check) take turns,
each CW next to its forward, so that a change in the machine's load hits them alike; every figure is a median over
repeats after a warm-up, every ratio the median of the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
KEPT_FROM = "## Faithfulness evaluator"  # RESULTS.md from this heading on is not this script's to rewrite
NO_CACHE = {"use_cache": False}  # timed calls build no key-value cache


def median_seconds(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_times(functions: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each function in each repeat, the functions taking turns within each repeat."""
    for function in functions.values():
        function()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_cell(numerator: list[float], denominator: list[float]) -> str:
    """The median of the per-repeat ratios (a change in the machine's load hits both runs of a repeat, most of all
    when they are neighbours in time), their interquartile range, and the ratio of the two fastest runs
    (interference only ever adds time)."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    low, _, high = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (ratios[0],) * 3
    return f"{statistics.median(ratios):.2f}x ({low:.2f}-{high:.2f}; fastest {min(numerator) / min(denominator):.2f}x)"


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra_memory(function) -> int:
    """Peak resident memory above the level before the call, sampled every millisecond."""
    baseline, peak, running = rss_bytes(), [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        function()
    finally:
        running[0] = False
        thread.join()
    return max(peak[0], rss_bytes()) - baseline


def memory_child(mode: str, n: int) -> None:
    """Runs in a fresh process so that peaks do not hide each other."""
    from captum_cw import ContributionWeights
    from captum_cw.models import load_model

    model, _ = load_model("smollm2-135m", attn_implementation="sdpa")
    ids = torch.randint(10, 40000, (1, n), generator=torch.Generator().manual_seed(0))
    if mode == "forward":
        function = lambda: model(ids, use_cache=False)  # noqa: E731
    else:
        attributor = ContributionWeights(model)
        function = lambda: attributor.attribute(ids, additional_forward_args={"use_cache": False},  # noqa: E731
                                                query_positions=[-1])
    with torch.no_grad():
        function()  # warm-up: allocator caches
        print(peak_extra_memory(function))


def arithmetic_floor(config, n: int, *, recompute_alpha: bool) -> float:
    """CW over all rows / a forward, in multiply-adds: the forward (every layer's projections, MLP and full n x n
    attention, and the logits of every position) against the products CW adds per layer (the layer output
    o = m W_O and its pull-back through each W_O[h], and the (n x d_head) x (d_head x n) dots per head; on a model
    whose kernel does not return its weights, also the recomputed scores and alpha @ V)."""
    d_model, d_ff, vocabulary = config.hidden_size, config.intermediate_size, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d_head = getattr(config, "head_dim", None) or d_model // heads
    per_layer = (n * d_model * (heads + 2 * kv_heads) * d_head + n * heads * d_head * d_model
                 + 3 * n * d_model * d_ff + 2 * heads * n * n * d_head)
    forward = config.num_hidden_layers * per_layer + n * d_model * vocabulary
    added = 2 * n * heads * d_head * d_model + heads * n * n * d_head
    if recompute_alpha:
        added += 2 * heads * n * n * d_head
    return (forward + config.num_hidden_layers * added) / forward


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--memory-length", type=int, default=8192)
    parser.add_argument("--ig-length", type=int, default=128)
    parser.add_argument("--memory-child", nargs=2, metavar=("MODE", "N"))
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    return parser.parse_args()


def header_lines(repeats: int) -> list[str]:
    """The title, the machine and library versions, and how to reproduce."""
    import captum
    import transformers

    return [
        "# Core benchmarks (SmolLM2-135M, float32)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU threads, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, captum {captum.__version__}; "
        f"device: {'cuda' if torch.cuda.is_available() else 'cpu'}. Medians of {repeats} runs after a warm-up; "
        "ratios are medians of the per-run ratios (interquartile range; ratio of the fastest runs).",
        f"Reproduce: `python benchmarks/bench_core.py` ({time.strftime('%Y-%m-%d')}).",
    ]


def forward_ratio_lines(model, lengths: list[int], repeats: int, generator: torch.Generator) -> list[str]:
    """The table of contribution weights over all layers, heads and rows against a plain forward pass, one row
    per length, each printed as it is measured."""
    from captum_cw import ContributionWeights

    lines = [
        "",
        "## Contribution weights over all 30 layers, 9 heads and n rows vs a plain forward pass",
        "",
        "| n | forward sdpa (s) | forward eager (s) | CW on sdpa model (s) | CW / eager forward | CW / sdpa forward "
        "| CW without self-check (s) | self-check's share of CW | CW on eager model (s) "
        "| CW on eager / eager forward | arithmetic floor (eager / sdpa) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(10, 40000, (1, n), generator=generator)
            attributor = ContributionWeights(model)
            unchecked = ContributionWeights(model, verify=False)

            def forward(implementation: str) -> None:
                model.set_attn_implementation(implementation)
                model(ids, use_cache=False)

            def contribution_weights(which: ContributionWeights, implementation: str = "sdpa") -> None:
                model.set_attn_implementation(implementation)  # eager hands its own weights to the scan
                which.attribute(ids, additional_forward_args=NO_CACHE)

            # each CW next to the forward of its own model (the headline ratio, CW on eager / eager forward)
            runs = interleaved_times({"sdpa": lambda: forward("sdpa"), "cw": lambda: contribution_weights(attributor),
                                      "unchecked": lambda: contribution_weights(unchecked),
                                      "eager": lambda: forward("eager"),
                                      "cw_eager": lambda: contribution_weights(attributor, "eager")}, repeats)
            times = {name: statistics.median(values) for name, values in runs.items()}
            lines.append(f"| {n} | {times['sdpa']:.3f} | {times['eager']:.3f} | {times['cw']:.3f} | "
                         f"{ratio_cell(runs['cw'], runs['eager'])} | {ratio_cell(runs['cw'], runs['sdpa'])} | "
                         f"{times['unchecked']:.3f} | {times['cw'] / times['unchecked'] - 1:+.1%} | "
                         f"{times['cw_eager']:.3f} | {ratio_cell(runs['cw_eager'], runs['eager'])} | "
                         f"{arithmetic_floor(model.config, n, recompute_alpha=False):.2f}x / "
                         f"{arithmetic_floor(model.config, n, recompute_alpha=True):.2f}x |")
            print(lines[-1], flush=True)
    return lines


def integrated_gradients_lines(model, n: int, repeats: int, generator: torch.Generator) -> list[str]:
    """The table of last-token attribution at length ``n``: contribution weights against captum's
    LayerIntegratedGradients (50 steps, half as many repeats)."""
    from captum.attr import LayerIntegratedGradients

    from captum_cw import ContributionWeights

    ids = torch.randint(10, 40000, (1, n), generator=generator)
    with torch.no_grad():
        target = int(model(ids).logits[0, -1].argmax())

    def last_logit(input_ids):
        return model(input_ids, use_cache=False).logits[:, -1]

    ig = LayerIntegratedGradients(last_logit, model.get_input_embeddings())
    baseline = torch.full_like(ids, model.config.pad_token_id or 0)
    attributor = ContributionWeights(model)
    ig_time = median_seconds(lambda: ig.attribute(ids, baselines=baseline, target=target, n_steps=50,
                                                  internal_batch_size=25), max(1, repeats // 2))
    with torch.no_grad():
        cw_time = median_seconds(lambda: attributor.attribute(ids, query_positions=[-1],
                                                              additional_forward_args=NO_CACHE), repeats)
    return [
        "",
        f"## Last-token attribution, n = {n}: CW (all layers and heads) vs captum's LayerIntegratedGradients",
        "",
        "| method | seconds | speed-up of CW |",
        "|---|---|---|",
        f"| LayerIntegratedGradients, 50 steps, on the embeddings | {ig_time:.3f} | |",
        f"| ContributionWeights, query_positions=[-1] | {cw_time:.3f} | {ig_time / cw_time:.1f}x |",
    ]


def peak_memory_lines(n: int) -> list[str]:
    """The table of peak memory of a forward pass and of a last-position attribution at length ``n``, each
    measured in a fresh process (:func:`memory_child`)."""
    peaks = {}
    for mode in ("forward", "attribute"):
        result = subprocess.run([sys.executable, __file__, "--memory-child", mode, str(n)], capture_output=True,
                                text=True, check=True)
        peaks[mode] = int(result.stdout.strip().splitlines()[-1])
    dense = 30 * 9 * n * n * 4
    return [
        "",
        f"## Peak memory, last-position attribution at n = {n} (sdpa model, fresh process each)",
        "",
        "| run | peak resident memory above the loaded model (MiB) |",
        "|---|---|",
        f"| plain forward | {peaks['forward'] / 2**20:.0f} |",
        f"| ContributionWeights, query_positions=[-1] | {peaks['attribute'] / 2**20:.0f} "
        f"({peaks['attribute'] / max(peaks['forward'], 1):.2f}x the forward) |",
        f"| for scale: one float32 (layers, heads, n, n) tensor | {dense / 2**20:.0f} |",
        "",
    ]


def write_results(text: str, out: Path) -> None:
    """Writes ``text`` to ``out``, keeping what ``out`` holds from :data:`KEPT_FROM` on (the evaluator
    benchmark's sections and the reading notes)."""
    kept = out.read_text() if out.exists() else ""
    kept = kept[kept.index(KEPT_FROM):] if KEPT_FROM in kept else ""
    out.write_text(text + "\n" + kept)


def main() -> None:
    args = parse_arguments()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return

    from captum_cw.models import load_model

    model, _ = load_model("smollm2-135m")
    generator = torch.Generator().manual_seed(0)  # the lengths' ids, then integrated gradients' ids
    lines = header_lines(args.repeats) + forward_ratio_lines(model, args.lengths, args.repeats, generator)
    lines += integrated_gradients_lines(model, args.ig_length, args.repeats, generator)
    print("\n".join(lines[-6:]), flush=True)
    lines += peak_memory_lines(args.memory_length)
    text = "\n".join(lines)
    print(text)
    write_results(text, Path(args.out))


if __name__ == "__main__":
    main()
