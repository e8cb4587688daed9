"""Hardware policy in one place: the accelerator torch finds, the CPU's vendor, where bf16 helps, the cores
each training process gets (`dataloader_num_workers: auto`) and the shared memory its DataLoader workers use.

The CPU kernels (`vit_ft.kernels`), the inference tools' `--bf16 auto` and the fine-tune's precision checks all
ask here, so that one measurement (docs/benchmarks.md) decides each of them once.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil

import torch

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


def onednn_bf16_supported() -> bool:
    """This CPU has native bf16 products that oneDNN uses (AVX512_BF16 or AMX)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported is not None and supported())


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


__all__ = [
    "SHARED_MEMORY",
    "accelerator_type",
    "auto_dataloader_workers",
    "bf16_helps",
    "cores_per_process",
    "cpu_cores",
    "cpu_model",
    "cpu_vendor",
    "cpuinfo",
    "default_device",
    "free_shared_memory",
    "inference_device",
    "is_amd_cpu",
    "local_processes",
    "onednn_bf16_supported",
]
