"""The task a classifier is trained for, chosen once from `config.problem_type` (transformers' own switch).

`task_for(config)` (or `task_for(problem_type)`) returns a `SingleLabel` or a `MultiLabel`; everything that
differs between the two lives in that object, and the fine-tune, the evaluation, predict, the exports and the
model card ask it instead of testing which task they run:

- training: `check_options` (what the task refuses, before the model loads), `loss_weights` and
  `training_loss` (class weights, label smoothing, mixup's soft targets / BCE positive weights),
  `balanced_labels` (the class-balanced sampler), `compute_metrics` (the Trainer's), `finish` (after training:
  the decision threshold tuned on validation, saved in the config), `fits_temperature`;
- inference: `probabilities(logits)` (calibrated softmax, or a sigmoid per label), `prediction`;
- evaluation: `evaluation_numbers`, `write_evaluation` (tables and figures), `report_lines`, `summary`;
- what people read: `name`, `curve_panels` (training_curves.png), `card` (the model card's metrics and usage).

A third task (regression, ordinal labels) is one more class with these members, registered in `TASKS` under
its `problem_type`; nothing else branches on the task.
"""

from __future__ import annotations

from typing import Any

from ..metrics.multilabel import MULTI_LABEL, PROBLEM_TYPES, SINGLE_LABEL
from .multi_label import MultiLabel
from .single_label import SingleLabel

TASKS = {SINGLE_LABEL: SingleLabel, MULTI_LABEL: MultiLabel}

Task = SingleLabel | MultiLabel


def task_for(source: Any = None, run_record: dict[str, Any] | None = None) -> Task:
    """The task of a model config (its `problem_type`; None, as transformers leaves it for a single-label model
    until its first loss, is single-label) or of a `problem_type` string, with what the model holds of it: a
    multi-label config's decision threshold, a single-label run record's calibration temperature."""
    problem_type = (
        source if isinstance(source, str) or source is None else getattr(source, "problem_type", None)
    )
    task = TASKS.get(problem_type or SINGLE_LABEL)
    if task is None:
        raise ValueError(f"problem_type={problem_type!r} is not one of {list(PROBLEM_TYPES)}.")
    return task.of(source, run_record)


__all__ = ["MULTI_LABEL", "SINGLE_LABEL", "TASKS", "MultiLabel", "SingleLabel", "Task", "task_for"]
