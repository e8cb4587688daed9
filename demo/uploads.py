"""The demo's uploads: a file checked and decoded, or one visible line that says what is wrong with it (not an
image, too many pixels: a decompression bomb, damaged), never a server traceback."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import gradio as gr
from PIL import Image, UnidentifiedImageError

from vit_ft.data.images import load_image

logger = logging.getLogger("vit_ft")


def open_upload(upload: str | dict | None, min_size: int, max_pixels: int | None) -> Image.Image:
    """The upload as 8-bit RGB, or a `gr.Error` that tells the user what is wrong with it.

    `upload` is a path, or Gradio's file payload {"path", "orig_name", ...}: the app's events run with
    `preprocess=False` because `gr.Image` would open the file with PIL first, and fail with a bare
    "Error" on a file that is not an image or is a decompression bomb. Gradio has checked by then that
    the path is one of its own uploads.
    """
    path = upload.get("path") if isinstance(upload, dict) else upload
    if path is None:
        raise rejected("No image yet: upload an image (JPEG, PNG, WebP, ...) or click an example.")
    name = (upload.get("orig_name") if isinstance(upload, dict) else None) or Path(path).name
    try:
        # JPEGs are decoded at a reduced scale that still covers the display size (faster on big photos)
        return load_image(path, min_size=min_size, max_pixels=max_pixels)
    except UnidentifiedImageError:
        raise rejected(
            f"{name} is not an image file that can be read. Upload a JPEG, PNG, WebP, BMP, GIF or TIFF image."
        ) from None
    except ValueError as error:
        if "max_pixels" not in str(error):
            raise rejected(f"{name} cannot be used: {error}") from None
        size = header_size(path)
        found = f"{size[0]}x{size[1]} = {size[0] * size[1]:,} pixels" if size else "too many pixels"
        raise rejected(
            f"{name} is too large ({found}); this demo takes at most {max_pixels:,} pixels "
            "(a guard against decompression bombs). Downscale the image and upload it again."
        ) from None
    except Exception as error:  # noqa: BLE001 - truncated or corrupt files raise OSError, SyntaxError, ...
        raise rejected(
            f"{name} is damaged or truncated and cannot be decoded ({type(error).__name__}: {error}). "
            "Upload the complete file."
        ) from None


def rejected(message: str) -> gr.Error:
    """A visible error for a bad upload: the user's to fix, so no server traceback is printed."""
    logger.info("Rejected an upload: %s", message)
    return gr.Error(message, print_exception=False)


def header_size(path: str) -> tuple[int, int] | None:
    """Width and height from the file header (no pixels decoded); None when even the header is refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return img.size
    except Exception:  # noqa: BLE001 - Pillow refuses headers over 2x its own limit
        return None


__all__ = ["header_size", "open_upload", "rejected"]
