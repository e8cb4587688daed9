"""Batch prediction: image files and folders -> the top-k labels of each file, as CSV or JSONL rows.

classifier = load_trained("outputs/digits")
files = collect_image_files(["photos/", "extra.jpg"])
n_rows, n_errors = write_predictions(predict_files(classifier, files, top_k=5), "preds.csv")
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.images import DEFAULT_MAX_PIXELS, image_extensions
from ..model.configuration_vit_ft import MAX_IMAGE_TOKENS
from ..reports.figures import display_image, plot_image_grid, short
from ..utils.files import move_into_place, staged_file, temporary_sibling
from .inference import describe_error, iter_batches
from .trained import Trained, load_trained

logger = logging.getLogger("vit_ft")

PREDICTION_COLUMNS = ("path", "label", "score", "top_k_labels", "top_k_scores", "error")
OUTPUT_FORMATS = (".csv", ".jsonl")


# ---------------------------------------------------------------------------------------------------------
# Prediction on files
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    """One output row: the top-k labels with their probabilities (highest first), or the reason there are none."""

    path: str
    labels: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str | None:
        return self.labels[0] if self.labels else None

    @property
    def score(self) -> float | None:
        return self.scores[0] if self.scores else None

    def as_row(self) -> dict[str, Any]:
        """A JSON-ready dict with the keys of PREDICTION_COLUMNS (error None when the file was read)."""
        return {
            "path": self.path,
            "label": self.label,
            "score": self.score,
            "top_k_labels": self.labels,
            "top_k_scores": self.scores,
            "error": self.error,
        }


def collect_image_files(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given (whatever their suffix: an unreadable one gets an error row), folders searched
    recursively for image suffixes in sorted order, skipping hidden entries. A pattern such as `photos/*.png`
    that the shell did not expand is expanded here. A path that does not exist is kept, so that it too gets an
    error row."""
    extensions = image_extensions()
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if not path.exists() and glob.has_magic(str(path)):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            if not matches:
                logger.warning("%s matches no file.", path)
            files.extend(collect_image_files(matches) if matches else [])
            continue
        if not path.is_dir():
            if not path.exists():
                logger.warning("%s does not exist; it gets an error row.", path)
            files.append(path)
            continue
        found = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in extensions
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
            and p.is_file()
        )
        if not found:
            logger.warning(
                "Folder %s holds no image files (%s, ...).", path, ", ".join(sorted(extensions)[:6])
            )
        files.extend(found)
    return files


def top_k(probabilities: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(batch, num_labels)` probabilities -> (scores, indices), each `(batch, min(k, num_labels))`, highest first."""
    return probabilities.topk(min(k, probabilities.shape[-1]), dim=-1)


def predict_files(
    classifier: Trained,
    files: Sequence[str | os.PathLike],
    top_k_labels: int = 5,
    batch_size: int = 32,
    num_workers: int = 0,
    progress: bool | None = None,
) -> Iterator[Prediction]:
    """One Prediction per file, in input order, computed `batch_size` images at a time.

    A file that cannot be decoded (missing, not an image, truncated, over the pixel limit) yields a
    Prediction with `error` set and no labels; the other files of its batch are unaffected.
    """
    if top_k_labels < 1:
        raise ValueError(f"top_k={top_k_labels} must be positive.")
    files = [str(f) for f in files]
    for batch in iter_batches(classifier, files, batch_size, num_workers, "Predicting", progress):
        rows = {i: Prediction(batch.sources[i], error=describe_error(e)) for i, e in batch.errors.items()}
        if batch.decoded:
            scores, indices = top_k(batch.outputs.softmax(dim=-1), top_k_labels)
            for row, i in enumerate(batch.decoded):
                rows[i] = Prediction(
                    batch.sources[i],
                    labels=[classifier.id2label[int(j)] for j in indices[row]],
                    scores=[float(s) for s in scores[row]],
                )
        yield from (rows[i] for i in range(len(batch.sources)))


def check_output_path(path: str | os.PathLike) -> Path:
    """`path` as a Path when it can be a predictions file: a .csv or .jsonl name that is not a folder."""
    path = Path(path)
    if path.suffix.lower() not in OUTPUT_FORMATS:
        raise ValueError(
            f"--output {path} must end in {' or '.join(OUTPUT_FORMATS)} (the suffix picks the format)."
        )
    if path.is_dir():
        raise ValueError(f"--output {path} is a folder; pass a file name such as {path / 'preds.csv'}.")
    return path


class PredictionWriter:
    """Streams Predictions to a `.csv` (lists as JSON arrays, empty cells for None) or `.jsonl` file.

    Rows go to a hidden temporary file in the same folder, renamed to `path` by `close()`: until then an
    existing file at `path` is untouched, and `discard()` (or leaving a `with` block on an exception) removes
    the temporary file and keeps it so.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = check_output_path(path)
        self.format = self.path.suffix.lower()
        self._partial = temporary_sibling(self.path)
        self._file = self._partial.open("w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by close()
        self._csv = (
            csv.DictWriter(self._file, fieldnames=PREDICTION_COLUMNS) if self.format == ".csv" else None
        )
        if self._csv is not None:
            self._csv.writeheader()

    def write(self, prediction: Prediction) -> None:
        row = prediction.as_row()
        if self._csv is None:
            self._file.write(json.dumps(row) + "\n")
            return
        row["top_k_labels"] = json.dumps(row["top_k_labels"])
        row["top_k_scores"] = json.dumps(row["top_k_scores"])
        self._csv.writerow({k: "" if v is None else v for k, v in row.items()})

    def close(self) -> None:
        """Finish the file and move it to `path` (replacing what was there)."""
        if self._file.closed:
            return
        self._file.close()
        move_into_place(self._partial, self.path)

    def discard(self) -> None:
        """Drop what was written; `path` keeps its old content (or stays absent)."""
        if not self._file.closed:
            self._file.close()
            self._partial.unlink(missing_ok=True)

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def read_predictions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows written by PredictionWriter, as dicts like `Prediction.as_row()` (CSV lists and numbers parsed)."""
    path = Path(path)
    with path.open(encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".jsonl":
            return [json.loads(line) for line in f if line.strip()]
        rows = []
        for row in csv.DictReader(f):
            rows.append(
                {
                    "path": row["path"],
                    "label": row["label"] or None,
                    "score": float(row["score"]) if row["score"] else None,
                    "top_k_labels": json.loads(row["top_k_labels"]),
                    "top_k_scores": json.loads(row["top_k_scores"]),
                    "error": row["error"] or None,
                }
            )
        return rows


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def plot_predictions(
    predictions: Sequence[Prediction], image_size: tuple[int, int], path: str | os.PathLike
) -> Path:
    """A grid of predicted images titled "label (p)", written to a hidden temporary file in the same folder and
    renamed to `path` when complete (an existing file at `path` stays as it was if drawing fails)."""
    images = [display_image(p.path, image_size) for p in predictions]
    titles = [f"{short(p.label or '?')} ({p.score:.2f})\n{short(Path(p.path).name, 24)}" for p in predictions]
    path = Path(path)
    with staged_file(path, suffix=".part.png") as partial:
        plot_image_grid(images, titles, partial, suptitle=f"Top-1 predictions ({len(predictions)} shown)")
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
) -> dict[str, Any]:
    """Predict every image in `inputs` and write one row per file to `output` (.csv or .jsonl).

    `figure="auto"` writes a grid of the first `figure_images` predicted images next to the output
    (`preds.csv` -> `preds.png`); None writes none. Neither may replace an input file. The output appears only
    when complete: a failure leaves an existing file as it was. `max_tokens` bounds the patch tokens per image
    at `image_size` (None: no bound); `bf16` runs the model under bf16 autocast ("auto": where the hardware
    has native bf16). Returns a summary: rows, errors, output and figure paths.
    """
    output = check_output_path(output)  # before the model loads
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
    classifier = load_trained(model, image_size, device, max_pixels, max_tokens=max_tokens, bf16=bf16)
    shown: list[Prediction] = []
    rows = errors = 0
    with PredictionWriter(output) as writer:
        for prediction in predict_files(classifier, files, top_k_labels, batch_size, num_workers, progress):
            writer.write(prediction)
            rows += 1
            errors += prediction.error is not None
            if prediction.error is None and len(shown) < figure_images:
                shown.append(prediction)
    summary: dict[str, Any] = {"rows": rows, "errors": errors, "output": str(writer.path), "figure": None}
    if figure_path is not None and shown:
        summary["figure"] = str(plot_predictions(shown, classifier.preprocessing.image_size, figure_path))
    logger.info("Wrote %d rows (%d with errors) to %s.", rows, errors, writer.path)
    return summary


__all__ = [
    "PREDICTION_COLUMNS",
    "Prediction",
    "PredictionWriter",
    "check_output_path",
    "collect_image_files",
    "default_figure_path",
    "predict_files",
    "read_predictions",
    "run_prediction",
]
