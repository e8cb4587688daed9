"""Frozen pre-logit features for few-shot evaluation: the pooled token a classification head would see (CLS
after the final LayerNorm, or the patch-token mean for `pooling: mean`: `tasks.feature_bank.pre_logits`, the
feature bank's too), through the one inference loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...data.images import describe_source
from ...tasks.feature_bank import pre_logits  # the one definition of the features (the feature bank's too)
from ..inference import describe_error, iter_batches
from ..trained import Trained


def extract_features(
    classifier: Trained,
    images: Sequence[Any],
    batch_size: int = 64,
    num_workers: int = 0,
    bf16: bool = False,
    desc: str = "Features",
    progress: bool | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """Frozen pre-logit features of `images` through the one inference loop (`iter_batches`):
    `(num_images, hidden)` float32 (zero rows for images that do not decode) and {index: why} for those."""
    device = classifier.device

    @torch.inference_mode()
    def forward(pixels: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return pre_logits(classifier.model, pixels.to(device)).float().cpu()

    features: np.ndarray | None = None
    errors: dict[int, str] = {}
    for batch in iter_batches(classifier, images, batch_size, num_workers, desc, progress, forward):
        for offset, error in batch.errors.items():
            errors[batch.start + offset] = describe_error(error)
        if batch.outputs is None:
            continue
        if features is None:
            features = np.zeros((len(images), batch.outputs.shape[1]), dtype=np.float32)
        features[[batch.start + i for i in batch.decoded]] = batch.outputs.numpy()
    if features is None:
        raise ValueError(f"None of the {len(images)} images decodes, e.g. {describe_source(images[0])}.")
    return features, errors


__all__ = ["extract_features", "pre_logits"]
