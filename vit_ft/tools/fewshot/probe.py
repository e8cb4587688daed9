"""The few-shot probe: regularised least squares from frozen features to {-1, 1}^K targets, in closed form
(the ViT paper, arXiv 2010.11929, §4.1: "we solve a regularized least-squares regression problem that maps the
(frozen) representation of a subset of training images to {-1, 1}^K target vectors"). As in
google-research/big_vision's `fewshot_lsr` evaluator, features are whitened with the fitted points' mean and
std, a large constant feature carries the bias (so it is barely regularised), and one eigendecomposition serves
every regularisation strength. Pure numpy.

    fit = fit_least_squares(features, labels, num_classes)
    l2, held_out_accuracy = select_l2(fit, holdout_features, holdout_labels)
    fit.accuracy(test_features, test_labels, l2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BIAS_CONSTANT = 100.0  # the bias feature's value: its weight is penalised 1e4 times less than the others
L2_GRID = tuple(2.0**k for k in range(-10, 21, 2))  # 2^-10 .. 2^20; big_vision's fixed default 2^10 is on it


@dataclass
class LeastSquares:
    """A regularised least-squares fit of features to {-1, 1}^K targets, solvable for any l2 in one product.

    With whitened features x (plus the bias column) of shape `(num_points, dim)` and targets y
    `(num_points, num_classes)`, the weights (x^T x + l2 I)^-1 x^T y (or x^T (x x^T + l2 I)^-1 y when
    there are fewer points than dimensions, the usual few-shot case) are `lhs diag(1 / (eigs + l2)) rhs`
    from one eigendecomposition of x^T x (or x x^T).
    """

    mean: np.ndarray  # (1, dim) feature mean of the fitted points
    std: np.ndarray  # (1, dim) feature std of the fitted points (+1e-5 for constant features)
    eigs: np.ndarray  # (rank,) eigenvalues of x^T x or x x^T
    lhs: np.ndarray  # (dim + 1, rank)
    rhs: np.ndarray  # (rank, num_classes)

    def design(self, features: np.ndarray) -> np.ndarray:
        """`(num_points, dim)` features -> whitened `(num_points, dim + 1)` with the constant bias column."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)

    def weights(self, l2: float) -> np.ndarray:
        """The solution for regularisation `l2`, `(dim + 1, num_classes)` (the last row is the bias)."""
        return (self.lhs / (self.eigs + l2)[None, :]) @ self.rhs

    def scores(self, features: np.ndarray, l2: float) -> np.ndarray:
        """`(num_points, dim)` features -> `(num_points, num_classes)` regression outputs."""
        return self.design(features) @ self.weights(l2)

    def accuracy(self, features: np.ndarray, labels: np.ndarray, l2: float) -> float:
        """The fraction of `labels` that the argmax of `scores` matches."""
        return float(np.mean(self.scores(features, l2).argmax(axis=1) == np.asarray(labels)))


def fit_least_squares(features: np.ndarray, labels: np.ndarray, num_classes: int) -> LeastSquares:
    """Prepare the regularised least-squares fit of `(num_points, dim)` features to the {-1, 1} one-hot
    codes of `labels` (ints in [0, num_classes)); `LeastSquares.weights(l2)` then solves it for any l2."""
    x = np.asarray(features, dtype=np.float64)  # float64: the Gram matrix of 25 x 1000 points stays exact
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True) + 1e-5
    x = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)
    y = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0  # (num_points, num_classes) in {-1, 1}
    if x.shape[0] >= x.shape[1]:
        eigs, q = np.linalg.eigh(x.T @ x)
        lhs, rhs = q, q.T @ (x.T @ y)
    else:  # fewer points than dimensions: the dual, an eigendecomposition of the small x x^T
        eigs, q = np.linalg.eigh(x @ x.T)
        lhs, rhs = x.T @ q, q.T @ y
    return LeastSquares(
        mean, std, np.clip(eigs, 0.0, None), lhs, rhs
    )  # clip: -1e-12 rounding of a PSD matrix


def select_l2(
    fit: LeastSquares, features: np.ndarray, labels: np.ndarray, grid: Sequence[float] = L2_GRID
) -> tuple[float, float]:
    """The l2 of `grid` with the best accuracy on the held-out `features`/`labels`, and that accuracy; ties
    go to the strongest regularisation (the safer fit when a small held-out set cannot tell them apart)."""
    best = (-1.0, 0.0)
    for l2 in sorted(grid, reverse=True):
        accuracy = fit.accuracy(features, labels, l2)
        if accuracy > best[0]:
            best = (accuracy, l2)
    return best[1], best[0]


__all__ = ["BIAS_CONSTANT", "L2_GRID", "LeastSquares", "fit_least_squares", "select_l2"]
