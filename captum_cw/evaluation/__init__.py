"""ERASER-style faithfulness evaluation of token rankings by causal interventions."""

from captum_cw.evaluation.ranking import DEFAULT_BINS, removal_from_ranking, top_k_count
from captum_cw.evaluation.runner import EvaluationConfig, evaluate
from captum_cw.tasks import TASKS, Example, load_examples

__all__ = [
    "DEFAULT_BINS",
    "EvaluationConfig",
    "Example",
    "TASKS",
    "evaluate",
    "load_examples",
    "removal_from_ranking",
    "top_k_count",
]
