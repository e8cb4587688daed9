"""`vit-ft evaluate --shift`: accuracy under distribution shift beside the clean accuracy.

`--shift corruptions`: every corruption of `data.corruptions` (noise, blur, photometric, digital) at its three
severities, on the evaluation images, each image decoded once and each batch corrupted on the model's device at every
(corruption, severity), seeded (one generator per pair). `--shift FOLDER`: a user's own shifted set, class folders
named as the model's labels; `--shift HUB_ID[@REVISION]`: a Hub dataset (its test split, else validation, else
train; its image column and ClassLabel column, class names matched to the model's), named through `utils.hub_ids`.
Either gives rows of accuracy per shift and the relative error: the mean shifted error minus the clean error (the
numerator of Hendrycks & Dietterich's relative mCE, which divides by AlexNet's).

    shift = shift_evaluation(trained, data, clean_accuracy, "corruptions", seed=0)
    shift["rows"]  # [{"shift": "gaussian_noise", "family": "noise", "severity 1": ..., "accuracy", ...}, ...]
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.corruptions import CORRUPTIONS, SEVERITIES, TABLES, corrupt
from ...utils.hub_ids import check_reference, looks_like_path, split_revision
from ..inference import iter_batches
from ..trained import Trained
from .data import EvalData, _as_eval_data, folder_eval_data
from .outputs import predict_dataset

logger = logging.getLogger("vit_ft")

CORRUPTIONS_SHIFT = "corruptions"
SHIFT_VALUES = "'corruptions', a folder of class folders (FOLDER/<class>/<image>) or a Hub dataset id (ID or ID@REVISION)"
SHIFT_SPLITS = ("test", "validation", "train")  # a Hub dataset's split the shift reads: the first it has


def check_shift(shift: str | None, trained: Trained) -> None:
    """ValueError before any pass: a shift needs a single-label model, and corruptions square inputs (the shift's
    source itself is checked before the model loads: `shift_inputs`)."""
    if shift is None:
        return
    if trained.task.problem_type == "multi_label_classification":
        raise ValueError("--shift measures top-1 accuracy; a multi-label model has none: evaluate it without --shift.")
    if shift == CORRUPTIONS_SHIFT:
        trained.preprocessing.refuse_patches(
            "--shift corruptions corrupts square images; a {kind} model's patches are not: give --image_size to "
            "evaluate it on squares, or --shift FOLDER."
        )


def shift_inputs(shift: str | None) -> list[str]:
    """The local folder a `shift` reads (none for corruptions or a Hub dataset), for the output-folder check.
    Before the model loads: a missing folder (the closest one named), a file, a near-miss of 'corruptions', or a Hub
    dataset id the Hub (or offline, its cache) does not have is one line (`utils.hub_ids.check_reference`)."""
    if shift is None or shift == CORRUPTIONS_SHIFT:
        return []
    path = Path(shift).expanduser()
    if path.is_dir():
        return [shift]
    if path.exists():
        raise ValueError(f"--shift {shift!r} is a file; pass {SHIFT_VALUES}.")
    repo_id, _ = split_revision(shift)
    if not looks_like_path(repo_id) and difflib.get_close_matches(repo_id, [CORRUPTIONS_SHIFT], cutoff=0.8):
        raise ValueError(f"--shift {shift!r}: did you mean --shift {CORRUPTIONS_SHIFT}? It takes {SHIFT_VALUES}.")
    check_reference(repo_id, f"--shift {shift}", SHIFT_VALUES, repo_type="dataset")
    return []


def shifted_eval_data(shift: str, id2label: dict[int, str], seed: int = 0) -> EvalData:
    """The images and labels of a shifted set `shift`: a folder of class folders or a Hub dataset."""
    if Path(shift).expanduser().is_dir():
        return folder_eval_data(shift, id2label, seed=seed, multi_label=False)
    return hub_eval_data(*split_revision(shift), id2label, seed)


def _hub_columns(features: Any, where: str) -> tuple[str, str]:
    """The image column and the ClassLabel column of a Hub dataset's split ("image" / "label" first)."""
    import datasets

    def first(kind: type, preferred: str) -> str | None:
        names = [name for name, feature in features.items() if isinstance(feature, kind)]
        return preferred if preferred in names else next(iter(names), None)

    image, label = first(datasets.Image, "image"), first(datasets.ClassLabel, "label")
    if image is None or label is None:
        raise ValueError(f"{where} has no {'image' if image is None else 'class label (ClassLabel)'} column (its columns: "
                         f"{', '.join(features)}); --shift reads a dataset of images with class labels.")  # fmt: skip
    return image, label


def hub_eval_data(repo_id: str, revision: str | None, id2label: dict[int, str], seed: int = 0) -> EvalData:
    """A Hub dataset at `revision` as a shifted set: its first split of `SHIFT_SPLITS` (else its only one), the image
    and ClassLabel columns, class names matched to the model's labels by name."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError

    where = f"--shift {repo_id}" + (f"@{revision}" if revision else "")
    try:
        splits = datasets.load_dataset(repo_id, revision=revision)
    except (RevisionNotFoundError, DatasetNotFoundError):
        if revision is None:  # the id itself was looked up before the model loaded: datasets' own line says why
            raise
        raise ValueError(f"{where}: the Hub dataset {repo_id} has no revision {revision!r}; pass one of its branches, "
                         "tags or commit ids after '@', or none for main.") from None  # fmt: skip
    split = next((name for name in SHIFT_SPLITS if name in splits), None) or (list(splits)[0] if len(splits) == 1 else None)
    if split is None:
        raise ValueError(f"{where} has splits {sorted(splits)} and none of {', '.join(SHIFT_SPLITS)}; save the split to "
                         "evaluate as a folder of class folders and pass that folder.")  # fmt: skip
    image, label = _hub_columns(splits[split].features, where)
    dataset = splits[split].select_columns([image, label]).rename_columns({image: "image", label: "label"})
    description = f"split {split!r} of the Hub dataset {repo_id}" + (f" at revision {revision}" if revision else "")
    return _as_eval_data(dataset, dataset.features["label"].names, id2label, description, None, seed, "", False)


def shift_section(
    shift: str | None, trained: Trained, data: EvalData, outputs: Any, seed: int = 0, batch_size: int = 64,
    num_workers: int = 0, progress: bool | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """An evaluation's shift section (`shift_evaluation`) beside its clean `outputs`, None without a shift."""
    if shift is None:
        return None
    check_shift(shift, trained)
    return shift_evaluation(trained, data, accuracy(outputs.logits, outputs.labels), shift, seed, batch_size,
                            num_workers, progress)  # fmt: skip


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of `(n, classes)` logits against `(n,)` label ids."""
    return float((np.asarray(logits).argmax(-1) == np.asarray(labels)).mean()) if len(labels) else float("nan")


def corruption_logits(
    trained: Trained, data: EvalData, seed: int = 0, batch_size: int = 64, num_workers: int = 0,
    progress: bool | None = None,
) -> tuple[dict[tuple[str, int], np.ndarray], np.ndarray]:  # fmt: skip
    """Logits of every (corruption, severity) on `data`'s images that decode, and those images' rows."""
    spec, device = trained.preprocessing, trained.device
    pairs = [(name, severity) for name in CORRUPTIONS for severity in SEVERITIES]
    generators = {pair: torch.Generator(device=device).manual_seed(seed * 1000 + i) for i, pair in enumerate(pairs)}

    def forward(pixels: torch.Tensor) -> dict[tuple[str, int], np.ndarray]:
        pixels = pixels.to(device)
        return {pair: trained.logits(corrupt(pixels, *pair, spec.mean, spec.std, generators[pair])).numpy()
                for pair in pairs}  # fmt: skip

    logits: dict[tuple[str, int], list[np.ndarray]] = {pair: [] for pair in pairs}
    rows: list[int] = []
    desc = f"Corruptions ({len(pairs)} per image)"
    for batch in iter_batches(trained, data.dataset["image"], batch_size, num_workers, desc, progress, forward):
        if batch.outputs is not None:
            for pair in pairs:
                logits[pair].append(batch.outputs[pair])
            rows.extend(batch.start + i for i in batch.decoded)
    if not rows:
        raise ValueError(f"none of the {len(data)} images of {data.description} decodes; nothing to corrupt.")
    return {pair: np.concatenate(parts) for pair, parts in logits.items()}, np.asarray(rows)


def corruption_rows(logits: dict[tuple[str, int], np.ndarray], labels: np.ndarray, clean: float) -> list[dict[str, Any]]:
    """One row per corruption: its family, accuracy at each severity and their mean, the relative error."""
    rows = []
    for name in CORRUPTIONS:
        per = [accuracy(logits[(name, s)], labels) for s in SEVERITIES]
        mean = float(np.mean(per))
        rows.append({"shift": name, "family": TABLES[name][0], **{f"severity {s}": a for s, a in zip(SEVERITIES, per, strict=True)},
                     "accuracy": mean, "relative error": (1 - mean) - (1 - clean)})  # fmt: skip
    return rows


def shift_evaluation(
    trained: Trained, data: EvalData, clean: float, shift: str, seed: int = 0, batch_size: int = 64,
    num_workers: int = 0, progress: bool | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The shift section of metrics.json and report.md: {"kind", "clean", "rows", "mean_accuracy",
    "relative_error", "how"}; `clean` is the accuracy on `data` itself."""
    if shift == CORRUPTIONS_SHIFT:
        logger.info("Shift: %d corruptions x %d severities on %d images, seed %d.", len(CORRUPTIONS),
                    len(SEVERITIES), len(data), seed)  # fmt: skip
        logits, rows = corruption_logits(trained, data, seed, batch_size, num_workers, progress)
        table = corruption_rows(logits, data.labels[rows], clean)
        how = (f"{len(CORRUPTIONS)} ImageNet-C corruptions (noise, blur, photometric, digital) at severities 1, 3 "
               f"and 5 of five, seed {seed}, {len(rows)} images.")  # fmt: skip
    else:
        shifted = shifted_eval_data(shift, trained.id2label, seed)
        outputs = predict_dataset(trained, shifted, batch_size, num_workers, progress)
        value = accuracy(outputs.logits, outputs.labels)
        kind = "folder" if Path(shift).expanduser().is_dir() else "hub dataset"
        table = [{"shift": Path(shift).name if kind == "folder" else shift, "family": kind, "accuracy": value,
                  "relative error": (1 - value) - (1 - clean)}]  # fmt: skip
        how = f"The shifted set: {shifted.description}, {len(outputs.labels)} images."
    mean = float(np.mean([row["accuracy"] for row in table]))
    return {"kind": table[0]["family"] if shift != CORRUPTIONS_SHIFT else "corruptions", "clean": clean, "rows": table,
            "mean_accuracy": mean, "relative_error": (1 - mean) - (1 - clean), "how": how}  # fmt: skip


__all__ = ["CORRUPTIONS_SHIFT", "SHIFT_VALUES", "accuracy", "check_shift", "corruption_logits", "corruption_rows",
           "hub_eval_data", "shift_evaluation", "shift_inputs", "shift_section", "shifted_eval_data"]
