"""scripts/evaluate_model.py and vit_ft.tools.evaluate.run: metrics, per-class table, confusion matrix, mistakes."""

import csv
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import precision_recall_fscore_support

from vit_ft.tasks.single_label import confusion_counts, per_class_table
from vit_ft.tools.evaluate.run import run_evaluation

from ..cli_runner import run_script
from ..conftest import REPO


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def report(tiny_finetuned_dir, tmp_path_factory):
    """The report of `python scripts/evaluate_model.py` on the fine-tune's recorded (test) data."""
    out = tmp_path_factory.mktemp("report") / "report"
    # float32, as the fine-tune evaluated: the numbers must match to the last digit (run in this process)
    args = ["--model", tiny_finetuned_dir, "--output_dir", out, "--bf16", "false"]
    result = run_script("scripts/evaluate_model.py", args, None, cwd=out.parent)
    assert result.returncode == 0, result.stderr[-4000:]
    return out, json.loads((out / "metrics.json").read_text())


def test_report_holds_every_artefact_and_links_them(report):
    out, _ = report
    for name in ("report.md", "metrics.json", "per_class.csv", "per_class.md", "confusion_matrix.png",
                 "confusion_matrix.csv", "confusion_matrix.npy", "mistakes.png", "mistakes.csv",
                 "predictions.csv", "training_curves.png", "per_class.png", "reliability.png"):  # fmt: skip
        assert (out / name).is_file(), name
    text = (out / "report.md").read_text()
    for link in ("(confusion_matrix.png)", "(mistakes.png)", "(training_curves.png)", "(metrics.json)",
                 "(per_class.csv)", "(per_class.png)", "(reliability.png)"):  # fmt: skip
        assert link in text, link
    for name in ("confusion_matrix.png", "mistakes.png", "per_class.png", "reliability.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG" and min(image.size) > 200


def test_metrics_reproduce_the_finetunes_test_results(report, tiny_finetuned_dir):
    """Same split, subset (seed read back from training_args.bin), transform and metric code as the fine-tune."""
    _, metrics = report
    test = json.loads((tiny_finetuned_dir / "test_results.json").read_text())
    assert metrics["num_images"] == 48 and metrics["num_skipped"] == 0
    assert metrics["accuracy"] == pytest.approx(test["test_accuracy"], abs=1e-9)
    assert metrics["top5_accuracy"] == pytest.approx(test["test_top5_accuracy"], abs=1e-9)
    assert metrics["f1"] == pytest.approx(test["test_f1"], abs=1e-9)
    assert metrics["balanced_accuracy"] == pytest.approx(test["test_balanced_accuracy"], abs=1e-9)
    assert metrics["image_size"] == [32, 32] and "'test'" in metrics["data"]


def test_confusion_matrix_per_class_table_and_predictions_agree(report):
    out, metrics = report
    counts = np.load(out / "confusion_matrix.npy")
    assert counts.shape == (10, 10) and counts.sum() == metrics["num_images"]
    rows = list(csv.reader((out / "confusion_matrix.csv").open()))
    assert rows[0][1:] == [str(i) for i in range(10)]
    np.testing.assert_array_equal(np.array([r[1:] for r in rows[1:]], dtype=np.int64), counts)
    assert np.trace(counts) / counts.sum() == pytest.approx(metrics["accuracy"])
    present = counts.sum(axis=1) > 0  # balanced accuracy: the mean recall of the classes in the labels
    recalls = np.diag(counts)[present] / counts.sum(axis=1)[present]
    assert metrics["balanced_accuracy"] == pytest.approx(recalls.mean())

    table = read_csv(out / "per_class.csv")
    for row in table:
        i = int(row["id"])
        assert int(row["support"]) == counts[i].sum() and int(row["predicted"]) == counts[:, i].sum()
        expected_recall = counts[i, i] / counts[i].sum() if counts[i].sum() else 0.0
        assert float(row["recall"]) == pytest.approx(expected_recall)  # the class's accuracy
    assert (out / "per_class.md").read_text().count("\n") == 12  # header, rule, 10 classes

    predictions = read_csv(out / "predictions.csv")
    assert len(predictions) == metrics["num_images"]
    assert np.mean([p["correct"] == "True" for p in predictions]) == pytest.approx(metrics["accuracy"])
    for p in predictions:
        assert counts[int(p["true_label"]), int(p["predicted_label"])] > 0


def test_mistakes_grid_lists_only_the_most_confident_misclassified_images(report):
    out, _ = report
    mistakes = read_csv(out / "mistakes.csv")
    wrong = [p for p in read_csv(out / "predictions.csv") if p["correct"] == "False"]
    assert len(mistakes) == min(25, len(wrong)) > 0
    by_row = {p["row"]: p for p in wrong}
    for m in mistakes:
        assert m["true_label"] != m["predicted_label"]
        assert by_row[m["row"]]["predicted_label"] == m["predicted_label"]  # a wrong prediction, same image
    confidences = [float(m["probability"]) for m in mistakes]
    assert confidences == sorted(confidences, reverse=True)
    assert (
        confidences[-1] >= sorted((float(p["probability"]) for p in wrong), reverse=True)[len(mistakes) - 1]
    )


def test_image_folder_at_another_resolution_maps_labels_by_name_and_skips_bad_files(
    tiny_finetuned_dir, tmp_path
):
    run = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())
    test_dir = run["data"]["test_dir"]
    folder = tmp_path / "mine"
    for digit in ("3", "7"):  # a subset of the classes: ids must come from the names, not the folder order
        (folder / digit).mkdir(parents=True)
        for path in sorted(os.listdir(os.path.join(test_dir, digit)))[:3]:
            shutil.copy(os.path.join(test_dir, digit, path), folder / digit / path)
    (folder / "7" / "broken.png").write_bytes(b"not a png")
    metrics = run_evaluation(
        tiny_finetuned_dir, tmp_path / "rep", data_dir=folder, image_size=48, max_mistakes=4
    )
    assert metrics["image_size"] == [48, 48] and metrics["trained_image_size"] == [32, 32]
    assert metrics["num_images"] == 6 and metrics["num_skipped"] == 1
    assert "broken.png" in metrics["skipped"][0]["source"]
    counts = np.load(tmp_path / "rep" / "confusion_matrix.npy")
    assert counts.sum() == 6 and counts[3].sum() == 3 and counts[7].sum() == 3
    assert len(read_csv(tmp_path / "rep" / "mistakes.csv")) <= 4
    assert "Resolution: 48x48 (fine-tuned at 32x32)" in (tmp_path / "rep" / "report.md").read_text()


def test_unknown_class_folder_and_bad_resolution_are_errors_that_say_what_to_do(tiny_finetuned_dir, tmp_path):
    (tmp_path / "cats" / "tabby").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "cats" / "tabby" / "a.png")
    with pytest.raises(ValueError, match="tabby"):
        run_evaluation(tiny_finetuned_dir, tmp_path / "rep", data_dir=tmp_path / "cats")
    with pytest.raises(ValueError, match="multiple of the model's patch size 4x4.*--image_size 32"):
        run_evaluation(tiny_finetuned_dir, tmp_path / "rep", image_size=30)


def test_numbers_from_counts_match_sklearn():
    rng = np.random.default_rng(0)
    labels, predictions = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    predictions[predictions == 4] = 3  # class 4 is never predicted: precision undefined -> 0
    counts = confusion_counts(labels, predictions, 6)  # class 5 never occurs
    assert counts.sum() == 200
    table = per_class_table(counts, {i: f"c{i}" for i in range(6)})
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predictions, labels=range(6), zero_division=0
    )
    np.testing.assert_allclose([r["precision"] for r in table], precision)
    np.testing.assert_allclose([r["recall"] for r in table], recall)
    np.testing.assert_allclose([r["f1"] for r in table], f1)
    assert [r["support"] for r in table] == support.tolist()


def test_no_script_is_named_like_a_module():
    """`python scripts/x.py` puts scripts/ first on sys.path, so a script named like a standard-library or
    installed module (`inspect`, the `evaluate` library) would stand in for it in every import of that run."""
    scripts = (REPO / "scripts").resolve()
    assert all(Path(p or os.curdir).resolve() != scripts for p in sys.path)
    stems = sorted(path.stem for path in scripts.glob("*.py"))
    assert "evaluate_model" in stems and "inspect_model" in stems
    shadowing = [s for s in stems if s in sys.stdlib_module_names or importlib.util.find_spec(s) is not None]
    assert shadowing == []


def test_bf16_autocast_is_recorded_and_close_to_float32(tiny_finetuned_dir, tmp_path, report):
    """--bf16 true runs the model under bf16 autocast: metrics.json and report.md say so, and the accuracy stays
    within a few images of float32's; a bad --bf16 value is refused before anything is written."""
    _, fp32 = report
    metrics = run_evaluation(tiny_finetuned_dir, tmp_path / "bf16", bf16="true")
    assert metrics["bf16"] is True and fp32["bf16"] is False
    assert "- Precision: bf16 autocast on cpu" in (tmp_path / "bf16" / "report.md").read_text()
    assert abs(metrics["accuracy"] - fp32["accuracy"]) <= 3 / fp32["num_images"]
    with pytest.raises(ValueError, match="--bf16 maybe must be one of auto, true, false"):
        run_evaluation(tiny_finetuned_dir, tmp_path / "bad", bf16="maybe")
    assert not (tmp_path / "bad").exists()


def test_recorded_temperature_calibrates_the_reported_probabilities_and_ece(
    report, tiny_finetuned_dir, tmp_path
):
    from vit_ft.metrics.calibration import reliability_bins

    out, metrics = report
    fitted = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["calibration"]["temperature"]
    assert (
        metrics["temperature"] == pytest.approx(fitted) and fitted != 1.0
    )  # the fine-tune's, fitted on validation
    model = tmp_path / "calibrated"
    shutil.copytree(tiny_finetuned_dir, model, ignore=shutil.ignore_patterns("checkpoint-*"))
    record = json.loads((model / "vit_ft_run.json").read_text())
    (model / "vit_ft_run.json").write_text(json.dumps({**record, "calibration": {"temperature": 3.0}}))
    calibrated = run_evaluation(model, tmp_path / "eval", progress=False, bf16=False)
    assert calibrated["temperature"] == 3.0 and calibrated["accuracy"] == metrics["accuracy"]  # argmax kept
    assert calibrated["ece_uncalibrated"] == pytest.approx(metrics["ece_uncalibrated"])
    for folder, numbers in ((out, metrics), (tmp_path / "eval", calibrated)):
        rows = read_csv(folder / "predictions.csv")
        confidence = np.array([float(r["probability"]) for r in rows])
        bins = reliability_bins(confidence, np.array([r["correct"] == "True" for r in rows]))
        assert numbers["ece"] == pytest.approx(bins.ece, abs=1e-6)  # the ECE of the probabilities reported
        assert "Calibration" in (folder / "report.md").read_text()
    before = np.array([float(r["probability"]) for r in read_csv(out / "predictions.csv")])
    after = np.array([float(r["probability"]) for r in read_csv(tmp_path / "eval" / "predictions.csv")])
    assert (after < before).all()  # T = 3 > 1: less sure of every prediction
    assert "temperature 3.000" in (tmp_path / "eval" / "report.md").read_text()
