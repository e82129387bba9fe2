"""The text front end: captum's LLMAttribution interface (lists, generation, TextTokenInput/TextTemplateInput,
skip_tokens, captum's token decoding, sub-word merging) and its layer aggregations."""

import matplotlib
import pytest
import torch
import transformers
from captum.attr import LLMAttributionResult, TextTemplateInput, TextTokenInput
from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens

from captum_cw import ContributionWeights
from captum_cw.layer_aggregation import aggregate_layers, in_forward_order
from captum_cw.llm import DEFAULT_GEN_ARGS, LLMContributionAttribution, _word_groups
from reference import reference_metrics
from tiny_models import FAMILIES

matplotlib.use("Agg")

PROMPTS = ["The capital of France is", "Rome is the capital city of", "Hi"]
TARGETS = [" Paris.", " Italy, a country", " there, how are you"]


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    """Two-layer random Llama with SmolLM2's tokenizer (tests/conftest.py)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir).eval()
    return model, transformers.AutoTokenizer.from_pretrained(tiny_llm_dir)


@pytest.fixture(scope="module")
def tiny_gpt2(tiny):
    """Two-layer random GPT-2 (absolute position embeddings) over SmolLM2's vocabulary."""
    _, tokenizer = tiny
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval(), tokenizer


def _ids(tokenizer, text, *, special=True):
    return tokenizer(text, add_special_tokens=special, return_tensors="pt")["input_ids"][0]


def _assert_same(result, expected, atol=1e-5):
    assert result.input_tokens == expected.input_tokens and result.output_tokens == expected.output_tokens
    torch.testing.assert_close(result.token_attr, expected.token_attr, rtol=0, atol=atol)
    torch.testing.assert_close(result.seq_attr, expected.seq_attr, rtol=0, atol=atol)
    torch.testing.assert_close(result.output_probs, expected.output_probs, rtol=0, atol=atol)


def test_rollout_on_hand_computed_matrices():
    first = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    second = torch.tensor([[1.0, 0.0], [-0.5, 1.5]])
    scores = torch.stack([first, second])  # [layer, query, key]
    # A' = (A + I) / 2: first' = [[1, 0], [.25, .75]], second' = [[1, 0], [-.25, 1.25]]
    # second' @ first' = [[1, 0], [-.25 + 1.25 * .25, 1.25 * .75]] = [[1, 0], [.0625, .9375]]
    expected = torch.tensor([[0.0625, 0.9375]])
    torch.testing.assert_close(aggregate_layers(scores, torch.tensor([1]), "rollout"), expected)
    torch.testing.assert_close(aggregate_layers(scores, torch.tensor([1]), "mean"), torch.tensor([[0.0, 1.0]]))
    torch.testing.assert_close(aggregate_layers(scores, torch.tensor([1]), "last"), torch.tensor([[-0.5, 1.5]]))
    # magnitude: (|.5| + |-.5|) / 2, (|.5| + |1.5|) / 2; the signed mean's 0.0 for the first key no longer cancels
    torch.testing.assert_close(aggregate_layers(scores, torch.tensor([1]), "magnitude"), torch.tensor([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="one of last, mean, magnitude, rollout"):
        aggregate_layers(scores, torch.tensor([1]), "max")


@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
def test_aggregate_layers_takes_leading_axes_and_rows_per_example(aggregation):
    torch.manual_seed(0)
    scores = torch.randn(3, 4, 5, 5)  # [example, layer, query, key]
    shared = torch.tensor([4, 1])
    each = aggregate_layers(scores, shared, aggregation)  # [example, row, key]
    for b in range(3):
        torch.testing.assert_close(each[b], aggregate_layers(scores[b], shared, aggregation))
    own = torch.tensor([[4], [0], [2]])  # one row per example
    picked = aggregate_layers(scores, own, aggregation)
    for b in range(3):
        torch.testing.assert_close(picked[b], aggregate_layers(scores[b], own[b], aggregation))
    layers = [7, 2, 5, 3]
    ordered = in_forward_order(scores, layers)
    assert [layers[k] for k in (1, 3, 2, 0)] == sorted(layers) and torch.equal(ordered, scores[:, [1, 3, 2, 0]])
    assert in_forward_order(scores, [0, 1, 2, 3]) is scores


@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
def test_token_attr_against_the_float64_brute_force(tiny, aggregation):
    model, tokenizer = tiny
    prompt, target = PROMPTS[0], TARGETS[0]
    result = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation).attribute(prompt, target)
    assert isinstance(result, LLMAttributionResult)
    prompt_ids, target_ids = _ids(tokenizer, prompt), _ids(tokenizer, target, special=False)
    ids = torch.cat([prompt_ids, target_ids])[None]
    n, m = len(prompt_ids), len(target_ids)
    full = reference_metrics(FAMILIES["llama"], model, ids, None)["cw_inter"].sum(2)[0]  # [layer, query, key]
    rows = torch.arange(m) + n - 1  # the positions that predict each target token
    expected = aggregate_layers(full, rows, aggregation)[:, :n].float()
    assert result.token_attr.shape == (m, n) and result.seq_attr.shape == (n,)
    torch.testing.assert_close(result.token_attr, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.seq_attr, expected.sum(0), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        probs = model(ids).logits[0, rows].softmax(-1).gather(-1, target_ids[:, None]).flatten()
    torch.testing.assert_close(result.output_probs, probs, rtol=1e-4, atol=1e-6)
    figure, _ = result.plot_token_attr(show=False)
    assert figure is not None
    result.plot_seq_attr(show=False)


@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
@pytest.mark.parametrize("which", ["tiny", "tiny_gpt2"])
def test_a_list_is_batched_and_each_result_equals_its_single_prompt_run(request, which, aggregation):
    model, tokenizer = request.getfixturevalue(which)  # GPT-2: absolute positions need the position ids
    explainer = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation)
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs), with_kwargs=True)
    try:
        batched = explainer.attribute(PROMPTS, TARGETS)
    finally:
        hook.remove()
    assert len(calls) == 1  # one padded forward pass
    mask = calls[0]["attention_mask"]
    assert mask.shape[0] == 3 and (mask[:, 0] == 0).any() and (mask[:, -1] == 1).all()  # left padding
    assert isinstance(batched, list) and len(batched) == 3
    for prompt, target, result in zip(PROMPTS, TARGETS, batched):
        _assert_same(result, explainer.attribute(prompt, target))
    in_pairs = explainer.attribute(PROMPTS, TARGETS, batch_size=2)  # order kept across batches
    for result, expected in zip(in_pairs, batched):
        _assert_same(result, expected)


@pytest.mark.filterwarnings("ignore:.*re-encode:UserWarning", "ignore:.*input_ids.i.:UserWarning",
                            "ignore:Pretty tokens length:UserWarning")  # a random model's text need not re-encode
def test_target_none_generates_then_explains(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer)
    prompt_ids = _ids(tokenizer, PROMPTS[0])[None]
    gen_args = {"max_new_tokens": 4, "do_sample": False}
    n = prompt_ids.shape[1]
    generated = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), **gen_args)[0, n:]
    result = explainer.attribute(PROMPTS[0], gen_args=gen_args)
    assert len(generated) == 4 and len(result.output_tokens) == 4
    _assert_same(result, explainer.attribute(PROMPTS[0], generated))
    default = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), **DEFAULT_GEN_ARGS)[0, n:]
    assert DEFAULT_GEN_ARGS["max_new_tokens"] == 25 and not DEFAULT_GEN_ARGS["do_sample"]
    assert explainer.attribute(PROMPTS[0]).output_tokens == _convert_ids_to_pretty_tokens(default, tokenizer)
    mixed = explainer.attribute(PROMPTS[:2], [None, TARGETS[1]], gen_args=gen_args)  # generate where None
    _assert_same(mixed[0], result)
    _assert_same(mixed[1], explainer.attribute(PROMPTS[1], TARGETS[1]))
    with pytest.raises(ValueError, match="gen_args is only used"):
        explainer.attribute(PROMPTS[0], TARGETS[0], gen_args=gen_args)
    with pytest.raises(ValueError, match="max_new_tokens"):  # transformers' own check passes through
        explainer.attribute(PROMPTS[0], gen_args={"max_new_tokens": 0})


def test_tokens_are_decoded_as_captum_decodes_them(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer)
    result = explainer.attribute("The capital of France is", " Paris.")
    assert result.output_tokens == ["Paris", "."]  # not 'ĠParis'
    assert result.output_tokens == _convert_ids_to_pretty_tokens(_ids(tokenizer, " Paris.", special=False), tokenizer)
    assert result.input_tokens == ["The", "capital", "of", "France", "is"]
    text = TextTokenInput("The capital of France is", tokenizer)
    assert explainer.attribute(text, " Paris.").input_tokens == text.values  # captum returns inp.values


def test_skip_tokens_and_text_token_input(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer, layer_aggregation="last")
    prompt = "Paris is the capital of"
    full = explainer.attribute(prompt, " France")
    text = TextTokenInput(prompt, tokenizer, skip_tokens=["Paris"])
    from_input = explainer.attribute(text, " France")
    assert from_input.input_tokens == text.values and "Paris" not in from_input.input_tokens
    assert len(from_input.seq_attr) == text.n_itp_features == len(full.seq_attr) - 1
    torch.testing.assert_close(from_input.token_attr, full.token_attr[:, 1:])  # the skipped token stays in the input
    from_argument = explainer.attribute(prompt, " France", skip_tokens=["Paris"])
    torch.testing.assert_close(from_argument.token_attr, full.token_attr[:, 1:])
    assert from_argument.input_tokens == full.input_tokens[1:]
    by_id = explainer.attribute(prompt, " France", skip_tokens=[tokenizer.convert_tokens_to_ids("Ġthe")])
    torch.testing.assert_close(by_id.token_attr, full.token_attr[:, [0, 1, 3, 4]])
    both = explainer.attribute(text, " France", skip_tokens=["Ġthe"])  # added to the input's own
    assert both.input_tokens == ["Ġis", "Ġcapital", "Ġof"]
    with pytest.raises(ValueError, match="not a token of this tokenizer"):
        explainer.attribute(prompt, " France", skip_tokens=["Paris is"])


def test_text_template_input_scores_each_segment_by_its_tokens(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer)
    tokens = explainer.attribute("Paris is the capital of France", " .")  # Paris|is|the|capital|of|France
    assert tokens.input_tokens == ["Paris", "is", "the", "capital", "of", "France"]
    segments = explainer.attribute(TextTemplateInput("{} is the capital of {}", values=["Paris", "France"]), " .")
    assert segments.input_tokens == ["Paris", "France"]
    torch.testing.assert_close(segments.token_attr, tokens.token_attr[:, [0, 5]])
    named = TextTemplateInput("{city} is the capital {rest}", values={"city": "Paris", "rest": "of France"})
    by_name = explainer.attribute(named, " .")  # "of France" is two tokens: their sum
    torch.testing.assert_close(by_name.token_attr[:, 1], tokens.token_attr[:, 4] + tokens.token_attr[:, 5])
    grouped = TextTemplateInput("{} is the capital of {}", values=["Paris", "France"], mask=[0, 0])
    together = explainer.attribute(grouped, " .")  # as captum's format_attr: each value gets its group's score
    hand = tokens.token_attr[:, 0] + tokens.token_attr[:, 5]
    torch.testing.assert_close(together.token_attr, torch.stack([hand, hand], 1))
    with pytest.raises(ValueError, match="cannot be found"):
        explainer.attribute(TextTemplateInput("{:>8} is here", values=["Paris"]), " .")
    with pytest.raises(ValueError, match="features are its values"):
        explainer.attribute(TextTemplateInput("{} is", values=["Paris"]), " .", merge_subwords=True)


def test_merge_subwords_sums_the_tokens_of_each_word(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer)
    prompt, target = "The antidisestablishmentarianism of Francophones is", " unbelievably photogenic."
    prompt_pieces = tokenizer.convert_ids_to_tokens(_ids(tokenizer, prompt).tolist())
    target_pieces = tokenizer.convert_ids_to_tokens(_ids(tokenizer, target, special=False).tolist())
    # the hand-made case: the words and the tokens they are made of
    assert prompt_pieces == ["The", "Ġant", "idis", "establish", "ment", "arianism", "Ġof", "ĠFranc", "ophones", "Ġis"]
    assert target_pieces == ["Ġunbelie", "v", "ably", "Ġphot", "ogenic", "."]
    tokens = explainer.attribute(prompt, target)
    words = explainer.attribute(prompt, target, merge_subwords=True)
    assert words.input_tokens == ["The", "antidisestablishmentarianism", "of", "Francophones", "is"]
    assert words.output_tokens == ["unbelievably", "photogenic."]
    a = tokens.token_attr  # [target token, prompt token]
    columns = torch.stack([a[:, 0], a[:, 1] + a[:, 2] + a[:, 3] + a[:, 4] + a[:, 5], a[:, 6], a[:, 7] + a[:, 8],
                           a[:, 9]], 1)  # [target token, word]
    hand = torch.stack([columns[0] + columns[1] + columns[2], columns[3] + columns[4] + columns[5]])
    torch.testing.assert_close(words.token_attr, hand)
    torch.testing.assert_close(words.seq_attr, hand.sum(0))
    p = tokens.output_probs
    torch.testing.assert_close(words.output_probs, torch.stack([p[0] * p[1] * p[2], p[3] * p[4] * p[5]]))
    skipped = explainer.attribute(prompt, target, merge_subwords=True, skip_tokens=["establish"])
    assert skipped.input_tokens == words.input_tokens
    s = tokens.seq_attr
    torch.testing.assert_close(skipped.seq_attr[1], s[1] + s[2] + s[4] + s[5])
    torch.testing.assert_close(skipped.seq_attr[[0, 2, 3, 4]], words.seq_attr[[0, 2, 3, 4]])


def test_word_boundaries_from_markers_match_the_offsets(tiny):
    _, tokenizer = tiny
    ids = _ids(tokenizer, "<|im_start|>The capitalisation\n\nof Francophones, is 😀ok").tolist()
    keep = [True] * len(ids)
    from_offsets = _word_groups(ids, tokenizer, keep)

    class NoOffsets:  # a slow tokenizer: no offsets, so the 'Ġ' markers decide
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, *args, **kwargs):
            raise NotImplementedError("return_offset_mapping is not available")

    from_markers = _word_groups(ids, NoOffsets(), keep)
    assert from_offsets[0] == from_markers[0]
    assert from_offsets[1] == from_markers[1] == ["<|im_start|>", "The", "capitalisation", "\\n", "\\n", "of",
                                                  "Francophones,", "is", "😀ok"]  # the emoji is two byte tokens
    assert from_offsets[0][-1] == [len(ids) - 3, len(ids) - 2, len(ids) - 1]


def test_arguments_are_checked_and_the_attributors_errors_pass_through(tiny):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer)
    with pytest.raises(ValueError, match="one per prompt"):
        explainer.attribute(PROMPTS, TARGETS[0])
    with pytest.raises(ValueError, match="one per prompt"):
        explainer.attribute(PROMPTS, TARGETS[:2])
    with pytest.raises(ValueError, match="non-empty list"):
        explainer.attribute([], [])
    with pytest.raises(ValueError, match="num_trials"):
        explainer.attribute(PROMPTS[0], TARGETS[0], num_trials=0)
    with pytest.raises(ValueError, match="batch_size"):
        explainer.attribute(PROMPTS, TARGETS, batch_size=0)
    with pytest.raises(ValueError, match="target is empty"):
        explainer.attribute(PROMPTS[0], "")
    with pytest.raises(ValueError, match="vocabulary"):  # ContributionWeights' own validation
        explainer.attribute(PROMPTS[0], torch.tensor([len(tokenizer) + 5]))
    _assert_same(explainer.attribute(PROMPTS[0], TARGETS[0], num_trials=3), explainer.attribute(PROMPTS[0], TARGETS[0]))
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            explainer.attribute(PROMPTS[0], TARGETS[0])
    finally:
        model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
def test_smollm2_rows_are_the_predicting_positions(smollm2, aggregation):
    model, tokenizer = smollm2
    prompt, target = "The capital of France is", " Paris."
    result = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation).attribute(prompt, target)
    prompt_ids, target_ids = _ids(tokenizer, prompt), _ids(tokenizer, target, special=False)
    ids = torch.cat([prompt_ids, target_ids])[None]
    n, m = len(prompt_ids), len(target_ids)
    full = ContributionWeights(model).attribute(ids)[0]  # [layer, query, key]
    expected = aggregate_layers(full, torch.arange(m) + n - 1, aggregation)[:, :n]
    torch.testing.assert_close(result.token_attr, expected, rtol=1e-5, atol=1e-6)
    if aggregation == "rollout":  # the attention sink compounds over 30 layers (see the class docstring)
        row = result.token_attr[0]
        assert row[0] > 0.99 and row[1:].abs().max() < 1e-3
        torch.testing.assert_close(row.sum(), torch.tensor(1.0), rtol=0, atol=1e-3)  # prompt keys take ~all of it


@pytest.mark.parametrize("aggregation", ["mean", "rollout"])
def test_exclude_zeroes_the_excluded_prompt_tokens_against_a_brute_force(tiny, aggregation):
    model, tokenizer = tiny
    explainer = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation)
    plain = explainer.attribute(PROMPTS, TARGETS)
    first = explainer.attribute(PROMPTS, TARGETS, exclude="first")
    for result, expected in zip(first, plain):  # the plain scores with each prompt's position 0 zeroed
        wanted = expected.token_attr.clone()
        wanted[:, 0] = 0
        torch.testing.assert_close(result.token_attr, wanted, rtol=0, atol=1e-6)
        torch.testing.assert_close(result.seq_attr, wanted.sum(0), rtol=0, atol=1e-5)
    model.config.bos_token_id = int(_ids(tokenizer, PROMPTS[0], special=False)[1])  # " capital" made special
    try:
        special = explainer.attribute(PROMPTS[0], TARGETS[0], exclude="special")
    finally:
        model.config.bos_token_id = tokenizer.bos_token_id
    torch.testing.assert_close(special.token_attr[:, 1], torch.zeros(len(special.output_tokens)))
    torch.testing.assert_close(special.token_attr[:, [0, 2, 3, 4]], plain[0].token_attr[:, [0, 2, 3, 4]])


def test_exclude_sinks_zeroes_the_keys_that_take_most_of_each_predicting_rows_attention(tiny):
    from captum_cw import AttentionWeights

    model, tokenizer = tiny
    prompt, target = PROMPTS[1], TARGETS[1]
    prompt_ids, target_ids = _ids(tokenizer, prompt), _ids(tokenizer, target, special=False)
    ids = torch.cat([prompt_ids, target_ids])[None]
    n, m = len(prompt_ids), len(target_ids)
    rows = list(range(n - 1, n + m - 1))  # the rows that predict the target's tokens
    attention = AttentionWeights(model).attribute(ids, query_positions=rows)[0]  # [layer, row, key]
    sinks = attention.mean(0)[:, :n] > 0.3  # [row, prompt key]
    assert sinks.any() and not sinks.all()  # the check means something on this model
    explainer = LLMContributionAttribution(model, tokenizer)
    plain = explainer.attribute(prompt, target).token_attr
    excluded = explainer.attribute(prompt, target, exclude="sinks").token_attr
    torch.testing.assert_close(excluded, torch.where(sinks, 0.0, plain), rtol=0, atol=1e-6)
    batched = explainer.attribute(PROMPTS, TARGETS, exclude="sinks")[1]  # padding changes nothing
    torch.testing.assert_close(batched.token_attr, excluded, rtol=0, atol=1e-5)


def test_exclude_takes_only_the_named_exclusions(tiny):
    from captum_cw.errors import InputError

    explainer = LLMContributionAttribution(*tiny)
    for bad in ("bos", [0], True):
        with pytest.raises(InputError, match="exclude must be one of first, special, sinks; got"):
            explainer.attribute(PROMPTS[0], TARGETS[0], exclude=bad)
