"""ContextCite (Cohen-Wang et al. 2024, ``context-cite==0.0.4``) run offline on our examples, through its hooks.

As shipped it cannot run here: ``context_cite.utils`` calls ``nltk.download("punkt_tab")`` at import and imports
spaCy, both only for its own sentence splitter, and ``ContextCiter._get_prompt_ids`` always applies a chat
template. The adaptation, all outside its package:

* its sources are ours, through its documented ``partitioner=`` hook (:class:`SourcesPartitioner`), so its
  sentence splitter (nltk, spaCy) is never called; where nltk or spaCy is absent, a stand-in module is put in
  ``sys.modules`` for the import only (and taken out again), and a present nltk's ``download`` is a no-op then;
* :class:`OfflineCiter` overrides the two places that assume a chat model: ``_get_prompt_ids`` gives our
  prompt's ids with the ablated sources' tokens deleted (the same ablation as every other measure here, no
  chat template) and ``_response_ids`` is the answer's first token (no generation);
* the scores are ``_get_attributions_for_ids_range(0, 1)``: what ``get_attributions()`` returns for the first
  response token, without its character-to-token mapping of a generated response. Its LASSO solver, ablation
  masks (keep rate 0.5) and logit-probability target are its own;
* with a foil (``EncodedExample.foil``; ContextCite has no contrast of its own) its target is the log-odds
  ``log p(answer) - log p(foil)`` on the same ablations (its own masks, ``context_cite.utils._create_mask`` with
  its seeds), fitted by its own solver: :meth:`OfflineCiter.contrast_attributions`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch import nn

from .encoding import EncodedExample
from .measures import target_logprobs
from .methods import PeerMethod, register

__all__ = ["contextcite_method", "load_context_cite"]


@contextlib.contextmanager
def _offline_imports() -> Iterator[None]:
    r"""nltk and spaCy as ContextCite's import needs them: stand-ins where absent, no nltk download."""
    stand_ins: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("nltk") is None:
        stand_ins["nltk"] = types.ModuleType("nltk")
    if importlib.util.find_spec("spacy") is None:
        for name in ("spacy", "spacy.lang", "spacy.lang.en"):
            stand_ins[name] = types.ModuleType(name)
        setattr(stand_ins["spacy.lang.en"], "English", None)  # never called: the sources are ours
    sys.modules.update(stand_ins)
    nltk = sys.modules.get("nltk") or importlib.import_module("nltk")
    download = getattr(nltk, "download", None)
    setattr(nltk, "download", lambda *args, **kwargs: True)  # the punkt_tab download at import
    try:
        yield
    finally:
        if download is None:
            del nltk.download
        else:
            setattr(nltk, "download", download)
        for name in stand_ins:
            del sys.modules[name]


def load_context_cite() -> Any:
    r"""The ``context_cite`` package, imported offline (see the module's docstring)."""
    if "context_cite" not in sys.modules:
        with _offline_imports():
            importlib.import_module("context_cite")
    return sys.modules["context_cite"]


@functools.cache
def _citer_class() -> type:
    r"""ContextCite's partitioner and citer, adapted (built on first use: the package is an optional peer)."""
    context_cite = load_context_cite()
    base_partitioner = sys.modules["context_cite.context_partitioner"].BaseContextPartitioner

    class SourcesPartitioner(base_partitioner):
        r"""Our sources as ContextCite's sources: the context is their concatenation."""

        def __init__(self, sources: list[str]) -> None:
            super().__init__("".join(sources))
            self.parts = list(sources)

        @property
        def num_sources(self) -> int:
            return len(self.parts)

        def split_context(self) -> None:
            return None

        def get_source(self, index: int) -> str:
            return self.parts[index]

        def get_context(self, mask: Any = None) -> str:
            keep = np.ones(len(self.parts), dtype=bool) if mask is None else mask
            return "".join(part for part, kept in zip(self.parts, keep) if kept)

    class OfflineCiter(context_cite.ContextCiter):
        r"""A ContextCiter on an encoded example: our prompt ids (sources deleted), the answer's first token."""

        def __init__(self, model: nn.Module, tokenizer: Any, encoded: EncodedExample, ablations: int) -> None:
            example = encoded.example
            super().__init__(model, tokenizer, example.context, example.question, num_ablations=ablations,
                             partitioner=SourcesPartitioner(list(example.sources)))
            self.encoded = encoded

        def _get_prompt_ids(self, mask: Any = None, return_prompt: bool = False) -> Any:  # noqa: FBT001, FBT002 (ContextCiter's)
            keep = np.ones(len(self.encoded.sources), dtype=bool) if mask is None else mask
            gone = {p for s, kept in enumerate(keep) if not kept for p in self.encoded.sources[s]}
            ids = [int(t) for p, t in enumerate(self.encoded.input_ids[0].tolist()) if p not in gone]
            return (ids, self.tokenizer.decode(ids)) if return_prompt else ids

        @property
        def _response_ids(self) -> list[int]:
            return [self.encoded.target]

        def contrast_attributions(self) -> np.ndarray:
            r"""``(sources,)`` ContextCite's solver fitted to the log-odds of the answer against the foil on its
            own ablation masks (one forward per ablation, as for its own target)."""
            create_mask = sys.modules["context_cite.utils"]._create_mask
            masks = np.array([create_mask(self.num_sources, self.ablation_keep_prob, seed)
                              for seed in range(self.num_ablations)])  # [ablations, sources] kept
            values = target_logprobs(self.model, [self._get_prompt_ids(mask=mask) for mask in masks],
                                     self.encoded.target, self.encoded.foil)  # [ablations]
            weights, _ = self.solver.fit(masks, values.astype(np.float32), 1)
            return np.asarray(weights, dtype=float)

    return OfflineCiter


def contextcite_method(ablations: int) -> PeerMethod:
    r"""ContextCite with ``ablations`` ablations (source level)."""
    def score(model: nn.Module, tokenizer: Any, encoded: EncodedExample) -> tuple[np.ndarray, int]:
        citer = _citer_class()(model, tokenizer, encoded, ablations)
        if encoded.foil is not None:
            return citer.contrast_attributions(), ablations
        weights, _ = citer._get_attributions_for_ids_range(0, 1)
        return np.asarray(weights, dtype=float), ablations
    return PeerMethod(f"contextcite_{ablations}", score, "source", ("context_cite", "pandas", "sklearn"))


for _ablations in (32, 64):
    register(contextcite_method(_ablations))
