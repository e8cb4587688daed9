"""The built-in multi-label dataset `digits-multilabel`: canvases holding one to three real scikit-learn digits
(no download), the labels being the set of digits present.

`write_digits_multilabel_imagefolder(root)` writes, once and atomically (as `vit_ft.data.digits`):

    root/train/00000.png ...   32x32 grayscale canvases (the training transform converts them to RGB)
    root/train/labels.csv      file,labels  e.g. 00000.png,3;7  (the `vit_ft.data.multilabel` folder format)
    root/train/layout.jsonl    which source digit sits where, per canvas: {"file", "digits": [{"source",
                               "digit", "top", "left"}]} (for checks; `read_labelled_folder` ignores it)
    root/test/...              the same from other source images
    root/digits_multilabel.json   the settings and counts (the mark of a complete folder)

Each canvas is a 2x2 grid of 16-pixel cells; 1 to 3 cells (uniformly many, distinct cells, so digits never
overlap) get a source digit upscaled 8x8 -> 16x16 (nearest: the strokes stay sharp), the scale of the built-in
pre-training's digits. A canvas can show the same digit twice; its labels are then that digit once. Why this
layout: with a 3x3 grid of 21-pixel cells and random offsets (64x64 canvases, measured 2026-11-25) the small
pre-trained ViT reached only 0.35 mAP in 12 epochs (a linear model on the pixels: 0.42): finding a digit
anywhere is a detection task that 0.2M parameters and a few thousand canvases do not learn in minutes. On the
fixed 2x2 grid it reaches 0.95 with 6,000 canvases (recipes/README.md).

Source split: scikit-learn's 1,797 digits are split as `write_digits_imagefolder` splits them
(`train_test_split(test_size=0.2, stratify=target, random_state=seed)`), so that with seed 0 no test canvas
holds a digit image that the built-in digits pre-training (on data/digits/train) or a train canvas has seen.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..utils.files import staged_folder

__all__ = ["CANVAS_SIZE", "compose_canvas", "source_split", "write_digits_multilabel_imagefolder"]

CANVAS_SIZE = 32
_GRID, _CELL, _DIGIT = 2, 16, 16  # 2x2 cells of 16 pixels, 16-pixel digits: each fills its cell
_MARKER = "digits_multilabel.json"


def source_split(seed: int = 0, test_size: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of scikit-learn's digits: the split of `write_digits_imagefolder(seed=seed)`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train, test = train_test_split(
        np.arange(len(target)), test_size=test_size, stratify=target, random_state=seed
    )
    return np.sort(train), np.sort(test)


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


def _write_split(
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
    root. Deterministic for a seed: the source split and a numpy Generator(seed) drawing every canvas. Written
    once: a complete root with the same settings is left alone, another one is an error; the files go to a
    temporary sibling renamed into place at the end, so an interrupted run leaves nothing that looks complete.
    """
    from sklearn.datasets import load_digits

    root = Path(root).expanduser()
    settings = {"seed": seed, "num_train": num_train, "num_test": num_test}
    if _complete(root, settings):
        return root
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(
            f"{root} exists but is not a complete digits-multilabel folder (no {_MARKER}); delete it or pass "
            "another root."
        )
    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (n, 8, 8), 0..16 -> 0..255
    train_sources, test_sources = source_split(seed)
    rng = np.random.default_rng(seed)
    try:  # replace=False: the rename fails if another process got there first
        with staged_folder(root, replace=False) as staging:
            _write_split(staging / "train", pixels, digits.target, train_sources, num_train, rng)
            _write_split(staging / "test", pixels, digits.target, test_sources, num_test, rng)
            marker = {**settings, "counts": {"train": num_train, "test": num_test}}
            (staging / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    except OSError:
        if not _complete(root, settings):
            raise
    return root


def _complete(root: Path, settings: dict[str, Any]) -> bool:
    """True when root holds a finished folder written with `settings`; False when it has no marker."""
    marker_path = root / _MARKER
    if not marker_path.is_file():
        return False
    marker = json.loads(marker_path.read_text())
    if {key: marker.get(key) for key in settings} != settings:
        written = ", ".join(f"{key}={marker.get(key)}" for key in settings)
        raise FileExistsError(
            f"{root} holds digits-multilabel written with {written}, not "
            f"{', '.join(f'{k}={v}' for k, v in settings.items())}; pass those values or another root."
        )
    counts = {split: sum(1 for _ in (root / split).glob("*.png")) for split in ("train", "test")}
    if counts != marker["counts"]:
        raise FileExistsError(
            f"{root} is a damaged digits-multilabel folder ({counts} PNGs, {marker['counts']} expected); "
            "delete it and run again."
        )
    return True
