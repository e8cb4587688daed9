"""The audit's detectors, pure numpy on features the model gave (and small pixel descriptors):

- `out_of_fold_probabilities`: k-fold least-squares probes (the few-shot tool's `fit_least_squares`) on frozen
  features; each image's class probabilities come from the probe that did not see it, softmax of its scores at
  the temperature fitted on all of them (`metrics.calibration.fit_temperature`);
  (one of the candidates of `probes`; label issues and the self-check on them: `labels`);
- `copies`: near-duplicates within the training images and leaks between them and the held-out ones, by cosine
  similarity of the pooled features or of the downsampled pixels (`pixel_descriptor`: exact and resized copies,
  recompressed ones too);
- `outliers`: the cosine distance to the k-th nearest other training image in both feature spaces of the
  feature bank (`tasks.feature_bank`), over its `OUTLIER_QUANTILE` among the training images; above 1 flagged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ...metrics.calibration import fit_temperature, negative_log_likelihood, softmax_with_temperature
from ...tasks.feature_bank import FeatureBank, normalized
from ...utils.progress import Progress
from ..fewshot.probe import L2_GRID, fit_least_squares

FOLDS = 5  # k of the k-fold probes: each sees 80 % of the images
PIXEL_SIZE = 16  # the pixel descriptor's side: small enough that a resized or recompressed copy keeps it
PIXEL_SMOOTH = 32  # every image resized to this first, so that upscaled copies and originals share one blur
# cosine of two pixel descriptors from which they are one image: on digits (8x8 images, alike by nature) copies at
# 2-3x the size as JPEG of quality 60-90 measured >= 0.9962, distinct images <= 0.9942 (docs/tools.md, Audit)
PIXEL_COPY = 0.995
# two images are one in the model's eyes when their centred pooled features are closer (cosine distance) than this
# fraction of the median distance of a training image to its nearest other: a scale of the backbone's own, since a
# small or weak one packs all images within 1e-4 of each other (measured on digits: absolute thresholds flagged
# hundreds of pairs there, and no leak a pixel descriptor missed)
FEATURE_COPY = 0.02
OUTLIER_NEIGHBOURS = 10  # k of the k-th nearest neighbour distance (the feature bank's OOD_NEIGHBOURS)
OUTLIER_QUANTILE = 0.99  # of the training images' own distances, per space: about 1 % flagged by chance


@dataclass(frozen=True)
class Finding:
    """One row of findings.csv: an image (`index` into its split), what kind of finding, its score (higher: surer),
    the given and suggested label ids (-1: none; for multi-label data a tuple of ids, the label set) and for a copy
    the other image (`other_split`, `other_index`)."""

    split: str
    index: int
    kind: str
    score: float
    given: int | tuple[int, ...] = -1
    suggested: int | tuple[int, ...] = -1
    other_split: str = ""
    other_index: int = -1


def stratified_folds(labels: np.ndarray, folds: int = FOLDS, seed: int = 0) -> np.ndarray:
    """`(n,)` fold ids: each class's images shuffled (seeded) and dealt round-robin, so every fold holds each
    class about equally."""
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(labels), np.int64)
    for label in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == label))
        fold[rows] = np.arange(len(rows)) % folds
    return fold


def out_of_fold_probabilities(
    features: np.ndarray, labels: np.ndarray, num_classes: int, folds: int = FOLDS, seed: int = 0,
    l2_grid: Sequence[float] = L2_GRID,
) -> tuple[np.ndarray, dict[str, float]]:  # fmt: skip
    """`(n, num_classes)` out-of-fold class probabilities of `(n, hidden)` features with given `labels`, and the
    probe's settings {"l2", "temperature", "accuracy"} (the out-of-fold accuracy against the given labels). The
    l2 is the grid's value whose out-of-fold scores, at their fitted temperature, give the given labels the
    highest likelihood (one eigendecomposition per fold serves all): confident learning needs calibrated
    probabilities, which the most accurate l2 (often the strongest, its scores flat) does not give."""
    labels = np.asarray(labels, np.int64)
    fold = stratified_folds(labels, folds, seed)
    scores = {l2: np.zeros((len(labels), num_classes)) for l2 in l2_grid}
    with Progress(folds, "Out-of-fold probes", unit="fold") as progress:
        for k in range(folds):
            held = fold == k
            if held.any():
                fit = fit_least_squares(features[~held], labels[~held], num_classes)
                design = fit.design(features[held])
                for l2 in l2_grid:
                    scores[l2][held] = design @ fit.weights(l2)
            progress.update()
    fits = {}
    for l2, values in scores.items():
        values = values / max(float(values.std()), 1e-12)  # strong l2 shrinks the scores: keep T in its range
        temperature = fit_temperature(values, labels)
        fits[l2] = (negative_log_likelihood(values, labels, temperature), temperature, values)
    l2 = min(sorted(l2_grid, reverse=True), key=lambda v: fits[v][0])  # ties: the strongest regularisation
    _, temperature, values = fits[l2]
    probabilities = softmax_with_temperature(values, temperature).numpy()
    accuracy = {l2: float(np.mean(probabilities.argmax(1) == labels))}
    return probabilities, {"l2": float(l2), "temperature": float(temperature), "accuracy": accuracy[l2]}


def require_cleanlab() -> Any:
    """cleanlab's `find_label_issues`; without cleanlab installed a ValueError saying how to get it (checked
    before the audit loads anything)."""
    try:
        from cleanlab.filter import find_label_issues
    except ImportError as error:
        raise ValueError(
            "vit-ft audit finds label issues with cleanlab, which is not installed: pip install 'vit-ft[audit]' "
            "(or pip install cleanlab)."
        ) from error
    return find_label_issues


def disagreements(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """The plain baseline: `(n,)` whether the most probable class is not the given label."""
    return probabilities.argmax(1) != np.asarray(labels)


def pixel_descriptor(image: Image.Image, size: int = PIXEL_SIZE) -> np.ndarray:
    """`(size * size,)` float32: the image in grey, resized to `PIXEL_SMOOTH` a side (bilinear: an upscaled copy
    and its original get the same blur) and averaged down to `size`, centred and of unit norm, so that a copy at
    another size, JPEG quality or brightness scale has a cosine near 1 with its original."""
    grey = image.convert("L").resize((PIXEL_SMOOTH, PIXEL_SMOOTH), Image.Resampling.BILINEAR)
    values = np.asarray(grey.resize((size, size), Image.Resampling.BOX), np.float32).ravel()
    values = values - values.mean()
    return values / max(float(np.linalg.norm(values)), 1e-6)


def _similar_pairs(
    queries: np.ndarray, keys: np.ndarray, threshold: float, same: bool
) -> dict[tuple[int, int], float]:
    """{(query, key): cosine} of the pairs of `(m, d)` queries and `(n, d)` keys (both unit norm) whose cosine is
    at least `threshold`; with `same` (queries are the keys) each pair once, self left out."""
    found: dict[tuple[int, int], float] = {}
    for start in range(0, len(queries), 1024):
        similarity = queries[start : start + 1024] @ keys.T  # (chunk, keys)
        if same:
            similarity[np.arange(len(similarity)), np.arange(start, start + len(similarity))] = -1
        for i, j in zip(*np.nonzero(similarity >= threshold), strict=True):
            pair = (int(i) + start, int(j))
            if same and pair[0] > pair[1]:
                pair = (pair[1], pair[0])
            found[pair] = float(similarity[i, j])
    return found


def feature_copy_threshold(features: np.ndarray, fraction: float = FEATURE_COPY) -> float:
    """The cosine from which two of these unit `(n, d)` features are one image: 1 - `fraction` of the median
    distance from an image to its nearest other."""
    nearest = np.zeros(len(features), np.float32)
    for start in range(0, len(features), 1024):
        similarity = features[start : start + 1024] @ features.T
        similarity[np.arange(len(similarity)), np.arange(start, start + len(similarity))] = -1
        nearest[start : start + 1024] = similarity.max(axis=1)
    return float(1 - fraction * np.median(1 - nearest))


def copies(
    train: dict[str, np.ndarray], held_out: dict[str, dict[str, np.ndarray]], pixel_copy: float = PIXEL_COPY,
    feature_copy: float = FEATURE_COPY,
) -> list[Finding]:  # fmt: skip
    """Duplicates within the training images and leaks of held-out ones into them. `train` and each split of
    `held_out` are {"features": `(n, hidden)`, "pixels": `(n, PIXEL_SIZE**2)`}; a pair is one image when its pixel
    descriptors' cosine is at least `pixel_copy` or its features (centred on the training images' mean: pooled
    features share a large common part) are closer than `feature_copy_threshold`. Score: the pixel cosine, or
    the feature cosine where only the features match. A duplicate names the later training image (the earlier
    one is kept), a leak the training image (the held-out image is `other`)."""
    centre = train["features"].mean(axis=0)
    features = normalized(train["features"] - centre)
    threshold = feature_copy_threshold(features, feature_copy)

    def pairs(query: dict[str, np.ndarray], query_features: np.ndarray, same: bool) -> dict[tuple[int, int], float]:
        by_features = _similar_pairs(query_features, features, threshold, same)
        by_pixels = _similar_pairs(normalized(query["pixels"]), normalized(train["pixels"]), pixel_copy, same)
        return {**by_features, **by_pixels}  # the pixel cosine where both match

    found = [Finding("train", j, "duplicate", score, other_split="train", other_index=i)
             for (i, j), score in pairs(train, features, same=True).items()]  # fmt: skip
    for split, values in held_out.items():
        held = pairs(values, normalized(values["features"] - centre), same=False)
        found += [Finding("train", j, "leak", score, other_split=split, other_index=i) for (i, j), score in held.items()]
    return found


def outlier_scores(bank: FeatureBank, k: int = OUTLIER_NEIGHBOURS, quantile: float = OUTLIER_QUANTILE) -> np.ndarray:
    """`(n,)` each bank image's cosine distance to its k-th nearest other bank image, over that distance's
    `quantile` among all of them, in each space of the bank; the larger of the spaces (as the OOD score)."""
    ratios = []
    for space in ("features", "input"):
        if space == "input" and bank.input is None:
            continue
        similarities, _ = bank.neighbours(bank.space(space), k + 1, space)  # the first is the image itself
        distance = 1.0 - similarities[:, -1]
        ratios.append(distance / max(float(np.quantile(distance, quantile)), 1e-12))
    return np.max(ratios, axis=0)


def outliers(scores: np.ndarray, labels: np.ndarray) -> list[Finding]:
    """The images whose outlier score is above 1."""
    return [Finding("train", int(i), "outlier", float(scores[i]), int(labels[i])) for i in np.flatnonzero(scores > 1)]


__all__ = [
    "FEATURE_COPY",
    "FOLDS",
    "Finding",
    "OUTLIER_NEIGHBOURS",
    "OUTLIER_QUANTILE",
    "PIXEL_COPY",
    "PIXEL_SIZE",
    "copies",
    "feature_copy_threshold",
    "disagreements",
    "out_of_fold_probabilities",
    "outlier_scores",
    "outliers",
    "pixel_descriptor",
    "require_cleanlab",
    "stratified_folds",
]
