"""vit_ft.tools.fewshot.probe: the least-squares probe against sklearn's Ridge and the closed form, and the
choice of the regularisation on held-out points."""

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from vit_ft.tools.fewshot.probe import L2_GRID, fit_least_squares, select_l2


@pytest.mark.parametrize("num_points", [12, 60])  # fewer points than dimensions (the dual) and more
def test_least_squares_matches_ridge_on_plus_minus_one_targets(num_points):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(num_points, 20)) * rng.uniform(0.1, 5, size=20) + rng.normal(size=20)
    labels = np.arange(num_points) % 4
    fit = fit_least_squares(features, labels, num_classes=4)
    x = fit.design(features)  # whitened with the fitted points' statistics, bias column appended
    np.testing.assert_allclose(x[:, :-1].mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(x[:, :-1].std(0), 1, atol=1e-4)
    targets = np.where(np.eye(4)[labels] > 0, 1.0, -1.0)
    for l2 in (0.01, 1.0, 300.0):
        ridge = Ridge(alpha=l2, fit_intercept=False, solver="cholesky").fit(x, targets)
        np.testing.assert_allclose(fit.weights(l2), ridge.coef_.T, rtol=1e-6, atol=1e-8)
        closed = np.linalg.solve(x.T @ x + l2 * np.eye(x.shape[1]), x.T @ targets)
        np.testing.assert_allclose(fit.weights(l2), closed, rtol=1e-6, atol=1e-8)
        test = rng.normal(size=(7, 20))
        np.testing.assert_allclose(
            fit.scores(test, l2), ridge.predict(fit.design(test)), rtol=1e-6, atol=1e-8
        )


def test_least_squares_separates_separable_classes():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 8)) * 4
    labels = np.repeat(np.arange(3), 5)
    fit = fit_least_squares(centres[labels] + rng.normal(size=(15, 8)) * 0.1, labels, 3)
    held_labels = np.repeat(np.arange(3), 4)
    held = centres[held_labels] + rng.normal(size=(12, 8)) * 0.1
    assert fit.accuracy(held, held_labels, 1.0) == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_select_l2_takes_the_best_held_out_accuracy_and_ties_go_to_the_strongest(seed):
    rng = np.random.default_rng(seed)  # noisy overlapping classes: the accuracy changes along the grid
    labels = np.arange(40) % 5
    fit = fit_least_squares(rng.normal(size=(40, 30)) + 0.3 * np.eye(30)[labels], labels, 5)
    held_labels = np.arange(50) % 5
    held = rng.normal(size=(50, 30)) + 0.3 * np.eye(30)[held_labels]
    accuracies = {l2: fit.accuracy(held, held_labels, l2) for l2 in L2_GRID}
    best = max(accuracies.values())
    l2, accuracy = select_l2(fit, held, held_labels, L2_GRID)
    assert accuracy == best and l2 == max(v for v, a in accuracies.items() if a == best)
    assert len(set(accuracies.values())) > 1  # the grid matters here
    assert select_l2(fit, held, held_labels, (4.0,)) == (4.0, accuracies[4.0])
