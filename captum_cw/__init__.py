"""captum_cw: contribution weights and attention baselines as Captum attributors."""

from captum_cw.architectures import (
    Architecture,
    AttentionLayer,
    find_attention_layers,
    register_architecture,
    registered_architectures,
)
from captum_cw.attribution import (
    AttentionWeights,
    ContributionFactors,
    ContributionWeights,
    MetricAttribution,
    MetricScores,
    OutputNormalizedAttention,
    ValueWeightedAttention,
    attribute_metrics,
)
from captum_cw.errors import (
    CaptumCWError,
    InputError,
    SelfCheckError,
    UnsupportedArchitectureError,
    UnsupportedArgumentError,
    UnsupportedSetupError,
)
from captum_cw.knockout_gradients import KnockoutGradients, knockout_gradients
from captum_cw.llm import LLMContributionAttribution
from captum_cw.metrics import Metric, get_metric, metric_names, register_metric
from captum_cw.positions import Positions
from captum_cw.sources import SourceAttribution, SourceContributions
from captum_cw.token_contributions import TokenContributions

__version__ = "0.1.0"

__all__ = [
    "Architecture",
    "AttentionLayer",
    "AttentionWeights",
    "CaptumCWError",
    "ContributionFactors",
    "ContributionWeights",
    "InputError",
    "KnockoutGradients",
    "LLMContributionAttribution",
    "Metric",
    "MetricAttribution",
    "MetricScores",
    "OutputNormalizedAttention",
    "Positions",
    "SelfCheckError",
    "SourceAttribution",
    "SourceContributions",
    "TokenContributions",
    "UnsupportedArchitectureError",
    "UnsupportedArgumentError",
    "UnsupportedSetupError",
    "ValueWeightedAttention",
    "attribute_metrics",
    "find_attention_layers",
    "get_metric",
    "knockout_gradients",
    "metric_names",
    "register_architecture",
    "register_metric",
    "registered_architectures",
]
