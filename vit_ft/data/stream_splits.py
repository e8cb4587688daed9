"""The splits of a streamed dataset (`load_image_datasets(..., streaming=True)`): the training split a
`TrainStream`, validation and test read once, up to `max_eval_samples`, into map-style datasets (the datasets
cache), so evaluation is unchanged; without a validation split, a `validation_split_percentage` of the size the
dataset's metadata states (`DatasetInfo.splits`) is held out as a count: the first examples of the seeded
shuffled stream, which training then never sees (matched by their image bytes)."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import datasets

from .stream_labels import LabelCoding, label_coding
from .stream_sources import StreamSource, named_shard_errors, open_splits, standard_stream, stated_size
from .streaming import SHUFFLE_BUFFER, TrainStream, image_key

__all__ = ["load_streamed_datasets", "stream_source"]

logger = logging.getLogger(__name__)


def stream_source(
    dataset_name: str | None, config: str | None, split: str, cache_dir: str | None, max_train_samples: int | None
) -> StreamSource:
    """The training split to stream: a dataset named, read in passes, never cut at a count (one line else)."""
    if not dataset_name:
        raise ValueError(
            "streaming reads dataset_name (a Hub dataset id or a folder of webdataset .tar shards); image folders "
            "(train_dir) are read whole: drop streaming, or pass the folder as dataset_name."
        )
    if max_train_samples is not None:
        raise ValueError(
            f"max_train_samples={max_train_samples!r} does not go with streaming: a stream trains for max_steps: "
            "lower max_steps instead; or drop streaming."
        )
    return StreamSource(dataset_name, config, split, cache_dir)


def _eval_rows(spec: str) -> Iterator[dict[str, Any]]:
    """The rows of an evaluation split read from its stream (`Dataset.from_generator`: its arguments are one
    JSON string, so that the datasets cache knows them and no list is taken for shards)."""
    values = json.loads(spec)
    source = StreamSource(values["name"], values["config"], values["split"], values["cache_dir"])
    where = source.describe()
    coding = LabelCoding(values["problem_type"], tuple(values["names"]), values["coding"])
    stream = standard_stream(source.open(), values["image_column"], values["label_column"], where)
    if values["shuffle"]:
        stream = stream.shuffle(seed=values["seed"], buffer_size=SHUFFLE_BUFFER)
    for row in itertools.islice(named_shard_errors(iter(stream), where), values["count"]):
        yield {"image": row["image"], "label": coding(row["label"])}


def _read_eval_split(
    source: StreamSource, coding: LabelCoding, columns: tuple[str, str], count: int | None,
    shuffle: bool, seed: int,
) -> datasets.Dataset:  # fmt: skip
    spec = {
        "name": source.name, "config": source.config, "split": source.split, "cache_dir": source.cache_dir,
        "problem_type": coding.problem_type, "names": list(coding.names), "coding": coding.source,
        "image_column": columns[0], "label_column": columns[1], "count": count, "shuffle": shuffle, "seed": seed,
    }  # fmt: skip
    features = datasets.Features({"image": datasets.Image(decode=False), "label": coding.feature})
    dataset = datasets.Dataset.from_generator(
        _eval_rows, features=features, gen_kwargs={"spec": json.dumps(spec)}, cache_dir=source.cache_dir
    )
    if len(dataset) == 0:
        raise ValueError(f"{source.describe()} is empty; choose a split with examples.")
    return dataset.cast_column("image", datasets.Image())


def _held_out(
    train: StreamSource, coding: LabelCoding, columns: tuple[str, str], fraction: float, stated: int | None,
    max_eval_samples: int | None, seed: int,
) -> tuple[datasets.Dataset, frozenset[str]]:  # fmt: skip
    """The validation split held out of the training stream by count, and the `image_key`s training skips."""
    where = train.describe()
    if stated is None:
        raise ValueError(
            f"validation_split_percentage={fraction} needs the size of {where}, which its metadata does not state "
            "(a stream is not counted before training); set validation_split to a split of the dataset, or "
            "validation_split_percentage 0 (no validation)."
        )
    count = max(1, round(fraction * stated))
    if max_eval_samples is not None:
        count = min(count, max_eval_samples)
    validation = _read_eval_split(train, coding, columns, count, True, seed)
    undecoded = validation.cast_column("image", datasets.Image(decode=False))
    excluded = frozenset(image_key(image) for batch in undecoded.iter(batch_size=1000) for image in batch["image"])
    logger.info(
        "No validation split: held out %d of the %d images %s states (%.0f%%), the first of its seeded "
        "shuffled stream; training skips them.", len(validation), stated, where, 100 * fraction,
    )  # fmt: skip
    return validation, excluded


def load_streamed_datasets(
    train: StreamSource, validation_split: str | None, test_split: str | None, columns: tuple[str, str],
    validation_split_percentage: float, seed: int, max_eval_samples: int | None,
    problem_type: str | None = None, label_names: Sequence[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """`load_image_datasets`' result for a streamed dataset (`streaming=True`: its arguments, the training split
    as a `StreamSource` and the (image, label) `columns`): "train" a `TrainStream` (its transform, process split
    and batch size set later by the fine-tune), "validation" / "test" map-style datasets read from their streams
    (validation held out of train by count when the dataset has no such split), and the class names."""
    available = open_splits(train.name, train.config, train.cache_dir)
    label = f"dataset {train.name!r}" + (f" (config {train.config!r})" if train.config else "")

    def source(split: str, argument: str) -> StreamSource:
        if split not in available:
            raise KeyError(
                f"{argument}={split!r} is not a split of {label}; available splits: {sorted(available)}. "
                f"Pass one of them as {argument}."
            )
        return StreamSource(train.name, train.config, split, train.cache_dir)

    train = source(train.split, "train_split")
    head = standard_stream(available[train.split], *columns, train.describe())
    coding = label_coding(head.features, train.describe(), problem_type, label_names)
    splits: dict[str, Any] = {}
    stated = stated_size(available[train.split])
    excluded: frozenset[str] = frozenset()
    if validation_split is not None and validation_split in available:
        validation = source(validation_split, "validation_split")
        splits["validation"] = _read_eval_split(validation, coding, columns, max_eval_samples, False, seed)
    elif validation_split_percentage > 0:
        splits["validation"], excluded = _held_out(
            train, coding, columns, validation_split_percentage, stated, max_eval_samples, seed
        )
    if test_split is not None:
        splits["test"] = _read_eval_split(source(test_split, "test_split"), coding, columns, max_eval_samples, False, seed)
    num_train = None if stated is None else stated - len(excluded)
    stream = TrainStream(train, coding, *columns, seed=seed, excluded=excluded, num_examples=num_train)
    return {"train": stream, **splits}, list(coding.names)
