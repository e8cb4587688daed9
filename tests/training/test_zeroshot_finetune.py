"""`method: zeroshot` and `head_init: zeroshot` in the fine-tune, on the real digits with a tiny random CLIP
checkpoint (its tokenizer built in tests/model/test_zeroshot.py): the saved folder is an ordinary model whose logits
are transformers' `CLIPModel.logits_per_image` for "a photo of a <digit>." on the same pixels, predict reads it as any
other, and head_init zeroshot fine-tunes from that head; a checkpoint without a text tower is one error line."""

from __future__ import annotations

import json
from pathlib import Path

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


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("zeroshot_fails", [False, True], ids=["ran", "multi-label"])
def test_the_ladder_starts_with_the_zeroshot_rung_on_an_image_text_checkpoint(clip_folder, tmp_path, zeroshot_fails):
    """The rungs a stub fine-tune reports: the zero-shot head first (its validation 0.5), kNN above it; a zero-shot
    rung that cannot run (e.g. multi-label data) is reported and the ladder goes on from kNN."""
    from types import SimpleNamespace

    from vit_ft.arguments.family_defaults import checkpoint_family
    from vit_ft.arguments.fields import ModelArguments
    from vit_ft.training.ladder import RUNGS, ladder_rungs, run_ladder

    validations = {"zeroshot": 0.5, "knn": 0.9, "linear": 0.905, "lora": 0.99, "full": 0.99}
    ran = []

    def rung(model_args, training_args):
        ran.append(model_args.method)
        if zeroshot_fails and model_args.method == "zeroshot":
            raise ValueError("a zero-shot head ranks the classes of one label per image")
        Path(training_args.output_dir).mkdir(parents=True)
        (Path(training_args.output_dir) / "config.json").write_text("{}")
        return {"eval_accuracy": validations[model_args.method]}

    model_args = ModelArguments(model_name_or_path=str(clip_folder[0]), method="auto")
    assert ladder_rungs(model_args, checkpoint_family(model_args.model_name_or_path)) == ("zeroshot", *RUNGS)
    training = SimpleNamespace(output_dir=str(tmp_path / "out"), process_index=0, overwrite_output_dir=False,
                               resume_from_checkpoint=None)  # fmt: skip
    run_ladder(model_args, training, rung, clock=_Clock())
    assert ran == ["zeroshot", "knn", "linear"]  # the linear probe gained 0.5 points over kNN: not above 1
    record = json.loads((tmp_path / "out" / "ladder.json").read_text())
    assert [r["method"] for r in record["rungs"]] == ["zeroshot", *RUNGS]
    assert record["rungs"][0]["ran"] is not zeroshot_fails and record["kept"] == "linear"
    assert "Stopped: linear gained" in (tmp_path / "out" / "report.md").read_text()
    assert ladder_rungs(ModelArguments(model_name_or_path=str(tmp_path / "nothing-here"), method="auto"), None) == RUNGS


def test_a_local_checkpoint_without_a_text_tower_is_refused_with_the_arguments(hf_backbone_dir):
    from vit_ft.arguments.fields import ModelArguments

    with pytest.raises(ValueError, match="without a text tower"):
        ModelArguments(model_name_or_path=hf_backbone_dir, head_init="zeroshot")


@pytest.mark.long  # a LoRA fine-tune
def test_head_init_zeroshot_with_lora_reloads_from_its_adapter(tmp_path, capfd, clip_folder):
    result, out = _fine_tune(tmp_path, capfd, clip_folder[0], head_init="zeroshot", method="lora")
    assert result.returncode == 0, result.stderr[-4000:]
    merged, adapter = load_trained(str(out)), load_trained(str(out / "adapter"))  # the adapter brings the head
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(adapter.logits(pixels), merged.logits(pixels), atol=1e-5, rtol=0)
