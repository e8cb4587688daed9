"""`vit-ft audit`: the detectors on features whose truth is known (label issues against cleanlab itself and the
plain baseline, copies at other sizes and JPEG qualities, outliers), the command end to end on digits with
injected faults (benchmarks/audit.py's seeded script) and a small backbone pre-trained on the faulted images, its
files, and bad input as one `error:` line each."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.audit import inject_faults, pixel_anchor, score
from tests.cli_runner import run_script
from vit_ft.data.digits import write_digits_imagefolder
from vit_ft.data.exclusions import FINDINGS_COLUMNS, RELABEL_COLUMNS
from vit_ft.tasks.feature_bank import FeatureBank, normalized
from vit_ft.tools.audit.findings import (
    PIXEL_COPY,
    copies,
    disagreements,
    out_of_fold_probabilities,
    outlier_scores,
    pixel_descriptor,
    stratified_folds,
)
from vit_ft.tools.audit.labels import label_issues

pytest.importorskip("cleanlab")


def clusters(n_per_class: int = 60, classes: int = 5, dim: int = 32, spread: float = 0.35, seed: int = 0):
    """Gaussian clusters around random unit centres: features, true labels."""
    rng = np.random.default_rng(seed)
    centres = normalized(rng.normal(size=(classes, dim)))
    labels = np.repeat(np.arange(classes), n_per_class)
    return centres[labels] + spread * rng.normal(size=(len(labels), dim)) / np.sqrt(dim), labels


def test_folds_hold_each_class_evenly_and_probabilities_come_from_probes_that_did_not_see_the_image():
    features, labels = clusters()
    fold = stratified_folds(labels, 5)
    for k in range(5):
        assert np.bincount(labels[fold == k]).tolist() == [12] * 5
    # an image's out-of-fold probability is unchanged when its own label is changed (its probe never saw it) ...
    probabilities, probe = out_of_fold_probabilities(features, labels, 5, l2_grid=(1.0,))
    flipped = labels.copy()
    flipped[0] = 3
    again, _ = out_of_fold_probabilities(features, flipped, 5, l2_grid=(1.0,))
    np.testing.assert_allclose(again[0], probabilities[0], atol=0.02)  # the temperature refits: nearly equal
    # ... and is a distribution; on separable clusters the probe is right
    np.testing.assert_allclose(probabilities.sum(1), 1, atol=1e-6)
    assert probe["accuracy"] > 0.95 and probe["l2"] == 1.0


def test_label_issues_are_cleanlabs_count_of_the_lowest_given_label_probabilities_and_find_the_flips():
    # was: flags = cleanlab | p(given) < 0.5, which flooded on a weak backbone (issue 46); now the count is
    # confident learning's calibrated estimate (num_label_issues) and the flags the lowest p(given)
    from cleanlab.count import num_label_issues
    from cleanlab.rank import get_label_quality_scores

    features, truth = clusters(n_per_class=80, spread=0.5)
    rng = np.random.default_rng(1)
    flipped = rng.choice(len(truth), size=len(truth) // 20, replace=False)  # 5 %
    given = truth.copy()
    given[flipped] = (truth[flipped] + rng.integers(1, 5, len(flipped))) % 5
    probabilities, _ = out_of_fold_probabilities(features, given, 5)
    found, estimate = label_issues(given, probabilities)
    rows = {f.index for f in found}
    count = num_label_issues(given, probabilities, estimation_method="off_diagonal_calibrated")
    reference = np.argsort(get_label_quality_scores(given, probabilities, method="self_confidence"))[:count]
    assert rows == set(reference.tolist())  # cleanlab's count and ranking, on the same probabilities
    assert len(rows) == estimate.issues >= num_label_issues(given, probabilities)  # calibrated: never fewer
    recall = len(rows & set(flipped)) / len(flipped)
    precision = len(rows & set(flipped)) / len(rows)
    assert recall >= 0.9 and precision >= 0.8, (recall, precision)  # the issue's targets
    for f in found:  # the suggestion is the true class wherever the flip was found; the score 1 - p(given)
        assert f.score == pytest.approx(1 - probabilities[f.index, given[f.index]])
        if f.index in set(flipped):
            assert f.suggested == truth[f.index] and f.given == given[f.index]
    assert disagreements(given, probabilities).sum() >= len(rows & set(flipped))


def _jpeg(image: Image.Image, size: int, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    image.resize((size, size), Image.Resampling.BILINEAR).save(buffer, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue()))


def test_copies_at_another_size_and_quality_are_found_and_distinct_images_are_not(tmp_path):
    digits = write_digits_imagefolder(tmp_path / "digits")
    train = [Image.open(p) for p in sorted((digits / "train").glob("*/*.png"))[:300]]
    test = [Image.open(p) for p in sorted((digits / "test").glob("*/*.png"))[:60]]
    pixels = np.stack([pixel_descriptor(i) for i in train])
    leaked = [_jpeg(test[i], size, quality) for i, size, quality in ((3, 16, 60), (7, 24, 90), (11, 40, 75))]
    duplicate = _jpeg(train[5], 8, 95)
    train_pixels = np.concatenate([pixels, np.stack([pixel_descriptor(i) for i in [*leaked, duplicate]])])
    rng = np.random.default_rng(0)
    values = {"features": rng.normal(size=(len(train_pixels), 8)), "pixels": train_pixels}  # features: no match
    held = {"test": {"features": rng.normal(size=(len(test), 8)), "pixels": np.stack([pixel_descriptor(i) for i in test])}}
    found = copies(values, held)
    leaks = {(f.index, f.other_index) for f in found if f.kind == "leak"}
    assert leaks == {(300, 3), (301, 7), (302, 11)}
    # the copy of train[5]; digits' 8x8 images hold a few near-identical pairs of their own (two bars as "1")
    assert (5, 303) in {(f.other_index, f.index) for f in found if f.kind == "duplicate"}
    assert all(f.score >= PIXEL_COPY for f in found)
    # the same features are a copy too (pixels alike or not)
    values["features"][10] = held["test"]["features"][0]
    assert (10, 0) in {(f.index, f.other_index) for f in copies(values, held) if f.kind == "leak"}


def test_outlier_scores_rank_images_far_from_every_other_first():
    features, labels = clusters(n_per_class=40)
    rng = np.random.default_rng(2)
    far = normalized(rng.normal(size=(4, features.shape[1])))
    bank = FeatureBank(normalized(np.concatenate([features, far])), np.concatenate([labels, [0] * 4]),
                       np.arange(len(labels) + 4))  # fmt: skip
    scores = outlier_scores(bank)
    assert set(np.argsort(-scores)[:4]) == set(range(len(labels), len(labels) + 4))
    assert (scores > 1).mean() < 0.05  # about the 1 % the quantile flags by chance, and the far ones


# ---- the command end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> tuple[Path, dict[str, list[str]], Path]:
    """Digits with faults injected (5 % flipped, 20 leaks, 10 noise images) and a small backbone pre-trained on the
    faulted training images for 10 epochs: a weak one (the benchmark's 60 make its features better than pixels)."""
    return faulted_digits_backbone(tmp_path_factory.mktemp("audit"), epochs=10)


def faulted_digits_backbone(tmp: Path, epochs: int, **faults) -> tuple[Path, dict[str, list[str]], Path]:
    """Digits written to tmp/digits, faults injected into tmp/faulted (`benchmarks.audit.inject_faults`, seed 0,
    `faults` its counts), and a backbone pre-trained on the faulted training images for `epochs` on one thread
    into tmp/backbone: (faulted folder, injected truth, backbone)."""
    import torch

    from vit_ft.training.pretrain import pretrain_digits

    digits = write_digits_imagefolder(tmp / "digits")
    truth = inject_faults(digits, tmp / "faulted", seed=0, **faults)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pretrain_digits(tmp / "backbone", tmp / "faulted" / "train", epochs=epochs, seed=0, progress=False)
    finally:
        torch.set_num_threads(threads)
    return tmp / "faulted", truth, tmp / "backbone"


@pytest.mark.slow
def test_audit_finds_the_injected_leaks_and_outliers_and_writes_its_files(faulted, tmp_path, capfd):
    data, truth, backbone = faulted
    out = tmp_path / "audit"
    ran = run_script("scripts/audit.py", ["--model", str(backbone), "--dataset", str(data), "--output_dir", str(out),
                                          "--device", "cpu", "--bf16", "false"], capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "relabel.csv" in ran.stdout
    result = score(out / "findings.csv", truth)
    assert result["leak"]["found"] == 20 and result["leak"]["others"] <= 5, result  # the issue's targets
    assert result["outlier"]["in_top_20"] == 10, result
    # a weak backbone (10 epochs): label issues at least as found as by cleanlab on raw pixels, and the warning
    anchor = pixel_anchor(data, truth)
    found = result["label_issue"]
    assert found["recall"] >= anchor["recall"] and found["precision"] >= anchor["precision"], (found, anchor)
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "raw pixels" in warnings[0], ran.stderr[-2000:]
    with open(out / "findings.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == FINDINGS_COLUMNS
    for kind in ("label_issue", "leak", "outlier"):
        scores = [float(r["score"]) for r in rows if r["kind"] == kind]
        assert scores == sorted(scores, reverse=True) and scores, kind
    record = json.loads((out / "audit.json").read_text())
    assert record["counts"] == {k: sum(r["kind"] == k for r in rows) for k in record["counts"]}
    report = (out / "report.md").read_text()
    for kind in record["counts"]:
        assert f"audit_{kind}.png" in report and (out / f"audit_{kind}.png").stat().st_size > 1000
    with open(out / "relabel.csv", newline="") as f:
        relabel = list(csv.DictReader(f))
    assert tuple(relabel[0]) == RELABEL_COLUMNS
    assert {r["action"] for r in relabel if r["kind"] == "leak"} == {"drop"}
    assert all(r["label"] and r["label"] != r["given_label"] for r in relabel if r["action"] == "relabel")
    assert len({r["path"] for r in relabel}) == len(relabel)  # one row per image


def _one_class(tmp: Path) -> Path:
    root = tmp / "one"
    (root / "train" / "7").mkdir(parents=True)
    for i in range(6):
        Image.fromarray(np.full((8, 8), i * 30, np.uint8)).save(root / "train" / "7" / f"{i}.png")
    return root


@pytest.mark.parametrize(
    "case, expected",
    [
        ("one_class", "has 1 class"),
        ("no_train", "has no train/ folder"),
        ("missing", "nowhere: no such folder; pass a folder with train/"),
        ("folds", "--folds 1 must be at least 2"),
        ("small_class", "fewer training images than --folds 5"),
    ],
)
def test_bad_input_is_one_error_line(case, expected, tmp_path, capfd, hf_backbone_dir):
    dataset = {"one_class": lambda: _one_class(tmp_path), "no_train": lambda: Path(shutil.copytree(_one_class(tmp_path) / "train", tmp_path / "flat")),
               "missing": lambda: tmp_path / "nowhere"}.get(case, lambda: None)()  # fmt: skip
    extra = []
    if case == "folds":
        dataset, extra = _one_class(tmp_path), ["--folds", "1"]
    if case == "small_class":
        dataset = _one_class(tmp_path)
        (dataset / "train" / "3").mkdir()
        shutil.copy(dataset / "train" / "7" / "0.png", dataset / "train" / "3" / "0.png")
    ran = run_script("scripts/audit.py", ["--model", hf_backbone_dir, "--dataset", str(dataset), "--output_dir",
                                          str(tmp_path / "out"), *extra], capfd, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 1
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], ran.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_without_cleanlab_the_audit_is_one_line_saying_how_to_install_it(tmp_path, capfd, hf_backbone_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "cleanlab.filter", None)  # import fails as when it is not installed
    ran = run_script("scripts/audit.py", ["--model", hf_backbone_dir, "--dataset", str(_one_class(tmp_path)),
                                          "--output_dir", str(tmp_path / "out")], capfd, cwd=tmp_path)  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1 and len(lines) == 1 and "pip install 'vit-ft[audit]'" in lines[0], ran.stderr
