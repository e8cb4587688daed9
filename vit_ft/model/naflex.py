"""NaFlex inputs (SigLIP 2, arXiv 2502.14786): each image patchified at its own aspect ratio under a patch budget,
`pixel_values` `(batch, max_patches, patch_h * patch_w * channels)` with `pixel_attention_mask` `(batch, max_patches)`
over the padding and `spatial_shapes` `(batch, 2)`, each image's patch grid (rows, columns): the names and layout of
transformers' `Siglip2ImageProcessor`, so its output feeds the model. The patch projection is the model's convolution
applied as a linear map, the position table resized per image as `Siglip2VisionEmbeddings` does. A saved folder
carries this file."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def naflex_budget(config: Any) -> dict[str, int] | None:
    """A NaFlex model's patch budget as its image processor takes it, `{"max_num_patches", "patch_size"}` (the
    names of `Siglip2ImageProcessor` and of the data path's transform), or None for a model of fixed-size images."""
    budget = getattr(config, "max_num_patches", None)
    return None if budget is None else {"max_num_patches": int(budget), "patch_size": int(config.patch_hw[0])}


def naflex_token_mask(
    pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None, spatial_shapes: torch.Tensor, config: Any
) -> torch.Tensor:
    """The `(batch, prefix + max_patches)` bool token mask of a NaFlex batch, the prefix tokens always valid. A
    batch whose parts do not fit together (or a model with rotary positions) is a ValueError saying what to pass."""
    (patch_h, patch_w), num_channels = config.patch_hw, config.num_channels
    width = patch_h * patch_w * num_channels
    if not pixel_values.is_floating_point() or pixel_values.dim() != 3 or pixel_values.shape[-1] != width:
        raise ValueError(
            f"NaFlex pixel_values is {pixel_values.dtype} {tuple(pixel_values.shape)}: pass float patches (batch, "
            f"max_patches, {width}) as Siglip2ImageProcessor makes them, or (batch, channels, height, width) images."
        )
    batch, length = pixel_values.shape[:2]
    if pixel_attention_mask is None or tuple(pixel_attention_mask.shape) != (batch, length):
        got = None if pixel_attention_mask is None else tuple(pixel_attention_mask.shape)
        raise ValueError(f"pixel_attention_mask is {got}: pass one (batch, max_patches) = {(batch, length)} mask.")
    # the checks of values (not shapes) read the tensors, which a graph being traced (torch.export, the ONNX
    # export, torch.compile) cannot: it checks the shapes only, the eager call before it checked the rest
    values = not torch.compiler.is_compiling()
    if tuple(spatial_shapes.shape) != (batch, 2) or (values and bool((spatial_shapes <= 0).any())):
        raise ValueError(f"spatial_shapes {tuple(spatial_shapes.shape)}: pass each image's positive (rows, columns).")
    if values and bool((spatial_shapes.prod(-1) != pixel_attention_mask.sum(-1)).any()):
        raise ValueError("spatial_shapes do not match pixel_attention_mask: each image's rows * columns must be its "
                         "number of unmasked patches; pass the processor's three outputs together.")  # fmt: skip
    if config.rope_theta is not None:
        raise ValueError("NaFlex inputs need learned position embeddings; this model has rotary ones (rope_theta): "
                         "pass (batch, channels, height, width) images (any multiple of the patch).")  # fmt: skip
    valid = pixel_attention_mask.bool()
    return torch.cat([valid.new_ones(batch, config.num_prefix_tokens), valid], dim=1)


def patchified_projection(projection: nn.Conv2d, pixel_values: torch.Tensor) -> torch.Tensor:
    """`(batch, max_patches, patch_h * patch_w * channels)` patches -> `(batch, max_patches, hidden)`: the patch
    convolution as a linear map over the processor's layout (rows, columns, channels within a patch)."""
    weight = projection.weight.permute(0, 2, 3, 1).flatten(1)  # (hidden, patch_h * patch_w * channels)
    return F.linear(pixel_values.to(weight.dtype), weight, projection.bias)


def resize_positional_embeddings(
    table: torch.Tensor, spatial_shapes: torch.Tensor, max_length: int
) -> torch.Tensor:
    """A `(rows, columns, hidden)` position table resized to each image's grid and padded: `(batch, max_length,
    hidden)`, padding taking the first position. `Siglip2VisionEmbeddings.resize_positional_embeddings`' closed
    form of `F.interpolate(mode="bilinear", align_corners=False, antialias=True)`, per axis, in float32."""
    grid = torch.tensor(table.shape[:2], device=spatial_shapes.device, dtype=torch.float32)  # (2,)
    sizes = spatial_shapes.float()[:, None]  # (B, 1, 2)
    positions = torch.arange(max_length, device=spatial_shapes.device, dtype=torch.float32)[None, :, None]
    rows = torch.div(positions, sizes[..., 1:], rounding_mode="floor")  # (B, L, 1)
    index = torch.cat([rows, positions - rows * sizes[..., 1:]], dim=-1)  # (B, L, 2): row, column
    index = index * (positions < sizes.prod(-1, keepdim=True))
    scale = grid / sizes  # (B, 1, 2)
    support = scale.clamp(min=1)
    center = (index + 0.5) * scale - 0.5  # (B, L, 2)
    source = torch.arange(max(table.shape[:2]), device=spatial_shapes.device, dtype=torch.float32)
    weights = (1 - (source - center[..., None]).abs_().div_(support[..., None])).clamp_(min=0)  # (B, L, 2, S)
    weights = weights * (source < grid[:, None])  # a non-square table: each axis its own length
    weights = weights / weights.sum(-1, keepdim=True)
    rows_w, cols_w = weights[..., 0, : table.shape[0]], weights[..., 1, : table.shape[1]]
    weights = (rows_w[..., :, None] * cols_w[..., None, :]).flatten(-2)  # (B, L, rows * columns)
    flat = table.reshape(-1, table.shape[-1])  # (rows * columns, hidden)
    return (weights.to(flat.device) @ flat.float()).to(table.dtype)


def naflex_positions(embeddings: nn.Module, spatial_shapes: torch.Tensor, max_length: int) -> torch.Tensor:
    """`ViTFTEmbeddings`' position table `(1, prefix + rows * columns, hidden)` for a NaFlex batch -> `(batch,
    prefix + max_length, hidden)`: the prefix slots as they are, the patch positions resized to each image's grid."""
    slots = embeddings.config.num_position_prefix
    prefix, table = embeddings.position_embeddings[:, :slots], embeddings.position_embeddings[0, slots:]
    table = table.reshape(*embeddings.grid_size, -1)  # (rows, columns, hidden)
    positions = resize_positional_embeddings(table, spatial_shapes, max_length)
    return torch.cat([prefix.expand(positions.shape[0], -1, -1), positions], dim=1)


def attention_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`(batch, seq_len)` bool -> an additive `(batch, 1, 1, seq_len)` key mask for SDPA and the eager path."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)[
        :, None, None
    ]


def masked_mean(tokens: torch.Tensor, mask: torch.Tensor | None, start: int = 0) -> torch.Tensor:
    """`(batch, seq_len, hidden)` -> `(batch, hidden)`, the mean of the tokens from `start` on (after the prefix),
    over the valid ones of the `(batch, seq_len)` token mask only where given."""
    tokens = tokens[:, start:]
    if mask is None:
        return tokens.mean(dim=1)
    weights = mask[:, start:].to(tokens.dtype)[..., None]  # (B, N, 1)
    return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


__all__ = [
    "attention_bias",
    "masked_mean",
    "naflex_budget",
    "naflex_positions",
    "naflex_token_mask",
    "patchified_projection",
    "resize_positional_embeddings",
]
