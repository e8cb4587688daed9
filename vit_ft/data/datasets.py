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
from collections.abc import Callable, Sequence
from typing import Any

import datasets

from .dataset_sources import check_columns, check_one_source, named_splits
from .label_files import labelled_folder_splits
from .multilabel import (
    MULTI_LABEL,
    SINGLE_LABEL,
    check_problem_type,
    data_report,
    is_multi_hot,
    label_kind,
    multi_hot_matrix,
    multi_label_names,
    split_multilabel,
    to_multi_hot,
)

__all__ = ["RECIPE_FIELDS", "is_multi_label_dataset", "load_image_datasets", "problem_type_of"]

logger = logging.getLogger(__name__)

# The recipe's keys (`DataArguments`) that `load_image_datasets` takes under the same name.
RECIPE_FIELDS = (
    "dataset_name", "dataset_config", "train_dir", "validation_dir", "test_dir", "train_split", "validation_split",
    "test_split", "image_column", "label_column", "validation_split_percentage", "max_train_samples",
    "max_eval_samples", "problem_type", "label_separator", "streaming",
)  # fmt: skip


def _standard_columns(
    dataset: datasets.Dataset, image_column: str, label_column: str, where: str
) -> datasets.Dataset:
    """Keep only the image and label columns, named "image" and "label"; paths become datasets.Image."""
    check_columns(dataset.column_names, image_column, label_column, where)
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
    try:
        label_kind(dataset.features, "label", f"label_column={label_column!r} of {where}")
    except ValueError as error:
        raise TypeError(str(error)) from None
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
    problem_type: str | None = None,
    label_names: Sequence[str] | None = None,
    label_separator: str = ";",
    streaming: bool = False,
) -> tuple[datasets.DatasetDict | dict[str, Any], list[str]]:
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

    Multi-label (from the data, or `problem_type`): a Sequence(ClassLabel), name-list or multi-hot column (names:
    `label_names`), or labels.csv / labels.jsonl folders (`vit_ft.data.label_files`, labels split by
    `label_separator`) give multi-hot float32 "label" vectors; the hold-out is iterative stratification. With
    `streaming`, dataset_name is read as streams and "train" is a `TrainStream` (`stream_splits`)."""
    if streaming:
        from .stream_splits import load_streamed_datasets, stream_source

        train = stream_source(dataset_name, dataset_config, train_split, cache_dir, max_train_samples)
        return load_streamed_datasets(train, validation_split, test_split, (image_column, label_column),
                                      validation_split_percentage, seed, max_eval_samples, problem_type, label_names)
    check_one_source(dataset_name, train_dir, validation_dir, test_dir)
    check_problem_type(problem_type)
    if dataset_name is not None:
        splits = (train_split, validation_split, test_split)
        raw = named_splits(dataset_name, dataset_config, splits, validation_split_percentage, cache_dir)
    else:
        folders = (train_dir, validation_dir, test_dir)
        raw, folder_names = labelled_folder_splits(folders, cache_dir, label_names, label_separator)
        label_names = folder_names or label_names
    labelled, names = _labelled_splits(raw, image_column, label_column, problem_type, label_names)
    _add_validation_split(labelled, validation_split_percentage, seed)
    result = _subsampled(labelled, max_train_samples, max_eval_samples, seed)
    _log_loaded(result, names)
    return result, names


def _log_loaded(splits: datasets.DatasetDict, names: list[str]) -> None:
    logger.info("Loaded %s with %d classes.", ", ".join(f"{k}: {len(v)}" for k, v in splits.items()), len(names))
    if is_multi_label_dataset(splits["train"]):
        report = data_report({split: multi_hot_matrix(ds) for split, ds in splits.items()}, names)
        logger.info("Multi-label data, positive images per label:\n%s", report)


def _subsampled(
    splits: dict[str, datasets.Dataset], max_train: int | None, max_eval: int | None, seed: int
) -> datasets.DatasetDict:
    """The splits in order train, validation, test, each a seeded subset (max_eval: validation and test)."""
    return datasets.DatasetDict(
        {
            split: _subsample(splits[split], *((max_train, seed, "max_train_samples") if split == "train"
                                              else (max_eval, seed, "max_eval_samples")))
            for split in ("train", "validation", "test")
            if split in splits
        }
    )  # fmt: skip


def is_multi_label_dataset(dataset: datasets.Dataset) -> bool:
    """Whether a split that `load_image_datasets` returned is multi-label (multi-hot "label" vectors)."""
    return is_multi_hot(dataset.features, "label")


def problem_type_of(dataset: datasets.Dataset) -> str:
    """The task a split that `load_image_datasets` returned is for, as transformers' `problem_type`: multi-hot
    "label" vectors are multi-label, class ids single-label (`vit_ft.tasks.task_for` takes it)."""
    return MULTI_LABEL if is_multi_label_dataset(dataset) else SINGLE_LABEL


def _labelled_splits(
    raw: dict[str, tuple[datasets.Dataset, str]],
    image_column: str,
    label_column: str,
    problem_type: str | None = None,
    label_names: Sequence[str] | None = None,
) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Standard "image"/"label" columns with labels encoded by the training split's class names.

    Returns ({split: dataset}, class names); a class of another split without training images is an error.
    Multi-label data (from the column's type, or `problem_type`) goes to `_multi_label_splits`.
    """
    splits = {
        split: _standard_columns(dataset, image_column, label_column, where)
        for split, (dataset, where) in raw.items()
    }
    kind = label_kind(splits["train"].features, "label")
    if problem_type == MULTI_LABEL or (problem_type is None and kind == "multi"):
        return _multi_label_splits(splits, raw, label_column, label_names)
    if kind == "multi":
        raise ValueError(
            f"problem_type={SINGLE_LABEL!r}, but label_column={label_column!r} of {raw['train'][1]} holds several "
            f"labels per image ({splits['train'].features['label']}); leave problem_type unset (or set it to "
            f"{MULTI_LABEL!r}) to train a multi-label classifier."
        )
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


def _as_label_lists(dataset: datasets.Dataset, where: str) -> datasets.Dataset:
    """A single-label "label" column as one-name lists (problem_type forced to multi-label)."""
    if label_kind(dataset.features, "label") == "multi":
        return dataset
    _, to_name = _label_strings(dataset, where)
    features = dataset.features.copy()
    features["label"] = datasets.List(datasets.Value("string"))
    return dataset.map(
        lambda labels: {"label": [[to_name(label)] for label in labels]},
        input_columns=["label"], batched=True, features=features, desc=f"Listing labels of {where}",
    )  # fmt: skip


def _multi_label_splits(
    splits: dict[str, datasets.Dataset],
    raw: dict[str, tuple[datasets.Dataset, str]],
    label_column: str,
    label_names: Sequence[str] | None,
) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """Every split's "label" as multi-hot float32 vectors over the training split's label names."""
    splits = {split: _as_label_lists(dataset, raw[split][1]) for split, dataset in splits.items()}
    names = multi_label_names(splits["train"], "label", label_names)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(
            f"label_column={label_column!r} of {raw['train'][1]} has the label names {names[:10]}; multi-label "
            "classification needs at least two distinct labels (label_names lists them in order)."
        )
    for split, (_, where) in raw.items():
        if not is_multi_hot(splits[split].features, "label") or splits[split].features["label"].length != len(
            names
        ):
            splits[split] = to_multi_hot(splits[split], "label", names, where)
    return splits, names


def _add_validation_split(splits: dict[str, datasets.Dataset], fraction: float, seed: int) -> None:
    """Without a "validation" split, hold one out of train in place (none at all when fraction is 0)."""
    if "validation" in splits:
        return
    if fraction == 0:
        logger.info("No validation split and validation_split_percentage=0: training without one.")
        return
    if is_multi_label_dataset(splits["train"]):
        splits["train"], splits["validation"] = split_multilabel(splits["train"], fraction, seed)
        how = "iterative stratification, every label with 2+ images in both parts"
    else:
        splits["train"], splits["validation"] = _hold_out(splits["train"], fraction, seed)
        how = "stratified"
    logger.info("No validation split: held out %.0f%% of train (%s, seed=%d).", 100 * fraction, how, seed)


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
