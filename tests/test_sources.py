"""Source-level context attribution: several targets (a response) against the float64 brute force, sources as
sums of their tokens, generated responses, chat messages and refusals."""

from __future__ import annotations

import html.parser

import pytest
import torch

import captum_cw.sources as sources
from captum_cw.architectures import find_attention_layers
from captum_cw.errors import InputError
from captum_cw.knockout_gradients import knockout_gradients
from captum_cw.scan import prepare_inputs
from captum_cw.sources import SourceContributions
from captum_cw.target_contributions import target_scores
from test_target_contributions import reference
from tiny_models import FAMILIES, example_inputs

SOURCES = ["Anna lives in Paris.", "Tom lives in Rome.", "Maria lives in Tokyo."]


@pytest.mark.parametrize("rows", ["explained", "all"])
def test_a_response_of_several_tokens_matches_the_brute_force(rows):
    model = FAMILIES["llama"].build()
    ids = example_inputs(FAMILIES["llama"])[0][:1]
    positions, targets = [5, 6, 7], [ids[0, 6].item(), ids[0, 7].item(), 11]
    model_inputs, positional = prepare_inputs(model, ids, None, None, torch.device("cpu"))
    found = target_scores(model, find_attention_layers(model), None, model_inputs, positional,
                          torch.tensor([positions]), torch.tensor([targets]), rows)
    expected = reference("llama", model, ids, targets, positions, rows)
    torch.testing.assert_close(found.scores[0].double(), expected, atol=2e-5 * expected.abs().max(), rtol=1e-3)
    if rows == "explained":
        torch.testing.assert_close(found.per_target.sum(1), found.scores)  # each target's row, summed
        own = reference("llama", model, ids, targets, positions, rows, only_row=6)  # the sum's gradient, row 6
        torch.testing.assert_close(found.per_target[0, 1].double(), own, atol=2e-5 * own.abs().max(), rtol=1e-3)
    assert found.objective.shape == (1, 3)


@pytest.fixture(scope="module")
def smollm2():
    from captum_cw.models import load_model

    return load_model("smollm2-135m")


def _source_positions(found, tokenizer) -> list[list[int]]:
    r"""Each source's token positions in the prompt (tokenized as is: SmolLM2 adds no special token), from the
    sources' character spans (one after the other, a space apart)."""
    offsets = tokenizer(found.prompt, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    positions, start = [], found.prompt.index(found.sources[0])
    for source in found.sources:
        span = (start, start + len(source))
        positions.append([p for p, (s, e) in enumerate(offsets)
                          if e > s and found.prompt[s:e].strip() and span[0] <= s + len(found.prompt[s:e]) - len(
                              found.prompt[s:e].lstrip()) and e <= span[1]])
        start += len(source) + 1
    return positions


def _sum_by_source(found, tokenizer, per_token: torch.Tensor) -> torch.Tensor:
    r"""``(n_sources,)``: ``per_token`` ``(n,)`` over the prompt's tokens summed over each source's tokens."""
    return torch.stack([per_token[inside].double().sum() for inside in _source_positions(found, tokenizer)])


def test_a_source_scores_the_sum_of_its_tokens(smollm2):
    model, tokenizer = smollm2
    explainer = SourceContributions(model, tokenizer, chat=False)
    found = explainer.attribute(SOURCES, "Where does Tom live?", " Tom lives in Rome.")
    prompt = tokenizer(found.prompt)["input_ids"]
    response = tokenizer(found.response, add_special_tokens=False)["input_ids"]
    n = len(prompt)
    ids = torch.tensor([prompt + response])
    positions = list(range(n - 1, n - 1 + len(response)))
    per_token = reference("llama", model, ids, response, positions, "explained").sum(0)  # [n]: layers summed
    expected = _sum_by_source(found, tokenizer, per_token)
    torch.testing.assert_close(found.scores.double(), expected, atol=1e-4 * expected.abs().max(), rtol=1e-3)
    torch.testing.assert_close(found.token_scores.sum(0), found.scores, atol=1e-5, rtol=1e-4)
    assert found.ranking()[0] == 1  # Tom's sentence supports "Tom lives in Rome." most
    assert found.log_probs.shape == (len(response),)


def test_a_foil_explains_the_log_odds(smollm2):
    r"""Why " Rome" rather than " Paris", in the chat format: the explainer against the brute force's gradient of
    the log-odds; the source that names Paris works against Rome. The knockout gradients against the library's
    own path with the foil, over the sources' tokens."""
    model, tokenizer = smollm2
    found = SourceContributions(model, tokenizer).attribute(SOURCES, "Where does Tom live?", " Rome", foil=" Paris")
    prompt = tokenizer(found.prompt, add_special_tokens=False)["input_ids"]
    rome, paris = (tokenizer(word, add_special_tokens=False)["input_ids"] for word in (" Rome", " Paris"))
    assert len(rome) == len(paris) == 1
    ids = torch.tensor([prompt + rome])
    per_token = reference("llama", model, ids, rome, [len(prompt) - 1], "explained", foil=paris).sum(0)  # [n + 1]
    expected = _sum_by_source(found, tokenizer, per_token)
    torch.testing.assert_close(found.scores.double(), expected, atol=1e-4 * expected.abs().max(), rtol=1e-3)
    assert float(found.scores[0]) < 0  # Anna's sentence names Paris
    with torch.no_grad():
        log_probs = model(input_ids=torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
    log_odds = float(log_probs[rome[0]] - log_probs[paris[0]])
    assert float(found.log_probs.sum() - found.foil_log_probs.sum()) == pytest.approx(log_odds, abs=1e-4)
    assert found.foil == " Paris" and "rather than ' Paris' (log-odds = " in found.to_text()
    assert "rather than" in found.to_html()
    torch.testing.assert_close(found.token_scores.sum(0), found.scores)  # one response token: its row is the whole
    knockout = SourceContributions(model, tokenizer, method="knockout").attribute(
        SOURCES, "Where does Tom live?", " Rome", foil=" Paris")
    context = torch.zeros(1, len(prompt), dtype=torch.bool)
    context[0, [p for inside in _source_positions(knockout, tokenizer) for p in inside]] = True
    one_pass = knockout_gradients(model, torch.tensor([prompt]), context, torch.tensor([len(prompt) - 1]),
                                  torch.tensor(rome), interval=(0.0, 0.1), foils=torch.tensor(paris)).scores[0]
    torch.testing.assert_close(knockout.scores.double(), _sum_by_source(knockout, tokenizer, one_pass),
                               atol=1e-5, rtol=1e-3)
    assert knockout.ranking()[0] == 1 and float(knockout.scores[0]) < 0  # Tom's sentence; Anna's against


def test_a_generated_response_is_contrasted_with_a_longer_foil(smollm2):
    r"""Two whole responses of different lengths: the scores are the response's less the foil's, each explained
    on its own, and the log-probabilities are each response's own."""
    model, tokenizer = smollm2
    explainer = SourceContributions(model, tokenizer)
    found = explainer.attribute(SOURCES, "Where does Tom live?", max_new_tokens=3, foil=" Tom lives in Paris.")
    response = explainer.attribute(SOURCES, "Where does Tom live?", found.response)
    foil = explainer.attribute(SOURCES, "Where does Tom live?", " Tom lives in Paris.")
    assert len(response.log_probs) == 3 and len(found.foil_log_probs) == len(foil.log_probs) > 3
    torch.testing.assert_close(found.scores, response.scores - foil.scores)
    torch.testing.assert_close(found.foil_log_probs, foil.log_probs)
    assert found.token_scores.shape == (3, 3) and bool(found.token_scores.isnan().all())
    assert "it supports the foil" in found.to_html()


@pytest.mark.parametrize("options", [{"method": "contributions"}, {"method": "knockout"},
                                     {"target_rows": "all"}, {"layers": [3, 7]}])
def test_two_one_token_answers_take_one_pass(smollm2, monkeypatch, options):
    r"""" Rome" against " Paris": one attribution pass with the foil and no other forward pass, equal to the
    response's scores less the foil's, each explained on its own, and each its own log-probability."""
    model, tokenizer = smollm2
    explainer = SourceContributions(model, tokenizer, **options)
    response, foil = (explainer.attribute(SOURCES, "Where does Tom live?", text) for text in (" Rome", " Paris"))
    passes = []
    for name in ("knockout_gradients", "target_scores"):
        real = getattr(sources, name)
        monkeypatch.setattr(sources, name, lambda *args, _real=real, **kwargs: passes.append(1) or _real(*args,
                                                                                                        **kwargs))
    forwards = []
    hook = model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        found = explainer.attribute(SOURCES, "Where does Tom live?", " Rome", foil=" Paris")
    finally:
        hook.remove()
    assert len(passes) == 1 and len(forwards) == (2 if options.get("method") == "knockout" else 1)  # + clean log p
    torch.testing.assert_close(found.scores, response.scores - foil.scores, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(found.log_probs, response.log_probs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(found.foil_log_probs, foil.log_probs, atol=1e-5, rtol=1e-4)
    assert "layers" in options or float(found.scores[0]) < 0  # Anna's sentence names Paris (every layer read)
    if options.get("method") != "knockout" and options.get("target_rows") != "all":
        torch.testing.assert_close(found.token_scores, response.token_scores - foil.token_scores, atol=1e-5,
                                   rtol=1e-4)


@pytest.mark.parametrize("foil, message", [("", "foil must be a non-empty text"), ("  ", "foil must be a non-empty"),
                                           (" Rome", "is the response itself")])
def test_a_bad_foil_is_refused(smollm2, foil, message):
    model, tokenizer = smollm2
    with pytest.raises(InputError, match=message):
        SourceContributions(model, tokenizer, chat=False).attribute(SOURCES, "Where?", " Rome", foil=foil)


def test_a_generated_response_is_the_greedy_one(smollm2):
    model, tokenizer = smollm2
    explainer = SourceContributions(model, tokenizer)  # the tokenizer's chat template
    found = explainer.attribute(SOURCES, "Where does Tom live?", max_new_tokens=4)
    prompt = tokenizer(found.prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=4,
                                temperature=None, top_p=None, top_k=None)
    assert found.response == tokenizer.decode(greedy[0, prompt.shape[1]:])
    assert "<|im_start|>user" in found.prompt and len(found.response_tokens) == 4


def test_chat_messages_are_sources_and_the_page_is_escaped(smollm2):
    model, tokenizer = smollm2
    messages = [{"role": "user", "content": "Anna lives in <Paris>."}, {"role": "user", "content": "Tom & Rome."}]
    found = SourceContributions(model, tokenizer).attribute(messages, "Where does Anna live?", "Paris")
    assert found.sources == ["Anna lives in <Paris>.", "Tom & Rome."]
    page = found.to_html()
    assert "&lt;Paris&gt;" in page and "Tom &amp; Rome." in page
    parser = html.parser.HTMLParser()
    parser.feed(page)
    assert "[0]" in found.to_text() and "[1]" in found.to_text()


@pytest.mark.parametrize("sources, message", [([], "non-empty list"), (["ok", "  "], "non-empty texts")])
def test_bad_sources_are_refused(smollm2, sources, message):
    model, tokenizer = smollm2
    with pytest.raises(InputError, match=message):
        SourceContributions(model, tokenizer).attribute(sources, "Where?", "x")


def test_chat_without_a_template_is_refused(smollm2):
    model, tokenizer = smollm2

    class NoTemplate:
        chat_template = None

    with pytest.raises(InputError, match="no chat template"):
        SourceContributions(model, NoTemplate(), chat=True)


def test_knockout_scores_sources_by_their_tokens_knockout_gradients(smollm2):
    r"""In the chat format (the model's own, where it answers; in the plain one SmolLM2's first source holds its
    sink token, whose gate moves every row)."""
    model, tokenizer = smollm2
    found = SourceContributions(model, tokenizer, method="knockout").attribute(SOURCES, "Where does Tom live?",
                                                                              " Tom lives in Rome.")
    text = tokenizer(found.prompt, return_offsets_mapping=True, add_special_tokens=False)  # the template's own
    response = tokenizer(found.response, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([text["input_ids"] + response])  # [1, n]
    positions = torch.arange(len(text["input_ids"]) - 1, ids.shape[1] - 1)[None]  # [1, t]
    spans, start = [], found.prompt.index(SOURCES[0])
    for source in SOURCES:  # the sources stand one after the other, a space apart
        spans.append((start, start + len(source)))
        start += len(source) + 1
    owner = [next((k for k, (low, high) in enumerate(spans) if low <= s + len(found.prompt[s:e]) - len(
        found.prompt[s:e].lstrip()) and e <= high), -1) if e > s and found.prompt[s:e].strip() else -1
        for s, e in text["offset_mapping"]]
    context = torch.tensor([[k >= 0 for k in owner]])  # [1, n - t]
    context = torch.cat([context, torch.zeros(1, len(response), dtype=torch.bool)], 1)  # [1, n]
    per_token = knockout_gradients(model, ids, context, positions, torch.tensor([response]),
                                   interval=(0.0, 0.1)).scores[0]  # read at gate 0.05
    expected = torch.zeros(len(SOURCES))
    for position, k in enumerate(owner):
        if k >= 0:
            expected[k] += per_token[position]
    torch.testing.assert_close(found.scores, expected)
    assert found.ranking()[0] == 1  # Tom's sentence
    assert bool(found.token_scores.isnan().all())  # no per-token split
    first_order = SourceContributions(model, tokenizer).attribute(SOURCES, "Where does Tom live?",
                                                                  " Tom lives in Rome.")
    torch.testing.assert_close(found.log_probs, first_order.log_probs, rtol=1e-4, atol=1e-5)  # the clean run's


@pytest.mark.parametrize("options, message", [({"method": "lrp"}, "method must be one of contributions, knockout"),
                                              ({"method": "knockout", "layers": [0]}, "leave layers"),
                                              ({"method": "knockout", "target_rows": "all"}, "leave layers")])
def test_bad_methods_are_refused(smollm2, options, message):
    model, tokenizer = smollm2
    with pytest.raises(InputError, match=message):
        SourceContributions(model, tokenizer, **options)
