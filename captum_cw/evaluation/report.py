"""Summaries with bootstrap intervals, CSV/JSON tables and curves."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captum_cw.errors import InputError
from captum_cw.evaluation.agreement import rank_agreement
from captum_cw.evaluation.ranking import MODES, aopc as area_over_curve
from captum_cw.evaluation.records import (
    ChoiceCheck,
    IGCompleteness,
    Kind,
    Record,
    Skipped,
    Summary,
    SummaryRow,
    choice_clean,
    record_kind,
    text_clean,
)
from captum_cw.files import write_atomically, write_json
from captum_cw.metrics import CW_INTER, PAPER_ORDER
from captum_cw.plotting import plot_curves
from captum_cw.statistics import (
    Interval,
    PairedComparison,
    bootstrap_interval,
    mean_interval,
    paired_comparison,
    wilson_interval,
)
from captum_cw.tasks import TASKS

__all__ = ["AT_CHANCE_SHARE", "MIN_EXAMPLES", "agreement_cells", "agreement_matrix",
           "agreement_reference", "aopc_cells", "aopc_header", "bootstrap_interval", "choice_check", "choice_line",
           "ig_completeness", "ig_completeness_line", "order_verdict", "paired_cells", "paired_comparisons",
           "paired_header", "paired_reversals", "paper_order", "summarize", "summary_lines", "summary_rows",
           "summary_warnings", "wilson_interval", "write_report"]

PRIMARY: dict[Kind, str] = {"choice": "prob_drop", "text": "delta_nll"}
AT_CHANCE_SHARE = 0.9  # a model that gives one answer this often is at chance, whatever its accuracy
MIN_EXAMPLES = 30  # fewer examples than this: the bootstrap intervals are unreliable
# the measures compared example by example, and the metrics the others are compared with (the first present)
PAIRED_MEASURES: dict[Kind, tuple[str, ...]] = {"choice": ("prob_drop", "logprob_drop"),
                                                "text": ("delta_nll", "delta_ppl")}
PAIRED_REFERENCES = (CW_INTER.name, "cw_last")  # the layer level's CW, the input level's


def _bin_keys(records: list[Record]) -> list[str]:
    r"""The bins every record holds, in increasing order; records of runs with other bins are refused."""
    keys = {tuple(sorted(by_bin, key=float)) for r in records for modes in r["results"].values()
            for by_bin in modes.values()}
    if len(keys) != 1:
        raise InputError(f"the records hold different bins ({' / '.join(', '.join(k) for k in sorted(keys))}); "
                         "they come from runs with other --bins and cannot be summarised together.")
    return list(keys.pop())


def _curves(records: list[Record], seed: int) -> tuple[dict, dict]:
    r"""Per metric, mode and bin every measure's interval, and per metric and mode its AOPC."""
    bin_keys = _bin_keys(records)
    first = records[0]["results"]
    measures = list(next(iter(first.values()))[MODES[0]][bin_keys[0]])
    bins: dict = {}
    aopc: dict = {}
    for metric in first:
        for mode in MODES:
            for measure in measures:
                per_example = [[r["results"][metric][mode][b][measure] for b in bin_keys] for r in records]
                for index, b in enumerate(bin_keys):
                    bins.setdefault(metric, {}).setdefault(mode, {}).setdefault(b, {})[measure] = mean_interval(
                        [values[index] for values in per_example], seed)
                aopc.setdefault(metric, {}).setdefault(mode, {})[measure] = mean_interval(
                    [area_over_curve(values) for values in per_example], seed)
    return bins, aopc


def paired_comparisons(records: list[Record], kind: Kind) -> dict[str, Any]:
    r"""
    CW against every other metric, example by example: per measure of :data:`PAIRED_MEASURES`, metric and mode,
    the share of examples where CW's AOPC is more faithful (larger comprehensiveness, smaller sufficiency) with
    its Wilson interval, the exact sign test and the Wilcoxon signed-rank test of the paired AOPCs
    (:func:`~captum_cw.statistics.paired_comparison`). CW is the first of :data:`PAIRED_REFERENCES` the records
    rank by (``cw_inter`` at the layer level, ``cw_last`` at the input level).

    Returns:
        ``{"reference": metric, "measures": {measure: {metric: {mode: PairedComparison}}}}``, or ``{}`` without
        a reference and another metric.
    """
    metrics = list(records[0]["results"])
    reference = next((m for m in PAIRED_REFERENCES if m in metrics), None)
    if reference is None or len(metrics) < 2:
        return {}
    bin_keys = _bin_keys(records)
    recorded = records[0]["results"][reference][MODES[0]][bin_keys[0]]
    measures = [measure for measure in PAIRED_MEASURES[kind] if measure in recorded]

    def aopcs(metric: str, mode: str, measure: str) -> list[float]:  # [example]
        return [area_over_curve([r["results"][metric][mode][b][measure] for b in bin_keys]) for r in records]

    return {"reference": reference, "measures": {
        measure: {metric: {mode: paired_comparison(aopcs(reference, mode, measure), aopcs(metric, mode, measure),
                                                   higher_is_better=mode == "comprehensiveness")
                           for mode in MODES}
                  for metric in metrics if metric != reference}
        for measure in measures}}


def _soft(records: list[Record], seed: int) -> dict:
    r"""Per metric and mode every measure's interval under soft removal (records without it: ``{}``)."""
    kept = [r for r in records if "soft" in r]
    if not kept:
        return {}
    return {metric: {mode: {measure: mean_interval([r["soft"][metric][mode][measure] for r in kept], seed)
                            for measure in measures}
                     for mode, measures in modes.items()}
            for metric, modes in kept[0]["soft"].items()}


def _answered(record: Record) -> bool:
    r"""Whether the model answers a multiple-choice record correctly (its clean prediction is the label)."""
    return choice_clean(record)["prediction"] == record["label"]


def choice_check(records: list[Record], answers: Sequence[str] = ()) -> ChoiceCheck:
    r"""
    Whether the model does better than chance on multiple-choice records. ``at_chance`` (not shown to beat
    chance) when the lower end of the accuracy's 95% Wilson interval is at or below chance (the mean over
    examples of 1 / number of choices), or when one answer makes at least ``AT_CHANCE_SHARE`` (90%) of the
    model's predictions.
    """
    n = len(records)
    correct = sum(_answered(r) for r in records)
    low, high = wilson_interval(correct, n)
    chance = float(np.mean([1 / len(choice_clean(r)["logliks"]) for r in records]))
    answer, count = Counter(choice_clean(r)["prediction"] for r in records).most_common(1)[0]
    majority = Counter(r["label"] for r in records).most_common(1)[0][1]
    check = ChoiceCheck(accuracy=correct / n, accuracy_low=low, accuracy_high=high, chance=chance,
                        most_frequent_answer=int(answer), most_frequent_share=count / n,
                        majority_label_share=majority / n,
                        at_chance=bool(low <= chance or count / n >= AT_CHANCE_SHARE))
    if int(answer) < len(answers):
        check["most_frequent_answer_name"] = answers[int(answer)]
    return check


def _answer_name(check: ChoiceCheck) -> str:
    r"""The most frequent answer as the task names it ("A", "yes"), else its index."""
    return check.get("most_frequent_answer_name", str(check["most_frequent_answer"]))


def summary_warnings(summary: Summary) -> list[str]:
    r"""What makes a summary's numbers unreliable, one sentence each (empty when nothing does)."""
    warnings = []
    n = summary["n_examples"]
    if n < MIN_EXAMPLES:
        warnings.append(f"only {n} examples: below {MIN_EXAMPLES} the 95% intervals are unreliable.")
    check = summary.get("choice_check")
    if check is not None and check["at_chance"]:
        if check["most_frequent_share"] >= AT_CHANCE_SHARE:
            warnings.append(f"the model is at chance: it gives answer {_answer_name(check)} to "
                            f"{check['most_frequent_share']:.0%} of the examples.")
        else:
            warnings.append(f"the model is at chance: clean accuracy {check['accuracy']:.3f} (95% interval "
                            f"[{check['accuracy_low']:.3f}, {check['accuracy_high']:.3f}]) is not above chance "
                            f"({check['chance']:.3f}); see the AOPCs over the examples it answers correctly.")
    correct = summary.get("correct")
    if correct is not None and 0 < correct["n_examples"] < MIN_EXAMPLES <= n:
        warnings.append(f"only {correct['n_examples']} examples answered correctly: below {MIN_EXAMPLES} the "
                        "intervals of their AOPCs are unreliable.")
    return warnings


def summarize(records: list[Record], seed: int = 0, answers: Sequence[str] = ()) -> Summary:
    r"""
    Per metric, mode and bin the mean of every measure with a 95% bootstrap
    interval over examples; per metric and mode the AOPC (the mean over bins,
    taken per example first), and the soft modes' measures when the records hold them.

    Multiple choice adds the clean accuracy against chance (:func:`choice_check`; ``answers`` name the
    choices, e.g. a task's :attr:`~captum_cw.tasks.Task.answers`) and the same AOPCs over the examples the
    model answers correctly (``"correct"``). ``"paired"`` compares CW with every other metric example by
    example (:func:`paired_comparisons`). Records with ``rankings`` add the
    rank agreement of every pair of metrics. ``"warnings"`` says what makes the numbers unreliable.
    """
    if not records:  # no examples: no kind, primary measure or paper order to state
        return {"n_examples": 0, "bins": {}, "aopc": {}, "warnings": []}  # type: ignore[typeddict-item]
    kinds = {record_kind(r) for r in records}
    if len(kinds) > 1:
        raise InputError("the records mix multiple-choice and text examples; summarise one task at a time.")
    kind = kinds.pop()
    bins, aopc = _curves(records, seed)
    # paper_order and warnings, required, are set below, once the rest is there to judge
    summary: Summary = {"n_examples": len(records), "kind": kind, "primary": PRIMARY[kind], "bins": bins,
                        "aopc": aopc}  # type: ignore[typeddict-item]
    if soft := _soft(records, seed):
        summary["soft"] = soft
    if kind == "choice":
        summary["clean_accuracy"] = mean_interval([float(_answered(r)) for r in records], seed)
        summary["choice_check"] = choice_check(records, answers)
        correct = [r for r in records if _answered(r)]
        summary["correct"] = {"n_examples": len(correct), "aopc": _curves(correct, seed)[1] if correct else {}}
        if soft and correct:
            summary["correct"]["soft"] = _soft(correct, seed)
        if correct and (paired_correct := paired_comparisons(correct, kind)):
            summary["correct"]["paired"] = paired_correct
    else:
        summary["clean_nll"] = mean_interval([text_clean(r)["nll"] for r in records], seed)
    if paired := paired_comparisons(records, kind):
        summary["paired"] = paired
    summary["paper_order"] = paper_order(aopc, PRIMARY[kind])
    completeness = [r["ig_completeness"] for r in records if "ig_completeness" in r]
    if completeness:
        summary["ig_completeness"] = ig_completeness(completeness)
    if agreement := rank_agreement(records, lambda values: mean_interval(values, seed)):
        summary["rank_agreement"] = agreement
    summary["warnings"] = summary_warnings(summary)
    return summary


def ig_completeness(checks: Sequence[IGCompleteness]) -> dict[str, float]:
    r"""
    How far IG's attributions are from summing to f(input) - f(baseline), over examples:
    medians of ``|attribution_sum - output_change|`` and of ``|output_change|``.
    """
    gaps = [abs(c["attribution_sum"] - c["output_change"]) for c in checks]
    return {"n": len(checks), "median_abs_gap": float(np.median(gaps)),
            "median_abs_output_change": float(np.median([abs(c["output_change"]) for c in checks]))}


def ig_completeness_line(summary: Mapping[str, Any]) -> str:
    r"""One sentence on IG's completeness for a summary that has it, else ``""``."""
    if "ig_completeness" not in summary:
        return ""
    check = summary["ig_completeness"]
    return (f"IG completeness ({check['n']} of {summary['n_examples']} examples record it): median "
            f"|sum of attributions - (f(x) - f(baseline))| = {check['median_abs_gap']:.3g}, against a median "
            f"|f(x) - f(baseline)| of {check['median_abs_output_change']:.3g}.")


def _number(value: float | None) -> float:
    r"""A number of a summary; None (an undefined value, as summary.json stores NaN) is NaN again."""
    return math.nan if value is None else value


def _cell(row: Interval) -> str:
    return f"{_number(row['mean']):.4f} [{_number(row['ci_low']):.4f}, {_number(row['ci_high']):.4f}]"


def aopc_header(summary: Summary) -> list[str]:
    r"""The column names of :func:`aopc_cells` after the metric's: ERASER's AOPCs, then the soft modes if run."""
    measure = summary["primary"]
    header = [f"comprehensiveness AOPC ({measure})", f"sufficiency AOPC ({measure})"]
    if "soft" in summary:
        header += [f"soft comprehensiveness ({measure})", f"soft sufficiency ({measure})"]
    return header


def aopc_cells(summary: Summary, subset: str = "all") -> list[tuple[str, ...]]:
    r"""
    Per metric, its comprehensiveness and sufficiency AOPC of the primary measure as ``"mean [low, high]"``,
    followed by its soft comprehensiveness and sufficiency when the run has them.

    Args:
        summary (Summary): as :func:`summarize` returns it.
        subset (str, optional): ``"all"`` examples, or ``"correct"``: those the model answers correctly
                    (multiple choice). Default: ``"all"``
    """
    measure = summary["primary"]
    part: Mapping[str, Any] = summary if subset == "all" else summary.get("correct", {"aopc": {}})
    soft = part.get("soft", {})
    return [(metric, *(_cell(modes[m][measure]) for m in MODES),
             *(_cell(soft[metric][m][measure]) for m in MODES if metric in soft))
            for metric, modes in part["aopc"].items()]


def _p_value(p: float) -> str:
    return "n/a" if p != p else f"{p:.1e}" if p < 0.001 else f"{p:.3f}"


def paired_header() -> list[str]:
    r"""The column names of :func:`paired_cells` (``wins``: the share of examples where CW is more faithful)."""
    return ["metric", "measure", *(name for mode in MODES for name in (f"{mode} wins", "sign p", "Wilcoxon p"))]


def paired_cells(summary: Summary, subset: str = "all") -> list[tuple[str, ...]]:
    r"""
    Per metric other than CW and per paired measure: in each mode, the share of examples where CW is more
    faithful as ``"win rate [low, high]"``, the sign test's and the Wilcoxon test's two-sided p-values
    (:func:`paired_comparisons`); no rows where the summary has no comparison.

    Args:
        summary (Summary): as :func:`summarize` returns it.
        subset (str, optional): ``"all"`` examples, or ``"correct"``: those the model answers correctly
                    (multiple choice). Default: ``"all"``
    """
    part: Mapping[str, Any] = summary if subset == "all" else summary.get("correct", {})
    paired = part.get("paired", {}).get("measures", {})
    rows = []
    for metric in next(iter(paired.values()), {}):
        for measure, by_metric in paired.items():
            cells = []
            for mode in MODES:
                row = by_metric[metric][mode]
                cells += [f"{row['win_rate']:.2f} [{row['win_low']:.2f}, {row['win_high']:.2f}]",
                          _p_value(row["sign_p"]), _p_value(row["wilcoxon_p"])]
            rows.append((metric, measure, *cells))
    return rows


def _clear_majority(row: PairedComparison) -> int:
    r"""+1 where CW is more faithful on a clear majority of the examples that are not tied (the 95% Wilson interval
    of its wins among them lies above 50%), -1 where on a clear minority (it lies below), 0 where the split cannot
    be told from even."""
    decided = row["n"] - row["ties"]
    if decided == 0:
        return 0
    low, high = wilson_interval(row["wins"], decided)
    return 1 if low > 0.5 else -1 if high < 0.5 else 0


def paired_reversals(summary: Summary) -> list[str]:
    r"""
    Where the evidence points two ways, one sentence each: CW's mean AOPC is the more faithful while CW is more
    faithful on a clear minority of the examples (or the other way round), and CW is more faithful on a clear
    majority of the examples by one measure but on a clear minority by another (ΔNLL against ΔPPL). A split
    is clear when the 95% Wilson interval of CW's wins among the examples that are not tied lies wholly on one
    side of 50%: a near-even split, or a handful of examples, reverses nothing.
    """
    paired = summary.get("paired")
    if not paired:
        return []
    reference, unit = paired["reference"], "texts" if summary["kind"] == "text" else "examples"
    measures: dict[str, dict[str, dict[str, PairedComparison]]] = paired["measures"]
    sentences = []
    for measure, by_metric in measures.items():
        for metric, modes in by_metric.items():
            for mode, row in modes.items():
                if row["mean_difference"] * _clear_majority(row) >= 0:  # they agree, or the split is not clear
                    continue
                losses = row["n"] - row["wins"] - row["ties"]
                sentences.append(
                    f"{mode} ({measure}): {reference}'s mean AOPC is "
                    f"{'more' if row['mean_difference'] > 0 else 'less'} faithful than {metric}'s, but {reference} "
                    f"is more faithful on {row['win_rate']:.0%} of the {unit} (95% interval [{row['win_low']:.0%}, "
                    f"{row['win_high']:.0%}]) and less on {losses / row['n']:.0%}; sign test p = "
                    f"{_p_value(row['sign_p'])}.")
    names = list(measures)
    for first, second in zip(names, names[1:]):
        for metric in measures[first]:
            for mode in MODES:
                a, b = measures[first][metric][mode], measures[second][metric][mode]
                if _clear_majority(a) * _clear_majority(b) < 0:
                    sentences.append(
                        f"{mode}: {reference} is more faithful than {metric} on {a['win_rate']:.0%} of the {unit} "
                        f"by {first} but on {b['win_rate']:.0%} by {second} (95% intervals [{a['win_low']:.0%}, "
                        f"{a['win_high']:.0%}] and [{b['win_low']:.0%}, {b['win_high']:.0%}]).")
    return sentences


def _pair(table: dict, a: str, b: str) -> Interval | None:
    r"""The agreement of ``a`` and ``b`` in a table that stores each pair once, under either metric."""
    return table.get(a, {}).get(b) or table.get(b, {}).get(a)


def agreement_matrix(summary: Summary, statistic: str = "kendall") -> list[list[str]]:
    r"""
    The mean ``statistic`` (``"kendall"`` or ``"spearman"``) between every two ranked metrics: a header row of
    their names, then one row per metric (1 on the diagonal, blank where a pair was not ranked on any example).
    Empty without rank agreement.
    """
    table = summary.get("rank_agreement", {}).get(statistic, {})
    ranked = {metric for pairs in table.values() for metric in pairs} | set(table)
    metrics = [metric for metric in summary["aopc"] if metric in ranked]
    if not metrics:
        return []

    def mean(a: str, b: str) -> str:
        row = _pair(table, a, b)
        return "1" if a == b else f"{row['mean']:.3f}" if row and row["n"] else ""

    return [["", *metrics]] + [[a, *(mean(a, b) for b in metrics)] for a in metrics]


def agreement_cells(summary: Summary, reference: str) -> list[tuple[str, str, str]]:
    r"""Per other metric, its Kendall tau and Spearman rho with ``reference`` (``"mean [low, high]"``)."""
    agreement = summary.get("rank_agreement", {})
    rows = []
    for metric in summary["aopc"]:
        cells = []
        for statistic in ("kendall", "spearman"):
            table = agreement.get(statistic, {})
            row = _pair(table, reference, metric)
            cells.append(_cell(row) if row and row["n"] else "")
        tau, rho = cells
        if metric != reference and (tau or rho):
            rows.append((metric, tau, rho))
    return rows


def choice_line(summary: Summary) -> str:
    r"""The clean accuracy against chance and the most frequent answer, in one sentence ("" for text)."""
    check = summary.get("choice_check")
    if check is None:
        return ""
    return (f"clean accuracy {check['accuracy']:.3f} (95% Wilson interval [{check['accuracy_low']:.3f}, "
            f"{check['accuracy_high']:.3f}]) against chance {check['chance']:.3f}; the model's most frequent "
            f"answer ({_answer_name(check)}) makes {check['most_frequent_share']:.0%} of its predictions "
            f"(most frequent correct answer: {check['majority_label_share']:.0%}); "
            f"{summary.get('correct', {}).get('n_examples', 0)} answered correctly"
            f"{': at chance' if check['at_chance'] else ''}.")


def agreement_reference(summary: Summary) -> str | None:
    r"""The metric rank agreement is reported against: IG if ranked, else CW (inter-head), else the first."""
    agreement = summary.get("rank_agreement", {}).get("kendall")
    if not agreement:
        return None
    ranked = list(agreement) + [b for pairs in agreement.values() for b in pairs]
    return next((m for m in ("ig", CW_INTER.name) if m in ranked), ranked[0])


def summary_lines(summary: Summary, task: str) -> list[str]:
    r"""The summary as the command line prints it: warnings, clean accuracy against chance, AOPC tables
    (all examples, then those answered correctly), CW against each metric example by example (and where that
    reverses the means), rank agreement and IG's completeness."""
    measure = summary["primary"]
    header = ["metric", *aopc_header(summary)]
    widths = [20] + [max(26, len(name)) for name in header[1:]]

    def table(rows: list[tuple[str, ...]]) -> list[str]:
        return ["  ".join(f"{cell:>{width}}" for cell, width in zip(row, widths)) for row in [tuple(header), *rows]]

    lines = [f"{task}: {summary['n_examples']} examples; AOPC of {measure} (95% bootstrap interval)"]
    lines += [f"warning: {warning}" for warning in summary.get("warnings", [])]
    if check := choice_line(summary):
        lines.append(check[0].upper() + check[1:])
    lines += table(aopc_cells(summary))
    correct = summary.get("correct")
    if correct is not None and correct["n_examples"]:
        k = correct["n_examples"]
        lines += ["", f"The {k} example{'s' if k != 1 else ''} the model answers correctly:"]
        lines += table(aopc_cells(summary, "correct"))
    if paired := paired_cells(summary):
        reference = summary["paired"]["reference"]
        rows = [tuple(paired_header()), *paired]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines += ["", f"{reference} against each metric, example by example (wins: the share of examples where "
                  f"{reference}'s AOPC is more faithful, 95% Wilson interval; two-sided sign and Wilcoxon "
                  "signed-rank tests):"]
        lines += ["  ".join(f"{cell:>{width}}" for cell, width in zip(row, widths)) for row in rows]
        lines += [f"reversal: {sentence}" for sentence in paired_reversals(summary)]
    if reference := agreement_reference(summary):
        lines += ["", f"Rank agreement with {reference} (mean over examples, 95% bootstrap interval):",
                  f"{'metric':>20}  {'Kendall tau':>26}  {'Spearman rho':>26}"]
        lines += [f"{metric:>20}  {tau:>26}  {rho:>26}" for metric, tau, rho in agreement_cells(summary, reference)]
    if completeness := ig_completeness_line(summary):
        lines.append(completeness)
    return lines


def paper_order(aopc: dict, measure: str) -> dict[str, Any]:
    r"""
    Whether attention < value-weighted < output-normalised < CW holds (:data:`captum_cw.metrics.PAPER_ORDER`;
    higher comprehensiveness, lower sufficiency is more faithful): ``holds`` by the AOPC means, ``separated``
    also with every step's 95% intervals apart. Both are None with fewer than two of these metrics.
    """
    present = [m for m in PAPER_ORDER if m in aopc]
    result = {}
    for mode, better_is_higher in (("comprehensiveness", True), ("sufficiency", False)):
        rows = [aopc[m][mode][measure] for m in present]
        pairs = list(zip(rows, rows[1:])) if better_is_higher else [(b, a) for a, b in zip(rows, rows[1:])]
        holds = [_number(upper["mean"]) > _number(lower["mean"]) for lower, upper in pairs]
        separated = [_number(upper["ci_low"]) > _number(lower["ci_high"]) for lower, upper in pairs]
        result[mode] = {"metrics": present, "aopc": [row["mean"] for row in rows],
                        "holds": all(holds) if pairs else None, "separated": all(separated) if pairs else None}
    return result


def order_verdict(order: dict[str, Any]) -> str:
    r"""``paper_order(...)[mode]`` in words."""
    if order["holds"] is None:
        return "not applicable"
    if not order["holds"]:
        return "does not hold"
    if order["separated"]:
        return "holds, every step with separated intervals"
    return "holds by the means (intervals overlap)"


def summary_rows(summary: Summary, task: str) -> list[SummaryRow]:
    r"""
    The rows of ``summary.csv`` (see :func:`write_report`): over all examples each metric's AOPC followed by its
    bins, per mode and measure; then the soft modes; then the AOPCs and soft modes over the examples answered
    correctly.
    """
    def row(metric: str, mode: str, b: str, measure: str, interval: Interval, examples: str) -> SummaryRow:
        return SummaryRow(task, metric, mode, b, measure, interval["mean"], interval["ci_low"], interval["ci_high"],
                          interval["n"], examples)

    rows = []
    for metric, modes in summary["aopc"].items():
        for mode, measures in modes.items():
            for measure, interval in measures.items():
                rows.append(row(metric, mode, "AOPC", measure, interval, "all"))
                rows += [row(metric, mode, b, measure, by_measure[measure], "all")
                         for b, by_measure in summary["bins"][metric][mode].items()]
    parts: list[tuple[str, str, Mapping[str, Any]]] = [
        ("all", "soft", summary), ("correct", "aopc", summary.get("correct", {})),
        ("correct", "soft", summary.get("correct", {}))]
    for examples, name, part in parts:
        rows += [row(metric, mode, "AOPC" if name == "aopc" else "soft", measure, interval, examples)
                 for metric, modes in part.get(name, {}).items() for mode, measures in modes.items()
                 for measure, interval in measures.items()]
    return rows


def _summary_csv(summary: Summary, task: str) -> str:
    r"""The text of ``summary.csv`` (:func:`summary_rows`), built whole before it is written."""
    handle = io.StringIO(newline="")
    writer = csv.writer(handle)
    writer.writerow(SummaryRow.columns())
    for row in summary_rows(summary, task):
        writer.writerow(row.cells())
    return handle.getvalue()


def write_report(records: list[Record | Skipped], config, out: Path) -> Summary:
    r"""
    Writes ``summary.json``, ``summary.csv`` and ``curves.png`` under ``out``; returns the summary.
    Records of skipped examples (``{"id", "skipped": reason}``) are listed under ``"skipped"``, not summarised.

    ``summary.csv`` has a row per metric, mode, bin (``AOPC`` for the area, ``soft`` for a soft mode) and
    measure; its last column says over which ``examples``: ``all``, or ``correct`` (multiple choice: those
    the model answers correctly, AOPC and soft rows only).
    """
    skipped = [{"id": r["id"], "reason": r["skipped"]} for r in records if "skipped" in r]
    scored = [r for r in records if "skipped" not in r]
    summary = summarize(scored, seed=config.protocol.seed, answers=TASKS[config.task].answers)
    summary["skipped"] = skipped
    summary["config"] = config.to_json()
    write_json(out / "summary.json", summary, indent=2)
    write_atomically(out / "summary.csv", _summary_csv(summary, config.task))
    if scored:
        plot_curves(summary, out / "curves.png", title=f"{config.model} on {config.task} ({len(scored)} examples)",
                    modes=MODES)
    return summary
