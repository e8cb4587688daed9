"""Two CPU processes (gloo, accelerate launch): one shared launch that several contracts read, instead of a launch
each. The recipe holds what each contract needs at once: a global batch of 32 split 8 per device (accumulation 2
on two processes, 4 on one), a teacher each process runs on its own share (distillation), random crops and flips
(drawn from per-image generators, so one process and two see the same pixels), checkpoints in the middle of an
epoch. Dropout is off: it draws from each process's own generator, and one process and two must give the same
losses.

- the run: process 0 alone writes the output, once; the global batch is derived and stated; the student alone is
  saved;
- the same recipe on one process gives the same first losses within 1e-4 (accelerate's SeedableRandomSampler
  orders the samples alike; BatchSamplerShard hands batches 0, 2 to process 0 and 1, 3 to process 1; DDP averages
  the two accumulated gradients: the same 32 images a step, each batch's mean loss weighed alike);
- the passes after training (the feature bank's, calibration's) are split between the processes, each passing
  its share, and process zero's bank is the one a single process computes from the saved model;
- a resume from checkpoint-4 (one step into the second epoch, both processes' RNG files) ends bit for bit where
  the uninterrupted run ended."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoImageProcessor

from vit_ft import ViTFTForImageClassification
from vit_ft.tasks.feature_bank import bank_features, normalized, read_feature_bank
from vit_ft.training.inputs import model_input_spec

from ..cli_runner import run_script
from ..conftest import logged_losses, write_tiny_recipe
from .test_distributed import final_metrics, launch_two_processes

# 96 images, global batch 32: 3 steps an epoch, 9 steps; checkpoints 2, 4, 6, 8 (4 is one step into epoch 2)
SETTINGS = {
    "num_train_epochs": 3,
    "global_batch_size": 32,
    "per_device_train_batch_size": 8,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "crop_scale_min": 0.5,
    "horizontal_flip": True,
    "save_strategy": "steps",
    "save_steps": 2,
    "save_total_limit": None,
    "load_best_model_at_end": False,
}


@pytest.fixture(scope="module")
def shared_launch(tmp_path_factory, tiny_finetuned_dir):
    """(folder, recipe, log) of the one two-process run this module reads."""
    tmp = tmp_path_factory.mktemp("two_processes")
    recipe = write_tiny_recipe(tmp, teacher_model_name_or_path=str(tiny_finetuned_dir), **SETTINGS)
    return tmp, recipe, launch_two_processes(recipe, tmp)


def test_process_zero_alone_writes_the_output_once(shared_launch):
    tmp, _, log = shared_launch
    out = tmp / "out"
    run = json.loads((out / "vit_ft_run.json").read_text())
    assert run["world_size"] == 2
    assert run["written_by_process"] == 0 and log.count("INFO vit_ft: Finished: ") == 1
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3 * 3
    losses = [loss for _, loss in logged_losses(out)]
    assert len(losses) == 9 and all(loss == loss and loss < 10 for loss in losses)  # finite and sane
    assert 0.0 <= run["metrics"]["test_accuracy"] <= 1.0


def test_each_process_runs_its_own_teacher_and_the_student_alone_is_saved(shared_launch):
    tmp, _, log = shared_launch
    assert "Distilling from" in log
    with safe_open(tmp / "out" / "model.safetensors", "pt") as weights:
        assert set(weights.keys()) == set(ViTFTForImageClassification.from_pretrained(tmp / "out").state_dict())


def test_one_and_two_processes_reach_the_same_global_batch_and_losses(shared_launch, capfd):
    tmp, recipe, two_log = shared_launch
    one = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--output_dir", str(tmp / "one"),
                                             "--save_strategy", "no"], capfd, tmp)  # fmt: skip
    assert one.returncode == 0, (one.stdout + one.stderr)[-4000:]
    runs = {name: json.loads((tmp / name / "vit_ft_run.json").read_text()) for name in ("one", "out")}
    assert runs["one"]["batch"] == {"world_size": 1, "per_device_train_batch_size": 8,
                                    "gradient_accumulation_steps": 4, "global_batch": 32, "global_batch_size": 32}
    assert runs["out"]["batch"] == {"world_size": 2, "per_device_train_batch_size": 8,
                                    "gradient_accumulation_steps": 2, "global_batch": 32, "global_batch_size": 32}  # fmt: skip
    assert "Batch: global 32 = 8 per device x 1 process (world size) x 4 accumulation steps" in one.stdout + one.stderr
    assert "Batch: global 32 = 8 per device x 2 processes (world size) x 2 accumulation steps" in two_log

    first = [loss for _, loss in logged_losses(tmp / "one")]
    second = [loss for _, loss in logged_losses(tmp / "out")]
    assert len(first) == len(second) == 9
    assert first == pytest.approx(second, abs=1e-4, rel=0)
    # steps tell batches apart: a wrong split (another global batch, another order) moves them by 1e-2 here
    assert len(set(first)) > 1


def test_the_banks_passes_are_split_and_process_zero_gathers_them_in_order(shared_launch):
    tmp, _, log = shared_launch
    out = tmp / "out"
    # 96 training and 48 validation images: each process passed half of each, once
    assert log.count("Feature bank: 48/48 img") == 2, log[-3000:]
    assert log.count("Calibration + feature bank, validation: 24/24 img") == 2, log[-3000:]
    bank, why = read_feature_bank(out)
    assert bank is not None, why
    assert bank.rows.tolist() == list(range(96)) and len(set(bank.sources)) == 96
    model = ViTFTForImageClassification.from_pretrained(out).eval()
    transform = model_input_spec(AutoImageProcessor.from_pretrained(out), model.config).eval_transform()
    with torch.no_grad():
        found, kept = bank_features(model, transform, list(bank.sources))
    assert kept == list(range(96))
    np.testing.assert_allclose(bank.features, normalized(found["features"]), atol=1e-5)
    np.testing.assert_allclose(bank.input, normalized(found["input"]), atol=1e-5)
    record = json.loads((out / "vit_ft_run.json").read_text())
    assert record["feature_bank"]["written"] and record["calibration"]["images"] == 48


def test_a_resume_from_the_middle_of_an_epoch_ends_where_the_run_ended(shared_launch):
    tmp, recipe, _ = shared_launch
    out, resumed = tmp / "out", tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-4", resumed / "checkpoint-4")
    assert (resumed / "checkpoint-4" / "rng_state_1.pth").is_file()
    launch_two_processes(recipe, tmp, "--output_dir", str(resumed), "--resume")
    for name in ("eval_results.json", "test_results.json"):
        assert final_metrics(resumed / name) == final_metrics(out / name)
    assert logged_losses(resumed) == logged_losses(out)
    assert (resumed / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
