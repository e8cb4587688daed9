"""Multi-label classification metrics (numpy only): average precision per class and its macro mean (mAP),
micro and macro F1 at a decision threshold, the exact-match ratio, and decision thresholds tuned on the
validation split.

Inputs are `labels` (num_images, num_labels) multi-hot 0/1 and `scores` (num_images, num_labels), the
sigmoid probabilities of the logits (AP only needs their order, F1 and exact match need probabilities).

    metrics = multilabel_metrics(val_labels, val_probs, threshold=0.5)   # {"mAP", "f1_micro", ...}
    global_t = tune_global_threshold(val_labels, val_probs)             # one float in (0, 1)
    per_class = tune_class_thresholds(val_labels, val_probs, default=global_t)   # (num_labels,)
    compute_metrics = build_multilabel_compute_metrics(threshold=global_t)       # for Trainer

Conventions, each equal to scikit-learn's where it has one (the tests compare):
- AP per class is `sklearn.metrics.average_precision_score` (step-wise, tied scores grouped). A class without
  a positive image has no AP (NaN here; scikit-learn would say 0.0 with a warning) and is left out of mAP,
  as in the PASCAL VOC and COCO multi-label protocols: mAP is the mean over the classes that have positives.
- An image is predicted positive for a class when its probability is >= the class's threshold.
- F1 is `f1_score(average="micro" | "macro", zero_division=0)`: macro F1 averages every class, a class with
  no positive and no predicted image counting 0, as scikit-learn does.
- exact match is `accuracy_score` on multi-label input (subset accuracy): all labels of an image right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Keys of the dict that build_multilabel_compute_metrics' function returns (Trainer logs them as eval_<key>);
# "mAP" is the default metric_for_best_model of a multi-label fine-tune.
MULTILABEL_METRIC_NAMES = ("mAP", "f1_micro", "f1_macro", "exact_match")
# a tuned threshold is kept this far inside (0, 1), so that it stays a valid threshold for every tool
_THRESHOLD_MARGIN = 1e-6
# transformers' problem_type values: a multi-label model (BCE-with-logits; its pipeline applies a sigmoid) and
# a single-label one (cross-entropy, softmax)
MULTI_LABEL = "multi_label_classification"
SINGLE_LABEL = "single_label_classification"
PROBLEM_TYPES = (SINGLE_LABEL, MULTI_LABEL)
# the config attribute holding the decision threshold a multi-label fine-tune tuned on validation (saved in
# config.json, so it travels with the model to every tool, the Hub and the exports)
THRESHOLD_ATTRIBUTE = "decision_threshold"
DEFAULT_THRESHOLD = 0.5

Threshold = float | Sequence[float] | np.ndarray


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Elementwise logistic function in float64, without overflow for large |logits|."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(logits, dtype=np.float64)))


def _as_arrays(labels: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """(num_images, num_labels) 0/1 int labels and float64 scores, or a ValueError naming the mismatch."""
    labels = np.asarray(labels)
    scores = np.asarray(scores, dtype=np.float64)
    if labels.ndim != 2 or labels.shape != scores.shape:
        raise ValueError(
            f"multi-label metrics need labels and scores of one shape (num_images, num_labels); got labels "
            f"{labels.shape} and scores {scores.shape}."
        )
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("multi-label labels must be multi-hot 0/1 vectors; found other values.")
    return labels.astype(np.int64), scores


def check_threshold(threshold: Threshold, num_labels: int, argument: str = "threshold") -> np.ndarray:
    """The decision threshold as a (num_labels,) float64 array: one float for every class, or one per class.
    A value outside (0, 1) or a per-class list of another length is a ValueError naming it."""
    values = np.asarray(threshold, dtype=np.float64)
    if values.ndim > 1 or (values.ndim == 1 and len(values) != num_labels):
        raise ValueError(
            f"{argument} has {values.size} values for {num_labels} labels; pass one number in (0, 1) or one "
            "per label."
        )
    bad = values[~((values > 0) & (values < 1))]  # also catches NaN
    if bad.size:
        raise ValueError(
            f"{argument}={float(bad.flat[0])!r} is outside (0, 1); a decision threshold is a probability "
            "strictly between 0 and 1, e.g. 0.5."
        )
    return np.broadcast_to(values, (num_labels,)).copy()


def is_multi_label(config: Any) -> bool:
    """Whether a model config (ours or transformers') is a multi-label classifier (`problem_type`)."""
    return getattr(config, "problem_type", None) == MULTI_LABEL


def decision_threshold_of(config: Any) -> np.ndarray:
    """The (num_labels,) decision threshold a multi-label model's config holds (`THRESHOLD_ATTRIBUTE`: one
    float or one per label, tuned on validation by the fine-tune), `DEFAULT_THRESHOLD` when it holds none."""
    value = getattr(config, THRESHOLD_ATTRIBUTE, None)
    return check_threshold(
        DEFAULT_THRESHOLD if value is None else value, config.num_labels, THRESHOLD_ATTRIBUTE
    )


def average_precision_per_class(labels: Any, scores: Any) -> np.ndarray:
    """(num_labels,) average precision of each class, as scikit-learn's `average_precision_score`
    (sum over distinct score thresholds of (R_n - R_{n-1}) * P_n); NaN for a class without positives."""
    labels, scores = _as_arrays(labels, scores)
    result = np.full(labels.shape[1], np.nan)
    for j in range(labels.shape[1]):
        positives = labels[:, j].sum()
        if positives == 0:
            continue
        order = np.argsort(-scores[:, j], kind="stable")
        sorted_scores, hits = scores[order, j], labels[order, j]
        # the last index of each run of tied scores: a threshold takes all tied images at once
        ends = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]
        true_pos = np.cumsum(hits)[ends]
        precision = true_pos / (ends + 1)
        recall_gain = np.diff(np.r_[0, true_pos]) / positives
        result[j] = float((recall_gain * precision).sum())
    return result


def mean_average_precision(labels: Any, scores: Any) -> float:
    """Macro mAP: the mean AP over the classes that have at least one positive image (NaN if none has)."""
    per_class = average_precision_per_class(labels, scores)
    return float(np.nanmean(per_class)) if not np.isnan(per_class).all() else float("nan")


def _confusion(labels: np.ndarray, scores: np.ndarray, threshold: Threshold) -> tuple[np.ndarray, ...]:
    """Per-class (true positives, false positives, false negatives, predicted 0/1 matrix)."""
    predicted = (scores >= check_threshold(threshold, labels.shape[1])).astype(np.int64)
    true_pos = (predicted * labels).sum(0)
    false_pos = (predicted * (1 - labels)).sum(0)
    false_neg = ((1 - predicted) * labels).sum(0)
    return true_pos, false_pos, false_neg, predicted


def _f1(true_pos: np.ndarray, false_pos: np.ndarray, false_neg: np.ndarray) -> np.ndarray:
    """2TP / (2TP + FP + FN), 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    denominator = 2 * true_pos + false_pos + false_neg
    return np.divide(2.0 * true_pos, denominator, out=np.zeros(np.shape(true_pos)), where=denominator > 0)


def per_class_metrics(labels: Any, scores: Any, threshold: Threshold = 0.5) -> dict[str, np.ndarray]:
    """Per class, (num_labels,) arrays: "ap" (NaN without positives), "precision", "recall", "f1" (0 where
    undefined), "support" (positive images), "predicted" (images predicted positive), "threshold"."""
    labels, scores = _as_arrays(labels, scores)
    true_pos, false_pos, false_neg, _ = _confusion(labels, scores, threshold)
    predicted, support = true_pos + false_pos, true_pos + false_neg
    return {
        "ap": average_precision_per_class(labels, scores),
        "precision": np.divide(true_pos, predicted, out=np.zeros(len(support)), where=predicted > 0),
        "recall": np.divide(true_pos, support, out=np.zeros(len(support)), where=support > 0),
        "f1": _f1(true_pos, false_pos, false_neg),
        "support": support,
        "predicted": predicted,
        "threshold": check_threshold(threshold, labels.shape[1]),
    }


def multilabel_metrics(labels: Any, scores: Any, threshold: Threshold = 0.5) -> dict[str, float]:
    """{"mAP", "f1_micro", "f1_macro", "exact_match"} of probabilities `scores` against multi-hot `labels`,
    predicting positive at probability >= `threshold` (one float, or one per class)."""
    labels, scores = _as_arrays(labels, scores)
    true_pos, false_pos, false_neg, predicted = _confusion(labels, scores, threshold)
    micro = _f1(true_pos.sum(), false_pos.sum(), false_neg.sum())
    return {
        "mAP": mean_average_precision(labels, scores),
        "f1_micro": float(micro),
        "f1_macro": float(_f1(true_pos, false_pos, false_neg).mean()),
        "exact_match": float((predicted == labels).all(axis=1).mean()),
    }


def _best_f1_threshold(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """The threshold in (0, 1) with the highest F1 for flat 0/1 `labels` and probabilities `scores`, from the
    sorted scores: a cut between two distinct scores, put half-way between them (the widest margin on both
    sides). None when there is no positive (F1 is 0 at every threshold). Ties keep the highest threshold."""
    positives = labels.sum()
    if positives == 0:
        return None
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    ends = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]
    f1 = 2.0 * np.cumsum(labels[order])[ends] / (ends + 1 + positives)  # predict the top ends+1 positive
    best = int(np.argmax(f1))
    lowest_taken = sorted_scores[ends[best]]
    highest_left = sorted_scores[ends[best] + 1] if best + 1 < len(ends) else 0.0
    threshold = (lowest_taken + highest_left) / 2.0
    return float(np.clip(threshold, _THRESHOLD_MARGIN, 1.0 - _THRESHOLD_MARGIN))


def tune_global_threshold(labels: Any, scores: Any, default: float = 0.5) -> float:
    """One threshold in (0, 1) for every class that maximises micro F1 on (validation) `labels` / `scores`;
    `default` when no image has any label. Tune on validation only: the test split never chooses it."""
    labels, scores = _as_arrays(labels, scores)
    best = _best_f1_threshold(labels.reshape(-1), scores.reshape(-1))
    return check_threshold(default if best is None else best, 1, "default").item()


def tune_class_thresholds(labels: Any, scores: Any, default: float = 0.5) -> np.ndarray:
    """(num_labels,) thresholds in (0, 1), each maximising its class's F1 (so together macro F1) on
    (validation) `labels` / `scores`; a class without a positive image keeps `default` (e.g. the tuned
    global threshold), since no threshold is better than another for it."""
    labels, scores = _as_arrays(labels, scores)
    default = check_threshold(default, 1, "default").item()
    tuned = [_best_f1_threshold(labels[:, j], scores[:, j]) for j in range(labels.shape[1])]
    return np.array([default if value is None else value for value in tuned])


def _multilabel_logits_and_labels(eval_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split an EvalPrediction (or a (predictions, label_ids) pair) into (num_images, num_labels) logits and
    multi-hot labels."""
    from . import eval_arrays  # the package's reader of an EvalPrediction

    logits, labels = eval_arrays(eval_pred)
    return np.asarray(logits, dtype=np.float64), np.rint(np.asarray(labels, dtype=np.float64))


def build_multilabel_compute_metrics(threshold: Threshold = 0.5) -> Callable[[Any], dict[str, float]]:
    """Return a Trainer `compute_metrics`: EvalPrediction of logits (num_images, num_labels) and multi-hot
    labels -> {"mAP", "f1_micro", "f1_macro", "exact_match"} on the sigmoid of the logits. `threshold` (one
    float or one per class, in (0, 1)) is checked here, before any training."""
    if np.ndim(threshold) == 0:
        check_threshold(threshold, 1)

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        logits, labels = _multilabel_logits_and_labels(eval_pred)
        return multilabel_metrics(labels, sigmoid(logits), threshold)

    return compute_metrics


__all__ = [
    "DEFAULT_THRESHOLD",
    "MULTILABEL_METRIC_NAMES",
    "MULTI_LABEL",
    "PROBLEM_TYPES",
    "SINGLE_LABEL",
    "THRESHOLD_ATTRIBUTE",
    "average_precision_per_class",
    "build_multilabel_compute_metrics",
    "check_threshold",
    "decision_threshold_of",
    "is_multi_label",
    "mean_average_precision",
    "multilabel_metrics",
    "per_class_metrics",
    "sigmoid",
    "tune_class_thresholds",
    "tune_global_threshold",
]
