"""The exceptions captum_cw raises for what a user can cause, one class per kind of problem.

Each subclasses the built-in exception a caller would catch without knowing captum_cw (``ValueError`` or
``TypeError``), and its message says what was passed, what is expected and how to proceed, in one line. They
are raised before any work is done where the problem can be seen then. The command line prints them without a
traceback and exits 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from transformers import PreTrainedModel

__all__ = [
    "CAPTUM_ARGUMENTS",
    "CaptumCWError",
    "InputError",
    "SelfCheckError",
    "UnsupportedArchitectureError",
    "UnsupportedArgumentError",
    "UnsupportedSetupError",
    "refuse_captum_arguments",
    "refuse_noisy_token_ids",
    "require_model",
]


class CaptumCWError(Exception):
    r"""Base class of every error captum_cw raises on purpose."""


class InputError(CaptumCWError, ValueError):
    r"""An argument or input with the wrong shape, type, range or content (ids, masks, positions, files, data)."""


class UnsupportedArchitectureError(CaptumCWError, ValueError):
    r"""A model whose attention captum_cw cannot read exactly: an unknown family it cannot discover, an attention
    that bypasses transformers' attention interface, a model without attention weights."""


class UnsupportedSetupError(CaptumCWError, ValueError):
    r"""A supported model used in a way whose scores would be wrong: cached keys, an encoder-decoder model, a
    module applied several times in one forward pass, a batch where one sequence is expected."""


class SelfCheckError(CaptumCWError, ValueError):
    r"""The recomputed attention does not reproduce what the model computed (docs/DESIGN.md, "Self-check")."""


class UnsupportedArgumentError(CaptumCWError, TypeError):
    r"""An argument a Captum attributor takes but contribution weights do not (``baselines``, ``n_steps``...), or
    an object of the wrong kind where the model is expected (a forward function, a layer module)."""


CAPTUM_ARGUMENTS: dict[str, str] = {
    "baselines": "contribution weights need no baseline: they decompose one forward pass of the inputs as they are",
    "n_steps": "there is no path integral: the scores come exactly from one forward pass",
    "method": "there is no integral to approximate (no Riemann or Gauss-Legendre steps): the scores are exact",
    "internal_batch_size": "there are no interpolation steps to batch: each call is one forward pass; to bound "
                           "memory pass chunk_size= (query rows at once) to the constructor",
    "target": "contribution weights decompose the attention output at a position and are the same for every "
              "class: choose rows with query_positions= (TokenContributions: position=); for a class logit end to "
              "end use captum.attr.IntegratedGradients",
    "return_convergence_delta": "aggregated scores have no completeness identity, so no convergence delta: "
                                "ContributionWeights.attribute(..., return_convergence_delta=True) gives the "
                                "per-layer one",
    "feature_mask": "every token gets its own score: sum the scores of a group yourself (the text front end: a "
                    "TextTemplateInput or merge_subwords=True)",
    "attribute_to_layer_input": "layers are chosen by index (layers=[...]) and scored inside their attention: "
                                "there is no layer input or output to choose",
    "perturbations_per_eval": "nothing is perturbed: the scores come from one forward pass",
    "sliding_window_shapes": "nothing is occluded: the scores come from one forward pass",
    "strides": "nothing is occluded: the scores come from one forward pass",
    "n_samples": "nothing is sampled: the scores are deterministic and come from one forward pass",
    "show_progress": "each call is one forward pass, there is no progress to show",
    "multiply_by_inputs": "contribution weights are not gradients: there is nothing to multiply by the inputs",
    "device_ids": "the model runs as it is placed (move it with model.to(...) or load it with device_map=...)",
    "use_cached_outputs": "nothing is generated token by token: the prompt and its target are scored in one "
                          "forward pass",
    "attr_target": "the scores decompose the attention output at the positions that predict the target, not a "
                   "log-probability: there is no attribution target to choose",
}
"""Keyword arguments of Captum attributors that contribution weights do not take, each with what to do instead."""


def refuse_captum_arguments(owner: str, arguments: Mapping[str, Any], accepted: Sequence[str] = ()) -> None:
    r"""
    Refuses keyword arguments that ``owner`` does not take, as a Captum user would pass them.

    Args:
        owner (str): the function called, e.g. ``"ContributionWeights.attribute"``.
        arguments (Mapping[str, Any]): the keyword arguments it did not recognise (its ``**kwargs``).
        accepted (Sequence[str], optional): the arguments it does take, named in the message for an argument
                    Captum does not have either. Default: none named.
    Raises:
        UnsupportedArgumentError: naming the first argument, and for a Captum one (:data:`CAPTUM_ARGUMENTS`)
                    why contribution weights do not take it and what to do instead.
    """
    for name in arguments:
        if name in CAPTUM_ARGUMENTS:
            raise UnsupportedArgumentError(f"{owner} does not take {name}= (a Captum argument): "
                                           f"{CAPTUM_ARGUMENTS[name]}.")
        takes = f"; it takes {', '.join(accepted)}" if accepted else ""
        raise UnsupportedArgumentError(f"{owner} got an unexpected keyword argument {name!r}{takes}.")


def require_model(model: object, owner: str) -> None:
    r"""
    Refuses anything but a transformers model (an ``nn.Module`` with a ``config``, or a module that wraps one)
    where the model is expected: a forward function, a layer or another module, with one line naming what was
    passed (never the module's printout).

    Args:
        model (object): what was passed as the model.
        owner (str): the class or function it was passed to, e.g. ``"ContributionWeights"``.
    Raises:
        UnsupportedArgumentError: if ``model`` is not an ``nn.Module`` whose ``config`` has a ``model_type``, nor
                    one that holds a ``PreTrainedModel``.
    """
    if isinstance(model, nn.Module):
        if hasattr(getattr(model, "config", None), "model_type"):
            return
        if any(isinstance(module, PreTrainedModel) for module in model.modules()):
            return  # a wrapper around a transformers model: its layers are found inside
        raise UnsupportedArgumentError(
            f"{owner}: model is a {type(model).__name__} module without a transformers config (a layer?): pass the "
            "whole transformers model and choose layers by index with layers=[...].")
    if hasattr(model, "attribute") and hasattr(model, "forward_func"):  # a captum attribution method
        raise UnsupportedArgumentError(
            f"{owner}: model is a captum {type(model).__name__}: pass the transformers model itself; contribution "
            "weights are the attribution method, read from the model's attention modules.")
    owner_module = getattr(model, "__self__", None)
    if isinstance(owner_module, nn.Module):  # a bound method such as model.forward
        raise UnsupportedArgumentError(
            f"{owner}: model is the method {getattr(model, '__name__', 'forward')} of a "
            f"{type(owner_module).__name__}: pass the {type(owner_module).__name__} itself, not a forward "
            "function: captum_cw reads its attention modules.")
    if callable(model):
        raise UnsupportedArgumentError(
            f"{owner}: model is a {type(model).__name__} ({getattr(model, '__qualname__', '?')}): pass the "
            "transformers model itself, not a forward function: captum_cw reads its attention modules.")
    raise UnsupportedArgumentError(f"{owner}: model must be a transformers model (an nn.Module with a config), got "
                                   f"{type(model).__name__}.")


def refuse_noisy_token_ids(model: nn.Module, inputs: object, owner: str) -> None:
    r"""
    Refuses floating-point inputs to a model that takes token ids, saying why: that is what captum's
    ``NoiseTunnel`` and ``captum.metrics.sensitivity_max`` / ``infidelity`` pass, having added noise to the ids.

    Args:
        model (nn.Module): the model (its ``main_input_name`` says whether it takes token ids).
        inputs (object): the inputs as given to ``attribute``: a tensor, a one-tensor tuple or a mapping with
                    ``input_ids``.
        owner (str): the function called, e.g. ``"ContributionWeights.attribute"``.
    Raises:
        InputError: for floating-point inputs where ``model`` takes token ids.
    """
    main = inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs
    if isinstance(main, Mapping):
        main = main.get("input_ids")
    if not isinstance(main, Tensor) or not main.is_floating_point():
        return
    if getattr(model, "main_input_name", "input_ids") != "input_ids":
        return
    raise InputError(
        f"{owner}: inputs are {main.dtype} {tuple(main.shape)}, but {type(model).__name__} takes token ids (integers). "
        "Noise on token ids has no meaning (an id names a token): NoiseTunnel and sensitivity_max / infidelity add "
        "noise to the inputs; use them on the pixel inputs of a vision model (where they work), or pass input_ids.")
