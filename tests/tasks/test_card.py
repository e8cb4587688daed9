"""Tests for vit_ft.tasks.card: a single-label fine-tune's model card (the multi-label card:
tests/tools/test_multilabel_share.py)."""

import pytest
import torch
import yaml
from PIL import Image

from vit_ft import ViTFTForImageClassification
from vit_ft.tasks.card import model_card, write_model_card

RUN = {
    "recipe": "beans",
    "base_model": "google/vit-base-patch16-224-in21k",
    "image_size": [224, 224],
    "lora": False,
    "data": {"dataset_name": "AI-Lab-Makerere/beans"},
    "metrics": {"eval_accuracy": 0.9, "eval_f1": 0.88, "test_accuracy": 0.95, "test_top5_accuracy": 1.0,
                "test_f1": 0.94, "test_loss": 0.2, "test_runtime": 3.0},
}  # fmt: skip


def front_matter(text: str) -> tuple[dict, str]:
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_model_card_metadata_holds_the_test_metrics(tmp_path):
    (tmp_path / "run").mkdir()
    meta, body = front_matter(write_model_card(tmp_path / "run", RUN).read_text())
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["base_model"] == RUN["base_model"] and meta["datasets"] == ["AI-Lab-Makerere/beans"]
    assert {"vit_ft", "full-fine-tuning", "custom_code"} <= set(meta["tags"])
    (index,) = meta["model-index"]
    assert index["name"] == "run" and index["results"][0]["dataset"]["split"] == "test"
    metrics = {m["type"]: m["value"] for m in index["results"][0]["metrics"]}
    assert metrics == {"accuracy": 0.95, "top5_accuracy": 1.0, "f1": 0.94}
    assert (
        "| validation | 0.9000 | - | 0.8800 | - |" in body
        and "| test | 0.9500 | 1.0000 | 0.9400 | 0.2000 |" in body
    )
    assert 'model_dir = "path/to/run"  # the folder\'s path' in body
    assert 'pipeline("image-classification", model=model_dir, trust_remote_code=True)' in body
    assert "`trust_remote_code=True` is needed" in body and '"run"' not in body


CARD_FACTS = ("- Recipe: `beans`", "- Base model: [`google/vit-base-patch16-224-in21k`]", "- Resolution: 224x224",
              "- Fine-tuning: full", "- Dataset: `AI-Lab-Makerere/beans`", "| test | 0.9500 | 1.0000 | 0.9400 |")  # fmt: skip


@pytest.mark.parametrize("format", ["vit_ft", "transformers"])
def test_model_card_snippet_names_the_hub_id_when_pushed_and_the_folders_path_otherwise(tmp_path, format):
    _, pushed = front_matter(str(model_card(RUN, "me/vit-beans", tmp_path, format, repo_id="me/vit-beans")))
    _, local = front_matter(str(model_card(RUN, "beans-run", tmp_path, format)))
    assert '"me/vit-beans"' in pushed and "path/to" not in pushed
    assert 'model_dir = "path/to/beans-run"  # the folder\'s path' in local and '"beans-run"' not in local
    assert 'model="me/vit-beans"' in pushed and "model=model_dir" in local  # pipeline(), either format
    for body in (pushed, local):
        assert all(fact in body for fact in CARD_FACTS), body


def test_output_folders_card_snippet_runs_with_the_folders_path(tiny_finetuned_dir, tmp_path, monkeypatch):
    """The snippet of a fine-tune's README.md, with its placeholder replaced by the path, loads the model from
    anywhere (here another working directory)."""
    body = (tiny_finetuned_dir / "README.md").read_text()
    code = body.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'model_dir = "path/to/out"' in code
    monkeypatch.chdir(tmp_path)
    code = code.replace("path/to/out", str(tiny_finetuned_dir)).replace('"image.jpg"', "image")
    image = sorted((tiny_finetuned_dir / "examples").glob("*.png"))[0]
    scope: dict = {"image": str(image)}
    exec(code, scope)  # noqa: S102 - our own card's snippet: pipeline() with trust_remote_code=True
    classifier = scope["classifier"]
    assert classifier.model.config.num_labels == 10 and classifier.image_processor.size["height"] == 32
    # the pipeline's answer is the model's: the folder loaded by vit_ft's own class, on the same pixels
    reference = ViTFTForImageClassification.from_pretrained(tiny_finetuned_dir).eval()
    pixels = classifier.image_processor(Image.open(image).convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        top = reference(pixel_values=pixels).logits.softmax(-1)[0].topk(5)
    answer = classifier(str(image), top_k=5)
    assert [a["label"] for a in answer] == [reference.config.id2label[int(i)] for i in top.indices]
    assert [a["score"] for a in answer] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_model_card_without_test_metrics_reports_validation_and_hides_local_paths(tmp_path):
    run = {**RUN, "base_model": str(tmp_path), "lora": True, "metrics": {"eval_accuracy": 0.5}}
    card = model_card(run, "me/vit-beans", tmp_path, format="transformers", repo_id="me/vit-beans")
    meta, body = front_matter(str(card))
    assert "base_model" not in meta and "lora" in meta["tags"] and "vit" in meta["tags"]
    assert meta["model-index"][0]["results"][0]["dataset"]["split"] == "validation"
    assert str(tmp_path) not in body and "a local checkpoint" in body
    assert (
        'pipeline("image-classification", model="me/vit-beans")' in body and "trust_remote_code" not in body
    )
