"""What people read: a fine-tune's training curves, an evaluation's report and tables (the model card: `card`)."""

from __future__ import annotations

import csv
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .figures import save_figure  # noqa: E402

EVAL_METRICS = ("eval_accuracy", "eval_top5_accuracy", "eval_f1", "eval_loss")


NO_LOGS = "no training logs yet"
# (key, label, format): accuracy and F1 in panels of their own, so that neither hides the other
ACCURACY_CURVES = (("eval_accuracy", "top-1", "o-"), ("eval_top5_accuracy", "top-5", "s--"))
F1_CURVES = (("eval_f1", "macro-F1", "^-"),)
# the two metric panels, (title, curves) each: a single-label run's; a task passes its own (`tasks`)
ACCURACY_PANELS = (("Evaluation accuracy", ACCURACY_CURVES), ("Evaluation macro-F1", F1_CURVES))


def plot_training_curves(
    log_history: list[dict[str, Any]],
    path: str | Path,
    evaluated_on: str | None = None,
    best_step: int | None = None,
    panels: Sequence[tuple[str, Sequence[tuple[str, str, str]]]] = ACCURACY_PANELS,
    metric: str = "accuracy",
    kept_step: int | None = None,
) -> Path:
    """One PNG of four panels against the optimizer step: loss, learning rate and the task's two metric
    `panels` (default: accuracy (top-1 and top-5) and macro-F1; a multi-label run's task gives mAP / exact match
    and micro / macro-F1), each panel's legend above it (off the curves), its metric named on its y axis, and
    the metric panels zoomed to their values. The best and the final evaluated step are marked on every panel
    with that panel's own number there, the best by `metric` ("best accuracy: step 697, top-1 0.986"); `best_step` is the best checkpoint the Trainer chose (default: the
    first step with the highest `metric`, as the recipes' metric_for_best_model) and `kept_step` the step of the
    model the run saved (its best checkpoint, or the final step), drawn in green and named "kept model".
    `evaluated_on` names the evaluation data ("validation, 144 images"; default: the size the Trainer's logs
    imply). A panel with nothing to draw says so ("no training logs yet" and why), as after a run shorter than
    its logging_steps."""
    train = [e for e in log_history if "loss" in e and "step" in e]
    evals = [e for e in log_history if "eval_loss" in e and "step" in e]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.8))
    loss_ax, lr_ax, accuracy_ax, f1_ax = axes.flat
    _curves(loss_ax, "Loss", [("train loss", "-", train, "loss"), ("eval loss", "o-", evals, "eval_loss")],
            "the run stopped before its first logging step")  # fmt: skip
    loss_ax.set_ylabel("loss")
    lr = [e for e in train if "learning_rate" in e]
    _curves(lr_ax, "Learning rate", [("learning rate", "-", lr, "learning_rate")],
            "the run stopped before its first logging step")  # fmt: skip
    lr_ax.set_ylabel("learning rate")
    for ax, (title, curves) in zip((accuracy_ax, f1_ax), panels, strict=True):
        _curves(ax, title, [(label, fmt, evals, key) for key, label, fmt in curves], "no evaluation has run")
        ax.set_ylabel(" / ".join(label for _, label, _ in curves) + (" (evaluation)" if evals else ""))
        _zoom_to_fractions(ax)
    marks = _marked_steps(evals, best_step, metric, kept_step)
    # each panel's own number at a marked step: (its name, its log key), none on the learning-rate panel
    shown = [("eval loss", "eval_loss"), None, *((curves[0][1], curves[0][0]) for _, curves in panels)]
    values = {e["step"]: e for e in evals}
    for ax, number in zip(axes.flat, shown, strict=True):
        for step, label, style, color in marks:
            value = values.get(step, {}).get(number[1]) if number else None
            if value is not None:
                label = label.replace(f"step {step}", f"step {step}, {number[0]} {value:.3f}", 1)
            if ax.get_lines():
                ax.axvline(step, linestyle=style, color=color, linewidth=1.6 if color != "0.4" else 1, label=label)
        entries = len(ax.get_legend_handles_labels()[1])
        if entries:  # the legend above the panel, under its title: never on the curves
            columns = entries if entries <= 3 else math.ceil(entries / 2)
            ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=columns, fontsize=8, frameon=False)
            ax.set_title(ax.get_title(), pad=8 + 16 * math.ceil(entries / columns))
    evaluated_on = evaluated_on or _evaluated_images(evals)
    fig.suptitle("Training curves" + (f"; evaluation on {evaluated_on}" if evaluated_on else ""), fontsize=12)
    return save_figure(fig, path)


KEPT_COLOR = "tab:green"  # the vertical line of the model the run saved


def _marked_steps(
    evals: list[dict[str, Any]], best_step: int | None, metric: str = "accuracy", kept_step: int | None = None
) -> list[tuple[int, str, str, str]]:
    """(step, legend label, line style, colour) of the best evaluated step by `metric` (accuracy; mAP for a
    multi-label run), the final one (one line when equal) and, in green, the model the run kept (`kept_step`),
    a line of its own when it is neither. Each panel adds its own number at the step to the label."""
    key = f"eval_{metric}"
    scored = [e for e in evals if key in e]
    if not scored:
        return []
    final = scored[-1]
    best = max(scored, key=lambda e: e[key])  # max keeps the first of equals, as the Trainer
    best = next((e for e in scored if e["step"] == best_step), best) if best_step is not None else best

    def mark(entry: dict[str, Any], name: str, style: str) -> tuple[int, str, str, str]:
        kept = entry["step"] == kept_step
        return entry["step"], f"{name}: step {entry['step']}" + ("; kept model" if kept else ""), style, (
            KEPT_COLOR if kept else "0.4"
        )

    if best["step"] == final["step"]:
        marks = [mark(final, f"best {metric} = final", "--")]
    else:
        marks = [mark(best, f"best {metric}", "--"), mark(final, "final", ":")]
    if kept_step is not None and kept_step not in (best["step"], final["step"]):
        marks.append((kept_step, f"kept model: step {kept_step} (not evaluated)", "-", KEPT_COLOR))
    return marks


def _zoom_to_fractions(ax: Any) -> None:
    """Fit the y axis to the curves' values (0.88 to 0.98 fills the panel), never beyond 0..1."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()] or [[]])
    if values.size:
        low, high = float(values.min()), float(values.max())
        margin = max(0.08 * (high - low), 0.005)
        ax.set_ylim(max(0.0, low - margin), min(1.0 + margin / 2, high + margin))


def _evaluated_images(evals: list[dict[str, Any]]) -> str | None:
    """The evaluation data as "validation, N images", N from the Trainer's eval_runtime x eval_samples_per_second, when that product is
    a whole number (both are rounded in the logs); else None."""
    for entry in evals:
        if "eval_runtime" in entry and "eval_samples_per_second" in entry:
            count = entry["eval_runtime"] * entry["eval_samples_per_second"]
            if count > 0 and abs(count - round(count)) < 0.05:
                return f"validation, {round(count)} images"
    return None


def _curves(
    ax: Any, title: str, curves: list[tuple[str, str, list[dict[str, Any]], str]], why_empty: str
) -> None:
    """Draw (label, format, entries, key) curves on `ax`; when the first (the panel's main curve) has no
    points, say so: in the middle of an empty panel, under the title when other curves are drawn."""
    drawn = []
    for label, fmt, entries, key in curves:
        points = [e for e in entries if key in e]
        if points:
            ax.plot([e["step"] for e in points], [e[key] for e in points], fmt, label=label, markersize=5)
            drawn.append(label)
    ax.set(title=title, xlabel="step")
    if not drawn:
        ax.set_xticks([])
        ax.set_yticks([])
    if curves[0][0] not in drawn:
        y = 0.9 if drawn else 0.5
        ax.text(0.5, y, f"{NO_LOGS}\n({why_empty})", ha="center", va="center", transform=ax.transAxes,
                fontsize=11, color="0.35")  # fmt: skip


# ---- an evaluation's report ------------------------------------------------------------------------------

def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """`rows` as a CSV file with their keys as the header."""
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `rows`; floats with 4 decimals, "|" in names escaped."""

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_confusion_csv(counts: np.ndarray, id2label: dict[int, str], path: Path) -> Path:
    """Counts with class names as the header row and first column (rows true, columns predicted)."""
    names = [id2label[i] for i in range(len(counts))]
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *names])
        for name, row in zip(names, counts, strict=True):
            writer.writerow([name, *row.tolist()])
    return path


PER_CLASS_COLUMNS = ("class", "support", "predicted", "precision", "recall", "f1")


def write_report_lines(output_dir: Path, lines: list[str], notes: Sequence[str]) -> Path:
    """output_dir/report.md: `lines`, then the notes (a section of their own when there are any)."""
    if notes:
        lines = [*lines, "## Notes", "", *[f"- {note}" for note in notes], ""]
    path = output_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def report_header(
    output_dir: Path, model: str, metrics: dict[str, Any], folder: Path | None, task: str = ""
) -> list[str]:
    """An evaluation report's title (`task`: e.g. " (multi-label)") and what was evaluated on what: the model
    (linked to its local `folder`), the data, the images (and those skipped), the resolution and the precision."""
    model_link = f"[`{model}`]({os.path.relpath(folder, output_dir)})" if folder else f"`{model}`"
    return [
        f"# Evaluation of `{model}`{task}",
        "",
        f"- Model: {model_link}",
        f"- Data: {metrics['data']}",
        f"- Images: {metrics['num_images']} evaluated"
        + (f", {metrics['num_skipped']} skipped (do not decode, see metrics.json)" if metrics["num_skipped"] else ""),
        f"- Resolution: {metrics['image_size'][0]}x{metrics['image_size'][1]}"
        + (f" (fine-tuned at {metrics['trained_image_size'][0]}x{metrics['trained_image_size'][1]})"
           if metrics.get("trained_image_size") and metrics["trained_image_size"] != metrics["image_size"] else ""),
        f"- Precision: {'bf16 autocast' if metrics.get('bf16') else 'float32'} on {metrics.get('device', 'cpu')}",
    ]  # fmt: skip


def report_figure_sections(figures: dict[str, str], titles: dict[str, str], tables: str) -> list[str]:
    """A section per figure in `figures` (key -> file name), in `titles`' order (key -> title), then the line
    `tables` naming the files behind them, and a word when the model folder had no training curves."""
    lines = []
    for key, title in titles.items():
        if key in figures:
            lines += [f"## {title}", "", f"![{title}]({figures[key]})", ""]
    lines += [tables, ""]
    if "training_curves" not in figures:
        lines += ["No training curves: the model folder has no training_curves.png.", ""]
    return lines


def copy_training_curves(folder: Path | None, output_dir: Path) -> str | None:
    """The fine-tune's training_curves.png (in its output `folder`) copied next to an evaluation report; its
    name, or None."""
    source = folder / "training_curves.png" if folder else None
    if source is None or not source.is_file():
        return None
    shutil.copyfile(source, output_dir / "training_curves.png")
    return "training_curves.png"


__all__ = [
    "ACCURACY_PANELS",
    "KEPT_COLOR",
    "PER_CLASS_COLUMNS",
    "copy_training_curves",
    "markdown_table",
    "plot_training_curves",
    "write_confusion_csv",
    "write_csv",
    "report_figure_sections",
    "report_header",
    "write_report_lines",
]
