"""The DataLoader's workers: their settings in one log line and the shared memory they need, checked before
training; and DataLoaders that leave torch's global RNG alone, so that workers change no result.

Each worker hands its batches to the main process through shared memory (/dev/shm), up to `prefetch` batches a
worker at once, for every training process on the machine. A container's /dev/shm is 64 MB unless Docker is told
otherwise (`--shm-size`): a run that needs more dies mid-epoch with a bus error, so the need is computed from
what the train transform actually returns (one example, measured) and checked before training.
"""

from __future__ import annotations

import logging
import math
import signal
from typing import Any

import numpy as np
import torch
from transformers import TrainingArguments

from ..arguments.data_loading import describe_data_loading
from ..data.training_split import first_examples
from ..utils.files import byte_size
from ..utils.hardware import SHARED_MEMORY, free_shared_memory, local_processes
from .preemption import SIGNALS

logger = logging.getLogger("vit_ft")

TORCH_PREFETCH_FACTOR = 2  # torch's DataLoader default when there are workers and no prefetch_factor


def example_bytes(example: Any) -> int:
    """The bytes of the arrays in one transformed example (tensors and numpy arrays, in dicts and lists too):
    what a worker puts in shared memory for it. float32 pixels take 4 bytes a channel, uint8 ones 1."""
    if isinstance(example, torch.Tensor):
        return example.element_size() * example.nelement()
    if isinstance(example, np.ndarray):
        return int(example.nbytes)
    if isinstance(example, dict):
        return sum(example_bytes(value) for value in example.values())
    if isinstance(example, (list, tuple)):
        return sum(example_bytes(value) for value in example)
    return 0


def sample_example(dataset: Any, tries: int = 8) -> dict[str, Any] | None:
    """The first of the dataset's first `tries` examples whose image decoded (its transform applied): a map-style
    dataset by position, an iterable one (a stream) from its start. None when none of them decodes."""
    for example in first_examples(dataset, tries):
        if isinstance(example.get("pixel_values"), (torch.Tensor, np.ndarray)):
            return example
    return None


def prefetch_factor(args: TrainingArguments) -> int:
    """Batches each worker loads ahead (0 without workers)."""
    if not args.dataloader_num_workers:
        return 0
    return args.dataloader_prefetch_factor or TORCH_PREFETCH_FACTOR


def shared_memory_need(args: TrainingArguments, bytes_per_image: int, processes: int | None = None) -> int:
    """Bytes of shared memory the training DataLoaders of this machine hold at once: batch size x prefetch factor
    x workers x bytes per image, for each of `processes` (default: the training processes on this machine)."""
    processes = local_processes() if processes is None else processes
    batch = args.per_device_train_batch_size
    return batch * prefetch_factor(args) * args.dataloader_num_workers * bytes_per_image * processes


def check_data_loading(args: TrainingArguments, train_dataset: Any, free: int | None = None) -> None:
    """Log the DataLoader's settings in one line; with workers, compare the shared memory their batches need with
    what /dev/shm has free (`free`: default measured now) and raise a one-line ValueError naming the fixes when
    it does not fit."""
    line = describe_data_loading(args)
    with torch.random.fork_rng(devices=[]):  # an unseeded transform draws from the global RNG: keep it as it was
        example = sample_example(train_dataset) if args.dataloader_num_workers else None
    if example is None:
        logger.info(line)
        return
    per_image, processes = example_bytes(example), local_processes()
    need = shared_memory_need(args, per_image, processes)
    free = free_shared_memory() if free is None else free
    workers, prefetch, batch = args.dataloader_num_workers, prefetch_factor(args), args.per_device_train_batch_size
    sum_up = (
        f"batch {batch} x prefetch {prefetch} x {workers} workers x {processes} process"
        f"{'es' if processes != 1 else ''} x {byte_size(per_image, binary=True)} an image"
    )
    if free is not None and need > free:
        fitting = free // max(1, batch * prefetch * per_image * processes)
        shm_size = max(1, math.ceil(need * 1.25 / 2**30))
        raise ValueError(
            f"the DataLoader workers need about {byte_size(need, binary=True)} of shared memory ({sum_up}) but {SHARED_MEMORY} has "
            f"{byte_size(free, binary=True)} free; use fewer workers (--dataloader_num_workers {min(fitting, workers - 1)}), a "
            f"smaller prefetch (--dataloader_prefetch_factor 1), or give the container more shared memory "
            f"(docker run --shm-size={shm_size}g)."
        )
    where = f" of {byte_size(free, binary=True)} free in {SHARED_MEMORY}" if free is not None else ""
    logger.info("%s Shared memory for the workers' batches: %s (%s)%s.", line, byte_size(need, binary=True), sum_up, where)


def with_own_generator(loader: torch.utils.data.DataLoader, seed: int) -> torch.utils.data.DataLoader:
    """`loader` drawing its workers' base seed from a generator of its own instead of torch's global RNG.

    Each new iterator draws one number: without workers and with non-persistent ones at every epoch and
    evaluation, with persistent workers only at the first (later epochs reuse the iterator). Dropout and drop
    path draw from the global RNG after it, so they would depend on the worker settings, and a resumed run (a
    new iterator where the uninterrupted one reused its own) would not replay them. The augmentation never reads
    the base seed: it draws from per-image generators (`data.transforms.augmentation_seed`)."""
    # accelerate's prepared loader wraps the DataLoader that makes the iterators; DataLoader allows the change
    getattr(loader, "base_dataloader", loader).generator = torch.Generator().manual_seed(seed)
    return loader


class _PreemptionShield:
    """A DataLoader's `worker_init_fn` that makes its workers ignore the preemption signals before running the
    loader's own: Slurm and `kill -- -PGID` send SIGTERM to the whole process group, and a worker killed by it
    takes the run down (torch raises "DataLoader worker ... is killed by signal") before the main process has
    saved its checkpoint (`preemption.PreemptionCallback`); the main process stops its workers itself."""

    def __init__(self, init: Any = None) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if self.init is not None:
            self.init(worker_id)


def shielded_from_preemption(loader: Any) -> Any:
    """`loader` (a DataLoader, or accelerate's prepared one) whose workers ignore SIGTERM / SIGUSR1 (see
    `_PreemptionShield`); a loader without workers is left as it is."""
    base = getattr(loader, "base_dataloader", loader)
    if getattr(base, "num_workers", 0) and not isinstance(base.worker_init_fn, _PreemptionShield):
        base.worker_init_fn = _PreemptionShield(base.worker_init_fn)
    return loader


__all__ = [
    "check_data_loading",
    "example_bytes",
    "prefetch_factor",
    "sample_example",
    "shared_memory_need",
    "shielded_from_preemption",
    "with_own_generator",
]
