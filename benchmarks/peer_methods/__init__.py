"""The peers benchmark's parts: examples as token positions, the method registry, the measures, the peers'
offline adapters (ContextCite, AttnLRP). ``benchmarks/peers.py`` runs them; docs/PEERS.md says how."""

from . import attnlrp, contextcite  # noqa: F401  # each registers its methods
from .encoding import EncodedExample, boolq_examples, encode_example, with_answer, with_foil
from .measures import lds_ablations, lds_seed, measure, target_logprobs
from .methods import METHODS, PeerMethod, register, unavailable

__all__ = ["METHODS", "EncodedExample", "PeerMethod", "boolq_examples", "encode_example", "lds_ablations",
           "lds_seed", "measure", "register", "target_logprobs", "unavailable", "with_answer", "with_foil"]
