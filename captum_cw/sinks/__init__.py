"""Attention sinks: the analysis of one sequence (:mod:`~captum_cw.sinks.analysis`), the study over many
texts behind ``captum-cw sinks`` (:mod:`~captum_cw.sinks.study`, :func:`~captum_cw.sinks.study.sink_study`)
and its figures (:mod:`~captum_cw.sinks.plots`)."""

from captum_cw.sinks.analysis import (
    SinkAnalysis,
    SinkNormEffect,
    analyze_sinks,
    matched_control,
    optimal_sink_rate,
    scale_sink_values,
    sink_norm_effect,
)

__all__ = ["SinkAnalysis", "SinkNormEffect", "analyze_sinks", "matched_control", "optimal_sink_rate",
           "scale_sink_values", "sink_norm_effect"]
