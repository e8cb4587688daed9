"""Knowledge distillation (DeiT, Touvron et al. 2021): a fine-tuned teacher's outputs join the labels in the loss.

`teacher_model_name_or_path` names the teacher: a vit_ft output folder, a transformers image classifier or a Hub id
of one, loaded through the fine-tune's own loading path, kept in eval mode under `no_grad`, placed on the
training device (never wrapped by DDP / FSDP, never saved in a checkpoint) and, where the student trains in bf16,
held in bf16. It sees each training micro-batch after the device augmentation, the very pixels the student sees.

The loss is DeiT's `DistillationLoss` (facebookresearch/deit `losses.py`):
`(1 - alpha) * base(class head, labels) + alpha * kd(distillation head, teacher)`, with
- soft: `KL(log_softmax(s / tau) || log_softmax(t / tau)) * tau^2`, summed and divided by `s.numel()` as DeiT does;
- hard: `cross_entropy(s, argmax t)`.
A student with DeiT's distillation token gives the class head to the labels and the distillation head to the
teacher (inference averages both, `modeling_vit_ft`); a student without one distills on its logits (logit
distillation, timm's). The two heads' outputs are read by forward hooks during the training forward, so the
model file and the DDP wrapper stay as they are. Evaluation's loss is the base loss alone.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..arguments.family_defaults import read_config_json
from ..model.families import FAMILY_MODEL_TYPES
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..tasks.losses import ClassificationLoss

logger = logging.getLogger("vit_ft")

DISTILLATION_TYPES = ("soft", "hard")
# DeiT's defaults (main.py: --distillation-type, --distillation-alpha 0.5, --distillation-tau 1.0); hard is its best
DEFAULT_TYPE, DEFAULT_ALPHA, DEFAULT_TAU = "hard", 0.5, 1.0
# the model types vit_ft's own loader reads: its folders, transformers' ViT and the ViT family (timm's configs and
# the paper's .npz files have none)
_VIT_FT_TYPES = frozenset({"vit_ft", "vit", *FAMILY_MODEL_TYPES})


def distillation_term(student: torch.Tensor, teacher: torch.Tensor, kind: str, tau: float) -> torch.Tensor:
    """DeiT's distillation term between student and teacher logits `(batch, num_classes)`: soft (KL at
    temperature `tau`, times tau^2, over `numel`) or hard (cross-entropy with the teacher's argmax)."""
    student, teacher = student.float(), teacher.float()
    if kind == "soft":
        return (
            F.kl_div(
                F.log_softmax(student / tau, dim=1),
                F.log_softmax(teacher / tau, dim=1),
                reduction="sum",
                log_target=True,
            )
            * (tau * tau)
            / student.numel()
        )
    if kind == "hard":
        return F.cross_entropy(student, teacher.argmax(dim=1))
    raise ValueError(f"distillation_type={kind!r}: use one of {', '.join(DISTILLATION_TYPES)}.")


class HeadOutputs:
    """Forward hooks on the student's class head and distillation head that keep their last training outputs
    `(batch, num_classes)`; a student without a distillation token has only the first."""

    def __init__(self, model: nn.Module) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft (LoRA) student
        self.outputs: dict[str, torch.Tensor] = {}
        self.has_token = bool(getattr(base.config, "distillation_token", False))
        heads = {"cls": base.classifier}
        if self.has_token:
            heads["dist"] = base.distillation_classifier
        for name, head in heads.items():
            head.register_forward_hook(self._keeper(name))

    def _keeper(self, name: str) -> Any:
        def keep(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            if module.training:
                self.outputs[name] = output

        return keep

    def take(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the logits the labels train, the logits the teacher trains); the model's logits for both without
        a distillation token."""
        cls, dist = self.outputs.pop("cls", None), self.outputs.pop("dist", None)
        if not self.has_token or cls is None or dist is None:
            return logits, logits
        return cls, dist


class DistillationLoss:
    """DeiT's `DistillationLoss` with the Trainer's `compute_loss_func` signature over `base` (the task's
    classification loss: label smoothing, class weights, mixup's soft targets). `Distiller.see` sets the teacher's
    logits of the coming training forward; without them (evaluation) the loss is `base` on the model's logits."""

    def __init__(self, base: Any, heads: HeadOutputs, kind: str, alpha: float, tau: float) -> None:
        self.base, self.heads, self.kind, self.alpha, self.tau = base, heads, kind, alpha, tau
        self.teacher_logits: torch.Tensor | None = None

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        teacher, self.teacher_logits = self.teacher_logits, None
        if teacher is None:
            self.heads.outputs.clear()
            return self.base({"logits": logits}, labels, num_items_in_batch)
        cls, dist = self.heads.take(logits)
        base = self.base({"logits": cls}, labels, num_items_in_batch)
        return (1 - self.alpha) * base + self.alpha * distillation_term(dist, teacher, self.kind, self.tau)


class Distiller:
    """The teacher on the training device and the loss that reads it; `see(pixel_values)` before each training
    forward runs the teacher on that micro-batch."""

    def __init__(self, teacher: nn.Module, loss: DistillationLoss) -> None:
        self.teacher, self.loss = teacher, loss

    @torch.no_grad()
    def see(self, pixel_values: torch.Tensor) -> None:
        dtype = next(self.teacher.parameters()).dtype
        logits = self.teacher(pixel_values=pixel_values.to(dtype)).logits  # (batch, num_classes)
        self.loss.teacher_logits = logits.float()


def load_teacher(name: str, names: list[str], bf16: bool = False, cache_dir: str | None = None) -> nn.Module:
    """The teacher: a vit_ft folder or a ViT-family classifier through vit_ft's loader (its trained heads checked
    complete), any other transformers image classifier through `AutoModelForImageClassification`; eval mode, no
    gradients, bf16 where the student trains in bf16. Its classes must be `names`, in order (one-line error)."""
    model_type = _model_type(name, cache_dir)
    if model_type is None or model_type in _VIT_FT_TYPES:
        teacher = ViTFTForImageClassification.from_pretrained(name, cache_dir=cache_dir)
        untrained = [key for key in teacher.loading_report.newly_initialized if "classifier" in key]
        if untrained:
            raise ValueError(
                f"teacher_model_name_or_path={name!r} has no trained classification head ({untrained[0]} is "
                "missing): a teacher is a fine-tuned classifier, e.g. the output folder of a fine-tune."
            )
    else:
        from transformers import AutoModelForImageClassification

        teacher = AutoModelForImageClassification.from_pretrained(name, cache_dir=cache_dir)
    config = teacher.config
    if getattr(config, "problem_type", None) == "multi_label_classification":
        raise ValueError(
            f"teacher_model_name_or_path={name!r} is a multi-label model; distillation needs a single-label teacher."
        )
    labels = [str(config.id2label[i]) for i in range(config.num_labels)]
    if labels != [str(n) for n in names]:
        raise ValueError(
            f"teacher_model_name_or_path={name!r} predicts {len(labels)} classes {_shown(labels)}, but the data "
            f"has {len(names)} classes {_shown(names)}: distill from a teacher fine-tuned on the same classes."
        )
    teacher.eval().requires_grad_(False)
    return teacher.to(torch.bfloat16) if bf16 else teacher


def _model_type(name: str, cache_dir: str | None) -> str | None:
    """The checkpoint's `model_type` as its config.json states it (None: none, or no config.json: a JAX .npz)."""
    config = read_config_json(name, cache_dir)
    return None if config is None else config.get("model_type")


def _shown(names: list[str]) -> str:
    return "[" + ", ".join(map(str, names[:10])) + (" ...]" if len(names) > 10 else "]")


def build_distiller(
    model: nn.Module, training_args: Any, names: list[str], task: Any, base_loss: Any, cache_dir: str | None = None
) -> Distiller | None:
    """The run's `Distiller` when `teacher_model_name_or_path` is set, else None. `base_loss` is the task's
    training loss, or None for the model's own (then the label smoothing moves into a `ClassificationLoss`)."""
    name = getattr(training_args, "teacher_model_name_or_path", None)
    if name is None:
        return None
    if task.problem_type != "single_label_classification":
        raise ValueError(
            "teacher_model_name_or_path: distillation is for data with one label per image; this data has "
            "several. Drop the teacher."
        )
    teacher = load_teacher(name, names, bf16=bool(training_args.bf16), cache_dir=cache_dir)
    teacher.to(training_args.device)  # placed only: no DDP / FSDP wrapper, no optimizer, no checkpoint
    heads = HeadOutputs(model)
    kind, alpha, tau = distillation_settings(training_args)
    base = base_loss or ClassificationLoss(None, training_args.label_smoothing_factor)
    logger.info(
        "Distilling from %s: %s, alpha %g, tau %g, %s.", name, kind, alpha, tau,
        "through the distillation token" if heads.has_token else "on the logits (the student has no distillation token)",
    )  # fmt: skip
    return Distiller(teacher, DistillationLoss(base, heads, kind, alpha, tau))


def distillation_settings(training_args: Any) -> tuple[str, float, float]:
    """(type, alpha, tau) with DeiT's defaults for the unset ones."""
    kind = getattr(training_args, "distillation_type", None) or DEFAULT_TYPE
    alpha = getattr(training_args, "distillation_alpha", None)
    tau = getattr(training_args, "distillation_tau", None)
    return kind, DEFAULT_ALPHA if alpha is None else alpha, DEFAULT_TAU if tau is None else tau


__all__ = [
    "DISTILLATION_TYPES",
    "DistillationLoss",
    "Distiller",
    "HeadOutputs",
    "build_distiller",
    "distillation_settings",
    "distillation_term",
    "load_teacher",
]
