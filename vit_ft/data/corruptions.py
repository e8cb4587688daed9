"""Corruptions for measuring robustness (Hendrycks & Dietterich 2019, ImageNet-C; the `imagecorruptions` package's
definitions): the families that make sense without scene geometry (noise, blur, photometric, digital; no weather),
each at three severities (ImageNet-C's 1, 3 and 5 of five), applied per batch on the device with kornia and torch,
seeded (the caller's generator, one per corruption and severity, on the batch's device).

Batches arrive normalised, as the model sees them; a corruption works on [0, 1] pixels (`corrupt` undoes the
normalisation, corrupts, clips and normalises again). The constants are ImageNet-C's (noise, photometric, the
pixelation ratio and JPEG quality do not depend on the image's size); the blurs' are CIFAR-10-C's for 32 px, scaled
to the image's side (ImageNet-C's sigma of 1-6 px at 224 px would erase a 32 px digit at severity 1).

    batch = corrupt(pixels, "gaussian_noise", 3, mean, std, generator)   # (B, 3, H, W) normalised -> same
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from kornia.color import hsv_to_rgb, rgb_to_hsv
from kornia.enhance import jpeg_codec_differentiable
from kornia.filters import gaussian_blur2d, motion_blur

SEVERITIES = (1, 2, 3)  # ImageNet-C's severities 1, 3 and 5 (of five): the mild, the middle and the worst
_PICK = (0, 2, 4)  # those severities' index in each five-value table

# corruption -> (family, ImageNet-C's / CIFAR-10-C's five values)
TABLES: dict[str, tuple[str, tuple[float, ...]]] = {
    "gaussian_noise": ("noise", (0.08, 0.12, 0.18, 0.26, 0.38)),  # std on [0, 1] pixels
    "shot_noise": ("noise", (60, 25, 12, 5, 3)),  # Poisson photon counts per unit intensity
    "impulse_noise": ("noise", (0.03, 0.06, 0.09, 0.17, 0.27)),  # salt-and-pepper fraction
    "gaussian_blur": ("blur", (0.4, 0.6, 0.7, 0.8, 1.0)),  # sigma in pixels at 32 px (CIFAR-10-C)
    "motion_blur": ("blur", (3, 5, 5, 7, 9)),  # kernel size in pixels at 32 px (CIFAR-10-C's radii + 1)
    "brightness": ("photometric", (0.1, 0.2, 0.3, 0.4, 0.5)),  # added to HSV value
    "contrast": ("photometric", (0.4, 0.3, 0.2, 0.1, 0.05)),  # kept share of the deviation from the mean
    "pixelate": ("digital", (0.6, 0.5, 0.4, 0.3, 0.25)),  # down-scale factor (a ratio: ImageNet-C's)
    "jpeg_compression": ("digital", (25, 18, 15, 10, 7)),  # JPEG quality (ImageNet-C's)
}
CORRUPTIONS = tuple(TABLES)


def severity_value(name: str, severity: int) -> float:
    """The constant of corruption `name` at `severity` (1-3)."""
    if name not in TABLES:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}.")
    if severity not in SEVERITIES:
        raise ValueError(f"severity {severity} is not one of {SEVERITIES}.")
    return TABLES[name][1][_PICK[severity - 1]]


def _scale(x: torch.Tensor) -> float:
    """The image side over CIFAR-10-C's 32 px: spatial constants grow with the image."""
    return min(x.shape[-2:]) / 32


def _gaussian_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    return x + c * torch.randn(x.shape, generator=g, device=g.device).to(x)


def _shot_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    return torch.poisson(x.clamp(0, 1) * c, generator=g) / c


def _impulse_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    draw = torch.rand(x.shape, generator=g, device=g.device).to(x)  # per pixel and channel, as skimage's s&p
    salt = torch.rand(x.shape, generator=g, device=g.device).to(x) < 0.5
    hit = draw < c
    return torch.where(hit & salt, 1.0, torch.where(hit, 0.0, x))


def _gaussian_blur(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    sigma = c * _scale(x)
    size = 2 * int(round(3 * sigma)) + 1  # +-3 sigma
    return gaussian_blur2d(x, (size, size), (sigma, sigma), border_type="reflect")


def _motion_blur(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    size = max(3, int(round(c * _scale(x))) | 1)  # odd
    angle = torch.empty(x.shape[0], device=g.device).uniform_(-45, 45, generator=g).to(x)  # degrees, per image
    return motion_blur(x, size, angle, torch.zeros_like(angle), border_type="reflect")


def _brightness(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    hsv = rgb_to_hsv(x.clamp(0, 1))
    return hsv_to_rgb(torch.cat([hsv[:, :2], (hsv[:, 2:] + c).clamp(0, 1)], dim=1))


def _contrast(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    mean = x.mean(dim=(2, 3), keepdim=True)  # per image and channel, as imagecorruptions' axis=(0, 1) of HWC
    return (x - mean) * c + mean


def _pixelate(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    height, width = x.shape[-2:]
    small = torch.nn.functional.interpolate(x, size=(max(1, int(height * c)), max(1, int(width * c))), mode="area")
    return torch.nn.functional.interpolate(small, size=(height, width), mode="nearest-exact")  # PIL's nearest


def _jpeg(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    height, width = x.shape[-2:]
    pad = (0, -width % 16, 0, -height % 16)  # kornia's codec needs sides that are multiples of 16
    padded = torch.nn.functional.pad(x.clamp(0, 1), pad, mode="replicate")
    quality = torch.full((x.shape[0],), float(c), device=x.device, dtype=x.dtype)
    return jpeg_codec_differentiable(padded, quality)[..., :height, :width]


_OPS: dict[str, Callable[[torch.Tensor, float, torch.Generator], torch.Tensor]] = {
    "gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur, "motion_blur": _motion_blur, "brightness": _brightness,
    "contrast": _contrast, "pixelate": _pixelate, "jpeg_compression": _jpeg,
}  # fmt: skip


def corrupt_pixels(x: torch.Tensor, name: str, severity: int, generator: torch.Generator) -> torch.Tensor:
    """`(batch, 3, height, width)` pixels in [0, 1] -> the same, corrupted by `name` at `severity` (1-3)."""
    return _OPS[name](x, severity_value(name, severity), generator).clamp(0, 1)


def corrupt(
    pixels: torch.Tensor, name: str, severity: int, mean: Sequence[float], std: Sequence[float],
    generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """Normalised `(batch, 3, height, width)` pixels -> the same corrupted (undone, corrupted, clipped, redone)."""
    mean_t = torch.as_tensor(mean, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    raw = pixels * std_t + mean_t  # (B, 3, H, W) in [0, 1]
    return (corrupt_pixels(raw.float(), name, severity, generator).to(pixels.dtype) - mean_t) / std_t


__all__ = ["CORRUPTIONS", "SEVERITIES", "TABLES", "corrupt", "corrupt_pixels", "severity_value"]
