"""captum_cw: contribution weights and attention baselines as Captum attributors."""

from captum_cw.architectures import Architecture, find_attention_layers, register_architecture, registered_architectures
from captum_cw.attribution import (
    AttentionWeights,
    ContributionFactors,
    ContributionWeights,
    OutputNormalizedAttention,
    ValueWeightedAttention,
)
from captum_cw.token_contributions import TokenContributions

__version__ = "0.1.0"

__all__ = [
    "Architecture",
    "AttentionWeights",
    "ContributionFactors",
    "ContributionWeights",
    "OutputNormalizedAttention",
    "TokenContributions",
    "ValueWeightedAttention",
    "find_attention_layers",
    "register_architecture",
    "registered_architectures",
]
