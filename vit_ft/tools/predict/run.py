"""Batch prediction: image files and folders -> the top-k labels of each file, as CSV or JSONL rows; for a
multi-label model, every label whose probability (sigmoid) is at or above its decision threshold.

classifier = load_trained("outputs/digits")
files = collect_image_files(["photos/", "extra.jpg"])  # vit_ft.data.images
n_rows, n_errors = write_predictions(predict_files(classifier, files, top_k=5), "preds.csv")
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...data.images import DEFAULT_MAX_PIXELS, collect_image_files
from ...reports.figures import display_image, plot_image_grid, short
from ...utils.files import staged_file
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.progress import Progress
from ..explain.methods import check_method
from ..explain.run import refuse_export
from ..inference import Batch, describe_error, iter_batches
from ..ood import OODScorer
from ..trained import Trained, load_trained
from ..tta import NO_OOD_SCORE, with_tta
from .output import (
    MAP_COLUMNS,
    MULTI_LABEL_COLUMNS,
    OOD_COLUMNS,
    PREDICTION_COLUMNS,
    Prediction,
    PredictionWriter,
    check_output_path,
    disk_full_error,
    mark_figure,
    read_predictions,
    refuse_replacing_others,
)

logger = logging.getLogger("vit_ft")

# ---------------------------------------------------------------------------------------------------------
# Prediction on files
# ---------------------------------------------------------------------------------------------------------


def predict_files(
    classifier: Trained,
    files: Sequence[str | os.PathLike],
    top_k_labels: int = 5,
    batch_size: int = 32,
    num_workers: int = 0,
    progress: bool | None = None,
    scorer: OODScorer | None = None,
) -> Iterator[Prediction]:
    """One Prediction per file, in input order, computed `batch_size` images at a time: the `top_k_labels`
    most probable labels, or for a multi-label model every label at or above its decision threshold (its
    task's `predicted_labels`; `top_k_labels` is then not used); with a `scorer` whose model folder keeps a
    feature bank, whether each image looks unlike the training images and its score (same forward pass).

    A file that cannot be decoded (missing, not an image, truncated, over the pixel limit) yields a
    Prediction with `error` set and no labels; the other files of its batch are unaffected.
    """
    if top_k_labels < 1:
        raise ValueError(f"top_k={top_k_labels} must be positive.")
    files = [str(f) for f in files]
    forward = None if scorer is None or scorer.bank is None else scorer.forward
    for batch in iter_batches(classifier, files, batch_size, num_workers, "Predicting", progress, forward):
        yield from batch_predictions(batch, classifier, top_k_labels, scorer if forward is not None else None)


def batch_predictions(
    batch: Batch, classifier: Any, top_k_labels: int, scorer: OODScorer | None = None
) -> list[Prediction]:
    """One Prediction per source of an `iter_batches` batch, in order (predict's rows, and `vit-ft serve`'s
    answers): the task's predicted labels of each decoded image with the OOD score and flag of `scorer.last`
    (the batch's forward; None: no score), an error for each image that did not decode. `classifier` gives
    `task` and `id2label` (a `Trained`, or the server's runtime)."""
    task, id2label = classifier.task, classifier.id2label
    rows = {i: Prediction(batch.sources[i], error=describe_error(e), task=task) for i, e in batch.errors.items()}
    if batch.decoded:
        found = task.predicted_labels(batch.probabilities, id2label, top_k_labels)
        ood = scorer.last if scorer is not None else ([None] * len(found), [None] * len(found))
        for j, (i, (labels, scores)) in enumerate(zip(batch.decoded, found, strict=True)):
            score, flag = ood[0][j], ood[1][j]
            rows[i] = Prediction(batch.sources[i], labels=labels, scores=scores, task=task,
                                 unlike_training=None if flag is None else bool(flag),
                                 ood_score=None if score is None else float(score))  # fmt: skip
    return [rows[i] for i in range(len(batch.sources))]


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def plot_predictions(
    predictions: Sequence[Prediction], image_size: tuple[int, int], path: str | os.PathLike,
    total: int | None = None,
) -> Path:  # fmt: skip
    """A grid of predicted images titled "label (p)" (a multi-label model's: every label at or above its
    threshold, "label p, ...", or "none ≥ threshold"), written to a hidden temporary file in the same folder and
    renamed to `path` when complete (an existing file at `path` stays as it was if drawing fails); the title
    names how many of the `total` predicted images it shows. It carries predict's mark (`mark_figure`), so
    that the next run may replace it."""
    images = [display_image(p.path, image_size) for p in predictions]
    titles = [f"{p.task.caption(p.labels, p.scores)}\n{short(Path(p.path).name, 24)}" for p in predictions]
    suptitle = predictions[0].task.figure_title(len(predictions), total) if predictions else "No predictions"
    path = Path(path)
    try:
        with staged_file(path, suffix=".part.png") as partial:
            plot_image_grid(images, titles, partial, suptitle=suptitle)
            partial.write_bytes(mark_figure(partial.read_bytes()))
    except OSError as error:
        replacement = disk_full_error(error, path, "--figure")
        if replacement is error:
            raise
        raise replacement from error
    return path


# ---------------------------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------------------------


def _refuse_overwriting_inputs(files: Sequence[Path], output: Path, figure: Path | None) -> None:
    """Neither the output nor the figure may be one of the input files, nor each other."""
    inputs = {f.resolve() for f in files if f.exists()}
    if output.resolve() in inputs:
        raise ValueError(f"--output {output} is one of the input files; pass another --output name.")
    if figure is None:
        return
    if figure.resolve() in inputs:
        raise ValueError(
            f"the figure {figure} would replace an input image; pass --figure with another .png name, "
            "or --figure none."
        )
    if figure.resolve() == output.resolve():
        raise ValueError(f"--figure {figure} is the --output file; pass another --figure name.")


def default_figure_path(output: str | os.PathLike) -> Path:
    """Where `figure="auto"` puts the figure: the output with a .png suffix (preds.csv -> preds.png)."""
    return Path(output).with_suffix(".png")


def _checked_inputs(
    inputs: Sequence[str | os.PathLike], output: Path, figure: str | os.PathLike | None, max_pixels: int | None
) -> tuple[list[Path], Path | None]:
    """The image files of `inputs` and the figure's path (None: no figure), refused before the model loads: no
    image file, a non-positive `max_pixels`, or an output or figure that would replace an input."""
    if max_pixels is not None and max_pixels < 1:
        raise ValueError(f"max_pixels={max_pixels} must be positive (None, 'none' on the command line: no bound).")
    files = collect_image_files(inputs)
    if not any(f.is_file() for f in files):
        raise FileNotFoundError(
            f"no image file in {' '.join(str(i) for i in inputs)}; pass image files, folders holding images, "
            "or a pattern such as 'photos/*.jpg' that matches some."
        )
    figure_path = (
        None if figure is None else default_figure_path(output) if figure == "auto" else Path(figure)
    )
    _refuse_overwriting_inputs(files, output, figure_path)
    return files, figure_path


def maps_path(output: str | os.PathLike) -> Path:
    """Where `explain` writes the maps: beside the output (preds.csv -> preds.maps.jsonl)."""
    return Path(output).with_suffix(".maps.jsonl")


def _maps_file(output: Path, explain: str | None, tta: str | None, model: str | os.PathLike) -> Path | None:
    """Where `explain`'s maps go (None: no `explain`); a bad method, one asked with `tta` or of an ONNX export
    (`model`), refused first."""
    if explain is None:
        return None
    check_method(explain)  # its name, and captum for captum's methods
    refuse_export(model)
    if tta is not None:
        raise ValueError(f"--explain {explain} maps the image the model sees once: drop --tta {tta} with it.")
    return maps_path(output)


def write_maps(classifier: Trained, files: Sequence[Path], method: str, path: Path, progress: bool | None) -> Path:
    """One JSON line per image that decodes (MAP_COLUMNS): `method`'s map `(grid_h, grid_w)` for its predicted
    class (the highest probability), that class and its probability, written to `path`."""
    from ..explain.run import explain_image  # torch's autograd and captum only when asked

    check_method(method, classifier.model)
    written = 0
    bar = Progress(len(files), f"Explaining ({method})", enabled=progress)
    with staged_file(path) as partial, open(partial, "w", encoding="utf-8") as out, bar:
        for file in files:
            bar.update(1)
            try:
                heatmap, chosen, probability = explain_image(classifier, file, method, None)
            except (OSError, ValueError):  # its row in --output already says why
                continue
            values = (str(file), method, classifier.id2label[chosen], probability, heatmap.tolist())
            out.write(json.dumps(dict(zip(MAP_COLUMNS, values, strict=True))) + "\n")
            written += 1
    logger.info("Wrote %d %s maps (each image's predicted class) to %s.", written, method, path)
    return path


def _write_rows(
    predictions: Iterator[Prediction], writer: PredictionWriter, figure_images: int
) -> tuple[int, int, int, list[Prediction]]:
    """Write every prediction; -> rows, rows with errors, images unlike the training images, and the first
    `figure_images` predicted ones (the figure's)."""
    shown: list[Prediction] = []
    rows = errors = unlike = 0
    for prediction in predictions:
        writer.write(prediction)
        rows += 1
        errors += prediction.error is not None
        unlike += bool(prediction.unlike_training)
        if prediction.error is None and len(shown) < figure_images:
            shown.append(prediction)
    return rows, errors, unlike, shown


def run_prediction(
    model: str | Path,
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    top_k_labels: int = 5,
    batch_size: int = 32,
    image_size: int | None = None,
    device: str | None = None,
    num_workers: int = 0,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    figure: str | os.PathLike | None = "auto",
    figure_images: int = 24,
    progress: bool | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    bf16: str | bool = False,
    overwrite: bool = False,
    tta: str | None = None,
    explain: str | None = None,
) -> dict[str, Any]:
    """Predict every image in `inputs` and write one row per file to `output` (.csv or .jsonl): its top
    `top_k_labels` labels, or for a multi-label model every label at or above its decision threshold (the
    columns of MULTI_LABEL_COLUMNS, which say the threshold).

    `figure="auto"` writes a grid of the first `figure_images` predicted images next to the output
    (`preds.csv` -> `preds.png`); None writes none. Neither may replace an input file, nor an existing file
    that predict did not write unless `overwrite` (`written_by_predict`). The output appears only
    when complete: a failure leaves an existing file as it was. `max_tokens` bounds the patch tokens per image
    at `image_size` (None: no bound); `bf16` runs the model under bf16 autocast ("auto": where the hardware
    has native bf16). `tta` ("flip" or "crops", `tools.tta`) averages each image's probabilities over several
    views. `explain` (a method of `vit_ft.tools.explain`) also writes each image's map for its predicted class
    to `maps_path(output)` (preds.maps.jsonl). Returns a summary: rows, errors, output, figure and maps paths.
    """
    output = check_output_path(output)  # before the model loads
    maps = _maps_file(output, explain, tta, model)
    files, figure_path = _checked_inputs(inputs, output, figure, max_pixels)
    classifier = load_trained(model, image_size, device, max_pixels, max_tokens=max_tokens, bf16=bf16)
    classifier = with_tta(classifier, tta)  # type: ignore[assignment]  # one view unless asked
    refuse_replacing_others({"--output": output, "--figure": figure_path, "--explain": maps}, overwrite)
    threshold = classifier.task.threshold_summary(classifier.id2label)
    if threshold is not None:
        logger.info(
            "Multi-label model: every label with probability >= its decision threshold %s.", threshold
        )
    scorer = OODScorer.of(classifier) if tta is None else OODScorer(classifier, None, NO_OOD_SCORE)
    logger.info(scorer.note())
    with PredictionWriter(output, classifier.task) as writer:
        found = predict_files(classifier, files, top_k_labels, batch_size, num_workers, progress, scorer)
        rows, errors, unlike, shown = _write_rows(found, writer, figure_images)
    summary: dict[str, Any] = {"rows": rows, "errors": errors, "output": str(writer.path), "figure": None,
                               "unlike_training": unlike if scorer.bank is not None else None}  # fmt: skip
    if figure_path is not None and shown:
        summary["figure"] = str(
            plot_predictions(shown, classifier.preprocessing.image_size, figure_path, total=rows - errors)
        )
    if maps is not None:
        summary["maps"] = str(write_maps(classifier, files, explain, maps, progress))
    logger.info("Wrote %d rows (%d with errors) to %s.", rows, errors, writer.path)
    if scorer.bank is not None:
        logger.info("%d of %d images look unlike the training images (column unlike_training).", unlike, rows - errors)
    return summary


__all__ = [  # the rows' format lives in prediction_output; its names are importable from here too
    "MULTI_LABEL_COLUMNS",
    "OOD_COLUMNS",
    "PREDICTION_COLUMNS",
    "batch_predictions",
    "Prediction",
    "PredictionWriter",
    "check_output_path",
    "default_figure_path",
    "predict_files",
    "read_predictions",
    "run_prediction",
]
