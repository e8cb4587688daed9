"""Test-time augmentation for evaluate and predict (`--tta flip | crops`): each image is classified as several
views and its probabilities (the task's: the calibrated softmax, or a sigmoid per label) are averaged over them,
as timm and MMPretrain average them.

- `flip`: the evaluation view and its mirror image (2 views). Only for a model trained with flips: a run
  recorded with `horizontal_flip: false` (digits, text, anything not mirror-symmetric) never saw a mirrored
  image, and is refused in one line.
- `crops`: the evaluation view and the five crops of torchvision's `FiveCrop` (four corners and the centre) of
  the image resized to cover the model's size / 0.875 (6 views). 0.875 is timm's and torchvision's ImageNet
  evaluation crop fraction: the crops shift the object by up to 1/16 of the image each way, which a model
  trained with random resized crops has seen; the evaluation view itself stays among them, so the average
  never loses the view the model is evaluated on.

    runner = with_tta(trained, "crops")   # a Runnable: `predict_dataset(runner, data)`
    runner.single_view_logits()                     # the evaluation view's logits, for the report's comparison
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.images import (
    center_crop_box,
    cover_size,
    load_image,
    resize_and_center_crop,
    to_normalized_tensor,
)
from ..data.transforms import ImageClassificationTransform
from .trained import Trained

TTA_CHOICES = ("flip", "crops")
CROPS_FRACTION = 0.875  # the five crops cover this fraction of the resized image's sides (timm's crop_pct)
DESCRIPTIONS = {
    "flip": "2 views: the evaluation view and its horizontal mirror",
    "crops": f"6 views: the evaluation view and five crops (corners, centre) of a resize to 1/{CROPS_FRACTION} of "
    "the model's size",
}


def check_tta(mode: str | None, run_record: dict[str, Any] | None) -> None:
    """A ValueError naming the fix unless `mode` is None or one of `TTA_CHOICES`, or when `mode` is "flip" and
    the run record says the model trained without flips."""
    if mode is None:
        return
    if mode not in TTA_CHOICES:
        raise ValueError(f"--tta {mode} is not one of {', '.join(TTA_CHOICES)}; leave it unset for one view.")
    trained_with_flips = ((run_record or {}).get("data") or {}).get("horizontal_flip", True)
    if mode == "flip" and trained_with_flips is False:
        raise ValueError(
            "--tta flip averages over mirrored images, but this model trained without flips (its run record says "
            "horizontal_flip: false: the data is not mirror-symmetric); use --tta crops, or leave --tta unset."
        )


def tta_views(img: Image.Image, base: ImageClassificationTransform, mode: str) -> list[Image.Image]:
    """The views of the decoded `img` for `mode`, each `base.image_size`: the evaluation view first."""
    size = tuple(base.image_size)
    view = resize_and_center_crop(img, size, base.crop_pct, base.resample)
    if mode == "flip":
        return [view, view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    height, width = size
    big_w, big_h = cover_size(img.width, img.height, size, CROPS_FRACTION)  # covers size / 0.875, aspect kept
    large = img.resize((big_w, big_h), resample=base.resample)
    corners = [(0, 0), (big_w - width, 0), (0, big_h - height), (big_w - width, big_h - height)]
    boxes = [(x, y, x + width, y + height) for x, y in corners] + [center_crop_box(big_w, big_h, height, width)]
    return [view, *(large.crop(box) for box in boxes)]


# why predict and evaluate give no out-of-distribution score with --tta (the feature bank scores one view)
NO_OOD_SCORE = "no out-of-distribution score with --tta (the score is of the evaluation view alone)"


@dataclass
class TTATransform:
    """The evaluation transform's decoding and normalisation, giving every view of an image:
    `transform_image(source)` -> float32 `(views, channels, height, width)`."""

    base: ImageClassificationTransform
    mode: str

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.base.image_size)

    def transform_image(self, image: Any) -> torch.Tensor:
        base = self.base
        img = load_image(image, min_size=base.min_decode_size, max_pixels=base.max_pixels)
        views = tta_views(img, base, self.mode)
        return torch.stack([to_normalized_tensor(v, base.mean, base.std, base.rescale_factor) for v in views])


@dataclass
class TTARunner:
    """A trained model run on every view of each image (`inference.Runnable`): `logits` takes `(batch, views,
    channels, height, width)` and returns logits whose task probabilities are the views' averaged probabilities
    (`task.logits_of`), so every tool reads them as it reads a model's. Everything else is the `Trained`'s."""

    trained: Trained
    mode: str
    transform: TTATransform = field(init=False)
    _single_view: list[torch.Tensor] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.transform = TTATransform(self.trained.transform, self.mode)

    def __getattr__(self, name: str) -> Any:  # task, id2label, origin, model, ...: the trained model's
        if name.startswith("__") or name == "trained":
            raise AttributeError(name)
        return getattr(self.trained, name)

    @property
    def description(self) -> str:
        return f"--tta {self.mode} ({DESCRIPTIONS[self.mode]}; probabilities averaged)"

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, views, channels, height, width)` -> float32 `(batch, num_labels)`: the task's logits of the
        views' mean probability. The first view's own logits are kept (`single_view_logits`)."""
        batch, views = pixel_values.shape[:2]
        logits = self.trained.logits(pixel_values.flatten(0, 1)).view(batch, views, -1)  # (B, V, num_labels)
        self._single_view.append(logits[:, 0])
        task = self.trained.task
        probabilities = torch.as_tensor(task.probabilities(logits.flatten(0, 1))).view(batch, views, -1)
        return torch.from_numpy(task.logits_of(probabilities.mean(dim=1)))

    def single_view_logits(self) -> np.ndarray:
        """The evaluation view's logits `(images run, num_labels)` in the order they ran (one view, no TTA)."""
        return torch.cat(self._single_view).numpy() if self._single_view else np.zeros((0, self.trained.num_labels))


def with_tta(trained: Trained, mode: str | None) -> Trained | TTARunner:
    """`trained` itself without `mode`, else its `TTARunner` runner; `mode` checked (`check_tta`)."""
    check_tta(mode, trained.run_record)
    return trained if mode is None else TTARunner(trained, mode)

__all__ = [
    "CROPS_FRACTION",
    "NO_OOD_SCORE",
    "TTA_CHOICES",
    "TTATransform",
    "TTARunner",
    "check_tta",
    "with_tta",
    "tta_views",
]
