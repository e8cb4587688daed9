"""The few-shot tool's kNN evaluator: for each k and draw, DINOv2's weighted vote over the same k-shot images
the linear probe fits on, against scikit-learn's KNeighborsClassifier with those weights."""

import numpy as np
from sklearn.neighbors import KNeighborsClassifier

from vit_ft.tools.fewshot.run import evaluate_fewshot
from vit_ft.tools.fewshot.sampling import draw_fewshot


def test_knn_evaluator_matches_scikit_learn_on_each_draw():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 12))
    train_labels, test_labels = np.repeat(np.arange(3), 30), np.repeat(np.arange(3), 10)
    train = (centres[train_labels] + 0.9 * rng.normal(size=(90, 12))).astype(np.float32)
    test = (centres[test_labels] + 0.9 * rng.normal(size=(30, 12))).astype(np.float32)
    draws = [draw_fewshot(train_labels, 3, (2, 10), seed) for seed in range(2)]
    results = evaluate_fewshot(train, train_labels, test, test_labels, 3, draws)
    for result in results:
        expected = []
        for draw in draws:
            rows = draw.shots[result.shots]
            unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731

            def dinov2(distances):  # softmax(similarity / 0.07) over the neighbours
                weights = np.exp((1 - distances) / 0.07)
                return weights / weights.sum(axis=1, keepdims=True)

            k = min(20, len(rows))
            knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", weights=dinov2, algorithm="brute")
            knn.fit(unit(train[rows]), train_labels[rows])
            expected.append(float(np.mean(knn.predict(unit(test)) == test_labels)))
        assert result.knn_accuracies == expected
        assert result.as_record()["knn_mean_accuracy"] == np.mean(expected)
