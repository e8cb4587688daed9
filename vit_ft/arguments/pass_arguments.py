"""The keys of the passes a fine-tune makes after training, and the sizes they take (issue 52: every pass scales
with the run). `PassArguments` is a base of `vit_ft.arguments.fields.DataArguments`, so that its fields are
recipe keys and flags like the others.

WiSE-FT (`wise_ft`, `wise_shift`) interpolates the fine-tune with the model it started from, after training
(`tools.wise.wise_finetune`). The feature bank (`tasks.feature_bank`) passes training images through the final model once more: up to
`bank_max_images`, and never more than training saw (`bank_images`), so that a smoke run of a few steps does
not pay for a full run's bank.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..utils.option_values import BANK_MAX_IMAGES
from .help import option

# what a run without a bank gives up, said where it skips it and in its record
NO_BANK = (
    "predict, evaluate and the demo will not flag images unlike the training images (their out-of-distribution "
    "score, unlike_training)"
)


@dataclass
class PassArguments:
    """How big the passes after training are."""

    bank_max_images: int | None = option(
        BANK_MAX_IMAGES,
        "Training images in the feature bank (feature_bank.safetensors, the out-of-distribution "
        "score's), a class-stratified sample, e.g. 20000; none or 0 skips the bank and the score. A run that "
        "trains on fewer images (max_steps x global batch) banks as many as it trained on.",
    )
    wise_ft: bool = option(
        False,
        "WiSE-FT after training (Wortsman et al. 2022, as the wise-ft repo's one command): the model the fine-tune "
        "starts from (method lp-ft: the linear probe; head_init zeroshot: the zero-shot model) and the fine-tune are "
        "run into OUTPUT/wise/start and OUTPUT/wise/finetuned, and OUTPUT holds their weights interpolated, alpha "
        "chosen on validation (vit-ft wise).",
    )
    wise_shift: str | None = option(
        None, "wise_ft: the curve's shifted accuracy too: 'corruptions', a folder of class folders or a Hub dataset id."
    )


def bank_images(limit: int | None, train_images: int, trained_images: int | None) -> tuple[int, str]:
    """How many of `train_images` the feature bank holds, and why in words: at most `limit` (`bank_max_images`;
    None or 0: none) and at most `trained_images` (optimizer steps x global batch; None: a probe, which saw the
    whole split through its frozen features)."""
    if not limit:
        return 0, f"bank_max_images is {limit}: {NO_BANK}"
    if trained_images is not None and trained_images < min(limit, train_images):
        return trained_images, f"as many as training saw ({trained_images}: steps x global batch)"
    if limit < train_images:
        return limit, f"bank_max_images {limit}"
    return train_images, "all of them"


__all__ = ["NO_BANK", "PassArguments", "bank_images"]
