"""Probes on frozen features, one label per image or several: the k-nearest-neighbour vote (DINOv2's protocol,
`model.knn_head.knn_votes`, the one implementation the saved kNN head runs too) and the linear probe, a
logistic regression (softmax over the classes, or one sigmoid per label) with scikit-learn's objective and
L2 penalty, fitted by L-BFGS in float64 and returned as the weights of a `nn.Linear` head on the raw features.

    probabilities = knn_probabilities(query_features, bank_features, bank_labels, num_labels)  # (m, labels)
    weight, bias = fit_linear_probe(features, labels, num_labels)       # (labels, hidden), (labels,)
    c, losses = choose_probe_c(features, labels, val_features, val_labels, num_labels)  # C by validation loss
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.knn_head import KNN_K, KNN_TEMPERATURE, knn_votes

PROBE_C = 1.0  # inverse L2 strength, scikit-learn's default, on standardised features (each of unit variance)
# the Cs `choose_probe_c` tries on validation, a decade apart around the default (CLIP's linear probes sweep the
# L2 strength on a validation split the same way)
PROBE_CS = (0.01, 0.1, 1.0, 10.0, 100.0)
PROBE_MAX_ITER = 500  # L-BFGS iterations; a convex problem of (labels x hidden) weights converges in far fewer


def label_rows(labels: np.ndarray, num_labels: int) -> np.ndarray:
    """`(n,)` class ids or `(n, num_labels)` multi-hot rows -> `(n, num_labels)` float32 rows."""
    labels = np.asarray(labels)
    if labels.ndim == 1:
        return np.eye(num_labels, dtype=np.float32)[labels.astype(np.int64)]
    return labels.astype(np.float32)


def knn_probabilities(
    queries: np.ndarray, bank: np.ndarray, bank_labels: np.ndarray, num_labels: int, k: int = KNN_K,
    temperature: float = KNN_TEMPERATURE,
) -> np.ndarray:  # fmt: skip
    """`(m, hidden)` query features and a `(n, hidden)` bank (both normalised here) with its labels -> `(m,
    num_labels)` weighted votes of the `k` nearest (cosine): softmax(similarity / T) over the k summed per label.
    One label per image: the rows sum to 1 (a distribution over the classes); several: each label's share."""
    bank_t = torch.nn.functional.normalize(torch.as_tensor(np.asarray(bank, np.float32)), dim=-1)
    rows = torch.as_tensor(label_rows(bank_labels, num_labels))
    votes = knn_votes(torch.as_tensor(np.asarray(queries, np.float32)), bank_t, rows, k, temperature)
    return votes.numpy()


def fit_linear_probe(
    features: np.ndarray, labels: np.ndarray, num_labels: int, c: float = PROBE_C, max_iter: int = PROBE_MAX_ITER
) -> tuple[np.ndarray, np.ndarray]:
    """A logistic regression of `(n, hidden)` features to `(n,)` class ids (multinomial) or `(n, num_labels)`
    multi-hot rows (one binary regression per label): scikit-learn's objective, 0.5 |W|^2 + C * (sum of log
    losses), on features standardised with their mean and std (folded back into the result). Returns the
    `(num_labels, hidden)` weight and `(num_labels,)` bias of a linear head on the raw features, float32."""
    x = torch.as_tensor(np.asarray(features, np.float64))
    mean, std = x.mean(dim=0), x.std(dim=0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant feature: scaled by 1, as StandardScaler
    x = (x - mean) / std
    targets = _targets(labels)
    weight = torch.zeros(num_labels, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  history_size=20, line_search_fn="strong_wolfe")  # fmt: skip

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        # the objective over n: the mean log loss + |W|^2 / (2 C n)
        loss = _log_loss(x @ weight.T + bias, targets) + (weight**2).sum() / (2 * c * len(x))
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        raw_weight = weight / std  # (labels, hidden): the standardisation folded into the head
        raw_bias = bias - raw_weight @ mean
    return raw_weight.float().numpy(), raw_bias.float().numpy()


def _targets(labels: np.ndarray) -> torch.Tensor:
    """`(n,)` class ids as int64, or `(n, num_labels)` multi-hot rows as float64: what `_log_loss` takes."""
    labels = np.asarray(labels)
    return torch.as_tensor(labels).to(torch.float64 if labels.ndim == 2 else torch.int64)


def _log_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The probe's data term: the mean over images of the cross-entropy against class ids, or of the binary log
    losses summed over the labels of multi-hot rows."""
    multi_label = targets.ndim == 2
    loss_fn = torch.nn.functional.binary_cross_entropy_with_logits if multi_label else torch.nn.functional.cross_entropy
    return loss_fn(logits, targets, reduction="sum") / len(logits)


def probe_log_loss(features: np.ndarray, labels: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> float:
    """The mean log loss of a linear head on `(n, hidden)` features (the probe's objective, unpenalised)."""
    x = torch.as_tensor(np.asarray(features, np.float64))
    logits = x @ torch.as_tensor(weight, dtype=torch.float64).T + torch.as_tensor(bias, dtype=torch.float64)
    return float(_log_loss(logits, _targets(labels)))


def choose_probe_c(
    features: np.ndarray, labels: np.ndarray, val_features: np.ndarray, val_labels: np.ndarray, num_labels: int,
    cs: tuple[float, ...] = PROBE_CS,
) -> tuple[float, dict[float, float]]:  # fmt: skip
    """The C of `cs` whose probe, fitted on the training features, has the lowest log loss on the validation
    features (the smaller C on a tie: the stronger penalty); returns it and every C's validation loss."""
    losses = {c: probe_log_loss(val_features, val_labels, *fit_linear_probe(features, labels, num_labels, c))
              for c in cs}  # fmt: skip
    return min(losses, key=lambda c: (losses[c], c)), losses


__all__ = ["PROBE_C", "PROBE_CS", "choose_probe_c", "fit_linear_probe", "knn_probabilities", "label_rows",
           "probe_log_loss"]  # fmt: skip
