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

This module loads the splits (`load_image_datasets`: Hub datasets, `save_to_disk` folders and image folders,
with labels encoded by the training split's classes, a held-out validation split and seeded subsets). The
other jobs have their own modules: the image-folder layout checks in `vit_ft.data.image_folders`, the
transforms and collator in `vit_ft.data.transforms`, bad-file screening in `vit_ft.data.bad_images`, the
built-in digits folders in `vit_ft.data.digits`.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets

from .image_folders import folder_splits

__all__ = ["load_image_datasets"]

logger = logging.getLogger(__name__)

_VALIDATION_NAMES = ("validation", "valid", "val", "dev", "eval")


def _load_named(name: str, config: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    """A Hub dataset id (or anything `load_dataset` takes), or a folder written by `save_to_disk`."""
    local = Path(name).expanduser()
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        loaded = datasets.load_from_disk(str(local))
    else:
        try:
            loaded = datasets.load_dataset(name, config, cache_dir=cache_dir)
        except datasets.exceptions.DatasetNotFoundError as error:  # its message says what, not what to do
            raise FileNotFoundError(
                f"dataset_name={name!r} is neither a folder written by save_to_disk nor a dataset on the Hub "
                f"({str(error).rstrip('.')}). Check the id (owner/name, as on huggingface.co/datasets) or the path; for a "
                "private or gated dataset, log in first (hf auth login)."
            ) from error
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


def _pick_split(splits: datasets.DatasetDict, split: str, argument: str, source: str) -> datasets.Dataset:
    """splits[split], or a KeyError that lists the available splits for `argument`."""
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
    """The class names of the training split: a ClassLabel's names, else its sorted distinct labels."""
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
    _check_one_source(dataset_name, train_dir, validation_dir, test_dir)
    if dataset_name is not None:
        splits = (train_split, validation_split, test_split)
        raw = _named_splits(dataset_name, dataset_config, splits, validation_split_percentage, cache_dir)
    else:
        raw = folder_splits(train_dir, validation_dir, test_dir, cache_dir)
    labelled, names = _labelled_splits(raw, image_column, label_column)
    _add_validation_split(labelled, validation_split_percentage, seed)

    labelled["train"] = _subsample(labelled["train"], max_train_samples, seed, "max_train_samples")
    for split in ("validation", "test"):
        if split in labelled:
            labelled[split] = _subsample(labelled[split], max_eval_samples, seed, "max_eval_samples")
    result = datasets.DatasetDict(
        {split: labelled[split] for split in ("train", "validation", "test") if split in labelled}
    )
    logger.info(
        "Loaded %s with %d classes.", ", ".join(f"{k}: {len(v)}" for k, v in result.items()), len(names)
    )
    return result, names


def _check_one_source(
    dataset_name: str | None,
    train_dir: str | os.PathLike | None,
    validation_dir: str | os.PathLike | None,
    test_dir: str | os.PathLike | None,
) -> None:
    """Fail unless exactly one of dataset_name and train_dir is given, with folders only beside train_dir."""
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


def _named_splits(
    dataset_name: str,
    dataset_config: str | None,
    splits: tuple[str, str | None, str | None],
    validation_split_percentage: float,
    cache_dir: str | None,
) -> dict[str, tuple[datasets.Dataset, str]]:
    """The (train, validation, test) splits of a named dataset -> {split: (dataset, description for errors)}.

    A validation split that is asked for but absent is left out (to be held out of train), unless the
    dataset has a validation-like split under another name: then the error names it.
    """
    train_split, validation_split, test_split = splits
    source = f"dataset {dataset_name!r}" + (f" (config {dataset_config!r})" if dataset_config else "")
    available = _load_named(dataset_name, dataset_config, cache_dir)
    raw = {
        "train": (
            _pick_split(available, train_split, "train_split", source),
            f"split {train_split!r} of {source}",
        )
    }
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
    return raw


def _labelled_splits(
    raw: dict[str, tuple[datasets.Dataset, str]], image_column: str, label_column: str
) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Standard "image"/"label" columns with labels encoded by the training split's class names.

    Returns ({split: dataset}, class names); a class of another split without training images is an error.
    """
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
    return splits, names


def _add_validation_split(splits: dict[str, datasets.Dataset], fraction: float, seed: int) -> None:
    """Without a "validation" split, hold one out of train in place (none at all when fraction is 0)."""
    if "validation" in splits:
        return
    if fraction == 0:
        logger.info("No validation split and validation_split_percentage=0: training without one.")
        return
    splits["train"], splits["validation"] = _hold_out(splits["train"], fraction, seed)
    logger.info("No validation split: held out %.0f%% of train (stratified, seed=%d).", 100 * fraction, seed)


def _hold_out(
    train: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split train into (train, validation) with a seeded, stratified `fraction` held out."""
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
