"""Classification metrics as a local `evaluate` module that ships inside vit_ft and loads offline by path.

`evaluate.load("accuracy")` fetches its module from the Hub; ours lives in
`vit_ft/metrics/classification/classification.py` (package data, see pyproject) and loads from there, so
evaluation works without a network. It computes accuracy, top-k accuracy, macro-F1 and balanced accuracy
(mean per-class recall) together from the logits.
"""

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

METRIC_PATH = Path(__file__).resolve().parent / "classification" / "classification.py"
# Keys of the dict that build_compute_metrics' function returns (Trainer logs them as eval_<key>).
METRIC_NAMES = ("accuracy", "top5_accuracy", "f1", "balanced_accuracy")


def base_metric(metric: str | None) -> str:
    """A metric_for_best_model name without its eval_ / ema_ prefixes ("eval_ema_mAP" -> "mAP"; None -> "")."""
    return (metric or "").removeprefix("eval_").removeprefix("ema_")


def load_metric(**kwargs: Any):
    """Load the packaged metric module with `evaluate.load` from its file, without touching the network.

    By default the module keeps its inputs in memory under a fresh experiment_id: no cache files and no file
    locks, so every process of a multi-process run can load and compute it independently. That fits Trainer,
    whose compute_metrics sees predictions already gathered from all processes. Pass evaluate's own
    process_id/num_process (and keep_in_memory=False) to have evaluate gather per-process inputs instead.
    """
    import evaluate  # deferred: importing evaluate pulls in datasets, which the argument parsing does not need

    kwargs.setdefault("experiment_id", uuid.uuid4().hex)
    if kwargs.get("num_process", 1) == 1:
        kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(METRIC_PATH), **kwargs)


def eval_arrays(eval_pred: Any) -> tuple[Any, Any]:
    """(logits, labels) of an EvalPrediction or a (predictions, label_ids) pair, the first array where a model
    returned several (hidden states, attentions); a batch without labels is an error that says what to keep."""
    if hasattr(eval_pred, "predictions"):
        logits, labels = eval_pred.predictions, eval_pred.label_ids
    else:
        logits, labels = eval_pred
    if isinstance(logits, (tuple, list)):  # models that also return hidden states or attentions
        logits = logits[0]
    if isinstance(labels, (tuple, list)):
        labels = labels[0]
    if labels is None:
        raise ValueError(
            "compute_metrics got no labels: Trainer found no label column. Keep label_names=['labels'] in the "
            "TrainingArguments (vit_ft.arguments.recipes sets it) and a 'labels' key in each batch."
        )
    return logits, labels


def _logits_and_labels(eval_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split an EvalPrediction (or a (predictions, label_ids) pair) into (num_examples, num_classes) logits and labels."""
    logits, labels = eval_arrays(eval_pred)
    logits = np.asarray(logits, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if logits.ndim != 2 or len(logits) != len(labels):
        raise ValueError(f"Expected logits of shape ({len(labels)}, num_classes); got {logits.shape}.")
    return logits, labels


def build_compute_metrics(top_k: int = 5) -> Callable[[Any], dict[str, float]]:
    """Return a Trainer `compute_metrics`: EvalPrediction -> {"accuracy", "top5_accuracy", "f1" (macro-F1),
    "balanced_accuracy" (mean per-class recall)}.

    The metric module is loaded once, here, not at every evaluation. With top_k != 5 the key is
    f"top{top_k}_accuracy"; with fewer than top_k classes it is 1.0 by definition.
    """
    metric = load_metric()

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        logits, labels = _logits_and_labels(eval_pred)
        return metric.compute(predictions=logits, references=labels, k=top_k)

    return compute_metrics


__all__ = ["METRIC_NAMES", "METRIC_PATH", "base_metric", "build_compute_metrics", "eval_arrays", "load_metric"]
