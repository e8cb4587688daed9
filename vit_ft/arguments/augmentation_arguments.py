"""The augmentation keys of a recipe: per-image ops (RandAugment, TrivialAugment, colour jitter, random erasing)
and batch-level mixup / cutmix, all off by default.

`AugmentationArguments` is the base of `vit_ft.arguments.fields.DataArguments`, so that these fields are recipe
keys and flags like the others. The per-image fields map one to one onto `vit_ft.data.augmentation.AugmentationSpec`
(timm's `--aa rand-m9-n2`, `--color-jitter`, `--reprob`, `--remode`), the mixup fields onto timm's `Mixup`
(`--mixup`, `--cutmix`, `--mixup-prob`, `--mixup-switch-prob`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .help import option
from .ranges import check_ranges

AUTO_AUGMENT_CHOICES = ("randaugment", "trivialaugment")
ERASING_MODE_CHOICES = ("const", "rand", "pixel")


@dataclass
class AugmentationArguments:
    """Augmentation beyond random-resized crop and flip (timm's names in brackets); the defaults add nothing."""

    auto_augment: str | None = option(
        None,
        "Automatic augmentation after the crop and flip: 'randaugment' (timm's rand-m{M}-n{N}: "
        "rand_augment_num_ops ops per image at rand_augment_magnitude) or 'trivialaugment' (one op at a "
        "random magnitude per image). None: off.",
    )
    rand_augment_num_ops: int = option(2, "RandAugment's N: ops applied per image (timm's n; DeiT uses 2).")
    rand_augment_magnitude: int = option(
        9, "RandAugment's M on timm's 0..10 scale (M/10 of each op's strongest setting; DeiT uses 9)."
    )
    color_jitter: float = option(
        0.0,
        "Colour jitter strength c in [0, 1]: brightness, contrast and saturation factors drawn "
        "in [1 - c, 1 + c] (timm's --color-jitter, e.g. 0.4). Ignored under auto_augment, as in timm. 0: off.",
    )
    random_erasing_prob: float = option(
        0.0,
        "Probability of erasing one random box of each training image, after normalisation "
        "(timm's --reprob; DeiT uses 0.25). 0: off.",
    )
    random_erasing_mode: str = option(
        "const",
        "What fills an erased box: 'const' (the mean colour), 'rand' (one random colour per channel) "
        "or 'pixel' (random noise per pixel) (timm's --remode; DeiT uses 'pixel').",
    )
    mixup_alpha: float = option(
        0.0,
        "Mixup: each training batch is blended with its reverse by a Beta(alpha, alpha) weight, the "
        "labels too, as soft targets (timm's --mixup; DeiT uses 0.8). Label smoothing then goes into the "
        "mixed targets. 0: off.",
    )
    cutmix_alpha: float = option(
        0.0,
        "CutMix: a box of the reversed batch is pasted in, area ratio from Beta(alpha, alpha), the "
        "labels mixed by area (timm's --cutmix; DeiT uses 1.0). 0: off.",
    )
    mixup_prob: float = option(
        1.0, "Probability that a training batch is mixed at all (timm's --mixup-prob)."
    )
    mixup_switch_prob: float = option(
        0.5,
        "With both mixup_alpha and cutmix_alpha on: probability of CutMix instead of mixup for a "
        "batch (timm's --mixup-switch-prob).",
    )

    def __post_init__(self) -> None:
        check_ranges(self)  # every number of the dataclass (DataArguments' too), before anything else
        if isinstance(self.auto_augment, str) and self.auto_augment.lower() in ("", "none"):
            self.auto_augment = None
        if self.auto_augment is not None and self.auto_augment not in AUTO_AUGMENT_CHOICES:
            raise ValueError(
                f"auto_augment={self.auto_augment!r} is not supported; use one of {', '.join(AUTO_AUGMENT_CHOICES)} "
                "(or none to turn it off)."
            )
        if self.random_erasing_mode not in ERASING_MODE_CHOICES:
            raise ValueError(
                f"random_erasing_mode={self.random_erasing_mode!r} is not supported; use one of "
                f"{', '.join(ERASING_MODE_CHOICES)}."
            )
        self.augmentation_spec()  # built once before any data loads (its own checks agree with RANGES)

    @property
    def mixes_batches(self) -> bool:
        """Whether mixup or cutmix is on (then training batches carry soft targets)."""
        return self.mixup_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def augmentation_spec(self) -> Any | None:
        """The per-image augmentation as `vit_ft.data.augmentation.AugmentationSpec`, or None when it adds nothing."""
        if self.auto_augment is None and self.color_jitter == 0 and self.random_erasing_prob == 0:
            return None  # nothing to build, and no kornia import for a plain run
        from ..data.augmentation import AugmentationSpec

        # the spec's fields are ours, one to one (the module docstring), so the spec takes each by its name
        spec = AugmentationSpec(**{item.name: getattr(self, item.name) for item in fields(AugmentationSpec)})
        return spec if spec.active else None


__all__ = ["AUTO_AUGMENT_CHOICES", "ERASING_MODE_CHOICES", "AugmentationArguments"]
