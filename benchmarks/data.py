"""The "data" section: vit_ft's training transform (the JPEG decoded for the crop) against the textbook full
decode, on synthetic photos, in one worker."""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from vit_ft.data.images import random_resized_crop_box, to_normalized_tensor
from vit_ft.data.transforms import build_transforms

from .common import MEAN, STD, TARGETS, BenchmarkSettings, Row, interleave, throughput_row

logger = logging.getLogger(__name__)


def synthetic_photo(width: int, height: int, seed: int, quality: int = 90) -> bytes:
    """A JPEG that compresses like a photo: smooth colour gradients, soft-edged shapes and sensor noise."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    img = Image.fromarray(corners).resize((width, height), Image.Resampling.BICUBIC)  # smooth background
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, x1 = sorted(rng.integers(0, width, 2))
        y0, y1 = sorted(rng.integers(0, height, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1 + 1, y1 + 1), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=max(1.0, width / 400)))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0.0, 6.0, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def naive_train_transform(
    data: bytes, image_size: tuple[int, int], mean: Sequence[float], std: Sequence[float], resample: int
) -> torch.Tensor:
    """The textbook path: full decode, random-resized crop, resize, flip, normalise."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    box = random_resized_crop_box(img.width, img.height)
    img = img.crop(box).resize((image_size[1], image_size[0]), resample=resample)
    if torch.rand(1).item() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_normalized_tensor(img, mean, std)


def bench_data(settings: BenchmarkSettings) -> list[Row]:
    """Train-transform images/s of one worker (one torch thread, as in a DataLoader worker) on synthetic photos:
    vit_ft's transform (crop drawn on the header, JPEG decoded for that crop) against the naive full decode."""
    rows: list[Row] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        transform = build_transforms(settings.image_size, MEAN, STD, train=True)
        size, resample = transform.image_size, transform.resample
        for index, (width, height) in enumerate(settings.photo_sizes):
            logger.info("train transform on %dx%d JPEGs", width, height)
            photos = [synthetic_photo(width, height, seed=i) for i in range(settings.photos_per_round)]
            batch = {"image": [{"bytes": p, "path": None} for p in photos], "label": [0] * len(photos)}
            times = interleave(
                {
                    "vit_ft": lambda b=batch: transform(b),
                    "naive": lambda p=photos: [
                        naive_train_transform(x, size, MEAN, STD, resample) for x in p
                    ],
                },
                settings.warmup,
                settings.rounds,
            )
            largest = index == len(settings.photo_sizes) - 1
            measurement = f"train transform, {width}x{height} JPEG (q90) -> {size[0]} px, one worker"
            naive = ("naive: full decode, crop, resize", times["naive"])
            rows.append(
                throughput_row(
                    "data",
                    measurement,
                    len(photos),
                    ("vit_ft build_transforms (decode for the crop)", times["vit_ft"]),
                    naive,
                    TARGETS["data_large"] if largest else None,
                )
            )
    finally:
        torch.set_num_threads(threads)
    return rows
