"""benchmarks/ig_convergence.py: IG's completeness gap and rank agreement by the number of steps."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captum_cw.evaluation import load_examples
from captum_cw.evaluation.protocols import ProtocolConfig, _integrated_gradients
from captum_cw.evaluation.sequences import encode
from captum_cw.models import load_model
from conftest import TEST_DATA

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ig_convergence.py"


def _script():
    spec = importlib.util.spec_from_file_location("ig_convergence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_top_overlap_on_hand_made_numbers():
    reference = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0])
    scores = torch.tensor([5.0, -9.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, 6.0])
    top_overlap = _script().top_overlap
    assert top_overlap(scores, reference, percent=10) == 0.5  # top 2: {11, 0} against {0, 1}
    assert top_overlap(reference, reference, percent=50) == 1.0


@pytest.mark.slow  # the benchmark script in a subprocess
def test_script_reports_gap_and_agreement(tiny_llm_dir, tmp_path):
    results = tmp_path / "IG.md"
    command = [sys.executable, str(SCRIPT), "--model", str(tiny_llm_dir), "--data-dir", str(TEST_DATA),
               "--tasks", "winogrande", "--examples", "1", "--steps", "2", "4", "--max-tokens", "32",
               "--results", str(results)]
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    assert completed.returncode == 0, completed.stderr
    row = next(line for line in results.read_text().splitlines() if line.startswith("| winogrande-0 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 6 and cells[-1].count("/") == 1  # example, tokens, change, gap @2, gap @4, agreement @2
    assert (tmp_path / "faithfulness" / "ig_convergence.png").exists()
    model, tokenizer = load_model(str(tiny_llm_dir))
    encoded = encode(load_examples("winogrande", 1, str(TEST_DATA))[0], tokenizer, max_tokens=32)
    with torch.no_grad():
        logliks = [float(model(ids[None]).logits[0, c.start:c.start + len(c.tokens)].log_softmax(-1)
                         .gather(-1, torch.tensor(c.tokens)[:, None]).sum())
                   for c, ids in zip(encoded.choices, encoded.sequences)]
    prediction = max(range(len(logliks)), key=logliks.__getitem__)
    clean = {"prediction": prediction, "logliks": logliks}
    _, completeness = _integrated_gradients(model, encoded, clean, ProtocolConfig(protocol="input", ig_steps=4))
    assert cells[2] == f"{completeness['output_change']:.3f}"
    assert cells[4] == f"{completeness['attribution_sum'] - completeness['output_change']:.3f}"
