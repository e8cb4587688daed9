"""The "gpu" section: ours against transformers' ViT at the ViT paper's fine-tuning resolution, bf16, on a GPU
(or on the device it is given: the smoke test runs it on the CPU), each eager and under `torch.compile`, and the
training step's model FLOP utilisation; timm's ViT of the same size as a third contender where timm is installed
(a GPU image usually has it)."""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time
from dataclasses import replace
from types import SimpleNamespace

import torch

from vit_ft.utils.timing import interleave

from .common import TARGETS, BenchmarkSettings, Row, throughput_row
from .compiled import best_of_eager_and_compiled, compile_rows, eager_and_compiled
from .flops import forward_flops
from .workloads import adamw, build_contenders, infer, interleave_training, random_batch

logger = logging.getLogger(__name__)

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (no sparsity), FLOP/s; matched in order against
# torch.cuda.get_device_name. Any other device is measured (`measured_peak`).
BF16_PEAKS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def gpu_available(settings: BenchmarkSettings) -> bool:
    device = torch.device(settings.gpu_device)
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())


def bench_gpu(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """Ours against transformers' ViT on `settings.gpu_device` at `gpu_image_size` px, bf16 autocast, batch
    `gpu_batch_size`, eager and compiled: inference and training-step images/s, each call timed to the device's
    end, and the training step's model FLOP utilisation against the device's bf16 peak."""
    gpu_settings = replace(settings, image_size=settings.gpu_image_size, warmup=max(settings.warmup, 1))
    device = torch.device(settings.gpu_device)
    ours, theirs = (model.to(device) for model in build_contenders(gpu_settings, folder))
    contenders = {"ours": ours, "theirs": theirs}
    timm_model = timm_contender(ours.config)
    if timm_model is not None:
        contenders["timm"] = timm_model.to(device)
    config, batch, dtype = ours.config, settings.gpu_batch_size, torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    size = f"{config.image_hw[0]} px"
    pixels, labels = (t.to(device) for t in random_batch(config, batch, settings.seed))
    backend = settings.compile_backend

    models = eager_and_compiled(contenders, backend)
    logger.info("%s, %s, batch %d: inference, eager and compiled", name, size, batch)
    calls = {key: functools.partial(infer, model, pixels, dtype) for key, model in models.items()}
    times = interleave(calls, gpu_settings.warmup, settings.rounds)
    measurement = f"inference, bf16, {size}, batch {batch}, on {name}"
    rows = [_eager_row(measurement, batch, times)]
    rows += compile_rows(times, measurement, batch, backend, section="gpu", target=TARGETS["gpu"])
    rows += _timm_rows(measurement, batch, times, backend)

    models = eager_and_compiled(contenders, backend, train=True)
    optimizers = {key: adamw(model, fused=device.type == "cuda") for key, model in models.items()}
    logger.info("%s, %s, batch %d: training step, eager and compiled", name, size, batch)
    times = interleave_training(gpu_settings, models, optimizers, pixels, labels, dtype)
    measurement = f"training step (forward, loss, backward, AdamW), bf16, {size}, batch {batch}, on {name}"
    rows += [_eager_row(measurement, batch, times)]
    rows += compile_rows(times, measurement, batch, backend, section="gpu", target=TARGETS["gpu"])
    rows += _timm_rows(measurement, batch, times, backend)
    rows.append(_utilisation_row(times, 3 * forward_flops(config, batch)["total"], measurement, device, name))
    return rows


def _eager_row(measurement: str, batch: int, times: dict[str, list[float]]) -> Row:
    return throughput_row(
        "gpu",
        f"{measurement}: eager",
        batch,
        ("vit_ft", times["ours"]),
        ("transformers ViT (sdpa)", times["theirs"]),
        TARGETS["gpu"],
    )


TIMM = "timm VisionTransformer"


class TimmClassifier(torch.nn.Module):
    """A timm model called as the transformers ones are: `(pixel_values=, labels=)` -> `.logits`, `.loss`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> SimpleNamespace:
        logits = self.model(pixel_values)  # (batch, num_labels)
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits.float(), labels)
        return SimpleNamespace(logits=logits, loss=loss)


def timm_contender(config) -> TimmClassifier | None:
    """timm's VisionTransformer of our config's size (random weights: speed alone is compared; its fused qkv and
    SDPA attention as timm builds them), or None where timm is not installed."""
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:  # timm, or torchvision which timm imports
        return None
    model = VisionTransformer(
        img_size=config.image_hw,
        patch_size=config.patch_size,
        num_classes=config.num_labels,
        embed_dim=config.hidden_size,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size,
        qkv_bias=config.qkv_bias,
        global_pool="token",
    )
    return TimmClassifier(model).eval()


def _timm_rows(measurement: str, batch: int, times: dict[str, list[float]], backend: str) -> list[Row]:
    """Ours against timm's ViT, eager and each at its best of eager and compiled; none without timm."""
    if "timm" not in times:
        return []
    best = {name: best_of_eager_and_compiled(times, name) for name in ("ours", "timm")}
    return [
        throughput_row("gpu", f"{measurement}: eager, against timm", batch, ("vit_ft", times["ours"]),
                       (TIMM, times["timm"]), TARGETS["gpu"]),
        throughput_row("gpu", f"{measurement}: each at its best of eager and torch.compile ({backend}), against "
                       "timm", batch, ("vit_ft (best)", best["ours"]), (f"{TIMM} (best)", best["timm"]),
                       TARGETS["gpu"]),
    ]  # fmt: skip


def _utilisation_row(
    times: dict[str, list[float]], step_flops: int, measurement: str, device: torch.device, name: str
) -> Row:
    """Model FLOP utilisation of our training step at its best of eager and compiled: 3x the forward's
    matrix-product FLOPs (forward, and backward's two products per forward product) per step time, over the
    device's dense bf16 peak."""
    best = best_of_eager_and_compiled(times, "ours")
    peak, source = device_peak(device, name)
    per_round = [step_flops / t / peak for t in best]
    achieved = step_flops / statistics.median(best)
    return Row(
        section="gpu",
        measurement=f"{measurement}: model FLOP utilisation (3x the forward's matrix-product FLOPs per step)",
        unit="TFLOP/s",
        candidate="vit_ft (best of eager and compiled)",
        candidate_value=achieved / 1e12,
        reference=source,
        reference_value=peak / 1e12,
        ratio=achieved / peak,
        ratio_low=min(per_round),
        ratio_high=max(per_round),
        target=TARGETS["gpu_utilisation"],
    )


def device_peak(device: torch.device, name: str) -> tuple[float, str]:
    """The device's dense bf16 peak FLOP/s and where it comes from: the datasheet for the GPUs in BF16_PEAKS,
    else the best of a few large bf16 matrix products measured here."""
    for key, peak in BF16_PEAKS:
        if device.type == "cuda" and key in name:
            return peak, f"{name} bf16 dense peak (datasheet)"
    size = 8192 if device.type == "cuda" else 512
    return measured_peak(device, size), f"best measured bf16 {size}x{size} matrix product on {name}"


def measured_peak(device: torch.device, size: int, tries: int = 5) -> float:
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    best = float("inf")
    for _ in range(tries + 1):  # the first call warms up
        start = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
