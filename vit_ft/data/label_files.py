"""Multi-label image folders: labels.csv or labels.jsonl beside the images, read and checked before any image
opens (`read_labelled_folder`), and the choice between such folders and class sub-folders for the fine-tune's
`train_dir` / `validation_dir` / `test_dir` (`labelled_folder_splits`). The layout::

    labels.csv                          labels.jsonl
    file,labels                         {"file": "a.jpg", "labels": ["dog", "grass"]}
    a.jpg,dog;grass                     {"file": "b.jpg", "labels": []}
    b.jpg,

`file` (or `file_name`, datasets' metadata name) is the image's path relative to the folder. In labels.csv
the labels of an image are separated by ";" (`separator`; a space would split names such as COCO's
"traffic light"; pass separator=" " for space-separated tags as in fastai's `label_delim`). An empty cell
(or `[]`) means an image with no label (all-negative), which is allowed. Every image in the folder must be
listed: an unlisted image is an error, not a silent all-negative example, since a forgotten row would
teach the model that its objects are absent; list it with an empty labels cell to mean "no label".
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path

import datasets

from .image_folders import folder_splits, is_hidden, named_argument
from .images import image_extensions
from .multilabel import multi_hot_feature, rows_to_matrix

__all__ = ["LABEL_FILES", "labelled_folder_splits", "labels_file", "read_labelled_folder"]

LABEL_FILES = ("labels.csv", "labels.jsonl")


def labels_file(folder: str | os.PathLike, argument: str = "train_dir") -> Path | None:
    """The folder's labels.csv or labels.jsonl (a multi-label image folder), None when it has neither."""
    found = [
        Path(folder).expanduser() / name
        for name in LABEL_FILES
        if (Path(folder).expanduser() / name).is_file()
    ]
    if len(found) > 1:
        raise ValueError(
            f"{named_argument(argument, folder)} holds both labels.csv and labels.jsonl; keep one of them."
        )
    return found[0] if found else None


def _csv_rows(path: Path, separator: str) -> list[tuple[int, str, list[str]]]:
    """(line, file, labels) per row of a labels.csv with the header `file,labels` (or `file_name,labels`)."""
    with open(path, newline="", encoding="utf-8-sig") as handle:  # -sig: a spreadsheet's byte-order mark
        reader = csv.DictReader(handle)
        fields = [name.strip() for name in reader.fieldnames or []]
        file_key = next((name for name in ("file", "file_name") if name in fields), None)
        if file_key is None or "labels" not in fields:
            raise ValueError(f"{path}: the header is {fields}; it must name the columns file,labels.")
        reader.fieldnames = fields
        rows = []
        for row in reader:
            cell = (row.get("labels") or "").strip()
            labels = [part.strip() for part in cell.split(separator)] if cell else []
            if any(not label for label in labels):
                raise ValueError(
                    f"{path} line {reader.line_num}: {row[file_key]!r} has an empty label in {cell!r} (labels are "
                    f"separated by {separator!r}; an image with no label has an empty labels cell)."
                )
            rows.append((reader.line_num, (row[file_key] or "").strip(), labels))
    return rows


def _jsonl_rows(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, file, labels) per line of a labels.jsonl of {"file": ..., "labels": [...]} objects."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} line {number} is not JSON ({error.msg}); write one object a line."
            ) from None
        file = record.get("file", record.get("file_name")) if isinstance(record, dict) else None
        labels = record.get("labels") if isinstance(record, dict) else None
        if not isinstance(file, str) or not isinstance(labels, list):
            raise ValueError(
                f'{path} line {number}: expected {{"file": "<image>", "labels": [...]}}, got {line.strip()[:80]}'
            )
        bad = [
            label
            for label in labels
            if isinstance(label, bool) or not isinstance(label, (str, int)) or not str(label).strip()
        ]
        if bad:
            raise ValueError(
                f"{path} line {number}: {file!r} has the invalid label {bad[0]!r}; labels are non-empty names."
            )
        rows.append((number, file.strip(), [str(label).strip() for label in labels]))
    return rows


def _check_rows(root: Path, path: Path, rows: list[tuple[int, str, list[str]]]) -> list[str]:
    """The rows' image paths relative to root; a missing, outside, non-image, twice-listed or unlisted
    image is a one-line error naming it."""
    extensions, seen, relative = image_extensions(), {}, []
    for line, file, _ in rows:
        key = os.path.normpath(file)
        if not file or os.path.isabs(key) or key.split(os.sep)[0] == "..":
            raise ValueError(
                f"{path} line {line}: file {file!r} must be a path inside {root}, relative to it."
            )
        if key in seen:
            raise ValueError(
                f"{path} lists {file!r} twice (lines {seen[key]} and {line}); merge its labels into one row."
            )
        if not (root / key).is_file():
            raise FileNotFoundError(
                f"{path} line {line} names {file!r}, which is not a file in {root}; fix the name or remove the row."
            )
        if Path(key).suffix.lower() not in extensions:
            raise ValueError(
                f"{path} line {line}: {file!r} is not an image file ({', '.join(sorted(extensions)[:6])}, ...)."
            )
        seen[key] = line
        relative.append(key)
    unlisted = sorted(
        str(p.relative_to(root)) for p in root.rglob("*")
        if p.suffix.lower() in extensions and p.is_file()
        and not any(is_hidden(part) for part in p.relative_to(root).parts) and str(p.relative_to(root)) not in seen
    )  # fmt: skip
    if unlisted:
        raise ValueError(
            f"{len(unlisted)} image(s) of {root} are not listed in {path.name}, e.g. {unlisted[0]!r}; add a row "
            "for each (an empty labels cell means no label) or move them out of the folder."
        )
    return relative


def read_labelled_folder(
    folder: str | os.PathLike,
    argument: str = "train_dir",
    names: Sequence[str] | None = None,
    separator: str = ";",
) -> tuple[datasets.Dataset, list[str]]:
    """An image folder with labels.csv / labels.jsonl -> (Dataset with "image" (datasets.Image) and "label"
    (multi-hot float32 vectors), label names). Names are the sorted labels found, or `names` (the training
    folder's) for a validation or test folder, where a label outside them is an error. Rows keep the file's
    order. Everything is checked before any image is opened."""
    root = Path(folder).expanduser()
    path = labels_file(root, argument) if root.is_dir() else None
    if path is None:
        raise FileNotFoundError(
            f"{named_argument(argument, folder)} is not a folder holding labels.csv or labels.jsonl."
        )
    rows = _jsonl_rows(path) if path.suffix == ".jsonl" else _csv_rows(path, separator)
    files = _check_rows(root, path, rows)
    found = sorted({label for _, _, labels in rows for label in labels})
    if names is None:
        if len(found) < 2:
            raise ValueError(
                f"{path} names {len(found)} label(s) {found}; multi-label classification needs at least two "
                "(for a yes/no task use one sub-folder per class instead)."
            )
        names = found
    names = list(names)
    lines = [line for line, _, _ in rows]
    matrix = rows_to_matrix([labels for _, _, labels in rows], datasets.Value("string"), names, str(path), lines)
    features = datasets.Features({"image": datasets.Image(), "label": multi_hot_feature(len(names))})
    data = {"image": [str(root / file) for file in files], "label": list(matrix)}
    return datasets.Dataset.from_dict(data, features=features), names


def labelled_folder_splits(
    folders: tuple[str | os.PathLike | None, ...],
    cache_dir: str | None,
    label_names: Sequence[str] | None,
    separator: str,
) -> tuple[dict[str, tuple[datasets.Dataset, str]], list[str] | None]:
    """Image folders (train, validation, test; None where not given) -> ({split: (dataset, description)},
    label names of a multi-label folder or None): class sub-folders (`folder_splits`), or (multi-label)
    labels.csv / labels.jsonl beside the images in every folder given (`read_labelled_folder`)."""
    arguments = ("train_dir", "validation_dir", "test_dir")
    given = [
        (split, argument, folder)
        for split, argument, folder in zip(("train", "validation", "test"), arguments, folders, strict=True)
        if folder is not None
    ]
    labelled = [
        Path(folder).expanduser().is_dir() and labels_file(folder, argument) is not None
        for _, argument, folder in given
    ]
    if not any(labelled):
        return folder_splits(*folders, cache_dir), None
    if not all(labelled):
        plain = [
            named_argument(argument, folder)
            for (_, argument, folder), has in zip(given, labelled, strict=True)
            if not has
        ]
        raise ValueError(
            f"{named_argument(given[0][1], given[0][2])} holds labels.csv / labels.jsonl (multi-label) but {', '.join(plain)} "
            "does not; give every folder its labels file (or use class sub-folders everywhere)."
        )
    train, names = read_labelled_folder(folders[0], "train_dir", label_names, separator)
    raw = {"train": (train, named_argument("train_dir", folders[0]))}
    for split, argument, folder in given[1:]:
        raw[split] = (
            read_labelled_folder(folder, argument, names, separator)[0],
            named_argument(argument, folder),
        )
    return raw, names
