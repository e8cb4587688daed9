"""The probes on frozen features against scikit-learn: the kNN vote against KNeighborsClassifier with DINOv2's
weights computed by hand, the linear probe against LogisticRegression (one per label when several)."""

import numpy as np
import pytest
import torch

from vit_ft.model.knn_head import KNNHead
from vit_ft.tasks.probes import PROBE_CS, choose_probe_c, fit_linear_probe, knn_probabilities


def _data(multi_label: bool, n: int = 120, hidden: int = 16, num_labels: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_labels, hidden)) * 1.5
    classes = rng.integers(0, num_labels, n)
    x = centres[classes] + rng.normal(size=(n, hidden))
    if not multi_label:
        return x.astype(np.float32), classes
    rows = np.eye(num_labels, dtype=np.uint8)[classes]
    rows[rng.random((n, num_labels)) < 0.2] = 1  # a second label on some images
    return x.astype(np.float32), rows


@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_knn_matches_scikit_learn_neighbours_with_dinov2_weights(multi_label):
    from sklearn.neighbors import KNeighborsClassifier

    x, y = _data(multi_label)
    bank, bank_labels, queries = x[:100], y[:100], x[100:]
    k, temperature = 20, 0.07
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    # scikit-learn finds the neighbours (cosine); DINOv2's weights by hand: softmax(sim / T) over the k
    found = KNeighborsClassifier(n_neighbors=k, metric="cosine").fit(unit(bank), np.zeros(len(bank)))
    distances, indices = found.kneighbors(unit(queries))
    weights = np.exp((1 - distances) / temperature)
    weights /= weights.sum(axis=1, keepdims=True)
    rows = np.eye(4)[bank_labels] if not multi_label else bank_labels.astype(float)
    expected = np.einsum("mk,mkc->mc", weights, rows[indices])
    got = knn_probabilities(queries, bank, bank_labels, 4, k, temperature)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # the saved model's head gives the same votes back through its logits
    head = KNNHead(16, 4, len(bank), k, temperature, multi_label)
    head.fill(torch.as_tensor(bank), torch.as_tensor(bank_labels))
    logits = head(torch.as_tensor(queries))
    back = logits.sigmoid() if multi_label else logits.softmax(-1)
    np.testing.assert_allclose(back.detach().numpy(), np.clip(expected, 1e-6, 1 - 1e-6) if multi_label
                               else expected / expected.sum(1, keepdims=True), atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_linear_probe_matches_scikit_learn_logistic_regression(multi_label):
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _data(multi_label, seed=1)
    regression = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000)
    reference = make_pipeline(StandardScaler(), OneVsRestClassifier(regression) if multi_label else regression)
    reference.fit(x, y)
    weight, bias = fit_linear_probe(x, y, 4, c=1.0)
    logits = x @ weight.T + bias
    ours = 1 / (1 + np.exp(-logits)) if multi_label else np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(ours, reference.predict_proba(x), atol=1e-3)  # both converged to 1e-3


@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_probe_c_is_the_one_with_scikit_learns_lowest_validation_log_loss(multi_label):
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # few training images in many dimensions: the default C overfits, so the choice matters
    x, y = _data(multi_label, n=40, hidden=64, seed=2)
    val_x, val_y = _data(multi_label, n=200, hidden=64, seed=2)  # the same centres, other draws
    val_x, val_y = val_x[40:], val_y[40:]
    chosen, losses = choose_probe_c(x, y, val_x, val_y, 4)
    expected = {}
    for c in PROBE_CS:
        regression = LogisticRegression(C=c, tol=1e-10, max_iter=5000)
        reference = make_pipeline(StandardScaler(), OneVsRestClassifier(regression) if multi_label else regression)
        p = reference.fit(x, y).predict_proba(val_x)
        expected[c] = (sum(log_loss(val_y[:, j], p[:, j], labels=[0, 1]) for j in range(4)) if multi_label
                       else log_loss(val_y, p, labels=range(4)))  # fmt: skip
    assert list(losses) == list(PROBE_CS)
    np.testing.assert_allclose([losses[c] for c in PROBE_CS], [expected[c] for c in PROBE_CS], rtol=2e-3)
    assert chosen == min(expected, key=expected.get) and chosen != 1.0


def test_knn_head_refuses_a_bank_of_another_size():
    head = KNNHead(8, 3, 5)
    with pytest.raises(ValueError, match="cannot hold"):
        head.fill(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))
