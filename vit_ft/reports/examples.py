"""A few images of the validation split in the output folder's `examples/`, for the demo and the Hub widget."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import datasets

from ..data.images import load_image
from ..utils.files import file_stem, staged_folder
from ..utils.progress import Progress
from ..utils.run_record import EXAMPLES_DIR

logger = logging.getLogger("vit_ft")

MAX_EXAMPLES = 8  # images in examples/: enough to try the demo, little to upload
MAX_CLASS_EXAMPLES = (
    20  # up to this many classes, one example of each even beyond MAX_EXAMPLES (the demo's gallery)
)


def write_examples(
    dataset: datasets.Dataset, names: list[str], output_dir: Path, limit: int | None = None
) -> list[Path]:
    """A few images of `dataset` (the validation split) in `output_dir/examples/`, for the demo and the Hub.

    At most `limit` in all (default: MAX_EXAMPLES, or one per class up to MAX_CLASS_EXAMPLES classes) and `limit // classes` per class (at least one), taken in the split's order, which
    the data seed fixes: the same run writes the same files. Named `NN_<label>`: PNG up to 256 pixels a side,
    JPEG above (reduced to 512); an image that does not decode is skipped. The folder is written aside and
    renamed, replacing an older one; a label too long for a file name keeps a prefix and a short hash.
    """
    if limit is None:
        limit = max(MAX_EXAMPLES, min(len(names), MAX_CLASS_EXAMPLES))
    rows = dataset.with_format(None)  # the stored images, not the eval transform's tensors
    per_class = max(1, limit // max(1, len(names)))
    chosen: list[int] = []
    counts = [0] * len(names)
    stems: dict[int, str] = {}
    for row, label in enumerate(rows["label"]):
        key, stems[row] = _example_label(label, names)
        if counts[key] < per_class:
            counts[key] += 1
            chosen.append(row)
            if len(chosen) == limit:
                break
    folder = output_dir / EXAMPLES_DIR
    written: list[str] = []
    logger.info("Examples: %d validation images (up to %d a class) into %s.", len(chosen), per_class, folder)
    with staged_folder(folder) as partial, Progress(len(chosen), "Examples") as progress:
        for row in chosen:
            progress.update()
            try:
                image = load_image(rows[row]["image"])
            except Exception as error:  # noqa: BLE001 - an example is optional: one that fails is left out
                logger.warning("Example image %d not written: %s", row, error)
                continue
            label = file_stem(stems[row])  # a 255-byte class name stays a valid file name
            stem = f"{len(written):02d}_{label}"
            if max(image.size) <= 256:
                image.save(partial / f"{stem}.png")
                written.append(f"{stem}.png")
            else:
                image.thumbnail((512, 512))
                image.save(partial / f"{stem}.jpg", quality=90)
                written.append(f"{stem}.jpg")
    return [folder / name for name in written]


def _example_label(label: Any, names: list[str]) -> tuple[int, str]:
    """(the class an example counts for, its file-name label): a class id; or a multi-hot vector, counted for
    its first label and named by all of them ("3+7"; "no-label" for an all-negative image)."""
    if not isinstance(label, (list, tuple)):
        return int(label), names[int(label)]
    present = [j for j, value in enumerate(label) if value > 0]
    return (present[0] if present else 0), "+".join(names[j] for j in present) or "no-label"


__all__ = ["MAX_CLASS_EXAMPLES", "MAX_EXAMPLES", "write_examples"]
