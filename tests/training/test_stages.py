"""A tiny end-to-end fine-tune through scripts/finetune.py, and what it leaves in the output folder.

The fine-tunes run the script in this process (`tests.cli_runner.run_script`: the same script file, arguments
and working folder, without a fresh interpreter's imports); the push to the fake Hub runs as a process of its
own, as huggingface_hub reads HF_ENDPOINT when it is imported."""

import json
import math
import re

import pytest
import torch
from PIL import Image

from vit_ft import ViTFTForImageClassification

from ..cli_runner import run_script
from ..conftest import run_finetune_script, write_tiny_recipe

FINETUNE = "scripts/finetune.py"


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune")
    recipe = write_tiny_recipe(tmp)
    result = run_script(FINETUNE, ["--recipe", recipe, "--report_to", "tensorboard"], None, cwd=tmp)
    assert result.returncode == 0, result.stderr[-4000:]
    return tmp / "out", result


def test_output_folder_has_every_artefact(finetuned):
    out, _ = finetuned
    for name in ("model.safetensors", "config.json", "preprocessor_config.json", "labels.json", "all_results.json",
                 "eval_results.json", "test_results.json", "README.md", "training_curves.png", "vit_ft_run.json",
                 "modeling_vit_ft.py"):  # fmt: skip
        assert (out / name).is_file(), name
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert (
        0.0 <= eval_results["eval_accuracy"] <= 1.0
        and "eval_top5_accuracy" in eval_results
        and "eval_f1" in eval_results
    )
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "runs").rglob("*")), (
        "no TensorBoard logs"
    )
    with Image.open(out / "training_curves.png") as image:
        assert image.size[0] > 500


def test_saved_model_keeps_labels_resolution_and_processor(finetuned):
    out, _ = finetuned
    model = ViTFTForImageClassification.from_pretrained(out)
    assert model.config.image_hw == (32, 32)
    assert model.config.id2label == {i: str(i) for i in range(10)}
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 32, "width": 32}
    labels = json.loads((out / "labels.json").read_text())
    assert labels["label2id"] == {str(i): i for i in range(10)}
    run = json.loads((out / "vit_ft_run.json").read_text())
    assert run["data"]["test_dir"].endswith("test") and run["image_size"] == [32, 32]


def test_training_moved_the_weights_and_the_loss_went_down(finetuned):
    out, _ = finetuned
    model = ViTFTForImageClassification.from_pretrained(out)
    assert torch.count_nonzero(model.classifier.weight) > 0  # the zero-initialised head was trained
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [e["loss"] for e in history if "loss" in e]
    assert len(losses) >= 10 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


def test_model_card_states_recipe_resolution_and_metrics(finetuned):
    out, _ = finetuned
    card = (out / "README.md").read_text()
    assert card.startswith("---") and "model-index" in card and "library_name: transformers" in card
    test_accuracy = json.loads((out / "test_results.json").read_text())["test_accuracy"]
    assert f"{test_accuracy:.4f}" in card and "32x32" in card and "Recipe: `tiny`" in card


def test_bad_recipe_value_stops_before_training(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, image_size=30)
    result = run_script(FINETUNE, ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode != 0
    assert "30" in result.stderr and "patch" in result.stderr
    assert not (tmp_path / "out").exists()


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path)
    result = run_script(FINETUNE, ["--recipe", recipe, "--resume"], capfd, cwd=tmp_path)
    assert result.returncode != 0 and "no complete checkpoint-* folder" in result.stderr


def test_bad_files_are_skipped_and_accumulation_and_checkpointing_work(tmp_path, capfd):
    recipe = write_tiny_recipe(
        tmp_path, gradient_accumulation_steps=2, gradient_checkpointing=True, num_train_epochs=1
    )
    train_dir = tmp_path / "digits" / "train"
    for folder in train_dir.iterdir():  # 30 images a class: every file is read, so keep the folder small
        for extra in sorted(folder.glob("*.png"))[30:]:
            extra.unlink()
    (train_dir / "3" / "not_an_image.png").write_bytes(b"this is text, not a PNG")
    good = next((train_dir / "5").glob("*.png")).read_bytes()
    (train_dir / "5" / "truncated.png").write_bytes(good[: len(good) // 2])
    result = run_script(FINETUNE, ["--recipe", recipe, "--max_train_samples", "none"], capfd, cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    # the count and the paths are in the log (the two files may land in the train or the held-out split)
    dropped = [int(m) for m in re.findall(r"Dropping (\d+) of \d+ images", log)]
    assert sum(dropped) == 2 and "not_an_image.png" in log and "truncated.png" in log
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    # the training images left after the 10% hold-out and the bad files (about 270): batches of 16, 2 of them
    # to an update (an odd count of batches still makes a last update)
    train = int(re.search(r"Data: \{'train': (\d+),", log).group(1))
    batches = math.ceil(train / 16)
    assert 250 <= train <= 300 and batches % 2 == 1 and state["global_step"] == (batches + 1) // 2


@pytest.mark.long
def test_push_to_hub_sends_the_finished_folder_once(tmp_path, monkeypatch):
    """`--push_to_hub`: after training, one complete push of the output folder (to a local fake Hub), with a
    cluster's Hub variables exported in the parent (`FakeHub.env` gives the run the stand-in's own)."""

    from ..fake_hub import FakeHub
    from ..test_hermetic import HOSTILE
    from ..tools.test_hub import push_env

    for name, value in HOSTILE.items():
        monkeypatch.setenv(name, value)

    recipe = write_tiny_recipe(tmp_path, num_train_epochs=1, max_train_samples=32)
    with FakeHub() as hub:
        result = run_finetune_script(
            "--recipe", str(recipe), "--push_to_hub", "true", "--hub_model_id", "me/tiny-push",
            cwd=tmp_path, env=push_env(hub, tmp_path),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Pushed" in result.stdout and not hub.unexpected
    files = hub.repos["me/tiny-push"]
    assert {"model.safetensors", "config.json", "README.md", "vit_ft_run.json"} <= set(files)
    # a plain ViT goes to the Hub as transformers' own class: no code, the weights converted to its layout
    assert json.loads(files["config.json"])["architectures"] == ["ViTForImageClassification"]
    assert not [name for name in files if name.endswith(".py")]


def test_the_final_validation_pass_is_reused_not_repeated(finetuned):
    """The weights the run ends with were evaluated during training: eval_results.json is that very pass (its
    runtime included), and the reported throughput without evaluation is faster than Trainer's with it."""
    out, _ = finetuned
    state = json.loads((out / "trainer_state.json").read_text())
    step = state["global_step"]
    if state.get("best_model_checkpoint"):
        step = int(state["best_model_checkpoint"].rsplit("-", 1)[-1])
    logged = [e for e in state["log_history"] if e.get("step") == step and "eval_loss" in e]
    assert logged, "the final weights were never evaluated during training"
    final = json.loads((out / "eval_results.json").read_text())
    assert final["eval_runtime"] == logged[-1]["eval_runtime"]
    assert final["eval_accuracy"] == logged[-1]["eval_accuracy"]
    train = json.loads((out / "train_results.json").read_text())
    assert train["train_runtime_excluding_eval"] < train["train_runtime"]
    assert train["train_samples_per_second_excluding_eval"] > train["train_samples_per_second"]


def test_evaluated_final_model_picks_the_best_or_last_step_and_none_when_unevaluated():
    from types import SimpleNamespace

    from vit_ft.training.trainer import evaluated_final_model

    history = [
        {"loss": 1.0, "step": 2},
        {"eval_loss": 0.5, "eval_accuracy": 0.7, "step": 2},
        {"eval_loss": 0.6, "eval_accuracy": 0.6, "step": 4},
    ]
    args = SimpleNamespace(load_best_model_at_end=True)
    best = SimpleNamespace(
        global_step=4, epoch=2.0, log_history=history, best_model_checkpoint="o/checkpoint-2"
    )
    assert evaluated_final_model(best, args) == {"eval_loss": 0.5, "eval_accuracy": 0.7, "epoch": 2.0}
    args.load_best_model_at_end = False
    assert evaluated_final_model(best, args)["eval_accuracy"] == 0.6  # the last step's weights
    unevaluated = SimpleNamespace(global_step=5, epoch=2.5, log_history=history, best_model_checkpoint=None)
    assert evaluated_final_model(unevaluated, args) is None


def test_with_the_ema_as_final_model_its_logged_metrics_are_the_final_ones():
    from types import SimpleNamespace

    from vit_ft.training.trainer import evaluated_final_model

    entry = {"eval_loss": 0.5, "eval_accuracy": 0.7, "eval_ema_loss": 0.4, "eval_ema_accuracy": 0.8,
             "eval_runtime": 1.5, "step": 4}  # fmt: skip
    state = SimpleNamespace(global_step=4, epoch=2.0, log_history=[entry], best_model_checkpoint=None)
    args = SimpleNamespace(load_best_model_at_end=False, ema_as_final_model=True)
    assert evaluated_final_model(state, args) == {
        "eval_loss": 0.4,
        "eval_accuracy": 0.8,
        "eval_runtime": 1.5,
        "epoch": 2.0,
    }
    args.ema_as_final_model = False
    assert evaluated_final_model(state, args)["eval_ema_accuracy"] == 0.8  # reported beside the model's
