"""The fine-tune's last measurement: a temperature for its probabilities, fitted on the validation split.

Guo et al. 2017 (arXiv 1706.04599): dividing the logits by one scalar T fitted on held-out data by the
negative log-likelihood calibrates a network's confidence without changing a single prediction. The fine-tune
records T in its run record (`utils.run_record.CALIBRATION_KEY`); `tools.trained.Trained.temperature` reads it
back, so predict, evaluate, inspect and the demo all report calibrated probabilities.

The exports that leave our tools (the transformers-format push, ONNX) carry T inside the model instead:
`fold_temperature` divides the classifier head's weights and bias by T, so `softmax(folded logits)` is the
calibrated softmax and `pipeline()` or onnxruntime give it as they are. The folded config records T under
`FOLDED_TEMPERATURE_ATTRIBUTE`, and a task built from such a config has temperature 1: nothing divides twice.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import numpy as np
import torch

from ..metrics.calibration import (
    FOLDED_TEMPERATURE_ATTRIBUTE,
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

UNSURE_BELOW = 0.5  # a calibrated top-1 probability below this is reported as unsure (the demo, the card)
# the heads whose outputs are the logits (DeiT's distillation head is averaged with the class head: both divided)
HEAD_NAMES = ("classifier", "distillation_classifier")


def folded_temperature_of(config: Any) -> float | None:
    """The temperature already folded into the head of the model `config` describes (None: none folded)."""
    value = getattr(config, FOLDED_TEMPERATURE_ATTRIBUTE, None)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _linear_head(model: torch.nn.Module, name: str) -> torch.nn.Linear | None:
    """The linear layer of head `name`: the head itself, or a zero-shot head's `logits` (after its normalisation)."""
    head = getattr(model, name, None)
    head = getattr(head, "logits", head)
    return head if isinstance(head, torch.nn.Linear) else None


def fold_temperature(model: torch.nn.Module, task: Any) -> torch.nn.Module:
    """`model` with the `task`'s calibration temperature T folded into its classifier head: a copy whose head
    weights and biases (`classifier`, and DeiT's `distillation_classifier`) are divided by T, so its logits are
    the calibrated `logits / T`, and whose config records T (`FOLDED_TEMPERATURE_ATTRIBUTE`). Merge a LoRA
    adapter first (the head the adapter trains must be in the weights). `model` itself is returned unchanged
    where there is nothing to fold: a multi-label task (sigmoid probabilities are never divided), or T = 1."""
    temperature = float(getattr(task, "temperature", 1.0))
    if not getattr(task, "fits_temperature", False) or temperature == 1.0:
        return model
    if hasattr(model, "get_base_model"):
        raise ValueError("fold the temperature into a merged model: merge the LoRA adapter first (merge_lora).")
    heads = [head for head in map(lambda name: _linear_head(model, name), HEAD_NAMES) if head is not None]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no linear classifier head to fold a temperature into.")
    folded = copy.deepcopy(model)
    with torch.no_grad():
        for name in HEAD_NAMES:
            head = _linear_head(folded, name)
            if head is not None:
                head.weight.div_(temperature)
                if head.bias is not None:
                    head.bias.div_(temperature)
    setattr(folded.config, FOLDED_TEMPERATURE_ATTRIBUTE, temperature)
    return folded


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
    if trainer.is_world_process_zero():
        logger.info("Calibration: predicting the %d %s images, a temperature fitted on their logits.",
                    len(eval_dataset), split)  # fmt: skip
    output = trainer.predict(eval_dataset, metric_key_prefix="calibration")
    if not trainer.is_world_process_zero():
        return broadcast_object(None)  # process zero's record
    logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    labels = output.label_ids[0] if isinstance(output.label_ids, tuple) else output.label_ids
    return broadcast_object(temperature_of_logits(logits, labels, split))


def temperature_of_logits(logits: np.ndarray, labels: np.ndarray, split: str = "validation") -> dict[str, Any]:
    """`calibration_record` of `(n, num_classes)` logits and `(n,)` labels a pass already gave (the validation
    pass the feature bank's threshold shares: `training.outputs`), said in one line."""
    record = calibration_record(logits, labels, split)
    if "nll" in record:
        logger.info("Calibration on %d %s images: temperature %.3f (NLL %.4f -> %.4f, ECE %.4f -> %.4f).",
                    record["images"], split, record["temperature"], *record["nll"], *record["ece"])  # fmt: skip
    return record


__all__ = [
    "HEAD_NAMES",
    "MIN_CALIBRATION_IMAGES",
    "UNSURE_BELOW",
    "calibration_record",
    "fit_and_record_temperature",
    "fold_temperature",
    "folded_temperature_of",
    "temperature_of_logits",
]
