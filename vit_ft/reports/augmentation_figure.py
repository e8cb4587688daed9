"""`augmentations.png`: a few training images, each beside several of its augmented draws as the model sees
them (crop, flip, RandAugment / TrivialAugment / colour jitter, random erasing, de-normalised for display), and,
with a mixup / CutMix collator, one row of those draws mixed as a batch. A user sees what a recipe does to
their images before trusting it.

    write_augmentation_figure(images, train_transform, "outputs/run/augmentations.png", mixer=mixer)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..data.images import load_image
from ..data.mixup import MixupCutmix
from ..data.transforms import INDEX_COLUMN, ImageClassificationTransform, augmentation_seed
from ..utils.files import staged_file
from .figures import plot_image_grid

__all__ = ["write_augmentation_figure"]

PANEL_PIXELS = 160  # the height images are shown at


def write_augmentation_figure(
    images: Sequence[Any],
    transform: ImageClassificationTransform,
    path: str | os.PathLike,
    draws: int = 4,
    mixer: MixupCutmix | None = None,
    seed: int = 0,
) -> Path:
    """One row per image: the original, then `draws` outputs of the train `transform` (the draws of epochs
    0..draws-1 under `seed`), de-normalised; with `mixer`, a last row of the first draws mixed as one batch.
    The title says what the recipe applies. Written atomically (a PNG); returns `path`.

    images: PIL images, or anything the transform decodes ({"bytes", "path"} dicts, paths, bytes).
    """
    if not images or draws < 1:
        raise ValueError(
            f"write_augmentation_figure needs images ({len(images)} given) and draws >= 1 ({draws})."
        )
    panels: list[Image.Image | None] = []
    titles: list[str] = []
    first_draws = []
    for index, image in enumerate(images):
        panels.append(_original(image))
        titles.append("original")
        for draw in range(draws):
            generator = torch.Generator().manual_seed(augmentation_seed(seed, draw, index))
            pixels = transform.transform_image(image, generator)
            first_draws += [pixels] if draw == 0 else []
            panels.append(transform.to_image(pixels))
            titles.append(f"draw {draw + 1}")
    if mixer is not None:
        _mixed_row(torch.stack(first_draws), transform, mixer, draws + 1, panels, titles)
    title = f"What training sees: {transform.describe()}"
    if mixer is not None:
        title += f"\nthen per batch: {mixer.describe()}"
    with staged_file(path) as partial:
        plot_image_grid(panels, titles, partial, suptitle=title, columns=draws + 1)
    return Path(path)


def _original(image: Any) -> Image.Image | None:
    """The whole image, PANEL_PIXELS high; None (an empty panel) when it does not decode."""
    try:
        img = load_image(image)
    except Exception:  # one unreadable image leaves its panels empty, not the figure
        return None
    width = max(1, round(PANEL_PIXELS * img.width / img.height))
    return img.resize((width, PANEL_PIXELS), Image.Resampling.BICUBIC)


def _mixed_row(
    batch: torch.Tensor,
    transform: ImageClassificationTransform,
    mixer: MixupCutmix,
    columns: int,
    panels: list[Image.Image | None],
    titles: list[str],
) -> None:
    """Append one row: the batch of first draws mixed as `mixer` mixes (each time: prob 1 here), each titled
    with its images' shares."""
    count = len(batch)
    # one class per image (and no smoothing): the soft targets are then each image's share
    shares_mixer = MixupCutmix(
        count, mixer.mixup_alpha, mixer.cutmix_alpha, 1.0, mixer.switch_prob, seed=mixer.seed
    )
    mixed = shares_mixer(
        {"pixel_values": batch, "labels": torch.arange(count), INDEX_COLUMN: torch.arange(count)}
    )
    weights = mixed["labels"]
    row = []
    for i in range(min(count, columns)):
        shares = [(float(w), j) for j, w in enumerate(weights[i]) if w > 1e-6]
        text = " + ".join(f"{w:.2f}×#{j + 1}" for w, j in sorted(shares, reverse=True))
        row.append((transform.to_image(mixed["pixel_values"][i]), f"mixed: {text}"))
    row += [(None, "")] * (columns - len(row))
    panels.extend(panel for panel, _ in row)
    titles.extend(title for _, title in row)
