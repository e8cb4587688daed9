"""Images that do not decode: found before training on small data, skipped where they are decoded on large data.

Small splits (at most `PRESCAN_MAX_IMAGES` rows) are scanned before training: `find_bad_images` lists the rows
whose image does not decode (missing files, non-images, truncated files, images over `max_pixels`),
`drop_bad_images` returns the split without them and logs what went, `prescan_small_splits` does it for each
small split. A file that passes here decodes in the transform of `vit_ft.data.transforms.build_transforms`.

Large or streamed data is never scanned as a whole (1.28M images take about 20 minutes in one process): the
train transform checks each image as it decodes it and returns a `BadImage` in its place; `SkipBadImages` (the
training batches' collator) drops those examples, so a batch holds the good images its sampler drew, the same in
a resumed run, and records their rows in a `BadImageTally` shared with the DataLoader workers. The fine-tune's
`BadImageCallback` (`vit_ft.training.callbacks`) counts them, fails the run with one line once more than
`max_bad_image_fraction` of the split is bad (`check_bad_fraction`), and names them in the run's record.
A streamed dataset uses the same path: its transform returns `BadImage.of(value, error)` (or its loop calls
`decode_error`) and its collator is a `SkipBadImages`, with a tally sized by the images the run reads at most
(the split's stated length, or max_steps' reads), each bad image counted at a row of its own bytes
(`streaming.bad_image_row`: once, however many passes read it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from datasets.fingerprint import generate_random_fingerprint

from ..utils.logs import no_dataset_bars
from ..utils.progress import Progress
from .images import DEFAULT_MAX_PIXELS, describe_source, load_image

__all__ = [
    "BAD_IMAGES_KEY",
    "PRESCAN_MAX_IMAGES",
    "BadImage",
    "BadImageTally",
    "SkipBadImages",
    "check_bad_fraction",
    "decode_error",
    "describe_rows",
    "drop_bad_images",
    "find_bad_images",
    "prescan_small_splits",
]

# The largest split scanned before training. The scan decodes about 1,000 images a second in one process (JPEGs
# at 1/8 scale; 1.28M images took about 20 minutes, issue 33), so 20,000 images cost about 20 s per split; above
# that, and for any streamed split, images are checked where the training decodes them.
PRESCAN_MAX_IMAGES = 20_000

logger = logging.getLogger("vit_ft.data.datasets")  # the data layer's logger, as the transforms'


def decode_error(value: Any, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> str:
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
    desc: str = "Checking images",
) -> list[tuple[int, str, str]]:
    """Rows whose image cannot be decoded: [(row index, path or identifier, reason), ...], in row order.

    The column is read as `datasets.Image(decode=False)` (paths/bytes) and each image decoded with
    `load_image` (JPEG at 1/8 scale, which still catches truncation), so a file that passes here decodes in
    the transform. Catches missing files, non-images, truncated files and images over max_pixels. Its progress
    shows as `desc` (`utils.progress.Progress`; datasets' own bar with `num_proc` workers).
    """
    raw = _as_undecoded_images(dataset, image_column)
    single = (num_proc or 1) == 1  # in this process: our progress; in workers, datasets' bar
    progress = Progress(len(raw), desc, enabled=None if single else False)

    def check(values: list[Any], indices: list[int]) -> dict[str, list]:
        bad: dict[str, list] = {"index": [], "source": [], "reason": []}
        for value, index in zip(values, indices, strict=True):
            reason = decode_error(value, max_pixels)
            if reason:
                bad["index"].append(index)
                bad["source"].append(describe_source(value) if value else f"{image_column}[{index}]")
                bad["reason"].append(reason)
        return bad

    def counted(values: list[Any], indices: list[int]) -> dict[str, list]:
        progress.update(len(values))
        return check(values, indices)

    with progress, no_dataset_bars() if single else contextlib.nullcontext():
        result = raw.map(
            counted if single else check,
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
            new_fingerprint=generate_random_fingerprint(),  # nothing to cache; the function is not hashed
            desc=desc,
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
    desc: str = "Checking images",
) -> datasets.Dataset:
    """`dataset` without the rows `find_bad_images` reports; logs how many and the first `max_listed`."""
    bad = find_bad_images(dataset, image_column, num_proc=num_proc, max_pixels=max_pixels, desc=desc)
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


def prescan_small_splits(
    splits: Mapping[str, Any],
    image_column: str,
    log: logging.Logger,
    max_images: int = PRESCAN_MAX_IMAGES,
) -> dict[str, Any]:
    """`splits` with `drop_bad_images` applied to each map-style split of at most `max_images` rows; larger or
    streamed splits are left to the check where they are decoded (logged once each). Call it outside any
    barrier: every process checks its own copy at once, none waits on another."""
    checked = dict(splits)
    for name, split in splits.items():
        if isinstance(split, datasets.Dataset) and len(split) <= max_images:
            log.info("Bad-image scan: the %s split's %d images, each decoded once.", name, len(split))
            checked[name] = drop_bad_images(split, image_column, log, desc=f"Checking images ({name})")
        else:
            size = f"{len(split)} images" if isinstance(split, datasets.Dataset) else "a stream"
            log.info(
                "The %s split (%s) is not scanned before training (above %d images): an image that does not "
                "decode is skipped where it is decoded.",
                name, size, max_images,
            )  # fmt: skip
    return checked


@dataclass(frozen=True)
class BadImage:
    """What a train transform returns in place of an image it cannot decode; `SkipBadImages` drops the example."""

    source: str  # the path, or a short description of the value (`images.describe_source`)
    reason: str  # "<error type>: <message>"

    @classmethod
    def of(cls, value: Any, error: BaseException) -> BadImage:
        """The marker for image `value` (PIL, {"bytes", "path"} dict, path or bytes) that raised `error`."""
        return cls(describe_source(value), f"{type(error).__name__}: {error}")


class BadImageTally:
    """The rows of a split whose image failed to decode during training, shared with the DataLoader workers.

    A bitmap over the split's row positions in shared memory (as the train transform's epoch): a worker sets the
    row of each image it skips, the main process counts and lists them; a bad image counts once however many
    epochs skip it. Rows outside [0, size) fold into it (a stream whose stated length was short) and an example
    without a row position is counted apart, so neither is lost from the count.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._rows = torch.zeros(max(self.size, 1), dtype=torch.bool).share_memory_()
        self._unindexed = torch.zeros((), dtype=torch.int64).share_memory_()

    def record(self, index: int | None) -> None:
        """Mark row `index` (None: an example without a row position) as bad."""
        if index is None:
            self._unindexed += 1  # workers may race here: at worst an undercount of unindexed examples
        else:
            self._rows[int(index) % self._rows.numel()] = True

    def rows(self) -> list[int]:
        """The bad rows seen so far by this process's DataLoader (its workers included), in row order."""
        return torch.nonzero(self._rows).flatten().tolist()

    def count(self) -> int:
        """How many bad images this process's DataLoader has skipped so far (each row once)."""
        return int(self._rows.sum()) + int(self._unindexed)


# The key of a training batch under which `SkipBadImages` names the images it dropped from it ({"row", "source",
# "reason"} each): from a DataLoader worker to the main process, where the trainer takes it out before the model.
BAD_IMAGES_KEY = "vit_ft_bad_images"


class SkipBadImages:
    """A collator that drops the examples whose image did not decode (a `BadImage` as their `pixel_values`),
    records their rows (`index_key`) in `tally`, and collates the rest with `collate`.

    Which examples go depends only on the files, so a batch holds the same images in a resumed run as in an
    uninterrupted one; it is smaller by the bad ones. A batch with no image left is a one-line ValueError.
    """

    def __init__(self, collate: Callable[[list[dict[str, Any]]], Any], tally: BadImageTally, index_key: str):
        self.collate, self.tally, self.index_key = collate, tally, index_key

    def __call__(self, examples: list[dict[str, Any]]) -> Any:
        kept, skipped = [], []
        for example in examples:
            bad = example.get("pixel_values")
            if not isinstance(bad, BadImage):
                kept.append(example)
                continue
            self.tally.record(example.get(self.index_key))
            skipped.append({"row": example.get(self.index_key), "source": bad.source, "reason": bad.reason})
            logger.warning("Skipping image %s, which does not decode (%s).", bad.source, bad.reason)
        if not kept:
            bad = examples[0]["pixel_values"]
            raise ValueError(
                f"none of the {len(examples)} images of a training batch decodes, e.g. {bad.source} ({bad.reason}); "
                "remove or fix the broken files (vit_ft.data.bad_images.find_bad_images lists them)."
            )
        batch = self.collate(kept)
        if skipped:  # the names travel with the batch to the main process (the trainer hands them on)
            batch[BAD_IMAGES_KEY] = skipped
        return batch


def check_bad_fraction(bad: int, total: int, max_fraction: float, example: str = "") -> None:
    """Raise a one-line ValueError when more than `max_fraction` of `total` images are bad."""
    if total > 0 and bad > max_fraction * total:
        named = f", e.g. {example}" if example else ""
        raise ValueError(
            f"{bad} of the {total} training images ({bad / total:.1%}) do not decode{named}: more than "
            f"max_bad_image_fraction={max_fraction:g} allows. Fix or remove the broken files (check_images lists "
            "them on small data), or raise --max_bad_image_fraction."
        )


def describe_rows(
    dataset: datasets.Dataset,
    rows: list[int],
    image_column: str = "image",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> list[dict[str, Any]]:
    """[{"row", "source", "reason"}] of `rows` of a map-style `dataset` (its undecoded images, re-checked here
    for the reason): the names a run's record gives its skipped images."""
    if not rows:
        return []
    images = _as_undecoded_images(dataset.with_format(None), image_column).select(rows)[image_column]
    return [
        {"row": row, "source": describe_source(value) if value else f"{image_column}[{row}]",
         "reason": decode_error(value, max_pixels) or "did not decode during training"}
        for row, value in zip(rows, images, strict=True)
    ]  # fmt: skip
