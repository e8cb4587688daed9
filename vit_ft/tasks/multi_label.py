"""Multi-label classification: several labels (or none) per image, an independent sigmoid per label
(`problem_type` "multi_label_classification", transformers' BCE-with-logits switch).

Training: BCE (with `pos_weight: balanced` through `losses.MultiLabelLoss`), mAP / F1 / exact-match metrics, and
the decision threshold tuned on validation after training (`threshold`), saved in the model's config. Evaluation:
the numbers at the model's threshold (`vit_ft.metrics.multilabel`, equal to scikit-learn's), a table per label,
precision-recall curves, the most confident false positives and negatives, and the sections of report.md. A
label without a positive image in the evaluated data has no AP and is left out of mAP.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..metrics.multilabel import (
    DEFAULT_THRESHOLD,
    MULTI_LABEL,
    MULTILABEL_METRIC_NAMES,
    THRESHOLD_ATTRIBUTE,
    build_multilabel_compute_metrics,
    decision_threshold_of,
    multilabel_metrics,
    per_class_metrics,
    sigmoid,
)
from ..reports.charts import plot_per_class, plot_precision_recall_curves
from ..reports.figures import FALSE_NEGATIVE, FALSE_POSITIVE, LabelMistake, plot_label_mistakes, short
from ..reports.reporting import markdown_table, report_figure_sections, report_header, write_csv
from . import threshold as tuning
from .feature_bank import ood_cells
from .losses import MultiLabelLoss

logger = logging.getLogger("vit_ft")

MULTILABEL_CLASS_COLUMNS = ("class", "support", "predicted", "ap", "precision", "recall", "f1", "threshold")
TABLE_IN_REPORT_MAX_LABELS = 30  # above this, report.md shows the 10 labels with the lowest AP
FIGURE_TITLES = {
    "pr_curves": "Precision-recall curves",
    "per_class": "Precision and recall per label at the decision threshold",
    "false_positives": "Most confident false positives",
    "false_negatives": "Most confident false negatives",
    "training_curves": "Training curves of the fine-tune",
}
# training_curves.png's metric panels: mAP (and exact match), micro- and macro-F1 at the decision threshold
CURVE_PANELS = (
    ("Evaluation mAP", (("eval_mAP", "mAP", "o-"), ("eval_exact_match", "exact match", "s--"))),
    ("Evaluation F1", (("eval_f1_micro", "micro-F1", "^-"), ("eval_f1_macro", "macro-F1", "v--"))),
)


def _number(value: float) -> float | None:
    """`value` for JSON and CSV: None (null, an empty cell) where it is NaN (an AP without positives)."""
    return None if math.isnan(value) else float(value)


def _names(row: np.ndarray, id2label: dict[int, str]) -> str:
    return ";".join(id2label[int(j)] for j in np.flatnonzero(row))


@dataclass(frozen=True)
class MultiLabel:
    """Several labels per image; `threshold` is the (num_labels,) decision threshold the model's config holds
    (None before a model has one: the recipe's number or 0.5 while training)."""

    threshold: np.ndarray | None = field(default=None, compare=False)
    names: tuple[str, ...] = ()  # the label names in label id order (the model's id2label)

    problem_type: ClassVar[str] = MULTI_LABEL
    name: ClassVar[str] = "multi-label image classification"
    metric_names: ClassVar[tuple[str, ...]] = MULTILABEL_METRIC_NAMES
    best_metric: ClassVar[str] = "mAP"
    curve_panels: ClassVar[tuple] = CURVE_PANELS
    fits_temperature: ClassVar[bool] = False
    # the model card: the metrics it reports (key, title), the model-index's metric types, tags, sentences
    card_metrics: ClassVar[tuple] = tuple(
        zip(MULTILABEL_METRIC_NAMES, ("mAP", "F1 micro", "F1 macro", "exact match"), strict=True)
    )
    card_metric_types: ClassVar[tuple[str, ...]] = ("mAP", "f1", "exact_match")
    card_tags: ClassVar[tuple[str, ...]] = ("multi-label-classification",)
    card_sentences: ClassVar[tuple[str, ...]] = (tuning.MULTILABEL_TASK,)

    @classmethod
    def of(cls, config: Any = None, run_record: dict[str, Any] | None = None) -> MultiLabel:
        has_labels = config is not None and not isinstance(config, str) and getattr(config, "num_labels", 0)
        if not has_labels:
            return cls()
        id2label = {int(k): str(v) for k, v in config.id2label.items()}
        return cls(decision_threshold_of(config), tuple(id2label[j] for j in sorted(id2label)))

    @property
    def temperature(self) -> float:
        """Sigmoid probabilities are not divided by a temperature."""
        return 1.0

    # ---- training ---------------------------------------------------------------------------------------

    def check_options(self, data_args: Any, training_args: Any) -> None:
        """Single-label-only options are one-line errors; a single-label metric_for_best_model becomes mAP."""
        tuning.check_multi_label_options(data_args, training_args)

    def train_labels(self, train: Any) -> None:
        """No class ids: the balanced sampler and class weights are single-label options."""
        return None

    def loss_weights(self, training_args: Any, train: Any, names: list[str]) -> torch.Tensor | None:
        """The BCE positive weights of `pos_weight: balanced`, or None."""
        return tuning.train_pos_weight(training_args, train, names)

    def training_loss(self, training_args: Any, data_args: Any, weights: torch.Tensor | None) -> Any:
        """`MultiLabelLoss` with the positive weights, or None (the model's own BCE-with-logits)."""
        return None if weights is None else MultiLabelLoss(weights)

    def compute_metrics(self, training_args: Any) -> Any:
        """The Trainer's compute_metrics: mAP, micro / macro F1 and exact match at the recipe's threshold (0.5
        while the tuned one is still to be chosen)."""
        return build_multilabel_compute_metrics(tuning.training_threshold(training_args))

    def finish(self, trainer: Any) -> dict[str, Any]:
        """Choose the decision threshold on validation (`threshold.tune_decision_threshold`): set in the model's
        config and the trainer's metrics; returns the run record's entry."""
        return tuning.tune_decision_threshold(trainer, trainer.args.decision_threshold)

    def calibrate(self, trainer: Any) -> None:
        """No temperature: the decision threshold is what a multi-label model fits on validation."""
        return None

    def record_fields(self, calibration: Any, fitted: dict[str, Any] | None) -> dict[str, Any]:
        """The run record's entries of the task: no calibration, the problem type and the threshold."""
        return {"calibration": calibration, "problem_type": MULTI_LABEL, THRESHOLD_ATTRIBUTE: fitted}

    def card_result(self, metric: str, title: str, run_info: dict[str, Any]) -> dict[str, Any]:
        """A model-index result's title, and the threshold F1 and exact match count labels at (mAP needs none; a
        per-label list stays in config.json, not repeated)."""
        value = tuning.recorded_threshold(run_info)[0]
        threshold = {"threshold": "per label (decision_threshold)" if isinstance(value, list) else value}
        return {"task_name": "Multi-label image classification", "metric_name": title,
                "metric_args": threshold if metric != "mAP" else None}  # fmt: skip

    def card_lines(self, run_info: dict[str, Any]) -> list[str]:
        """The card's bullet stating the decision threshold and how it was chosen."""
        return [tuning.threshold_line(run_info)]

    def card_usage(self, where: str, model: str, format: str, run_info: dict[str, Any]) -> str:
        """Through `pipeline()`, keeping the labels at or above the decision threshold in config.json."""
        return tuning.multilabel_usage(where, model, format, tuning.recorded_threshold(run_info)[0])

    # ---- inference --------------------------------------------------------------------------------------

    def probabilities(self, logits: torch.Tensor | np.ndarray) -> np.ndarray:
        """Independent label probabilities `(batch, num_labels)`: the sigmoid of each logit, float64."""
        return sigmoid(torch.as_tensor(logits).float().numpy())

    def logits_of(self, probabilities: np.ndarray | torch.Tensor) -> np.ndarray:
        """Logits whose sigmoids are `probabilities` `(batch, num_labels)`, float32: `log(p / (1 - p))`, for
        outputs that are averaged probabilities (test-time augmentation)."""
        p = torch.as_tensor(probabilities).double().clamp(1e-12, 1 - 1e-12)
        return torch.logit(p).float().numpy()

    def predicted_labels(
        self, probabilities: np.ndarray | torch.Tensor, id2label: dict[int, str], top_k: int
    ) -> list[tuple[list[str], list[float]]]:
        """Per image, the labels whose probability is >= their threshold and those probabilities, highest first
        (ties in label order); empty lists when none is. `top_k` is not used."""
        rows = []
        for scores in np.asarray(probabilities):
            above = np.flatnonzero(scores >= self.threshold)
            above = above[np.argsort(-scores[above], kind="stable")]
            rows.append(([id2label[int(j)] for j in above], [float(scores[j]) for j in above]))
        return rows

    def threshold_summary(self, id2label: dict[int, str] | None = None) -> float | dict[str, float]:
        """The decision threshold as the rows say it: one number when every label has the same, else
        {label name: threshold} (names from `id2label`, else the model's)."""
        values = [float(t) for t in self.threshold]
        if all(t == values[0] for t in values):
            return values[0]
        names = [id2label[j] for j in range(len(values))] if id2label is not None else self.names
        return dict(zip(names, values, strict=True))

    @cached_property
    def _row_threshold(self) -> float | dict[str, float]:
        return self.threshold_summary()

    # predict's rows: `labels` / `scores` (JSON arrays in CSV) hold every label whose probability is >= its
    # threshold, highest first; `num_labels` is 0 when none is (empty for a file that could not be read);
    # `threshold` is the model's decision threshold: one number, or {label: threshold} (JSON in CSV)
    prediction_columns: ClassVar[tuple[str, ...]] = ("path", "labels", "scores", "num_labels", "threshold", "error")

    def prediction_row(self, prediction: Any) -> dict[str, Any]:
        """predict's row of a `tools.predict.output.Prediction` (the keys of `prediction_columns`)."""
        count = None if prediction.error is not None else len(prediction.labels)
        return {"path": prediction.path, "labels": prediction.labels, "scores": prediction.scores,
                "num_labels": count, "threshold": self._row_threshold, "error": prediction.error}  # fmt: skip

    def caption(self, labels: list[str], scores: list[float]) -> str:
        """predict's figure caption of an image: its labels at or above the threshold with their probabilities."""
        found = [f"{short(label, 14)}\u00a0{score:.2f}" for label, score in zip(labels, scores, strict=True)]
        return ", ".join(found) if found else "none ≥ threshold"  # no line break inside a pair

    def figure_title(self, count: int, total: int | None = None) -> str:
        value = None if self.threshold is None else self.threshold_summary()
        said = f"{value:.2f}" if isinstance(value, float) else "per label"
        total = count if total is None else total
        return f"Labels at or above the decision threshold ({said}), {count} images shown of {total}"

    # ---- evaluation -------------------------------------------------------------------------------------

    def evaluation_numbers(self, outputs: Any, trained: Any, top_k: int) -> dict[str, Any]:
        """metrics.json's numbers: mAP, micro / macro F1 and exact match at the model's threshold, the threshold
        and where it came from, and the labels without positives (no AP)."""
        numbers = multilabel_metrics(outputs.labels, outputs.probabilities, self.threshold)
        support = np.asarray(outputs.labels).sum(axis=0)
        return {
            **{key: _number(value) for key, value in numbers.items()},
            **self._threshold_record(trained),
            "problem_type": MULTI_LABEL,
            "labels_without_positives": [
                trained.id2label[j] for j in range(trained.num_labels) if support[j] == 0
            ],
        }

    def _threshold_record(self, trained: Any) -> dict[str, Any]:
        saved = getattr(trained.model.config, THRESHOLD_ATTRIBUTE, None) is not None
        tuned = (trained.run_record or {}).get(THRESHOLD_ATTRIBUTE) or {}
        if not saved:
            source = "the default (the model's config holds no decision_threshold)"
        elif isinstance(tuned, dict) and tuned.get("split"):
            source = f"the model's ({tuned.get('kind', 'tuned')}, chosen on the fine-tune's {tuned['split']} split)"
        else:
            source = "the model's (config decision_threshold)"
        return {"threshold": self.threshold_summary(trained.id2label), "threshold_source": source}

    def write_evaluation(
        self, output_dir: Path, outputs: Any, metrics: dict[str, Any], images: Any, trained: Any, split: str,
        max_mistakes: int,
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:  # fmt: skip
        """per_class.csv/.md, mistakes.csv (both kinds), predictions.csv and the figures (pr_curves.png,
        per_class.png, false_positives.png, false_negatives.png); `images(rows)` reads the images of those
        evaluated rows. Returns the per-label table and {figure key: file name}."""
        id2label = trained.id2label
        table = class_table(outputs.labels, outputs.probabilities, self.threshold, id2label)
        write_csv(output_dir / "per_class.csv", table)
        shown_table = [{**row, "ap": "" if row["ap"] is None else row["ap"]} for row in table]
        (output_dir / "per_class.md").write_text(
            markdown_table(shown_table, MULTILABEL_CLASS_COLUMNS), encoding="utf-8"
        )
        mistakes = confident_mistakes(outputs, self.threshold, id2label, max_mistakes)
        write_csv(output_dir / "mistakes.csv", [vars(m) for kind in mistakes.values() for m in kind])
        write_csv(output_dir / "predictions.csv", self._prediction_rows(outputs, id2label))
        shown = f"{split}, {len(outputs.labels)} images"
        names = [id2label[j] for j in range(trained.num_labels)]
        ap = np.array([np.nan if row["ap"] is None else row["ap"] for row in table])
        figures = {
            "pr_curves": plot_precision_recall_curves(outputs.labels, outputs.probabilities, names, self.threshold, ap,
                                                      output_dir / "pr_curves.png", shown).name,  # fmt: skip
            "per_class": plot_per_class(table, output_dir / "per_class.png", shown).name,
        }
        size = trained.preprocessing.image_size
        for key, kind in (("false_positives", FALSE_POSITIVE), ("false_negatives", FALSE_NEGATIVE)):
            found = mistakes[kind]
            path = output_dir / f"{key}.png"
            figures[key] = plot_label_mistakes(found, images([m.row for m in found]), size, path).name
        return table, figures

    def _prediction_rows(self, outputs: Any, id2label: dict[int, str]) -> list[dict[str, Any]]:
        """predictions.csv: per image its true and predicted labels, exact or not, every label's probability, and
        whether it looks unlike the training images (where scored)."""
        probabilities, labels = outputs.probabilities, outputs.labels > 0
        predicted = probabilities >= self.threshold
        names = [id2label[j] for j in range(len(id2label))]
        return [
            {
                "row": int(row),
                "source": outputs.sources[i],
                "true_labels": _names(labels[i], id2label),
                "predicted_labels": _names(predicted[i], id2label),
                "exact_match": bool((predicted[i] == labels[i]).all()),
                "probabilities": json.dumps(
                    dict(zip(names, np.round(probabilities[i], 6).tolist(), strict=True))
                ),
                **ood_cells(outputs, i),
            }
            for i, row in enumerate(outputs.rows)
        ]

    def report_lines(
        self, output_dir: Path, model: str, metrics: dict[str, Any], table: list[dict[str, Any]],
        figures: dict[str, str], folder: Path | None,
    ) -> tuple[list[str], list[str]]:  # fmt: skip
        """report.md's sections (the metrics at the decision threshold, every figure, the per-label table or its
        10 lowest-AP rows) and the notes the task adds (labels without positives)."""
        missing = metrics["labels_without_positives"]
        value = metrics["threshold"]
        said = f"{value:.4g}" if isinstance(value, float) else "one per label (see per_class.csv)"
        lines = [
            *report_header(output_dir, model, metrics, folder, " (multi-label)"),
            f"- Decision threshold: {said}, {metrics['threshold_source']}; a label is predicted at probability >= it",
            "",
            "## Metrics",
            "",
            markdown_table(
                [{"mAP": metrics["mAP"], "micro-F1": metrics["f1_micro"], "macro-F1": metrics["f1_macro"],
                  "exact match": metrics["exact_match"], "images": metrics["num_images"]}],
                ["mAP", "micro-F1", "macro-F1", "exact match", "images"],
            ),
            "mAP: mean AP over the labels with a positive image"
            + (f" ({', '.join(missing)} have none: no AP)" if missing else "") + ". All numbers: "
            "[metrics.json](metrics.json). Per-image labels: [predictions.csv](predictions.csv).",
            "",
            *report_figure_sections(figures, FIGURE_TITLES, "The wrong labels shown, and more: [mistakes.csv](mistakes.csv)."),
            "## Per label", "", "Full table: [per_class.csv](per_class.csv), [per_class.md](per_class.md).", "",
        ]  # fmt: skip
        rows = [{**row, "ap": "" if row["ap"] is None else row["ap"]} for row in table]
        if len(rows) > TABLE_IN_REPORT_MAX_LABELS:
            rows = sorted((r for r in rows if r["ap"] != ""), key=lambda r: r["ap"])[:10]
            lines += ["The 10 labels with the lowest AP:", ""]
        lines.append(markdown_table(rows, MULTILABEL_CLASS_COLUMNS))
        notes = []
        if missing:
            notes.append(
                f"{len(missing)} label(s) of the model have no positive image in this data "
                f"({', '.join(missing[:10])}): no AP, left out of mAP."
            )
        return lines, notes

    def summary(self, metrics: dict[str, Any], top_k: int) -> str:
        """The evaluation's log line."""
        mean_ap = "n/a" if metrics["mAP"] is None else f"{metrics['mAP']:.4f}"
        return (
            f"mAP {mean_ap}, micro-F1 {metrics['f1_micro']:.4f}, macro-F1 {metrics['f1_macro']:.4f}, exact match "
            f"{metrics['exact_match']:.4f} on {metrics['num_images']} images"
        )


def class_table(
    labels: np.ndarray, probabilities: np.ndarray, threshold: np.ndarray, id2label: dict[int, str]
) -> list[dict[str, Any]]:
    """One row per model label: id, class, support (positive images), predicted (images at or above the
    threshold), ap (None without positives), precision, recall, f1 (0 where undefined) and its threshold."""
    values = per_class_metrics(labels, probabilities, threshold)
    return [
        {"id": j, "class": id2label[j], "support": int(values["support"][j]),
         "predicted": int(values["predicted"][j]), "ap": _number(values["ap"][j]),
         "precision": float(values["precision"][j]), "recall": float(values["recall"][j]),
         "f1": float(values["f1"][j]), "threshold": float(values["threshold"][j])}
        for j in range(len(id2label))
    ]  # fmt: skip


def confident_mistakes(
    outputs: Any, threshold: np.ndarray, id2label: dict[int, str], limit: int = 25
) -> dict[str, list[LabelMistake]]:
    """{FALSE_POSITIVE: ..., FALSE_NEGATIVE: ...}: the `limit` (image, label) pairs of each kind the model is
    most sure of: false positives with the highest probability, false negatives with the lowest."""
    probabilities, labels = outputs.probabilities, outputs.labels > 0
    predicted = probabilities >= threshold
    found = {}
    kinds = ((FALSE_POSITIVE, predicted & ~labels, -1.0), (FALSE_NEGATIVE, ~predicted & labels, 1.0))
    for kind, wrong, sign in kinds:
        images, columns = np.nonzero(wrong)
        order = np.argsort(sign * probabilities[images, columns], kind="stable")[:limit]
        found[kind] = [
            LabelMistake(
                kind=kind,
                rank=rank,
                row=int(outputs.rows[images[k]]),
                source=outputs.sources[images[k]],
                label=id2label[int(columns[k])],
                probability=float(probabilities[images[k], columns[k]]),
                threshold=float(threshold[columns[k]]),
                true_labels=_names(labels[images[k]], id2label),
                predicted_labels=_names(predicted[images[k]], id2label),
            )
            for rank, k in enumerate(order, start=1)
        ]
    return found


__all__ = ["DEFAULT_THRESHOLD", "MULTILABEL_CLASS_COLUMNS", "MultiLabel", "class_table", "confident_mistakes"]
