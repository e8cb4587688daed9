"""What people read: a fine-tune's training curves and model card, an evaluation's report and tables."""

from __future__ import annotations

import csv
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from huggingface_hub import EvalResult, ModelCard, ModelCardData  # noqa: E402

from ..utils.hub_ids import is_hub_model  # noqa: E402
from ..utils.run_record import RUN_RECORD_FILE  # noqa: E402

EVAL_METRICS = ("eval_accuracy", "eval_top5_accuracy", "eval_f1", "eval_loss")


NO_LOGS = "no training logs yet"
# (key, label, format): accuracy and F1 in panels of their own, so that neither hides the other
ACCURACY_CURVES = (("eval_accuracy", "top-1", "o-"), ("eval_top5_accuracy", "top-5", "s--"))
F1_CURVES = (("eval_f1", "macro-F1", "^-"),)


def plot_training_curves(log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """One PNG of four panels against the optimizer step: loss, learning rate, evaluation accuracy (top-1 and
    top-5) and macro-F1. A panel with nothing to draw says so ("no training logs yet" and why), as after a
    run shorter than its logging_steps."""
    train = [e for e in log_history if "loss" in e and "step" in e]
    evals = [e for e in log_history if "eval_loss" in e and "step" in e]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    loss_ax, lr_ax, accuracy_ax, f1_ax = axes.flat
    _curves(loss_ax, "Loss", [("train loss", "-", train, "loss"), ("eval loss", "o-", evals, "eval_loss")],
            "the run stopped before its first logging step")  # fmt: skip
    lr = [e for e in train if "learning_rate" in e]
    _curves(lr_ax, "Learning rate", [("learning rate", "-", lr, "learning_rate")],
            "the run stopped before its first logging step")  # fmt: skip
    for ax, title, curves in ((accuracy_ax, "Evaluation accuracy", ACCURACY_CURVES), (f1_ax, "Evaluation macro-F1", F1_CURVES)):  # fmt: skip
        _curves(ax, title, [(label, fmt, evals, key) for key, label, fmt in curves], "no evaluation has run")
        ax.set_ylim(0, 1.02)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
    if drawn:
        ax.legend(loc="lower left" if title == "Loss" else "best")
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    if curves[0][0] not in drawn:
        y = 0.9 if drawn else 0.5
        ax.text(0.5, y, f"{NO_LOGS}\n({why_empty})", ha="center", va="center", transform=ax.transAxes,
                fontsize=11, color="0.35")  # fmt: skip


# ---- a fine-tune's model card ----------------------------------------------------------------------------


def model_card(
    run_info: dict[str, Any],
    name: str,
    folder: str | Path,
    format: str = "vit_ft",
    repo_id: str | None = None,
) -> ModelCard:
    """The model card of a fine-tune, for its output folder and for the Hub alike.

    YAML metadata (license, library, pipeline, tags, dataset, base model when it is a Hub id, model-index
    results) and a body stating the recipe, base model, resolution, full or LoRA fine-tuning, the results
    and how to load the model. `run_info` is the run record (`vit_ft_run.json`); `name` is the card's title
    (the Hub repository id, or the output folder's name); `folder` is where the card goes (it links
    training_curves.png and the run record when they are there); `format` is the one it is shared in:
    "vit_ft" (our code beside the weights, loaded with trust_remote_code) or "transformers" (a plain ViT).
    `repo_id` is the Hub repository the card is pushed with: the usage snippet loads it by that id; without
    one the snippet loads "path/to/<name>" and says to put the folder's path there (a bare folder name only
    works from the folder's parent).
    """
    body = _card_body(run_info, name, format, Path(folder), repo_id)
    return ModelCard(f"---\n{_card_data(run_info, name, format).to_yaml()}\n---\n{body}")


def write_model_card(output_dir: str | Path, run_info: dict[str, Any]) -> Path:
    """README.md of a fine-tune's output folder: `model_card` named after the folder."""
    output_dir = Path(output_dir)
    path = output_dir / "README.md"
    model_card(run_info, output_dir.name, output_dir).save(path)
    return path


def _card_data(run_info: dict[str, Any], name: str, format: str) -> ModelCardData:
    metrics = run_info.get("metrics") or {}
    data = run_info.get("data") or {}
    dataset_id = (
        data.get("dataset_name")
        or (data.get("builtin_dataset") and f"sklearn-{data['builtin_dataset']}")
        or "imagefolder"
    )
    split, prefix = (
        ("test", "test_") if any(k.startswith("test_") for k in metrics) else ("validation", "eval_")
    )
    results = [
        EvalResult(
            task_type="image-classification",
            dataset_type=dataset_id,
            dataset_name=dataset_id,
            dataset_split=split,
            metric_type=metric,
            metric_value=float(metrics[prefix + metric]),
        )
        for metric in ("accuracy", "top5_accuracy", "f1")
        if prefix + metric in metrics
    ]
    base = run_info.get("base_model")
    tuning = "lora" if run_info.get("lora") else "full-fine-tuning"
    return ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=[
            "vit_ft",
            "vision",
            "image-classification",
            tuning,
            "custom_code" if format == "vit_ft" else "vit",
        ],
        datasets=[data["dataset_name"]] if data.get("dataset_name") else None,
        base_model=base if is_hub_model(base) else None,  # the Hub rejects a local path as base_model
        metrics=["accuracy", "f1"],
        model_name=name,
        eval_results=results or None,
        pipeline_tag="image-classification",
    )


def _card_body(run_info: dict[str, Any], name: str, format: str, folder: Path, repo_id: str | None) -> str:
    lora = bool(run_info.get("lora"))
    height, width = run_info.get("image_size") or (None, None)
    data = run_info.get("data") or {}
    dataset = data.get("dataset_name") or data.get("builtin_dataset") or "a local image folder"
    merged = "merged into the weights here" if (folder / "config.json").is_file() else "in `adapter/`"
    how = f"LoRA (low-rank adapters, {merged})" if lora else "full fine-tuning"
    base = run_info.get("base_model")
    base_text = f"[`{base}`](https://huggingface.co/{base})" if is_hub_model(base) else "a local checkpoint"
    lines = [
        "",
        f"# {name}",
        "",
        f"A Vision Transformer fine-tuned for image classification with vit-ft, by {how}.",
        "",
        f"- Recipe: `{run_info.get('recipe')}`",
        f"- Base model: {base_text}",
        f"- Resolution: {height}x{width} (the image processor resizes to it)",
        f"- Fine-tuning: {'LoRA' if lora else 'full'}",
        f"- Dataset: `{dataset}`",
        f"- Format: {'vit_ft (custom code, `trust_remote_code=True`)' if format == 'vit_ft' else 'transformers ViT'}",
        "",
        "## Evaluation results",
        "",
        _results_table(run_info.get("metrics") or {}),
        "",
        "## Use",
        "",
        _card_usage(repo_id, name, format, lora, f"{height}x{width}"),
        "",
    ]
    if (folder / "training_curves.png").is_file():
        lines += ["## Training", "", "![training curves](training_curves.png)", ""]
    if (folder / RUN_RECORD_FILE).is_file():
        lines += [f"All run settings are in `{RUN_RECORD_FILE}`.", ""]
    return "\n".join(lines)


def _card_usage(repo_id: str | None, name: str, format: str, lora: bool, resolution: str) -> str:
    """How to load the model: by its Hub id when pushed, else by the folder's path (not its bare name)."""
    if repo_id:
        where, model = "", f'"{repo_id}"'
    else:
        where, model = (
            f'model_dir = "path/to/{name}"  # the folder\'s path: the folder this README.md is in\n',
            "model_dir",
        )
    if format == "transformers":
        return (
            "```python\nfrom transformers import pipeline\n\n"
            f'{where}classifier = pipeline("image-classification", model={model})\n'
            'classifier("image.jpg", top_k=5)\n```\n\n'
            "A standard transformers `ViTForImageClassification` (exported from vit-ft): no remote code. "
            f"Its position embeddings are at the fine-tuned {resolution} resolution."
        )
    usage = (
        "```python\nfrom transformers import AutoImageProcessor, AutoModelForImageClassification\n\n"
        f"{where}model = AutoModelForImageClassification.from_pretrained({model}, trust_remote_code=True)\n"
        f"processor = AutoImageProcessor.from_pretrained({model})\n```\n\n"
        f"The model's code (`modeling_vit_ft.py` and its imports) is in this {'repository' if repo_id else 'folder'}: "
        "it is the vit-ft ViT (fused-qkv SDPA attention, any input resolution), not transformers' own ViT. With "
        f"vit-ft installed, `vit_ft.ViTFTForImageClassification.from_pretrained({model})` loads it without "
        "remote code."
    )
    return usage + (" The LoRA adapter alone (peft) is in `adapter/`." if lora else "")


def _results_table(metrics: dict[str, Any]) -> str:
    """One row per split with results (validation, test); "-" where a metric was not recorded."""
    columns = {"accuracy": "accuracy", "top5_accuracy": "top-5 accuracy", "f1": "F1", "loss": "loss"}
    rows = []
    for split, prefix in (("validation", "eval_"), ("test", "test_")):
        values = {title: metrics.get(prefix + key) for key, title in columns.items()}
        if any(isinstance(v, (int, float)) for v in values.values()):
            cells = {t: float(v) if isinstance(v, (int, float)) else "-" for t, v in values.items()}
            rows.append({"split": split, **cells})
    if not rows:
        return "No evaluation results were recorded."
    return markdown_table(rows, ["split", *columns.values()]).rstrip("\n")


# ---- an evaluation's report ------------------------------------------------------------------------------

TABLE_IN_REPORT_MAX_CLASSES = 30  # above this, report.md shows the worst classes and links the full table


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


def write_report(
    output_dir: Path,
    model: str,
    metrics: dict[str, Any],
    table: list[dict[str, Any]],
    figures: dict[str, str],
    notes: Sequence[str],
    model_folder: Path | None = None,
) -> Path:
    """report.md: the metrics, every figure, the per-class table (or its worst rows), and the notes; the
    model's name links to `model_folder` (its local folder) when there is one."""
    lines = [
        *_report_summary(output_dir, model, metrics, model_folder),
        *_report_figures(figures),
        *_report_per_class(table),
    ]
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    path = output_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _report_summary(output_dir: Path, model: str, metrics: dict[str, Any], folder: Path | None) -> list[str]:
    """The report's title, what was evaluated on what, and the metrics table."""
    top_key = next(k for k in metrics if k.startswith("top") and k.endswith("_accuracy"))
    top_name = f"top-{top_key.removeprefix('top').removesuffix('_accuracy')} accuracy"
    model_link = f"[`{model}`]({os.path.relpath(folder, output_dir)})" if folder else f"`{model}`"
    return [
        f"# Evaluation of `{model}`",
        "",
        f"- Model: {model_link}",
        f"- Data: {metrics['data']}",
        f"- Images: {metrics['num_images']} evaluated"
        + (f", {metrics['num_skipped']} skipped (do not decode, see metrics.json)" if metrics["num_skipped"] else ""),
        f"- Resolution: {metrics['image_size'][0]}x{metrics['image_size'][1]}"
        + (f" (fine-tuned at {metrics['trained_image_size'][0]}x{metrics['trained_image_size'][1]})"
           if metrics.get("trained_image_size") and metrics["trained_image_size"] != metrics["image_size"] else ""),
        f"- Precision: {'bf16 autocast' if metrics.get('bf16') else 'float32'} on {metrics.get('device', 'cpu')}",
        "",
        "## Metrics",
        "",
        markdown_table(
            [{"accuracy": metrics["accuracy"], top_name: metrics[top_key],
              "macro-F1": metrics["f1"], "images": metrics["num_images"]}],
            ["accuracy", top_name, "macro-F1", "images"],
        ),
        "All numbers: [metrics.json](metrics.json). Per-image predictions: [predictions.csv](predictions.csv).",
        "",
    ]  # fmt: skip


FIGURE_TITLES = {
    "confusion_matrix": "Confusion matrix (rows: true class, normalised)",
    "mistakes": "Most confident mistakes",
    "training_curves": "Training curves of the fine-tune",
}


def _report_figures(figures: dict[str, str]) -> list[str]:
    """A section per figure in `figures` (key -> file name), in FIGURE_TITLES' order, and the tables behind them."""
    lines = []
    for key, title in FIGURE_TITLES.items():
        if key in figures:
            lines += [f"## {title}", "", f"![{title}]({figures[key]})", ""]
    lines += ["Counts: [confusion_matrix.csv](confusion_matrix.csv) ([.npy](confusion_matrix.npy)); the mistakes "
              "shown: [mistakes.csv](mistakes.csv).", ""]  # fmt: skip
    if "training_curves" not in figures:
        lines += ["No training curves: the model folder has no training_curves.png.", ""]
    return lines


def _report_per_class(table: list[dict[str, Any]]) -> list[str]:
    """The per-class table of the classes present, or its 10 lowest-F1 rows when there are many classes."""
    lines = [
        "## Per class",
        "",
        "Full table: [per_class.csv](per_class.csv), [per_class.md](per_class.md).",
        "",
    ]
    present = [row for row in table if row["support"] > 0]
    if len(present) <= TABLE_IN_REPORT_MAX_CLASSES:
        return [*lines, markdown_table(present, PER_CLASS_COLUMNS)]
    worst = sorted(present, key=lambda row: (row["f1"], -row["support"]))[:10]
    return [*lines, "The 10 classes with the lowest F1:", "", markdown_table(worst, PER_CLASS_COLUMNS)]


def copy_training_curves(folder: Path | None, output_dir: Path) -> str | None:
    """The fine-tune's training_curves.png (in its output `folder`) copied next to an evaluation report; its
    name, or None."""
    source = folder / "training_curves.png" if folder else None
    if source is None or not source.is_file():
        return None
    shutil.copyfile(source, output_dir / "training_curves.png")
    return "training_curves.png"


__all__ = [
    "copy_training_curves",
    "markdown_table",
    "model_card",
    "plot_training_curves",
    "write_confusion_csv",
    "write_csv",
    "write_model_card",
    "write_report",
]
