"""Per-image transforms and the batch collator for image-classification fine-tuning.

`build_transforms` gives the batch transform for `datasets.Dataset.with_transform` (train: random resized crop
and flip; eval: resize and centre crop; then normalise) and `collate.collate_fn` stacks its output for the Trainer.
With `device_augmentation=True` the train transform stops after the crop and returns uint8 (channels, height,
width) crops, a quarter of float32's bytes across the DataLoader workers' boundary: the flip, the augmentation,
the normalisation and mixup then run per batch on the training device (`vit_ft.data.batch_augmentation`).

Decoding happens in the transform, so the image column should be cast to `datasets.Image(decode=False)`:
then JPEGs are decoded at reduced size (draft mode) and a bad file cannot crash a worker.

Augmentation randomness is a function of (seed, epoch, sample index) when the train transform has a seed and
the split an `INDEX_COLUMN`: a run resumed mid-epoch, whose Trainer skips the consumed batches without loading
them, then draws exactly the crops and flips of an uninterrupted run, whatever the workers or processes.
The optional `augmentation` (RandAugment, TrivialAugment, colour jitter, random erasing:
`vit_ft.data.augmentation`) draws from the same per-sample generator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from .bad_images import BadImage
from .collate import label_value
from .images import (
    DEFAULT_MAX_PIXELS,
    RESCALE_FACTOR,
    describe_source,
    load_image,
    resize_and_center_crop,
    to_normalized_tensor,
    to_uint8_tensor,
)
from .naflex import collate_patches, from_patches, resize_to_budget, to_patches
from .random_crops import CROP_RATIO, CROP_SCALE, random_resized_crop

__all__ = [
    "INDEX_COLUMN",
    "ImageClassificationTransform",
    "augmentation_seed",
    "build_transforms",
]

if TYPE_CHECKING:  # kornia (behind the augmentation) loads only when a spec is built
    from .augmentation import AugmentationSpec

# The train split's column of row positions (`training_split.set_transforms` adds it): a seeded train transform
# draws each image's crop and flip from a generator seeded by (seed, epoch, this index).
INDEX_COLUMN = "vit_ft_index"

# The data layer's logger, whichever of its modules logs: a bad image is reported under one name.
logger = logging.getLogger("vit_ft.data.datasets")


@dataclass(eq=False, repr=False)  # eq=False: compared and hashed by identity, as before
class ImageClassificationTransform:
    """Batch transform for `datasets.Dataset.set_transform` / `with_transform`; `build_transforms` checks the
    settings and says what it does. A class rather than a closure so that it pickles (DataLoader workers with
    spawn, `datasets` hashing).
    """

    image_size: tuple[int, int]  # (height, width); build_transforms takes one int for a square
    mean: Sequence[float]  # per-channel statistics: the checkpoint image processor's image_mean / image_std
    std: Sequence[float]
    train: bool
    crop_scale: tuple[float, float]  # train: RandomResizedCrop's area fraction and aspect-ratio ranges
    crop_ratio: tuple[float, float]
    horizontal_flip: bool
    # eval crop fraction; 1.0 crops the whole shorter side, timm-style 0.875/0.9 resize 224 / 0.875 = 256 first
    crop_pct: float
    rescale_factor: float  # the image processor's rescale_factor, 1/255
    # PIL resampling filter. Bicubic by default: Pillow's bicubic is antialiased when downscaling and sharper than
    # bilinear, and it is what timm/big_vision ViT recipes evaluate with. Pass the checkpoint processor's
    # `resample` (e.g. 2 = bilinear for google/vit-base-patch16-224) to match its preprocessing exactly.
    resample: int
    image_column: str
    label_column: str
    max_pixels: int | None  # decompression-bomb limit per image; None disables it
    # decode JPEGs at the largest 1/2, 1/4, 1/8 reduction that still keeps the output a downscale: of the resize
    # in eval, of each drawn crop in train (the crop is drawn on the header's size before decoding)
    draft: bool
    seed: int | None = None  # train only: the augmentation a function of (seed, epoch, sample index)
    # train only: RandAugment / TrivialAugment / colour jitter on the crop, then random erasing after
    # normalisation (`vit_ft.data.augmentation`), drawn from the same per-sample generator. None (default) or an
    # inactive spec: crop and flip only.
    augmentation: AugmentationSpec | None = None
    # train only: return the crop as uint8 (channels, height, width) and leave the flip, the augmentation and
    # the normalisation to `batch_augmentation.BatchAugmentation` (per batch on the training device, each image
    # its own draws); the eval transform is unchanged
    device_augmentation: bool = False
    # NaFlex (`vit_ft.data.naflex`): each image at its own aspect ratio, resized to at most this many `patch_size`
    # patches (train: a random crop about its aspect ratio and a flip first; no crop in eval) -> `pixel_values`
    # `(rows * columns, patch * patch * 3)` and `spatial_shapes`; `collate_fn` pads and masks them. Not with
    # `device_augmentation` (its batches are square crops).
    max_num_patches: int | None = None
    patch_size: int = 16

    def __post_init__(self) -> None:
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        self.crop_scale, self.crop_ratio = tuple(self.crop_scale), tuple(self.crop_ratio)
        self.resample = int(self.resample)
        # In shared memory: DataLoader workers (persistent ones too) read the epoch the main process sets.
        seeded_train = self.train and self.seed is not None
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_() if seeded_train else None
        # Eval decodes for the resize, which covers (height, width) / crop_pct; train decodes for each drawn
        # crop instead (see vit_ft.data.random_crops.random_resized_crop).
        self.min_decode_size = (
            math.ceil(max(self.image_size) / self.crop_pct) if self.draft and not self.train else None
        )
        # train only: eval never augments; the device path augments per batch (vit_ft.data.batch_augmentation)
        self.crops_only = self.train and self.device_augmentation
        in_worker = self.train and not self.crops_only and self.augmentation is not None
        self._augment = self.augmentation.build() if in_worker else None
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std_t = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)

    def __repr__(self) -> str:
        mode = "train" if self.train else "eval"
        return (
            f"{type(self).__name__}({mode}, image_size={self.image_size}, mean={self.mean}, std={self.std}, "
            f"crop_scale={self.crop_scale}, horizontal_flip={self.horizontal_flip}, crop_pct={self.crop_pct}, "
            f"resample={Image.Resampling(self.resample).name}, draft={self.draft}, seed={self.seed}"
            + (f", augmentation={self.augmentation.describe()!r}" if self._augments else "")
            + (", device_augmentation=True)" if self.crops_only else ")")
        )

    @property
    def _augments(self) -> bool:
        """Whether the augmentation applies (in the workers, or per batch on the device)."""
        return self.train and self.augmentation is not None and self.augmentation.active

    def describe(self) -> str:
        """What the transform does to an image, in a few words (figure titles, logs)."""
        naflex = f"its own aspect ratio, at most {self.max_num_patches} patches (NaFlex)" if self.max_num_patches else ""
        if not self.train:
            if naflex:
                return f"resize to {naflex}"
            return f"resize + centre crop (crop_pct {self.crop_pct:g}) to {self.image_size[0]}x{self.image_size[1]}"
        low, high = self.crop_scale
        to = naflex or f"{self.image_size[0]}x{self.image_size[1]}"
        parts = [f"random resized crop (scale {low:g}-{high:g}) to {to}"]
        parts += ["flip"] if self.horizontal_flip else []
        parts += [self.augmentation.describe()] if self._augments else []
        return " + ".join(parts)

    def to_image(self, pixels: torch.Tensor) -> Image.Image:
        """One output of this transform (normalised `(channels, height, width)` pixels, or an image's patches) back
        to 8-bit RGB: pixels * std + mean, over the rescale (figures)."""
        if self.max_num_patches is not None:
            pixels = from_patches(pixels, self.patch_size)
        values = (pixels * self._std_t + self._mean_t) / (255 * self.rescale_factor)  # [0, 1] whatever the rescale
        return Image.fromarray((values.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())

    def on_workers(self) -> ImageClassificationTransform:
        """This transform with everything in the workers again (float32 output, as without
        `device_augmentation`): the per-image reference of what a batch sees, for figures and benchmarks."""
        return dataclasses.replace(self, device_augmentation=False)

    @property
    def epoch(self) -> int:
        """The epoch whose augmentations a seeded train transform draws (0 until `set_epoch`)."""
        return int(self._epoch) if self._epoch is not None else 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the augmentations of `epoch` from now on, in this process and in its DataLoader workers."""
        if self._epoch is None:
            raise ValueError(
                "set_epoch needs a train transform with a seed: build_transforms(train=True, seed=...)."
            )
        self._epoch.fill_(int(epoch))

    def sample_generator(self, index: int) -> torch.Generator:
        """The generator of sample `index`'s crop and flip in the current epoch (see `augmentation_seed`)."""
        return torch.Generator().manual_seed(augmentation_seed(self.seed, self.epoch, index))

    def transform_image(self, image: Any, generator: torch.Generator | None = None) -> torch.Tensor:
        """One image (PIL, {"bytes", "path"} dict, path or bytes) -> float32 (channels, height, width), or
        the uint8 crop with `device_augmentation`.

        Train draws the crop, the flip and the augmentation from `generator`, or from torch's global RNG
        when None. With `max_num_patches`: NaFlex patches `(rows, columns, patch * patch * channels)`.
        """
        if self.max_num_patches is not None:
            return self._naflex(image, generator)
        if self.train:
            img = random_resized_crop(
                image,
                self.image_size,
                self.crop_scale,
                self.crop_ratio,
                self.resample,
                self.max_pixels,
                self.draft,
                generator,
            )
            if self.crops_only:
                return to_uint8_tensor(img)
            if self.horizontal_flip and torch.rand(1, generator=generator).item() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if self._augment is not None:
                return self._augmented(img, generator)
        else:
            img = load_image(image, min_size=self.min_decode_size, max_pixels=self.max_pixels)
            img = resize_and_center_crop(img, self.image_size, self.crop_pct, self.resample)
        return to_normalized_tensor(img, self.mean, self.std, self.rescale_factor)

    def _naflex(self, image: Any, generator: torch.Generator | None) -> torch.Tensor:
        """NaFlex (`naflex.py`): train crops a random box of the recipe's scale at an aspect ratio about the
        image's own (`crop_ratio` times it) and flips; then the crop, or the whole image in eval, is resized to its
        size under the patch budget (`Siglip2ImageProcessor`'s rule), normalised (augmented in train) and cut into
        `(rows, columns, patch * patch * channels)` patches."""
        img = load_image(image, max_pixels=self.max_pixels)
        crop = (self.crop_scale, self.crop_ratio) if self.train else None
        img = resize_to_budget(img, self.patch_size, self.max_num_patches, self.resample, crop, generator)
        if self.train and self.horizontal_flip and torch.rand(1, generator=generator).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self.train and self._augment is not None:
            return to_patches(self._augmented(img, generator), self.patch_size)
        return to_patches(to_normalized_tensor(img, self.mean, self.std, self.rescale_factor), self.patch_size)

    def collate(self, pixels: list[torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        """This transform's outputs -> the model's input: `(batch, channels, height, width)` pixels, or with
        `max_num_patches` the padded NaFlex batch (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`)."""
        if self.max_num_patches is None:
            return torch.stack(pixels)
        return collate_patches(pixels, [grid.shape[:2] for grid in pixels])

    def _augmented(self, img: Image.Image, generator: torch.Generator | None) -> torch.Tensor:
        """The augmentation of the cropped, flipped `img`, normalised; its draws seeded from `generator`."""
        pixels = to_normalized_tensor(img, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), self.rescale_factor)  # [0, 1]
        # one 32-bit seed (all a CPU generator keeps) for kornia, which draws from the global RNG
        seed = None if generator is None else int(torch.randint(2**32, (1,), generator=generator))
        return self._augment(pixels, self._mean_t, self._std_t, seed)

    def _blank(self) -> torch.Tensor:
        """A bad evaluation image's stand-in: the mean colour (zeros once normalised); training skips its bad
        images instead (`BadImage`). NaFlex: one patch of it."""
        if self.max_num_patches is not None:
            return torch.zeros(1, 1, self.patch_size * self.patch_size * 3)
        return torch.zeros(3, *self.image_size)

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        if self.image_column not in batch:
            raise KeyError(
                f"The batch has no image column {self.image_column!r} (columns: {sorted(batch)}). Pass "
                "image_column= to build_transforms, and with the HF Trainer set remove_unused_columns=False "
                "(otherwise it drops the image column before the transform sees it)."
            )
        images = batch[self.image_column]
        # per-sample generators when seeded and indexed; else the global RNG (the draws then depend on the order)
        indices = batch.get(INDEX_COLUMN) if self._epoch is not None else None
        generators = (
            [self.sample_generator(int(i)) for i in indices] if indices is not None else [None] * len(images)
        )
        pixel_values = []
        for image, generator in zip(images, generators, strict=True):
            try:
                pixel_values.append(self.transform_image(image, generator))
            except Exception as error:  # any failure: one bad file must not kill an epoch
                if self.train:  # skipped, counted and named by the collator: vit_ft.data.bad_images
                    pixel_values.append(BadImage.of(image, error))
                    continue
                logger.warning(
                    "Could not decode image %s (%s: %s); using a blank (mean-colour) image instead. "
                    "Run vit_ft.data.bad_images.drop_bad_images on the split before training to remove it.",
                    describe_source(image),
                    type(error).__name__,
                    error,
                )
                pixel_values.append(self._blank())
        output: dict[str, list] = {"pixel_values": pixel_values}
        if self.max_num_patches is not None:  # NaFlex: each image's patches and its grid (a skipped one: none)
            grids = [p.shape[:2] if isinstance(p, torch.Tensor) else (0, 0) for p in pixel_values]
            output["spatial_shapes"] = [list(grid) for grid in grids]
            output["pixel_values"] = [p.flatten(0, 1) if isinstance(p, torch.Tensor) else p for p in pixel_values]
        if self.label_column in batch:
            output["labels"] = [label_value(label) for label in batch[self.label_column]]
        if self.train and INDEX_COLUMN in batch:  # for a batch-level mix seeded by its images (data.mixup)
            output[INDEX_COLUMN] = [int(i) for i in batch[INDEX_COLUMN]]
        return output


def build_transforms(
    image_size: int | tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    train: bool,
    crop_scale: tuple[float, float] = CROP_SCALE,
    crop_ratio: tuple[float, float] = CROP_RATIO,
    horizontal_flip: bool = True,
    crop_pct: float = 1.0,
    rescale_factor: float = RESCALE_FACTOR,
    resample: int = Image.Resampling.BICUBIC,
    image_column: str = "image",
    label_column: str = "label",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    seed: int | None = None,
    augmentation: AugmentationSpec | None = None,
    device_augmentation: bool = False,
    max_num_patches: int | None = None,
    patch_size: int = 16,
) -> ImageClassificationTransform:
    """Batch transform {image_column: [...], label_column: [...]} -> {"pixel_values": [(3, height, width)
    float32 tensor, ...], "labels": [int, ...]} for `Dataset.with_transform` / `set_transform`.

    Images may be `datasets.Image(decode=False)` values {"bytes", "path"} (the main path: decoding happens
    here, JPEGs at reduced size via draft mode, and a file that fails to decode becomes, instead of an exception,
    a `bad_images.BadImage` in train, which the training collator skips, or a blank image with a warning in
    eval), PIL images (a decoded column: datasets decodes before this runs, so a bad file raises there), paths or
    bytes. Every image becomes 8-bit RGB first (see `vit_ft.data.images.to_rgb`).

    Train: torchvision's RandomResizedCrop(image_size, crop_scale, crop_ratio) then a horizontal flip with
    p=0.5, then `augmentation` if given. With `seed`, an image whose batch carries its row position in
    `INDEX_COLUMN` draws all of them from a generator seeded by (seed, epoch, index), the epoch set with
    `set_epoch` (the fine-tune's callback does it at each epoch's start): the augmentation of a sample then
    depends on nothing else, not on the order of loading, the batches a resumed run skips, the DataLoader
    workers or the process. Otherwise they are drawn from torch's global RNG (seed with
    `transformers.set_seed`). The train output passes `INDEX_COLUMN` on, for `vit_ft.data.mixup` (the plain
    `collate_fn` drops it). Eval: resize to cover image_size / crop_pct, then centre-crop image_size. Then
    (pixel * rescale_factor - mean) / std. Each argument is documented on `ImageClassificationTransform`'s field.
    """
    _check_statistics_and_crops(mean, std, crop_scale, crop_ratio, crop_pct)
    if max_num_patches is not None and device_augmentation and train:
        raise ValueError(
            "max_num_patches (NaFlex) needs the augmentation in the workers: build the train transform with "
            "device_augmentation=False."
        )
    return ImageClassificationTransform(  # the fields in the signature's order
        _height_width(image_size), mean, std, train, crop_scale, crop_ratio, horizontal_flip, crop_pct,
        rescale_factor, resample, image_column, label_column, max_pixels, draft, seed, augmentation,
        device_augmentation, max_num_patches, patch_size)  # fmt: skip


def augmentation_seed(seed: int, epoch: int, index: int, stream: str = "") -> int:
    """The generator seed of sample `index`'s augmentation in `epoch` of a run seeded with `seed`.

    A hash rather than arithmetic (seed + epoch * n + index) so that neighbouring triples give unrelated
    streams. 32 bits, as torch's CPU generator keeps only the low 32 bits of a seed. `stream` names another,
    unrelated stream of the same sample ("" is the worker's crop; the device's per-batch draws use "batch").
    """
    key = f"{seed}/{epoch}/{index}" + (f"/{stream}" if stream else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0xFFFF_FFFF


def _height_width(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """`image_size` as an int (height, width) pair; an int is a square."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size={image_size!r} must be a positive int or a (height, width) pair.")
    return int(size[0]), int(size[1])


def _check_statistics_and_crops(
    mean: Sequence[float],
    std: Sequence[float],
    crop_scale: tuple[float, float],
    crop_ratio: tuple[float, float],
    crop_pct: float,
) -> None:
    """Raise a ValueError that names the fix for normalisation statistics or crop settings that cannot work."""
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(
            f"mean={list(mean)} and std={list(std)} need 3 values each (images are converted to RGB); "
            "pass the checkpoint image processor's image_mean and image_std."
        )
    if min(std) <= 0:
        raise ValueError(f"std={list(std)} must be positive.")
    if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
        raise ValueError(f"crop_scale={crop_scale} must satisfy 0 < low <= high <= 1, e.g. (0.08, 1.0).")
    if not 0 < crop_ratio[0] <= crop_ratio[1]:
        raise ValueError(f"crop_ratio={crop_ratio} must satisfy 0 < low <= high, e.g. (3/4, 4/3).")
    if not 0 < crop_pct <= 1:
        raise ValueError(f"crop_pct={crop_pct} must be in (0, 1]; 1.0 keeps the whole shorter side.")
