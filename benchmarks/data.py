"""The "data" section: vit_ft's training transform (the JPEG decoded for the crop) against the textbook full
decode, on synthetic photos, in one worker; and the cost of a DeiT-style augmentation (RandAugment + random
erasing) at the fine-tuning resolution, with the DataLoader workers it would take to feed an H100."""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from vit_ft.data.augmentation import AugmentationSpec
from vit_ft.data.images import random_resized_crop_box, to_normalized_tensor
from vit_ft.data.transforms import build_transforms
from vit_ft.model.configuration_vit_ft import ViTFTConfig

from .common import MEAN, STD, TARGETS, BenchmarkSettings, Row, interleave, throughput_row
from .flops import forward_flops
from .gpu import BF16_PEAKS

# DeiT's fine-tuning augmentation (timm rand-m9-n2, --reprob 0.25): the heaviest per-image work a recipe asks
AUGMENTATION = AugmentationSpec("randaugment", 2, 9, random_erasing_prob=0.25, random_erasing_mode="pixel")
# the assumed H100 training rate: the gpu section's utilisation target (never measured here: no GPU lent)
H100_UTILISATION = float(TARGETS["gpu_utilisation"].split()[1])

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
        rows.append(augmented_row(settings))
    finally:
        torch.set_num_threads(threads)
    return rows


def h100_training_rate() -> tuple[float, float]:
    """(images/s, forward GFLOP per image) of ViT-B/16 at 384 px training on an H100 SXM, assumed: 3x the
    forward's FLOPs per image at the gpu section's target utilisation of the datasheet's dense bf16 peak."""
    config = ViTFTConfig.from_variant("base", patch_size=16, image_size=384, num_labels=1000)
    forward = forward_flops(config, 1)["total"]
    return H100_UTILISATION * dict(BF16_PEAKS)["H100"] / (3 * forward), forward / 1e9


def augmented_row(settings: BenchmarkSettings) -> Row:
    """images/s of one worker: the train transform with RandAugment + random erasing against crop + flip only,
    at the gpu section's resolution (384 px) on photo-sized JPEGs; the note says how many workers an H100
    would need at that rate."""
    width, height = settings.photo_sizes[0]  # 500x375: a typical photo
    size = settings.gpu_image_size
    photos = [synthetic_photo(width, height, seed=i) for i in range(settings.photos_per_round)]
    batch = {"image": [{"bytes": p, "path": None} for p in photos], "label": [0] * len(photos)}
    augmented = build_transforms(size, MEAN, STD, train=True, augmentation=AUGMENTATION)
    plain = build_transforms(size, MEAN, STD, train=True)
    logger.info(
        "train transform with %s on %dx%d JPEGs -> %d px", AUGMENTATION.describe(), width, height, size
    )
    times = interleave(
        {"augmented": lambda: augmented(batch), "plain": lambda: plain(batch)},
        settings.warmup,
        settings.rounds,
    )
    row = throughput_row(
        "data",
        f"train transform + {AUGMENTATION.describe()}, {width}x{height} JPEG (q90) -> {size} px, one worker",
        len(photos),
        ("with the augmentation (kornia)", times["augmented"]),
        ("crop + flip only", times["plain"]),
    )
    rate, gflop = h100_training_rate()
    row.note = (
        f"at {row.candidate_value:.1f} images/s per worker ({size} px), an H100 SXM training ViT-B/16 at 384 px "
        f"at about {rate:.0f} images/s (assumed: 3 x {gflop:.0f} GFLOP per image at {H100_UTILISATION:.2f} of "
        f"the {dict(BF16_PEAKS)['H100'] / 1e12:.0f} TFLOP/s bf16 datasheet peak, the gpu section's target) "
        f"needs {math.ceil(rate / row.candidate_value)} DataLoader workers"
    )
    return row
