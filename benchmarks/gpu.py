"""The "gpu" section: ours against transformers' ViT at the ViT paper's fine-tuning resolution, bf16, on a GPU
(or on the device it is given: the smoke test runs it on the CPU)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import torch

from .common import TARGETS, BenchmarkSettings, Row, interleave, throughput_row
from .workloads import adamw, build_contenders, infer, interleave_training, random_batch

logger = logging.getLogger(__name__)


def gpu_available(settings: BenchmarkSettings) -> bool:
    device = torch.device(settings.gpu_device)
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())


def bench_gpu(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """Ours against transformers' ViT on `settings.gpu_device` at `gpu_image_size` px, bf16 autocast, batch
    `gpu_batch_size`: inference and training-step images/s, each call timed to the device's end."""
    gpu_settings = replace(settings, image_size=settings.gpu_image_size)
    device = torch.device(settings.gpu_device)
    ours, theirs = (model.to(device) for model in build_contenders(gpu_settings, folder))
    config, batch, dtype = ours.config, settings.gpu_batch_size, torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    size = f"{config.image_hw[0]} px"
    pixels, labels = (t.to(device) for t in random_batch(config, batch, settings.seed))
    logger.info("%s, %s, batch %d: inference", name, size, batch)
    times = interleave(
        {"ours": lambda: infer(ours, pixels, dtype), "theirs": lambda: infer(theirs, pixels, dtype)},
        settings.warmup,
        settings.rounds,
    )
    rows = [
        throughput_row(
            "gpu",
            f"inference, bf16, {size}, batch {batch}, on {name}",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["inference"],
        )
    ]
    models = {"ours": ours.train(), "theirs": theirs.train()}
    optimizers = {key: adamw(model, fused=True) for key, model in models.items()}
    logger.info("%s, %s, batch %d: training step", name, size, batch)
    times = interleave_training(settings, models, optimizers, pixels, labels, dtype)
    rows.append(
        throughput_row(
            "gpu",
            f"training step (forward, loss, backward, fused AdamW), bf16, {size}, batch {batch}, on {name}",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["training"],
        )
    )
    return rows
