"""The output folder of an evaluation run: its records, their repair, its lock, its configuration and fingerprints.

A folder holds one run: ``config.json`` (the configuration, the fingerprints of the data, its tokens and the model,
and each session's environment),
``records*.jsonl`` (one line per finished example) and ``.lock`` (held while a run writes). A run resumes
only with the same configuration, data, tokens and model, and only one run writes to a folder at a time.
:class:`RunFolder` does all of this for a run, reading the folder once; the functions below are its steps.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from captum_cw.errors import InputError
from captum_cw.evaluation.records import ExampleRecord, Record, Skipped, SkippedExample, read_record
from captum_cw.evaluation.sequences import encode
from captum_cw.files import strict_json, write_atomically
from captum_cw.tasks import Example

__all__ = ["RecordsFile", "RunFolder", "check_data", "check_model", "check_tokens", "config_defaults",
           "data_fingerprint", "locked", "model_fingerprint", "read_records", "repair_tail", "session",
           "tokens_fingerprint"]

_WEIGHT_SAMPLES = 64  # evenly spaced values per parameter in the sampled hash (runs stored before the full one)
_HASH_CHUNK_BYTES = 2**26  # bytes of a weight moved to the CPU and hashed at once


def read_records(out: Path, *, include_skipped: bool = False) -> list[Record | Skipped]:
    r"""
    The finished examples under ``out`` (every shard), in example order, in their JSON form; a torn last line is
    left out. Records of any version are read, their bin keys normalised
    (:func:`~captum_cw.evaluation.records.read_record`).

    Args:
        out (Path): the run's folder.
        include_skipped (bool, optional): also return the examples recorded as skipped
                    (``{"id", "skipped": reason}``: too short to score). Default: False
    """
    records = _read_shards(out).values()
    return [r.to_json() for r in _in_example_order(records) if include_skipped or isinstance(r, ExampleRecord)]


def _read_shards(out: Path) -> dict[str, ExampleRecord | SkippedExample]:
    r"""Every record under ``out`` by example id (a later line of an id replaces an earlier one)."""
    records = {}
    for path in sorted(out.glob("records*.jsonl")):
        with open(path) as handle:
            for line in handle:
                try:
                    record = read_record(json.loads(line))
                except (json.JSONDecodeError, ValueError):
                    continue  # the example in flight when a run was killed
                records[record.id] = record
    return records


def _in_example_order(records: Collection[ExampleRecord | SkippedExample]) -> list[ExampleRecord | SkippedExample]:
    return sorted(records, key=lambda record: record.example_index)


def _is_record(line: bytes) -> bool:
    try:
        read_record(json.loads(line))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return False
    return True


def repair_tail(path: Path) -> None:
    r"""
    Makes a records file end on a full line before records are appended to it. A last record that
    lost only its newline is kept (the newline is added); a line left unfinished by a killed run is cut,
    atomically (a kill during the repair leaves the file as it was).
    """
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    if _is_record(data[cut:]):
        with open(path, "ab") as handle:
            handle.write(b"\n")
            handle.flush()
            os.fsync(handle.fileno())
    else:
        write_atomically(path, data[:cut])


@contextmanager
def locked(out: Path) -> Iterator[None]:
    r"""
    Holds ``out/.lock`` while the block runs, so that a second run on the same folder stops at once.
    The lock is an ``flock``: the system drops it when its process ends, however it ends.
    """
    with open(out / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise InputError(f"{out} is in use by another run (process {holder} holds {out / '.lock'}); wait for "
                             "it to finish or use another --out.") from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def data_fingerprint(examples: Sequence[Example]) -> dict[str, Any]:
    r"""How many examples and a SHA-256 of their content (prompts, continuations, labels)."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(dataclasses.asdict(example), sort_keys=True).encode() + b"\n")
    return {"examples": len(examples), "sha256": digest.hexdigest()}


def tokens_fingerprint(examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                       max_tokens: int) -> dict[str, Any]:
    r"""
    How many examples and a SHA-256 of the token ids the evaluation feeds the model for them (as
    :func:`~captum_cw.evaluation.sequences.encode` makes them, with where each choice is scored): the same text
    through another tokenizer, e.g. another transformers release's conversion of a GGUF one, hashes otherwise.
    """
    digest = hashlib.sha256()  # the release that made the ids is kept to name it, not compared
    for example in examples:
        encoded = encode(example, tokenizer, max_tokens)
        ids = [sequence.tolist() for sequence in encoded.sequences]
        choices = [dataclasses.astuple(choice) for choice in encoded.choices]
        digest.update(json.dumps([ids, choices]).encode() + b"\n")
    return {"examples": len(examples), "sha256": digest.hexdigest(), "transformers": transformers.__version__}


def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    r"""
    The model's configuration as JSON (``config``, without its path and transformers version) with its SHA-256,
    and two SHA-256 of its weights' names, shapes and dtypes with their values: ``weights_sha256_all`` over every
    value (any edit of any weight changes it), and ``weights_sha256`` over 64 evenly spaced values of each, which
    runs stored before the full hash hold and are still compared by (:func:`check_model`).
    """
    settings = getattr(model, "config", None)
    if not isinstance(settings, PretrainedConfig):
        raise InputError(f"{type(model).__name__} has no transformers configuration (model.config); the evaluation "
                         "runs transformers models.")
    sampled, every = hashlib.sha256(), hashlib.sha256()
    for name, parameter in model.named_parameters():
        described = f"{name}:{tuple(parameter.shape)}:{parameter.dtype};".encode()
        sampled.update(described)
        every.update(described)
        if parameter.device.type != "meta":  # offloaded weights: their shape only
            flat = parameter.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // _WEIGHT_SAMPLES)][:_WEIGHT_SAMPLES]
            sampled.update(sample.float().cpu().numpy().tobytes())
            _hash_values(every, flat)
    config = _comparable(settings.to_dict())
    return {"config": config, "config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
            "weights_sha256": sampled.hexdigest(), "weights_sha256_all": every.hexdigest()}


def _hash_values(digest: Any, flat: torch.Tensor) -> None:
    r"""Feeds the bytes of every value of ``flat`` (1D, any device and dtype) to ``digest``, a chunk at a time
    (a GPU's weights reach the CPU one chunk after the other, never as a whole copy)."""
    raw = flat.contiguous().view(torch.uint8)  # [bytes]
    for start in range(0, raw.numel(), _HASH_CHUNK_BYTES):
        digest.update(raw[start:start + _HASH_CHUNK_BYTES].cpu().numpy())


def config_defaults(model: nn.Module) -> dict[str, Any]:
    r"""The defaults of the model's configuration class as :func:`model_fingerprint` writes a configuration, for
    :func:`check_model`; empty where the class cannot be built without arguments."""
    settings = getattr(model, "config", None)
    try:
        return _comparable(type(settings)().to_dict()) if isinstance(settings, PretrainedConfig) else {}
    except Exception:  # any configuration class's own validation error: no defaults known
        return {}


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    r"""``config`` through JSON (tuples as lists, other objects as strings), without path and version."""
    kept = {key: value for key, value in config.items() if key not in ("_name_or_path", "transformers_version")}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def _config_changes(before: dict, now: dict, defaults: dict, prefix: str = "") -> list[str]:
    r"""The settings that differ between two configurations; a setting only ``now`` has (one a later
    transformers release added) counts as unchanged where it holds the class's default. Nested configurations
    are compared setting by setting."""
    changes = []
    for key in sorted(set(before) | set(now)):
        default = defaults.get(key) if isinstance(defaults, dict) else None
        if key in before and key in now:
            if isinstance(before[key], dict) and isinstance(now[key], dict):
                changes += _config_changes(before[key], now[key], default or {}, f"{prefix}{key}.")
            elif before[key] != now[key]:
                changes.append(prefix + key)
        elif key not in now or not isinstance(defaults, dict) or key not in defaults or default != now[key]:
            changes.append(prefix + key)
    return changes


def _previous_run(out: Path, config: dict, *, resume: bool, defaults: dict) -> dict:
    r"""
    Checks that this run may write to ``out``: a folder with records must hold the same configuration
    (``limit`` aside: a larger one extends the run; ``data_dir`` aside where the data's fingerprint is stored,
    which is checked instead, so that a run moved to another machine resumes on its copy of the data) and be
    resumed. A setting the stored configuration lacks (one added since it was written) counts as its default,
    so that older runs still resume.

    Args:
        out (Path): the run's folder.
        config (dict): this run's configuration as JSON.
        resume (bool): whether the records there are to be continued.
        defaults (dict): the default configuration as JSON, for the settings an older ``config.json`` lacks.
    Returns:
        The stored ``config.json`` (its fingerprints are to be checked).
    """
    path = out / "config.json"
    if not path.exists():
        raise InputError(f"{out} holds records but no config.json to check them against; use another --out.")
    stored = json.loads(path.read_text())
    filled = _filled(stored, defaults)
    unchecked = {"limit", "fingerprint", "sessions"}
    if "data" in stored.get("fingerprint", {}):  # else only the data's folder tells the data apart
        unchecked.add("data_dir")
    keys = sorted((set(filled) | set(config)) - unchecked)
    changed = [key for key in keys if filled.get(key) != config.get(key)]
    if changed:
        raise InputError(f"{out} holds a run with another configuration ({', '.join(changed)} differ, see {path}); "
                         "use another --out.")
    if not resume:
        raise InputError(f"{out} already holds results: pass --resume to continue them, or use another --out.")
    return stored


def _filled(stored: dict, defaults: dict) -> dict:
    r"""``stored`` with the settings it lacks taken from ``defaults``, in nested settings too."""
    filled = dict(stored)
    for key, default in defaults.items():
        if key not in filled:
            filled[key] = default
        elif isinstance(default, dict) and isinstance(filled[key], dict):
            filled[key] = _filled(filled[key], default)
    return filled


def check_data(out: Path, previous: dict | None, examples: Sequence[Example]) -> None:
    r"""
    Refuses to resume on other data: the first examples, as many as the stored run had, must hash as
    they did. ``examples`` must hold at least that many when the source still does.
    """
    before = (previous or {}).get("fingerprint", {}).get("data")
    if before is None:
        return
    now = data_fingerprint(examples[: before["examples"]])
    if now != before:
        found = (f"only {now['examples']} examples are left of the {before['examples']}"
                 if now["examples"] < before["examples"] else f"its first {before['examples']} examples differ")
        raise InputError(f"the data changed since {out} was started ({found}); use a new --out for the new data.")


def check_tokens(out: Path, previous: dict | None, examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                 max_tokens: int) -> None:
    r"""
    Refuses to resume with another tokenization: the first examples, as many as the stored run had, must
    tokenize as they did. Runs stored before tokens were fingerprinted resume unchecked.
    """
    before = (previous or {}).get("fingerprint", {}).get("tokens")
    if before is None:
        return
    if tokens_fingerprint(examples[: before["examples"]], tokenizer, max_tokens)["sha256"] != before["sha256"]:
        release = before.get("transformers")
        started = f"transformers {release} (pip install transformers=={release})" if release else "it"
        raise InputError(f"the tokenizer changed since {out} was started: its first {before['examples']} examples "
                         f"tokenize otherwise (another transformers release can convert a tokenizer otherwise); "
                         f"resume with the tokenizer it started with, under {started}, or use a new --out.")


def check_model(out: Path, previous: dict | None, fingerprint: dict[str, Any],
                defaults: dict[str, Any] | None = None) -> None:
    r"""
    Refuses to resume with another model: its weights must hash as they did (every value; for a run stored
    before that hash, the sampled values, and the run then stores the full hash) and its configuration must hold
    the same settings, except settings added since (by a transformers release) that hold their defaults.

    Args:
        out (Path): the run's folder.
        previous (dict or None): its stored ``config.json``.
        fingerprint (dict): :func:`model_fingerprint` of the model now.
        defaults (dict, optional): :func:`config_defaults` of the model now. Default: None (no setting may be new)
    """
    before = (previous or {}).get("fingerprint", {}).get("model")
    if before is None:
        return
    if "config" in before:
        settings = _config_changes(before["config"], fingerprint["config"], defaults or {})
    else:  # stored before configurations were: only the hash of the whole
        settings = [] if before.get("config_sha256") == fingerprint["config_sha256"] else ["?"]
    weights = "weights_sha256_all" if "weights_sha256_all" in before else "weights_sha256"  # older runs: sampled
    changed = ["configuration"] * bool(settings) + ["weights"] * (before[weights] != fingerprint[weights])
    if changed:
        named = [name for name in settings if name != "?"]
        detail = f" ({', '.join(named[:8])}{', ...' if len(named) > 8 else ''})" if named else ""
        raise InputError(f"the model's {' and '.join(changed)} changed{detail} since {out} was started; use a new "
                         "--out for the new model.")


def session(model: nn.Module, records_before: int) -> dict[str, Any]:
    r"""
    Where and with what one session of a run computes, for ``config.json``'s ``sessions``: when it started (UTC),
    how many records the folder held before it, the model's devices (with the accelerator's name) and dtype, and
    the releases of torch, transformers, captum_cw and Python.
    """
    parameters = list(model.parameters())
    devices = sorted({p.device for p in parameters}, key=str)
    names = sorted({torch.cuda.get_device_name(device) for device in devices if device.type == "cuda"})
    dtype = str(parameters[0].dtype).removeprefix("torch.") if parameters else None
    return {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "records_before": records_before,
            "devices": [str(device) for device in devices], "device_names": names or [platform.machine()],
            "dtype": dtype, "torch": torch.__version__, "transformers": transformers.__version__,
            "captum_cw": _installed_release(), "python": platform.python_version()}


def _installed_release() -> str | None:
    r"""captum_cw's release as installed; None where it runs from a source tree that is not installed."""
    try:
        return importlib.metadata.version("captum_cw")
    except importlib.metadata.PackageNotFoundError:
        return None


class RecordsFile:
    r"""A records file open for appending: each record is one line, on disk (fsynced) before the next example."""

    def __init__(self, path: Path, folder: RunFolder) -> None:
        self.path = path
        self._folder = folder

    @contextmanager
    def opened(self) -> Iterator[RecordsFile]:
        r"""Repairs the file's tail (:func:`repair_tail`) and holds it open while the block appends."""
        repair_tail(self.path)
        with open(self.path, "a") as self._handle:
            yield self

    def append(self, record: ExampleRecord | SkippedExample) -> None:
        r"""Writes ``record`` as the file's last line (and keeps it among the folder's records)."""
        self._handle.write(strict_json(record.to_json()) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._folder.records_by_id[record.id] = record


class RunFolder:
    r"""
    The output folder of one run (see the module): reads its records once, holds its lock, refuses to resume
    another run, checks and writes the fingerprints and sessions of ``config.json``, and appends records.
    A run's main process :meth:`opens <open>` it under :meth:`locked`, :meth:`checks <check_model>` the model and
    :meth:`writes its configuration <write_config>`; each process then :meth:`reads <read>` it (the main process
    has) and appends to its own :meth:`records_file`; :meth:`records` are then those read and appended.

    Args:
        path (str or Path): the folder (made when locked).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"{self.path} is a file; give a folder for the run's results.")
        self.stored: dict[str, Any] | None = None  # config.json of the run resumed
        self.records_by_id: dict[str, ExampleRecord | SkippedExample] = {}

    @contextmanager
    def locked(self) -> Iterator[None]:
        r"""Makes the folder and holds its lock while the block runs (:func:`locked`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with locked(self.path):
            yield

    def read(self) -> None:
        r"""Reads every records file of the folder (torn lines left out)."""
        self.records_by_id = _read_shards(self.path)

    def open(self, config: dict[str, Any], defaults: dict[str, Any], *, resume: bool) -> None:
        r"""
        Reads the folder and checks that this run may write to it: a folder with records must hold the same
        configuration and be resumed (see :func:`_previous_run`); keeps the stored ``config.json`` in
        :attr:`stored`.

        Args:
            config (dict): this run's configuration as JSON.
            defaults (dict): the default configuration as JSON, for the settings an older ``config.json`` lacks.
            resume (bool): whether the records there are to be continued.
        """
        self.read()
        self.stored = _previous_run(self.path, config, resume=resume, defaults=defaults) if self.records_by_id else None

    @property
    def stored_examples(self) -> int | None:
        r"""How many examples the stored run's data fingerprint covers, or None."""
        before = (self.stored or {}).get("fingerprint", {}).get("data")
        return None if before is None else before["examples"]

    def check_data(self, examples: Sequence[Example]) -> None:
        r"""Refuses to resume on other data (:func:`check_data`)."""
        check_data(self.path, self.stored, examples)

    def check_model(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example],
                    max_tokens: int) -> dict[str, Any]:
        r"""
        Refuses to resume with another model or tokenization (:func:`check_model`, :func:`check_tokens`).

        Returns:
            The fingerprints for ``config.json``: of the data, its tokens and the model.
        """
        fingerprint = model_fingerprint(model)
        check_model(self.path, self.stored, fingerprint, config_defaults(model))
        check_tokens(self.path, self.stored, examples, tokenizer, max_tokens)
        return {"data": data_fingerprint(examples), "tokens": tokens_fingerprint(examples, tokenizer, max_tokens),
                "model": fingerprint}

    def write_config(self, config: dict[str, Any], fingerprint: dict[str, Any], model: nn.Module,
                     pending: Collection[str]) -> None:
        r"""
        Writes ``config.json``: the configuration, the fingerprints, and the environment of each session that had
        examples left to compute (:func:`session`, oldest first; not compared on resume): this one's if any of
        the ``pending`` example ids is not recorded yet.
        """
        sessions = (self.stored or {}).get("sessions", [])
        if set(pending) - set(self.records_by_id):  # a session that computes nothing is not kept
            sessions = [*sessions, session(model, len(self.records_by_id))]
        write_atomically(self.path / "config.json", strict_json({**config, "fingerprint": fingerprint,
                                                                "sessions": sessions}, indent=2))

    def records_file(self, process_index: int = 0, num_processes: int = 1) -> RecordsFile:
        r"""The records file a process appends to: ``records.jsonl``, or its own shard among several processes."""
        name = f"records.rank{process_index}.jsonl" if num_processes > 1 else "records.jsonl"
        return RecordsFile(self.path / name, self)

    def records(self, ids: Collection[str]) -> list[ExampleRecord | SkippedExample]:
        r"""The records of the examples ``ids`` read and appended so far, in example order."""
        return _in_example_order([r for r in self.records_by_id.values() if r.id in ids])
