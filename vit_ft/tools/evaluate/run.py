"""Evaluation of a fine-tuned classifier: the numbers, a table per class, the figures and a `report.md` that
shows them (with the fine-tune's training curves), for either task.

Each job has its module: loading the model once (`trained`), which images (`eval_data`), the model's outputs on
them (`eval_outputs`, with the batched loop of `inference`), and what the model's task computes and draws from
them (`vit_ft.tasks`: a single-label model's accuracy, confusion matrix and mistakes; a multi-label model's mAP
at its decision threshold, precision-recall curves and false positives / negatives); `run_evaluation` puts them
together; with `shift` ("corruptions" or a folder, `shift.py`), accuracy under shift beside the clean one
(shift.csv / .md / .png, metrics.json's "shift", a section of report.md).

    run_evaluation("outputs/digits", "reports/digits")                       # the recorded test split
    run_evaluation("outputs/digits", "reports/digits-48", image_size=48)     # another test-time resolution
    run_evaluation("outputs/digits", "reports/mine", data_dir="my_digits/")  # labels matched by class name
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...reports.reporting import copy_training_curves, write_report_lines
from ...reports.robustness import write_shift_table
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.output_dir import OutputFiles, check_output_dir
from ..explain.mistakes import MISTAKES_FIGURE, check_report_method, explain_mistakes
from ..ood import OODScorer
from ..trained import Trained, load_trained
from ..tta import NO_OOD_SCORE, TTARunner, with_tta
from .data import EvalData, folders_read, resolve_eval_data
from .outputs import EvalOutputs, evaluation_facts, predict_dataset, short_description
from .shift import shift_inputs, shift_section

logger = logging.getLogger("vit_ft")

# either task's files (`Task.write_evaluation`): only these are replaced in the folder, its others kept
EVALUATION_FILES = OutputFiles(
    "evaluate",
    ("report.md", "metrics.json", "per_class.csv", "per_class.md", "per_class.png", "predictions.csv",
     "mistakes.csv", "mistakes.png", "confusion_matrix.png", "confusion_matrix.csv", "confusion_matrix.npy",
     "reliability.png", "pr_curves.png", "false_positives.png", "false_negatives.png", "training_curves.png",
     "shift.csv", "shift.md", "shift.png", MISTAKES_FIGURE),
    "an evaluation report",
)  # fmt: skip


def run_evaluation(
    model: str | os.PathLike,
    output_dir: str | os.PathLike,
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    image_size: int | Sequence[int] | None = None,
    batch_size: int = 64,
    max_samples: int | None = None,
    max_mistakes: int = 25,
    top_k: int = 5,
    seed: int | None = None,
    device: str | None = None,
    num_workers: int = 0,
    progress: bool | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    bf16: str | bool = False,
    label_separator: str = ";",
    overwrite: bool = False,
    tta: str | None = None,
    shift: str | None = None,
    explain: str | None = None,
) -> dict[str, Any]:
    """Evaluate `model` and write metrics.json, per_class.csv/.md/.png, confusion_matrix.png/.csv/.npy,
    reliability.png, mistakes.png/.csv, predictions.csv, training_curves.png (copied when the model folder has
    one) and report.md to `output_dir`. Returns the contents of metrics.json. Probabilities (mistakes,
    predictions.csv, the reliability diagram) are divided by the model's calibration temperature, when the
    fine-tune fitted one (`Trained.task`).

    `max_tokens` bounds the patch tokens per image at `image_size` (None: no bound); `bf16` runs the model
    under bf16 autocast ("auto": where the hardware has native bf16). Nothing is written before the model loads;
    `output_dir` may not be, nor lie inside, a folder the evaluation reads (the model's, the data's). Only the
    evaluation's own files there are replaced (`EVALUATION_FILES`: a file of those names it did not write only
    with `overwrite`); the folder's other files are kept.

    `tta` ("flip" or "crops", `tools.tta`) averages each image's probabilities over several views; metrics.json
    and report.md then also give the task's main metric on the evaluation view alone, measured on the same run.

    A multi-label model needs multi-label data (a `data_dir` with labels.csv, its labels separated by
    `label_separator`); its files are its task's (`tasks.MultiLabel.write_evaluation`): pr_curves.png,
    false_positives.png and false_negatives.png instead of the confusion matrix, reliability and mistakes.
    `explain` (a method; the command's default gradcam, here None) draws the top mistakes' maps (`explain.mistakes`).
    """
    output_dir, explain = _checked_before_loading(model, output_dir, data_dir, shift, explain, overwrite)
    trained = load_trained(model, image_size, device, max_tokens=max_tokens, bf16=bf16)
    runner = with_tta(trained, tta)  # a flip for a model trained without flips is refused here
    check_report_method(explain, trained.model)  # a model that cannot give the maps, before the evaluation runs
    id2label, where = trained.id2label, (recipe, data_dir, split, seed, max_samples)
    data = resolve_eval_data(trained.origin, id2label, *where, trained.task.problem_type, label_separator)
    check_output_dir(output_dir, inputs=folders_read(trained.origin, data))  # the recorded data's folders too
    views = f", each as several views: {runner.description}" if tta else ""
    logger.info("Evaluating %s on %s: %d images%s.", trained.source, data.description, len(data), views)

    scorer = OODScorer.of(trained) if tta is None else OODScorer(trained, None, NO_OOD_SCORE)
    started = time.perf_counter()
    outputs = predict_dataset(runner, data, batch_size, num_workers, progress, scorer)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    tta_numbers = tta_comparison(runner, outputs, trained, top_k) if tta else None
    return write_evaluation(output_dir, trained, data, outputs, elapsed, top_k, max_mistakes, overwrite, scorer, tta_numbers,
                            shift_section(shift, trained, data, outputs, seed or 0, batch_size, num_workers, progress), explain)  # fmt: skip


def _checked_before_loading(
    model: str | os.PathLike, output_dir: str | os.PathLike, data_dir: str | os.PathLike | None, shift: str | None,
    explain: str | None, overwrite: bool,
) -> tuple[Path, str | None]:  # fmt: skip
    """What is checked before the model loads, so that nothing is written or loaded for a mistake: the explanation's
    method (and that `model` is no ONNX export), the folders read, the output folder; -> it and the method (or None)."""
    explain = check_report_method(explain, model)
    given = [model, *([data_dir] if data_dir is not None else []), *shift_inputs(shift)]  # `shift`: shift.py
    check_output_dir(output_dir, inputs=given, holds="report.md and its files")
    EVALUATION_FILES.check(Path(output_dir), overwrite)
    return Path(output_dir), explain


def tta_comparison(runner: TTARunner, outputs: EvalOutputs, trained: Trained, top_k: int) -> dict[str, Any]:
    """metrics.json's "tta": the views, and the task's main metric with them and on the evaluation view alone
    (the same images, the same run: the first view's logits are kept as it goes)."""
    single = dataclasses.replace(outputs, logits=runner.single_view_logits())
    metric = outputs.task.best_metric
    with_views = outputs.task.evaluation_numbers(outputs, trained, top_k).get(metric)
    alone = outputs.task.evaluation_numbers(single, trained, top_k).get(metric)
    return {"mode": runner.mode, "views": runner.description, "metric": metric, "with_tta": with_views,
            "single_view": alone}  # fmt: skip


def write_evaluation(
    output_dir: Path,
    trained: Trained,
    data: EvalData,
    outputs: EvalOutputs,
    elapsed: float,
    top_k: int = 5,
    max_mistakes: int = 25,
    overwrite: bool = False,
    scorer: OODScorer | None = None,
    tta: dict[str, Any] | None = None,
    shift: dict[str, Any] | None = None,
    explain: str | None = None,
) -> dict[str, Any]:
    """An evaluation's files (see `run_evaluation`), from what the model's task computes and draws, written
    aside and moved into `output_dir` (`EVALUATION_FILES.staged`: the folder's other files kept); returns
    metrics.json's contents. `scorer` (the model's feature bank) adds how many images look unlike the training
    images (`unlike_training`) to metrics.json and a line to report.md; `explain` (a method) the explained
    mistakes (`explain.mistakes`: explained_mistakes.png, metrics.json's "explained_mistakes", a section)."""
    task = outputs.task
    metrics = {**task.evaluation_numbers(outputs, trained, top_k), **evaluation_facts(trained, data, outputs, elapsed)}
    ood_line = ""
    if scorer is not None:
        metrics["unlike_training"], ood_line = unlike_training_count(outputs, scorer)
    if tta is not None:  # test-time augmentation and its measured effect (`tta_comparison`)
        metrics["tta"] = tta
    if shift is not None:  # accuracy under shift (`shift.shift_evaluation`)
        metrics["shift"] = shift

    def images(rows: list[int]) -> list[Any]:
        return [data.dataset[row]["image"] for row in rows]

    split = short_description(data.description)
    logger.info("Report: metrics, tables and figures of %d images (up to %d mistakes drawn) in %s.",
                len(outputs.logits), max_mistakes, output_dir)  # fmt: skip
    with EVALUATION_FILES.staged(output_dir, overwrite) as staging:
        explained: list[str] = []  # report.md's section of explained mistakes, with metrics.json's record of them
        if explain is not None:
            explained, metrics["explained_mistakes"] = explain_mistakes(trained, outputs, images, explain, staging / MISTAKES_FIGURE)
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        written = task.write_evaluation(staging, outputs, metrics, images, trained, split, max_mistakes)
        table, figures = written
        curves = copy_training_curves(trained.origin.run_folder, staging)
        if curves:
            figures["training_curves"] = curves
        run_folder = trained.origin.run_folder  # linked from report.md, relative to where it will be read
        lines, notes = task.report_lines(output_dir, trained.source, metrics, table, figures, run_folder)
        lines += [*explained, *(write_shift_table(staging, shift) if shift is not None else [])]
        write_report_lines(staging, lines, [*data.notes, *notes, *([ood_line] if ood_line else []), *tta_notes(tta)])
    logger.info("%s; report in %s", task.summary(metrics, top_k), output_dir / "report.md")
    if ood_line:
        logger.info(ood_line)
    return metrics


def unlike_training_count(outputs: EvalOutputs, scorer: OODScorer) -> tuple[dict[str, Any], str]:
    """metrics.json's `unlike_training` entry (how many evaluated images the feature bank flags, at which
    threshold; or why there is no count) and its line for report.md."""
    if outputs.unlike_training is None:
        return {"flagged": None, "why": scorer.why}, scorer.note()
    flagged, total = int(outputs.unlike_training.sum()), len(outputs.unlike_training)
    entry = {"flagged": flagged, "images": total, "fraction": flagged / max(total, 1), "fit": scorer.bank.ood}
    line = (f"{flagged} of {total} images ({100 * flagged / max(total, 1):.1f} %) look unlike the training "
            f"images. {scorer.note()}")  # fmt: skip
    return entry, line


def tta_notes(tta: dict[str, Any] | None) -> list[str]:
    """report.md's note on test-time augmentation: the views and the main metric with and without them."""
    if tta is None:
        return []
    with_views, alone = tta["with_tta"], tta["single_view"]
    if not isinstance(with_views, (int, float)) or not isinstance(alone, (int, float)):
        return [f"Test-time augmentation: {tta['views']}."]
    return [
        f"Test-time augmentation: {tta['views']}. {tta['metric']} {with_views:.4f} with it, {alone:.4f} on the "
        f"evaluation view alone ({100 * (with_views - alone):+.2f} points), on the same images."
    ]


__all__ = ["EVALUATION_FILES", "EvalOutputs", "predict_dataset", "run_evaluation", "write_evaluation"]
