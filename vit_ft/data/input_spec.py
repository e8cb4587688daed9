"""What a model sees of an image, decided once: `InputSpec`, a (height, width) resolution or a NaFlex patch budget
(SigLIP 2: each image at its own aspect ratio, resized to at most `max_num_patches` patches), with the
normalisation its image processor states. The fine-tune, the tools and the exports build their transforms from it
(`eval_transform`, `train_transform`) and from nothing else; `input_spec` reads it from a model's config and its
image processor (the object, or its `preprocessor_config.json` settings)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from PIL import Image

from ..utils.run_record import PROCESSOR_FILE
from .images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from .random_crops import CROP_SCALE
from .transforms import ImageClassificationTransform, build_transforms

logger = logging.getLogger("vit_ft")


@dataclass(frozen=True)
class InputSpec:
    """The evaluation geometry and normalisation: resize + centre crop to `image_size`, or with `max_num_patches`
    NaFlex patches at each image's own aspect ratio; then normalise."""

    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = VIT_MEAN
    std: tuple[float, ...] = VIT_STD
    rescale_factor: float = RESCALE_FACTOR
    resample: int = Image.Resampling.BICUBIC  # what vit_ft fine-tunes and evaluates with
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    max_num_patches: int | None = None  # NaFlex (the model's config): each image at its own aspect ratio
    patch_size: int = 16

    @property
    def naflex(self) -> bool:
        """Whether batches are NaFlex patches (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`) rather
        than `(batch, channels, height, width)` pixels."""
        return self.max_num_patches is not None

    def describe(self) -> str:
        if self.naflex:
            return f"NaFlex: up to {self.max_num_patches} patches of {self.patch_size} px per image at its own aspect ratio"
        return f"{self.image_size[0]}x{self.image_size[1]} px"

    def _transform(self, train: bool, **options: Any) -> ImageClassificationTransform:
        return build_transforms(
            self.image_size, mean=self.mean, std=self.std, train=train, rescale_factor=self.rescale_factor,
            resample=self.resample, max_pixels=self.max_pixels, max_num_patches=self.max_num_patches,
            patch_size=self.patch_size, **options,
        )  # fmt: skip

    def eval_transform(self) -> ImageClassificationTransform:
        """Resize to cover, centre-crop, normalise (`data.transforms.build_transforms`); NaFlex patches instead."""
        return self._transform(train=False)

    def train_transform(
        self,
        crop_scale: tuple[float, float] = CROP_SCALE,
        horizontal_flip: bool = True,
        seed: int | None = None,
        augmentation: Any = None,
    ) -> ImageClassificationTransform:
        """The fine-tune's: random-resized crop + flip (+ `augmentation`) drawn per (seed, epoch, index). Square
        inputs return uint8 crops, the rest per batch on the training device (`BatchAugmentation`); NaFlex grids
        differ from image to image, so everything runs in the workers."""
        return self._transform(
            train=True, crop_scale=crop_scale, horizontal_flip=horizontal_flip, seed=seed,
            device_augmentation=not self.naflex, **({} if augmentation is None else {"augmentation": augmentation}),
        )  # fmt: skip


def input_spec(
    processor: Any,
    config: Any,
    size: tuple[int, int] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    name: str = "the model",
) -> InputSpec:
    """The InputSpec of a model: its image `processor` (an image processor, its settings as a dict, or None:
    mean 0.5, std 0.5 with a warning), at `size` (default: the model `config`'s `image_hw`), and the config's
    NaFlex patch budget where it has one (`max_num_patches`)."""
    settings = processor.to_dict() if hasattr(processor, "to_dict") else processor
    size = tuple(size if size is not None else config.image_hw)
    budget = getattr(config, "max_num_patches", None)
    naflex = {} if budget is None else {"max_num_patches": int(budget), "patch_size": int(config.patch_hw[0])}
    if settings is None:
        logger.warning("No %s for %s: normalising with mean 0.5, std 0.5.", PROCESSOR_FILE, name)
        return InputSpec(image_size=size, max_pixels=max_pixels, **naflex)
    normalize, rescale = settings.get("do_normalize", True), settings.get("do_rescale", True)
    std = settings.get("image_std", VIT_STD)
    if normalize and not all(math.isfinite(float(v)) and float(v) > 0 for v in std):
        raise ValueError(
            f"the {PROCESSOR_FILE} of {name} has image_std={list(std)}; every value must be positive (dividing by "
            "it would make NaN or infinite pixels). Restore the file the model was saved with."
        )
    return InputSpec(
        image_size=size,
        mean=tuple(float(v) for v in settings.get("image_mean", VIT_MEAN)) if normalize else (0.0,) * 3,
        std=tuple(float(v) for v in std) if normalize else (1.0,) * 3,
        rescale_factor=float(settings.get("rescale_factor", RESCALE_FACTOR)) if rescale else 1.0,
        resample=int(settings.get("resample", Image.Resampling.BICUBIC)),
        max_pixels=max_pixels,
        **naflex,
    )


__all__ = ["InputSpec", "input_spec"]
