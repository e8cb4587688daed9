"""The "lora" section: LoRA against full fine-tuning of the same model: training-step speed, trainable
parameters, and peak training memory measured in fresh processes."""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import torch

from vit_ft.arguments.fields import ModelArguments
from vit_ft.kernels import kernelize
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.training.lora import apply_lora, count_parameters

from .common import DTYPES, TARGETS, BenchmarkSettings, Row, throughput_row
from .workloads import adamw, interleave_training, method_model, random_batch, train_step

logger = logging.getLogger(__name__)

LORA = "LoRA r=16 on qkv + head"
FULL = "full fine-tuning"


def _lora_arguments() -> ModelArguments:
    """The recipes' LoRA setup: rank 16 on the fused qkv projection, the head trained in full."""
    return ModelArguments(model_name_or_path="benchmark", use_lora=True)


def _reset_peak_rss() -> bool:
    """Start the kernel's peak-RSS count (VmHWM) afresh from the current RSS; False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise OSError(f"no {field} in /proc/self/status")


def training_memory_probe(settings: BenchmarkSettings, variant: str, dtype_name: str) -> dict[str, float]:
    """Peak resident memory of two training steps, above this process's resident memory before the model was
    built: weights, gradients, optimizer state, activations and allocator slack.

    Linux's own count (VmHWM, reset first), run in a fresh process per variant (`_peak_training_memory`) so
    that no other model's freed memory is reused. (`ru_maxrss` would not do: a spawned process inherits its
    parent's peak, and tracemalloc does not see torch's allocations.)
    """
    if settings.threads:
        torch.set_num_threads(settings.threads)
    if not _reset_peak_rss():
        raise OSError("Peak-memory measurement needs Linux /proc/self/clear_refs; pass --no-memory.")
    # the peak counter just reset, read as the baseline: VmRSS and VmHWM are separate approximate counts (a few
    # pages apart), so a model too small to show took a few KiB below zero once
    before = _rss_mib("VmHWM")
    config = settings.model_config()
    model = method_model(config, variant, settings.seed)  # variant: a --method value ("full", "lora", "ssf", ...)
    model.train()
    optimizer = adamw(model, fused=True)
    pixels, labels = random_batch(config, settings.train_batch_size, settings.seed + 2)
    for _ in range(2):
        train_step(model, optimizer, pixels, labels, DTYPES[dtype_name])
    return {"peak_mib": max(0.0, _rss_mib("VmHWM") - before)}


def _peak_training_memory(settings: BenchmarkSettings, variant: str, dtype_name: str) -> float:
    # a spawned child imports this module afresh: it finds `benchmarks` on the sys.path it is handed
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(training_memory_probe, settings, variant, dtype_name).result()["peak_mib"]


def bench_lora(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """LoRA (rank 16 on qkv, head in full) against full fine-tuning of the same model, both with fused AdamW:
    training-step images/s interleaved, trainable parameters, and peak memory from fresh processes."""
    rows: list[Row] = []
    full = kernelize(ViTFTForImageClassification.from_pretrained(folder))
    lora = apply_lora(kernelize(ViTFTForImageClassification.from_pretrained(folder)), _lora_arguments())
    trainable_lora, total = count_parameters(lora)
    trainable_full, _ = count_parameters(full)
    config = full.config
    batch = settings.train_batch_size
    pixels, labels = random_batch(config, batch, settings.seed + 3)
    models = {"lora": lora.train(), "full": full.train()}
    optimizers = {name: adamw(model, fused=True) for name, model in models.items()}
    for dtype_name in settings.dtypes:
        dtype = DTYPES[dtype_name]
        logger.info("LoRA against full fine-tuning, %s", dtype_name)
        times = interleave_training(settings, models, optimizers, pixels, labels, dtype)
        rows.append(
            throughput_row(
                "lora",
                f"training step, {dtype_name}, batch {batch}, fused AdamW for both",
                batch,
                (LORA, times["lora"]),
                (FULL, times["full"]),
                TARGETS["lora_speed"],
            )
        )
    rows.append(
        Row(
            section="lora",
            measurement=f"trainable parameters ({config.num_labels}-class head; {total:,} in all)",
            unit="parameters",
            candidate=LORA,
            candidate_value=trainable_lora,
            reference=FULL,
            reference_value=trainable_full,
            ratio=trainable_lora / trainable_full,
            target=TARGETS["lora_parameters"],
        )
    )
    if settings.measure_memory:
        rows.append(_memory_row(settings))
    return rows


def _memory_row(settings: BenchmarkSettings) -> Row:
    """Peak training memory of LoRA against full fine-tuning, in the first dtype, one fresh process each."""
    dtype_name = settings.dtypes[0]
    logger.info("peak training memory, %s: one fresh process each for LoRA and full", dtype_name)
    peaks = {variant: _peak_training_memory(settings, variant, dtype_name) for variant in ("lora", "full")}
    return Row(
        section="lora",
        measurement=f"peak memory of training, {dtype_name}, batch {settings.train_batch_size} (resident set "
        "of a fresh process above its size before the model was built)",
        unit="MiB",
        candidate=LORA,
        candidate_value=peaks["lora"],
        reference=FULL,
        reference_value=peaks["full"],
        ratio=peaks["lora"] / peaks["full"],
        target=TARGETS["lora_memory"],
    )
