"""Accuracy as an `evaluate` metric module: the fraction of predicted labels equal to the references.

Shipped inside vit_ft so that `evaluate.load(<path to this file>)` works offline; keep one import per line,
because evaluate reads this file's import lines to check the module's dependencies.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Accuracy is the proportion of correct predictions among all predictions:
accuracy = (number of predictions equal to their reference) / (number of predictions).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted labels, shape (num_examples,).
    references (`list` of `int`): ground-truth labels, shape (num_examples,).
    normalize (`bool`, defaults to `True`): if False, return the number of correct predictions instead.
    sample_weight (`list` of `float`, *optional*): one weight per example.

Returns:
    accuracy (`float`): in [0, 1] when normalize is True, else the (weighted) count of correct predictions.

Example:
    >>> accuracy = evaluate.load("vit_ft/metrics/accuracy/accuracy.py")
    >>> accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'accuracy': 0.6666666666666666}
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


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
            format="numpy",
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = np.asarray(predictions) == np.asarray(references)
        weights = (
            np.ones(len(correct)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        )
        if len(weights) != len(correct):
            raise ValueError(f"sample_weight has {len(weights)} entries for {len(correct)} predictions.")
        total = float(np.sum(weights * correct))
        if normalize:
            total = total / float(np.sum(weights)) if len(correct) else 0.0
        return {"accuracy": total}
