"""Views: visualize_text records, the scores behind the HTML view, JSON and CSV, the HTML page itself, and
token labels that stay readable (no two tick labels overlap) at a few hundred tokens."""

import csv
import html
import json
import re
from html.parser import HTMLParser

import pytest
import torch
import transformers
from captum.attr import visualization
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from captum_cw.attribution import AttentionWeights, ContributionWeights
from captum_cw.layer_aggregation import rollout
from captum_cw.llm import LLMContributionAttribution
from captum_cw.plotting import layer_token_heatmaps, plot_layer_token_heatmaps
from captum_cw.views import attribution_view, html_view, render_html, text_records, write_html

TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)
    return model, tokenizer


# ------------------------------------------------------------------------------------------ visualize_text


def test_records_from_a_tensor_render_in_visualize_text(capsys):
    scores = torch.tensor([[0.5, -0.25, 0.0], [0.0, 0.0, 0.0]])
    records = text_records(scores, ["a<b", " &c", "\n"], pred_class=["x", "y"], pred_prob=0.9, attr_class="cw")
    assert [type(r) for r in records] == [visualization.VisualizationDataRecord] * 2
    first, empty = records
    assert first.word_attributions.tolist() == [1.0, -0.5, 0.0]  # scaled so the largest |score| is 1
    assert first.attr_score == pytest.approx(0.25) and first.pred_class == "x" and first.pred_prob == 0.9
    assert first.raw_input_ids == ["a&lt;b", " &amp;c", "↵"]  # visualize_text writes the words as HTML
    assert empty.word_attributions.tolist() == [0.0, 0.0, 0.0] and empty.pred_class == "y"
    page = visualization.visualize_text(records).data
    capsys.readouterr()  # outside a notebook, display() prints the object
    assert "a&lt;b" in page and "&amp;c" in page and page.count("<mark") == 6
    raw = text_records(scores[0], ["a", "b", "c"], normalize=False)[0]
    assert raw.word_attributions.tolist() == [0.5, -0.25, 0.0]


def test_records_refuse_mismatched_tokens():
    with pytest.raises(ValueError, match="2 tokens for 3 scores"):
        text_records(torch.ones(3), ["a", "b"])
    with pytest.raises(ValueError, match="tokens are needed"):
        text_records(torch.ones(3))
    with pytest.raises(ValueError, match="pred_class has 3 entries for 2 rows"):
        text_records(torch.ones(2, 3), ["a", "b", "c"], pred_class=["p", "q", "r"])


def test_records_from_an_llm_result(tiny, capsys):
    model, tokenizer = tiny
    result = LLMContributionAttribution(model, tokenizer).attribute(TEXT, " Paris is")
    records = text_records(result)
    assert len(records) == len(result.output_tokens) == 2
    assert records[0].raw_input_ids == result.input_tokens and records[0].pred_class == result.output_tokens[0]
    assert records[1].pred_prob == pytest.approx(float(result.output_probs[1]))
    assert records[0].attr_score == pytest.approx(float(result.token_attr[0].sum()), abs=1e-6)
    visualization.visualize_text(records)
    capsys.readouterr()


def test_raw_tokens_are_made_readable_with_the_tokenizer(tiny):
    _, tokenizer = tiny
    raw = tokenizer.convert_ids_to_tokens(tokenizer(TEXT)["input_ids"])
    assert raw[1] == "Ġcapital"
    record, = text_records(torch.ones(len(raw)), raw, tokenizer=tokenizer)
    assert record.raw_input_ids[1] == " capital"


# ---------------------------------------------------------------------------------------------- the scores


def test_view_of_the_last_position_matches_the_attributors(tiny):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    assert view.positions == [n - 1] and view.tokens == [tokenizer.decode([t]) for t in ids[0].tolist()]
    assert view.metrics == ["cw_inter", "cw_intra", "attention"] and view.layers == [0, 1] and view.heads == [0, 1,
                                                                                                           2, 3]
    expected = {"cw_inter": ContributionWeights(model, metric="cw_inter"),
                "cw_intra": ContributionWeights(model, metric="cw_intra"), "attention": AttentionWeights(model)}
    for metric, attributor in expected.items():
        per_layer = attributor.attribute(ids, query_positions=[n - 1])[0]  # [layer, row, key]
        per_head = attributor.attribute(ids, query_positions=[n - 1], per_head=True)[0]
        torch.testing.assert_close(view.per_layer[metric], per_layer, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(view.per_head[metric], per_head, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(view.aggregated[metric], per_layer.mean(0))
    assert view.predicted == [tokenizer.decode([model(ids).logits[0, -1].argmax()])]


def test_view_of_a_target_sums_like_the_text_front_end(tiny):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, " Paris is", aggregation="last", metrics=("cw_intra",))
    n_prompt = len(tokenizer(TEXT)["input_ids"])
    assert view.positions == [n_prompt - 1, n_prompt] and view.target_tokens == [" Paris", " is"]
    assert len(view.tokens) == n_prompt + 1  # the target's last token is read by no explained position
    result = LLMContributionAttribution(model, tokenizer, layer_aggregation="last", metric="cw_intra").attribute(
        TEXT, " Paris is")
    torch.testing.assert_close(view.aggregated["cw_intra"][:, :n_prompt], result.token_attr)
    torch.testing.assert_close(torch.tensor(view.target_probs), result.output_probs)


def test_rollout_layer_and_head_selection(tiny):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, layers=[-1, 0], heads=[3, 1], aggregation="rollout",
                            metrics=("cw_inter",), position=2)
    assert view.layers == [0, 1] and view.heads == [1, 3] and view.positions == [2] and len(view.tokens) == 3
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    full = ContributionWeights(model, heads=[1, 3]).attribute(ids)  # [1, layer, n, n], heads summed
    torch.testing.assert_close(view.aggregated["cw_inter"], rollout(full)[0, [2], :3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(view.per_layer["cw_inter"], full[0, :, [2], :3], rtol=1e-5, atol=1e-6)


def test_sinks_are_keys_with_large_attention(tiny):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, threshold=0.2)
    attention = view.per_layer["attention"][:, 0]  # [layer, key]
    assert view.sinks_per_layer() == [[j for j in range(len(view.tokens)) if layer[j] > 0.2] for layer in attention]
    assert view.sinks() == [j for j in range(len(view.tokens)) if attention[:, j].mean() > 0.2]



def test_exclusions_are_the_first_token_and_the_keys_above_the_threshold_at_each_position(tiny):
    model, tokenizer = tiny
    plain = attribution_view(model, tokenizer, TEXT, " Paris is")
    first = attribution_view(model, tokenizer, TEXT, " Paris is", exclude="first")
    assert first.exclude == "first" and first.excluded == [[0], [0]] and plain.excluded == []
    torch.testing.assert_close(first.aggregated["cw_inter"], plain.aggregated["cw_inter"])  # scores kept, marked
    ids = torch.tensor([plain.token_ids + [0]])  # the keys and the target's last token
    rows = plain.positions
    attention = AttentionWeights(model).attribute(ids, query_positions=rows)[0, :, :, :len(plain.tokens)]
    found = []
    for threshold in (0.15, 0.2, 0.3):  # [layer, position, key] -> each position's keys above it, mean over layers
        expected = [(row > threshold).nonzero().flatten().tolist() for row in attention.mean(0)]
        sinks = attribution_view(model, tokenizer, TEXT, " Paris is", exclude="sinks", threshold=threshold)
        assert sinks.excluded == expected and sinks.excluded_keys() == sorted({k for keys in expected for k in keys})
        assert sinks.to_dict()["excluded"] == expected
        found.append(any(expected))
    assert any(found) and not all(found)  # some thresholds mark keys on this model, some do not


@pytest.mark.parametrize("kwargs, message", [
    ({"target": " Paris", "position": 1}, "give a position or a target, not both"),
    ({"position": 5}, r"position \[5\] out of range for a sequence of 5 tokens"),
    ({"target": ""}, "the target has no tokens"),
    ({"aggregation": "max"}, "aggregation must be one of last, mean, magnitude, rollout"),
    ({"metrics": ("both",)}, "Unknown metric 'both'"),
    ({"metrics": ()}, "metrics is empty"),
    ({"layers": [2]}, "layer 2 is out of range"),
    ({"threshold": 1.0}, "threshold is a share"),
    ({"exclude": "bos"}, "exclude must be one of first, special, sinks; got 'bos'"),
])
def test_view_refuses_bad_options(tiny, kwargs, message):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=message):
        attribution_view(model, tokenizer, TEXT, **kwargs)


# ------------------------------------------------------------------------------------------- JSON and CSV


def test_json_and_csv_hold_every_score(tiny, tmp_path):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, " Paris", model_name="tiny")
    document = json.loads(view.write_json(tmp_path / "scores.json").read_text())
    assert document["tokens"] == view.tokens and document["positions"] == view.positions
    assert document["target_tokens"] == [" Paris"] and document["layers"] == [0, 1]
    scores = document["scores"]["cw_inter"]
    n_keys = len(view.tokens)
    assert torch.tensor(scores["per_head"]).shape == (2, 4, 1, n_keys)
    assert scores["per_layer"] == view.per_layer["cw_inter"].tolist()
    assert scores["aggregated"] == view.aggregated["cw_inter"].tolist()
    with view.write_csv(tmp_path / "scores.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 3 * 1 * (n_keys + 2 * n_keys + 2 * 4 * n_keys)
    head = [r for r in rows if r["metric"] == "attention" and r["level"] == "head" and r["layer"] == "1"
            and r["head"] == "2" and r["key"] == "0"]
    assert len(head) == 1 and float(head[0]["score"]) == pytest.approx(float(view.per_head["attention"][1, 2, 0, 0]))
    aggregated = [r for r in rows if r["level"] == "aggregated" and r["metric"] == "cw_intra"]
    assert [r["token"] for r in aggregated] == view.tokens and {r["layer"] for r in aggregated} == {"mean"}


# ---------------------------------------------------------------------------------------------- HTML view


class _TagBalance(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def test_html_view_is_one_valid_self_contained_page(tiny, tmp_path):
    model, tokenizer = tiny
    text = "Fish & <chips> are"
    page = html_view(model, tokenizer, text, " good", model_name="tiny")
    parser = _TagBalance()
    parser.feed(page)
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    assert page.startswith("<!DOCTYPE html>") and not re.search(r"(src|href)=|https?://|@import", page)
    view = attribution_view(model, tokenizer, text, " good")
    chips = [attrs for tag, attrs in parser.tags if tag == "span" and "tok" in attrs.get("class", "")]
    for token in view.tokens:  # every token, escaped, with its value on hover
        assert f">{html.escape(token)}</span>" in page
    for metric in view.metrics:
        for key, value in enumerate(view.aggregated[metric][0].tolist()):
            assert any(f"position {key} · {metric} = {value:.6g}" in chip.get("title", "") for chip in chips)
    data = json.loads(re.search(r'<script type="application/json" id="cw-data">(.*?)</script>', page, re.S)[1])
    assert data["tokens"] == view.tokens and data["metrics"] == view.metrics and data["sinks"] == view.sinks()
    torch.testing.assert_close(torch.tensor(data["per_head"]["cw_intra"]), view.per_head["cw_intra"], rtol=1e-5,
                               atol=1e-7)
    written = write_html(view, tmp_path / "deep" / "view.html")
    assert written.read_text(encoding="utf-8") == render_html(view)
    folder = tmp_path / "folder.html"
    folder.mkdir()
    assert write_html(view, folder) == folder / "captum_cw.html"  # a folder gets the page inside it
    with pytest.raises(ValueError, match="has the suffix '.txt'"):
        write_html(view, tmp_path / "view.txt")



def test_html_view_marks_excluded_tokens_instead_of_colouring_them(tiny):
    model, tokenizer = tiny
    view = attribution_view(model, tokenizer, TEXT, exclude="first")
    page = render_html(view)
    parser = _TagBalance()
    parser.feed(page)
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    chips = [attrs for tag, attrs in parser.tags if tag == "span" and "tok" in attrs.get("class", "").split()
             and "position " in attrs.get("title", "")]
    assert len(chips) == len(view.metrics) * len(view.tokens)
    for chip in chips:
        excluded = chip["title"].split(" · ")[1] == "position 0"
        assert ("excluded" in chip["class"].split()) == excluded and ("style" not in chip) == excluded
        assert ("excluded (first)" in chip["title"]) == excluded
    data = json.loads(re.search(r'<script type="application/json" id="cw-data">(.*?)</script>', page, re.S)[1])
    assert data["excluded"] == [[0]] and "<b>Excluded</b> (first" in page
    assert "<b>Excluded</b>" not in render_html(attribution_view(model, tokenizer, TEXT))


# ------------------------------------------------------------------------------- readable token labels


def _overlaps(figure: Figure) -> list[tuple[str, str]]:
    r"""Pairs of neighbouring x tick labels (of any axes) whose drawn boxes overlap."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw_without_rendering()  # lays out the constrained layout
    found = []
    for axis in figure.axes:
        labels = [label for label in axis.get_xticklabels() if label.get_text()]
        boxes = [label.get_window_extent(renderer) for label in labels]
        for (a, box_a), (b, box_b) in zip(zip(labels, boxes), list(zip(labels, boxes))[1:]):
            if box_a.x1 > box_b.x0 + 0.5:
                found.append((a.get_text(), b.get_text()))
    return found


@pytest.mark.parametrize("n_tokens", [5, 40, 128, 256])
def test_heatmap_labels_never_collide(tmp_path, n_tokens):
    tokens = [f"tok{j % 7}" + ("\n" if j % 11 == 0 else "") for j in range(n_tokens)]
    panels = {"cw": torch.randn(30, n_tokens), "attention": torch.rand(30, n_tokens)}  # [layer, token]
    sink = n_tokens // 2
    figure = layer_token_heatmaps(panels, tokens, title="t", layers=range(30), marked=[0, sink])
    assert figure.get_figwidth() <= 24 and _overlaps(figure) == []
    heatmaps = [axis for axis in figure.axes if axis.images]  # the others are colour bars
    assert len(heatmaps) == 2
    for axis in heatmaps:
        shown = [label.get_text() for label in axis.get_xticklabels()]
        assert shown[0].startswith("▼tok0") and shown[-1].startswith(f"tok{(n_tokens - 1) % 7}")  # sink, last
        assert any(label.startswith(f"▼tok{sink % 7}") for label in shown)
        assert all("\n" not in label for label in shown)
        assert min(label.get_fontsize() for label in axis.get_xticklabels()) >= 8  # readable at 120 dpi
        assert (len(shown) < n_tokens) == (n_tokens >= 128)  # every k-th label at 128 tokens and more
    path = plot_layer_token_heatmaps(panels, tokens, tmp_path / "heat", layers=range(30))
    assert path.suffix == ".png" and path.read_bytes()[:4] == b"\x89PNG"


def test_a_sink_that_dwarfs_the_rest_leaves_the_colour_scale():
    scores = torch.full((2, 6), 0.01)
    scores[:, 0] = 0.9
    figure = layer_token_heatmaps({"cw": scores}, list("abcdef"), marked=[0])
    assert figure.axes[0].images[0].get_clim() == pytest.approx((-0.01, 0.01))
    figure = layer_token_heatmaps({"cw": scores}, list("abcdef"))
    assert figure.axes[0].images[0].get_clim() == pytest.approx((-0.9, 0.9))


def test_sinks_received_plot_is_readable_at_256_tokens():
    from captum_cw.plotting import sink_received_figure

    received = torch.rand(30, 256) / 256
    received[3:, 0] = 0.6
    sinks = [[0] if layer >= 3 else [] for layer in range(30)]
    figure = sink_received_figure(received, sinks, [f"w{j}" for j in range(256)], 0.3)
    assert figure.get_figwidth() <= 16 and _overlaps(figure) == []
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert labels[0] == "▼w0 (0)" and labels[-1] == "w255 (255)" and len(labels) < 100
    assert min(label.get_fontsize() for label in figure.axes[0].get_xticklabels()) >= 7
