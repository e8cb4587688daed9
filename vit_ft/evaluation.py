"""Evaluation of a fine-tuned classifier: metrics, a per-class table, a confusion matrix, the most confident
mistakes, and a `report.md` that shows them (with the fine-tune's training curves).

The data is, by default, the evaluation split the fine-tune recorded in `vit_ft_run.json` (test if it had one,
else validation), rebuilt with `vit_ft.data.load_image_datasets` from the same arguments and seed; or a
recipe's split; or an image folder with one sub-folder per class.

    run_evaluation("outputs/digits", "reports/digits")                       # the recorded test split
    run_evaluation("outputs/digits", "reports/digits-48", image_size=48)     # another test-time resolution
    run_evaluation("outputs/digits", "reports/mine", data_dir="my_digits/")  # labels matched by class name
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import pickle
import shutil
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from .data import load_image_datasets, write_digits_imagefolder  # noqa: E402
from .images import describe_source  # noqa: E402
from .lora import ADAPTER_DIR, is_adapter_folder  # noqa: E402
from .prediction import (  # noqa: E402
    Classifier,
    describe_error,
    display_image,
    load_classifier,
    map_images,
    plot_image_grid,
    progress_bar,
    short,
)
from .training import RUN_INFO_FILE  # noqa: E402

logger = logging.getLogger("vit_ft")

DATA_FIELDS = (
    "dataset_name", "dataset_config", "train_dir", "validation_dir", "test_dir", "train_split",
    "validation_split", "test_split", "image_column", "label_column", "validation_split_percentage",
    "max_eval_samples",
)  # fmt: skip
CELL_NUMBERS_MAX_CLASSES = 30  # above this, numbers in the confusion-matrix cells are unreadable
TABLE_IN_REPORT_MAX_CLASSES = 30  # above this, report.md shows the worst classes and links the full table


# ---------------------------------------------------------------------------------------------------------
# What the fine-tune recorded
# ---------------------------------------------------------------------------------------------------------


def run_folder(model: str | os.PathLike) -> Path | None:
    """The fine-tune's output folder for a local `--model` (the parent of an `adapter/` folder), else None."""
    path = Path(model)
    if not path.is_dir():
        return None
    if is_adapter_folder(path) and path.name == ADAPTER_DIR and (path.parent / RUN_INFO_FILE).is_file():
        return path.parent
    return path


def read_run_info(model: str | os.PathLike) -> dict[str, Any] | None:
    """The `vit_ft_run.json` a fine-tune wrote next to the model, or None (a Hub id, a converted checkpoint)."""
    folder = run_folder(model)
    if folder is None or not (folder / RUN_INFO_FILE).is_file():
        return None
    return json.loads((folder / RUN_INFO_FILE).read_text(encoding="utf-8"))


class _Recorded:
    """Stands in for every class in a pickle, so reading one runs no code of the classes it names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _StateOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("copyreg", "_reconstructor"):
            return lambda cls, base, state: cls()
        return type(name, (_Recorded,), {})

    def persistent_load(self, pid: Any) -> None:
        return None  # tensor storages: TrainingArguments holds none


def read_training_seed(folder: str | os.PathLike) -> int | None:
    """The data seed of the fine-tune in `folder` (TrainingArguments' data_seed, else seed), or None.

    Read from `vit_ft_run.json` when it records one, else from the `training_args.bin` that Trainer saves.
    That file is a pickle: it is read with an unpickler that builds no object of the classes it names, so
    a foreign model folder cannot run code here.
    """
    folder = Path(folder)
    info = read_run_info(folder) or {}
    for key in ("data_seed", "seed"):
        if info.get(key) is not None:
            return int(info[key])
    path = folder / "training_args.bin"
    if not path.is_file():
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            args = _StateOnlyUnpickler(io.BytesIO(archive.read(name))).load()
        state = args.state if isinstance(args, _Recorded) and isinstance(args.state, dict) else {}
    except (
        OSError,
        StopIteration,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
    ) as error:
        logger.warning("Could not read the seed from %s (%s).", path, error)
        return None
    seed = state.get("data_seed") if state.get("data_seed") is not None else state.get("seed")
    return int(seed) if isinstance(seed, int) else None


# ---------------------------------------------------------------------------------------------------------
# Evaluation data
# ---------------------------------------------------------------------------------------------------------


@dataclass
class EvalData:
    """Images to evaluate, their true labels as the model's label ids, and where they came from."""

    dataset: datasets.Dataset  # column "image" holds datasets.Image(decode=False) values {"bytes", "path"}
    labels: np.ndarray  # (num_images,) int64 model label ids
    description: str
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)


def _model_label_ids(names: Sequence[str], id2label: dict[int, str], where: str) -> list[int]:
    """The model's label id of each dataset class name; a class the model does not know is an error."""
    label2id = {name: i for i, name in id2label.items()}
    unknown = [name for name in names if name not in label2id]
    if unknown:
        known = list(id2label.values())
        raise ValueError(
            f"{where} has class(es) {unknown} that the model does not know; its labels are "
            f"{known[:20]}{' ...' if len(known) > 20 else ''}. Rename or remove those class folders."
        )
    return [label2id[name] for name in names]


def _as_eval_data(
    dataset: datasets.Dataset,
    names: Sequence[str],
    id2label: dict[int, str],
    description: str,
    notes: list[str],
) -> EvalData:
    ids = np.asarray(_model_label_ids(names, id2label, description), dtype=np.int64)
    labels = ids[np.asarray(dataset["label"], dtype=np.int64)]  # dataset class index -> model label id
    dataset = dataset.select_columns(["image"]).cast_column("image", datasets.Image(decode=False))
    return EvalData(dataset, labels, description, notes)


def data_from_fields(
    fields: dict[str, Any],
    id2label: dict[int, str],
    split: str | None,
    seed: int,
    where: str,
    max_samples: int | None = None,
) -> EvalData:
    """The `split` ("test"/"validation"; default test if there is one) of the data that DataArguments-style
    `fields` describe, loaded as the fine-tune loaded it (same held-out split and subsets for the same seed)."""
    if fields.get("builtin_dataset") == "digits" and fields.get("train_dir"):
        write_digits_imagefolder(Path(fields["train_dir"]).parent, seed=0)  # as the fine-tune writes it
    arguments = {name: fields[name] for name in DATA_FIELDS if name in fields}
    try:
        splits, names = load_image_datasets(**arguments, seed=seed)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error} (data recorded by {where}; relative paths are read from the current folder: run from the "
            "folder the fine-tune ran in, or pass --data_dir / --recipe)."
        ) from error
    if split is None:
        split = "test" if "test" in splits else "validation"
    if split not in splits:
        raise ValueError(
            f"{where} has no {split!r} split; its splits are {sorted(splits)}. Pass --split with one of them."
        )
    source = fields.get("dataset_name") or fields.get(f"{split}_dir") or fields.get("train_dir")
    description = f"split {split!r} of {source} ({where}, seed {seed})"
    dataset = splits[split]
    if max_samples is not None and max_samples < len(dataset):
        dataset = dataset.shuffle(seed=seed).select(range(max_samples))
        description += f", {max_samples} random images"
    return _as_eval_data(dataset, names, id2label, description, [])


def recorded_eval_data(
    model: str | os.PathLike,
    id2label: dict[int, str],
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """The evaluation data recorded in the model folder's `vit_ft_run.json` (see `data_from_fields`)."""
    info = read_run_info(model)
    if info is None:
        raise FileNotFoundError(
            f"{model} has no {RUN_INFO_FILE} (it is not a vit_ft fine-tune output folder), so there is no recorded "
            "evaluation data: pass --data_dir FOLDER (one sub-folder per class) or --recipe NAME."
        )
    notes = []
    if seed is None:
        seed = read_training_seed(run_folder(model))
        if seed is None:
            seed = 0
            notes.append(
                "The fine-tune's seed is not recorded: seed 0 assumed. A held-out validation split and "
                "max_eval_samples subsets depend on it; pass --seed to match the fine-tune."
            )
    data = data_from_fields(
        info.get("data", {}), id2label, split, seed, f"{RUN_INFO_FILE} of {model}", max_samples
    )
    data.notes.extend(notes)
    return data


def recipe_eval_data(
    recipe: str,
    id2label: dict[int, str],
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """The evaluation split of a recipe's data, with the recipe's seed (TrainingArguments' 42 if it sets none)."""
    from .recipes import load_recipe, resolve_recipe

    values = load_recipe(resolve_recipe(recipe))
    if seed is None:
        seed = values.get("data_seed") if values.get("data_seed") is not None else values.get("seed", 42)
    return data_from_fields(values, id2label, split, int(seed), f"recipe {recipe!r}", max_samples)


def folder_eval_data(
    folder: str | os.PathLike, id2label: dict[int, str], max_samples: int | None = None, seed: int = 0
) -> EvalData:
    """All images of `folder`/<class name>/<image>; class names are matched to the model's label names."""
    splits, names = load_image_datasets(train_dir=folder, validation_split_percentage=0, seed=seed)
    dataset = splits["train"]
    description = f"image folder {os.fspath(folder)}"
    if max_samples is not None and max_samples < len(dataset):
        dataset = dataset.shuffle(seed=seed).select(range(max_samples))
        description += f" ({max_samples} random images, seed {seed})"
    return _as_eval_data(dataset, names, id2label, description, [])


def resolve_eval_data(
    model: str | os.PathLike,
    id2label: dict[int, str],
    recipe: str | None = None,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    seed: int | None = None,
    max_samples: int | None = None,
) -> EvalData:
    """`data_dir` if given, else `recipe`'s split, else the data recorded with the model."""
    if recipe is not None and data_dir is not None:
        raise ValueError("Pass either --recipe or --data_dir, not both.")
    if data_dir is not None:
        return folder_eval_data(data_dir, id2label, max_samples, seed or 0)
    if recipe is not None:
        return recipe_eval_data(recipe, id2label, split, seed, max_samples)
    return recorded_eval_data(model, id2label, split, seed, max_samples)


# ---------------------------------------------------------------------------------------------------------
# Running the model
# ---------------------------------------------------------------------------------------------------------


@dataclass
class EvalOutputs:
    """Model outputs on the images that decoded; `rows` indexes them in the EvalData."""

    logits: np.ndarray  # (num_evaluated, num_labels) float32
    labels: np.ndarray  # (num_evaluated,) true model label ids
    rows: np.ndarray  # (num_evaluated,) row index in EvalData.dataset
    sources: list[str]  # (num_evaluated,) file path (or a description) of each image
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"row", "source", "reason"}

    @property
    def probabilities(self) -> np.ndarray:
        """Softmax of the logits, `(num_evaluated, num_labels)`."""
        return torch.from_numpy(self.logits).softmax(dim=-1).numpy()

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(axis=-1)


def predict_dataset(
    classifier: Classifier,
    data: EvalData,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool | None = None,
) -> EvalOutputs:
    """Logits for every image of `data`, `batch_size` at a time; images that do not decode are skipped
    (listed in `skipped`), as the fine-tune's `drop_bad_images` dropped them."""
    logits, rows, sources, skipped = [], [], [], []
    pool = ThreadPoolExecutor(num_workers) if num_workers > 0 else None
    try:
        with progress_bar(len(data), "Evaluating", progress) as bar:
            for start in range(0, len(data), batch_size):
                values = data.dataset[start : start + batch_size]["image"]
                pixels = map_images(classifier.transform.transform_image, values, pool)
                good = []
                for offset, (value, result) in enumerate(zip(values, pixels, strict=True)):
                    if isinstance(result, torch.Tensor):
                        good.append(offset)
                    else:
                        source = describe_source(value) if value else f"row {start + offset}"
                        skipped.append(
                            {"row": start + offset, "source": source, "reason": describe_error(result)}
                        )
                if good:
                    batch = torch.stack([pixels[i] for i in good])  # (B, channels, height, width)
                    logits.append(classifier.logits(batch).numpy())
                    rows.extend(start + i for i in good)
                    sources.extend(describe_source(values[i]) for i in good)
                bar.update(len(values))
    finally:
        if pool is not None:
            pool.shutdown()
    if skipped:
        logger.warning(
            "Skipped %d of %d images that do not decode, e.g. %s (%s).",
            len(skipped),
            len(data),
            skipped[0]["source"],
            skipped[0]["reason"],
        )
    if not rows:
        raise ValueError(
            f"None of the {len(data)} images of {data.description} decodes; nothing to evaluate."
        )
    row_index = np.asarray(rows, dtype=np.int64)
    return EvalOutputs(np.concatenate(logits), data.labels[row_index], row_index, sources, skipped)


# ---------------------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------------------


def confusion_counts(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """`(num_classes, num_classes)` int64 counts, rows = true class, columns = predicted class."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


def normalize_rows(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (the fraction of a true class predicted as each class); empty rows stay 0."""
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros(counts.shape, dtype=np.float64), where=totals > 0)


def per_class_table(counts: np.ndarray, id2label: dict[int, str]) -> list[dict[str, Any]]:
    """One row per class from the confusion counts: support, predicted, precision, recall (the class's
    accuracy) and F1; precision/F1 are 0 where undefined (nothing predicted or no support)."""
    true_positives = np.diag(counts)
    support = counts.sum(axis=1)
    predicted = counts.sum(axis=0)
    rows = []
    for i in range(len(counts)):
        precision = true_positives[i] / predicted[i] if predicted[i] else 0.0
        recall = true_positives[i] / support[i] if support[i] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append(
            {
                "id": i,
                "class": id2label[i],
                "support": int(support[i]),
                "predicted": int(predicted[i]),
                "precision": float(precision),
                "recall": float(recall),
                "f1": float(f1),
            }
        )
    return rows


def compute_metrics(outputs: EvalOutputs, top_k: int = 5) -> dict[str, float]:
    """accuracy, top-k accuracy and macro-F1 with the metric modules the fine-tune used (so the numbers agree
    with its eval/test results); macro-F1 averages over the classes present in the labels or predictions."""
    from .metrics import build_compute_metrics

    values = build_compute_metrics(top_k)((outputs.logits, outputs.labels))
    return {
        "accuracy": float(values["accuracy"]),
        f"top{top_k}_accuracy": float(values[f"top{top_k}_accuracy"]),
        "macro_f1": float(values["f1"]),
    }


@dataclass
class Mistake:
    rank: int
    row: int  # in EvalData.dataset
    source: str
    true_label: str
    predicted_label: str
    probability: float  # of the predicted label
    true_probability: float


def most_confident_mistakes(
    outputs: EvalOutputs, data: EvalData, id2label: dict[int, str], limit: int = 25
) -> list[Mistake]:
    """The `limit` wrong predictions with the highest predicted probability, most confident first."""
    probabilities = outputs.probabilities
    predictions = outputs.predictions
    wrong = np.flatnonzero(predictions != outputs.labels)
    confidence = probabilities[wrong, predictions[wrong]]
    order = wrong[np.argsort(-confidence, kind="stable")][:limit]
    mistakes = []
    for rank, i in enumerate(order, start=1):
        row = int(outputs.rows[i])
        mistakes.append(
            Mistake(
                rank=rank,
                row=row,
                source=outputs.sources[i],
                true_label=id2label[int(outputs.labels[i])],
                predicted_label=id2label[int(predictions[i])],
                probability=float(probabilities[i, predictions[i]]),
                true_probability=float(probabilities[i, outputs.labels[i]]),
            )
        )
    return mistakes


# ---------------------------------------------------------------------------------------------------------
# Figures and tables
# ---------------------------------------------------------------------------------------------------------


def plot_confusion_matrix(
    counts: np.ndarray, id2label: dict[int, str], path: str | os.PathLike, title: str = "Confusion matrix"
) -> Path:
    """Row-normalised confusion matrix as a PNG, readable from 2 to 1,000 classes.

    Only classes that occur (as truth or prediction) are drawn. Cells show their value up to 30 classes; above
    that the figure grows with the class count (up to 24 inches), tick labels shrink, and every k-th label is
    kept so that they never overlap.
    """
    shown = np.flatnonzero((counts.sum(axis=0) + counts.sum(axis=1)) > 0)
    if len(shown) == 0:
        shown = np.arange(len(counts))
    matrix = normalize_rows(counts[np.ix_(shown, shown)])
    n = len(shown)
    side = float(np.clip(3 + 0.16 * n, 6, 24))  # inches
    points_per_class = side * 72 * 0.75 / n  # the axes take about 3/4 of the figure
    fontsize = float(np.clip(points_per_class * 0.8, 3.5, 10))
    step = max(1, math.ceil(fontsize / max(points_per_class, 1e-6) / 0.9))
    fig, ax = plt.subplots(figsize=(side + 1.5, side))
    image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ticks = np.arange(0, n, step)
    names = [short(id2label[int(shown[i])], 24) for i in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, names, fontsize=fontsize)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title + ("" if step == 1 else f" (every {step}th class labelled)"))
    if n <= CELL_NUMBERS_MAX_CLASSES:
        for (i, j), value in np.ndenumerate(matrix):
            if value > 0:
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=min(9, fontsize),
                        color="white" if value > 0.5 else "black")  # fmt: skip
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="fraction of the true class")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100 if n <= 60 else 150)
    plt.close(fig)
    return path


def plot_mistakes(
    mistakes: Sequence[Mistake], data: EvalData, image_size: tuple[int, int], path: str | os.PathLike
) -> Path:
    """A grid of the most confident mistakes titled "true / pred (p)", most confident first."""
    if not mistakes:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No mistakes", ha="center", va="center", fontsize=14)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)
    images: list[Image.Image | None] = map_images(
        lambda m: display_image(data.dataset[m.row]["image"], image_size), list(mistakes)
    )
    images = [image if isinstance(image, Image.Image) else None for image in images]
    titles = [f"{short(m.true_label)} / {short(m.predicted_label)} ({m.probability:.2f})" for m in mistakes]
    return plot_image_grid(
        images,
        titles,
        path,
        suptitle=f"{len(mistakes)} most confident mistakes: true / predicted (probability)",
    )


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `rows`; floats with 4 decimals, "|" in names escaped."""

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_confusion_csv(counts: np.ndarray, id2label: dict[int, str], path: Path) -> Path:
    """Counts with class names as the header row and first column (rows true, columns predicted)."""
    names = [id2label[i] for i in range(len(counts))]
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *names])
        for name, row in zip(names, counts, strict=True):
            writer.writerow([name, *row.tolist()])
    return path


PER_CLASS_COLUMNS = ("class", "support", "predicted", "precision", "recall", "f1")


def write_report(
    output_dir: Path,
    model: str,
    metrics: dict[str, Any],
    table: list[dict[str, Any]],
    figures: dict[str, str],
    notes: Sequence[str],
) -> Path:
    """report.md: the metrics, every figure, the per-class table (or its worst rows), and the notes."""
    top_key = next(k for k in metrics if k.startswith("top") and k.endswith("_accuracy"))
    top_name = f"top-{top_key.removeprefix('top').removesuffix('_accuracy')} accuracy"
    folder = run_folder(model)
    model_link = f"[`{model}`]({os.path.relpath(folder, output_dir)})" if folder else f"`{model}`"
    lines = [
        f"# Evaluation of `{model}`",
        "",
        f"- Model: {model_link}",
        f"- Data: {metrics['data']}",
        f"- Images: {metrics['num_images']} evaluated"
        + (f", {metrics['num_skipped']} skipped (do not decode, see metrics.json)" if metrics["num_skipped"] else ""),
        f"- Resolution: {metrics['image_size'][0]}x{metrics['image_size'][1]}"
        + (f" (fine-tuned at {metrics['trained_image_size'][0]}x{metrics['trained_image_size'][1]})"
           if metrics.get("trained_image_size") and metrics["trained_image_size"] != metrics["image_size"] else ""),
        "",
        "## Metrics",
        "",
        markdown_table(
            [{"accuracy": metrics["accuracy"], top_name: metrics[top_key],
              "macro-F1": metrics["macro_f1"], "images": metrics["num_images"]}],
            ["accuracy", top_name, "macro-F1", "images"],
        ),
        "All numbers: [metrics.json](metrics.json). Per-image predictions: [predictions.csv](predictions.csv).",
        "",
    ]  # fmt: skip
    titles = {
        "confusion_matrix": "Confusion matrix (rows: true class, normalised)",
        "mistakes": "Most confident mistakes",
        "training_curves": "Training curves of the fine-tune",
    }
    for key, title in titles.items():
        if key in figures:
            lines += [f"## {title}", "", f"![{title}]({figures[key]})", ""]
    lines += ["Counts: [confusion_matrix.csv](confusion_matrix.csv) ([.npy](confusion_matrix.npy)); the mistakes "
              "shown: [mistakes.csv](mistakes.csv).", ""]  # fmt: skip
    if "training_curves" not in figures:
        lines += ["No training curves: the model folder has no training_curves.png.", ""]
    lines += [
        "## Per class",
        "",
        "Full table: [per_class.csv](per_class.csv), [per_class.md](per_class.md).",
        "",
    ]
    present = [row for row in table if row["support"] > 0]
    if len(present) <= TABLE_IN_REPORT_MAX_CLASSES:
        lines.append(markdown_table(present, PER_CLASS_COLUMNS))
    else:
        worst = sorted(present, key=lambda row: (row["f1"], -row["support"]))[:10]
        lines += ["The 10 classes with the lowest F1:", "", markdown_table(worst, PER_CLASS_COLUMNS)]
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    path = output_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _copy_training_curves(model: str, output_dir: Path) -> str | None:
    folder = run_folder(model)
    source = folder / "training_curves.png" if folder else None
    if source is None or not source.is_file():
        return None
    shutil.copyfile(source, output_dir / "training_curves.png")
    return "training_curves.png"


# ---------------------------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Evaluate `model` and write metrics.json, per_class.csv/.md, confusion_matrix.png/.csv/.npy,
    mistakes.png/.csv, predictions.csv, training_curves.png (copied when the model folder has one) and
    report.md to `output_dir`. Returns the contents of metrics.json."""
    model = str(model)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    classifier = load_classifier(model, image_size, device)
    id2label = classifier.id2label
    data = resolve_eval_data(model, id2label, recipe, data_dir, split, seed, max_samples)
    logger.info("Evaluating %s on %s: %d images.", model, data.description, len(data))

    started = time.perf_counter()
    outputs = predict_dataset(classifier, data, batch_size, num_workers, progress)
    elapsed = time.perf_counter() - started
    predictions = outputs.predictions
    counts = confusion_counts(outputs.labels, predictions, classifier.num_labels)
    table = per_class_table(counts, id2label)
    info = read_run_info(model) or {}
    metrics: dict[str, Any] = {
        **compute_metrics(outputs, top_k),
        "num_images": int(len(outputs.labels)),
        "num_skipped": len(outputs.skipped),
        "num_classes": classifier.num_labels,
        "model": model,
        "data": data.description,
        "image_size": list(classifier.preprocessing.image_size),
        "trained_image_size": info.get("image_size"),
        "images_per_second": round(len(outputs.labels) / max(elapsed, 1e-9), 2),
        "device": str(classifier.device),
        "skipped": outputs.skipped,
        "notes": data.notes,
    }
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")

    _write_csv(output_dir / "per_class.csv", table)
    (output_dir / "per_class.md").write_text(markdown_table(table, PER_CLASS_COLUMNS), encoding="utf-8")
    np.save(output_dir / "confusion_matrix.npy", counts)
    write_confusion_csv(counts, id2label, output_dir / "confusion_matrix.csv")
    probabilities = outputs.probabilities
    _write_csv(
        output_dir / "predictions.csv",
        [
            {
                "row": int(row),
                "source": outputs.sources[i],
                "true_label": id2label[int(label)],
                "predicted_label": id2label[int(pred)],
                "probability": float(probabilities[i, pred]),
                "correct": bool(label == pred),
            }
            for i, (row, label, pred) in enumerate(
                zip(outputs.rows, outputs.labels, predictions, strict=True)
            )
        ],
    )
    mistakes = most_confident_mistakes(outputs, data, id2label, max_mistakes)
    _write_csv(output_dir / "mistakes.csv", [vars(m) for m in mistakes])

    figures = {
        "confusion_matrix": plot_confusion_matrix(
            counts,
            id2label,
            output_dir / "confusion_matrix.png",
            title=f"Confusion matrix, accuracy {metrics['accuracy']:.3f} on {metrics['num_images']} images",
        ).name,
        "mistakes": plot_mistakes(
            mistakes, data, classifier.preprocessing.image_size, output_dir / "mistakes.png"
        ).name,
    }
    curves = _copy_training_curves(model, output_dir)
    if curves:
        figures["training_curves"] = curves
    write_report(output_dir, model, metrics, table, figures, data.notes)
    logger.info(
        "accuracy %.4f, top-%d %.4f, macro-F1 %.4f on %d images; report in %s",
        metrics["accuracy"],
        top_k,
        metrics[f"top{top_k}_accuracy"],
        metrics["macro_f1"],
        metrics["num_images"],
        output_dir / "report.md",
    )
    return metrics


__all__ = [
    "EvalData",
    "EvalOutputs",
    "Mistake",
    "compute_metrics",
    "confusion_counts",
    "most_confident_mistakes",
    "normalize_rows",
    "per_class_table",
    "plot_confusion_matrix",
    "plot_mistakes",
    "predict_dataset",
    "read_run_info",
    "read_training_seed",
    "resolve_eval_data",
    "run_evaluation",
]
