"""The training split of a streamed dataset (`streaming: true`) as a `TrainStream`: a torch IterableDataset split
across processes (whole shards when they divide evenly, else every world_size-th example) and DataLoader workers
(whole shards). Each worker reads its share in passes, each pass shuffled by (seed, pass): shard order and a
`SHUFFLE_BUFFER`-example buffer, so that in one pass every example of the split is read by exactly one (process,
worker), also when the shards are of unequal length. The passes never end for the Trainer (it trains for
`max_steps`): no process runs dry before another at an epoch's end, and no collective waits on a rank that has
left its loop. A pass's end is per worker: with shards of unequal length, workers begin their next pass at
different times.

Everything a worker yields is a function of (seed, process index, number of processes, number of workers, its
position): the n-th example of worker w of process r gets the augmentation index `r * W + w + n * R * W` (R
processes, W workers), and a resumed run (`resume_from_batch`) has each worker skip exactly the examples whose
batches were trained, before decoding them: it reads the same samples in the same order as an uninterrupted one
(the skipped part of the pass is read again from the source, not decoded).

Where a stream reads from is `stream_sources`, its labels `stream_labels`, the splits of a streamed dataset
(evaluation splits read once, the hold-out) `stream_splits`.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch

from .bad_images import BadImage
from .stream_labels import LabelCoding
from .stream_sources import StreamSource, named_shard_errors, standard_stream
from .transforms import INDEX_COLUMN

__all__ = [
    "SHUFFLE_BUFFER",
    "TrainStream",
    "bad_image_row",
    "image_key",
    "resume_skip",
    "stream_dataloader",
]

logger = logging.getLogger(__name__)

# Examples held in the shuffle buffer of each worker: ~1 GB of JPEG bytes at ImageNet's ~110 kB an image.
SHUFFLE_BUFFER = 10_000


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
        self._stream = standard_stream(self.source.open(), self.image_column, self.label_column, where)

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
        batches = named_shard_errors(stream.iter(batch_size=64), self.source.describe())
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

    def place(self, rank: int, world_size: int, batch_size: int) -> None:
        """Read as process `rank` of `world_size` (its share of the shards), in batches of `batch_size`."""
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size

    def max_steps(self, epochs: float, global_batch: int) -> int:
        """max_steps for `epochs` passes over the stream, from the size its metadata states; else one line."""
        if self.num_examples is None:
            raise ValueError(
                f"streaming trains for max_steps, and {self.source.describe()} states no size to derive it from "
                "num_train_epochs; set max_steps (e.g. --max_steps 10000)."
            )
        return max(1, math.ceil(epochs * self.num_examples / global_batch))

    def images_to_count(self, reads: int) -> int:
        """The images a run of `reads` reads meets at most: the stated size, or the reads (a bad image counts
        once however many passes read it: `bad_image_row`)."""
        return min(reads, self.num_examples or reads)


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
