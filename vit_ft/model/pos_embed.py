"""Position-embedding resampling, the one algorithm used at load time and at run time."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_position_embeddings(
    pos_embed: torch.Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    antialias: bool = False,
) -> torch.Tensor:
    """Resample a learned position-embedding table to another patch grid.

    `pos_embed` is `(1, num_prefix_tokens + old_h * old_w, hidden)`; the result is
    `(1, num_prefix_tokens + new_h * new_w, hidden)`. The prefix (CLS) entries are kept as they are and the
    patch entries are interpolated in 2D, bicubic, `align_corners=False`, no antialias (by default), in float32: the
    algorithm of transformers' `ViTEmbeddings.interpolate_pos_encoding`, so both give the same numbers (and of its
    DeiT, DINOv2, CLIP and SigLIP). `antialias=True` is `Dinov2WithRegistersEmbeddings`' variant, which differs
    even when upsampling (PyTorch's antialiased bicubic uses the a=-0.5 kernel, the plain one a=-0.75).
    """
    old_h, old_w = old_grid
    new_h, new_w = new_grid
    if pos_embed.dim() != 3 or pos_embed.shape[1] != num_prefix_tokens + old_h * old_w:
        raise ValueError(
            f"Position embeddings of shape {tuple(pos_embed.shape)} do not match a {old_h}x{old_w} grid with "
            f"{num_prefix_tokens} prefix token(s): expected (1, {num_prefix_tokens + old_h * old_w}, hidden)."
        )
    if (old_h, old_w) == (new_h, new_w):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = pos_embed.shape[-1]
    # bicubic on low-precision tables loses accuracy; interpolate in float32 and restore the dtype after
    patches = patches.float().reshape(1, old_h, old_w, dim).permute(0, 3, 1, 2)  # (1, hidden, old_h, old_w)
    patches = F.interpolate(
        patches, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=antialias
    )
    patches = patches.permute(0, 2, 3, 1).reshape(1, new_h * new_w, dim)  # (1, new_h * new_w, hidden)
    return torch.cat([prefix, patches.to(pos_embed.dtype)], dim=1)


__all__ = ["resample_position_embeddings"]
