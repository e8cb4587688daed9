"""Figures shared by predict, evaluate and inspect: image grids with titles, the confusion matrix, the most
confident mistakes, the per-class precision/recall chart and the reliability diagram."""

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
from mpl_toolkits.axes_grid1 import make_axes_locatable  # noqa: E402
from PIL import Image  # noqa: E402

from ..data.images import load_image, resize_and_center_crop  # noqa: E402
from ..metrics.calibration import ReliabilityBins  # noqa: E402

CELL_NUMBERS_MAX_CLASSES = 30  # above this, numbers in the confusion-matrix cells are unreadable
PANEL_INCHES = 2.3  # the width of one image in a grid
TITLE_FONTSIZE = 8
MISTAKE_TITLE_FONTSIZE = 11  # the mistakes grid's captions are what it is read for
TITLE_MAX_LINES = 4  # per grid title; a longer title is cut with "…"


def title_line_chars(fontsize: float = TITLE_FONTSIZE) -> int:
    """Characters of a grid title's line at `fontsize`: DejaVu Sans averages about 0.6 em a character, and the
    panels' spacing takes some of the width."""
    return int(0.85 * PANEL_INCHES * 72 / (0.6 * fontsize))


TITLE_LINE_CHARS = title_line_chars()


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
    title_fontsize: float = TITLE_FONTSIZE,
) -> Path:
    """Images in a grid (about square) with a title over each; None shows an empty panel. Saves a PNG.

    Titles are wrapped to the panel's width at `title_fontsize` (`wrap_title`), so that long class names never
    run into the neighbouring titles; the rows get the height their titles need.
    """
    n = max(1, len(images))
    columns = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    titles = [wrap_title(title, title_line_chars(title_fontsize)) for title in titles]
    lines = max((title.count("\n") + 1 for title in titles), default=1)
    row_inches = PANEL_INCHES + 0.45 + 0.15 * lines * title_fontsize / TITLE_FONTSIZE
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
        ax.set_title(titles[i], fontsize=title_fontsize, color=color, linespacing=1.15)
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


def shown_image(source: Any, image_size: tuple[int, int]) -> Image.Image | None:
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

    The diagonal (right answers) and the errors have colour scales of their own: blue from 0 to 1 for the
    diagonal, red from the faintest to the largest error for the rest, so that an error of a few percent is
    as visible as the colour of a right answer. Up to 30 classes each cell shows its fraction of the true
    class and its count; above that the figure grows with the class count (up to 24 inches), tick labels
    shrink, and every k-th label is kept so that they never overlap. Only classes that occur (as truth or
    prediction) are drawn.
    """
    shown = np.flatnonzero((counts.sum(axis=0) + counts.sum(axis=1)) > 0)
    if len(shown) == 0:
        shown = np.arange(len(counts))
    kept = counts[np.ix_(shown, shown)]
    matrix = normalize_rows(kept)
    n = len(shown)
    side = float(np.clip(3 + 0.16 * n, 6, 24))  # inches
    points_per_class = side * 72 * 0.75 / n  # the axes take about 3/4 of the figure
    fontsize = float(np.clip(points_per_class * 0.8, 3.5, 10))
    step = max(1, math.ceil(fontsize / max(points_per_class, 1e-6) / 0.9))
    fig, ax = plt.subplots(figsize=(side + 2.8, side))
    diagonal = np.eye(n, dtype=bool)
    right = ax.imshow(
        np.ma.masked_where(~diagonal, matrix), cmap="Blues", vmin=0, vmax=1, interpolation="nearest"
    )
    errors = np.ma.masked_where(diagonal | (kept == 0), matrix)
    error_max = float(errors.max()) if errors.count() else 1.0
    # the palest third of "Reds" is left out: the smallest error is still clearly red on the white background
    reds = matplotlib.colors.ListedColormap(plt.get_cmap("Reds")(np.linspace(0.3, 1.0, 256)))
    wrong = ax.imshow(errors, cmap=reds, vmin=0, vmax=error_max, interpolation="nearest")
    ticks = np.arange(0, n, step)
    names = [short(id2label[int(shown[i])], 24) for i in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, names, fontsize=fontsize)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    cells = n <= CELL_NUMBERS_MAX_CLASSES
    ax.set_title(title + ("\n(fraction of the true class, and count)" if cells else "")
                 + ("" if step == 1 else f" (every {step}th class labelled)"))  # fmt: skip
    if cells:
        _cell_numbers(ax, matrix, kept, error_max, fontsize)
    divider = make_axes_locatable(ax)  # two colour bars side by side, each with room for its label
    fig.colorbar(
        right,
        cax=divider.append_axes("right", size=0.25, pad=0.15),
        label="right: fraction of the true class",
    )
    fig.colorbar(
        wrong,
        cax=divider.append_axes("right", size=0.25, pad=0.9),
        label="errors: fraction of the true class",
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100 if n <= 60 else 150)
    plt.close(fig)
    return path


def _cell_numbers(ax: Any, matrix: np.ndarray, counts: np.ndarray, error_max: float, fontsize: float) -> None:
    """Each non-empty cell's fraction and, under it, its count; white on the dark end of its colour scale."""
    for (i, j), value in np.ndenumerate(matrix):
        if counts[i, j] > 0:
            dark = value > 0.5 if i == j else value > 0.6 * error_max
            ax.text(j, i, f"{value:.2f}\n({counts[i, j]})", ha="center", va="center", linespacing=1.1,
                    fontsize=min(8, fontsize), color="white" if dark else "black")  # fmt: skip


PER_CLASS_CHART_MAX_CLASSES = 30  # above this, the chart shows the classes with the lowest F1


def plot_per_class(table: Sequence[dict[str, Any]], path: str | os.PathLike, split: str) -> Path:
    """Per-class precision and recall as paired horizontal bars, one row per class with support, from
    `evaluation.per_class_table` rows; above 30 classes only the 30 with the lowest F1. `split` names what was
    evaluated ("test split, 360 images"). The legend sits above the bars, never on them."""
    present = [row for row in table if row["support"] > 0 or row["predicted"] > 0]
    if len(present) > PER_CLASS_CHART_MAX_CLASSES:
        present = sorted(present, key=lambda row: (row["f1"], -row["support"]))[:PER_CLASS_CHART_MAX_CLASSES]
        heading = f"Precision and recall of the {len(present)} classes with the lowest F1"
    else:
        heading = "Precision and recall per class"
    n = max(1, len(present))
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.32 * n))
    rows = np.arange(n)
    for offset, key, color in ((-0.2, "precision", "tab:blue"), (0.2, "recall", "tab:orange")):
        values = [row[key] for row in present]
        ax.barh(rows + offset, values, height=0.38, color=color, label=key)
    ax.set_yticks(
        rows, [f"{short(str(row['class']), 24)} (n={row['support']})" for row in present], fontsize=8
    )
    ax.invert_yaxis()  # the first class on top
    ax.set_xlim(0, 1)  # fractions: a bar's length is read against the whole
    ax.set_xlabel("fraction")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{heading}\n{split}", fontsize=10)
    ax.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.0 + 0.45 / fig.get_figheight()), ncol=2, frameon=False
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reliability_diagram(
    bins: ReliabilityBins, path: str | os.PathLike, split: str, temperature: float = 1.0,
    uncalibrated_ece: float | None = None,
) -> Path:  # fmt: skip
    """The reliability diagram of Guo et al. 2017: per confidence bin, the accuracy (bars) against the mean
    confidence (the diagonal is perfect calibration; the red part of a bar is its gap), and below it how many
    images fall in each bin. The title states the expected calibration error, the temperature the
    probabilities were divided by, and the ECE before it (`uncalibrated_ece`) when one was applied."""
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(5.5, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    width = np.diff(bins.edges)
    left = bins.edges[:-1]
    filled = bins.counts > 0
    top.bar(left[filled], bins.accuracy[filled], width=width[filled], align="edge", color="tab:blue",
            edgecolor="white", label="accuracy")  # fmt: skip
    gap_bottom = np.minimum(bins.accuracy, bins.confidence)[filled]
    top.bar(left[filled], np.abs(bins.accuracy - bins.confidence)[filled], bottom=gap_bottom,
            width=width[filled], align="edge", color="tab:red", alpha=0.35, label="gap to confidence")  # fmt: skip
    top.plot([0, 1], [0, 1], "--", color="0.3", label="perfect calibration")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    top.legend(loc="upper left", fontsize=8)  # the empty triangle above the diagonal
    calibration = f"temperature {temperature:.2f}" if temperature != 1.0 else "no temperature fitted"
    before = (
        f", ECE {uncalibrated_ece:.3f} before" if uncalibrated_ece is not None and temperature != 1.0 else ""
    )
    ece = f"ECE {bins.ece:.3f} ({len(bins.counts)} bins; {calibration}{before})"
    top.set_title(f"Reliability diagram, {split}\n{ece}", fontsize=10)
    bottom.bar(left, bins.counts, width=width, align="edge", color="0.5", edgecolor="white")
    bottom.set(xlabel="confidence (top-1 probability)", ylabel="images")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
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
    shown = [shown_image(image, image_size) for image in images]
    width = title_line_chars(MISTAKE_TITLE_FONTSIZE)
    titles = [
        f"{wrap_title(m.true_label, width)}\n{wrap_title(f'→ {m.predicted_label} ({m.probability:.2f})', width)}"
        for m in mistakes
    ]
    return plot_image_grid(
        shown,
        titles,
        path,
        suptitle=f"{len(mistakes)} most confident mistakes: true class, → predicted (probability)",
        title_fontsize=MISTAKE_TITLE_FONTSIZE,
    )


__all__ = [
    "Mistake",
    "display_image",
    "normalize_rows",
    "plot_confusion_matrix",
    "plot_image_grid",
    "plot_mistakes",
    "plot_per_class",
    "plot_reliability_diagram",
    "title_line_chars",
    "short",
    "shown_image",
    "wrap_title",
]
