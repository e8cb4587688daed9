"""The image processor an exported or shared model carries: the fine-tune's normalisation (ViT's defaults where
the folder has none) with the geometry of our evaluation, so that transformers' processor gives the pixels vit-ft
evaluates on (`evaluation_image_processor`: resize the shorter side and centre-crop; for a NaFlex model its input
spec's `patch_image_processor`, at its patch budget). Both exports write it (`write_image_processor`: the ONNX
folder, the Hub repository in either format)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ...data.input_spec import patch_image_processor
from ...model.export import NORMALISATION_KEYS
from ...utils.run_record import PROCESSOR_FILE
from ..trained import Origin

logger = logging.getLogger("vit_ft")


def vit_image_processor(origin: Origin):
    """The fine-tune's image processor (at its resolution), or None when the folder has none."""
    from transformers import ViTImageProcessorPil

    if origin.processor is None:
        logger.warning("No %s in %s: sharing ViT's default image processor.", PROCESSOR_FILE, origin.name)
        return None
    return ViTImageProcessorPil(**_normalisation(origin.processor))


def _normalisation(settings: dict[str, Any] | None) -> dict[str, Any]:
    """The rescale / normalisation / resampling of image processor `settings` (ViT's mean and std 0.5 where
    none are stated, as `data.input_spec.input_spec` reads them)."""
    from ...data.images import VIT_MEAN, VIT_STD

    found = {key: settings[key] for key in NORMALISATION_KEYS if key in (settings or {})}
    return {"image_mean": list(VIT_MEAN), "image_std": list(VIT_STD), **found}


def evaluation_image_processor(settings: dict[str, Any] | None, config: Any) -> Any:
    """The transformers image processor that preprocesses as our evaluation does for the model `config` describes
    (`data.transforms`' eval transform: resize the shorter side to the model's size, keeping the aspect ratio, then
    centre-crop it).

    A square size: `CLIPImageProcessorPil` (transformers' processor with a shortest-edge resize and a centre
    crop; ViT's own resizes to the size, squashing a non-square image). PIL resizes for both with the same
    filter and both round the resized side and the crop's offset down (`data.images.cover_size`), so the pixels
    are ours on every image size. A non-square size (no shortest-edge resize covers it):
    ViT's processor at that size, with a warning that it squashes. A model whose input spec makes patches rather
    than pixels: that spec's processor (`data.input_spec.patch_image_processor`)."""
    from transformers import CLIPImageProcessorPil, ViTImageProcessorPil

    height, width = tuple(config.image_hw)
    pixels = {**_normalisation(settings), "do_convert_rgb": True}
    own = patch_image_processor(pixels, config)
    if own is not None:
        return own
    if height == width:
        return CLIPImageProcessorPil(
            **pixels,
            do_resize=True,
            size={"shortest_edge": height},
            do_center_crop=True,
            crop_size={"height": height, "width": width},
        )
    logger.warning(
        "The model's resolution %dx%d is not square: its image processor resizes to it (squashing another "
        "aspect ratio), where vit-ft's evaluation resizes and centre-crops.",
        height,
        width,
    )
    return ViTImageProcessorPil(**pixels, size={"height": height, "width": width})


def write_staged_processor(origin: Origin, staging: Path) -> None:
    """The processor, resizing to the staged model's resolution whatever the folder's processor said."""
    from ...model.configuration_vit_ft import ViTFTConfig

    write_image_processor(origin, staging, ViTFTConfig.from_pretrained(staging))


def write_image_processor(origin: Origin, folder: Path, config: Any) -> None:
    """The image processor a shared or exported model carries in `folder`: the fine-tune's normalisation (ViT's
    defaults when the folder has none), resizing and centre-cropping to the resolution of the model's `config`, or
    for a NaFlex model its patch budget, as our evaluation does (`evaluation_image_processor`)."""
    if origin.processor is None:
        logger.warning("No %s in %s: sharing ViT's default normalisation.", PROCESSOR_FILE, origin.name)
    processor = evaluation_image_processor(origin.processor, config)
    processor.save_pretrained(folder)


__all__ = [
    "evaluation_image_processor",
    "vit_image_processor",
    "write_image_processor",
    "write_staged_processor",
]
