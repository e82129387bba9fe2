"""Every figure captum_cw draws, on ``matplotlib.figure.Figure`` (never pyplot: the user's backend and open
figures are left alone). The modules that compute what is drawn call these; nothing here computes scores.

- :mod:`~captum_cw.plotting.heatmaps`: layer x token heatmaps and readable token labels (``captum-cw attribute``).
- :mod:`~captum_cw.plotting.curves`: the faithfulness curves of an evaluation (``curves.png``).
- :mod:`~captum_cw.plotting.sinks`: the figures of the sink study (``captum-cw sinks``).
"""

from captum_cw.plotting.curves import plot_curves
from captum_cw.plotting.heatmaps import (
    display_token,
    heatmap_path,
    layer_token_heatmaps,
    plot_layer_token_heatmaps,
    token_ticks,
)
from captum_cw.plotting.sinks import (
    sink_alignment_figure,
    sink_convexity_figure,
    sink_factors_figure,
    sink_norm_effect_figure,
    sink_received_figure,
)

__all__ = [
    "display_token",
    "heatmap_path",
    "layer_token_heatmaps",
    "plot_curves",
    "plot_layer_token_heatmaps",
    "sink_alignment_figure",
    "sink_convexity_figure",
    "sink_factors_figure",
    "sink_norm_effect_figure",
    "sink_received_figure",
    "token_ticks",
]
