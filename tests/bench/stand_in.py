"""Generated tasks of the suites' shapes for the local Hub stand-in: clip-benchmark's VTAB webdataset layout
(`<key>.webp` image, `<key>.cls` label, train/ and test/ shards), a class signal in the tint so that a tiny model
learns something, and a tiny transformers ViT checkpoint."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image
from transformers import ViTImageProcessor, ViTModel

from ..conftest import randomize, tiny_hf_config

SIZE, PATCH = 32, 8


def vtab_shard(count: int, classes: int, seed: int) -> bytes:
    """One webdataset tar of `count` samples as clip-benchmark's wds_vtab-* shards hold them."""
    rng, buffer = np.random.default_rng(seed), io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(count):
            label = i % classes
            pixels = rng.integers(0, 80, (20 + i % 5, 24, 3)) + 40 * label
            members = {"webp": io.BytesIO(), "cls": io.BytesIO(f"{label}\n".encode())}
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(members["webp"], "WEBP", lossless=True)
            for suffix, member in members.items():
                info = tarfile.TarInfo(f"s{seed}_{i:05d}.{suffix}")
                info.size = len(member.getvalue())
                tar.addfile(info, io.BytesIO(member.getvalue()))
    return buffer.getvalue()


def vtab_files(train: int, test: int, classes: int, seed: int) -> dict[str, bytes]:
    return {"train/0.tar": vtab_shard(train, classes, seed), "test/0.tar": vtab_shard(test, classes, seed + 1)}


def tiny_backbone(folder: Path) -> Path:
    """A tiny random transformers ViTModel with its processor: the harness's --model."""
    randomize(ViTModel(tiny_hf_config(image_size=SIZE, patch_size=PATCH))).save_pretrained(folder)
    ViTImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder
