"""Tests for vit_ft.metrics: the packaged evaluate module loads offline by path and agrees with scikit-learn."""

import fnmatch
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score, top_k_accuracy_score
from transformers import EvalPrediction

from vit_ft.metrics import METRIC_NAMES, METRIC_PATH, build_compute_metrics, load_metric

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def metric():
    return load_metric()


@pytest.fixture(scope="module")
def compute_metrics():
    return build_compute_metrics()


def _random(seed: int, num_examples: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(num_examples, num_classes)).astype(np.float32)
    labels = rng.integers(0, num_classes, size=num_examples)
    return logits, labels


# ----------------------------------------------------------------------------------------------------------------
# Packaging and offline loading
# ----------------------------------------------------------------------------------------------------------------


def test_module_is_package_data():
    """pyproject ships `metrics/*/*.py`; the module must match it, or an installed wheel cannot load it."""
    pyproject = (REPO / "pyproject.toml").read_text()
    package_data = re.search(
        r"^\[tool\.setuptools\.package-data\]\s*\nvit_ft\s*=\s*\[(.*?)\]", pyproject, re.M | re.S
    )
    assert package_data, "pyproject.toml lost its [tool.setuptools.package-data] vit_ft entry"
    patterns = re.findall(r'"([^"]+)"', package_data.group(1))
    relative = METRIC_PATH.relative_to(REPO / "vit_ft").as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


def test_module_has_one_import_per_line():
    """evaluate reads the module's import lines to find its dependencies; `import a, b` would be misread."""
    lines = METRIC_PATH.read_text().splitlines()
    imports = [line for line in lines if re.match(r"^(import|from)\s", line)]
    assert imports and not [line for line in imports if re.match(r"^import\s+\S+\s*,", line)]


def test_loads_and_computes_with_the_hub_offline():
    code = (
        "import numpy as np\n"
        "from vit_ft.metrics import build_compute_metrics\n"
        "out = build_compute_metrics()((np.eye(3, dtype=np.float32), np.arange(3)))\n"
        "assert out == {'accuracy': 1.0, 'top5_accuracy': 1.0, 'f1': 1.0, 'balanced_accuracy': 1.0}, out\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_instances_do_not_share_state():
    """Each load gets its own in-memory store, as every process of a multi-process run does."""
    first, second = load_metric(), load_metric()
    assert first.experiment_id != second.experiment_id
    first.add_batch(predictions=[[1.0, 0.0], [1.0, 0.0]], references=[0, 1])
    assert second.compute(predictions=[[0.0, 1.0]], references=[1], k=1)["accuracy"] == 1.0
    assert first.compute(k=1)["accuracy"] == 0.5


# ----------------------------------------------------------------------------------------------------------------
# Agreement with scikit-learn on random data
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "num_examples", "num_classes", "k"),
    [(0, 200, 3, 1), (1, 500, 10, 5), (2, 1000, 37, 5), (3, 400, 100, 3), (4, 600, 120, 5)],
)
def test_metrics_match_sklearn(metric, seed, num_examples, num_classes, k):
    logits, labels = _random(seed, num_examples, num_classes)
    predictions = logits.argmax(-1)
    result = metric.compute(predictions=logits, references=labels, k=k)
    assert list(result) == ["accuracy", f"top{k}_accuracy", "f1", "balanced_accuracy"]
    assert result["accuracy"] == pytest.approx(accuracy_score(labels, predictions))
    top_k = top_k_accuracy_score(labels, logits, k=k, labels=np.arange(num_classes))
    assert result[f"top{k}_accuracy"] == pytest.approx(top_k)
    assert 0.0 < result[f"top{k}_accuracy"] < 1.0  # the case is not degenerate
    assert result["f1"] == pytest.approx(f1_score(labels, predictions, average="macro"))
    assert result["f1"] != pytest.approx(f1_score(labels, predictions, average="weighted"), abs=1e-9)
    assert result["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions))


def test_top_k_defaults_to_5_and_clips_k_to_the_number_of_classes(metric):
    logits, labels = _random(4, 300, 10)
    default = metric.compute(predictions=logits, references=labels)["top5_accuracy"]
    assert default == pytest.approx(top_k_accuracy_score(labels, logits, k=5, labels=np.arange(10)))
    few_classes_logits, few_classes_labels = _random(5, 50, 3)
    for k in (3, 5, 100):  # k >= number of classes: every label is in the top k
        result = metric.compute(predictions=few_classes_logits, references=few_classes_labels, k=k)
        assert result[f"top{k}_accuracy"] == 1.0


def test_top_k_breaks_ties_as_sklearn_does(metric):
    logits = np.round(_random(6, 300, 8)[0], 0)  # many tied scores
    labels = np.random.default_rng(6).integers(0, 8, size=300)
    result = metric.compute(predictions=logits, references=labels, k=2)["top2_accuracy"]
    assert result == pytest.approx(top_k_accuracy_score(labels, logits, k=2, labels=np.arange(8)))


def test_rejects_bad_inputs_with_the_fix(metric):
    with pytest.raises(ValueError, match=r"labels in \[0, 3\)"):
        metric.compute(predictions=np.zeros((2, 3)), references=[0, 3], k=1)
    with pytest.raises(ValueError, match="k=0 must be at least 1"):
        metric.compute(predictions=np.zeros((2, 3)), references=[0, 1], k=0)


def test_f1_counts_a_never_predicted_class_as_zero(metric):
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 0, 1, 1, 1, 1])  # class 2 is never predicted
    result = metric.compute(predictions=np.eye(3)[predictions], references=labels)["f1"]
    assert result == pytest.approx(f1_score(labels, predictions, average="macro", zero_division=0.0))
    assert result == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)


def test_balanced_accuracy_sees_through_a_majority_class_predictor(metric):
    """On 90 % class 0, always predicting 0 has accuracy 0.9 but balanced accuracy 1/3 (scikit-learn's value)."""
    labels = np.array([0] * 90 + [1] * 6 + [2] * 4)
    predictions = np.zeros_like(labels)
    result = metric.compute(predictions=np.eye(3)[predictions], references=labels)
    assert result["accuracy"] == pytest.approx(0.9)
    assert result["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions))
    assert result["balanced_accuracy"] == pytest.approx(1 / 3)


def test_one_true_class_gives_balanced_accuracy_without_a_warning(metric):
    """Evaluating a folder of one class: predictions of other classes are what it measures, not a reason for
    scikit-learn's "y_pred contains classes not in y_true" warning on the user's console."""
    labels, predictions = np.array([1, 1, 1, 1]), np.array([1, 0, 2, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = metric.compute(predictions=np.eye(3)[predictions], references=labels)
    with pytest.warns(UserWarning, match="y_pred contains classes not in y_true"):
        expected = balanced_accuracy_score(labels, predictions)
    assert result["balanced_accuracy"] == pytest.approx(expected) == 0.5


# ----------------------------------------------------------------------------------------------------------------
# The Trainer's compute_metrics
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "num_classes"), [(0, 10), (1, 37), (2, 120)])
def test_compute_metrics_matches_sklearn(compute_metrics, seed, num_classes):
    logits, labels = _random(seed, 800, num_classes)
    result = compute_metrics(EvalPrediction(predictions=logits, label_ids=labels))
    assert set(result) == set(METRIC_NAMES) == {"accuracy", "top5_accuracy", "f1", "balanced_accuracy"}
    predictions = logits.argmax(-1)
    assert result["accuracy"] == pytest.approx(accuracy_score(labels, predictions))
    assert result["top5_accuracy"] == pytest.approx(
        top_k_accuracy_score(labels, logits, k=5, labels=np.arange(num_classes))
    )
    assert result["f1"] == pytest.approx(f1_score(labels, predictions, average="macro"))
    assert result["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predictions))
    assert all(type(value) is float for value in result.values())  # JSON-serialisable for the Trainer's logs


def test_compute_metrics_handles_extra_outputs_and_few_classes(compute_metrics):
    logits, labels = _random(3, 100, 3)
    hidden_states = np.zeros((100, 4, 8), dtype=np.float32)
    result = compute_metrics(EvalPrediction(predictions=(logits, hidden_states), label_ids=labels))
    assert result["top5_accuracy"] == 1.0  # 3 classes: all are in the top 5
    assert result["accuracy"] == pytest.approx(accuracy_score(labels, logits.argmax(-1)))


def test_compute_metrics_explains_missing_labels(compute_metrics):
    with pytest.raises(ValueError, match="label_names"):
        compute_metrics(EvalPrediction(predictions=np.zeros((2, 3)), label_ids=None))


def test_compute_metrics_other_k():
    logits, labels = _random(6, 200, 20)
    result = build_compute_metrics(top_k=3)((logits, labels))
    assert result["top3_accuracy"] == pytest.approx(
        top_k_accuracy_score(labels, logits, k=3, labels=np.arange(20))
    )
