"""Interruption: a run killed at a checkpoint in the middle of an epoch resumes with --resume and ends bit for bit
where an uninterrupted run ends: the same metrics, losses and final weights.

The interrupted runs are real processes (a signal is sent to them); each signal's interruption runs once per
module and every test works on its own copy of the folder. The uninterrupted runs and the resumes run
scripts/finetune.py in this process (`tests.cli_runner.run_script`: the same script, arguments and working
folder, without a fresh interpreter's imports)."""

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
import torch

from vit_ft.data.batch_augmentation import BatchAugmentation
from vit_ft.training.checkpoints import checkpoint_is_complete, last_complete_checkpoint

from ..cli_runner import run_script
from ..conftest import REPO, write_tiny_recipe

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


def _group_ended(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def signal_at_checkpoint(command: list[str], cwd: Path, send, env: dict | None = None) -> tuple[int, str]:
    """Start `command` (a fine-tune into cwd/out) in a session of its own, call `send(process)` once
    out/checkpoint-4 is complete (in epoch 1 of 4), and return its exit status and stderr (kept in a file, not a
    pipe nobody reads while the run goes on) once every process of its group has ended."""
    with (cwd / "stderr.txt").open("w") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                                   env=env)  # fmt: skip
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and process.poll() is None:
                if checkpoint_is_complete(cwd / "out" / "checkpoint-4"):
                    break
                time.sleep(0.05)
            assert process.poll() is None, "the run finished before the signal could be sent"
            send(process)
            process.wait(timeout=120)
            while time.monotonic() < deadline and not _group_ended(process.pid):  # a launcher that died first
                time.sleep(0.05)
        finally:
            if not _group_ended(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, (cwd / "stderr.txt").read_text()


def signal_after_first_checkpoint(recipe: Path, cwd: Path, sig: int) -> tuple[int, str]:
    """Start a fine-tune of `recipe` and send its process `sig` once checkpoint-4 is complete."""
    command = [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)]
    return signal_at_checkpoint(command, cwd, lambda process: os.kill(process.pid, sig))


def finetune(cwd: Path, recipe: Path, *args: str, capfd=None) -> Path:
    """`python scripts/finetune.py --recipe RECIPE ARGS` in `cwd`, run in this process; must succeed."""
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe), *args], capfd, cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    return cwd


class Interrupted:
    """A run interrupted by each signal once per module (a real process): `copy(sig, folder)` puts that run's
    recipe and output folder in `folder` (the recipe's output_dir pointing at the copy) and returns (exit
    status, stderr, recipe) for the test to resume or break."""

    def __init__(self, root: Path):
        self.root, self.runs = root, {}

    def copy(self, sig: int, folder: Path) -> tuple[int, str, Path]:
        if sig not in self.runs:
            tmp = self.root / signal.Signals(sig).name
            tmp.mkdir()
            status, stderr = signal_after_first_checkpoint(write_tiny_recipe(tmp, **SETTINGS), tmp, sig)
            assert not (tmp / "out" / "all_results.json").exists(), "the run was not interrupted"
            self.runs[sig] = (status, stderr, tmp / "out")
        status, stderr, out = self.runs[sig]
        folder.mkdir(exist_ok=True)
        shutil.copytree(out, folder / "out", symlinks=True)
        for name in ("backbone", "digits"):  # read, never written: shared
            if not (folder / name).exists():
                (folder / name).symlink_to(out.parent / name)
        return status, stderr, write_tiny_recipe(folder, **SETTINGS)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> Interrupted:
    return Interrupted(tmp_path_factory.mktemp("interrupted"))


@pytest.fixture(scope="module")
def uninterrupted_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return finetune(tmp, write_tiny_recipe(tmp, **SETTINGS)) / "out"


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_dir) -> dict:
    return final_run(uninterrupted_dir)


@pytest.fixture(scope="module")
def resumed_after_sigterm(interrupted, tmp_path_factory) -> Path:
    """The SIGTERM run resumed (the same resume for the kill and the preemption tests below)."""
    tmp = tmp_path_factory.mktemp("resumed_after_sigterm")
    recipe = interrupted.copy(signal.SIGTERM, tmp)[2]
    return finetune(tmp, recipe, "--resume") / "out"


# SIGTERM's save-and-resume is the preemption test's below; the killed SIGTERM run is CI's long step
@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.long)])
def test_killed_run_resumes_to_the_same_result(tmp_path, interrupted, uninterrupted, sig, request):
    interrupted.copy(sig, tmp_path)
    last = last_complete_checkpoint(tmp_path / "out")
    assert last is not None and int(Path(last).name.split("-")[1]) < 24
    if sig == signal.SIGTERM:
        out = request.getfixturevalue("resumed_after_sigterm")
    else:
        out = finetune(tmp_path, tmp_path / "tiny.yaml", "--resume") / "out"
    assert_same_run(final_run(out), uninterrupted)


def test_resume_from_the_middle_of_an_earlier_epoch_is_exact(tmp_path, uninterrupted_dir, uninterrupted):
    """Only checkpoint-8 (2 steps into epoch 2 of 4) in a fresh folder: the skipped batches' crops, the rest of
    the epoch and the later epochs must all be drawn as they were. (The same recipe: the same backbone and image
    folders; a copy of them elsewhere is other data to --resume.)"""
    step = 8
    assert step % STEPS_PER_EPOCH != 0
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(uninterrupted_dir / f"checkpoint-{step}", out / f"checkpoint-{step}")
    recipe = uninterrupted_dir.parent / "tiny.yaml"
    finetune(tmp_path, recipe, "--output_dir", str(out), "--resume")
    assert_same_run(final_run(out), uninterrupted)


def test_half_written_checkpoint_is_never_resumed_from(tmp_path, interrupted, uninterrupted):
    recipe = interrupted.copy(signal.SIGKILL, tmp_path)[2]
    out = tmp_path / "out"
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
    finetune(tmp_path, recipe, "--resume")
    assert_same_run(final_run(out), uninterrupted)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.long)])  # one handler
def test_a_preempted_run_saves_at_the_next_step_and_resumes_to_the_same_result(
    tmp_path, interrupted, uninterrupted, sig, request
):
    """SIGTERM (Slurm, Kubernetes, spot instances) or SIGUSR1 (Slurm's --signal) mid-epoch: a checkpoint at the
    next step, one line naming it, exit 75; --resume then ends bit for bit like the uninterrupted run."""
    status, stderr, _ = interrupted.copy(sig, tmp_path)
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
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
    assert_same_run(final_run(request.getfixturevalue("resumed_after_sigterm")), uninterrupted)


# Every random draw of the fine-tuning toolkit on at once (issue 23): flip, RandAugment, random erasing (noise fill),
# mixup/cutmix with label smoothing (all per batch on the device, issue 33), drop path, EMA (the saved model) and
# layer decay; 2 epochs of 6 steps, checkpoint-8 mid-epoch.
TOOLKIT = {
    **SETTINGS,
    "num_train_epochs": 2,
    "horizontal_flip": True,
    "auto_augment": "randaugment",
    "random_erasing_prob": 0.5,
    "random_erasing_mode": "pixel",
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


def test_resume_with_every_augmentation_drop_path_and_ema_is_exact(tmp_path, monkeypatch):
    """An uninterrupted run, then its checkpoint-8 (2 steps into epoch 2) resumed in a fresh folder: the same
    metrics, losses and final weights (the EMA's), so every draw replays and the EMA comes back from the checkpoint.
    The augmentation runs per batch on the training device, on the workers' uint8 crops."""
    seen = []
    augment = BatchAugmentation.__call__

    def spy(self, batch):
        seen.append((batch["pixel_values"].dtype, self.describe()))
        return augment(self, batch)

    monkeypatch.setattr(BatchAugmentation, "__call__", spy)
    first = tmp_path / "first"
    first.mkdir()
    recipe = write_tiny_recipe(first, **TOOLKIT)
    finetune(first, recipe)
    uninterrupted = final_run(first / "out")
    history = json.loads((first / "out" / "trainer_state.json").read_text())["log_history"]
    assert any("eval_ema_accuracy" in entry and "eval_accuracy" in entry for entry in history)
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(first / "out" / "checkpoint-8", out / "checkpoint-8")
    assert (out / "checkpoint-8" / "ema.safetensors").is_file()
    finetune(first, recipe, "--output_dir", str(out), "--resume")
    assert_same_run(final_run(out), uninterrupted)
    assert len(seen) == 12 + 4  # every training batch of both runs, no evaluation batch
    assert {dtype for dtype, _ in seen} == {torch.uint8}
    assert all(("flip + RandAugment" in text and "erasing" in text and "mixup" in text) for _, text in seen)
