"""F1 score as an `evaluate` metric module, macro-averaged over classes by default.

Shipped inside vit_ft so that `evaluate.load(<path to this file>)` works offline; keep one import per line,
because evaluate reads this file's import lines to check the module's dependencies.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import f1_score

_DESCRIPTION = """
The F1 score is the harmonic mean of precision and recall: F1 = 2 * (precision * recall) / (precision + recall).
For multi-class classification it is computed per class and then averaged; the default here is the unweighted
("macro") mean, which weighs rare classes as much as frequent ones.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted labels, shape (num_examples,).
    references (`list` of `int`): ground-truth labels, shape (num_examples,).
    labels (`list` of `int`, *optional*): the classes to average over; default: those in predictions or references.
    pos_label (`int`, defaults to 1): the positive class when average is "binary".
    average (`str` or `None`, defaults to "macro"): "macro", "micro", "weighted", "binary", or None for one
        score per class.
    sample_weight (`list` of `float`, *optional*): one weight per example.
    zero_division (`float` or "warn", defaults to 0.0): the score of a class with no predictions and no references.

Returns:
    f1 (`float`, or an array of floats when average is None): in [0, 1].

Example:
    >>> f1 = evaluate.load("vit_ft/metrics/f1/f1.py")
    >>> f1.compute(predictions=[0, 1, 2, 2], references=[0, 1, 1, 2])
    {'f1': 0.7777777777777777}
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
class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
            format="numpy",
            reference_urls=[
                "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.f1_score.html"
            ],
        )

    def _compute(
        self,
        predictions,
        references,
        labels=None,
        pos_label=1,
        average="macro",
        sample_weight=None,
        zero_division=0.0,
    ):
        score = f1_score(
            np.asarray(references),
            np.asarray(predictions),
            labels=labels,
            pos_label=pos_label,
            average=average,
            sample_weight=sample_weight,
            zero_division=zero_division,
        )
        return {"f1": score if average is None else float(score)}
