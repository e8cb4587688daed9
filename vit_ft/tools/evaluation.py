"""Evaluation of a fine-tuned classifier: metrics, a per-class table, a confusion matrix, the most confident
mistakes, and a `report.md` that shows them (with the fine-tune's training curves).

Each job has its module: loading the model once (`trained`), which images (`eval_data`), the model's outputs on
them (`eval_outputs`, with the batched loop of `inference`), the numbers (here), the figures (`reports.figures`)
and the report (`reports.reporting`); `run_evaluation` puts them together.

    run_evaluation("outputs/digits", "reports/digits")                       # the recorded test split
    run_evaluation("outputs/digits", "reports/digits-48", image_size=48)     # another test-time resolution
    run_evaluation("outputs/digits", "reports/mine", data_dir="my_digits/")  # labels matched by class name

A multi-label model (`Trained.multi_label`) is evaluated by `multilabel_evaluation` on multi-label data.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..metrics.calibration import reliability_bins
from ..model.configuration_vit_ft import MAX_IMAGE_TOKENS
from ..reports.figures import (
    Mistake,
    plot_confusion_matrix,
    plot_mistakes,
    plot_per_class,
    plot_reliability_diagram,
)
from ..reports.reporting import (
    PER_CLASS_COLUMNS,
    copy_training_curves,
    markdown_table,
    write_confusion_csv,
    write_csv,
    write_report,
)
from ..utils.output_dir import check_output_dir
from .eval_data import EvalData, folders_read, resolve_eval_data
from .eval_outputs import EvalOutputs, evaluation_facts, predict_dataset, short_description
from .multilabel_evaluation import write_multilabel_evaluation
from .trained import Trained, load_trained

logger = logging.getLogger("vit_ft")


def confusion_counts(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """`(num_classes, num_classes)` int64 counts, rows = true class, columns = predicted class."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


def per_class_table(counts: np.ndarray, id2label: dict[int, str]) -> list[dict[str, Any]]:
    """One row per class from the confusion counts: support, predicted, precision, recall (the class's
    accuracy) and F1; precision/F1 are 0 where undefined (nothing predicted or no support)."""
    true_positives = np.diag(counts)
    support = counts.sum(axis=1)
    predicted = counts.sum(axis=0)
    rows = []
    for i in range(len(counts)):
        precision = true_positives[i] / predicted[i] if predicted[i] else 0.0
        recall = true_positives[i] / support[i] if support[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append(
            {
                "id": i,
                "class": id2label[i],
                "support": int(support[i]),
                "predicted": int(predicted[i]),
                "precision": float(precision),
                "recall": float(recall),
                "f1": float(f1),
            }
        )
    return rows


def compute_metrics(outputs: EvalOutputs, top_k: int = 5) -> dict[str, float]:
    """accuracy, top-k accuracy, macro-F1 and balanced accuracy with the metric modules the fine-tune used (so the numbers agree
    with its eval/test results); macro-F1 averages over the classes present in the labels or predictions."""
    from ..metrics import build_compute_metrics

    values = build_compute_metrics(top_k)((outputs.logits, outputs.labels))
    return {
        "accuracy": float(values["accuracy"]),
        f"top{top_k}_accuracy": float(values[f"top{top_k}_accuracy"]),
        "f1": float(values["f1"]),  # macro-averaged, as the fine-tune's eval_f1
        "balanced_accuracy": float(values["balanced_accuracy"]),  # mean per-class recall
    }


def most_confident_mistakes(
    outputs: EvalOutputs, data: EvalData, id2label: dict[int, str], limit: int = 25
) -> list[Mistake]:
    """The `limit` wrong predictions with the highest predicted probability, most confident first."""
    probabilities = outputs.probabilities
    predictions = outputs.predictions
    wrong = np.flatnonzero(predictions != outputs.labels)
    confidence = probabilities[wrong, predictions[wrong]]
    order = wrong[np.argsort(-confidence, kind="stable")][:limit]
    mistakes = []
    for rank, i in enumerate(order, start=1):
        row = int(outputs.rows[i])
        mistakes.append(
            Mistake(
                rank=rank,
                row=row,
                source=outputs.sources[i],
                true_label=id2label[int(outputs.labels[i])],
                predicted_label=id2label[int(predictions[i])],
                probability=float(probabilities[i, predictions[i]]),
                true_probability=float(probabilities[i, outputs.labels[i]]),
            )
        )
    return mistakes


def calibration_metrics(outputs: EvalOutputs) -> dict[str, float]:
    """The expected calibration error (15 bins) of the probabilities the tools report (divided by the
    model's temperature) and of the raw softmax, and the temperature."""
    correct = outputs.predictions == outputs.labels
    raw = torch.from_numpy(outputs.logits).softmax(dim=-1).numpy().max(axis=-1)
    return {
        "ece": reliability_bins(outputs.probabilities.max(axis=-1), correct).ece,
        "ece_uncalibrated": reliability_bins(raw, correct).ece,
        "temperature": outputs.temperature,
    }


def _metrics_record(
    trained: Trained, data: EvalData, outputs: EvalOutputs, top_k: int, elapsed: float
) -> dict[str, Any]:
    """What metrics.json holds: the numbers, what was evaluated at which resolution, and how fast."""
    return {
        **compute_metrics(outputs, top_k),
        **calibration_metrics(outputs),
        **evaluation_facts(trained, data, outputs, elapsed),
    }


def _write_tables(
    output_dir: Path,
    outputs: EvalOutputs,
    counts: np.ndarray,
    table: list[dict[str, Any]],
    id2label: dict[int, str],
) -> None:
    """per_class.csv/.md, confusion_matrix.npy/.csv and predictions.csv (one row per evaluated image)."""
    write_csv(output_dir / "per_class.csv", table)
    (output_dir / "per_class.md").write_text(markdown_table(table, PER_CLASS_COLUMNS), encoding="utf-8")
    np.save(output_dir / "confusion_matrix.npy", counts)
    write_confusion_csv(counts, id2label, output_dir / "confusion_matrix.csv")
    probabilities, predictions = outputs.probabilities, outputs.predictions
    rows = [
        {
            "row": int(row),
            "source": outputs.sources[i],
            "true_label": id2label[int(label)],
            "predicted_label": id2label[int(pred)],
            "probability": float(probabilities[i, pred]),
            "correct": bool(label == pred),
        }
        for i, (row, label, pred) in enumerate(zip(outputs.rows, outputs.labels, predictions, strict=True))
    ]
    write_csv(output_dir / "predictions.csv", rows)


def _write_figures(
    output_dir: Path,
    trained: Trained,
    data: EvalData,
    outputs: EvalOutputs,
    counts: np.ndarray,
    table: list[dict[str, Any]],
    mistakes: list[Mistake],
    metrics: dict[str, Any],
) -> dict[str, str]:
    """confusion_matrix.png, per_class.png, reliability.png, mistakes.png and the fine-tune's
    training_curves.png (copied when its folder has one); returns {figure key: file name} for the report."""
    images = [data.dataset[m.row]["image"] for m in mistakes]
    split = f"{short_description(data.description)}, {metrics['num_images']} images"
    title = f"Confusion matrix, accuracy {metrics['accuracy']:.3f} on {metrics['num_images']} images"
    bins = reliability_bins(outputs.probabilities.max(axis=-1), outputs.predictions == outputs.labels)
    figures = {
        "confusion_matrix": plot_confusion_matrix(
            counts, trained.id2label, output_dir / "confusion_matrix.png", title=title
        ).name,
        "per_class": plot_per_class(table, output_dir / "per_class.png", split).name,
        "reliability": plot_reliability_diagram(
            bins, output_dir / "reliability.png", split, outputs.temperature, metrics["ece_uncalibrated"]
        ).name,
        "mistakes": plot_mistakes(
            mistakes, images, trained.preprocessing.image_size, output_dir / "mistakes.png"
        ).name,
    }
    curves = copy_training_curves(trained.origin.run_folder, output_dir)
    if curves:
        figures["training_curves"] = curves
    return figures


def run_evaluation(
    model: str | os.PathLike,
    output_dir: str | os.PathLike,
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    image_size: int | Sequence[int] | None = None,
    batch_size: int = 64,
    max_samples: int | None = None,
    max_mistakes: int = 25,
    top_k: int = 5,
    seed: int | None = None,
    device: str | None = None,
    num_workers: int = 0,
    progress: bool | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    bf16: str | bool = False,
    label_separator: str = ";",
) -> dict[str, Any]:
    """Evaluate `model` and write metrics.json, per_class.csv/.md/.png, confusion_matrix.png/.csv/.npy,
    reliability.png, mistakes.png/.csv, predictions.csv, training_curves.png (copied when the model folder has
    one) and report.md to `output_dir`. Returns the contents of metrics.json. Probabilities (mistakes,
    predictions.csv, the reliability diagram) are divided by the model's calibration temperature, when the
    fine-tune fitted one (`Trained.temperature`).

    `max_tokens` bounds the patch tokens per image at `image_size` (None: no bound); `bf16` runs the model
    under bf16 autocast ("auto": where the hardware has native bf16). Nothing is written before the model loads;
    `output_dir` may not be, nor lie inside, a folder the evaluation reads (the model's, the data's).

    A multi-label model needs multi-label data (a `data_dir` with labels.csv, its labels separated by
    `label_separator`) and gets the files of `multilabel_evaluation.write_multilabel_evaluation` instead.
    """
    given = [model, *([data_dir] if data_dir is not None else [])]
    check_output_dir(output_dir, inputs=given, holds="report.md and its files")  # before the model loads
    output_dir = Path(output_dir)
    trained = load_trained(model, image_size, device, max_tokens=max_tokens, bf16=bf16)
    id2label = trained.id2label
    where = (recipe, data_dir, split, seed, max_samples)
    data = resolve_eval_data(trained.origin, id2label, *where, trained.multi_label, label_separator)
    check_output_dir(output_dir, inputs=folders_read(trained.origin, data))  # the recorded data's folders too
    output_dir.mkdir(parents=True, exist_ok=True)
    logger.info("Evaluating %s on %s: %d images.", trained.source, data.description, len(data))

    started = time.perf_counter()
    outputs = predict_dataset(trained, data, batch_size, num_workers, progress)
    elapsed = time.perf_counter() - started
    if outputs.multi_label:
        return write_multilabel_evaluation(output_dir, trained, data, outputs, elapsed, max_mistakes)
    return _write_evaluation(output_dir, trained, data, outputs, elapsed, top_k, max_mistakes)


def _write_evaluation(
    output_dir: Path,
    trained: Trained,
    data: EvalData,
    outputs: EvalOutputs,
    elapsed: float,
    top_k: int,
    max_mistakes: int,
) -> dict[str, Any]:
    """A single-label evaluation's files (see `run_evaluation`); returns metrics.json's contents."""
    id2label = trained.id2label
    metrics = _metrics_record(trained, data, outputs, top_k, elapsed)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")

    counts = confusion_counts(outputs.labels, outputs.predictions, trained.num_labels)
    table = per_class_table(counts, id2label)
    _write_tables(output_dir, outputs, counts, table, id2label)
    mistakes = most_confident_mistakes(outputs, data, id2label, max_mistakes)
    write_csv(output_dir / "mistakes.csv", [vars(m) for m in mistakes])
    figures = _write_figures(output_dir, trained, data, outputs, counts, table, mistakes, metrics)
    write_report(output_dir, trained.source, metrics, table, figures, data.notes, trained.origin.run_folder)
    logger.info(
        "accuracy %.4f, top-%d %.4f, macro-F1 %.4f on %d images; report in %s",
        metrics["accuracy"], top_k, metrics[f"top{top_k}_accuracy"], metrics["f1"], metrics["num_images"],
        output_dir / "report.md",
    )  # fmt: skip
    return metrics


__all__ = [
    "EvalOutputs",
    "calibration_metrics",
    "compute_metrics",
    "confusion_counts",
    "most_confident_mistakes",
    "per_class_table",
    "predict_dataset",
    "run_evaluation",
]
