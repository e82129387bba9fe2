"""What a row of each task must hold, and a JSONL reader that names the line of every bad row.

Each task's schema is data: field name -> :class:`Rule`. A row that breaks a rule stops the run
with the row's place (``file:line`` for local files, the row index otherwise), the field, what it
must hold and what it holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captum_cw.errors import InputError

__all__ = ["Rule", "SCHEMAS", "SourceRow", "check_row", "read_jsonl"]


@dataclass(frozen=True)
class Rule:
    r"""What one field must hold: ``expected`` in words, ``accepts`` as a test of the value."""

    expected: str
    accepts: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TEXT = Rule("a string", lambda value: isinstance(value, str))

SCHEMAS: dict[str, dict[str, Rule]] = {
    "mmlu": {
        "question": _TEXT,
        "subject": _TEXT,
        "choices": Rule("a list of 4 strings",
                        lambda value: isinstance(value, list) and len(value) == 4
                        and all(isinstance(choice, str) for choice in value)),
        "answer": Rule("an integer from 0 to 3 (the index of the right choice)",
                       lambda value: _is_int(value) and 0 <= value <= 3),
    },
    "winogrande": {
        "sentence": Rule("a string with exactly one blank '_'",
                         lambda value: isinstance(value, str) and value.count("_") == 1),
        "option1": _TEXT,
        "option2": _TEXT,
        "answer": Rule('"1" or "2" (the option that fills the blank)',
                       lambda value: value in ("1", "2") or (_is_int(value) and value in (1, 2))),
    },
    "boolq": {
        "question": _TEXT,
        "passage": _TEXT,
        "answer": Rule("true or false (a JSON boolean, not a string)", lambda value: isinstance(value, bool)),
    },
    "gsm8k": {"question": _TEXT, "answer": _TEXT},
    "fineweb_edu": {"text": _TEXT},
}


class SourceRow(dict):
    r"""A row read from a local file; ``location`` is its ``file:line``."""

    location: str


def read_jsonl(path: str | Path) -> Iterator[SourceRow]:
    r"""
    The rows of a JSONL file (one JSON object per line; blank lines are skipped), each with its ``file:line``.

    Raises:
        InputError: on a line that is not UTF-8, not JSON or not an object, or a file without rows,
                    naming the file and line.
    """
    path = Path(path)
    rows = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            location = f"{path}:{number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"{location}: {_undecodable_field(raw)}not valid UTF-8 text (byte "
                                 f"{raw[error.start]:#04x} at byte {error.start + 1} of the line); save the file as "
                                 "UTF-8 JSONL, one JSON object per line.") from None
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise InputError(f"{location}: not valid JSON ({error.msg}, column {error.colno}); each line must "
                                 "hold one JSON object.") from None
            if not isinstance(row, dict):
                raise InputError(f"{location}: a JSON {type(row).__name__} where a row object {{...}} was expected.")
            row = SourceRow(row)
            row.location = location
            rows += 1
            yield row
    if rows == 0:
        raise InputError(f"{path} holds no rows: write one JSON object per line in the task's hub schema.")


def _undecodable_field(raw: bytes) -> str:
    r"""``"field 'name' is "`` for the first field of a JSON line whose text holds bytes that are not UTF-8, or
    ``""`` where the line does not parse as an object with such a field."""
    try:
        row = json.loads(raw.decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError:
        return ""
    if isinstance(row, dict):
        for name, value in row.items():
            if _lone_surrogate(value) is not None:
                return f"field {name!r} is "
    return ""


def check_row(task: str, row: dict, index: int) -> dict:
    r"""
    Checks one row against its task's schema.

    Args:
        task (str): a key of :data:`SCHEMAS`.
        row (dict): the row; a :class:`SourceRow` is named by its ``file:line``, any other by ``index``.
        index (int): the row's index in its source.
    Returns:
        The row as a plain dict.
    Raises:
        InputError: naming the row, the field, what it must hold and what it holds; also for text that is not
                    valid UTF-8 (a lone surrogate, as a JSON escape such as ``"\ud800"`` writes it), which no
                    tokenizer can read.
    """
    where = getattr(row, "location", None) or f"{task} row {index}"
    schema = SCHEMAS[task]
    for name, rule in schema.items():
        if name not in row:
            raise InputError(f"{where}: the row has no field {name!r}; a {task} row needs "
                             f"{', '.join(repr(field) for field in schema)}.")
        if not rule.accepts(row[name]):
            shown = json.dumps(row[name], ensure_ascii=False, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise InputError(f"{where}: {task} field {name!r} must be {rule.expected}, got {shown}; fix or drop "
                             "that row.")
        surrogate = _lone_surrogate(row[name])
        if surrogate is not None:
            raise InputError(f"{where}: {task} field {name!r} is not valid UTF-8 text (a lone surrogate "
                             f"{surrogate!r}, which no tokenizer can read); fix or drop that row.")
    return dict(row)


def _lone_surrogate(value: Any) -> str | None:
    r"""The first lone surrogate (``'\ud800'``) in a string or a list of strings, else None: JSON escapes can
    write one, but it is no character and has no UTF-8 encoding."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                return text[error.start]
    return None
