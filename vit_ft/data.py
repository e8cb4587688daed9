"""Data layer for image-classification fine-tuning: load splits, screen bad files, transform, collate.

Typical use (the trainer script's "data" stage)::

    splits, names = load_image_datasets(train_dir="data/digits/train", validation_dir="data/digits/test")
    for split in splits:
        splits[split] = drop_bad_images(splits[split], "image", logger)
        splits[split] = splits[split].cast_column("image", datasets.Image(decode=False))
    train = splits["train"].with_transform(build_transforms(size, mean, std, train=True))
    # Trainer(..., data_collator=collate_fn, args=TrainingArguments(remove_unused_columns=False, ...))

Decoding happens in the transform, so the image column should be cast to `datasets.Image(decode=False)`:
then JPEGs are decoded at reduced size (draft mode) and a bad file cannot crash a worker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from PIL import Image

from .images import (
    DEFAULT_MAX_PIXELS,
    describe_source,
    image_extensions,
    load_image,
    random_resized_crop,
    resize_and_center_crop,
    to_normalized_tensor,
)

__all__ = [
    "ImageClassificationTransform",
    "build_transforms",
    "collate_fn",
    "drop_bad_images",
    "find_bad_images",
    "load_image_datasets",
    "write_digits_imagefolder",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------------------


class ImageClassificationTransform:
    """Batch transform for `datasets.Dataset.set_transform` / `with_transform`; see `build_transforms`.

    A class rather than a closure so that it pickles (DataLoader workers with spawn, `datasets` hashing).
    """

    def __init__(
        self,
        image_size: tuple[int, int],
        mean: Sequence[float],
        std: Sequence[float],
        train: bool,
        crop_scale: tuple[float, float],
        crop_ratio: tuple[float, float],
        horizontal_flip: bool,
        crop_pct: float,
        rescale_factor: float,
        resample: int,
        image_column: str,
        label_column: str,
        max_pixels: int | None,
        draft: bool,
    ) -> None:
        self.image_size = image_size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.train = train
        self.crop_scale = crop_scale
        self.crop_ratio = crop_ratio
        self.horizontal_flip = horizontal_flip
        self.crop_pct = crop_pct
        self.rescale_factor = rescale_factor
        self.resample = resample
        self.image_column = image_column
        self.label_column = label_column
        self.max_pixels = max_pixels
        self.draft = draft
        # Eval decodes for the resize, which covers (height, width) / crop_pct; train decodes for each drawn
        # crop instead (see vit_ft.images.random_resized_crop).
        self.min_decode_size = math.ceil(max(image_size) / crop_pct) if draft and not train else None

    def __repr__(self) -> str:
        mode = "train" if self.train else "eval"
        return (
            f"{type(self).__name__}({mode}, image_size={self.image_size}, mean={self.mean}, std={self.std}, "
            f"crop_scale={self.crop_scale}, horizontal_flip={self.horizontal_flip}, crop_pct={self.crop_pct}, "
            f"resample={Image.Resampling(self.resample).name}, draft={self.draft})"
        )

    def transform_image(self, image: Any) -> torch.Tensor:
        """One image (PIL, {"bytes", "path"} dict, path or bytes) -> float32 (channels, height, width)."""
        if self.train:
            img = random_resized_crop(
                image,
                self.image_size,
                self.crop_scale,
                self.crop_ratio,
                self.resample,
                self.max_pixels,
                self.draft,
            )
            if self.horizontal_flip and torch.rand(1).item() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            img = load_image(image, min_size=self.min_decode_size, max_pixels=self.max_pixels)
            img = resize_and_center_crop(img, self.image_size, self.crop_pct, self.resample)
        return to_normalized_tensor(img, self.mean, self.std, self.rescale_factor)

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        if self.image_column not in batch:
            raise KeyError(
                f"The batch has no image column {self.image_column!r} (columns: {sorted(batch)}). Pass "
                "image_column= to build_transforms, and with the HF Trainer set remove_unused_columns=False "
                "(otherwise it drops the image column before the transform sees it)."
            )
        pixel_values = []
        for image in batch[self.image_column]:
            try:
                pixel_values.append(self.transform_image(image))
            except Exception as error:  # any failure: one bad file must not kill an epoch
                logger.warning(
                    "Could not decode image %s (%s: %s); using a blank (mean-colour) image instead. "
                    "Run vit_ft.data.drop_bad_images on the split before training to remove it.",
                    describe_source(image),
                    type(error).__name__,
                    error,
                )
                pixel_values.append(torch.zeros(3, *self.image_size))
        output: dict[str, list] = {"pixel_values": pixel_values}
        if self.label_column in batch:
            output["labels"] = [int(label) for label in batch[self.label_column]]
        return output


def build_transforms(
    image_size: int | tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    train: bool,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    horizontal_flip: bool = True,
    crop_pct: float = 1.0,
    rescale_factor: float = 1 / 255,
    resample: int = Image.Resampling.BICUBIC,
    image_column: str = "image",
    label_column: str = "label",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    draft: bool = True,
) -> ImageClassificationTransform:
    """Batch transform {image_column: [...], label_column: [...]} -> {"pixel_values": [(3, height, width)
    float32 tensor, ...], "labels": [int, ...]} for `Dataset.with_transform` / `set_transform`.

    Images may be `datasets.Image(decode=False)` values {"bytes", "path"} (the main path: decoding happens
    here, JPEGs at reduced size via draft mode, and a file that fails to decode becomes a blank image with a
    warning instead of an exception), PIL images (a decoded column: datasets decodes before this runs, so a
    bad file raises there), paths or bytes. Every image becomes 8-bit RGB first (see `vit_ft.images.to_rgb`).

    Train: torchvision's RandomResizedCrop(image_size, crop_scale, crop_ratio) then a horizontal flip with
    p=0.5, drawn from torch's global RNG (seed with `transformers.set_seed`). Eval: resize to cover
    image_size / crop_pct, then centre-crop image_size. Then (pixel * rescale_factor - mean) / std.

    Args:
        image_size: (height, width), or one int for a square.
        mean, std: per-channel statistics, the checkpoint image processor's `image_mean` / `image_std`.
        crop_pct: eval crop fraction; 1.0 (default) crops the whole shorter side, timm-style 0.875/0.9
            resize 224 / 0.875 = 256 first.
        rescale_factor: the image processor's `rescale_factor`, 1/255.
        resample: PIL resampling filter. Bicubic by default: Pillow's bicubic is antialiased when
            downscaling and sharper than bilinear, and it is what timm/big_vision ViT recipes evaluate with.
            Pass the checkpoint processor's `resample` (e.g. 2 = bilinear for google/vit-base-patch16-224)
            to match its preprocessing exactly.
        max_pixels: decompression-bomb limit per image; None disables it.
        draft: decode JPEGs at the largest 1/2, 1/4, 1/8 reduction that still keeps the output a
            downscale: of the resize in eval, of each drawn crop in train (the crop is drawn on the header's
            size before decoding).
    """
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size={image_size!r} must be a positive int or a (height, width) pair.")
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
    return ImageClassificationTransform(
        image_size=(int(size[0]), int(size[1])),
        mean=mean,
        std=std,
        train=train,
        crop_scale=tuple(crop_scale),
        crop_ratio=tuple(crop_ratio),
        horizontal_flip=horizontal_flip,
        crop_pct=crop_pct,
        rescale_factor=rescale_factor,
        resample=int(resample),
        image_column=image_column,
        label_column=label_column,
        max_pixels=max_pixels,
        draft=draft,
    )


def collate_fn(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Transformed examples -> {"pixel_values": (batch, channels, height, width), "labels": (batch,) long}.

    `labels` is left out when the examples have none (prediction on unlabelled images).
    """
    batch = {"pixel_values": torch.stack([example["pixel_values"] for example in examples])}
    if "labels" in examples[0]:
        batch["labels"] = torch.tensor([int(example["labels"]) for example in examples], dtype=torch.long)
    return batch


# ---------------------------------------------------------------------------------------------------------
# Bad files
# ---------------------------------------------------------------------------------------------------------


def _decode_error(value: Any, max_pixels: int | None) -> str:
    """'' when the image decodes, else the reason."""
    if value is None:
        return "missing image (null value)"
    try:
        # min_size=1 lets JPEGs decode at 1/8 scale: libjpeg still reads the whole entropy-coded stream, so
        # truncation and unreadable headers are caught as in a full decode (tests check truncation).
        load_image(value, min_size=1, max_pixels=max_pixels)
    except Exception as error:  # any failure makes the file unusable
        return f"{type(error).__name__}: {error}"
    return ""


def _as_undecoded_images(dataset: datasets.Dataset, image_column: str) -> datasets.Dataset:
    """Only `image_column`, cast to `datasets.Image(decode=False)` so rows are {"bytes", "path"} dicts."""
    if image_column not in dataset.column_names:
        raise KeyError(
            f"image_column={image_column!r} is not a column of the dataset; columns: {dataset.column_names}."
        )
    feature = dataset.features[image_column]
    if not isinstance(feature, datasets.Image) and feature != datasets.Value("string"):
        raise TypeError(
            f"Column {image_column!r} holds {feature}, not images; pass the column that holds "
            "datasets.Image values (or file paths) as image_column."
        )
    return dataset.select_columns([image_column]).cast_column(image_column, datasets.Image(decode=False))


def find_bad_images(
    dataset: datasets.Dataset,
    image_column: str = "image",
    num_proc: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> list[tuple[int, str, str]]:
    """Rows whose image cannot be decoded: [(row index, path or identifier, reason), ...], in row order.

    The column is read as `datasets.Image(decode=False)` (paths/bytes) and each image decoded with
    `load_image` (JPEG at 1/8 scale, which still catches truncation), so a file that passes here decodes in
    the transform. Catches missing files, non-images, truncated files and images over max_pixels.
    """
    raw = _as_undecoded_images(dataset, image_column)

    def check(values: list[Any], indices: list[int]) -> dict[str, list]:
        bad: dict[str, list] = {"index": [], "source": [], "reason": []}
        for value, index in zip(values, indices, strict=True):
            reason = _decode_error(value, max_pixels)
            if reason:
                bad["index"].append(index)
                bad["source"].append(describe_source(value) if value else f"{image_column}[{index}]")
                bad["reason"].append(reason)
        return bad

    result = raw.map(
        check,
        input_columns=[image_column],
        with_indices=True,
        batched=True,
        batch_size=256,
        remove_columns=[image_column],
        features=datasets.Features(
            {
                "index": datasets.Value("int64"),
                "source": datasets.Value("string"),
                "reason": datasets.Value("string"),
            }
        ),
        num_proc=num_proc,
        keep_in_memory=True,  # file contents can change between runs: never reuse a cached verdict
        load_from_cache_file=False,
        desc="Checking images",
    )
    return [
        (int(i), str(s), str(r))
        for i, s, r in zip(result["index"], result["source"], result["reason"], strict=True)
    ]


def drop_bad_images(
    dataset: datasets.Dataset,
    image_column: str,
    logger: logging.Logger,
    num_proc: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_listed: int = 5,
) -> datasets.Dataset:
    """`dataset` without the rows `find_bad_images` reports; logs how many and the first `max_listed`."""
    bad = find_bad_images(dataset, image_column, num_proc=num_proc, max_pixels=max_pixels)
    if not bad:
        logger.info("All %d images in column %r decode.", len(dataset), image_column)
        return dataset
    if len(bad) == len(dataset):
        raise ValueError(
            f"None of the {len(dataset)} images in column {image_column!r} decodes, e.g. {bad[0][1]} "
            f"({bad[0][2]}). Check the files, or that image_column names the image column."
        )
    listed = "; ".join(f"{source} ({reason})" for _, source, reason in bad[:max_listed])
    more = f"; and {len(bad) - max_listed} more" if len(bad) > max_listed else ""
    logger.warning(
        "Dropping %d of %d images that cannot be decoded: %s%s", len(bad), len(dataset), listed, more
    )
    bad_rows = {index for index, _, _ in bad}
    return dataset.select([i for i in range(len(dataset)) if i not in bad_rows])


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------

_VALIDATION_NAMES = ("validation", "valid", "val", "dev", "eval")


def _check_image_folder(folder: str | os.PathLike, argument: str) -> Path:
    """Fail early, naming the argument, unless folder is laid out as <folder>/<class>/<image>."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{argument}={os.fspath(folder)!r} is not a directory; pass a folder laid out as "
            "<folder>/<class name>/<image file>."
        )
    extensions = image_extensions()
    images = []
    for path in root.rglob("*"):
        relative = path.relative_to(root).parts
        # imagefolder skips hidden (".x") and "__x" entries; mirror that so both see the same files
        if any(part.startswith((".", "__")) for part in relative):
            continue
        if path.suffix.lower() in extensions and path.is_file():
            images.append(relative)
    if not images:
        raise FileNotFoundError(
            f"{argument}={os.fspath(folder)!r} holds no image files (looked for "
            f"{', '.join(sorted(extensions)[:8])}, ...); expected <folder>/<class name>/<image file>."
        )
    misplaced = [parts for parts in images if len(parts) != 2]
    if misplaced:
        raise ValueError(
            f"{argument}={os.fspath(folder)!r}: images must sit directly in class sub-folders "
            f"(<folder>/<class name>/<image file>), but {len(misplaced)} do not, e.g. "
            f"{os.path.join(*misplaced[0])!r}. Move them into a class folder (nested sub-folders are not "
            "classes)."
        )
    return root.resolve()


def _load_image_folder(root: Path, cache_dir: str | None) -> datasets.Dataset:
    """<root>/<class>/<image> -> Dataset(image, label: ClassLabel of the sub-folder names) via imagefolder."""
    return datasets.load_dataset(
        "imagefolder",
        data_files={"train": [os.path.join(str(root), "**")]},
        split="train",
        drop_labels=False,  # always label by sub-folder, even with a single class
        drop_metadata=True,  # the class is the sub-folder name, never a metadata file's column
        cache_dir=cache_dir,
    )


def _load_named(name: str, config: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    """A Hub dataset id (or anything `load_dataset` takes), or a folder written by `save_to_disk`."""
    local = Path(name).expanduser()
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        loaded = datasets.load_from_disk(str(local))
    else:
        loaded = datasets.load_dataset(name, config, cache_dir=cache_dir)
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


def _pick_split(splits: datasets.DatasetDict, split: str, argument: str, source: str) -> datasets.Dataset:
    if split not in splits:
        raise KeyError(
            f"{argument}={split!r} is not a split of {source}; available splits: {sorted(splits)}. "
            f"Pass one of them as {argument}."
        )
    return splits[split]


def _standard_columns(
    dataset: datasets.Dataset, image_column: str, label_column: str, where: str
) -> datasets.Dataset:
    """Keep only the image and label columns, named "image" and "label"; paths become datasets.Image."""
    for argument, column in (("image_column", image_column), ("label_column", label_column)):
        if column not in dataset.column_names:
            raise KeyError(
                f"{argument}={column!r} is not a column of {where}; available columns: "
                f"{dataset.column_names}. Pass the right name as {argument}."
            )
    if image_column == label_column:
        raise ValueError(f"image_column and label_column are both {image_column!r}; they must differ.")
    dataset = dataset.select_columns([image_column, label_column])
    dataset = dataset.rename_columns(
        {old: new for old, new in ((image_column, "image"), (label_column, "label")) if old != new}
    )
    image_feature = dataset.features["image"]
    if image_feature == datasets.Value("string"):
        dataset = dataset.cast_column("image", datasets.Image())
    elif not isinstance(image_feature, datasets.Image):
        raise TypeError(
            f"image_column={image_column!r} of {where} holds {image_feature}, not images or image paths; "
            "pass the column with datasets.Image values as image_column."
        )
    label_feature = dataset.features["label"]
    if not isinstance(label_feature, datasets.ClassLabel) and not (
        isinstance(label_feature, datasets.Value)
        and (label_feature.dtype in ("string", "large_string", "bool") or "int" in label_feature.dtype)
    ):
        raise TypeError(
            f"label_column={label_column!r} of {where} holds {label_feature}; single-label classification "
            "needs one class id (int) or class name (str) per image."
        )
    return dataset


def _label_strings(dataset: datasets.Dataset, where: str) -> tuple[set[str], Callable[[Any], str]]:
    """The distinct labels of a split as class names, and the value -> name function used to get them."""
    feature = dataset.features["label"]
    values = dataset.unique("label")
    if any(value is None for value in values):
        raise ValueError(f"{where} has rows without a label; remove them or fill them in.")
    if isinstance(feature, datasets.ClassLabel):
        if any(value < 0 for value in values):
            raise ValueError(
                f"{where} has rows labelled -1 (unlabelled, e.g. a hidden test set); it cannot be used for "
                "training or evaluation. Choose another split."
            )
        return {feature.int2str(int(value)) for value in values}, feature.int2str
    return {str(value) for value in values}, str


def _class_names(train: datasets.Dataset) -> list[str]:
    feature = train.features["label"]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    return [str(value) for value in sorted(train.unique("label"))]  # ints sort numerically, names by text


def _encode_labels(dataset: datasets.Dataset, names: list[str], where: str) -> datasets.Dataset:
    """Cast the label column to ClassLabel(names), mapping by class name; unknown classes are an error."""
    feature = dataset.features["label"]
    present, to_name = _label_strings(dataset, where)
    unknown = sorted(present - set(names))
    if unknown:
        raise ValueError(
            f"Class(es) {unknown} of {where} are not in the training split, whose classes are {names}. "
            "Add training images for them or remove them from this split."
        )
    if isinstance(feature, datasets.ClassLabel) and list(feature.names) == names:
        return dataset
    index = {name: i for i, name in enumerate(names)}
    features = dataset.features.copy()
    features["label"] = datasets.ClassLabel(names=names)
    return dataset.map(
        lambda labels: {"label": [index[to_name(label)] for label in labels]},
        input_columns=["label"],
        batched=True,
        features=features,
        desc=f"Encoding labels of {where}",
    )


def _subsample(
    dataset: datasets.Dataset, max_samples: int | None, seed: int, argument: str
) -> datasets.Dataset:
    """A seeded random subset (folders are sorted by class, so the first rows would be one class)."""
    if max_samples is None or max_samples >= len(dataset):
        return dataset
    if max_samples < 1:
        raise ValueError(f"{argument}={max_samples} must be a positive number of samples, or None for all.")
    return dataset.shuffle(seed=seed).select(range(max_samples))


def load_image_datasets(
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    train_dir: str | os.PathLike | None = None,
    validation_dir: str | os.PathLike | None = None,
    test_dir: str | os.PathLike | None = None,
    train_split: str = "train",
    validation_split: str | None = "validation",
    test_split: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    validation_split_percentage: float = 0.1,
    seed: int = 0,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    cache_dir: str | None = None,
) -> tuple[datasets.DatasetDict, list[str]]:
    """Load an image-classification dataset as splits "train", "validation" (and "test") with columns
    "image" (datasets.Image) and "label" (ClassLabel), plus the class names (id2label = dict(enumerate(names))).

    Source, exactly one of:
      - dataset_name: a Hub id loaded with `datasets.load_dataset(dataset_name, dataset_config)` (splits
        picked by train_split / validation_split / test_split), or a folder written by `save_to_disk`;
      - train_dir (+ validation_dir, test_dir): image folders <dir>/<class name>/<image file>, loaded with
        datasets' imagefolder builder; the class is the sub-folder name.

    Labels: class names come from the training split (a ClassLabel's names, else the sorted distinct values,
    ints numerically); the other splits are encoded by name, and a class missing from training is an error.
    Without a validation split (validation_split absent or None, or no validation_dir), a seeded stratified
    `validation_split_percentage` fraction of train becomes validation; 0 means no "validation" split at all.
    max_train_samples / max_eval_samples then take seeded random subsets (eval: validation and test).
    """
    if (dataset_name is None) == (train_dir is None):
        raise ValueError(
            "Pass exactly one data source: dataset_name (a Hub dataset id or a save_to_disk folder) or "
            f"train_dir (an image folder); got dataset_name={dataset_name!r}, train_dir={train_dir!r}."
        )
    if dataset_name is not None and (validation_dir is not None or test_dir is not None):
        raise ValueError(
            "validation_dir / test_dir go with train_dir; with dataset_name, pick splits with "
            "validation_split / test_split."
        )

    raw: dict[str, tuple[datasets.Dataset, str]] = {}  # split -> (dataset, description for errors)
    if dataset_name is not None:
        source = f"dataset {dataset_name!r}" + (f" (config {dataset_config!r})" if dataset_config else "")
        available = _load_named(dataset_name, dataset_config, cache_dir)
        raw["train"] = (
            _pick_split(available, train_split, "train_split", source),
            f"split {train_split!r} of {source}",
        )
        if validation_split is not None and validation_split in available:
            raw["validation"] = (available[validation_split], f"split {validation_split!r} of {source}")
        elif validation_split is not None:
            similar = [s for s in available if s.lower() in _VALIDATION_NAMES]
            if similar:
                raise KeyError(
                    f"validation_split={validation_split!r} is not a split of {source}; available splits: "
                    f"{sorted(available)}. Pass validation_split={similar[0]!r}, or validation_split=None to "
                    f"hold out {validation_split_percentage:.0%} of {train_split!r} instead."
                )
        if test_split is not None:
            raw["test"] = (
                _pick_split(available, test_split, "test_split", source),
                f"split {test_split!r} of {source}",
            )
    else:
        folders = {
            split: (argument, folder, _check_image_folder(folder, argument))
            for split, argument, folder in (
                ("train", "train_dir", train_dir),
                ("validation", "validation_dir", validation_dir),
                ("test", "test_dir", test_dir),
            )
            if folder is not None
        }
        for split, (argument, folder, root) in folders.items():
            raw[split] = (_load_image_folder(root, cache_dir), f"{argument}={os.fspath(folder)!r}")

    splits = {
        split: _standard_columns(dataset, image_column, label_column, where)
        for split, (dataset, where) in raw.items()
    }
    names = _class_names(splits["train"])
    for split, (_, where) in raw.items():
        splits[split] = _encode_labels(splits[split], names, where)
    train_classes, _ = _label_strings(splits["train"], raw["train"][1])
    for split in ("validation", "test"):
        if split in splits:
            missing = sorted(_label_strings(splits[split], raw[split][1])[0] - train_classes)
            if missing:
                raise ValueError(
                    f"Class(es) {missing} of {raw[split][1]} have no training images in {raw['train'][1]}. "
                    "Add training images for them or remove them from this split."
                )
    if "validation" not in splits and validation_split_percentage == 0:
        logger.info("No validation split and validation_split_percentage=0: training without one.")
    elif "validation" not in splits:
        splits["train"], splits["validation"] = _hold_out(splits["train"], validation_split_percentage, seed)
        logger.info(
            "No validation split: held out %.0f%% of train (stratified, seed=%d).",
            100 * validation_split_percentage,
            seed,
        )

    splits["train"] = _subsample(splits["train"], max_train_samples, seed, "max_train_samples")
    for split in ("validation", "test"):
        if split in splits:
            splits[split] = _subsample(splits[split], max_eval_samples, seed, "max_eval_samples")
    result = datasets.DatasetDict(
        {split: splits[split] for split in ("train", "validation", "test") if split in splits}
    )
    logger.info(
        "Loaded %s with %d classes.", ", ".join(f"{k}: {len(v)}" for k, v in result.items()), len(names)
    )
    return result, names


def _hold_out(
    train: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    if not 0 < fraction < 1:
        raise ValueError(
            f"validation_split_percentage={fraction} must be a fraction in [0, 1), e.g. 0.1 to hold out 10% "
            "of train as validation, or 0 for no validation split; or provide one (validation_dir / "
            "validation_split)."
        )
    try:
        parts = train.train_test_split(test_size=fraction, stratify_by_column="label", seed=seed)
    except ValueError as error:
        counts = Counter(train["label"])
        raise ValueError(
            f"Cannot hold out a stratified validation_split_percentage={fraction} of {len(train)} training "
            f"images over {len(counts)} classes (smallest class: {min(counts.values())} images): {error} "
            "Raise validation_split_percentage, add images, or provide a validation split."
        ) from error
    return parts["train"], parts["test"]


# ---------------------------------------------------------------------------------------------------------
# Built-in smoke dataset
# ---------------------------------------------------------------------------------------------------------

_DIGITS_MARKER = "digits.json"


def _count_pngs(root: Path) -> dict[str, int]:
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
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        counts = {}
        for split, split_idx in (("train", train_idx), ("test", test_idx)):
            for digit in range(10):
                (staging / split / str(digit)).mkdir(parents=True)
            for i in split_idx:
                Image.fromarray(pixels[i]).save(staging / split / str(digits.target[i]) / f"{i}.png")
            counts[split] = len(split_idx)
        marker = {**settings, "counts": counts}
        (staging / _DIGITS_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(staging, root)  # atomic; fails if another process got there first
        except OSError:
            if not _digits_complete(root, settings):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
