"""Image grids shared by predict, evaluate and inspect: titled grids of images as the model saw them, and the
most confident mistakes of either task (a wrong class; a false positive or negative label). Charts are `charts`."""

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

PANEL_INCHES = 2.3  # the width of one image in a grid
TITLE_FONTSIZE = 8
MISTAKE_TITLE_FONTSIZE = 11  # the mistakes grid's captions are what it is read for
TITLE_MAX_LINES = 4  # per grid title; a longer title is cut with "…"
FALSE_POSITIVE, FALSE_NEGATIVE = "false positive", "false negative"  # a multi-label evaluation's mistakes


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
    colorbar: tuple[str, str] | None = None,
) -> Path:
    """Images in a grid (about square) with a title over each; None shows an empty panel. Saves a PNG.

    Titles are wrapped to the panel's width at `title_fontsize` (`wrap_title`), so that long class names never
    run into the neighbouring titles; the rows get the height their titles need. `colorbar` (colour map name,
    label) adds a 0-to-1 colour scale under the grid, for images coloured by a map (heat maps).
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
        hide_axes(ax)
        if i >= len(images):
            continue
        if images[i] is not None:
            ax.imshow(np.asarray(images[i]), interpolation="nearest")
        color = title_colors[i] if title_colors else "black"
        ax.set_title(titles[i], fontsize=title_fontsize, color=color, linespacing=1.15)
    height = fig.get_figheight()
    if suptitle:
        fig.suptitle(suptitle, fontsize=11, y=1 - 0.1 / height)
    bottom = 0.0
    if colorbar:  # 0.9 inch more at the bottom for the scale and its label
        fig.set_figheight(height + 0.9)
        height, bottom = height + 0.9, 0.9 / (height + 0.9)
    top = 1 - 0.3 / height if suptitle else 1
    fig.tight_layout(rect=(0, bottom, 1, top))  # keep the titles off the suptitle, the images off the scale
    if colorbar:
        cax = fig.add_axes((0.2, 0.5 / height, 0.6, 0.14 / height))
        scale = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(0, 1), plt.get_cmap(colorbar[0]))
        fig.colorbar(scale, cax=cax, orientation="horizontal", label=colorbar[1])
    return save_figure(fig, path, tight=False)  # laid out above, around the suptitle and the scale


def hide_axes(ax: Any) -> None:
    """No frame, ticks or labels. The ticks are removed, not only hidden: matplotlib measures a hidden axis's ticks
    to place each title (half of a 20-image grid's drawing time); the PNG is the same, byte for byte."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.axis("off")


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


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 100, tight: bool = True) -> Path:
    """Lay `fig` out (`tight_layout`, unless the caller laid it out: `tight=False`), write it to `path` and close
    it; -> the path."""
    if tight:
        fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _empty_figure(text: str, path: str | os.PathLike) -> Path:
    """A small figure that only says `text` (a grid with nothing to show), saved to `path`."""
    fig, ax = plt.subplots(figsize=(4, 2))
    hide_axes(ax)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=14)
    return save_figure(fig, path, tight=False)


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
        return _empty_figure("No mistakes", path)
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


@dataclass
class LabelMistake:
    """One wrong label of one image: a false positive (predicted, absent) or a false negative (present, missed),
    as mistakes.csv and the contact sheets show it."""

    kind: str  # FALSE_POSITIVE or FALSE_NEGATIVE
    rank: int  # within its kind, 1 = most confident
    row: int  # in the evaluated data
    source: str
    label: str
    probability: float  # of `label`
    threshold: float  # `label`'s decision threshold
    true_labels: str  # the image's labels, ";"-separated ("" for none)
    predicted_labels: str  # the labels at or above their threshold, ";"-separated


def _mistake_title(mistake: LabelMistake, width: int) -> str:
    if mistake.kind == FALSE_POSITIVE:
        first = f"+{mistake.label} ({mistake.probability:.2f} ≥ {mistake.threshold:.2f})"
        second = f"true: {mistake.true_labels.replace(';', ', ') or 'none'}"
    else:
        first = f"−{mistake.label} ({mistake.probability:.2f} < {mistake.threshold:.2f})"
        second = f"predicted: {mistake.predicted_labels.replace(';', ', ') or 'none'}"
    return f"{wrap_title(first, width)}\n{wrap_title(second, width)}"


def plot_label_mistakes(
    mistakes: Sequence[LabelMistake],
    images: Sequence[Any],
    image_size: tuple[int, int],
    path: str | os.PathLike,
) -> Path:
    """A grid of false positives ("+label (p ≥ threshold)", then the true labels) or false negatives ("−label
    (p < threshold)", then the predicted labels), most confident first, each image as the model saw it."""
    kind = mistakes[0].kind if mistakes else "mistake"
    if not mistakes:
        return _empty_figure("None", path)
    width = title_line_chars(MISTAKE_TITLE_FONTSIZE)
    described = (
        "predicted label (probability ≥ threshold), true labels"
        if kind == FALSE_POSITIVE
        else "missed label (probability < threshold), predicted labels"
    )
    return plot_image_grid(
        [shown_image(image, image_size) for image in images],
        [_mistake_title(m, width) for m in mistakes],
        path,
        suptitle=f"{len(mistakes)} most confident {kind}s: {described}",
        title_fontsize=MISTAKE_TITLE_FONTSIZE,
        columns=math.ceil(math.sqrt(len(mistakes))),
    )


__all__ = [
    "FALSE_NEGATIVE",
    "FALSE_POSITIVE",
    "LabelMistake",
    "Mistake",
    "display_image",
    "plot_image_grid",
    "plot_label_mistakes",
    "plot_mistakes",
    "save_figure",
    "title_line_chars",
    "short",
    "shown_image",
    "wrap_title",
]
