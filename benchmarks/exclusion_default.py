"""Which ``exclude`` default should TokenContributions have? Pointing with and without exclusions, measured.

    OMP_NUM_THREADS=1 python benchmarks/exclusion_default.py --table docs/PEERS.md

On SmolLM2-135M in the *plain* prompt format (the sources, then the question; no BOS token, so the first context
token is the model's attention sink), for the examples of who_lives_where with 2 distractors and country_of_city
with 3 (``captum_cw.tasks.context``), pointing is whether the top-scoring context token lies in the evidence source
(ties shared, as ``benchmarks/peers.py`` counts it; excluded tokens are left out of the ranking) for
``TokenContributions(metric="cw_inter")`` without a target and with the answer's first token as target, each with
``exclude`` None, ``"first"`` and ``"sinks"``. The table replaces the section between ``<!-- exclusion -->`` and
``<!-- /exclusion -->`` of ``--table``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_methods.encoding import encode_example
from peer_methods.measures import tied_top_share

from captum_cw import TokenContributions
from captum_cw.statistics import mean_interval
from captum_cw.tasks.context import context_examples

TASKS = (("who_lives_where", 2), ("country_of_city", 3))
EXCLUDES = (None, "first", "sinks")
FORMS = ("no target", "target")


def example_rows(model, tokenizer, example, explainers: dict) -> dict[str, float]:
    r"""Pointing of every form and exclusion on one example, whether the model answers it, and where the plain
    score's top context token is (position 0 or not)."""
    encoded = encode_example(tokenizer, example, "plain")
    ids = encoded.input_ids
    context = np.array(encoded.context)
    good = np.isin(context, encoded.evidence)
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    answered = encoded.candidates[int(logits[encoded.candidates].argmax())] == encoded.target  # among the candidates
    row: dict[str, float] = {"answered": float(answered), "first_in_context": float(context[0] == 0),
                             "random": float(good.mean())}
    for form in FORMS:
        target = encoded.target if form == "target" else None
        plain = explainers[None].attribute(ids, target=target)[0].double().numpy()
        for exclude in EXCLUDES:
            scores = plain if exclude is None else explainers[exclude].attribute(ids, target=target)[0].double().numpy()
            left_out = (scores == 0) & (plain != 0)  # exactly the excluded tokens (a computed score is never 0.0)
            values = np.where(left_out, -np.inf, scores)[context]
            row[f"{form}/{exclude}"] = tied_top_share(values, good)
        row[f"{form}/top is position 0"] = float(context[int(np.argmax(plain[context]))] == 0)
    return row


def table(rows: list[dict[str, float]], counts: dict[str, int]) -> str:
    def cell(values: Sequence[float]) -> str:
        found = mean_interval(list(values))
        return f"{found['mean']:.2f} [{found['ci_low']:.2f}, {found['ci_high']:.2f}]"

    lines = [f"SmolLM2-135M, plain prompts, {len(rows)} examples ("
             + ", ".join(f"{task}: {count}" for task, count in counts.items())
             + f"; answered among the candidates: {sum(r['answered'] for r in rows):.0f}). Pointing (top context "
             "token in the evidence source, ties shared), mean with its 95% bootstrap interval; "
             "`TokenContributions(metric=\"cw_inter\")`, layers averaged. A random context token points "
             f"{np.mean([r['random'] for r in rows]):.2f} (the evidence's share of the context).", "",
             "| form | exclude=None | exclude=\"first\" | exclude=\"sinks\" | plain top token is position 0 |",
             "|---|---|---|---|---|"]
    for form in FORMS:
        label = "without target" if form == "no target" else "target = the answer's first token"
        lines.append(f"| {label} | " + " | ".join(cell([r[f"{form}/{e}"] for r in rows]) for e in EXCLUDES)
                     + f" | {np.mean([r[f'{form}/top is position 0'] for r in rows]):.0%} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str, marker: str = "exclusion") -> None:
    r"""Replaces the text between ``<!-- marker -->`` and ``<!-- /marker -->`` of ``path`` (appends it where
    absent)."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    text = path.read_text(encoding="utf-8")
    block = f"{start}\n{section.rstrip()}\n{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--n", type=int, default=20, help="examples per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", default=None, help="a Markdown file whose exclusion section gets the table")
    args = parser.parse_args(argv)
    from captum_cw.models import load_model

    model, tokenizer = load_model("smollm2-135m")
    explainers = {exclude: TokenContributions(model, metric="cw_inter", exclude=exclude) for exclude in EXCLUDES}
    rows, counts = [], {}
    for task, distractors in TASKS:
        examples = context_examples(task, args.n, args.seed, distractors)
        counts[f"{task}:{distractors}"] = len(examples)
        rows += [example_rows(model, tokenizer, e, explainers) for e in tqdm(examples, desc=task)]
    assert all(r["first_in_context"] for r in rows), "plain prompts start with the context"
    section = table(rows, counts)
    print(section)
    if args.table:
        write_section(Path(args.table), section)


if __name__ == "__main__":
    main()
