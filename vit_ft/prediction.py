"""Batch prediction: image files and folders -> the top-k labels of each file, as CSV or JSONL rows.

Also the pieces `vit_ft.evaluation` and `vit_ft.inspection` share: loading any `--model` (a vit_ft folder, a
LoRA adapter folder or a Hub id) with its evaluation preprocessing, batched decoding that turns a bad file into
an error instead of a crash, and a grid of images with titles.

    classifier = load_classifier("outputs/digits")
    files = collect_image_files(["photos/", "extra.jpg"])
    n_rows, n_errors = write_predictions(predict_files(classifier, files, top_k=5), "preds.csv")
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from .data import ImageClassificationTransform, build_transforms  # noqa: E402
from .images import DEFAULT_MAX_PIXELS, load_image, resize_and_center_crop  # noqa: E402
from .lora import ADAPTER_DIR, is_adapter_folder, load_for_inference  # noqa: E402

logger = logging.getLogger("vit_ft")

PREDICTION_COLUMNS = ("path", "label", "score", "top_k_labels", "top_k_scores", "error")
OUTPUT_FORMATS = (".csv", ".jsonl")
# ViTImageProcessor's defaults, for a model that comes without a preprocessor_config.json
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


# ---------------------------------------------------------------------------------------------------------
# Loading a model with its preprocessing
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preprocessing:
    """The evaluation geometry and normalisation: resize + centre crop to `image_size`, then normalise."""

    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = DEFAULT_MEAN
    std: tuple[float, ...] = DEFAULT_STD
    rescale_factor: float = 1 / 255
    resample: int = Image.Resampling.BICUBIC  # what vit_ft fine-tunes and evaluates with
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def transform(self) -> ImageClassificationTransform:
        """The eval transform of `vit_ft.data.build_transforms` with these settings."""
        return build_transforms(
            self.image_size,
            mean=self.mean,
            std=self.std,
            train=False,
            rescale_factor=self.rescale_factor,
            resample=self.resample,
            max_pixels=self.max_pixels,
        )


@dataclass
class Classifier:
    """A loaded image classifier: the model (in eval mode, on `device`), its preprocessing and label names."""

    model: torch.nn.Module
    preprocessing: Preprocessing
    id2label: dict[int, str]
    source: str
    device: torch.device
    transform: ImageClassificationTransform = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.transform = self.preprocessing.transform()

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @torch.inference_mode()
    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`(batch, channels, height, width)` normalised pixels -> float32 logits `(batch, num_labels)` on CPU."""
        out = self.model(pixel_values=pixel_values.to(self.device))
        return out.logits.float().cpu()


def _read_processor_config(model: str | Path) -> dict[str, Any] | None:
    """preprocessor_config.json of a local folder (or its adapter/ subfolder), else of a Hub id, else None."""
    path = Path(model)
    for folder in (path, path / ADAPTER_DIR):
        candidate = folder / "preprocessor_config.json"
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    if path.exists():
        return None
    try:
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(str(model)).to_dict()
    except (OSError, ValueError) as error:
        logger.warning("No image processor for %s (%s).", model, error)
        return None


def read_preprocessing(
    model: str | Path,
    config: Any,
    image_size: int | Sequence[int] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Preprocessing:
    """The model's evaluation preprocessing: mean/std/resample from its image processor, size from its config.

    `image_size` (an int or (height, width)) evaluates at another test-time resolution; it must be a multiple
    of the patch size (the model resamples its position embeddings to the new grid).
    """
    size = tuple(config.image_hw) if image_size is None else _as_hw(image_size)
    patch = tuple(config.patch_hw)
    if size[0] % patch[0] or size[1] % patch[1] or min(size) <= 0:
        near = [max(p, round(s / p) * p) for s, p in zip(size, patch, strict=True)]
        raise ValueError(
            f"image_size={size[0]}x{size[1]} is not a multiple of the model's patch size {patch[0]}x{patch[1]}; "
            f"use e.g. --image_size {near[0]}"
            + ("" if near[0] == near[1] else f" (or {near[0]}x{near[1]})")
            + "."
        )
    processor = _read_processor_config(model)
    if processor is None:
        logger.warning("No preprocessor_config.json for %s: normalising with mean 0.5, std 0.5.", model)
        return Preprocessing(image_size=size, max_pixels=max_pixels)
    return Preprocessing(
        image_size=size,
        mean=tuple(float(v) for v in processor.get("image_mean", DEFAULT_MEAN)),
        std=tuple(float(v) for v in processor.get("image_std", DEFAULT_STD)),
        rescale_factor=float(processor.get("rescale_factor", 1 / 255)),
        resample=int(processor.get("resample", Image.Resampling.BICUBIC)),
        max_pixels=max_pixels,
    )


def _as_hw(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    values = tuple(int(v) for v in size)
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) != 2:
        raise ValueError(f"image_size={size!r} must be one int or a (height, width) pair.")
    return values  # type: ignore[return-value]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_classifier(
    model: str | Path,
    image_size: int | Sequence[int] | None = None,
    device: str | torch.device | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Classifier:
    """Load `model` (vit_ft folder, LoRA adapter folder or output folder with `adapter/`, or a Hub id) for inference.

    A LoRA model is kept unmerged (its adapters active); `image_size` changes only the input resolution, the
    model resamples its position embeddings on the fly, exactly as `from_pretrained(image_size=...)` would.
    """
    loaded = load_for_inference(model)
    if hasattr(loaded, "get_base_model"):  # a peft model: its base model holds the active LoRA layers
        loaded = loaded.get_base_model()
    config = loaded.config
    if not getattr(config, "id2label", None) or getattr(config, "num_labels", 0) < 1:
        raise ValueError(
            f"{model} has no classification head (no labels in its config); pass a fine-tuned model folder."
        )
    device = torch.device(device) if device is not None else default_device()
    preprocessing = read_preprocessing(model, config, image_size, max_pixels)
    id2label = {int(k): str(v) for k, v in config.id2label.items()}
    return Classifier(loaded.to(device).eval(), preprocessing, id2label, str(model), device)


def is_local_model(model: str | Path) -> bool:
    path = Path(model)
    return path.is_dir() and ((path / "config.json").is_file() or is_adapter_folder(path / ADAPTER_DIR))


# ---------------------------------------------------------------------------------------------------------
# Decoding many images, bad ones reported instead of raised
# ---------------------------------------------------------------------------------------------------------


def _try(function: Callable[[Any], Any], value: Any) -> Any:
    try:
        return function(value)
    except Exception as error:  # any failure makes this one file unusable, not the run
        return error


def map_images(
    function: Callable[[Any], Any], sources: Sequence[Any], pool: ThreadPoolExecutor | None = None
) -> list[Any]:
    """`function(source)` for each source, in order; a failure comes back as its exception, not raised.

    With a thread pool the images decode in parallel (Pillow releases the GIL while decoding).
    """
    if pool is None:
        return [_try(function, source) for source in sources]
    return list(pool.map(lambda source: _try(function, source), sources))


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def progress_bar(total: int, desc: str, enabled: bool | None = None) -> tqdm:
    """A tqdm bar on stderr; `enabled=None` shows it only on a terminal."""
    return tqdm(total=total, desc=desc, unit="img", disable=None if enabled is None else not enabled)


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


def image_extensions() -> set[str]:
    """Lower-case file suffixes read as images: those of datasets' imagefolder builder (the training loader)."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return {ext.lower() for ext in ImageFolder.EXTENSIONS}


def collect_image_files(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given (whatever their suffix: an unreadable one gets an error row), folders searched
    recursively for image suffixes in sorted order, skipping hidden entries. A path that does not exist is
    kept, so that it too gets an error row."""
    extensions = image_extensions()
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
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
    classifier: Classifier,
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
    if top_k_labels < 1 or batch_size < 1:
        raise ValueError(f"top_k={top_k_labels} and batch_size={batch_size} must be positive.")
    pool = ThreadPoolExecutor(num_workers) if num_workers > 0 else None
    try:
        with progress_bar(len(files), "Predicting", progress) as bar:
            for start in range(0, len(files), batch_size):
                chunk = [str(f) for f in files[start : start + batch_size]]
                pixels = map_images(classifier.transform.transform_image, chunk, pool)
                good = [i for i, p in enumerate(pixels) if isinstance(p, torch.Tensor)]
                rows = {
                    i: Prediction(chunk[i], error=describe_error(p))
                    for i, p in enumerate(pixels)
                    if i not in good
                }
                if good:
                    batch = torch.stack([pixels[i] for i in good])  # (B, channels, height, width)
                    scores, indices = top_k(classifier.logits(batch).softmax(dim=-1), top_k_labels)
                    for row, i in enumerate(good):
                        rows[i] = Prediction(
                            chunk[i],
                            labels=[classifier.id2label[int(j)] for j in indices[row]],
                            scores=[float(s) for s in scores[row]],
                        )
                bar.update(len(chunk))
                yield from (rows[i] for i in range(len(chunk)))
    finally:
        if pool is not None:
            pool.shutdown()


class PredictionWriter:
    """Streams Predictions to a `.csv` (lists as JSON arrays, empty cells for None) or `.jsonl` file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.format = self.path.suffix.lower()
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(
                f"--output {self.path} must end in {' or '.join(OUTPUT_FORMATS)} (the suffix picks the format)."
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8", newline="")
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
        self._file.close()

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def display_image(source: Any, image_size: tuple[int, int], height: int = 160) -> Image.Image:
    """The centre crop the model sees (same geometry as the eval transform), `height` pixels high, for plots."""
    width = max(1, round(height * image_size[1] / image_size[0]))
    return resize_and_center_crop(load_image(source), (height, width))


def plot_image_grid(
    images: Sequence[Image.Image | None],
    titles: Sequence[str],
    path: str | os.PathLike,
    suptitle: str | None = None,
    title_colors: Sequence[str] | None = None,
    columns: int | None = None,
) -> Path:
    """Images in a grid (about square) with a small title over each; None shows an empty panel. Saves a PNG."""
    n = max(1, len(images))
    columns = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.3 * columns, 2.75 * rows + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(images):
            continue
        if images[i] is not None:
            ax.imshow(np.asarray(images[i]), interpolation="nearest")
        ax.set_title(titles[i], fontsize=8, color=title_colors[i] if title_colors else "black")
    height = fig.get_figheight()
    if suptitle:
        fig.suptitle(suptitle, fontsize=11, y=1 - 0.1 / height)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height if suptitle else 1))  # keep the titles off the suptitle
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def short(name: str, width: int = 18) -> str:
    """A label cut to `width` characters for plot titles and tick labels."""
    return name if len(name) <= width else name[: width - 1] + "…"


def plot_predictions(
    predictions: Sequence[Prediction], image_size: tuple[int, int], path: str | os.PathLike
) -> Path:
    """A grid of predicted images titled "label (p)"."""
    images = [display_image(p.path, image_size) for p in predictions]
    titles = [f"{short(p.label or '?')} ({p.score:.2f})\n{short(Path(p.path).name, 24)}" for p in predictions]
    return plot_image_grid(images, titles, path, suptitle=f"Top-1 predictions ({len(predictions)} shown)")


# ---------------------------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Predict every image in `inputs` and write one row per file to `output` (.csv or .jsonl).

    `figure="auto"` writes a grid of the first `figure_images` predicted images next to the output
    (`preds.csv` -> `preds.png`); None writes none. Returns a summary: rows, errors, output and figure paths.
    """
    writer = PredictionWriter(output)  # checks the suffix before the model loads
    try:
        files = collect_image_files(inputs)
        if not files:
            raise FileNotFoundError(f"No image files in {[str(i) for i in inputs]}.")
        classifier = load_classifier(model, image_size, device, max_pixels)
        shown: list[Prediction] = []
        rows = errors = 0
        for prediction in predict_files(classifier, files, top_k_labels, batch_size, num_workers, progress):
            writer.write(prediction)
            rows += 1
            errors += prediction.error is not None
            if prediction.error is None and len(shown) < figure_images:
                shown.append(prediction)
    finally:
        writer.close()
    summary: dict[str, Any] = {"rows": rows, "errors": errors, "output": str(writer.path), "figure": None}
    if figure is not None and shown:
        figure_path = writer.path.with_suffix(".png") if figure == "auto" else Path(figure)
        summary["figure"] = str(plot_predictions(shown, classifier.preprocessing.image_size, figure_path))
    logger.info("Wrote %d rows (%d with errors) to %s.", rows, errors, writer.path)
    return summary


__all__ = [
    "PREDICTION_COLUMNS",
    "Classifier",
    "Prediction",
    "PredictionWriter",
    "Preprocessing",
    "collect_image_files",
    "load_classifier",
    "map_images",
    "plot_image_grid",
    "predict_files",
    "read_predictions",
    "read_preprocessing",
    "run_prediction",
]
