"""Benchmarks on this machine: our ViT against transformers' ViT, the matrix-product ceiling, LoRA against full
fine-tuning, the training image pipeline against a naive decode, and on a GPU ViT-B/16 at 384 px in bf16.

Method, in every section: the contenders run interleaved within one run. After `warmup` untimed calls each,
every round calls each contender once, in an order rotated by one per round, so that a burst of load from other
processes lands on all of them alike. A contender's figure is its median over the rounds; the headline is the
ratio of medians, with the range of the per-round ratios (two calls seconds apart) beside it as its noise. No
absolute number is reported without a ratio next to it: on a shared machine only the ratios carry over.

    python scripts/bench.py                        # ViT-B/16 at 224 px, every section: minutes on 2 cores
    python scripts/bench.py --quick                # a tiny ViT, seconds (the smoke test runs this)
    python scripts/bench.py --sections model,ceiling
    python scripts/bench.py --sections gpu         # where CUDA is available; otherwise a note, no failure
"""

from __future__ import annotations

import copy
import functools
import io
import json
import logging
import math
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image, ImageDraw, ImageFilter
from torch.utils import flop_counter
from transformers import ViTConfig, ViTForImageClassification

from .arguments import ModelArguments
from .configuration_vit_ft import VIT_CONFIG_FIELDS, ViTFTConfig
from .data import build_transforms
from .images import random_resized_crop_box, to_normalized_tensor
from .lora import apply_lora, count_parameters
from .modeling_vit_ft import ViTFTForImageClassification

__all__ = [
    "SECTIONS",
    "BenchmarkSettings",
    "Gemm",
    "Row",
    "build_contenders",
    "count_flops",
    "forward_flops",
    "forward_gemms",
    "interleave",
    "machine_info",
    "naive_train_transform",
    "quick_settings",
    "run_benchmark",
    "synthetic_photo",
    "to_markdown",
    "training_memory_probe",
    "write_results",
]

logger = logging.getLogger(__name__)

SECTIONS = ("model", "ceiling", "lora", "data", "gpu")
# autocast dtype per precision name; None runs without autocast
DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
MEAN = STD = (0.5, 0.5, 0.5)  # google/vit-base-patch16-224-in21k's processor
LEARNING_RATE = 1e-5  # small, so that a few timed steps leave the weights (and their speed) as they were

# The targets, candidate / reference.
TARGETS = {
    "inference": ">= 1.05",
    "training": ">= 1.10",
    "ceiling": ">= 0.90",
    "lora_speed": ">= 1.30",
    "lora_memory": "<= 0.75",
    "lora_parameters": "<= 0.01",
    "data_large": ">= 2.00",
}


@dataclass
class BenchmarkSettings:
    """What to measure and how. The defaults: ViT-B/16 at 224 px, a few minutes on a 2-core CPU."""

    variant: str = "base"
    patch_size: int = 16
    image_size: int = 224
    num_labels: int = 100  # CIFAR-100, as recipes/cifar100*.yaml; under LoRA this head is trained in full
    infer_batch_size: int = 8
    train_batch_size: int = 8
    threads: int | None = None  # None: torch's current setting (one per core)
    warmup: int = 2  # the first calls fault in fresh memory pages: never time them
    rounds: int = 5
    sections: tuple[str, ...] = SECTIONS
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    photo_sizes: tuple[tuple[int, int], ...] = ((500, 375), (2000, 1500))  # (width, height)
    photos_per_round: int = 16  # per round: enough decodes that a round outlasts scheduler noise
    measure_memory: bool = True  # one fresh process per LoRA / full variant (several seconds each)
    # the "gpu" section: the ViT paper's fine-tuning resolution, bf16, a GPU-sized batch; skipped without one
    gpu_device: str = "cuda"
    gpu_image_size: int = 384
    gpu_batch_size: int = 64
    overrides: dict[str, Any] = field(default_factory=dict)  # ViTFTConfig fields over the variant's
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise ValueError(f"Unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}.")
        unknown = sorted(set(self.dtypes) - set(DTYPES))
        if unknown:
            raise ValueError(f"Unknown dtype(s) {unknown}; choose from {', '.join(DTYPES)}.")
        if self.rounds < 1 or self.warmup < 0:
            raise ValueError(f"rounds={self.rounds} must be >= 1 and warmup={self.warmup} >= 0.")

    def model_config(self) -> ViTFTConfig:
        return ViTFTConfig.from_variant(
            self.variant,
            patch_size=self.patch_size,
            image_size=self.image_size,
            num_labels=self.num_labels,
            **self.overrides,
        )


def quick_settings(**overrides: Any) -> BenchmarkSettings:
    """A tiny ViT (2 layers, 32 px), small photos, no memory subprocesses: every code path in seconds."""
    values: dict[str, Any] = {
        "variant": "tiny",
        "patch_size": 8,
        "image_size": 32,
        "num_labels": 10,
        "infer_batch_size": 4,
        "train_batch_size": 4,
        "warmup": 1,
        "rounds": 3,
        "photo_sizes": ((64, 48), (320, 240)),
        "photos_per_round": 2,
        "measure_memory": False,
        "overrides": {"num_hidden_layers": 2},
        "gpu_image_size": 48,
        "gpu_batch_size": 4,
        # one thread: on a busy machine, a tiny model's many short parallel regions stall on the other core
        "threads": 1,
    }
    return BenchmarkSettings(**{**values, **overrides})


# ---------------------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    """`count` matrix products (batch, m, k) x (batch, k, n) of one forward pass."""

    name: str
    batch: int
    m: int
    k: int
    n: int
    count: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n * self.count  # 2 FLOPs per multiply-add


def forward_gemms(config: ViTFTConfig, batch_size: int) -> list[Gemm]:
    """Every matrix product of one forward pass: patch embedding (a stride-p convolution is one GEMM), per layer
    qkv, attention scores, attention-weighted values, output projection and MLP, then the head."""
    grid_h, grid_w = config.grid_size
    patch_h, patch_w = config.patch_hw
    patches = grid_h * grid_w
    tokens = patches + 1  # CLS
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    rows = batch_size * tokens
    gemms = [
        Gemm("patch embedding", 1, batch_size * patches, config.num_channels * patch_h * patch_w, hidden, 1),
        Gemm("qkv", 1, rows, hidden, 3 * hidden, layers),
        Gemm("attention scores", batch_size * heads, tokens, hidden // heads, tokens, layers),
        Gemm("attention x values", batch_size * heads, tokens, tokens, hidden // heads, layers),
        Gemm("proj", 1, rows, hidden, hidden, layers),
        Gemm("fc1", 1, rows, hidden, config.intermediate_size, layers),
        Gemm("fc2", 1, rows, config.intermediate_size, hidden, layers),
    ]
    if config.num_labels > 0:
        gemms.append(Gemm("head", 1, batch_size, hidden, config.num_labels, 1))
    return gemms


def forward_flops(config: ViTFTConfig, batch_size: int) -> dict[str, int]:
    """Analytic FLOPs of one forward pass by part, and their "total". Matrix products only (2 per multiply-add):
    LayerNorm, softmax, GELU and bias adds are O(tokens x hidden) and left out, as is customary."""
    flops = {gemm.name: gemm.flops for gemm in forward_gemms(config, batch_size)}
    flops["total"] = sum(flops.values())
    return flops


def _linear_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


def _cpu_sdpa_flop(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    batch, heads, q_len, head_dim = q_shape
    return 2 * 2 * batch * heads * q_len * k_shape[-2] * head_dim  # scores, then weights x values


def count_flops(model: torch.nn.Module, pixel_values: torch.Tensor) -> int:
    """FLOPs of `model(pixel_values)` as `torch.utils.flop_counter.FlopCounterMode` counts them, taught the two
    CPU kernels it does not know: oneDNN's linear (vit_ft's float32 CPU path) and the CPU flash attention."""
    extra = {
        torch.ops.mkldnn._linear_pointwise: _linear_flop,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    }
    for op, formula in extra.items():
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op)(formula)
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False) as counter:
        model(pixel_values=pixel_values)
    return counter.get_total_flops()


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


def interleave(
    contenders: dict[str, Callable[[], float | None]], warmup: int, rounds: int
) -> dict[str, list[float]]:
    """Seconds per call of each contender: `warmup` untimed calls each, then `rounds` rounds that call every
    contender once, in an order rotated by one each round. A contender that returns a float reports its own
    time (the ceiling, which adds up per-shape times); otherwise the call is timed from outside."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            reported = contenders[name]()
            times[name].append(reported if isinstance(reported, float) else time.perf_counter() - start)
    return times


@dataclass
class Row:
    """One line of the table: a candidate against a reference, and the ratio candidate / reference."""

    section: str
    measurement: str
    unit: str
    candidate: str
    candidate_value: float
    reference: str
    reference_value: float
    ratio: float
    ratio_low: float | None = None  # range of the per-round ratios
    ratio_high: float | None = None
    target: str | None = None  # ">= 1.10" or "<= 0.75", on the ratio
    met: bool | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.target is not None and self.met is None:
            bound = float(self.target.split()[1])
            self.met = self.ratio >= bound if self.target.startswith(">=") else self.ratio <= bound


def _throughput_row(
    section: str,
    measurement: str,
    items: int,
    candidate: tuple[str, list[float]],
    reference: tuple[str, list[float]],
    target: str | None = None,
) -> Row:
    """items/s of two timed contenders; the ratio of medians and the range of per-round ratios."""
    (candidate_name, candidate_times), (reference_name, reference_times) = candidate, reference
    per_round = [r / c for c, r in zip(candidate_times, reference_times, strict=True)]
    return Row(
        section=section,
        measurement=measurement,
        unit="images/s",
        candidate=candidate_name,
        candidate_value=items / statistics.median(candidate_times),
        reference=reference_name,
        reference_value=items / statistics.median(reference_times),
        ratio=statistics.median(reference_times) / statistics.median(candidate_times),
        ratio_low=min(per_round),
        ratio_high=max(per_round),
        target=target,
    )


# ---------------------------------------------------------------------------------------------------------
# Model: ours against transformers', and the matrix-product ceiling
# ---------------------------------------------------------------------------------------------------------


def build_contenders(
    settings: BenchmarkSettings, folder: str | os.PathLike
) -> tuple[ViTFTForImageClassification, ViTForImageClassification]:
    """Our model and transformers' ViT (SDPA attention) carrying identical weights: transformers' random
    initialisation, written with save_pretrained to `folder` and loaded by both."""
    config = settings.model_config()
    hf_config = ViTConfig(
        **{name: getattr(config, name) for name in VIT_CONFIG_FIELDS}, num_labels=config.num_labels
    )
    torch.manual_seed(settings.seed)
    ViTForImageClassification(hf_config).save_pretrained(folder)
    theirs = ViTForImageClassification.from_pretrained(folder, attn_implementation="sdpa").eval()
    ours = ViTFTForImageClassification.from_pretrained(folder).eval()
    return ours, theirs


def _autocast(dtype: torch.dtype | None, device_type: str = "cpu") -> torch.autocast:
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a call is timed to its end (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _infer(model: torch.nn.Module, pixels: torch.Tensor, dtype: torch.dtype | None) -> None:
    with torch.inference_mode(), _autocast(dtype, pixels.device.type):
        model(pixel_values=pixels)
    _synchronize(pixels.device)


def _adamw(model: torch.nn.Module, fused: bool = False) -> torch.optim.Optimizer:
    """torch's AdamW over the trainable parameters: its default implementation (a per-tensor loop on CPU), or
    the fused kernel."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True if fused else None)


def _train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pixels: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype | None,
) -> None:
    """Forward with the loss (under autocast for bf16), backward, optimizer step: one fine-tuning step."""
    with _autocast(dtype, pixels.device.type):
        loss = model(pixel_values=pixels, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _synchronize(pixels.device)


def _interleave_training(
    settings: BenchmarkSettings,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    pixels: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype | None,
) -> dict[str, list[float]]:
    """Seconds per training step of each model with its optimizer, interleaved (see `interleave`)."""
    steps = {
        name: functools.partial(_train_step, model, optimizers[name], pixels, labels, dtype)
        for name, model in models.items()
    }
    return interleave(steps, settings.warmup, settings.rounds)


def _batch(config: ViTFTConfig, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    height, width = config.image_hw
    pixels = torch.randn(batch_size, config.num_channels, height, width, generator=generator)
    labels = torch.randint(0, max(config.num_labels, 1), (batch_size,), generator=generator)
    return pixels, labels


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
    the 2-D products oneDNN's linear without bias (the kernel vit_ft uses in float32 on CPU; torch.matmul
    calls MKL, slower on AMD CPUs). FLOPs / those seconds is the ceiling; the sequence is timed as one call,
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
                if onednn is not None:
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
    config = ours.config
    rows: list[Row] = []
    size = f"{config.image_hw[0]} px"
    for dtype_name in settings.dtypes:
        dtype = DTYPES[dtype_name]
        batch = settings.infer_batch_size
        pixels, _ = _batch(config, batch, settings.seed)
        contenders: dict[str, Callable[[], float | None]] = {
            "ours": lambda p=pixels, d=dtype: _infer(ours, p, d)
        }
        if "model" in sections:
            contenders["theirs"] = lambda p=pixels, d=dtype: _infer(theirs, p, d)
        if "ceiling" in sections:
            contenders["matmul"] = MatmulCeiling(config, batch, dtype or torch.float32)
        logger.info("inference, %s: %s", dtype_name, ", ".join(contenders))
        times = interleave(contenders, settings.warmup, settings.rounds)
        if "model" in sections:
            rows.append(
                _throughput_row(
                    "model",
                    f"inference, {dtype_name}, {size}, batch {batch}",
                    batch,
                    ("vit_ft", times["ours"]),
                    ("transformers ViT (sdpa)", times["theirs"]),
                    TARGETS["inference"],
                )
            )
        if "ceiling" in sections:
            flops = forward_flops(config, batch)["total"]
            ceiling = contenders["matmul"]
            for name, label in (("ours", "vit_ft"), ("theirs", "transformers ViT (sdpa)")):
                if name not in times:
                    continue
                per_round = [m / t for t, m in zip(times[name], times["matmul"], strict=True)]
                rows.append(
                    Row(
                        section="ceiling",
                        measurement=f"inference, {dtype_name}, {size}, batch {batch}: model FLOP/s over "
                        "the FLOP/s of its own matrix products",
                        unit="GFLOP/s",
                        candidate=label,
                        candidate_value=flops / statistics.median(times[name]) / 1e9,
                        reference="its matrix products",
                        reference_value=ceiling.flops / statistics.median(times["matmul"]) / 1e9,
                        ratio=statistics.median(times["matmul"]) / statistics.median(times[name]),
                        ratio_low=min(per_round),
                        ratio_high=max(per_round),
                        target=TARGETS["ceiling"] if name == "ours" else None,
                        note=""
                        if name != "ours"
                        else f"{dtype_name} ceiling's products on: "
                        + ", ".join(f"{gemm} {backend}" for gemm, backend in ceiling.backends.items()),
                    )
                )
        if "model" in sections:
            rows.extend(_bench_training(settings, ours, theirs, dtype_name))
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
    pixels, labels = _batch(config, batch, settings.seed + 1)
    models = {"ours": copy.deepcopy(ours), "theirs": copy.deepcopy(theirs), "ours_fused": copy.deepcopy(ours)}
    optimizers = {name: _adamw(model, fused=name == "ours_fused") for name, model in models.items()}
    for model in models.values():
        model.train()
    logger.info("training step, %s: %s", dtype_name, ", ".join(models))
    times = _interleave_training(settings, models, optimizers, pixels, labels, dtype)
    size = f"{config.image_hw[0]} px"
    return [
        _throughput_row(
            "model",
            f"training step (forward, loss, backward, AdamW), {dtype_name}, {size}, batch {batch}; "
            "both with torch's default AdamW",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["training"],
        ),
        _throughput_row(
            "model",
            f"training step, {dtype_name}, {size}, batch {batch}: our best option (fused AdamW) against "
            "transformers with torch's default AdamW",
            batch,
            ("vit_ft + fused AdamW", times["ours_fused"]),
            ("transformers ViT (sdpa)", times["theirs"]),
        ),
    ]


# ---------------------------------------------------------------------------------------------------------
# LoRA against full fine-tuning
# ---------------------------------------------------------------------------------------------------------


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
    before = _rss_mib("VmRSS")
    config = settings.model_config()
    torch.manual_seed(settings.seed)
    model: torch.nn.Module = ViTFTForImageClassification(config)
    if variant == "lora":
        model = apply_lora(model, _lora_arguments())
    model.train()
    optimizer = _adamw(model, fused=True)
    pixels, labels = _batch(config, settings.train_batch_size, settings.seed + 2)
    for _ in range(2):
        _train_step(model, optimizer, pixels, labels, DTYPES[dtype_name])
    return {"peak_mib": _rss_mib("VmHWM") - before}


def _peak_training_memory(settings: BenchmarkSettings, variant: str, dtype_name: str) -> float:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(training_memory_probe, settings, variant, dtype_name).result()["peak_mib"]


def bench_lora(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """LoRA (rank 16 on qkv, head in full) against full fine-tuning of the same model, both with fused AdamW:
    training-step images/s interleaved, trainable parameters, and peak memory from fresh processes."""
    rows: list[Row] = []
    full = ViTFTForImageClassification.from_pretrained(folder)
    lora = apply_lora(ViTFTForImageClassification.from_pretrained(folder), _lora_arguments())
    trainable_lora, total = count_parameters(lora)
    trainable_full, _ = count_parameters(full)
    config = full.config
    batch = settings.train_batch_size
    pixels, labels = _batch(config, batch, settings.seed + 3)
    models = {"lora": lora.train(), "full": full.train()}
    optimizers = {name: _adamw(model, fused=True) for name, model in models.items()}
    for dtype_name in settings.dtypes:
        dtype = DTYPES[dtype_name]
        logger.info("LoRA against full fine-tuning, %s", dtype_name)
        times = _interleave_training(settings, models, optimizers, pixels, labels, dtype)
        rows.append(
            _throughput_row(
                "lora",
                f"training step, {dtype_name}, batch {batch}, fused AdamW for both",
                batch,
                ("LoRA r=16 on qkv + head", times["lora"]),
                ("full fine-tuning", times["full"]),
                TARGETS["lora_speed"],
            )
        )
    rows.append(
        Row(
            section="lora",
            measurement=f"trainable parameters ({config.num_labels}-class head; {total:,} in all)",
            unit="parameters",
            candidate="LoRA r=16 on qkv + head",
            candidate_value=trainable_lora,
            reference="full fine-tuning",
            reference_value=trainable_full,
            ratio=trainable_lora / trainable_full,
            target=TARGETS["lora_parameters"],
        )
    )
    if settings.measure_memory:
        dtype_name = settings.dtypes[0]
        logger.info("peak training memory, %s: one fresh process each for LoRA and full", dtype_name)
        peaks = {
            variant: _peak_training_memory(settings, variant, dtype_name) for variant in ("lora", "full")
        }
        rows.append(
            Row(
                section="lora",
                measurement=f"peak memory of training, {dtype_name}, batch {batch} (resident set of a fresh "
                "process above its size before the model was built)",
                unit="MiB",
                candidate="LoRA r=16 on qkv + head",
                candidate_value=peaks["lora"],
                reference="full fine-tuning",
                reference_value=peaks["full"],
                ratio=peaks["lora"] / peaks["full"],
                target=TARGETS["lora_memory"],
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------------------
# GPU: the paper's fine-tuning resolution
# ---------------------------------------------------------------------------------------------------------


def gpu_available(settings: BenchmarkSettings) -> bool:
    device = torch.device(settings.gpu_device)
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())


def bench_gpu(settings: BenchmarkSettings, folder: str | os.PathLike) -> list[Row]:
    """Ours against transformers' ViT on `settings.gpu_device` at `gpu_image_size` px, bf16 autocast, batch
    `gpu_batch_size`: inference and training-step images/s, each call timed to the device's end."""
    gpu_settings = replace(settings, image_size=settings.gpu_image_size)
    device = torch.device(settings.gpu_device)
    ours, theirs = (model.to(device) for model in build_contenders(gpu_settings, folder))
    config, batch, dtype = ours.config, settings.gpu_batch_size, torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    size = f"{config.image_hw[0]} px"
    pixels, labels = (t.to(device) for t in _batch(config, batch, settings.seed))
    logger.info("%s, %s, batch %d: inference", name, size, batch)
    times = interleave(
        {"ours": lambda: _infer(ours, pixels, dtype), "theirs": lambda: _infer(theirs, pixels, dtype)},
        settings.warmup,
        settings.rounds,
    )
    rows = [
        _throughput_row(
            "gpu",
            f"inference, bf16, {size}, batch {batch}, on {name}",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["inference"],
        )
    ]
    models = {"ours": ours.train(), "theirs": theirs.train()}
    optimizers = {key: _adamw(model, fused=True) for key, model in models.items()}
    logger.info("%s, %s, batch %d: training step", name, size, batch)
    times = _interleave_training(settings, models, optimizers, pixels, labels, dtype)
    rows.append(
        _throughput_row(
            "gpu",
            f"training step (forward, loss, backward, fused AdamW), bf16, {size}, batch {batch}, on {name}",
            batch,
            ("vit_ft", times["ours"]),
            ("transformers ViT (sdpa)", times["theirs"]),
            TARGETS["training"],
        )
    )
    return rows


# ---------------------------------------------------------------------------------------------------------
# Data pipeline
# ---------------------------------------------------------------------------------------------------------


def synthetic_photo(width: int, height: int, seed: int, quality: int = 90) -> bytes:
    """A JPEG that compresses like a photo: smooth colour gradients, soft-edged shapes and sensor noise."""
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, (3, 3, 3), dtype=np.uint8)
    img = Image.fromarray(corners).resize((width, height), Image.Resampling.BICUBIC)  # smooth background
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, x1 = sorted(rng.integers(0, width, 2))
        y0, y1 = sorted(rng.integers(0, height, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1 + 1, y1 + 1), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=max(1.0, width / 400)))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0.0, 6.0, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def naive_train_transform(
    data: bytes, image_size: tuple[int, int], mean: Sequence[float], std: Sequence[float], resample: int
) -> torch.Tensor:
    """The textbook path: full decode, random-resized crop, resize, flip, normalise."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    box = random_resized_crop_box(img.width, img.height)
    img = img.crop(box).resize((image_size[1], image_size[0]), resample=resample)
    if torch.rand(1).item() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return to_normalized_tensor(img, mean, std)


def bench_data(settings: BenchmarkSettings) -> list[Row]:
    """Train-transform images/s of one worker (one torch thread, as in a DataLoader worker) on synthetic photos:
    vit_ft's transform (crop drawn on the header, JPEG decoded for that crop) against the naive full decode."""
    rows: list[Row] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        transform = build_transforms(settings.image_size, MEAN, STD, train=True)
        size, resample = transform.image_size, transform.resample
        for index, (width, height) in enumerate(settings.photo_sizes):
            logger.info("train transform on %dx%d JPEGs", width, height)
            photos = [synthetic_photo(width, height, seed=i) for i in range(settings.photos_per_round)]
            batch = {"image": [{"bytes": p, "path": None} for p in photos], "label": [0] * len(photos)}
            times = interleave(
                {
                    "vit_ft": lambda b=batch: transform(b),
                    "naive": lambda p=photos: [
                        naive_train_transform(x, size, MEAN, STD, resample) for x in p
                    ],
                },
                settings.warmup,
                settings.rounds,
            )
            largest = index == len(settings.photo_sizes) - 1
            measurement = f"train transform, {width}x{height} JPEG (q90) -> {size[0]} px, one worker"
            naive = ("naive: full decode, crop, resize", times["naive"])
            rows.append(
                _throughput_row(
                    "data",
                    measurement,
                    len(photos),
                    ("vit_ft build_transforms (decode for the crop)", times["vit_ft"]),
                    naive,
                    TARGETS["data_large"] if largest else None,
                )
            )
    finally:
        torch.set_num_threads(threads)
    return rows


# ---------------------------------------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16": bool(bf16()) if bf16 is not None else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pillow": Image.__version__,
        "platform": platform.platform(),
    }


def run_benchmark(settings: BenchmarkSettings) -> dict[str, Any]:
    """Run the selected sections; returns {"machine", "settings", "rows", "notes", "load_average", ...}."""
    threads = torch.get_num_threads()
    try:
        if settings.threads:
            torch.set_num_threads(settings.threads)
        return _run_sections(settings)
    finally:
        torch.set_num_threads(threads)


def _run_sections(settings: BenchmarkSettings) -> dict[str, Any]:
    start = time.perf_counter()
    load_before = os.getloadavg()
    rows: list[Row] = []
    notes = []
    gpu = "gpu" in settings.sections and gpu_available(settings)
    if "gpu" in settings.sections and not gpu:
        notes.append(
            f"No {settings.gpu_device} device here: the gpu rows ({settings.gpu_image_size} px, bf16, batch "
            f"{settings.gpu_batch_size}) were not measured."
        )
    with tempfile.TemporaryDirectory() as folder:
        model_sections = [s for s in ("model", "ceiling") if s in settings.sections]
        if model_sections:
            ours, theirs = build_contenders(settings, folder)
            rows.extend(bench_model(settings, ours, theirs, model_sections))
            del ours, theirs
        if "lora" in settings.sections:
            if not model_sections:
                build_contenders(settings, folder)
            rows.extend(bench_lora(settings, folder))
        if gpu:
            rows.extend(bench_gpu(settings, folder))
    if "data" in settings.sections:
        rows.extend(bench_data(settings))
    load_after = os.getloadavg()
    busiest = max(load_before[0], load_after[0])
    if busiest > 1.5 * torch.get_num_threads():  # ours alone loads one per thread
        notes.append(
            f"The machine was busy (1-minute load average up to {busiest:.1f} on {os.cpu_count()} CPUs): other "
            "processes took cores mid-run, so ratios may be far from a quiet machine's; wide per-round ranges "
            "show it. Rerun when the machine is idle."
        )
    return {
        "machine": machine_info(),
        "settings": asdict(settings),
        "rows": [asdict(row) for row in rows],
        "notes": notes,
        "load_average": {"before": load_before, "after": load_after},
        "elapsed_s": time.perf_counter() - start,
    }


def _fmt(value: float) -> str:
    if value >= 100_000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def to_markdown(result: dict[str, Any]) -> str:
    """The machine, the settings and one table row per measurement."""
    machine, settings = result["machine"], result["settings"]
    load = result["load_average"]
    lines = [
        f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {machine['torch_threads']} torch "
        f"threads, {machine['cpu_capability']}, oneDNN bf16: {machine['onednn_bf16']}; Python "
        f"{machine['python']}, torch {machine['torch']}, transformers {machine['transformers']}, Pillow "
        f"{machine['pillow']}.",
        "",
        f"Settings: ViT-{settings['variant']}/{settings['patch_size']} at {settings['image_size']} px"
        f"{' ' + str(settings['overrides']) if settings['overrides'] else ''}, {settings['num_labels']} classes, warm-up {settings['warmup']}, "
        f"{settings['rounds']} interleaved rounds. Load average (1 min) {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after; {result['elapsed_s'] / 60:.1f} min.",
        "",
        "| section | measurement | candidate | reference | ratio | per-round ratios | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        spread = "" if row["ratio_low"] is None else f"{row['ratio_low']:.2f}-{row['ratio_high']:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(
            f"| {row['section']} | {row['measurement']} | {row['candidate']}: {_fmt(row['candidate_value'])} "
            f"{row['unit']} | {row['reference']}: {_fmt(row['reference_value'])} {row['unit']} | "
            f"{row['ratio']:.3g}x | {spread} | {row['target'] or ''} | {met} |"
        )
    notes = [f"{row['section']}, {row['candidate']}: {row['note']}" for row in result["rows"] if row["note"]]
    lines.extend(["", *(f"- {note}" for note in [*result["notes"], *notes])])
    return "\n".join(lines) + "\n"


def write_results(result: dict[str, Any], output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """benchmark.md and benchmark.json in `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    markdown, data = output_dir / "benchmark.md", output_dir / "benchmark.json"
    markdown.write_text(to_markdown(result), encoding="utf-8")
    data.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return markdown, data
