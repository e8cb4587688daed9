"""Which images an evaluation runs on: the split a fine-tune recorded in `vit_ft_run.json` (test if it had
one, else validation; taken from the loaded model's `Origin`, not read again), rebuilt with
`vit_ft.data.datasets.load_image_datasets` from the same arguments and seed; or a recipe's split; or an image
folder with one sub-folder per class. Labels are matched to the model's by name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ..data.datasets import load_image_datasets
from ..data.digits import write_digits_imagefolder
from ..data.image_folders import check_class_folders, check_image_folder
from ..utils.run_record import RUN_RECORD_FILE, recorded_seed
from .trained import Origin

DATA_FIELDS = (
    "dataset_name", "dataset_config", "train_dir", "validation_dir", "test_dir", "train_split",
    "validation_split", "test_split", "image_column", "label_column", "validation_split_percentage",
    "max_eval_samples",
)  # fmt: skip


@dataclass
class EvalData:
    """Images to evaluate, their true labels as the model's label ids, and where they came from."""

    dataset: datasets.Dataset  # column "image" holds datasets.Image(decode=False) values {"bytes", "path"}
    labels: np.ndarray  # (num_images,) int64 model label ids
    description: str
    notes: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the local folders the images were read from

    def __len__(self) -> int:
        return len(self.labels)


def _model_label_ids(names: Sequence[str], id2label: dict[int, str], where: str) -> list[int]:
    """The model's label id of each dataset class name; a class the model does not know is an error."""
    label2id = {name: i for i, name in id2label.items()}
    unknown = [name for name in names if name not in label2id]
    if unknown:
        known = list(id2label.values())
        raise ValueError(
            f"{where} has class(es) {unknown} that the model does not know; its labels are "
            f"{known[:20]}{' ...' if len(known) > 20 else ''}. Rename or remove those class folders."
        )
    return [label2id[name] for name in names]


def _as_eval_data(
    dataset: datasets.Dataset,
    names: Sequence[str],
    id2label: dict[int, str],
    description: str,
    max_samples: int | None,
    seed: int,
    sampled: str,
) -> EvalData:
    """`dataset`'s images with their classes as the model's label ids. With `max_samples` below its size, that
    many random images (the same ones for the same seed), and `sampled`, formatted with n and seed, is appended
    to the description."""
    if max_samples is not None and max_samples < len(dataset):
        dataset = dataset.shuffle(seed=seed).select(range(max_samples))
        description += sampled.format(n=max_samples, seed=seed)
    ids = np.asarray(_model_label_ids(names, id2label, description), dtype=np.int64)
    labels = ids[np.asarray(dataset["label"], dtype=np.int64)]  # dataset class index -> model label id
    dataset = dataset.select_columns(["image"]).cast_column("image", datasets.Image(decode=False))
    return EvalData(dataset, labels, description)


def data_from_fields(
    fields: dict[str, Any],
    id2label: dict[int, str],
    split: str | None,
    seed: int,
    where: str,
    max_samples: int | None = None,
) -> EvalData:
    """The `split` ("test"/"validation"; default test if there is one) of the data that DataArguments-style
    `fields` describe, loaded as the fine-tune loaded it (same held-out split and subsets for the same seed)."""
    if fields.get("builtin_dataset") == "digits" and fields.get("train_dir"):
        write_digits_imagefolder(Path(fields["train_dir"]).parent, seed=0)  # as the fine-tune writes it
    arguments = {name: fields[name] for name in DATA_FIELDS if name in fields}
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
            f"{where} has no {split!r} split; its splits are {sorted(splits)}. Pass --split with one of them."
        )
    source = fields.get("dataset_name") or fields.get(f"{split}_dir") or fields.get("train_dir")
    description = f"split {split!r} of {source} ({where}, seed {seed})"
    data = _as_eval_data(
        splits[split], names, id2label, description, max_samples, seed, ", {n} random images"
    )
    given = (fields.get(name) for name in ("dataset_name", "train_dir", "validation_dir", "test_dir"))
    data.folders = [str(folder) for folder in given if folder and Path(folder).expanduser().is_dir()]
    return data


def recorded_eval_data(
    origin: Origin,
    id2label: dict[int, str],
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """The evaluation data recorded in the model's run record (`origin.record`, see `data_from_fields`)."""
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
    data = data_from_fields(
        info.get("data", {}), id2label, split, seed, f"{RUN_RECORD_FILE} of {model}", max_samples
    )
    data.notes.extend(notes)
    return data


def recipe_eval_data(
    recipe: str,
    id2label: dict[int, str],
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """The evaluation split of a recipe's data, with the recipe's seed (TrainingArguments' 42 if it sets none)."""
    from ..training.recipes import load_recipe, resolve_recipe

    values = load_recipe(resolve_recipe(recipe))
    if seed is None:
        seed = values.get("data_seed") if values.get("data_seed") is not None else values.get("seed", 42)
    return data_from_fields(values, id2label, split, int(seed), f"recipe {recipe!r}", max_samples)


def folder_eval_data(
    folder: str | os.PathLike, id2label: dict[int, str], max_samples: int | None = None, seed: int = 0
) -> EvalData:
    """All images of `folder`/<class name>/<image>; class names are matched to the model's label names.
    Hidden class folders are skipped, as the fine-tune skips them; mistakes name `--data_dir`."""
    check_class_folders(check_image_folder(folder, "--data_dir"), folder, "--data_dir")
    splits, names = load_image_datasets(train_dir=folder, validation_split_percentage=0, seed=seed)
    description = f"image folder {os.fspath(folder)}"
    sampled = " ({n} random images, seed {seed})"
    data = _as_eval_data(splits["train"], names, id2label, description, max_samples, seed, sampled)
    data.folders = [os.fspath(folder)]
    return data


def folders_read(origin: Origin, data: EvalData | None = None) -> list[str]:
    """The local folders an evaluation reads: the model's (its run folder and adapter too) and the data's;
    a tool's output folder may be none of them, nor inside one (`check_output_dir`'s `inputs`)."""
    model = [origin.path, origin.run_folder, origin.adapter]
    return [str(folder) for folder in model if folder is not None] + (data.folders if data else [])


def resolve_eval_data(
    origin: Origin,
    id2label: dict[int, str],
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """`data_dir` if given, else `recipe`'s split, else the data recorded with the model at `origin`."""
    if recipe is not None and data_dir is not None:
        raise ValueError("Pass either --recipe or --data_dir, not both.")
    if data_dir is not None:
        return folder_eval_data(data_dir, id2label, max_samples, seed or 0)
    if recipe is not None:
        return recipe_eval_data(recipe, id2label, split, seed, max_samples)
    return recorded_eval_data(origin, id2label, split, seed, max_samples)


__all__ = [
    "DATA_FIELDS",
    "EvalData",
    "data_from_fields",
    "folder_eval_data",
    "folders_read",
    "recipe_eval_data",
    "recorded_eval_data",
    "resolve_eval_data",
]
