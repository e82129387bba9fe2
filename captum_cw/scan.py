"""One forward pass that hands each selected layer's geometry, chunk by chunk of query rows, to a callback."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache

from captum_cw.architectures import AttentionLayer
from captum_cw.capture import AttentionCall, capture_attention, take_rows
from captum_cw.errors import InputError, UnsupportedSetupError
from captum_cw.geometry import HeadGeometry
from captum_cw.positions import Positions
from captum_cw.self_check import LayerCheck, check_layer, projection_hooks, raise_on_mismatch

__all__ = [
    "CACHE_ARGUMENTS",
    "CHUNK_ELEMENTS",
    "ModelInputs",
    "check_inputs",
    "prepare_inputs",
    "scan_geometry",
    "untuple",
]

CHUNK_ELEMENTS = 2**24
r"""Numbers in one ``(batch, head, row, key)`` block when the chunk size is not given (at least one row): n = 512
with 9 heads is one chunk, n = 8192 chunks of 227 rows. A chunk holds a few such blocks at once (alpha, the
scores, their product), about 4-5 x 64 MiB in float32 and twice that in float64. Larger chunks spend less on
per-chunk work; the block bounds memory at long n."""


@dataclass
class ModelInputs:
    r"""What the model is called with, plus the padding mask that attribution needs."""

    main: Tensor  # [batch, n] token ids, or pixel values
    keyword: dict[str, Any]  # everything else passed to the model, attention_mask included
    padding_mask: Tensor | None  # [batch, n] bool, True = real token; None when nothing is padded

    @property
    def is_text(self) -> bool:
        return not torch.is_floating_point(self.main)


def prepare_inputs(
    model: nn.Module,
    inputs: Tensor | Mapping[str, Any],
    attention_mask: Tensor | None,
    additional_forward_args: Mapping[str, Any] | Sequence[Any] | None,
    device: torch.device,
) -> tuple[ModelInputs, tuple[Any, ...]]:
    r"""
    Normalises captum-style arguments into a model call.

    Positional ``additional_forward_args`` are named after the parameters of ``model.forward`` that they fill
    (after the main input), so that an attention mask or a cache passed positionally is recognised as one. An
    ``attention_mask`` among them is the attention mask; a different one given as well is refused.

    Args:
        model (nn.Module): the model that will be called.
        inputs (Tensor or Mapping): token ids ``(batch, n)`` or ``(n,)``, pixel values, or a dict with
                    ``input_ids`` / ``pixel_values`` and other model arguments.
        attention_mask (Tensor, optional): ``(batch, n)``, 1 for real tokens.
        additional_forward_args (dict or tuple, optional): more model arguments.
        device (torch.device): where the model's inputs go.
    Returns:
        The :class:`ModelInputs` and the positional ``additional_forward_args`` that could not be named.
    Raises:
        InputError: for inputs of another type, or two different attention masks.
    """
    keyword: dict[str, Any] = {}
    if isinstance(inputs, Mapping):
        keyword = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values")}
        main = inputs.get("input_ids", inputs.get("pixel_values"))
        if main is None:
            raise InputError("inputs is a mapping without 'input_ids' or 'pixel_values'; pass the token ids or "
                             "pixels.")
        if attention_mask is None:
            attention_mask = keyword.pop("attention_mask", None)
        else:
            keyword.pop("attention_mask", None)
    elif isinstance(inputs, Tensor):
        main = inputs
    else:
        raise InputError(
            "inputs must be a tensor of token ids / pixel values or a tokenizer's BatchEncoding, "
            f"got {type(inputs).__name__}."
        )
    if not torch.is_floating_point(main) and main.dim() == 1:
        main = main.unsqueeze(0)
    extra, positional = _name_additional_args(model, additional_forward_args)
    twice = sorted(set(extra) & set(keyword))
    if twice:
        raise InputError(f"{', '.join(twice)} given both in inputs and in additional_forward_args; pass each model "
                         "argument once.")
    attention_mask = _one_attention_mask(attention_mask, extra.pop("attention_mask", None))
    keyword.update(extra)
    main = main.to(device)
    padding_mask = None
    if attention_mask is not None:
        if attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
        if main.is_floating_point() or attention_mask.shape != main.shape:
            raise InputError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but inputs have shape "
                f"{tuple(main.shape)}; pass one 0/1 entry per token, shape (batch, n)."
            )
        attention_mask = attention_mask.to(device)
        keyword["attention_mask"] = attention_mask
        padding_mask = attention_mask.bool()
    keyword = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in keyword.items()}
    return ModelInputs(main, keyword, padding_mask), positional


def untuple(value: Any) -> tuple[bool, Any]:
    r"""Unwraps captum's one-tensor tuple of inputs (or attributions): ``(was a tuple, the value)``."""
    if not isinstance(value, tuple):
        return False, value
    if len(value) != 1:
        raise InputError(f"inputs is a tuple of {len(value)} tensors; captum_cw attributes one input (token ids or "
                         "pixels): pass (inputs,) and put the other model arguments in additional_forward_args.")
    return True, value[0]


def _name_additional_args(
    model: nn.Module, additional_forward_args: Mapping[str, Any] | Sequence[Any] | None
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    r"""``additional_forward_args`` as ``(keyword arguments, positional arguments left unnamed)``: a tuple is
    named after the parameters of ``model.forward`` that follow the main input, when each of them can be
    passed by name; else it stays positional."""
    if additional_forward_args is None:
        return {}, ()
    if isinstance(additional_forward_args, Mapping):
        return dict(additional_forward_args), ()
    positional = (tuple(additional_forward_args) if isinstance(additional_forward_args, (tuple, list))
                  else (additional_forward_args,))
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())[1:]  # after the main input
    except (TypeError, ValueError):  # no signature to read: the arguments stay positional
        return {}, positional
    named = parameters[:len(positional)]
    if len(named) < len(positional) or any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in named):
        return {}, positional
    return {parameter.name: value for parameter, value in zip(named, positional)}, ()


def _one_attention_mask(given: Tensor | None, additional: Any) -> Tensor | None:
    r"""The attention mask from ``attention_mask`` (or ``inputs``) and the one in ``additional_forward_args``:
    either may be None; two different ones are refused."""
    for mask in (given, additional):
        if mask is not None and not isinstance(mask, Tensor):
            raise InputError(f"attention_mask must be a tensor (batch, n) of 0/1, got {type(mask).__name__}.")
    if additional is None:
        return given
    if given is not None and (given.shape != additional.shape
                              or not torch.equal(given.cpu(), additional.cpu())):
        raise InputError("two different attention masks were given, one in additional_forward_args and one as "
                         "attention_mask (or in inputs); pass one of them.")
    return additional


#: keyword arguments that carry cached keys and values under the names transformers has used
CACHE_ARGUMENTS = ("past_key_values", "cache", "past_key_value", "layer_past")


def _refuse_cache(keyword: Mapping[str, Any], positional: tuple[Any, ...]) -> None:
    r"""Refuses cached keys in any form: a non-None cache argument by name, or a ``Cache`` anywhere."""
    named = [name for name in CACHE_ARGUMENTS if keyword.get(name) is not None]
    cached = [type(value).__name__ for value in (*keyword.values(), *positional) if isinstance(value, Cache)]
    if named or cached:
        given = named[0] if named else f"a {cached[0]}"
        raise UnsupportedSetupError(
            f"{given} is not supported: cached keys have no query rows to attribute and shift the rows by the "
            "cache's length. Pass the whole sequence (prompt and continuation) as inputs instead, without a cache."
        )


def check_inputs(model: nn.Module, model_inputs: ModelInputs, positional: tuple[Any, ...] = ()) -> None:
    r"""
    Refuses, before any forward pass, inputs that would fail late or give wrong scores.

    Args:
        model (nn.Module): the model that will be called.
        model_inputs (ModelInputs): as :func:`prepare_inputs` made them.
        positional (tuple, optional): the positional arguments left unnamed. Default: ()
    Raises:
        UnsupportedSetupError: for a model in training mode or cached keys.
        InputError: for token ids that are empty, not integers, not ``(batch, n)`` or outside
                    the vocabulary, and pixel values that are integers or not ``(batch, channels, height, width)``.
    """
    if any(module.training for module in model.modules()):
        raise UnsupportedSetupError("The model (or one of its modules) is in training mode: dropout would make its "
                                    "attention random and differ from the recomputed one. Call model.eval() first.")
    _refuse_cache(model_inputs.keyword, positional)
    main, expects = model_inputs.main, getattr(model, "main_input_name", "input_ids")
    if expects == "input_ids" and main.is_floating_point():
        raise InputError(f"inputs are {main.dtype}, but {type(model).__name__} takes token ids: pass the "
                         "tokenizer's input_ids (integers).")
    if expects == "pixel_values" and not main.is_floating_point():
        raise InputError(f"inputs are {main.dtype}, but {type(model).__name__} takes pixel values: pass the "
                         "image processor's pixel_values (floating point).")
    if main.is_floating_point():
        _check_pixels(model, main)
        return
    if main.dim() != 2:
        raise InputError(f"token ids must have shape (batch, n) or (n,), got {tuple(main.shape)}.")
    if main.numel() == 0:
        raise InputError(f"inputs have no tokens (shape {tuple(main.shape)}); pass at least one token per example.")
    get_embeddings: Any = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    vocabulary = getattr(embeddings, "num_embeddings", None)
    if vocabulary is not None:
        low, high = main.aminmax()
        if low < 0 or high >= vocabulary:
            raise InputError(f"token ids range over [{int(low)}, {int(high)}] but the model's vocabulary has "
                             f"{vocabulary} entries; encode the text with this model's own tokenizer.")


def _check_pixels(model: nn.Module, pixels: Tensor) -> None:
    r"""Refuses pixel values that are not ``(batch, channels, height, width)`` with the model's channels."""
    channels = getattr(getattr(model, "config", None), "num_channels", None)
    expected = f"(batch, {channels if isinstance(channels, int) else 'channels'}, height, width)"
    if pixels.dim() != 4 or (isinstance(channels, int) and pixels.shape[1] != channels):
        raise InputError(f"pixel values must have shape {expected}, got {tuple(pixels.shape)}; pass the image "
                         "processor's pixel_values (a single image as pixels[None]).")


def kernel_rows(call: AttentionCall, rows: Tensor) -> tuple[Tensor, Tensor] | None:
    r"""
    ``alpha`` ``(batch, head, row, key)`` and mixed values ``(batch, head, row, d_head)`` of ``rows`` as the
    attention kernel itself computed them, when it returned its weights in the dtype of the recomputation
    (eager in float32 or float64), else None. Taking them saves recomputing the scores, the softmax and
    ``alpha @ V``; the self-check still compares the two with the kernel's output (docs/DESIGN.md,
    "Self-check").
    """
    weights = call.weights
    if weights is None or weights.dtype != call.compute_dtype or weights.shape[-2:] != (
            call.query.shape[2], call.key.shape[2]) or weights.shape[1] != call.n_heads:
        return None
    alpha = take_rows(weights.detach(), 2, rows)  # [batch, head, row, key]
    mixed = take_rows(call.output.detach(), 1, rows).transpose(1, 2)  # [batch, head, row, d_head]
    return alpha, mixed


def scan_geometry(
    model: nn.Module,
    layers: Sequence[AttentionLayer],
    model_inputs: ModelInputs,
    positional_args: tuple[Any, ...],
    positions: Positions | None,
    on_chunk: Callable[[int, Tensor, HeadGeometry], None],
    chunk_size: int | None = None,
    *,
    verify: bool = True,
    grad: bool = False,
) -> Any:
    r"""
    Runs ``model`` once and calls ``on_chunk(k, rows, geometry)`` for each selected
    layer (``k`` is its index in ``layers``) and each chunk of the query ``rows`` that ``positions`` ask for
    (:meth:`~captum_cw.positions.Positions.computed_rows`; None: every row), ``chunk_size`` rows at a time (None:
    as many as keep ``alpha`` within :data:`CHUNK_ELEMENTS`).

    Padded query rows get all-zero ``alpha``; so do padded keys. A layer whose attention module runs twice
    in the pass (shared layers, as in ALBERT) is refused when it runs the second time. With ``verify``,
    a few rows of each layer's first chunk go through the self-check
    (:mod:`captum_cw.self_check`), which raises after the forward pass if the
    recomputation does not reproduce the model.

    With ``grad`` the pass records the autograd graph (the geometry stays detached), so that the caller can
    differentiate the output it returns (:mod:`captum_cw.target_contributions`).

    Returns:
        The model's own output.
    Raises:
        UnsupportedSetupError: if a selected attention module runs more than once.
        ValueError: if the recomputation does not reproduce the model (``verify``, :mod:`captum_cw.self_check`).
    """
    slot = {id(layer.attention): k for k, layer in enumerate(layers)}
    padding = model_inputs.padding_mask
    checks: list[LayerCheck] = []
    calls: Counter[int] = Counter()

    def on_call(call: AttentionCall) -> None:
        k = slot[id(call.module)]
        calls[k] += 1
        if calls[k] > 1:
            _refuse_shared_layer(model, layers[k])
        device = call.query.device
        n = call.query.shape[2]
        all_rows = (positions or Positions(None)).computed_rows(padding, call.query.shape[0], n).to(device)
        values = call.values()  # [batch, head, key, d_head]
        if padding is not None and padding.shape[1] == values.shape[2]:  # padded keys may hold NaN states
            values = torch.where(padding.to(device)[:, None, :, None], values, 0.0)
        projections = layers[k].head_projections(call.n_heads, call.compute_dtype).to(device)  # [head, d_head, d_model]
        per_chunk = chunk_size or max(1, CHUNK_ELEMENTS // (values.shape[0] * call.n_heads * values.shape[2]))
        for chunk, rows in enumerate(all_rows.split(per_chunk)):
            alpha, mixed = kernel_rows(call, rows) or (call.alpha(rows), None)  # [b, head, row, key], [.., d_head]
            if padding is not None and padding.shape[1] == alpha.shape[-1]:
                mask = padding.to(device)
                real_rows = mask[:, rows][:, None, :, None]  # [batch, 1, row, 1]
                alpha = alpha * mask[:, None, None, :] * real_rows
                mixed = None if mixed is None else torch.where(real_rows, mixed, 0.0)
            if verify and chunk == 0:
                checks.append(check_layer(layers[k], call, rows, alpha, values, projections, padding, hooks))
            on_chunk(k, rows, HeadGeometry(alpha, values, projections, mixed))

    modules = [layer.attention for layer in layers]
    with torch.set_grad_enabled(grad), projection_hooks() as hooks, capture_attention(model, modules, on_call):
        output = model(model_inputs.main, *positional_args, **model_inputs.keyword)
    raise_on_mismatch(checks)
    return output


def _refuse_shared_layer(model: nn.Module, layer: AttentionLayer) -> None:
    r"""Refuses an attention module applied more than once in one forward pass: one slice cannot hold its
    several applications, and the last would overwrite the others."""
    model_type = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    raise UnsupportedSetupError(
        f"{model_type!r}: attention layer {layer.index} ({type(layer.attention).__name__}) ran more than once in "
        "one forward pass; shared layers (ALBERT) are not supported, since one layer slice cannot hold several "
        "applications. Use a model whose layers each run once."
    )
