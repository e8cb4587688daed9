"""Accuracy, top-k accuracy and macro-F1 from class scores, as one `evaluate` metric module.

Shipped inside vit_ft so that `evaluate.load(<path to this file>)` works offline; keep one import per line,
because evaluate reads this file's import lines to check the module's dependencies.
"""

import warnings

import datasets
import evaluate
import numpy as np
from sklearn.metrics import balanced_accuracy_score, f1_score

_DESCRIPTION = """
Four classification metrics from one pass over the class scores (logits or probabilities):
- accuracy: the fraction of examples whose highest-scoring class is the reference;
- top-k accuracy: the fraction whose reference is among the k highest-scoring classes (every example counts
  when k >= the number of classes);
- F1: the harmonic mean of precision and recall per class, averaged without weights over the classes that
  occur in the predictions or references ("macro"), so rare classes weigh as much as frequent ones; a class
  that is never predicted scores 0;
- balanced accuracy: the mean over the classes present in the references of each class's recall, so a model
  that always predicts the majority class of a skewed set scores 1 / num_classes, not the majority's share
  (scikit-learn's `balanced_accuracy_score`).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): class scores, shape (num_examples, num_classes).
    references (`list` of `int`): ground-truth labels in [0, num_classes), shape (num_examples,).
    k (`int`, defaults to 5): how many top-scoring classes count for top-k accuracy; clipped to num_classes.

Returns:
    accuracy (`float`): in [0, 1].
    top{k}_accuracy (`float`): in [0, 1], named after the k asked for (top5_accuracy by default).
    f1 (`float`): macro-F1, in [0, 1].
    balanced_accuracy (`float`): mean per-class recall, in [0, 1].

Example:
    >>> metric = evaluate.load("vit_ft/metrics/classification/classification.py")
    >>> metric.compute(predictions=[[0.1, 0.5, 0.4], [0.8, 0.1, 0.1]], references=[2, 0], k=2)
    {'accuracy': 0.5, 'top2_accuracy': 1.0, 'f1': 0.3333333333333333, 'balanced_accuracy': 0.5}
"""

_CITATION = """
@article{scikit-learn,
  title={Scikit-learn: Machine Learning in {P}ython},
  author={Pedregosa, F. and others},
  journal={Journal of Machine Learning Research},
  volume={12},
  pages={2825--2830},
  year={2011}
}
"""


def _check_inputs(scores: np.ndarray, references: np.ndarray, k: int) -> None:
    if scores.ndim != 2 or len(scores) != len(references):
        raise ValueError(
            f"predictions must be class scores of shape (num_examples, num_classes) = ({len(references)}, C); "
            f"got shape {scores.shape}."
        )
    if k < 1:
        raise ValueError(f"k={k} must be at least 1.")
    num_classes = scores.shape[1]
    if len(references) and (references.min() < 0 or references.max() >= num_classes):
        raise ValueError(
            f"references must be labels in [0, {num_classes}) to match the {num_classes} score columns; "
            f"got values in [{references.min()}, {references.max()}]."
        )


def _top_k_hits(scores: np.ndarray, references: np.ndarray, k: int) -> np.ndarray:
    """(num_examples,) bool: is the reference among the k highest scores?"""
    k = min(k, scores.shape[1])
    # stable sort, then reverse: ties rank the higher class index first, as scikit-learn's top_k_accuracy_score does
    top_k = np.argsort(scores, axis=1, kind="stable")[:, ::-1][:, :k]  # (num_examples, k)
    return (top_k == references[:, None]).any(axis=1)


def _balanced_accuracy(references: np.ndarray, predicted: np.ndarray) -> float:
    """Mean recall over the classes in `references`; 0.0 for no examples (scikit-learn warns and divides by 0)."""
    if not len(references):
        return 0.0
    with warnings.catch_warnings():  # a prediction outside the references' classes is what it measures
        warnings.filterwarnings("ignore", "y_pred contains classes not in y_true")
        return float(balanced_accuracy_score(references, predicted))


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Classification(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("float32")),
                    "references": datasets.Value("int64"),
                }
            ),
            reference_urls=[
                "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.top_k_accuracy_score.html",
                "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.f1_score.html",
                "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.balanced_accuracy_score.html",
            ],
        )

    def _compute(self, predictions, references, k=5):
        scores = np.asarray(predictions, dtype=np.float64)  # (num_examples, num_classes)
        references = np.asarray(references, dtype=np.int64)  # (num_examples,)
        _check_inputs(scores, references, k)
        predicted = scores.argmax(axis=1)  # (num_examples,)
        hits = _top_k_hits(scores, references, k)
        return {
            "accuracy": float(np.mean(predicted == references)) if len(references) else 0.0,
            f"top{k}_accuracy": float(np.mean(hits)) if len(references) else 0.0,
            "f1": float(f1_score(references, predicted, average="macro", zero_division=0.0)),
            "balanced_accuracy": _balanced_accuracy(references, predicted),
        }
