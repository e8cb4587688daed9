"""Streamed datasets (`streaming: true`): Hub datasets (parquet, webdataset, imagefolder) and local folders of
webdataset `.tar` shards read with `datasets.load_dataset(..., streaming=True)`, never converted to Arrow whole.

The training split becomes a `TrainStream`, a torch IterableDataset that `datasets` splits across processes
(`split_dataset_by_node`: whole shards when they divide evenly, else every world_size-th example) and DataLoader
workers (whole shards). Each worker reads its share in passes, each pass shuffled by (seed, pass): shard order
and a `SHUFFLE_BUFFER`-example buffer, so that in one pass every example of the split is read by exactly one
(process, worker), also when the shards are of unequal length. The passes never end for the Trainer (it trains
for `max_steps`): no process runs dry before another at an epoch's end, and no collective waits on a rank that
has left its loop. A pass's end is per worker: with shards of unequal length, workers begin their next pass at
different times.

Everything a worker yields is a function of (seed, process index, number of processes, number of workers, its
position): the n-th example of worker w of process r gets the augmentation index `r * W + w + n * R * W` (R
processes, W workers), and a resumed run (`resume_from_batch`) has each worker skip exactly the examples whose
batches were trained, before decoding them: it reads the same samples in the same order as an uninterrupted one
(the skipped part of the pass is read again from the source, not decoded).

Validation and test splits are read once, up to `max_eval_samples`, into map-style datasets (the datasets
cache), so evaluation is unchanged; without a validation split, a `validation_split_percentage` of the size the
dataset's metadata states (`DatasetInfo.splits`) is held out as a count: the first examples of the seeded
shuffled stream, which training then never sees (matched by their image bytes).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch

from .bad_images import BadImage
from .multilabel import MULTI_LABEL, SINGLE_LABEL, _is_value, _list_item, multi_hot_feature
from .transforms import INDEX_COLUMN

__all__ = [
    "SHUFFLE_BUFFER",
    "StreamSource",
    "TrainStream",
    "bad_image_row",
    "load_streamed_datasets",
    "resume_skip",
    "stream_dataloader",
]

logger = logging.getLogger(__name__)

# Examples held in the shuffle buffer of each worker: ~1 GB of JPEG bytes at ImageNet's ~110 kB an image.
SHUFFLE_BUFFER = 10_000


@dataclass(frozen=True)
class StreamSource:
    """One split of a dataset, as `datasets.load_dataset(name, config, split=split, streaming=True)` reads it;
    `name` is a Hub id or a local folder of webdataset `.tar` shards (or of image folders)."""

    name: str
    config: str | None
    split: str
    cache_dir: str | None = None

    def open(self) -> datasets.IterableDataset:
        return _open_splits(self.name, self.config, self.cache_dir)[self.split]

    def describe(self) -> str:
        config = f" (config {self.config!r})" if self.config else ""
        return f"split {self.split!r} of dataset {self.name!r}{config}"


def _check_local_shards(folder: Path) -> None:
    """Every `.tar` of a local webdataset folder must be a tar archive: a bad one is one line naming it."""
    for shard in sorted(folder.rglob("*.tar")):
        if not tarfile.is_tarfile(shard):
            raise ValueError(
                f"{shard} is not a tar archive (a webdataset shard must be one); replace or remove it, or "
                "rebuild the shards (e.g. with `tar cf`)."
            )


def _open_splits(name: str, config: str | None, cache_dir: str | None) -> datasets.IterableDatasetDict:
    """All splits of a dataset as streams (only its metadata and file list are read here)."""
    local = Path(name).expanduser()
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        raise ValueError(
            f"dataset_name={name!r} is a folder written by save_to_disk, which is read whole; drop streaming "
            "(--streaming false), or stream the Hub dataset or a folder of webdataset .tar shards."
        )
    if local.is_dir():
        _check_local_shards(local)
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=cache_dir, streaming=True)
    except datasets.exceptions.DatasetNotFoundError as error:
        raise FileNotFoundError(
            f"dataset_name={name!r} is neither a local folder nor a dataset on the Hub "
            f"({str(error).rstrip('.')}). Check the id or the path; for a gated dataset, accept its terms on "
            "the Hub and log in first (hf auth login)."
        ) from error
    except tarfile.TarError as error:  # the first shard, read for the features of a Hub webdataset
        raise _not_a_tar(error, f"dataset {name!r}") from None
    if isinstance(loaded, datasets.IterableDataset):
        loaded = datasets.IterableDatasetDict({"train": loaded})
    return loaded


def _shard_of(error: BaseException) -> str | None:
    """The shard being read when `error` was raised: the `tar_path` datasets' webdataset reader was at (its
    error, tarfile's, does not name the file)."""
    traceback = error.__traceback__
    shard = None
    while traceback is not None:
        shard = traceback.tb_frame.f_locals.get("tar_path", shard)
        traceback = traceback.tb_next
    return None if shard is None else str(shard)


def _named_shard_errors(rows: Iterator[Any], where: str) -> Iterator[Any]:
    """`rows`, with a shard that is not a tar archive (found only when it is read: a Hub dataset's shards are
    not checked before) as a one-line ValueError naming it; a DataLoader worker re-raises it as a ValueError."""
    try:
        yield from rows
    except tarfile.TarError as error:
        raise _not_a_tar(error, where) from None


def _not_a_tar(error: tarfile.TarError, where: str) -> ValueError:
    shard = _shard_of(error) or f"a shard of {where}"
    return ValueError(
        f"{shard} is not a tar archive ({type(error).__name__}: {error}), read as a webdataset shard of "
        f"{where}; replace or remove that shard (or rebuild the shards, e.g. with `tar cf`)."
    )


def _stated_size(stream: datasets.IterableDataset) -> int | None:
    """The number of examples the dataset's metadata states for this split, or None when it states none."""
    splits = stream.info.splits or {}
    split = splits.get(str(stream.split)) if stream.split is not None else None
    count = getattr(split, "num_examples", None)
    return int(count) if count else None


# --- labels: names from the features or the recipe, each example encoded as the map-style path encodes it ---


@dataclass(frozen=True)
class LabelCoding:
    """How a stream's label column becomes what the map-style splits hold: a class id (single-label) or a
    multi-hot float vector over `names` (multi-label)."""

    problem_type: str
    names: tuple[str, ...]
    source: str  # "class_label", "ids", "names", "class_label_list", "id_list", "name_list", "multi_hot"

    @property
    def feature(self) -> Any:
        if self.problem_type == SINGLE_LABEL:
            return datasets.ClassLabel(names=list(self.names))
        return multi_hot_feature(len(self.names))

    def __call__(self, value: Any) -> int | list[float]:
        if self.problem_type == SINGLE_LABEL:
            return self._class_id(value)
        if self.source == "multi_hot":
            if len(value) != len(self.names):
                raise ValueError(
                    f"a multi-hot label has {len(value)} entries, but class_names lists {len(self.names)}."
                )
            return [float(v) for v in value]
        values = value if isinstance(value, (list, tuple)) else [value]
        hot = [0.0] * len(self.names)
        for item in values:
            hot[self._class_id(item)] = 1.0
        return hot

    def _class_id(self, value: Any) -> int:
        if isinstance(value, str):
            if value not in self.names:
                raise ValueError(f"label {value!r} is not one of class_names {list(self.names)[:10]}.")
            return self.names.index(value)
        if value is None or not 0 <= int(value) < len(self.names):
            raise ValueError(
                f"label {value!r} is no class id of the {len(self.names)} classes; -1 (unlabelled) rows "
                "cannot train. Choose a labelled split."
            )
        return int(value)


def label_coding(
    features: datasets.Features, where: str, problem_type: str | None, class_names: Sequence[str] | None
) -> LabelCoding:
    """The class names of a stream's "label" column from its features (a ClassLabel, or a list of them), else
    from `class_names`: a stream cannot be scanned for its distinct labels before training."""
    feature, item = features["label"], _list_item(features["label"])
    names = list(class_names) if class_names else None
    if isinstance(feature, datasets.ClassLabel):
        kind, names, source = SINGLE_LABEL, list(feature.names), "class_label"
    elif isinstance(item, datasets.ClassLabel):
        kind, names, source = MULTI_LABEL, list(item.names), "class_label_list"
    elif _is_value(feature, ("int", "string", "bool")):
        kind, source = SINGLE_LABEL, "names" if _is_value(feature, ("string",)) else "ids"
    elif _is_value(item, ("float", "bool")):
        kind, source = MULTI_LABEL, "multi_hot"
    elif _is_value(item, ("int", "string")):
        kind, source = MULTI_LABEL, "name_list" if _is_value(item, ("string",)) else "id_list"
    else:
        raise ValueError(f"label_column of {where} holds {feature}: not class ids, names, or lists of them.")
    if not names:
        raise ValueError(
            f"label_column of {where} ({feature}) names no classes, and a stream cannot be read whole to find "
            "them; set class_names (a YAML list, or comma-separated) in the recipe or on the command line."
        )
    if problem_type == SINGLE_LABEL and kind == MULTI_LABEL:
        raise ValueError(
            f"problem_type={SINGLE_LABEL!r}, but the label column of {where} holds several labels per image "
            f"({feature}); leave problem_type unset (or set it to {MULTI_LABEL!r})."
        )
    if problem_type == MULTI_LABEL:
        kind = MULTI_LABEL
    return LabelCoding(kind, tuple(names), source)


def _standard_stream(
    stream: datasets.IterableDataset, image_column: str, label_column: str, where: str
) -> datasets.IterableDataset:
    """The image and label columns alone, named "image" and "label", the images undecoded."""
    features = stream.features
    if features is None:  # a builder that infers them from the first example
        first = next(_named_shard_errors(iter(stream), where), None)
        if first is None:
            raise ValueError(f"{where} is empty; choose a split with examples.")
        features = datasets.Features({k: _inferred(v) for k, v in first.items()})
    for argument, column in (("image_column", image_column), ("label_column", label_column)):
        if column not in features:
            raise KeyError(
                f"{argument}={column!r} is not a column of {where}; available columns: {sorted(features)}. "
                f"Pass the right name as {argument}."
            )
    if image_column == label_column:
        raise ValueError(f"image_column and label_column are both {image_column!r}; they must differ.")
    stream = stream.select_columns([image_column, label_column])
    image = None if stream.features is None else stream.features[image_column]
    struct = isinstance(image, dict) and "bytes" in image  # {"bytes", "path"}, as datasets writes images
    if image is not None and not isinstance(image, datasets.Image) and image not in _IMAGE_VALUES and not struct:
        raise ValueError(
            f"image_column={image_column!r} of {where} holds {image}, not images; pass the column with the "
            "images as image_column."
        )
    # undecoded before the renaming, which would otherwise decode every image (and fail on one that is bad)
    stream = stream.cast_column(image_column, datasets.Image(decode=False))
    renames = {old: new for old, new in ((image_column, "image"), (label_column, "label")) if old != new}
    return stream.rename_columns(renames) if renames else stream


_IMAGE_VALUES = (datasets.Value("string"), datasets.Value("binary"))


def _inferred(value: Any) -> Any:
    if isinstance(value, bool):
        return datasets.Value("bool")
    if isinstance(value, int):
        return datasets.Value("int64")
    if isinstance(value, str):
        return datasets.Value("string")
    return datasets.Value("binary")


def bad_image_row(image: dict[str, Any]) -> int:
    """The row a stream's undecodable image is counted at (`bad_images.BadImageTally`): from its path (a
    webdataset member's, a parquet row's) and bytes, the same in every pass, process and worker; two broken
    files of the same bytes (empty downloads) count apart by their paths."""
    identity = f"{image.get('path')}\0{image_key(image)}"
    return int(hashlib.blake2b(identity.encode(), digest_size=7).hexdigest(), 16)


def image_key(image: dict[str, Any]) -> str:
    """What identifies an undecoded image for the hold-out: its bytes' digest, else its path."""
    data = image.get("bytes")
    if data is None:
        return f"path:{image.get('path')}"
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# --- the training stream ---


@dataclass
class TrainStream(torch.utils.data.IterableDataset):
    """The training split as endless seeded passes, split across processes and DataLoader workers.

    `transform` (the train `ImageClassificationTransform`, or None for the raw rows) maps each example to the
    model's inputs; `passes` ends the stream after that many passes (tests; None: endless, the Trainer stops at
    max_steps); `excluded` are the `image_key`s of the held-out validation images; `resume_from_batch` is the
    number of batches this process already trained on (each worker skips its share of them)."""

    source: StreamSource
    coding: LabelCoding
    image_column: str = "image"
    label_column: str = "label"
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_workers: int = 0
    batch_size: int = 1
    buffer_size: int = SHUFFLE_BUFFER
    excluded: frozenset[str] = frozenset()
    num_examples: int | None = None  # what the metadata states, less the hold-out
    transform: Callable[[dict[str, list]], dict[str, list]] | None = None
    passes: int | None = None
    resume_from_batch: int = 0
    _stream: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__init__()
        where = self.source.describe()
        self._stream = _standard_stream(self.source.open(), self.image_column, self.label_column, where)

    @property
    def n_shards(self) -> int:
        return self._stream.n_shards

    @property
    def features(self) -> datasets.Features:
        return datasets.Features({"image": datasets.Image(decode=False), "label": self.coding.feature})

    def shards_per_process(self) -> int:
        """The shards each process reads: its share when they divide evenly, else all (every k-th example)."""
        n = self.n_shards
        return n // self.world_size if n % self.world_size == 0 else n

    def worker_share(self, epoch: int, worker: int, workers: int) -> Iterator[dict[str, Any]]:
        """Pass `epoch` of worker `worker` of `workers` in this process: shards and a buffer shuffled by (seed,
        epoch); the shards split across the processes when they divide evenly (else each process keeps every
        world_size-th example of the stream), then across the workers.

        The split is done here, not by `datasets` inside the worker (which would tie a share to the worker's id):
        a resumed run hands worker i the share worker (i + trained batches) % workers had."""
        stream = self._stream.shuffle(seed=self.seed, buffer_size=self.buffer_size)
        by_shards = self.n_shards % self.world_size == 0
        if self.world_size > 1 and by_shards:
            stream = stream.shard(num_shards=self.world_size, index=self.rank, contiguous=False)
        if workers > 1:
            stream = stream.shard(num_shards=workers, index=worker, contiguous=False)
        stream.set_epoch(epoch)
        position = 0
        batches = _named_shard_errors(stream.iter(batch_size=64), self.source.describe())
        for batch in batches:  # iter(): no worker split of its own
            for values in zip(*batch.values(), strict=True):
                if by_shards or position % self.world_size == self.rank:
                    yield dict(zip(batch, values, strict=True))
                position += 1

    def rows(self) -> Iterator[dict[str, Any]]:
        """This worker's examples, pass after pass, with their augmentation index; held-out ones left out."""
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker = (worker + self.resume_from_batch) % workers  # the DataLoader starts its round at worker 0
        slot, slots = self.rank * workers + worker, self.world_size * workers
        position = 0
        for epoch in itertools.count() if self.passes is None else range(self.passes):
            seen = 0
            for row in self.worker_share(epoch, worker, workers):
                if self.excluded and image_key(row["image"]) in self.excluded:
                    continue
                seen += 1
                yield {**row, INDEX_COLUMN: slot + slots * position}
                position += 1
            if seen == 0:  # nothing for this worker (an empty share): stop, rather than loop on nothing
                return

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker = (worker + self.resume_from_batch) % workers  # as in `rows`
        skip = resume_skip(self.resume_from_batch, worker, workers) * self.batch_size
        for row in itertools.islice(self.rows(), skip, None):
            label = self.coding(row["label"])
            if self.transform is None:
                yield {"image": row["image"], "label": label, INDEX_COLUMN: row[INDEX_COLUMN]}
                continue
            out = self.transform({"image": [row["image"]], "label": [label], INDEX_COLUMN: [row[INDEX_COLUMN]]})
            example = {key: values[0] for key, values in out.items()}
            if isinstance(example.get("pixel_values"), BadImage):
                # dropped before any use of its augmentation index: the bad-image tally's row is the image's
                # own, so that one bad image read in several passes counts once
                example[INDEX_COLUMN] = bad_image_row(row["image"])
            yield example

    def head(self, count: int) -> list[dict[str, Any]]:
        """The first `count` undecoded rows of pass 0 in the main process (the augmentation figure)."""
        return [row for row, _ in zip(self.rows(), range(count), strict=False)]


def resume_skip(batches: int, worker: int, workers: int) -> int:
    """How many of the first `batches` batches worker `worker` of `workers` made: a DataLoader takes its
    batches from the workers in turn (batch b from worker b % workers), each worker batching its own examples."""
    return max(0, (batches - worker + workers - 1) // workers)


def stream_dataloader(stream: TrainStream, collate_fn: Callable, args: Any) -> Any:
    """The training DataLoader of a stream, already split per process: accelerate's per-process wrapper (device
    placement, the end-of-data signal) without its re-sharding of iterable datasets across processes.

    Workers beyond the shards a process reads would get none: their number is capped at that."""
    from accelerate.data_loader import prepare_data_loader

    workers = min(args.dataloader_num_workers, stream.shards_per_process())
    if workers < args.dataloader_num_workers:
        logger.warning(
            "The stream has %d shard(s) per process: using %d dataloader worker(s), not %d.",
            stream.shards_per_process(), workers, args.dataloader_num_workers,
        )  # fmt: skip
    stream.num_workers = workers
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=args.per_device_train_batch_size,
        collate_fn=collate_fn,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
        prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
        drop_last=False,
        # its own generator: creating the iterator must not draw from the global RNG, which a resumed run
        # restores just before (dropout would then be one draw off an uninterrupted run)
        generator=torch.Generator().manual_seed(stream.seed),
    )
    return prepare_data_loader(loader, device=args.device, num_processes=1, process_index=0,
                               put_on_device=True, dispatch_batches=False)  # fmt: skip


# --- the splits ---


def _eval_rows(spec: str) -> Iterator[dict[str, Any]]:
    """The rows of an evaluation split read from its stream (`Dataset.from_generator`: its arguments are one
    JSON string, so that the datasets cache knows them and no list is taken for shards)."""
    values = json.loads(spec)
    source = StreamSource(values["name"], values["config"], values["split"], values["cache_dir"])
    where = source.describe()
    coding = LabelCoding(values["problem_type"], tuple(values["names"]), values["coding"])
    stream = _standard_stream(source.open(), values["image_column"], values["label_column"], where)
    if values["shuffle"]:
        stream = stream.shuffle(seed=values["seed"], buffer_size=SHUFFLE_BUFFER)
    for row in itertools.islice(_named_shard_errors(iter(stream), where), values["count"]):
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


def load_streamed_datasets(
    dataset_name: str,
    dataset_config: str | None = None,
    train_split: str = "train",
    validation_split: str | None = "validation",
    test_split: str | None = None,
    image_column: str = "image",
    label_column: str = "label",
    validation_split_percentage: float = 0.1,
    seed: int = 0,
    max_eval_samples: int | None = None,
    cache_dir: str | None = None,
    problem_type: str | None = None,
    label_names: Sequence[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """`load_image_datasets`' result for a streamed dataset: "train" a `TrainStream` (its transform, process
    split and batch size set later by the fine-tune), "validation" / "test" map-style datasets read from their
    streams (validation held out of train by count when the dataset has no such split), and the class names."""
    available = _open_splits(dataset_name, dataset_config, cache_dir)
    label = f"dataset {dataset_name!r}" + (f" (config {dataset_config!r})" if dataset_config else "")

    def source(split: str, argument: str) -> StreamSource:
        if split not in available:
            raise KeyError(
                f"{argument}={split!r} is not a split of {label}; available splits: {sorted(available)}. "
                f"Pass one of them as {argument}."
            )
        return StreamSource(dataset_name, dataset_config, split, cache_dir)

    train_source = source(train_split, "train_split")
    train_where = train_source.describe()
    head = _standard_stream(available[train_split], image_column, label_column, train_where)
    coding = label_coding(head.features, train_where, problem_type, label_names)
    columns = (image_column, label_column)
    splits: dict[str, Any] = {}
    stated = _stated_size(available[train_split])
    excluded: frozenset[str] = frozenset()
    if validation_split is not None and validation_split in available:
        splits["validation"] = _read_eval_split(
            source(validation_split, "validation_split"), coding, columns, max_eval_samples, False, seed
        )
    elif validation_split_percentage > 0:
        if stated is None:
            raise ValueError(
                f"validation_split_percentage={validation_split_percentage} needs the size of {train_where}, "
                "which its metadata does not state (a stream is not counted before training); set "
                "validation_split to a split of the dataset, or validation_split_percentage 0 (no validation)."
            )
        count = max(1, round(validation_split_percentage * stated))
        if max_eval_samples is not None:
            count = min(count, max_eval_samples)
        validation = _read_eval_split(train_source, coding, columns, count, True, seed)
        undecoded = validation.cast_column("image", datasets.Image(decode=False))
        excluded = frozenset(
            image_key(image) for batch in undecoded.iter(batch_size=1000) for image in batch["image"]
        )
        splits["validation"] = validation
        logger.info(
            "No validation split: held out %d of the %d images %s states (%.0f%%), the first of its seeded "
            "shuffled stream; training skips them.", len(validation), stated, train_where,
            100 * validation_split_percentage,
        )  # fmt: skip
    if test_split is not None:
        test = source(test_split, "test_split")
        splits["test"] = _read_eval_split(test, coding, columns, max_eval_samples, False, seed)
    num_train = None if stated is None else stated - len(excluded)
    splits = {
        "train": TrainStream(train_source, coding, image_column, label_column, seed=seed, excluded=excluded,
                             num_examples=num_train),
        **splits,
    }  # fmt: skip
    return splits, list(coding.names)


def streamed_max_steps(stream: TrainStream, epochs: float, global_batch: int) -> int:
    """max_steps for `epochs` passes over a stream whose size its metadata states; else a one-line error."""
    if stream.num_examples is None:
        raise ValueError(
            f"streaming trains for max_steps, and {stream.source.describe()} states no size to derive it from "
            "num_train_epochs; set max_steps (e.g. --max_steps 10000)."
        )
    return max(1, math.ceil(epochs * stream.num_examples / global_batch))
