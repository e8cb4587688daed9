"""predict's files: the rows (`.csv` or `.jsonl`, streamed by PredictionWriter and read back by
`read_predictions`, in the model's task's columns: PREDICTION_COLUMNS, the top k; a multi-label model's
MULTI_LABEL_COLUMNS, every label at or above its decision threshold with its probability, highest first, an
empty list when none is, and the threshold; both end with OOD_COLUMNS, whether the image looks unlike the
training images and its score), the mark its figure carries, and the rule that keeps a user's files safe: predict
replaces only a file that predict wrote (a CSV with its header row, a JSONL file of its rows, a PNG with its
mark, or an empty file), anything else only with `--overwrite`; a full disk is one line, and no hidden
`.part` file stays behind whatever fails.
"""

from __future__ import annotations

import csv
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...tasks import TASKS, MultiLabel, SingleLabel, Task, task_for
from ...tasks.feature_bank import OOD_COLUMNS
from ...utils.files import disk_full_error as files_disk_full_error
from ...utils.files import is_disk_full, move_into_place, temporary_sibling

PREDICTION_COLUMNS = (*SingleLabel.prediction_columns, *OOD_COLUMNS)
MULTI_LABEL_COLUMNS = (*MultiLabel.prediction_columns, *OOD_COLUMNS)
# every task's rows are predict's, with or without the OOD columns (written before there were any)
MAP_COLUMNS = ("image", "method", "target", "probability", "map")  # `--explain`'s maps file (preds.maps.jsonl)
ROW_COLUMNS = (
    *(columns for task in TASKS.values() for columns in (task.prediction_columns, (*task.prediction_columns, *OOD_COLUMNS))),
    MAP_COLUMNS,
)
OUTPUT_FORMATS = (".csv", ".jsonl")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURE_MARK = b"vit_ft\x00predict"  # a PNG tEXt chunk's keyword and text: this figure is predict's own


@dataclass
class Prediction:
    """One output row: the predicted labels with their probabilities (highest first: the top k, or a multi-label
    model's labels at or above its threshold), or the reason there are none. Its task writes it as a row."""

    path: str
    labels: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    error: str | None = None
    task: Task = field(default_factory=task_for, repr=False)  # the model's: the row's columns and the caption
    unlike_training: bool | None = None  # None: no feature bank to tell (or the file was not read)
    ood_score: float | None = None  # the k-th nearest training image's distance over its threshold (above 1: unlike)

    @property
    def label(self) -> str | None:
        return self.labels[0] if self.labels else None

    @property
    def score(self) -> float | None:
        return self.scores[0] if self.scores else None

    def as_row(self) -> dict[str, Any]:
        """A JSON-ready dict with the keys of its task's `prediction_columns` (error None when the file was read)
        and of OOD_COLUMNS."""
        return {**self.task.prediction_row(self), "unlike_training": self.unlike_training, "ood_score": self.ood_score}


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


def mark_figure(png: bytes) -> bytes:
    """`png` with predict's mark: a tEXt chunk right after the header chunk (IHDR, always 25 bytes)."""
    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    chunk = b"tEXt" + FIGURE_MARK
    end = len(PNG_SIGNATURE) + 25
    return (
        png[:end]
        + struct.pack(">I", len(FIGURE_MARK))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + png[end:]
    )


def written_by_predict(path: str | os.PathLike) -> bool:
    """Whether the existing file `path` is one predict wrote (or is empty): only such a file is replaced
    without `--overwrite`. Read from its first bytes: the CSV header row, a JSONL row's keys, the PNG mark."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return True
    if head.startswith(PNG_SIGNATURE):
        return b"tEXt" + FIGURE_MARK in head
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    if first in (",".join(columns).encode() for columns in ROW_COLUMNS):
        return True
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and tuple(row) in ROW_COLUMNS


def refuse_replacing_others(files: dict[str, Path | None], overwrite: bool) -> None:
    """Refuse (FileExistsError) to replace an existing file that predict did not write, unless `overwrite`.
    `files` maps the flag that names each file (`--output`, `--figure`) to it (None: not written)."""
    for flag, path in files.items():
        if overwrite or path is None or not path.is_file() or written_by_predict(path):
            continue
        if flag == "--explain":  # the maps file is named after --output
            raise FileExistsError(f"{path} exists and was not written by predict; pass --overwrite to replace it, "
                                  "or another --output name (the maps go beside it, preds.maps.jsonl).")  # fmt: skip
        other = "preds.csv" if flag == "--output" else "preds.png, or --figure none"
        raise FileExistsError(
            f"{path} exists and was not written by predict; pass --overwrite to replace it, or another {flag} "
            f"name (e.g. {other})."
        )


def disk_full_error(error: BaseException, path: Path, flag: str, needed: int | None = None) -> BaseException:
    """For a full disk while writing `path` (named on the command line by `flag`), the one line to say
    (`files.disk_full_error`): which file, the space needed where known and the space free; any other error
    as it is."""
    if not is_disk_full(error):
        return error
    state = "an existing one is unchanged" if path.exists() else "nothing was written"
    return files_disk_full_error(path, state, f"Free some space, or pass {flag} on another disk", needed)


class PredictionWriter:
    """Streams Predictions to a `.csv` (lists as JSON arrays, empty cells for None) or `.jsonl` file.

    Rows go to a hidden temporary file in the same folder, renamed to `path` by `close()`: until then an
    existing file at `path` is untouched, and `discard()` (or leaving a `with` block on an exception) removes
    the temporary file and keeps it so. The temporary file is removed on every failure, a full disk included
    (then the error is one line that says so, see `disk_full_error`).
    """

    def __init__(self, path: str | os.PathLike, task: Task | None = None):
        self.path = check_output_path(path)
        columns = (*(task or task_for()).prediction_columns, *OOD_COLUMNS)
        self.format = self.path.suffix.lower()
        self._partial = temporary_sibling(self.path)
        try:
            self._file = self._partial.open("w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by close()
        except BaseException:
            self._partial.unlink(missing_ok=True)
            raise
        self._csv = csv.DictWriter(self._file, fieldnames=columns) if self.format == ".csv" else None
        if self._csv is not None:
            self._guarded(self._csv.writeheader)

    def _guarded(self, step: Any, *args: Any) -> None:
        """Run a step that writes; on any failure drop the temporary file, and say a full disk in one line."""
        try:
            step(*args)
        except BaseException as error:
            written = self._partial.stat().st_size if self._partial.exists() else 0
            self.discard()
            replacement = disk_full_error(error, self.path, "--output", written)
            if replacement is error:
                raise
            raise replacement from error

    def write(self, prediction: Prediction) -> None:
        row = prediction.as_row()
        if self._csv is None:
            self._guarded(self._file.write, json.dumps(row) + "\n")
            return
        for key, value in row.items():  # lists (and a per-label threshold) as JSON
            if isinstance(value, (list, dict)):
                row[key] = json.dumps(value)
        self._guarded(self._csv.writerow, {k: "" if v is None else v for k, v in row.items()})

    def _finish(self) -> None:
        self._file.close()
        move_into_place(self._partial, self.path)

    def close(self) -> None:
        """Finish the file and move it to `path` (replacing what was there)."""
        if not self._file.closed:
            self._guarded(self._finish)

    def discard(self) -> None:
        """Drop what was written; `path` keeps its old content (or stays absent)."""
        try:
            if not self._file.closed:
                self._file.close()  # may fail again on a full disk (the buffer is flushed first)
        except OSError:
            pass
        finally:
            self._partial.unlink(missing_ok=True)

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def _parsed_csv_row(row: dict[str, str]) -> dict[str, Any]:
    """A CSV row of either kind with its JSON arrays and numbers parsed, empty cells as None."""
    parsed = _parsed_task_columns(row)
    if "unlike_training" in row:
        flag, score = row["unlike_training"], row["ood_score"]
        parsed["unlike_training"] = None if not flag else flag == "True"
        parsed["ood_score"] = float(score) if score else None
    return parsed


def _parsed_task_columns(row: dict[str, str]) -> dict[str, Any]:
    if "labels" in row:  # a multi-label model's
        threshold = row["threshold"]
        return {
            "path": row["path"],
            "labels": json.loads(row["labels"]),
            "scores": json.loads(row["scores"]),
            "num_labels": int(row["num_labels"]) if row["num_labels"] else None,
            "threshold": json.loads(threshold) if threshold else None,
            "error": row["error"] or None,
        }
    return {
        "path": row["path"],
        "label": row["label"] or None,
        "score": float(row["score"]) if row["score"] else None,
        "top_k_labels": json.loads(row["top_k_labels"]),
        "top_k_scores": json.loads(row["top_k_scores"]),
        "error": row["error"] or None,
    }


def read_predictions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows written by PredictionWriter, as dicts like `Prediction.as_row()` (CSV lists and numbers parsed)."""
    path = Path(path)
    with path.open(encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".jsonl":
            return [json.loads(line) for line in f if line.strip()]
        return [_parsed_csv_row(row) for row in csv.DictReader(f)]


__all__ = [
    "MULTI_LABEL_COLUMNS",
    "OOD_COLUMNS",
    "OUTPUT_FORMATS",
    "PREDICTION_COLUMNS",
    "Prediction",
    "PredictionWriter",
    "check_output_path",
    "disk_full_error",
    "mark_figure",
    "read_predictions",
    "refuse_replacing_others",
    "written_by_predict",
]
