"""Classification metrics as `evaluate` modules that ship inside vit_ft and load offline by path.

`evaluate.load("accuracy")` fetches its module from the Hub; ours live in `vit_ft/metrics/<name>/<name>.py`
(package data, see pyproject) and load from there, so evaluation works without a network.
"""

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

METRICS_DIR = Path(__file__).resolve().parent
METRIC_MODULES = ("accuracy", "top_k_accuracy", "f1")
# Keys of the dict that build_compute_metrics' function returns (Trainer logs them as eval_<key>).
METRIC_NAMES = ("accuracy", "top5_accuracy", "f1")


def metric_path(name: str) -> Path:
    """Path of the module file of the packaged metric `name` (one of METRIC_MODULES)."""
    path = METRICS_DIR / name / f"{name}.py"
    if name not in METRIC_MODULES or not path.is_file():
        raise ValueError(f"Unknown metric {name!r}; vit_ft ships: {', '.join(METRIC_MODULES)}.")
    return path


def load_metric(name: str, **kwargs: Any):
    """Load the packaged metric `name` with `evaluate.load` from its file, without touching the network.

    By default the module keeps its inputs in memory under a fresh experiment_id: no cache files and no file
    locks, so every process of a multi-process run can load and compute it independently. That fits Trainer,
    whose compute_metrics sees predictions already gathered from all processes. Pass evaluate's own
    process_id/num_process (and keep_in_memory=False) to have evaluate gather per-process inputs instead.
    """
    import evaluate  # deferred: importing evaluate pulls in datasets, which the argument parsing does not need

    kwargs.setdefault("experiment_id", uuid.uuid4().hex)
    if kwargs.get("num_process", 1) == 1:
        kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(metric_path(name)), **kwargs)


def _logits_and_labels(eval_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split an EvalPrediction (or a (predictions, label_ids) pair) into (num_examples, num_classes) logits and labels."""
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
            "TrainingArguments (vit_ft.recipes sets it) and a 'labels' key in each batch."
        )
    logits = np.asarray(logits, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if logits.ndim != 2 or len(logits) != len(labels):
        raise ValueError(f"Expected logits of shape ({len(labels)}, num_classes); got {logits.shape}.")
    return logits, labels


def build_compute_metrics(top_k: int = 5) -> Callable[[Any], dict[str, float]]:
    """Return a Trainer `compute_metrics`: EvalPrediction -> {"accuracy", "top5_accuracy", "f1"} (macro-F1).

    The metric modules are loaded once, here, not at every evaluation. With top_k != 5 the key is
    f"top{top_k}_accuracy"; with fewer than top_k classes it is 1.0 by definition.
    """
    accuracy = load_metric("accuracy")
    top_k_accuracy = load_metric("top_k_accuracy")
    f1 = load_metric("f1")

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        logits, labels = _logits_and_labels(eval_pred)
        predictions = logits.argmax(axis=-1)  # (num_examples,)
        return {
            "accuracy": accuracy.compute(predictions=predictions, references=labels)["accuracy"],
            f"top{top_k}_accuracy": top_k_accuracy.compute(predictions=logits, references=labels, k=top_k)[
                "top_k_accuracy"
            ],
            "f1": f1.compute(predictions=predictions, references=labels, average="macro")["f1"],
        }

    return compute_metrics


__all__ = [
    "METRICS_DIR",
    "METRIC_MODULES",
    "METRIC_NAMES",
    "build_compute_metrics",
    "load_metric",
    "metric_path",
]
