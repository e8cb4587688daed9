"""The "pipeline" section: evaluate's batched loop (decode a JPEG folder in worker threads, overlapped with the
model) against the bare model forward on ready-made pixels, same model, batch and dtype: how much of the model's
speed a user of scripts/evaluate_model.py gets."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch

from vit_ft.tools.evaluate.data import resolve_eval_data
from vit_ft.tools.evaluate.run import predict_dataset
from vit_ft.tools.trained import load_trained
from vit_ft.utils.timing import interleave

from .common import TARGETS, BenchmarkSettings, Row, throughput_row
from .data import synthetic_photo

logger = logging.getLogger(__name__)


def bench_pipeline(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """images/s of evaluate's loop over `pipeline_images` synthetic photos (two classes of JPEG files, the
    first of `photo_sizes`) against the model's forward alone on the same number of images; fp32, as the tools
    run. `folder` holds the contenders' checkpoint (build_contenders)."""
    data_dir = Path(folder) / "photos"
    width, height = settings.photo_sizes[0]
    for index in range(settings.pipeline_images):
        path = data_dir / f"class{index % 2}" / f"{index}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(synthetic_photo(width, height, seed=index))
    classifier = load_trained(folder, device="cpu")
    data = resolve_eval_data(classifier.origin, {0: "class0", 1: "class1"}, data_dir=data_dir)
    batch, workers = settings.infer_batch_size, settings.pipeline_workers
    height_px, width_px = classifier.preprocessing.image_size
    pixels = torch.randn(batch, 3, height_px, width_px)
    full, rest = divmod(len(data), batch)

    def bare() -> None:  # the same number of images through the forward alone
        for _ in range(full):
            classifier.logits(pixels)
        if rest:
            classifier.logits(pixels[:rest])

    run = functools.partial(predict_dataset, classifier, data, batch, workers, False)
    logger.info("evaluate's loop on %d %dx%d JPEGs, %d workers", len(data), width, height, workers)
    times = interleave({"pipeline": run, "bare": bare}, settings.warmup, settings.rounds)
    return [
        throughput_row(
            "pipeline",
            f"evaluate's loop on a folder of {width}x{height} JPEGs ({len(data)} images, {workers} decode "
            f"workers) against the bare forward, fp32, {height_px} px, batch {batch}",
            len(data),
            ("vit_ft evaluate loop", times["pipeline"]),
            ("model forward alone", times["bare"]),
            TARGETS["pipeline"],
        )
    ]
