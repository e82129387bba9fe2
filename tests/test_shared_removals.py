"""The evaluator's shared work: every metric from one forward pass, one ranking per metric for all bins and
modes, and one forward pass for variants whose removals are identical; the numbers do not change."""

import weakref

import pytest
import torch

from captum_cw import metric_names
from captum_cw.evaluation import load_examples, protocols
from captum_cw.evaluation.protocols import ProtocolConfig, clean_scores, evaluate_example, layer_metrics
from captum_cw.evaluation.sequences import encode
from captum_cw.models import load_model
from conftest import TEST_DATA
from reference import reference_metrics
from tiny_models import FAMILIES

DATA = str(TEST_DATA)


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def test_the_layer_metrics_are_the_registry_and_random():
    assert layer_metrics() == (*metric_names(), "random") and protocols.LAYER_METRICS == layer_metrics()
    assert {"cw_last", "cw_inter_mean", "cw_magnitude", "value_weighted_rollout", "ig", "random"} <= set(
        protocols.input_metrics())
    with pytest.raises(ValueError, match="Unknown layer-level metrics"):
        ProtocolConfig(metrics=("cw_last",)).validate()


@pytest.mark.parametrize("per_head", [False, True])
def test_clean_scores_equal_each_metrics_own_attributor(tiny, per_head):
    model, tokenizer = tiny
    ids = encode(load_examples("mmlu", 1, DATA)[0], tokenizer, max_tokens=40).sequences[0]
    names = list(metric_names())
    scores, logits = clean_scores(model, ids, [1, 0], names, per_head=per_head, keep=1)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(ids[None]).logits[:, -1:], rtol=1e-5, atol=1e-5)
    reference = reference_metrics(FAMILIES["llama"], model, ids[None], None)  # float64 [1, layer, head, n, n]
    for name in names:
        expected = reference[name][0, [1, 0]]  # [layer, head, n, n]
        if not per_head:  # heads reduced as each metric is documented to: summed for cw_inter, else averaged
            expected = (expected.sum if name == "cw_inter" else expected.mean)(1, keepdim=True)
        torch.testing.assert_close(scores[name], expected.float(), rtol=1e-4, atol=1e-5, msg=name)


def test_identical_removals_run_once_and_change_nothing(tiny, monkeypatch):
    model, tokenizer = tiny
    encoded = encode(load_examples("winogrande", 1, DATA)[0], tokenizer, max_tokens=40)
    # every row has at most 40 eligible keys: 1% and 2% both remove one key per row
    config = ProtocolConfig(metrics=("cw_inter", "random"), bins=(1, 2, 50), batch_size=4)
    rows, ranked = [], []
    forward, key_ranks = protocols._forward, protocols.key_ranks

    def counting_forward(model, ids, keep):
        rows.append(ids.shape[0])
        return forward(model, ids, keep)

    def counting_ranks(*args, **kwargs):
        ranked.append(1)
        return key_ranks(*args, **kwargs)

    monkeypatch.setattr(protocols, "_forward", counting_forward)
    monkeypatch.setattr(protocols, "key_ranks", counting_ranks)
    shared = evaluate_example(model, encoded, config)
    n_sequences = len(encoded.sequences)
    assert len(ranked) == 2 * n_sequences  # one ranking per metric and sequence, for 3 bins x 2 modes
    variants = 2 * 2 * 3
    assert sum(rows) == n_sequences * (variants - 2 * 2)  # the 2% variants reuse the 1% ones' forwards
    monkeypatch.setattr(protocols, "_distinct", lambda removals: (removals, list(range(len(removals[0])))))
    rows.clear()
    every = evaluate_example(model, encoded, config)
    assert sum(rows) == n_sequences * variants
    assert shared == every
    for metric in config.metrics:
        for mode in ("comprehensiveness", "sufficiency"):
            assert shared["results"][metric][mode]["1"] == shared["results"][metric][mode]["2"]


@pytest.mark.parametrize("task", ["gsm8k", "winogrande"])  # a text; two sequences of one example
def test_each_batch_of_logits_is_dropped_once_read(tiny, monkeypatch, task):
    # Gemma's 262k-token vocabulary makes a text's logits 200 MB per variant: kept for 60 variants they
    # ran a 24 GB machine out of memory
    model, tokenizer = tiny
    encoded = encode(load_examples(task, 1, DATA)[0], tokenizer, max_tokens=40)
    config = ProtocolConfig(metrics=("cw_inter", "random"), bins=(10, 50), batch_size=2)
    alive: list[weakref.ref] = []
    most_alive = []
    forward = protocols._forward

    def tracking_forward(model, ids, keep):
        logits = forward(model, ids, keep)
        alive[:] = [ref for ref in alive if ref() is not None] + [weakref.ref(logits)]
        most_alive.append(len(alive))
        return logits

    monkeypatch.setattr(protocols, "_forward", tracking_forward)
    tracked = evaluate_example(model, encoded, config)
    assert len(most_alive) >= 4 and max(most_alive) == 1  # 2 metrics x 2 modes x 2 bins in batches of 2
    monkeypatch.setattr(protocols, "_forward", forward)
    assert evaluate_example(model, encoded, config) == tracked
