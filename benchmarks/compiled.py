"""The "compile" section: both models eager and under `torch.compile`, inference and training step, interleaved
in one run. Two rows per measurement: ours compiled against ours eager (compiling must not lose speed), and
ours against transformers' ViT, each contender at its best of eager and compiled in every round."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable

import torch
from transformers import ViTForImageClassification

from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.utils.timing import interleave

from .common import DTYPES, TARGETS, BenchmarkSettings, Row, throughput_row
from .workloads import adamw, infer, random_batch, train_step

logger = logging.getLogger(__name__)

OURS, THEIRS = "vit_ft", "transformers ViT (sdpa)"


def bench_compile(
    settings: BenchmarkSettings, ours: ViTFTForImageClassification, theirs: ViTForImageClassification
) -> list[Row]:
    """Inference and training-step rows for each dtype; the first (untimed) call of a compiled model compiles
    it, so `warmup` is at least 1 here."""
    rows: list[Row] = []
    for dtype_name in settings.dtypes:
        rows.extend(_inference_rows(settings, ours, theirs, dtype_name))
        rows.extend(_training_rows(settings, ours, theirs, dtype_name))
    return rows


def eager_and_compiled(
    models: dict[str, torch.nn.Module], backend: str, train: bool = False
) -> dict[str, torch.nn.Module]:
    """Each model as it is and under `torch.compile` ("<name> compiled"). For training, each of the two is a deep
    copy in train mode: the timed steps move the weights."""

    def own(model: torch.nn.Module) -> torch.nn.Module:
        return copy.deepcopy(model).train() if train else model

    contenders = {}
    for name, model in models.items():
        contenders[name] = own(model)
        contenders[f"{name} compiled"] = torch.compile(own(model), backend=backend)
    return contenders


def best_of_eager_and_compiled(times: dict[str, list[float]], name: str) -> list[float]:
    """Per round, the faster of `name` eager and `name` compiled."""
    return [
        min(eager, compiled) for eager, compiled in zip(times[name], times[f"{name} compiled"], strict=True)
    ]


def _inference_rows(
    settings: BenchmarkSettings, ours: torch.nn.Module, theirs: torch.nn.Module, dtype_name: str
) -> list[Row]:
    dtype, batch = DTYPES[dtype_name], settings.infer_batch_size
    pixels, _ = random_batch(ours.config, batch, settings.seed)
    models = eager_and_compiled({"ours": ours, "theirs": theirs}, settings.compile_backend)
    logger.info("compile, inference, %s: %s", dtype_name, ", ".join(models))
    calls = {name: functools.partial(infer, model, pixels, dtype) for name, model in models.items()}
    times = _interleave(calls, settings)
    measurement = f"inference, {dtype_name}, {ours.config.image_hw[0]} px, batch {batch}"
    return compile_rows(times, measurement, batch, settings.compile_backend)


def _training_rows(
    settings: BenchmarkSettings, ours: torch.nn.Module, theirs: torch.nn.Module, dtype_name: str
) -> list[Row]:
    """Training steps on copies (the timed steps move the weights), each with torch's default AdamW."""
    dtype, batch = DTYPES[dtype_name], settings.train_batch_size
    pixels, labels = random_batch(ours.config, batch, settings.seed + 1)
    models = eager_and_compiled({"ours": ours, "theirs": theirs}, settings.compile_backend, train=True)
    calls = {
        name: functools.partial(train_step, model, adamw(model), pixels, labels, dtype)
        for name, model in models.items()
    }
    logger.info("compile, training step, %s: %s", dtype_name, ", ".join(calls))
    times = _interleave(calls, settings)
    size = f"{ours.config.image_hw[0]} px"
    measurement = f"training step (forward, loss, backward, AdamW), {dtype_name}, {size}, batch {batch}"
    return compile_rows(times, measurement, batch, settings.compile_backend)


def _interleave(calls: dict[str, Callable[[], None]], settings: BenchmarkSettings) -> dict[str, list[float]]:
    return interleave(calls, max(settings.warmup, 1), settings.rounds)


def compile_rows(
    times: dict[str, list[float]],
    measurement: str,
    batch: int,
    backend: str,
    section: str = "compile",
    target: str = TARGETS["compile"],
) -> list[Row]:
    """From the times of "ours", "theirs", "ours compiled" and "theirs compiled": compiled against eager (ours),
    and best against best (ours against transformers' ViT, each at its faster of eager and compiled per round)."""
    best = {name: best_of_eager_and_compiled(times, name) for name in ("ours", "theirs")}
    return [
        throughput_row(
            section,
            f"{measurement}: torch.compile ({backend}) against eager",
            batch,
            (f"{OURS} + torch.compile", times["ours compiled"]),
            (f"{OURS} eager", times["ours"]),
            ">= 1.00",
        ),
        throughput_row(
            section,
            f"{measurement}: each at its best of eager and torch.compile ({backend}), per round",
            batch,
            (f"{OURS} (best)", best["ours"]),
            (f"{THEIRS} (best)", best["theirs"]),
            target,
        ),
    ]
