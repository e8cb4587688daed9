"""The calibration temperature folded into the shared head (`tasks.temperature.fold_temperature`): the
transformers-format push and the ONNX export give the calibrated probabilities as they come out of the model
(`pipeline()`, onnxruntime), every vit-ft tool reads a folded model at temperature 1 (never dividing twice), a
multi-label model is never folded, and the pushed processor resizes and centre-crops as our evaluation does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

from vit_ft import ViTFTForImageClassification
from vit_ft.metrics.calibration import FOLDED_TEMPERATURE_ATTRIBUTE
from vit_ft.tasks import task_for
from vit_ft.tasks.temperature import fold_temperature
from vit_ft.tools.evaluate.data import resolve_eval_data
from vit_ft.tools.evaluate.outputs import predict_dataset
from vit_ft.tools.export.hub import stage_for_hub
from vit_ft.tools.predict.run import predict_files
from vit_ft.tools.trained import load_trained

from ..conftest import randomize, tiny_ft_config
from .test_hub import write_lora_run

needs_onnx = pytest.mark.skipif(
    any(importlib.util.find_spec(n) is None for n in ("onnx", "onnxscript", "onnxruntime")),
    reason="needs onnx, onnxscript and onnxruntime",
)


def digit_photo(folder: Path, size: tuple[int, int] = (50, 30)) -> tuple[Path, Image.Image]:
    """The fine-tune's first test image, and a non-square RGB copy of it (width, height): processors must crop."""
    test_dir = json.loads((folder / "vit_ft_run.json").read_text())["data"]["test_dir"]
    first = sorted(Path(test_dir).glob("*/*.png"))[0]
    return first, Image.open(first).convert("RGB").resize(size, Image.Resampling.BILINEAR)


@pytest.fixture(scope="module")
def staged(tiny_finetuned_dir, tmp_path_factory):
    """The tiny digits fine-tune staged for the Hub in the default (transformers) format."""
    return stage_for_hub(tiny_finetuned_dir, tmp_path_factory.mktemp("push") / "digits", "me/digits")


@pytest.mark.parametrize("distillation_token", [False, True])
def test_folding_divides_the_logits_by_the_temperature(distillation_token):
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=5, distillation_token=distillation_token)))
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    task = task_for(None, {"calibration": {"temperature": 1.7}})
    folded = fold_temperature(model, task)
    with torch.inference_mode():
        expected, got = model(pixel_values=pixels).logits / 1.7, folded(pixel_values=pixels).logits
    assert (got - expected).abs().max().item() <= 1e-6
    assert getattr(folded.config, FOLDED_TEMPERATURE_ATTRIBUTE) == 1.7
    assert getattr(model.config, FOLDED_TEMPERATURE_ATTRIBUTE, None) is None  # the source is left as it was
    assert task_for(folded.config, {"calibration": {"temperature": 1.7}}).temperature == 1.0  # never twice


@pytest.mark.parametrize(
    "problem_type, record",
    [
        ("multi_label_classification", {"calibration": {"temperature": 1.7}}),  # sigmoid: never folded
        ("single_label_classification", {"calibration": {"temperature": 1.0}}),  # nothing to fold
        ("single_label_classification", None),  # no calibration recorded
    ],
)
def test_nothing_is_folded_where_no_temperature_applies(problem_type, record):
    model = ViTFTForImageClassification(tiny_ft_config(num_labels=3, problem_type=problem_type))
    assert fold_temperature(model, task_for(model.config, record)) is model


def test_a_lora_run_is_merged_then_folded(hf_classifier_dir, tmp_path):
    peft_model = write_lora_run(hf_classifier_dir, tmp_path / "out")
    record_file = tmp_path / "out" / "vit_ft_run.json"
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "calibration": {"temperature": 2.5, "ece": [0.1, 0.02]}}))
    staged = stage_for_hub(tmp_path / "out", tmp_path / "staged", "me/vit-lora")
    pixels = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = AutoModelForImageClassification.from_pretrained(staged).eval()(pixels).logits
        expected = peft_model(pixel_values=pixels).logits / 2.5  # the adapter's head (modules_to_save), folded
    assert (got - expected).abs().max().item() <= 1e-5
    assert "temperature 2.500" in (staged / "README.md").read_text()


def test_push_folds_the_temperature_and_every_tool_agrees(staged, tiny_finetuned_dir):
    source = load_trained(tiny_finetuned_dir, device="cpu")
    folded = load_trained(staged, device="cpu")
    fitted = source.temperature
    assert fitted != 1.0  # the tiny fine-tune fitted one: otherwise nothing here is tested
    config = json.loads((staged / "config.json").read_text())
    assert config[FOLDED_TEMPERATURE_ATTRIBUTE] == pytest.approx(fitted) and folded.temperature == 1.0
    card = (staged / "README.md").read_text()
    assert f"temperature {fitted:.3f}" in card and "folded into the classifier head" in card and "ECE" in card
    assert "below 50%" in card  # the unsure threshold

    first, photo = digit_photo(tiny_finetuned_dir)
    photo_path = staged.parent / "photo.png"
    photo.save(photo_path)
    files = [str(first), str(photo_path)]
    # evaluate and predict: the task's probabilities on the same pixels (evaluate's EvalOutputs use them too)
    pixels = torch.stack([source.transform.transform_image(f) for f in files])
    assert (folded.probabilities(pixels) - source.probabilities(pixels)).abs().max().item() <= 1e-6
    ours = list(predict_files(source, files, top_k_labels=5, progress=False))
    theirs = list(predict_files(folded, files, top_k_labels=5, progress=False))
    for a, b in zip(ours, theirs, strict=True):
        assert a.labels == b.labels and np.allclose(a.scores, b.scores, atol=1e-6)

    # evaluate: the recorded test split through both models, its probabilities (every report's numbers)
    data = resolve_eval_data(source.origin, source.id2label, split="test")
    plain, folded_out = (predict_dataset(m, data, progress=False) for m in (source, folded))
    assert np.abs(folded_out.probabilities - plain.probabilities).max() <= 1e-6
    assert (folded_out.predictions == plain.predictions).all()

    # transformers' pipeline on the pushed folder: our calibrated scores, and predict's top-5 on a non-square image
    classify = pipeline("image-classification", model=str(staged), device="cpu")
    for file, prediction in zip(files, ours, strict=True):
        answer = classify(file, top_k=5)
        assert [a["label"] for a in answer] == list(prediction.labels)
        assert np.allclose([a["score"] for a in answer], prediction.scores, atol=1e-5)


def test_pushed_processor_gives_our_evaluation_pixels(staged, tiny_finetuned_dir):
    source = load_trained(tiny_finetuned_dir, device="cpu")
    processor = AutoImageProcessor.from_pretrained(staged)
    # non-square: a crop, not a squash; both round the resized side and the crop's offset down, also on the sizes
    # where rounding to nearest differs (45x29 -> 49.66x32, 29x61 -> 32x67.3, 33x47 -> 32x45.6 with offset 6.5)
    for width, height in ((50, 30), (40, 60), (60, 40), (32, 45), (45, 29), (29, 61), (33, 47), (61, 29), (47, 33)):
        _, photo = digit_photo(tiny_finetuned_dir, (width, height))
        ours = source.transform.transform_image(photo)
        theirs = processor(photo, return_tensors="pt")["pixel_values"][0]
        assert theirs.shape == ours.shape
        assert (theirs - ours).abs().max().item() <= 1e-5, (width, height)


def test_demo_on_a_folded_model_equals_the_source(staged, tiny_finetuned_dir):
    pytest.importorskip("gradio")
    from ..test_demo import load_app

    app = load_app()
    first, _ = digit_photo(tiny_finetuned_dir)
    source, folded = app.Classifier(tiny_finetuned_dir), app.Classifier(staged)
    assert folded.temperature == 1.0 and source.temperature != 1.0
    ours, theirs = source.predict(str(first)), folded.predict(str(first))
    assert list(ours) == list(theirs)
    assert np.allclose(list(ours.values()), list(theirs.values()), atol=1e-6)


@needs_onnx
def test_onnx_export_folds_the_temperature(tiny_finetuned_dir, tmp_path):
    from vit_ft.tools.export.onnx import export_onnx
    from vit_ft.tools.export.onnx_runtime import ONNX_FILE, OnnxClassifier, graph_task

    source = load_trained(tiny_finetuned_dir, device="cpu")
    export_onnx(source, tmp_path / "onnx")
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config[FOLDED_TEMPERATURE_ATTRIBUTE] == pytest.approx(source.temperature)
    graph = OnnxClassifier(tmp_path / "onnx" / ONNX_FILE, source.transform, task=graph_task(tmp_path / "onnx"))
    first, photo = digit_photo(tiny_finetuned_dir)
    pixels = torch.stack([source.transform.transform_image(x) for x in (str(first), photo)])
    # onnxruntime's plain softmax of the graph's logits is our calibrated probability
    assert graph.task.temperature == 1.0
    got = torch.from_numpy(graph.task.probabilities(graph.logits(pixels)))
    assert (got - source.probabilities(pixels)).abs().max().item() <= 1e-6
