"""Every tutorial notebook runs offline on the default model."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import TEST_DATA

TUTORIALS = sorted((Path(__file__).parents[1] / "tutorials").glob("*.ipynb"))


def test_there_are_four_tutorials():
    assert [path.stem[:2] for path in TUTORIALS] == ["01", "02", "03", "04"]


@pytest.mark.slow  # executes every notebook
@pytest.mark.parametrize("path", TUTORIALS, ids=[path.stem for path in TUTORIALS])
def test_tutorial_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_CW_DATA", str(TEST_DATA))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    notebook = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources).execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors
