"""The model's outputs on an evaluation's images (`EvalData`): `predict_dataset` runs the loaded model over them
a batch at a time (skipping images that do not decode, as the fine-tune dropped them) into `EvalOutputs`, whose
probabilities are its task's (`vit_ft.tasks`: the calibrated softmax, or the sigmoid of each logit);
`evaluation_facts` is what metrics.json says about the run besides its numbers.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...data.images import describe_source
from ...tasks import Task, task_for
from ..inference import describe_error, iter_batches
from ..ood import OODScorer
from ..trained import Trained
from .data import EvalData

logger = logging.getLogger("vit_ft")


@dataclass
class EvalOutputs:
    """Model outputs on the images that decoded; `rows` indexes them in the EvalData."""

    logits: np.ndarray  # (num_evaluated, num_labels) float32
    labels: np.ndarray  # (num_evaluated,) true model label ids; multi-label: (num_evaluated, num_labels) 0/1
    rows: np.ndarray  # (num_evaluated,) row index in EvalData.dataset
    sources: list[str]  # (num_evaluated,) file path (or a description) of each image
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"row", "source", "reason"}
    task: Task = field(default_factory=task_for)  # the model's (`trained.Trained.task`): its probabilities
    # (num_evaluated,) the feature bank's k-NN distances and whether each is above its threshold; None: no bank
    ood_scores: np.ndarray | None = None
    unlike_training: np.ndarray | None = None

    @property
    def probabilities(self) -> np.ndarray:
        """The task's probabilities `(num_evaluated, num_labels)`: the softmax of the logits / temperature, or
        the sigmoid of each logit."""
        return self.task.probabilities(self.logits)

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(axis=-1)


def predict_dataset(
    trained: Trained,
    data: EvalData,
    batch_size: int = 64,
    num_workers: int = 0,
    progress: bool | None = None,
    scorer: OODScorer | None = None,
) -> EvalOutputs:
    """Logits for every image of `data`, `batch_size` at a time; images that do not decode are skipped
    (listed in `skipped`), as the fine-tune's `drop_bad_images` dropped them. With a `scorer` whose model
    keeps a feature bank, each image's out-of-distribution score and flag too (same forward pass)."""
    logits, rows, sources, skipped, scores, flags = [], [], [], [], [], []
    values = data.dataset["image"]
    forward = None if scorer is None or scorer.bank is None else scorer.forward
    for batch in iter_batches(trained, values, batch_size, num_workers, "Evaluating", progress, forward):
        for offset, error in batch.errors.items():
            value, row = batch.sources[offset], batch.start + offset
            source = describe_source(value) if value else f"row {row}"
            skipped.append({"row": row, "source": source, "reason": describe_error(error)})
        if batch.decoded:
            logits.append(batch.outputs.numpy())
            if forward is not None:
                scores.append(scorer.last[0])
                flags.append(scorer.last[1])
            rows.extend(batch.start + i for i in batch.decoded)
            sources.extend(describe_source(batch.sources[i]) for i in batch.decoded)
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
    outputs = (np.concatenate(logits), data.labels[row_index], row_index, sources, skipped)
    ood = (np.concatenate(scores), np.concatenate(flags)) if forward is not None else (None, None)
    return EvalOutputs(*outputs, trained.task, *ood)


def evaluation_facts(
    trained: Trained, data: EvalData, outputs: EvalOutputs, elapsed: float
) -> dict[str, Any]:
    """What metrics.json says besides the numbers: what was evaluated at which resolution, how fast, what was
    skipped, and the notes."""
    info = trained.run_record or {}
    return {
        "num_images": int(len(outputs.labels)),
        "num_skipped": len(outputs.skipped),
        "num_classes": trained.num_labels,
        "model": trained.source,
        "data": data.description,
        "image_size": list(trained.preprocessing.image_size),
        "trained_image_size": info.get("image_size"),
        "images_per_second": round(len(outputs.labels) / max(elapsed, 1e-9), 2),
        "device": str(trained.device),
        "bf16": trained.bf16,
        "skipped": outputs.skipped,
        "notes": data.notes,
    }


def short_description(description: str) -> str:
    """An `EvalData.description` short enough for a figure title: "test split", "image folder my_digits"."""
    split = re.match(r"split '([^']+)'", description)
    if split:
        return f"{split.group(1)} split"
    if description.startswith("image folder "):
        return f"image folder {Path(description.removeprefix('image folder ').split(',')[0]).name}"
    return description


__all__ = ["EvalOutputs", "evaluation_facts", "predict_dataset", "short_description"]
