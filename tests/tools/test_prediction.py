"""scripts/predict.py and vit_ft.tools.predict.run: one row per file, errors in their own rows, same answer as the model."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft import ViTFTForImageClassification
from vit_ft.data.images import collect_image_files
from vit_ft.data.transforms import build_transforms
from vit_ft.tools.predict.run import (
    PREDICTION_COLUMNS,
    PredictionWriter,
    predict_files,
    read_predictions,
    run_prediction,
)
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import randomize, tiny_ft_config

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

LABELS = ["ant", "bee", "wasp"]
MEAN, STD = [0.4, 0.45, 0.5], [0.2, 0.25, 0.3]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """A random 3-label vit_ft classifier (distinct outputs per image) with its own normalisation."""
    path = tmp_path_factory.mktemp("classifier")
    config = tiny_ft_config(id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    randomize(ViTFTForImageClassification(config), seed=3).save_pretrained(path)
    processor = {"image_mean": MEAN, "image_std": STD, "rescale_factor": 1 / 255, "resample": 3,
                 "size": {"height": 16, "width": 16}}  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder tree of good images (nested, various sizes and modes) and unreadable ones."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    (root / "a" / "b").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for i, (size, mode) in enumerate(
        [((20, 16), "RGB"), ((40, 30), "L"), ((16, 16), "RGBA"), ((64, 48), "RGB")]
    ):
        image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
        image.save(root / ("a/b" if i % 2 else "a") / f"good{i}.png")
    Image.new("RGB", (8, 8)).save(root / ".hidden" / "skip.png")
    (root / "notes.txt").write_text("not an image and not an image suffix: not collected")
    (root / "fake.jpg").write_text("not an image")
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    (root / "truncated.png").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    Image.new("RGB", (200, 200)).save(root / "huge.png")  # over the max_pixels the tests pass
    return root


BAD = {"fake.jpg", "truncated.png", "huge.png", "missing.png"}


def test_folders_are_searched_recursively_for_images_only(photos):
    files = collect_image_files([photos, photos / "notes.txt"])
    names = [f.name for f in files]
    assert sorted(names[:-1]) == sorted(["good0.png", "good1.png", "good2.png", "good3.png", "fake.jpg",
                                         "truncated.png", "huge.png"])  # fmt: skip
    assert names[-1] == "notes.txt"  # a file given by name is kept, whatever its suffix
    assert files[:-1] == sorted(files[:-1])


def test_cli_writes_one_row_per_file_with_errors_in_their_own_rows(classifier_dir, photos, tmp_path, capfd):
    output = tmp_path / "preds.csv"
    args = ["--model", classifier_dir, photos, photos / "missing.png", "--output", output, "--top_k", "2",
            "--batch_size", "3", "--max_pixels", "10000"]  # fmt: skip
    result = run_script("scripts/predict.py", args, capfd, cwd=tmp_path)  # in this process
    assert result.returncode == 0, result.stderr[-4000:]
    assert output.read_text().splitlines()[0] == ",".join(PREDICTION_COLUMNS)
    rows = read_predictions(output)
    assert len(rows) == 8  # 4 good, 3 unreadable, 1 missing
    for row in rows:
        name = row["path"].rsplit("/", 1)[-1]
        if name in BAD:
            assert row["error"] and row["label"] is None and row["top_k_labels"] == []
        else:
            assert row["error"] is None and row["label"] == row["top_k_labels"][0]
            assert len(row["top_k_labels"]) == 2 and set(row["top_k_labels"]) <= set(LABELS)
            assert row["top_k_scores"] == sorted(row["top_k_scores"], reverse=True)
            assert 0 < sum(row["top_k_scores"]) <= 1 + 1e-6 and row["score"] == row["top_k_scores"][0]
    errors = {row["path"].rsplit("/", 1)[-1]: row["error"] for row in rows if row["error"]}
    assert set(errors) == BAD
    assert "max_pixels" in errors["huge.png"] and "truncated" in errors["truncated.png"]
    assert "does not exist" in errors["missing.png"]
    with Image.open(tmp_path / "preds.png") as figure:
        assert figure.format == "PNG"


def test_top1_matches_running_the_model_directly(classifier_dir, photos, tmp_path):
    files = sorted(photos.glob("a/**/good*.png"))
    summary = run_prediction(
        classifier_dir, files, tmp_path / "p.jsonl", top_k_labels=3, batch_size=3, figure=None
    )
    assert summary == {"rows": 4, "errors": 0, "output": str(tmp_path / "p.jsonl"), "figure": None,
                       "unlike_training": None}  # no feature bank in a folder saved by hand
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]

    model = ViTFTForImageClassification.from_pretrained(classifier_dir)
    transform = build_transforms(16, MEAN, STD, train=False)
    pixels = transform({"image": [str(f) for f in files]})["pixel_values"]
    with torch.no_grad():
        probabilities = model(pixel_values=torch.stack(pixels)).logits.softmax(-1)
    for row, file, p in zip(rows, files, probabilities, strict=True):
        assert row["path"] == str(file) and row["error"] is None
        assert row["label"] == LABELS[int(p.argmax())]
        np.testing.assert_allclose(row["top_k_scores"], p.sort(descending=True).values.numpy(), rtol=1e-5)
        assert sum(row["top_k_scores"]) == pytest.approx(1.0, abs=1e-5)  # top 3 of 3 classes


def test_batch_size_and_resolution(classifier_dir, photos):
    files = sorted(photos.glob("a/**/good*.png"))
    classifier = load_trained(classifier_dir)
    one = list(predict_files(classifier, files, batch_size=1))
    four = list(predict_files(classifier, files, batch_size=4))
    threaded = list(predict_files(classifier, files, batch_size=3, num_workers=2))
    for a, b, c in zip(one, four, threaded, strict=True):
        assert a.path == b.path == c.path and a.labels == b.labels == c.labels
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4)
        np.testing.assert_allclose(c.scores, b.scores, rtol=1e-4)
    larger = load_trained(classifier_dir, image_size=24)
    assert larger.preprocessing.image_size == (24, 24) and larger.preprocessing.mean == tuple(MEAN)
    assert all(p.error is None for p in predict_files(larger, files))
    with pytest.raises(ValueError, match="patch size 4x4"):
        load_trained(classifier_dir, image_size=18)


def test_lora_adapter_folder_predicts_like_the_merged_model(classifier_dir, photos, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = ViTFTForImageClassification.from_pretrained(classifier_dir)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["qkv"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    peft_model.base_model.model.config.save_pretrained(tmp_path / "adapter")
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    for folder in ("adapter", "merged"):
        (tmp_path / folder / "preprocessor_config.json").write_text(
            (classifier_dir / "preprocessor_config.json").read_text()
        )
    files = sorted(photos.glob("a/**/good*.png"))
    from_adapter = list(predict_files(load_trained(tmp_path / "adapter"), files))
    from_merged = list(predict_files(load_trained(tmp_path / "merged"), files))
    for a, b in zip(from_adapter, from_merged, strict=True):
        assert a.labels == b.labels
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-6)


def test_output_suffix_picks_the_format(tmp_path):
    with pytest.raises(ValueError, match=r"\.csv or \.jsonl"):
        PredictionWriter(tmp_path / "preds.txt")
