"""A stream's labels (`streaming: true`): the class names from its features or from `class_names` (a stream
cannot be read whole to find them before training), and each example's label encoded as the map-style splits hold
it: a class id (single-label) or a multi-hot float vector (multi-label)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import datasets

from .multilabel import MULTI_LABEL, SINGLE_LABEL, _is_value, _list_item, multi_hot_feature

__all__ = ["LabelCoding", "label_coding"]


@dataclass(frozen=True)
class LabelCoding:
    """How a stream's label column becomes what the map-style splits hold: a class id (single-label) or a
    multi-hot float vector over `names` (multi-label)."""

    problem_type: str
    names: tuple[str, ...]
    source: str  # "class_label", "ids", "names", "class_label_list", "id_list", "name_list", "multi_hot"

    @property
    def feature(self) -> Any:
        if self.problem_type == SINGLE_LABEL:
            return datasets.ClassLabel(names=list(self.names))
        return multi_hot_feature(len(self.names))

    def __call__(self, value: Any) -> int | list[float]:
        if self.problem_type == SINGLE_LABEL:
            return self._class_id(value)
        if self.source == "multi_hot":
            if len(value) != len(self.names):
                raise ValueError(
                    f"a multi-hot label has {len(value)} entries, but class_names lists {len(self.names)}."
                )
            return [float(v) for v in value]
        values = value if isinstance(value, (list, tuple)) else [value]
        hot = [0.0] * len(self.names)
        for item in values:
            hot[self._class_id(item)] = 1.0
        return hot

    def _class_id(self, value: Any) -> int:
        if isinstance(value, str):
            if value not in self.names:
                raise ValueError(f"label {value!r} is not one of class_names {list(self.names)[:10]}.")
            return self.names.index(value)
        if value is None or not 0 <= int(value) < len(self.names):
            raise ValueError(
                f"label {value!r} is no class id of the {len(self.names)} classes; -1 (unlabelled) rows "
                "cannot train. Choose a labelled split."
            )
        return int(value)


def label_coding(
    features: datasets.Features, where: str, problem_type: str | None, class_names: Sequence[str] | None
) -> LabelCoding:
    """The class names of a stream's "label" column from its features (a ClassLabel, or a list of them), else
    from `class_names`: a stream cannot be scanned for its distinct labels before training."""
    feature, item = features["label"], _list_item(features["label"])
    names = list(class_names) if class_names else None
    if isinstance(feature, datasets.ClassLabel):
        kind, names, source = SINGLE_LABEL, list(feature.names), "class_label"
    elif isinstance(item, datasets.ClassLabel):
        kind, names, source = MULTI_LABEL, list(item.names), "class_label_list"
    elif _is_value(feature, ("int", "string", "bool")):
        kind, source = SINGLE_LABEL, "names" if _is_value(feature, ("string",)) else "ids"
    elif _is_value(item, ("float", "bool")):
        kind, source = MULTI_LABEL, "multi_hot"
    elif _is_value(item, ("int", "string")):
        kind, source = MULTI_LABEL, "name_list" if _is_value(item, ("string",)) else "id_list"
    else:
        raise ValueError(f"label_column of {where} holds {feature}: not class ids, names, or lists of them.")
    if not names:
        raise ValueError(
            f"label_column of {where} ({feature}) names no classes, and a stream cannot be read whole to find "
            "them; set class_names (a YAML list, or comma-separated) in the recipe or on the command line."
        )
    if problem_type == SINGLE_LABEL and kind == MULTI_LABEL:
        raise ValueError(
            f"problem_type={SINGLE_LABEL!r}, but the label column of {where} holds several labels per image "
            f"({feature}); leave problem_type unset (or set it to {MULTI_LABEL!r})."
        )
    if problem_type == MULTI_LABEL:
        kind = MULTI_LABEL
    return LabelCoding(kind, tuple(names), source)
