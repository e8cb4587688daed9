"""The "data" section: vit_ft's training transform (the JPEG decoded for the crop) against the textbook full
decode, on synthetic photos, in one worker; then, at the fine-tuning resolution (384 px), the worker path that
feeds a GPU (decode + crop, uint8 out: `build_transforms(device_augmentation=True)`) against the old one (crop,
flip, float32 normalisation, and with the `-strong` recipes RandAugment + random erasing, all in the worker),
interleaved in one run; the per-batch augmentation that moved to the device (`BatchAugmentation`), timed on this
CPU; the bytes per image that cross the workers' boundary; and the DataLoader workers each path needs to feed
an H100 at 1,300 images/s."""

from __future__ import annotations

import io
import logging
import math
import statistics
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from vit_ft.data.augmentation import AugmentationSpec
from vit_ft.data.batch_augmentation import BatchAugmentation
from vit_ft.data.images import to_normalized_tensor
from vit_ft.data.mixup import MixupCutmix
from vit_ft.data.random_crops import random_resized_crop_box
from vit_ft.data.transforms import INDEX_COLUMN, build_transforms
from vit_ft.model.configuration_vit_ft import ViTFTConfig
from vit_ft.utils.timing import interleave

from .common import MEAN, STD, TARGETS, BenchmarkSettings, Row, throughput_row
from .flops import forward_flops
from .gpu import BF16_PEAKS

# DeiT's fine-tuning augmentation (timm rand-m9-n2, --reprob 0.25): the heaviest per-image work a recipe asks
AUGMENTATION = AugmentationSpec("randaugment", 2, 9, random_erasing_prob=0.25, random_erasing_mode="pixel")
# and its batch mix (DeiT: mixup 0.8, cutmix 1.0, label smoothing 0.1), as the -strong recipes
MIXUP = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1}
# the assumed H100 training rate: the gpu section's utilisation target (never measured here: no GPU lent)
H100_UTILISATION = float(TARGETS["gpu_utilisation"].split()[1])
# the images/s the workers must feed an H100 training ViT-B/16 at 384 px (issue 33; about h100_training_rate())
H100_FEED_RATE = 1300

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
        rows.extend(worker_path_rows(settings))
        rows.append(device_augmentation_row(settings))
    finally:
        torch.set_num_threads(threads)
    rows.append(bytes_row(settings))
    return rows


def h100_training_rate() -> tuple[float, float]:
    """(images/s, forward GFLOP per image) of ViT-B/16 at 384 px training on an H100 SXM, assumed: 3x the
    forward's FLOPs per image at the gpu section's target utilisation of the datasheet's dense bf16 peak."""
    config = ViTFTConfig.from_variant("base", patch_size=16, image_size=384, num_labels=1000)
    forward = forward_flops(config, 1)["total"]
    return H100_UTILISATION * dict(BF16_PEAKS)["H100"] / (3 * forward), forward / 1e9


def _workers(rate: float) -> int:
    """DataLoader workers of `rate` images/s each to feed H100_FEED_RATE."""
    return math.ceil(H100_FEED_RATE / rate)


def worker_path_rows(settings: BenchmarkSettings) -> list[Row]:
    """images/s of one worker (one torch thread) at the GPU resolution, per photo size: the new worker path
    (decode + crop, uint8) against the old one with crop + flip (float32) and with the strong augmentation,
    the three interleaved; the notes give the workers each needs to feed an H100 at 1,300 images/s."""
    size = settings.gpu_image_size
    new = build_transforms(size, MEAN, STD, train=True, augmentation=AUGMENTATION, device_augmentation=True)
    old_plain = build_transforms(size, MEAN, STD, train=True)
    old_strong = build_transforms(size, MEAN, STD, train=True, augmentation=AUGMENTATION)
    rows = []
    for index, (width, height) in enumerate(settings.photo_sizes):
        logger.info("worker paths on %dx%d JPEGs -> %d px", width, height, size)
        photos = [synthetic_photo(width, height, seed=i) for i in range(settings.photos_per_round)]
        batch = {"image": [{"bytes": p, "path": None} for p in photos], "label": [0] * len(photos)}
        times = interleave(
            {
                "new": lambda b=batch: new(b),
                "old": lambda b=batch: old_plain(b),
                "strong": lambda b=batch: old_strong(b),
            },
            settings.warmup,
            settings.rounds,
        )
        source = f"{width}x{height} JPEG (q90) -> {size} px, one worker"
        candidate = ("new: decode + crop, uint8 out", times["new"])
        plain = throughput_row(
            "data",
            f"worker path, crop + flip, {source}",
            len(photos),
            candidate,
            ("old: crop + flip + normalise, float32 out", times["old"]),
            TARGETS["data_large"] if index == 0 else None,
        )
        strong = throughput_row(
            "data",
            f"worker path, crop + flip + {AUGMENTATION.describe()}, {source}",
            len(photos),
            candidate,
            ("old: all of it in the worker (kornia per image), float32 out", times["strong"]),
        )
        plain.note = (
            f"DataLoader workers to feed an H100 at {H100_FEED_RATE} images/s: "
            f"{_workers(plain.candidate_value)} new, {_workers(plain.reference_value)} old"
        )
        strong.note = (
            f"DataLoader workers to feed an H100 at {H100_FEED_RATE} images/s: "
            f"{_workers(strong.candidate_value)} new (the augmentation runs per batch on the GPU), "
            f"{_workers(strong.reference_value)} old"
        )
        rows += [plain, strong]
    rate, gflop = h100_training_rate()
    rows[-1].note += (
        f"; {H100_FEED_RATE} images/s is about what an H100 SXM trains ViT-B/16 at 384 px (estimated {rate:.0f}:"
        f" 3 x {gflop:.0f} GFLOP per image at {H100_UTILISATION:.2f} of the "
        f"{dict(BF16_PEAKS)['H100'] / 1e12:.0f} TFLOP/s bf16 peak)"
    )
    return rows


def device_augmentation_row(settings: BenchmarkSettings) -> Row:
    """images/s of the per-batch augmentation on one CPU thread (as the worker rows: robust to a busy host), one
    batch of uint8 crops at the GPU resolution: flip + RandAugment + erasing + mixup (each image its own draws)
    against flip + normalise."""
    size, count = settings.gpu_image_size, settings.gpu_batch_size
    device = build_transforms(size, MEAN, STD, train=True, seed=0, device_augmentation=True)
    strong = build_transforms(
        size, MEAN, STD, train=True, seed=0, augmentation=AUGMENTATION, device_augmentation=True
    )
    plain = BatchAugmentation(device)
    augmented = BatchAugmentation(strong, MixupCutmix(num_classes=1000, seed=0, **MIXUP))
    generator = torch.Generator().manual_seed(settings.seed)
    batch = {
        "pixel_values": torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=generator),
        "labels": torch.randint(0, 1000, (count,), generator=generator),
        INDEX_COLUMN: torch.arange(count),
    }
    logger.info("per-batch device augmentation on the CPU: batch %d at %d px", count, size)
    times = interleave(
        {"strong": lambda: augmented(batch), "plain": lambda: plain(batch)}, settings.warmup, settings.rounds
    )
    row = throughput_row(
        "data",
        f"per-batch augmentation on the device, here one CPU thread, batch {count} "
        f"of uint8 {size}-px crops",
        count,
        (f"flip + {AUGMENTATION.describe()} + mixup/CutMix, per-image draws", times["strong"]),
        ("flip + normalise", times["plain"]),
    )
    # its fixed cost per batch, whatever the device: the per-image draws and kornia's dispatch per op group,
    # measured on tiny crops where the pixel work is negligible
    tiny = {**batch, "pixel_values": batch["pixel_values"][:, :, :8, :8].contiguous()}
    fixed = statistics.median(interleave({"tiny": lambda: augmented(tiny)}, settings.warmup, settings.rounds)["tiny"])
    row.note = (
        f"on a GPU the pixel work is a few kernels per op group; the fixed cost per batch (draws and dispatch, on "
        f"8-px crops) is {fixed * 1e3:.1f} ms on this CPU thread: at most {count / fixed:.0f} images/s from the "
        "training process's thread at this batch size, whatever the device"
    )
    return row


def bytes_row(settings: BenchmarkSettings) -> Row:
    """Bytes per image crossing the DataLoader workers' boundary: the new uint8 crop against float32."""
    size = settings.gpu_image_size
    uint8_bytes, float_bytes = 3 * size * size, 4 * 3 * size * size
    return Row(
        section="data",
        measurement=f"bytes per image across the worker boundary, {size} px",
        unit="bytes",
        candidate="new: uint8 crop",
        candidate_value=float(uint8_bytes),
        reference="old: float32 normalised",
        reference_value=float(float_bytes),
        ratio=uint8_bytes / float_bytes,
        target="<= 0.25",
        note=(
            f"a batch of 32: {32 * uint8_bytes / 2**20:.1f} MiB of shared memory (old "
            f"{32 * float_bytes / 2**20:.1f} MiB)"
        ),
    )
