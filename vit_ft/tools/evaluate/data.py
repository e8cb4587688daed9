"""Which images an evaluation runs on: the split a fine-tune recorded in `vit_ft_run.json` (test if it had
one, else validation; taken from the loaded model's `Origin`, not read again), rebuilt with
`vit_ft.data.datasets.load_image_datasets` from the same arguments and seed; or a recipe's split; or an image
folder with one sub-folder per class, or (multi-label) with labels.csv / labels.jsonl beside its images. Labels
are matched to the model's by name: a label of the data the model lacks is an error, a model label absent from
the data is not (a multi-label model's label then has no positive image, hence no AP).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ...data.builtin import BUILTIN_DATASETS, write_builtin_dataset
from ...data.datasets import is_multi_label_dataset, load_image_datasets
from ...data.image_folders import load_class_folder
from ...data.label_files import labels_file, read_labelled_folder
from ...data.multilabel import multi_hot_matrix
from ...metrics.multilabel import MULTI_LABEL
from ...utils.run_record import RUN_RECORD_FILE, recorded_seed
from ..trained import Origin

DATA_FIELDS = (
    "dataset_name", "dataset_config", "train_dir", "validation_dir", "test_dir", "train_split",
    "validation_split", "test_split", "image_column", "label_column", "validation_split_percentage",
    "max_eval_samples", "problem_type", "label_separator",
)  # fmt: skip


@dataclass
class EvalData:
    """Images to evaluate, their true labels as the model's label ids, and where they came from."""

    dataset: datasets.Dataset  # column "image" holds datasets.Image(decode=False) values {"bytes", "path"}
    # (num_images,) int64 model label ids, or for multi-label data (num_images, num_labels) float32 multi-hot
    # rows over the model's labels (a model label absent from the data: a column of zeros); None when the
    # caller uses the images only (inspect: `id2label=None`), so that no class need be the model's
    labels: np.ndarray | None
    description: str
    notes: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the local folders the images were read from

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def multi_label(self) -> bool:
        """Several labels (or none) per image: `labels` holds multi-hot rows."""
        return self.labels is not None and self.labels.ndim == 2


def _model_label_ids(
    names: Sequence[str], id2label: dict[int, str] | None, where: str, multi_label: bool = False
) -> list[int]:
    """The model's label id of each dataset class name; a class the model does not know is an error."""
    label2id = {name: i for i, name in id2label.items()}
    unknown = [name for name in names if name not in label2id]
    if unknown:
        known = list(id2label.values())
        fix = (
            "Remove them from its labels file, or evaluate a model fine-tuned with them."
            if multi_label
            else "Rename or remove those class folders."
        )
        raise ValueError(
            f"{where} has {'label' if multi_label else 'class'}(es) {unknown} that the model does not know; its "
            f"labels are {known[:20]}{' ...' if len(known) > 20 else ''}. {fix}"
        )
    return [label2id[name] for name in names]


def check_task(data_multi_label: bool, multi_label: bool | None, where: str) -> None:
    """A multi-label model needs multi-label data and a single-label one single-label data (`multi_label`
    None: either); a mismatch is a ValueError naming the data and the fix."""
    if multi_label is None or data_multi_label == multi_label:
        return
    if multi_label:
        raise ValueError(
            f"{where} has one label per image, but the model is multi-label ({MULTI_LABEL}); pass multi-label "
            "data: a --data_dir folder with labels.csv (columns file,labels; labels separated by ';') or "
            "labels.jsonl beside its images, or a --recipe with multi-label data."
        )
    raise ValueError(
        f"{where} is multi-label (several labels per image), but the model is a single-label classifier; pass "
        "data with one label per image (a --data_dir laid out as <folder>/<class name>/<image>), or a "
        "multi-label model."
    )


def _model_labels(
    dataset: datasets.Dataset, names: Sequence[str], id2label: dict[int, str] | None, where: str
) -> np.ndarray:
    """The dataset's labels as the model's: label ids (num_images,), or multi-hot rows (num_images,
    num_labels) with the dataset's columns moved to the model's label order."""
    multi_label = is_multi_label_dataset(dataset)
    ids = np.asarray(_model_label_ids(names, id2label, where, multi_label), dtype=np.int64)
    if not multi_label:
        return ids[np.asarray(dataset["label"], dtype=np.int64)]  # dataset class index -> model label id
    labels = np.zeros((len(dataset), len(id2label)), dtype=np.float32)
    labels[:, ids] = multi_hot_matrix(dataset)
    return labels


def _as_eval_data(
    dataset: datasets.Dataset,
    names: Sequence[str],
    id2label: dict[int, str] | None,
    description: str,
    max_samples: int | None,
    seed: int,
    sampled: str,
    multi_label: bool | None = None,
) -> EvalData:
    """`dataset`'s images with their classes as the model's label ids (multi-hot rows for multi-label data,
    which a model whose `multi_label` is given must match: `check_task`). With `max_samples` below its size,
    that many random images (the same ones for the same seed), and `sampled`, formatted with n and seed, is
    appended to the description."""
    check_task(is_multi_label_dataset(dataset), multi_label, description)
    if max_samples is not None and max_samples < len(dataset):
        dataset = dataset.shuffle(seed=seed).select(range(max_samples))
        description += sampled.format(n=max_samples, seed=seed)
    labels = None if id2label is None else _model_labels(dataset, names, id2label, description)
    dataset = dataset.select_columns(["image"]).cast_column("image", datasets.Image(decode=False))
    return EvalData(dataset, labels, description)


def data_from_fields(
    fields: dict[str, Any],
    id2label: dict[int, str] | None,
    split: str | None,
    seed: int,
    where: str,
    max_samples: int | None = None,
    multi_label: bool | None = None,
) -> EvalData:
    """The `split` ("test"/"validation"; default test if there is one) of the data that DataArguments-style
    `fields` describe, loaded as the fine-tune loaded it (same held-out split and subsets for the same seed;
    multi-label data with its recorded `problem_type`, `class_names` and `label_separator`)."""
    if fields.get("builtin_dataset") in BUILTIN_DATASETS and fields.get("train_dir"):
        write_builtin_dataset(fields["builtin_dataset"], fields["train_dir"])  # as the fine-tune writes it
    arguments = {name: fields[name] for name in DATA_FIELDS if name in fields}
    if fields.get("class_names") is not None:  # the names of a multi-hot label column
        arguments["label_names"] = fields["class_names"]
    try:
        splits, names = load_image_datasets(**arguments, seed=seed)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error} (data recorded by {where}; relative paths are read from the current folder: run from the "
            "folder the fine-tune ran in, or pass --data_dir / --recipe)."
        ) from error
    if split is None:
        split = "test" if "test" in splits else "validation"
    if split not in splits:
        raise ValueError(
            f"{where} has no {split!r} split; its splits are {sorted(splits)}; pass one of them."
        )
    source = fields.get("dataset_name") or fields.get(f"{split}_dir") or fields.get("train_dir")
    description = f"split {split!r} of {source} ({where}, seed {seed})"
    data = _as_eval_data(
        splits[split], names, id2label, description, max_samples, seed, ", {n} random images", multi_label
    )
    given = (fields.get(name) for name in ("dataset_name", "train_dir", "validation_dir", "test_dir"))
    data.folders = [str(folder) for folder in given if folder and Path(folder).expanduser().is_dir()]
    return data


def recorded_fields(origin: Origin, seed: int | None = None) -> tuple[dict[str, Any], int, str, list[str]]:
    """The data fields recorded in the model's run record (`origin.record`), the seed to split them with (`seed`,
    else the fine-tune's), where they come from, and a note when the seed had to be assumed."""
    info, model = origin.record, origin.name
    if info is None:
        raise FileNotFoundError(
            f"{model} has no {RUN_RECORD_FILE} (it is not a vit_ft fine-tune output folder), so there is no recorded "
            "evaluation data: pass --data_dir FOLDER (one sub-folder per class) or --recipe NAME."
        )
    notes = []
    if seed is None:
        seed = recorded_seed(info)
        if seed is None:
            seed = 0
            notes.append(
                "The fine-tune's seed is not recorded: seed 0 assumed. A held-out validation split and "
                "max_eval_samples subsets depend on it; pass --seed to match the fine-tune."
            )
    return info.get("data", {}), seed, f"{RUN_RECORD_FILE} of {model}", notes


def recipe_fields(recipe: str, seed: int | None = None) -> tuple[dict[str, Any], int, str, list[str]]:
    """A recipe's data fields, with the recipe's seed (TrainingArguments' 42 if it sets none) unless `seed` is
    given, and where they come from (as `recorded_fields`; no notes)."""
    from ...arguments.recipes import load_recipe, resolve_recipe

    values = load_recipe(resolve_recipe(recipe))
    if seed is None:
        seed = values.get("data_seed") if values.get("data_seed") is not None else values.get("seed", 42)
    return values, int(seed), f"recipe {recipe!r}", []


def _labelled_folder(
    folder: str | os.PathLike, id2label: dict[int, str] | None, separator: str
) -> tuple[datasets.Dataset, list[str]]:
    """A --data_dir with labels.csv / labels.jsonl read as multi-label data over its own label names (so that a
    label the model lacks is named by `_model_label_ids`), or over the model's when it names fewer than two."""
    try:
        return read_labelled_folder(folder, "--data_dir", None, separator)
    except ValueError:  # one label or none: read over the model's labels, which names an unknown one too
        if id2label is None:  # the images only: any labels will do
            raise
        return read_labelled_folder(folder, "--data_dir", list(id2label.values()), separator)


def folder_eval_data(
    folder: str | os.PathLike,
    id2label: dict[int, str] | None,
    max_samples: int | None = None,
    seed: int = 0,
    multi_label: bool | None = None,
    separator: str = ";",
) -> EvalData:
    """All images of `folder`/<class name>/<image>; class names are matched to the model's label names.
    Hidden class folders are skipped, as the fine-tune skips them; mistakes name `--data_dir`. A folder with
    labels.csv / labels.jsonl beside its images (labels separated by `separator`) is multi-label data, every
    image listed there. A model's `multi_label` (None: either) must match the folder's (`check_task`)."""
    description = f"image folder {os.fspath(folder)}"
    where = f"--data_dir {os.fspath(folder)}"
    if multi_label and not Path(folder).expanduser().is_dir():
        raise FileNotFoundError(
            f"{where} is not a folder; pass a folder of images with labels.csv beside them"
        )
    has_labels_file = Path(folder).expanduser().is_dir() and labels_file(folder, "--data_dir") is not None
    if multi_label and not has_labels_file:
        raise ValueError(
            f"{where} has no labels.csv or labels.jsonl, but the model is multi-label ({MULTI_LABEL}); put a "
            "labels.csv beside its images (columns file,labels; labels separated by ';'; every image listed, an "
            "empty labels cell for an image with none)."
        )
    check_task(has_labels_file, multi_label, where)  # before the layout is checked for the other kind
    if has_labels_file:
        dataset, names = _labelled_folder(folder, id2label, separator)
    else:
        dataset, names = load_class_folder(folder, "--data_dir")
    sampled = " ({n} random images, seed {seed})"
    data = _as_eval_data(dataset, names, id2label, description, max_samples, seed, sampled)
    data.folders = [os.fspath(folder)]
    return data


def folders_read(origin: Origin, data: EvalData | None = None) -> list[str]:
    """The local folders an evaluation reads: the model's (its run folder and adapter too) and the data's;
    a tool's output folder may be none of them, nor inside one (`check_output_dir`'s `inputs`)."""
    model = [origin.path, origin.run_folder, origin.adapter]
    return [str(folder) for folder in model if folder is not None] + (data.folders if data else [])


def resolve_eval_data(
    origin: Origin,
    id2label: dict[int, str] | None,
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
    problem_type: str | None = None,
    label_separator: str = ";",
) -> EvalData:
    """`data_dir` if given (labels.csv separated by `label_separator`), else `recipe`'s split, else the data
    recorded with the model at `origin`. With `problem_type` (the model's task), the data must be of its kind.
    `id2label` None: the images only, their labels unmatched (`EvalData.labels` None)."""
    multi_label = None if problem_type is None else problem_type == MULTI_LABEL
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples={max_samples} must be positive (None: every image).")
    if recipe is not None and data_dir is not None:
        raise ValueError("Pass either --recipe or --data_dir, not both.")
    if data_dir is not None:
        return folder_eval_data(data_dir, id2label, max_samples, seed or 0, multi_label, label_separator)
    fields, seed, where, notes = recipe_fields(recipe, seed) if recipe is not None else recorded_fields(origin, seed)
    data = data_from_fields(fields, id2label, split, seed, where, max_samples, multi_label)
    data.notes.extend(notes)
    return data


__all__ = [
    "DATA_FIELDS",
    "EvalData",
    "check_task",
    "data_from_fields",
    "folder_eval_data",
    "folders_read",
    "recipe_fields",
    "recorded_fields",
    "resolve_eval_data",
]
