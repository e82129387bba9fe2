"""What the answer loses when its in-context copy is deleted together with other tokens: why comp@3 and comp@5
on the copy task can favour a method that ranks the other sources' cities second.

On the who_lives_where examples a model answered in its kept peers run (``benchmarks/runs/peers/MODEL``, 3-4
sources), deletes from the prompt the evidence's copy of the answer alone, with the evidence's next two words (the
asked person's name and "lives"), and with the other sources' copies of their own candidates (their cities, the
first two); and asks each method of ``--methods`` what it ranks second and third: a word of the evidence, another
source's city, or another token. ``drop`` is the full prompt's log p(answer) minus the one after the deletion,
as in comp@k. One JSON file per model (``--out``); ``--report-only`` prints a kept file's summary.

    python benchmarks/deletion_order.py --model smollm2-135m --out benchmarks/runs/deletion_order/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from knockout_points import answered_examples
from peer_methods import METHODS, EncodedExample, encode_example, target_logprobs, unavailable
from peer_methods.measures import ranking, without

from captum_cw.files import write_atomically
from captum_cw.models import load_model

__all__ = ["DELETIONS", "deletions", "main", "rank_kinds"]

DELETIONS = ("copy", "copy + evidence words", "copy + other cities")


def deletions(encoded: EncodedExample) -> dict[str, list[int]]:
    r"""The positions each deletion of :data:`DELETIONS` removes: the evidence's copy of the answer, that and the
    evidence's first two other tokens, that and the first two copies of another candidate in another source."""
    evidence_words = [p for p in encoded.evidence if p not in encoded.copy][:2]
    ids = encoded.input_ids[0].tolist()
    others = {c for c in encoded.candidates if c != encoded.target}
    other_cities = [p for source in encoded.sources if source != encoded.evidence for p in source
                    if ids[p] in others][:2]
    return dict(zip(DELETIONS, (list(encoded.copy), [*encoded.copy, *evidence_words],
                                [*encoded.copy, *other_cities])))


def rank_kinds(encoded: EncodedExample, scores: np.ndarray) -> list[str]:
    r"""What the method ranks second and third among the context's tokens (``scores`` ``(n,)``): ``"evidence"``,
    ``"other city"`` (a copy of another candidate in another source) or ``"other"``."""
    context = np.asarray(encoded.context)
    order = context[ranking(scores[context])]
    other_cities = set(deletions(encoded)["copy + other cities"]) - set(encoded.copy)
    return ["evidence" if p in encoded.evidence else "other city" if p in other_cities else "other"
            for p in order[1:3].tolist()]


def summary(records: list[dict]) -> str:
    lines = [f"{len(records)} answered who_lives_where examples; mean drop in log p(answer) when deleting:"]
    lines += [f"  {name}: {np.mean([r['drops'][name] for r in records]):.2f}" for name in DELETIONS]
    for method in sorted({m for r in records for m in r["ranked"]}):
        kinds = [kind for r in records for kind in r["ranked"].get(method, [])]
        shares = ", ".join(f"{kind} {kinds.count(kind) / len(kinds):.0%}" for kind in ("evidence", "other city",
                                                                                        "other"))
        lines.append(f"  {method}, ranks 2-3: {shares}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--out", required=True, help="the JSON file of the per-example results")
    parser.add_argument("--methods", default="cw_knockout_early,attnlrp", help="methods whose ranks 2-3 to read")
    parser.add_argument("--report-only", action="store_true", help="print the summary of a kept --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        print(summary(json.loads(out.read_text(encoding="utf-8"))))
        return
    methods = [name for name in args.methods.split(",") if not unavailable(METHODS[name])]
    for name in set(args.methods.split(",")) - set(methods):
        print(f"{name} skipped: {unavailable(METHODS[name])}", file=sys.stderr)
    examples, settings, _ = answered_examples(args.model)
    model, tokenizer = load_model(args.model)
    records = []
    for example in tqdm([e for e in examples if e.task == "who_lives_where"], desc=args.model):
        encoded = encode_example(tokenizer, example, settings["style"])
        ids = encoded.input_ids[0].tolist()
        rows = [without(encoded, gone) for gone in deletions(encoded).values()]
        full, *deleted = target_logprobs(model, [ids, *rows], encoded.target)
        ranked = {name: rank_kinds(encoded, METHODS[name].score(model, tokenizer, encoded)[0]) for name in methods}
        records.append({"example": example.id, "drops": dict(zip(DELETIONS, (float(full - d) for d in deleted))),
                        "ranked": ranked})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, json.dumps(records, indent=1) + "\n")
    print(summary(records))


if __name__ == "__main__":
    main()
