"""The same recipe with the same `global_batch_size` on 1 process and on 2 (accelerate launch, gloo on CPU): the
same global batch, derived (accumulation 4 and 2), stated in the log's first line and the run record, and the
same first 10 logged losses within 1e-4.

Why the steps see the same samples: accelerate replaces Trainer's RandomSampler by its SeedableRandomSampler (one
order from the seed and the epoch, the same in every process) and, with 2 processes, hands the batches of 8 out in
turn (`BatchSamplerShard`: process 0 takes batches 0, 2, ...; process 1 takes 1, 3, ...). One process accumulates
batches 0-3 into a step; two processes accumulate 0, 2 and 1, 3, and DDP averages their gradients: the same 32
images, each batch's mean loss weighed alike. Dropout is off and the transforms draw nothing (full-image crops,
no flips), so nothing differs but the order of float sums."""

import json

import pytest

from ..cli_runner import run_script
from ..conftest import logged_losses, write_tiny_recipe
from .test_distributed import launch_two_processes

# 96 images, global batch 32: 3 steps an epoch, 10 steps; nothing random in the data but the seeded order
SETTINGS = {
    "global_batch_size": 32,
    "per_device_train_batch_size": 8,
    "max_steps": 10,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "crop_scale_min": 1.0,
    "horizontal_flip": False,
    "eval_strategy": "no",
    "save_strategy": "no",
    "max_eval_samples": 16,
}


def losses(output_dir) -> list[float]:
    return [loss for _, loss in logged_losses(output_dir)]


@pytest.mark.slow
def test_one_and_two_processes_reach_the_same_global_batch_and_losses(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    one = run_script("scripts/finetune.py", ["--recipe", str(recipe), "--use_cpu", "true", "--output_dir",
                                             str(tmp_path / "one")], capfd, tmp_path)  # fmt: skip
    assert one.returncode == 0, (one.stdout + one.stderr)[-4000:]
    two_log = launch_two_processes(recipe, tmp_path, "--output_dir", str(tmp_path / "two"))

    runs = {name: json.loads((tmp_path / name / "vit_ft_run.json").read_text()) for name in ("one", "two")}
    assert runs["one"]["batch"] == {"world_size": 1, "per_device_train_batch_size": 8,
                                    "gradient_accumulation_steps": 4, "global_batch": 32, "global_batch_size": 32}
    assert runs["two"]["batch"] == {"world_size": 2, "per_device_train_batch_size": 8,
                                    "gradient_accumulation_steps": 2, "global_batch": 32, "global_batch_size": 32}  # fmt: skip
    assert "Batch: global 32 = 8 per device x 1 process (world size) x 4 accumulation steps" in one.stdout + one.stderr
    assert "Batch: global 32 = 8 per device x 2 processes (world size) x 2 accumulation steps" in two_log

    first, second = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(first) == len(second) == 10
    assert first == pytest.approx(second, abs=1e-4, rel=0)
    # the head starts at zero (loss ln 10 at step 1 whatever the batch); the next steps tell batches apart: a global
    # batch of 64 on 2 processes (--global_batch_size none --gradient_accumulation_steps 4) differs by 0.03 here
    assert len(set(first)) > 1

