"""Attention capture through transformers' attention interface.

While :func:`capture_attention` is active, every call of a tracked attention
module goes through a dispatcher registered under the model's own implementation
name (``eager``, ``sdpa``, ``flash_attention_2``...). The dispatcher hands a
:class:`AttentionCall` to the callback of the capture that watches the module in
the calling thread, which can recompute ``alpha`` for just the query rows it
needs, in float32 (docs/DESIGN.md, "Capture"). The original function runs
unchanged the first time a callback reads its result (``call.output``,
``call.weights``), or after the callbacks when none replaced the output: a
callback that computes the whole output itself (an intervention on every row)
saves the kernel's work.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.modeling_utils import AttentionInterface

from captum_cw.errors import UnsupportedArchitectureError, UnsupportedSetupError

__all__ = ["AttentionCall", "capture_attention", "take_rows"]


@dataclass
class AttentionCall:
    r"""
    The arguments of one attention-interface call, as seen by the wrapper.

    ``query`` is ``(batch, n_heads, n_query, d_head)``; ``key`` and ``value`` are
    ``(batch, n_kv_heads, n_key, d_head)`` (grouped-query attention shares a KV
    head between ``n_heads // n_kv_heads`` query heads).
    """

    module: nn.Module
    query: Tensor  # [batch, head, query, d_head]
    key: Tensor  # [batch, kv_head, key, d_head]
    value: Tensor  # [batch, kv_head, key, d_head]
    kernel: Callable[[], tuple]  # runs the implementation (once, cached): (output, weights or None, ...)
    mask: Tensor | None  # implementation-specific: 4D float/bool, 2D padding, or None
    implementation: str
    scaling: float
    softcap: float | None
    sliding_window: int | None
    is_causal: bool
    replaced: Tensor | None = None  # an earlier capture's replacement of the output
    rerun: Callable[..., tuple] | None = None  # the implementation on other (query, key, value, mask), same settings

    @property
    def output(self) -> Tensor:
        r"""The attention output ``(batch, n_query, n_heads, d_head)``: an earlier capture's replacement,
        else what the implementation returns (running it now if no capture has asked before)."""
        return self.replaced if self.replaced is not None else self.kernel()[0]

    @property
    def weights(self) -> Tensor | None:
        r"""The kernel's own weights ``(batch, n_heads, n_query, n_key)`` if it returns them (eager), else None."""
        result = self.kernel()
        return result[1] if len(result) > 1 and isinstance(result[1], Tensor) else None

    def rerun_in(self, dtype: torch.dtype, rows: Tensor) -> Tensor | None:
        r"""
        The implementation's output for the given query rows, run once more on this call's query, key, value and
        float mask cast to ``dtype`` (a bool mask as is), every other argument as the model passed it: for a
        half-precision kernel in float32, the model's own computation on its own inputs without its rounding.
        With a 4D mask only the given rows are run (with the mask's own rows, each row is computed alone); without
        one the kernel infers causality from the number of rows, so all of them are run.

        Args:
            rows (Tensor): query positions, ``(n_rows,)`` long.
        Returns:
            Tensor ``(batch, n_rows, n_heads, d_head)``, or None for a call that :func:`capture_attention` did not
            make (no implementation to rerun).
        """
        if self.rerun is None:
            return None
        query, mask = self.query, self.mask
        alone = mask is not None and mask.dim() == 4 and mask.shape[2] == query.shape[2]
        if alone and mask is not None:
            query, mask = query.index_select(2, rows), mask.index_select(2, rows)
        mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
        with torch.no_grad():
            output = self.rerun(query.to(dtype), self.key.to(dtype), self.value.to(dtype), mask)[0]
        return output if alone else output.index_select(1, rows)  # [batch, row, head, d_head]

    @property
    def n_heads(self) -> int:
        return self.query.shape[1]

    @property
    def compute_dtype(self) -> torch.dtype:
        r"""float32, or float64 for a float64 model: half precision is never used for scores."""
        return torch.promote_types(self.query.dtype, torch.float32)

    def values(self) -> Tensor:
        r"""Returns the value vectors per query head: ``(batch, n_heads, n_key, d_head)``."""
        value = self.value.detach().to(self.compute_dtype)
        return value.repeat_interleave(self.n_heads // value.shape[1], dim=1)

    def allowed_keys(self, rows: Tensor) -> Tensor:
        r"""
        Which keys each of the given query rows may attend to, as the model does.

        Args:
            rows (Tensor): query positions, ``(n_rows,)`` long.
        Returns:
            Bool tensor broadcastable to ``(batch, n_heads, n_rows, n_key)``.
        """
        n_query, n_key = self.query.shape[2], self.key.shape[2]
        mask = self.mask
        if mask is not None and mask.dim() == 4:
            mask = mask.index_select(2, rows)
            if mask.dtype == torch.bool:
                return mask
            return mask > torch.finfo(mask.dtype).min / 2
        keys = torch.arange(n_key, device=rows.device)
        absolute_rows = rows + (n_key - n_query)  # [row]
        # eager with no mask means full attention; the others apply causality themselves
        causal = self.is_causal and self.implementation != "eager" and n_query > 1
        allowed = torch.ones(len(rows), n_key, dtype=torch.bool, device=rows.device)  # [row, key]
        if causal or (mask is not None and self.is_causal):
            allowed &= keys[None, :] <= absolute_rows[:, None]
        if self.sliding_window is not None and mask is not None:
            allowed &= keys[None, :] > absolute_rows[:, None] - self.sliding_window
        allowed = allowed[None, None]  # [1, 1, row, key]
        if mask is not None:  # 2D padding mask of flash implementations: [batch, key]
            allowed = allowed & mask.bool()[:, None, None, :]
        return allowed

    def mix(self, weights: Tensor) -> Tensor:
        r"""
        ``weights @ values`` per query head, without copying the values of grouped-query heads.

        Args:
            weights (Tensor): ``(batch, n_heads, n_rows, n_key)`` in :attr:`compute_dtype`.
        Returns:
            Tensor ``(batch, n_heads, n_rows, d_head)``.
        """
        value = self.value.detach().to(self.compute_dtype)  # [batch, kv_head, key, d_head]
        batch, n_heads, n_rows, n_key = weights.shape
        grouped = weights.reshape(batch, value.shape[1], -1, n_key)  # [batch, kv_head, group * row, key]
        return (grouped @ value).view(batch, n_heads, n_rows, value.shape[-1])

    def scores(self, rows: Tensor) -> Tensor:
        r"""Pre-softmax logits of the given rows: ``(batch, n_heads, n_rows, n_key)``, a new tensor."""
        query = take_rows(self.query.detach(), 2, rows)
        key = self.key.detach().to(self.compute_dtype)  # [batch, kv_head, key, d_head]
        batch, n_heads, n_rows, d_head = query.shape
        # grouped-query heads share their key: [batch, kv_head, group * row, d_head], scaled on the smaller side
        query = (query.to(self.compute_dtype) * self.scaling).reshape(batch, key.shape[1], -1, d_head)
        scores = (query @ key.transpose(-1, -2)).view(batch, n_heads, n_rows, -1)  # [batch, head, row, key]
        if self.mask is not None and self.mask.dim() == 4 and self.mask.is_floating_point():
            bias = self.mask.index_select(2, rows).to(self.compute_dtype)
            scores.add_(torch.where(bias > torch.finfo(bias.dtype).min / 2, bias, 0.0))
        if self.softcap is not None:
            scores.div_(self.softcap).tanh_().mul_(self.softcap)
        return scores

    def alpha(self, rows: Tensor) -> Tensor:
        r"""
        Attention weights of the given rows in :attr:`compute_dtype`, recomputed from query and key.

        Masked keys are exactly 0; a row with no allowed key is all 0 (never NaN).

        Returns:
            Tensor ``(batch, n_heads, n_rows, n_key)``.
        """
        scores = self.scores(rows)
        allowed = self.allowed_keys(rows)  # broadcastable to scores
        alpha = torch.softmax(scores.masked_fill_(~allowed, float("-inf")), dim=-1)  # in place: scores are ours
        if self.mask is None:  # without a mask every row reads at least its own position
            return alpha
        has_key = allowed.any(-1, keepdim=True)  # [batch or 1, head or 1, row, 1]
        return torch.where(has_key, alpha, 0.0)


def take_rows(tensor: Tensor, dim: int, rows: Tensor) -> Tensor:
    r"""``tensor.index_select(dim, rows)``, as a view (no copy) when ``rows`` are consecutive and increasing."""
    first = int(rows[0]) if len(rows) else 0
    if bool((rows == torch.arange(first, first + len(rows), device=rows.device)).all()):
        return tensor.narrow(dim, first, len(rows))
    return tensor.index_select(dim, rows)


def _eager_function(module: nn.Module) -> Callable:
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise UnsupportedArchitectureError(
            f"{type(module).__name__} has no module-level eager_attention_forward; run the model with "
            "attn_implementation='sdpa' or register its eager function in transformers' AttentionInterface."
        )
    return function


def _implementation(module: nn.Module, model: nn.Module) -> str:
    config: Any = getattr(module, "config", None) or getattr(model, "config")
    name: str = config._attn_implementation or "eager"  # private: docs/DESIGN.md, "transformers internals"
    if name == "flex_attention":
        raise UnsupportedSetupError(
            "captum_cw cannot read flex_attention's block masks, so it cannot recompute the attention weights; "
            "call model.set_attn_implementation('sdpa') (or 'eager') first."
        )
    return name


@dataclass(eq=False)
class _Capture:
    r"""One active :func:`capture_attention` block: the modules it watches and its callback."""

    modules: tuple[nn.Module, ...]  # kept alive so that their ids stay theirs
    module_ids: frozenset[int]
    on_call: Callable[[AttentionCall], Tensor | tuple[Tensor, Tensor | None] | None]


# The captures active in this thread (or task), outermost first. Threads start with an empty tuple, so a
# forward pass only ever reaches the captures opened in its own thread.
_ACTIVE: ContextVar[tuple[_Capture, ...]] = ContextVar("captum_cw_active_captures", default=())


@dataclass
class _Dispatcher:
    r"""What :func:`capture_attention` installed under one implementation name, and for how many captures."""

    function: Callable
    original: Callable | None  # the registry's entry before, None if there was none
    users: int = 0


_DISPATCHERS: dict[str, _Dispatcher] = {}
_REGISTRY_LOCK = threading.Lock()


def _dispatcher(name: str, original: Callable | None) -> Callable:
    r"""The function installed under ``name``: hands the call to the captures of the calling thread that
    watch the module, outermost first (each may replace the output), and runs ``original`` unchanged when
    one of them reads its result or none replaced the output."""

    def dispatch(module, query, key, value, attention_mask, **kwargs):
        function = original if original is not None else _eager_function(module)
        owners = [capture for capture in _ACTIVE.get() if id(module) in capture.module_ids]
        if not owners:
            return function(module, query, key, value, attention_mask, **kwargs)
        kernel = functools.cache(lambda: function(module, query, key, value, attention_mask, **kwargs))
        attention_output = None  # [batch, query, head, d_head], once a capture replaced it
        weights, weights_given = None, False  # [batch, head, query, key] or None, where the last replacement gave them
        scaling = kwargs.get("scaling")
        for capture in owners:
            replacement = capture.on_call(
                AttentionCall(
                    module=module,
                    query=query,
                    key=key,
                    value=value,
                    kernel=kernel,
                    mask=attention_mask,
                    implementation=name,
                    scaling=query.shape[-1] ** -0.5 if scaling is None else scaling,
                    softcap=kwargs.get("softcap"),
                    sliding_window=kwargs.get("sliding_window"),
                    is_causal=bool(kwargs.get("is_causal", getattr(module, "is_causal", True))),
                    replaced=attention_output,
                    rerun=lambda *arguments: function(module, *arguments, **kwargs),
                )
            )
            if isinstance(replacement, tuple):  # (output, weights): the kernel's weights are not needed
                output, weights = replacement
                attention_output, weights_given = output.to(query.dtype), True
                weights = weights.to(query.dtype) if isinstance(weights, Tensor) else None
            elif replacement is not None:
                attention_output, weights_given = replacement.to(query.dtype), False
        if attention_output is None:
            return kernel()
        if weights_given:
            return attention_output, weights
        if kernel.cache_info().currsize == 0 and name != "eager":  # its weights are None: the kernel can be skipped
            return attention_output, None
        return (attention_output, *kernel()[1:])  # eager's weights (output_attentions), as the model computed them

    return dispatch


def _acquire(name: str) -> None:
    mapping: dict[str, Any] = AttentionInterface._global_mapping  # private: docs/DESIGN.md, "transformers internals"
    if name not in _DISPATCHERS:
        original = mapping.get(name)
        _DISPATCHERS[name] = _Dispatcher(_dispatcher(name, original), original)
        mapping[name] = _DISPATCHERS[name].function
    _DISPATCHERS[name].users += 1


def _release(name: str) -> None:
    entry = _DISPATCHERS[name]
    entry.users -= 1
    if entry.users:
        return
    del _DISPATCHERS[name]
    mapping = AttentionInterface._global_mapping
    if mapping.get(name) is not entry.function:
        return  # somebody registered another function meanwhile: theirs stays
    if entry.original is None:
        mapping.pop(name, None)
    else:
        mapping[name] = entry.original


@contextmanager
def capture_attention(
    model: nn.Module,
    modules: list[nn.Module],
    on_call: Callable[[AttentionCall], Tensor | tuple[Tensor, Tensor | None] | None],
) -> Iterator[None]:
    r"""
    Calls ``on_call`` with an :class:`AttentionCall` each time one of ``modules``
    runs attention in this thread, inside the ``with`` block. If ``on_call``
    returns a tensor, it replaces the attention output ``(batch, n_query, n_heads,
    d_head)`` (the input of the output projection); otherwise the model runs
    unchanged. A tuple ``(output, weights)`` (weights ``(batch, n_heads, n_query,
    n_key)`` or None) replaces the weights the call returns too, so that eager
    attention is not run again only for its weights (``output_attentions``); a
    later capture's plain replacement drops them (the call then returns the
    kernel's own weights, as for any plain replacement), and ``call.weights``
    stays the kernel's own for every capture.

    Captures may be nested, interleaved and opened from several threads at once:
    one dispatcher per implementation name stays in transformers' registry while
    any capture needs it, routes each call to the captures of the calling thread
    that watch the module (outermost first, each seeing the output as the ones
    before it left it), and the registry's original entry is restored when the
    last capture exits, also after an exception.

    Args:
        model (nn.Module): the transformers model.
        modules (list[nn.Module]): the attention modules to watch.
        on_call (Callable): receives each :class:`AttentionCall`, returns None, a
                    replacement attention output, or ``(output, weights)``.

    Raises:
        UnsupportedSetupError: if the model runs ``flex_attention``, whose block masks cannot
                    be read.
    """
    names = {_implementation(module, model) for module in modules}
    capture = _Capture(tuple(modules), frozenset(id(module) for module in modules), on_call)
    with _REGISTRY_LOCK:
        for name in names:
            _acquire(name)
    _ACTIVE.set((*_ACTIVE.get(), capture))
    try:
        yield
    finally:
        _ACTIVE.set(tuple(active for active in _ACTIVE.get() if active is not capture))
        with _REGISTRY_LOCK:
            for name in names:
                _release(name)
