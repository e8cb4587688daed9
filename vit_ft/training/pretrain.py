"""The digits recipe's pre-training: the ViT paper's story in miniature.

A small ViT is pre-trained at low resolution (16x16 pixels, 4x4 patches: a 4x4 grid) on the training split of
scikit-learn's handwritten digits and saved as a standard transformers `ViTModel` checkpoint, the layout of
google/vit-base-patch16-224-in21k. The `digits` recipe then loads it through the same `from_pretrained` at
32x32 (position embeddings interpolated to 8x8) with a new zero-initialised head, and fine-tunes it.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import ViTImageProcessorPil

from ..data.images import VIT_MEAN, VIT_STD
from ..kernels import kernelize
from ..model.configuration_vit_ft import ViTFTConfig
from ..model.export import export_to_transformers
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.progress import Progress

logger = logging.getLogger(__name__)

# Small enough to pre-train in about a minute on two CPU cores; deep enough to be a real encoder.
DIGITS_VIT = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 256}
# the built-in pre-trainings (`pretrain_if_missing`): digits-small is the distillation student of the digits model
# (recipes/digits-distill.yaml): half its width, its depth, its head size, so about a quarter of its parameters
DIGITS_SIZES = {
    "digits": DIGITS_VIT,
    "digits-small": {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "intermediate_size": 128},
}


def read_image_folder(root: str | Path, size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """`root/<class>/*.png` -> normalised pixels `(num_images, 3, size, size)`, labels, and class names."""
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise FileNotFoundError(
            f"No class sub-folders in {root}; write the digits first (vit_ft.data.digits)."
        )
    pixels, labels = [], []
    for index, name in enumerate(classes):
        for path in sorted((root / name).iterdir()):
            with Image.open(path) as image:
                image = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
            pixels.append(np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0)
            labels.append(index)
    mean, std = torch.tensor(VIT_MEAN)[:, None, None], torch.tensor(VIT_STD)[:, None, None]  # (3, 1, 1)
    tensor = (torch.from_numpy(np.stack(pixels)) - mean) / std  # (N, 3, size, size)
    return tensor, torch.tensor(labels), classes


def random_affine(pixels: torch.Tensor, generator: torch.Generator, min_scale: float = 0.8) -> torch.Tensor:
    """Random zoom and shift of a batch `(B, C, H, W)`: a cheap random-resized-crop on tensors."""
    batch = pixels.shape[0]
    scale = torch.empty(batch).uniform_(min_scale, 1.0, generator=generator).sqrt()
    shift = (torch.rand(batch, 2, generator=generator) * 2 - 1) * (1 - scale)[:, None]
    theta = torch.zeros(batch, 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = scale
    theta[:, :, 2] = shift
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


def pretrain_digits(
    output_dir: str | Path,
    train_dir: str | Path,
    image_size: int = 16,
    patch_size: int = 4,
    epochs: int = 60,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
    size: str = "digits",
) -> Path:
    """Pre-train the small ViT (`DIGITS_SIZES[size]`) on `train_dir` and write it as a transformers ViTModel
    checkpoint. `progress`: a progress bar over the steps with its ETA and the last epoch's train accuracy (as
    Trainer's; off with `disable_tqdm`, when one log line per 10 epochs says how it goes)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    pixels, labels, classes = read_image_folder(train_dir, image_size)
    config = ViTFTConfig(
        **DIGITS_SIZES[size],
        image_size=image_size,
        patch_size=patch_size,
        num_labels=len(classes),
        hidden_dropout_prob=0.1,
    )
    model = kernelize(ViTFTForImageClassification(config)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.05)
    steps = epochs * math.ceil(len(pixels) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, learning_rate, total_steps=steps, pct_start=0.1)
    start = time.perf_counter()
    bar = Progress(steps, "Pre-training", unit="step", enabled=progress)  # a bar, or plain lines in a log
    for epoch in range(epochs):
        order = torch.randperm(len(pixels), generator=generator)
        correct = 0
        for begin in range(0, len(pixels), batch_size):
            index = order[begin : begin + batch_size]
            out = model(random_affine(pixels[index], generator), labels=labels[index])
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            correct += (out.logits.argmax(-1) == labels[index]).sum().item()
            bar.update()
        bar.postfix(epoch=f"{epoch + 1}/{epochs}", train_accuracy=f"{correct / len(pixels):.3f}")
        if not progress and ((epoch + 1) % 10 == 0 or epoch + 1 == epochs):
            logger.info(
                "pre-training epoch %d/%d: train accuracy %.4f", epoch + 1, epochs, correct / len(pixels)
            )
    bar.close()
    logger.info(
        "Pre-training took %.0f s (train accuracy %.2f %% in the last epoch).",
        time.perf_counter() - start,
        100 * correct / len(pixels),
    )
    processor = ViTImageProcessorPil(
        size={"height": image_size, "width": image_size}, image_mean=list(VIT_MEAN), image_std=list(VIT_STD)
    )
    return export_to_transformers(model.eval(), output_dir, image_processor=processor, with_head=False)


__all__ = ["DIGITS_SIZES", "pretrain_digits", "read_image_folder"]
