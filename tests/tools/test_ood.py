"""Out-of-distribution awareness end to end on a tiny fine-tune: the feature bank it writes (fitted on
validation, read back whole), predict's unlike_training / ood_score columns, evaluate's count, the demo's
warning and expected input, and a model folder without a bank (empty column, one line saying why)."""

from __future__ import annotations

import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from benchmarks.ood import noise_images
from vit_ft.data.images import load_image
from vit_ft.tasks.feature_bank import (
    FEATURE_BANK_FILE,
    OOD_QUANTILE,
    SPACES,
    FeatureBank,
    bank_features,
    normalized,
)
from vit_ft.tools.evaluate.data import resolve_eval_data
from vit_ft.tools.evaluate.run import run_evaluation
from vit_ft.tools.predict.run import OOD_COLUMNS, read_predictions, run_prediction
from vit_ft.tools.trained import load_trained


@pytest.fixture(scope="module")
def trained(tiny_finetuned_dir):
    return load_trained(tiny_finetuned_dir, device="cpu")


@pytest.fixture(scope="module")
def image_sets(trained, tmp_path_factory) -> dict[str, list[Path]]:
    """Test digits, the same digits inverted (dark strokes on light) and uniform noise, as files."""
    root = tmp_path_factory.mktemp("ood_images")
    test = resolve_eval_data(trained.origin, trained.id2label).dataset["image"][:24]
    sets: dict[str, list[Path]] = {"digits": [], "inverted": [], "noise": []}
    for i, image in enumerate(test):
        digit = load_image(image)
        digit.save(root / f"digit_{i:02d}.png")
        ImageOps.invert(digit).save(root / f"inverted_{i:02d}.png")
        sets["digits"].append(root / f"digit_{i:02d}.png")
        sets["inverted"].append(root / f"inverted_{i:02d}.png")
    for i, data in enumerate(noise_images(24, seed=1)):
        Image.open(io.BytesIO(data)).save(root / f"noise_{i:02d}.png")
        sets["noise"].append(root / f"noise_{i:02d}.png")
    return sets


def test_the_fine_tune_keeps_a_bank_of_the_training_images_fitted_on_validation(tiny_finetuned_dir, trained):
    bank = FeatureBank.load(tiny_finetuned_dir / FEATURE_BANK_FILE)
    record = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["feature_bank"]
    assert record["written"] and record["images"] == len(bank) == 96  # the tiny recipe's max_train_samples
    assert record["ood"] == bank.ood and bank.ood["split"] == "validation" and bank.ood["quantile"] == OOD_QUANTILE
    assert bank.expected_input["colours"] == "grey" and bank.expected_input["background"] == "dark"
    # each entry is a training image's features as the saved model gives them, with its label (read back whole)
    train = resolve_eval_data(trained.origin, trained.id2label, split="train")  # before max_train_samples
    features, _ = bank_features(trained.model, trained.transform, train.dataset["image"])
    for space in SPACES:
        similarity = bank.space(space) @ normalized(features[space]).T  # (bank, train)
        assert (similarity.max(axis=1) > 1 - 1e-5).all()
        if space == "features":
            same = similarity.argmax(axis=1)
    np.testing.assert_array_equal(bank.labels, train.labels[same])
    assert len(set(bank.rows.tolist())) == len(bank)
    paths = [image["path"] for image in train.dataset.with_format(None)["image"]]
    assert [paths[i] for i in same] == list(bank.sources)  # each entry names its file
    # each threshold is the quantile of the validation images' k-th neighbour distances, not of test's
    validation = resolve_eval_data(trained.origin, trained.id2label, split="validation").dataset["image"]
    held_out, _ = bank_features(trained.model, trained.transform, validation)
    assert bank.ood["images"] == len(validation)
    for space in SPACES:
        expected = np.quantile(bank.distances(held_out[space], space), OOD_QUANTILE)
        assert bank.ood["thresholds"][space] == pytest.approx(expected, rel=1e-3, abs=1e-6)


def test_predict_marks_noise_and_inverted_digits_more_often_than_digits(tiny_finetuned_dir, image_sets, tmp_path):
    files = [path for paths in image_sets.values() for path in paths]
    summary = run_prediction(tiny_finetuned_dir, files, tmp_path / "preds.csv", figure=None, device="cpu")
    rows = {Path(row["path"]).name: row for row in read_predictions(tmp_path / "preds.csv")}
    header = (tmp_path / "preds.csv").read_text().splitlines()[0].split(",")
    assert tuple(header[-2:]) == OOD_COLUMNS
    rate = {name: np.mean([rows[p.name]["unlike_training"] for p in paths]) for name, paths in image_sets.items()}
    assert rate["noise"] > rate["digits"] and rate["inverted"] > rate["digits"] and rate["digits"] <= 0.25, rate
    assert all((row["ood_score"] > 1) == row["unlike_training"] for row in rows.values())
    assert summary["unlike_training"] == sum(row["unlike_training"] for row in rows.values())
    run_prediction(tiny_finetuned_dir, files[:3], tmp_path / "preds.jsonl", figure=None, device="cpu")
    assert [set(row) >= set(OOD_COLUMNS) for row in read_predictions(tmp_path / "preds.jsonl")] == [True] * 3


def test_evaluate_counts_the_test_images_unlike_the_training_images(tiny_finetuned_dir, tmp_path):
    metrics = run_evaluation(tiny_finetuned_dir, tmp_path / "report", device="cpu")
    entry = metrics["unlike_training"]
    predictions = run_prediction(
        tiny_finetuned_dir, [Path(row) for row in _evaluated_paths(tmp_path / "report")], tmp_path / "p.csv",
        figure=None, device="cpu", batch_size=64,  # evaluate's batches: the same sums, the same scores
    )  # fmt: skip
    assert entry["images"] == metrics["num_images"]
    assert entry["flagged"] == predictions["unlike_training"], (entry, predictions)
    assert entry["fraction"] == pytest.approx(entry["flagged"] / entry["images"])
    assert entry["fit"] == FeatureBank.load(tiny_finetuned_dir / FEATURE_BANK_FILE).ood
    assert f"{entry['flagged']} of {entry['images']} images" in (tmp_path / "report" / "report.md").read_text()
    # per image too: predictions.csv's columns equal predict's for the same files
    evaluated = _evaluated_rows(tmp_path / "report")
    predicted = {row["path"]: row for row in read_predictions(tmp_path / "p.csv")}
    assert sum(row["unlike_training"] == "True" for row in evaluated) == entry["flagged"]
    for row in evaluated:
        assert row["unlike_training"] == str(predicted[row["source"]]["unlike_training"])
        assert float(row["ood_score"]) == pytest.approx(predicted[row["source"]]["ood_score"], rel=1e-6)


def _evaluated_rows(report: Path) -> list[dict[str, str]]:
    import csv

    with (report / "predictions.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _evaluated_paths(report: Path) -> list[str]:
    return [row["source"] for row in _evaluated_rows(report)]


def test_a_folder_without_a_bank_still_predicts_and_says_why_once(tiny_finetuned_dir, image_sets, tmp_path, caplog):
    folder = tmp_path / "old_run"
    shutil.copytree(tiny_finetuned_dir, folder, ignore=shutil.ignore_patterns(FEATURE_BANK_FILE, "checkpoint-*"))
    with caplog.at_level(logging.INFO, logger="vit_ft"):
        run_prediction(folder, image_sets["noise"][:2], tmp_path / "preds.csv", figure=None, device="cpu")
    rows = read_predictions(tmp_path / "preds.csv")
    assert [(row["unlike_training"], row["ood_score"]) for row in rows] == [(None, None)] * 2
    assert all(row["label"] is not None for row in rows)
    why = [r.getMessage() for r in caplog.records if "No out-of-distribution score" in r.getMessage()]
    assert len(why) == 1 and FEATURE_BANK_FILE in why[0] and "\n" not in why[0]
    metrics = run_evaluation(folder, tmp_path / "report", device="cpu")
    assert metrics["unlike_training"]["flagged"] is None and FEATURE_BANK_FILE in metrics["unlike_training"]["why"]
    assert {(row["unlike_training"], row["ood_score"]) for row in _evaluated_rows(tmp_path / "report")} == {("", "")}


def test_the_demo_warns_on_noise_and_states_the_expected_input(tiny_finetuned_dir, image_sets):
    from ..test_demo import load_app

    app = load_app()
    classifier = app.Classifier(tiny_finetuned_dir)
    intro = app.introduction(classifier)
    assert "Expected input:** grey images of about 8x8 pixels on a dark background" in intro
    noise = str(image_sets["noise"][0])
    line, _ = classifier.status(noise, {"confidences": [{"label": "3", "confidence": 1.0}]})
    assert "does not look like the training images" in line and "The model expects grey images" in line
    digits = [classifier.unlike_training(str(path))[1] for path in image_sets["digits"]]
    noises = [classifier.unlike_training(str(path))[1] for path in image_sets["noise"]]
    assert np.mean(noises) > np.mean(digits)
