"""The two faithfulness protocols: rank on the clean run, intervene, measure.

*Layer level* (the paper's): at the chosen layers each query row ranks its keys by
a metric and loses its top-k% keys (comprehensiveness) or all but them
(sufficiency), by value masking. *Input level* (ERASER's): one score per input
token for the model's prediction; the top-k% tokens are knocked out of the
context at every layer (or deleted from the input). With ``soft``, each key (token)
also keeps a share of its term set by its normalised score instead (Zhao & Aletras,
2023; :func:`~captum_cw.evaluation.ranking.soft_removal`).

Each metric is ranked once per sequence (every bin and mode reads that ranking), and variants
whose removals come out identical (two bins that round to the same keys, two metrics that rank
alike) share one forward pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar, cast

import torch
from captum.attr import LayerIntegratedGradients
from torch import Tensor, nn

from captum_cw.architectures import find_attention_layers
from captum_cw.attribution import attribute_metrics
from captum_cw.errors import InputError
from captum_cw.evaluation.ranking import (
    DEFAULT_BINS,
    MODES,
    key_ranks,
    ranked_positions,
    removal_from_ranks,
    soft_removal,
)
from captum_cw.evaluation.records import (
    ChoiceClean,
    ExampleRecord,
    IGCompleteness,
    Measures,
    Record,
    TextClean,
    bin_key,
)
from captum_cw.evaluation.reuse import record_layer_output, skip_layers_below
from captum_cw.evaluation.sequences import (
    Choice,
    EncodedExample,
    compare,
    measure,
    measure_reads,
    sequence_reads,
)
from captum_cw.interventions import mask_values
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers
from captum_cw.metrics import get_metric, metric_names
from captum_cw.selection import select_indices

__all__ = ["LAYER_METRICS", "INPUT_METRICS", "FirstToken", "Granularity", "Protocol", "ProtocolConfig", "Removal",
           "chosen_layers", "eligible_keys", "evaluate_example", "example_record", "input_metrics", "layer_metrics"]

LAYER_METRICS = (*metric_names(), "random")  # the defaults: the registered metrics (captum_cw.metrics) and random
INPUT_METRICS = ("ig", "cw_last", "cw_mean", "cw_rollout", "attention_mean", "attention_rollout", "random")


def layer_metrics() -> tuple[str, ...]:
    r"""The layer level's metrics: every metric registered now (:func:`captum_cw.metrics.metric_names`) and random."""
    return (*metric_names(), "random")


def input_metrics() -> tuple[str, ...]:
    r"""
    The input level's metrics: ``ig``, ``random`` and ``{metric}_{aggregation}`` for every name and alias of a
    registered metric (``cw_last`` is ``cw_inter``'s, through its alias ``cw``) and layer aggregation
    (:data:`captum_cw.layer_aggregation.LAYER_AGGREGATIONS`).
    """
    families = [spelling for name in metric_names() for spelling in get_metric(name).spellings]
    return ("ig", "random", *(f"{family}_{how}" for family in families for how in LAYER_AGGREGATIONS))


def _input_metric(name: str) -> tuple[str, str]:
    r"""``"cw_rollout"`` -> ``("cw_inter", "rollout")``: the registered metric's name and its layer aggregation."""
    family, aggregation = name.rsplit("_", 1)
    return get_metric(family).name, aggregation


_Choice = TypeVar("_Choice", bound="Setting")


class Setting(str, Enum):
    r"""A setting with a fixed set of values; a ``str``, so that ``config.json`` stores its value as before."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def parse(cls: type[_Choice], value: str, name: str) -> _Choice:
        r"""The member named by ``value``; an InputError naming the setting ``name`` and its values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise InputError(f"{name} must be one of {', '.join(member.value for member in cls)}, "
                             f"got {value!r}.") from None


class Protocol(Setting):
    r"""Where a protocol intervenes: on each layer's attention, or on the input's tokens at every layer."""

    LAYER = "layer"
    INPUT = "input"


class Granularity(Setting):
    r"""What the layer level ranks: tokens (heads aggregated) or each head's keys."""

    TOKEN = "token"
    HEAD = "head"


class Removal(Setting):
    r"""How the input level removes tokens: knocked out of the context at every layer, or deleted from the input."""

    KNOCKOUT = "knockout"
    DELETION = "deletion"


class FirstToken(Setting):
    r"""What happens to position 0 (see :func:`eligible_keys`): as any position, kept out, or ranked."""

    SPECIAL = "special"
    PROTECT = "protect"
    RANK = "rank"


_SETTINGS: dict[str, type[Setting]] = {"protocol": Protocol, "granularity": Granularity, "removal": Removal,
                                       "first_token": FirstToken}  # the ProtocolConfig fields that take a Setting


@dataclass(frozen=True)
class ProtocolConfig:
    r"""
    How each example is ranked and intervened on. The settings with a fixed set of values are
    :class:`Setting` members; their values (``"layer"``, ``"head"``...) are taken too.
    """

    protocol: Protocol = Protocol.LAYER
    metrics: tuple[str, ...] = LAYER_METRICS
    bins: tuple[float, ...] = DEFAULT_BINS
    layers: tuple[int, ...] | None = None  # layer level: where to intervene (default all at once)
    granularity: Granularity = Granularity.TOKEN  # layer level
    absolute: bool = False
    renormalize: bool = False
    removal: Removal = Removal.KNOCKOUT  # input level
    remove_special: bool = False
    first_token: FirstToken = FirstToken.SPECIAL  # position 0 (see eligible_keys)
    batch_size: int = 16
    ig_steps: int = 50
    seed: int = 0
    reuse_clean: bool = True  # layer level: variants skip the blocks below the first intervened layer
    soft: bool = False  # also soft comprehensiveness and sufficiency (Zhao & Aletras, 2023)
    save_rankings: bool = False  # keep each example's ranked positions per metric (for rank agreement)

    def __post_init__(self) -> None:
        r"""Takes each :class:`Setting` by its value too; an unknown value is refused by :meth:`validate`."""
        for name, kind in _SETTINGS.items():
            value = getattr(self, name)
            if value in kind._value2member_map_:
                object.__setattr__(self, name, kind(value))

    def validate(self) -> None:
        r"""Raises an InputError on the first setting that cannot run."""
        for name, kind in _SETTINGS.items():
            kind.parse(getattr(self, name), name)
        allowed = layer_metrics() if self.protocol == Protocol.LAYER else input_metrics()
        unknown = [m for m in self.metrics if m not in allowed]
        if unknown:
            raise InputError(f"Unknown {self.protocol}-level metrics {unknown}; choose from {', '.join(allowed)}.")
        if not self.metrics or not self.bins:
            raise InputError("metrics and bins must each name at least one; leave them out for the defaults.")
        outside = [b for b in self.bins if not 0 < b <= 100]
        if outside:
            raise InputError(f"bins are percentages in (0, 100], got {outside}.")
        for name in ("batch_size", "ig_steps"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.layers is not None and not self.layers:
            raise InputError("layers is empty; pass None to intervene on every layer.")


def eligible_keys(special: Tensor, config: ProtocolConfig) -> Tensor:
    r"""
    The positions a protocol may rank and remove: every position but the special tokens (all of them with
    ``remove_special``), with position 0, the first token and the usual attention sink, decided by
    ``first_token`` whatever the tokenizer calls it: ``"protect"`` keeps it out, ``"rank"`` lets it in (a
    ``<bos>`` too), ``"special"`` treats it as any other position (so a ``<bos>`` sink is protected and a
    first word is ranked: the rule before ``first_token`` existed, the default for runs stored before it).

    Args:
        special (Tensor): ``(n,)`` bool, the special tokens of one sequence.
        config (ProtocolConfig): reads ``remove_special`` and ``first_token``.
    Returns:
        ``(n,)`` bool, True where a key may be ranked and removed.
    """
    eligible = torch.ones_like(special, dtype=torch.bool) if config.remove_special else ~special.bool()  # [n]
    if len(eligible) and config.first_token != FirstToken.SPECIAL:
        eligible[0] = config.first_token == FirstToken.RANK
    return eligible


def chosen_layers(config: ProtocolConfig, n_layers: int) -> list[int]:
    r"""
    The layers the layer level intervenes on, in ``[0, n_layers)``: every layer by default; negative
    indices count from the end; an index out of range or named twice raises (nothing wraps around).
    """
    return select_indices(None if config.layers is None else list(config.layers), n_layers, "layer")


def _generator(seed: int, key: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _forward(model: nn.Module, ids: Tensor, keep: int) -> Tensor:
    return model(ids, use_cache=False, logits_to_keep=keep).logits


def clean_scores(
    model: nn.Module, ids: Tensor, layer_indices: Sequence[int], metrics: Sequence[str], *, per_head: bool,
    keep: int
) -> tuple[dict[str, Tensor], Tensor]:
    r"""
    Every registered metric of one sequence from a single forward pass
    (:func:`~captum_cw.attribution.attribute_metrics`), and that pass's logits.

    Returns:
        ``{metric: (n_layers, n_heads or 1, n, n)}`` and logits ``(1, keep, vocab)``.
    """
    device = next(model.parameters()).device
    forward_args = {"use_cache": False, "logits_to_keep": keep}
    registered = [m for m in metrics if m in metric_names()]
    if not registered:
        with torch.no_grad():
            return {}, _forward(model, ids[None].to(device), keep)
    found = attribute_metrics(model, ids[None].to(device), registered, layers=list(layer_indices),
                              additional_forward_args=forward_args, per_head=per_head)
    scores = {m: (values[0] if per_head else values[0, :, None]) for m, values in found.scores.items()}
    return scores, found.output.logits


def _batched_reads(model, encoded: EncodedExample, sequence: int, removals: list[dict[int, Tensor]],
                   config: ProtocolConfig, clean_below: Tensor | None = None) -> Tensor:
    r"""
    What the measures read (:func:`~captum_cw.evaluation.sequences.sequence_reads`, ``(n_variants, k)``)
    from one sequence under each removal (a dict layer -> mask); each batch's logits are dropped once read.
    With ``clean_below`` (the clean output of the block before the first intervened layer), the
    blocks below that layer are not run again.
    """
    ids = encoded.sequences[sequence].to(next(model.parameters()).device)
    keep = encoded.rows_needed(sequence)
    start = min(removals[0]) if clean_below is not None else 0
    outputs = []
    for first in range(0, len(removals), config.batch_size):
        chunk = removals[first:first + config.batch_size]
        stacked = {layer: _stacked([removal[layer] for removal in chunk]) for layer in chunk[0]}
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(mask_values(model, stacked, renormalize=config.renormalize))
            if clean_below is not None and start > 0:
                stack.enter_context(skip_layers_below(model, start, clean_below))
            outputs.append(sequence_reads(encoded, sequence, _forward(model, ids.expand(len(chunk), -1), keep)))
    return torch.cat(outputs)


def _stacked(masks: list[Tensor]) -> Tensor:
    r"""Stacks removals of one layer; bool (all or nothing) ones become shares of 1 next to soft ones."""
    if any(mask.is_floating_point() for mask in masks):
        masks = [mask.float() for mask in masks]
    return torch.stack(masks)


def _digest(removal: dict[int, Tensor] | Tensor, seen: dict[int, bytes]) -> bytes:
    r"""A hash of a removal's masks (``seen`` keeps those of tensors met before: a mask shared by layers)."""
    masks = removal.items() if isinstance(removal, dict) else [(0, removal)]
    digest = hashlib.sha1()
    for layer, mask in masks:
        if id(mask) not in seen:
            content = mask.detach().cpu().contiguous()
            seen[id(mask)] = hashlib.sha1(f"{content.dtype}{tuple(content.shape)}".encode()
                                          + content.numpy().tobytes()).digest()
        digest.update(f"{layer}:".encode() + seen[id(mask)])
    return digest.digest()


def _distinct(removals_per_sequence: list[list]) -> tuple[list[list], list[int]]:
    r"""
    The variants whose removals differ in some sequence, once each, and for every variant the index of
    its distinct one: variants with identical removals in every sequence need one forward pass.
    """
    seen: dict[int, bytes] = {}
    keys = [tuple(_digest(removals[v], seen) for removals in removals_per_sequence)
            for v in range(len(removals_per_sequence[0]))]
    distinct: dict[tuple, int] = {}  # removal -> its index among the distinct ones
    kept: list[int] = []  # the first variant of each distinct removal
    index: list[int] = []  # each variant's distinct index
    for variant, key in enumerate(keys):
        if key not in distinct:
            distinct[key] = len(kept)
            kept.append(variant)
        index.append(distinct[key])
    return [[removals[v] for v in kept] for removals in removals_per_sequence], index


def _measure_variants(model, encoded: EncodedExample, removals_per_sequence: list[list[dict[int, Tensor]]],
                      config: ProtocolConfig, clean_below: list[Tensor | None] | None = None) -> list[dict]:
    r"""The example's measures under each variant (a removal per sequence); identical variants run once."""
    clean_below = clean_below or [None] * len(removals_per_sequence)
    distinct, index = _distinct(removals_per_sequence)
    reads = [_batched_reads(model, encoded, s, removals, config, clean_below[s]) for s, removals in enumerate(distinct)]
    measured = measure_reads(encoded, reads)
    return [measured[i] for i in index]


@dataclass(frozen=True)
class _Variant:
    r"""One intervention on an example: a metric's removal in one mode, of a bin's top keys or soft."""

    metric: str
    mode: str  # "comprehensiveness" or "sufficiency"
    percent: float | None  # the bin (ERASER's removal of the top keys); None: soft removal


def _variants(config: ProtocolConfig) -> list[_Variant]:
    r"""Every variant in record order: ERASER's (per metric, mode and bin), then the soft ones (per metric and mode)."""
    hard = [_Variant(m, mode, b) for m in config.metrics for mode in MODES for b in config.bins]
    return hard + ([_Variant(m, mode, None) for m in config.metrics for mode in MODES] if config.soft else [])


def _removals(scores: Tensor, eligible: Tensor, config: ProtocolConfig) -> tuple[list[Tensor], list[Tensor], Tensor]:
    r"""One metric's removals for every bin and mode from a single ranking, its soft ones, and that ranking."""
    ranks = key_ranks(scores, eligible, absolute=config.absolute)
    hard = [removal_from_ranks(ranks, eligible, b, mode) for mode in MODES for b in config.bins]
    soft = [soft_removal(scores, eligible, mode, absolute=config.absolute) for mode in MODES] if config.soft else []
    return hard, soft, ranks


def _layer_level(model, encoded: EncodedExample, config: ProtocolConfig, n_layers: int) -> ExampleRecord:
    layer_indices = chosen_layers(config, n_layers)
    per_head = config.granularity == Granularity.HEAD
    start = min(layer_indices) if config.reuse_clean else 0
    removals_per_sequence, clean_reads, clean_below = [], [], []
    rankings: dict[str, list] = {m: [] for m in config.metrics}
    for s, ids in enumerate(encoded.sequences):
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            recorded = stack.enter_context(record_layer_output(model, start - 1)) if start > 0 else {}
            scores, logits = clean_scores(model, ids, layer_indices, config.metrics, per_head=per_head,
                                          keep=encoded.rows_needed(s))
        clean_reads.append(sequence_reads(encoded, s, logits))
        clean_below.append(recorded.get("output"))
        n = len(ids)
        device = logits.device
        shape = (len(layer_indices), next(iter(scores.values())).shape[1] if scores else 1, n, n)
        if "random" in config.metrics:
            generator = _generator(config.seed, f"{encoded.example.id}/{s}")
            scores["random"] = torch.rand(shape, generator=generator).to(device)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # [query, key]
        eligible = causal & eligible_keys(encoded.special[s], config).to(device)[None, :]
        hard, soft = [], []
        for metric in config.metrics:
            metric_hard, metric_soft, ranks = _removals(scores[metric], eligible, config)  # each [layer, head|1, n, n]
            hard += metric_hard
            soft += metric_soft
            if config.save_rankings:  # the keys of the last row, per layer (and head)
                last = ranked_positions(ranks[:, :, -1], eligible[-1])  # [layer][head][position]
                rankings[metric].append(last if per_head else [heads[0] for heads in last])
        removals_per_sequence.append([{layer: masks[k] for k, layer in enumerate(layer_indices)}
                                      for masks in hard + soft])
    clean = measure_reads(encoded, clean_reads)[0]
    perturbed = _measure_variants(model, encoded, removals_per_sequence, config, clean_below)
    return _record(encoded, config, clean, perturbed, rankings=rankings if config.save_rankings else None)


def _record(encoded: EncodedExample, config: ProtocolConfig, clean: dict, perturbed: list[dict],
            rankings: dict[str, list] | None = None, ig_completeness: IGCompleteness | None = None) -> ExampleRecord:
    r"""
    The example's record: each variant's measures (:func:`_variants`, in their order) compared with the clean ones,
    by metric, mode and bin key (ERASER's) or by metric and mode (soft).
    """
    label = encoded.example.label
    results: dict[str, dict[str, dict[str, Measures]]] = {}
    soft: dict[str, dict[str, Measures]] = {}
    for variant, measured in zip(_variants(config), perturbed, strict=True):
        measures = compare(clean, measured, label)
        if variant.percent is None:
            soft.setdefault(variant.metric, {})[variant.mode] = measures
        else:
            results.setdefault(variant.metric, {}).setdefault(variant.mode, {})[bin_key(variant.percent)] = measures
    clean_form = cast("ChoiceClean | TextClean", clean)  # measure() builds the form of the example's kind
    return ExampleRecord(id=encoded.example.id, label=label, clean=clean_form, results=results,
                         ig_completeness=ig_completeness, soft=soft or None,
                         rankings=rankings)


def _input_scores(model, encoded: EncodedExample, clean: dict, metrics: Sequence[str], config: ProtocolConfig,
                  n_layers: int) -> tuple[dict[str, Tensor], IGCompleteness | None]:
    r"""
    One score per token of the predicted choice's sequence ``(n,)``, per metric, and
    with IG its completeness check (else None).
    """
    choice = encoded.choices[clean["prediction"]]
    ids = encoded.sequences[choice.sequence]
    n = len(ids)
    rows = torch.arange(choice.start, choice.start + len(choice.tokens))
    rows = rows[rows < n]  # a collapsed (single-token) choice predicts from the last context row
    scores: dict[str, Tensor] = {}
    aggregated = [m for m in metrics if m not in ("ig", "random")]
    if aggregated:
        wanted = list(dict.fromkeys(_input_metric(m)[0] for m in aggregated))
        matrices, _ = clean_scores(model, ids, range(n_layers), wanted, per_head=False, keep=1)
        for metric in aggregated:
            family, aggregation = _input_metric(metric)
            token_level = matrices[family][:, 0]  # [layer, n, n]
            scores[metric] = aggregate_layers(token_level, rows.to(token_level.device), aggregation).sum(0).cpu()
    if "random" in metrics:
        scores["random"] = torch.rand(n, generator=_generator(config.seed, encoded.example.id))
    completeness = None
    if "ig" in metrics:
        scores["ig"], completeness = _integrated_gradients(model, encoded, clean, config)
    return scores, completeness


def _integrated_gradients(model, encoded: EncodedExample, clean: dict,
                          config: ProtocolConfig) -> tuple[Tensor, IGCompleteness]:
    r"""
    IG scores ``(n,)`` of the predicted choice's log-likelihood, and their completeness:
    ``attribution_sum`` should equal ``output_change`` = f(input) - f(baseline), with
    f(input) taken from the clean run; the gap shrinks with ``ig_steps``.
    """
    prediction = clean["prediction"]
    choice = encoded.choices[prediction]
    ids = encoded.sequences[choice.sequence].to(next(model.parameters()).device)
    keep = encoded.rows_needed(choice.sequence)
    view = EncodedExample(encoded.example, encoded.sequences, [choice], encoded.special)

    def predicted_loglik(input_ids: Tensor) -> Tensor:
        return sequence_reads(view, choice.sequence, _forward(model, input_ids, keep))[:, 0]

    baseline_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    baseline = torch.full_like(ids[None], baseline_id)
    ig = LayerIntegratedGradients(predicted_loglik, model.get_input_embeddings())
    with _frozen(model):
        attributions = ig.attribute(ids[None], baselines=baseline, n_steps=config.ig_steps,
                                    internal_batch_size=config.batch_size)
    with torch.no_grad():
        output_change = clean["logliks"][prediction] - float(predicted_loglik(baseline)[0])
    scores = attributions.sum(-1)[0].detach().cpu()  # [n]
    return scores, IGCompleteness(attribution_sum=float(scores.double().sum()), output_change=output_change)


@contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    r"""Turns off the parameters' gradients, which IG does not need (it saves their backward pass)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for parameter in trainable:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


def _input_level(model, encoded: EncodedExample, config: ProtocolConfig, n_layers: int) -> ExampleRecord:
    if not encoded.choices:
        raise InputError("the input-level protocol explains a prediction: use it on a multiple-choice task "
                         "(mmlu, winogrande, boolq); text tasks take --protocol layer.")
    clean = measure_unperturbed(model, encoded)
    scores, completeness = _input_scores(model, encoded, clean, config.metrics, config, n_layers)
    # only the context shared by every choice is ranked: its positions mean the same token in every sequence
    contexts = [encoded.sequences[c.sequence][: c.start + 1] for c in encoded.choices]
    shared = min(len(c) for c in contexts)
    while shared > 0 and any(not torch.equal(c[:shared], contexts[0][:shared]) for c in contexts):
        shared -= 1
    eligible = torch.zeros(len(encoded.sequences[encoded.choices[clean["prediction"]].sequence]), dtype=torch.bool)
    eligible[:shared] = eligible_keys(encoded.special[encoded.choices[0].sequence][:shared], config)
    hard, soft, rankings = [], [], {}
    for metric in config.metrics:
        metric_hard, metric_soft, ranks = _removals(scores[metric][: len(eligible)], eligible, config)  # each [n]
        hard += metric_hard
        soft += metric_soft
        rankings[metric] = ranked_positions(ranks, eligible)
    token_sets = hard + soft  # bool (removed) or float (share removed) over the shared context
    if config.removal == Removal.DELETION:
        distinct, index = _distinct([token_sets])
        measured = [_deleted(model, encoded, tokens) if not tokens.is_floating_point()
                    else _scaled_embeddings(model, encoded, tokens) for tokens in distinct[0]]
        perturbed = [measured[i] for i in index]
    else:
        removals_per_sequence = []
        for ids in encoded.sequences:
            n = len(ids)
            own = ~torch.eye(n, dtype=torch.bool)
            masks = [(_pad(tokens, n)[None, :] * own if tokens.is_floating_point() else _pad(tokens, n)[None, :] & own)
                     for tokens in token_sets]  # [n, n]: every row but the token's own
            removals_per_sequence.append([{layer: mask[None] for layer in range(n_layers)} for mask in masks])
        perturbed = _measure_variants(model, encoded, removals_per_sequence, config)
    return _record(encoded, config, clean, perturbed, rankings=rankings if config.save_rankings else None,
                   ig_completeness=completeness)


def _pad(tokens: Tensor, n: int) -> Tensor:
    out = torch.zeros(n, dtype=tokens.dtype)
    out[: len(tokens)] = tokens[:n]
    return out


def _deleted(model, encoded: EncodedExample, tokens: Tensor) -> dict:
    r"""Measures the example with the given shared-context tokens deleted from every sequence."""
    sequences, choices = [], []
    for choice in encoded.choices:
        ids = encoded.sequences[choice.sequence]
        keep = ~_pad(tokens, len(ids))
        sequences.append(ids[keep])
        choices.append(Choice(len(sequences) - 1, int(keep[: choice.start + 1].sum()) - 1, choice.tokens))
    return measure_unperturbed(model, EncodedExample(encoded.example, sequences, choices, [s == -1 for s in sequences]))


def _scaled_embeddings(model, encoded: EncodedExample, shares: Tensor) -> dict:
    r"""
    Measures the example with each shared-context token's input embedding scaled by ``1 - share`` in every
    sequence: soft removal where hard removal deletes tokens (Zhao & Aletras's own perturbation, in expectation).
    """
    device = next(model.parameters()).device
    logits = []
    for s, ids in enumerate(encoded.sequences):
        keep = (1 - _pad(shares, len(ids))).to(device)  # [n]

        def scaled(module, args, output, keep=keep):
            return output * keep[None, :, None].to(output.dtype)

        handle = model.get_input_embeddings().register_forward_hook(scaled)
        try:
            with torch.no_grad():
                logits.append(_forward(model, ids[None].to(device), encoded.rows_needed(s)))
        finally:
            handle.remove()
    return measure(encoded, logits)[0]


def measure_unperturbed(model: nn.Module, encoded: EncodedExample) -> dict:
    r"""The example's measures (``logliks`` and ``prediction``, or ``nll``) from one plain forward per sequence."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = [_forward(model, ids[None].to(device), encoded.rows_needed(s))
                  for s, ids in enumerate(encoded.sequences)]
    return measure(encoded, logits)[0]


def example_record(model: nn.Module, encoded: EncodedExample, config: ProtocolConfig) -> ExampleRecord:
    r"""Runs one example through the protocol; :func:`evaluate_example` describes what its record holds."""
    run = _layer_level if config.protocol == Protocol.LAYER else _input_level
    return run(model, encoded, config, len(find_attention_layers(model)))


def evaluate_example(model: nn.Module, encoded: EncodedExample, config: ProtocolConfig) -> Record:
    r"""
    Runs one example through the protocol (:func:`example_record`), in the form ``records.jsonl`` holds it.

    Returns:
        A JSON-ready :class:`~captum_cw.evaluation.records.Record` ``{"id", "label", "clean",
        "results": {metric: {mode: {bin key: measures}}}}``; with IG also ``"ig_completeness":
        {"attribution_sum", "output_change"}``; with ``soft`` also ``"soft": {metric: {mode: measures}}``;
        with ``save_rankings`` also ``"rankings": {metric: positions}``, the eligible positions most
        important first: at the input level one list (the shared context), at the layer level the keys of
        each sequence's last row, ``[sequence][layer]`` (``[sequence][layer][head]`` per head).
    """
    return example_record(model, encoded, config).to_json()
