"""What every section shares: settings, the table's rows, the machine's description (the interleaved timing is
`vit_ft.utils.timing`, which the deployment report shares)."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import transformers
from PIL import Image

from vit_ft.model.configuration_vit_ft import ViTFTConfig
from vit_ft.utils.hardware import EMULATED_BF16_SLOWDOWN, Compute, compute_for, cpu_flags, cpu_model

SECTIONS = ("model", "ceiling", "profile", "compile", "onnx", "lora", "data", "pipeline", "gpu")
# autocast dtype per precision name; None runs without autocast
DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
MEAN = STD = (0.5, 0.5, 0.5)  # google/vit-base-patch16-224-in21k's processor
LEARNING_RATE = 1e-5  # small, so that a few timed steps leave the weights (and their speed) as they were

# The targets, candidate / reference.
TARGETS = {
    "inference": ">= 1.05",
    "training": ">= 1.10",
    "ceiling": ">= 0.90",
    "compile": ">= 1.10",
    "lora_speed": ">= 1.30",
    "lora_memory": "<= 0.75",
    "lora_parameters": "<= 0.01",
    "data_large": ">= 2.00",
    "pipeline": ">= 0.80",
    "gpu": ">= 1.00",  # every gpu row, eager and compiled
    "gpu_utilisation": ">= 0.45",  # training-step model FLOP utilisation
}

# ---------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------


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
    pipeline_images: int = 32  # the "pipeline" section's JPEG folder (per round)
    pipeline_workers: int = 2  # its decode threads (evaluate_model.py --num_workers)
    # the "gpu" section: the ViT paper's fine-tuning resolution, bf16, a GPU-sized batch; skipped without one
    gpu_device: str = "cuda"
    gpu_image_size: int = 384
    gpu_batch_size: int = 64
    # the "compile" section's torch.compile backend: "inductor" (torch's default) generates kernels; "eager" only
    # traces (seconds: the smoke test's choice)
    compile_backend: str = "inductor"
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


def cpu_compute(dtype_name: str) -> Compute:
    """The kernels a CPU row in `dtype_name` runs on, and why (`vit_ft.utils.hardware.compute_for`)."""
    return compute_for("cpu", "float32" if DTYPES[dtype_name] is None else "bf16")


def without_emulated(settings: BenchmarkSettings) -> tuple[BenchmarkSettings, list[str]]:
    """`settings` less the precisions this CPU would run emulated (bf16 without native bf16 products: its rows
    measure torch's emulation, about EMULATED_BF16_SLOWDOWN slower than float32, and took over 25 minutes on a
    2-core AVX2 host), and the line saying so; a ValueError where no precision is left."""
    emulated = [name for name in settings.dtypes if cpu_compute(name).emulated_bf16]
    if not emulated:
        return settings, []
    kept = tuple(name for name in settings.dtypes if name not in emulated)
    why = f"{cpu_compute(emulated[0]).reason}, so bf16 would run emulated, about {EMULATED_BF16_SLOWDOWN} slower"
    if not kept:
        raise ValueError(f"--dtypes {','.join(settings.dtypes)}: {why}; pass --dtypes fp32.")
    return replace(settings, dtypes=kept), [f"The CPU rows in {', '.join(emulated)} were skipped: {why}."]


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
        "pipeline_images": 6,
        "overrides": {"num_hidden_layers": 2},
        "gpu_image_size": 48,
        "gpu_batch_size": 4,
        # one thread: on a busy machine, a tiny model's many short parallel regions stall on the other core
        "threads": 1,
        "compile_backend": "eager",  # trace only: inductor's code generation takes minutes
    }
    return BenchmarkSettings(**{**values, **overrides})


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Rows of the table
# ---------------------------------------------------------------------------------------------------------


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


def throughput_row(
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
# The machine
# ---------------------------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": list(cpu_flags()),  # those of vit_ft.utils.hardware.CPU_FLAGS it has
        "onednn_bf16": bool(bf16()) if bf16 is not None else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pillow": Image.__version__,
        "platform": platform.platform(),
    }
