"""The images of a few-shot evaluation: the train split (sampled from) and the test split (scored on) of a folder
with train/ and test/ image folders, a `save_to_disk` folder, or a Hub dataset, loaded with
`vit_ft.data.datasets.load_image_datasets` (test labels encoded by the training split's class names)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...utils.hub_ids import check_reference
from ..splits import is_image_folders, load_named_splits


@dataclass(frozen=True)
class FewShotSource:
    """Where the images are: `dataset` (a folder with train/ and test/, a save_to_disk folder or a Hub dataset
    id) and, for a saved or Hub dataset, its configuration, split names and columns."""

    dataset: str | os.PathLike
    dataset_config: str | None = None
    train_split: str = "train"
    test_split: str = "test"
    image_column: str = "image"
    label_column: str = "label"


@dataclass
class FewShotData:
    """The training and test splits: image values ({"bytes", "path"}), class ids, and the class names."""

    train_images: Sequence[Any]
    train_labels: np.ndarray  # (num_train,) int64
    test_images: Sequence[Any]
    test_labels: np.ndarray  # (num_test,) int64
    names: list[str]
    description: str


def _image_folders(root: Path, dataset: str | os.PathLike) -> tuple[dict[str, Any], list[str], str]:
    """`root`/train and `root`/test as image folders (`<split>/<class name>/<image>`); a missing one is named."""
    from ...data.datasets import load_image_datasets

    missing = [split for split in ("train", "test") if not (root / split).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"--dataset {dataset} has no {' or '.join(s + '/' for s in missing)} folder; few-shot evaluation "
            f"samples from {dataset}/train/<class name>/<image> and scores on {dataset}/test/<class name>/"
            "<image>: add the missing split."
        )
    splits, names = load_image_datasets(
        train_dir=root / "train", test_dir=root / "test", validation_split_percentage=0
    )
    return splits, names, f"image folders {os.fspath(dataset)}/{{train,test}}"


def _named_splits(source: FewShotSource) -> tuple[dict[str, Any], list[str], str]:
    """The train and test splits of a save_to_disk folder or a Hub dataset, by split and column names."""
    dataset = source.dataset
    try:
        splits, names = load_named_splits(source)
    except ConnectionError as error:  # huggingface_hub's offline mode is one too
        raise ConnectionError(
            f"--dataset {dataset} is no folder here and the Hub could not be reached "
            f"({' '.join(str(error).split())}); a Hub dataset needs the network: connect, or pass a folder "
            "with train/ and test/ image folders."
        ) from error
    splits_named = f"splits {source.train_split!r} and {source.test_split!r}"
    return splits, names, f"dataset {os.fspath(dataset)} ({splits_named})"


def load_fewshot_data(source: FewShotSource | str | os.PathLike) -> FewShotData:
    """The train and test splits of `source` (a FewShotSource, or just its `dataset`): a folder with train/ and
    test/ image folders, a `save_to_disk` folder, or a Hub dataset id (splits by name)."""
    import datasets

    source = source if isinstance(source, FewShotSource) else FewShotSource(source)
    if is_image_folders(source.dataset):
        splits, names, description = _image_folders(Path(source.dataset).expanduser(), source.dataset)
    else:
        expected = "a folder with train/ and test/ image folders, a save_to_disk folder, or a Hub dataset id"
        check_reference(source.dataset, f"--dataset {source.dataset}", expected, repo_type="dataset")
        splits, names, description = _named_splits(source)
    undecoded = {
        split: splits[split].cast_column("image", datasets.Image(decode=False)) for split in ("train", "test")
    }
    return FewShotData(
        train_images=undecoded["train"]["image"],
        train_labels=np.asarray(splits["train"]["label"], dtype=np.int64),
        test_images=undecoded["test"]["image"],
        test_labels=np.asarray(splits["test"]["label"], dtype=np.int64),
        names=list(names),
        description=description,
    )


__all__ = ["FewShotData", "FewShotSource", "load_fewshot_data"]
