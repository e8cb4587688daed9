"""`method: zeroshot` and `head_init: zeroshot` in the fine-tune, on the real digits with a tiny random CLIP
checkpoint (its tokenizer built in tests/model/test_zeroshot.py): the saved folder is an ordinary model whose logits
are transformers' `CLIPModel.logits_per_image` for "a photo of a <digit>." on the same pixels, predict reads it as any
other, and head_init zeroshot fine-tunes from that head; a checkpoint without a text tower is one error line."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, CLIPConfig, CLIPModel

from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import randomize, write_tiny_recipe
from ..model.test_zeroshot import TEXT, VISION, tokenizer

RUN = {"num_train_epochs": 1, "max_train_samples": 40, "max_eval_samples": 20, "bank_max_images": 0}


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    model = CLIPModel(CLIPConfig(vision_config={**VISION, "image_size": 32}, text_config=TEXT, projection_dim=24))
    randomize(model, seed=5).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder, model


def _fine_tune(tmp_path, capfd, clip_folder, **overrides):
    recipe = write_tiny_recipe(tmp_path, model_name_or_path=str(clip_folder), zeroshot_templates="photo",
                               **{**RUN, **overrides})  # fmt: skip
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    return result, tmp_path / "out"


@pytest.mark.long  # three fine-tunes, about 20 s together: CI's own step
def test_zeroshot_method_saves_clips_classifier(tmp_path, capfd, clip_folder):
    folder, reference = clip_folder
    result, out = _fine_tune(tmp_path, capfd, folder, method="zeroshot")
    assert result.returncode == 0, result.stderr[-4000:]
    trained = load_trained(str(out))
    assert trained.model.config.head_type == "zeroshot"
    assert json.loads((out / "vit_ft_run.json").read_text())["method"] == "zeroshot"
    names = [trained.model.config.id2label[i] for i in range(trained.model.config.num_labels)]
    text = AutoTokenizer.from_pretrained(folder)([f"a photo of a {n}." for n in names], padding=True, return_tensors="pt")
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(**text, pixel_values=pixels).logits_per_image
        torch.testing.assert_close(trained.model(pixel_values=pixels).logits, expected, atol=1e-4, rtol=0)
    predicted = run_script("scripts/predict.py", ["--model", str(out), "--output", str(tmp_path / "p.csv"),
                                                   str(tmp_path / "digits" / "test" / "3")],
                           capfd, cwd=tmp_path)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-2000:]


@pytest.mark.long
def test_head_init_zeroshot_fine_tunes_from_the_zeroshot_head(tmp_path, capfd, clip_folder):
    result, out = _fine_tune(tmp_path, capfd, clip_folder[0], head_init="zeroshot", learning_rate=1e-4)
    assert result.returncode == 0, result.stderr[-4000:]
    model = load_trained(str(out)).model
    assert model.config.head_type == "zeroshot" and model.classifier.projection.weight.shape == (24, 32)


@pytest.mark.long
def test_zeroshot_without_a_text_tower_is_one_line(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, method="zeroshot", **RUN)  # a ViTModel backbone
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode != 0
    assert "without a text tower" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
