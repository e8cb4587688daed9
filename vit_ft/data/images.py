"""Image decoding and the evaluation geometry: any file -> 8-bit RGB PIL image -> resized and centre-cropped ->
normalised (channels, height, width). Pure PIL / numpy / torch, no torchvision; the training crop, decoded for
the crop it draws, is `random_crops`, and `transforms` builds the dataset-level transforms on these."""

from __future__ import annotations

import glob
import io
import logging
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from PIL import Image, ImageOps

from ..utils.limits import DEFAULT_MAX_PIXELS

logger = logging.getLogger("vit_ft")

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "RESCALE_FACTOR",
    "VIT_MEAN",
    "VIT_STD",
    "ImageSource",
    "center_crop_box",
    "collect_image_files",
    "cover_size",
    "describe_source",
    "image_extensions",
    "is_remote",
    "load_image",
    "open_local",
    "open_target",
    "resize_and_center_crop",
    "to_normalized_tensor",
    "to_uint8_tensor",
    "to_rgb",
]

# ViTImageProcessor's normalisation (google/vit-* checkpoints), for a model that comes without a processor
VIT_MEAN = (0.5, 0.5, 0.5)
VIT_STD = (0.5, 0.5, 0.5)
RESCALE_FACTOR = 1 / 255  # 8-bit pixels to [0, 1], as image processors rescale

# A path, raw encoded bytes, a binary file object, a `datasets.Image(decode=False)` value {"bytes", "path"},
# or an already decoded PIL image.
ImageSource = str | os.PathLike | bytes | IO[bytes] | dict | Image.Image

_WHITE = (255, 255, 255)
# Modes Pillow converts to RGB exactly (palette lookup, channel copy, CMYK/YCbCr/HSV formulas).
_DIRECT_TO_RGB = {"1", "L", "P", "CMYK", "YCbCr", "HSV", "RGBX"}
# Modes with an alpha channel, composited on white after a conversion to RGBA.
_WITH_ALPHA = {"RGBA", "RGBa", "LA", "La", "PA"}


def image_extensions() -> set[str]:
    """Lower-case file suffixes read as images: those of datasets' imagefolder builder (the training loader)."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return {ext.lower() for ext in ImageFolder.EXTENSIONS}


def describe_source(source: Any) -> str:
    """A short name for an image source, for error messages: the path when there is one."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, dict):
        if source.get("path"):
            return str(source["path"])
        data = source.get("bytes")
        return f"<{len(data)} bytes>" if data is not None else "<empty image value>"
    if isinstance(source, (bytes, bytearray)):
        return f"<{len(source)} bytes>"
    if isinstance(source, Image.Image):
        return f"<PIL image {source.mode} {source.width}x{source.height}>"
    return getattr(source, "name", None) or f"<{type(source).__name__}>"


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL image to 8-bit RGB; an RGB image without transparency is returned as is.

    - Transparency (RGBA, LA, PA, P or L/RGB with a transparent colour) is composited on white rather than
      dropped: dropping alpha exposes whatever colour sits under transparent pixels (often black), which
      turns e.g. a black logo on a transparent background into a black square.
    - High bit depth is scaled, never clipped: I;16* (16-bit) maps 0..65535 to 0..255. The modes I (int32)
      and F (float32) carry no nominal depth, so the range is read from each image: values in [0, 1]
      (F only) are fractions, in [0, 255] 8-bit, in [0, 65535] 16-bit, anything else is min-max scaled.
    """
    mode = img.mode
    if mode == "RGB" and "transparency" not in img.info:
        return img
    if mode in _WITH_ALPHA or "transparency" in img.info:
        rgba = img.convert("RGBA")
        background = Image.new("RGB", img.size, _WHITE)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if mode.startswith("I;16") or mode in ("I", "F"):
        return Image.fromarray(_high_depth_to_uint8(np.asarray(img), mode)).convert("RGB")
    if mode in _DIRECT_TO_RGB:
        return img.convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as error:
        raise ValueError(
            f"Cannot convert a {mode!r} image to RGB ({error}); supported modes are 1, L, LA, P, PA, RGB, RGBA, "
            "CMYK, YCbCr, HSV, I;16, I and F. Re-save the file as PNG or JPEG."
        ) from error


def _high_depth_to_uint8(array: np.ndarray, mode: str) -> np.ndarray:
    """Scale a 16-bit, int32 or float32 (height, width) array to uint8 (see `to_rgb` for the rules)."""
    values = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if mode.startswith("I;16"):
        scaled = values / 257.0  # 65535 / 257 == 255 exactly
    elif low >= 0 and high <= 1 and mode == "F":
        scaled = values * 255.0
    elif low >= 0 and high <= 255:
        scaled = values
    elif low >= 0 and high <= 65535:
        scaled = values / 257.0
    else:
        scaled = (values - low) * (255.0 / (high - low))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _check_pixels(size: tuple[int, int], max_pixels: int | None, name: str) -> None:
    if max_pixels is not None and size[0] * size[1] > max_pixels:
        raise ValueError(
            f"{name}: {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels is over max_pixels={max_pixels:,} "
            "(decompression-bomb guard). If the file is trusted, pass a larger max_pixels; otherwise remove it "
            "(vit_ft.data.bad_images.drop_bad_images lists and drops such files)."
        )


def _apply_exif_orientation(img: Image.Image, owned: bool) -> Image.Image:
    """Rotate/flip per the EXIF Orientation tag; in place when the image is ours, else on a copy."""
    if img.getexif().get(Image.ExifTags.Base.Orientation, 1) in (1, None):
        return img
    if owned:
        ImageOps.exif_transpose(img, in_place=True)
        return img
    return ImageOps.exif_transpose(img)


def open_target(source: ImageSource) -> str | IO[bytes]:
    """What to hand to `PIL.Image.open`; a remote URL (hf://, https://) comes back as the string."""
    if isinstance(source, dict):
        if source.get("bytes") is not None:
            return io.BytesIO(source["bytes"])
        if not source.get("path"):
            raise ValueError(
                f"Image value {source!r} has neither 'bytes' nor 'path'; the row holds no image."
            )
        source = source["path"]
    if isinstance(source, (bytes, bytearray)):
        return io.BytesIO(source)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.isfile(path) and not is_remote(path):
            raise FileNotFoundError(f"Image file {path!r} does not exist (or is not a file).")
        return path
    if hasattr(source, "read"):
        return source
    raise TypeError(
        f"Cannot load an image from a {type(source).__name__}; pass a path, bytes, a binary file object, "
        "a {'bytes', 'path'} dict (a datasets.Image(decode=False) value) or a PIL image."
    )


def is_remote(path: str) -> bool:
    return "://" in path and not os.path.exists(path)


def open_local(target: str | IO[bytes], max_pixels: int | None, name: str) -> Image.Image:
    """`Image.open` (header only, no pixels decoded yet) with the decompression-bomb check."""
    with warnings.catch_warnings():
        # Pillow warns above its own limit; the check below replaces the warning with a clear error.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(target)
        except Image.DecompressionBombError as error:
            raise ValueError(
                f"{name}: {error} If the file is trusted, raise PIL.Image.MAX_IMAGE_PIXELS and max_pixels; "
                "otherwise remove it (vit_ft.data.bad_images.drop_bad_images lists and drops such files)."
            ) from error
    try:
        _check_pixels(img.size, max_pixels, name)
    except ValueError:
        img.close()
        raise
    return img


def load_image(
    source: ImageSource,
    min_size: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Decode an image to 8-bit RGB with its EXIF orientation applied.

    Args:
        source: a path, raw bytes, a binary file object, a `datasets.Image(decode=False)` value
            {"bytes", "path"} (bytes win when both are set), or an already decoded PIL image.
        min_size: the smallest side length the caller needs. A JPEG at least twice that size on both sides
            is decoded at 1/2, 1/4 or 1/8 scale (Pillow draft mode, DCT-domain scaling: several times
            faster) with both sides kept >= min_size. None decodes at full size.
        max_pixels: decompression-bomb guard, checked on the header before any pixel is decoded;
            None disables it.

    Raises:
        ValueError: the image is over max_pixels or has an unsupported mode.
        OSError: the file is missing, unreadable or truncated (`PIL.UnidentifiedImageError` is one).
    """
    name = describe_source(source)
    if isinstance(source, Image.Image):
        _check_pixels(source.size, max_pixels, name)
        return to_rgb(_apply_exif_orientation(source, owned=False))
    target = open_target(source)
    if isinstance(target, str) and is_remote(target):
        import datasets  # fetches hf:// and http(s) paths with the user's Hub token; full-size decode

        img = datasets.Image().decode_example({"path": target, "bytes": None})
        _check_pixels(img.size, max_pixels, name)
        return to_rgb(img)
    with open_local(target, max_pixels, name) as img:
        if min_size is not None:
            img.draft("RGB", (min_size, min_size))  # JPEG only; a no-op for other formats
        img.load()
    return to_rgb(_apply_exif_orientation(img, owned=True))


def center_crop_box(width: int, height: int, crop_height: int, crop_width: int) -> tuple[int, int, int, int]:
    """Centred (left, top, right, bottom) box of size (crop_height, crop_width), its offset rounded down as
    transformers' image processors crop (`image_transforms.center_crop`: `(height - crop_height) // 2`)."""
    top = (height - crop_height) // 2
    left = (width - crop_width) // 2
    return left, top, left + crop_width, top + crop_height


def cover_size(width: int, height: int, size: tuple[int, int], crop_pct: float = 1.0) -> tuple[int, int]:
    """(width, height) of an image of (width, height) resized to cover `size` (height, width) / crop_pct with
    its aspect ratio kept: the side that binds gets floor(side / crop_pct) exactly, the other is rounded down
    (never below its target), as transformers' shortest-edge resize (`get_resize_output_image_size`:
    `int(short_target * long / short)`) and torchvision's Resize compute it. Integer arithmetic, so a size
    whose exact value is whole is never floored one pixel short by a float error."""
    target_height, target_width = (math.floor(side / crop_pct) for side in size)
    if target_height * width >= target_width * height:  # height's ratio is the larger: height binds
        return max(target_width, target_height * width // height), target_height
    return target_width, max(target_height, target_width * height // width)


def resize_and_center_crop(
    img: Image.Image,
    size: tuple[int, int],
    crop_pct: float = 1.0,
    resample: int = Image.Resampling.BICUBIC,
) -> Image.Image:
    """Evaluation geometry: resize so the image covers (height / crop_pct, width / crop_pct), keeping its
    aspect ratio (`cover_size`), then centre-crop (height, width) (`center_crop_box`).

    For a square target and crop_pct 1 these are the pixels of transformers' `CLIPImageProcessorPil` with a
    shortest-edge resize and a centre crop (the processor a push writes), on every image size: both round the
    resized side and the crop's offset down. For a non-square target the scale is the larger of the two side
    ratios, so the crop never needs padding.
    """
    height, width = size
    new_width, new_height = cover_size(img.width, img.height, size, crop_pct)
    if (new_width, new_height) != img.size:
        img = img.resize((new_width, new_height), resample=resample)
    return img.crop(center_crop_box(new_width, new_height, height, width))


def to_normalized_tensor(
    img: Image.Image,
    mean: Sequence[float],
    std: Sequence[float],
    rescale_factor: float = RESCALE_FACTOR,
) -> torch.Tensor:
    """8-bit RGB PIL image -> float32 (channels, height, width) tensor: (pixel * rescale_factor - mean) / std."""
    array = np.array(img, dtype=np.uint8)  # (height, width, channels), a writable copy for torch
    pixels = torch.from_numpy(array).permute(2, 0, 1)  # (channels, height, width)
    pixels = pixels.to(torch.float32, memory_format=torch.contiguous_format)
    mean_t = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return pixels.mul_(rescale_factor).sub_(mean_t).div_(std_t)


def to_uint8_tensor(img: Image.Image) -> torch.Tensor:
    """8-bit RGB PIL image -> uint8 (channels, height, width) tensor: what a DataLoader worker ships when the
    normalisation runs on the device (a quarter of float32's bytes). A channels-first view of the pixels, not a
    second copy: the collator's stack makes the batch contiguous."""
    array = np.array(img, dtype=np.uint8)  # (height, width, channels), a writable copy for torch
    return torch.from_numpy(array).permute(2, 0, 1)  # (channels, height, width)


def collect_image_files(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given (whatever their suffix: an unreadable one gets an error row), folders searched
    recursively for image suffixes in sorted order, skipping hidden entries. A pattern such as `photos/*.png`
    that the shell did not expand is expanded here. A path that does not exist is kept, so that it too gets an
    error row."""
    extensions = image_extensions()
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if not path.exists() and glob.has_magic(str(path)):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            if not matches:
                logger.warning("%s matches no file.", path)
            files.extend(collect_image_files(matches) if matches else [])
            continue
        if not path.is_dir():
            if not path.exists():
                logger.warning("%s does not exist; it gets an error row.", path)
            files.append(path)
            continue
        found = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in extensions
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
            and p.is_file()
        )
        if not found:
            logger.warning(
                "Folder %s holds no image files (%s, ...).", path, ", ".join(sorted(extensions)[:6])
            )
        files.extend(found)
    return files
