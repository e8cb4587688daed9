"""The "model" and "ceiling" sections: our ViT against transformers' ViT (inference and training steps), and
inference against the matrix-product ceiling (the model's own GEMMs, timed bare)."""

from __future__ import annotations

import copy
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import ViTForImageClassification

from vit_ft.model.configuration_vit_ft import ViTFTConfig
from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification
from vit_ft.utils.hardware import onednn_bf16_supported
from vit_ft.utils.timing import interleave

from .common import DTYPES, TARGETS, BenchmarkSettings, Row, throughput_row
from .flops import forward_flops, forward_gemms
from .workloads import adamw, infer, interleave_training, random_batch

logger = logging.getLogger(__name__)


def _onednn_linear() -> Callable | None:
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


class MatmulCeiling:
    """The model's own matrix products, timed bare: called, it runs every GEMM of one forward pass in the
    model's order (per layer qkv, scores, weighted values, proj, fc1, fc2; patch embedding and head around
    them) on random operands of the same shapes and dtype, and returns the seconds taken.

    Each shape runs on the faster of two plain products, picked once at construction: torch.matmul, and for
    the 2-D products oneDNN's linear without bias (the kernel vit_ft uses in float32 on CPU, and in bf16 where the
    CPU has native bf16 products: elsewhere oneDNN has no bf16 kernel; torch.matmul calls MKL, slower on AMD CPUs). FLOPs / those seconds is the ceiling; the sequence is timed as one call,
    like the model, so that both see the same load from other processes.
    """

    def __init__(self, config: ViTFTConfig, batch_size: int, dtype: torch.dtype):
        gemms = forward_gemms(config, batch_size)
        self.flops = sum(gemm.flops for gemm in gemms)
        self.backends: dict[str, str] = {}
        generator = torch.Generator().manual_seed(0)
        onednn = _onednn_linear()
        calls: dict[str, Callable[[], torch.Tensor]] = {}
        for gemm in gemms:
            if gemm.batch > 1:
                a = torch.randn(gemm.batch, gemm.m, gemm.k, generator=generator).to(dtype)
                b = torch.randn(gemm.batch, gemm.k, gemm.n, generator=generator).to(dtype)
                candidates = {"torch.bmm": lambda a=a, b=b: torch.bmm(a, b)}
            else:
                a = torch.randn(gemm.m, gemm.k, generator=generator).to(dtype)
                b = torch.randn(gemm.k, gemm.n, generator=generator).to(dtype)
                candidates = {"torch.matmul": lambda a=a, b=b: torch.matmul(a, b)}
                if onednn is not None and (dtype == torch.float32 or onednn_bf16_supported()):
                    weight = b.t().contiguous()  # (n, k): nn.Linear's layout
                    candidates["oneDNN linear"] = lambda a=a, w=weight: onednn(a, w, None, "none", [], "")
            best = min(candidates, key=lambda name: _fastest_of(candidates[name], 3))
            self.backends[gemm.name] = best
            calls[gemm.name] = candidates[best]
        per_layer = ["qkv", "attention scores", "attention x values", "proj", "fc1", "fc2"]
        self.sequence = [calls["patch embedding"]]
        self.sequence += [calls[name] for _ in range(config.num_hidden_layers) for name in per_layer]
        self.sequence += [calls["head"]] if "head" in calls else []

    def __call__(self) -> float:
        start = time.perf_counter()
        for call in self.sequence:
            call()
        return time.perf_counter() - start


def _fastest_of(call: Callable[[], Any], tries: int) -> float:
    call()  # warm-up
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def bench_model(
    settings: BenchmarkSettings,
    ours: ViTFTForImageClassification,
    theirs: ViTForImageClassification,
    sections: Sequence[str],
) -> list[Row]:
    """Inference and training-step images/s, ours against transformers', and inference against the ceiling."""
    rows: list[Row] = []
    for dtype_name in settings.dtypes:
        rows.extend(_bench_inference(settings, ours, theirs, sections, dtype_name))
        if "model" in sections:
            rows.extend(_bench_training(settings, ours, theirs, dtype_name))
    return rows


def _bench_inference(
    settings: BenchmarkSettings,
    ours: ViTFTForImageClassification,
    theirs: ViTForImageClassification,
    sections: Sequence[str],
    dtype_name: str,
) -> list[Row]:
    """One interleaved inference run: ours, transformers' ViT (for "model"), the ceiling (for "ceiling")."""
    config = ours.config
    dtype = DTYPES[dtype_name]
    batch = settings.infer_batch_size
    pixels, _ = random_batch(config, batch, settings.seed)
    contenders: dict[str, Callable[[], float | None]] = {"ours": lambda: infer(ours, pixels, dtype)}
    if "model" in sections:
        contenders["theirs"] = lambda: infer(theirs, pixels, dtype)
    if "ceiling" in sections:
        contenders["matmul"] = MatmulCeiling(config, batch, dtype or torch.float32)
    logger.info("inference, %s: %s", dtype_name, ", ".join(contenders))
    times = interleave(contenders, settings.warmup, settings.rounds)
    measurement = f"inference, {dtype_name}, {config.image_hw[0]} px, batch {batch}"
    rows: list[Row] = []
    if "model" in sections:
        rows.append(
            throughput_row(
                "model",
                measurement,
                batch,
                ("vit_ft", times["ours"]),
                ("transformers ViT (sdpa)", times["theirs"]),
                TARGETS["inference"],
            )
        )
    if "ceiling" in sections:
        flops = forward_flops(config, batch)["total"]
        rows.extend(_ceiling_rows(measurement, dtype_name, flops, times, contenders["matmul"]))
    return rows


def _ceiling_rows(
    measurement: str, dtype_name: str, flops: int, times: dict[str, list[float]], ceiling: MatmulCeiling
) -> list[Row]:
    """Each model's FLOP/s against the FLOP/s of its own matrix products, timed in the same rounds."""
    rows: list[Row] = []
    for name, label in (("ours", "vit_ft"), ("theirs", "transformers ViT (sdpa)")):
        if name not in times:
            continue
        per_round = [m / t for t, m in zip(times[name], times["matmul"], strict=True)]
        note = ""
        if name == "ours":
            note = f"{dtype_name} ceiling's products on: " + ", ".join(
                f"{gemm} {backend}" for gemm, backend in ceiling.backends.items()
            )
        rows.append(
            Row(
                section="ceiling",
                measurement=f"{measurement}: model FLOP/s over the FLOP/s of its own matrix products",
                unit="GFLOP/s",
                candidate=label,
                candidate_value=flops / statistics.median(times[name]) / 1e9,
                reference="its matrix products",
                reference_value=ceiling.flops / statistics.median(times["matmul"]) / 1e9,
                ratio=statistics.median(times["matmul"]) / statistics.median(times[name]),
                ratio_low=min(per_round),
                ratio_high=max(per_round),
                target=TARGETS["ceiling"] if name == "ours" else None,
                note=note,
            )
        )
    return rows


def _bench_training(
    settings: BenchmarkSettings,
    ours: ViTFTForImageClassification,
    theirs: ViTForImageClassification,
    dtype_name: str,
) -> list[Row]:
    """Training steps on copies (the timed steps move the weights), with the same optimizer for both, and ours
    with its best option (fused AdamW) as a separate, labelled row."""
    dtype = DTYPES[dtype_name]
    config = ours.config
    batch = settings.train_batch_size
    pixels, labels = random_batch(config, batch, settings.seed + 1)
    models = {"ours": copy.deepcopy(ours), "theirs": copy.deepcopy(theirs), "ours_fused": copy.deepcopy(ours)}
    optimizers = {name: adamw(model, fused=name == "ours_fused") for name, model in models.items()}
    for model in models.values():
        model.train()
    logger.info("training step, %s: %s", dtype_name, ", ".join(models))
    times = interleave_training(settings, models, optimizers, pixels, labels, dtype)
    size = f"{config.image_hw[0]} px"
    return [
        throughput_row(
            "model",
            f"training step (forward, loss, backward, AdamW), {dtype_name}, {size}, batch {batch}; "
            "both with torch's default AdamW",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["training"],
        ),
        throughput_row(
            "model",
            f"training step, {dtype_name}, {size}, batch {batch}: our best option (fused AdamW) against "
            "transformers with torch's default AdamW",
            batch,
            ("vit_ft + fused AdamW", times["ours_fused"]),
            ("transformers ViT (sdpa)", times["theirs"]),
        ),
    ]
