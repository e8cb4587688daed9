"""2-D rotary position embeddings (RoPE) on the patch tokens, DINOv3's (`DINOv3ViTRopePositionEmbedding`).

Each patch's centre, normalised to [-1, 1] along height and width, turns a quarter of every head's channels by
its row and a quarter by its column; the prefix tokens (class, registers) are not turned. Nothing is learned, so
any multiple of the patch runs as it is: there is no table to resample. In training mode DINOv3 also moves the
centres at random (shift, jitter, rescale: the config's `rope_*`). A saved folder carries this file.
"""

from __future__ import annotations

import math

import torch


def augment_coordinates(
    coords: torch.Tensor, shift: float | None, jitter: float | None, rescale: float | None
) -> torch.Tensor:
    """DINOv3's training-time augmentation of the patch centres `(N, 2)`: a shift uniform in [-shift, shift] per
    axis, a stretch log-uniform in [1/jitter, jitter] per axis, one scale log-uniform in [1/rescale, rescale];
    drawn from torch's generator in transformers' order and shapes, so a seeded step equals its
    `augment_patches_center_coordinates`."""
    if shift is not None:
        coords = coords + torch.empty((1, 2), device=coords.device, dtype=coords.dtype).uniform_(-shift, shift)
    if jitter is not None:
        spread = math.log(jitter)
        coords = coords * torch.empty((1, 2), device=coords.device, dtype=coords.dtype).uniform_(-spread, spread).exp()
    if rescale is not None:
        spread = math.log(rescale)
        coords = coords * torch.empty(1, device=coords.device, dtype=coords.dtype).uniform_(-spread, spread).exp()
    return coords


def rotary_cos_sin(
    grid: tuple[int, int],
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    device: torch.device,
    augment: tuple[float | None, float | None, float | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation of each patch of a `grid` (rows, columns): cos and sin, each `(rows * columns, head_dim)`;
    `augment` (shift, jitter, rescale) moves the patch centres first, as DINOv3 does in training mode.

    Computed in float32 each call, as transformers' DINOv3 does (no buffer: a meta-device build needs none)."""
    rows, cols = grid
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)  # (head_dim/4,)
    coords_h = torch.arange(0.5, rows, dtype=torch.float32, device=device) / rows
    coords_w = torch.arange(0.5, cols, dtype=torch.float32, device=device) / cols
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)  # (N, 2)
    coords = 2.0 * coords - 1.0  # patch centres in [-1, 1]
    if augment is not None:
        coords = augment_coordinates(coords, *augment)
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2)  # (N, head_dim / 2)
    angles = angles.tile(2)  # (N, head_dim)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def apply_rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn the patch tokens (the last `cos.shape[0]`) of `(batch, heads, seq_len, head_dim)` queries and keys;
    the prefix tokens before them pass unchanged."""
    patches = cos.shape[0]

    def turn(x: torch.Tensor) -> torch.Tensor:
        prefix, x_patches = x.split((x.shape[-2] - patches, patches), dim=-2)
        first, second = x_patches.chunk(2, dim=-1)  # each (B, heads, N, head_dim / 2)
        rotated = torch.cat((-second, first), dim=-1)  # rotate_half
        return torch.cat((prefix, x_patches * cos + rotated * sin), dim=-2)

    return turn(query), turn(key)


__all__ = ["apply_rotary", "augment_coordinates", "rotary_cos_sin"]
