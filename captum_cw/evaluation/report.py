"""Summaries with bootstrap intervals, CSV/JSON tables and curves."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from captum_cw.evaluation.ranking import MODES, aopc as area_over_curve

__all__ = ["aopc_cells", "bootstrap_interval", "ig_completeness", "ig_completeness_line", "order_verdict",
           "paper_order", "summarize", "write_report", "PAPER_ORDER"]

PAPER_ORDER = ("attention", "value_weighted", "output_normalized", "cw_inter")
PRIMARY = {"choice": "prob_drop", "text": "delta_nll"}


def bootstrap_interval(values: list[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    r"""95% percentile bootstrap interval of the mean."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _row(values: list[float], seed: int) -> dict[str, float]:
    low, high = bootstrap_interval(values, seed)
    return {"mean": float(np.mean(values)) if values else float("nan"), "ci_low": low, "ci_high": high,
            "n": len(values)}


def summarize(records: list[dict], seed: int = 0) -> dict[str, Any]:
    r"""
    Per metric, mode and bin the mean of every measure with a 95% bootstrap
    interval over examples; per metric and mode the AOPC (the mean over bins,
    taken per example first).
    """
    if not records:
        return {"n_examples": 0, "bins": {}, "aopc": {}}
    kind = "text" if "nll" in records[0]["clean"] else "choice"
    measures = list(next(iter(next(iter(records[0]["results"].values()))[MODES[0]].values())))
    bins: dict = {}
    aopc: dict = {}
    for metric in records[0]["results"]:
        for mode in MODES:
            bin_keys = list(records[0]["results"][metric][mode])
            for measure in measures:
                per_example = [[r["results"][metric][mode][b][measure] for b in bin_keys] for r in records]
                for index, b in enumerate(bin_keys):
                    bins.setdefault(metric, {}).setdefault(mode, {}).setdefault(b, {})[measure] = _row(
                        [values[index] for values in per_example], seed)
                aopc.setdefault(metric, {}).setdefault(mode, {})[measure] = _row(
                    [area_over_curve(values) for values in per_example], seed)
    summary: dict[str, Any] = {"n_examples": len(records), "kind": kind, "primary": PRIMARY[kind], "bins": bins,
                               "aopc": aopc}
    if kind == "choice":
        summary["clean_accuracy"] = _row([float(r["clean"]["prediction"] == r["label"]) for r in records], seed)
    else:
        summary["clean_nll"] = _row([r["clean"]["nll"] for r in records], seed)
    summary["paper_order"] = paper_order(aopc, PRIMARY[kind])
    completeness = [r["ig_completeness"] for r in records if "ig_completeness" in r]
    if completeness:
        summary["ig_completeness"] = ig_completeness(completeness)
    return summary


def ig_completeness(checks: list[dict[str, float]]) -> dict[str, float]:
    r"""
    How far IG's attributions are from summing to f(input) - f(baseline), over examples:
    medians of ``|attribution_sum - output_change|`` and of ``|output_change|``.
    """
    gaps = [abs(c["attribution_sum"] - c["output_change"]) for c in checks]
    return {"n": len(checks), "median_abs_gap": float(np.median(gaps)),
            "median_abs_output_change": float(np.median([abs(c["output_change"]) for c in checks]))}


def ig_completeness_line(summary: dict[str, Any]) -> str:
    r"""One sentence on IG's completeness for a summary that has it, else ``""``."""
    if "ig_completeness" not in summary:
        return ""
    check = summary["ig_completeness"]
    return (f"IG completeness ({check['n']} of {summary['n_examples']} examples record it): median "
            f"|sum of attributions - (f(x) - f(baseline))| = {check['median_abs_gap']:.3g}, against a median "
            f"|f(x) - f(baseline)| of {check['median_abs_output_change']:.3g}.")


def aopc_cells(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    r"""Per metric, its comprehensiveness and sufficiency AOPC of the primary measure as ``"mean [low, high]"``."""
    measure = summary["primary"]
    return [(metric, *(f"{modes[m][measure]['mean']:.4f} [{modes[m][measure]['ci_low']:.4f}, "
                       f"{modes[m][measure]['ci_high']:.4f}]" for m in MODES))
            for metric, modes in summary["aopc"].items()]


def paper_order(aopc: dict, measure: str) -> dict[str, Any]:
    r"""
    Whether attention < value-weighted < output-normalised < CW holds (higher comprehensiveness,
    lower sufficiency is more faithful): ``holds`` by the AOPC means, ``separated`` also with every
    step's 95% intervals apart. Both are None with fewer than two of these metrics.
    """
    present = [m for m in PAPER_ORDER if m in aopc]
    result = {}
    for mode, better_is_higher in (("comprehensiveness", True), ("sufficiency", False)):
        rows = [aopc[m][mode][measure] for m in present]
        pairs = list(zip(rows, rows[1:])) if better_is_higher else [(b, a) for a, b in zip(rows, rows[1:])]
        holds = [upper["mean"] > lower["mean"] for lower, upper in pairs]
        separated = [upper["ci_low"] > lower["ci_high"] for lower, upper in pairs]
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


def write_report(records: list[dict], config, out: Path) -> dict[str, Any]:
    r"""
    Writes ``summary.json``, ``summary.csv`` and ``curves.png`` under ``out``; returns the summary.
    Records of skipped examples (``{"id", "skipped": reason}``) are listed under ``"skipped"``, not summarised.
    """
    skipped = [{"id": r["id"], "reason": r["skipped"]} for r in records if "skipped" in r]
    records = [r for r in records if "skipped" not in r]
    summary = summarize(records, seed=config.protocol.seed)
    summary["skipped"] = skipped
    summary["config"] = config.to_json()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "summary.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["task", "metric", "mode", "bin", "measure", "mean", "ci_low", "ci_high", "n"])
        for metric, modes in summary["aopc"].items():
            for mode, measures in modes.items():
                for measure, row in measures.items():
                    writer.writerow([config.task, metric, mode, "AOPC", measure, row["mean"], row["ci_low"],
                                     row["ci_high"], row["n"]])
                    for b, by_measure in summary["bins"][metric][mode].items():
                        cell = by_measure[measure]
                        writer.writerow([config.task, metric, mode, b, measure, cell["mean"], cell["ci_low"],
                                         cell["ci_high"], cell["n"]])
    if records:
        plot_curves(summary, out / "curves.png", title=f"{config.model} on {config.task} ({len(records)} examples)")
    return summary


def plot_curves(summary: dict, path: Path, title: str = "") -> None:
    r"""Drop of the primary measure against the bin, one line per metric, with 95% intervals."""
    measure = summary["primary"]
    figure = Figure(figsize=(11, 4))
    axes = figure.subplots(1, 2)
    for axis, mode in zip(axes, MODES):
        for metric, modes in summary["bins"].items():
            bins = list(modes[mode])
            x = [float(b) for b in bins]
            mean = [modes[mode][b][measure]["mean"] for b in bins]
            low = [modes[mode][b][measure]["ci_low"] for b in bins]
            high = [modes[mode][b][measure]["ci_high"] for b in bins]
            aopc = summary["aopc"][metric][mode][measure]["mean"]
            finite = [k for k, value in enumerate(mean) if math.isfinite(value)]  # a NaN has no place on a curve
            if not finite:
                continue
            axis.plot([x[k] for k in finite], [mean[k] for k in finite], marker="o",
                      label=f"{metric} (AOPC {aopc:.3g})")
            axis.fill_between([x[k] for k in finite], [low[k] for k in finite], [high[k] for k in finite],
                              alpha=0.15)
        if axis.lines:
            axis.set_xscale("log")
            axis.legend(fontsize=7)
        axis.set_xlabel("k (% of keys removed)" if mode == "comprehensiveness" else "k (% of keys kept)")
        axis.set_ylabel(measure)
        axis.set_title(f"{mode} ({'higher' if mode == 'comprehensiveness' else 'lower'} is more faithful)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
