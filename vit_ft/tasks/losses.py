"""The fine-tune's classification loss, for the Trainer's `compute_loss_func`: hard labels or soft targets, class
weights and label smoothing in one cross-entropy.

Hard labels `(batch,)` give exactly `torch.nn.functional.cross_entropy(logits, labels, weight=, label_smoothing=)`
(with weights, the mean divides by the summed weights of the labels). Soft targets `(batch, num_classes)`, which
mixup / cutmix make, give torch's probability-target cross-entropy, the mean over the batch of
`-sum_c weight_c * target_c * log_softmax(logits)_c`: without weights exactly timm's `SoftTargetCrossEntropy`.
Label smoothing is then already folded into the targets (timm's `Mixup(label_smoothing=)`), so it is not
applied again. The Trainer's own `label_smoothing_factor` must be 0 when this loss is used (`vit_ft.training.trainer`
moves it here), or the smoothing would apply twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..utils.option_values import BALANCED


class ClassificationLoss:
    """`(model outputs, labels or soft targets) -> scalar loss`, with the Trainer's compute_loss_func signature.

    The loss is a per-batch mean; the Trainer scales it for gradient accumulation itself
    (`FineTuneTrainer.loss_is_scaled_for_ga = False`), as for the model's own loss, so `num_items_in_batch` is
    accepted and not used.
    """

    def __init__(self, class_weights: torch.Tensor | None = None, label_smoothing: float = 0.0) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1).")
        self.class_weights = class_weights
        self.label_smoothing = label_smoothing

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        # (batch, num_classes), in float32 under bf16 autocast too, as the model's own loss
        logits = logits.float()
        weight = None if self.class_weights is None else self.class_weights.to(logits.device)
        if labels.is_floating_point():  # soft targets (batch, num_classes): smoothing is already in them
            return F.cross_entropy(logits, labels.to(logits.dtype), weight=weight)
        return F.cross_entropy(logits, labels, weight=weight, label_smoothing=self.label_smoothing)


class MultiLabelLoss:
    """Multi-label `(model outputs, multi-hot float labels (batch, num_labels)) -> scalar loss`: exactly
    `F.binary_cross_entropy_with_logits(logits, labels, pos_weight=)`, the mean over images and labels, as the
    model's own multi-label loss (transformers' BCEWithLogitsLoss) with per-label positive weights added."""

    def __init__(self, pos_weight: torch.Tensor | None = None) -> None:
        self.pos_weight = pos_weight

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        logits = (outputs["logits"] if isinstance(outputs, dict) else outputs[0]).float()
        weight = None if self.pos_weight is None else self.pos_weight.to(logits.device)
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), pos_weight=weight)


def balanced_class_weights(labels: Sequence[int], num_classes: int) -> np.ndarray:
    """scikit-learn's `compute_class_weight("balanced")`: n_samples / (n_classes * count) per class.

    A class with no training example gets weight 1 (it never appears in the loss's hard labels anyway).
    """
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes).astype(np.float64)
    present = counts > 0
    weights = np.ones(num_classes)
    weights[present] = len(labels) / (present.sum() * counts[present])
    return weights


def class_weight_vector(
    spec: str | dict[str, float], names: Sequence[str], labels: Sequence[int]
) -> torch.Tensor:
    """The `(num_classes,)` float32 weights of a recipe's `class_weights` for these class names and train labels.

    A label->weight mapping names classes by their name (a folder name, or a Hub dataset's label name); classes
    it leaves out weigh 1. A name that is not a class is a ValueError listing the classes.
    """
    if spec == BALANCED:
        return torch.tensor(balanced_class_weights(labels, len(names)), dtype=torch.float32)
    index = {str(name): i for i, name in enumerate(names)}
    unknown = [label for label in spec if label not in index]
    if unknown:
        shown = ", ".join(list(index)[:20]) + (" ..." if len(index) > 20 else "")
        raise ValueError(
            f"class_weights names {unknown} which are not classes of the training data; its classes are: {shown}."
        )
    weights = torch.ones(len(names), dtype=torch.float32)
    for label, weight in spec.items():
        weights[index[label]] = weight
    return weights


__all__ = [
    "BALANCED",
    "ClassificationLoss",
    "MultiLabelLoss",
    "balanced_class_weights",
    "class_weight_vector",
]
