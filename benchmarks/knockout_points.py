"""Where along the knockout path the gradient predicts half-ablations best: the probe behind ``cw_knockout``.

On the answered ground-truth examples of a peers run (``benchmarks/runs/peers/MODEL``), reads the gradient of
log p(answer) with respect to each context token's key gate (every layer and row, renormalised) with every context
token's gate at one point ``t`` (1: the model as it is; 1/2: ``cw_knockout``), and scores it as docs/PEERS.md
does: pointing, and the LDS over the same 16 seeded half-ablations as the peers run. The gate here is built
independently of the package: the model's eager attention reads a 4D float mask holding causality and ``log t``
on the context's keys. ``cw_target`` and ``cw_target_magnitude`` are scored beside it.

Usage::

    python benchmarks/knockout_points.py --model gemma-3-270m --points 1,0.75,0.5,0.25 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_methods.encoding import encode_example
from peer_methods.measures import lds, lds_ablations, lds_seed, source_scores, tied_top_share
from peer_methods.methods import METHODS
from peers import examples_of, parse_args, read_results

from captum_cw.models import load_model

RUNS = Path(__file__).resolve().parent / "runs" / "peers"
TASKS = {"smollm2-135m": [("who_lives_where:2,country_of_city:3", 35), ("job_of_description:2", 30)],
         "gemma-3-270m": [("who_lives_where:2,country_of_city:3", 40), ("job_of_description:2", 30)]}


def gate_gradient(model, encoded, point: float) -> np.ndarray:
    r"""``(n,)`` d log p(answer) / d gate of each context token, every context gate at ``point`` (0 elsewhere)."""
    n = encoded.n
    log_gate = torch.zeros(n)
    log_gate[encoded.context] = float(np.log(point))
    log_gate.requires_grad_()
    causal = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)  # [n, n]
    mask = (causal + log_gate[None, :])[None, None]  # [1, 1, n, n]
    logits = model(input_ids=encoded.input_ids, attention_mask=mask, logits_to_keep=1).logits[0, -1]
    (gradient,) = torch.autograd.grad(logits.float().log_softmax(-1)[encoded.target], log_gate)
    scores = np.zeros(n)
    scores[encoded.context] = gradient[encoded.context].double().numpy() / point  # d/d gate = d/d log gate / gate
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(TASKS))
    parser.add_argument("--points", default="1,0.75,0.5,0.25")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    points = [float(p) for p in args.points.split(",")]
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
        scores = {f"gate {point:g}": gate_gradient(model, encoded, point) for point in points}
        scores.update({name: METHODS[name].score(model, tokenizer, encoded)[0]
                       for name in ("cw_target", "cw_target_magnitude")})
        context = np.asarray(encoded.context)
        evidence = np.isin(context, encoded.evidence)
        row = {"id": example.id, "task": example.task}
        for name, values in scores.items():
            row[name] = {"lds": lds(source_scores(encoded, values, "token"), ablations),
                         "pointing": tied_top_share(values[context], evidence)}
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    for name in [key for key in rows[0] if key not in ("id", "task")]:
        mean_lds = np.nanmean([row[name]["lds"] for row in rows])
        pointing = np.mean([row[name]["pointing"] for row in rows])
        print(f"{name}: n {len(rows)}, LDS {mean_lds:.3f}, pointing {pointing:.3f}")


if __name__ == "__main__":
    main()
