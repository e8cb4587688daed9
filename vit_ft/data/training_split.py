"""The training split as the fine-tune asks of it, whatever its source: a map-style `datasets.Dataset` (image
folders, Hub or saved datasets: read whole, indexed by row) or a `TrainStream` (`streaming: true`: read in
passes, never whole). Training asks these questions and never the split's type; another kind of split answers
them here."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import datasets

from .bad_images import describe_rows
from .streaming import TrainStream, stream_dataloader
from .transforms import INDEX_COLUMN

__all__ = [
    "first_examples",
    "first_images",
    "images_to_count",
    "in_words",
    "max_steps_for",
    "place",
    "reads_whole",
    "row_names",
    "set_transforms",
    "skips_trained_batches",
    "train_dataloader",
]


def reads_whole(split: Any) -> bool:
    """Whether `split` can be read whole after loading (its rows counted and selected: the probes, the feature
    bank); a stream cannot, and no split is none."""
    return split is not None and not isinstance(split, TrainStream)


def place(split: Any, rank: int, world_size: int, batch_size: int) -> None:
    """Split a stream across the processes here (process `rank` of `world_size`, batches of `batch_size`); a
    map-style split is whole in every process (the Trainer's sampler shares it out)."""
    if isinstance(split, TrainStream):
        split.place(rank, world_size, batch_size)


def max_steps_for(split: Any, epochs: float, global_batch: int) -> int | None:
    """The max_steps a stream trains `epochs` passes for (from the size its metadata states); None for a split
    whose length the Trainer counts its epochs by."""
    return split.max_steps(epochs, global_batch) if isinstance(split, TrainStream) else None


def in_words(splits: Mapping[str, Any]) -> str:
    """The splits' sizes for the log: `{'train': 48, 'validation': 12}`, or a stream's stated size and shards."""
    train = splits["train"]
    if not isinstance(train, TrainStream):
        return str({name: len(split) for name, split in splits.items()})
    others = {name: len(split) for name, split in splits.items() if name != "train"}
    return f"train streamed ({train.num_examples} examples stated, {train.n_shards} shards), {others}"


def first_images(split: Any, count: int) -> list[Any]:
    """The first `count` training images, undecoded, without the transform (the augmentation figure)."""
    if isinstance(split, TrainStream):
        return [row["image"] for row in split.head(count)]
    train = split.with_format(None)
    return train.select(range(min(count, len(train))))["image"]


def first_examples(split: Any, count: int) -> Iterator[dict[str, Any]]:
    """The first `count` examples as the training DataLoader gets them (the transform applied): a map-style
    split's by position, a stream's from its start."""
    if isinstance(split, datasets.Dataset):
        return (split[i] for i in range(min(count, len(split))))
    return itertools.islice(iter(split), count)


def set_transforms(splits: dict[str, Any], train_transform: Any, eval_transform: Any) -> None:
    """`train_transform` on the training split, `eval_transform` on the others, in place. A map-style split's
    images are cast undecoded (the transform decodes them, at reduced size where it can) and the training split
    gains `INDEX_COLUMN`, its global row positions (the same in every process: each loads the whole split); a
    stream is undecoded already and indexes its rows by their position in it."""
    for name in splits:
        if isinstance(splits[name], TrainStream):
            splits[name].transform = train_transform
            continue
        splits[name] = splits[name].cast_column("image", datasets.Image(decode=False))
        if name == "train":
            splits[name] = splits[name].add_column(INDEX_COLUMN, list(range(len(splits[name]))))
        splits[name].set_transform(train_transform if name == "train" else eval_transform)


def images_to_count(split: Any, reads: int) -> int:
    """The training images a run's undecodable ones are counted against: a map-style split's rows; for a stream,
    what a run of `reads` reads meets at most (`TrainStream.images_to_count`)."""
    return split.images_to_count(reads) if isinstance(split, TrainStream) else len(split)


def row_names(split: Any, image_column: str = "image") -> Callable[[list[int]], list[dict[str, Any]]] | None:
    """How a split's bad rows are named in the run's record: a map-style split's from its undecoded images
    (`bad_images.describe_rows`); None for a stream, whose batches name them as they drop them."""
    if isinstance(split, TrainStream):
        return None
    return lambda rows: describe_rows(split, rows, image_column)


def skips_trained_batches(split: Any, batches: int) -> bool:
    """Have a stream skip the `batches` each process trained before a resumed checkpoint itself, before decoding
    them (`TrainStream.resume_from_batch`), and say so: the Trainer must then not skip them again
    (`ignore_data_skip`). A map-style split's batches are skipped by the Trainer (False)."""
    if not isinstance(split, TrainStream):
        return False
    split.resume_from_batch = batches
    return True


def train_dataloader(split: Any, collate_fn: Callable, args: Any) -> Any | None:
    """A stream's training DataLoader, split per process already (`stream_dataloader`); None for a map-style
    split, which the Trainer loads and shards itself."""
    return stream_dataloader(split, collate_fn, args) if isinstance(split, TrainStream) else None
