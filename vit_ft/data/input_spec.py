"""What a model sees of an image, decided once: `InputSpec`, a (height, width) resolution or a NaFlex patch budget
(SigLIP 2: each image at its own aspect ratio, resized to at most `max_num_patches` patches), with the
normalisation its image processor states. The fine-tune, the tools and the exports build their transforms from it
(`eval_transform`, `train_transform`) and from nothing else; `input_spec` reads it from a model's config and its
image processor (the object, or its `preprocessor_config.json` settings).

The batches a model takes, for exporting and checking a graph of it, are decided here too: `check_batches` (what
an export is compared with PyTorch on), `graph_traces` (how its ONNX graph is traced: the inputs, their dynamic
axes and the checks, in order of preference), `GraphLogits` (the model as the graph exposes it), which batches a
graph takes (`check_graph_batch`) and the processor a NaFlex export carries (`patch_image_processor`), so that the
exporters hold no branch on the kind of input. So is the layout of a batch of either kind as the tools read it:
its valid patches (`valid_patches`), each image's patch grid (`patch_grids`), values per patch (`per_patch`,
`patch_window`, `expand_patch_mask`) and each image's mean colour (`mean_colour`); and `InputSpec.refuse_patches`
for what needs pixels. Outside data/ and model/, the tools ask these and name no NaFlex input."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from ..utils.run_record import PROCESSOR_FILE
from .images import DEFAULT_MAX_PIXELS, RESCALE_FACTOR, VIT_MEAN, VIT_STD
from .naflex import collate_patches, image_size_for_max_num_patches, is_naflex_batch, refuse_batch_mixes
from .random_crops import CROP_SCALE
from .transforms import ImageClassificationTransform, build_transforms

logger = logging.getLogger("vit_ft")

# a NaFlex batch's inputs, in a graph's order (transformers' `Siglip2ImageProcessor`'s names)
NAFLEX_INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


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

    def refuse_patches(self, message: str, **values: Any) -> None:
        """A ValueError of `message` (its `{kind}`: "NaFlex", `{budget}`: the patch budget, and `values`) where this
        spec's batches are patches rather than pixels: for what needs `(batch, channels, height, width)` images."""
        if self.naflex:
            raise ValueError(message.format(kind="NaFlex", budget=self.max_num_patches, **values))

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
    naflex = patch_budget(config) or {}
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


def patch_budget(config: Any) -> dict[str, int] | None:
    """A NaFlex model's patch budget as its image processor and our transform take it, `{"max_num_patches",
    "patch_size"}`, from the model `config`; None for a model of fixed-size images."""
    budget = getattr(config, "max_num_patches", None)
    return None if budget is None else {"max_num_patches": int(budget), "patch_size": int(config.patch_hw[0])}


def patch_image_processor(settings: dict[str, Any], config: Any) -> Any:
    """transformers' image processor that makes the NaFlex batches of the model `config` describes from images,
    as our evaluation does (`Siglip2ImageProcessorPil` at its budget, with the pixel `settings`: its normalisation;
    bicubic where they state no filter, as ours); None for a model of fixed-size images."""
    budget = patch_budget(config)
    if budget is None:
        return None
    from transformers import Siglip2ImageProcessorPil  # its default filter is bilinear; ours bicubic

    return Siglip2ImageProcessorPil(**{"resample": int(Image.Resampling.BICUBIC), **settings, **budget})


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


def valid_patches(batch: Any) -> torch.Tensor | None:
    """`(batch, num_patches)` bool over the patches of a NaFlex batch that are an image's, not padding; None for a
    batch of images (a tensor, or a mapping with `pixel_values` alone), whose every patch is valid."""
    mask = batch.get("pixel_attention_mask") if isinstance(batch, dict) else None
    return None if mask is None else mask.bool()


def patch_grids(batch: Any, patch_hw: tuple[int, int]) -> list[tuple[int, int]]:
    """Each image's patch grid (rows, columns): a NaFlex batch's `spatial_shapes`, else its pixels' height and
    width over the patch size `patch_hw`, the same for every image."""
    if is_naflex_batch(batch):
        return [(int(rows), int(columns)) for rows, columns in batch["spatial_shapes"].tolist()]
    pixels = batch["pixel_values"] if isinstance(batch, dict) else batch
    return [(pixels.shape[-2] // patch_hw[0], pixels.shape[-1] // patch_hw[1])] * pixels.shape[0]


def per_patch(values: torch.Tensor, patch_hw: tuple[int, int], reduce: str = "sum") -> torch.Tensor:
    """Values shaped as a batch's `pixel_values` (an attribution) -> `(batch, num_patches)`, summed (`reduce`
    "sum") or averaged ("mean") over each patch's pixels and channels: a NaFlex batch's rows of patch values, or
    `(batch, channels, height, width)` images cut into `patch_hw` patches."""
    if values.dim() == 3:  # NaFlex patches (B, N, patch_h * patch_w * channels)
        return values.sum(-1) if reduce == "sum" else values.mean(-1)
    patch_h, patch_w = patch_hw
    batch, channels, height, width = values.shape
    blocks = values.reshape(batch, channels, height // patch_h, patch_h, width // patch_w, patch_w)
    return (blocks.sum((1, 3, 5)) if reduce == "sum" else blocks.mean((1, 3, 5))).flatten(1)  # (B, grid_h * grid_w)


def patch_window(pixels: torch.Tensor, patch_hw: tuple[int, int]) -> tuple[int, ...]:
    """The shape of one patch within one image's `pixel_values` (occlusion's window): a NaFlex patch's row of
    values `(1, patch_h * patch_w * channels)`, or an image's `(channels, patch_h, patch_w)`; `pixels` the batch's."""
    return (1, pixels.shape[-1]) if pixels.dim() == 3 else (pixels.shape[1], *patch_hw)


def expand_patch_mask(keep: torch.Tensor, pixels: torch.Tensor, patch_hw: tuple[int, int]) -> torch.Tensor:
    """A `(steps, num_patches)` patch mask -> a mask broadcastable to one image's pixel values (`pixels`: its
    `(channels, height, width)`, or NaFlex patches `(num_patches, patch_h * patch_w * channels)`)."""
    if pixels.dim() == 2:  # NaFlex
        return keep[:, :, None]
    grid = (pixels.shape[-2] // patch_hw[0], pixels.shape[-1] // patch_hw[1])
    pixel_mask = keep.reshape(-1, *grid).repeat_interleave(patch_hw[0], 1).repeat_interleave(patch_hw[1], 2)
    return pixel_mask[:, None]  # (steps, 1, H, W)


def mean_colour(batch: dict[str, torch.Tensor], channels: int) -> torch.Tensor:
    """Each image's per-channel mean over its valid pixels, broadcastable to its `pixel_values` (a NaFlex batch:
    over its patches, not the padding; `channels` the model's)."""
    pixels = batch["pixel_values"]
    if pixels.dim() == 4:
        return pixels.mean(dim=(2, 3), keepdim=True)  # (B, C, 1, 1)
    mask = batch["pixel_attention_mask"].to(pixels.dtype)[:, :, None, None]  # (B, N, 1, 1)
    values = pixels.reshape(*pixels.shape[:2], -1, channels)  # (B, N, patch_h * patch_w, C)
    mean = (values * mask).sum(dim=(1, 2), keepdim=True) / (
        mask.sum(dim=(1, 2), keepdim=True) * values.shape[2]
    )
    return mean.expand_as(values).reshape(pixels.shape)  # (B, N, patch_h * patch_w * C)


def check_graph_batch(path: Any, graph_inputs: Any, batch: dict[str, torch.Tensor]) -> None:
    """A ValueError where the batch (its input names) is not of the kind the graph at `path` takes (its input
    names `graph_inputs`): NaFlex batches for a NaFlex graph, `(batch, channels, height, width)` pixels otherwise."""
    patches = is_naflex_batch(dict.fromkeys(graph_inputs))
    if patches != is_naflex_batch(batch):
        takes = (f"NaFlex batches ({', '.join(NAFLEX_INPUTS)}), as its folder's {PROCESSOR_FILE} makes them "
                 "(OnnxClassifier.from_folder)" if patches else "(batch, channels, height, width) pixels")
        raise ValueError(f"{path} takes {takes}; it was given {', '.join(sorted(batch))}: preprocess "
                         "the images with the transform of the model it was exported from.")  # fmt: skip


def graph_input_words(inputs: tuple[str, ...], max_num_patches: int | None) -> str | None:
    """What an exported graph's `inputs` take, in words, where its model has a patch budget (`max_num_patches`):
    None for a graph of images (whose sizes the exporter states)."""
    if max_num_patches is None:
        return None
    return (f"NaFlex inputs ({', '.join(inputs)}) of any aspect ratio and patch count, its processor making at "
            f"most {max_num_patches} patches")  # fmt: skip


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


class GraphLogits(torch.nn.Module):
    """The classifier as the graph exposes it: its inputs (`pixel_values`, and a NaFlex batch's mask and grid
    shapes) -> logits, for tracing its ONNX graph. The model checks a batch's values only when it runs eagerly."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None = None,
        spatial_shapes: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        given = {"pixel_attention_mask": pixel_attention_mask, "spatial_shapes": spatial_shapes}
        return self.model(pixel_values=pixel_values, **{k: v for k, v in given.items() if v is not None}).logits


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


__all__ = [
    "NAFLEX_ASPECTS",
    "NAFLEX_INPUTS",
    "GraphLogits",
    "GraphTrace",
    "InputSpec",
    "check_batches",
    "check_graph_batch",
    "expand_patch_mask",
    "graph_input_words",
    "graph_traces",
    "input_spec",
    "is_naflex_batch",
    "mean_colour",
    "patch_budget",
    "patch_grids",
    "patch_image_processor",
    "patch_window",
    "per_patch",
    "valid_patches",
]
