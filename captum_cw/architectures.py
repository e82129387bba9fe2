"""Per-architecture facts, kept as data.

Each supported transformer family is described by one :class:`Architecture`
entry: the class of the module that calls transformers' attention interface,
where that module's output projection ``W_O`` lives, and how ``W_O`` stores its
weight. Everything else (head counts, GQA groups, scaling, masks) is read from
the attention call itself, so a new family usually needs one line::

    register_architecture("olmo2", Architecture("Olmo2Attention", "o_proj"))
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = [
    "Architecture",
    "AttentionLayer",
    "register_architecture",
    "registered_architectures",
    "find_attention_layers",
]


@dataclass(frozen=True)
class Architecture:
    r"""
    Where the pieces of one attention layer live in a transformers model.

    Args:
        attention (str): class name of the module that calls the attention
                    interface (it receives ``query, key, value``).
        output_projection (str): dotted path from that module to the output
                    projection. Each leading ``^`` steps up to the parent module,
                    e.g. ``"^.output.dense"`` for BERT, whose projection is a
                    sibling of the self-attention module.
        weight_layout (str): ``"linear"`` for ``nn.Linear`` weights
                    ``(d_model, n_heads * d_head)``, ``"conv1d"`` for GPT-2's
                    ``Conv1D`` weights ``(n_heads * d_head, d_model)``.
    """

    attention: str
    output_projection: str
    weight_layout: Literal["linear", "conv1d"] = "linear"

    def __post_init__(self) -> None:
        if self.weight_layout not in ("linear", "conv1d"):
            raise ValueError(f"weight_layout must be 'linear' (nn.Linear) or 'conv1d' (GPT-2's Conv1D), "
                             f"got {self.weight_layout!r}.")


_ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("LlamaAttention", "o_proj"),
    "mistral": Architecture("MistralAttention", "o_proj"),
    "qwen2": Architecture("Qwen2Attention", "o_proj"),
    "qwen3": Architecture("Qwen3Attention", "o_proj"),
    "gemma3_text": Architecture("Gemma3Attention", "o_proj"),
    "gpt2": Architecture("GPT2Attention", "c_proj", weight_layout="conv1d"),
    "bert": Architecture("BertSelfAttention", "^.output.dense"),
    "vit": Architecture("ViTAttention", "o_proj"),
}


def register_architecture(model_type: str, architecture: Architecture) -> None:
    r"""
    Teach captum_cw a new model family (or override a known one).

    Args:
        model_type (str): the ``config.model_type`` of the family, e.g. ``"olmo2"``.
        architecture (Architecture): where its attention pieces live.
    """
    _ARCHITECTURES[model_type] = architecture


def registered_architectures() -> dict[str, Architecture]:
    r"""Returns a copy of the registry, keyed by ``config.model_type``."""
    return dict(_ARCHITECTURES)


@dataclass(frozen=True)
class AttentionLayer:
    r"""One attention layer of a loaded model: the module and its ``W_O``."""

    index: int
    attention: nn.Module
    output_projection: nn.Module
    weight_layout: str

    def head_projections(self, n_heads: int, dtype: torch.dtype = torch.float32) -> Tensor:
        r"""
        Returns ``W_O`` split per head, in ``dtype`` on the projection's device.

        Returns:
            Tensor of shape ``(n_heads, d_head, d_model)``: ``W_O[h]`` maps head
            ``h``'s value vector to the residual stream.
        """
        weight = self.output_projection.weight.detach().to(dtype)
        if self.weight_layout == "linear":  # [d_model, heads * d_head]
            weight = weight.t()
        return weight.reshape(n_heads, -1, weight.shape[-1])  # [head, d_head, d_model]


def _model_types(model: nn.Module) -> list[str]:
    config = getattr(model, "config", None)
    if config is None:
        return []
    types = [getattr(config, "model_type", "")]
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and getattr(sub, "model_type", None):
            types.append(sub.model_type)
    return types


def _resolve(model: nn.Module, module_name: str, path: str) -> nn.Module:
    base = module_name.split(".") if module_name else []
    while path.startswith("^"):
        base = base[:-1]
        path = path[1:].lstrip(".")
    return model.get_submodule(".".join(base + ([path] if path else [])))


def find_attention_layers(model: nn.Module) -> list[AttentionLayer]:
    r"""
    Finds the attention layers of ``model`` in forward order.

    Raises:
        ValueError: if the model's family is not registered, or no attention
                    module of the registered class is found in it.
    """
    types = _model_types(model)
    known = [t for t in types if t in _ARCHITECTURES]
    if not known:
        raise ValueError(
            f"Unsupported architecture {types or type(model).__name__!r}: captum_cw does not know where "
            "its attention modules and output projections are. Register it with "
            "captum_cw.register_architecture(model_type, Architecture(attention='<AttentionClass>', "
            "output_projection='o_proj')). Known: " + ", ".join(sorted(_ARCHITECTURES))
        )
    layers: list[AttentionLayer] = []
    for model_type in known:
        arch = _ARCHITECTURES[model_type]
        for name, module in model.named_modules():
            if type(module).__name__ == arch.attention:
                _check_attention_interface(module)
                projection = _resolve(model, name, arch.output_projection)
                _check_layout(projection, arch)
                layers.append(AttentionLayer(len(layers), module, projection, arch.weight_layout))
        if layers:
            break
    if not layers:
        raise ValueError(
            f"Found no attention module of class {_ARCHITECTURES[known[0]].attention!r} in "
            f"{type(model).__name__}: the model has no attention weights to attribute. If the class was "
            "renamed, register the architecture again with register_architecture()."
        )
    return layers


def _check_attention_interface(module: nn.Module) -> None:
    r"""Refuses attention classes whose modeling file never calls transformers' attention interface."""
    source = sys.modules.get(type(module).__module__)
    if source is not None and not hasattr(source, "ALL_ATTENTION_FUNCTIONS"):
        raise ValueError(
            f"{type(module).__name__} does not call transformers' attention interface (its module "
            f"{source.__name__} never uses ALL_ATTENTION_FUNCTIONS), so captum_cw cannot capture its attention; "
            "this family is not supported, whatever attn_implementation it runs."
        )


def _check_layout(projection: nn.Module, arch: Architecture) -> None:
    r"""Refuses a weight layout that contradicts the projection's class (GPT-2's Conv1D vs nn.Linear)."""
    is_conv1d = type(projection).__name__ == "Conv1D"
    if (arch.weight_layout == "conv1d") != is_conv1d:
        expected = "conv1d" if is_conv1d else "linear"
        raise ValueError(
            f"{arch.attention}'s output projection is a {type(projection).__name__}, but its Architecture says "
            f"weight_layout={arch.weight_layout!r}; register it with weight_layout={expected!r}."
        )
    if getattr(projection, "weight", None) is None:
        raise ValueError(f"{arch.attention}'s output projection {type(projection).__name__} has no weight matrix; "
                         "point output_projection at the linear layer that maps the heads to the residual stream.")
