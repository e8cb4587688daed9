"""SSF (Lian et al. 2022, "Scaling & Shifting Your Features", arXiv 2210.08823): `method: ssf` trains a scale and
a shift after each op of the frozen backbone (the attention's qkv and proj, the MLP's fc1 and fc2, every norm) and
the new head; saving folds each scale and shift into its op's weight and bias, so the output folder is a plain
model that predict, evaluate, export and push read as a full fine-tune's.

The ops are wrapped from outside the model file (as peft wraps LoRA's), each `ScaleShift(op)`: the wrapper is no
`nn.Linear`, so the CPU kernels' fused MLP calls it as a module and the scale sees every output. An op without a
bias (qkv_bias false, RMSNorm) has no place for a shift in a plain model and is left unwrapped (logged).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model.norms import RMSNorm
from .lora import count_parameters
from .peft_methods import NORMS, heads

logger = logging.getLogger("vit_ft")

SSF_TARGETS = ("qkv", "proj", "fc1", "fc2", *NORMS)
# the paper's initialisation (its repository's init_ssf_scale_shift): scale ~ N(1, 0.02), shift ~ N(0, 0.02)
SSF_INIT_STD = 0.02


class ScaleShift(nn.Module):
    """`op(x) * scale + shift` over the last dimension: `(..., dim)` -> `(..., dim)`."""

    def __init__(self, op: nn.Linear | nn.LayerNorm) -> None:
        super().__init__()
        dim = op.out_features if isinstance(op, nn.Linear) else op.normalized_shape[-1]
        self.op = op
        self.scale = nn.Parameter(torch.empty(dim).normal_(1.0, SSF_INIT_STD))
        self.shift = nn.Parameter(torch.empty(dim).normal_(0.0, SSF_INIT_STD))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x) * self.scale + self.shift

    def folded(self) -> nn.Module:
        """The op with the scale and shift in its parameters: W' = diag(scale) W, b' = scale * b + shift."""
        with torch.no_grad():
            self.op.weight.mul_(self.scale.view(-1, *[1] * (self.op.weight.dim() - 1)))
            self.op.bias.mul_(self.scale).add_(self.shift)
        return self.op


def _has_bias(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.LayerNorm)) and getattr(module, "bias", None) is not None


def train_only(model: nn.Module, method: str, modules: tuple[str, ...] = ()) -> nn.Module:
    """Freeze `model` but its head(s) and `modules` (dotted names), in place; logs the trainable count (VPT: the
    prompt tokens, whose parameters are the model's own)."""
    for param in model.parameters():
        param.requires_grad_(False)
    for name in (*heads(model), *modules):
        model.get_submodule(name).requires_grad_(True)
    if modules:
        trainable, total = count_parameters(model)
        logger.info("%s: %s trainable of %s parameters (%.2f%%): %s and the head", method, f"{trainable:,}",
                    f"{total:,}", 100 * trainable / total, ", ".join(modules))  # fmt: skip
    return model


def apply_ssf(model: nn.Module) -> nn.Module:
    """Freeze `model` but its head, wrap each SSF target in a `ScaleShift` (in place); logs what was trained."""
    train_only(model, "SSF")
    wrapped, skipped = 0, []
    for name, module in list(model.named_modules()):
        if name.rpartition(".")[2] not in SSF_TARGETS or isinstance(module, ScaleShift):
            continue
        if not _has_bias(module):  # a shift needs a bias to fold into
            if isinstance(module, (nn.Linear, nn.LayerNorm, RMSNorm)):
                skipped.append(name)
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, ScaleShift(module))
        wrapped += 1
    trainable, total = count_parameters(model)
    logger.info("SSF: %d ops scaled and shifted, %s trainable of %s parameters (%.2f%%)%s", wrapped,
                f"{trainable:,}", f"{total:,}", 100 * trainable / total,
                f"; left as they are (no bias to fold a shift into): {', '.join(skipped[:4])}" if skipped else "")  # fmt: skip
    return model


def merge_ssf(model: nn.Module) -> nn.Module:
    """A copy of `model` with every `ScaleShift` folded into its op: the plain model's modules and keys."""
    merged = copy.deepcopy(model)
    for name, module in list(merged.named_modules()):
        if isinstance(module, ScaleShift):
            parent, _, child = name.rpartition(".")
            setattr(merged.get_submodule(parent) if parent else merged, child, module.folded())
    for param in merged.parameters():
        param.requires_grad_(True)
    return merged


def save_ssf_outputs(trainer: Any, output_dir: Path) -> None:
    """The model with the scales and shifts folded in, in `output_dir` (with its processor)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not trainer.is_world_process_zero():
        return
    merge_ssf(model).save_pretrained(output_dir)
    trainer.processing_class.save_pretrained(output_dir)


__all__ = ["SSF_TARGETS", "ScaleShift", "apply_ssf", "merge_ssf", "save_ssf_outputs", "train_only"]
