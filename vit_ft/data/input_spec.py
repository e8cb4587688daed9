"""What a model sees of an image, decided once: `InputSpec`, a (height, width) resolution or a NaFlex patch budget
(SigLIP 2: each image at its own aspect ratio, resized to at most `max_num_patches` patches), with the
normalisation its image processor states. The fine-tune, the tools and the exports build their transforms from it
(`eval_transform`, `train_transform`) and from nothing else; `input_spec` reads it from a model's config and its
image processor (the object, or its `preprocessor_config.json` settings).

The batches a model takes, for exporting and checking a graph of it, are decided here too: `check_batches` (what
an export is compared with PyTorch on) and `graph_traces` (how its ONNX graph is traced: the inputs, their dynamic
axes and the checks, in order of preference), so that the exporters hold no branch on the kind of input."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from ..utils.run_record import PROCESSOR_FILE
from .images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from .naflex import collate_patches, image_size_for_max_num_patches, refuse_batch_mixes
from .random_crops import CROP_SCALE
from .transforms import ImageClassificationTransform, build_transforms

logger = logging.getLogger("vit_ft")


@dataclass(frozen=True)
class InputSpec:
    """The evaluation geometry and normalisation: resize + centre crop to `image_size`, or with `max_num_patches`
    NaFlex patches at each image's own aspect ratio; then normalise."""

    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...] = VIT_MEAN
    std: tuple[float, ...] = VIT_STD
    rescale_factor: float = RESCALE_FACTOR
    resample: int = Image.Resampling.BICUBIC  # what vit_ft fine-tunes and evaluates with
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    max_num_patches: int | None = None  # NaFlex (the model's config): each image at its own aspect ratio
    patch_size: int = 16

    @property
    def naflex(self) -> bool:
        """Whether batches are NaFlex patches (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`) rather
        than `(batch, channels, height, width)` pixels."""
        return self.max_num_patches is not None

    def check_batch_mixes(self, mixes_batches: bool) -> None:
        """Refuse mixup / CutMix (`mixes_batches`) where this spec's images cannot be blended
        (`refuse_batch_mixes`)."""
        refuse_batch_mixes(self.max_num_patches, mixes_batches)

    def record(self) -> dict[str, Any]:
        """What a record of the model states of its input (`vit-ft serve`'s /info)."""
        return {"image_size": list(self.image_size), "mean": list(self.mean), "std": list(self.std),
                "resample": int(self.resample), "max_pixels": self.max_pixels,
                "max_num_patches": self.max_num_patches}  # fmt: skip

    def _transform(self, train: bool, **options: Any) -> ImageClassificationTransform:
        return build_transforms(
            self.image_size, mean=self.mean, std=self.std, train=train, rescale_factor=self.rescale_factor,
            resample=self.resample, max_pixels=self.max_pixels, max_num_patches=self.max_num_patches,
            patch_size=self.patch_size, **options,
        )  # fmt: skip

    def eval_transform(self) -> ImageClassificationTransform:
        """Resize to cover, centre-crop, normalise (`data.transforms.build_transforms`); NaFlex patches instead."""
        return self._transform(train=False)

    def train_transform(
        self,
        crop_scale: tuple[float, float] = CROP_SCALE,
        horizontal_flip: bool = True,
        seed: int | None = None,
        augmentation: Any = None,
    ) -> ImageClassificationTransform:
        """The fine-tune's: random-resized crop + flip (+ `augmentation`) drawn per (seed, epoch, index). Square
        inputs return uint8 crops, the rest per batch on the training device (`BatchAugmentation`); NaFlex grids
        differ from image to image, so everything runs in the workers."""
        return self._transform(
            train=True, crop_scale=crop_scale, horizontal_flip=horizontal_flip, seed=seed,
            device_augmentation=not self.naflex, **({} if augmentation is None else {"augmentation": augmentation}),
        )  # fmt: skip


def input_spec(
    processor: Any,
    config: Any,
    size: tuple[int, int] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    name: str = "the model",
) -> InputSpec:
    """The InputSpec of a model: its image `processor` (an image processor, its settings as a dict, or None:
    mean 0.5, std 0.5 with a warning), at `size` (default: the model `config`'s `image_hw`), and the config's
    NaFlex patch budget where it has one (`max_num_patches`)."""
    settings = processor.to_dict() if hasattr(processor, "to_dict") else processor
    size = tuple(size if size is not None else config.image_hw)
    budget = getattr(config, "max_num_patches", None)
    naflex = {} if budget is None else {"max_num_patches": int(budget), "patch_size": int(config.patch_hw[0])}
    if settings is None:
        logger.warning("No %s for %s: normalising with mean 0.5, std 0.5.", PROCESSOR_FILE, name)
        return InputSpec(image_size=size, max_pixels=max_pixels, **naflex)
    normalize, rescale = settings.get("do_normalize", True), settings.get("do_rescale", True)
    std = settings.get("image_std", VIT_STD)
    if normalize and not all(math.isfinite(float(v)) and float(v) > 0 for v in std):
        raise ValueError(
            f"the {PROCESSOR_FILE} of {name} has image_std={list(std)}; every value must be positive (dividing by "
            "it would make NaN or infinite pixels). Restore the file the model was saved with."
        )
    return InputSpec(
        image_size=size,
        mean=tuple(float(v) for v in settings.get("image_mean", VIT_MEAN)) if normalize else (0.0,) * 3,
        std=tuple(float(v) for v in std) if normalize else (1.0,) * 3,
        rescale_factor=float(settings.get("rescale_factor", RESCALE_FACTOR)) if rescale else 1.0,
        resample=int(settings.get("resample", Image.Resampling.BICUBIC)),
        max_pixels=max_pixels,
        **naflex,
    )


# (height, width) shapes of the images a NaFlex model is checked on: wide, tall, square, a strip, 2:3
NAFLEX_ASPECTS = ((1, 3), (3, 1), (1, 1), (1, 8), (2, 3))


def check_batches(config: Any, sizes: list[tuple[int, int]] | None = None) -> list[dict[str, torch.Tensor]]:
    """Random batches of what the model `config` describes takes, for checking an export (an ONNX graph,
    transformers' class) against it: two images at each of `sizes` (default: its resolution); for a NaFlex model
    (`max_num_patches`) images of the shapes `NAFLEX_ASPECTS` at its budget (`Siglip2ImageProcessor`'s rule), all
    padded to the budget as that processor pads, then two of them padded to the longer one as the tools'
    collation pads (another batch size and patch count; zeros in the padding)."""
    budget, channels = getattr(config, "max_num_patches", None), config.num_channels
    if budget is None:
        return [
            {"pixel_values": torch.randn(2, channels, h, w, generator=torch.Generator().manual_seed(index))}
            for index, (h, w) in enumerate(sizes or [tuple(config.image_hw)])
        ]
    patch, grids = config.patch_hw[0], []
    for height, width in NAFLEX_ASPECTS:
        height, width = image_size_for_max_num_patches(100 * height, 100 * width, patch, budget)
        grids.append((height // patch, width // patch))
    generator = torch.Generator().manual_seed(0)
    patches = [torch.randn(rows * columns, patch * patch * channels, generator=generator) for rows, columns in grids]
    return [collate_patches(patches, grids, length=budget), collate_patches(patches[:2], grids[:2])]


@dataclass(frozen=True)
class GraphTrace:
    """One way to export a model's graph: the batch it is traced on (its inputs, in the graph's order), their
    dynamic axes, the batches the graph must then give PyTorch's logits on, and the image sizes those are."""

    inputs: dict[str, torch.Tensor]
    dynamic_axes: dict[str, dict[int, str]]
    checks: list[dict[str, torch.Tensor]] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (height, width) in pixels of the checked images

    @property
    def dynamic_size(self) -> bool:
        """Whether the graph takes images of any size (height and width, or the patch count, are dynamic)."""
        return any(len(axes) > 1 for axes in self.dynamic_axes.values())


def graph_traces(config: Any) -> list[GraphTrace]:
    """The ways to export the graph of the model `config` describes, in order of preference (the exporter keeps the
    first whose graph passes its checks). A model of fixed-size images: dynamic height and width, traced one patch
    above its size so that the position embeddings' resampling is in the graph and checked at both sizes; else
    fixed at its size. A NaFlex model: its three inputs, batch and patch count dynamic, traced on three images
    padded to their longest (neither the size nor the length of a check batch)."""
    if getattr(config, "max_num_patches", None) is None:
        (height, width), (ph, pw) = config.image_hw, config.patch_hw
        sizes = [(height, width), (height + ph, width + pw)]
        checks, batch = check_batches(config, sizes), {0: "batch"}  # traced on a check batch: any batch would do
        return [
            GraphTrace(checks[1], {"pixel_values": {**batch, 2: "height", 3: "width"}}, checks, sizes),
            GraphTrace(checks[0], {"pixel_values": batch}, checks[:1], sizes[:1]),
        ]
    checks, patch = check_batches(config), config.patch_hw[0]
    trace = {name: values[1:4] for name, values in checks[0].items()}
    length = int(trace["pixel_attention_mask"].sum(-1).max())
    trace = {**trace, "pixel_values": trace["pixel_values"][:, :length],
             "pixel_attention_mask": trace["pixel_attention_mask"][:, :length]}  # fmt: skip
    patches = {0: "batch", 1: "patches"}
    axes = {"pixel_values": patches, "pixel_attention_mask": patches, "spatial_shapes": {0: "batch"}}
    sizes = [(int(rows) * patch, int(columns) * patch) for rows, columns in checks[0]["spatial_shapes"].tolist()]
    return [GraphTrace(trace, axes, checks, sizes)]


__all__ = ["NAFLEX_ASPECTS", "GraphTrace", "InputSpec", "check_batches", "graph_traces", "input_spec"]
