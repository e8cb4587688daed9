"""Figures shared by predict, evaluate and inspect: image grids with titles, the confusion matrix, the most
confident mistakes."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from ..data.images import load_image, resize_and_center_crop  # noqa: E402

CELL_NUMBERS_MAX_CLASSES = 30  # above this, numbers in the confusion-matrix cells are unreadable
PANEL_INCHES = 2.3  # the width of one image in a grid
TITLE_FONTSIZE = 8
TITLE_MAX_LINES = 4  # per grid title; a longer title is cut with "…"
# characters of a grid title's line: DejaVu Sans averages about 0.6 em a character, and the panels' spacing
# takes some of the width
TITLE_LINE_CHARS = int(0.85 * PANEL_INCHES * 72 / (0.6 * TITLE_FONTSIZE))


def display_image(source: Any, image_size: tuple[int, int], height: int = 160) -> Image.Image:
    """The centre crop the model sees (same geometry as the eval transform), `height` pixels high, for plots."""
    width = max(1, round(height * image_size[1] / image_size[0]))
    return resize_and_center_crop(load_image(source), (height, width))


def plot_image_grid(
    images: Sequence[Image.Image | None],
    titles: Sequence[str],
    path: str | os.PathLike,
    suptitle: str | None = None,
    title_colors: Sequence[str] | None = None,
    columns: int | None = None,
) -> Path:
    """Images in a grid (about square) with a small title over each; None shows an empty panel. Saves a PNG.

    Titles are wrapped to the panel's width (`wrap_title`), so that long class names never run into the
    neighbouring titles; the rows get the height their titles need.
    """
    n = max(1, len(images))
    columns = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    titles = [wrap_title(title) for title in titles]
    lines = max((title.count("\n") + 1 for title in titles), default=1)
    row_inches = PANEL_INCHES + 0.45 + 0.15 * lines
    fig, axes = plt.subplots(
        rows, columns, figsize=(PANEL_INCHES * columns, row_inches * rows + 0.4), squeeze=False
    )
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(images):
            continue
        if images[i] is not None:
            ax.imshow(np.asarray(images[i]), interpolation="nearest")
        color = title_colors[i] if title_colors else "black"
        ax.set_title(titles[i], fontsize=TITLE_FONTSIZE, color=color, linespacing=1.15)
    height = fig.get_figheight()
    if suptitle:
        fig.suptitle(suptitle, fontsize=11, y=1 - 0.1 / height)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height if suptitle else 1))  # keep the titles off the suptitle
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def short(name: str, width: int = 18) -> str:
    """A label cut to `width` characters for plot titles and tick labels."""
    return name if len(name) <= width else name[: width - 1] + "…"


def wrap_title(text: str, width: int = TITLE_LINE_CHARS, max_lines: int = TITLE_MAX_LINES) -> str:
    """`text` in lines of at most `width` characters, for a grid panel's title.

    Lines break after a space, "-", "_" or "/" (class names such as `n02109047-Great_Dane` have no spaces),
    a word longer than a line is cut, and the existing line breaks are kept; beyond `max_lines` the last line
    ends with "…".
    """
    out: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for piece in re.split(r"(?<=[ \-_/])", paragraph):
            while len(piece) > width:  # a word longer than the line
                room = width - len(line)
                out.append(line + piece[:room])
                line, piece = "", piece[room:]
            if len(line) + len(piece.rstrip()) > width:
                out.append(line.rstrip())
                line = ""
            line += piece
        out.append(line.rstrip())
    if len(out) > max_lines:
        out = [*out[: max_lines - 1], out[max_lines - 1][: width - 1].rstrip() + "…"]
    return "\n".join(out)


def _shown(source: Any, image_size: tuple[int, int]) -> Image.Image | None:
    """`display_image`, or None (an empty panel) for an image that does not decode."""
    try:
        return display_image(source, image_size)
    except Exception:  # one unreadable image leaves its panel empty, not the figure
        return None


def normalize_rows(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (the fraction of a true class predicted as each class); empty rows stay 0."""
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros(counts.shape, dtype=np.float64), where=totals > 0)


def plot_confusion_matrix(
    counts: np.ndarray, id2label: dict[int, str], path: str | os.PathLike, title: str = "Confusion matrix"
) -> Path:
    """Row-normalised confusion matrix as a PNG, readable from 2 to 1,000 classes.

    Only classes that occur (as truth or prediction) are drawn. Cells show their value up to 30 classes; above
    that the figure grows with the class count (up to 24 inches), tick labels shrink, and every k-th label is
    kept so that they never overlap.
    """
    shown = np.flatnonzero((counts.sum(axis=0) + counts.sum(axis=1)) > 0)
    if len(shown) == 0:
        shown = np.arange(len(counts))
    matrix = normalize_rows(counts[np.ix_(shown, shown)])
    n = len(shown)
    side = float(np.clip(3 + 0.16 * n, 6, 24))  # inches
    points_per_class = side * 72 * 0.75 / n  # the axes take about 3/4 of the figure
    fontsize = float(np.clip(points_per_class * 0.8, 3.5, 10))
    step = max(1, math.ceil(fontsize / max(points_per_class, 1e-6) / 0.9))
    fig, ax = plt.subplots(figsize=(side + 1.5, side))
    image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ticks = np.arange(0, n, step)
    names = [short(id2label[int(shown[i])], 24) for i in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, names, fontsize=fontsize)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title + ("" if step == 1 else f" (every {step}th class labelled)"))
    if n <= CELL_NUMBERS_MAX_CLASSES:
        for (i, j), value in np.ndenumerate(matrix):
            if value > 0:
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=min(9, fontsize),
                        color="white" if value > 0.5 else "black")  # fmt: skip
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="fraction of the true class")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100 if n <= 60 else 150)
    plt.close(fig)
    return path


@dataclass
class Mistake:
    """One wrong prediction of an evaluation, as mistakes.csv and mistakes.png show it."""

    rank: int
    row: int  # in the evaluated data
    source: str
    true_label: str
    predicted_label: str
    probability: float  # of the predicted label
    true_probability: float


def plot_mistakes(
    mistakes: Sequence[Mistake], images: Sequence[Any], image_size: tuple[int, int], path: str | os.PathLike
) -> Path:
    """A grid of the most confident mistakes titled "true", then "→ predicted (p)", most confident first; the
    class names are whole, wrapped to the panel's width. `images` holds each mistake's image (a path, bytes,
    {"bytes", "path"} or PIL image), shown as the model saw it at `image_size`."""
    if not mistakes:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No mistakes", ha="center", va="center", fontsize=14)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)
    shown = [_shown(image, image_size) for image in images]
    titles = [
        f"{wrap_title(m.true_label)}\n{wrap_title(f'→ {m.predicted_label} ({m.probability:.2f})')}"
        for m in mistakes
    ]
    return plot_image_grid(
        shown,
        titles,
        path,
        suptitle=f"{len(mistakes)} most confident mistakes: true class, → predicted (probability)",
    )


__all__ = [
    "Mistake",
    "display_image",
    "normalize_rows",
    "plot_confusion_matrix",
    "plot_image_grid",
    "plot_mistakes",
    "short",
    "wrap_title",
]
