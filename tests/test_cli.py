"""The main job of README, on the offline default model."""

import os
import subprocess
import sys

import pytest


@pytest.mark.slow  # a subprocess loads the model
def test_attribute_prints_a_table_and_writes_a_heatmap(tmp_path):
    out = tmp_path / "heatmap.png"
    result = subprocess.run(
        [sys.executable, "-m", "captum_cw.cli", "attribute", "The capital of France is", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TQDM_DISABLE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "next token predicted: ' Paris'" in result.stdout
    assert "' France'" in result.stdout and "contribution (inter)" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
