"""Mixup and CutMix at batch level with soft targets, as timm's `timm.data.Mixup` in its "batch" mode.

    mixer = MixupCutmix(num_classes=10, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, seed=42)
    trainer = Trainer(..., data_collator=mixer.collate)   # train batches mixed, eval batches left alone
    mixer.set_epoch(epoch)                                # at each epoch's start, as the train transform's

One draw per batch, as timm: with probability `prob` the batch is mixed; when both alphas are positive CutMix
is chosen with probability `switch_prob`, else the active one. lam ~ Beta(alpha, alpha). Mixup blends each
image with the batch's reverse (image i with image B-1-i); CutMix pastes the reverse's pixels into one box of
side sqrt(1 - lam) of the image's, centred uniformly and clipped to the image, and lam becomes the uncovered
fraction (timm's `rand_bbox` and `correct_lam`). Targets: timm's `mixup_target`, one-hot vectors smoothed to
off = smoothing / classes and on = 1 - smoothing + off, then lam * y + (1 - lam) * y_reversed; they sum to 1.

Randomness: a numpy generator seeded by (seed, epoch, the batch's image indices), the indices the seeded
train transform passes on (`INDEX_COLUMN`): a resumed run mixes its batches exactly as an uninterrupted one,
whatever the workers. A batch without indices draws from a generator seeded by (seed, epoch) and its labels.
The call works on the batch's device: the fine-tune mixes on the training device, after the per-image
augmentation (`vit_ft.data.batch_augmentation`); `collate` mixes in the DataLoader workers instead.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from .collate import collate_fn
from .transforms import INDEX_COLUMN

__all__ = ["MixupCutmix", "check_mixup", "cutmix_box", "mixup_target"]


def mixup_target(labels: torch.Tensor, num_classes: int, lam: float, smoothing: float = 0.0) -> torch.Tensor:
    """timm's `mixup_target`: (batch,) int labels -> (batch, num_classes) float soft targets, smoothed one-hot
    vectors of each label mixed lam : 1 - lam with those of the reversed batch."""
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    one_hot = torch.full((len(labels), num_classes), off, dtype=torch.float32, device=labels.device)
    one_hot.scatter_(1, labels.long().view(-1, 1), on)
    return one_hot * lam + one_hot.flip(0) * (1.0 - lam)


def cutmix_box(
    height: int, width: int, lam: float, rng: np.random.Generator
) -> tuple[tuple[int, int, int, int], float]:
    """timm's `rand_bbox` + `correct_lam`: a box (top, bottom, left, right) of sides int(side * sqrt(1 - lam))
    centred at a uniform pixel and clipped to the image, and 1 - its area / the image's area."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
    left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
    return (top, bottom, left, right), 1.0 - (bottom - top) * (right - left) / float(height * width)


class MixupCutmix:
    """Batch-level mixup / CutMix with soft targets (timm's `Mixup(mode="batch", correct_lam=True)`).

    Args:
        num_classes: the length of the soft targets.
        mixup_alpha: Beta(alpha, alpha) of mixup's lam; 0 turns mixup off (timm's --mixup, 0.8 in DeiT).
        cutmix_alpha: the same for CutMix (timm's --cutmix, 1.0 in DeiT).
        prob: probability that a batch is mixed at all (timm's --mixup-prob).
        switch_prob: probability of CutMix rather than mixup when both alphas are positive.
        label_smoothing: smoothing of the one-hot targets before mixing (timm's --smoothing).
        seed: the run's seed; the draws are a function of (seed, epoch, the batch's image indices).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
        seed: int = 0,
    ) -> None:
        check_mixup(num_classes, mixup_alpha, cutmix_alpha, prob, switch_prob, label_smoothing)
        self.num_classes, self.mixup_alpha, self.cutmix_alpha = num_classes, mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob, self.label_smoothing = prob, switch_prob, label_smoothing
        self.seed = seed
        # in shared memory: the collator runs in the DataLoader workers, which read the epoch set here
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_classes={self.num_classes}, mixup_alpha={self.mixup_alpha}, "
            f"cutmix_alpha={self.cutmix_alpha}, prob={self.prob}, switch_prob={self.switch_prob}, "
            f"label_smoothing={self.label_smoothing}, seed={self.seed})"
        )

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Draw the mixes of `epoch` from now on, in this process and in its DataLoader workers."""
        self._epoch.fill_(int(epoch))

    def describe(self) -> str:
        """What is applied, in a few words for a figure title or a log line."""
        parts = [f"mixup α={self.mixup_alpha:g}"] if self.mixup_alpha > 0 else []
        parts += [f"CutMix α={self.cutmix_alpha:g}"] if self.cutmix_alpha > 0 else []
        text = " / ".join(parts) + (f", p={self.prob:g}" if self.prob < 1 else "")
        return text + (f", smoothing {self.label_smoothing:g}" if self.label_smoothing > 0 else "")

    def generator(self, indices: torch.Tensor | None, labels: torch.Tensor) -> np.random.Generator:
        """The batch's numpy generator, seeded by (seed, epoch, indices), or by its labels without indices."""
        key = indices if indices is not None else labels
        text = f"{self.seed}/{self.epoch}/{'index' if indices is not None else 'labels'}/"
        digest = hashlib.blake2b(text.encode() + key.to("cpu", torch.int64).numpy().tobytes(), digest_size=8)
        return np.random.default_rng(int.from_bytes(digest.digest(), "little"))

    def draw(self, rng: np.random.Generator) -> tuple[float, bool]:
        """timm's `_params_per_batch`: (lam, use_cutmix); lam = 1 leaves the batch as it is."""
        if rng.random() >= self.prob:
            return 1.0, False
        use_cutmix = self.cutmix_alpha > 0
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = bool(rng.random() < self.switch_prob)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        return float(rng.beta(alpha, alpha)), use_cutmix

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{"pixel_values": (batch, channels, height, width), "labels": (batch,) int[, INDEX_COLUMN: (batch,)]}
        -> the same with pixel_values mixed and labels (batch, num_classes) float soft targets; the index
        column is dropped (the model takes no such input)."""
        batch = dict(batch)
        indices = batch.pop(INDEX_COLUMN, None)
        pixels, labels = batch["pixel_values"], batch["labels"]
        rng = self.generator(indices, labels)
        lam, use_cutmix = self.draw(rng)
        if lam < 1.0:
            if use_cutmix:  # the box from the same generator, after lam: timm's order of draws
                (top, bottom, left, right), lam = cutmix_box(pixels.shape[-2], pixels.shape[-1], lam, rng)
                pixels = pixels.clone()
                pixels[:, :, top:bottom, left:right] = pixels.flip(0)[:, :, top:bottom, left:right]
            else:
                pixels = pixels * lam + pixels.flip(0) * (1.0 - lam)
        batch["pixel_values"] = pixels
        batch["labels"] = mixup_target(labels, self.num_classes, lam, self.label_smoothing)
        return batch

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """`collate_fn`, then the mix for train batches: those whose examples carry `INDEX_COLUMN` (the train
        transform passes it on). Eval examples carry none: their batches keep hard labels, so that one
        collator serves the Trainer's train and eval loaders."""
        batch = collate_fn(examples)
        if INDEX_COLUMN not in examples[0] or "labels" not in batch:
            return batch
        batch[INDEX_COLUMN] = torch.tensor([int(example[INDEX_COLUMN]) for example in examples])
        return self(batch)


def check_mixup(
    num_classes: int,
    mixup_alpha: float,
    cutmix_alpha: float,
    prob: float,
    switch_prob: float,
    label_smoothing: float,
) -> None:
    """Raise a one-line ValueError naming the bad setting and its allowed range (MixupCutmix's arguments;
    callable alone to check a recipe before any data loads)."""
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes} must be positive.")
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if not value >= 0:  # also refuses NaN
            raise ValueError(
                f"{name}={value} must be >= 0 (0 turns it off; DeiT uses mixup 0.8, cutmix 1.0)."
            )
    if mixup_alpha == 0 and cutmix_alpha == 0:
        raise ValueError("mixup_alpha and cutmix_alpha are both 0: set one above 0, or use no MixupCutmix.")
    # named by the recipe keys (timm's --mixup-prob, --mixup-switch-prob)
    for name, value in (("mixup_prob", prob), ("mixup_switch_prob", switch_prob)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name}={value} must be in [0, 1].")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1) (0.1 is usual).")
