"""The text front end and its layer aggregations."""

import matplotlib
import pytest
import torch
from captum.attr import LLMAttributionResult, TextTokenInput

from captum_cw import ContributionWeights
from captum_cw.llm import LLMContributionAttribution, aggregate_layers

matplotlib.use("Agg")


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
    with pytest.raises(ValueError, match="one of last, mean, rollout"):
        aggregate_layers(scores, torch.tensor([1]), "max")


@pytest.mark.parametrize("aggregation", ["last", "mean", "rollout"])
def test_token_attr_rows_are_the_predicting_positions(smollm2, aggregation):
    model, tokenizer = smollm2
    prompt, target = "The capital of France is", " Paris."
    result = LLMContributionAttribution(model, tokenizer, layer_aggregation=aggregation).attribute(prompt, target)
    assert isinstance(result, LLMAttributionResult)
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    target_ids = tokenizer(target, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ids = torch.cat([prompt_ids, target_ids], 1)
    n, m = prompt_ids.shape[1], target_ids.shape[1]
    full = ContributionWeights(model).attribute(ids)[0]  # [layer, query, key]
    rows = torch.arange(m) + n - 1
    expected = aggregate_layers(full, rows, aggregation)[:, :n]
    assert result.token_attr.shape == (m, n) and result.seq_attr.shape == (n,)
    torch.testing.assert_close(result.token_attr, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.seq_attr, expected.sum(0), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        probs = model(ids).logits[0, rows].softmax(-1).gather(-1, target_ids[0][:, None]).flatten()
    torch.testing.assert_close(result.output_probs, probs, rtol=1e-4, atol=1e-6)
    figure, _ = result.plot_token_attr(show=False)
    assert figure is not None
    result.plot_seq_attr(show=False)


def test_text_token_input_with_skipped_tokens(smollm2):
    model, tokenizer = smollm2
    text = TextTokenInput("Paris is the capital of", tokenizer, skip_tokens=["Paris"])
    result = LLMContributionAttribution(model, tokenizer, layer_aggregation="last").attribute(text, " France")
    assert "Paris" not in result.input_tokens
    assert len(result.input_tokens) == len(result.seq_attr) == text.n_itp_features
