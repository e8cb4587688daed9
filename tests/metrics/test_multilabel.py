"""Tests for vit_ft.metrics.multilabel: every number against scikit-learn's own function."""

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, average_precision_score, f1_score
from transformers import EvalPrediction

from vit_ft.metrics.multilabel import (
    MULTILABEL_METRIC_NAMES,
    average_precision_per_class,
    build_multilabel_compute_metrics,
    check_threshold,
    mean_average_precision,
    multilabel_metrics,
    per_class_metrics,
    sigmoid,
    tune_class_thresholds,
    tune_global_threshold,
)


def _data(seed: int = 0, n: int = 60, k: int = 5, ties: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, k)) < np.linspace(0.1, 0.6, k)).astype(np.int64)
    scores = np.clip(0.35 * labels + rng.random((n, k)) * 0.7, 0, 1)
    if ties:  # rounded scores make runs of equal scores, the case where AP definitions differ
        scores = np.round(scores, 1)
    return labels, scores


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_average_precision_matches_sklearn(seed, ties):
    labels, scores = _data(seed, ties=ties)
    expected = average_precision_score(labels, scores, average=None)
    np.testing.assert_allclose(average_precision_per_class(labels, scores), expected, rtol=1e-12)
    expected_macro = average_precision_score(labels, scores, average="macro")
    assert mean_average_precision(labels, scores) == pytest.approx(expected_macro, rel=1e-12)


def test_class_without_positives_is_left_out_of_map():
    labels, scores = _data(3)
    labels[:, 2] = 0
    per_class = average_precision_per_class(labels, scores)
    assert np.isnan(per_class[2]) and not np.isnan(np.delete(per_class, 2)).any()
    kept = [0, 1, 3, 4]
    expected = average_precision_score(labels[:, kept], scores[:, kept], average="macro")
    assert mean_average_precision(labels, scores) == pytest.approx(expected, rel=1e-12)
    assert np.isnan(mean_average_precision(np.zeros_like(labels), scores))


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.75])
def test_f1_and_exact_match_match_sklearn(threshold):
    labels, scores = _data(4)
    labels[:, 0] = 0  # a class with no positives: macro F1 counts it as 0, like zero_division=0
    predicted = (scores >= threshold).astype(int)
    metrics = multilabel_metrics(labels, scores, threshold)
    assert set(metrics) == set(MULTILABEL_METRIC_NAMES)
    assert metrics["f1_micro"] == pytest.approx(f1_score(labels, predicted, average="micro", zero_division=0))
    assert metrics["f1_macro"] == pytest.approx(f1_score(labels, predicted, average="macro", zero_division=0))
    assert metrics["exact_match"] == pytest.approx(accuracy_score(labels, predicted))


def test_per_class_thresholds_and_table_match_sklearn():
    labels, scores = _data(5)
    thresholds = np.array([0.2, 0.4, 0.5, 0.6, 0.8])
    predicted = (scores >= thresholds).astype(int)
    table = per_class_metrics(labels, scores, thresholds)
    np.testing.assert_allclose(table["f1"], f1_score(labels, predicted, average=None, zero_division=0))
    np.testing.assert_array_equal(table["support"], labels.sum(0))
    np.testing.assert_array_equal(table["predicted"], predicted.sum(0))
    metrics = multilabel_metrics(labels, scores, thresholds)
    assert metrics["f1_macro"] == pytest.approx(f1_score(labels, predicted, average="macro", zero_division=0))


def _best_f1_by_brute_force(labels: np.ndarray, scores: np.ndarray, average: str) -> float:
    """The best F1 over every candidate threshold (each distinct score, and above the highest)."""
    candidates = np.r_[np.unique(scores), 1.01]
    return max(
        f1_score(labels, (scores >= t).astype(int), average=average, zero_division=0) for t in candidates
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tuned_global_threshold_reaches_best_micro_f1(seed):
    labels, scores = _data(seed, n=60 if seed < 2 else 12, ties=seed < 2)  # distinct scores: few images
    threshold = tune_global_threshold(labels, scores)
    assert 0 < threshold < 1
    reached = multilabel_metrics(labels, scores, threshold)["f1_micro"]
    assert reached == pytest.approx(_best_f1_by_brute_force(labels, scores, "micro"))


@pytest.mark.parametrize("seed", [0, 1])
def test_tuned_class_thresholds_reach_best_f1_per_class(seed):
    labels, scores = _data(seed)
    labels[:, 1] = 0
    thresholds = tune_class_thresholds(labels, scores, default=0.37)
    assert thresholds.shape == (5,) and ((thresholds > 0) & (thresholds < 1)).all()
    assert thresholds[1] == 0.37  # no positive: keeps the default
    table = per_class_metrics(labels, scores, thresholds)
    for j in (0, 2, 3, 4):
        assert table["f1"][j] == pytest.approx(_best_f1_by_brute_force(labels[:, j], scores[:, j], "binary"))


def test_tuned_thresholds_stay_inside_zero_one_on_saturated_scores():
    labels = np.array([[1, 0], [1, 1], [0, 1], [0, 0]])
    scores = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    assert 0 < tune_global_threshold(labels, scores) < 1
    thresholds = tune_class_thresholds(labels, scores)
    assert ((thresholds > 0) & (thresholds < 1)).all()
    assert multilabel_metrics(labels, scores, thresholds)["exact_match"] == 1.0
    everything = np.ones((3, 2), dtype=int)  # every image positive: the cut sits below the lowest score
    assert tune_global_threshold(everything, np.full((3, 2), 0.2)) == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan")])
def test_threshold_outside_zero_one_is_one_error_line(bad):
    with pytest.raises(ValueError, match=r"outside \(0, 1\)") as error:
        build_multilabel_compute_metrics(threshold=bad)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"outside \(0, 1\)"):
        check_threshold([0.5, bad], 2)
    with pytest.raises(ValueError, match="3 values for 2 labels"):
        check_threshold([0.5, 0.5, 0.5], 2)


def test_compute_metrics_takes_logits_through_sigmoid():
    labels, scores = _data(6, ties=False)
    scores = np.clip(scores, 1e-4, 1 - 1e-4)
    logits = np.log(scores / (1 - scores)).astype(np.float32)
    np.testing.assert_allclose(sigmoid(logits), scores, rtol=1e-5)
    compute = build_multilabel_compute_metrics(threshold=0.4)
    got = compute(EvalPrediction(predictions=(logits,), label_ids=labels.astype(np.float32)))
    expected = multilabel_metrics(labels, sigmoid(logits), 0.4)
    assert got == expected
    assert got["mAP"] == pytest.approx(average_precision_score(labels, scores, average="macro"), rel=1e-6)
    assert np.isfinite(sigmoid(np.array([-1000.0, 1000.0]))).all()


def test_mismatched_shapes_and_non_binary_labels_are_errors():
    with pytest.raises(ValueError, match="one shape"):
        multilabel_metrics(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="multi-hot 0/1"):
        multilabel_metrics(np.full((3, 2), 2), np.zeros((3, 2)))
