"""The corruptions (`data/corruptions.py`) against the `imagecorruptions` package's definitions written here in
numpy, Python's colorsys and Pillow: contrast, brightness (HSV value), pixelation (box down-scaling) and JPEG at the
same constants; the noises' statistics; seeded draws; every corruption harsher at each severity."""

from __future__ import annotations

import colorsys
import io

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt, corrupt_pixels, severity_value

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)


def image(seed: int = 0, side: int = 32) -> torch.Tensor:
    """A smooth random image (1, 3, side, side) in [0, 1]: blurred noise, as photos are smoother than noise."""
    noise = torch.rand(1, 3, side // 4, side // 4, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.interpolate(noise, size=(side, side), mode="bilinear", align_corners=False)


def as_pil(x: torch.Tensor) -> Image.Image:
    return Image.fromarray((x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))


def from_pil(picture: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255).permute(2, 0, 1)[None]


def quantised(x: torch.Tensor) -> torch.Tensor:
    return from_pil(as_pil(x))


@pytest.mark.parametrize("severity", SEVERITIES)
def test_contrast_is_imagecorruptions(severity):
    x = image()
    c = severity_value("contrast", severity)
    hwc = x[0].permute(1, 2, 0).numpy()
    means = hwc.mean(axis=(0, 1), keepdims=True)
    expected = np.clip((hwc - means) * c + means, 0, 1)
    got = corrupt_pixels(x, "contrast", severity, torch.Generator()).numpy()[0].transpose(1, 2, 0)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_brightness_adds_to_the_hsv_value_as_imagecorruptions():
    x = image(side=8)
    c = severity_value("brightness", 2)
    expected = np.empty((8, 8, 3))
    for i, j in np.ndindex(8, 8):
        h, s, v = colorsys.rgb_to_hsv(*x[0, :, i, j].tolist())
        expected[i, j] = colorsys.hsv_to_rgb(h, s, min(1.0, v + c))
    got = corrupt_pixels(x, "brightness", 2, torch.Generator()).numpy()[0].transpose(1, 2, 0)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_pixelate_and_jpeg_are_pillows():
    x = quantised(image())
    c = severity_value("pixelate", 3)
    small = as_pil(x).resize((int(32 * c), int(32 * c)), Image.Resampling.BOX)
    expected = from_pil(small.resize((32, 32), Image.Resampling.NEAREST))
    got = corrupt_pixels(x, "pixelate", 3, torch.Generator())
    assert (got - expected).abs().mean() < 0.01  # box averages, 8-bit rounding apart
    buffer = io.BytesIO()
    as_pil(x).save(buffer, format="JPEG", quality=int(severity_value("jpeg_compression", 3)))
    expected = from_pil(Image.open(buffer).convert("RGB"))
    got = corrupt_pixels(x, "jpeg_compression", 3, torch.Generator())
    assert (got - expected).abs().mean() < 0.02  # kornia's codec against libjpeg: rounding and chroma filters


def test_noise_statistics_and_seeds():
    x = torch.full((4, 3, 32, 32), 0.5)
    c = severity_value("gaussian_noise", 1)
    residual = corrupt_pixels(x, "gaussian_noise", 1, torch.Generator().manual_seed(0)) - x
    assert abs(residual.std().item() - c) < 0.01 and abs(residual.mean().item()) < 0.01
    shot = corrupt_pixels(x, "shot_noise", 2, torch.Generator().manual_seed(0))
    count = severity_value("shot_noise", 2)
    assert abs(shot.var().item() - 0.5 / count) < 0.2 * 0.5 / count  # Poisson: variance = mean / count
    impulse = corrupt_pixels(x, "impulse_noise", 3, torch.Generator().manual_seed(0))
    assert abs((impulse != 0.5).float().mean().item() - severity_value("impulse_noise", 3)) < 0.02
    for name in CORRUPTIONS:
        once = corrupt_pixels(image(), name, 2, torch.Generator().manual_seed(3))
        again = corrupt_pixels(image(), name, 2, torch.Generator().manual_seed(3))
        torch.testing.assert_close(once, again, atol=0, rtol=0)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_each_severity_is_harsher_and_normalisation_round_trips(name):
    x = image(1)
    change = [(corrupt_pixels(x, name, s, torch.Generator().manual_seed(0)) - x).abs().mean().item() for s in SEVERITIES]
    assert change == sorted(change) and change[0] > 0
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    normalised = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    got = corrupt(normalised, name, 1, mean, std, torch.Generator().manual_seed(0))
    expected = corrupt_pixels(x, name, 1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(got * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1),
                               expected, atol=1e-5, rtol=0)  # fmt: skip
