import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, os.cpu_count() or 1))

TEST_DATA = Path(__file__).resolve().parent / "data"  # samples of every task in the hub schema


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
