"""What a model expects of its input, read from its training images: their size, colours and background
(`describe_input`, kept in the feature bank), and the sentence the tools and the demo say it in
(`expected_input_text`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data.images import load_image

INPUT_SAMPLE = 256  # training images read to describe the expected input (size, colours, background)


def describe_input(images: Sequence[Any], limit: int = INPUT_SAMPLE) -> dict[str, Any]:
    """What the training images look like, from up to `limit` of them (decoded to RGB, as the model sees them):
    the median size `[width, height]`, whether they are grey (every pixel's channels equal), and their background (the border pixels' mean
    brightness, 0-255: "dark" below 85, "light" above 170, else "mixed")."""
    sizes, grey, borders = [], True, []
    for image in list(images)[:limit]:
        try:
            img = load_image(image)
        except Exception:  # noqa: BLE001 - an image that does not decode says nothing
            continue
        sizes.append(img.size)
        pixels = np.asarray(img.convert("RGB"), dtype=np.float32)
        grey = grey and bool(np.ptp(pixels, axis=-1).max() <= 8)  # JPEG noise aside, R = G = B
        edge = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        borders.append(float(edge.mean()))
    if not sizes:
        return {}
    brightness = float(np.mean(borders))
    background = "dark" if brightness < 85 else "light" if brightness > 170 else "mixed"
    return {"size": [int(np.median([s[0] for s in sizes])), int(np.median([s[1] for s in sizes]))],
            "colours": "grey" if grey else "colour", "background": background,
            "border_brightness": round(brightness, 1), "images_read": len(sizes)}  # fmt: skip


def expected_input_text(expected: dict[str, Any], model_size: Sequence[int] | None = None) -> str:
    """One sentence on the input a model expects: "grey images about 32x32 pixels on a dark background"."""
    if not expected:
        size = (
            f"{model_size[1]}x{model_size[0]} pixels (the model's input size)" if model_size else "any size"
        )
        return f"images like its training images, resized to {size}"
    width, height = expected["size"]
    background = {"dark": "on a dark background", "light": "on a light background"}.get(
        expected["background"], ""
    )
    colours = "grey images" if expected["colours"] == "grey" else "colour images"
    return " ".join(part for part in (colours, f"of about {width}x{height} pixels", background) if part)


__all__ = ["INPUT_SAMPLE", "describe_input", "expected_input_text"]
