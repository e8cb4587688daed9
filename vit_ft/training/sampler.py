"""A class-balanced training sampler whose order is a function of (seed, epoch), so `--resume` replays it.

Each image is drawn with probability proportional to 1 / (its class's count), with replacement, as many draws
per epoch as there are images (torch's `WeightedRandomSampler` with those weights): every class is then drawn
equally often on average. The Trainer calls `set_epoch` at each epoch's start (accelerate forwards it to the
sampler), and a resumed run, which skips the batches it already trained on, sees the same order. Under several
processes every process draws the same order and accelerate hands each its share of the batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler


def sampler_seed(seed: int, epoch: int) -> int:
    """The generator seed of an epoch's draws (a hash, so that neighbouring epochs give unrelated streams)."""
    digest = hashlib.blake2b(f"balanced-sampler/{seed}/{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0xFFFF_FFFF


class ClassBalancedSampler(Sampler[int]):
    """Indices of a training split drawn class-balanced with replacement; a function of (seed, epoch)."""

    def __init__(self, labels: Sequence[int], seed: int, num_samples: int | None = None) -> None:
        labels = np.asarray(labels, dtype=np.int64)
        if labels.size == 0:
            raise ValueError("ClassBalancedSampler needs at least one training label.")
        counts = np.bincount(labels)
        self.weights = torch.as_tensor(1.0 / counts[labels], dtype=torch.float64)  # (num_images,)
        self.seed = int(seed)
        self.num_samples = len(labels) if num_samples is None else int(num_samples)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the order of `epoch` from now on."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(sampler_seed(self.seed, self.epoch))
        draws = torch.multinomial(self.weights, self.num_samples, replacement=True, generator=generator)
        return iter(draws.tolist())

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ClassBalancedSampler", "sampler_seed"]
