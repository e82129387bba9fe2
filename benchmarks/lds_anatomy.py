"""What decides the LDS on the answered examples of a peers run: the additive ceiling, and the distractors' sign.

For each answered ground-truth example of ``benchmarks/runs/peers/MODEL`` (3-4 sources), runs the prompt under
every subset of its sources (deleting the others' tokens, as the LDS does) and computes each source's Banzhaf
value: its mean effect on log p(answer) over the subsets of the other sources, the least-squares additive model
of random half-ablations, so the best an additive score can do on the LDS. It then scores on the run's own 16
seeded half-ablations (``peer_methods.measures.lds``): the Banzhaf values, the evidence's indicator (1 on the
evidence, 0 elsewhere) and the methods of ``--methods`` (token scores summed per source), and counts for each the
share of distractor sources it scores above zero (Banzhaf's share says what sign a distractor deserves).

Usage::

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
from knockout_points import RUNS, TASKS
from peer_methods.encoding import encode_example
from peer_methods.measures import _without, lds, lds_ablations, lds_seed, source_scores, target_logprobs
from peer_methods.methods import METHODS
from peers import examples_of, parse_args, read_results

from captum_cw.models import load_model


def banzhaf(model, encoded) -> np.ndarray:
    r"""``(sources,)`` each source's mean effect on the target log-probability over every subset of the others."""
    count = len(encoded.sources)
    subsets = list(itertools.product((False, True), repeat=count))  # kept sources
    rows = [_without(encoded, [p for s, kept in enumerate(subset) if not kept for p in encoded.sources[s]])
            for subset in subsets]
    value = dict(zip(subsets, target_logprobs(model, rows, encoded.target)))
    return np.array([np.mean([value[s[:i] + (True,) + s[i + 1:]] - value[s] for s in subsets if not s[i]])
                     for i in range(count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(TASKS))
    parser.add_argument("--methods", default="cw_knockout,attnlrp,feature_ablation")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    methods = args.methods.split(",")
    if "attnlrp" in methods:
        import peer_methods.attnlrp  # noqa: F401  (registers it; needs lxt)
    folder = RUNS / args.model
    records = read_results(folder / "results.jsonl")
    answered = {r["example"] for r in records if r["method"] == "answered" and r["correct"]}
    style = json.loads((folder / "settings.json").read_text(encoding="utf-8"))["style"]
    examples = [e for tasks, n in TASKS[args.model] for e in examples_of(parse_args(["--tasks", tasks, "--n", str(n),
                                                                                      "--out", str(folder)]))
                if e.id in answered]
    model, tokenizer = load_model(args.model, attn_implementation="eager")
    rows = []
    for example in tqdm(examples, desc=args.model):
        encoded = encode_example(tokenizer, example, style)
        ablations = lds_ablations(model, encoded, 16, lds_seed(example.id))  # the peers run's own ablations
        per_source = {"banzhaf": banzhaf(model, encoded), "evidence only": np.eye(len(encoded.sources))[
            example.evidence]}
        per_source.update({name: source_scores(encoded, METHODS[name].score(model, tokenizer, encoded)[0], "token")
                           for name in methods})
        distractors = [s for s in range(len(encoded.sources)) if s != example.evidence]
        row = {"id": example.id, "task": example.task}
        for name, values in per_source.items():
            row[name] = {"lds": lds(values, ablations), "distractors_positive": float(np.mean(values[distractors] > 0)),
                         "source_scores": values.tolist()}
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    for task in sorted({row["task"] for row in rows}):
        group = [row for row in rows if row["task"] == task]
        for name in per_source:
            mean_lds = np.nanmean([row[name]["lds"] for row in group])
            positive = np.mean([row[name]["distractors_positive"] for row in group])
            print(f"{task} (n {len(group)}) {name}: LDS {mean_lds:.3f}, distractors scored positive {positive:.2f}")


if __name__ == "__main__":
    main()
