"""benchmarks/peers.py: the peers harness, each measure against a hand computation, the peers' offline adapters."""

import dataclasses
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from captum_cw.tasks.context import context_examples
from conftest import TEST_DATA, needs, require
from tiny_models import FAMILIES

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peer_methods  # noqa: E402  # benchmarks/ is on the path from the line above
import peers  # noqa: E402
from peer_methods import METHODS, PeerMethod, encode_example, measure, register, unavailable  # noqa: E402
from peer_methods.measures import lds_ablations, spearman  # noqa: E402

CHEAP = ["cw_mean", "attention_last", "random", "answer_copy"]


def logprob(model, ids: list[int], target: int) -> float:
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)[target])


@pytest.fixture(scope="module")
def example(smollm2):
    """An example SmolLM2 answers (who_lives_where-2 with two distractors), encoded."""
    _, tokenizer = smollm2
    return encode_example(tokenizer, context_examples("who_lives_where", 3, 0, 2)[2])


def test_encoding_maps_sources_evidence_and_copy_onto_tokens(smollm2, example):
    _, tokenizer = smollm2
    decode = lambda positions: tokenizer.decode(example.input_ids[0, positions])  # noqa: E731
    for source, positions in zip(example.example.sources, example.sources):
        assert decode(positions).strip() == source.strip()
    assert decode(example.evidence).strip() == example.example.sources[example.example.evidence].strip()
    assert decode(example.copy) == example.example.answer
    assert example.context == sorted(p for s in example.sources for p in s)
    assert decode(list(range(example.context[-1] + 1, example.n))).strip() == example.example.question.strip()
    assert example.target == tokenizer(example.example.answer, add_special_tokens=False)["input_ids"][0]


def test_encoding_leaves_special_tokens_out_of_the_context():
    from captum_cw.models import load_model

    _, tokenizer = load_model("gemma-3-270m")  # adds <bos>, offsets (0, 0)
    encoded = encode_example(tokenizer, context_examples("yes_no", 1, 0, 2)[0])
    assert encoded.input_ids[0, 0] == tokenizer.bos_token_id and 0 not in encoded.context
    assert tokenizer.decode(encoded.input_ids[0, encoded.context]) == encoded.example.context
    assert encoded.copy == []  # a yes/no answer has no in-context copy


def test_each_measure_equals_its_hand_computation(smollm2, example):
    model, _ = smollm2
    ids, target = example.input_ids[0].tolist(), example.target
    scores = np.zeros(example.n)
    order = [example.evidence[1], example.sources[1][0], example.sources[0][-1], example.sources[2][1]]
    negative = example.sources[2][0]
    scores[order + [negative]] = [5.0, 4.0, 3.0, 2.0, -1.0]  # a known ranking, one negative score
    scores[example.n - 1] = 99.0  # outside the context: never ranked
    full = logprob(model, ids, target)
    masks, lps = lds_ablations(model, example, 8, seed=3)
    result = measure(model, example, scores, "token", full, (masks, lps))
    context = example.context
    for k in (1, 3, 5):
        ranked = order[:k] if k < 5 else order + [next(p for p in context if p not in order + [negative])]
        kept = [t for p, t in enumerate(ids) if p not in ranked]
        assert result[f"comp@{k}"] == pytest.approx(full - logprob(model, kept, target), abs=1e-4)
        only = [t for p, t in enumerate(ids) if p not in context or p in ranked]
        assert result[f"suff@{k}"] == pytest.approx(full - logprob(model, only, target), abs=1e-4)
    assert result["pointing"] == 1.0  # the top token is one of the evidence's
    positive = {p: scores[p] for p in context if scores[p] > 0}
    assert result["evidence_mass"] == pytest.approx(sum(v for p, v in positive.items() if p in example.evidence)
                                                    / sum(positive.values()))
    per_source = [scores[s].sum() for s in example.sources]
    top = example.sources[int(np.argmax(per_source))]
    assert result["source_comp@1"] == pytest.approx(
        full - logprob(model, [t for p, t in enumerate(ids) if p not in top], target), abs=1e-4)
    for mask, value in zip(masks, lps):  # the LDS's ground truth: the sources deleted
        gone = {p for s, keep in enumerate(mask) if not keep for p in example.sources[s]}
        assert value == pytest.approx(logprob(model, [t for p, t in enumerate(ids) if p not in gone], target),
                                      abs=1e-4)
    scipy_stats = require("scipy.stats")
    expected = scipy_stats.spearmanr(masks.astype(float) @ np.array(per_source), lps).statistic
    assert result["lds"] == pytest.approx(expected)


def test_pointing_counts_ties_as_random_tie_breaking(smollm2, example):
    model, _ = smollm2
    scores = np.zeros(example.n)  # every context token tied: pointing is the evidence's share of the context
    result = measure(model, example, scores, "token", 0.0, None)
    assert result["pointing"] == pytest.approx(len(example.evidence) / len(example.context))
    assert result["evidence_mass"] is None and "lds" not in result
    sources = np.array([0.0, 0.0, 0.0])
    sources[example.example.evidence] = 2.0
    result = measure(model, example, sources, "source", 0.0, None)
    assert result["pointing"] == 1.0 and result["evidence_mass"] == 1.0 and result["comp@1"] is None


def test_spearman_averages_tied_ranks():
    scipy_stats = require("scipy.stats")
    a, b = np.array([1.0, 2.0, 2.0, 5.0, 0.0, 2.0]), np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    assert spearman(a, b) == pytest.approx(scipy_stats.spearmanr(a, b).statistic)
    assert math.isnan(spearman(np.ones(4), b[:4]))


def test_sign_test_is_the_exact_binomial():
    first = [1.0] * 8 + [0.0] * 2 + [0.5] * 3  # against 0.5: 8 wins, 2 losses, 3 ties (dropped)
    second = [0.5] * 13
    wins, losses, p = peers.sign_test(first, second)
    assert (wins, losses) == (8, 2)
    assert p == pytest.approx(2 * (1 + 10 + 45) / 2 ** 10)


def test_cheap_methods_score_as_defined(smollm2, example):
    model, tokenizer = smollm2
    copy, _ = METHODS["answer_copy"].score(model, tokenizer, example)
    assert set(np.flatnonzero(copy)) == set(example.copy)
    first, _ = METHODS["random"].score(model, tokenizer, example)
    again, _ = METHODS["random"].score(model, tokenizer, example)
    assert np.array_equal(first, again)  # seeded by the example


def test_feature_ablation_is_the_drop_when_no_query_reads_the_token(smollm2, example):
    model, tokenizer = smollm2
    scores, forwards = METHODS["feature_ablation"].score(model, tokenizer, example)
    assert forwards == len(example.context) + 1
    position = example.evidence[0]
    mask = torch.ones_like(example.input_ids)
    mask[0, position] = 0
    with torch.no_grad():
        full = model(input_ids=example.input_ids).logits[0, -1].log_softmax(-1)[example.target]
        masked = model(input_ids=example.input_ids, attention_mask=mask).logits[0, -1].log_softmax(-1)[example.target]
    assert scores[position] == pytest.approx(float(full - masked), abs=1e-4)
    assert np.all(scores[[p for p in range(example.n) if p not in example.context]] == 0)


@pytest.mark.parametrize(("name", "interval", "n_steps"), [("cw_knockout", (0.0, 1.0), 1),
                                                           ("cw_knockout_early", (0.0, 0.1), 1),
                                                           ("cw_knockout_path", (0.0, 1.0), 4)])
def test_cw_knockout_is_knockout_gradients_over_the_context(smollm2, example, name, interval, n_steps):
    r"""The gates cover the context's tokens only, the path's interval is the method's, and the library's scores
    come back unchanged."""
    from captum_cw import knockout_gradients

    model, tokenizer = smollm2
    scores, forwards = METHODS[name].score(model, tokenizer, example)
    context = torch.zeros(example.input_ids.shape, dtype=torch.bool)
    context[0, example.context] = True
    found = knockout_gradients(model, example.input_ids, context, torch.tensor([example.n - 1]),
                               torch.tensor([example.target]), interval=interval, n_steps=n_steps)
    np.testing.assert_allclose(scores, found.scores[0].double().numpy(), rtol=1e-5, atol=1e-7)
    assert forwards == 2 * n_steps and np.all(scores[[p for p in range(example.n) if p not in example.context]] == 0)


def test_integrated_gradients_is_complete(example):
    """On a tiny Llama, where 50 steps converge (SmolLM2 needs far more: docs/IG_CONVERGENCE.md)."""
    model = FAMILIES["llama"].build()
    ids = torch.tensor([[5, 9, 3, 12, 7, 30, 2, 44, 8, 17, 21, 6, 13, 40, 11, 19, 25, 33]])
    tiny = dataclasses.replace(example, input_ids=ids, target=7)
    scores, forwards = METHODS["integrated_gradients"].score(model, types.SimpleNamespace(pad_token_id=0), tiny)
    baseline = ids[0].tolist()
    for p in tiny.context:
        baseline[p] = 0
    gap = logprob(model, ids[0].tolist(), 7) - logprob(model, baseline, 7)
    assert scores.sum() == pytest.approx(gap, rel=0.02, abs=1e-3)
    assert np.all(scores[tiny.context[-1] + 1:] == 0) and forwards == 100  # the question is not attributed


def test_harness_runs_resumes_and_writes_its_table(smollm2, tmp_path, monkeypatch):
    model, tokenizer = smollm2
    monkeypatch.setattr("captum_cw.models.load_model", lambda *args, **kwargs: (model, tokenizer))
    table = tmp_path / "PEERS.md"
    table.write_text("# Kept\n\ntext\n")
    argv = ["--model", "smollm2-135m", "--tasks", "who_lives_where", "--n", "3", "--distractors", "2",
            "--methods", ",".join(CHEAP), "--boolq-data", str(TEST_DATA / "boolq_validation.jsonl"),
            "--boolq-n", "1", "--lds-ablations", "4", "--out", str(tmp_path / "run"), "--table", str(table)]
    peers.main(argv)
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    answered = [r for r in records if r["method"] == "answered"]
    assert [r["example"] for r in answered] == ["who_lives_where-0", "who_lives_where-1", "who_lives_where-2",
                                                 "boolq-0"]
    assert answered[-1]["correct"]  # the model's own answer is its target
    correct = {r["example"] for r in answered if r["correct"]}
    assert {(r["example"], r["method"]) for r in records if r["method"] != "answered"} == {
        (e, m) for e in correct for m in CHEAP}
    assert all(r["pointing"] is None for r in records if r["task"] == "boolq" and r["method"] != "answered")
    assert all(r["time_ratio"] >= 0 for r in records if r["method"] != "answered")
    peers.main(argv)  # resumed: nothing is done twice
    assert (tmp_path / "run" / "results.jsonl").read_text().splitlines() == lines
    text = table.read_text()
    assert text.startswith("# Kept\n\ntext\n") and text.count("<!-- peers:smollm2-135m -->") == 1
    assert "| cw_mean |" in text and "| answer_copy |" in text and "BoolQ" in text
    assert "vs cw_mean: lds (wins/losses)" in text
    # a second section of the same file; its rows in the registry's order, whatever order --methods gives
    peers.main([*argv, "--methods", ",".join(reversed(CHEAP)), "--section", "heldout", "--report-only"])
    both = table.read_text()
    heldout = both[both.index("<!-- heldout:smollm2-135m -->"):]
    rows = [line.split(" | ")[0][2:] for line in heldout.splitlines() if line.startswith("| ")]
    assert rows[:len(CHEAP) + 1] == ["method", *sorted(CHEAP, key=list(METHODS).index)]
    assert both.startswith(text.rstrip("\n")) and both.count("<!-- heldout:smollm2-135m -->") == 1
    assert both.count("<!-- /heldout:smollm2-135m -->") == 1 and both.count("<!-- peers:smollm2-135m -->") == 1


def test_a_method_is_one_registry_entry(smollm2, example):
    model, _ = smollm2
    method = register(PeerMethod("everything_on_evidence", lambda m, t, e: (np.isin(np.arange(e.n), e.evidence)
                                                                              .astype(float), 0)))
    try:
        assert "everything_on_evidence" in peers.parse_args(["--out", "x"]).methods.split(",")  # run by default
        scores, _ = METHODS["everything_on_evidence"].score(model, None, example)
        assert measure(model, example, scores, "token", 0.0, None)["evidence_mass"] == 1.0
        assert unavailable(method) is None
    finally:
        del METHODS["everything_on_evidence"]


def test_an_absent_peer_is_skipped_with_its_reason():
    assert "not installed: no_such_peer_module" in unavailable(PeerMethod("x", METHODS["random"].score,
                                                                         needs=("no_such_peer_module",)))


@needs("context_cite")
def test_contextcite_runs_offline_on_our_sources(smollm2, example, monkeypatch):
    from peer_methods.contextcite import _citer_class

    model, tokenizer = smollm2
    citer = _citer_class()(model, tokenizer, example, 32)
    keep = np.array([True, False, True])
    gone = set(example.sources[1])
    assert citer._get_prompt_ids(keep) == [t for p, t in enumerate(example.input_ids[0].tolist()) if p not in gone]
    assert citer._get_prompt_ids() == example.input_ids[0].tolist()  # no chat template
    scores, forwards = METHODS["contextcite_32"].score(model, tokenizer, example)
    assert scores.shape == (3,) and np.isfinite(scores).all() and forwards == 32


@needs("lxt")
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_attnlrp_adapter_equals_lxt_patching_the_classes(family, monkeypatch):
    from peer_methods.attnlrp import attnlrp_rules, load_lxt

    rules, patches, gemma3 = load_lxt()
    model = FAMILIES[family].build()
    ids = torch.tensor([[3, 7, 1, 9, 4, 2]])

    def relevance() -> torch.Tensor:
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        (gradient,) = torch.autograd.grad(model(inputs_embeds=embeddings).logits[0, -1, 5], embeddings)
        return (embeddings * gradient).sum(-1)[0]

    plain = relevance()
    with attnlrp_rules(model):
        adapted = relevance()
    assert torch.equal(relevance(), plain)  # the rules are undone
    # lxt's own patching of the classes (its patch functions; the attention wrapper on the eager function)
    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    mlp, norm = type(model.model.layers[0].mlp), type(model.model.norm)
    monkeypatch.setattr(mlp, "forward", patches.gated_mlp_forward)
    if family == "llama":
        monkeypatch.setattr(norm, "forward", patches.rms_norm_forward)
    else:
        monkeypatch.setattr(norm, "_norm", gemma3.gemma3_norm)
    monkeypatch.setattr(module, "eager_attention_forward", patches.wrap_attention_forward(
        module.eager_attention_forward))
    monkeypatch.setattr(model.config, "_attn_implementation", "eager")
    assert torch.allclose(adapted, relevance(), atol=1e-5)
    assert not torch.allclose(adapted, plain, atol=1e-3)  # the rules change the relevance


def test_several_models_run_into_their_own_folders_and_sections(smollm2, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr("captum_cw.models.load_model", lambda name, **kwargs: loaded.append(name) or smollm2)
    table = tmp_path / "PEERS.md"
    peers.main(["--model", "smollm2-135m,other-model", "--tasks", "who_lives_where", "--n", "3", "--methods",
                "random", "--lds-ablations", "0", "--out", str(tmp_path), "--table", str(table)])
    assert loaded == ["smollm2-135m", "other-model"]
    for name in loaded:
        assert (tmp_path / name / "results.jsonl").exists()
        assert table.read_text().count(f"<!-- peers:{name} -->") == 1


def test_target_logprobs_batches_within_the_logits_budget(smollm2, example, monkeypatch):
    from peer_methods import measures

    model, _ = smollm2
    ids = example.input_ids[0].tolist()
    rows = [ids, ids[:-3], ids[:5] + ids[-4:], ids[2:]]  # different lengths: right-padded in a batch
    batched = measures.target_logprobs(model, rows, example.target)
    monkeypatch.setattr(measures, "LOGITS_BUDGET", 1)  # one row per forward
    one_by_one = measures.target_logprobs(model, rows, example.target)
    assert one_by_one == pytest.approx([logprob(model, row, example.target) for row in rows], abs=1e-4)
    assert batched == pytest.approx(one_by_one, abs=1e-4)


def log_odds(model, ids: list[int], target: int, foil: int) -> float:
    return logprob(model, ids, target) - logprob(model, ids, foil)


@pytest.fixture(scope="module")
def contrasted(smollm2, example):
    """The example explained as the log-odds of its answer against another candidate's first token."""
    from peer_methods import with_foil

    foil = next(c for c in example.candidates if c != example.target)
    return with_foil(example, foil)


def test_a_foil_makes_every_measure_read_the_log_odds(smollm2, contrasted):
    model, _ = smollm2
    ids, target, foil = contrasted.input_ids[0].tolist(), contrasted.target, contrasted.foil
    full = log_odds(model, ids, target, foil)
    scores = np.zeros(contrasted.n)
    scores[contrasted.evidence[0]] = 1.0
    masks, values = lds_ablations(model, contrasted, 4, seed=3)
    result = measure(model, contrasted, scores, "token", full, (masks, values))
    kept = [t for p, t in enumerate(ids) if p != contrasted.evidence[0]]
    assert result["comp@1"] == pytest.approx(full - log_odds(model, kept, target, foil), abs=1e-4)
    gone = {p for s, keep in enumerate(masks[0]) if not keep for p in contrasted.sources[s]}
    assert values[0] == pytest.approx(log_odds(model, [t for p, t in enumerate(ids) if p not in gone], target, foil),
                                      abs=1e-4)
    with pytest.raises(ValueError, match="the target itself"):
        peer_methods.with_foil(contrasted, target)


def test_a_foil_reaches_the_knockout_the_target_aware_form_and_feature_ablation(smollm2, contrasted):
    from captum_cw import TokenContributions, knockout_gradients

    model, tokenizer = smollm2
    ids, target, foil = contrasted.input_ids, contrasted.target, contrasted.foil
    context = torch.zeros(ids.shape, dtype=torch.bool)
    context[0, contrasted.context] = True
    knockout, _ = METHODS["cw_knockout_early"].score(model, tokenizer, contrasted)
    found = knockout_gradients(model, ids, context, torch.tensor([contrasted.n - 1]), torch.tensor([target]),
                               interval=(0.0, 0.1), foils=torch.tensor([foil]))
    np.testing.assert_allclose(knockout, found.scores[0].double().numpy(), rtol=1e-5, atol=1e-7)
    target_aware, _ = METHODS["cw_target"].score(model, tokenizer, contrasted)
    expected = TokenContributions(model).attribute(ids, target=target, foil=foil)[0]
    np.testing.assert_allclose(target_aware, expected.double().numpy(), rtol=1e-5, atol=1e-7)
    ablation, _ = METHODS["feature_ablation"].score(model, tokenizer, contrasted)
    position = contrasted.evidence[0]
    mask = torch.ones_like(ids)
    mask[0, position] = 0
    with torch.no_grad():
        whole = model(input_ids=ids).logits[0, -1].log_softmax(-1)
        masked = model(input_ids=ids, attention_mask=mask).logits[0, -1].log_softmax(-1)
    assert ablation[position] == pytest.approx(float((whole[target] - whole[foil]) - (masked[target] - masked[foil])),
                                               abs=1e-4)


@needs("context_cite")
def test_contextcite_fits_the_log_odds_on_its_own_masks(smollm2, contrasted):
    import context_cite.utils
    from peer_methods.contextcite import _citer_class

    model, tokenizer = smollm2
    masks = np.array([context_cite.utils._create_mask(3, 0.5, seed) for seed in range(32)])
    values = np.array([log_odds(model, _citer_class()(model, tokenizer, contrasted, 32)._get_prompt_ids(mask),
                                contrasted.target, contrasted.foil) for mask in masks], dtype=np.float32)
    expected, _ = context_cite.solver.LassoRegression().fit(masks, values, 1)
    scores, forwards = METHODS["contextcite_32"].score(model, tokenizer, contrasted)
    np.testing.assert_allclose(scores, expected, rtol=1e-3, atol=1e-4)
    assert forwards == 32


def test_integrated_gradients_with_a_foil_is_complete_for_the_log_odds(example):
    model = FAMILIES["llama"].build()
    ids = torch.tensor([[5, 9, 3, 12, 7, 30, 2, 44, 8, 17, 21, 6, 13, 40, 11, 19, 25, 33]])
    tiny = dataclasses.replace(example, input_ids=ids, target=7, foil=20)
    scores, _ = METHODS["integrated_gradients"].score(model, types.SimpleNamespace(pad_token_id=0), tiny)
    baseline = ids[0].tolist()
    for p in tiny.context:
        baseline[p] = 0
    gap = log_odds(model, ids[0].tolist(), 7, 20) - log_odds(model, baseline, 7, 20)
    assert scores.sum() == pytest.approx(gap, rel=0.02, abs=1e-3)


@needs("lxt")
def test_attnlrp_explains_the_logit_difference_with_a_foil(example):
    from peer_methods.attnlrp import attnlrp, attnlrp_rules

    model = FAMILIES["llama"].build()
    ids = torch.tensor([[3, 7, 1, 9, 4, 2]])
    tiny = dataclasses.replace(example, input_ids=ids, target=5, foil=8)

    def relevance(token: int) -> torch.Tensor:
        with attnlrp_rules(model):
            embeddings = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            (gradient,) = torch.autograd.grad(model(inputs_embeds=embeddings).logits[0, -1, token], embeddings)
        return (embeddings * gradient).sum(-1)[0].detach().double()

    scores, _ = attnlrp(model, None, tiny)
    np.testing.assert_allclose(scores, (relevance(5) - relevance(8)).numpy(), rtol=1e-4, atol=1e-6)


def test_the_harness_contrasts_the_answer_with_the_strongest_other_candidate(smollm2, tmp_path, monkeypatch):
    model, tokenizer = smollm2
    monkeypatch.setattr("captum_cw.models.load_model", lambda *args, **kwargs: (model, tokenizer))
    argv = ["--tasks", "who_lives_where", "--n", "3", "--methods", "random", "--lds-ablations", "0",
            "--out", str(tmp_path / "run")]
    peers.main([*argv, "--contrast"])
    assert json.loads((tmp_path / "run" / "settings.json").read_text())["target"] == "contrast"
    example = context_examples("who_lives_where", 3, 0, 2)[2]
    encoded = encode_example(tokenizer, example)
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids).logits[0, -1]
    others = [c for c in encoded.candidates if c != encoded.target]
    foil = max(others, key=lambda c: float(logits[c]))
    record = next(r for r in peers.read_results(tmp_path / "run" / "results.jsonl")
                  if r["example"] == example.id and r["method"] == "random")
    assert record["target_logprob"] == pytest.approx(
        log_odds(model, encoded.input_ids[0].tolist(), encoded.target, foil), abs=1e-4)
    with pytest.raises(SystemExit, match="holds results made with"):
        peers.main(argv)  # a log-probability run does not add to a contrast run's folder
