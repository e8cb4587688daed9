"""Sharing a multi-label model (issue 24, item 4): the transformers export and the push keep `problem_type` and
the decision threshold, and transformers' own pipeline gives sigmoid scores; the model card reports mAP and says
how to keep the labels at or above the threshold; the ONNX export's config.json keeps both; the demo shows the
labels at or above threshold (never "unsure"). Tiny models (hidden 32, 2 layers, 32x32), no network."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml
from huggingface_hub import ModelCard
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, ViTImageProcessorPil

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.metrics.multilabel import MULTI_LABEL, THRESHOLD_ATTRIBUTE
from vit_ft.model.export import export_to_transformers
from vit_ft.tasks.card import model_card
from vit_ft.tools.export.hub import stage_for_hub
from vit_ft.tools.export.hub_format import check_same_head

from ..conftest import randomize
from ..test_demo import load_app

NAMES = ["dog", "cat", "grass", "sky", "car", "tree"]
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "image_size": 32, "patch_size": 8}  # fmt: skip
LABELS = {"id2label": dict(enumerate(NAMES)), "label2id": {n: i for i, n in enumerate(NAMES)}}
# the family classes a multi-label model is exported as: plain ViT, and one of the families (SigLIP's mean pooling)
FAMILIES = {"plain": {}, "siglip": {"pooling": "mean", "class_token": False}}
RECORD = {  # the run record a multi-label fine-tune writes (vit_ft_run.json)
    "recipe": "digits-multilabel", "base_model": "google/vit-base-patch16-224-in21k", "image_size": [32, 32],
    "lora": False, "data": {"builtin_dataset": "digits-multilabel"}, "problem_type": MULTI_LABEL,
    "metrics": {"eval_mAP": 0.91, "eval_f1_micro": 0.8, "eval_f1_macro": 0.78, "eval_exact_match": 0.5,
                "test_mAP": 0.93, "test_f1_micro": 0.85, "test_f1_macro": 0.84, "test_exact_match": 0.6,
                "test_loss": 0.2},
    THRESHOLD_ATTRIBUTE: {"value": [0.3, 0.4, 0.45, 0.5, 0.55, 0.6], "kind": "per_class", "split": "validation",
                          "images": 40, "metrics": {"mAP": 0.91, "f1_micro": 0.8, "f1_macro": 0.78,
                                                    "exact_match": 0.5}},
}  # fmt: skip


def image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8))


def multilabel_model(threshold, **options) -> ViTFTForImageClassification:
    config = ViTFTConfig(**TINY, **LABELS, problem_type=MULTI_LABEL, decision_threshold=threshold, **options)
    return randomize(ViTFTForImageClassification(config), seed=5)


def sigmoid_of_ours(model, folder: Path, picture: Image.Image) -> torch.Tensor:
    """Our model's sigmoid probabilities on `picture`, through the exported folder's own image processor."""
    pixels = AutoImageProcessor.from_pretrained(folder)(images=picture, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=pixels).logits[0].sigmoid()


def pipeline_scores(folder: Path, picture: Image.Image, **kwargs) -> dict[str, float]:
    classifier = transformers.pipeline("image-classification", model=str(folder), device="cpu", **kwargs)
    # top_k=None is the pipeline's default, 5 labels; every label needs top_k=num_labels
    return {s["label"]: s["score"] for s in classifier(picture, top_k=len(NAMES))}


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_export_is_multi_label_for_auto_class_and_pipeline(family, tmp_path):
    """AutoModelForImageClassification loads the export (no remote code) with the config's problem_type, and
    transformers' pipeline gives the sigmoid of our logits (which do not sum to 1), every label."""
    model = multilabel_model(0.4, **FAMILIES[family])
    folder = export_to_transformers(model, tmp_path / "export")
    assert not list(folder.glob("*.py"))
    loaded = AutoModelForImageClassification.from_pretrained(folder)
    assert loaded.config.problem_type == MULTI_LABEL and loaded.config.model_type != "vit_ft"
    expected = sigmoid_of_ours(model, folder, image())
    scores = pipeline_scores(folder, image())
    assert scores.keys() == set(NAMES)
    assert all(abs(scores[name] - expected[i].item()) <= 1e-4 for i, name in enumerate(NAMES)), scores
    assert abs(sum(scores.values()) - 1.0) > 0.05  # independent sigmoids, not a softmax


@pytest.mark.parametrize(
    "family",
    [
        "plain",
        "siglip",
    ],
)  # fmt: skip
def test_transformers_export_keeps_the_decision_threshold(family, tmp_path):
    thresholds = [0.3, 0.4, 0.45, 0.5, 0.55, 0.6]
    folder = export_to_transformers(multilabel_model(thresholds, **FAMILIES[family]), tmp_path / "export")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["problem_type"] == MULTI_LABEL and saved[THRESHOLD_ATTRIBUTE] == thresholds
    assert AutoModelForImageClassification.from_pretrained(folder).config.decision_threshold == thresholds


def test_a_staged_export_that_lost_the_threshold_is_refused(tmp_path):
    reference = multilabel_model([0.3, 0.4, 0.45, 0.5, 0.55, 0.6])
    check_same_head(reference, reference, tmp_path)
    lost = transformers.ViTForImageClassification(
        transformers.ViTConfig(**TINY, **LABELS, problem_type=MULTI_LABEL)
    )
    with pytest.raises(ValueError, match=r"lost the model's decision_threshold=\[0.3, .*--format vit_ft"):
        check_same_head(reference, lost, tmp_path)
    single = transformers.ViTForImageClassification(transformers.ViTConfig(**TINY, **LABELS))
    with pytest.raises(ValueError, match="lost the model's problem_type='multi_label_classification'"):
        check_same_head(reference, single, tmp_path)


def write_run(folder: Path, model: ViTFTForImageClassification, record: dict | None = RECORD) -> Path:
    model.save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    if record is not None:
        (folder / "vit_ft_run.json").write_text(json.dumps(record))
    return folder


def run_card_snippet(folder: Path, cwd: Path, monkeypatch) -> list[str]:
    """The staged README.md's snippet, run from `cwd` (which holds image.jpg) on the staged folder."""
    body = (folder / "README.md").read_text()
    code = body.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(cwd)
    scope: dict = {}
    exec(code.replace('"me/tags"', repr(str(folder))), scope)  # noqa: S102 - our own card's snippet
    return scope["labels"]


@pytest.mark.parametrize(
    ("format", "family"),
    [
        ("transformers", "plain"),
        ("transformers", "siglip"),
        ("vit_ft", "siglip"),
    ],
)  # fmt: skip
def test_push_keeps_the_head_and_the_cards_snippet_keeps_the_labels_at_threshold(
    format, family, tmp_path, monkeypatch
):
    """Staged for the Hub in either format, config.json keeps problem_type and the per-label thresholds, and the
    card's pipeline snippet (every label, remote code for vit_ft) keeps exactly the labels at or above them."""
    thresholds = RECORD[THRESHOLD_ATTRIBUTE]["value"]
    model = multilabel_model(thresholds, **FAMILIES[family])
    staged = stage_for_hub(write_run(tmp_path / "run", model), tmp_path / "staged", "me/tags", format)
    saved = json.loads((staged / "config.json").read_text())
    assert saved["problem_type"] == MULTI_LABEL and saved[THRESHOLD_ATTRIBUTE] == thresholds
    expected_type = {"plain": "vit", "siglip": "siglip"}[family] if format == "transformers" else "vit_ft"
    assert saved["model_type"] == expected_type
    image().convert("RGB").save(tmp_path / "image.jpg", quality=95)
    probs = sigmoid_of_ours(model, staged, Image.open(tmp_path / "image.jpg"))
    expected = {NAMES[i] for i, p in enumerate(probs.tolist()) if p >= thresholds[i]}
    assert 0 < len(expected) < len(NAMES)  # the thresholds split the labels: the test can fail
    assert set(run_card_snippet(staged, tmp_path, monkeypatch)) == expected


def test_multi_label_card_reports_map_and_the_threshold_tuned_on_validation(tmp_path):
    text = str(model_card(RECORD, "me/tags", tmp_path, "transformers", repo_id="me/tags"))
    _, front, body = text.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["pipeline_tag"] == "image-classification" and "multi-label-classification" in meta["tags"]
    data = ModelCard(text).data  # huggingface_hub's own parse of the model-index
    assert {r.task_name for r in data.eval_results} == {"Multi-label image classification"}
    assert {r.dataset_split for r in data.eval_results} == {"test"}
    values = {r.metric_type: r.metric_value for r in data.eval_results}
    assert values == {"mAP": 0.93, "f1_micro": 0.85, "f1_macro": 0.84, "exact_match": 0.6}
    args = {r.metric_type: r.metric_args for r in data.eval_results}
    assert args["mAP"] is None and args["exact_match"] == {"threshold": "per label (decision_threshold)"}
    assert "accuracy" not in front
    assert "fine-tuned for multi-label image classification" in body
    assert "- Decision threshold: one per label, from 0.300 to 0.600 (in label id order), tuned on the " \
           "validation split (40 images) for each label's best F1 (the test split never chose it)" in body  # fmt: skip
    assert "| test | 0.9300 | 0.8500 | 0.8400 | 0.6000 | 0.2000 |" in body
    assert (
        'pipeline("image-classification", model="me/tags")' in body
        and "top_k=classifier.model.config.num_labels" in body
    )
    assert "Unsure" not in body and "unsure" not in body
    one = {**RECORD, THRESHOLD_ATTRIBUTE: {**RECORD[THRESHOLD_ATTRIBUTE], "value": 0.42, "kind": "global"}}
    fixed = {**RECORD, THRESHOLD_ATTRIBUTE: {**RECORD[THRESHOLD_ATTRIBUTE], "value": 0.3, "kind": "fixed"}}
    assert "- Decision threshold: 0.300 for every label, fixed by the recipe;" in str(
        model_card(fixed, "tags", tmp_path, "vit_ft")
    )
    body = str(model_card(one, "tags", tmp_path, "vit_ft"))
    assert "- Decision threshold: 0.420 for every label, tuned on the validation split (40 images) for the " \
           "best micro F1" in body  # fmt: skip
    assert 'labels = [s["label"] for s in scores if s["score"] >= threshold]' in body
    meta = yaml.safe_load(body.split("---\n", 2)[1])
    assert meta["model-index"][0]["results"][0]["metrics"][1]["args"] == {"threshold": 0.42}
    assert "trust_remote_code=True" in body


def test_card_without_run_record_takes_the_threshold_from_the_config(tmp_path):
    """A folder with no vit_ft_run.json: the push's card still says multi-label and states the threshold."""
    folder = write_run(tmp_path / "bare", multilabel_model(0.35, **FAMILIES["siglip"]), record=None)
    staged = stage_for_hub(folder, tmp_path / "staged", "me/tags")
    body = (staged / "README.md").read_text()
    assert (
        "multi-label image classification" in body and "- Decision threshold: 0.350 for every label" in body
    )


def test_onnx_side_files_keep_the_head_and_evaluate_is_refused(tmp_path, monkeypatch):
    """config.json beside the graph keeps problem_type and the thresholds, the summary says how to read the
    logits, and --evaluate (top-1 accuracy) is refused before anything loads. The graph itself is stubbed: its
    export and its logits against PyTorch are test_onnx_export's (seconds each)."""
    pytest.importorskip("onnxruntime")
    from vit_ft.data.input_spec import graph_traces
    from vit_ft.tools.export import onnx as onnx_export
    from vit_ft.tools.export.onnx_runtime import compare_accuracy

    def stub_graph(model, path):
        path.write_bytes(b"graph")
        return graph_traces(model.config)[-1], 0.0

    monkeypatch.setattr(onnx_export, "export_model", stub_graph)
    thresholds = [0.3, 0.4, 0.45, 0.5, 0.55, 0.6]
    folder = write_run(tmp_path / "run", multilabel_model(thresholds))
    with pytest.raises(
        ValueError, match="--evaluate compares top-1 accuracy, which a multi-label model .*mAP"
    ):
        compare_accuracy(folder, tmp_path / "nothing")
    result = onnx_export.export_onnx(folder, tmp_path / "onnx")
    saved = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert saved["problem_type"] == MULTI_LABEL and saved[THRESHOLD_ATTRIBUTE] == thresholds
    assert "auto_map" not in saved and saved["id2label"] == {str(i): n for i, n in enumerate(NAMES)}
    assert "multi-label: a label's probability is the sigmoid of its logit" in result.summary()


# ---- the demo ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app():
    return load_app()


def demo_folder(tmp_path: Path, picture: Path) -> tuple[Path, dict[str, float]]:
    """A multi-label run whose per-label thresholds put the two most probable labels of `picture` just above
    theirs and every other just below; with its sigmoid probabilities, through transformers' image processor."""
    model = multilabel_model(0.5)
    folder = write_run(tmp_path / "run", model, record=None)
    probs = sigmoid_of_ours(model, folder, Image.open(picture)).tolist()
    top_two = sorted(range(len(NAMES)), key=lambda i: -probs[i])[:2]
    thresholds = [p - 0.01 if i in top_two else p + 0.01 for i, p in enumerate(probs)]
    model.config.decision_threshold = thresholds
    write_run(folder, model)  # RECORD: the thresholds were tuned on validation
    return folder, {NAMES[i]: probs[i] for i in sorted(range(len(NAMES)), key=lambda i: -probs[i])}


def test_demo_shows_the_labels_at_or_above_their_thresholds_and_the_next_below(app, tmp_path):
    import gradio as gr

    image(1).resize((48, 48)).save(tmp_path / "picture.png")  # square: resizing to cover needs no crop
    folder, probs = demo_folder(tmp_path, tmp_path / "picture.png")
    classifier = app.Classifier(folder)
    assert classifier.task.problem_type == MULTI_LABEL and classifier.temperature == 1.0
    answer = classifier.predict(str(tmp_path / "picture.png"))
    ranked = list(probs)
    assert list(answer) == ranked[:2] + ranked[2 : 2 + app.BELOW_SHOWN]  # above, then the next 3 below
    # sigmoid probabilities, no temperature
    assert answer == {name: pytest.approx(probs[name], abs=1e-5) for name in answer}
    demo = app.build_demo(classifier)
    (panel,) = [block for block in demo.blocks.values() if isinstance(block, gr.Label)]
    assert panel.show_heading is False and panel.num_top_classes is None
    (endpoint,) = [fn for fn in demo.fns.values() if fn.api_name == "predict"]
    assert endpoint.fn == classifier.predict  # the /predict API returns these sigmoid confidences
    shown = panel.postprocess(answer).model_dump()
    assert [c["label"] for c in shown["confidences"]] == list(answer)
    status, _ = classifier.status(str(tmp_path / "picture.png"), shown)
    first, second = ranked[:2]
    assert status.startswith("**2 labels** at or above the per-label decision thresholds")
    assert f"**{first} {100 * probs[first]:.1f} % (threshold " in status and f"**{second} " in status
    assert "(tuned on the validation split)" in status
    below = status.split("Below the threshold, not predicted: ")[1]
    assert [part.split(" ")[0].strip("_") for part in below.split("_, _")] == ranked[2:5]
    texts = " ".join(str(block.value) for block in demo.blocks.values() if isinstance(block, gr.Markdown))
    assert "class-agnostic" in texts and "unsure" not in (texts + status).lower()

    classifier.thresholds = dict.fromkeys(NAMES, 0.999)
    answer = classifier.predict(str(tmp_path / "picture.png"))
    assert list(answer) == ranked[: app.BELOW_SHOWN]
    status, _ = classifier.status(None, panel.postprocess(answer).model_dump())
    assert status.startswith(
        "**No label above threshold** (decision threshold 99.9 % (tuned on the validation"
    )
    assert "unsure" not in status.lower()
