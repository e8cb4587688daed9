"""The built-in datasets, written from scikit-learn's digits with no download: their names (a recipe's
`builtin_dataset`) and `write_builtin_dataset`, which the fine-tune and the evaluation of a recorded fine-tune
both call to write a missing one's image folders."""

from __future__ import annotations

import os
from pathlib import Path

from .digits import write_digits_imagefolder, write_digits_multilabel_imagefolder

BUILTIN_DATASET_WRITERS = {
    "digits": write_digits_imagefolder,  # class folders
    "digits-multilabel": write_digits_multilabel_imagefolder,  # canvases with labels.csv
}
BUILTIN_DATASETS = tuple(BUILTIN_DATASET_WRITERS)


def write_builtin_dataset(name: str, train_dir: str | os.PathLike) -> Path:
    """Write the built-in dataset `name` (seed 0, as every fine-tune of it) into the parent of `train_dir`, which
    then holds its train/ and test/ folders; a complete one is left as it is. Returns that parent."""
    return BUILTIN_DATASET_WRITERS[name](Path(train_dir).parent, seed=0)


__all__ = ["BUILTIN_DATASETS", "BUILTIN_DATASET_WRITERS", "write_builtin_dataset"]
