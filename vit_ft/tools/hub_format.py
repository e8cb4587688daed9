"""Which format a fine-tune is shared in: transformers' own class wherever the model maps onto it exactly, so the
repository loads with `pipeline()` and runs in the Hub's widget without remote code; vit_ft's code only where
the model needs it, or when asked.

    choose_format(model.config)                 # ShareFormat("transformers", "ViTForImageClassification", ...)
    choose_format(model.config, "vit_ft")       # as asked
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

AUTO = "auto"
FORMATS = ("vit_ft", "transformers")
FORMAT_CHOICES = (AUTO, *FORMATS)
# the transformers class a plain vit_ft classifier is
VIT_CLASS = "ViTForImageClassification"
TRANSFORMERS_POOLING = "cls"  # ViTForImageClassification classifies the CLS token


@dataclass(frozen=True)
class ShareFormat:
    """The format a model is shared in: `name` ("transformers" or "vit_ft"), the transformers class of the
    transformers format (`model_class`, None for vit_ft) and `reason`, a sentence for the model card and log."""

    name: str
    model_class: str | None
    reason: str


def _architecture_fields(config: PretrainedConfig) -> list[str]:
    """The fields the config class itself declares (hidden_size, ..., pooling and whatever a model family adds),
    not transformers' generic ones (labels, dtype, output flags)."""
    generic = {name for base in PretrainedConfig.__mro__ for name in vars(base).get("__annotations__", {})}
    fields: list[str] = []
    for cls in type(config).__mro__:
        if cls is PretrainedConfig or not issubclass(cls, PretrainedConfig):
            continue
        fields += [n for n in vars(cls).get("__annotations__", {}) if n not in generic and n not in fields]
    return fields


def remote_code_reasons(config: PretrainedConfig) -> list[str]:
    """Why transformers' ViTForImageClassification cannot express the model `config` describes; [] when it can.

    Plain ViT is CLS pooling and every other field the config class adds (a model family's extras) at its
    default; `model.export._vit_config` carries the ViTConfig fields across, nothing else.
    """
    from ..model.configuration_vit_ft import VIT_CONFIG_FIELDS

    reasons = []
    if getattr(config, "model_type", None) != "vit_ft":
        reasons.append(f"model_type={config.model_type!r} is not vit-ft's ViT")
        return reasons
    if getattr(config, "pooling", TRANSFORMERS_POOLING) != TRANSFORMERS_POOLING:
        reasons.append(
            f"pooling={config.pooling!r}: transformers' {VIT_CLASS} classifies the CLS token, not the mean of "
            "the patch tokens"
        )
    defaults = type(config)()
    for name in _architecture_fields(config):
        if name in VIT_CONFIG_FIELDS or name == "pooling":
            continue
        value = getattr(config, name, None)
        if value != getattr(defaults, name, None):
            reasons.append(f"{name}={value!r} has no counterpart in transformers' ViTConfig")
    if getattr(config, "num_labels", 0) < 1:
        reasons.append("it has no classification head (num_labels=0)")
    return reasons


def transformers_export_class(config: PretrainedConfig) -> str | None:
    """The transformers class the model `config` describes is exactly (weights renamed, same logits), or None."""
    return None if remote_code_reasons(config) else VIT_CLASS


# the staged export against its source on the same pixels: renamed weights, same arithmetic (fp32 rounding only)
EXPORT_LOGITS_TOLERANCE = 1e-4


def check_same_logits(reference: Any, staged: Any, staging: Path) -> None:
    """`staged` (loaded from `staging`) gives `reference`'s logits on two random images at its resolution, within
    `EXPORT_LOGITS_TOLERANCE`; else a ValueError: the export would not be the model that was fine-tuned."""
    import torch

    height, width = reference.config.image_hw
    pixels = torch.randn(
        2, reference.config.num_channels, height, width, generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        expected = reference.eval()(pixel_values=pixels).logits.float()
        got = staged.eval()(pixel_values=pixels).logits.float()
    difference = (got - expected).abs().max().item()
    if not difference <= EXPORT_LOGITS_TOLERANCE * max(1.0, expected.abs().max().item()):
        raise ValueError(
            f"the {type(staged).__name__} staged in {staging} gives logits {difference:.2g} away from the fine-tuned "
            "model's: transformers' class does not express this model exactly; share it with --format vit_ft."
        )


def check_format(requested: str) -> None:
    """A ValueError naming the choices unless `requested` is one of `FORMAT_CHOICES`."""
    if requested not in FORMAT_CHOICES:
        raise ValueError(
            f"format={requested!r} is not one of {FORMAT_CHOICES}: 'auto' (transformers' class where the model "
            "maps onto one, else vit_ft), 'transformers' (no remote code) or 'vit_ft' (our code, "
            "trust_remote_code)."
        )


def choose_format(config: PretrainedConfig | Any, requested: str = AUTO) -> ShareFormat:
    """The format to share the model `config` describes in: `requested` ("auto", "transformers", "vit_ft").

    "auto" is transformers' class where the model maps onto one exactly, else vit_ft with the reason. Asking
    for "transformers" where it cannot express the model is a ValueError naming why and the fix.
    """
    check_format(requested)
    reasons = remote_code_reasons(config)
    if requested == "vit_ft":
        why = "asked for with `--format vit_ft`"
        if not reasons:
            why += f" (the model is also a plain transformers `{VIT_CLASS}`, the default format)"
        return ShareFormat("vit_ft", None, why)
    if not reasons:
        return ShareFormat("transformers", VIT_CLASS, f"a plain ViT: exactly transformers' `{VIT_CLASS}`")
    if requested == "transformers":
        raise ValueError(
            f"--format transformers cannot express this model ({'; '.join(reasons)}); share it in the vit_ft "
            "format (leave --format unset, or --format vit_ft)."
        )
    return ShareFormat(
        "vit_ft", None, f"transformers' `{VIT_CLASS}` cannot express this model: {'; '.join(reasons)}"
    )


__all__ = [
    "AUTO",
    "FORMATS",
    "FORMAT_CHOICES",
    "ShareFormat",
    "check_format",
    "check_same_logits",
    "choose_format",
    "remote_code_reasons",
    "transformers_export_class",
]
