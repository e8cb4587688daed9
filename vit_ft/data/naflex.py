"""NaFlex batches (SigLIP 2): each image resized to its own aspect ratio under a patch budget (the rule of
transformers' `Siglip2ImageProcessor`), patchified as that processor does, and padded with a mask by the collator:
`pixel_values` `(batch, max_num_patches, patch * patch * channels)`, `pixel_attention_mask` `(batch,
max_num_patches)`, `spatial_shapes` `(batch, 2)`, the names `vit_ft.model`'s NaFlex input takes. A transformed
image is `(rows, columns, patch * patch * channels)`, so that its grid goes with it."""

from __future__ import annotations

import math
from typing import Any

import torch
from PIL import Image

from .random_crops import random_resized_crop_box


def image_size_for_max_num_patches(
    height: int, width: int, patch_size: int, max_num_patches: int, eps: float = 1e-5
) -> tuple[int, int]:
    """The (height, width) in pixels, multiples of `patch_size` (at least one patch each), of the largest scale of
    the image with at most `max_num_patches` patches: `Siglip2ImageProcessor`'s binary search, step for step."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while (high - low) >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def resize_to_budget(
    img: Image.Image, patch_size: int, max_num_patches: int, resample: int,
    crop: tuple[tuple[float, float], tuple[float, float]] | None = None, generator: torch.Generator | None = None,
) -> Image.Image:  # fmt: skip
    """`img` resized to its size under the patch budget (`image_size_for_max_num_patches`): whole, or with `crop`
    ((scale, ratio): training) a random box of that scale at an aspect ratio about the image's own (`ratio` times
    it), drawn from `generator` (`random_crops.random_resized_crop_box`)."""
    box = (0.0, 0.0, float(img.width), float(img.height))
    if crop is not None:
        (scale, ratio), aspect = crop, img.width / img.height
        box = random_resized_crop_box(img.width, img.height, scale, (ratio[0] * aspect, ratio[1] * aspect), generator)
    crop_h, crop_w = max(1, round(box[3] - box[1])), max(1, round(box[2] - box[0]))
    height, width = image_size_for_max_num_patches(crop_h, crop_w, patch_size, max_num_patches)
    return img.resize((width, height), resample=resample, box=box)


def to_patches(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """`(channels, height, width)` -> `(rows, columns, patch * patch * channels)`, each patch's pixels row by row
    with the channels last (`Siglip2ImageProcessor`'s `convert_image_to_patches` layout); flattened over (rows,
    columns) it is that processor's output for one image."""
    channels, height, width = pixels.shape
    rows, columns = height // patch_size, width // patch_size
    patches = pixels.reshape(channels, rows, patch_size, columns, patch_size)
    return patches.permute(1, 3, 2, 4, 0).reshape(rows, columns, -1)  # (rows, columns, p * p * C)


def from_patches(grid: torch.Tensor, patch_size: int) -> torch.Tensor:
    """`to_patches`' inverse: `(rows, columns, patch * patch * channels)` -> `(channels, height, width)` (figures)."""
    rows, columns, width = grid.shape
    patches = grid.reshape(rows, columns, patch_size, patch_size, width // (patch_size * patch_size))
    return patches.permute(4, 0, 2, 1, 3).reshape(-1, rows * patch_size, columns * patch_size)


def collate_patches(
    patches: list[torch.Tensor], spatial_shapes: list[Any], length: int | None = None
) -> dict[str, torch.Tensor]:
    """Each image's patches `(rows * columns, patch * patch * channels)` and grid (rows, columns) -> the padded
    NaFlex batch: `pixel_values` `(batch, length, patch * patch * channels)` (zeros in the padding),
    `pixel_attention_mask` (1 on an image's patches) and `spatial_shapes` `(batch, 2)`. `length` defaults to the
    batch's longest image: the padding is masked, so any length gives the same outputs (the processor pads to
    `max_num_patches`)."""
    shapes = torch.as_tensor([[int(v) for v in shape] for shape in spatial_shapes], dtype=torch.long)
    counts = shapes.prod(-1).tolist()
    length = max(counts) if length is None else length
    pixel_values = patches[0].new_zeros(len(patches), length, patches[0].shape[-1])
    mask = torch.zeros(len(patches), length, dtype=torch.int32)
    for i, (image, count) in enumerate(zip(patches, counts, strict=True)):
        pixel_values[i, :count], mask[i, :count] = image.reshape(count, -1), 1
    return {"pixel_values": pixel_values, "pixel_attention_mask": mask, "spatial_shapes": shapes}


def is_naflex_batch(batch: Any) -> bool:
    """A collated NaFlex batch (a mapping with `spatial_shapes`) rather than a `(batch, channels, height, width)`
    tensor."""
    return isinstance(batch, dict) and "spatial_shapes" in batch


def refuse_batch_mixes(max_num_patches: int | None, mixes_batches: bool) -> None:
    """Batch-level mixes (mixup / CutMix) need one pixel grid per batch: a NaFlex budget (`max_num_patches`, a
    flag's or the checkpoint's own) gives each image its own, so the two are refused together in one line."""
    if max_num_patches is not None and mixes_batches:
        raise ValueError(
            f"mixup / cutmix with max_num_patches={max_num_patches} (NaFlex): images of different aspect ratios "
            "cannot be mixed; set mixup_alpha and cutmix_alpha to 0, or fine-tune on square crops (leave "
            "max_num_patches unset for a checkpoint without it)."
        )


def describe_inputs(image_size: int | None, max_num_patches: int | None) -> str:
    """The input a run's settings ask for, in words, before the checkpoint is read: a square resolution (the
    checkpoint's when `image_size` is None), or a NaFlex patch budget (SigLIP 2)."""
    if max_num_patches is not None:
        return f"NaFlex: up to {max_num_patches} patches per image at its own aspect ratio"
    return f"square {image_size}x{image_size} px" if image_size else "square, the checkpoint's resolution"


__all__ = [
    "describe_inputs",
    "refuse_batch_mixes",
    "collate_patches",
    "from_patches",
    "image_size_for_max_num_patches",
    "is_naflex_batch",
    "resize_to_budget",
    "to_patches",
]
