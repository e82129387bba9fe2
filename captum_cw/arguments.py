"""Command-line argument types that refuse a bad number or device when the command line is parsed."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

import torch

__all__ = ["OneLineParser", "device", "int_at_least", "non_negative_float", "percent", "probability"]


class OneLineParser(argparse.ArgumentParser):
    r"""An ``ArgumentParser`` that reports a bad argument in one line on stderr (exit status 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    r"""A type for integers ``>= minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def probability(text: str) -> float:
    r"""A type for shares strictly between 0 and 1."""
    value = _finite(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return value


def percent(text: str) -> float:
    r"""A type for percentages in (0, 100]."""
    value = _finite(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage in (0, 100], got {value}")
    return value


def non_negative_float(text: str) -> float:
    r"""A type for finite numbers ``>= 0``."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def device(text: str) -> str:
    r"""A type for a torch device that this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``...)."""
    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (e.g. cpu, cuda, cuda:1, mps)") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text} asks for CUDA, but torch sees no CUDA device here; "
                                             "use --device cpu")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"{text} does not exist: torch sees {count} CUDA device(s)")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text} asks for Apple's MPS, which this machine lacks; use --device cpu")
    return text
