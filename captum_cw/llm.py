"""Text front end: contribution weights of prompts for given or generated targets, as captum's LLMAttributionResult."""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import torch
from captum.attr import LLMAttributionResult, TextTemplateInput, TextTokenInput
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from captum_cw.attribution import attributor_for
from captum_cw.errors import InputError, UnsupportedSetupError, refuse_captum_arguments, require_model
from captum_cw.exclusions import check_exclusion, excluded_tokens
from captum_cw.layer_aggregation import LAYER_AGGREGATIONS, aggregate_layers, in_forward_order
from captum_cw.metrics import ATTENTION, CW_INTER, deprecated_variant
from captum_cw.models import readable_tokens
from captum_cw.positions import Positions

try:  # captum's own decoding of ids into readable tokens ('Paris', not 'ĠParis')
    from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens
except ImportError:  # pragma: no cover - captum versions without it
    _convert_ids_to_pretty_tokens = None

__all__ = ["DEFAULT_GEN_ARGS", "LAYER_AGGREGATIONS", "LLMContributionAttribution", "aggregate_layers"]

Prompt: TypeAlias = str | TextTokenInput | TextTemplateInput
Target: TypeAlias = str | Tensor | Sequence[int] | None

DEFAULT_GEN_ARGS: dict[str, Any] = {"max_new_tokens": 25, "do_sample": False, "temperature": None, "top_p": None}
"""What ``target=None`` generates with when ``gen_args`` is empty: captum's LLMAttribution defaults (greedy)."""

_ATTRIBUTE_ARGUMENTS = ("inp", "target", "skip_tokens", "num_trials", "gen_args", "merge_subwords", "batch_size",
                        "exclude")
"""What :meth:`LLMContributionAttribution.attribute` takes, named when it is given another keyword argument."""


def _clean_token(text: str) -> str:
    return text.replace("\n", "\\n").strip()  # as captum cleans its pretty tokens


def _pretty_tokens(ids: Sequence[int], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    r"""Tokens as captum's LLMAttribution shows its output tokens: the text each id stands for."""
    if _convert_ids_to_pretty_tokens is None:  # pragma: no cover
        return [_clean_token(token) for token in readable_tokens(tokenizer, ids)]
    with warnings.catch_warnings(record=True) as caught:  # captum warns once per token it cannot re-encode
        warnings.simplefilter("always")
        tokens = _convert_ids_to_pretty_tokens(torch.as_tensor(list(ids), dtype=torch.long), tokenizer)
    if caught:
        warnings.warn("the decoded text does not re-encode to the same ids, so tokens were decoded one id at a time "
                      "(captum's fallback).", stacklevel=3)
    return tokens


def _reencoded_offsets(ids: list[int], tokenizer) -> tuple[str, list[tuple[int, int]]] | None:
    r"""
    ``(text, character span of each id)`` from the decoded text re-encoded with offsets,
    as captum's pretty tokens are found; None where the tokenizer has no offsets (slow
    tokenizers) or re-encoding the text does not give ``ids`` back.
    """
    text = tokenizer.decode(ids)
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError, KeyError):
        return None
    if list(encoded["input_ids"]) != list(ids):
        return None
    return text, [tuple(span) for span in encoded["offset_mapping"]]


def _word_groups(ids: list[int], tokenizer, keep: list[bool]) -> tuple[list[list[int]], list[str]]:
    r"""
    The kept positions of ``ids`` grouped into words, and each word's text.

    A word is a run of tokens with no whitespace between or inside them ("Paris."
    is one word, "\n" one of its own); special tokens are words of their own. The
    boundaries come from the tokenizer's offsets on the decoded text; without them
    (slow tokenizers, text that does not re-encode to ``ids``), from the token
    strings: a token starting with 'Ġ' or '▁', or with whitespace, starts a word,
    as does the token after one that ends with whitespace.
    """
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    spans = _reencoded_offsets(ids, tokenizer)
    starts = []
    if spans is not None:
        text, offsets = spans
        for j, (start, _) in enumerate(offsets):
            previous_end = offsets[j - 1][1] if j else 0
            starts.append(j == 0 or ids[j] in special or ids[j - 1] in special or start > previous_end
                          or (start < len(text) and text[start].isspace())
                          or (previous_end > 0 and text[previous_end - 1].isspace()))

        def label(group: list[int]) -> str:
            return _clean_token(text[min(offsets[p][0] for p in group):max(offsets[p][1] for p in group)])
    else:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        strings = [tokenizer.convert_tokens_to_string([piece]) for piece in pieces]
        for j, piece in enumerate(pieces):
            starts.append(j == 0 or ids[j] in special or ids[j - 1] in special or piece.startswith(("Ġ", "▁"))
                          or strings[j][:1].isspace() or strings[j - 1][-1:].isspace())

        def label(group: list[int]) -> str:
            return _clean_token(tokenizer.convert_tokens_to_string([pieces[p] for p in group]))
    word = torch.tensor(starts, dtype=torch.long).cumsum(0) - 1  # [n] word index of each token
    groups: dict[int, list[int]] = {}
    for position, kept in enumerate(keep):
        if kept:
            groups.setdefault(int(word[position]), []).append(position)
    words = list(groups.values())
    return words, [label(group) for group in words]


def _template_spans(inp: TextTemplateInput) -> tuple[str, list[list[tuple[int, int]]]]:
    r"""The text of a TextTemplateInput and the character spans of each of its values in it."""
    markers = [f"\ue000{i}\ue001" for i in range(len(inp.values))]
    marked = inp.format_fn(**dict(zip(inp.dict_keys, markers))) if inp.dict_keys else inp.format_fn(*markers)
    parts: list[str] = []
    spans: list[list[tuple[int, int]]] = [[] for _ in inp.values]
    length, last = 0, 0
    for match in re.finditer("\ue000(\\d+)\ue001", marked):
        literal, value = marked[last:match.start()], inp.values[int(match.group(1))]
        parts += [literal, value]
        length += len(literal)
        spans[int(match.group(1))].append((length, length + len(value)))
        length += len(value)
        last = match.end()
    parts.append(marked[last:])
    text = "".join(parts)
    if text != inp.to_model_input():
        raise InputError("the TextTemplateInput's template changes its values (a format spec or a template function "
                         "that edits them), so its segments cannot be found in the text; use plain '{}' fields.")
    return text, spans


def _one_target_per_prompt(prompts: list[Prompt], target: Target | Sequence[Target], *, single: bool) -> list[Target]:
    r"""The target of each prompt: the one target of a single prompt, None for every prompt, or one per prompt."""
    if single or target is None:  # one prompt's target, or none for every prompt (checked by _target_ids)
        return [cast(Target, target)] * (len(prompts) if target is None else 1)
    if isinstance(target, (list, tuple)) and len(target) == len(prompts):
        return list(target)
    raise InputError(f"inp is a list of {len(prompts)} prompts, so target must be None or a list of "
                     f"{len(prompts)} targets (one per prompt), got {target!r}.")


def _check_counts(num_trials: int, batch_size: int) -> None:
    r"""Refuses a ``num_trials`` or ``batch_size`` that is not a positive int."""
    if isinstance(num_trials, bool) or not isinstance(num_trials, int) or num_trials < 1:
        raise InputError(f"num_trials must be a positive int, got {num_trials!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive int (prompts per forward pass), got {batch_size!r}.")


@dataclass
class _Prompt:
    ids: Tensor  # [n_prompt] token ids
    features: Tensor  # [n_prompt, n_features] 1 where a feature sums the token's score
    labels: list[str]


class LLMContributionAttribution:
    r"""
    Contribution weights of each prompt token (or word, or template segment) for
    each token of a target continuation, given or generated; captum's
    ``LLMAttribution`` interface with lists of prompts computed in batched passes.

    For target token ``t`` the query row is the position that predicts it (the
    token before it). Heads are aggregated as :class:`~captum_cw.ContributionWeights` does
    (sum for inter-head, mean for intra-head and attention); layers by
    ``layer_aggregation``: ``"last"`` (the deepest selected layer), ``"mean"``
    (their mean), ``"magnitude"`` (the mean of their absolute values) or
    ``"rollout"``. ``token_attr[t, j]`` is the score of prompt feature ``j`` for
    target token ``t``; ``seq_attr`` is its sum over target tokens, as captum's
    ``LLMAttribution`` sums over the target sequence.

    Rollout (:func:`captum_cw.layer_aggregation.rollout`) is ``R = A_L' ... A_1'``
    with ``A' = (A + I) / 2``: it follows the scores through the residual stream,
    half of each position's update coming from the layer. Inter-head contribution
    weights keep rows summing to 1 (as attention does), so rows of ``R`` sum to 1
    too, but the scores are signed: an entry of ``R`` is the net, signed share of
    all paths from a prompt token to the row, and positive and negative paths
    cancel; it is not a probability. Because the factors multiply, a key that takes
    most of the mass in many layers compounds: on SmolLM2-135M (30 layers, the first
    token an attention sink) rollout gives the first token about 1.0 and the next
    ~1e-5, which describes the sink more than the prompt; prefer ``"mean"`` or
    ``"last"`` there, or leave the first token out of the selection with
    ``skip_tokens`` (its score is then simply not shown), or zero it with
    ``exclude="first"`` (``"sinks"`` for every sink).

    Args:
        model (nn.Module): a causal language model of a supported architecture
                    (``generate`` is needed for ``target=None``).
        tokenizer (PreTrainedTokenizerBase): its tokenizer (a fast one for
                    ``TextTemplateInput``).
        layer_aggregation (str, optional): ``"last"``, ``"mean"``, ``"magnitude"`` or ``"rollout"``.
                    Default: ``"mean"``
        metric (str, optional): a registered metric's name or alias
                    (:func:`captum_cw.metrics.metric_names`): ``"cw_inter"``,
                    ``"cw_intra"``, or a baseline such as ``"attention"``.
                    Default: ``"cw_inter"``
        layers (Sequence[int], optional): layers to use. Default: all.
        heads (Sequence[int], optional): heads to use. Default: all.
        variant (str, optional): deprecated: the former name of ``metric``
                    (``"inter"``, ``"intra"``, ``"attention"``), with a DeprecationWarning.

    Examples::

        >>> explainer = LLMContributionAttribution(model, tokenizer)
        >>> result = explainer.attribute("The capital of France is", " Paris")  # one prompt: one result
        >>> result.input_tokens, result.output_tokens, result.token_attr.shape
        (['The', 'capital', 'of', 'France', 'is'], ['Paris'], torch.Size([1, 5]))
        >>> results = explainer.attribute(["Paris is in", "Rome is in"], [" France", " Italy"])  # one padded pass
        >>> [r.input_tokens for r in results]
        [['Paris', 'is', 'in'], ['Rome', 'is', 'in']]
        >>> explainer.attribute("The capital of France is", gen_args={"max_new_tokens": 2, "do_sample": False}
        ...                     ).output_tokens  # target=None: explain what the model generates
        ['Paris', '.']
        >>> explainer.attribute("Its capitalisation", " unbelievable", merge_subwords=True).input_tokens
        ['Its', 'capitalisation']
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        layer_aggregation: str = "mean",
        metric: str | None = None,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        *,
        variant: str | None = None,
        **captum_arguments: Any,
    ) -> None:
        require_model(model, type(self).__name__)
        refuse_captum_arguments(type(self).__name__, captum_arguments)
        if layer_aggregation not in LAYER_AGGREGATIONS:
            raise InputError(f"layer_aggregation must be one of {', '.join(LAYER_AGGREGATIONS)}, "
                             f"got {layer_aggregation!r}.")
        self.model = model
        self.tokenizer = tokenizer
        self.layer_aggregation = layer_aggregation
        given = deprecated_variant(metric, variant, type(self).__name__)
        self.attributor = attributor_for(CW_INTER.name if given is None else given, model, layers, heads)
        forward = inspect.signature(model.forward).parameters
        self._takes_position_ids = "position_ids" in forward

    def attribute(
        self,
        inp: Prompt | Sequence[Prompt],
        target: Target | Sequence[Target] = None,
        skip_tokens: Sequence[int] | Sequence[str] | None = None,
        num_trials: int = 1,
        gen_args: Mapping[str, Any] | None = None,
        *,
        merge_subwords: bool = False,
        batch_size: int = 16,
        exclude: str | None = None,
        **captum_arguments: Any,
    ) -> LLMAttributionResult | list[LLMAttributionResult]:
        r"""
        Args:
            inp (str, TextTokenInput, TextTemplateInput or a list of them): the
                        prompt(s). A string is tokenized as ``tokenizer(inp)`` does
                        (special tokens such as BOS included); a ``TextTokenInput``
                        gives its ids and leaves out its skipped tokens; a
                        ``TextTemplateInput`` scores each of its values (segments):
                        the sum over the tokens of the segment (a token that straddles
                        a boundary goes to the segment it overlaps most; the
                        template's own text is not a feature), and with a ``mask``
                        each value gets its group's sum, as captum formats it.
            target (str, Tensor, list of ids, None, or a list of these, optional):
                        the continuation to explain, as text (tokenized without
                        special tokens) or token ids; one per prompt when ``inp`` is
                        a list. None: the model generates it from the prompt, as
                        captum does, with ``model.generate(ids, attention_mask=...,
                        **gen_args)``, prompt by prompt, so that each continuation is
                        the one its prompt alone generates.
                        Default: None
            skip_tokens (list of int or str, optional): prompt tokens to leave out of
                        the features, as ids or as ``convert_ids_to_tokens`` spells
                        them (e.g. ``"<|im_start|>"``, ``"ĠParis"``), as captum's
                        ``TextTokenInput(skip_tokens=...)``; for string and
                        ``TextTokenInput`` prompts (added to the latter's own). The
                        skipped tokens stay in the model's input.
                        Default: None
            num_trials (int, optional): accepted for captum compatibility. Contribution
                        weights are deterministic, so every trial would give the
                        same scores and one is run.
                        Default: 1
            gen_args (dict, optional): arguments of ``model.generate`` for
                        ``target=None``; empty or None means :data:`DEFAULT_GEN_ARGS`
                        (greedy, 25 new tokens). A ValueError if no target is None.
                        Default: None
            merge_subwords (bool, optional): sum the scores of the tokens of each word
                        (a run of tokens with no whitespace between them, from the
                        tokenizer's offsets or its 'Ġ'/'▁' markers) into one feature,
                        on both sides: input features are words (their columns
                        summed), output tokens are words (their rows summed, their
                        probabilities multiplied, the probability of the word).
                        Labels are the words' text. Not for ``TextTemplateInput``.
                        Default: False
            batch_size (int, optional): prompts per forward pass (left padded, with
                        the attention mask and position ids; every result equals its
                        prompt's own run).
                        Default: 16
            exclude (str, optional): prompt tokens whose scores are set to 0 (they stay
                        features, so a ranking of the features leaves them out unless
                        a feature holds other tokens too), with
                        :class:`~captum_cw.TokenContributions`' meaning
                        (:func:`captum_cw.exclusions.excluded_tokens`): ``"first"`` (the
                        prompt's first token), ``"special"`` (the model's BOS, EOS and
                        padding ids) or ``"sinks"`` (those and every key taking more than
                        :data:`~captum_cw.exclusions.SINK_THRESHOLD` of the attention of
                        the row that predicts a target token, mean over heads and the
                        selected layers: decided per target token). The excluded scores
                        are dropped, not redistributed, so a row of ``token_attr`` no
                        longer sums to what it sums to without them (for inter-head
                        contribution weights, 1 minus the target prefix's share); this
                        front end returns no convergence delta. To leave tokens out of the
                        features instead, use ``skip_tokens``.
                        Default: None
            **captum_arguments: refused with an
                        :class:`~captum_cw.errors.UnsupportedArgumentError` (a TypeError)
                        that says what to do instead (Captum's ``n_steps``,
                        ``baselines``, ``use_cached_outputs``...:
                        :data:`captum_cw.errors.CAPTUM_ARGUMENTS`).

        Returns:
            *LLMAttributionResult* for one prompt, a list of them (in the order given)
            for a list, each with ``seq_attr`` ``(n_features,)``, ``token_attr``
            ``(n_target_tokens, n_features)``, ``output_probs`` ``(n_target_tokens,)``
            (the model's probability of each target token given everything before
            it), ``output_tokens`` decoded as captum decodes them (``"Paris"``,
            not ``"ĠParis"``) and ``input_tokens``: for ``TextTokenInput`` and
            ``TextTemplateInput`` their ``values``, as captum's LLMAttribution
            returns them; for a string, captum's decoding of the prompt's ids; the
            words with ``merge_subwords``.
        """
        refuse_captum_arguments(f"{type(self).__name__}.attribute", captum_arguments, _ATTRIBUTE_ARGUMENTS)
        single = isinstance(inp, (str, TextTokenInput, TextTemplateInput))
        prompts = [inp] if single else list(inp) if isinstance(inp, Sequence) else None
        if not prompts:
            raise InputError("inp must be a string, a TextTokenInput, a TextTemplateInput or a non-empty list of them, "
                             f"got {inp!r}.")
        targets = _one_target_per_prompt(prompts, target, single=single)
        _check_counts(num_trials, batch_size)
        if gen_args and all(t is not None for t in targets):
            raise InputError("gen_args is only used to generate a missing target (target=None); every prompt has "
                             "a target here, so leave gen_args out.")
        check_exclusion(exclude, named_only=True)
        skip_ids = self._skip_ids(skip_tokens)
        prepared = [self._prepare_prompt(prompt, skip_ids, merge=bool(merge_subwords)) for prompt in prompts]
        target_ids = [self._target_ids(p.ids, t, gen_args) for p, t in zip(prepared, targets)]
        results: list[LLMAttributionResult | None] = [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prepared[i].ids) + len(target_ids[i]))
        for begin in range(0, len(order), batch_size):
            chunk = order[begin:begin + batch_size]
            batch = self._attribute_batch([prepared[i] for i in chunk], [target_ids[i] for i in chunk],
                                          merge=bool(merge_subwords), exclude=exclude)
            for i, result in zip(chunk, batch):
                results[i] = result
        return results[0] if single else results

    def _skip_ids(self, skip_tokens) -> set[int]:
        if not skip_tokens:
            return set()
        if isinstance(skip_tokens, (str, int)):
            skip_tokens = [skip_tokens]
        ids = set()
        for token in skip_tokens:
            if isinstance(token, str):
                index = self.tokenizer.convert_tokens_to_ids(token)
                unknown = getattr(self.tokenizer, "unk_token", None)
                if not isinstance(index, int) or (index == getattr(self.tokenizer, "unk_token_id", None)
                                                  and token != unknown):
                    raise InputError(f"skip_tokens: {token!r} is not a token of this tokenizer; pass ids, or tokens "
                                     "as tokenizer.convert_ids_to_tokens spells them (e.g. 'ĠParis' for ' Paris').")
                ids.add(int(index))
            elif isinstance(token, int) and not isinstance(token, bool):
                ids.add(token)
            else:
                raise InputError(f"skip_tokens must hold token ids (int) or token strings, got {token!r}.")
        return ids

    def _prepare_prompt(self, inp: Prompt, skip_ids: set[int], *, merge: bool) -> _Prompt:
        r"""The prompt's ids and which tokens each interpretable feature sums."""
        if isinstance(inp, TextTemplateInput):
            if merge or skip_ids:
                raise InputError("merge_subwords and skip_tokens apply to token features; a TextTemplateInput's "
                                 "features are its values already (leave a segment out of the values instead).")
            return self._prepare_template(inp)
        if isinstance(inp, TextTokenInput):
            ids = inp.inp_tensor[0].cpu()
            keep = inp.itp_mask[0].cpu().bool() if inp.itp_mask is not None else torch.ones(len(ids), dtype=torch.bool)
        elif isinstance(inp, str):
            ids = torch.as_tensor(self.tokenizer(inp, return_tensors="pt")["input_ids"])[0]
            keep = torch.ones(len(ids), dtype=torch.bool)
        else:
            raise InputError("inp must be a string, captum's TextTokenInput or TextTemplateInput (or a list of them), "
                             f"got {type(inp).__name__}.")
        if len(ids) == 0:
            raise InputError("the prompt is empty: the first target token needs a position before it that "
                             "predicts it; pass a non-empty prompt (or a tokenizer that adds a BOS token).")
        if skip_ids:
            keep &= torch.tensor([int(i) not in skip_ids for i in ids], dtype=torch.bool)
        positions = keep.nonzero().flatten().tolist()
        if merge:
            groups, labels = _word_groups(ids.tolist(), self.tokenizer, keep.tolist())
        else:
            groups = [[p] for p in positions]
            if isinstance(inp, TextTokenInput):  # captum's values: convert_ids_to_tokens of the kept ids
                kept = self.tokenizer.convert_ids_to_tokens(ids[keep].tolist()) if skip_ids else inp.values
                labels = [kept] if isinstance(kept, str) else list(kept)
            else:
                pretty = _pretty_tokens(ids.tolist(), self.tokenizer)
                labels = [pretty[p] for p in positions]
        return _Prompt(ids, self._membership(len(ids), groups), list(labels))

    def _prepare_template(self, inp: TextTemplateInput) -> _Prompt:
        text, spans = _template_spans(inp)
        try:
            encoded = self.tokenizer(text, return_offsets_mapping=True)
        except NotImplementedError as error:
            raise UnsupportedSetupError("TextTemplateInput needs a fast tokenizer (with offsets) to find its "
                                        "segments' tokens.") from error
        ids = torch.as_tensor(encoded["input_ids"])
        if len(ids) == 0:
            raise InputError("the prompt is empty: the template and its values give no tokens.")
        segment_tokens: list[list[int]] = [[] for _ in inp.values]
        for position, (start, end) in enumerate(encoded["offset_mapping"]):
            overlaps = [max((min(end, e) - max(start, s) for s, e in value_spans), default=0) for value_spans in spans]
            best = max(range(len(overlaps)), key=overlaps.__getitem__, default=None)
            if best is not None and overlaps[best] > 0 and end > start:
                segment_tokens[best].append(position)
        group = getattr(inp, "formatted_mask", None) if inp.mask is not None else None
        if group is None:
            groups = segment_tokens
        else:  # every value reports the sum of its mask group, as captum's format_attr spreads it
            groups = [[p for j, tokens in enumerate(segment_tokens) if group[j] == group[i] for p in tokens]
                      for i in range(len(inp.values))]
        return _Prompt(ids, self._membership(len(ids), groups), list(inp.values))

    @staticmethod
    def _membership(n: int, groups: list[list[int]]) -> Tensor:
        membership = torch.zeros(n, len(groups))  # [token, feature]
        for feature, positions in enumerate(groups):
            membership[positions, feature] = 1.0
        return membership

    def _target_ids(self, prompt_ids: Tensor, target: Target, gen_args: Mapping[str, Any] | None) -> Tensor:
        if target is None:
            generate: Callable[..., Tensor] | None = getattr(self.model, "generate", None)
            if not callable(generate):
                raise UnsupportedSetupError(f"{type(self.model).__name__} has no generate(); pass the target to "
                                            "explain.")
            device = next(self.model.parameters()).device
            ids = prompt_ids[None].to(device)
            with torch.no_grad():
                output = generate(ids, attention_mask=torch.ones_like(ids), **dict(gen_args or DEFAULT_GEN_ARGS))
            output = output.sequences if hasattr(output, "sequences") else output
            target_ids = output[0, ids.shape[1]:].cpu()
            if len(target_ids) == 0:
                raise InputError(f"generation with {dict(gen_args or DEFAULT_GEN_ARGS)} produced no tokens; "
                                 "ask for at least one new token (max_new_tokens >= 1) or pass the target.")
            return target_ids
        if isinstance(target, str):
            encoded = self.tokenizer(target, add_special_tokens=False)["input_ids"]
            target_ids = torch.as_tensor(encoded, dtype=torch.long)
        elif isinstance(target, (Tensor, list, tuple)):
            target_ids = torch.as_tensor(target).flatten().cpu()
            if target_ids.numel() and (target_ids.is_floating_point() or target_ids.dtype == torch.bool):
                raise InputError(f"target ids must be integers, got {target_ids.dtype}.")
            target_ids = target_ids.long()
        else:
            raise InputError(f"target must be a string, token ids or None, got {type(target).__name__}.")
        if len(target_ids) == 0:
            raise InputError("target is empty; pass at least one target token.")
        return target_ids

    def _attribute_batch(self, prompts: list[_Prompt], targets: list[Tensor], *, merge: bool,
                         exclude: str | None) -> list[LLMAttributionResult]:
        r"""One forward pass for a batch: left padded, each example's rows picked from the union of rows."""
        lengths = [len(p.ids) + len(t) for p, t in zip(prompts, targets)]
        n = max(lengths)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        ids = torch.full((len(prompts), n), 0 if pad is None else pad, dtype=torch.long)  # [batch, n]
        mask = torch.zeros(len(prompts), n, dtype=torch.long)  # [batch, n]
        rows = []  # per example, the padded positions that predict its target tokens
        for b, (prompt, target) in enumerate(zip(prompts, targets)):
            offset = n - lengths[b]
            ids[b, offset:] = torch.cat([prompt.ids, target])
            mask[b, offset:] = 1
            rows.append(torch.arange(len(target)) + offset + len(prompt.ids) - 1)
        extra = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if self._takes_position_ids else None
        layers, metric = self.attributor.layers, self.attributor.metric
        metrics = list(dict.fromkeys([metric, ATTENTION] if exclude == "sinks" else [metric]))
        if self.layer_aggregation == "rollout":  # every row of every layer, composed in forward order
            wanted = None
            found = self.attributor.score(ids, mask, extra, None, metrics)
        else:  # the union of the rows the batch needs, once each
            wanted = torch.cat(rows).unique()  # sorted; some are padding in a shorter example (rows of 0)
            found = self.attributor.score(ids, mask, extra, Positions.shared(wanted, allow_padding=True), metrics)
        scores, output = in_forward_order(found.scores[metric.name], layers), found.output  # [b, layer, row, n]
        attention = found.scores[ATTENTION.name] if exclude == "sinks" else None  # [b, layer, row, n]
        excluded = excluded_tokens(exclude, ids, mask.bool(), self.model,
                                   None if attention is None else in_forward_order(attention, layers).transpose(1, 2))
        picked = []  # per example [target, n]
        for b in range(len(prompts)):
            example_rows = (rows[b] if wanted is None else torch.searchsorted(wanted, rows[b])).to(scores.device)
            example_scores = aggregate_layers(scores[b], example_rows, self.layer_aggregation)  # [target, n]
            left_out = excluded[b, example_rows.to(excluded.device)] if excluded.dim() == 3 else excluded[b][None]
            picked.append(torch.where(left_out.to(example_scores.device), 0.0, example_scores))
        results = []
        for b, (prompt, target) in enumerate(zip(prompts, targets)):
            offset = n - lengths[b]
            prompt_scores = picked[b][:, offset:offset + len(prompt.ids)].float().cpu()  # [target, n_prompt]
            token_attr = prompt_scores @ prompt.features  # [target, feature]
            log_probs = torch.log_softmax(output.logits[b, rows[b].to(output.logits.device)].float(), dim=-1)
            target_log_probs = log_probs.gather(-1, target[:, None].to(log_probs.device)).flatten().cpu()
            target_list = target.tolist()
            if merge:
                words, output_tokens = _word_groups(target_list, self.tokenizer, [True] * len(target_list))
                membership = self._membership(len(target_list), words)  # [target token, word]
                token_attr = membership.T @ token_attr
                target_log_probs = membership.T @ target_log_probs
            else:
                output_tokens = _pretty_tokens(target_list, self.tokenizer)
            results.append(LLMAttributionResult(
                input_tokens=prompt.labels,
                output_tokens=output_tokens,
                seq_attr=token_attr.sum(0),
                token_attr=token_attr,
                output_probs=target_log_probs.exp(),
            ))
        return results
