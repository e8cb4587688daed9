"""The audit's out-of-fold probabilities: several probes on each candidate feature space (the frozen pooled features,
and the images' raw pixels downscaled to 8x8 grey (`pixel_space`), the anchor a weak backbone must beat), each giving every training image
class probabilities from a probe fitted on the other folds, and the candidate whose probabilities give the given
labels the highest likelihood (lowest out-of-fold log-loss) chosen; every candidate's figures are kept. With the
pixels among the candidates the chosen source is never worse, by that measure, than cleanlab on raw pixels (issue
46: a 10-epoch digits backbone's best probe reached 65 % out of fold, the pixels' kNN 92 %).

- `least_squares`: the few-shot tool's ridge probe, l2 and temperature fitted on the out-of-fold scores
  (`findings.out_of_fold_probabilities`);
- `logistic`: scikit-learn's LogisticRegression on standardised features (`cross_val_predict`, `predict_proba`);
- `knn`: scikit-learn's KNeighborsClassifier on L2-normalised features (cosine neighbours, DINOv2's k = 20 where
  the folds allow it, weighted by distance), its votes smoothed by one vote spread over the classes so that no
  class is impossible (confident learning and the log-loss need every probability above 0).

    probabilities, probe = best_probe({"features": pooled, "pixels": pixels}, labels, num_classes, folds=5, seed=0)
    probe["chosen"], probe["space"], probe["candidates"]["pixels/knn"]["log_loss"]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ...tasks.feature_bank import normalized
from .findings import FOLDS, out_of_fold_probabilities, stratified_folds

PROBES = ("least_squares", "logistic", "knn")
KNN_NEIGHBOURS = 20  # DINOv2's kNN protocol (PEERS.md); fewer where a training fold is smaller
LOGISTIC_C = 1.0  # scikit-learn's default strength on standardised features: no grid, the folds are the budget
PROBABILITY_FLOOR = 1e-6
# the pixel candidate's side: the copies' 16x16 descriptor averaged down to 8x8 (the anchor's size). Measured on
# digits: the same flags from kNN, and logistic regression 5-20x faster (64 inputs, not 256) at a lower log-loss
PIXEL_PROBE_SIZE = 8  # log-loss of a probability of 0 is infinite: one wrong neighbour vote must not decide


def _splits(labels: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    fold = stratified_folds(labels, folds, seed)
    return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(folds) if (fold == k).any()]


def _sklearn_probabilities(
    estimator: object, features: np.ndarray, labels: np.ndarray, num_classes: int,
    splits: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:  # fmt: skip
    """`(n, num_classes)` out-of-fold `predict_proba` (a class missing from a fold's training rows gets 0)."""
    import warnings

    from sklearn.model_selection import cross_val_predict

    with warnings.catch_warnings():  # a class absent from one training fold: its column is 0 there, as intended
        warnings.simplefilter("ignore")
        values = cross_val_predict(estimator, features, labels, cv=splits, method="predict_proba")
    full = np.zeros((len(labels), num_classes))
    full[:, np.unique(labels)] = values  # cross_val_predict's columns are the classes present, in order
    return full


def logistic_probabilities(
    features: np.ndarray, labels: np.ndarray, num_classes: int, splits: list[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """Out-of-fold multinomial logistic regression on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    estimator = make_pipeline(StandardScaler(), LogisticRegression(C=LOGISTIC_C, max_iter=1000))
    return _sklearn_probabilities(estimator, features, labels, num_classes, splits)


def knn_probabilities(
    features: np.ndarray, labels: np.ndarray, num_classes: int, splits: list[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """Out-of-fold distance-weighted kNN votes on unit features, smoothed by one vote spread over the classes."""
    from sklearn.neighbors import KNeighborsClassifier

    k = max(1, min(KNN_NEIGHBOURS, min(len(train) for train, _ in splits) - 1))
    estimator = KNeighborsClassifier(n_neighbors=k, weights="distance")
    votes = _sklearn_probabilities(estimator, normalized(features), labels, num_classes, splits)
    return (k * votes + 1.0 / num_classes) / (k + 1)


def least_squares_probabilities(
    features: np.ndarray, labels: np.ndarray, num_classes: int, folds: int, seed: int
) -> np.ndarray:
    """The ridge probe of `findings.out_of_fold_probabilities` (its own l2 and temperature)."""
    probabilities, _ = out_of_fold_probabilities(features, labels, num_classes, folds, seed)
    return probabilities


def probe_probabilities(
    name: str, features: np.ndarray, labels: np.ndarray, num_classes: int, folds: int = FOLDS, seed: int = 0
) -> np.ndarray:
    """`(n, num_classes)` out-of-fold probabilities of the probe `name` (one of PROBES), rows summing to 1."""
    labels = np.asarray(labels, np.int64)
    if name == "least_squares":
        values = least_squares_probabilities(features, labels, num_classes, folds, seed)
    else:
        fit: Callable[..., np.ndarray] = {"logistic": logistic_probabilities, "knn": knn_probabilities}[name]
        values = fit(features, labels, num_classes, _splits(labels, folds, seed))
    values = np.clip(values, PROBABILITY_FLOOR, None)
    return values / values.sum(axis=1, keepdims=True)


def pixel_space(descriptors: np.ndarray, size: int = PIXEL_PROBE_SIZE) -> np.ndarray:
    """`(n, side**2)` pixel descriptors (`findings.pixel_descriptor`, side a multiple of `size`) averaged down to
    `(n, size**2)` and L2-normalised: the raw-pixel candidate space of the probes."""
    side = int(round(np.sqrt(descriptors.shape[1])))
    factor = side // size
    pooled = descriptors.reshape(len(descriptors), size, factor, size, factor).mean(axis=(2, 4))  # (n, size, size)
    return normalized(pooled.reshape(len(descriptors), size * size))


def log_loss(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log-probability of the given labels."""
    return float(-np.mean(np.log(probabilities[np.arange(len(labels)), labels])))


# a candidate from outside the probes (`--oof finetune`'s k-fold fine-tunes): (labels, what) -> `(n, num_classes)`
# out-of-fold probabilities; `what` names the pass in its progress ("out-of-fold", or "self-check" on flipped labels)
Source = Callable[[np.ndarray, str], np.ndarray]


def best_probe(
    spaces: Mapping[str, np.ndarray] | np.ndarray, labels: np.ndarray, num_classes: int, folds: int = FOLDS,
    seed: int = 0, probes: Sequence[str] = PROBES, extra: Mapping[str, Source] | None = None,
    pick: str | None = None,
) -> tuple[np.ndarray, dict[str, object]]:  # fmt: skip
    """The out-of-fold probabilities of the candidate (a probe on one feature space: `{space: (n, d)}`, a bare
    array is the space "features"; or one of `extra`, "space/name": `Source`) with the lowest log-loss against
    the given labels, and {"chosen": "space/probe", "space", "probe", "accuracy", "log_loss", "candidates":
    {"space/probe": {"log_loss", "accuracy", "seconds"}}}. Log-loss, not accuracy: confident learning reads the
    probabilities themselves, and a probe with the same accuracy but overconfident mistakes would flag more
    right labels. `pick` names a candidate taken whatever its log-loss (`--oof_pick finetune`: the lowest
    log-loss against labels that hold flips favours features that learned them); "picked_by" says which rule."""
    labels = np.asarray(labels, np.int64)
    spaces = {"features": spaces} if isinstance(spaces, np.ndarray) else dict(spaces)
    sources: dict[str, Callable[[], np.ndarray]] = {
        f"{space}/{name}": functools.partial(probe_probabilities, name, features, labels, num_classes, folds, seed)
        for space, features in spaces.items() for name in probes
    }  # fmt: skip
    sources.update({name: functools.partial(source, labels, "out-of-fold") for name, source in (extra or {}).items()})
    candidates: dict[str, dict[str, float]] = {}
    best: tuple[float, str, np.ndarray] | None = None
    for candidate, source in sources.items():
        started = time.perf_counter()
        probabilities = source()
        loss = log_loss(probabilities, labels)
        candidates[candidate] = {"log_loss": round(loss, 4), "seconds": round(time.perf_counter() - started, 2),
                                 "accuracy": float(np.mean(probabilities.argmax(1) == labels))}  # fmt: skip
        if best is None or (loss < best[0] and best[1] != pick) or candidate == pick:
            best = (loss, candidate, probabilities)
    assert best is not None, "no probe given"
    loss, chosen, probabilities = best
    space, name = chosen.split("/")
    return probabilities, {"chosen": chosen, "space": space, "probe": name, "accuracy": candidates[chosen]["accuracy"],
                           "log_loss": candidates[chosen]["log_loss"], "candidates": candidates,
                           "picked_by": "asked" if chosen == pick else "log-loss"}  # fmt: skip


__all__ = ["KNN_NEIGHBOURS", "PIXEL_PROBE_SIZE", "PROBES", "Source", "best_probe", "knn_probabilities", "log_loss", "logistic_probabilities",
           "pixel_space", "probe_probabilities"]  # fmt: skip
