"""Hardware policy in one place: the accelerator torch finds, the CPU's vendor and flags, whether it has native
bf16 products, where the oneDNN kernels run and where bf16 helps, the cores each training process gets
(`dataloader_num_workers: auto`) and the shared memory its DataLoader workers use.

The CPU kernels (`vit_ft.kernels`), the inference tools' `--bf16`, the fine-tune's precision and the benchmark
all ask here, so that one measurement (docs/performance.md) decides each of them once. `compute_for` gathers the
answers for a run into one value (`Compute`: device, precision, kernels and why), which a run logs as one line
at its start and the fine-tune keeps in its run record.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from typing import Any

import torch

logger = logging.getLogger("vit_ft")

SHARED_MEMORY = "/dev/shm"  # where torch's DataLoader workers put the batches they hand to the main process


@functools.cache
def cpuinfo(field: str) -> str:
    """A field of the first processor in /proc/cpuinfo ("vendor_id", "model name"); "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    """The CPU's name for a table of timings: /proc/cpuinfo's "model name", else what `platform` knows."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The CPU vendor ("AuthenticAMD", "GenuineIntel", ...); "" where /proc/cpuinfo does not say."""
    return cpuinfo("vendor_id")


def is_amd_cpu() -> bool:
    """AMD x86 CPUs: where the oneDNN kernels and bf16 inference were measured to help."""
    return cpu_vendor() == "AuthenticAMD"


def accelerator_type() -> str:
    """The type of the accelerator torch finds ("cuda", "mps", ...), or "cpu" when there is none."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.current_accelerator().type if accelerator.is_available() else "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_device() -> torch.device:
    """The inference tools' device: a CUDA GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inference_device(device: str | torch.device | None) -> torch.device:
    """The tools' `--device` as a torch.device that exists here (None: `default_device`); a name torch does not
    know, or an accelerator this machine or this torch build lacks, is a one-line ValueError naming the fix."""
    if device is None:
        return default_device()
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"--device {device!r} is not a device name; pass cpu, cuda, cuda:1, mps, ... (default: cuda when "
            "there is a GPU)."
        ) from None
    if chosen.type == "cpu" or chosen.type == "meta":
        return chosen
    module = getattr(torch, chosen.type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 0
    available = module is not None and getattr(module, "is_available", lambda: False)()
    if not available or (chosen.index is not None and chosen.index >= count):
        found = f"{count} {chosen.type} device(s)" if available else f"no {chosen.type} device"
        raise ValueError(
            f"--device {device}: this machine (torch {torch.__version__}) has {found}; pass --device cpu, or "
            "leave --device out to use a GPU when there is one."
        )
    return chosen


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's or Slurm's share, not the host's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def local_processes() -> int:
    """The training processes on this machine: LOCAL_WORLD_SIZE (torchrun and `accelerate launch` set it), else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def cores_per_process() -> int:
    """This process's share of the CPU cores: its cores divided among the training processes on the machine."""
    return max(1, cpu_cores() // local_processes())


def auto_dataloader_workers() -> int:
    """`dataloader_num_workers: auto`: one DataLoader worker per core of this process's share, less one core
    left to the main process (which runs the training step and feeds the GPU); 0 with a single core."""
    return cores_per_process() - 1


def free_shared_memory(path: str = SHARED_MEMORY) -> int | None:
    """Free bytes of the shared-memory file system DataLoader workers hand batches through; None where there
    is none (macOS, Windows)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


# /proc/cpuinfo flags that decide the CPU kernels and the bf16 path (docs/performance.md; .ci/run prints them)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
KERNELS_ENV = "VIT_FT_KERNELS"  # the oneDNN kernels: auto (AMD CPUs), 1 (wherever oneDNN is), 0 (never)
# 1: answer "no native bf16" on any CPU, to run an AVX2-only host's path (torch's bf16 autocast) on this one
NO_NATIVE_BF16_ENV = "VIT_FT_NO_NATIVE_BF16"
# bf16 autocast without native bf16 products (torch emulates them) against float32, ViT-S/16 and ViT-B/16 at
# 224 px, batch 8, inference and training step, on a 2-core AMD EPYC limited to AVX2 (docs/performance.md)
EMULATED_BF16_SLOWDOWN = "4-5x"
_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def cpu_flags() -> tuple[str, ...]:
    """Those of `CPU_FLAGS` this CPU has, as /proc/cpuinfo lists them (empty where there is none)."""
    present = set(cpuinfo("flags").split())
    return tuple(flag for flag in CPU_FLAGS if flag in present)


@functools.cache
def _onednn_reports_bf16() -> bool:
    """oneDNN is built in and reports native bf16 products on this CPU (asked once: it reads the CPU's ISA)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and supported is not None and supported())


def onednn_bf16_supported() -> bool:
    """The one answer to "does this CPU have native bf16 products?" (AVX512_BF16 or AMX, as oneDNN finds them):
    the oneDNN bf16 kernels run only where it is yes, `--bf16 auto` reads it, and bf16 where it is no runs on
    torch's emulation with a warning (`compute_for`). `VIT_FT_NO_NATIVE_BF16=1` makes it no on any CPU."""
    if os.environ.get(NO_NATIVE_BF16_ENV, "").strip().lower() in _ON:
        return False
    return _onednn_reports_bf16()


def onednn_kernels_allowed() -> tuple[bool, str]:
    """Whether the `VIT_FT_KERNELS` switch lets the oneDNN kernels run, and why, in words: `auto` (the default)
    on AMD x86 CPUs only, where MKL's fp32 GEMM runs AVX2 code at about half oneDNN's AVX-512 speed and torch's
    flash attention leaves the bf16 units idle; on Intel and ARM they were not measured to help. Read at each
    call, so the switch can be flipped in a running process."""
    setting = os.environ.get(KERNELS_ENV, "auto").strip().lower()
    if setting in _OFF:
        return False, f"{KERNELS_ENV}={setting}"
    if setting not in _ON and not is_amd_cpu():
        return (
            False,
            f"{KERNELS_ENV}=auto runs them on AMD CPUs only, this one is {cpu_vendor() or 'unknown'}",
        )
    if not torch.backends.mkldnn.enabled:
        return False, "oneDNN is switched off in torch (torch.backends.mkldnn.enabled)"
    return True, f"{KERNELS_ENV}={setting}"


def bf16_helps(device: torch.device) -> bool:
    """True where bf16 autocast was measured to run inference faster: CUDA GPUs with bf16, and AMD CPUs with
    native bf16 products (ViT-B/16 at 224, batch 8, on an AMD EPYC with AVX512_BF16: 16.1 images/s against 9.1
    in float32). On an Intel Xeon that reports AVX512_BF16 too, bf16 ran at 4.2 images/s against 7.0 in float32,
    kernels on or off (docs/benchmarks.md), so elsewhere float32 stays."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return onednn_bf16_supported() and is_amd_cpu()
    return False


# the kernels of a bf16 run on a CPU without native bf16 products
EMULATED_BF16 = "torch's bf16 autocast, emulated"


@dataclass(frozen=True)
class Compute:
    """How a run computes, decided once (`compute_for`): the device, the precision ("float32", "bf16", "fp16"),
    the kernels of its matrix products and attention, why, and the CPU flags that decided it."""

    device: str
    precision: str
    kernels: str  # "oneDNN", "torch" or EMULATED_BF16
    reason: str
    flags: tuple[str, ...] = ()

    @property
    def emulated_bf16(self) -> bool:
        """bf16 on a CPU without native bf16 products: correct, but EMULATED_BF16_SLOWDOWN slower than float32."""
        return self.kernels == EMULATED_BF16

    def line(self) -> str:
        """The decision in one line (a warning's where bf16 is emulated: it names the cost and the fix)."""
        flags = ""
        if self.device == "cpu":
            flags = f"; CPU flags: {' '.join(self.flags) or 'none of ' + ' '.join(CPU_FLAGS)}"
        line = f"Compute: {self.precision} on {self.device}; kernels: {self.kernels} ({self.reason}{flags})."
        if self.emulated_bf16:
            line += (
                f" Measured about {EMULATED_BF16_SLOWDOWN} slower than float32: --bf16 false runs float32."
            )
        return line

    def log(self) -> None:
        """`line()` on the vit_ft logger: info, or a warning where bf16 is emulated."""
        (logger.warning if self.emulated_bf16 else logger.info)(self.line())

    def record(self) -> dict[str, Any]:
        """The decision as a run record keeps it (JSON values)."""
        return {**asdict(self), "flags": list(self.flags), "emulated_bf16": self.emulated_bf16}


def compute_for(device: str | torch.device, precision: str = "float32") -> Compute:
    """The kernels a run on `device` in `precision` gets, and why: on CPU, bf16 without native bf16 products runs
    on torch's autocast (emulated; the oneDNN bf16 kernels would fail there), else the oneDNN kernels where
    `onednn_kernels_allowed`, else torch's own."""
    device_type = torch.device(device).type
    if device_type != "cpu":
        return Compute(device_type, precision, "torch", "the oneDNN kernels are CPU-only")
    flags = cpu_flags()
    if precision == "bf16" and not onednn_bf16_supported():
        reason = "this CPU has no native bf16 products: neither avx512_bf16 nor amx_bf16"
        if _onednn_reports_bf16():
            reason = f"{NO_NATIVE_BF16_ENV}=1: this CPU's native bf16 products are not used"
        return Compute("cpu", precision, EMULATED_BF16, reason, flags)
    allowed, why = onednn_kernels_allowed()
    if precision == "bf16" and allowed:
        why = f"native bf16 products, {why}"
    return Compute("cpu", precision, "oneDNN" if allowed else "torch", why, flags)


__all__ = [
    "CPU_FLAGS",
    "EMULATED_BF16",
    "EMULATED_BF16_SLOWDOWN",
    "KERNELS_ENV",
    "NO_NATIVE_BF16_ENV",
    "SHARED_MEMORY",
    "Compute",
    "accelerator_type",
    "auto_dataloader_workers",
    "bf16_helps",
    "compute_for",
    "cores_per_process",
    "cpu_cores",
    "cpu_flags",
    "cpu_model",
    "cpu_vendor",
    "cpuinfo",
    "default_device",
    "free_shared_memory",
    "inference_device",
    "is_amd_cpu",
    "local_processes",
    "onednn_bf16_supported",
    "onednn_kernels_allowed",
]
