"""The formats of an evaluation run, typed: one record per example (``records*.jsonl``), the summary and its rows.

An example's record is an :class:`ExampleRecord` (:func:`~captum_cw.evaluation.protocols.example_record` makes
it), or a :class:`SkippedExample`; a line of ``records.jsonl`` holds its JSON form (:class:`Record`,
:class:`Skipped`). :meth:`ExampleRecord.from_json` reads one back, from this version or an older one, with its bin
keys normalised by :func:`bin_key` (older runs wrote ``"10"`` for the default bins and ``"10.0"`` for
``--bins 10``). The summary (``summary.json``) is built by :func:`~captum_cw.evaluation.report.summarize`; a
:class:`SummaryRow` is a line of ``summary.csv``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypedDict, final

from typing_extensions import NotRequired

from captum_cw.errors import InputError
from captum_cw.statistics import Interval
from captum_cw.tasks import KINDS, Kind

__all__ = ["KINDS", "ChoiceCheck", "ChoiceClean", "ExampleRecord", "IGCompleteness", "Interval", "Kind", "Measures",
           "Record", "Skipped", "SkippedExample", "Summary", "SummaryRow", "TextClean", "bin_key", "choice_clean",
           "parse_record", "read_record", "record_kind", "text_clean"]


Measures = dict[str, float]  # choice: prob_drop, logprob_drop, accuracy; text: delta_nll, delta_ppl
ByBin = dict[str, Measures]  # bin key (bin_key) -> measures


# @final: each format has exactly its keys, so a type checker tells a union's members apart by one of them
@final
class ChoiceClean(TypedDict):
    logliks: list[float]  # [choice]: log-likelihood of each choice's continuation
    prediction: int  # argmax of logliks


@final
class TextClean(TypedDict):
    nll: float  # mean next-token NLL


class IGCompleteness(TypedDict):
    attribution_sum: float
    output_change: float  # f(input) - f(baseline)


@final
class Record(TypedDict):
    r"""One finished example."""

    id: str
    label: int | None
    clean: ChoiceClean | TextClean
    results: dict[str, dict[str, ByBin]]  # metric -> "comprehensiveness" | "sufficiency" -> bin key -> measures
    soft: NotRequired[dict[str, dict[str, Measures]]]  # metric -> "comprehensiveness" | "sufficiency" -> measures
    rankings: NotRequired[dict[str, Any]]  # metric -> ranked positions (see protocols.evaluate_example)
    ig_completeness: NotRequired[IGCompleteness]


@final
class Skipped(TypedDict):
    r"""An example too short to score."""

    id: str
    skipped: str  # why


class ChoiceCheck(TypedDict):
    r"""Whether a multiple-choice model does better than chance (see report.choice_check)."""

    accuracy: float
    accuracy_low: float  # 95% Wilson interval
    accuracy_high: float
    chance: float  # mean over examples of 1 / number of choices
    most_frequent_answer: int  # the model's most frequent prediction
    most_frequent_answer_name: NotRequired[str]  # its name in the task ("A", "yes"; see Task.answers)
    most_frequent_share: float  # its share of the predictions
    majority_label_share: float  # accuracy of always giving the most frequent correct answer
    at_chance: bool


class Summary(TypedDict):
    r"""``summary.json``: means with 95% bootstrap intervals over the examples."""

    n_examples: int
    kind: Kind
    primary: str  # the measure the tables show: prob_drop (choice) or delta_nll (text)
    bins: dict[str, dict[str, dict[str, dict[str, Interval]]]]  # metric -> mode -> bin key -> measure -> interval
    aopc: dict[str, dict[str, dict[str, Interval]]]  # metric -> mode -> measure -> interval
    soft: NotRequired[dict[str, dict[str, dict[str, Interval]]]]  # metric -> mode -> measure -> interval
    clean_accuracy: NotRequired[Interval]
    clean_nll: NotRequired[Interval]
    choice_check: NotRequired[ChoiceCheck]
    correct: NotRequired[dict[str, Any]]  # choice: {"n_examples", "aopc", "soft", "paired"} over those answered right
    rank_agreement: NotRequired[dict[str, Any]]  # see report.rank_agreement
    paired: NotRequired[dict[str, Any]]  # CW against each metric, example by example (report.paired_comparisons)
    paper_order: dict[str, Any]
    ig_completeness: NotRequired[dict[str, float]]
    warnings: list[str]
    skipped: NotRequired[list[dict[str, str]]]
    config: NotRequired[dict[str, Any]]


def bin_key(percent: float | str) -> str:
    r"""
    The key of a bin in records and summaries: the shortest exact form of the percentage,
    ``10``, ``10.0`` and ``"10.0"`` all give ``"10"``, ``12.5`` gives ``"12.5"``.
    """
    text = repr(float(percent))
    return text[:-2] if text.endswith(".0") else text


def record_kind(record: Record) -> Kind:
    r"""``"text"`` for a record scored by NLL, ``"choice"`` for one scored by its choices' log-likelihoods."""
    return "text" if "nll" in record["clean"] else "choice"


def choice_clean(record: Record) -> ChoiceClean:
    r"""The clean measurement of a multiple-choice record; a ValueError for a text record."""
    clean = record["clean"]
    if "logliks" not in clean:
        raise InputError(f"record {record['id']!r} is a text record where a multiple-choice one was expected.")
    return clean


def text_clean(record: Record) -> TextClean:
    r"""The clean measurement of a text record; a ValueError for a multiple-choice record."""
    clean = record["clean"]
    if "nll" not in clean:
        raise InputError(f"record {record['id']!r} is a multiple-choice record where a text one was expected.")
    return clean


def _undefined_as_nan(measures: dict[str, Any]) -> Measures:
    r"""Measures as written to strict JSON (an undefined one, such as the accuracy of an unlabelled example, is
    ``null``) read back as floats: ``null`` is NaN again."""
    return {name: math.nan if value is None else value for name, value in measures.items()}


def _index_of(example_id: str) -> int:
    return int(example_id.rsplit("-", 1)[1])


@dataclass(frozen=True)
class ExampleRecord:
    r"""One finished example: its clean measurement and its measures under every intervention."""

    id: str
    label: int | None  # the correct choice (None: unlabelled, or a text)
    clean: ChoiceClean | TextClean
    results: dict[str, dict[str, ByBin]]  # metric -> "comprehensiveness" | "sufficiency" -> bin key -> measures
    ig_completeness: IGCompleteness | None = None  # with IG
    soft: dict[str, dict[str, Measures]] | None = None  # with soft removal: metric -> mode -> measures
    rankings: dict[str, Any] | None = None  # with save_rankings: metric -> ranked positions (protocols)

    @property
    def example_index(self) -> int:
        r"""The example's position in its task (``"mmlu-12"`` -> 12): the order of ``records.jsonl``."""
        return _index_of(self.id)

    def to_json(self) -> Record:
        r"""The line of ``records.jsonl``: the fields in this order, those a run did not compute left out."""
        return {key: value for key, value in dataclasses.asdict(self).items()  # type: ignore[return-value]
                if value is not None or key in ("label", "clean", "results")}

    @classmethod
    def from_json(cls, raw: Record) -> ExampleRecord:
        r"""A record as read from ``records.jsonl``, any version: bin keys normalised, ``null`` measures NaN."""
        results = {metric: {mode: {bin_key(b): _undefined_as_nan(measures) for b, measures in by_bin.items()}
                            for mode, by_bin in modes.items()}
                   for metric, modes in raw["results"].items()}
        soft = raw.get("soft")
        if soft is not None:
            soft = {metric: {mode: _undefined_as_nan(measures) for mode, measures in modes.items()}
                    for metric, modes in soft.items()}
        return cls(id=raw["id"], label=raw["label"], clean=raw["clean"], results=results,
                   ig_completeness=raw.get("ig_completeness"), soft=soft, rankings=raw.get("rankings"))


@dataclass(frozen=True)
class SkippedExample:
    r"""An example too short to score, and why."""

    id: str
    reason: str

    @property
    def example_index(self) -> int:
        r"""The example's position in its task (``"mmlu-12"`` -> 12): the order of ``records.jsonl``."""
        return _index_of(self.id)

    def to_json(self) -> Skipped:
        r"""The line of ``records.jsonl``."""
        return Skipped(id=self.id, skipped=self.reason)


@dataclass(frozen=True)
class SummaryRow:
    r"""A line of ``summary.csv``: one measure's mean and 95% interval for a metric, mode and bin."""

    task: str
    metric: str
    mode: str  # "comprehensiveness" or "sufficiency"
    bin: str  # a bin key, "AOPC" (the area over the curve) or "soft" (soft removal)
    measure: str
    mean: float | None  # None: undefined (summary.json's null)
    ci_low: float | None
    ci_high: float | None
    n: int
    examples: str  # over which examples: "all", or "correct" (those the model answers correctly)

    def cells(self) -> list[Any]:
        r"""The values in the order of ``summary.csv``'s columns (:meth:`columns`)."""
        return list(dataclasses.astuple(self))

    @staticmethod
    def columns() -> list[str]:
        r"""``summary.csv``'s header."""
        return [field.name for field in dataclasses.fields(SummaryRow)]


def read_record(raw: Any) -> ExampleRecord | SkippedExample:
    r"""
    The record of one line of ``records.jsonl`` (parsed JSON), any version.

    Raises:
        ValueError: the line is not a record (no ``id``, or neither ``results`` nor ``skipped``).
    """
    if not isinstance(raw, dict) or "id" not in raw or not ("results" in raw or "skipped" in raw):
        raise InputError(f"not an evaluation record: {str(raw)[:80]}")
    if "skipped" in raw:
        return SkippedExample(id=raw["id"], reason=raw["skipped"])
    return ExampleRecord.from_json(raw)  # type: ignore[arg-type]  # a JSON object whose keys are checked


def parse_record(raw: dict[str, Any]) -> Record | Skipped:
    r"""
    A record as read from ``records.jsonl``, any version, in its JSON form (:func:`read_record`).

    Raises:
        ValueError: the line is not a record (no ``id``, or neither ``results`` nor ``skipped``).
    """
    return read_record(raw).to_json()
