"""Which training images a few-shot evaluation fits on: for each seed, k images per class for every k (nested,
so the 5 images of a class include its 1) and a held-out part for choosing the regularisation, disjoint from
them. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class FewShotDraw:
    """One seed's choice of training rows: the held-out rows (for choosing l2) and, for each k, the k-shot
    rows; the k-shot sets are nested (the 5 images of a class include its 1) and disjoint from the held-out."""

    seed: int
    holdout: np.ndarray  # (num_holdout,) row indices into the training split
    shots: dict[int, np.ndarray]  # k -> (k * num_classes,) row indices


def holdout_count(class_size: int, fraction: float, max_per_class: int) -> int:
    """How many of a class's training images are held out: `fraction` of them, at least 1, at most
    `max_per_class` (enough to choose l2; more would only cost feature extraction on large datasets)."""
    return max(1, min(max_per_class, round(fraction * class_size)))


def draw_fewshot(
    labels: np.ndarray,
    num_classes: int,
    shots: Sequence[int],
    seed: int,
    holdout_fraction: float = 0.2,
    max_holdout_per_class: int = 50,
    excluded: Sequence[int] | np.ndarray = (),
    names: Sequence[str] | None = None,
) -> FewShotDraw:
    """For each class, a seeded permutation of its training rows (`labels`: the class of each row): the first
    `holdout_count` rows are held out, the next k are the k-shot images. `excluded` rows (images that do not
    decode) are skipped without changing which other rows a seed picks. A class with too few images for the
    largest k is a ValueError naming it and the largest k that fits."""
    labels = np.asarray(labels)
    excluded = np.asarray(sorted(set(int(i) for i in excluded)), dtype=np.int64)
    rng = np.random.default_rng(seed)
    holdout, pools = [], []
    for c in range(num_classes):
        order = rng.permutation(np.flatnonzero(labels == c))  # drawn before exclusions: stable picks
        order = order[~np.isin(order, excluded)]
        held = holdout_count(len(order), holdout_fraction, max_holdout_per_class)
        holdout.append(order[:held])
        pools.append(order[held:])
    largest = max(shots)
    sizes = [len(pool) for pool in pools]
    if min(sizes) < largest:
        c = int(np.argmin(sizes))
        name = names[c] if names is not None else str(c)
        raise ValueError(
            f"--shots {largest} needs {largest} training images per class, but class {name!r} has "
            f"{sizes[c]} once {len(holdout[c])} are held out for choosing the regularisation; pass --shots "
            f"values up to {sizes[c]}, or a smaller --holdout_fraction."
        )
    return FewShotDraw(
        seed=seed,
        holdout=np.concatenate(holdout),
        shots={k: np.concatenate([pool[:k] for pool in pools]) for k in shots},
    )


__all__ = ["FewShotDraw", "draw_fewshot", "holdout_count"]
