"""The batch collator: transformed examples -> the model's batch, `pixel_values` stacked (or NaFlex's padded,
masked patches: `naflex.collate_patches`) and `labels` as class ids or multi-hot rows."""

from __future__ import annotations

from typing import Any

import torch

from .naflex import collate_patches

__all__ = ["collate_fn", "label_value"]


def label_value(label: Any) -> int | list[float]:
    """A class id, or a multi-label example's multi-hot vector as floats (BCE-with-logits targets)."""
    return [float(value) for value in label] if isinstance(label, (list, tuple)) else int(label)


def collate_fn(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Transformed examples -> {"pixel_values": (batch, channels, height, width), "labels": (batch,) long, or
    (batch, num_labels) float32 multi-hot for multi-label examples}.

    `labels` is left out when the examples have none (prediction on unlabelled images). NaFlex examples (with
    `spatial_shapes`) give the padded batch instead of the pixels (`vit_ft.data.naflex.collate_patches`).
    """
    if "spatial_shapes" in examples[0]:
        pixels = [example["pixel_values"] for example in examples]
        batch = collate_patches(pixels, [example["spatial_shapes"] for example in examples])
    else:
        batch = {"pixel_values": torch.stack([example["pixel_values"] for example in examples])}
    if "labels" in examples[0]:
        # class ids give a long tensor, multi-hot float vectors a float32 one (torch's default dtype)
        batch["labels"] = torch.tensor([label_value(example["labels"]) for example in examples])
    return batch
