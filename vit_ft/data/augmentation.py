"""Per-image augmentation beyond crop and flip: RandAugment, TrivialAugment, colour jitter, random erasing.

The ops are kornia's (`kornia.augmentation`), configured to timm's semantics where they differ:

- RandAugment follows timm's `rand_augment_transform("rand-m{M}-n{N}")`: N ops drawn with replacement from
  timm's 15 (`_RAND_TRANSFORMS`), each applied with probability 0.5, at magnitude M on timm's scale 0..10
  (M / 10 of each op's maximum: rotate 30 degrees, shear 0.3, translate 0.45 of the side, enhance factor
  0.1 + 1.8 M / 10, posterize to int(4 M / 10) bits, solarize above 1 - M / 10, solarize-add 110 / 255).
  kornia's own RandAugment scale is 0..30 (m / 30), so M maps to kornia's m = 3 M. torchvision's RandAugment
  (31 bins, magnitude 9 = 9 / 30 of each maximum) is a different, milder scale: its 9 is about timm's 3.
- TrivialAugment draws one op and a uniform magnitude per image, with torchvision's `TrivialAugmentWide`
  ranges (the paper's); num ops and magnitude do not apply to it.
- colour jitter: timm's one float, brightness = contrast = saturation = that, hue 0, in a random order
  (torchvision's ColorJitter, which kornia's ColorJitter reproduces); applied only without an auto-augment,
  as timm does.
- random erasing (timm's RandomErasing, after normalisation): one box of 2 % to 1/3 of the area, aspect ratio
  0.3 to 1/0.3, filled with 0 (`const`: the mean colour), one normal colour per channel (`rand`) or normal
  noise per pixel (`pixel`). kornia erases constants only; the two other fills are ours.

Known differences from timm, small beside the draw itself: kornia's ops fill the corners a rotation, shear
or translation uncovers with black (timm: the mean colour), solarize-add also inverts the pixels it pushes
past the threshold (timm only adds below 128), kornia draws the erasing box's aspect ratio uniformly on each
side of 1 and clips a box that does not fit (timm: log-uniform, up to 10 tries).

kornia versions: two conventions changed within the supported range (0.7 .. 0.9.2), a shear's magnitude and
posterize's draw of bits; both are pinned in one place below ("kornia's conventions"), so that every version
draws the same values.

Randomness: kornia draws from torch's global RNG; `ImageAugmentation.__call__` runs it inside
`torch.random.fork_rng` seeded with the seed it is given, so that the draws are a function of that seed (the
transform derives it from (seed, epoch, image index)) and the caller's global RNG is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import kornia.augmentation as K
import torch
from kornia.augmentation.auto import RandAugment, TrivialAugment
from kornia.augmentation.auto.operations import ops
from kornia.augmentation.auto.operations.policy import PolicySequential
from kornia.geometry.bbox import bbox_generator, bbox_to_mask

__all__ = ["AUTO_AUGMENTS", "ERASING_MODES", "AugmentationSpec", "ImageAugmentation"]

AUTO_AUGMENTS = ("randaugment", "trivialaugment")
ERASING_MODES = ("const", "rand", "pixel")
MAX_MAGNITUDE = 10  # timm's _LEVEL_DENOM: magnitude M applies M / 10 of each op's maximum
RAND_AUGMENT_OP_PROBABILITY = 0.5  # timm's rand_augment_ops(prob=0.5): each drawn op applies half the time
MAX_NUM_OPS = 15  # as many as there are ops (draws are with replacement; more would only repeat them)


@dataclass(frozen=True)
class AugmentationSpec:
    """What the train transform applies after its crop and flip; the defaults apply nothing.

    auto_augment: "randaugment", "trivialaugment" or None.
    rand_augment_num_ops: RandAugment's N, ops per image (timm's n, default 2).
    rand_augment_magnitude: RandAugment's M on timm's scale 0..10 (timm's m; recipes use 9), see the module.
    color_jitter: timm's --color-jitter: brightness, contrast and saturation factors drawn in [1 - c, 1 + c];
        ignored under an auto-augment, as in timm.
    random_erasing_prob: timm's --reprob, the probability of erasing one box (applied after normalisation).
    random_erasing_mode: timm's --remode: "const" (zeros: the mean colour), "rand" (a normal colour per
        channel) or "pixel" (normal noise per pixel).
    """

    auto_augment: str | None = None
    rand_augment_num_ops: int = 2
    rand_augment_magnitude: int = 9
    color_jitter: float = 0.0
    random_erasing_prob: float = 0.0
    random_erasing_mode: str = "const"

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise a one-line ValueError naming the first field out of range and its allowed values."""
        if self.auto_augment not in (None, *AUTO_AUGMENTS):
            raise ValueError(
                f"auto_augment={self.auto_augment!r} must be one of {', '.join(AUTO_AUGMENTS)} or none (off)."
            )
        num_ops = self.rand_augment_num_ops
        if isinstance(num_ops, bool) or not isinstance(num_ops, int) or not 1 <= num_ops <= MAX_NUM_OPS:
            raise ValueError(
                f"rand_augment_num_ops={self.rand_augment_num_ops} must be an integer in [1, {MAX_NUM_OPS}] "
                "(timm's n; 2 is usual)."
            )
        if not 0 <= self.rand_augment_magnitude <= MAX_MAGNITUDE:
            raise ValueError(
                f"rand_augment_magnitude={self.rand_augment_magnitude} must be in [0, {MAX_MAGNITUDE}] "
                "(timm's m; 9 is usual)."
            )
        if not 0 <= self.color_jitter <= 1:
            raise ValueError(
                f"color_jitter={self.color_jitter} must be in [0, 1] (timm's 0.4 is usual; 0: off)."
            )
        if not 0 <= self.random_erasing_prob <= 1:
            raise ValueError(
                f"random_erasing_prob={self.random_erasing_prob} must be in [0, 1] (0.25 is usual; 0: off)."
            )
        if self.random_erasing_mode not in ERASING_MODES:
            raise ValueError(
                f"random_erasing_mode={self.random_erasing_mode!r} must be one of {', '.join(ERASING_MODES)}."
            )

    @property
    def active(self) -> bool:
        """Whether anything is applied at all."""
        return self.auto_augment is not None or self.color_jitter > 0 or self.random_erasing_prob > 0

    def describe(self) -> str:
        """What is applied, in a few words for a figure title or a log line ("" when nothing)."""
        parts = []
        if self.auto_augment == "randaugment":
            parts.append(f"RandAugment (n={self.rand_augment_num_ops}, m={self.rand_augment_magnitude})")
        elif self.auto_augment == "trivialaugment":
            parts.append("TrivialAugment")
        elif self.color_jitter > 0:
            parts.append(f"colour jitter {self.color_jitter:g}")
        if self.random_erasing_prob > 0:
            parts.append(f"random erasing (p={self.random_erasing_prob:g}, {self.random_erasing_mode})")
        return " + ".join(parts)

    def build(self) -> ImageAugmentation | None:
        """The callable that applies this spec, or None when it applies nothing."""
        return ImageAugmentation(self) if self.active else None


class ImageAugmentation:
    """An `AugmentationSpec` built: pixel ops on [0, 1] images, then normalisation, then erasing."""

    def __init__(self, spec: AugmentationSpec) -> None:
        self.spec = spec
        self.pixel_ops = _pixel_ops(spec)
        self.erasing = (
            TimmRandomErasing(spec.random_erasing_prob, spec.random_erasing_mode)
            if spec.random_erasing_prob > 0
            else None
        )

    def __call__(
        self, pixels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, seed: int | None = None
    ) -> torch.Tensor:
        """(channels, height, width) float image in [0, 1] -> augmented and normalised (pixels - mean) / std.

        mean, std: (channels, 1, 1). With `seed`, every draw comes from torch's RNG seeded with it inside
        `fork_rng` (the global RNG is unchanged); without, from the global RNG.
        """
        if seed is None:
            return self._apply(pixels, mean, std)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self._apply(pixels, mean, std)

    @torch.no_grad()
    def _apply(self, pixels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        batch = pixels.unsqueeze(0)  # (1, channels, height, width): kornia works on batches
        if self.pixel_ops is not None:
            batch = self.pixel_ops(batch).clamp_(0.0, 1.0)
        batch = (batch - mean) / std
        if self.erasing is not None:
            batch = self.erasing(batch)
        return batch[0].contiguous()


def _pixel_ops(spec: AugmentationSpec) -> torch.nn.Module | None:
    """The ops on [0, 1] pixels: the auto-augment, or else the colour jitter, or None."""
    if spec.auto_augment == "randaugment":
        return TimmRandAugment(spec.rand_augment_num_ops, spec.rand_augment_magnitude)
    if spec.auto_augment == "trivialaugment":
        return WideTrivialAugment()
    if spec.color_jitter > 0:
        jitter = spec.color_jitter
        return K.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter, hue=0.0, p=1.0)
    return None


# ---------------------------------------------------------------------------------------------------------
# kornia's conventions that changed within the supported versions (0.7 .. 0.9.2), pinned here
# ---------------------------------------------------------------------------------------------------------
# - a shear's magnitude: before 0.9.2 ShearX / ShearY read it as an angle in units of 180 degrees (their
#   `_process_magnitude`: `magnitude * 180`), from 0.9.2 as the shear factor (`atan(magnitude) * 180 / pi`).
#   Each shear op built here gets the factor's mapping (`_with_shear_factor`), so that its magnitude is the
#   shear factor, timm's and torchvision's level (the affine matrix's off-diagonal entry), in every version.
# - posterize's bits drawn from a range of whole numbers: before 0.9.2 U(low, high) rounded (the two ends half
#   as likely as the others; torchvision's 31 bins: 3 each against 5, near that), from 0.9.2 each whole number
#   equally often (PosterizeGenerator: U(low, high + 1) floored). Both versions draw a range with a fractional
#   end the first way, so TrivialAugment's range ends at the float32 just below 8 (`_POSTERIZE_TOP`).
#   RandAugment's bits are its level, which replaces the draw: the same under every version.


def _shear_degrees(factor: torch.Tensor) -> torch.Tensor:
    # kornia's RandomShear takes an angle in degrees and shears by its tan
    return torch.rad2deg(torch.atan(factor))


def _with_shear_factor(op: ops.OperationBase) -> ops.OperationBase:
    """`op`, if a shear, with its magnitude read as the shear factor whatever kornia's version (the version's
    random sign still applied after the mapping); any other op as it is."""
    if isinstance(op, (ops.ShearX, ops.ShearY)):
        op._magnitude_fn = op._init_magnitude_fn(_shear_degrees)
    return op


_POSTERIZE_TOP = torch.nextafter(torch.tensor(8.0), torch.tensor(0.0)).item()  # 8 - 2**-21: fractional


# ---------------------------------------------------------------------------------------------------------
# RandAugment with timm's ops, ranges, selection and probability
# ---------------------------------------------------------------------------------------------------------

_SHEAR_MAX = 0.3  # timm's shear level at M = 10, a shear factor (`_with_shear_factor`)


def _timm_posterize_bits(magnitude: torch.Tensor) -> torch.Tensor:
    # RandAugment hands posterize 4 - 4 f (kornia's bits convention); timm keeps int(4 f) bits
    return (4.0 - magnitude).long()


def _timm_solarize_threshold(magnitude: torch.Tensor) -> torch.Tensor:
    # timm solarizes the pixels at or above 256 - 256 f (out of 255): about 1 - f on [0, 1]
    return 1.0 - magnitude


def _timm_op(name: str, p: float) -> ops.OperationBase:
    """One of timm's RandAugment ops as a kornia operation; its range times M / 10 is timm's level."""
    symmetric = {"rotate": (ops.Rotate, 30.0), "shear_x": (ops.ShearX, _SHEAR_MAX),
                 "shear_y": (ops.ShearY, _SHEAR_MAX), "translate_x": (ops.TranslateX, 0.45),
                 "translate_y": (ops.TranslateY, 0.45)}  # fmt: skip
    enhance = {"color": ops.Saturate, "contrast": ops.Contrast, "brightness": ops.Brightness,
               "sharpness": ops.Sharpness}  # fmt: skip
    if name in symmetric:
        cls, maximum = symmetric[name]
        return _with_shear_factor(cls(None, p, magnitude_range=(0.0, maximum), symmetric_megnitude=True))
    if name in enhance:
        return enhance[name](None, p, magnitude_range=(0.1, 1.9))
    if name == "posterize":
        op = ops.Posterize(None, p, magnitude_range=(0.0, 4.0))
        op._magnitude_fn = _timm_posterize_bits
        return op
    if name == "solarize":
        op = ops.Solarize(None, p, magnitude_range=(0.0, 1.0))
        op._magnitude_fn = _timm_solarize_threshold
        return op
    if name == "solarize_add":
        op = ops.SolarizeAdd(None, p, magnitude_range=(0.0, 110 / 255))
        # kornia's SolarizeAdd passes thresholds=0.5, which its RandomSolarize reads as the range 0.5 +- 0.5:
        # timm's threshold is fixed at 128
        op.op = K.RandomSolarize(thresholds=(0.5, 0.5), additions=(0.0, 110 / 255), p=p)
        return op
    return {"auto_contrast": ops.AutoContrast, "equalize": ops.Equalize, "invert": ops.Invert}[name](p)


# timm's _RAND_TRANSFORMS, in its order
TIMM_RAND_OPS = ("auto_contrast", "equalize", "invert", "rotate", "posterize", "solarize", "solarize_add",
                 "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x",
                 "translate_y")  # fmt: skip


class TimmRandAugment(RandAugment):
    """kornia's RandAugment drawing as timm's: `num_ops` of timm's ops with replacement, each applied with
    probability 0.5, at `magnitude` on timm's 0..10 scale (kornia's m = 3 x magnitude)."""

    def __init__(self, num_ops: int, magnitude: float) -> None:
        super().__init__(n=1, m=1, policy=[[(name, 0.0, 1.0)] for name in TIMM_RAND_OPS])
        # set after the constructor, which refuses kornia's ends (m = 0, 30) that timm's M = 0 and 10 reach;
        # forward_parameters reads m / 30
        self.n, self.m = num_ops, 3 * magnitude

    def compose_subpolicy_sequential(self, subpolicy: list) -> PolicySequential:
        return PolicySequential(_timm_op(subpolicy[0][0], RAND_AUGMENT_OP_PROBABILITY))

    def rand_selector(self, n: int) -> torch.Tensor:
        return torch.randint(len(self._modules), (n,))  # with replacement, as timm's np.random.choice


# torchvision's TrivialAugmentWide ranges in kornia's terms (its identity op has no kornia counterpart):
# shear factor 0.99, translate 32 px of a 224-px image, rotate 135 degrees, enhance factors 1 +- 0.99,
# posterize to 2..8 bits, solarize at any threshold
TRIVIAL_AUGMENT_WIDE_POLICY = [
    [("auto_contrast", 0, 1)],
    [("equalize", 0, 1)],
    [("rotate", -135.0, 135.0)],
    [("posterize", 2.0, _POSTERIZE_TOP)],
    [("solarize", 0.0, 1.0)],
    [("color", 0.01, 1.99)],
    [("contrast", 0.01, 1.99)],
    [("brightness", 0.01, 1.99)],
    [("sharpness", 0.01, 1.99)],
    [("shear_x", -0.99, 0.99)],
    [("shear_y", -0.99, 0.99)],
    [("translate_x", -32 / 224, 32 / 224)],
    [("translate_y", -32 / 224, 32 / 224)],
]


class WideTrivialAugment(TrivialAugment):
    """kornia's TrivialAugment over torchvision's TrivialAugmentWide ranges, its shears in shear factors."""

    def __init__(self) -> None:
        super().__init__(policy=TRIVIAL_AUGMENT_WIDE_POLICY)

    def compose_subpolicy_sequential(self, subpolicy: list) -> PolicySequential:
        sequential = super().compose_subpolicy_sequential(subpolicy)
        _with_shear_factor(sequential[0])
        return sequential


# ---------------------------------------------------------------------------------------------------------
# Random erasing with timm's fills
# ---------------------------------------------------------------------------------------------------------


class TimmRandomErasing(K.RandomErasing):
    """kornia's RandomErasing with timm's box range (area 0.02..1/3, aspect 0.3..1/0.3) and fill modes:
    "const" zeros, "rand" one standard-normal value per channel, "pixel" one per pixel."""

    def __init__(self, p: float, mode: str = "const") -> None:
        super().__init__(scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3), value=0.0, p=p)
        self.mode = mode

    def apply_transform(self, input, params, flags, transform=None):  # noqa: A002 (kornia's signature)
        if self.mode == "const":
            return super().apply_transform(input, params, flags, transform)
        fill = torch.randn(self.fill_shape(input.shape), dtype=input.dtype, device=input.device)
        return erase_boxes(input, params, fill)

    def fill_shape(self, shape: torch.Size) -> tuple[int, ...]:
        """The shape of the normal fill of a (batch, channels, height, width) input: per pixel ("pixel") or
        per channel ("rand")."""
        batch, channels, height, width = shape
        return (batch, channels, height, width) if self.mode == "pixel" else (batch, channels, 1, 1)


def erase_boxes(input: torch.Tensor, params: dict[str, torch.Tensor], fill: torch.Tensor) -> torch.Tensor:  # noqa: A002
    """(batch, channels, height, width) `input` with each image's box (kornia's erasing params xs, ys, widths,
    heights) replaced by `fill` (broadcast to the input: zeros, a colour per channel or noise per pixel)."""
    height, width = input.shape[-2:]
    boxes = bbox_generator(params["xs"], params["ys"], params["widths"], params["heights"])
    mask = bbox_to_mask(boxes.to(input.device), width, height).unsqueeze(1)  # (batch, 1, height, width)
    return torch.where(mask == 1.0, fill.to(input.dtype), input)
