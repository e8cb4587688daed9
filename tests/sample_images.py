"""Small synthetic test images shared by the data-layer tests (transforms, bad files, loading)."""

import io

import numpy as np
from PIL import Image, ImageDraw


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth RGB test image with a few shapes, different for each seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 128, size=3)
    rgb = base + np.stack([x * 100 // max(width, 1), y * 100 // max(height, 1), (x + y) % 50], axis=-1)
    img = Image.fromarray(rgb.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.ellipse(
        (width // 4, height // 4, width // 2, height // 2),
        fill=tuple(int(v) for v in rng.integers(0, 256, 3)),
    )
    return img


def encoded(img: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()
