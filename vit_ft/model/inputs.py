"""What the model refuses of its input (and of its configured `image_size`), each a ValueError that says what to
pass instead. Shapes and dtypes only: free, and static under torch.compile and export (the channels are tested
first, so a valid input puts no guard on its height or width). A saved folder carries this file."""

from __future__ import annotations

from typing import Any

import torch

from .configuration_vit_ft import nearest_multiple
from .naflex import naflex_token_mask


def check_pixel_values(pixel_values: torch.Tensor, num_channels: int) -> None:
    """Refuse integer pixels, one unbatched image, an empty batch, channels-last pixels `(batch, height, width,
    channels)` and another channel count. The `torch.channels_last` memory format of a `(batch, channels, height,
    width)` tensor is fine."""
    shape = tuple(pixel_values.shape)
    if not pixel_values.is_floating_point():
        raise ValueError(
            f"pixel_values is {pixel_values.dtype}: pass float pixels normalised as the model's image processor "
            "does (rescaled and normalised with its mean/std), not raw 0-255 integers."
        )
    if pixel_values.dim() == 3 and shape[0] == num_channels:
        raise ValueError(
            f"pixel_values has shape {shape}: one image without a batch dimension; pass a batch: pixel_values[None]."
        )
    if pixel_values.dim() != 4:
        raise ValueError(f"pixel_values has shape {shape}: pass a (batch, channels, height, width) batch of images.")
    if shape[1] != num_channels and shape[3] == num_channels:
        raise ValueError(
            f"pixel_values has shape {shape}: (batch, height, width, channels), the channels last; pass "
            "pixel_values.permute(0, 3, 1, 2), (batch, channels, height, width) (the torch.channels_last "
            "memory format of such a tensor is fine)."
        )
    if shape[0] == 0:
        raise ValueError(f"pixel_values has shape {shape}: an empty batch; pass at least one image.")
    if shape[1] != num_channels:
        raise ValueError(
            f"pixel_values has {shape[1]} channels but the model expects {num_channels}: "
            "pass (batch, channels, height, width) images converted to RGB."
        )


def check_inputs(
    pixel_values: torch.Tensor | None, pixel_attention_mask: torch.Tensor | None, spatial_shapes: torch.Tensor | None,
    config: Any,
) -> torch.Tensor | None:  # fmt: skip
    """Check the model's input, images or NaFlex patches (`naflex.py`); -> the NaFlex token mask `(batch, prefix +
    max_patches)`, or None for images."""
    if pixel_values is None:
        raise ValueError("pixel_values is required: a (batch, channels, height, width) float tensor.")
    if spatial_shapes is None:
        check_pixel_values(pixel_values, config.num_channels)
        return None
    return naflex_token_mask(pixel_values, pixel_attention_mask, spatial_shapes, config)


def check_image_size(image_hw: tuple[int, int], patch_size: tuple[int, int]) -> None:
    """Refuse a configured `image_size` (height, width) that is not a positive multiple of the patch size."""
    if min(image_hw) <= 0 or image_hw[0] % patch_size[0] or image_hw[1] % patch_size[1]:
        raise ValueError(
            f"image_size {image_hw} is not divisible by patch_size {patch_size}: use a multiple of the "
            f"patch size, e.g. {nearest_multiple(image_hw, patch_size)}."
        )


def patch_grid(height: int, width: int, patch_size: tuple[int, int]) -> tuple[int, int]:
    """The patch grid (rows, columns) of an input of `height` x `width` pixels, or a ValueError saying what to fix."""
    ph, pw = patch_size
    if height % ph or width % pw or height <= 0 or width <= 0:
        raise ValueError(
            f"Input size {height}x{width} is not a multiple of the patch size {ph}x{pw}: resize or crop the "
            f"images to a multiple, e.g. {max(ph, round(height / ph) * ph)}x{max(pw, round(width / pw) * pw)}, "
            "or use the model's image processor."
        )
    return (height // ph, width // pw)


__all__ = ["check_image_size", "check_inputs", "check_pixel_values", "patch_grid"]
