"""docs/DESIGN.md's worked example of extending captum_cw (section 8) runs as written, in a scratch registry: a
registered metric's name stays taken, and the other tests expect the built-in five."""

import pytest

from captum_cw import metric_names, metrics
from test_docs_snippets import BLOCKS, run_python


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(metrics, "_REGISTERED", dict(metrics._REGISTERED))


def test_the_worked_example_runs_as_written(scratch_registry):
    examples = [block for block in BLOCKS if block.mark == "worked-example"]
    assert [block.path.name for block in examples] == ["DESIGN.md"]
    before = metric_names()
    namespace: dict = {"__name__": "__snippet__"}
    run_python(examples[0], namespace)
    assert metric_names() == (*before, "cw_magnitude")
    ranking = namespace["ranking"]
    assert ranking.shape == namespace["ids"].shape and bool((ranking >= 0).all())


def test_the_registry_is_as_before_after_the_example():
    assert "cw_magnitude" not in metric_names()
