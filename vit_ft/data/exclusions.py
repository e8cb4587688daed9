"""`exclude: FILE` in the fine-tune: the training images a data audit (`vit-ft audit`) flagged, dropped or
relabelled before training. FILE is the audit's `findings.csv` (every training image it names is dropped) or its
`relabel.csv`, which a user edits (each row's `action`: `drop`, `relabel` to the row's `label`, or `keep`).

    plan = read_exclusions("audit/relabel.csv")          # what to do with which file, checked
    train = apply_exclusions(train, names, plan)          # rows dropped, labels changed; unknown files refused

Images are matched by their file path (resolved: a relative or symlinked path names the same file), or for data
without files by `train[<row>]`, as the audit writes them. A file the training split does not hold is an error
naming it: an exclude file meant for other data would otherwise change nothing, silently.
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


def image_key(path: str | None, row: int) -> str:
    """How an exclude file names a training image: its resolved file path, or `train[<row>]` without one."""
    if path:
        return os.path.realpath(os.path.expanduser(path))
    return f"train[{row}]"


def _key_of(text: str) -> str:
    text = text.strip()
    return text if text.startswith("train[") else image_key(text, -1)


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


def apply_exclusions(train: Any, names: list[str], plan: Exclusions) -> tuple[Any, dict[str, Any]]:
    """The training split (a `datasets.Dataset` with an "image" column of files and a ClassLabel "label")
    without the rows `plan` drops and with its relabelled rows' labels changed, and the run record's entry.
    A file `plan` names that the split does not hold, or a label that is not a class, is a ValueError."""
    import datasets

    paths = [image.get("path") if isinstance(image, dict) else None
             for image in train.cast_column("image", datasets.Image(decode=False))["image"]]  # fmt: skip
    keys = [image_key(p, row) for row, p in enumerate(paths)]
    known = set(keys)
    unknown = sorted((plan.drop | set(plan.relabel)) - known)
    if unknown:
        raise ValueError(
            f"exclude: {plan.file} names {len(unknown)} image(s) the training split does not hold, e.g. "
            f"{unknown[0]}; pass the findings.csv or relabel.csv that vit-ft audit wrote for this training data."
        )
    if plan.relabel and isinstance(train.features["label"], datasets.Sequence):
        raise ValueError(f"exclude: {plan.file} relabels images of multi-label data; drop them instead.")
    bad = sorted({label for label in plan.relabel.values() if label not in names})
    if bad:
        raise ValueError(
            f"exclude: {plan.file} relabels images to {bad}, which are not classes of the training data "
            f"({names[:20]}); correct the label column."
        )
    label_ids = {name: i for i, name in enumerate(names)}
    new_labels = {row: label_ids[plan.relabel[key]] for row, key in enumerate(keys) if key in plan.relabel}
    if new_labels:
        labels = list(train["label"])
        for row, label in new_labels.items():
            labels[row] = label
        features = train.features
        train = train.remove_columns("label").add_column("label", labels).cast(features)
    kept = [row for row, key in enumerate(keys) if key not in plan.drop]
    dropped = len(keys) - len(kept)
    if dropped:
        train = train.select(kept)
    if len(train) == 0:
        raise ValueError(f"exclude: {plan.file} drops every training image; keep some of them.")
    return train, plan.record(dropped, len(new_labels))


__all__ = [
    "ACTIONS",
    "FINDINGS_COLUMNS",
    "KINDS",
    "RELABEL_COLUMNS",
    "Exclusions",
    "apply_exclusions",
    "image_key",
    "read_exclusions",
]
