"""The HTML view read as a browser reads it (html.parser): every token with its score and colour, the controls
and legends, text that looks like markup escaped; the page's template files ship as package data; and the
visualize_text records of a view."""

import fnmatch
import json
import re
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest
import transformers

from captum_cw.layer_aggregation import LAYER_AGGREGATIONS
from captum_cw.views import aggregation_label, attribution_view, render_html, text_records
from captum_cw.views.html_page import TEMPLATES

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Fish & <chips> are"
TARGET = " <script>alert(1)</script> &amp;"


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)
    return model, tokenizer


@pytest.fixture(scope="module")
def view(tiny):
    model, tokenizer = tiny
    return attribution_view(model, tokenizer, TEXT, TARGET, model_name="tiny <b>", threshold=0.1)


class Page(HTMLParser):
    r"""The elements of a page: ``(tag, attributes, text)`` of each, its text being all the text inside it."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self, text: str):
        super().__init__()  # convert_charrefs: the text as a browser shows it, entities decoded
        self.elements: list[tuple[str, dict, list[str]]] = []
        self.open: list[tuple[str, dict, list[str]]] = []
        self.feed(text)
        self.close()
        assert not self.open, [tag for tag, _, _ in self.open]

    def handle_starttag(self, tag, attrs):
        element = (tag, {name: value or "" for name, value in attrs}, [])
        self.elements.append(element)
        if tag not in self.VOID:
            self.open.append(element)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1][0] == tag, f"</{tag}> closes {self.open[-1][0] if self.open else 'nothing'}"
        self.open.pop()

    def handle_data(self, data):
        for _, _, text in self.open:
            text.append(data)

    def find(self, tag: str, cls: str | None = None, **attributes: str) -> list[tuple[dict, str]]:
        r"""``(attributes, text)`` of the ``tag`` elements of class ``cls`` (one of theirs) with ``attributes``."""
        return [(attrs, "".join(text)) for name, attrs, text in self.elements
                if name == tag and (cls is None or cls in attrs.get("class", "").split())
                and all(attrs.get(key) == value for key, value in attributes.items())]


def expected_colour(value: float, limit: float) -> tuple[int, int, int]:
    r"""RdBu's ends at ``|value| = limit``: red (178, 24, 43) above 0, blue (33, 102, 172) below, white at 0."""
    share = min(1.0, abs(value) / limit)
    end = (178, 24, 43) if value >= 0 else (33, 102, 172)
    return tuple(round(255 - (255 - e) * share) for e in end)


def test_every_token_is_shown_with_its_score_and_colour(view):
    page = Page(render_html(view))
    sinks = set(view.sinks())
    rows = ["sum"] + [str(r) for r in range(len(view.positions))]  # the sum over the positions, then each
    assert len(view.positions) > 1 and sinks  # a sum strip, and a sink to mark
    strips = page.find("div", cls="strips")
    assert [attrs["data-row"] for attrs, _ in strips] == rows
    assert ["hidden" in attrs for attrs, _ in strips] == [False] + [True] * len(view.positions)
    chips = [(attrs, text) for attrs, text in page.find("span", cls="tok") if " · position " in attrs.get("title", "")]
    assert len(chips) == len(strips) * len(view.metrics) * len(view.tokens)
    for r, metric in enumerate(view.metrics):  # the first strip: the sum over the explained positions
        values = view.aggregated[metric].sum(0).tolist()  # [key]
        limit = max(abs(v) for k, v in enumerate(values) if k not in sinks)
        shown = chips[r * len(view.tokens):(r + 1) * len(view.tokens)]
        for key, ((attrs, text), token, value) in enumerate(zip(shown, view.tokens, values)):
            assert text == token
            assert f"{token!r} · position {key} · {metric} = {value:.6g}" in attrs["title"]
            assert ("sink" in attrs["class"].split()) == (key in sinks) == attrs["title"].endswith(" · sink")
            colour = tuple(int(c) for c in re.match(r"background:rgb\((\d+),(\d+),(\d+)\)", attrs["style"]).groups())
            assert colour == expected_colour(value, limit)


def test_the_controls_and_legends_are_there(view):
    page = Page(render_html(view))
    options = {attrs["id"]: text for attrs, text in page.find("select")}
    assert set(options) == {"row", "scale", "width"} and "one per row, sinks left out" in options["scale"]
    positions = [attrs["value"] for attrs, _ in page.find("option")][:len(view.positions) + 1]
    assert positions == ["sum"] + [str(r) for r in range(len(view.positions))]
    assert [text for _, text in page.find("h2")] == ["Scores per token (mean over layers)", "Per layer",
                                                     "Per head: layer "]
    assert page.find("div", id="layers") and page.find("div", id="heads") and page.find("div", cls="controls")
    note = " ".join(text for _, text in page.find("p", cls="note"))
    assert "Red: positive, blue: negative, white: 0." in note and "exceeds 0.1" in note
    assert [text for _, text in page.find("span", cls="sink")][0] == "\xa0▼\xa0" and page.find("span", cls="key")
    data = json.loads(page.find("script", type="application/json", id="cw-data")[0][1])
    assert data["tokens"] == view.tokens and data["metrics"] == view.metrics and data["threshold"] == 0.1
    scripts = [text for attrs, text in page.find("script") if "type" not in attrs]
    assert len(scripts) == 1 and 'document.getElementById("cw-data")' in scripts[0]
    style, = (text for _, text in page.find("style"))
    assert ".tok.sink" in style and ".legend" in style


def test_text_that_looks_like_markup_is_escaped(view):
    text = render_html(view)
    page = Page(text)
    assert [attrs.get("type") for attrs, _ in page.find("script")] == ["application/json", None]  # none injected
    assert [t for _, t in page.find("title")] == [t for _, t in page.find("h1")] == ["captum_cw: tiny <b>"]
    assert [t for _, t in page.find("b")] == ["Text:", "Target:", "Explained:", "Layers:", "Heads:", "Sinks"]
    meta = [t for _, t in page.find("p", cls="meta")]
    assert meta[0] == f"Text: {TEXT} Target: {TARGET}"  # shown as written, <script> and &amp; included
    assert "<script>alert" not in text and "&amp;amp;" in text
    assert "$" not in text  # every field of the template filled


def test_the_page_templates_ship_as_package_data():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    folder = resources.files("captum_cw.views") / "templates"
    shipped = {name: (folder / name).read_text(encoding="utf-8") for name in TEMPLATES}
    assert all(shipped.values())
    on_disk = sorted(path.name for path in (ROOT / "captum_cw" / "views" / "templates").iterdir())
    assert on_disk == sorted(TEMPLATES)
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["captum_cw"]
    for name in on_disk:
        assert any(fnmatch.fnmatch(f"views/templates/{name}", glob) for glob in globs), f"{name} is not package data"
    fields = set(re.findall(r"\$(\w+)", shipped["page.html"]))
    assert {"title", "css", "js", "data", "token_strips"} <= fields


def test_records_of_a_view_one_per_metric_and_position(view):
    records = text_records(view)
    rows = [(metric, r) for metric in view.metrics for r in range(len(view.positions))]
    assert len(records) == len(rows)
    for record, (metric, r) in zip(records, rows):
        assert record.pred_class == view.target_tokens[r] and record.pred_prob == pytest.approx(view.target_probs[r])
        assert record.attr_class.endswith(f" @ {view.positions[r]}") and record.true_class == TARGET
        assert record.attr_score == pytest.approx(float(view.aggregated[metric][r].sum()))
        assert float(record.word_attributions.abs().max()) == pytest.approx(1.0)
        assert len(record.raw_input_ids) == len(view.tokens)


@pytest.mark.parametrize("aggregation", LAYER_AGGREGATIONS)
def test_every_layer_aggregation_renders_and_says_its_name(tiny, aggregation):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, TARGET, aggregation=aggregation, layers=[0, 1])
    heading = [text for _, text in Page(render_html(view)).find("h2")][0]
    assert heading == f"Scores per token ({aggregation_label(aggregation, view.layers)})"
    assert {"mean": "mean over", "last": "last layer (1)", "magnitude": "mean magnitude over",
            "rollout": "rollout over"}[aggregation] in heading
