import io
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFilter

from vit_ft.data.images import (
    DEFAULT_MAX_PIXELS,
    center_crop_box,
    cover_size,
    load_image,
    resize_and_center_crop,
    to_normalized_tensor,
    to_rgb,
)
from vit_ft.data.random_crops import random_resized_crop, random_resized_crop_box


def smooth_photo(width: int, height: int) -> Image.Image:
    """A photo-like RGB image: smooth gradients plus blurred shapes (no noise, as a camera's JPEG)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    x, y = x / width, y / height
    rgb = np.stack([255 * x, 255 * y, 127 + 100 * np.sin(6 * x + 4 * y)], axis=-1)
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    draw.ellipse((0.2 * width, 0.2 * height, 0.5 * width, 0.6 * height), fill=(240, 200, 40))
    draw.rectangle((0.6 * width, 0.3 * height, 0.85 * width, 0.8 * height), fill=(30, 60, 150))
    draw.ellipse((0.55 * width, 0.05 * height, 0.7 * width, 0.25 * height), fill=(200, 30, 30))
    return img.filter(ImageFilter.GaussianBlur(radius=4))


def encode(img: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels but holds no pixel data (a decompression-bomb stand-in)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def gray_values(img: Image.Image) -> list[int]:
    """The pixels of a one-row RGB image whose channels are equal, as one gray value each."""
    array = np.asarray(img)
    assert (array == array[..., :1]).all(), f"channels differ: {array.tolist()}"
    return array[0, :, 0].tolist()


# ---- to_rgb -------------------------------------------------------------------------------------------


def test_to_rgb_returns_rgb_images_unchanged():
    img = Image.new("RGB", (3, 2), (10, 20, 30))
    assert to_rgb(img) is img


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (np.array([[0, 1000, 32896, 65535]], dtype=np.uint16), [0, 4, 128, 255]),  # I;16: /257, not clipped
        (np.array([[0, 1000, 32896, 65535]], dtype=np.int32), [0, 4, 128, 255]),  # I holding 16-bit data
        (np.array([[0, 128, 255]], dtype=np.int32), [0, 128, 255]),  # I holding 8-bit data
        (np.array([[-100, 0, 155]], dtype=np.int32), [0, 100, 255]),  # I, other range: min-max
        (np.array([[0.0, 0.5, 1.0]], dtype=np.float32), [0, 128, 255]),  # F fractions
        (np.array([[0.0, 1000.0, 65535.0]], dtype=np.float32), [0, 4, 255]),  # F 16-bit range
    ],
)
def test_to_rgb_scales_high_bit_depth_to_8_bits(array, expected):
    img = Image.fromarray(array)
    assert img.mode in ("I;16", "I", "F")
    rgb = to_rgb(img)
    assert rgb.mode == "RGB"
    assert gray_values(rgb) == expected


def test_to_rgb_composites_alpha_on_white():
    rgba = np.array([[[255, 0, 0, 0], [0, 0, 255, 255], [0, 0, 0, 128]]], dtype=np.uint8)
    rgb = np.asarray(to_rgb(Image.fromarray(rgba)))
    assert rgb[0, 0].tolist() == [255, 255, 255]  # fully transparent -> background, not the hidden red
    assert rgb[0, 1].tolist() == [0, 0, 255]
    assert abs(int(rgb[0, 2, 0]) - 127) <= 1  # half-transparent black over white


def test_to_rgb_handles_palette_with_transparency_via_png():
    img = Image.new("P", (2, 1))
    img.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    img.putpixel((0, 0), 0)
    img.putpixel((1, 0), 1)
    reloaded = Image.open(io.BytesIO(encode(img, "PNG", transparency=0)))
    assert reloaded.mode == "P" and "transparency" in reloaded.info
    assert np.asarray(to_rgb(reloaded)).tolist() == [[[255, 255, 255], [0, 0, 255]]]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Image.fromarray(np.array([[0, 100, 255]], dtype=np.uint8)), [[0] * 3, [100] * 3, [255] * 3]),
        (lambda: Image.fromarray(np.array([[[50, 0], [50, 255]]], dtype=np.uint8)), [[255] * 3, [50] * 3]),
        (lambda: Image.frombytes("1", (8, 1), bytes([0b01000000])), [[0] * 3, [255] * 3] + [[0] * 3] * 6),
        (
            lambda: Image.frombytes("CMYK", (2, 1), bytes([0, 0, 0, 0, 0, 255, 255, 0])),
            [[255] * 3, [255, 0, 0]],
        ),
    ],
    ids=["L", "LA", "1", "CMYK"],
)
def test_to_rgb_converts_common_modes(make, expected):
    img = make()
    rgb = to_rgb(img)
    assert rgb.mode == "RGB" and rgb.size == img.size
    assert np.asarray(rgb)[0].tolist() == expected


# ---- load_image -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode_image", "fmt"),
    [
        (lambda: Image.new("L", (4, 3), 90), "PNG"),
        (lambda: Image.new("LA", (4, 3), (90, 255)), "PNG"),
        (lambda: Image.new("RGBA", (4, 3), (90, 90, 90, 255)), "PNG"),
        (lambda: Image.new("RGB", (4, 3), (90, 90, 90)).convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        (lambda: Image.new("CMYK", (4, 3), (165, 165, 165, 0)), "TIFF"),
        (lambda: Image.fromarray(np.full((3, 4), 90 * 257, dtype=np.uint16)), "PNG"),
        (lambda: Image.new("1", (4, 3), 1), "PNG"),
    ],
    ids=["L", "LA", "RGBA", "P", "CMYK", "I;16", "1"],
)
def test_load_image_decodes_every_mode_to_8bit_rgb(mode_image, fmt):
    img = mode_image()
    loaded = load_image(encode(img, fmt))
    assert loaded.mode == "RGB" and loaded.size == (4, 3)
    expected = 255 if img.mode == "1" else 90
    assert np.abs(np.asarray(loaded).astype(int) - expected).max() <= 1


def test_load_image_accepts_every_source_kind(tmp_path: Path):
    img = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    path = tmp_path / "a.png"
    img.save(path)
    data = path.read_bytes()
    sources = [
        path,
        str(path),
        data,
        io.BytesIO(data),
        {"bytes": data, "path": "ignored-when-bytes-are-set.png"},
        {"bytes": None, "path": str(path)},
        img,
    ]
    for source in sources:
        assert np.array_equal(np.asarray(load_image(source)), np.asarray(img)), source


def test_load_image_applies_exif_orientation(tmp_path: Path):
    # Stored 40 wide x 20 high, left half red; orientation 6 = "rotate 90 degrees clockwise to display".
    stored = np.zeros((20, 40, 3), dtype=np.uint8)
    stored[:, :20] = (255, 0, 0)
    stored[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[Image.ExifTags.Base.Orientation] = 6
    path = tmp_path / "rotated.jpg"
    Image.fromarray(stored).save(path, exif=exif, quality=95)
    for min_size in (None, 10):
        shown = np.asarray(load_image(path, min_size=min_size)).astype(int)
        height, width = shown.shape[:2]
        assert (width, height) == ((20, 40) if min_size is None else (10, 20))
        top, bottom = shown[height // 4, width // 2], shown[3 * height // 4, width // 2]
        assert top[0] > 200 and top[2] < 60, top  # the left (red) half is now on top
        assert bottom[2] > 200 and bottom[0] < 60, bottom


def test_load_image_leaves_callers_pil_image_untouched():
    exif = Image.Exif()
    exif[Image.ExifTags.Base.Orientation] = 6
    img = Image.open(io.BytesIO(encode(Image.new("RGB", (6, 2)), "JPEG", exif=exif)))
    assert load_image(img).size == (2, 6)
    assert img.size == (6, 2) and img.getexif()[Image.ExifTags.Base.Orientation] == 6


def test_load_image_rejects_images_over_max_pixels():
    small = encode(Image.new("RGB", (100, 60)), "PNG")
    with pytest.raises(ValueError, match="6,000 pixels is over max_pixels=5,000"):
        load_image(small, max_pixels=5000)
    assert load_image(small, max_pixels=None).size == (100, 60)


@pytest.mark.parametrize("side", [10_000, 100_000])  # above Pillow's warning limit; above its hard limit
def test_load_image_default_limit_stops_bombs_before_decoding(side):
    assert side * side > DEFAULT_MAX_PIXELS
    with pytest.raises(ValueError, match="max_pixels|MAX_IMAGE_PIXELS"):
        load_image(png_header_only(side, side))


def test_load_image_errors_on_missing_truncated_and_non_image_files(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="missing.png"):
        load_image(tmp_path / "missing.png")
    with pytest.raises(OSError, match="cannot identify"):
        load_image(b"not an image at all")
    data = encode(smooth_photo(64, 48), "JPEG")
    with pytest.raises(OSError, match="(?i)truncated"):
        load_image(data[: len(data) // 2])
    with pytest.raises(ValueError, match="neither 'bytes' nor 'path'"):
        load_image({"bytes": None, "path": None})


def test_draft_decoding_keeps_min_size_and_matches_full_decode(tmp_path: Path):
    path = tmp_path / "photo.jpg"
    smooth_photo(2000, 1500).save(path, quality=90)
    full = load_image(path)
    drafted = load_image(path, min_size=224)
    assert full.size == (2000, 1500)
    assert drafted.size == (500, 375)  # decoded at 1/4 scale: draft mode was used
    resized_full = np.asarray(resize_and_center_crop(full, (224, 224))).astype(float)
    resized_draft = np.asarray(resize_and_center_crop(drafted, (224, 224))).astype(float)
    assert np.abs(resized_full - resized_draft).mean() < 2.0


def test_draft_decoding_never_goes_below_min_size(tmp_path: Path):
    path = tmp_path / "photo.jpg"
    smooth_photo(800, 600).save(path, quality=85)
    for min_size in (1, 70, 75, 76, 149, 150, 151, 299, 300, 301, 599, 600, 601, 5000):
        width, height = load_image(path, min_size=min_size).size
        assert min(width, height) >= min(min_size, 600), min_size
        reduction = 800 // width
        # reduced as far as allowed: 1/8 is Pillow's limit, else the next halving would go below min_size
        assert reduction == 8 or math.ceil(600 / (2 * reduction)) < min_size, min_size


def two_step_crop(source, size: tuple[int, int], seed: int) -> np.ndarray:
    """The reference for `random_resized_crop`: full decode (EXIF applied), draw the box, resize it."""
    img = load_image(source)
    torch.manual_seed(seed)
    box = random_resized_crop_box(img.width, img.height)
    return np.asarray(img.resize(size[::-1], resample=Image.Resampling.BICUBIC, box=box)).astype(float)


def crop(source, size: tuple[int, int], seed: int, draft: bool) -> np.ndarray:
    torch.manual_seed(seed)
    return np.asarray(random_resized_crop(source, size, draft=draft)).astype(float)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_random_resized_crop_matches_full_decode_for_every_exif_orientation(tmp_path: Path, orientation):
    # Stored 360 x 240 with the orientation tag: the crop is drawn on the displayed image (240 x 360 when
    # the tag turns it by 90 degrees) and must show the same pixels as decoding, rotating, then cropping.
    exif = Image.Exif()
    exif[Image.ExifTags.Base.Orientation] = orientation
    path = tmp_path / "photo.jpg"
    smooth_photo(360, 240).save(path, quality=95, exif=exif)
    for seed in range(4):
        for size in [(24, 40), (20, 20)]:  # (height, width); crops of 8-100% area, so drafts at 1/2..1/8
            reference = two_step_crop(path, size, seed)
            exact = crop(path, size, seed, draft=False)
            assert exact.shape == reference.shape == (*size, 3)
            assert np.abs(exact - reference).max() <= 1, (seed, size)  # resize and rotation commute
            drafted = crop(path, size, seed, draft=True)
            assert np.abs(drafted - reference).mean() < 2.0, (seed, size)


def test_random_resized_crop_decodes_at_the_largest_scale_the_crop_allows(tmp_path: Path, monkeypatch):
    from PIL import JpegImagePlugin

    path = tmp_path / "photo.jpg"
    smooth_photo(2000, 1500).save(path, quality=90)
    factors = []
    real_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        result = real_draft(self, mode, size)
        factors.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    for seed in range(40):
        torch.manual_seed(seed)
        left, top, right, bottom = random_resized_crop_box(2000, 1500)
        reduction = min(right - left, bottom - top) / 224
        expected = max((f for f in (1, 2, 4, 8) if f <= reduction), default=1)
        factors.clear()
        out = crop(path, (224, 224), seed, draft=True)
        decoded = factors[0] if factors else (2000, 1500)  # no draft call: a full decode
        assert decoded == (math.ceil(2000 / expected), math.ceil(1500 / expected)), (seed, reduction)
        assert out.shape == (224, 224, 3)
        assert np.abs(out - two_step_crop(path, (224, 224), seed)).mean() < 2.0, seed


def test_random_resized_crop_takes_every_source_kind(tmp_path: Path):
    img = smooth_photo(96, 64)
    data = encode(img, "PNG")
    path = tmp_path / "photo.png"
    path.write_bytes(data)
    reference = two_step_crop(img, (16, 16), seed=3)
    for source in (img, data, path, str(path), {"bytes": data, "path": None}, io.BytesIO(data)):
        assert np.array_equal(crop(source, (16, 16), seed=3, draft=True), reference), type(source)
    with pytest.raises(ValueError, match="max_pixels"):
        random_resized_crop(data, (16, 16), max_pixels=1000)


# ---- geometry and normalisation ------------------------------------------------------------------------


def test_random_resized_crop_box_follows_scale_and_ratio():
    torch.manual_seed(0)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(300, 200, scale=(0.2, 0.6), ratio=(3 / 4, 4 / 3))
        assert 0 <= left < right <= 300 and 0 <= top < bottom <= 200
        width, height = right - left, bottom - top
        assert 0.2 - 0.02 <= width * height / (300 * 200) <= 0.6 + 0.02
        assert 3 / 4 - 0.05 <= width / height <= 4 / 3 + 0.05


def test_random_resized_crop_box_is_seeded_and_random():
    torch.manual_seed(1)
    first = [random_resized_crop_box(500, 400) for _ in range(5)]
    torch.manual_seed(1)
    again = [random_resized_crop_box(500, 400) for _ in range(5)]
    assert first == again
    assert len(set(first)) > 1


def test_random_resized_crop_draws_from_the_generator_given():
    def generator(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    jpeg = {"bytes": encode(smooth_photo(96, 64), "JPEG"), "path": "photo.jpg"}
    torch.manual_seed(7)
    before = torch.get_rng_state()
    boxes = [random_resized_crop_box(500, 400, generator=generator(seed)) for seed in (1, 1, 2)]
    crops = [np.asarray(random_resized_crop(jpeg, (24, 24), generator=generator(seed))) for seed in (1, 2)]
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is left alone
    assert boxes[0] == boxes[1] != boxes[2]
    assert not np.array_equal(crops[0], crops[1])
    # the same draws as from the global RNG seeded alike
    torch.manual_seed(1)
    assert random_resized_crop_box(500, 400) == boxes[0]
    torch.manual_seed(1)
    assert np.array_equal(np.asarray(random_resized_crop(jpeg, (24, 24))), crops[0])


def test_random_resized_crop_box_falls_back_to_center_crop():
    # A 1000x10 strip: no crop with aspect ratio <= 4/3 and area >= 8% fits, so the fallback runs.
    torch.manual_seed(0)
    assert random_resized_crop_box(1000, 10) == pytest.approx(
        (500 - 20 / 3, 0, 500 + 20 / 3, 10)
    )  # 10 * 4/3 wide
    assert random_resized_crop_box(10, 1000) == pytest.approx(
        (0, 500 - 20 / 3, 10, 500 + 20 / 3)
    )  # 10 / (3/4) high


def test_random_resized_crop_box_is_sub_pixel_on_small_images():
    torch.manual_seed(0)
    boxes = [random_resized_crop_box(8, 8, scale=(0.7, 1.0)) for _ in range(50)]
    for left, top, right, bottom in boxes:
        assert 0 <= left < right <= 8 and 0 <= top < bottom <= 8
        assert 0.7 * 64 * 0.999 <= (right - left) * (bottom - top) <= 64 * 1.001
    assert len({round(b[0], 3) for b in boxes}) > 20  # continuous offsets, not 1-2 whole-pixel positions


def test_resize_and_center_crop_matches_resize_shorter_side_then_crop():
    img = smooth_photo(300, 200)
    out = resize_and_center_crop(img, (100, 100))
    manual = img.resize((150, 100), Image.Resampling.BICUBIC).crop((25, 0, 125, 100))
    assert np.array_equal(np.asarray(out), np.asarray(manual))


@pytest.mark.parametrize(
    ("source_size", "target"), [((300, 200), (64, 160)), ((200, 300), (160, 64)), ((50, 40), (30, 90))]
)
def test_resize_and_center_crop_covers_non_square_targets(source_size, target):
    out = resize_and_center_crop(smooth_photo(*source_size), target)
    assert out.size == (target[1], target[0])


# (width, height) where rounding to nearest (our rule before) and down (transformers') disagree, and some where not
ROUNDING_SIZES = [(45, 29), (29, 61), (33, 47), (61, 29), (47, 33), (9, 10), (50, 30), (64, 64), (13, 200)]


@pytest.mark.parametrize("width, height", ROUNDING_SIZES)
@pytest.mark.parametrize("shortest_edge", [16, 32, 224])
def test_cover_size_and_crop_offset_round_as_transformers(width, height, shortest_edge):
    from transformers.image_transforms import get_resize_output_image_size

    image = np.zeros((height, width, 3), dtype=np.uint8)
    expected_height, expected_width = get_resize_output_image_size(image, shortest_edge, default_to_square=False)
    assert cover_size(width, height, (shortest_edge, shortest_edge)) == (expected_width, expected_height)
    # transformers' crop offset on the resized image: (side - crop) // 2 (`image_transforms.center_crop`)
    left, top = (expected_width - shortest_edge) // 2, (expected_height - shortest_edge) // 2
    box = (left, top, left + shortest_edge, top + shortest_edge)
    assert center_crop_box(expected_width, expected_height, shortest_edge, shortest_edge) == box


@pytest.mark.parametrize("width, height", ROUNDING_SIZES)
def test_resize_and_center_crop_gives_clip_processor_pixels(width, height):
    from transformers import CLIPImageProcessorPil

    size = 32
    processor = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}, image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )  # fmt: skip
    # noise: a one-pixel shift of the resize or the crop changes every value
    img = Image.fromarray(np.random.default_rng(width * height).integers(0, 256, (height, width, 3), np.uint8))
    ours = to_normalized_tensor(resize_and_center_crop(img, (size, size)), [0.5] * 3, [0.5] * 3)
    theirs = processor(img, return_tensors="pt")["pixel_values"][0]
    assert theirs.shape == ours.shape and (theirs - ours).abs().max().item() <= 1e-5


@pytest.mark.parametrize("crop_pct, expected", [(1.0, (240, 160)), (0.875, (273, 182)), (0.9, (265, 177))])
def test_cover_size_floors_the_crop_fraction_as_timm(crop_pct, expected):
    # timm's eval transform: the shorter side floor(160 / crop_pct) (182, 177), the longer 1.5 times it, down
    assert cover_size(300, 200, (160, 160), crop_pct) == expected


@pytest.mark.parametrize("size", [(64, 160), (160, 64), (30, 90), (100, 100)])
@pytest.mark.parametrize("width, height", [(300, 200), (200, 300), (50, 40), (45, 29)])
def test_cover_size_covers_every_target(width, height, size):
    new_width, new_height = cover_size(width, height, size)
    assert new_width >= size[1] and new_height >= size[0]
    assert new_width == size[1] or new_height == size[0]  # one side binds: no larger than needed


def test_resize_and_center_crop_pct_crops_the_centre():
    out = resize_and_center_crop(smooth_photo(256, 256), (224, 224), crop_pct=0.875)
    assert out.size == (224, 224)
    assert np.array_equal(
        np.asarray(out), np.asarray(smooth_photo(256, 256).crop(center_crop_box(256, 256, 224, 224)))
    )


def test_to_normalized_tensor_matches_numpy():
    array = np.random.default_rng(0).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tensor = to_normalized_tensor(Image.fromarray(array), mean, std)
    expected = ((array.astype(np.float32) / 255 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)
    assert tensor.shape == (3, 5, 7) and tensor.dtype == torch.float32 and tensor.is_contiguous()
    assert np.allclose(tensor.numpy(), expected, atol=1e-5)
    assert math.isclose(float(tensor.max()), float(expected.max()), rel_tol=1e-5)
