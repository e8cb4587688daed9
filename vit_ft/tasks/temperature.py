"""The fine-tune's last measurement: a temperature for its probabilities, fitted on the validation split.

Guo et al. 2017 (arXiv 1706.04599): dividing the logits by one scalar T fitted on held-out data by the
negative log-likelihood calibrates a network's confidence without changing a single prediction. The fine-tune
records T in its run record (`utils.run_record.CALIBRATION_KEY`); `tools.trained.Trained.temperature` reads it
back, so predict, evaluate, inspect and the demo all report calibrated probabilities.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..metrics.calibration import (
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    softmax_with_temperature,
)
from ..utils.distributed import broadcast_object

logger = logging.getLogger("vit_ft")

MIN_CALIBRATION_IMAGES = (
    20  # below this one scalar fitted on the split says more about the split than the model
)


def calibration_record(logits: np.ndarray, labels: np.ndarray, split: str = "validation") -> dict[str, Any]:
    """Fit the temperature on `(n, num_classes)` logits and `(n,)` labels; what the run record keeps:
    {"temperature", "split", "images", "nll": [before, after], "ece": [before, after]}. With fewer than
    MIN_CALIBRATION_IMAGES images the temperature stays 1.0 (and the record says why)."""
    logits = np.asarray(logits, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    enough = len(labels) >= MIN_CALIBRATION_IMAGES
    temperature = fit_temperature(logits, labels) if enough else 1.0
    record: dict[str, Any] = {"temperature": temperature, "split": split, "images": int(len(labels))}
    if len(labels):
        record["nll"] = [negative_log_likelihood(logits, labels, t) for t in (1.0, temperature)]
        record["ece"] = [
            expected_calibration_error(softmax_with_temperature(logits, t), labels)
            for t in (1.0, temperature)
        ]
    if not enough:
        record["note"] = f"not fitted: fewer than {MIN_CALIBRATION_IMAGES} {split} images"
    return record


def fit_and_record_temperature(trainer: Any, eval_dataset: Any, split: str = "validation") -> dict[str, Any]:
    """Predict `eval_dataset` (the validation split) with the trainer's final model and fit the calibration
    temperature on it; returns `calibration_record`'s dict for the run record's "calibration" key.

    Every process must call it: each predicts its shard and Trainer.predict gathers the logits over processes;
    process zero alone fits the temperature (one answer, not one copy per process) and broadcasts the record.
    """
    output = trainer.predict(eval_dataset, metric_key_prefix="calibration")
    if not trainer.is_world_process_zero():
        return broadcast_object(None)  # process zero's record
    logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    labels = output.label_ids[0] if isinstance(output.label_ids, tuple) else output.label_ids
    record = broadcast_object(calibration_record(logits, labels, split))
    if "nll" in record:
        logger.info(
            "Calibration on %d %s images: temperature %.3f (NLL %.4f -> %.4f, ECE %.4f -> %.4f).",
            record["images"],
            split,
            record["temperature"],
            *record["nll"],
            *record["ece"],
        )
    return record


__all__ = ["MIN_CALIBRATION_IMAGES", "calibration_record", "fit_and_record_temperature"]
