"""ProtocolConfig.first_token: position 0 (the usual attention sink) protected or ranked by one rule for every
tokenizer, with or without a ``<bos>``; the default keeps the rule runs were stored under."""

import json

import pytest
import torch

from captum_cw.evaluation import EvaluationConfig, evaluate, protocols
from captum_cw.evaluation.protocols import ProtocolConfig, eligible_keys, evaluate_example
from captum_cw.evaluation.run_folder import read_records
from captum_cw.evaluation.sequences import encode
from captum_cw.models import load_model
from captum_cw.tasks import Example
from conftest import TEST_DATA
from tiny_models import FAMILIES


class _Tokenizer:
    """One id per character (mod 60, plus 2), ``<bos>`` (id 1) in front when ``bos`` and special tokens are asked."""

    all_special_ids = [1]

    def __init__(self, *, bos: bool):
        self.bos = bos

    def __call__(self, text, add_special_tokens=True, **_):  # noqa: FBT002 (a tokenizer's __call__)
        return {"input_ids": [1] * (self.bos and add_special_tokens) + [2 + ord(c) % 60 for c in text]}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return FAMILIES["llama"].build()


def _removed_keys(model, encoded, config, monkeypatch) -> torch.Tensor:
    r"""``(n,)`` bool: the keys of the first sequence that some removal of the run touched."""
    seen = []
    original = protocols.mask_values

    def recording(model, removals, *, renormalize=False):
        seen.extend(mask[..., : len(encoded.sequences[0])] for mask in removals.values())
        return original(model, removals, renormalize=renormalize)

    monkeypatch.setattr(protocols, "mask_values", recording)
    evaluate_example(model, encoded, config)
    monkeypatch.undo()
    assert seen
    n = len(encoded.sequences[0])
    return torch.stack([mask.reshape(-1, n).bool().any(0) for mask in seen if mask.shape[-1] == n]).any(0)


@pytest.mark.parametrize("bos", [True, False])
@pytest.mark.parametrize("protocol", ["layer", "input"])
def test_protect_never_removes_position_0_and_rank_does(model, bos, protocol, monkeypatch):
    example = Example("q", ("the sky is blue. is it?",) * 2, (" n", " y"), label=1)
    encoded = encode(example, _Tokenizer(bos=bos))
    assert encoded.special[0][0].item() is bos
    metrics = ("random", "attention_last" if protocol == "input" else "attention")
    # 100% comprehensiveness removes every eligible key: exactly the eligible set shows
    base = {"protocol": protocol, "metrics": metrics, "bins": (100,)}
    protected = _removed_keys(model, encoded, ProtocolConfig(**base, first_token="protect"), monkeypatch)
    ranked = _removed_keys(model, encoded, ProtocolConfig(**base, first_token="rank"), monkeypatch)
    today = _removed_keys(model, encoded, ProtocolConfig(**base), monkeypatch)
    assert not protected[0] and ranked[0]
    assert today[0] is not bos  # the default: a <bos> is protected, a first word is ranked
    context = encoded.choices[0].start + 1  # the input level ranks the context the choices share
    assert protected[1:context].all() and ranked[1:context].all()


def test_eligible_keys_by_hand():
    special = torch.tensor([True, False, True, False])  # <bos>, word, special token inside, word
    rule = lambda **kw: eligible_keys(special, ProtocolConfig(**kw)).tolist()  # noqa: E731
    assert rule() == [False, True, False, True]
    assert rule(first_token="protect") == [False, True, False, True]
    assert rule(first_token="rank") == [True, True, False, True]
    assert rule(remove_special=True) == [True, True, True, True]
    assert rule(remove_special=True, first_token="protect") == [False, True, True, True]
    no_bos = torch.zeros(3, dtype=torch.bool)
    assert eligible_keys(no_bos, ProtocolConfig()).tolist() == [True, True, True]
    assert eligible_keys(no_bos, ProtocolConfig(first_token="protect")).tolist() == [False, True, True]
    with pytest.raises(ValueError, match="first_token must be one of"):
        ProtocolConfig(first_token="keep").validate()


def test_stored_runs_without_the_setting_resume_under_the_old_rule(tiny_llm_dir, tmp_path):
    # a config.json written before first_token lacks it: it counts as the default, the old rule, and resumes;
    # a run asking for another rule on that folder is refused
    tiny = load_model(str(tiny_llm_dir))

    def run(limit, first_token="special", *, resume=False):
        protocol = ProtocolConfig(metrics=("random",), bins=(50,), first_token=first_token)
        config = EvaluationConfig(task="gsm8k", limit=limit, data_dir=str(TEST_DATA), max_tokens=16, protocol=protocol)
        return evaluate(config, tmp_path, resume=resume, model=tiny[0], tokenizer=tiny[1], progress=False)

    run(1)
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["protocol"]["first_token"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    run(2, resume=True)
    assert len(read_records(tmp_path)) == 2
    with pytest.raises(ValueError, match="another configuration"):
        run(3, first_token="protect", resume=True)
