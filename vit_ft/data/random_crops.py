"""The training crop: torchvision's RandomResizedCrop box, drawn on the image's header before decoding, and the
image decoded for that crop (a JPEG at the largest draft reduction that keeps the crop a downscale), its EXIF
orientation applied to the small result only. Pure PIL / torch, no torchvision."""

from __future__ import annotations

import math

import torch
from PIL import Image

from .images import (
    DEFAULT_MAX_PIXELS,
    ImageSource,
    describe_source,
    is_remote,
    load_image,
    open_local,
    open_target,
    to_rgb,
)

__all__ = ["CROP_RATIO", "CROP_SCALE", "random_resized_crop", "random_resized_crop_box"]

# Inception-style random-resized-crop: area fraction and aspect-ratio ranges (torchvision's defaults)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)

# The Pillow transpose that `ImageOps.exif_transpose` applies for each EXIF orientation (1: none), and the
# inverse map of a point (x, y) of the displayed image back to the stored one of size (width, height).
_EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SHOWN_TO_STORED = {
    1: lambda x, y, width, height: (x, y),
    2: lambda x, y, width, height: (width - x, y),
    3: lambda x, y, width, height: (width - x, height - y),
    4: lambda x, y, width, height: (x, height - y),
    5: lambda x, y, width, height: (y, x),
    6: lambda x, y, width, height: (y, height - x),
    7: lambda x, y, width, height: (width - y, height - x),
    8: lambda x, y, width, height: (width - y, x),
}


def random_resized_crop(
    source: ImageSource,
    size: tuple[int, int],
    scale: tuple[float, float] = CROP_SCALE,
    ratio: tuple[float, float] = CROP_RATIO,
    resample: int = Image.Resampling.BICUBIC,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    generator: torch.Generator | None = None,
) -> Image.Image:
    """Decode `source` and return a random-resized crop of it as an 8-bit RGB image of `size` (height, width).

    The same crop as `load_image` followed by `random_resized_crop_box` on the displayed (EXIF-rotated) image
    and `resize(size, box=...)`, but decoded for that crop: the box is drawn on the header's size first, then
    a JPEG is decoded at the largest 1/2, 1/4 or 1/8 scale that keeps the crop at least `size` (Pillow draft
    mode). A large photo whose crop is a fraction of it is no longer decoded in full for a 224-pixel output.
    The crop is resized in the stored orientation and only the small result is rotated, which commutes with
    resampling. With draft=False the decode is full-size and the result matches the two-step path.
    The box is drawn from `generator` (torch's global RNG when None), see `random_resized_crop_box`.
    """
    height, width = size
    target = None if isinstance(source, Image.Image) else open_target(source)
    if target is None or (isinstance(target, str) and is_remote(target)):
        img = load_image(source, max_pixels=max_pixels)  # decoded already, or fetched whole: no draft to gain
        box = random_resized_crop_box(img.width, img.height, scale, ratio, generator)
        return img.resize((width, height), resample=resample, box=box)
    with open_local(target, max_pixels, describe_source(source)) as img:
        orientation = img.getexif().get(Image.ExifTags.Base.Orientation, 1)
        orientation = orientation if orientation in _SHOWN_TO_STORED else 1
        stored_width, stored_height = img.size
        swapped = orientation >= 5  # the displayed image is the stored one turned by 90 degrees
        shown_width, shown_height = img.size[::-1] if swapped else img.size
        left, top, right, bottom = random_resized_crop_box(shown_width, shown_height, scale, ratio, generator)
        to_stored = _SHOWN_TO_STORED[orientation]
        x0, y0 = to_stored(left, top, stored_width, stored_height)
        x1, y1 = to_stored(right, bottom, stored_width, stored_height)
        box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))  # in the stored image
        out_width, out_height = (height, width) if swapped else (width, height)
        if draft:
            reduction = min((box[2] - box[0]) / out_width, (box[3] - box[1]) / out_height)
            factor = next((f for f in (8, 4, 2) if reduction >= f), 1)
            if factor > 1:
                # Pillow picks the largest factor with size // request >= factor; floor division makes
                # that exactly `factor` (a ceil request can lose one step, e.g. 1500 // 188 = 7 -> 4).
                request = (max(1, stored_width // factor), max(1, stored_height // factor))
                drafted = img.draft("RGB", request)  # JPEG only; None for other formats
                if drafted is not None:
                    # 1, 2, 4 or 8: decoded pixel = stored pixel / factor
                    factor = stored_width / drafted[1][2]
                    box = tuple(coordinate / factor for coordinate in box)
        img.load()
        rgb = to_rgb(img)
    out = rgb.resize((out_width, out_height), resample=resample, box=box)
    return out.transpose(_EXIF_TRANSPOSE[orientation]) if orientation != 1 else out


def random_resized_crop_box(
    width: int,
    height: int,
    scale: tuple[float, float] = CROP_SCALE,
    ratio: tuple[float, float] = CROP_RATIO,
    generator: torch.Generator | None = None,
) -> tuple[float, float, float, float]:
    """Crop box (left, top, right, bottom) drawn like torchvision's `RandomResizedCrop.get_params`.

    Area fraction uniform in `scale`, aspect ratio (width / height) log-uniform in `ratio`, 10 tries, then
    a centre crop clamped to `ratio`. Unlike torchvision the box is not rounded to whole pixels: Pillow's
    `resize(box=...)` samples sub-pixel boxes exactly, which keeps crops of small images (8x8 digits, 32x32
    CIFAR) as varied as crops of photos, where rounding makes no difference. Draws from `generator`, or from
    torch's global RNG when None (`torch.manual_seed` / `transformers.set_seed` make that reproducible). The
    fine-tune passes a generator seeded per (seed, epoch, sample) so that a resumed run replays the crops
    (see `vit_ft.data.transforms.ImageClassificationTransform`).
    """
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = math.exp(
            torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator).item()
        )
        w = math.sqrt(target_area * aspect_ratio)
        h = math.sqrt(target_area / aspect_ratio)
        if 0 < w <= width and 0 < h <= height:
            top = torch.empty(1).uniform_(0, height - h, generator=generator).item()
            left = torch.empty(1).uniform_(0, width - w, generator=generator).item()
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, width / min(ratio)
    elif in_ratio > max(ratio):
        w, h = height * max(ratio), height
    else:
        w, h = width, height
    top, left = (height - h) / 2, (width - w) / 2
    return left, top, left + w, top + h
