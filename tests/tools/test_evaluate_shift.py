"""`vit-ft evaluate --shift`: on the tiny fine-tune's digits, the report's clean accuracy is the evaluation's own,
the contrast rows equal the model's accuracy on images corrupted here by imagecorruptions' numpy formula, a
shifted folder's row equals evaluating that folder, and the refusals are one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

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
    with pytest.raises(FileNotFoundError, match="--shift .*missing: no such folder"):
        run_evaluation(str(tiny_finetuned_dir), tmp_path / "x", shift=str(tmp_path / "missing"))


# --- --shift HUB_ID[@REVISION]: a Hub dataset through the local Hub stand-in; its refusals before the model loads ---


@pytest.mark.parametrize(
    ("name", "expected"),
    [("me/shifted@v1", ("me/shifted", "v1")), ("shifted@0123abc", ("shifted", "0123abc")),
     ("me/shifted", ("me/shifted", None)), ("me/shifted@", ("me/shifted@", None)), ("./a@b", ("./a@b", None))],
)  # fmt: skip
@pytest.mark.smoke
def test_split_revision(name, expected):
    from vit_ft.utils.hub_ids import split_revision

    assert split_revision(name) == expected


@pytest.mark.smoke
def test_a_bad_shift_is_one_line_before_the_model_loads(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from vit_ft.tools.evaluate.shift import shift_inputs
    from vit_ft.utils.cli import error_line

    (tmp_path / "shifted").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    assert shift_inputs(str(tmp_path / "shifted")) == [str(tmp_path / "shifted")]
    assert shift_inputs("corruptions") == [] and shift_inputs(None) == []
    with pytest.raises(ValueError, match="did you mean --shift corruptions"):
        shift_inputs("corruption")
    with pytest.raises(ValueError, match="is a file"):
        shift_inputs(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match="did you mean .*shifted"):
        shift_inputs(str(tmp_path / "shiftd"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network asked; nothing of it in this test's cache
    with pytest.raises(FileNotFoundError) as error:
        shift_inputs("me/shifted-digits@v1")
    line = error_line(error.value)
    assert "\n" not in line and "--shift me/shifted-digits@v1" in line and "offline mode" in line


def _shifted_dataset_files(folder) -> dict[str, bytes]:
    """A Hub dataset of `folder`'s class folders: one test parquet file, image and ClassLabel columns."""
    from ..fake_hub import dataset_card, parquet_bytes

    names = sorted(p.name for p in folder.iterdir())
    rows = [{"img": {"bytes": image.read_bytes(), "path": image.name}, "digit": names.index(image.parent.name)}
            for image in sorted(folder.glob("*/*"))]  # fmt: skip
    features = [{"name": "img", "dtype": "image"},
                {"name": "digit", "dtype": {"class_label": {"names": dict(enumerate(names))}}}]  # fmt: skip
    return {"data/test-00000-of-00001.parquet": parquet_bytes(rows),
            "README.md": dataset_card(features, {"test": len(rows)}, {"test": "data/test-*"})}  # fmt: skip


@pytest.mark.long  # three evaluate processes against the local Hub: about 20 s on an idle host
def test_a_hub_dataset_shift_equals_the_same_images_as_a_folder(tiny_finetuned_dir, tmp_path):
    from ..fake_hub import FakeHub

    folder = tmp_path / "shifted"  # a few test images, renamed columns, under a pinned revision
    for source in sorted((tiny_finetuned_dir.parent / "digits" / "test").iterdir())[:4]:
        (folder / source.name).mkdir(parents=True)
        for image in sorted(source.iterdir())[:3]:
            shutil.copy(image, folder / source.name / image.name)
    trained = load_trained(str(tiny_finetuned_dir))
    data = resolve_eval_data(trained.origin, trained.id2label, data_dir=str(folder))
    pixels = torch.stack([trained.transform.transform_image(v) for v in data.dataset["image"]])
    expected = float((trained.logits(pixels).argmax(-1).numpy() == data.labels).mean())
    with FakeHub() as hub:
        commit = hub.add_repo("me/shifted-digits", _shifted_dataset_files(folder), repo_type="dataset")
        env = hub.env(tmp_path)

        def evaluate(shift: str, out: str):
            command = [sys.executable, "-m", "vit_ft", "evaluate", "--model", str(tiny_finetuned_dir), "--output_dir",
                       str(tmp_path / out), "--max_samples", "8", "--shift", shift]  # fmt: skip
            return subprocess.run(command, cwd=tiny_finetuned_dir.parent, env=env, capture_output=True, text=True, timeout=600)

        done = evaluate(f"me/shifted-digits@{commit}", "r")
        assert done.returncode == 0, done.stderr[-3000:]
        metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
        assert metrics["shift"]["kind"] == "hub dataset"
        assert metrics["shift"]["rows"][0]["accuracy"] == pytest.approx(expected)
        assert f"revision {commit}" in metrics["shift"]["how"] and "12 images" in metrics["shift"]["how"]
        for shift, says in (("me/shifted-digits@nope", "has no revision 'nope'"), ("me/missing", "no dataset of that name")):
            failed = evaluate(shift, "x")
            lines = failed.stderr.strip().splitlines()
            assert failed.returncode == 1 and lines[-1].startswith("error:") and says in lines[-1], failed.stderr[-2000:]
            assert "Traceback" not in failed.stderr
    assert not hub.unexpected


def test_the_pushed_card_shows_the_shift_evaluation(tiny_finetuned_dir, shifted, tmp_path):
    from vit_ft.commands.push import push

    out, metrics = shifted
    staged = push([str(tiny_finetuned_dir), "--hub_model_id", "me/tiny", "--local_dir", str(tmp_path / "s"),
                   "--evaluation", str(out)])  # fmt: skip
    card = (tmp_path / "s" / "README.md").read_text()
    section = card[card.index("## Robustness under shift"):card.index("## Use")]
    shift = metrics["shift"]
    assert f"Clean accuracy {100 * shift['clean']:.2f} %" in section and shift["how"] in section
    assert f"{100 * shift['relative_error']:.2f} points" in section and "seed 0" in section
    assert all(f"| {row['shift']} | {row['family']} |" in section for row in shift["rows"])
    assert staged == str(tmp_path / "s")
