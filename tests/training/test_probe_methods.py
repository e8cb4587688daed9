"""`method: knn` and `method: linear` end to end on the real digits (one label per image, and several): the saved
model is a folder predict / evaluate load as any other, its outputs equal the probes computed independently from
the run's feature bank (DINOv2's kNN vote; scikit-learn's LogisticRegression), and `method` against `use_lora`
is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vit_ft.tasks.feature_bank import FEATURE_BANK_FILE, FeatureBank, bank_features, pre_logits
from vit_ft.tasks.probes import PROBE_CS, knn_probabilities
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe
from .test_multilabel_finetune import multilabel_recipe

PROBE = {"num_train_epochs": 1, "max_train_samples": 60, "max_eval_samples": 30}


def _fine_tune(tmp_path, capfd, method: str, multi_label: bool):
    write = multilabel_recipe if multi_label else write_tiny_recipe
    recipe = write(tmp_path, method=method, **PROBE)
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "out"
    (out / "log.txt").write_text(result.stdout + result.stderr)  # what the run printed, for the test to read
    return out, load_trained(str(out)), FeatureBank.load(out / FEATURE_BANK_FILE)


@pytest.mark.slow
@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_knn_method_saves_a_model_whose_votes_are_dinov2s(tmp_path, capfd, multi_label):
    out, trained, bank = _fine_tune(tmp_path, capfd, "knn", multi_label)
    config = trained.model.config
    assert config.head_type == "knn" and config.knn_k == 20 and config.knn_bank_size == len(bank)
    assert json.loads((out / "vit_ft_run.json").read_text())["method"] == "knn"
    pixels = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        logits = trained.model(pixel_values=pixels).logits
        queries = pre_logits(trained.model, pixels).numpy()
    # the run's feature bank (written after the fit, by other code) holds the same training features
    expected = knn_probabilities(queries, bank.features, bank.labels, config.num_labels)
    got = logits.sigmoid() if multi_label else logits.softmax(-1)
    expected = np.clip(expected, 1e-6, 1 - 1e-6) if multi_label else expected / expected.sum(1, keepdims=True)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("multi_label", [False, True], ids=["single", "multi"])
def test_linear_method_saves_scikit_learns_logistic_regression(tmp_path, capfd, multi_label):
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out, trained, bank = _fine_tune(tmp_path, capfd, "linear", multi_label)
    assert trained.model.config.head_type == "linear"
    # the bank holds every training image here (fewer than its cap); the probe saw their unnormalised features
    features, kept = bank_features(trained.model, trained.transform, list(bank.sources))
    assert len(kept) == len(bank)
    # C was chosen on validation (tests/tasks/test_probes.py checks the choice against scikit-learn's log loss)
    c = json.loads((out / "train_results.json").read_text())["probe_c"]
    assert c in PROBE_CS and f"Linear probe: C = {c:g}, the lowest validation log loss" in (out / "log.txt").read_text()
    regression = LogisticRegression(C=c, tol=1e-10, max_iter=5000)
    reference = make_pipeline(StandardScaler(), OneVsRestClassifier(regression) if multi_label else regression)
    reference.fit(features["features"], bank.labels)
    with torch.no_grad():
        logits = trained.model.classifier(torch.as_tensor(features["features"]))
    got = logits.sigmoid() if multi_label else logits.softmax(-1)
    np.testing.assert_allclose(got.numpy(), reference.predict_proba(features["features"]), atol=5e-3)
    expected = reference.predict_proba(features["features"])
    top_two = np.sort(expected, axis=1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 1e-2  # the same top label wherever the reference's is not a near tie
    assert clear.sum() > len(clear) // 2 and (got.numpy().argmax(1) == expected.argmax(1))[clear].all()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["knn", "linear"])
def test_a_probe_passes_each_image_once_and_its_bank_equals_a_fresh_one(tmp_path, capfd, monkeypatch, method):
    """The feature bank at the end reads the probe's features of the training (and validation) images instead
    of a second pass; the bank equals one built afresh from the saved model."""
    import vit_ft.tasks.feature_bank as feature_bank
    import vit_ft.training.probes as probes

    passed = []
    real = feature_bank.bank_features

    def counted(model, transform, images, *args, **kwargs):
        passed.append(len(images))
        return real(model, transform, images, *args, **kwargs)

    monkeypatch.setattr(feature_bank, "bank_features", counted)
    monkeypatch.setattr(probes, "bank_features", counted)
    out, trained, bank = _fine_tune(tmp_path, capfd, method, multi_label=False)
    train, validation = PROBE["max_train_samples"], PROBE["max_eval_samples"]
    assert sorted(passed) == sorted([train, validation]), passed  # before: the training images twice
    fresh = feature_bank.build_feature_bank(trained.model, trained.transform, list(bank.sources), bank.labels,
                                            bank.rows, None)  # fmt: skip
    np.testing.assert_allclose(bank.features, fresh.features, atol=1e-5)
    np.testing.assert_allclose(bank.input, fresh.input, atol=1e-5)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--method", "lora", "--use_lora", "false"], "method='lora' and use_lora=false disagree"),
        (["--method", "knn", "--use_lora", "true"], "method='knn' and use_lora=true disagree"),
        (["--method", "probe"], "method='probe' is not supported; use one of: full, lora, linear, knn, auto"),
    ],
)
def test_method_mistakes_are_one_line(tmp_path, capfd, flags, expected):
    recipe = write_tiny_recipe(tmp_path)
    result = run_script("scripts/finetune.py", ["--recipe", recipe, *flags], capfd, cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and expected in lines[-1], result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--method", "auto", "--budget_minutes", "0"], "budget_minutes=0"),
        (["--method", "full", "--budget_minutes", "5"], "budget_minutes=5 limits the ladder of method: auto"),
        (["--method", "auto", "--ladder_min_gain", "-1"], "ladder_min_gain=-1"),
    ],
)
def test_ladder_mistakes_are_one_line(tmp_path, capfd, flags, expected):
    test_method_mistakes_are_one_line(tmp_path, capfd, flags, expected)
