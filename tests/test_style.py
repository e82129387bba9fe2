"""The code follows the project's lint rules (pyproject.toml, [tool.ruff]) and type-checks ([tool.mypy])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    completed = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                               text=True, cwd=ROOT)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_mypy_finds_nothing():
    # the files and settings are pyproject.toml's; .mypy_cache keeps a repeated run to seconds (about a minute cold)
    completed = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert completed.returncode == 0, completed.stdout + completed.stderr
