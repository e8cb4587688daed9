"""`vit-ft evaluate --shift`: accuracy under distribution shift beside the clean accuracy.

`--shift corruptions`: every corruption of `data.corruptions` (noise, blur, photometric, digital) at its three
severities, on the evaluation images, each image decoded once and each batch corrupted on the model's device at every
(corruption, severity), seeded (one generator per pair). `--shift FOLDER`: a user's own shifted set, class folders
named as the model's labels. Either gives rows of accuracy per shift and the relative error: the mean shifted error
minus the clean error (the numerator of Hendrycks & Dietterich's relative mCE, which divides by AlexNet's).

    shift = shift_evaluation(trained, data, clean_accuracy, "corruptions", seed=0)
    shift["rows"]  # [{"shift": "gaussian_noise", "family": "noise", "severity 1": ..., "accuracy", ...}, ...]
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.corruptions import CORRUPTIONS, SEVERITIES, TABLES, corrupt
from ..inference import iter_batches
from ..trained import Trained
from .data import EvalData, folder_eval_data
from .outputs import predict_dataset

logger = logging.getLogger("vit_ft")

CORRUPTIONS_SHIFT = "corruptions"


def check_shift(shift: str | None, trained: Trained) -> None:
    """ValueError before any pass: a shift needs a single-label model with square inputs (corruptions), and a
    folder that exists."""
    if shift is None:
        return
    if trained.task.problem_type == "multi_label_classification":
        raise ValueError("--shift measures top-1 accuracy; a multi-label model has none: evaluate it without --shift.")
    if shift == CORRUPTIONS_SHIFT:
        if trained.preprocessing.naflex:
            raise ValueError("--shift corruptions corrupts square images; a NaFlex model's patches are not: give "
                             "--image_size to evaluate it on squares, or --shift FOLDER.")  # fmt: skip
    elif not Path(shift).expanduser().is_dir():
        raise ValueError(f"--shift {shift!r} is neither 'corruptions' nor a folder of class folders (FOLDER/<class>/<image>).")


def shift_inputs(shift: str | None) -> list[str]:
    """The folder a `shift` reads (none for corruptions), for the output-folder check; ValueError, before the
    model loads, for a shift that is neither "corruptions" nor a folder."""
    if shift is None or shift == CORRUPTIONS_SHIFT:
        return []
    if not Path(shift).expanduser().is_dir():
        raise ValueError(f"--shift {shift!r} is neither 'corruptions' nor a folder of class folders (FOLDER/<class>/<image>).")
    return [shift]


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
        shifted = folder_eval_data(shift, trained.id2label, seed=seed, multi_label=False)
        outputs = predict_dataset(trained, shifted, batch_size, num_workers, progress)
        value = accuracy(outputs.logits, outputs.labels)
        table = [{"shift": Path(shift).name or str(shift), "family": "folder", "accuracy": value,
                  "relative error": (1 - value) - (1 - clean)}]  # fmt: skip
        how = f"The shifted set: {shifted.description}, {len(outputs.labels)} images."
    mean = float(np.mean([row["accuracy"] for row in table]))
    return {"kind": "corruptions" if shift == CORRUPTIONS_SHIFT else "folder", "clean": clean, "rows": table,
            "mean_accuracy": mean, "relative_error": (1 - mean) - (1 - clean), "how": how}  # fmt: skip


__all__ = ["CORRUPTIONS_SHIFT", "accuracy", "check_shift", "corruption_logits", "corruption_rows", "shift_evaluation",
           "shift_inputs", "shift_section"]
