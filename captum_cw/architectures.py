"""Per-architecture facts, kept as data.

Each supported transformer family is described by one :class:`Architecture`
entry: the class of the module that calls transformers' attention interface,
where that module's output projection ``W_O`` lives, and how ``W_O`` stores its
weight. Everything else (head counts, GQA groups, scaling, masks) is read from
the attention call itself, so a new family usually needs one line::

    register_architecture("olmo2", Architecture("Olmo2Attention", "o_proj"))

A family that is not registered is discovered from the model's structure (see
:func:`find_attention_layers`): the modules whose ``forward`` calls the attention
interface, and their output projection among the usual names. Discovery only
guesses where the pieces are; what makes the scores trustworthy is the self-check
that every ``attribute()`` runs (:mod:`captum_cw.self_check`, ``verify=True``), which
refuses a discovered family whose attention has terms the recomputation lacks
(T5's relative position bias) or whose projection is not ``W_O``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from captum_cw.errors import InputError, UnsupportedArchitectureError

__all__ = [
    "Architecture",
    "AttentionLayer",
    "register_architecture",
    "registered_architectures",
    "find_attention_layers",
]


WeightLayout = Literal["linear", "conv1d"]  # nn.Linear's (d_model, heads * d_head) or GPT-2's Conv1D's transpose


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
    weight_layout: WeightLayout = "linear"

    def __post_init__(self) -> None:
        if self.weight_layout not in ("linear", "conv1d"):
            raise InputError(f"weight_layout must be 'linear' (nn.Linear) or 'conv1d' (GPT-2's Conv1D), "
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
    "phi3": Architecture("Phi3Attention", "o_proj"),  # fused qkv_proj: V is read from the attention call
    "olmo2": Architecture("Olmo2Attention", "o_proj"),
    "gpt_neox": Architecture("GPTNeoXAttention", "dense"),
    "stablelm": Architecture("StableLmAttention", "o_proj"),
    "gemma2": Architecture("Gemma2Attention", "o_proj"),  # logit softcapping, eager only
    "mixtral": Architecture("MixtralAttention", "o_proj"),
    "granite": Architecture("GraniteAttention", "o_proj"),
    "roberta": Architecture("RobertaSelfAttention", "^.output.dense"),
    "opt": Architecture("OPTAttention", "out_proj"),
    "smollm3": Architecture("SmolLM3Attention", "o_proj"),
    "distilbert": Architecture("DistilBertSelfAttention", "out_lin"),
    "falcon": Architecture("FalconAttention", "dense"),  # since transformers 5.25; fused qkv: V read from the call
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
    weight_layout: WeightLayout
    discovered: bool = False  # found by structure, not from the registry: only the self-check vouches for it

    @property
    def projection_weight(self) -> Tensor:
        r"""The output projection's weight matrix, in its ``weight_layout``."""
        weight = self.output_projection.weight
        if not isinstance(weight, Tensor):
            raise UnsupportedArchitectureError(f"layer {self.index}'s output projection "
                                               f"{type(self.output_projection).__name__} has no weight tensor.")
        return weight

    def head_projections(self, n_heads: int, dtype: torch.dtype = torch.float32) -> Tensor:
        r"""
        Returns ``W_O`` split per head, in ``dtype`` on the projection's device.

        Returns:
            Tensor of shape ``(n_heads, d_head, d_model)``: ``W_O[h]`` maps head
            ``h``'s value vector to the residual stream.
        """
        weight = self.projection_weight.detach().to(dtype)
        if self.weight_layout == "linear":  # [d_model, heads * d_head]
            weight = weight.t()
        return weight.reshape(n_heads, -1, weight.shape[-1])  # [head, d_head, d_model]


def _model_config(model: nn.Module) -> object | None:
    r"""The model's ``config``, else that of the first submodule with one (a wrapper around a model)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None):
            return config
    return None


def _model_types(model: nn.Module) -> list[str]:
    r"""The keys the registry is looked up under: the model type of the model's (or the wrapped model's)
    config and of its sub-configs, else the model's class name."""
    config = _model_config(model)
    if config is None:
        return [type(model).__name__]
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

    A family registered under ``config.model_type`` (or a sub-config's; for a
    wrapper without a config, the wrapped model's, and for a model without any
    config, its class name) is resolved from its :class:`Architecture`. Any
    other family is discovered:

    - its attention modules are those whose class's ``forward`` reads
      ``ALL_ATTENTION_FUNCTIONS`` (transformers' attention interface), leaving
      out cross-attention (a class or attribute named as such, or
      ``is_cross_attention`` on the module or its parent);
    - all of them must be of one class;
    - its output projection is the first of the children ``o_proj``,
      ``out_proj``, ``dense``, ``c_proj``, ``out_lin``, ``o`` (T5) that the first
      such module has, or else its parent's ``output.dense`` (BERT-style), the
      same path in every layer; the weight layout follows the projection's
      class (GPT-2's ``Conv1D``: ``"conv1d"``).

    A discovered family is announced once per model type with a warning that
    names what was found and the ``register_architecture`` call that silences
    it. It is trusted only through the self-check that ``attribute()`` runs
    (``verify=True``, the default): with ``verify=False`` nothing checks it.

    Raises:
        UnsupportedArchitectureError: if the registered class is missing from
                    the model or its ``output_projection`` is not a submodule,
                    the family's attention does not go through the attention
                    interface, the model is an encoder-decoder (attention in
                    both an encoder and a decoder stack), or discovery finds no
                    attention module, more than one attention class, or no
                    output projection.
    """
    types = _model_types(model)
    known = [t for t in types if t in _ARCHITECTURES]
    if not known:
        return _discover(model, types)
    layers: list[AttentionLayer] = []
    for model_type in known:
        arch = _ARCHITECTURES[model_type]
        names = [name for name, module in model.named_modules() if type(module).__name__ == arch.attention]
        _refuse_encoder_decoder(model, names)
        for name in names:
            module = model.get_submodule(name)
            _check_attention_interface(module)
            projection = _registered_projection(model, name, module, model_type, arch)
            _check_layout(projection, arch)
            layers.append(AttentionLayer(len(layers), module, projection, arch.weight_layout))
        if layers:
            break
    if not layers:
        raise UnsupportedArchitectureError(
            f"Found no attention module of class {_ARCHITECTURES[known[0]].attention!r} in "
            f"{type(model).__name__}: the model has no attention weights to attribute. If the class was "
            "renamed, register the architecture again with register_architecture()."
        )
    return layers


def _registered_projection(model: nn.Module, name: str, module: nn.Module, model_type: str,
                           arch: Architecture) -> nn.Module:
    r"""The output projection a registered :class:`Architecture` points at, refusing a path that is not there."""
    try:
        return _resolve(model, name, arch.output_projection)
    except AttributeError:
        children = ", ".join(child for child, _ in module.named_children()) or "none"
        raise UnsupportedArchitectureError(
            f"output_projection {arch.output_projection!r} registered for {model_type!r} is not a submodule of "
            f"{type(module).__name__} (its children: {children}); register the architecture again with the path "
            "of its output projection (a leading '^' steps up to the parent)."
        ) from None


def _refuse_encoder_decoder(model: nn.Module, attention_names: list[str]) -> None:
    r"""Refuses a model whose attention modules sit in both an encoder and a decoder stack: their layers would
    share one layer axis, and the encoder's padding mask would be applied to the decoder's layers."""
    stacks = [set(name.split(".")) for name in attention_names]
    if any("encoder" in parts for parts in stacks) and any("decoder" in parts for parts in stacks):
        model_type = _model_types(model)[0]
        raise UnsupportedArchitectureError(
            f"{model_type!r} ({type(model).__name__}) is an encoder-decoder model: encoder-decoder models are not "
            "supported: attribute the encoder alone (model.get_encoder(), e.g. T5EncoderModel) or a decoder-only "
            "model."
        )


#: children of an attention module that are tried, in this order, as its output projection
USUAL_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "out_lin", "o")
_SIBLING_PROJECTION = "^.output.dense"
_CROSS_ATTENTION_NAMES = ("crossattention", "cross_attention", "cross_attn", "encoder_attn", "encdecattention")
_ANNOUNCED: set[str] = set()  # model types whose discovery was announced


@functools.cache
def _calls_attention_interface(cls: type) -> bool:
    r"""Whether ``cls.forward`` calls transformers' attention interface: its code reads
    ``ALL_ATTENTION_FUNCTIONS`` (decorators unwrapped), else its source names it or calls ``attention_interface``;
    the class's modeling module must import ``ALL_ATTENTION_FUNCTIONS`` either way."""
    source_module = sys.modules.get(cls.__module__)
    if source_module is None or not hasattr(source_module, "ALL_ATTENTION_FUNCTIONS"):
        return False
    forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    code = getattr(forward, "__code__", None)
    if code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names:
        return True
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source or "attention_interface(" in source


def _is_cross_attention(name: str, module: nn.Module, parent: nn.Module | None) -> bool:
    names = [part.lower() for part in name.split(".")[-2:]]
    names += [type(module).__name__.lower(), type(parent).__name__.lower()]
    flagged = getattr(module, "is_cross_attention", False) or getattr(parent, "is_cross_attention", False)
    return flagged is True or any(cross in part for part in names for cross in _CROSS_ATTENTION_NAMES)


def _find_projection(model: nn.Module, name: str, module: nn.Module) -> str | None:
    r"""The path of ``module``'s output projection among the usual names, or None."""
    for path in (*USUAL_PROJECTIONS, _SIBLING_PROJECTION):
        try:
            projection = _resolve(model, name, path)
        except AttributeError:
            continue
        weight = getattr(projection, "weight", None)
        if projection is not module and isinstance(weight, Tensor) and weight.dim() == 2:
            return path
    return None


def _unsupported(types: list[str]) -> str:
    return f"Unsupported architecture {types[0]!r}"


def _discover(model: nn.Module, types: list[str]) -> list[AttentionLayer]:
    r"""Finds the attention layers of an unregistered family from the model's structure."""
    parents = {id(child): module for module in model.modules() for child in module.children()}
    found = [(name, module) for name, module in model.named_modules()
             # a class is hashable; mypy does not see it (python/mypy#11470)
             if _calls_attention_interface(type(module))  # type: ignore[arg-type]
             and not _is_cross_attention(name, module, parents.get(id(module)))]
    _refuse_encoder_decoder(model, [name for name, _ in found])
    model_type = types[0]
    register = (f"captum_cw.register_architecture({model_type!r}, Architecture(attention='<AttentionClass>', "
                "output_projection='o_proj'))")
    if not found:
        outside = sorted({type(m).__name__ for m in model.modules()
                          if "attention" in type(m).__name__.lower()})
        if outside:
            raise UnsupportedArchitectureError(
                f"{_unsupported(types)}: its attention ({', '.join(outside[:3])}) does not call "
                "transformers' attention interface (ALL_ATTENTION_FUNCTIONS), so captum_cw cannot capture it; "
                "this family is not supported, whatever attn_implementation it runs."
            )
        raise UnsupportedArchitectureError(
            f"{_unsupported(types)}: captum_cw found no module that calls transformers' attention "
            f"interface, so it does not know where the attention modules and output projections are. If the "
            f"model has them, register it with {register}. Known: " + ", ".join(sorted(_ARCHITECTURES))
        )
    classes = sorted({type(module).__name__ for _, module in found})
    if len(classes) > 1:
        raise UnsupportedArchitectureError(
            f"{_unsupported(types)}: captum_cw found attention modules of several classes "
            f"({', '.join(classes)}) and does not guess which to attribute; register the one you want with "
            f"{register}."
        )
    path = _find_projection(model, *found[0])
    if path is None or any(_find_projection(model, name, module) != path for name, module in found[1:]):
        raise UnsupportedArchitectureError(
            f"{_unsupported(types)}: captum_cw found {len(found)} attention modules of class "
            f"{classes[0]} but no output projection among their children "
            f"{', '.join(USUAL_PROJECTIONS)} or their parent's output.dense (the same in every layer); register "
            f"it with captum_cw.register_architecture({model_type!r}, Architecture(attention={classes[0]!r}, "
            "output_projection='<path from the attention module>'))."
        )
    layout: WeightLayout = "conv1d" if type(_resolve(model, found[0][0], path)).__name__ == "Conv1D" else "linear"
    arch = Architecture(classes[0], path, layout)
    layers: list[AttentionLayer] = []
    for name, module in found:
        projection = _resolve(model, name, path)
        _check_layout(projection, arch)
        layers.append(AttentionLayer(len(layers), module, projection, layout, discovered=True))
    if model_type not in _ANNOUNCED:
        _ANNOUNCED.add(model_type)
        layout_arg = ", weight_layout='conv1d'" if layout == "conv1d" else ""
        warnings.warn(
            f"captum_cw: discovered {len(layers)} attention layers of class {arch.attention} with output "
            f"projection {path!r} for model_type {model_type!r}; the self-check of each attribute() call "
            f"(verify=True) vouches for them. register_architecture({model_type!r}, "
            f"Architecture({arch.attention!r}, {path!r}{layout_arg})) to silence this.",
            stacklevel=3,
        )
    return layers


def _check_attention_interface(module: nn.Module) -> None:
    r"""Refuses attention classes whose modeling file never calls transformers' attention interface."""
    source = sys.modules.get(type(module).__module__)
    if source is not None and not hasattr(source, "ALL_ATTENTION_FUNCTIONS"):
        raise UnsupportedArchitectureError(
            f"{type(module).__name__} does not call transformers' attention interface (its module "
            f"{source.__name__} never uses ALL_ATTENTION_FUNCTIONS), so captum_cw cannot capture its attention; "
            "this family is not supported, whatever attn_implementation it runs."
        )


def _check_layout(projection: nn.Module, arch: Architecture) -> None:
    r"""Refuses a weight layout that contradicts the projection's class (GPT-2's Conv1D vs nn.Linear)."""
    is_conv1d = type(projection).__name__ == "Conv1D"
    if (arch.weight_layout == "conv1d") != is_conv1d:
        expected = "conv1d" if is_conv1d else "linear"
        raise UnsupportedArchitectureError(
            f"{arch.attention}'s output projection is a {type(projection).__name__}, but its Architecture says "
            f"weight_layout={arch.weight_layout!r}; register it with weight_layout={expected!r}."
        )
    if getattr(projection, "weight", None) is None:
        raise UnsupportedArchitectureError(
            f"{arch.attention}'s output projection {type(projection).__name__} has no weight matrix; point "
            "output_projection at the linear layer that maps the heads to the residual stream."
        )
