"""Row chunking, accelerate device maps, and (marked gpu) CUDA devices and half precision."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from captum_cw import ContributionWeights, geometry, scan
from conftest import needs, require
from tiny_models import FAMILIES, example_inputs


@pytest.fixture(scope="module")
def llama():
    family = FAMILIES["llama"]
    return family.build(), *example_inputs(family)


@pytest.fixture
def chunk_shapes(monkeypatch):
    """The alpha shape ``(batch, head, row, key)`` of every chunk the scan hands to the geometry, in order."""
    shapes = []
    original = geometry.HeadGeometry.__init__

    def recording(self, alpha, *args, **kwargs):
        shapes.append(tuple(alpha.shape))
        original(self, alpha, *args, **kwargs)

    monkeypatch.setattr(geometry.HeadGeometry, "__init__", recording)
    return shapes


def test_only_the_asked_rows_are_computed_in_chunks(llama, chunk_shapes):
    model, ids, mask = llama
    ContributionWeights(model).attribute(ids, attention_mask=mask, query_positions=[-1])
    assert chunk_shapes == [(2, 4, 1, 9)] * 2  # one row per layer, never (n, n)
    chunk_shapes.clear()
    ContributionWeights(model, chunk_size=4).attribute(ids, attention_mask=mask)
    assert [shape[2] for shape in chunk_shapes] == [4, 4, 1] * 2


def test_default_chunks_are_sized_by_the_element_budget(llama, chunk_shapes, monkeypatch):
    model, ids, mask = llama  # batch 2, 4 heads, 9 tokens
    whole = ContributionWeights(model).attribute(ids, attention_mask=mask)
    assert [shape[2] for shape in chunk_shapes] == [9] * 2  # 2 * 4 * 9 * 9 numbers fit the budget: one chunk a layer
    chunk_shapes.clear()
    monkeypatch.setattr(scan, "CHUNK_ELEMENTS", 2 * 4 * 9 * 2)  # two rows' worth
    chunked = ContributionWeights(model).attribute(ids, attention_mask=mask)
    assert [shape[2] for shape in chunk_shapes] == [2, 2, 2, 2, 1] * 2
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
    chunk_shapes.clear()
    monkeypatch.setattr(scan, "CHUNK_ELEMENTS", 1)  # less than one row: still one row per chunk
    ContributionWeights(model, layers=[0]).attribute(ids, attention_mask=mask)
    assert [shape[2] for shape in chunk_shapes] == [1] * 9


@needs("accelerate")
def test_accelerate_device_map(llama, tmp_path):
    model, ids, mask = llama
    model.save_pretrained(tmp_path)
    dispatched = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto").eval()
    expected = ContributionWeights(model).attribute(ids, attention_mask=mask)
    torch.testing.assert_close(ContributionWeights(dispatched).attribute(ids, attention_mask=mask), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_results_stay_on_the_device(llama, dtype):
    model, ids, mask = llama
    expected = ContributionWeights(model).attribute(ids, attention_mask=mask)
    cuda_model = FAMILIES["llama"].build().to("cuda", dtype)
    scores = ContributionWeights(cuda_model).attribute(ids.cuda(), attention_mask=mask.cuda())
    assert scores.device.type == "cuda" and scores.dtype == torch.float32
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(scores.cpu(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@needs("accelerate")
def test_model_spread_over_two_devices(llama, tmp_path):
    model, ids, mask = llama
    model.save_pretrained(tmp_path)
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
                  "model.rotary_emb": 0, "lm_head": 1}
    spread = AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map).eval()
    scores = ContributionWeights(spread).attribute(ids, attention_mask=mask)
    torch.testing.assert_close(scores.cpu(), ContributionWeights(model).attribute(ids, attention_mask=mask))


@pytest.mark.gpu
def test_flash_attention_matches_eager(llama):
    require("flash_attn")
    model, ids, mask = llama
    expected = ContributionWeights(model).attribute(ids, attention_mask=mask)
    flash = FAMILIES["llama"].build().to("cuda", torch.bfloat16)
    flash.set_attn_implementation("flash_attention_2")
    scores = ContributionWeights(flash).attribute(ids.cuda(), attention_mask=mask.cuda())
    torch.testing.assert_close(scores.cpu(), expected, rtol=0.05, atol=0.05)
