"""At which layer does each metric point at the evidence? Per-layer pointing on the ground-truth context tasks.

    python benchmarks/layer_pointing.py --model smollm2-135m --peers benchmarks/runs/peers/smollm2-135m \
        --out benchmarks/runs/layer_pointing/smollm2-135m --table docs/PEERS.md --plot docs/peers/layers.png

The examples are those of a ``benchmarks/peers.py`` run that the model answers (its folder's ``settings.json``
gives the prompt style and seed, ``--tasks`` and ``--n`` must be the run's). For each example, every metric's
token scores at the last position are kept per layer (one pass for the five attention metrics,
``captum_cw.attribute_metrics``), and the target-aware contributions of each layer
(one forward and one backward pass for every layer). Pointing
at a layer is the share of the evidence among the context's top-scoring tokens (ties shared), as in peers.py;
``mean`` is the pointing of the scores averaged over layers (TokenContributions' default aggregation), ``last`` the
last layer's. Results are appended per example to ``OUT/results.jsonl`` (a rerun skips what is done);
``--report-only`` writes the table and plot from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_methods.encoding import encode_example
from peer_methods.measures import tied_top_share
from peers import examples_of, read_results, write_section

from captum_cw.statistics import mean_interval

METRICS = ("attention", "value_weighted", "output_normalized", "cw_intra", "cw_inter")
TARGET = "cw_target"  # the target-aware contributions (cw_inter's decomposition, projected on the answer)
GROUPS = {"all ground-truth tasks": lambda r: True,
          "evidence that is not the answer string": lambda r: not r["copy"]}


def layer_scores(model, encoded) -> dict[str, np.ndarray]:
    r"""``{metric: (n_layers, n_context)}`` scores of the context's tokens at the last position, every layer: the
    five attention metrics from one pass, the target-aware contributions of every layer from one forward and one
    backward pass (``captum_cw.target_contributions.target_scores``, what ``TokenContributions(target=)``
    averages over layers)."""
    import torch

    from captum_cw import attribute_metrics, find_attention_layers
    from captum_cw.positions import Positions
    from captum_cw.scoring import prepare_call
    from captum_cw.target_contributions import target_scores

    ids = encoded.input_ids.to(next(model.parameters()).device)  # [1, n]
    context = torch.tensor(encoded.context)
    found = attribute_metrics(model, ids, list(METRICS), query_positions=[-1])
    scores = {name: found.scores[name][0, :, 0][:, context].double().cpu().numpy() for name in METRICS}
    call = prepare_call(model, ids, None, None, Positions(None))
    last, target = torch.tensor([ids.shape[1] - 1]), torch.tensor([encoded.target])
    per_layer = target_scores(model, find_attention_layers(model), None, call.inputs, call.positional, last,
                              target).scores  # [1, layers, n]
    scores[TARGET] = per_layer[0][:, context].detach().double().cpu().numpy()
    return scores


def run(args: argparse.Namespace) -> None:
    from captum_cw.models import load_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    settings = json.loads((Path(args.peers) / "settings.json").read_text(encoding="utf-8"))
    answered = {r["example"] for r in read_results(Path(args.peers) / "results.jsonl")
                if r["method"] == "answered" and r["correct"]}
    done = {r["example"] for r in read_results(path)}
    model, tokenizer = load_model(args.model, device=args.device)
    args.seed, args.boolq_data = settings["seed"], None
    todo = [e for e in examples_of(args) if e.id in answered and e.id not in done]
    with open(path, "a", encoding="utf-8") as results:
        for example in tqdm(todo, desc=f"layers ({Path(args.model).name})"):
            encoded = encode_example(tokenizer, example, settings["style"])
            scores = layer_scores(model, encoded)
            is_evidence = np.isin(np.asarray(encoded.context), encoded.evidence).tolist()
            results.write(json.dumps({"example": example.id, "task": example.task, "copy": example.copy,
                                      "evidence": is_evidence,
                                      "scores": {name: values.tolist() for name, values in scores.items()}}) + "\n")
            results.flush()


def pointing(record: dict) -> dict[str, dict[str, object]]:
    r"""``{metric: {"layers": [pointing per layer], "mean": ..., "magnitude": ..., "last": ...}}`` of one example
    (``magnitude``: the mean of the layers' absolute scores, ``layer_aggregation="magnitude"``)."""
    evidence = np.asarray(record["evidence"], dtype=bool)
    found = {}
    for name, values in record["scores"].items():
        per_layer = np.asarray(values)  # [layers, context]
        found[name] = {"layers": [tied_top_share(row, evidence) for row in per_layer],
                       "mean": tied_top_share(per_layer.mean(0), evidence),
                       "magnitude": tied_top_share(np.abs(per_layer).mean(0), evidence),
                       "last": tied_top_share(per_layer[-1], evidence)}
    return found


def _cell(values: Sequence[float]) -> str:
    interval = mean_interval(list(values))
    return f"{interval['mean']:.2f} [{interval['ci_low']:.2f}, {interval['ci_high']:.2f}]"


def summary_table(records: list[dict], model_name: str) -> str:
    r"""The Markdown section of one model: per metric, the best layer, the last layer, the layer mean and the
    mean magnitude."""
    lines = [f"<!-- layers:{model_name} -->", f"#### {model_name}: pointing per layer", ""]
    for title, keep in GROUPS.items():
        group = [pointing(r) for r in records if keep(r)]
        if not group:
            continue
        n_layers = len(group[0][METRICS[0]]["layers"])
        lines += [f"**{title}** ({len(group)} examples, {n_layers} layers; mean [95% bootstrap interval])", "",
                  "| metric | best layer | pointing there | last layer | mean over layers | magnitude over layers | "
                  "layers pointing >= 0.8 |", "|---|---|---|---|---|---|---|"]
        for name in (*METRICS, TARGET):
            by_layer = np.array([example[name]["layers"] for example in group])  # [examples, layers]
            best = int(by_layer.mean(0).argmax())
            strong = [str(layer) for layer in np.flatnonzero(by_layer.mean(0) >= 0.8)]
            lines.append(f"| {name} | {best} | {_cell(by_layer[:, best])} | "
                         f"{_cell([e[name]['last'] for e in group])} | {_cell([e[name]['mean'] for e in group])} | "
                         f"{_cell([e[name]['magnitude'] for e in group])} | "
                         f"{', '.join(strong) if strong else 'none'} |")
        lines.append("")
    lines.append(f"<!-- /layers:{model_name} -->")
    return "\n".join(lines) + "\n"


def plot(folders: dict[str, Path], path: Path) -> None:
    r"""Pointing against depth, one panel per model, one line per metric."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from captum_cw.files import save_figure

    figure, axes = plt.subplots(1, len(folders), figsize=(6 * len(folders), 4), squeeze=False, sharey=True)
    for axis, (name, folder) in zip(axes[0], folders.items()):
        group = [pointing(r) for r in read_results(folder / "results.jsonl")]
        if not group:
            continue
        for metric in (*METRICS, TARGET):
            curve = np.array([example[metric]["layers"] for example in group]).mean(0)
            axis.plot(range(len(curve)), curve, label=metric, linewidth=2.5 if metric == TARGET else 1.2)
        axis.set(title=f"{name} ({len(group)} answered examples)", xlabel="layer", ylim=(0, 1.02))
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0][0].set_ylabel("pointing: top context token is the evidence")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(figure, path, dpi=120)
    plt.close(figure)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", required=True, help="a bundled model's name or a local folder")
    parser.add_argument("--peers", required=True, help="the peers.py run folder of this model")
    parser.add_argument("--tasks", default="who_lives_where:2,country_of_city:3", help="as the peers run's")
    parser.add_argument("--n", type=int, default=40, help="as the peers run's")
    parser.add_argument("--distractors", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--table", help="Markdown file whose section for this model is rewritten")
    parser.add_argument("--plot", help="PNG of every model folder beside --out (OUT/../*)")
    parser.add_argument("--device")
    parser.add_argument("--report-only", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.report_only:
        run(args)
    out = Path(args.out)
    if args.table:
        text = summary_table(read_results(out / "results.jsonl"), Path(args.model).name)
        write_section(Path(args.table), text, Path(args.model).name, marker="layers")
    if args.plot:
        folders = {folder.name: folder for folder in sorted(out.parent.iterdir()) if folder.is_dir()}
        plot(folders, Path(args.plot))


if __name__ == "__main__":
    main()
