"""Label issues bounded by what the out-of-fold probabilities can tell, and the audit's measure of itself.

- `label_issues`: confident learning's estimate of how many labels are wrong (cleanlab's `num_label_issues`, the
  off-diagonal of the confident joint calibrated to the given labels' counts) bounds how many images are flagged;
  those flagged are the ones whose given label has the lowest out-of-fold probability (cleanlab's
  `low_self_confidence` ranking, as its docs recommend for a cut-off with that count). Each flag: score 1 - p(given), suggested label the most
  probable other class. The earlier rule ("p(given) < 0.5, or cleanlab") flooded on a weak backbone (issue 46:
  2,559 of 4,030 images flagged at precision 0.077): its count had no bound but the data's size.
- `self_check`: a known fraction of the labels flipped in a copy of the out-of-fold problem (the features and
  labels the probe was fitted on), the probe and the flagging run again, and the recall and precision reached on
  those known flips reported; the score from which the flags reach PRECISION_FLOOR too. The warning reads the
  precision's lower confidence bound, not its estimate: the flags the audit doubted before the flips count as
  right at the estimated precision, which is optimistic where those are the probe's own confident mistakes (a
  10-epoch backbone on clean digits, uncalibrated count: 152 false flags, the estimate 0.52; its lower bound 0.45 warns).

    found, estimate = label_issues(labels, probabilities)
    check = self_check(features, labels, found, lambda y: probe_probabilities("logistic", features, y, k))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .findings import Finding, require_cleanlab

# below this estimated precision a flagged label is more likely right than wrong: relabelling the flags would
# corrupt more labels than it fixes, so the CLI warns and relabel.csv proposes only flags scored where the
# self-check measured at least this precision
PRECISION_FLOOR = 0.5
SELF_CHECK_FLIP = 0.05  # the issue's targets are stated at 5 % flipped labels; small enough to leave the data itself
SELF_CHECK_MIN_FLIPS = 10  # fewer known flips give a recall and precision too coarse to read
# relabel.csv's cut-off asks the precision's one-sided 95 % lower bound (Wilson) to reach PRECISION_FLOOR: read from
# a few dozen known flips, the plain precision at the cut-off promised 0.5 where the truth was 0.37 (docs/tools.md)
CONFIDENCE_Z = 1.645
# how many labels confident learning estimates wrong: the joint calibrated to the given labels' counts, cleanlab's
# "most accurate estimate" (count.num_label_issues). The uncalibrated off-diagonal count (find_label_issues' own)
# stopped at 61 where 72 + 10 labels were wrong (digits, a kNN on 16x16 raw pixels: recall 0.79; calibrated, 77 flags:
# 0.96 at precision 0.96); on the same digits without faults, 10 and 11 flags of 1,437
NOISE_ESTIMATE = "off_diagonal_calibrated"


@dataclass(frozen=True)
class NoiseEstimate:
    """What confident learning estimates of the labels: `issues` wrong labels among `images` (its flag count)."""

    issues: int
    images: int

    @property
    def rate(self) -> float:
        return self.issues / max(1, self.images)


def _quiet_cleanlab(labels: np.ndarray, probabilities: np.ndarray, **options: object) -> np.ndarray:
    find_label_issues = require_cleanlab()
    # n_jobs=1: cleanlab's default forks a multiprocessing pool, whose workers can deadlock when the process already
    # runs threads (torch's, a test runner's: seen hanging in CI); one process is a fraction of a second here
    return np.asarray(find_label_issues(labels, probabilities, n_jobs=1, **options))


def flagged_rows(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """`(n,)` bool: the NOISE_ESTIMATE count of images (cleanlab's `num_label_issues`) of lowest p(given) (its
    `rank.get_label_quality_scores(method="self_confidence")`): cleanlab's `low_self_confidence` filter with the
    calibrated count."""
    from cleanlab.count import num_label_issues
    from cleanlab.rank import get_label_quality_scores

    labels = np.asarray(labels, np.int64)
    flagged = np.zeros(len(labels), bool)
    if len(np.unique(labels)) < 2:
        return flagged
    count = int(num_label_issues(labels, probabilities, estimation_method=NOISE_ESTIMATE))
    scores = get_label_quality_scores(labels, probabilities, method="self_confidence")
    flagged[np.argsort(scores, kind="stable")[:count]] = True
    return flagged


def label_issues(labels: np.ndarray, probabilities: np.ndarray) -> tuple[list[Finding], NoiseEstimate]:
    """The label issues among images with given `labels` and out-of-fold `(n, num_classes)` probabilities, at most
    confident learning's estimate of the wrong labels (see the module), and that estimate."""
    labels = np.asarray(labels, np.int64)
    flagged = flagged_rows(labels, probabilities)
    given = probabilities[np.arange(len(labels)), labels]
    others = probabilities.copy()
    others[np.arange(len(labels)), labels] = -1  # the suggestion is another class, even where the given one leads
    found = [Finding("train", int(i), "label_issue", float(1 - given[i]), int(labels[i]),
                     int(others[i].argmax())) for i in np.flatnonzero(flagged)]  # fmt: skip
    return found, NoiseEstimate(int(flagged.sum()), len(labels))


def cleanlab_default(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """`(n,)` cleanlab's default filter (prune by noise rate) on the same probabilities: the comparison."""
    return _quiet_cleanlab(np.asarray(labels, np.int64), probabilities, filter_by="prune_by_noise_rate").astype(bool)


@dataclass(frozen=True)
class SelfCheck:
    """The self-check's outcome: `rows` whose labels were flipped to `labels` (the whole flipped copy), the
    probabilities the probe gave it, the rows it flagged, the recall and precision on the known flips, and
    `min_score`, the lowest flag score from which its flags reached PRECISION_FLOOR, as a lower bound (inf: none
    did)."""

    rows: np.ndarray
    labels: np.ndarray
    probabilities: np.ndarray
    flagged: np.ndarray
    recall: float
    precision: float
    min_score: float

    @property
    def precision_low(self) -> float:
        """The precision's one-sided 95 % lower bound (Wilson, over the flags): what the warning reads."""
        return float(lower_bound(np.array([self.precision]), np.array([max(1, int(self.flagged.sum()))]))[0])

    def summary(self) -> dict[str, float | int]:
        return {"flipped": len(self.rows), "flagged": int(self.flagged.sum()), "recall": round(self.recall, 4),
                "precision": round(self.precision, 4), "precision_low": round(self.precision_low, 4),
                "min_score": None if np.isinf(self.min_score) else round(self.min_score, 4)}  # fmt: skip


def flip_labels(
    labels: np.ndarray, num_classes: int, fraction: float = SELF_CHECK_FLIP, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A copy of `labels` with `fraction` of them (at least SELF_CHECK_MIN_FLIPS, at most half) moved to another
    class drawn uniformly (seeded), and the flipped rows, sorted."""
    rng = np.random.default_rng(seed)
    count = min(len(labels) // 2, max(SELF_CHECK_MIN_FLIPS, round(fraction * len(labels))))
    rows = np.sort(rng.choice(len(labels), size=count, replace=False))
    flipped = np.asarray(labels, np.int64).copy()
    flipped[rows] = (flipped[rows] + rng.integers(1, num_classes, count)) % num_classes
    return flipped, rows


def corrected_precision(hits: np.ndarray, new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """The precision p of flags of which `hits` are known flips, `new` neither flips nor doubted before, and `old`
    not flips but doubted by the audit before the flips (their truth unknown: counted right at the rate p
    itself). p solves p = hits / (hits + new + (1 - p) old), the root in [0, 1]; arrays, element-wise."""
    hits, new, old = (np.asarray(v, np.float64) for v in (hits, new, old))
    total = hits + new + old
    root = np.sqrt(np.maximum(total**2 - 4 * old * hits, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        quadratic = (total - root) / (2 * old)
        plain = hits / (hits + new)
    return np.nan_to_num(np.where(old > 0, quadratic, plain))


def lower_bound(precision: np.ndarray, count: np.ndarray, z: float = CONFIDENCE_Z) -> np.ndarray:
    """Wilson's lower confidence bound of a `precision` measured on `count` flags (element-wise)."""
    p, n = np.asarray(precision, np.float64), np.asarray(count, np.float64)
    centre = p + z**2 / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return (centre - spread) / (1 + z**2 / n)


def measured(flagged: np.ndarray, scores: np.ndarray, rows: np.ndarray, doubted: np.ndarray) -> tuple[float, float, float]:
    """Recall and precision of the `(n,)` bool `flagged` on the known flipped `rows`, and the lowest score from
    which the flags reach PRECISION_FLOOR (its lower bound, `lower_bound`). The flags on rows the audit `doubted` before the flips (and that were
    not flipped) are of unknown truth: the data's own wrong labels must not count against the precision, nor its
    right ones for it, so they count as right at the precision measured on the rest (`corrected_precision`)."""
    known = np.zeros(len(flagged), bool)
    known[rows] = True
    recall = float((flagged & known).sum() / max(1, len(rows)))
    order = np.argsort(-np.where(flagged, scores, -np.inf), kind="stable")[: int(flagged.sum())]  # highest first
    hits = np.cumsum(known[order])
    old = np.cumsum(~known[order] & doubted[order])
    precisions = corrected_precision(hits, np.arange(1, len(order) + 1) - hits - old, old)
    precision = float(precisions[-1]) if len(order) else 0.0
    above = np.flatnonzero(lower_bound(precisions, np.arange(1, len(order) + 1)) >= PRECISION_FLOOR)
    min_score = float(scores[order][above[-1]]) if len(above) else float("inf")
    return recall, precision, min_score


def self_check(
    labels: np.ndarray, found: list[Finding], num_classes: int, probe: Callable[[np.ndarray], np.ndarray],
    fraction: float = SELF_CHECK_FLIP, seed: int = 0,
) -> SelfCheck:  # fmt: skip
    """Flip `fraction` of `labels` (seeded), run `probe` (flipped labels -> `(n, num_classes)` out-of-fold
    probabilities, the audit's own probe on the same features) and `flagged_rows` again, and measure what it
    found against the known flips (`measured`; `found`: the audit's flags before the flips)."""
    flipped, rows = flip_labels(labels, num_classes, fraction, seed)
    probabilities = probe(flipped)
    flagged = flagged_rows(flipped, probabilities)
    scores = 1 - probabilities[np.arange(len(flipped)), flipped]
    doubted = np.zeros(len(labels), bool)
    doubted[[f.index for f in found]] = True
    recall, precision, min_score = measured(flagged, scores, rows, doubted)
    return SelfCheck(rows, flipped, probabilities, flagged, recall, precision, min_score)


def quality_record(probe: dict[str, Any], estimate: NoiseEstimate, check: SelfCheck, found: list[Finding]) -> dict[str, Any]:
    """audit.json's "quality": the chosen probe's out-of-fold accuracy, the noise estimate, the self-check's
    precision (and its lower bound, which the warning reads) and recall, and how many flags relabel.csv proposes."""
    low = check.precision_low < PRECISION_FLOOR
    min_score = check.min_score if low else 0.0  # all proposed when precise enough
    features = [c["log_loss"] for name, c in probe["candidates"].items() if name.startswith("features/")]
    return {
        "accuracy": probe["accuracy"], "noise_rate": round(estimate.rate, 4), "estimated_issues": estimate.issues,
        "precision": round(check.precision, 4), "precision_low": round(check.precision_low, 4),
        "recall": round(check.recall, 4), "flipped": len(check.rows), "precision_floor": PRECISION_FLOOR,
        "low_precision": low, "source": probe["space"],
        # the model's features gave the given labels a lower likelihood than the raw pixels: a weak backbone
        "weaker_than_pixels": probe["space"] == "pixels" and bool(features),
        "features_log_loss": min(features) if features else None,
        "min_score": None if np.isinf(min_score) else round(min_score, 4),
        "proposed": sum(f.score >= min_score for f in found), "self_check": check.summary(),
    }  # fmt: skip


__all__ = ["PRECISION_FLOOR", "SELF_CHECK_FLIP", "NoiseEstimate", "SelfCheck", "cleanlab_default",
           "corrected_precision", "flagged_rows", "flip_labels", "label_issues", "lower_bound", "measured",
           "quality_record", "self_check"]  # fmt: skip
