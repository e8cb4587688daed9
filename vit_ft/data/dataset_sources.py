"""Named datasets: a Hub dataset id or a `save_to_disk` folder, and its train / validation / test splits picked
by name for `vit_ft.data.datasets.load_image_datasets`, each mistake a message that lists what there is."""

from __future__ import annotations

import os
from pathlib import Path

import datasets

__all__ = ["check_columns", "check_one_source", "named_splits"]

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



def check_columns(available: list[str], image_column: str, label_column: str, where: str) -> None:
    """A KeyError listing the `available` columns for an image or label column `where` lacks, and a ValueError
    when both name the same column."""
    for argument, column in (("image_column", image_column), ("label_column", label_column)):
        if column not in available:
            raise KeyError(
                f"{argument}={column!r} is not a column of {where}; available columns: {available}. "
                f"Pass the right name as {argument}."
            )
    if image_column == label_column:
        raise ValueError(f"image_column and label_column are both {image_column!r}; they must differ.")


def check_one_source(
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


def named_splits(
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
