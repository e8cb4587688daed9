"""The built-in datasets, written from scikit-learn's handwritten digits (no download), once and atomically:

- `digits` (`write_digits_imagefolder`): root/{train,test}/<digit>/<index>.png class folders, one label per
  image; `load_image_datasets(train_dir=root / "train", validation_dir=root / "test")` then loads them.
- `digits-multilabel` (`write_digits_multilabel_imagefolder`): canvases holding one to three real digits, the
  labels being the set of digits present:

      root/train/00000.png ...   32x32 grayscale canvases (the training transform converts them to RGB)
      root/train/labels.csv      file,labels  e.g. 00000.png,3;7  (the `vit_ft.data.multilabel` folder format)
      root/train/layout.jsonl    which source digit sits where, per canvas: {"file", "digits": [{"source",
                                 "digit", "top", "left"}]} (for checks; `read_labelled_folder` ignores it)
      root/test/...              the same from other source images
      root/digits_multilabel.json   the settings and counts (the mark of a complete folder)

  Each canvas is a 2x2 grid of 16-pixel cells; 1 to 3 cells (uniformly many, distinct cells, so digits never
  overlap) get a source digit upscaled 8x8 -> 16x16 (nearest: the strokes stay sharp), the scale of the
  built-in pre-training's digits. A canvas can show the same digit twice; its labels are then that digit once.
  Why this layout: with a 3x3 grid of 21-pixel cells and random offsets (64x64 canvases, measured 2026-11-25)
  the small pre-trained ViT reached only 0.35 mAP in 12 epochs (a linear model on the pixels: 0.42): finding a
  digit anywhere is a detection task that 0.2M parameters and a few thousand canvases do not learn in minutes.
  On the fixed 2x2 grid it reaches 0.95 with 6,000 canvases (recipes/README.md).

Both split scikit-learn's 1,797 digits the same way (`source_split`: `train_test_split(test_size=0.2,
stratify=target, random_state=seed)`), so that with seed 0 no test canvas holds a digit image that the built-in
digits pre-training (on data/digits/train) or a train canvas has seen. Each writes its files to a temporary
sibling folder renamed into place at the end, with a marker of its settings and counts: an interrupted run
never leaves a root that looks complete, and a complete root with the same settings is left alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..utils.files import staged_folder

__all__ = [
    "CANVAS_SIZE",
    "compose_canvas",
    "source_split",
    "write_digits_imagefolder",
    "write_digits_multilabel_imagefolder",
]

_DIGITS_MARKER = "digits.json"
_MULTILABEL_MARKER = "digits_multilabel.json"
CANVAS_SIZE = 32
_GRID, _CELL, _DIGIT = 2, 16, 16  # 2x2 cells of 16 pixels, 16-pixel digits: each fills its cell


def _digit_pixels() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (n, 8, 8) uint8 pixels (0..16 scaled to 0..255) and their (n,) digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8), digits.target


def source_split(seed: int = 0, test_size: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) sorted indices of scikit-learn's digits, stratified by digit: both built-in datasets'."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train, test = train_test_split(
        np.arange(len(target)), test_size=test_size, stratify=target, random_state=seed
    )
    return np.sort(train), np.sort(test)


def _write_once(
    root: str | os.PathLike, name: str, marker: str, settings: dict[str, Any], pattern: str,
    write: Callable[[Path], dict[str, int]], folder: str,
) -> Path:  # fmt: skip
    """Write the built-in dataset `name` (a `folder`, in the messages) into root once: `write(staging)` fills a
    temporary sibling and returns its image counts per split, renamed into place with the `marker` file of
    `settings` and counts. A complete root with the same settings is left alone; another one, or a root holding
    other files, is an error."""
    root = Path(root).expanduser()
    if _complete(root, name, marker, settings, pattern):
        return root
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(
            f"{root} exists but is not a complete {folder} (no {marker}); delete it or pass another root."
        )
    try:  # replace=False: the rename fails if another process got there first
        with staged_folder(root, replace=False) as staging:
            counts = write(staging)
            (staging / marker).write_text(json.dumps({**settings, "counts": counts}, indent=2) + "\n")
    except OSError:
        if not _complete(root, name, marker, settings, pattern):
            raise
    return root


def _complete(root: Path, name: str, marker: str, settings: dict[str, Any], pattern: str) -> bool:
    """True when root holds a finished `name` folder written with `settings`; False when it has no marker."""
    marker_path = root / marker
    if not marker_path.is_file():
        return False
    found = json.loads(marker_path.read_text())
    if {key: found.get(key) for key in settings} != settings:
        written = ", ".join(f"{key}={found.get(key)}" for key in settings)
        raise FileExistsError(
            f"{root} holds {name} written with {written}, not "
            f"{', '.join(f'{k}={v}' for k, v in settings.items())}; pass those values or another root."
        )
    counts = {split: sum(1 for _ in (root / split).glob(pattern)) for split in ("train", "test")}
    if counts != found["counts"]:
        raise FileExistsError(
            f"{root} is a damaged {name} folder ({counts} PNGs, {found['counts']} expected); delete it and run again."
        )
    return True


def write_digits_imagefolder(root: str | os.PathLike, seed: int = 0, test_size: float = 0.2) -> Path:
    """scikit-learn's handwritten digits (1,797 8x8 grayscale images, 10 classes, no download) as PNG image
    folders root/train/<digit>/<index>.png and root/test/<digit>/<index>.png; returns root.

    Stratified split (`source_split`); pixels kept at 8x8 (the model's transform resizes). Written once.
    """

    def write(staging: Path) -> dict[str, int]:
        pixels, target = _digit_pixels()
        counts = {}
        for split, split_idx in zip(("train", "test"), source_split(seed, test_size), strict=True):
            for digit in range(10):
                (staging / split / str(digit)).mkdir(parents=True)
            for i in split_idx:
                Image.fromarray(pixels[i]).save(staging / split / str(target[i]) / f"{i}.png")
            counts[split] = len(split_idx)
        return counts

    settings = {"seed": seed, "test_size": test_size}
    return _write_once(root, "digits", _DIGITS_MARKER, settings, "*/*.png", write, "digits image folder")


def compose_canvas(
    digits: np.ndarray, sources: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """One (32, 32) uint8 canvas of 1-3 digits drawn from `sources` (indices into `digits`, (n, 8, 8) uint8)
    and where each went: [{"source", "top", "left"}, ...]."""
    count = int(rng.integers(1, 4))
    cells = rng.choice(_GRID * _GRID, size=count, replace=False)
    chosen = rng.choice(sources, size=count, replace=True)
    canvas = np.zeros((CANVAS_SIZE, CANVAS_SIZE), dtype=np.uint8)
    placed = []
    for cell, source in zip(cells, chosen, strict=True):
        top = int(cell // _GRID) * _CELL + int(rng.integers(0, _CELL - _DIGIT + 1))
        left = int(cell % _GRID) * _CELL + int(rng.integers(0, _CELL - _DIGIT + 1))
        scale = _DIGIT // digits.shape[1]
        canvas[top : top + _DIGIT, left : left + _DIGIT] = np.kron(digits[source], np.ones((scale, scale)))
        placed.append({"source": int(source), "top": top, "left": left})
    return canvas, placed


def _write_canvases(
    folder: Path, digits: np.ndarray, target: np.ndarray, sources: np.ndarray, count: int, rng
) -> None:
    """`count` canvases from `sources` into folder, with labels.csv and layout.jsonl."""
    folder.mkdir(parents=True)
    label_rows, layout_rows = ["file,labels"], []
    for i in range(count):
        canvas, placed = compose_canvas(digits, sources, rng)
        name = f"{i:05d}.png"
        Image.fromarray(canvas).save(folder / name)
        for item in placed:
            item["digit"] = int(target[item["source"]])
        label_rows.append(f"{name},{';'.join(str(d) for d in sorted({item['digit'] for item in placed}))}")
        layout_rows.append(json.dumps({"file": name, "digits": placed}))
    (folder / "labels.csv").write_text("\n".join(label_rows) + "\n", encoding="utf-8")
    (folder / "layout.jsonl").write_text("\n".join(layout_rows) + "\n", encoding="utf-8")


def write_digits_multilabel_imagefolder(
    root: str | os.PathLike, seed: int = 0, num_train: int = 6000, num_test: int = 1000
) -> Path:
    """The `digits-multilabel` image folders root/train and root/test (see the module's docstring); returns
    root. Deterministic for a seed: the source split and a numpy Generator(seed) drawing every canvas."""

    def write(staging: Path) -> dict[str, int]:
        pixels, target = _digit_pixels()
        train_sources, test_sources = source_split(seed)
        rng = np.random.default_rng(seed)
        _write_canvases(staging / "train", pixels, target, train_sources, num_train, rng)
        _write_canvases(staging / "test", pixels, target, test_sources, num_test, rng)
        return {"train": num_train, "test": num_test}

    settings = {"seed": seed, "num_train": num_train, "num_test": num_test}
    return _write_once(
        root, "digits-multilabel", _MULTILABEL_MARKER, settings, "*.png", write, "digits-multilabel folder"
    )
