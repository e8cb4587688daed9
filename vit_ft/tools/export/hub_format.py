"""Which format a fine-tune is shared in: transformers' own class wherever the model maps onto it exactly, so the
repository loads with `pipeline()` and runs in the Hub's widget without remote code; vit_ft's code only where
the model needs it, or when asked. Which class a model is, is `model.family_export`'s decision (plain ViT,
DeiT, DINOv2, SigLIP); this module turns it into the push's format and the card's reason.

    choose_format(model.config)                 # ShareFormat("transformers", "ViTForImageClassification", ...)
    choose_format(model.config, "vit_ft")       # as asked
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PretrainedConfig

from ...data.input_spec import check_batches
from ...metrics.multilabel import THRESHOLD_ATTRIBUTE
from .formats import AUTO, FORMAT_CHOICES, FORMATS


@dataclass(frozen=True)
class ShareFormat:
    """The format a model is shared in: `name` ("transformers" or "vit_ft"), the transformers class of the
    transformers format (`model_class`, None for vit_ft) and `reason`, a sentence for the model card and log."""

    name: str
    model_class: str | None
    reason: str


def remote_code_reasons(config: PretrainedConfig) -> list[str]:
    """Why no transformers class expresses the model `config` describes ([] when one does): the model layer's
    one decision (`model.family_export`), which `model.export.export_to_transformers` follows too."""
    from ...model.family_export import transformers_export_reason

    reason = transformers_export_reason(config)
    return [reason] if reason else []


def transformers_export_class(config: PretrainedConfig) -> str | None:
    """The transformers class the model `config` describes is exactly (weights renamed, same logits), e.g.
    "ViTForImageClassification" for a plain ViT; None where the model needs vit_ft's code."""
    from ...model.family_export import transformers_class_for

    return transformers_class_for(config)


# the staged export against its source on the same pixels: renamed weights, same arithmetic (fp32 rounding only)
EXPORT_LOGITS_TOLERANCE = 1e-4


def check_same_logits(reference: Any, staged: Any, staging: Path) -> None:
    """`staged` (loaded from `staging`) gives `reference`'s logits on the batches its model takes
    (`data.input_spec.check_batches`: two random images at its resolution, or NaFlex batches of several aspect
    ratios), within `EXPORT_LOGITS_TOLERANCE`; else a ValueError: the export would not be the model that was
    fine-tuned."""
    batches = check_batches(reference.config)
    with torch.inference_mode():
        expected = torch.cat([reference.eval()(**batch).logits.float() for batch in batches])
        got = torch.cat([staged.eval()(**batch).logits.float() for batch in batches])
    difference = (got - expected).abs().max().item()
    if not difference <= EXPORT_LOGITS_TOLERANCE * max(1.0, expected.abs().max().item()):
        raise ValueError(
            f"the {type(staged).__name__} staged in {staging} gives logits {difference:.2g} away from the fine-tuned "
            "model's: transformers' class does not express this model exactly; share it with --format vit_ft."
        )


def check_same_head(reference: Any, staged: Any, staging: Path) -> None:
    """`staged` (loaded from `staging`) keeps `reference`'s `problem_type` and multi-label decision threshold
    (`family_export.head_fields`); else a ValueError: without them transformers' pipeline would give a
    multi-label model softmax scores, and every tool would keep labels at 0.5 instead of the tuned threshold."""
    from ...model.family_export import head_fields

    def normalised(name: str, value: Any) -> Any:  # a threshold tuple, JSON list or numpy value compare equal
        numbers = name == THRESHOLD_ATTRIBUTE and value is not None
        return np.asarray(value, dtype=np.float64).tolist() if numbers else value

    expected = head_fields(reference.config)
    lost = [
        f"{name}={expected.get(name)!r} (staged: {getattr(staged.config, name, None)!r})"
        for name in ("problem_type", THRESHOLD_ATTRIBUTE)
        if normalised(name, expected.get(name)) != normalised(name, getattr(staged.config, name, None))
    ]
    if lost:
        raise ValueError(
            f"the {type(staged).__name__} staged in {staging} lost the model's {'; '.join(lost)}; share it with "
            "--format vit_ft, which keeps config.json as the fine-tune saved it."
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
    target, reasons = transformers_export_class(config), remote_code_reasons(config)
    if requested == "vit_ft":
        why = "asked for with `--format vit_ft`"
        if target is not None:
            why += f" (the model is also exactly transformers' `{target}`, the default format)"
        return ShareFormat("vit_ft", None, why)
    if target is not None:
        return ShareFormat("transformers", target, f"the model is exactly transformers' `{target}`")
    if requested == "transformers":
        raise ValueError(
            f"--format transformers cannot express this model ({'; '.join(reasons)}); share it in the vit_ft "
            "format (leave --format unset, or --format vit_ft)."
        )
    return ShareFormat("vit_ft", None, f"no transformers class expresses this model: {'; '.join(reasons)}")


__all__ = [
    "AUTO",
    "FORMATS",
    "FORMAT_CHOICES",
    "ShareFormat",
    "check_format",
    "check_same_head",
    "check_same_logits",
    "choose_format",
    "remote_code_reasons",
    "transformers_export_class",
]
