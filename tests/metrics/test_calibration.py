"""vit_ft.metrics.calibration: reliability bins and ECE against a hand computation, temperature scaling against
a brute-force search and a known over-confidence."""

import numpy as np
import pytest
import torch

from vit_ft.metrics.calibration import (
    TEMPERATURE_RANGE,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    reliability_bins,
    softmax_with_temperature,
)


def test_ece_matches_a_hand_computation():
    # 15 bins of width 1/15 = 0.0667: 0.95 and 0.97 fall in bin 15 (0.933, 1], 0.62 in bin 10 (0.6, 0.667],
    # 0.5 in bin 8 (0.467, 0.533]; 0.6 sits on an edge and belongs to the bin it closes, bin 9 (0.533, 0.6]
    confidences = np.array([0.95, 0.97, 0.62, 0.5, 0.6])
    correct = np.array([1, 0, 1, 1, 0])
    bins = reliability_bins(confidences, correct)
    assert bins.counts.tolist() == [0] * 7 + [1, 1, 1] + [0] * 4 + [2]
    assert bins.confidence[14] == pytest.approx(0.96) and bins.accuracy[14] == 0.5
    assert np.isnan(bins.accuracy[0]) and np.isnan(bins.confidence[0])
    by_hand = (2 * abs(0.5 - 0.96) + abs(1 - 0.62) + abs(1 - 0.5) + abs(0 - 0.6)) / 5
    assert bins.ece == pytest.approx(by_hand)  # 0.48


def test_ece_of_probabilities_uses_the_top_class():
    probabilities = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.25, 0.5, 0.25]])
    labels = np.array([0, 0, 1])
    # confidences 0.7 (right), 0.6 (wrong), 0.5 (right), each alone in its bin
    by_hand = (abs(1 - 0.7) + abs(0 - 0.6) + abs(1 - 0.5)) / 3
    assert expected_calibration_error(probabilities, labels) == pytest.approx(by_hand)
    assert expected_calibration_error(np.eye(3), [0, 1, 2]) == 0.0  # sure and right


def test_temperature_divides_the_logits():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    np.testing.assert_allclose(softmax_with_temperature(logits, 2.0), torch.softmax(logits / 2, -1))
    assert softmax_with_temperature(logits.numpy()).argmax() == 0  # numpy in, same ranking


def test_fitted_temperature_undoes_a_known_overconfidence():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(size=(2000, 5)) * 1.5
    probabilities = torch.softmax(torch.from_numpy(true_logits), -1).numpy()
    labels = (rng.random((2000, 1)) > probabilities.cumsum(-1)).sum(-1)  # drawn from the true probabilities
    temperature = fit_temperature(3 * true_logits, labels)  # logits three times too sharp
    assert temperature == pytest.approx(3.0, rel=0.1)
    # the minimum of the NLL, as a brute-force search over T finds it
    grid = np.linspace(2.5, 3.5, 51)
    best = grid[np.argmin([negative_log_likelihood(3 * true_logits, labels, t) for t in grid])]
    assert temperature == pytest.approx(best, abs=0.02)
    before = expected_calibration_error(softmax_with_temperature(3 * true_logits), labels)
    after = expected_calibration_error(softmax_with_temperature(3 * true_logits, temperature), labels)
    assert after < before / 3


def test_temperature_is_bounded_and_neutral_without_data():
    assert fit_temperature(np.zeros((0, 3)), np.zeros(0, dtype=int)) == 1.0
    separable = np.array([[1.0, -1.0], [-1.0, 1.0]])  # every image right: the NLL falls as T -> 0
    assert TEMPERATURE_RANGE[0] <= fit_temperature(separable, [0, 1]) < 0.2  # sharper, within the bounds
