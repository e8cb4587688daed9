"""The built-in smoke dataset: scikit-learn's handwritten digits written as PNG image folders (no download).

`write_digits_imagefolder` writes root/{train,test}/<digit>/<index>.png
once; `load_image_datasets(train_dir=root / "train", validation_dir=root / "test")` then loads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..utils.files import staged_folder

__all__ = ["write_digits_imagefolder"]

_DIGITS_MARKER = "digits.json"


def _count_pngs(root: Path) -> dict[str, int]:
    """The number of PNG files under root/train and root/test, per split."""
    return {split: sum(1 for _ in (root / split).glob("*/*.png")) for split in ("train", "test")}


def write_digits_imagefolder(root: str | os.PathLike, seed: int = 0, test_size: float = 0.2) -> Path:
    """scikit-learn's handwritten digits (1,797 8x8 grayscale images, 10 classes, no download) as PNG image
    folders root/train/<digit>/<index>.png and root/test/<digit>/<index>.png; returns root.

    Stratified split (`train_test_split(stratify=y, random_state=seed)`); pixels 0..16 scaled to 0..255 and
    kept at 8x8 (the model's transform resizes). Written once: a complete root with the same seed and
    test_size is left alone. The files go to a temporary sibling folder renamed into place at the end, so
    an interrupted run never leaves a root that looks complete.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    root = Path(root).expanduser()
    settings = {"seed": seed, "test_size": test_size}
    if _digits_complete(root, settings):
        return root
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(
            f"{root} exists but is not a complete digits image folder (no {_DIGITS_MARKER}); delete it or "
            "pass another root."
        )

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (n, 8, 8), 0..16 -> 0..255
    indices = np.arange(len(pixels))
    train_idx, test_idx = train_test_split(
        indices, test_size=test_size, stratify=digits.target, random_state=seed
    )
    try:  # replace=False: the rename fails if another process got there first
        with staged_folder(root, replace=False) as staging:
            counts = {}
            for split, split_idx in (("train", train_idx), ("test", test_idx)):
                for digit in range(10):
                    (staging / split / str(digit)).mkdir(parents=True)
                for i in split_idx:
                    Image.fromarray(pixels[i]).save(staging / split / str(digits.target[i]) / f"{i}.png")
                counts[split] = len(split_idx)
            marker = {**settings, "counts": counts}
            (staging / _DIGITS_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    except OSError:
        if not _digits_complete(root, settings):
            raise
    return root


def _digits_complete(root: Path, settings: dict[str, Any]) -> bool:
    """True when root holds a finished digits folder written with `settings`; False when root is absent."""
    marker_path = root / _DIGITS_MARKER
    if not marker_path.is_file():
        return False
    marker = json.loads(marker_path.read_text())
    if {key: marker.get(key) for key in settings} != settings:
        raise FileExistsError(
            f"{root} holds digits written with seed={marker.get('seed')}, test_size={marker.get('test_size')}, "
            f"not seed={settings['seed']}, test_size={settings['test_size']}; pass those values or another root."
        )
    if _count_pngs(root) != marker["counts"]:
        raise FileExistsError(
            f"{root} is a damaged digits folder ({_count_pngs(root)} PNGs, {marker['counts']} expected); "
            "delete it and run again."
        )
    return True
