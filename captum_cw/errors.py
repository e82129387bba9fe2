"""The exceptions captum_cw raises for what a user can cause, one class per kind of problem.

Each subclasses the built-in exception a caller would catch without knowing captum_cw (``ValueError`` or
``TypeError``), and its message says what was passed, what is expected and how to proceed, in one line. They
are raised before any work is done where the problem can be seen then. The command line prints them without a
traceback and exits 2.
"""

from __future__ import annotations

__all__ = [
    "CaptumCWError",
    "InputError",
    "SelfCheckError",
    "UnsupportedArchitectureError",
    "UnsupportedArgumentError",
    "UnsupportedSetupError",
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
