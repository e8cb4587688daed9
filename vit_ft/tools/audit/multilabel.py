"""Label issues of multi-label data (several labels or none per image, a multi-hot `(n, num_labels)` matrix): the
same out-of-fold idea per label, and cleanlab's multi-label confident learning on it.

- `multilabel_probabilities`: for each candidate feature space (the pooled features, the raw pixels), one-vs-rest
  logistic regression on standardised features through `cross_val_predict` over iteratively stratified folds
  (`iterative-stratification`'s MultilabelStratifiedKFold, as the fine-tune's hold-out): each image's
  `(num_labels,)` probabilities come from probes that never saw it; the space of lowest mean binary log-loss is
  chosen, every candidate's figures kept;
- `multilabel_issues`: cleanlab's `multilabel_classification.filter.find_label_issues` with the
  `low_self_confidence` filter (its count is confident learning's one-vs-rest estimate of the wrong label sets, so
  the flags are bounded as the single-label ones are); score 1 - cleanlab's label quality score of the image
  (`multilabel_classification.rank.get_label_quality_scores`), suggestion the labels of probability above 0.5;
- `multilabel_self_check`: the audit's self-check (`labels`) with one label added or removed in 5 % of the images.

    probabilities, probe = multilabel_probabilities({"features": pooled, "pixels": pixels}, matrix)
    flags = multilabel_issues(matrix, probabilities)      # [(row, score, given labels, suggested labels)]
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .findings import FOLDS, Finding
from .labels import SELF_CHECK_FLIP, SELF_CHECK_MIN_FLIPS, SelfCheck, measured
from .probes import LOGISTIC_C, PROBABILITY_FLOOR


@dataclass(frozen=True)
class MultiLabelIssue:
    """One image whose label set the out-of-fold probes doubt: its row, score (higher: surer), given and suggested
    label ids."""

    index: int
    score: float
    given: tuple[int, ...]
    suggested: tuple[int, ...]


def _folds(matrix: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from iterstrat.ml_stratifiers import MultilabelStratifiedKFold

    splitter = MultilabelStratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(matrix)), matrix))


def binary_log_loss(probabilities: np.ndarray, matrix: np.ndarray) -> float:
    """Mean over images and labels of the binary cross-entropy of `(n, num_labels)` probabilities."""
    p = np.clip(probabilities, PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    return float(-np.mean(matrix * np.log(p) + (1 - matrix) * np.log(1 - p)))


def logistic_multilabel(features: np.ndarray, matrix: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """`(n, num_labels)` out-of-fold one-vs-rest logistic probabilities (a label constant in a training fold: its
    rate there)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    values = np.zeros(matrix.shape)
    for train, held in splits:
        scaler = StandardScaler().fit(features[train])
        x_train, x_held = scaler.transform(features[train]), scaler.transform(features[held])
        for label in range(matrix.shape[1]):
            y = matrix[train, label]
            if y.min() == y.max():
                values[held, label] = y.mean()
                continue
            fit = LogisticRegression(C=LOGISTIC_C, max_iter=1000).fit(x_train, y)
            values[held, label] = fit.predict_proba(x_held)[:, 1]
    return values


def multilabel_probabilities(
    spaces: Mapping[str, np.ndarray], matrix: np.ndarray, folds: int = FOLDS, seed: int = 0
) -> tuple[np.ndarray, dict[str, object]]:
    """The out-of-fold `(n, num_labels)` probabilities of the space of lowest mean binary log-loss against the given
    multi-hot `matrix`, and {"chosen", "space", "probe", "log_loss", "accuracy" (exact label sets at 0.5),
    "candidates"} as `probes.best_probe` records them."""
    matrix = np.asarray(matrix, np.int64)
    splits = _folds(matrix, folds, seed)
    candidates: dict[str, dict[str, float]] = {}
    best: tuple[float, str, np.ndarray] | None = None
    for space, features in spaces.items():
        started = time.perf_counter()
        values = logistic_multilabel(np.asarray(features, np.float64), matrix, splits)
        loss = binary_log_loss(values, matrix)
        name = f"{space}/logistic"
        candidates[name] = {"log_loss": round(loss, 4), "seconds": round(time.perf_counter() - started, 2),
                            "accuracy": float(np.mean(((values > 0.5) == matrix).all(axis=1)))}  # fmt: skip
        if best is None or loss < best[0]:
            best = (loss, name, values)
    assert best is not None, "no feature space given"
    loss, chosen, values = best
    return values, {"chosen": chosen, "space": chosen.split("/")[0], "probe": "logistic", "log_loss": round(loss, 4),
                    "accuracy": candidates[chosen]["accuracy"], "candidates": candidates}  # fmt: skip


def label_lists(matrix: np.ndarray) -> list[list[int]]:
    """cleanlab's multi-label format: each image's list of label ids."""
    return [np.flatnonzero(row).tolist() for row in np.asarray(matrix)]


def multilabel_issues(matrix: np.ndarray, probabilities: np.ndarray) -> list[MultiLabelIssue]:
    """The images whose given label set (`(n, num_labels)` multi-hot) the out-of-fold `probabilities` doubt (see the
    module), highest score first."""
    from cleanlab.multilabel_classification.filter import find_label_issues
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    labels = label_lists(matrix)
    with warnings.catch_warnings():  # cleanlab's multi-label filter calls its own deprecated multi_label path
        warnings.simplefilter("ignore", DeprecationWarning)
        # n_jobs=1: cleanlab's default pool of processes can deadlock under threads (see labels._quiet_cleanlab)
        flagged = np.asarray(find_label_issues(labels, probabilities, filter_by="low_self_confidence", n_jobs=1), bool)
    quality = get_label_quality_scores(labels, probabilities)
    rows = sorted(np.flatnonzero(flagged), key=lambda i: quality[i])
    return [MultiLabelIssue(int(i), float(1 - quality[i]), tuple(labels[i]),
                            tuple(np.flatnonzero(probabilities[i] > 0.5).tolist())) for i in rows]  # fmt: skip


def flip_label_sets(matrix: np.ndarray, fraction: float = SELF_CHECK_FLIP, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A copy of the multi-hot `matrix` with `fraction` of its images (at least SELF_CHECK_MIN_FLIPS, at most half)
    given one label added or removed (drawn uniformly, seeded), and the flipped rows, sorted."""
    rng = np.random.default_rng(seed)
    count = min(len(matrix) // 2, max(SELF_CHECK_MIN_FLIPS, round(fraction * len(matrix))))
    rows = np.sort(rng.choice(len(matrix), size=count, replace=False))
    flipped = np.asarray(matrix, np.int64).copy()
    flipped[rows, rng.integers(0, matrix.shape[1], count)] ^= 1
    return flipped, rows


def multilabel_self_check(
    matrix: np.ndarray, found: Sequence[Finding], probe: Callable[[np.ndarray], np.ndarray],
    fraction: float = SELF_CHECK_FLIP, seed: int = 0,
) -> SelfCheck:  # fmt: skip
    """`labels.self_check` on label sets: flip (`flip_label_sets`), run `probe` (flipped matrix -> out-of-fold
    probabilities) and `multilabel_issues` again, and measure the flags against the known flips (`labels.measured`,
    `found`: the audit's flags before the flips)."""
    flipped, rows = flip_label_sets(matrix, fraction, seed)
    probabilities = probe(flipped)
    flagged, scores = np.zeros(len(matrix), bool), np.zeros(len(matrix))
    for issue in multilabel_issues(flipped, probabilities):
        flagged[issue.index], scores[issue.index] = True, issue.score
    doubted = np.zeros(len(matrix), bool)
    doubted[[f.index for f in found]] = True
    recall, precision, min_score = measured(flagged, scores, rows, doubted)
    return SelfCheck(rows, flipped, probabilities, flagged, recall, precision, min_score)


__all__ = ["MultiLabelIssue", "binary_log_loss", "label_lists", "logistic_multilabel", "multilabel_issues",
           "multilabel_probabilities", "flip_label_sets", "multilabel_self_check"]  # fmt: skip
