"""Heatmaps of token scores."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from torch import Tensor

__all__ = ["plot_layer_token_heatmaps"]


def plot_layer_token_heatmaps(
    panels: dict[str, Tensor], tokens: Sequence[str], path: str | Path, title: str = ""
) -> Path:
    r"""
    Side-by-side heatmaps of ``(n_layers, n_tokens)`` score matrices, one per metric,
    with a diverging colour map centred on 0 (contribution weights can be negative).

    Args:
        panels (dict[str, Tensor]): metric name -> scores ``(n_layers, n_tokens)``.
        tokens (Sequence[str]): the token labels.
        path (str or Path): where to write the image; its suffix picks the format (``.png`` added when
                    it has none).
        title (str, optional): figure title.
    Returns:
        The path written.
    """
    path = Path(path)
    path = path if path.suffix else path.with_suffix(".png")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the heatmap a file name such as {path / 'heatmap.png'}.")
    n_layers, n_tokens = next(iter(panels.values())).shape
    figure = Figure(figsize=(2 + 0.45 * n_tokens * len(panels), 1.5 + 0.18 * n_layers))
    axes = figure.subplots(1, len(panels), squeeze=False)
    for axis, (name, scores) in zip(axes[0], panels.items()):
        values = scores.detach().float().cpu().numpy()
        limit = max(abs(values).max(), 1e-12)
        image = axis.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        axis.set_title(name)
        axis.set_xticks(range(n_tokens), tokens, rotation=90, fontsize=8)
        axis.set_ylabel("layer")
        figure.colorbar(image, ax=axis, fraction=0.04)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path
