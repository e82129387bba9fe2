"""What a two-way answer's explained target depends on: log p(answer) against the log-odds of the two answers.

On the review_sentiment examples a model answered in its kept peers run (``benchmarks/runs/peers_sentiment/MODEL``,
the run's seed and prompt style), reads with the whole prompt, with the evidence (the judging sentence) deleted and
with every source deleted: ``log p(answer)`` (the peers runs' target) and the log-odds ``log p(answer) - log
p(other label)``, and whether the model still picks the answer. Deleting the evidence of a negative review moves
the log-odds far more than log p(" negative"): the complaint's part is mostly to take probability from
" positive", which log p(answer) does not see. The summary then splits the run's methods' pointing, source comp@1
and LDS between the examples whose pick the evidence decides (deleting it flips the model to the other label) and
the rest. One JSON file per model (``--out``); ``--report-only`` prints a kept file's summary.

    python benchmarks/two_way_target.py --model smollm2-135m --out benchmarks/runs/two_way_target/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_methods import EncodedExample, encode_example
from peer_methods.measures import kept_sources
from peers import answered_examples, read_results

from captum_cw.files import write_atomically
from captum_cw.models import load_model

__all__ = ["CONTEXTS", "main", "readings", "summary"]

RUN = Path(__file__).resolve().parent / "runs" / "peers_sentiment"
CONTEXTS = ("whole prompt", "evidence deleted", "every source deleted")


def readings(model, encoded: EncodedExample) -> dict[str, dict[str, float]]:
    r"""For each context of :data:`CONTEXTS`: ``logprob`` (log p(answer)) and ``logodds`` (log p(answer) minus log
    p(the other candidate)) at the last position."""
    if len(encoded.candidates) != 2:
        raise ValueError(f"{encoded.example.id} has {len(encoded.candidates)} candidates; a two-way answer has 2.")
    other = next(c for c in encoded.candidates if c != encoded.target)
    sources = range(len(encoded.sources))
    rows = [encoded.input_ids[0].tolist(),
            kept_sources(encoded, [s != encoded.example.evidence for s in sources]),
            kept_sources(encoded, [False for _ in sources])]
    device = next(model.parameters()).device
    values = {}
    with torch.no_grad():
        for name, ids in zip(CONTEXTS, rows):
            logprobs = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].double().log_softmax(-1)
            values[name] = {"logprob": float(logprobs[encoded.target]),
                            "logodds": float(logprobs[encoded.target] - logprobs[other])}
    return values


def summary(records: list[dict], peers: list[dict]) -> str:
    r"""By label, the mean readings; then, from the peers run's records ``peers``, each method's mean pointing,
    source comp@1 and LDS where the evidence decides the pick and where it does not."""
    lines = []
    for label in sorted({r["answer"] for r in records}):
        group = [r for r in records if r["answer"] == label]
        lines.append(f"answer {label!r}, {len(group)} answered examples (means):")
        for reading in ("logprob", "logodds"):
            values = [f"{name} {np.mean([r['readings'][name][reading] for r in group]):.2f}" for name in CONTEXTS]
            drop = np.mean([r["readings"]["whole prompt"][reading] - r["readings"]["evidence deleted"][reading]
                            for r in group])
            lines.append(f"  {reading}: {', '.join(values)}; deleting the evidence drops it by {drop:.2f}")
        flipped = np.mean([r["readings"]["evidence deleted"]["logodds"] < 0 for r in group])
        lines.append(f"  the other label picked once the evidence is deleted: {flipped:.0%}")
    decides = {r["example"] for r in records if r["readings"]["evidence deleted"]["logodds"] < 0}
    read = {r["example"] for r in records}
    peers = [r for r in peers if r["example"] in read]  # an example read here and measured there
    lines.append(f"the evidence decides the pick on {len(decides)} of {len(records)}; each method there / elsewhere:")
    for method in dict.fromkeys(r["method"] for r in peers if r["method"] != "answered"):
        cells = []
        for measure in ("pointing", "source_comp@1", "lds"):
            means = [np.mean(values) if (values := [r[measure] for r in peers if r["method"] == method
                                                    and (r["example"] in decides) == inside
                                                    and r.get(measure) is not None
                                                    and not math.isnan(r[measure])]) else float("nan")
                     for inside in (True, False)]
            cells.append(f"{measure} {means[0]:.2f} / {means[1]:.2f}")
        lines.append(f"  {method}: {', '.join(cells)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--out", required=True, help="the JSON file of the per-example results")
    parser.add_argument("--runs", default=str(RUN), help="the folder of the peers run (MODEL/ under it)")
    parser.add_argument("--report-only", action="store_true", help="print the summary of a kept --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not (Path(args.runs) / args.model / "results.jsonl").exists():
        raise SystemExit(f"no peers run of {args.model} in {args.runs}")
    peers = read_results(Path(args.runs) / args.model / "results.jsonl")
    if args.report_only:
        print(summary(json.loads(out.read_text(encoding="utf-8")), peers))
        return
    examples, style = answered_examples(Path(args.runs) / args.model, "review_sentiment:2", 40)
    model, tokenizer = load_model(args.model)
    records = [{"example": example.id, "answer": example.answer,
                "readings": readings(model, encode_example(tokenizer, example, style))}
               for example in tqdm(examples, desc=args.model)]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(records, indent=1) + "\n")
    print(summary(records, peers))


if __name__ == "__main__":
    main()
