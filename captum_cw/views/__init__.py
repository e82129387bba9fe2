"""Views of the scores: captum ``visualize_text`` records, a self-contained HTML page, JSON and CSV.

One module per job: ``model.py`` scores a text into an :class:`AttributionView` (:func:`attribution_view`) and
writes its JSON and CSV; ``records.py`` turns scores, captum's ``LLMAttributionResult`` or a view into the
records of ``captum.attr.visualization.visualize_text`` (:func:`text_records`); ``html_page.py`` renders a view
as one HTML file (:func:`render_html`, :func:`write_html`) from the page's template, style and script in
``templates/`` (package data; inline in the page, no network).
"""

from captum_cw.models import readable_tokens
from captum_cw.views.html_page import html_view, index_ranges, render_html, write_html
from captum_cw.views.model import (
    METRIC_LABELS,
    VIEW_FILES,
    AttributionView,
    aggregation_label,
    attribution_scores,
    attribution_view,
    view_path,
)
from captum_cw.views.records import text_records

__all__ = ["METRIC_LABELS", "VIEW_FILES", "AttributionView", "aggregation_label", "attribution_scores",
           "attribution_view", "html_view", "index_ranges", "readable_tokens", "render_html", "text_records",
           "view_path", "write_html"]
