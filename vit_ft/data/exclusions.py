"""`exclude: FILE` in the fine-tune: the training images a data audit (`vit-ft audit`) flagged, dropped or
relabelled before training. FILE is the audit's `findings.csv` (every training image it names is dropped) or its
`relabel.csv`, which a user edits (each row's `action`: `drop`, `relabel` to the row's `label`, or `keep`).

    plan = read_exclusions("audit/relabel.csv")                  # what to do with which file, checked
    splits, record = apply_exclusions(splits, names, plan)        # rows dropped, labels changed; unknown refused

Images are matched by their file path (resolved: a relative or symlinked path names the same file), or for data
without files by `train[<row>]`, as the audit writes them, in the training split and the validation split held out
of it. A file neither holds is an error naming it: an exclude file meant for other data would otherwise change
nothing, silently.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FINDINGS_COLUMNS = ("path", "kind", "score", "given_label", "suggested_label", "other")
RELABEL_COLUMNS = ("path", "action", "label", "given_label", "kind", "score")
ACTIONS = ("drop", "relabel", "keep")
KINDS = ("label_issue", "duplicate", "leak", "outlier")
# the fine-tune's splits an exclude file's images are looked for in: the training folder's, which the validation
# hold-out is cut from (test is never changed)
AUDITED_SPLITS = ("train", "validation")


@dataclass(frozen=True)
class Exclusions:
    """What an exclude file asks: the images to drop and those to relabel {key: label name}, keyed by
    `image_key`; `file` and `sha256` name it in the run record."""

    file: str
    sha256: str
    drop: frozenset[str] = frozenset()
    relabel: dict[str, str] = field(default_factory=dict)

    def record(self, dropped: int, relabelled: int) -> dict[str, Any]:
        """What the run record keeps of it."""
        return {"file": self.file, "sha256": self.sha256, "dropped": dropped, "relabelled": relabelled}


def image_key(path: str | None, row: int, split: str = "train") -> str:
    """How an exclude file names an image: its resolved file path, or `<split>[<row>]` without one."""
    if path:
        return os.path.realpath(os.path.expanduser(path))
    return f"{split}[{row}]"


def _key_of(text: str) -> str:
    text = text.strip()
    return text if text.startswith(tuple(f"{split}[" for split in AUDITED_SPLITS)) else image_key(text, -1)


def read_exclusions(path: str | os.PathLike) -> Exclusions:
    """The exclude file at `path` (findings.csv or relabel.csv), checked: a missing file, other columns, an
    unknown action or a relabel without a label is a ValueError naming the file, the row and the fix."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    data = path.read_bytes()
    try:
        reader = csv.DictReader(data.decode("utf-8-sig").splitlines())
        rows, header = list(reader), set(reader.fieldnames or ())
    except (UnicodeDecodeError, csv.Error) as error:
        raise ValueError(
            f"exclude: {path} is not a CSV file ({error}); pass the findings.csv or relabel.csv vit-ft audit wrote."
        ) from error
    relabel_file = {"path", "action", "label"} <= header
    if not relabel_file and not {"path", "kind"} <= header:
        raise ValueError(
            f"exclude: {path} has columns {sorted(header)}; pass vit-ft audit's findings.csv (columns "
            f"{', '.join(FINDINGS_COLUMNS)}) or relabel.csv (columns {', '.join(RELABEL_COLUMNS)})."
        )
    drop: set[str] = set()
    relabel: dict[str, str] = {}
    for line, row in enumerate(rows, start=2):
        key = _key_of(row.get("path") or "")
        if not (row.get("path") or "").strip():
            raise ValueError(f"exclude: {path} line {line} has no path; give each row the image's file path.")
        action = (row.get("action") or "drop").strip() if relabel_file else "drop"
        if action not in ACTIONS:
            raise ValueError(
                f"exclude: {path} line {line} has action {action!r}; use one of {', '.join(ACTIONS)}."
            )
        if action == "drop":
            drop.add(key)
            relabel.pop(key, None)
        elif action == "relabel" and key not in drop:
            label = (row.get("label") or "").strip()
            if not label:
                raise ValueError(
                    f"exclude: {path} line {line} relabels {row['path']} to no label; write the class name in "
                    "its label column, or set its action to keep or drop."
                )
            relabel[key] = label
    return Exclusions(str(path.resolve()), hashlib.sha256(data).hexdigest(), frozenset(drop), relabel)


def apply_exclusions(
    splits: dict[str, Any], names: list[str], plan: Exclusions, subsampled: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The splits (`datasets.Dataset`s with an "image" column of files and a ClassLabel "label") without the rows
    `plan` drops and with its relabelled rows' labels changed, and the run record's entry. Every split is looked
    in: the validation images held out of the training folder were audited as training images. A file `plan`
    names that no split holds (`subsampled`, a `max_train_samples` run: that is not a file), or a label that is not
    a class, is a ValueError."""
    import datasets

    audited = {split: dataset for split, dataset in splits.items() if split in AUDITED_SPLITS}
    keys = {split: [image_key(image.get("path") if isinstance(image, dict) else None, row, split) for row, image
                    in enumerate(dataset.cast_column("image", datasets.Image(decode=False))["image"])]
            for split, dataset in audited.items()}  # fmt: skip
    known = set().union(*keys.values())
    unknown = sorted(key for key in (plan.drop | set(plan.relabel)) - known
                     if not (subsampled and os.path.isfile(key)))  # fmt: skip
    if unknown:
        raise ValueError(
            f"exclude: {plan.file} names {len(unknown)} image(s) the training data does not hold, e.g. "
            f"{unknown[0]}; pass the findings.csv or relabel.csv that vit-ft audit wrote for this training data."
        )
    if plan.relabel and isinstance(splits["train"].features["label"], datasets.Sequence):
        raise ValueError(f"exclude: {plan.file} relabels images of multi-label data; drop them instead.")
    bad = sorted({label for label in plan.relabel.values() if label not in names})
    if bad:
        raise ValueError(
            f"exclude: {plan.file} relabels images to {bad}, which are not classes of the training data "
            f"({names[:20]}); correct the label column."
        )
    label_ids = {name: i for i, name in enumerate(names)}
    result, dropped, relabelled = dict(splits), 0, 0
    for split, dataset in audited.items():
        new_labels = {row: label_ids[plan.relabel[key]] for row, key in enumerate(keys[split]) if key in plan.relabel}
        if new_labels:
            labels = list(dataset["label"])
            for row, label in new_labels.items():
                labels[row] = label
            dataset = dataset.remove_columns("label").add_column("label", labels).cast(dataset.features)
        kept = [row for row, key in enumerate(keys[split]) if key not in plan.drop]
        if len(kept) < len(dataset):
            dataset = dataset.select(kept)
        dropped, relabelled = dropped + len(keys[split]) - len(kept), relabelled + len(new_labels)
        result[split] = dataset
    if len(result["train"]) == 0:
        raise ValueError(f"exclude: {plan.file} drops every training image; keep some of them.")
    return result, plan.record(dropped, relabelled)


__all__ = [
    "ACTIONS",
    "AUDITED_SPLITS",
    "FINDINGS_COLUMNS",
    "KINDS",
    "RELABEL_COLUMNS",
    "Exclusions",
    "apply_exclusions",
    "image_key",
    "read_exclusions",
]
