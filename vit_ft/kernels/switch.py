"""The `VIT_FT_KERNELS` switch: whether the oneDNN paths may run at all, read at each call.

`auto` (the default) runs them only on AMD x86 CPUs, `1` wherever oneDNN is available, `0` never: the policy and
its reasons are `utils.hardware.onednn_kernels_allowed` (docs/benchmarks.md "Where the CPU kernels run"). Being
read at each call, the switch can be flipped in a running process. The bf16 kernels also need native bf16
products (`utils.hardware.onednn_bf16_supported`), which each asks itself.
"""

from __future__ import annotations

import torch

from ..utils import hardware
from ..utils.hardware import KERNELS_ENV


def kernels_enabled() -> bool:
    """Whether the oneDNN paths may run at all: not tracing, and the `VIT_FT_KERNELS` switch allows them."""
    # torch.compile and torch.export trace the plain path: they emit their own kernels, portable graphs. Checked
    # first, so that a trace never reads the environment or /proc/cpuinfo (each read would break the graph).
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    return hardware.onednn_kernels_allowed()[0]


__all__ = ["KERNELS_ENV", "kernels_enabled"]
