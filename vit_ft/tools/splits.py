"""The `--dataset` of the tools that read training data (few-shot, audit): a folder of split folders
(`<split>/<class name>/<image>`), a `save_to_disk` folder or a Hub dataset id, whose splits and columns are then
picked by name (`vit_ft.data.datasets.load_image_datasets`, no hold-out split)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def is_image_folders(dataset: str | os.PathLike) -> bool:
    """Whether `dataset` is a local folder of split image folders (not a `save_to_disk` folder, nor a Hub id)."""
    root = Path(dataset).expanduser()
    saved = (root / "dataset_dict.json").is_file() or (root / "state.json").is_file()
    return root.is_dir() and not saved


def load_named_splits(source: Any) -> tuple[dict[str, Any], list[str]]:
    """{split: Dataset} and the class names of a saved or Hub dataset, by the names `source` gives (a tool's
    source: `dataset`, `dataset_config`, `train_split`, `test_split`, `image_column`, `label_column`, and a
    `validation_split` where it has one)."""
    from ..data.datasets import load_image_datasets

    return load_image_datasets(
        dataset_name=os.fspath(source.dataset), dataset_config=source.dataset_config,
        train_split=source.train_split, validation_split=getattr(source, "validation_split", None),
        test_split=source.test_split, image_column=source.image_column, label_column=source.label_column,
        validation_split_percentage=0,
    )  # fmt: skip


__all__ = ["is_image_folders", "load_named_splits"]
