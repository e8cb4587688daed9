"""evaluate and predict on a multi-label model (issue 24, item 4): evaluation's numbers equal scikit-learn's on
the same sigmoid probabilities at the model's saved threshold, its files are there and hold what they say;
predict lists every label at or above its threshold, as a hand computation from the logits does; a mistake is
one `error:` line and writes nothing. A tiny model (hidden 32, 2 layers, 16x16) on a generated labels.csv folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.metrics import accuracy_score, average_precision_score, f1_score
from sklearn.metrics import precision_recall_curve as sklearn_pr_curve

from vit_ft.metrics.multilabel import MULTI_LABEL, sigmoid
from vit_ft.reports.charts import precision_recall_curve
from vit_ft.tools.evaluate.data import data_from_fields, folder_eval_data
from vit_ft.tools.evaluate.run import run_evaluation
from vit_ft.tools.predict.run import MULTI_LABEL_COLUMNS, read_predictions, run_prediction
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import save_tiny_classifier

DATA_NAMES = ["cat", "dog", "grass", "sky"]  # the folder's labels
MODEL_NAMES = ["sky", "car", "dog", "cat", "grass"]  # another order, and "car", which the data never shows
NUM_IMAGES = 24


def _write_folder(root: Path, rows: list[tuple[str, list[str]]], seed: int = 0) -> Path:
    """Random images with labels.csv (file,labels; ';' between labels)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name, _ in rows:
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(root / name)
    lines = ["file,labels", *(f"{name},{';'.join(labels)}" for name, labels in rows)]
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """24 images with 0-3 of DATA_NAMES each (image 5 has none: all-negative)."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(NUM_IMAGES):
        count = 0 if i == 5 else int(rng.integers(1, 4))
        rows.append((f"img{i:02d}.png", sorted(rng.choice(DATA_NAMES, count, replace=False).tolist())))
    return _write_folder(tmp_path_factory.mktemp("ml") / "photos", rows)



def hand_probabilities(model_dir: Path, files: list[Path]) -> np.ndarray:
    """(images, labels) sigmoid of `Trained.logits` on the model's own eval transform, computed here."""
    trained = load_trained(model_dir, device="cpu")
    pixels = torch.stack([trained.transform.transform_image(str(f)) for f in files])
    return sigmoid(trained.logits(pixels).numpy())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, folder) -> Path:
    """A multi-label model whose per-label thresholds leave img03 with no label and the others with some:
    each threshold just above img03's probability, or the label's median probability when that is higher."""
    path = save_tiny_classifier(tmp_path_factory.mktemp("ml_model"), MODEL_NAMES, seed=4, problem_type=MULTI_LABEL)
    probabilities = hand_probabilities(path, sorted(folder.glob("*.png")))
    thresholds = np.maximum(probabilities[3] + 1e-4, np.median(probabilities, axis=0)).round(6)
    config = json.loads((path / "config.json").read_text())
    config["decision_threshold"] = thresholds.tolist()
    (path / "config.json").write_text(json.dumps(config))
    return path


def data_labels(folder: Path, names: list[str]) -> np.ndarray:
    """(images, labels) multi-hot rows over `names`, read from labels.csv here."""
    with open(folder / "labels.csv", newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda row: row["file"])
    return np.array([[name in row["labels"].split(";") for name in names] for row in rows], dtype=int)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def report(model_dir, folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("ml_report") / "report"
    metrics = run_evaluation(model_dir, out, data_dir=folder, max_mistakes=4, progress=False, device="cpu")
    return out, metrics


def test_evaluation_numbers_equal_sklearn_at_the_saved_threshold(report, model_dir, folder):
    out, metrics = report
    assert metrics == json.loads((out / "metrics.json").read_text())
    files = sorted(folder.glob("*.png"))
    probabilities = hand_probabilities(model_dir, files)
    labels = data_labels(folder, MODEL_NAMES)  # by name, in the model's order; "car" all zero
    thresholds = np.array(json.loads((model_dir / "config.json").read_text())["decision_threshold"])
    ap = [average_precision_score(labels[:, j], probabilities[:, j]) for j in range(5) if labels[:, j].any()]
    assert metrics["mAP"] == pytest.approx(np.mean(ap), abs=1e-6)
    predicted = probabilities >= thresholds
    for average in ("micro", "macro"):
        expected = f1_score(labels, predicted, average=average, zero_division=0)
        assert metrics[f"f1_{average}"] == pytest.approx(expected, abs=1e-9)
    assert metrics["exact_match"] == pytest.approx(accuracy_score(labels, predicted))
    assert metrics["threshold"] == dict(zip(MODEL_NAMES, thresholds.tolist(), strict=True))
    assert metrics["labels_without_positives"] == ["car"] and metrics["num_images"] == NUM_IMAGES

    table = read_csv(out / "per_class.csv")
    assert [row["class"] for row in table] == MODEL_NAMES
    for j, row in enumerate(table):
        assert int(row["support"]) == labels[:, j].sum() and int(row["predicted"]) == predicted[:, j].sum()
        assert float(row["threshold"]) == pytest.approx(thresholds[j])
        if row["class"] == "car":
            assert row["ap"] == ""  # no positive image: no AP, left out of mAP
            continue
        assert float(row["ap"]) == pytest.approx(average_precision_score(labels[:, j], probabilities[:, j]))
        assert float(row["f1"]) == pytest.approx(f1_score(labels[:, j], predicted[:, j], zero_division=0))

    rows = read_csv(out / "predictions.csv")
    assert [row["predicted_labels"] for row in rows] == [
        ";".join(n for n, p in zip(MODEL_NAMES, image, strict=True) if p) for image in predicted
    ]


def test_evaluation_files_and_the_most_confident_wrong_labels(report, model_dir, folder):
    out, _ = report
    for name in ("pr_curves.png", "per_class.png", "false_positives.png", "false_negatives.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG" and min(image.size) > 150, name
    text = (out / "report.md").read_text()
    for link in ("(pr_curves.png)", "(false_positives.png)", "(false_negatives.png)", "(metrics.json)",
                 "(per_class.csv)", "(mistakes.csv)", "| car | 0 |"):  # fmt: skip
        assert link in text, link
    probabilities = hand_probabilities(model_dir, sorted(folder.glob("*.png")))
    labels = data_labels(folder, MODEL_NAMES) > 0
    thresholds = np.array(json.loads((model_dir / "config.json").read_text())["decision_threshold"])
    predicted = probabilities >= thresholds
    mistakes = read_csv(out / "mistakes.csv")
    for kind, wrong, highest in (("false positive", predicted & ~labels, True),
                                 ("false negative", ~predicted & labels, False)):  # fmt: skip
        found = [m for m in mistakes if m["kind"] == kind]
        expected = sorted(probabilities[wrong], reverse=highest)[:4]
        assert len(found) == min(4, wrong.sum()) > 0
        np.testing.assert_allclose([float(m["probability"]) for m in found], expected, rtol=1e-6)
        for m in found:
            i, j = int(m["row"]), MODEL_NAMES.index(m["label"])
            assert wrong[i, j] and Path(m["source"]).name == f"img{i:02d}.png"


def test_pr_curve_is_sklearns():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 60)
    scores = np.round(rng.random(60), 1)  # many ties
    precision, recall = precision_recall_curve(labels, scores)
    expected_precision, expected_recall, _ = sklearn_pr_curve(labels, scores)
    np.testing.assert_allclose(precision, expected_precision)
    np.testing.assert_allclose(recall, expected_recall)
    assert precision_recall_curve(np.zeros(5), scores[:5])[0].size == 0


def test_folder_labels_are_matched_by_name(folder):
    data = folder_eval_data(folder, dict(enumerate(MODEL_NAMES)), multi_label=True)
    np.testing.assert_array_equal(data.labels, data_labels(folder, MODEL_NAMES))
    with pytest.raises(ValueError, match=r"has label\(es\) \['cat'\] that the model does not know"):
        folder_eval_data(folder, dict(enumerate(["sky", "dog", "grass"])), multi_label=True)


def test_predict_lists_every_label_at_or_above_its_threshold(model_dir, folder, tmp_path):
    files = sorted(folder.glob("*.png"))
    probabilities = hand_probabilities(model_dir, files)
    thresholds = json.loads((model_dir / "config.json").read_text())["decision_threshold"]
    expected_threshold = dict(zip(MODEL_NAMES, thresholds, strict=True))
    for name in ("p.csv", "p.jsonl"):
        figure = "auto" if name == "p.csv" else None  # one figure is enough
        summary = run_prediction(model_dir, [*files, tmp_path / "missing.png"], tmp_path / name, batch_size=5,
                                 progress=False, device="cpu", figure=figure, figure_images=6)  # fmt: skip
        assert summary["rows"] == NUM_IMAGES + 1 and summary["errors"] == 1
        if name == "p.csv":
            assert (tmp_path / name).read_text().splitlines()[0] == ",".join(MULTI_LABEL_COLUMNS)
        rows = read_predictions(tmp_path / name)
        for row, p in zip(rows, probabilities, strict=False):
            order = [j for j in np.argsort(-p, kind="stable") if p[j] >= thresholds[j]]
            assert row["labels"] == [MODEL_NAMES[j] for j in order]
            np.testing.assert_allclose(row["scores"], p[order], rtol=1e-5)
            assert row["num_labels"] == len(order) and row["threshold"] == expected_threshold
        assert rows[3]["labels"] == [] and rows[3]["num_labels"] == 0  # none at or above threshold
        assert sum(row["num_labels"] or 0 for row in rows) > NUM_IMAGES  # several labels per image too
        assert rows[-1]["error"] and rows[-1]["labels"] == [] and rows[-1]["num_labels"] is None
    with Image.open(tmp_path / "p.png") as image:
        assert image.format == "PNG"


def test_mistakes_are_one_error_line_and_write_nothing(model_dir, folder, tmp_path, capfd):
    single = save_tiny_classifier(tmp_path / "single", DATA_NAMES, seed=1)
    classes = tmp_path / "classes"
    for name in DATA_NAMES[:2]:
        (classes / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(classes / name / "a.png")
    missing = _write_folder(tmp_path / "missing", [("a.png", ["cat"]), ("b.png", ["dog"])])
    (missing / "b.png").unlink()
    cases = [
        (model_dir, missing, "labels.csv line 3 names 'b.png', which is not a file"),
        (model_dir, classes, "has no labels.csv or labels.jsonl, but the model is multi-label"),
        (single, folder, "is multi-label (several labels per image), but the model is a single-label"),
    ]
    for i, (model, data, words) in enumerate(cases):
        out = tmp_path / f"out{i}"
        args = ["--model", model, "--data_dir", data, "--output_dir", out, "--bf16", "false"]
        result = run_script("scripts/evaluate_model.py", args, capfd, cwd=tmp_path)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert last.startswith("error: ") and words in last, last
        assert not out.exists()


def test_recorded_data_is_rebuilt_multi_label_with_its_class_names(folder, tmp_path):
    """A run record's data fields (a save_to_disk dataset with a multi-hot column, its `class_names`) give the
    test split as multi-hot rows over the model's labels, matched by name; a single-label model refuses it."""
    import datasets

    matrix = data_labels(folder, DATA_NAMES)
    files = [str(f) for f in sorted(folder.glob("*.png"))]
    split = datasets.Dataset.from_dict(
        {"image": files, "label": matrix.astype(np.float32).tolist()},
        features=datasets.Features(
            {"image": datasets.Image(), "label": datasets.List(datasets.Value("float32"))}
        ),
    )
    datasets.DatasetDict({"train": split, "test": split.select(range(8))}).save_to_disk(tmp_path / "hub")
    fields = {"dataset_name": str(tmp_path / "hub"), "test_split": "test", "validation_split": None,
              "validation_split_percentage": 0, "class_names": DATA_NAMES, "problem_type": None}  # fmt: skip
    id2label = dict(enumerate(MODEL_NAMES))
    data = data_from_fields(fields, id2label, None, 0, "the record", multi_label=True)
    assert "'test'" in data.description and len(data) == 8
    np.testing.assert_array_equal(data.labels, data_labels(folder, MODEL_NAMES)[:8])
    with pytest.raises(ValueError, match="is multi-label .* but the model is a single-label classifier"):
        data_from_fields(fields, dict(enumerate(DATA_NAMES)), None, 0, "the record", multi_label=False)
