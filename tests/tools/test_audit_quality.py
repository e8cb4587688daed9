"""The audit's label issues know when they do not know (issue 46): the flags bounded by confident learning's
estimate of the noise, the best of several out-of-fold probes chosen by log-loss, the self-check's recall and
precision against known flips (checked against cleanlab called directly), and on a weak backbone the warning,
the report's first lines and a relabel.csv that proposes only what the self-check supports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.cli_runner import run_script
from vit_ft.tasks.feature_bank import normalized
from vit_ft.tools.audit.labels import (
    PRECISION_FLOOR,
    corrected_precision,
    label_issues,
    lower_bound,
    measured,
    self_check,
)
from vit_ft.tools.audit.probes import PROBES, best_probe, log_loss, probe_probabilities
from vit_ft.tools.audit.run import audit_labels

pytest.importorskip("cleanlab")


def noisy_clusters(spread: float, n_per_class: int = 80, classes: int = 5, dim: int = 32, seed: int = 0):
    """Gaussian clusters around random unit centres (`spread` large: little class signal), 5 % of labels flipped:
    features, true labels, given labels, flipped rows."""
    rng = np.random.default_rng(seed)
    centres = normalized(rng.normal(size=(classes, dim)))
    truth = np.repeat(np.arange(classes), n_per_class)
    features = centres[truth] + spread * rng.normal(size=(len(truth), dim)) / np.sqrt(dim)
    flipped = rng.choice(len(truth), size=len(truth) // 20, replace=False)
    given = truth.copy()
    given[flipped] = (truth[flipped] + rng.integers(1, classes, len(flipped))) % classes
    return features, truth, given, flipped


def calibrated_flags(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """The reference: cleanlab's calibrated estimate of the wrong labels (its estimate_joint's off-diagonal mass),
    that many images of lowest p(given)."""
    from cleanlab.count import compute_confident_joint, estimate_joint

    joint = estimate_joint(labels, probabilities, confident_joint=compute_confident_joint(labels, probabilities, calibrate=True))
    count = int(np.rint((1 - np.trace(joint)) * len(labels)))
    flags = np.zeros(len(labels), bool)
    flags[np.argsort(probabilities[np.arange(len(labels)), labels], kind="stable")[:count]] = True
    return flags


def test_the_candidate_of_lowest_out_of_fold_log_loss_is_chosen_among_spaces_and_every_one_reported():
    features, _, given, _ = noisy_clusters(spread=0.5)
    noise = np.random.default_rng(3).normal(size=features.shape)  # a weak backbone's features: no class signal
    probabilities, probe = best_probe({"features": noise, "pixels": features}, given, 5)
    assert set(probe["candidates"]) == {f"{space}/{name}" for space in ("features", "pixels") for name in PROBES}
    losses = {name: c["log_loss"] for name, c in probe["candidates"].items()}
    assert probe["chosen"] == min(losses, key=losses.get) and probe["space"] == "pixels"
    assert log_loss(probabilities, given) == pytest.approx(losses[probe["chosen"]], abs=1e-4)
    probabilities, probe = best_probe(features, given, 5)  # a bare array: the space "features"
    assert probe["space"] == "features" and len(probe["candidates"]) == len(PROBES)
    for name in PROBES:  # each a distribution with no impossible class, right on separable clusters
        values = probe_probabilities(name, features, given, 5)
        np.testing.assert_allclose(values.sum(1), 1, atol=1e-6)
        assert values.min() > 0 and probe["candidates"][f"features/{name}"]["accuracy"] > 0.85, name


def test_on_features_with_little_class_signal_the_flags_stay_within_the_noise_bound_and_the_check_says_so():
    features, _, given, flipped = noisy_clusters(spread=6.0)
    found, record, probabilities = audit_labels(features, given, 5)
    quality = record["quality"]
    old_rule = int((probabilities[np.arange(len(given)), given] < 0.5).sum())  # the rule that flooded
    assert {f.index for f in found} == set(np.flatnonzero(calibrated_flags(given, probabilities)))
    assert len(found) == quality["estimated_issues"] < old_rule
    true_precision = len({f.index for f in found} & set(flipped)) / len(found)
    assert true_precision < PRECISION_FLOOR and quality["low_precision"], (true_precision, quality)
    assert quality["precision_low"] <= quality["precision"]  # the warning reads the lower bound
    assert quality["precision"] == pytest.approx(true_precision, abs=0.15)  # the estimate is near the truth
    assert quality["proposed"] < len(found)


def test_the_self_checks_recall_and_precision_are_what_cleanlab_finds_on_the_known_flips():
    features, truth, given, _ = noisy_clusters(spread=0.5)
    probabilities, probe = best_probe(features, given, 5)
    found, _ = label_issues(given, probabilities)
    check = self_check(given, found, 5, lambda y: probe_probabilities(probe["probe"], features, y, 5))
    assert (check.labels[check.rows] != given[check.rows]).all() and len(check.rows) == 20  # 5 % flipped
    np.testing.assert_array_equal(np.delete(check.labels, check.rows), np.delete(given, check.rows))
    again = calibrated_flags(check.labels, check.probabilities)
    np.testing.assert_array_equal(check.flagged, again)  # cleanlab itself, on the check's probabilities
    hits = again[check.rows].sum()
    assert check.recall == pytest.approx(hits / len(check.rows))
    doubted = np.zeros(len(given), bool)
    doubted[[f.index for f in found]] = True
    others = again & ~np.isin(np.arange(len(given)), check.rows)
    expected = corrected_precision(hits, (others & ~doubted).sum(), (others & doubted).sum())
    assert check.precision == pytest.approx(float(expected))
    assert check.recall >= 0.9 and check.precision >= 0.8, check.summary()  # separable: the issue's targets


def test_corrected_precision_counts_earlier_doubts_right_at_the_precision_itself():
    assert corrected_precision(8, 2, 0) == pytest.approx(0.8)  # no earlier doubts: plain precision
    assert corrected_precision(10, 0, 10) == pytest.approx(1.0)  # the earlier doubts all flagged again: all right
    p = float(corrected_precision(5, 5, 10))
    assert p == pytest.approx(5 / (5 + 5 + (1 - p) * 10))
    flagged = np.array([True, True, True, False])  # by score: a flip, a clean image, a flip
    recall, precision, min_score = measured(flagged, np.array([0.9, 0.8, 0.7, 0.1]), np.array([0, 2]),
                                            np.zeros(4, bool))  # fmt: skip
    assert recall == 1.0 and precision == pytest.approx(2 / 3) and min_score == np.inf  # 3 flags: too few to tell
    scores = np.linspace(1, 0.5, 40)  # 40 flags by score: the first 20 flips, then 4 more among clean ones
    recall, precision, min_score = measured(np.ones(40, bool), scores, np.r_[np.arange(20), [30, 32, 34, 36]],
                                            np.zeros(40, bool))  # fmt: skip
    assert precision == pytest.approx(24 / 40) and scores[39] < min_score <= scores[19]  # 0.6 of 40: not sure
    assert lower_bound(np.array([0.6]), np.array([40]))[0] < 0.6 < lower_bound(np.array([0.6]), np.array([4000]))[0] + 0.02


# ---- the command on a weak backbone ---------------------------------------------------------------------------


def _no_signal(tmp: Path, per_class: int = 30, classes: int = 4) -> Path:
    """Images of uniform noise in `classes` folders (train/ only): no feature can tell the classes apart (a random
    backbone still separates digits' classes: 0.93 out-of-fold on four of them, measured)."""
    rng = np.random.default_rng(0)
    root = tmp / "noise"
    for label in range(classes):
        (root / "train" / f"c{label}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(root / "train" / f"c{label}" / f"{i}.png")
    return root


def test_backbone_that_cannot_tell_the_classes_apart_warns_in_one_line_opens_its_report_with_it_and_proposes_few_relabels(
    tmp_path, capfd, hf_backbone_dir
):
    out = tmp_path / "audit"
    ran = run_script("scripts/audit.py", ["--model", hf_backbone_dir, "--dataset", str(_no_signal(tmp_path)),
                                          "--output_dir", str(out), "--device", "cpu", "--bf16", "false"], capfd,
                     cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "estimated precision" in warnings[0], ran.stderr
    record = json.loads((out / "audit.json").read_text())
    quality = record["quality"]
    assert quality["low_precision"] and record["counts"]["label_issue"] == quality["estimated_issues"]
    lines = (out / "report.md").read_text().splitlines()
    assert lines[2].startswith("**Warning: estimated precision"), lines[:8]
    first = next(i for i, line in enumerate(lines) if line.startswith("- "))  # the quality figures, after warnings
    assert all(line.startswith("**Warning") or not line for line in lines[2:first]), lines[:first]
    assert "out-of-fold accuracy" in lines[first] and "estimated noise rate" in lines[first + 1]
    with open(out / "relabel.csv", newline="") as f:
        relabel = [r for r in csv.DictReader(f) if r["kind"] == "label_issue"]
    proposed = [r for r in relabel if r["action"] == "relabel"]
    assert len(proposed) == quality["proposed"] < len(relabel)
    if quality["min_score"] is not None:
        assert all(float(r["score"]) >= quality["min_score"] for r in proposed)


def test_the_pixel_candidate_is_the_image_box_resized_to_8x8_grey_centred_and_unit(tmp_path):
    from vit_ft.data.digits import write_digits_imagefolder
    from vit_ft.tools.audit.findings import pixel_descriptor
    from vit_ft.tools.audit.probes import PIXEL_PROBE_SIZE, pixel_space

    folder = write_digits_imagefolder(tmp_path / "digits")
    images = [Image.open(p) for p in sorted((folder / "train").glob("*/*.png"))[:20]]
    space = pixel_space(np.stack([pixel_descriptor(i) for i in images]))
    reference = np.stack([pixel_descriptor(i, size=PIXEL_PROBE_SIZE) for i in images])  # PIL's box filter at 8x8
    assert space.shape == (20, PIXEL_PROBE_SIZE**2)
    np.testing.assert_allclose((space * reference).sum(1), 1, atol=1e-3)  # the same image up to uint8 rounding
