"""Exports of a NaFlex model (SigLIP 2). ONNX (`tools.export.onnx.export_model`): the graph takes the three
NaFlex inputs with a dynamic batch and patch count, and onnxruntime gives PyTorch's logits (fp32, <= 1e-4) on batches
of several aspect ratios made by transformers' `Siglip2ImageProcessor` (the one the export folder carries) and by our
transform (`OnnxClassifier.from_folder`); the per-image position resize (antialiased bilinear) is in the graph. The
push: Siglip2ForImageClassification with its NaFlex processor (`pipeline()` gives `predict`'s scores), or vit_ft's code
where that class cannot hold the head. A NaFlex graph given plain pixels, and `--report` on a NaFlex model, are one
line."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, Siglip2Config, Siglip2ForImageClassification
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.tools.trained import load_trained

from ..conftest import randomize
from ..model.test_naflex import LABELS, TEXT, VISION, references

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(n) is None for n in ("onnx", "onnxscript", "onnxruntime")),
    reason="needs onnx, onnxscript and onnxruntime",
)
# (height, width): wide, tall, square, strips (their grids resize the 4x4 table down one way, up the other), odd
IMAGE_SIZES = [(20, 60), (48, 16), (32, 32), (8, 64), (60, 12), (13, 29)]


def images(sizes=IMAGE_SIZES) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny SigLIP 2 classifier (mean pooling) saved by transformers with a NaFlex processor (bilinear)."""
    folder = tmp_path_factory.mktemp("siglip2")
    config = Siglip2Config(vision_config=VISION, text_config=TEXT, **LABELS)
    randomize(Siglip2ForImageClassification(config), seed=3).save_pretrained(folder)
    Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory):
    from vit_ft.tools.export.onnx import export_onnx

    out = tmp_path_factory.mktemp("onnx") / "siglip2-onnx"
    return out, export_onnx(str(source), out, quantize="int8")


@pytest.mark.slow
def test_naflex_graph_gives_pytorchs_logits_on_several_aspect_ratios(source, exported):
    from vit_ft.tools.export.onnx_runtime import INT8_FILE, ONNX_FILE, OnnxClassifier

    out, result = exported
    assert {ONNX_FILE, INT8_FILE, "config.json", "preprocessor_config.json"} <= {p.name for p in out.iterdir()}
    assert result.max_num_patches == 16 and result.fp32_difference <= 1e-4
    assert "NaFlex inputs (pixel_values, pixel_attention_mask, spatial_shapes)" in result.summary()
    processor_config = json.loads((out / "preprocessor_config.json").read_text())
    assert processor_config["image_processor_type"] == "Siglip2ImageProcessor"
    assert (processor_config["max_num_patches"], processor_config["patch_size"], processor_config["resample"]) == (
        16, 4, int(Image.Resampling.BILINEAR))  # fmt: skip

    trained = load_trained(str(source), device="cpu")
    graph = OnnxClassifier.from_folder(out)
    assert graph.naflex and graph.transform.max_num_patches == 16
    # our transform's batch and the exported processor's: the same patches (both 16 long: the square's count)
    ours = graph.transform.collate([graph.transform.transform_image(image) for image in images()])
    theirs = dict(AutoImageProcessor.from_pretrained(out)(images=images(), return_tensors="pt"))
    assert len({tuple(s) for s in ours["spatial_shapes"].tolist()}) == len(IMAGE_SIZES)
    torch.testing.assert_close(theirs["pixel_values"], ours["pixel_values"], atol=1e-5, rtol=0)
    expected = trained.logits(ours)  # PyTorch (no calibration recorded: nothing folded)
    assert (graph.logits(ours) - expected).abs().max().item() <= 1e-4
    assert (graph.logits(theirs) - expected).abs().max().item() <= 1e-4
    # another batch size and patch count: the wide image and the strip, padded to their longer (12 patches)
    pair = graph.transform.collate([graph.transform.transform_image(images()[i]) for i in (0, 3)])
    assert pair["pixel_values"].shape[:2] == (2, 12)
    assert (graph.logits(pair) - expected[[0, 3]]).abs().max().item() <= 1e-4
    int8 = OnnxClassifier.from_folder(out, INT8_FILE)
    assert (int8.logits(theirs).argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.5


@pytest.mark.slow
def test_naflex_graph_with_the_attention_pooling_head(tmp_path):
    """SigLIP 2's map head (attention pooling over the valid patches only) in the graph."""
    from vit_ft.tools.export.onnx import export_model
    from vit_ft.tools.export.onnx_runtime import OnnxClassifier

    randomize(references()["vision"], seed=4).save_pretrained(tmp_path / "vision")
    model = randomize(ViTFTForImageClassification.from_pretrained(tmp_path / "vision", **LABELS), seed=5)
    assert model.config.max_num_patches is not None
    trace, difference = export_model(model, tmp_path / "model.onnx")
    sizes = trace.sizes
    assert trace.dynamic_size and difference <= 1e-4 and len(set(sizes)) == len(sizes) >= 4  # several aspect ratios
    batch = dict(Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16)(images=images(), return_tensors="pt"))
    with torch.no_grad():
        expected = model(**batch).logits
    assert (OnnxClassifier(tmp_path / "model.onnx").logits(batch) - expected).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_a_naflex_graph_given_pixels_is_one_line(exported):
    from vit_ft.tools.export.onnx_runtime import OnnxClassifier

    graph = OnnxClassifier.from_folder(exported[0])
    with pytest.raises(ValueError, match=r"takes NaFlex batches .* it was given pixel_values") as error:
        graph.logits(torch.randn(2, 3, 16, 16))
    assert "\n" not in str(error.value)


def test_report_on_a_naflex_model_is_one_line_before_the_export(source, tmp_path):
    from vit_ft.commands.export import export

    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"NaFlex model .*max_num_patches 16.*--evaluate SPLIT") as error:
        export(["--model", str(source), "--output_dir", str(out), "--report", "test"])
    assert "\n" not in str(error.value) and not out.exists()


def test_push_of_a_naflex_fine_tune_is_siglip2_and_pipeline_gives_predicts_scores(source, tmp_path):
    """The default (transformers-format) push of a SigLIP 2 NaFlex classifier: Siglip2ForImageClassification with
    the NaFlex processor at the model's budget and the folder's filter; `pipeline()` on non-square images gives
    `predict`'s top labels and scores."""
    from transformers import pipeline

    from vit_ft.tools.export.hub import stage_for_hub
    from vit_ft.tools.predict.run import predict_files

    staged = stage_for_hub(source, tmp_path / "push" / "siglip2", "me/siglip2")
    assert json.loads((staged / "config.json").read_text())["architectures"] == ["Siglip2ForImageClassification"]
    assert not list(staged.glob("*.py"))  # no remote code
    processor = json.loads((staged / "preprocessor_config.json").read_text())
    assert (processor["image_processor_type"], processor["max_num_patches"], processor["resample"]) == (
        "Siglip2ImageProcessor", 16, int(Image.Resampling.BILINEAR))  # fmt: skip
    files = []
    for index, image in enumerate(images()):
        files.append(str(tmp_path / f"{index}.png"))
        image.save(files[-1])
    ours = predict_files(load_trained(str(source), device="cpu"), files, top_k_labels=3, progress=False)
    classify = pipeline("image-classification", model=str(staged), device="cpu")
    for file, prediction in zip(files, ours, strict=True):
        answer = classify(file, top_k=3)
        assert [a["label"] for a in answer] == list(prediction.labels)
        assert np.allclose([a["score"] for a in answer], prediction.scores, atol=1e-5)


def test_push_of_a_naflex_map_head_keeps_vit_ft_code_and_says_why(tmp_path):
    """SigLIP 2's attention-pooling head has no place in Siglip2ForImageClassification: the push keeps vit_ft's code,
    the card says why, and the processor is still the NaFlex one."""
    from vit_ft.tools.export.hub import stage_for_hub

    randomize(references()["vision"], seed=4).save_pretrained(tmp_path / "vision")
    model = randomize(ViTFTForImageClassification.from_pretrained(tmp_path / "vision", **LABELS), seed=5)
    model.save_pretrained(tmp_path / "run")
    Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16).save_pretrained(tmp_path / "run")
    staged = stage_for_hub(tmp_path / "run", tmp_path / "push" / "map", "me/map")
    assert list(staged.glob("*.py"))  # remote code
    assert "Siglip2ForImageClassification cannot express pooling='map'" in (staged / "README.md").read_text()
    assert json.loads((staged / "preprocessor_config.json").read_text())["max_num_patches"] == 16


@pytest.mark.slow
def test_export_evaluate_feeds_the_graph_naflex_batches_of_the_recorded_split(tmp_path):
    """A tiny NaFlex fine-tune on 3:1 images (`benchmarks/naflex.py`'s set), exported with `--evaluate test`: the
    graph runs on the test split's NaFlex batches (the model's own transform) and agrees with PyTorch on every one."""
    from benchmarks.naflex import prepare, recipe
    from vit_ft.commands.export import export

    from ..cli_runner import run_script

    prepare(tmp_path, per_class=4, seed=0)
    values = recipe(tmp_path, "naflex", seed=0, epochs=1, per_class=4)
    (tmp_path / "naflex.yaml").write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in values.items()))
    result = run_script("scripts/finetune.py", ["--recipe", str(tmp_path / "naflex.yaml")], None, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = export(["--model", str(tmp_path / "naflex"), "--output_dir", str(tmp_path / "onnx"),
                      "--evaluate", "test"])  # fmt: skip
    assert "NaFlex inputs" in summary and "ONNX fp32 100.0%" in summary
