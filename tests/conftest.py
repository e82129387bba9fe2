import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, os.cpu_count() or 1))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
