"""NaFlex batches (SigLIP 2): each image resized to its own aspect ratio under a patch budget (the rule of
transformers' `Siglip2ImageProcessor`), patchified as that processor does, and padded with a mask by the collator:
`pixel_values` `(batch, max_num_patches, patch * patch * channels)`, `pixel_attention_mask` `(batch,
max_num_patches)`, `spatial_shapes` `(batch, 2)`, the names `vit_ft.model`'s NaFlex input takes. A transformed
image is `(rows, columns, patch * patch * channels)`, so that its grid goes with it."""

from __future__ import annotations

import math
from typing import Any

import torch


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


__all__ = ["collate_patches", "from_patches", "image_size_for_max_num_patches", "is_naflex_batch", "to_patches"]
