"""Test-time augmentation (`vit_ft.tools.tta`, `--tta flip | crops` in evaluate and predict): the views, the
averaged probabilities, the refusals, and the report's comparison with the evaluation view alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.commands.evaluate import evaluate
from vit_ft.commands.predict import predict
from vit_ft.data.images import load_image
from vit_ft.tools.predict.output import read_predictions
from vit_ft.tools.trained import load_trained
from vit_ft.tools.tta import TTARunner, check_tta, tta_views, with_tta

from ..cli_runner import run_script
from ..conftest import REPO


@pytest.fixture(scope="module")
def trained(tiny_finetuned_dir):
    return load_trained(tiny_finetuned_dir, device="cpu")


@pytest.fixture(scope="module")
def photo(tiny_finetuned_dir, tmp_path_factory) -> Path:
    """A non-square (50x30) RGB copy of the fine-tune's first test image."""
    test_dir = json.loads((tiny_finetuned_dir / "vit_ft_run.json").read_text())["data"]["test_dir"]
    first = sorted(Path(test_dir).glob("*/*.png"))[0]
    path = tmp_path_factory.mktemp("tta") / "photo.png"
    Image.open(first).convert("RGB").resize((50, 30), Image.Resampling.BILINEAR).save(path)
    return path


@pytest.mark.parametrize("mode, views", [("flip", 2), ("crops", 6)])
def test_views_have_the_models_size_and_start_with_the_evaluation_view(trained, photo, mode, views):
    runner = TTARunner(trained, mode)  # flip built directly: the tiny run's record refuses it (below)
    pixels = runner.transform.transform_image(str(photo))
    assert pixels.shape == (views, 3, 32, 32)
    assert torch.equal(pixels[0], trained.transform.transform_image(str(photo)))  # the view evaluated without TTA
    if mode == "flip":
        assert torch.equal(pixels[1], pixels[0].flip(-1))
    else:  # five crops of a resize covering floor(32 / 0.875) = 36 px: all different, none the evaluation view
        crops = tta_views(load_image(str(photo)), trained.transform, mode)[1:]
        assert len({c.tobytes() for c in crops}) == 5 and all(c.size == (32, 32) for c in crops)


@pytest.mark.parametrize("mode", ["flip", "crops"])
def test_probabilities_are_the_mean_over_the_views(trained, photo, mode):
    runner = TTARunner(trained, mode)
    pixels = torch.stack([runner.transform.transform_image(str(photo))] * 3)  # (batch, views, C, H, W)
    got = torch.from_numpy(runner.task.probabilities(runner.logits(pixels)))
    expected = torch.stack([trained.probabilities(p) for p in pixels]).mean(dim=1)  # calibrated, then averaged
    assert got.shape == (3, trained.num_labels)
    assert (got - expected).abs().max().item() <= 1e-6
    assert torch.equal(torch.from_numpy(runner.single_view_logits()), trained.logits(pixels[:, 0]))


@pytest.mark.parametrize(
    "mode, record, message",
    [
        ("rotate", None, "--tta rotate is not one of flip, crops"),
        ("Flip", None, "is not one of flip, crops"),
        ("flip", {"data": {"horizontal_flip": False}}, "trained without flips"),
    ],
)
def test_bad_tta_is_one_line_naming_the_fix(mode, record, message):
    with pytest.raises(ValueError, match=message) as error:
        check_tta(mode, record)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "mode, record", [(None, None), ("crops", {"data": {"horizontal_flip": False}}), ("flip", None),
                     ("flip", {"data": {"horizontal_flip": True}})],  # fmt: skip
)
def test_good_tta_settings_pass(mode, record):
    check_tta(mode, record)  # a Hub model without a run record may flip: nothing says it must not


def test_no_tta_is_the_model_itself(trained):
    assert with_tta(trained, None) is trained


def test_flip_on_digits_is_refused_by_the_command(tiny_finetuned_dir, tmp_path):
    result = run_script("scripts/predict.py", ["--model", str(tiny_finetuned_dir), str(REPO / "README.md"),
                        "--output", str(tmp_path / "p.csv"), "--tta", "flip"], None, cwd=tmp_path)  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1 and "trained without flips" in lines[0], result.stderr[-2000:]
    assert not (tmp_path / "p.csv").exists()


def test_evaluate_with_crops_reports_the_single_view_metric(tiny_finetuned_dir, tmp_path):
    plain = evaluate(["--model", str(tiny_finetuned_dir), "--output_dir", str(tmp_path / "plain"),
                      "--bf16", "false"])  # fmt: skip
    metrics = evaluate(["--model", str(tiny_finetuned_dir), "--output_dir", str(tmp_path / "tta"),
                        "--bf16", "false", "--tta", "crops"])  # fmt: skip
    tta = metrics["tta"]
    assert tta["mode"] == "crops" and tta["metric"] == "accuracy"
    assert tta["single_view"] == pytest.approx(plain["accuracy"], abs=1e-9)  # the same view, the same images
    assert tta["with_tta"] == pytest.approx(metrics["accuracy"], abs=1e-9)
    report = (tmp_path / "tta" / "report.md").read_text()
    assert "Test-time augmentation: --tta crops (6 views" in report and "on the evaluation view alone" in report


def test_predict_with_crops_writes_the_averaged_scores(trained, tiny_finetuned_dir, photo, tmp_path):
    predict(["--model", str(tiny_finetuned_dir), str(photo), "--output", str(tmp_path / "p.csv"),
             "--tta", "crops", "--figure", "none", "--bf16", "false"])  # fmt: skip
    (row,) = read_predictions(tmp_path / "p.csv")
    runner = TTARunner(trained, "crops")
    probabilities = runner.task.probabilities(runner.logits(runner.transform.transform_image(str(photo))[None]))[0]
    top = np.argsort(-probabilities)[:5]
    assert row["top_k_labels"] == [trained.id2label[int(i)] for i in top]
    assert np.allclose(row["top_k_scores"], probabilities[top], atol=1e-6)
    # the folder keeps a feature bank, whose score is of the evaluation view: left empty with --tta, not wrong
    assert (tiny_finetuned_dir / "feature_bank.safetensors").is_file()
    assert row["unlike_training"] in ("", None) and row["ood_score"] in ("", None)
