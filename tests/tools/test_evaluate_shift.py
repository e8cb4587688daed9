"""`vit-ft evaluate --shift`: on the tiny fine-tune's digits, the report's clean accuracy is the evaluation's own,
the contrast rows equal the model's accuracy on images corrupted here by imagecorruptions' numpy formula, a
shifted folder's row equals evaluating that folder, and the refusals are one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vit_ft.data.corruptions import SEVERITIES, severity_value
from vit_ft.tools.evaluate.data import resolve_eval_data
from vit_ft.tools.evaluate.run import run_evaluation
from vit_ft.tools.trained import load_trained

SAMPLES = 24


@pytest.fixture(scope="module")
def shifted(tiny_finetuned_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shift") / "report"
    metrics = run_evaluation(str(tiny_finetuned_dir), out, max_samples=SAMPLES, shift="corruptions", seed=0)
    return out, metrics


def test_corruption_rows_equal_a_numpy_reference(tiny_finetuned_dir, shifted):
    out, metrics = shifted
    shift = metrics["shift"]
    assert shift["clean"] == pytest.approx(metrics["accuracy"])
    assert {"shift.csv", "shift.md", "shift.png"} <= {p.name for p in out.iterdir()}
    assert "## Robustness under shift" in (out / "report.md").read_text()
    assert json.loads((out / "metrics.json").read_text())["shift"]["rows"] == shift["rows"]
    trained = load_trained(str(tiny_finetuned_dir))
    data = resolve_eval_data(trained.origin, trained.id2label, max_samples=SAMPLES, seed=0)
    pixels = torch.stack([trained.transform.transform_image(v) for v in data.dataset["image"]])
    mean = np.asarray(trained.preprocessing.mean).reshape(1, 3, 1, 1)
    std = np.asarray(trained.preprocessing.std).reshape(1, 3, 1, 1)
    raw = pixels.numpy() * std + mean
    row = next(r for r in shift["rows"] if r["shift"] == "contrast")
    for severity in SEVERITIES:
        c = severity_value("contrast", severity)
        means = raw.mean(axis=(2, 3), keepdims=True)  # imagecorruptions: per channel of each image
        corrupted = (np.clip((raw - means) * c + means, 0, 1) - mean) / std
        logits = trained.logits(torch.as_tensor(corrupted, dtype=torch.float32))
        expected = float((logits.argmax(-1).numpy() == data.labels).mean())
        assert row[f"severity {severity}"] == pytest.approx(expected)
    assert row["relative error"] == pytest.approx((1 - row["accuracy"]) - (1 - shift["clean"]))


@pytest.mark.long  # two evaluations with their reports: about 5 s
def test_a_shifted_folder_is_evaluated_as_a_folder(tiny_finetuned_dir, tmp_path):
    folder = tmp_path / "shifted"  # a few of the tiny fine-tune's test images, as a user's "shifted" set
    for source in sorted((tiny_finetuned_dir.parent / "digits" / "test").iterdir())[:4]:
        (folder / source.name).mkdir(parents=True)
        for image in sorted(source.iterdir())[:3]:
            shutil.copy(image, folder / source.name / image.name)
    metrics = run_evaluation(str(tiny_finetuned_dir), tmp_path / "r", max_samples=8, shift=str(folder))
    trained = load_trained(str(tiny_finetuned_dir))
    data = resolve_eval_data(trained.origin, trained.id2label, data_dir=str(folder))
    pixels = torch.stack([trained.transform.transform_image(v) for v in data.dataset["image"]])
    expected = float((trained.logits(pixels).argmax(-1).numpy() == data.labels).mean())
    assert metrics["shift"]["rows"][0]["accuracy"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="neither 'corruptions' nor a folder"):
        run_evaluation(str(tiny_finetuned_dir), tmp_path / "x", shift=str(tmp_path / "missing"))
