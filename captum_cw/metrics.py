"""The per-head metrics, each defined once: its name and aliases, its per-head scores, how heads are aggregated,
and its completeness identity (docs/DESIGN.md, "Metrics"). This module is the one place a metric's name is
spelled: attributors, the evaluator, the command line and the reports ask the registry (:func:`get_metric`,
:func:`metric_names`) or use the built-in metrics below by object; a new metric is one :func:`register_metric`
call plus its tests.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from torch import Tensor

from captum_cw.errors import InputError
from captum_cw.geometry import HeadGeometry

__all__ = ["ATTENTION", "CW_INTER", "CW_INTRA", "Metric", "OUTPUT_NORMALIZED", "PAPER_ORDER", "VALUE_WEIGHTED",
           "deprecated_variant", "get_metric", "metric_names", "register_metric"]


@dataclass(frozen=True)
class Metric:
    r"""
    One per-head metric.

    Args:
        name (str): its key, e.g. ``"cw_inter"``: how results, records and files name it.
        label (str): how tables and plots name it.
        per_head (Callable): ``HeadGeometry -> (batch, head, row, key)`` scores.
        head_reduction (str): ``"sum"`` or ``"mean"``: how token-level scores
                    aggregate heads.
        row_totals (Callable, optional): ``HeadGeometry -> (batch, head, row)``,
                    what each head's row sums to over the keys by the metric's
                    completeness identity, computed without the scores; None if it
                    has none (then it has no convergence delta).
        aliases (tuple[str, ...], optional): other names :func:`get_metric` accepts
                    for it, e.g. ``("inter", "cw")``. Default: ``()``
        projected_on (str, optional): for contribution weights, the output each
                    key's value is projected on: ``"layer"`` (inter-head) or ``"head"``
                    (intra-head), which :meth:`HeadGeometry.decomposition` factors and
                    :class:`captum_cw.ContributionWeights` computes; None for the other
                    metrics. Default: None
    """

    name: str
    label: str
    per_head: Callable[[HeadGeometry], Tensor]
    head_reduction: Literal["sum", "mean"]
    row_totals: Callable[[HeadGeometry], Tensor] | None = None
    aliases: tuple[str, ...] = ()
    projected_on: Literal["layer", "head"] | None = None

    def __post_init__(self) -> None:
        if self.head_reduction not in ("sum", "mean"):
            raise InputError(f"head_reduction must be 'sum' or 'mean', got {self.head_reduction!r}.")
        if not isinstance(self.aliases, tuple) or not all(isinstance(alias, str) for alias in self.aliases):
            raise InputError(f"aliases must be a tuple of str, got {self.aliases!r}.")
        if len(set(self.spellings)) != len(self.spellings):
            raise InputError(f"metric {self.name!r}: its name and aliases must differ, got {self.spellings}.")
        if self.projected_on not in (None, "layer", "head"):
            raise InputError(f"projected_on must be 'layer', 'head' or None, got {self.projected_on!r}.")

    @property
    def spellings(self) -> tuple[str, ...]:
        r"""Its name, then its aliases: every string :func:`get_metric` resolves to it."""
        return (self.name, *self.aliases)


_REGISTERED: dict[str, Metric] = {}  # name -> metric, in registration order; read through the functions below


def register_metric(metric: Metric) -> Metric:
    r"""
    Adds a metric; every entry point that takes metric names then knows it.

    Returns:
        ``metric``, so that a module can keep it: ``MINE = register_metric(Metric(...))``.
    Raises:
        InputError: its name or an alias already names a registered metric (a metric is never replaced).
    """
    if not isinstance(metric, Metric):
        raise InputError(f"register_metric takes a Metric, got {type(metric).__name__}.")
    owners = {spelling: known.name for known in _REGISTERED.values() for spelling in known.spellings}
    clashes = [f"{spelling!r} already names {owners[spelling]!r}" for spelling in metric.spellings
               if spelling in owners]
    if clashes:
        raise InputError(f"Cannot register metric {metric.name!r}: {'; '.join(clashes)}. Give it another name "
                         "or alias.")
    _REGISTERED[metric.name] = metric
    return metric


def metric_names() -> tuple[str, ...]:
    r"""The names of the registered metrics, in registration order (the built-in ones first)."""
    return tuple(_REGISTERED)


def get_metric(name: str) -> Metric:
    r"""The registered metric called ``name`` or one of its aliases; an InputError lists the known ones otherwise."""
    for metric in _REGISTERED.values():
        if name in metric.spellings:
            return metric
    aliases = "; ".join(f"{metric.name}: {', '.join(metric.aliases)}" for metric in _REGISTERED.values()
                        if metric.aliases)
    raise InputError(f"Unknown metric {name!r}; choose one of {', '.join(_REGISTERED)} (aliases: {aliases}).")


_Given = TypeVar("_Given")


def deprecated_variant(
    metric: _Given | None, variant: _Given | None, owner: str, names: tuple[str, str] = ("metric", "variant")
) -> _Given | None:
    r"""
    What an entry point was given for ``metric=``, taking the deprecated ``variant=`` in its place with a
    DeprecationWarning (its ``"inter"`` and ``"intra"`` are aliases of the metrics).

    Args:
        metric, variant: the two arguments as given (None: not given).
        owner (str): the entry point, for the messages.
        names (tuple[str, str], optional): the two arguments' names. Default: ``("metric", "variant")``
    Raises:
        InputError: both are given.
    """
    if variant is None:
        return metric
    new, old = names
    if metric is not None:
        raise InputError(f"{owner}: give {new}= only; {old}= is its deprecated former name.")
    warnings.warn(f"{owner}: {old}= is deprecated; pass {new}= instead (a metric name or alias: {new}={variant!r} "
                  "means the same).", DeprecationWarning, stacklevel=3)
    return variant


def _reads(geometry: HeadGeometry) -> Tensor:
    r"""1 for rows that read any key, 0 for padded rows: ``(batch, head, row)``."""
    return (geometry.alpha.sum(-1) > 0).to(geometry.alpha.dtype)


def _reads_a_nonzero_output(geometry: HeadGeometry) -> Tensor:
    return _reads(geometry) * (geometry.head_output_norms.squeeze(-1) > 0)


ATTENTION = register_metric(Metric("attention", "attention", lambda g: g.alpha, "mean", _reads))
VALUE_WEIGHTED = register_metric(Metric("value_weighted", "value-weighted", HeadGeometry.value_weighted, "mean"))
OUTPUT_NORMALIZED = register_metric(Metric("output_normalized", "output-normalised",
                                           HeadGeometry.output_normalized, "mean"))
CW_INTRA = register_metric(Metric("cw_intra", "CW (intra-head)", HeadGeometry.cw_intra, "mean",
                                  _reads_a_nonzero_output, aliases=("intra",), projected_on="head"))
CW_INTER = register_metric(Metric("cw_inter", "CW (inter-head)", HeadGeometry.cw_inter, "sum",
                                  lambda g: g.inter_shares, aliases=("inter", "cw"), projected_on="layer"))

PAPER_ORDER = (ATTENTION.name, VALUE_WEIGHTED.name, OUTPUT_NORMALIZED.name, CW_INTER.name)
"""The paper's faithfulness order, least faithful first: attention < value-weighted < output-normalised < CW
(inter-head), what :func:`captum_cw.evaluation.report.paper_order` tests."""
