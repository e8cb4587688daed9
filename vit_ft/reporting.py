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

from .run_record import RUN_RECORD_FILE, run_folder  # noqa: E402

EVAL_METRICS = ("eval_accuracy", "eval_top5_accuracy", "eval_f1", "eval_loss")
REPORTED = ("_accuracy", "_f1", "_loss")  # metric-name endings shown in the model card (not runtimes)


def plot_training_curves(log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """One PNG with loss, learning rate and evaluation metrics against the optimizer step."""
    train = [e for e in log_history if "loss" in e and "step" in e]
    evals = [e for e in log_history if "eval_loss" in e and "step" in e]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    loss_ax, lr_ax, metric_ax = axes
    if train:
        loss_ax.plot([e["step"] for e in train], [e["loss"] for e in train], label="train loss")
    if evals:
        loss_ax.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-", label="eval loss")
    loss_ax.set(title="Loss", xlabel="step")
    loss_ax.legend()
    lr = [e for e in train if "learning_rate" in e]
    lr_ax.plot([e["step"] for e in lr], [e["learning_rate"] for e in lr])
    lr_ax.set(title="Learning rate", xlabel="step")
    for key in EVAL_METRICS[:3]:
        points = [e for e in evals if key in e]
        if points:
            metric_ax.plot(
                [e["step"] for e in points], [e[key] for e in points], "o-", label=key.removeprefix("eval_")
            )
    metric_ax.set(title="Evaluation", xlabel="step", ylim=(0, 1.02))
    if evals:
        metric_ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_model_card(output_dir: str | Path, run_info: dict[str, Any]) -> Path:
    """README.md with YAML metadata (license, library, tags, datasets, base model, model-index results)."""
    output_dir = Path(output_dir)
    metrics = run_info.get("metrics", {})
    data = run_info.get("data", {})
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
            metric_type=name,
            metric_value=float(metrics[prefix + name]),
        )
        for name in ("accuracy", "top5_accuracy", "f1")
        if prefix + name in metrics
    ]
    name = output_dir.name
    base = run_info.get("base_model")
    card_data = ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=[
            "vit_ft",
            "vision",
            "image-classification",
            "lora" if run_info.get("lora") else "full-fine-tuning",
        ],
        datasets=[data["dataset_name"]] if data.get("dataset_name") else None,
        base_model=base if base and not Path(base).exists() else None,
        metrics=["accuracy", "f1"],
        model_name=name,
        eval_results=results or None,
    )
    height, width = run_info.get("image_size") or (None, None)
    rows = "\n".join(
        f"| {k} | {v:.4f} |"
        for k, v in sorted(metrics.items())
        if isinstance(v, float) and k.endswith(REPORTED)
    )
    content = f"""---
{card_data.to_yaml()}
---

# {name}

A Vision Transformer fine-tuned with vit-ft ({"LoRA" if run_info.get("lora") else "full fine-tuning"}).

- Recipe: `{run_info.get("recipe")}`
- Base model: `{base}`
- Resolution: {height}x{width}
- Dataset: `{dataset_id}`

## Results

| metric | value |
| --- | --- |
{rows}

## Use

```python
from transformers import AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained("{name}", trust_remote_code=True)
```

![training curves](training_curves.png)

Run settings: see `{RUN_RECORD_FILE}`.
"""
    path = output_dir / "README.md"
    ModelCard(content).save(path)
    return path


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
) -> Path:
    """report.md: the metrics, every figure, the per-class table (or its worst rows), and the notes."""
    top_key = next(k for k in metrics if k.startswith("top") and k.endswith("_accuracy"))
    top_name = f"top-{top_key.removeprefix('top').removesuffix('_accuracy')} accuracy"
    folder = run_folder(model)
    model_link = f"[`{model}`]({os.path.relpath(folder, output_dir)})" if folder else f"`{model}`"
    lines = [
        f"# Evaluation of `{model}`",
        "",
        f"- Model: {model_link}",
        f"- Data: {metrics['data']}",
        f"- Images: {metrics['num_images']} evaluated"
        + (f", {metrics['num_skipped']} skipped (do not decode, see metrics.json)" if metrics["num_skipped"] else ""),
        f"- Resolution: {metrics['image_size'][0]}x{metrics['image_size'][1]}"
        + (f" (fine-tuned at {metrics['trained_image_size'][0]}x{metrics['trained_image_size'][1]})"
           if metrics.get("trained_image_size") and metrics["trained_image_size"] != metrics["image_size"] else ""),
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
    titles = {
        "confusion_matrix": "Confusion matrix (rows: true class, normalised)",
        "mistakes": "Most confident mistakes",
        "training_curves": "Training curves of the fine-tune",
    }
    for key, title in titles.items():
        if key in figures:
            lines += [f"## {title}", "", f"![{title}]({figures[key]})", ""]
    lines += ["Counts: [confusion_matrix.csv](confusion_matrix.csv) ([.npy](confusion_matrix.npy)); the mistakes "
              "shown: [mistakes.csv](mistakes.csv).", ""]  # fmt: skip
    if "training_curves" not in figures:
        lines += ["No training curves: the model folder has no training_curves.png.", ""]
    lines += [
        "## Per class",
        "",
        "Full table: [per_class.csv](per_class.csv), [per_class.md](per_class.md).",
        "",
    ]
    present = [row for row in table if row["support"] > 0]
    if len(present) <= TABLE_IN_REPORT_MAX_CLASSES:
        lines.append(markdown_table(present, PER_CLASS_COLUMNS))
    else:
        worst = sorted(present, key=lambda row: (row["f1"], -row["support"]))[:10]
        lines += ["The 10 classes with the lowest F1:", "", markdown_table(worst, PER_CLASS_COLUMNS)]
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    path = output_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def copy_training_curves(model: str, output_dir: Path) -> str | None:
    """The fine-tune's training_curves.png copied next to an evaluation report; its name, or None."""
    folder = run_folder(model)
    source = folder / "training_curves.png" if folder else None
    if source is None or not source.is_file():
        return None
    shutil.copyfile(source, output_dir / "training_curves.png")
    return "training_curves.png"


__all__ = [
    "copy_training_curves",
    "markdown_table",
    "plot_training_curves",
    "write_confusion_csv",
    "write_csv",
    "write_model_card",
    "write_report",
]
