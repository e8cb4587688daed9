"""The evaluation preprocessing of a trained model: its resolution (checked against the patch size and the token
bound) and the normalisation its image processor states. `trained.load_trained` builds it once per model."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from ..data.images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from ..data.transforms import ImageClassificationTransform, build_transforms
from ..model.configuration_vit_ft import nearest_multiple, to_2tuple
from ..utils.run_record import PROCESSOR_FILE

logger = logging.getLogger("vit_ft")


@dataclass(frozen=True)
class Preprocessing:
    """The evaluation geometry and normalisation: resize + centre crop to `image_size`, then normalise."""

    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = VIT_MEAN
    std: tuple[float, ...] = VIT_STD
    rescale_factor: float = RESCALE_FACTOR
    resample: int = Image.Resampling.BICUBIC  # what vit_ft fine-tunes and evaluates with
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def transform(self) -> ImageClassificationTransform:
        """The eval transform of `vit_ft.data.transforms.build_transforms` with these settings."""
        return build_transforms(
            self.image_size,
            mean=self.mean,
            std=self.std,
            train=False,
            rescale_factor=self.rescale_factor,
            resample=self.resample,
            max_pixels=self.max_pixels,
        )


def _as_hw(size: int | Sequence[int]) -> tuple[int, int]:
    if not isinstance(size, int) and len(size) == 1:
        size = size[0]
    try:
        return to_2tuple(size if isinstance(size, int) else tuple(int(v) for v in size), "image_size")
    except (TypeError, ValueError):
        raise ValueError(f"image_size={size!r} must be one int or a (height, width) pair.") from None


def check_image_size(
    config: Any, image_size: int | Sequence[int] | None, max_tokens: int | None = None
) -> tuple[int, int]:
    """The (height, width) to evaluate at: the config's, or `image_size`, which must be a multiple of the patch
    size (the model resamples its position embeddings to the new grid) and give at most `max_tokens` patch
    tokens (None: no bound)."""
    size = tuple(config.image_hw) if image_size is None else _as_hw(image_size)
    patch = tuple(config.patch_hw)
    if min(size) <= 0:
        raise ValueError(
            f"image_size={size[0]}x{size[1]} must be positive: a number of pixels such as --image_size "
            f"{config.image_hw[0]} (the model's own), or leave it unset."
        )
    if size[0] % patch[0] or size[1] % patch[1] or min(size) <= 0:
        near = nearest_multiple(size, patch)
        raise ValueError(
            f"image_size={size[0]}x{size[1]} is not a multiple of the model's patch size {patch[0]}x{patch[1]}; "
            f"use e.g. --image_size {near[0]}"
            + ("" if near[0] == near[1] else f" (or {near[0]}x{near[1]})")
            + "."
        )
    tokens = (size[0] // patch[0]) * (size[1] // patch[1])
    if image_size is not None and max_tokens is not None and tokens > max_tokens:
        raise ValueError(
            f"--image_size {size[0]}x{size[1]} makes {tokens} patch tokens per image ({patch[0]}x{patch[1]} "
            f"patches), more than the bound of {max_tokens} (ViT-B/16 at 1024 px); pass a smaller --image_size, "
            f"or --max_tokens {tokens} to run it anyway (attention's cost grows with the square of the tokens)."
        )
    return size


def preprocessing_from(
    settings: dict[str, Any] | None, size: tuple[int, int], max_pixels: int | None, name: str
) -> Preprocessing:
    """The Preprocessing at `size` that image processor `settings` describe (mean/std/rescale/resample)."""
    if settings is None:
        logger.warning("No %s for %s: normalising with mean 0.5, std 0.5.", PROCESSOR_FILE, name)
        return Preprocessing(image_size=size, max_pixels=max_pixels)
    normalize, rescale = settings.get("do_normalize", True), settings.get("do_rescale", True)
    std = settings.get("image_std", VIT_STD)
    if normalize and not all(math.isfinite(float(v)) and float(v) > 0 for v in std):
        raise ValueError(
            f"the {PROCESSOR_FILE} of {name} has image_std={list(std)}; every value must be positive (dividing by "
            "it would make NaN or infinite pixels). Restore the file the model was saved with."
        )
    return Preprocessing(
        image_size=size,
        mean=tuple(float(v) for v in settings.get("image_mean", VIT_MEAN)) if normalize else (0.0,) * 3,
        std=tuple(float(v) for v in settings.get("image_std", VIT_STD)) if normalize else (1.0,) * 3,
        rescale_factor=float(settings.get("rescale_factor", RESCALE_FACTOR)) if rescale else 1.0,
        resample=int(settings.get("resample", Image.Resampling.BICUBIC)),
        max_pixels=max_pixels,
    )


__all__ = ["Preprocessing", "check_image_size", "preprocessing_from"]
