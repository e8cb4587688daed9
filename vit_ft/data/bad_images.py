"""Screening image files before training: find the rows whose image does not decode, and drop them.

`find_bad_images` lists them (missing files, non-images, truncated files, images over `max_pixels`);
`drop_bad_images` returns the dataset without them and logs what went.
A file that passes here decodes in the transform of `vit_ft.data.transforms.build_transforms`.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets

from .images import DEFAULT_MAX_PIXELS, describe_source, load_image

__all__ = ["drop_bad_images", "find_bad_images"]


def _decode_error(value: Any, max_pixels: int | None) -> str:
    """'' when the image decodes, else the reason."""
    if value is None:
        return "missing image (null value)"
    try:
        # min_size=1 lets JPEGs decode at 1/8 scale: libjpeg still reads the whole entropy-coded stream, so
        # truncation and unreadable headers are caught as in a full decode (tests check truncation).
        load_image(value, min_size=1, max_pixels=max_pixels)
    except Exception as error:  # any failure makes the file unusable
        return f"{type(error).__name__}: {error}"
    return ""


def _as_undecoded_images(dataset: datasets.Dataset, image_column: str) -> datasets.Dataset:
    """Only `image_column`, cast to `datasets.Image(decode=False)` so rows are {"bytes", "path"} dicts."""
    if image_column not in dataset.column_names:
        raise KeyError(
            f"image_column={image_column!r} is not a column of the dataset; columns: {dataset.column_names}."
        )
    feature = dataset.features[image_column]
    if not isinstance(feature, datasets.Image) and feature != datasets.Value("string"):
        raise TypeError(
            f"Column {image_column!r} holds {feature}, not images; pass the column that holds "
            "datasets.Image values (or file paths) as image_column."
        )
    return dataset.select_columns([image_column]).cast_column(image_column, datasets.Image(decode=False))


def find_bad_images(
    dataset: datasets.Dataset,
    image_column: str = "image",
    num_proc: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> list[tuple[int, str, str]]:
    """Rows whose image cannot be decoded: [(row index, path or identifier, reason), ...], in row order.

    The column is read as `datasets.Image(decode=False)` (paths/bytes) and each image decoded with
    `load_image` (JPEG at 1/8 scale, which still catches truncation), so a file that passes here decodes in
    the transform. Catches missing files, non-images, truncated files and images over max_pixels.
    """
    raw = _as_undecoded_images(dataset, image_column)

    def check(values: list[Any], indices: list[int]) -> dict[str, list]:
        bad: dict[str, list] = {"index": [], "source": [], "reason": []}
        for value, index in zip(values, indices, strict=True):
            reason = _decode_error(value, max_pixels)
            if reason:
                bad["index"].append(index)
                bad["source"].append(describe_source(value) if value else f"{image_column}[{index}]")
                bad["reason"].append(reason)
        return bad

    result = raw.map(
        check,
        input_columns=[image_column],
        with_indices=True,
        batched=True,
        batch_size=256,
        remove_columns=[image_column],
        features=datasets.Features(
            {
                "index": datasets.Value("int64"),
                "source": datasets.Value("string"),
                "reason": datasets.Value("string"),
            }
        ),
        num_proc=num_proc,
        keep_in_memory=True,  # file contents can change between runs: never reuse a cached verdict
        load_from_cache_file=False,
        desc="Checking images",
    )
    return [
        (int(i), str(s), str(r))
        for i, s, r in zip(result["index"], result["source"], result["reason"], strict=True)
    ]


def drop_bad_images(
    dataset: datasets.Dataset,
    image_column: str,
    logger: logging.Logger,
    num_proc: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_listed: int = 5,
) -> datasets.Dataset:
    """`dataset` without the rows `find_bad_images` reports; logs how many and the first `max_listed`."""
    bad = find_bad_images(dataset, image_column, num_proc=num_proc, max_pixels=max_pixels)
    if not bad:
        logger.info("All %d images in column %r decode.", len(dataset), image_column)
        return dataset
    if len(bad) == len(dataset):
        raise ValueError(
            f"None of the {len(dataset)} images in column {image_column!r} decodes, e.g. {bad[0][1]} "
            f"({bad[0][2]}). Check the files, or that image_column names the image column."
        )
    listed = "; ".join(f"{source} ({reason})" for _, source, reason in bad[:max_listed])
    more = f"; and {len(bad) - max_listed} more" if len(bad) > max_listed else ""
    logger.warning(
        "Dropping %d of %d images that cannot be decoded: %s%s", len(bad), len(dataset), listed, more
    )
    bad_rows = {index for index, _, _ in bad}
    return dataset.select([i for i in range(len(dataset)) if i not in bad_rows])
