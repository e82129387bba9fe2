"""Plots are written without touching the user's matplotlib state."""

import os
import subprocess
import sys

import torch
from PIL import Image

from captum_cw.plotting import plot_layer_token_heatmaps


def test_importing_the_plotting_modules_keeps_the_users_backend():
    code = ("import matplotlib; import captum_cw.plotting, captum_cw.sinks.study, captum_cw.evaluation.report; "
            "print(matplotlib.get_backend())")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env={**os.environ, "MPLBACKEND": "pdf"})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "pdf"


def test_heatmaps_are_written_and_leave_no_open_pyplot_figure(tmp_path):
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()  # other tests may have left pyplot figures open
    panels = {"cw": torch.randn(3, 5), "attention": torch.rand(3, 5)}  # [layer, token]
    path = plot_layer_token_heatmaps(panels, list("abcde"), tmp_path / "deep" / "heat.png", title="t")
    width, height = Image.open(path).size
    assert abs(width - (2 + 0.45 * 5 * 2) * 120) <= 1 and abs(height - (1.5 + 0.18 * 3) * 120) <= 1  # figsize x dpi
    assert plt.get_fignums() == open_before
