"""What a multi-label evaluation shows (issue 24): precision-recall curves with each label's AP, contact sheets
of the most confident false positives and false negatives, and its `report.md`.

    plot_precision_recall_curves(labels, probabilities, names, thresholds, ap, "pr_curves.png", "test split")
    plot_label_mistakes(false_positives, images, (224, 224), "false_positives.png")
    write_multilabel_report(output_dir, "outputs/digits-multilabel", metrics, table, figures, notes)

`labels` are (num_images, num_labels) multi-hot 0/1 rows and `probabilities` the sigmoid of the logits, both in
the model's label order; `names` the model's label names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .figures import MISTAKE_TITLE_FONTSIZE, plot_image_grid, short, shown_image, title_line_chars, wrap_title  # noqa: E402
from .reporting import markdown_table, report_header, write_report_lines  # noqa: E402

PR_CURVES_MAX_LABELS = 10  # above this, the figure shows the 5 labels with the highest AP and the 5 lowest
MULTILABEL_CLASS_COLUMNS = ("class", "support", "predicted", "ap", "precision", "recall", "f1", "threshold")
FALSE_POSITIVE, FALSE_NEGATIVE = "false positive", "false negative"


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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "None", ha="center", va="center", fontsize=14)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)
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


# ---- report.md -------------------------------------------------------------------------------------------

FIGURE_TITLES = {
    "pr_curves": "Precision-recall curves",
    "per_class": "Precision and recall per label at the decision threshold",
    "false_positives": "Most confident false positives",
    "false_negatives": "Most confident false negatives",
    "training_curves": "Training curves of the fine-tune",
}
TABLE_IN_REPORT_MAX_LABELS = 30  # above this, report.md shows the 10 labels with the lowest AP


def _threshold_text(metrics: dict[str, Any]) -> str:
    value = metrics["threshold"]
    shown = f"{value:.4g}" if isinstance(value, float) else "one per label (see per_class.csv)"
    return f"{shown}, {metrics['threshold_source']}"


def _summary(output_dir: Path, model: str, metrics: dict[str, Any], folder: Path | None) -> list[str]:
    """The report's title, what was evaluated on what, and the metrics table."""
    return [
        *report_header(output_dir, model, metrics, folder, " (multi-label)"),
        f"- Decision threshold: {_threshold_text(metrics)}; a label is predicted at probability >= it",
        "",
        "## Metrics",
        "",
        markdown_table(
            [{"mAP": metrics["mAP"], "micro-F1": metrics["f1_micro"], "macro-F1": metrics["f1_macro"],
              "exact match": metrics["exact_match"], "images": metrics["num_images"]}],
            ["mAP", "micro-F1", "macro-F1", "exact match", "images"],
        ),
        "mAP: mean AP over the labels with a positive image"
        + (f" ({', '.join(metrics['labels_without_positives'])} have none: no AP)"
           if metrics["labels_without_positives"] else "") + ". All numbers: [metrics.json](metrics.json). "
        "Per-image labels: [predictions.csv](predictions.csv).",
        "",
    ]  # fmt: skip


def write_multilabel_report(
    output_dir: Path,
    model: str,
    metrics: dict[str, Any],
    table: list[dict[str, Any]],
    figures: dict[str, str],
    notes: Sequence[str],
    model_folder: Path | None = None,
) -> Path:
    """report.md of a multi-label evaluation: the metrics at the decision threshold, every figure, the
    per-label table (or its 10 lowest-AP rows when there are many labels) and the notes."""
    lines = _summary(output_dir, model, metrics, model_folder)
    for key, title in FIGURE_TITLES.items():
        if key in figures:
            lines += [f"## {title}", "", f"![{title}]({figures[key]})", ""]
    lines += ["The wrong labels shown, and more: [mistakes.csv](mistakes.csv).", ""]
    if "training_curves" not in figures:
        lines += ["No training curves: the model folder has no training_curves.png.", ""]
    lines += ["## Per label", "", "Full table: [per_class.csv](per_class.csv), [per_class.md](per_class.md)."]
    lines.append("")
    rows = [{**row, "ap": "" if row["ap"] is None else row["ap"]} for row in table]
    if len(rows) > TABLE_IN_REPORT_MAX_LABELS:
        rows = sorted((r for r in rows if r["ap"] != ""), key=lambda r: r["ap"])[:10]
        lines += ["The 10 labels with the lowest AP:", ""]
    lines.append(markdown_table(rows, MULTILABEL_CLASS_COLUMNS))
    return write_report_lines(output_dir, lines, notes)


__all__ = [
    "FALSE_NEGATIVE",
    "FALSE_POSITIVE",
    "MULTILABEL_CLASS_COLUMNS",
    "LabelMistake",
    "plot_label_mistakes",
    "plot_precision_recall_curves",
    "precision_recall_curve",
    "write_multilabel_report",
]
