"""Image folders laid out as <folder>/<class name>/<image file>: checked before anything loads (each mistake
named with the argument that passed the folder), then loaded with datasets' imagefolder builder, the class
being the sub-folder name. `vit_ft.data.datasets.load_image_datasets` loads `train_dir` / `validation_dir` /
`test_dir` through `folder_splits`.

Hidden entries (a name starting with "."; `.ipynb_checkpoints`, `.git`, `._photo.jpg`) are skipped, as
datasets' imagefolder and `ls` skip them, and a skipped folder that holds images is said in the log; every
other name is a class or an image, `__dunder` ones included (imagefolder alone would drop those too)."""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

import datasets

from ..utils.logs import no_dataset_bars
from .images import image_extensions

logger = logging.getLogger("vit_ft")

__all__ = [
    "check_class_folders",
    "check_image_folder",
    "folder_splits",
    "is_hidden",
    "load_class_folder",
    "named_argument",
]


def is_hidden(name: str) -> bool:
    """A file or folder name that image folders skip: one starting with "." (Unix's hidden files)."""
    return name.startswith(".")


def named_argument(argument: str, folder: str | os.PathLike) -> str:
    """How a message names the folder: `--data_dir photos` for a flag, `train_dir='photos'` for a field."""
    return (
        f"{argument} {os.fspath(folder)}"
        if argument.startswith("--")
        else f"{argument}={os.fspath(folder)!r}"
    )


def check_image_folder(folder: str | os.PathLike, argument: str) -> Path:
    """Fail early, naming the argument, unless folder is laid out as <folder>/<class>/<image>; returns it
    resolved."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{named_argument(argument, folder)} is not a directory; pass a folder laid out as "
            "<folder>/<class name>/<image file>."
        )
    extensions = image_extensions()
    images = []
    for path in root.rglob("*"):
        relative = path.relative_to(root).parts
        if any(is_hidden(part) for part in relative):
            continue
        if path.suffix.lower() in extensions and path.is_file():
            images.append(relative)
    if not images:
        raise FileNotFoundError(
            f"{named_argument(argument, folder)} holds no image files (looked for "
            f"{', '.join(sorted(extensions)[:8])}, ...); expected <folder>/<class name>/<image file>."
        )
    misplaced = [parts for parts in images if len(parts) != 2]
    if misplaced:
        raise ValueError(
            f"{named_argument(argument, folder)}: images must sit directly in class sub-folders "
            f"(<folder>/<class name>/<image file>), but {len(misplaced)} do not, e.g. "
            f"{os.path.join(*misplaced[0])!r}. Move them into a class folder (nested sub-folders are not "
            "classes)."
        )
    return root.resolve()


def _holds_images(folder: Path) -> bool:
    extensions = image_extensions()
    return any(p.suffix.lower() in extensions and not is_hidden(p.name) for p in folder.iterdir())


def _class_folders(root: Path) -> tuple[list[str], list[str]]:
    """(class folders, hidden folders skipped) of the checked folder `root`, sorted: sub-folders that hold
    images, those with a hidden name apart."""
    folders = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and _holds_images(entry))
    return [name for name in folders if not is_hidden(name)], [name for name in folders if is_hidden(name)]


def _say_skipped(root: Path, folder: str | os.PathLike) -> list[str]:
    """The class folders of `root`; the hidden ones that hold images are said in the log (the data report),
    naming the folder only: the fine-tune's `train_dir` is evaluate's `--data_dir`."""
    classes, skipped = _class_folders(root)
    if skipped:
        logger.warning(
            "%s: skipped %d hidden class folder(s) %s (a name starting with '.' is hidden, not a class); "
            "rename them without the leading '.' to use them as classes.",
            os.fspath(folder), len(skipped), skipped,
        )  # fmt: skip
    return classes


def check_class_folders(root: Path, folder: str | os.PathLike, argument: str = "train_dir") -> list[str]:
    """The class names of the checked folder `root`; fails unless there are at least two (a classifier to
    train needs two classes; an evaluation needs only the model's, see `load_class_folder`)."""
    classes, _ = _class_folders(root)
    if len(classes) < 2:
        raise ValueError(
            f"{named_argument(argument, folder)} has {len(classes)} class folder(s) {classes}; a classifier needs "
            "at least two. Add a sub-folder of images for each other class."
        )
    return classes


def load_class_folder(folder: str | os.PathLike, argument: str) -> tuple[datasets.Dataset, list[str]]:
    """One image folder <folder>/<class name>/<image file> with any number of classes, as a Dataset (image,
    label: ClassLabel of the sub-folder names) and those names: for evaluating a trained model, where each
    class need only be one of the model's, and one class is enough."""
    root = check_image_folder(folder, argument)  # images, each in a class folder: one class at least
    classes = _say_skipped(root, folder)
    return _load_image_folder(root, classes, None), classes


def _load_image_folder(root: Path, classes: list[str], cache_dir: str | None) -> datasets.Dataset:
    """<root>/<class>/<image> -> Dataset(image, label: ClassLabel of the sub-folder names) via imagefolder.
    One pattern per class folder, escaped: imagefolder's own `**` would also drop `__dunder` folders."""
    patterns = [os.path.join(glob.escape(str(root)), glob.escape(name), "*") for name in classes]
    with no_dataset_bars():  # local files: no "Downloading data" / "Generating split" bars
        return datasets.load_dataset(
            "imagefolder",
            data_files={"train": patterns},
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
        split: (argument, folder, check_image_folder(folder, argument))
        for split, argument, folder in (
            ("train", "train_dir", train_dir),
            ("validation", "validation_dir", validation_dir),
            ("test", "test_dir", test_dir),
        )
        if folder is not None
    }
    check_class_folders(folders["train"][2], train_dir)
    classes = {split: _say_skipped(root, folder) for split, (_, folder, root) in folders.items()}
    return {
        split: (_load_image_folder(root, classes[split], cache_dir), named_argument(argument, folder))
        for split, (argument, folder, root) in folders.items()
    }
