"""The multi-label task's training side (`tasks.multi_label.MultiLabel` calls it): the recipe checks, the BCE
positive weights and the decision threshold tuned on validation after training.

- `check_multi_label_options`: single-label-only options (mixup / cutmix, class weights, the balanced sampler,
  label smoothing) are one-line errors for multi-label data, and a single-label `metric_for_best_model` (the
  recipes' default `accuracy`) becomes `mAP`, the multi-label default.
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
from ..metrics import METRIC_NAMES, base_metric, eval_arrays
from ..metrics.multilabel import (
    DEFAULT_THRESHOLD,
    THRESHOLD_ATTRIBUTE,
    build_multilabel_compute_metrics,
    multilabel_metrics,
    sigmoid,
    tune_class_thresholds,
    tune_global_threshold,
)
from ..utils.option_values import BALANCED, TUNE, TUNE_PER_CLASS

logger = logging.getLogger("vit_ft")

_SINGLE_LABEL_ONLY = {
    "mixup_alpha / cutmix_alpha": "mixes one class per image",
    "class_weights": "weighs the classes of a softmax; use pos_weight: balanced for multi-label",
    "balanced_sampler": "draws one class per image; use pos_weight: balanced for multi-label",
    "label_smoothing_factor": "smooths a softmax's one-hot targets; set it to 0",
}


def check_multi_label_options(data_args: Any, training_args: Any) -> None:
    """Refuse the single-label options for multi-label data (one-line ValueError, before the model loads); a
    run watching a single-label metric is switched to mAP, and says so."""
    used = {
        "mixup_alpha / cutmix_alpha": data_args.mixes_batches,
        "class_weights": training_args.class_weights is not None,
        "balanced_sampler": training_args.balanced_sampler,
        "label_smoothing_factor": training_args.label_smoothing_factor > 0,
    }
    for option, on in used.items():
        if on:
            raise ValueError(
                f"{option} is single-label only ({_SINGLE_LABEL_ONLY[option]}), and this data is multi-label "
                "(several labels or none per image); turn it off in the recipe or with its flag."
            )
    if base_metric(training_args.metric_for_best_model) in METRIC_NAMES:
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


# ---- in the model card (`tasks.card`) ----------------------------------------------------------------

MULTILABEL_TASK = (
    "Each label's probability is the sigmoid of its logit, independent of the others (they do not sum to 1); an "
    "image gets every label whose probability is at or above the decision threshold, so several labels or none."
)


# how the fine-tune chose the threshold (`tune_decision_threshold`'s "kind"), in words
THRESHOLD_KINDS = {
    "global": "tuned on the {split} split{images} for the best micro F1 (the test split never chose it)",
    "per_class": "tuned on the {split} split{images} for each label's best F1 (the test split never chose it)",
    "fixed": "fixed by the recipe",
    "default": "the default: there was no validation split to tune it on",
}


def recorded_threshold(run_info: dict[str, Any]) -> tuple[float | list[float], str]:
    """A multi-label run's decision threshold (one float, or one per label in label id order) and how it was
    chosen, in words: the run record's (`THRESHOLD_ATTRIBUTE`: value, kind, split, images), else the default."""
    record = run_info.get(THRESHOLD_ATTRIBUTE)
    if not isinstance(record, dict) or record.get("value") is None:
        return DEFAULT_THRESHOLD, "the default: none was tuned"
    images = f" ({record['images']:,} images)" if isinstance(record.get("images"), int) else ""
    how = THRESHOLD_KINDS.get(record.get("kind"), "")
    how = how.format(split=record.get("split") or "validation", images=images)
    where = "`decision_threshold` in config.json"
    return record["value"], f"{how}; {where}" if how else where


def threshold_line(run_info: dict[str, Any]) -> str:
    """The card's bullet stating a multi-label model's decision threshold and how it was chosen."""
    value, source = recorded_threshold(run_info)
    if isinstance(value, list):
        return (
            f"- Decision threshold: one per label, from {min(value):.3f} to {max(value):.3f} (in label id order), "
            f"{source}"
        )
    return f"- Decision threshold: {float(value):.3f} for every label, {source}"


REMOTE_CODE = "the model code beside the weights (vit-ft's ViT)"


def multilabel_usage(where: str, model: str, format: str, threshold: Any) -> str:
    """A multi-label model through `pipeline()`: every label's sigmoid score (`top_k=num_labels`), keeping those at or
    above the decision threshold that config.json holds (one for every label, or one per label)."""
    remote = ", trust_remote_code=True" if format == "vit_ft" else ""
    if isinstance(threshold, list):
        keep = (
            "thresholds = classifier.model.config.decision_threshold  # one per label, in label id order\n"
            "label2id = classifier.model.config.label2id\n"
            'labels = [s["label"] for s in scores if s["score"] >= thresholds[label2id[s["label"]]]]\n'
        )
    else:
        keep = (
            f'threshold = getattr(classifier.model.config, "decision_threshold", {DEFAULT_THRESHOLD})'
            "  # one for every label\n"
            'labels = [s["label"] for s in scores if s["score"] >= threshold]\n'
        )
    return (
        "```python\nfrom transformers import pipeline\n\n"
        f'{where}classifier = pipeline("image-classification", model={model}{remote})\n'
        "# every label with its sigmoid probability (top_k=None would mean the pipeline's default, 5)\n"
        'scores = classifier("image.jpg", top_k=classifier.model.config.num_labels)\n'
        f"{keep}```\n\n"
        "config.json says `problem_type: multi_label_classification`, so `pipeline()` applies a sigmoid to each "
        "logit: the scores are independent and do not sum to 1. Keep the labels at or above the decision "
        "threshold (`decision_threshold` in config.json, stated above); an image may have none."
        + (f" `trust_remote_code=True` runs {REMOTE_CODE}." if remote else "")
    )


__all__ = [
    "MULTILABEL_TASK",
    "TUNE",
    "TUNE_PER_CLASS",
    "check_multi_label_options",
    "multilabel_usage",
    "recorded_threshold",
    "threshold_line",
    "train_pos_weight",
    "training_threshold",
    "tune_decision_threshold",
]
