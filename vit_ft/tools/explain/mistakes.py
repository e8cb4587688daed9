"""The evaluation report's explained mistakes (`vit-ft evaluate --explain METHOD`, the command's default gradcam:
`names.REPORT_METHOD`): the most confident errors, each drawn with a class-specific map for the classes in
question, as explained_mistakes.png, with a section of report.md and metrics.json's "explained_mistakes".

- Single-label: the `MAX_EXPLAINED` wrong predictions with the highest predicted probability (the first of
  mistakes.png, `tasks.single_label.most_confident_mistakes`), each as three panels: the image, the map for the
  predicted class, the map for the true class ("why this class and not that one").
- Multi-label: the most confident false positives and false negatives (`tasks.multi_label.confident_mistakes`),
  half of `MAX_EXPLAINED` each (one kind fills in when the other has fewer), each as the image and that label's map.

The count is fixed, whatever the size of the evaluation: 16 maps at most, about 16 forward + backward passes with
Grad-CAM (docs/tools.md: one Grad-CAM map costs about one forward + backward). The maps are of the image the model
sees once (the evaluation view: under --tta the probabilities in the titles are the views' average).

    section, record = explain_mistakes(trained, outputs, images, "gradcam", staging / MISTAKES_FIGURE)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...metrics.multilabel import MULTI_LABEL
from ...reports.figures import FALSE_NEGATIVE, FALSE_POSITIVE, display_image, plot_image_grid, short
from ...tasks.multi_label import confident_mistakes
from ...tasks.single_label import most_confident_mistakes
from .methods import CLASS_SPECIFIC, check_method, explain, patch_grids
from .names import check_method_name
from .rollout import overlay_heatmap
from .run import refuse_export

logger = logging.getLogger("vit_ft")

MAX_EXPLAINED = 8  # mistakes drawn with their maps; a fixed cost whatever the evaluation's size
MISTAKES_FIGURE = "explained_mistakes.png"
MISTAKES_PER_ROW = {1: 3, 2: 2}  # by the maps per mistake: 6 panels a row either way


@dataclass(frozen=True)
class ExplainedMistake:
    """One mistake of the grid: its row in the evaluated data, the image panel's title and, per map, the class
    it explains and the map panel's title."""

    row: int
    title: str
    targets: tuple[tuple[int, str], ...]


def check_report_method(method: str | None, model: str | os.PathLike | torch.nn.Module) -> str | None:
    """The evaluation's `--explain` value (None or "none": no explained mistakes), checked before the model loads
    (`model` its path: no ONNX export) and after (`model` the module: one the methods support): a method of
    `names.METHODS` that names a class (the grid compares classes) and whose library is installed."""
    if method is None or method == "none":
        return None
    check_method_name(method)
    if method not in CLASS_SPECIFIC:
        raise ValueError(
            f"--explain {method} is class-agnostic (one map whatever the class), and the report's grid compares the "
            f"predicted and the true class: choose one of {', '.join(CLASS_SPECIFIC)}, or --explain none."
        )
    if isinstance(model, torch.nn.Module):
        return check_method(method, model)
    refuse_export(model, "vit-ft evaluate (its report's explained mistakes: --explain)")
    return check_method(method)


def _single_label(outputs: Any, id2label: dict[int, str], limit: int) -> list[ExplainedMistake]:
    index = {name: i for i, name in id2label.items()}
    return [
        ExplainedMistake(
            m.row, f"{short(m.true_label)} → {short(m.predicted_label)}",
            ((index[m.predicted_label], f"predicted {short(m.predicted_label)} ({m.probability:.2f})"),
             (index[m.true_label], f"true {short(m.true_label)} ({m.true_probability:.2f})")),
        )  # fmt: skip
        for m in most_confident_mistakes(outputs, id2label, limit)
    ]


def _multi_label(outputs: Any, id2label: dict[int, str], limit: int) -> list[ExplainedMistake]:
    found = confident_mistakes(outputs, outputs.task.threshold, id2label, limit)
    positives, negatives = found[FALSE_POSITIVE], found[FALSE_NEGATIVE]
    taken = min(len(positives), max(limit // 2, limit - len(negatives)))
    index = {name: i for i, name in id2label.items()}
    chosen = [*positives[:taken], *negatives[: limit - taken]]
    return [
        ExplainedMistake(
            m.row, f"true: {m.true_labels.replace(';', ', ') or 'none'}",
            ((index[m.label], f"{'+' if m.kind == FALSE_POSITIVE else '−'}{short(m.label)} ({m.probability:.2f}, "
                              f"threshold {m.threshold:.2f})"),),
        )  # fmt: skip
        for m in chosen
    ]


def select_mistakes(outputs: Any, id2label: dict[int, str], limit: int = MAX_EXPLAINED) -> list[ExplainedMistake]:
    """The mistakes the grid explains, most confident first (see the module's docstring)."""
    if outputs.task.problem_type == MULTI_LABEL:
        return _multi_label(outputs, id2label, limit)
    return _single_label(outputs, id2label, limit)


def mistake_maps(trained: Any, images: Sequence[Any], targets: Sequence[int], method: str) -> list[torch.Tensor]:
    """`method`'s map `(grid_h, grid_w)` of each image for its target class, `MAX_EXPLAINED` images a batch."""
    grids: list[torch.Tensor] = []
    for start in range(0, len(images), MAX_EXPLAINED):
        pixels = [trained.transform.transform_image(image) for image in images[start : start + MAX_EXPLAINED]]
        inputs = trained.transform.collate(pixels)  # images, or a NaFlex batch
        maps = explain(trained.model, inputs, method, target=torch.tensor(targets[start : start + MAX_EXPLAINED]))
        grids += patch_grids(maps, inputs, trained.model.config.patch_hw)
    return grids


def plot_explained_mistakes(
    trained: Any, mistakes: Sequence[ExplainedMistake], images: Sequence[Any], method: str, path: Path
) -> Path:
    """The grid: per mistake the image (titled with its classes), then each map over it (titled with its class)."""
    pairs = [(image, cls) for mistake, image in zip(mistakes, images, strict=True) for cls, _ in mistake.targets]
    grids = iter(mistake_maps(trained, [image for image, _ in pairs], [cls for _, cls in pairs], method))
    panels, titles = [], []
    for mistake, image in zip(mistakes, images, strict=True):
        shown = display_image(image, trained.preprocessing.image_size)
        panels.append(shown)
        titles.append(mistake.title)
        for _, title in mistake.targets:
            panels.append(overlay_heatmap(shown, next(grids).numpy()))
            titles.append(title)
    per_mistake = 1 + len(mistakes[0].targets)
    columns = per_mistake * min(len(mistakes), MISTAKES_PER_ROW[per_mistake - 1])
    scale = ("jet", f"{method}, each map scaled from its lowest (0) to its highest patch (1)")
    what = "mistakes" if per_mistake == 3 else "wrong labels (+ false positive, − false negative)"
    suptitle = f"The {len(mistakes)} most confident {what}, with {method}'s map of each class in question"
    return plot_image_grid(panels, titles, path, suptitle=suptitle, columns=columns, colorbar=scale)


def explain_mistakes(
    trained: Any, outputs: Any, images: Callable[[list[int]], list[Any]], method: str, path: Path,
    limit: int = MAX_EXPLAINED,
) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """Draw the explained mistakes to `path` (`images(rows)` reads the evaluated rows' images); returns report.md's
    section and metrics.json's record (method, the mistakes explained, the figure's name or why there is none)."""
    mistakes = select_mistakes(outputs, trained.id2label, limit)
    record: dict[str, Any] = {"method": method, "mistakes": len(mistakes), "figure": None}
    heading = [f"## The most confident mistakes, explained ({method})", ""]
    if not mistakes:
        return [*heading, "No mistakes to explain.", ""], record
    try:
        plot_explained_mistakes(trained, mistakes, images([m.row for m in mistakes]), method, path)
    except (RuntimeError, ValueError) as error:  # a map the model cannot give must not cost the report
        logger.warning("No explained mistakes (%s): %s", method, error)
        record["why"] = str(error)
        return [*heading, f"No explained mistakes: {method} failed on this model ({error}).", ""], record
    record["figure"] = path.name
    how = ("Per mistake the image (true → predicted class), then the map for the predicted class and for the true "
           "class" if outputs.task.problem_type != MULTI_LABEL else
           "Per wrong label the image (its true labels), then that label's map (+: false positive, −: false negative)")  # fmt: skip
    text = f"{how}; each map scaled to its own range, of the image as the model sees it (`--explain none`: no grid)."
    return [*heading, f"![explained mistakes]({path.name})", "", text, ""], record


__all__ = [
    "MAX_EXPLAINED",
    "MISTAKES_FIGURE",
    "ExplainedMistake",
    "check_report_method",
    "explain_mistakes",
    "mistake_maps",
    "plot_explained_mistakes",
    "select_mistakes",
]
