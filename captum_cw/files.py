"""Files written whole or not at all, JSON that strict parsers read, and output paths that do what they say.

Every file captum_cw writes (summaries, records, configurations, views, figures) goes through
:func:`write_atomically`: a kill at any moment leaves the old file or the new one, never half of one. JSON goes
through :func:`strict_json`, which writes an undefined number (NaN, infinity) as ``null``: Python reads the
non-standard ``NaN`` it would otherwise write, but JavaScript, ``jq`` and most other parsers refuse it.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from captum_cw.errors import InputError

__all__ = ["output_path", "save_figure", "strict_json", "write_atomically", "write_json"]


def write_atomically(path: str | Path, data: bytes | str) -> Path:
    r"""
    Replaces ``path`` by ``data`` through a synced temporary file in the same folder, renamed over it: a kill
    or an error at any moment leaves the previous file (or none) or the whole new one, never half of it.

    Args:
        path (str or Path): the file to write; its folder must exist.
        data (bytes or str): the content; a string is written as UTF-8.
    Returns:
        ``path``, as a Path.
    """
    path = Path(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
    return path


def _defined(value: Any) -> Any:
    r"""``value`` with every NaN or infinite float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _defined(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_defined(item) for item in value]
    return value


def strict_json(value: Any, **dumps_kwargs: Any) -> str:
    r"""
    ``json.dumps(value, **dumps_kwargs)`` as standard JSON: NaN and infinities (undefined means, intervals of
    no examples) become ``null`` instead of the ``NaN`` only Python reads back.

    Args:
        value (Any): what ``json.dumps`` takes.
        **dumps_kwargs: passed to ``json.dumps`` (``indent``, ``ensure_ascii``...), but not ``allow_nan``.
    Returns:
        The JSON text.
    """
    return json.dumps(_defined(value), allow_nan=False, **dumps_kwargs)


def write_json(path: str | Path, value: Any, **dumps_kwargs: Any) -> Path:
    r"""Writes ``value`` to ``path`` as strict JSON (:func:`strict_json`), atomically (:func:`write_atomically`);
    returns the path."""
    return write_atomically(path, strict_json(value, **dumps_kwargs))


class _Figure(Protocol):
    def savefig(self, fname: Any, **kwargs: Any) -> None: ...


def save_figure(figure: _Figure, path: str | Path, **savefig_kwargs: Any) -> Path:
    r"""
    Saves a matplotlib figure to ``path`` in the format its suffix names (``.png``, ``.pdf``, ``.svg``...),
    atomically (:func:`write_atomically`), creating its folder.

    Args:
        figure (matplotlib.figure.Figure): the figure.
        path (str or Path): where to write it.
        **savefig_kwargs: passed to ``Figure.savefig`` (``dpi``...).
    Returns:
        ``path``, as a Path.
    """
    path = Path(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png", **savefig_kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, buffer.getvalue())


def output_path(path: str | Path, suffixes: Sequence[str], default_name: str, flag: str) -> Path:
    r"""
    The file an output flag names, checked before any work is done: a path with one of ``suffixes`` is that
    file; an existing folder, a path ending in ``/`` or a path without a suffix is a folder, and the file is
    ``default_name`` inside it; any other suffix is refused.

    Args:
        path (str or Path): what the user gave.
        suffixes (Sequence[str]): the suffixes accepted, lower case with their dot (``(".png", ".pdf")``).
        default_name (str): the file's name inside a folder.
        flag (str): how the user gave ``path`` (``"--out"``), for the error.
    Returns:
        The file to write (its folder may not exist yet).
    Raises:
        InputError: a suffix not in ``suffixes``, or a file without a suffix where a folder is meant.
    """
    text = str(path)
    path = Path(path)
    if path.is_dir() or text.endswith(("/", os.sep)):
        return path / default_name
    if not path.suffix:
        if path.exists():
            raise InputError(f"{flag} {text} is a file without a suffix; give a file name ending in "
                             f"{', '.join(suffixes)}, or a folder.")
        return path / default_name
    if path.suffix.lower() not in suffixes:
        raise InputError(f"{flag} {text} has the suffix {path.suffix!r}, which names no format written here; give "
                         f"a file name ending in {', '.join(suffixes)}, or a folder (ending in /).")
    return path
