"""The figures of `vit_ft.tools.inspect.run` (the ViT paper's Figure 7): the patch-embedding filters' principal
components, the position embeddings' similarity maps, and each head's mean attention distance against depth.
They draw the numbers inspection computes; nothing here runs a model."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ..data.images import load_image  # noqa: E402
from .figures import hide_axes, save_figure  # noqa: E402

GREY_SAMPLE_IMAGES = 8  # images looked at to tell grey data from colour


def grey_images(sources: Sequence[Any], limit: int = GREY_SAMPLE_IMAGES) -> bool:
    """Whether the first `limit` images of `sources` that decode (paths, bytes, {"bytes", "path"} or PIL
    images) are all grey: one channel, or red, green and blue equal in every pixel. None decodes: False."""
    seen = 0
    for source in sources:
        if seen == limit:
            break
        try:
            image = load_image(source)
        except Exception:  # noqa: BLE001 - an image that does not decode says nothing of the colours
            continue
        seen += 1
        if image.mode not in ("L", "I", "I;16", "F", "1", "LA"):
            pixels = np.asarray(image.convert("RGB"))
            if not ((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()):
                return False
    return seen > 0


def plot_patch_embedding_components(
    components: torch.Tensor, explained: torch.Tensor, path: str | os.PathLike, columns: int = 7
) -> Path:
    """The components `(k, channels, patch_h, patch_w)` as small images (each min-max scaled), 7 per row: in
    colour for 3 channels (RGB filters), in grey for one (the filters of a model fed grey images, summed over
    their channels by the caller: what a grey pixel, equal in R, G and B, meets)."""
    k, channels = len(components), components.shape[1]
    rows = math.ceil(k / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.45 * rows + 0.6), squeeze=False)
    for i, ax in enumerate(axes.flat):
        hide_axes(ax)
        if i >= k:
            continue
        image = components[i].permute(1, 2, 0).numpy()  # (patch_h, patch_w, channels)
        image = (image - image.min()) / max(float(image.max() - image.min()), 1e-12)
        grey = image.mean(-1)
        ax.imshow(image if channels == 3 else grey, interpolation="nearest", cmap="gray", vmin=0, vmax=1)
        ax.set_title(f"PC{i + 1} {100 * float(explained[i]):.1f}%", fontsize=7)
    kind = "RGB embedding filters" if channels == 3 else (
        "Grey embedding filters (grey input: channels summed)" if channels == 1
        else f"{channels}-channel embedding filters (channel mean)"
    )  # fmt: skip
    fig.suptitle(f"{kind}, first {k} principal components", fontsize=10)
    return save_figure(fig, path, dpi=120)


def similarity_mosaic(similarity: torch.Tensor) -> np.ndarray:
    """The `(grid_h * grid_w, grid_h, grid_w)` maps tiled as a grid_h x grid_w grid of panels separated by
    one NaN row/column: `(grid_h * (grid_h + 1) - 1, grid_w * (grid_w + 1) - 1)`. Panel (r, c) is the map of
    the patch at row r, column c."""
    count, gh, gw = similarity.shape
    if count != gh * gw:
        raise ValueError(f"Expected {gh * gw} maps of {gh}x{gw}, got {count}.")
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan, dtype=np.float32)
    for position in range(count):
        r, c = divmod(position, gw)
        top, left = r * (gh + 1), c * (gw + 1)
        mosaic[top : top + gh, left : left + gw] = similarity[position].numpy()
    return mosaic


def count_mosaic_panels(mosaic: np.ndarray, grid: tuple[int, int]) -> int:
    """How many panels of a `similarity_mosaic` hold a map (no NaN inside the panel)."""
    gh, gw = grid
    return sum(
        bool(np.isfinite(mosaic[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw]).all())
        for r in range((mosaic.shape[0] + 1) // (gh + 1))
        for c in range((mosaic.shape[1] + 1) // (gw + 1))
    )


def plot_position_similarity(similarity: torch.Tensor, path: str | os.PathLike) -> tuple[Path, int]:
    """The paper's position-embedding figure: a panel per patch position, each a grid_h x grid_w map of
    its cosine similarity with all positions. Returns the PNG path and the number of panels drawn."""
    _, gh, gw = similarity.shape
    mosaic = similarity_mosaic(similarity)
    side = float(np.clip(0.28 * max(gh, gw) + 3, 5, 16))
    fig, ax = plt.subplots(figsize=(side * gw / max(gh, gw) + 1.3, side * gh / max(gh, gw)))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # the gaps between panels
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    step = max(1, math.ceil(max(gh, gw) / 16))  # at most ~16 labelled rows/columns
    ax.set_xticks(
        [c * (gw + 1) + (gw - 1) / 2 for c in range(0, gw, step)], [str(c + 1) for c in range(0, gw, step)]
    )
    ax.set_yticks(
        [r * (gh + 1) + (gh - 1) / 2 for r in range(0, gh, step)], [str(r + 1) for r in range(0, gh, step)]
    )
    ax.tick_params(length=0, labelsize=8)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="Cosine similarity")
    path = save_figure(fig, path, dpi=100 if max(gh, gw) <= 16 else 150)
    return path, count_mosaic_panels(mosaic, (gh, gw))


def plot_attention_distance(
    distances: torch.Tensor,
    max_distance: float,
    path: str | os.PathLike,
    uniform_distance: float | None = None,
) -> Path:
    """The paper's Figure 7 (right): each head's mean attention distance (pixels) against network depth, with
    the distance a head attending uniformly to every patch would have (`uniform_distance`) as a dashed line:
    heads below it attend locally, heads at it globally. The legend sits beside the panel, off the points."""
    layers, heads = distances.shape
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    colors = plt.get_cmap("tab20" if heads > 10 else "tab10")
    depth = np.arange(1, layers + 1)
    for head in range(heads):
        ax.scatter(
            depth, distances[:, head].numpy(), s=16, color=colors(head % colors.N), label=f"head {head + 1}"
        )
    if uniform_distance is not None:
        ax.axhline(uniform_distance, linestyle="--", color="0.3", linewidth=1,
                   label=f"uniform attention\n({uniform_distance:.1f} px)")  # fmt: skip
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if layers <= 16 else depth[:: math.ceil(layers / 16)])
    ax.set_xlim(0.5, layers + 0.5)
    ax.set_ylim(0, max_distance * 1.02 if max_distance > 0 else 1)
    ax.set_title("Mean attention distance per head")
    handles, labels = ax.get_legend_handles_labels()
    if heads > 16:  # too many heads to name: keep the reference line's entry only
        handles, labels = handles[heads:], labels[heads:]
    if handles:
        ax.legend(handles, labels, fontsize=7, ncol=1 if len(handles) <= 9 else 2, loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), markerscale=0.8, frameon=False)  # fmt: skip
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=120)


__all__ = [
    "count_mosaic_panels",
    "grey_images",
    "plot_attention_distance",
    "plot_patch_embedding_components",
    "plot_position_similarity",
    "similarity_mosaic",
]
