"""How often the feature bank's out-of-distribution score flags the test split and four foreign sets (issue 35):
noise, inverted digits, scikit-learn's sample photos (random crops) and the benchmark's synthetic photos.

    python -m benchmarks.ood --model outputs/digits            # the table of docs/tools.md, as JSON lines

Targets on digits: at most 5 % of the test split flagged, at least 90 % of each foreign set.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from .data import synthetic_photo

TARGETS = {"test": ("at most", 0.05), "foreign": ("at least", 0.90)}


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def noise_images(count: int, size: int = 32, seed: int = 0) -> list[bytes]:
    """Uniform RGB noise, `size` pixels a side."""
    rng = np.random.default_rng(seed)
    return [png(Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))) for _ in range(count)]


def inverted_images(images: Sequence[Any]) -> list[bytes]:
    """The images (paths or {"bytes", "path"} values) with every pixel inverted: dark strokes on light."""
    from vit_ft.data.images import load_image

    return [png(ImageOps.invert(load_image(image))) for image in images]


def sample_photo_crops(count: int, seed: int = 0) -> list[bytes]:
    """scikit-learn's two sample photos (china, flower) whole, then random square crops of 16 to 320 pixels."""
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(array) for array in load_sample_images().images]
    rng = np.random.default_rng(seed)
    crops = [png(photo) for photo in photos]
    while len(crops) < count:
        photo = photos[int(rng.integers(len(photos)))]
        side = int(rng.integers(16, 321))
        x, y = int(rng.integers(photo.width - side)), int(rng.integers(photo.height - side))
        crops.append(png(photo.crop((x, y, x + side, y + side))))
    return crops


def synthetic_photos(count: int, seed: int = 0) -> list[bytes]:
    """`benchmarks.data.synthetic_photo` JPEGs of 32 to 256 pixels a side."""
    rng = np.random.default_rng(seed)
    return [synthetic_photo(int(rng.integers(32, 257)), int(rng.integers(32, 257)), seed + i) for i in range(count)]


def flagged_fraction(trained: Any, scorer: Any, images: Sequence[Any]) -> float:
    """The fraction of `images` the scorer marks unlike the training images."""
    from vit_ft.tools.inference import iter_batches

    flags = []
    for batch in iter_batches(trained, list(images), 64, 0, "Scoring", False, scorer.forward):
        if batch.decoded:
            flags.extend(scorer.last[1].tolist())
    return float(np.mean(flags))


def measure(model: str, count: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """One row per set: its name, size, fraction flagged and the target it is held to."""
    from vit_ft.tools.evaluate.data import resolve_eval_data
    from vit_ft.tools.ood import OODScorer
    from vit_ft.tools.trained import load_trained

    trained = load_trained(model, device="cpu")
    scorer = OODScorer.of(trained)
    if scorer.bank is None:
        raise ValueError(scorer.note())
    test = resolve_eval_data(trained.origin, trained.id2label).dataset["image"]
    sets = {
        "test": test,
        "noise": noise_images(count, seed=seed),
        "inverted digits": inverted_images(test),
        "sample photos": sample_photo_crops(count, seed),
        "synthetic photos": synthetic_photos(count, seed),
    }
    rows = []
    for name, images in sets.items():
        fraction = flagged_fraction(trained, scorer, images)
        how, target = TARGETS["test" if name == "test" else "foreign"]
        met = fraction <= target if how == "at most" else fraction >= target
        rows.append({"set": name, "images": len(images), "flagged": round(fraction, 4),
                     "target": f"{how} {target:.0%}", "met": met})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="outputs/digits")
    parser.add_argument("--count", type=int, default=200, help="images per generated set")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for row in measure(args.model, args.count, args.seed):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
