"""The audit's label issues on multi-label data (`tools/audit/multilabel.py`): out-of-fold one-vs-rest
probabilities checked against scikit-learn fitted directly, the space of lowest binary log-loss chosen, and the flags
against cleanlab's multi-label `find_label_issues` called directly and the known flips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vit_ft.tasks.feature_bank import normalized
from vit_ft.tools.audit.multilabel import (
    binary_log_loss,
    label_lists,
    multilabel_issues,
    multilabel_probabilities,
)

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

pytest.importorskip("cleanlab")


def multilabel_clusters(n: int = 300, labels: int = 4, dim: int = 32, seed: int = 0):
    """Images holding one or two of `labels` concepts: features the sum of their concepts' unit centres plus noise;
    5 % of the images with one label added or removed. Features, true and given multi-hot matrices, flipped rows."""
    rng = np.random.default_rng(seed)
    centres = normalized(rng.normal(size=(labels, dim)))
    truth = np.zeros((n, labels), np.int64)
    for i in range(n):
        truth[i, rng.choice(labels, size=rng.integers(1, 3), replace=False)] = 1
    features = truth @ centres + 0.3 * rng.normal(size=(n, dim)) / np.sqrt(dim)
    flipped = rng.choice(n, size=n // 20, replace=False)
    given = truth.copy()
    for i in flipped:
        given[i, rng.integers(labels)] ^= 1
    return features, truth, given, flipped


def test_multilabel_probabilities_are_out_of_fold_logistic_and_the_better_space_is_chosen():
    from iterstrat.ml_stratifiers import MultilabelStratifiedKFold
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    features, _, given, _ = multilabel_clusters()
    noise = np.random.default_rng(1).normal(size=features.shape)
    probabilities, probe = multilabel_probabilities({"features": noise, "pixels": features}, given, folds=5, seed=0)
    assert probe["space"] == "pixels" and set(probe["candidates"]) == {"features/logistic", "pixels/logistic"}
    assert probe["log_loss"] == pytest.approx(binary_log_loss(probabilities, given), abs=1e-4)
    assert probe["candidates"]["features/logistic"]["log_loss"] > probe["log_loss"]
    # the reference: the first fold's held-out images, label 0, fitted by scikit-learn directly
    train, held = next(MultilabelStratifiedKFold(n_splits=5, shuffle=True, random_state=0).split(features, given))
    scaler = StandardScaler().fit(features[train])
    reference = LogisticRegression(max_iter=1000).fit(scaler.transform(features[train]), given[train, 0])
    np.testing.assert_allclose(probabilities[held, 0], reference.predict_proba(scaler.transform(features[held]))[:, 1],
                               atol=1e-6)  # fmt: skip


def test_multilabel_issues_are_cleanlabs_and_find_the_flipped_label_sets():
    from cleanlab.multilabel_classification.filter import find_label_issues

    features, truth, given, flipped = multilabel_clusters()
    probabilities, _ = multilabel_probabilities({"features": features}, given)
    found = multilabel_issues(given, probabilities)
    reference = find_label_issues(label_lists(given), probabilities, filter_by="low_self_confidence", n_jobs=1)
    assert {f.index for f in found} == set(np.flatnonzero(reference))
    assert [f.score for f in found] == sorted((f.score for f in found), reverse=True)
    hits = {f.index for f in found} & set(flipped)
    recall, precision = len(hits) / len(flipped), len(hits) / max(1, len(found))
    assert recall >= 0.8 and precision >= 0.8, (recall, precision)
    for f in found:  # the suggestion is the true set where the flip was found, the given one is the data's
        assert f.given == tuple(np.flatnonzero(given[f.index]))
        if f.index in hits:
            assert f.suggested == tuple(np.flatnonzero(truth[f.index]))


def test_the_command_audits_multi_label_folders_and_flags_label_sets_without_proposing_relabels(tmp_path, capfd,
                                                                                                 hf_backbone_dir):  # fmt: skip
    import csv
    import json

    from tests.cli_runner import run_script
    from vit_ft.data.digits import write_digits_multilabel_imagefolder

    root = write_digits_multilabel_imagefolder(tmp_path / "ml", num_train=150, num_test=20)
    with open(root / "train" / "labels.csv", newline="") as f:
        given = {row["file"]: row["labels"] for row in csv.DictReader(f)}
    out = tmp_path / "audit"
    ran = run_script("scripts/audit.py", ["--model", hf_backbone_dir, "--dataset", str(root), "--output_dir", str(out),
                                          "--device", "cpu", "--bf16", "false"], capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = json.loads((out / "audit.json").read_text())
    assert record["multi_label"] and record["quality"]["estimated_issues"] == record["counts"]["label_issue"]
    assert set(record["probe"]["candidates"]) == {"features/logistic", "pixels/logistic"}
    with open(out / "findings.csv", newline="") as f:
        issues = [r for r in csv.DictReader(f) if r["kind"] == "label_issue"]
    for row in issues:  # the given label set as labels.csv holds it, names joined by ";"
        assert row["given_label"] == given[Path(row["path"]).name], row
    with open(out / "relabel.csv", newline="") as f:
        actions = {r["action"] for r in csv.DictReader(f) if r["kind"] == "label_issue"}
    assert "relabel" not in actions and "keep" in actions  # --exclude cannot relabel multi-label images (copies: drop)
    assert (out / "report.md").read_text().startswith("# Data audit")
