"""Where along the knockout path the gradient predicts half-ablations best: the probe behind ``cw_knockout``.

On the answered ground-truth examples of a peers run (``RUNS/MODEL``, default ``benchmarks/runs/peers``; another
task's run with ``--tasks`` and ``--n``), reads the gradient of log p(answer) (of the log-odds against the run's
foil where the run is a ``--contrast`` one) with respect to each context token's key gate (every layer and row,
renormalised) with every context token's gate at one point ``t`` (1: the model as it is; 1/2: ``cw_knockout``), and
scores it as docs/PEERS.md does: pointing, and the LDS over the same 16 seeded half-ablations as the peers run,
sign-tested example by example against the LDS the run recorded for ``--compare``'s methods. Each point's scores
summed over the context (``gradient_sum``: the path's integrand there) show where along the path the gradient lies.

A point ``igK`` is the mean of the gradients at the ``K`` midpoints of the path (Integrated Gradients with ``K``
steps, ``2K`` passes). ``adaptive`` reads one gate per example, ``(1 - c) / (2 - c)`` with ``c`` the context's share
of the explained row's attention; ``randK`` reads each source's tokens knocked out (0.05) amid ``K`` random halves
of the other sources and their complements (``2K`` forward and backward passes, each source read ``K`` times). A
point with the suffix ``:lrp`` (``0.5:lrp``) reads the gradient with AttnLRP's rules bound on the model (lxt's,
``peer_methods.attnlrp``: the norms' scales and the MLPs' gates held constant in the backward pass, the gradient
into queries, keys and values divided by 4, 4 and 2). The gate here is built independently of the package: the
model's eager attention reads a 4D float mask holding causality and ``log t`` on the context's keys.
``cw_target`` and ``cw_target_magnitude`` are scored beside it.

Usage::

    python benchmarks/knockout_points.py --model gemma-3-270m --points 1,0.75,0.5,0.25 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m.json
    python benchmarks/knockout_points.py --model gemma-3-270m --points 0.5,ig2,ig4,ig8 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m-steps.json
    python benchmarks/knockout_points.py --model gemma-3-270m --points 0.2,0.1,0.05 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m-low.json
    python benchmarks/knockout_points.py --model gemma-3-270m --points 1,0.5,1:lrp,0.5:lrp --limit 30 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m-lrp.json
    python benchmarks/knockout_points.py --model gemma-3-270m --runs benchmarks/runs/peers_heldout \\
        --points 1,0.5,0.25,0.1,0.05 --out benchmarks/runs/knockout_points/gemma-3-270m-heldout.json
    python benchmarks/knockout_points.py --model gemma-3-270m --points 0.05,adaptive,rand2 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m-other.json
    python benchmarks/knockout_points.py --model gemma-3-270m --runs benchmarks/runs/peers_sentiment_contrast \\
        --tasks review_sentiment:2 --n 40 --points 1,0.5,0.25,0.1,0.05,ig4 \\
        --out benchmarks/runs/knockout_points/gemma-3-270m-contrast.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import AttentionInterface

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_methods.encoding import encode_example
from peer_methods.measures import explained_value, lds, lds_ablations, lds_seed, source_scores, tied_top_share
from peer_methods.methods import METHODS
from peers import answered, answered_in, contrasted, read_results, sign_test

from captum_cw.models import load_model

RUNS = Path(__file__).resolve().parent / "runs" / "peers"
TASKS = {"smollm2-135m": [("who_lives_where:2,country_of_city:3", 35), ("job_of_description:2", 30)],
         "gemma-3-270m": [("who_lives_where:2,country_of_city:3", 40), ("job_of_description:2", 30)]}


def answered_examples(model_name: str, runs: Path = RUNS, tasks: list[tuple[str, int]] | None = None) -> tuple[
        list, dict, list[dict]]:
    r"""The examples the model answered in its peers run ``runs/MODEL`` (``tasks``, ``[(spec, n)]``, default
    ``TASKS``' settings; :func:`peers.answered_in`), the run's settings (prompt style, seed, target) and its
    records."""
    folder = runs / model_name
    examples, settings = answered_in(folder, tasks or TASKS[model_name])
    return examples, settings, read_results(folder / "results.jsonl")


def gates_gradient(model, encoded, gates: np.ndarray) -> np.ndarray:
    r"""``(n,)`` d log p(answer) (with a foil, the log-odds) / d gate of every token, with token ``j``'s key gated by
    ``gates[j]`` ``(n,)``."""
    n = encoded.n
    log_gate = torch.tensor(np.log(gates), dtype=torch.float32).requires_grad_()  # [n]
    causal = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)  # [n, n]
    mask = (causal + log_gate[None, :])[None, None]  # [1, 1, n, n]
    logits = model(input_ids=encoded.input_ids, attention_mask=mask, logits_to_keep=1).logits[0, -1]
    objective = explained_value(logits.float().log_softmax(-1)[None], encoded.target, encoded.foil)[0]
    (gradient,) = torch.autograd.grad(objective, log_gate)
    return gradient.double().numpy() / gates  # d/d gate = d/d log gate / gate


def gate_gradient(model, encoded, point: float) -> np.ndarray:
    r"""``(n,)`` d log p(answer) (with a foil, the log-odds) / d gate of each context token, every context gate at
    ``point`` (0 elsewhere)."""
    gates = np.ones(encoded.n)
    gates[encoded.context] = point
    scores = np.zeros(encoded.n)
    scores[encoded.context] = gates_gradient(model, encoded, gates)[encoded.context]
    return scores


_MIXTURE: dict[str, torch.Tensor] = {}  # "gate" (n,), "context" (n,) bool: the mixture path's state


def _mixture_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None, **kwargs):
    r"""Eager attention whose rows mix the model's weights with the context deleted: each context key's weight
    ``alpha_ij`` scaled by its gate ``t_j``, the removed mass ``sum_j (1 - t_j) alpha_ij`` given to the other keys
    in proportion to their weights (at ``t = 0`` the row renormalised without the context, as deleting it reads)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # [b, h, n, d]
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling  # [b, h, q, k]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if attention_mask is None:  # causality left to the kernel
        attention_mask = torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device).tril()
    attention_mask = attention_mask[..., : key.shape[-2]]
    if attention_mask.dtype == torch.bool:  # the keys each row may read (sdpa's form)
        logits = logits.masked_fill(~attention_mask, torch.finfo(logits.dtype).min)
    else:
        logits = logits + attention_mask
    alpha = logits.softmax(-1, dtype=torch.float32).to(query.dtype)
    gate, context = _MIXTURE["gate"].to(alpha.dtype), _MIXTURE["context"]  # [k]
    removed = (alpha * (1 - gate)).sum(-1, keepdim=True)  # [b, h, q, 1]
    others = (alpha * ~context).sum(-1, keepdim=True).clamp_min(torch.finfo(alpha.dtype).tiny)
    weights = torch.where(context, alpha * gate, alpha * (1 + removed / others))
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


AttentionInterface.register("knockout_mixture", _mixture_attention)


def mixture_gradient(model, encoded, point: float) -> np.ndarray:
    r"""``(n,)`` d log p(answer) (with a foil, the log-odds) / d t of each context token along the mixture path
    (every context gate at ``point``): each row's weights move linearly from the model's (1) to the context deleted
    (0)."""
    n = encoded.n
    context = torch.zeros(n, dtype=torch.bool)
    context[encoded.context] = True
    gate = torch.where(context, point, 1.0).requires_grad_()  # [n]
    _MIXTURE.update(gate=gate, context=context)
    model.set_attn_implementation("knockout_mixture")
    try:
        logits = model(input_ids=encoded.input_ids, logits_to_keep=1).logits[0, -1]
        objective = explained_value(logits.float().log_softmax(-1)[None], encoded.target, encoded.foil)[0]
        (gradient,) = torch.autograd.grad(objective, gate)
    finally:
        model.set_attn_implementation("eager")
    scores = np.zeros(n)
    scores[encoded.context] = gradient[encoded.context].double().numpy()
    return scores


def adaptive_point(model, encoded) -> float:
    r"""``(1 - c) / (2 - c)``, ``c`` the context's share of the explained row's attention (mean over layers and
    heads): the gate at which a row with that share keeps half of it, ``t c / (t c + 1 - c) = c / 2``."""
    with torch.no_grad():
        attentions = model(input_ids=encoded.input_ids, output_attentions=True).attentions  # [1, h, n, n] each
    share = torch.stack([a[0, :, -1, encoded.context].float().sum(-1).mean() for a in attentions]).mean().item()
    return (1 - share) / (2 - share)


def random_contexts_gradient(model, encoded, pairs: int, knocked: float = 0.05) -> np.ndarray:
    r"""``(n,)`` each context token's gate gradient where its source is knocked out (gate ``knocked``) and each other
    source kept or knocked out at random: ``pairs`` random source subsets and their complements (each source
    knocked out in exactly one of a pair), the mean of a token's readings."""
    n, sources = encoded.n, encoded.sources
    rng = np.random.default_rng(lds_seed(encoded.example.id) + 1)  # not the LDS ablations' own draw
    total, count = np.zeros(n), np.zeros(n)
    for _ in range(pairs):
        kept = rng.random(len(sources)) < 0.5
        for subset in (kept, ~kept):
            gates = np.ones(n)
            for source, keep in zip(sources, subset, strict=True):
                gates[source] = 1.0 if keep else knocked
            out = gates < 1
            total[out] += gates_gradient(model, encoded, gates)[out]
            count[out] += 1
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


def path_gradient(model, encoded, point: str) -> np.ndarray:
    r"""``gate_gradient`` at a point (``"0.5"``), or its mean over the ``K`` midpoints of the path (``"igK"``);
    through AttnLRP's rules with the suffix ``":lrp"``; at :func:`adaptive_point` (``"adaptive"``); or
    :func:`random_contexts_gradient` with ``K`` pairs (``"randK"``)."""
    if point == "adaptive":
        return gate_gradient(model, encoded, adaptive_point(model, encoded))
    if point.startswith("rand"):
        return random_contexts_gradient(model, encoded, int(point[4:]))
    if point.endswith(":lrp"):
        from peer_methods.attnlrp import attnlrp_rules

        with attnlrp_rules(model):
            return path_gradient(model, encoded, point.removesuffix(":lrp"))
    if point.startswith("mix"):
        return mixture_gradient(model, encoded, float(point[3:]))
    if not point.startswith("ig"):
        return gate_gradient(model, encoded, float(point))
    steps = int(point[2:])
    return np.mean([gate_gradient(model, encoded, (k + 0.5) / steps) for k in range(steps)], axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(TASKS))
    parser.add_argument("--points", default="1,0.75,0.5,0.25")
    parser.add_argument("--limit", type=int, help="the first LIMIT answered examples only (a quick probe)")
    parser.add_argument("--runs", default=str(RUNS), help="the folder of the peers runs (RUNS/MODEL) to read")
    parser.add_argument("--tasks", help="the run's --tasks (with --n), where it is not TASKS' fact lookups")
    parser.add_argument("--n", type=int, default=40, help="the run's --n (with --tasks; TASKS' own without)")
    parser.add_argument("--compare", default="cw_knockout,attnlrp,feature_ablation,contextcite_32",
                        help="the run's methods whose LDS each point is sign-tested against, example by example")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    points = args.points.split(",")
    examples, settings, records = answered_examples(args.model, Path(args.runs),
                                                    [(args.tasks, args.n)] if args.tasks else None)
    examples = examples[:args.limit]
    model, tokenizer = load_model(args.model, attn_implementation="eager")
    rows = []
    for example in tqdm(examples, desc=args.model):
        encoded = encode_example(tokenizer, example, settings["style"])
        if settings.get("target") == "contrast":  # the run's own foil: the log-odds, in every reading and the LDS
            encoded = contrasted(encoded, answered(model, encoded)[0])
        ablations = lds_ablations(model, encoded, 16, lds_seed(example.id))  # the peers run's own ablations
        scores = {point if point.startswith(("ig", "mix", "rand", "adaptive")) or point.endswith(":lrp")
                  else f"gate {float(point):g}":
                  path_gradient(model, encoded, point) for point in points}
        scores.update({name: METHODS[name].score(model, tokenizer, encoded)[0]
                       for name in ("cw_target", "cw_target_magnitude")})
        context = np.asarray(encoded.context)
        evidence = np.isin(context, encoded.evidence)
        row = {"id": example.id, "task": example.task}
        for name, values in scores.items():
            row[name] = {"lds": lds(source_scores(encoded, values, "token"), ablations),
                         "pointing": tied_top_share(values[context], evidence),
                         "gradient_sum": float(values[context].sum())}
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows) + "\n", encoding="utf-8")
    for name in [key for key in rows[0] if key not in ("id", "task")]:
        mean_lds = np.nanmean([row[name]["lds"] for row in rows])
        pointing = np.mean([row[name]["pointing"] for row in rows])
        total = np.median([row[name]["gradient_sum"] for row in rows])
        print(f"{name}: n {len(rows)}, LDS {mean_lds:.3f}, pointing {pointing:.3f}, median score sum {total:.3g}")
    recorded = {(r["method"], r["example"]): r.get("lds") for r in records if r["method"] in args.compare.split(",")}
    for name in [key for key in rows[0] if key not in ("id", "task")]:
        for method in args.compare.split(","):
            shared = [row for row in rows if (method, row["id"]) in recorded]
            wins, losses, p = sign_test([row[name]["lds"] for row in shared],
                                        [recorded[method, row["id"]] for row in shared])
            print(f"{name} against {method}'s LDS: wins/losses {wins}/{losses}, p = {p:.2g}")


if __name__ == "__main__":
    main()
