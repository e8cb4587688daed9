"""The option values that the fine-tune's arguments parse and the tasks act on: `balanced` (class_weights,
pos_weight), `tune` / `tune_per_class` (decision_threshold) and the feature bank's default size.

They live here, below both layers and free of torch, datasets and transformers, so that the argument dataclasses
(and `--print_plan`, which builds them) name them without importing the tasks package, which imports datasets,
pandas and matplotlib.
"""

from __future__ import annotations

BALANCED = "balanced"  # class_weights / pos_weight: from the training split's label counts
TUNE, TUNE_PER_CLASS = "tune", "tune_per_class"  # decision_threshold: tuned on validation after training
BANK_MAX_IMAGES = 20_000  # 20k x 768 float32 x 2 spaces = 123 MB: a kNN over it is one matrix product per batch

__all__ = ["BALANCED", "BANK_MAX_IMAGES", "TUNE", "TUNE_PER_CLASS"]
