"""Top-k accuracy as an `evaluate` metric module: is the reference among the k highest-scoring classes?

Shipped inside vit_ft so that `evaluate.load(<path to this file>)` works offline; keep one import per line,
because evaluate reads this file's import lines to check the module's dependencies.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Top-k accuracy counts a prediction as correct when the reference label is among the k classes with the
highest scores (logits or probabilities). With k >= the number of classes every prediction is correct.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): class scores (logits or probabilities), shape (num_examples, num_classes).
    references (`list` of `int`): ground-truth labels in [0, num_classes), shape (num_examples,).
    k (`int`, defaults to 5): how many top-scoring classes count; clipped to num_classes.
    normalize (`bool`, defaults to `True`): if False, return the number of correct predictions instead.
    sample_weight (`list` of `float`, *optional*): one weight per example.

Returns:
    top_k_accuracy (`float`): in [0, 1] when normalize is True, else the (weighted) count of hits.

Example:
    >>> top_k = evaluate.load("vit_ft/metrics/top_k_accuracy/top_k_accuracy.py")
    >>> top_k.compute(predictions=[[0.1, 0.5, 0.4], [0.8, 0.1, 0.1]], references=[2, 1], k=2)
    {'top_k_accuracy': 0.5}
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TopKAccuracy(evaluate.Metric):
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
        )

    def _compute(self, predictions, references, k=5, normalize=True, sample_weight=None):
        scores = np.asarray(predictions, dtype=np.float64)  # (num_examples, num_classes)
        references = np.asarray(references, dtype=np.int64)
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
        k = min(k, num_classes)
        # stable sort, then reverse: ties rank the higher class index first, as scikit-learn's top_k_accuracy_score does
        top_k = np.argsort(scores, axis=1, kind="stable")[:, ::-1][:, :k]  # (num_examples, k)
        hits = (top_k == references[:, None]).any(axis=1)
        weights = np.ones(len(hits)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if len(weights) != len(hits):
            raise ValueError(f"sample_weight has {len(weights)} entries for {len(hits)} predictions.")
        total = float(np.sum(weights * hits))
        if normalize:
            total = total / float(np.sum(weights)) if len(hits) else 0.0
        return {"top_k_accuracy": total}
