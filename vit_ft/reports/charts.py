"""The charts of an evaluation, for either task: the confusion matrix, the per-class precision/recall bars, the
reliability diagram and the precision-recall curves (multi-label). Image grids are `figures`.

`labels` are (num_images, num_labels) multi-hot 0/1 rows and `probabilities` the sigmoid of the logits, both in
the model's label order, where a chart takes them.
"""

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
from matplotlib.patches import Patch  # noqa: E402
from mpl_toolkits.axes_grid1 import make_axes_locatable  # noqa: E402

from ..metrics.calibration import ReliabilityBins  # noqa: E402
from .figures import save_figure, short  # noqa: E402

CELL_NUMBERS_MAX_CLASSES = 30  # above this, numbers in the confusion-matrix cells are unreadable
PR_CURVES_MAX_LABELS = 10  # above this, the figure shows the 5 labels with the highest AP and the 5 lowest


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
    return save_figure(fig, path, dpi=100 if n <= 60 else 150)


def _cell_numbers(ax: Any, matrix: np.ndarray, counts: np.ndarray, error_max: float, fontsize: float) -> None:
    """Each non-empty cell's fraction and, under it, its count; white on the dark end of its colour scale."""
    for (i, j), value in np.ndenumerate(matrix):
        if counts[i, j] > 0:
            dark = value > 0.5 if i == j else value > 0.6 * error_max
            ax.text(j, i, f"{value:.2f}\n({counts[i, j]})", ha="center", va="center", linespacing=1.1,
                    fontsize=min(8, fontsize), color="white" if dark else "black")  # fmt: skip


PER_CLASS_CHART_MAX_CLASSES = 30  # above this, the chart shows the classes with the lowest F1


def zoomed_fraction_limits(values: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
    """x or y limits for fractions in 0..1 fitted to `values`: from a round 0.05 step below the lowest (with
    `floor`, e.g. a baseline line, kept in view when it is not far below) to 1, so 0.91-1.0 fills the axis
    instead of a tenth of it; 0 to 1 when the values reach below 0.5."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    low = min(float(values.min()) if values.size else 0.0, floor)
    if low < 0.5:
        return 0.0, 1.0
    return math.floor((low - 0.02) / 0.05) * 0.05, 1.0


def plot_per_class(table: Sequence[dict[str, Any]], path: str | os.PathLike, split: str) -> Path:
    """Per-class precision and recall as paired horizontal bars, one row per class with support, from
    `evaluation.per_class_table` rows; above 30 classes only the 30 with the lowest F1. `split` names what was
    evaluated ("test split, 360 images"). The axis is zoomed to the bars (`zoomed_fraction_limits`; its start
    named in the axis label) with a dashed line at the recall of all classes together (the accuracy of a
    single-label model) as the baseline a class is read against. The legend sits above the bars, never on
    them."""
    present = [row for row in table if row["support"] > 0 or row["predicted"] > 0]
    support = sum(row["support"] for row in present)
    overall = sum(row["recall"] * row["support"] for row in present) / support if support else None
    if len(present) > PER_CLASS_CHART_MAX_CLASSES:
        heading = f"Precision and recall of the {PER_CLASS_CHART_MAX_CLASSES} classes with the lowest F1, of {len(present)}"
        present = sorted(present, key=lambda row: (row["f1"], -row["support"]))[:PER_CLASS_CHART_MAX_CLASSES]
    else:
        heading = "Precision and recall per class"
    n = max(1, len(present))
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.32 * n))
    rows = np.arange(n)
    drawn = []
    for offset, key, color in ((-0.2, "precision", "tab:blue"), (0.2, "recall", "tab:orange")):
        values = [row[key] for row in present]
        drawn += values
        ax.barh(rows + offset, values, height=0.38, color=color, label=key)
    if overall is not None:
        ax.axvline(overall, linestyle="--", color="0.25", linewidth=1,
                   label=f"all classes: recall {overall:.3f}")  # fmt: skip
    ax.set_yticks(
        rows, [f"{short(str(row['class']), 24)} (n={row['support']})" for row in present], fontsize=8
    )
    ax.invert_yaxis()  # the first class on top
    low, high = zoomed_fraction_limits(np.array(drawn), overall if overall is not None else 1.0)
    ax.set_xlim(low, high)
    ax.set_xlabel("fraction" if low == 0 else f"fraction (axis from {low:.2f}, not 0)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"{heading}\n{split}", fontsize=10)
    ax.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.0 + 0.45 / fig.get_figheight()), ncol=3, frameon=False
    )
    return save_figure(fig, path)


SPARSE_BIN_IMAGES = 10  # a bin with fewer images is faded: one image moves its accuracy by 10 points or more


def plot_reliability_diagram(
    bins: ReliabilityBins, path: str | os.PathLike, split: str, temperature: float = 1.0,
    uncalibrated_ece: float | None = None,
) -> Path:  # fmt: skip
    """The reliability diagram of Guo et al. 2017: per confidence bin, the accuracy (bars) against the mean
    confidence (the diagonal is perfect calibration; the red part of a bar is its gap), each bar's image count
    over it, bins of fewer than SPARSE_BIN_IMAGES images faded (their accuracy is a handful of images); below,
    how many images fall in each bin on a log scale (a well-trained model puts nearly all in the top bin), and
    the fullest bin's share named. The title states the expected calibration error, the temperature the
    probabilities were divided by, and the ECE before it (`uncalibrated_ece`) when one was applied."""
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(5.5, 6.6), sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    width = np.diff(bins.edges)
    left = bins.edges[:-1]
    filled = bins.counts > 0
    alpha = np.where(bins.counts >= SPARSE_BIN_IMAGES, 1.0, 0.3)[filled]
    accuracy = top.bar(left[filled], bins.accuracy[filled], width=width[filled], align="edge",
                       color="tab:blue", edgecolor="white", label="accuracy")  # fmt: skip
    gap_bottom = np.minimum(bins.accuracy, bins.confidence)[filled]
    gaps = top.bar(left[filled], np.abs(bins.accuracy - bins.confidence)[filled], bottom=gap_bottom,
                   width=width[filled], align="edge", color="tab:red", label="gap to confidence")  # fmt: skip
    for bar, gap, fade, count in zip(accuracy, gaps, alpha, bins.counts[filled], strict=True):
        bar.set_alpha(fade)
        gap.set_alpha(0.35 * fade)
        top.text(bar.get_x() + bar.get_width() / 2, max(bar.get_height(), gap.get_y() + gap.get_height()) + 0.01,
                 str(count), ha="center", va="bottom", fontsize=7, color="0.2" if fade == 1 else "0.55")  # fmt: skip
    top.plot([0, 1], [0, 1], "--", color="0.3", label="perfect calibration")
    handles = [  # drawn apart from the bars: the first bar may be a faded one
        Patch(color="tab:blue", label="accuracy"),
        Patch(color="tab:red", alpha=0.35, label="gap to confidence"),
        *top.get_lines(),
    ]
    if (alpha < 1).any():
        handles.append(Patch(color="tab:blue", alpha=0.3, label=f"bin of < {SPARSE_BIN_IMAGES} images (faded)"))
    top.set(xlim=(0, 1), ylim=(0, 1.08), ylabel="accuracy")
    top.legend(handles=handles, loc="upper left", fontsize=8)  # the empty triangle above the diagonal
    calibration = f"temperature {temperature:.2f}" if temperature != 1.0 else "no temperature fitted"
    before = (
        f", ECE {uncalibrated_ece:.3f} before" if uncalibrated_ece is not None and temperature != 1.0 else ""
    )
    ece = f"ECE {bins.ece:.3f} ({len(bins.counts)} bins; {calibration}{before})"
    top.set_title(f"Reliability diagram, {split}\n{ece}\nthe number over a bar: its images", fontsize=10)
    bottom.bar(left[filled], bins.counts[filled], width=width[filled], align="edge", color="0.5",
               edgecolor="white")  # fmt: skip
    bottom.set_yscale("log")
    total = int(bins.counts.sum())
    if total:
        bottom.set_ylim(0.7, 2 * float(bins.counts.max()))
        fullest = int(np.argmax(bins.counts))
        bottom.set_title(
            f"images per bin (log scale): {bins.counts[fullest]} of {total} in "
            f"({bins.edges[fullest]:.2f}, {bins.edges[fullest + 1]:.2f}]",
            fontsize=9,
        )
    bottom.set(xlabel="confidence (top-1 probability)", ylabel="images")
    return save_figure(fig, path)


def precision_recall_curve(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) of one label at every distinct score taken as the threshold, from the lowest
    threshold that reaches full recall up to the highest, then the point (1, 0): scikit-learn's
    `precision_recall_curve` (tied scores taken together). A label without positives has no curve (empty)."""
    labels, scores = np.asarray(labels) > 0, np.asarray(scores, dtype=np.float64)
    if not labels.any():
        return np.empty(0), np.empty(0)
    order = np.argsort(-scores, kind="stable")
    sorted_scores, hits = scores[order], labels[order]
    ends = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]  # the last of each tie
    true_pos = np.cumsum(hits)[ends]
    last = int(np.searchsorted(true_pos, true_pos[-1]))  # full recall first reached here
    precision, recall = true_pos / (ends + 1), true_pos / true_pos[-1]
    return np.r_[precision[last::-1], 1.0], np.r_[recall[last::-1], 0.0]


def _shown_labels(ap: np.ndarray, limit: int) -> tuple[list[int], str]:
    """The label indices whose curves are drawn (labels with positives, by AP, highest first) and a heading."""
    present = [int(j) for j in np.argsort(-np.nan_to_num(ap, nan=-1.0), kind="stable") if not np.isnan(ap[j])]
    if len(present) <= limit:
        return present, f"Precision-recall per label ({len(present)} labels with positives)"
    half = limit // 2
    shown = present[:half] + present[-(limit - half) :]
    heading = f"Precision-recall of the {half} labels with the highest AP and the {limit - half} lowest"
    return shown, f"{heading}, of {len(present)}"


def plot_precision_recall_curves(
    labels: np.ndarray,
    probabilities: np.ndarray,
    names: Sequence[str],
    thresholds: np.ndarray,
    ap: np.ndarray,
    path: str | os.PathLike,
    split: str,
    max_labels: int = PR_CURVES_MAX_LABELS,
) -> Path:
    """One step curve per label (all labels with a positive image, or the best and worst `max_labels` by AP),
    its AP (`ap`, (num_labels,), NaN for a label without positives) in the legend, and a dot where its decision
    threshold (`thresholds`, (num_labels,)) puts it; the mAP over the labels with positives in the title.
    `split` names what was evaluated ("test split, 500 images")."""
    labels, probabilities = np.asarray(labels) > 0, np.asarray(probabilities, dtype=np.float64)
    curves = [precision_recall_curve(labels[:, j], probabilities[:, j]) for j in range(labels.shape[1])]
    ap = np.asarray(ap, dtype=np.float64)
    shown, heading = _shown_labels(ap, max_labels)
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20")
    for k, j in enumerate(shown):
        precision, recall = curves[j]
        ax.step(recall, precision, where="post", color=colors(k % colors.N),
                label=f"{short(str(names[j]), 24)} (AP {ap[j]:.3f})")  # fmt: skip
        predicted = probabilities[:, j] >= thresholds[j]
        hits = (predicted & labels[:, j]).sum()
        point = (hits / labels[:, j].sum(), hits / predicted.sum() if predicted.any() else 1.0)
        ax.plot(*point, "o", color=colors(k % colors.N), markersize=6, markeredgecolor="black")
    if not shown:
        ax.text(0.5, 0.5, "no label has a positive image", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlim=(0, 1.01), ylim=(0, 1.02), xlabel="recall", ylabel="precision")
    ax.grid(alpha=0.3)
    mean_ap = f"mAP {np.nanmean(ap):.3f}" if shown else "no mAP"
    ax.set_title(f"{heading}\n{split}; {mean_ap}; dots: the decision threshold", fontsize=10)
    if shown:  # beside the axes, never on the curves
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)


__all__ = [
    "PER_CLASS_CHART_MAX_CLASSES",
    "SPARSE_BIN_IMAGES",
    "normalize_rows",
    "plot_confusion_matrix",
    "plot_per_class",
    "plot_precision_recall_curves",
    "plot_reliability_diagram",
    "precision_recall_curve",
    "zoomed_fraction_limits",
]
