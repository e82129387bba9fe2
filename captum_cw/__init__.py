"""captum_cw: contribution weights and attention baselines as Captum attributors."""

from captum_cw.architectures import Architecture, find_attention_layers, register_architecture, registered_architectures
from captum_cw.attribution import (
    AttentionWeights,
    ContributionFactors,
    ContributionWeights,
    OutputNormalizedAttention,
    ValueWeightedAttention,
)

__version__ = "0.1.0"

__all__ = [
    "Architecture",
    "AttentionWeights",
    "ContributionFactors",
    "ContributionWeights",
    "OutputNormalizedAttention",
    "ValueWeightedAttention",
    "find_attention_layers",
    "register_architecture",
    "registered_architectures",
]
