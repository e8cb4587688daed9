"""Image folders laid out as <folder>/<class name>/<image file>: checked before anything loads (each mistake
named with the argument that passed the folder), then loaded with datasets' imagefolder builder, the class
being the sub-folder name. `vit_ft.data.datasets.load_image_datasets` loads `train_dir` / `validation_dir` /
`test_dir` through `folder_splits`."""

from __future__ import annotations

import os
from pathlib import Path

import datasets

from .images import image_extensions

__all__ = ["folder_splits"]


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


def _check_two_classes(root: Path, folder: str | os.PathLike) -> None:
    """Fail unless the checked train folder `root` has image files in at least two class sub-folders."""
    extensions = image_extensions()
    classes = sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir()
        and not entry.name.startswith((".", "__"))
        and any(
            p.suffix.lower() in extensions and not p.name.startswith((".", "__")) for p in entry.iterdir()
        )
    )
    if len(classes) < 2:
        raise ValueError(
            f"train_dir={os.fspath(folder)!r} has {len(classes)} class folder(s) {classes}; a classifier needs "
            "at least two. Add a sub-folder of images for each other class."
        )


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


def folder_splits(
    train_dir: str | os.PathLike,
    validation_dir: str | os.PathLike | None,
    test_dir: str | os.PathLike | None,
    cache_dir: str | None,
) -> dict[str, tuple[datasets.Dataset, str]]:
    """Image folders -> {split: (dataset, description for errors)}; every folder is checked before any loads."""
    folders = {
        split: (argument, folder, _check_image_folder(folder, argument))
        for split, argument, folder in (
            ("train", "train_dir", train_dir),
            ("validation", "validation_dir", validation_dir),
            ("test", "test_dir", test_dir),
        )
        if folder is not None
    }
    _check_two_classes(folders["train"][2], train_dir)
    return {
        split: (_load_image_folder(root, cache_dir), f"{argument}={os.fspath(folder)!r}")
        for split, (argument, folder, root) in folders.items()
    }
