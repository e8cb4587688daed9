"""`vit-ft inspect --explain METHOD --target CLASS` (scripts/inspect_model.py) on a transformers classifier: the
figure and the maps it writes (against the library's own `explain`), and each mistake as one `error:` line."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.tools.explain.methods import explain
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / name)
    return folder


def test_explain_writes_the_maps_of_the_named_class(hf_classifier_dir, photos, tmp_path, capfd):
    args = ["--model", hf_classifier_dir, "--output_dir", str(tmp_path / "why"), "--images", str(photos),
            "--explain", "gradcam", "--target", "bee"]  # fmt: skip
    result = run_script("scripts/inspect_model.py", args, capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "why").iterdir() if not p.name.startswith(".")) == [
        "explanation.json",
        "explanation.png",
    ]
    summary = json.loads((tmp_path / "why" / "explanation.json").read_text())
    assert summary["method"] == "gradcam" and summary["target"] == "bee" and summary["class_specific"]
    trained = load_trained(hf_classifier_dir, device="cpu")
    for record in summary["images"]:
        assert record["target"] == "bee" and record["target_index"] == 1
        pixels = trained.transform.transform_image(record["image"])[None]
        expected = explain(trained.model, pixels, "gradcam", target=1).reshape(4, 4)
        torch.testing.assert_close(torch.tensor(record["map"]), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--explain", "saliency"], "--explain 'saliency' is not a method: choose one of grad_rollout"),
        (["--explain", "gradcam", "--target", "moth"], "--target 'moth' is not a class of this model"),
        (["--explain", "gradcam", "--target", "7"], "an index 0..2"),
        (["--target", "bee"], "pass --explain METHOD with it"),
    ],
    ids=["method", "class-name", "class-index", "target-alone"],
)
def test_a_bad_method_or_class_is_one_error_line(hf_classifier_dir, photos, tmp_path, capfd, extra, words):
    args = ["--model", hf_classifier_dir, "--output_dir", str(tmp_path / "why"), "--images", str(photos), *extra]
    result = run_script("scripts/inspect_model.py", args, capfd, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith("error: ") and words in lines[-1], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "why" / "explanation.png").exists()


def test_predict_writes_the_maps_of_the_predicted_class_beside_the_csv(hf_classifier_dir, photos, tmp_path, capfd):
    args = ["--model", hf_classifier_dir, str(photos), "--output", str(tmp_path / "preds.csv"), "--explain",
            "grad_rollout", "--figure", "none"]  # fmt: skip
    for _ in range(2):  # the second run replaces predict's own maps file
        result = run_script("scripts/predict.py", args, capfd, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "preds.maps.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    trained = load_trained(hf_classifier_dir, device="cpu")
    for row in rows:
        pixels = trained.transform.transform_image(row["image"])[None]
        predicted = int(trained.probabilities(pixels)[0].argmax())
        assert row["method"] == "grad_rollout" and row["target"] == trained.id2label[predicted]
        expected = explain(trained.model, pixels, "grad_rollout", target=predicted).reshape(4, 4)
        torch.testing.assert_close(torch.tensor(row["map"]), expected, atol=1e-5, rtol=1e-4)
    result = run_script("scripts/predict.py", [*args, "--tta", "flip"], capfd, cwd=tmp_path)
    assert result.returncode == 1 and "drop --tta flip" in result.stderr.strip().splitlines()[-1]


def test_an_onnx_export_is_one_error_line(photos, tmp_path, capfd):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "model.onnx").write_bytes(b"onnx")
    args = ["--model", str(export), "--output_dir", str(tmp_path / "why"), "--images", str(photos), "--explain", "gradcam"]
    result = run_script("scripts/inspect_model.py", args, capfd, cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("error: --explain needs the PyTorch")
