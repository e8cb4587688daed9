"""Interruption: a run killed at a checkpoint in the middle of an epoch resumes with --resume and ends bit for bit
where an uninterrupted run ends: the same metrics, losses and final weights."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_ft.training.checkpoints import checkpoint_is_complete, last_complete_checkpoint

from ..conftest import REPO, run_finetune_script, write_tiny_recipe

# 6 steps per epoch, a checkpoint every 4: checkpoints 4, 8, 16 and 20 fall in the middle of an epoch.
# Random crops and dropout: both must replay; the final model is the last one, not the best checkpoint.
SETTINGS = {
    "num_train_epochs": 4,
    "save_strategy": "steps",
    "save_steps": 4,
    "save_total_limit": None,
    "load_best_model_at_end": False,
    "hidden_dropout_prob": 0.1,
    "crop_scale_min": 0.5,
}
STEPS_PER_EPOCH = 6


def final_run(out: Path) -> dict:
    """What must not depend on the interruption: eval/test metrics, each step's logged loss, the final weights.

    (train_loss and the timings in train_results.json do differ: the Trainer averages the loss over the steps
    that this process ran.)
    """
    metrics = json.loads((out / "all_results.json").read_text())
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {
        "metrics": {
            k: v
            for k, v in metrics.items()
            if k.startswith(("eval_", "test_")) and "runtime" not in k and "per_second" not in k
        },
        "losses": {e["step"]: (e["loss"], e["grad_norm"]) for e in history if "loss" in e},
        "weights": (out / "model.safetensors").read_bytes(),
    }


def assert_same_run(resumed: dict, uninterrupted: dict) -> None:
    assert resumed["metrics"] == uninterrupted["metrics"]
    # the resumed run's log holds the steps before the checkpoint (from its state) and those it ran
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["weights"] == uninterrupted["weights"]


def signal_after_first_checkpoint(recipe: Path, cwd: Path, sig: int) -> tuple[int, str]:
    """Start a fine-tune and send `sig` once checkpoint-4 is complete (in epoch 1 of 4); its exit status and
    stderr (kept in a file, not a pipe nobody reads while the run goes on)."""
    out = cwd / "out"
    with (cwd / "stderr.txt").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)],
            cwd=cwd, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and process.poll() is None:
                if (out / "checkpoint-4").is_dir() and checkpoint_is_complete(out / "checkpoint-4"):
                    break
                time.sleep(0.05)
            assert process.poll() is None, "the run finished before the signal could be sent"
            os.kill(process.pid, sig)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    return process.returncode, (cwd / "stderr.txt").read_text()


def kill_after_first_checkpoint(recipe: Path, cwd: Path, sig: int) -> Path:
    signal_after_first_checkpoint(recipe, cwd, sig)
    out = cwd / "out"
    assert not (out / "all_results.json").exists(), "the run was not interrupted"
    return out


@pytest.fixture(scope="module")
def uninterrupted_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    result = run_finetune_script("--recipe", str(write_tiny_recipe(tmp, **SETTINGS)), cwd=tmp)
    assert result.returncode == 0, result.stderr[-4000:]
    return tmp / "out"


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_dir) -> dict:
    return final_run(uninterrupted_dir)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_resumes_to_the_same_result(tmp_path, uninterrupted, sig):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    out = kill_after_first_checkpoint(recipe, tmp_path, sig)
    last = last_complete_checkpoint(out)
    assert last is not None and int(Path(last).name.split("-")[1]) < 24
    result = run_finetune_script("--recipe", str(recipe), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(final_run(out), uninterrupted)


def test_resume_from_the_middle_of_an_earlier_epoch_is_exact(tmp_path, uninterrupted_dir, uninterrupted):
    """Only checkpoint-8 (2 steps into epoch 2 of 4) in a fresh folder: the skipped batches' crops, the rest of
    the epoch and the later epochs must all be drawn as they were."""
    step = 8
    assert step % STEPS_PER_EPOCH != 0
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(uninterrupted_dir / f"checkpoint-{step}", out / f"checkpoint-{step}")
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    result = run_finetune_script("--recipe", str(recipe), "--output_dir", str(out), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(final_run(out), uninterrupted)


def test_half_written_checkpoint_is_never_resumed_from(tmp_path, uninterrupted):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    out = kill_after_first_checkpoint(recipe, tmp_path, signal.SIGKILL)
    good = Path(last_complete_checkpoint(out))
    # what a death while saving leaves: a newer folder with weights cut short and no trainer_state.json
    broken = out / f"checkpoint-{int(good.name.split('-')[1]) + SETTINGS['save_steps']}"
    shutil.rmtree(broken, ignore_errors=True)
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:100])
    assert not checkpoint_is_complete(broken)
    assert last_complete_checkpoint(out) == str(good)
    assert (
        not broken.exists() and (out / f"incomplete-{broken.name}").is_dir()
    )  # moved aside, good one intact
    assert checkpoint_is_complete(good)
    result = run_finetune_script("--recipe", str(recipe), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(final_run(out), uninterrupted)


def preempt_after_first_checkpoint(recipe: Path, cwd: Path, sig: int) -> tuple[int, str]:
    """Send `sig` once checkpoint-4 is complete; the exit status and the last stderr line."""
    status, stderr = signal_after_first_checkpoint(recipe, cwd, sig)
    assert "Traceback" not in stderr, stderr[-3000:]
    return status, stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_preempted_run_saves_at_the_next_step_and_resumes_to_the_same_result(tmp_path, uninterrupted, sig):
    """SIGTERM (Slurm, Kubernetes, spot instances) or SIGUSR1 (Slurm's --signal) mid-epoch: a checkpoint at the
    next step, one line naming it, exit 75; --resume then ends bit for bit like the uninterrupted run."""
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    status, last = preempt_after_first_checkpoint(recipe, tmp_path, sig)
    named = re.fullmatch(
        rf"error: stopped by {sig.name}; the run is saved in (\S+/checkpoint-(\d+))\. Run the same command "
        r"with --resume to continue\.",
        last,
    )
    assert status == 75 and named, (status, last)
    step = int(named.group(2))
    assert 4 < step < 24 and checkpoint_is_complete(named.group(1))
    out = tmp_path / "out"
    assert last_complete_checkpoint(out) == str(out / f"checkpoint-{step}")
    assert not (out / "all_results.json").exists() and not (out / "vit_ft_run.json").exists()
    if sig == signal.SIGUSR1:
        return  # the same save as SIGTERM's; one resume is enough to show it is exact
    result = run_finetune_script("--recipe", str(recipe), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(final_run(out), uninterrupted)


# Every random draw of the fine-tuning toolkit on at once (issue 23): RandAugment, random erasing, mixup/cutmix
# with label smoothing, drop path, EMA (the saved model) and layer decay; 2 epochs of 6 steps, checkpoint-8 mid-epoch.
TOOLKIT = {
    **SETTINGS,
    "num_train_epochs": 2,
    "auto_augment": "randaugment",
    "random_erasing_prob": 0.5,
    "mixup_alpha": 0.8,
    "cutmix_alpha": 1.0,
    "label_smoothing_factor": 0.1,
    "drop_path_rate": 0.1,
    "ema_decay": 0.9,
    "ema_warmup": True,
    "ema_as_final_model": True,
    "layer_decay": 0.75,
    "weight_decay": 0.05,
}


def test_resume_with_every_augmentation_drop_path_and_ema_is_exact(tmp_path):
    """An uninterrupted run, then its checkpoint-8 (2 steps into epoch 2) resumed in a fresh folder: the same
    metrics, losses and final weights (the EMA's), so every draw replays and the EMA comes back from the checkpoint."""
    first = tmp_path / "first"
    first.mkdir()
    recipe = write_tiny_recipe(first, **TOOLKIT)
    result = run_finetune_script("--recipe", str(recipe), cwd=first)
    assert result.returncode == 0, result.stderr[-4000:]
    uninterrupted = final_run(first / "out")
    history = json.loads((first / "out" / "trainer_state.json").read_text())["log_history"]
    assert any("eval_ema_accuracy" in entry and "eval_accuracy" in entry for entry in history)
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(first / "out" / "checkpoint-8", out / "checkpoint-8")
    assert (out / "checkpoint-8" / "ema.safetensors").is_file()
    result = run_finetune_script("--recipe", str(recipe), "--output_dir", str(out), "--resume", cwd=first)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_run(final_run(out), uninterrupted)
