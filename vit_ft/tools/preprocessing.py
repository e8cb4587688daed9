"""The evaluation preprocessing of a trained model: its resolution (checked against the patch size and the token
bound by `vit_ft.model.checks.check_image_size`) and the normalisation its image processor states.
`trained.load_trained` builds it once per model."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from PIL import Image

from ..data.images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from ..data.transforms import ImageClassificationTransform, build_transforms
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
    max_num_patches: int | None = None  # NaFlex (the model's config): each image at its own aspect ratio
    patch_size: int = 16

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
            max_num_patches=self.max_num_patches,
            patch_size=self.patch_size,
        )


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


__all__ = ["Preprocessing", "preprocessing_from"]
