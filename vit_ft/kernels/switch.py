"""The `VIT_FT_KERNELS` switch: whether the oneDNN paths may run at all, read at each call.

`auto` (the default) runs them only on AMD x86 CPUs, where MKL's fp32 GEMM runs AVX2 code at about half
oneDNN's AVX-512 speed and torch's flash attention leaves the bf16 units idle; on Intel and ARM they were not
measured to help (docs/benchmarks.md "Where the CPU kernels run"). `1` runs them wherever oneDNN is available, `0`
never. Being read at each call, the switch can be flipped in a running process.
"""

from __future__ import annotations

import os

import torch

from ..utils.hardware import is_amd_cpu

KERNELS_ENV = "VIT_FT_KERNELS"


def kernels_enabled() -> bool:
    """Whether the oneDNN paths may run at all: not tracing, the `VIT_FT_KERNELS` switch, oneDNN on."""
    # torch.compile and torch.export trace the plain path: they emit their own kernels, portable graphs. Checked
    # first, so that a trace never reads the environment or /proc/cpuinfo (each read would break the graph).
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    setting = os.environ.get(KERNELS_ENV, "auto").strip().lower()
    if setting in ("0", "false", "off", "no"):
        return False
    if setting not in ("1", "true", "on", "yes") and not is_amd_cpu():
        return False
    return torch.backends.mkldnn.enabled


__all__ = ["KERNELS_ENV", "kernels_enabled"]
