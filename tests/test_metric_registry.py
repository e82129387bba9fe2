"""One metric registry: it owns every metric's name and aliases, is read-only to callers, refuses clashes; every
metric from one forward pass equals the float64 reference; a new metric is one entry; and no module of the
package spells a metric's name (the literal scan below, shown to catch a planted one)."""

import ast
import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

from captum_cw import metrics
from captum_cw.attribution import (
    AttentionWeights,
    ContributionWeights,
    MetricAttribution,
    attribute_metrics,
    attributor_for,
)
from captum_cw.errors import InputError
from captum_cw.llm import LLMContributionAttribution
from captum_cw.metrics import CW_INTER, CW_INTRA, Metric, get_metric, metric_names, register_metric
from captum_cw.models import load_model
from captum_cw.token_contributions import TokenContributions
from captum_cw.views import attribution_view
from reference import reference_metrics
from tiny_models import FAMILIES, example_inputs

PACKAGE = Path(__file__).resolve().parents[1] / "captum_cw"
REGISTRY = PACKAGE / "metrics.py"
# Literals equal to a metric's name or alias that mean something else, each with why (file relative to the package).
NOT_METRIC_NAMES = {
    ("architectures.py", "attention"): "a fragment of an attention module's class name",
    ("sinks/analysis.py", "attention"): "the sink study's factor alpha (as ContributionFactors.attention)",
    ("sinks/analysis.py", "cw"): "the sink study's product of the three factors (a key of sinks.json)",
    ("sinks/plots.py", "attention"): "the panel of the factor alpha in sinks_factors.png",
    ("sinks/plots.py", "cw"): "the panel of the factors' product in sinks_factors.png",
}


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    return family, family.build(), *example_inputs(family)


@pytest.fixture
def scratch_registry(monkeypatch):
    r"""The registry as it is, restored after the test (register_metric never removes one)."""
    monkeypatch.setattr(metrics, "_REGISTERED", dict(metrics._REGISTERED))


# ------------------------------------------------------------------------------------------- the literal scan


def _spellings() -> set[str]:
    return {spelling for name in metric_names() for spelling in get_metric(name).spellings}


def metric_literals(source: str, spellings: set[str]) -> list[tuple[int, str]]:
    r"""
    ``(line, text)`` of each string literal in ``source`` that spells a metric: equal to a name or alias, or an
    f-string piece that starts one and ends at ``_`` before a placeholder (``f"cw_{variant}"``). Docstrings (a
    string that opens a module, class or function) may name metrics; so may comments, which ast never sees.
    """
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    pieces = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docstrings:
            continue
        starts_one = id(node) in pieces and node.value.endswith("_") and any(
            spelling.startswith(node.value) and spelling != node.value for spelling in spellings)
        if node.value in spellings or starts_one:
            found.append((node.lineno, node.value))
    return sorted(found)


def test_no_metric_name_is_spelled_outside_the_registry():
    spellings = _spellings()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != REGISTRY:
            for line, text in metric_literals(path.read_text(encoding="utf-8"), spellings):
                found.setdefault((path.relative_to(PACKAGE).as_posix(), text), []).append(line)
    spelled = {f"captum_cw/{file}:{lines} {text!r}" for (file, text), lines in found.items()
               if (file, text) not in NOT_METRIC_NAMES}
    assert not spelled, f"use the registry (captum_cw.metrics: get_metric, CW_INTER.name, ...): {sorted(spelled)}"
    assert set(NOT_METRIC_NAMES) <= set(found), "an exception no longer needed: remove it from NOT_METRIC_NAMES"


def test_the_literal_scan_catches_a_planted_name():
    spellings = _spellings()
    planted = '''"""A module about cw_inter, in its docstring."""
def scores(model, variant):
    """Docstrings may say "attention"."""
    first = get_metric("intra")  # the comment may say cw too
    return first, attributor_for(f"cw_{variant}", model), f"{variant}_last", "cw_last", "attention_mean"
'''
    assert metric_literals(planted, spellings) == [(4, "intra"), (5, "cw_")]
    assert metric_literals(REGISTRY.read_text(encoding="utf-8"), spellings)  # where the names are spelled


# ------------------------------------------------------------------------------------------- the registry


def test_names_and_aliases():
    assert metric_names() == ("attention", "value_weighted", "output_normalized", "cw_intra", "cw_inter")
    assert get_metric("inter") is get_metric("cw") is get_metric("cw_inter") is CW_INTER
    assert get_metric("intra") is CW_INTRA and CW_INTRA.spellings == ("cw_intra", "intra")
    assert metrics.PAPER_ORDER == ("attention", "value_weighted", "output_normalized", "cw_inter")
    with pytest.raises(InputError, match=r"Unknown metric 'gradient'; choose one of attention, value_weighted, "
                                         r"output_normalized, cw_intra, cw_inter \(aliases: cw_intra: intra; "
                                         r"cw_inter: inter, cw\)"):
        get_metric("gradient")


def test_entry_points_take_aliases_and_key_results_by_name(llama):
    _, model, ids, mask = llama
    assert ContributionWeights(model, metric="intra").metric is CW_INTRA
    assert ContributionWeights(model, None, None, "cw").metric is CW_INTER  # where variant stood
    assert type(attributor_for("cw", model)) is ContributionWeights
    assert TokenContributions(model, metric="inter").metric == "cw_inter"
    found = attribute_metrics(model, ids, ["inter", "attention"], attention_mask=mask)
    assert list(found.scores) == ["cw_inter", "attention"] and list(found.deltas) == ["cw_inter", "attention"]
    with pytest.raises(InputError, match="each once"):
        attribute_metrics(model, ids, ["cw_inter", "cw"])


def test_the_registry_is_read_only_to_callers():
    assert isinstance(metric_names(), tuple)
    public = {name: getattr(metrics, name) for name in metrics.__all__}
    assert not [name for name, value in public.items() if isinstance(value, (dict, list, set))]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CW_INTER.name = "cw"  # type: ignore[misc]


def test_register_refuses_clashes(scratch_registry):
    before = metric_names()
    same = dataclasses.replace(CW_INTER, aliases=())
    with pytest.raises(InputError, match="Cannot register metric 'cw_inter': 'cw_inter' already names 'cw_inter'"):
        register_metric(same)
    an_alias = Metric("cw", "CW", CW_INTER.per_head, "sum")
    with pytest.raises(InputError, match="'cw' already names 'cw_inter'"):
        register_metric(an_alias)
    taken_alias = Metric("attention_squared", "a^2", lambda g: g.alpha.square(), "mean", aliases=("x", "intra"))
    with pytest.raises(InputError, match="'intra' already names 'cw_intra'"):
        register_metric(taken_alias)
    assert metric_names() == before  # nothing registered by a refused call
    with pytest.raises(InputError, match="aliases must be a tuple of str"):
        Metric("twice", "twice", CW_INTER.per_head, "sum", aliases="tw")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="its name and aliases must differ"):
        Metric("twice", "twice", CW_INTER.per_head, "sum", aliases=("twice",))
    with pytest.raises(InputError, match="head_reduction must be"):
        dataclasses.replace(get_metric("attention"), head_reduction="max")
    with pytest.raises(InputError, match="projected_on must be"):
        dataclasses.replace(CW_INTER, projected_on="model")


def test_a_new_metric_is_one_entry(llama, scratch_registry):
    family, model, ids, mask = llama
    squared = register_metric(Metric("attention_squared", "attention squared", lambda g: g.alpha.square(), "mean",
                                     aliases=("a2",)))
    assert metric_names()[-1] == "attention_squared" and get_metric("a2") is squared
    scores = attributor_for("a2", model).attribute(ids, attention_mask=mask, per_head=True)
    expected = reference_metrics(family, model, ids, mask)["attention"].square()
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-6)
    assert not MetricAttribution(model, "attention_squared").has_convergence_delta()
    assert "attention_squared" in attribute_metrics(model, ids, attention_mask=mask).scores


@pytest.mark.parametrize("per_head", [False, True])
def test_one_pass_gives_every_metric_as_the_float64_reference(llama, per_head):
    family, model, ids, mask = llama
    forwards = []
    hook = model.register_forward_hook(lambda *args: forwards.append(1))
    found = attribute_metrics(model, ids, attention_mask=mask, layers=[1, 0], heads=[2, 0, 3],
                              query_positions=[-1, 3], per_head=per_head)
    hook.remove()
    assert len(forwards) == 1 and list(found.scores) == list(metric_names())
    reference = reference_metrics(family, model, ids, mask)  # [batch, layer, head, n, n] float64
    for name, scores in found.scores.items():
        metric = get_metric(name)
        expected = reference[name][:, [1, 0]][:, :, [2, 0, 3]][..., [-1, 3], :]  # [batch, layer, head, row, key]
        if not per_head:
            expected = expected.sum(2) if metric.head_reduction == "sum" else expected.mean(2)
        torch.testing.assert_close(scores.double(), expected, rtol=1e-4, atol=1e-5)
        if metric.row_totals is None:
            assert name not in found.deltas
        else:  # the reference's rows add up as the identity says: the delta is rounding only
            assert (found.deltas[name] < 1e-4).all(), name


# ------------------------------------------------------------------------------------------- variant=, deprecated


def test_variant_is_a_deprecated_alias_of_metric(llama, tiny_llm_dir):
    _, model, _, _ = llama
    with pytest.warns(DeprecationWarning, match=r"ContributionWeights: variant= is deprecated; pass metric= "
                                                r"instead \(a metric name or alias: metric='intra' means the same\)"):
        assert ContributionWeights(model, variant="intra").metric is CW_INTRA
    with pytest.raises(InputError, match="ContributionWeights: give metric= only; variant= is its deprecated"):
        ContributionWeights(model, metric="cw_inter", variant="inter")
    lm, tokenizer = load_model(str(tiny_llm_dir))
    with pytest.warns(DeprecationWarning, match="LLMContributionAttribution: variant= is deprecated"):
        assert type(LLMContributionAttribution(lm, tokenizer, variant="attention").attributor) is AttentionWeights
    with pytest.raises(InputError, match="LLMContributionAttribution: give metric= only"):
        LLMContributionAttribution(lm, tokenizer, metric="cw_intra", variant="intra")
    with pytest.warns(DeprecationWarning, match="attribution_view: variants= is deprecated; pass metrics="):
        view = attribution_view(lm, tokenizer, "Paris is in", variants=("intra",))
    assert view.metrics == ["cw_intra", "attention"]
    with pytest.raises(InputError, match="attribution_view: give metrics= only"):
        attribution_view(lm, tokenizer, "Paris is in", metrics=("cw_intra",), variants=("intra",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # metric= itself warns of nothing
        ContributionWeights(model, metric="intra")
        LLMContributionAttribution(lm, tokenizer, metric="value_weighted")
