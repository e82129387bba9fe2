"""The ``captum-cw`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

__all__ = ["main"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _attribute(args: argparse.Namespace) -> int:
    from captum_cw.attribution import AttentionWeights, ContributionWeights
    from captum_cw.models import load_model
    from captum_cw.plotting import plot_layer_token_heatmaps

    model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES.get(args.dtype))
    ids = tokenizer(args.text, return_tensors="pt")["input_ids"]
    attributors = {
        "contribution (inter)": ContributionWeights(model, variant="inter"),
        "contribution (intra)": ContributionWeights(model, variant="intra"),
        "attention": AttentionWeights(model),
    }
    rows = {}
    for name, attributor in attributors.items():
        scores, _, output = attributor.attribute_with_output(ids, query_positions=[-1])
        rows[name] = scores[0, :, 0]  # [layer, key]
    tokens = [tokenizer.decode([token]) for token in ids[0].tolist()]
    predicted = tokenizer.decode(output.logits[0, -1].argmax()) if hasattr(output, "logits") else ""
    print(f"Scores of each token for the last position (next token predicted: {predicted!r}), mean over layers:")
    names = list(rows)
    print(f"{'token':>16}  " + "  ".join(f"{name:>20}" for name in names))
    for position, token in enumerate(tokens):
        cells = "  ".join(f"{rows[name][:, position].mean().item():>20.4f}" for name in names)
        print(f"{token!r:>16}  {cells}")
    path = plot_layer_token_heatmaps(rows, tokens, args.out, title=f"{args.model}: last position")
    print(f"heatmap written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captum-cw", description="Contribution weights for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)
    attribute = commands.add_parser("attribute", help="score every token of a text for its last position")
    attribute.add_argument("text")
    attribute.add_argument("--model", default="smollm2-135m", help="smollm2-135m (offline), a local path or hub id")
    attribute.add_argument("--out", default="captum_cw_heatmap.png", help="where to write the heatmap PNG")
    attribute.add_argument("--device", default=None)
    attribute.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    attribute.set_defaults(run=_attribute)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
