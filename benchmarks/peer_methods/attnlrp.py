"""AttnLRP (Achtibat et al. 2024, ``lxt==2.1``) on the bundled Llama and Gemma 3 models, through lxt's own rules.

As shipped it cannot run on transformers 5.25: ``import lxt.efficient`` imports ``lxt.efficient.models.bert``,
which imports ``find_pruneable_heads_and_indices`` from ``transformers.pytorch_utils`` (gone in transformers 5);
and ``lxt.efficient.monkey_patch`` replaces ``modeling_llama.ALL_ATTENTION_FUNCTIONS`` (an ``AttentionInterface``)
by a plain dict, so the patched model's first forward fails on ``'dict' object has no attribute 'get_interface'``.

The adapter, all outside lxt's package:

* ``lxt.efficient`` and ``lxt.efficient.models`` are entered as bare packages (their ``__init__`` files, which
  import every model, are not run), so ``lxt.efficient.rules``, ``lxt.efficient.patches`` and
  ``lxt.efficient.models.gemma3`` import on their own;
* lxt's forwards are bound on the model's modules (not on transformers' classes, so the other methods in the
  process see the model unchanged) for the time of one explanation: ``gated_mlp_forward`` on every MLP,
  ``rms_norm_forward`` on Llama's RMSNorms, ``gemma3_norm`` as Gemma 3's ``_norm``; the attention rule of
  ``wrap_attention_forward`` (``divide_gradient`` of query and key by 4, value by 2) is applied as forward
  hooks on the q/k/v projections: between them and the attention function only linear maps stand (RoPE,
  the repeat of grouped heads, and under lxt Gemma's q/k norms, whose scale is a constant), so the gradient
  that reaches the projections is divided exactly as lxt divides it;
* relevance is gradient times input at the input embeddings, summed over the hidden size, as lxt's examples
  do, for the answer's first-token **logit** at the last position (LRP explains a logit); with a foil, for the
  difference of the answer's and the foil's logits (the log-odds, a contrastive output LRP explains alike).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .encoding import EncodedExample
from .methods import PeerMethod, register

__all__ = ["attnlrp_rules", "load_lxt"]


def load_lxt() -> tuple[Any, Any, Any]:
    r"""lxt's ``rules``, ``patches`` and ``models.gemma3`` modules, imported without ``lxt.efficient``'s init."""
    spec = importlib.util.find_spec("lxt")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("lxt is not installed: pip install --no-deps lxt==2.1 (see docs/PEERS.md)")
    root = Path(spec.origin).parent / "efficient"
    for name, folder in (("lxt.efficient", root), ("lxt.efficient.models", root / "models")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    from lxt.efficient import patches, rules
    from lxt.efficient.models import gemma3
    return rules, patches, gemma3


@contextlib.contextmanager
def attnlrp_rules(model: nn.Module) -> Iterator[None]:
    r"""lxt's AttnLRP rules bound on ``model``'s MLPs, norms and q/k/v projections, undone on exit."""
    rules, patches, gemma3 = load_lxt()
    bound: list[tuple[nn.Module, str]] = []
    hooks = []
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("MLP") and hasattr(module, "gate_proj"):
            module.forward = types.MethodType(patches.gated_mlp_forward, module)
            bound.append((module, "forward"))
        elif kind == "Gemma3RMSNorm":
            module._norm = types.MethodType(gemma3.gemma3_norm, module)
            bound.append((module, "_norm"))
        elif kind.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(patches.rms_norm_forward, module)
            bound.append((module, "forward"))
        for name, factor in (("q_proj", 4), ("k_proj", 4), ("v_proj", 2)):
            projection = getattr(module, name, None)
            if kind.endswith("Attention") and isinstance(projection, nn.Module):
                hooks.append(projection.register_forward_hook(
                    lambda _module, _inputs, output, factor=factor: rules.divide_gradient(output, factor)))
    if not bound or len(hooks) == 0:
        raise NotImplementedError(f"AttnLRP's rules found no Llama/Gemma-style MLP, RMSNorm or attention in "
                                  f"{type(model).__name__}; the adapter covers Llama and Gemma 3.")
    try:
        yield
    finally:
        for module, attribute in bound:
            delattr(module, attribute)
        for hook in hooks:
            hook.remove()


def attnlrp(model: nn.Module, tokenizer: Any, encoded: EncodedExample) -> tuple[np.ndarray, int]:
    r"""AttnLRP relevance of each input token for the answer's first-token logit at the last position (less the
    foil's logit where the example has a foil)."""
    device = next(model.parameters()).device
    with attnlrp_rules(model), torch.enable_grad():
        embeddings = model.get_input_embeddings()(encoded.input_ids.to(device)).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeddings).logits  # [1, n, vocab]
        explained = logits[0, -1, encoded.target]
        if encoded.foil is not None:
            explained = explained - logits[0, -1, encoded.foil]
        (gradient,) = torch.autograd.grad(explained, embeddings)  # [1, n, hidden]
    relevance = (embeddings * gradient).sum(-1)[0]  # [n]
    return relevance.detach().double().cpu().numpy(), 2


register(PeerMethod("attnlrp", attnlrp, "token", ("lxt",)))
