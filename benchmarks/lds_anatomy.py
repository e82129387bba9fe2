"""What decides the LDS on the answered examples of a peers run: the additive ceiling, and the distractors' sign.

For each answered ground-truth example of ``benchmarks/runs/peers/MODEL`` (3-4 sources), runs the prompt under
every subset of its sources (deleting the others' tokens, as the LDS does) and computes each source's Banzhaf
value: its mean effect on log p(answer) over the subsets of the other sources, the least-squares additive model
of random half-ablations, so the best an additive score can do on the LDS. It then scores on the run's own 16
seeded half-ablations (read off those subsets; ``peer_methods.measures.lds``): the Banzhaf values, the evidence's
indicator (1 on the evidence, 0 elsewhere) and the methods of ``--methods`` (token scores summed per source,
source-level ones such as ContextCite's as they are), and counts for each the share of distractor sources it
scores above zero (Banzhaf's share says what sign a distractor deserves).

Usage (``--report-only`` prints the table of a kept run)::

    python benchmarks/lds_anatomy.py --model gemma-3-270m --out benchmarks/runs/lds_anatomy/gemma-3-270m.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from knockout_points import TASKS, answered_examples
from peer_methods.encoding import encode_example
from peer_methods.measures import kept_sources, lds, lds_masks, lds_seed, source_scores, target_logprobs
from peer_methods.methods import METHODS

from captum_cw.models import load_model


def subset_logprobs(model, encoded) -> dict[tuple[bool, ...], float]:
    r"""The target log-probability with each subset of the sources kept (the others' tokens deleted)."""
    subsets = list(itertools.product((False, True), repeat=len(encoded.sources)))
    values = target_logprobs(model, [kept_sources(encoded, subset) for subset in subsets], encoded.target)
    return dict(zip(subsets, values.tolist()))


def banzhaf(value: dict[tuple[bool, ...], float]) -> np.ndarray:
    r"""``(sources,)`` each source's mean effect on the target log-probability over every subset of the others."""
    count = len(next(iter(value)))
    return np.array([np.mean([value[s[:i] + (True,) + s[i + 1:]] - value[s] for s in value if not s[i]])
                     for i in range(count)])


def summary_table(rows: list[dict], model_name: str) -> str:
    r"""Markdown: per method and task, the mean LDS, the share of distractors scored above zero, and the evidence's
    share of the scores' absolute sum (how far the evidence dominates)."""
    tasks = sorted({row["task"] for row in rows})
    names = [key for key in rows[0] if key not in ("id", "task")]
    lines = [f"{model_name}: LDS / distractors scored positive / evidence's share of the absolute scores",
             "", "| | " + " | ".join(f"{task} (n {sum(r['task'] == task for r in rows)})" for task in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for name in names:
        cells = []
        for task in tasks:
            group = [row for row in rows if row["task"] == task]
            shares = [abs(s[e]) / max(np.abs(s).sum(), 1e-12) for s, e in  # e: the evidence, where its indicator is 1
                      ((np.asarray(row[name]["source_scores"]), int(np.argmax(row["evidence only"]["source_scores"])))
                       for row in group)]
            cells.append(f"{np.nanmean([row[name]['lds'] for row in group]):.2f} / "
                         f"{np.mean([row[name]['distractors_positive'] for row in group]):.2f} / "
                         f"{np.mean(shares):.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(TASKS))
    parser.add_argument("--methods", default="cw_knockout,cw_knockout_early,attnlrp,feature_ablation,contextcite_32")
    parser.add_argument("--out", required=True)
    parser.add_argument("--report-only", action="store_true", help="print the table of --out without running")
    args = parser.parse_args()
    if args.report_only:
        print(summary_table(json.loads(Path(args.out).read_text(encoding="utf-8")), args.model))
        return
    methods = args.methods.split(",")
    examples, settings, _ = answered_examples(args.model)
    model, tokenizer = load_model(args.model, attn_implementation="eager")
    rows = []
    for example in tqdm(examples, desc=args.model):
        encoded = encode_example(tokenizer, example, settings["style"])
        value = subset_logprobs(model, encoded)
        masks = lds_masks(len(encoded.sources), 16, lds_seed(example.id))  # the peers run's own ablations
        ablations = masks, np.array([value[tuple(mask.tolist())] for mask in masks])
        per_source = {"banzhaf": banzhaf(value), "evidence only": np.eye(len(encoded.sources))[example.evidence]}
        per_source.update({name: source_scores(encoded, METHODS[name].score(model, tokenizer, encoded)[0],
                                               METHODS[name].level) for name in methods})
        distractors = [s for s in range(len(encoded.sources)) if s != example.evidence]
        row = {"id": example.id, "task": example.task}
        for name, values in per_source.items():
            row[name] = {"lds": lds(values, ablations), "distractors_positive": float(np.mean(values[distractors] > 0)),
                         "source_scores": values.tolist()}
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    print(summary_table(rows, args.model))


if __name__ == "__main__":
    main()
