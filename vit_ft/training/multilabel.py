"""What a multi-label fine-tune does differently, chosen once the data says it is multi-label
(`vit_ft.data.datasets.is_multi_label_dataset`): the recipe checks, the BCE positive weights, the metrics and
the decision threshold tuned on validation after training.

- `check_task_options`: single-label-only options (mixup / cutmix, class weights, the balanced sampler, label
  smoothing) are one-line errors for multi-label data, `pos_weight` and the multi-label metrics are for
  multi-label data only, and a single-label `metric_for_best_model` (the recipes' default `accuracy`) becomes
  `mAP`, the multi-label default.
- `train_pos_weight`: `pos_weight: balanced` -> negatives / positives of each label in train (torch's
  `BCEWithLogitsLoss(pos_weight=)`), for `losses.MultiLabelLoss`.
- `tune_decision_threshold`: after training, the validation split's sigmoid probabilities choose the threshold
  (`decision_threshold`: one global for the best micro F1, one per class, or the recipe's fixed number); it is
  saved in the model's config (`metrics.multilabel.THRESHOLD_ATTRIBUTE`) and the run record, and the final
  validation and test metrics use it. The test split never chooses it.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets
import numpy as np
import torch

from ..data.multilabel import multi_hot_matrix
from ..metrics import METRIC_NAMES, eval_arrays
from ..metrics.multilabel import (
    DEFAULT_THRESHOLD,
    MULTILABEL_METRIC_NAMES,
    THRESHOLD_ATTRIBUTE,
    build_multilabel_compute_metrics,
    multilabel_metrics,
    sigmoid,
    tune_class_thresholds,
    tune_global_threshold,
)
from .arguments import RecipeError
from .training_arguments import BALANCED, TUNE, TUNE_PER_CLASS

logger = logging.getLogger("vit_ft")

_SINGLE_LABEL_ONLY = {
    "mixup_alpha / cutmix_alpha": "mixes one class per image",
    "class_weights": "weighs the classes of a softmax; use pos_weight: balanced for multi-label",
    "balanced_sampler": "draws one class per image; use pos_weight: balanced for multi-label",
    "label_smoothing_factor": "smooths a softmax's one-hot targets; set it to 0",
}


def _metric_task(metric: str | None) -> str | None:
    """ "single" or "multi" for a metric_for_best_model name (eval_ / ema_ prefixes allowed), None for loss."""
    name = (metric or "").removeprefix("eval_").removeprefix("ema_")
    return "single" if name in METRIC_NAMES else "multi" if name in MULTILABEL_METRIC_NAMES else None


def check_task_options(multi_label: bool, data_args: Any, training_args: Any) -> None:
    """Refuse the options that do not fit the task the data turned out to be (one-line RecipeError, before the
    model loads); a multi-label run watching a single-label metric is switched to mAP, and says so."""
    task = _metric_task(training_args.metric_for_best_model)
    if not multi_label:
        if training_args.pos_weight is not None or task == "multi":
            option = "pos_weight" if training_args.pos_weight is not None else "metric_for_best_model"
            raise RecipeError(
                f"{option}={getattr(training_args, option)!r} is for multi-label data, but this data has one "
                "label per image; drop it (or give several labels per image: docs/fine-tuning.md, Multi-label)."
            )
        return
    used = {
        "mixup_alpha / cutmix_alpha": data_args.mixes_batches,
        "class_weights": training_args.class_weights is not None,
        "balanced_sampler": training_args.balanced_sampler,
        "label_smoothing_factor": training_args.label_smoothing_factor > 0,
    }
    for option, on in used.items():
        if on:
            raise RecipeError(
                f"{option} is single-label only ({_SINGLE_LABEL_ONLY[option]}), and this data is multi-label "
                "(several labels or none per image); turn it off in the recipe or with its flag."
            )
    if task == "single":
        metric = training_args.metric_for_best_model
        ema = "ema_" if metric.removeprefix("eval_").startswith("ema_") else ""
        training_args.metric_for_best_model = f"{ema}mAP"
        training_args.greater_is_better = True
        logger.info(
            "Multi-label data: metric_for_best_model %s -> %smAP (the multi-label default).", metric, ema
        )


def train_pos_weight(training_args: Any, train: datasets.Dataset, names: list[str]) -> torch.Tensor | None:
    """The (num_labels,) BCE positive weights of `pos_weight: balanced` (negatives / positives per label in the
    training split; 1 for a label without positives or without negatives), or None when unset."""
    if training_args.pos_weight != BALANCED:
        return None
    matrix = multi_hot_matrix(train) > 0
    positives, negatives = matrix.sum(0), (~matrix).sum(0)
    weights = np.where((positives > 0) & (negatives > 0), negatives / np.maximum(positives, 1), 1.0)
    logger.info(
        "BCE positive weights: %s", {n: round(float(w), 3) for n, w in zip(names, weights, strict=True)}
    )
    return torch.tensor(weights, dtype=torch.float32)


def training_threshold(training_args: Any) -> float:
    """The threshold the metrics use during training: the recipe's number, else the default 0.5 (the tuned one
    is chosen after training)."""
    value = training_args.decision_threshold
    return DEFAULT_THRESHOLD if value in (TUNE, TUNE_PER_CLASS) else float(value)


def _choose(
    labels: np.ndarray, probabilities: np.ndarray, mode: str | float
) -> tuple[float | list[float], str]:
    if mode == TUNE:
        return tune_global_threshold(labels, probabilities), "global"
    if mode == TUNE_PER_CLASS:
        default = tune_global_threshold(labels, probabilities)  # for a label without positives in validation
        return [float(v) for v in tune_class_thresholds(labels, probabilities, default=default)], "per_class"
    return float(mode), "fixed"


def tune_decision_threshold(trainer: Any, mode: str | float) -> dict[str, Any]:
    """Choose the decision threshold on the trainer's validation split with the final weights (every process
    predicts; the gathered probabilities are the same everywhere), set it in the model's config and the
    trainer's metrics; returns the run record's "decision_threshold" entry."""
    record: dict[str, Any]
    if trainer.eval_dataset is None:
        record = {"value": training_threshold(trainer.args),  # the recipe's number, else the default 0.5
                  "kind": "default" if mode in (TUNE, TUNE_PER_CLASS) else "fixed",
                  "split": None, "note": "no validation split: nothing to tune on"}  # fmt: skip
    else:
        output = trainer.predict(trainer.eval_dataset, metric_key_prefix="threshold")
        logits, labels = eval_arrays(output)
        labels = np.rint(np.asarray(labels, dtype=np.float64)).astype(np.int64)
        probabilities = sigmoid(np.asarray(logits, dtype=np.float64))
        value, kind = _choose(labels, probabilities, mode)
        record = {
            "value": value, "kind": kind, "split": "validation", "images": int(len(labels)),
            "metrics": multilabel_metrics(labels, probabilities, value),
            "metrics_at_default": multilabel_metrics(labels, probabilities, DEFAULT_THRESHOLD),
        }  # fmt: skip
        logger.info(
            "Decision threshold (%s) on %d validation images: %s; micro-F1 %.4f (%.4f at %.2f).",
            kind, len(labels), np.round(value, 3).tolist(), record["metrics"]["f1_micro"],
            record["metrics_at_default"]["f1_micro"], DEFAULT_THRESHOLD,
        )  # fmt: skip
    setattr(trainer.model.config, THRESHOLD_ATTRIBUTE, record["value"])
    trainer.compute_metrics = build_multilabel_compute_metrics(record["value"])
    return record


__all__ = ["check_task_options", "train_pos_weight", "training_threshold", "tune_decision_threshold"]
