"""Reuse of clean activations: variants that intervene from layer l on share the clean run below l."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError

__all__ = ["decoder_layers", "record_layer_output", "skip_layers_below"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    r"""The blocks (elements of the model's layer list) that hold each attention layer, in order."""
    names = {id(module): name for name, module in model.named_modules()}
    blocks = []
    for layer in find_attention_layers(model):
        parts = names[id(layer.attention)].split(".")
        for cut in range(len(parts) - 1, 0, -1):
            parent = model.get_submodule(".".join(parts[: cut - 1])) if cut > 1 else model
            if isinstance(parent, nn.ModuleList) and parts[cut - 1].isdigit():
                blocks.append(model.get_submodule(".".join(parts[:cut])))
                break
        else:
            raise InputError(f"no layer list holds {names[id(layer.attention)]}; cannot reuse clean activations.")
    return blocks


@contextmanager
def record_layer_output(model: nn.Module, index: int) -> Iterator[dict[str, Tensor]]:
    r"""Records the hidden states ``(batch, n, d_model)`` that block ``index`` outputs, under ``"output"``."""
    recorded: dict[str, Tensor] = {}

    def hook(module, args, output):
        recorded["output"] = output.detach()

    handle = decoder_layers(model)[index].register_forward_hook(hook)
    try:
        yield recorded
    finally:
        handle.remove()


@contextmanager
def skip_layers_below(model: nn.Module, start: int, output_below: Tensor) -> Iterator[None]:
    r"""
    Inside the ``with`` block the blocks below ``start`` are not computed: each returns
    ``output_below`` (the clean output of block ``start - 1``, ``(1, n, d_model)``), broadcast
    to the batch, so the forward pass effectively starts at block ``start``.
    """
    blocks = decoder_layers(model)[:start]

    def skipped(hidden_states: Tensor, *args, **kwargs) -> Tensor:
        return output_below.expand(hidden_states.shape[0], *output_below.shape[1:])

    try:
        for block in blocks:
            block.forward = skipped
        yield
    finally:
        for block in blocks:
            del block.forward
