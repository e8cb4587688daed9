"""Single-label classification: one class per image, softmax over the classes (`problem_type`
"single_label_classification", transformers' default).

Training: cross-entropy (the model's own, or `losses.ClassificationLoss` with class weights and mixup's soft
targets), the class-balanced sampler, the metrics of `vit_ft.metrics` (accuracy, top-5, macro-F1, balanced
accuracy), the calibration temperature fitted on validation after training (`temperature`). Evaluation: the
numbers, a per-class table, the confusion matrix, the most confident mistakes, the reliability diagram and the
sections of report.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..metrics import METRIC_NAMES, base_metric, build_compute_metrics
from ..metrics.calibration import reliability_bins, softmax_with_temperature
from ..metrics.multilabel import MULTILABEL_METRIC_NAMES, SINGLE_LABEL
from ..reports.charts import plot_confusion_matrix, plot_per_class, plot_reliability_diagram
from ..reports.figures import Mistake, plot_mistakes, short
from ..reports.reporting import (
    ACCURACY_PANELS,
    PER_CLASS_COLUMNS,
    markdown_table,
    report_figure_sections,
    report_header,
    write_confusion_csv,
    write_csv,
)
from ..utils.run_record import recorded_temperature
from .feature_bank import ood_cells
from .losses import ClassificationLoss, class_weight_vector

logger = logging.getLogger("vit_ft")

TABLE_IN_REPORT_MAX_CLASSES = 30  # above this, report.md shows the worst classes and links the full table
FIGURE_TITLES = {
    "confusion_matrix": "Confusion matrix (rows: true class, normalised)",
    "per_class": "Precision and recall per class",
    "reliability": "Reliability diagram (calibration, 15 bins)",
    "mistakes": "Most confident mistakes",
    "training_curves": "Training curves of the fine-tune",
}


@dataclass(frozen=True)
class SingleLabel:
    """One class per image; `temperature` is the calibration the fine-tune fitted (1.0: none)."""

    temperature: float = 1.0

    problem_type: ClassVar[str] = SINGLE_LABEL
    name: ClassVar[str] = "image classification"
    metric_names: ClassVar[tuple[str, ...]] = METRIC_NAMES
    best_metric: ClassVar[str] = "accuracy"  # the curves' marked step
    curve_panels: ClassVar[tuple] = ACCURACY_PANELS  # training_curves.png: accuracy (top-1, top-5), macro-F1
    fits_temperature: ClassVar[bool] = True
    # the model card: the metrics it reports (key, title), the model-index's metric types, tags, sentences
    card_metrics: ClassVar[tuple] = (
        ("accuracy", "accuracy"),
        ("top5_accuracy", "top-5 accuracy"),
        ("f1", "F1"),
    )
    card_metric_types: ClassVar[tuple[str, ...]] = ("accuracy", "f1")
    card_tags: ClassVar[tuple[str, ...]] = ()
    card_sentences: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, config: Any = None, run_record: dict[str, Any] | None = None) -> SingleLabel:
        """The run record's temperature; 1.0 for a model whose config says it is already folded into its head."""
        from .temperature import folded_temperature_of

        return cls(1.0 if folded_temperature_of(config) is not None else recorded_temperature(run_record))

    # ---- training ---------------------------------------------------------------------------------------

    def check_options(self, data_args: Any, training_args: Any) -> None:
        """The multi-label options are one-line errors for data with one label per image."""
        if (
            training_args.pos_weight is not None
            or base_metric(training_args.metric_for_best_model) in MULTILABEL_METRIC_NAMES
        ):
            option = "pos_weight" if training_args.pos_weight is not None else "metric_for_best_model"
            raise ValueError(
                f"{option}={getattr(training_args, option)!r} is for multi-label data, but this data has one "
                "label per image; drop it (or give several labels per image: docs/fine-tuning.md, Multi-label)."
            )

    def train_labels(self, train: Any) -> list[int]:
        """The training split's class ids, for the class weights and the balanced sampler."""
        return [int(label) for label in train["label"]]

    def loss_weights(self, training_args: Any, train: Any, names: list[str]) -> torch.Tensor | None:
        """The loss's (num_classes,) class weights from the recipe's `class_weights`, or None; a label that is no
        class is a ValueError naming the classes (checked before the model loads)."""
        spec = getattr(training_args, "class_weights", None)
        if spec is None:
            return None
        weights = class_weight_vector(spec, names, self.train_labels(train))
        shown = {name: round(weight, 4) for name, weight in zip(names, weights.tolist(), strict=True)}
        logger.info("Class weights in the loss: %s", shown)
        return weights

    def training_loss(self, training_args: Any, data_args: Any, weights: torch.Tensor | None) -> Any:
        """`ClassificationLoss` when class weights or mixed batches need it, else None (the model's loss, with
        Trainer's label smoothing). Label smoothing moves into it (hard labels) or into the mixup targets."""
        if weights is None and not data_args.mixes_batches:
            return None
        smoothing = 0.0 if data_args.mixes_batches else training_args.label_smoothing_factor
        return ClassificationLoss(weights, smoothing)

    def compute_metrics(self, training_args: Any = None) -> Any:
        """The Trainer's compute_metrics: accuracy, top-5 accuracy, macro-F1 and balanced accuracy."""
        return build_compute_metrics()

    def finish(self, trainer: Any) -> None:
        """Nothing to choose before the final evaluation (the temperature is fitted with the outputs)."""
        return None

    def calibrate(self, trainer: Any) -> dict[str, Any] | None:
        """The temperature fitted on the validation split, or None without one: every process predicts its
        shard, process zero fits on the gathered logits and every process receives its record."""
        if trainer.eval_dataset is None:
            return None
        from .temperature import fit_and_record_temperature

        return fit_and_record_temperature(trainer, trainer.eval_dataset)

    def record_fields(self, calibration: dict[str, Any] | None, fitted: Any = None) -> dict[str, Any]:
        """The run record's entries of the task: the calibration."""
        return {"calibration": calibration}

    def card_result(self, metric: str, title: str, run_info: dict[str, Any]) -> dict[str, Any]:
        """A model-index result's task-specific fields: none."""
        return {}

    def card_lines(self, run_info: dict[str, Any]) -> list[str]:
        """The card's task-specific bullets: none."""
        return []

    def card_usage(self, where: str, model: str, format: str, run_info: dict[str, Any]) -> None:
        """No use of its own: the card's (`pipeline()` or `AutoModelForImageClassification`)."""
        return None

    # ---- inference --------------------------------------------------------------------------------------

    def probabilities(self, logits: torch.Tensor | np.ndarray) -> np.ndarray:
        """Calibrated probabilities `(batch, num_classes)`: the softmax of `logits / temperature`, float32."""
        return softmax_with_temperature(logits, self.temperature).numpy()

    def logits_of(self, probabilities: np.ndarray | torch.Tensor) -> np.ndarray:
        """Logits whose `probabilities` are `probabilities` `(batch, num_classes)` (rows summing to 1), float32:
        `temperature * log(p)`, for outputs that are averaged probabilities (test-time augmentation)."""
        p = torch.as_tensor(probabilities).float().clamp_min(torch.finfo(torch.float32).tiny)
        return (self.temperature * p.log()).numpy()

    def predicted_labels(
        self, probabilities: np.ndarray | torch.Tensor, id2label: dict[int, str], top_k: int
    ) -> list[tuple[list[str], list[float]]]:
        """Per image, the `top_k` most probable labels and their probabilities, highest first."""
        probabilities = torch.as_tensor(probabilities)
        scores, indices = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
        return [
            ([id2label[int(j)] for j in row_indices], [float(s) for s in row_scores])
            for row_scores, row_indices in zip(scores, indices, strict=True)
        ]

    def threshold_summary(self, id2label: dict[int, str]) -> None:
        """A single-label model has no decision threshold: its rows give the top k."""
        return None

    # predict's rows: the top k labels and their probabilities
    prediction_columns: ClassVar[tuple[str, ...]] = (
        "path",
        "label",
        "score",
        "top_k_labels",
        "top_k_scores",
        "error",
    )

    def prediction_row(self, prediction: Any) -> dict[str, Any]:
        """predict's row of a `tools.predict.output.Prediction` (the keys of `prediction_columns`)."""
        return {"path": prediction.path, "label": prediction.label, "score": prediction.score,
                "top_k_labels": prediction.labels, "top_k_scores": prediction.scores, "error": prediction.error}  # fmt: skip

    def caption(self, labels: list[str], scores: list[float]) -> str:
        """predict's figure caption of an image: `label (p)` of the top label."""
        return f"{short(labels[0] if labels else '?')} ({scores[0] if scores else 0.0:.2f})"

    def figure_title(self, count: int, total: int | None = None) -> str:
        return f"Top-1 predictions ({count} shown of {total if total is not None else count})"

    # ---- evaluation -------------------------------------------------------------------------------------

    def evaluation_numbers(self, outputs: Any, trained: Any, top_k: int) -> dict[str, Any]:
        """metrics.json's numbers: accuracy, top-k accuracy, macro-F1 and balanced accuracy with the metric
        modules the fine-tune used (so they agree with its eval/test results), then the calibration error."""
        values = build_compute_metrics(top_k)((outputs.logits, outputs.labels))
        correct = outputs.predictions == outputs.labels
        raw = torch.from_numpy(outputs.logits).softmax(dim=-1).numpy().max(axis=-1)
        return {
            "accuracy": float(values["accuracy"]),
            f"top{top_k}_accuracy": float(values[f"top{top_k}_accuracy"]),
            "f1": float(values["f1"]),  # macro-averaged, as the fine-tune's eval_f1
            "balanced_accuracy": float(values["balanced_accuracy"]),  # mean per-class recall
            "ece": reliability_bins(outputs.probabilities.max(axis=-1), correct).ece,
            "ece_uncalibrated": reliability_bins(raw, correct).ece,
            "temperature": outputs.task.temperature,
        }

    def write_evaluation(
        self, output_dir: Path, outputs: Any, metrics: dict[str, Any], images: Any, trained: Any, split: str,
        max_mistakes: int,
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:  # fmt: skip
        """per_class.csv/.md, confusion_matrix.npy/.csv, predictions.csv, mistakes.csv and the figures
        (confusion_matrix.png, per_class.png, reliability.png, mistakes.png); `images(rows)` reads the images
        of those evaluated rows. Returns the per-class table and {figure key: file name}."""
        id2label = trained.id2label
        counts = confusion_counts(outputs.labels, outputs.predictions, trained.num_labels)
        table = per_class_table(counts, id2label)
        write_csv(output_dir / "per_class.csv", table)
        (output_dir / "per_class.md").write_text(markdown_table(table, PER_CLASS_COLUMNS), encoding="utf-8")
        np.save(output_dir / "confusion_matrix.npy", counts)
        write_confusion_csv(counts, id2label, output_dir / "confusion_matrix.csv")
        write_csv(output_dir / "predictions.csv", _prediction_rows(outputs, id2label))
        mistakes = most_confident_mistakes(outputs, id2label, max_mistakes)
        write_csv(output_dir / "mistakes.csv", [vars(m) for m in mistakes])
        shown = f"{split}, {metrics['num_images']} images"
        title = f"Confusion matrix, accuracy {metrics['accuracy']:.3f} on {metrics['num_images']} images"
        bins = reliability_bins(outputs.probabilities.max(axis=-1), outputs.predictions == outputs.labels)
        figures = {
            "confusion_matrix": plot_confusion_matrix(
                counts, id2label, output_dir / "confusion_matrix.png", title=title
            ).name,
            "per_class": plot_per_class(table, output_dir / "per_class.png", shown).name,
            "reliability": plot_reliability_diagram(
                bins, output_dir / "reliability.png", shown, outputs.task.temperature, metrics["ece_uncalibrated"]
            ).name,
            "mistakes": plot_mistakes(
                mistakes, images([m.row for m in mistakes]), trained.preprocessing.image_size,
                output_dir / "mistakes.png",
            ).name,
        }  # fmt: skip
        return table, figures

    def report_lines(
        self, output_dir: Path, model: str, metrics: dict[str, Any], table: list[dict[str, Any]],
        figures: dict[str, str], folder: Path | None,
    ) -> tuple[list[str], list[str]]:  # fmt: skip
        """report.md's sections (the metrics, every figure, the per-class table or its worst rows) and the
        notes the task adds (none)."""
        top_key = next(k for k in metrics if k.startswith("top") and k.endswith("_accuracy"))
        top_name = f"top-{top_key.removeprefix('top').removesuffix('_accuracy')} accuracy"
        lines = [
            *report_header(output_dir, model, metrics, folder),
            *_calibration_line(metrics),
            "",
            "## Metrics",
            "",
            markdown_table(
                [{"accuracy": metrics["accuracy"], top_name: metrics[top_key], "macro-F1": metrics["f1"],
                  "balanced accuracy": metrics.get("balanced_accuracy"), "ECE": metrics.get("ece"),
                  "images": metrics["num_images"]}],
                ["accuracy", top_name, "macro-F1", *(["balanced accuracy"] if "balanced_accuracy" in metrics else []),
                 *(["ECE"] if "ece" in metrics else []), "images"],
            ),
            "All numbers: [metrics.json](metrics.json). Per-image predictions: [predictions.csv](predictions.csv).",
            "",
            *report_figure_sections(figures, FIGURE_TITLES, "Counts: [confusion_matrix.csv](confusion_matrix.csv) "
                                    "([.npy](confusion_matrix.npy)); the mistakes shown: [mistakes.csv](mistakes.csv)."),
            *_report_per_class(table),
        ]  # fmt: skip
        return lines, []

    def summary(self, metrics: dict[str, Any], top_k: int) -> str:
        """The evaluation's log line."""
        return (
            f"accuracy {metrics['accuracy']:.4f}, top-{top_k} {metrics[f'top{top_k}_accuracy']:.4f}, "
            f"macro-F1 {metrics['f1']:.4f} on {metrics['num_images']} images"
        )


def confusion_counts(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """`(num_classes, num_classes)` int64 counts, rows = true class, columns = predicted class."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


def per_class_table(counts: np.ndarray, id2label: dict[int, str]) -> list[dict[str, Any]]:
    """One row per class from the confusion counts: support, predicted, precision, recall (the class's
    accuracy) and F1; precision/F1 are 0 where undefined (nothing predicted or no support)."""
    true_positives = np.diag(counts)
    support, predicted = counts.sum(axis=1), counts.sum(axis=0)
    rows = []
    for i in range(len(counts)):
        precision = true_positives[i] / predicted[i] if predicted[i] else 0.0
        recall = true_positives[i] / support[i] if support[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"id": i, "class": id2label[i], "support": int(support[i]), "predicted": int(predicted[i]),
                     "precision": float(precision), "recall": float(recall), "f1": float(f1)})  # fmt: skip
    return rows


def most_confident_mistakes(outputs: Any, id2label: dict[int, str], limit: int = 25) -> list[Mistake]:
    """The `limit` wrong predictions with the highest predicted probability, most confident first."""
    probabilities, predictions = outputs.probabilities, outputs.predictions
    wrong = np.flatnonzero(predictions != outputs.labels)
    confidence = probabilities[wrong, predictions[wrong]]
    order = wrong[np.argsort(-confidence, kind="stable")][:limit]
    return [
        Mistake(
            rank=rank,
            row=int(outputs.rows[i]),
            source=outputs.sources[i],
            true_label=id2label[int(outputs.labels[i])],
            predicted_label=id2label[int(predictions[i])],
            probability=float(probabilities[i, predictions[i]]),
            true_probability=float(probabilities[i, outputs.labels[i]]),
        )
        for rank, i in enumerate(order, start=1)
    ]


def _prediction_rows(outputs: Any, id2label: dict[int, str]) -> list[dict[str, Any]]:
    """predictions.csv: one row per evaluated image, its true and predicted class and that probability, and
    whether it looks unlike the training images (where scored)."""
    probabilities, predictions = outputs.probabilities, outputs.predictions
    return [
        {
            "row": int(row),
            "source": outputs.sources[i],
            "true_label": id2label[int(label)],
            "predicted_label": id2label[int(pred)],
            "probability": float(probabilities[i, pred]),
            "correct": bool(label == pred),
            **ood_cells(outputs, i),
        }
        for i, (row, label, pred) in enumerate(zip(outputs.rows, outputs.labels, predictions, strict=True))
    ]


def _calibration_line(metrics: dict[str, Any]) -> list[str]:
    """What the probabilities are: divided by the fine-tune's temperature or raw, with their ECE."""
    if "ece" not in metrics:
        return []
    temperature = metrics.get("temperature", 1.0)
    if temperature == 1.0:
        return [f"- Calibration: raw softmax (no temperature fitted); ECE {metrics['ece']:.4f}"]
    return [f"- Calibration: probabilities divided by the temperature {temperature:.3f} fitted on the fine-tune's "
            f"validation split; expected calibration error {metrics['ece']:.4f} "
            f"({metrics.get('ece_uncalibrated', float('nan')):.4f} without it)"]  # fmt: skip


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


__all__ = ["SingleLabel", "confusion_counts", "most_confident_mistakes", "per_class_table"]
