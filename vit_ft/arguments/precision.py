"""Mixed precision against the hardware: which device a run trains on and whether fp16 or bf16 is set
(`precision_of`, which the run plan's compute decision reads), and the refusal, before TrainingArguments' own
vaguer device errors, of a precision the hardware cannot run (`check_precision`).
"""

from __future__ import annotations

from typing import Any

from ..utils.hardware import accelerator_type
from .checks import RecipeError


def precision_of(training_args: Any, device_type: str | None = None) -> tuple[str, bool, bool]:
    """The run's device type, and whether fp16 and bf16 are set (for training or evaluation)."""
    use_cpu = bool(getattr(training_args, "use_cpu", False))
    device = "cpu" if use_cpu else (device_type or accelerator_type())
    fp16 = bool(getattr(training_args, "fp16", False) or getattr(training_args, "fp16_full_eval", False))
    bf16 = bool(getattr(training_args, "bf16", False) or getattr(training_args, "bf16_full_eval", False))
    return device, fp16, bf16


def check_precision(training_args: Any, device_type: str | None = None) -> None:
    """Fail early on a mixed precision the hardware cannot run: fp16 without a GPU, bf16 on CPU without use_cpu.
    bf16 on a CPU without native bf16 products runs (emulated, with a warning: `plan.run_compute`).

    `training_args` is a TrainingArguments or anything with its fp16/bf16/use_cpu attributes; `device_type`
    ("cuda", "cpu", ...) defaults to the accelerator torch finds.
    """
    use_cpu = bool(getattr(training_args, "use_cpu", False))
    device, fp16, bf16 = precision_of(training_args, device_type)
    if fp16 and device == "cpu":
        where = "use_cpu is set" if use_cpu else "no GPU was found"
        raise RecipeError(
            f"fp16 mixed precision needs a CUDA GPU, but {where}. Use bf16 instead (--fp16 false --bf16 true, "
            "adding --use_cpu true on CPU) or drop fp16 (--fp16 false) to train in fp32."
        )
    if bf16 and device == "cpu" and not use_cpu:
        raise RecipeError(
            "bf16 is set but no GPU was found. Drop it (--bf16 false) to train in fp32 on CPU, or pass "
            "--use_cpu true to train with CPU bf16 autocast."
        )
    if bf16 and device == "cuda" and device_type is None and not _cuda_bf16():
        raise RecipeError(
            "bf16 needs an Ampere or newer GPU; this one has none. Use --bf16 false --fp16 true."
        )


def _cuda_bf16() -> bool:
    import torch

    return torch.cuda.is_bf16_supported()


__all__ = ["check_precision", "precision_of"]
