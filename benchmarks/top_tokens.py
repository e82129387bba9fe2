"""What two methods rank first on the answered examples of a kept peers run, and what deleting it costs the answer.

    python benchmarks/top_tokens.py --run benchmarks/runs/peers_many/gemma-3-270m --model gemma-3-270m \\
        --tasks who_lives_where:7,country_of_city:7,job_of_description:5 --n 30 --non-copy \\
        --methods cw_knockout_early,cw_knockout,attnlrp --out benchmarks/runs/top_tokens/gemma-3-270m-many.json

and the same with ``--run benchmarks/runs/peers_many_heldout/gemma-3-270m`` into ``gemma-3-270m-many-heldout.json``.

Rebuilds the run's examples (``--tasks``, ``--n`` as the run was made, its seed and prompt style from its
``settings.json``), keeps those the model answered (``--non-copy``: only where the evidence is not the answer
string), and records for each method of ``--methods`` its top context token and the drop in log p(answer) when
that token alone is deleted (comp@1 of the run). The summary lists the examples where the methods' top tokens
differ. One JSON file (``--out``); ``--report-only`` prints a kept file's summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_methods import METHODS, encode_example, target_logprobs
from peer_methods.measures import ranking, without
from peers import answered_examples

from captum_cw.files import write_atomically
from captum_cw.models import load_model

__all__ = ["main", "summary", "top_token"]


def top_token(model, tokenizer, encoded, method: str, full: float) -> dict:
    r"""``method``'s top context token (its text, whether it lies in the evidence) and the drop from ``full``, the
    whole prompt's log p(answer), when it alone is deleted."""
    scores = METHODS[method].score(model, tokenizer, encoded)[0]  # (n,)
    context = np.asarray(encoded.context)
    top = int(context[ranking(scores[context])[0]])
    (deleted,) = target_logprobs(model, [without(encoded, [top])], encoded.target)
    return {"token": tokenizer.decode([int(encoded.input_ids[0, top])]).strip(), "evidence": top in encoded.evidence,
            "drop": float(full - deleted)}


def summary(records: list[dict]) -> str:
    methods = list(records[0]["top"]) if records else []
    lines = [f"{len(records)} examples; mean drop when deleting each method's top token: "
             + ", ".join(f"{m} {np.mean([r['top'][m]['drop'] for r in records]):.2f}" for m in methods)]
    differ = [r for r in records if len({r["top"][m]["token"] for m in methods}) > 1]
    lines.append(f"top tokens differ on {len(differ)}:")
    lines += [f"  {r['example']} ({r['answer'].strip()}): " + ", ".join(
        f"{m} {r['top'][m]['token']!r} {r['top'][m]['drop']:.2f}" for m in methods) for r in differ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a kept peers run folder (results.jsonl, settings.json)")
    parser.add_argument("--model", required=True, help="the model the run was made with")
    parser.add_argument("--tasks", default="", help="as the run was made (task:distractors,...)")
    parser.add_argument("--n", type=int, default=30, help="as the run was made")
    parser.add_argument("--methods", default="cw_knockout_early,attnlrp")
    parser.add_argument("--non-copy", action="store_true", help="only where the evidence is not the answer string")
    parser.add_argument("--out", required=True, help="the JSON file of the per-example results")
    parser.add_argument("--report-only", action="store_true", help="print the summary of a kept --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        print(summary(json.loads(out.read_text(encoding="utf-8"))))
        return
    run = Path(args.run)
    examples, style = answered_examples(run, args.tasks, args.n)
    examples = [e for e in examples if not (args.non_copy and e.copy)]
    if not examples:
        parser.error(f"no answered example of --tasks {args.tasks!r} in {run}")
    model, tokenizer = load_model(args.model)
    records = []
    for example in tqdm(examples, desc=args.model):
        encoded = encode_example(tokenizer, example, style)
        (full,) = target_logprobs(model, [encoded.input_ids[0].tolist()], encoded.target)  # once for every method
        records.append({"example": example.id, "answer": example.answer,
                        "top": {m: top_token(model, tokenizer, encoded, m, float(full))
                                for m in args.methods.split(",")}})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(records, indent=1) + "\n")
    print(summary(records))


if __name__ == "__main__":
    main()
