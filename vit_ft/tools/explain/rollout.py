"""Attention rollout (Abnar & Zuidema 2020, arXiv 2005.00928): where the CLS token gets its information from."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def attention_rollout(
    attentions: tuple[torch.Tensor, ...] | list[torch.Tensor], head_fusion: str = "mean", num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Roll attention maps through the layers; returns the CLS row over the patches, `(batch, num_patches)`
    (`num_prefix_tokens` tokens precede the patches; with none, the mean row over all tokens).

    Each layer's `(batch, heads, tokens, tokens)` map is fused over heads ("mean", "max" or "min"), the
    residual connection is accounted for as `0.5 * A + 0.5 * I` with rows renormalised, and the layers are
    multiplied from the first to the last. The result is scaled to sum to 1 per image.
    """
    if not attentions:
        raise ValueError(
            "attention_rollout needs the attention maps: call the model with output_attentions=True."
        )
    fuse = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be one of {sorted(fuse)}, got {head_fusion!r}.")
    tokens = attentions[0].shape[-1]
    identity = torch.eye(tokens, dtype=torch.float32, device=attentions[0].device)
    rollout = identity.expand(attentions[0].shape[0], tokens, tokens)
    for layer in attentions:
        fused = fuse[head_fusion](layer.float())  # (B, tokens, tokens)
        fused = 0.5 * fused + 0.5 * identity
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused @ rollout
    # what flows into the class token (the first prefix token) from each patch; with no class token (SigLIP),
    # into the mean over the tokens, as mean and attention pooling read them all: (B, num_patches)
    to_patches = rollout[:, 0, num_prefix_tokens:] if num_prefix_tokens else rollout.mean(dim=1)
    return to_patches / to_patches.sum(dim=-1, keepdim=True)


@torch.no_grad()
def rollout_maps(
    model: torch.nn.Module, pixel_values: torch.Tensor, head_fusion: str = "mean"
) -> torch.Tensor:
    """Rollout maps `(batch, grid_h, grid_w)` for a ViTFT model (classifier or encoder) on `pixel_values`."""
    out = model(pixel_values=pixel_values, output_attentions=True)
    patch_h, patch_w = _patch_size(model)
    grid = (pixel_values.shape[-2] // patch_h, pixel_values.shape[-1] // patch_w)
    prefix = model.config.num_prefix_tokens  # class, distillation and register tokens
    return attention_rollout(out.attentions, head_fusion, num_prefix_tokens=prefix).reshape(-1, *grid)


def overlay_heatmap(
    image: Image.Image, heatmap: np.ndarray | torch.Tensor, alpha: float = 0.6
) -> Image.Image:
    """The image with a `(grid_h, grid_w)` heat map blended over it, upsampled to the image size (jet colours).

    Each pixel takes `alpha` x its heat (scaled to 0..1) of the colour and the rest of the image: where the
    model looks, the colour shows with the image under it (at most `alpha`, so never opaque); elsewhere the
    image is shown nearly as it is.
    """
    from matplotlib import colormaps

    heat = np.asarray(heatmap, dtype=np.float32)
    heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
    heat_image = Image.fromarray(np.uint8(heat * 255)).resize(image.size, Image.Resampling.BICUBIC)
    heat = np.asarray(heat_image, dtype=np.float32)[..., None] / 255.0  # (H, W, 1)
    colored = colormaps["jet"](heat[..., 0])[..., :3]
    base = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    weight = alpha * heat
    return Image.fromarray(np.uint8(np.round(255 * ((1 - weight) * base + weight * colored))))


def heatmap_image(heatmap: np.ndarray | torch.Tensor, height: int = 224) -> Image.Image:
    """A `(grid_h, grid_w)` heat map alone, scaled to 0..1 in the jet colours of `overlay_heatmap`, `height`
    pixels high (each patch a sharp block)."""
    from matplotlib import colormaps

    heat = np.asarray(heatmap, dtype=np.float32)
    heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
    colored = Image.fromarray(np.uint8(255 * colormaps["jet"](heat)[..., :3]))
    width = max(1, round(height * heat.shape[1] / heat.shape[0]))
    return colored.resize((width, height), Image.Resampling.NEAREST)


def _patch_size(model: torch.nn.Module) -> tuple[int, int]:
    config = model.config
    return config.patch_hw if hasattr(config, "patch_hw") else (config.patch_size, config.patch_size)


__all__ = ["attention_rollout", "heatmap_image", "overlay_heatmap", "rollout_maps"]
