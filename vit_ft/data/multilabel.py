"""Multi-label data: several labels (or none) per image, held as a fixed-length multi-hot float vector.

Sources, each turned into a "label" column of `List(Value("float32"), length=num_labels)` and the label names:
- a Hub or `save_to_disk` dataset whose label column is `Sequence(ClassLabel)` (names from the ClassLabel),
  a list of label names per image (names sorted), or a multi-hot 0/1 list (names given, else "0", "1", ...):
  `label_kind` tells a multi-label column from a single-label one, `to_multi_hot` converts it;
- an image folder with `labels.csv` or `labels.jsonl` beside the images (`vit_ft.data.label_files`).

The validation hold-out (`stratified_hold_out`) is iterative stratification (Sechidis et al. 2011, via the
`iterative-stratification` package's MultilabelStratifiedShuffleSplit), then repaired so that every label
with two or more positive images has one in each part. `data_report` counts images per label and
all-negative images per split, for the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import datasets
import numpy as np

from ..metrics.multilabel import MULTI_LABEL, PROBLEM_TYPES, SINGLE_LABEL

__all__ = [
    "MULTI_LABEL",
    "PROBLEM_TYPES",
    "SINGLE_LABEL",
    "check_problem_type",
    "data_report",
    "is_multi_hot",
    "label_kind",
    "multi_hot_feature",
    "multi_hot_matrix",
    "multi_label_names",
    "rows_to_matrix",
    "split_multilabel",
    "stratified_hold_out",
    "to_multi_hot",
]

_ACCEPTED = (
    "one label per image (ClassLabel, int or str) or several (Sequence(ClassLabel), a list of label names, "
    "or a multi-hot list of 0/1 per image)"
)


def multi_hot_feature(num_labels: int) -> datasets.List:
    """The feature of a multi-hot label column: a float32 vector of length num_labels (BCE targets)."""
    return datasets.List(datasets.Value("float32"), length=num_labels)


def _list_item(feature: Any) -> Any:
    """The element feature of a list feature (List, LargeList, legacy Sequence), else None."""
    list_types = tuple(
        getattr(datasets, name) for name in ("List", "LargeList", "Sequence") if hasattr(datasets, name)
    )
    return feature.feature if isinstance(feature, list_types) else None


def _is_value(feature: Any, kinds: tuple[str, ...]) -> bool:
    """A datasets.Value whose dtype contains one of `kinds` ("int" matches int8 ... uint64)."""
    return isinstance(feature, datasets.Value) and any(kind in feature.dtype for kind in kinds)


def label_kind(
    features: datasets.Features, column: str, described: str | None = None
) -> Literal["single", "multi"]:
    """`single` for one label per image (ClassLabel, int, str, bool), `multi` for several: a list of
    ClassLabel, of label names (str) or of 0/1 numbers (multi-hot). Another type is a one-line ValueError
    (`described` names the column there, by default `label_column=<column>`)."""
    if column not in features:
        raise KeyError(f"label_column={column!r} is not a column; available columns: {list(features)}.")
    feature, item = features[column], _list_item(features[column])
    if isinstance(feature, datasets.ClassLabel) or _is_value(feature, ("int", "string", "bool")):
        return "single"
    if isinstance(item, datasets.ClassLabel) or _is_value(item, ("int", "string", "bool", "float")):
        return "multi"
    raise ValueError(f"{described or f'label_column={column!r}'} holds {feature}; accepted: {_ACCEPTED}.")


def check_problem_type(problem_type: str | None) -> None:
    """A ValueError unless `problem_type` is None (chosen from the data) or one of transformers' PROBLEM_TYPES."""
    if problem_type not in (None, *PROBLEM_TYPES):
        raise ValueError(
            f"problem_type={problem_type!r} is not one of {list(PROBLEM_TYPES)} (or None: from the data)."
        )


def is_multi_hot(features: datasets.Features, column: str = "label") -> bool:
    """Whether `column` is the multi-hot float vector column that `to_multi_hot` writes (a loaded multi-label
    split), as opposed to a ClassLabel column (a loaded single-label split)."""
    item = _list_item(features.get(column))
    return _is_value(item, ("float",)) and features[column].length not in (None, -1)


def multi_label_names(
    dataset: datasets.Dataset, column: str, names: Sequence[str] | None = None
) -> list[str]:
    """The label names of a multi-label column: a ClassLabel's names; the sorted names found in a column of
    name lists; for a multi-hot column `names` if given, else "0", "1", ... (one per position)."""
    item = _list_item(dataset.features[column])
    if isinstance(item, datasets.ClassLabel):
        return list(item.names)
    if _is_value(item, ("string",)):
        return sorted({str(name) for row in dataset[column] for name in row})
    if names is not None:
        return list(names)
    width = dataset.features[column].length
    if width in (None, -1):
        width = len(dataset[0][column]) if len(dataset) else 0
    return [str(i) for i in range(width)]


def rows_to_matrix(
    rows: Sequence[Sequence[Any]],
    item: Any,
    names: list[str],
    where: str,
    lines: Sequence[int] | None = None,
) -> np.ndarray:
    """(num_images, num_labels) float32 multi-hot matrix from a label column's values. A bad row is named by
    its index in the dataset ("row 0" is the first, as datasets counts), or by `lines`, the line of each row in
    the labels file `where` ("line 2" is a CSV's first row after its header, as an editor counts)."""

    def row_name(r: int) -> str:
        return f"{where} line {lines[r]}" if lines is not None else f"{where} row {r}"

    matrix = np.zeros((len(rows), len(names)), dtype=np.float32)
    if isinstance(item, datasets.ClassLabel) or _is_value(item, ("string",)):
        to_name = item.int2str if isinstance(item, datasets.ClassLabel) else str
        index = {name: i for i, name in enumerate(names)}
        for r, row in enumerate(rows):
            if isinstance(item, datasets.ClassLabel) and any(value < 0 for value in row):
                raise ValueError(f"{row_name(r)} holds the class id -1 (unlabelled); remove such rows.")
            unknown = sorted({to_name(value) for value in row} - index.keys())
            if unknown:
                raise ValueError(
                    f"{row_name(r)} has label(s) {unknown} that are not among the training labels {names}; "
                    "add training images for them or remove them."
                )
            matrix[r, [index[to_name(value)] for value in row]] = 1.0
        return matrix
    for r, row in enumerate(rows):
        values = np.asarray(row, dtype=np.float64)
        if values.shape != (len(names),) or not np.isin(values, (0, 1)).all():
            raise ValueError(
                f"{row_name(r)} holds {list(row)[:8]}, not a multi-hot 0/1 vector of length {len(names)} "
                f"(one per label); if these are class ids, cast the column to Sequence(ClassLabel(names=...))."
            )
        matrix[r] = values
    return matrix


def to_multi_hot(
    dataset: datasets.Dataset, column: str, names: Sequence[str], where: str = "the dataset"
) -> datasets.Dataset:
    """Replace `column` (a multi-label column, see `label_kind`) by multi-hot float32 vectors over `names`
    (the training split's label names; labels are matched by name). Only that column is rewritten."""
    if label_kind(dataset.features, column) != "multi":
        raise ValueError(
            f"label_column={column!r} of {where} holds {dataset.features[column]}, one label per image; "
            f"multi-label classification needs several: {_ACCEPTED.split(' or several ')[1]}."
        )
    item, names = _list_item(dataset.features[column]), list(names)
    matrix = rows_to_matrix(dataset[column], item, names, where)
    return dataset.remove_columns(column).add_column(
        column, list(matrix), feature=multi_hot_feature(len(names))
    )


def multi_hot_matrix(dataset: datasets.Dataset, column: str = "label") -> np.ndarray:
    """(num_images, num_labels) float32 matrix of a multi-hot column, read without decoding the images."""
    if len(dataset) == 0:
        return np.zeros((0, max(dataset.features[column].length or 0, 0)), dtype=np.float32)
    values = dataset.select_columns([column]).with_format("numpy")[column]
    return np.asarray(list(values), dtype=np.float32).reshape(len(dataset), -1)


def _move_one(labels: np.ndarray, source: np.ndarray, label: int) -> bool:
    """Move one image holding `label` out of the part `source` (a boolean mask, flipped in place), choosing
    one whose every label keeps a positive image in `source` (fewest labels first); False if none can go."""
    left = labels[source].sum(0)
    candidates = [
        i for i in np.flatnonzero(source & (labels[:, label] > 0)) if (left[labels[i] > 0] >= 2).all()
    ]
    if not candidates:
        return False
    chosen = min(candidates, key=lambda i: (labels[i].sum(), i))
    source[chosen] = False
    return True


def stratified_hold_out(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, validation) row indices of a multi-hot matrix (num_images, num_labels), holding out
    `fraction` by iterative stratification (MultilabelStratifiedShuffleSplit, seeded), then moving single
    images so that each label with >= 2 positive images has one in both parts (moves keep every other label
    present where it was; the validation size may change by a few images)."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation_split_percentage={fraction} must be a fraction in (0, 1), e.g. 0.1.")
    labels = np.asarray(labels) > 0
    try:
        from iterstrat.ml_stratifiers import MultilabelStratifiedShuffleSplit
    except ImportError as error:  # a dependency of vit-ft; missing only in a hand-made environment
        raise ImportError(
            "the multi-label hold-out needs iterative-stratification: pip install iterative-stratification"
        ) from error
    splitter = MultilabelStratifiedShuffleSplit(n_splits=1, test_size=fraction, random_state=seed)
    try:
        _, held = next(splitter.split(np.zeros(len(labels)), labels.astype(int)))
    except ValueError as error:
        raise ValueError(
            f"Cannot hold out validation_split_percentage={fraction} of {len(labels)} images ({error}); raise "
            "it, add images, or provide a validation split."
        ) from None
    in_train = np.ones(len(labels), dtype=bool)
    in_train[held] = False
    for label in np.argsort(labels.sum(0), kind="stable"):  # rarest first: they have the fewest choices
        if labels[:, label].sum() < 2:
            continue
        if not labels[~in_train, label].any():
            _move_one(labels, in_train, label)
        elif not labels[in_train, label].any():
            in_validation = ~in_train
            if _move_one(labels, in_validation, label):
                in_train = ~in_validation
    return np.flatnonzero(in_train), np.flatnonzero(~in_train)


def split_multilabel(
    dataset: datasets.Dataset, fraction: float, seed: int, column: str = "label"
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(train, validation) of a dataset with a multi-hot `column`, by `stratified_hold_out`."""
    train, validation = stratified_hold_out(multi_hot_matrix(dataset, column), fraction, seed)
    return dataset.select(train), dataset.select(validation)


def data_report(splits: Mapping[str, np.ndarray], names: Sequence[str]) -> str:
    """A text table for the log: positive images per label and split, images with no label (all-negative)
    and images per split, then the labels a split has no positive image of (their AP is undefined there)."""
    counts = {split: (np.asarray(m) > 0).reshape(len(m), len(names)) for split, m in splits.items()}
    width = max([len("all-negative"), *map(len, names)])
    lines = [f"{'label':<{width}}  " + "  ".join(f"{split:>10}" for split in counts)]
    for j, name in enumerate(names):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{int(m[:, j].sum()):>10}" for m in counts.values()))
    lines.append(
        f"{'all-negative':<{width}}  " + "  ".join(f"{int((~m.any(1)).sum()):>10}" for m in counts.values())
    )
    lines.append(f"{'images':<{width}}  " + "  ".join(f"{len(m):>10}" for m in counts.values()))
    for split, m in counts.items():
        absent = [name for j, name in enumerate(names) if len(m) and not m[:, j].any()]
        if absent:
            lines.append(f"{split}: no positive image of {absent} (left out of its mAP).")
    return "\n".join(lines)
