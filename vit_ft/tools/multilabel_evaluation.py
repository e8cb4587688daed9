"""Evaluation of a multi-label classifier (issue 24): the numbers at the model's decision threshold, a table per
label, the most confident false positives and false negatives, and the files `run_evaluation` writes for it.

Probabilities are the sigmoid of each logit (no temperature); a label is predicted at probability >= its
threshold (`Trained.decision_threshold`: the config's `decision_threshold`, tuned on the fine-tune's validation
split, else 0.5). The numbers are `vit_ft.metrics.multilabel`'s, equal to scikit-learn's
`average_precision_score` and `f1_score(average="micro" | "macro", zero_division=0)`; a label without a positive
image in the evaluated data has no AP and is left out of mAP.

    metrics = run_evaluation("outputs/digits-multilabel", "reports/digits-multilabel")   # dispatches here
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..metrics.multilabel import THRESHOLD_ATTRIBUTE, multilabel_metrics, per_class_metrics
from ..reports.figures import plot_per_class
from ..reports.multilabel_figures import (
    FALSE_NEGATIVE,
    FALSE_POSITIVE,
    MULTILABEL_CLASS_COLUMNS,
    LabelMistake,
    plot_label_mistakes,
    plot_precision_recall_curves,
    write_multilabel_report,
)
from ..reports.reporting import copy_training_curves, markdown_table, write_csv
from .eval_data import EvalData
from .eval_outputs import EvalOutputs, evaluation_facts, short_description
from .trained import Trained

logger = logging.getLogger("vit_ft")


def _number(value: float) -> float | None:
    """`value` for JSON and CSV: None (null, an empty cell) where it is NaN (an AP without positives)."""
    return None if math.isnan(value) else float(value)


def class_table(
    labels: np.ndarray, probabilities: np.ndarray, threshold: np.ndarray, id2label: dict[int, str]
) -> list[dict[str, Any]]:
    """One row per model label: id, class, support (positive images), predicted (images at or above the
    threshold), ap (None without positives), precision, recall, f1 (0 where undefined) and its threshold."""
    values = per_class_metrics(labels, probabilities, threshold)
    return [
        {
            "id": j,
            "class": id2label[j],
            "support": int(values["support"][j]),
            "predicted": int(values["predicted"][j]),
            "ap": _number(values["ap"][j]),
            "precision": float(values["precision"][j]),
            "recall": float(values["recall"][j]),
            "f1": float(values["f1"][j]),
            "threshold": float(values["threshold"][j]),
        }
        for j in range(len(id2label))
    ]


def _names(row: np.ndarray, id2label: dict[int, str]) -> str:
    return ";".join(id2label[int(j)] for j in np.flatnonzero(row))


def confident_mistakes(
    outputs: EvalOutputs, threshold: np.ndarray, id2label: dict[int, str], limit: int = 25
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


def threshold_record(trained: Trained) -> dict[str, Any]:
    """metrics.json's threshold: one number when every label has the same, else {label: threshold}, and where
    it came from."""
    values = trained.decision_threshold
    saved = getattr(trained.model.config, THRESHOLD_ATTRIBUTE, None) is not None
    tuned = (trained.run_record or {}).get(THRESHOLD_ATTRIBUTE) or {}
    if not saved:
        source = "the default (the model's config holds no decision_threshold)"
    elif isinstance(tuned, dict) and tuned.get("split"):
        source = (
            f"the model's ({tuned.get('kind', 'tuned')}, chosen on the fine-tune's {tuned['split']} split)"
        )
    else:
        source = "the model's (config decision_threshold)"
    same = bool(np.all(values == values[0]))
    value = float(values[0]) if same else {trained.id2label[j]: float(t) for j, t in enumerate(values)}
    return {"threshold": value, "threshold_source": source}


def multilabel_metrics_record(
    trained: Trained, data: EvalData, outputs: EvalOutputs, table: list[dict[str, Any]], elapsed: float
) -> dict[str, Any]:
    """What metrics.json holds: mAP, micro / macro F1 and exact match at the model's threshold, the threshold,
    the labels without positives (no AP), then what was evaluated (`evaluation_facts`)."""
    numbers = multilabel_metrics(outputs.labels, outputs.probabilities, trained.decision_threshold)
    return {
        **{key: _number(value) for key, value in numbers.items()},
        **threshold_record(trained),
        "problem_type": trained.model.config.problem_type,
        "labels_without_positives": [row["class"] for row in table if row["support"] == 0],
        **evaluation_facts(trained, data, outputs, elapsed),
    }


def _write_tables(
    output_dir: Path,
    outputs: EvalOutputs,
    table: list[dict[str, Any]],
    mistakes: dict[str, list[LabelMistake]],
    trained: Trained,
) -> None:
    """per_class.csv/.md, mistakes.csv (both kinds) and predictions.csv (one row per evaluated image: its true and
    predicted labels, exact or not, and every label's probability)."""
    write_csv(output_dir / "per_class.csv", table)
    shown = [{**row, "ap": "" if row["ap"] is None else row["ap"]} for row in table]
    (output_dir / "per_class.md").write_text(
        markdown_table(shown, MULTILABEL_CLASS_COLUMNS), encoding="utf-8"
    )
    write_csv(output_dir / "mistakes.csv", [vars(m) for kind in mistakes.values() for m in kind])
    probabilities, labels = outputs.probabilities, outputs.labels > 0
    predicted = probabilities >= trained.decision_threshold
    names = [trained.id2label[j] for j in range(trained.num_labels)]
    rows = [
        {
            "row": int(row),
            "source": outputs.sources[i],
            "true_labels": _names(labels[i], trained.id2label),
            "predicted_labels": _names(predicted[i], trained.id2label),
            "exact_match": bool((predicted[i] == labels[i]).all()),
            "probabilities": json.dumps(
                dict(zip(names, np.round(probabilities[i], 6).tolist(), strict=True))
            ),
        }
        for i, row in enumerate(outputs.rows)
    ]
    write_csv(output_dir / "predictions.csv", rows)


def _write_figures(
    output_dir: Path,
    trained: Trained,
    data: EvalData,
    outputs: EvalOutputs,
    table: list[dict[str, Any]],
    mistakes: dict[str, list[LabelMistake]],
) -> dict[str, str]:
    """pr_curves.png, per_class.png, false_positives.png, false_negatives.png and the fine-tune's
    training_curves.png (copied when its folder has one); returns {figure key: file name} for the report."""
    split = f"{short_description(data.description)}, {len(outputs.labels)} images"
    names = [trained.id2label[j] for j in range(trained.num_labels)]
    ap = np.array([np.nan if row["ap"] is None else row["ap"] for row in table])
    figures = {
        "pr_curves": plot_precision_recall_curves(
            outputs.labels, outputs.probabilities, names, trained.decision_threshold, ap,
            output_dir / "pr_curves.png", split,
        ).name,
        "per_class": plot_per_class(table, output_dir / "per_class.png", split).name,
    }  # fmt: skip
    for key, kind in (("false_positives", FALSE_POSITIVE), ("false_negatives", FALSE_NEGATIVE)):
        images = [data.dataset[m.row]["image"] for m in mistakes[kind]]
        size = trained.preprocessing.image_size
        figures[key] = plot_label_mistakes(mistakes[kind], images, size, output_dir / f"{key}.png").name
    curves = copy_training_curves(trained.origin.run_folder, output_dir)
    if curves:
        figures["training_curves"] = curves
    return figures


def write_multilabel_evaluation(
    output_dir: Path,
    trained: Trained,
    data: EvalData,
    outputs: EvalOutputs,
    elapsed: float,
    max_mistakes: int = 25,
) -> dict[str, Any]:
    """Write a multi-label evaluation to `output_dir`: metrics.json, per_class.csv/.md/.png, pr_curves.png,
    mistakes.csv with false_positives.png and false_negatives.png (`max_mistakes` of each kind),
    predictions.csv, training_curves.png (copied when the model folder has one) and report.md. Returns the
    contents of metrics.json."""
    table = class_table(outputs.labels, outputs.probabilities, trained.decision_threshold, trained.id2label)
    metrics = multilabel_metrics_record(trained, data, outputs, table, elapsed)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    mistakes = confident_mistakes(outputs, trained.decision_threshold, trained.id2label, max_mistakes)
    _write_tables(output_dir, outputs, table, mistakes, trained)
    figures = _write_figures(output_dir, trained, data, outputs, table, mistakes)
    notes = list(data.notes)
    if metrics["labels_without_positives"]:
        notes.append(
            f"{len(metrics['labels_without_positives'])} label(s) of the model have no positive image in this data "
            f"({', '.join(metrics['labels_without_positives'][:10])}): no AP, left out of mAP."
        )
    folder = trained.origin.run_folder
    write_multilabel_report(output_dir, trained.source, metrics, table, figures, notes, folder)
    mean_ap = "n/a" if metrics["mAP"] is None else f"{metrics['mAP']:.4f}"
    logger.info(
        "mAP %s, micro-F1 %.4f, macro-F1 %.4f, exact match %.4f on %d images; report in %s",
        mean_ap, metrics["f1_micro"], metrics["f1_macro"], metrics["exact_match"], metrics["num_images"],
        output_dir / "report.md",
    )  # fmt: skip
    return metrics


__all__ = [
    "class_table",
    "confident_mistakes",
    "multilabel_metrics_record",
    "threshold_record",
    "write_multilabel_evaluation",
]
