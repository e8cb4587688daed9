"""Interruption: a run killed between checkpoints resumes with --resume and ends where an uninterrupted run ends."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_ft.training import checkpoint_is_complete, last_complete_checkpoint

from .conftest import REPO, run_finetune_script, write_tiny_recipe

SETTINGS = {"num_train_epochs": 4, "save_total_limit": 2, "logging_steps": 2}  # 6 steps per epoch


def final_metrics(out: Path) -> dict[str, float]:
    metrics = json.loads((out / "all_results.json").read_text())
    return {
        k: v
        for k, v in metrics.items()
        if k.startswith(("eval_", "test_")) and "runtime" not in k and "per_second" not in k
    }


def kill_after_first_checkpoint(recipe: Path, cwd: Path, sig: int) -> Path:
    out = cwd / "out"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if (out / "checkpoint-6").is_dir() and checkpoint_is_complete(out / "checkpoint-6"):
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run finished before it could be interrupted"
        os.kill(process.pid, sig)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert not (out / "all_results.json").exists(), "the run was not interrupted"
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, float]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    result = run_finetune_script("--recipe", str(write_tiny_recipe(tmp, **SETTINGS)), cwd=tmp)
    assert result.returncode == 0, result.stderr[-4000:]
    return final_metrics(tmp / "out")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_resumes_to_the_same_result(tmp_path, uninterrupted, sig):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    out = kill_after_first_checkpoint(recipe, tmp_path, sig)
    last = last_complete_checkpoint(out)
    assert last is not None and int(Path(last).name.split("-")[1]) < 24
    result = run_finetune_script("--recipe", str(recipe), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert final_metrics(out) == pytest.approx(uninterrupted, abs=1e-6)


def test_half_written_checkpoint_is_never_resumed_from(tmp_path, uninterrupted):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    out = kill_after_first_checkpoint(recipe, tmp_path, signal.SIGKILL)
    good = Path(last_complete_checkpoint(out))
    # what a death while saving leaves: a newer folder with weights cut short and no trainer_state.json
    broken = out / f"checkpoint-{int(good.name.split('-')[1]) + 6}"
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
    assert final_metrics(out) == pytest.approx(uninterrupted, abs=1e-6)


def test_truncated_weights_and_the_interrupt_message(tmp_path):
    import torch
    from safetensors.torch import save_file

    from vit_ft.training import checkpoint_problem, interrupted_message, newest_complete_checkpoint

    assert "before any checkpoint was saved" in interrupted_message(tmp_path)
    for step in (6, 12):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-12")
    weights = tmp_path / "checkpoint-12" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "cannot be loaded" in checkpoint_problem(tmp_path / "checkpoint-12")
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")  # moves nothing
    assert (tmp_path / "checkpoint-12").is_dir()
    assert "checkpoint-6" in interrupted_message(tmp_path) and "--resume" in interrupted_message(tmp_path)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    assert (tmp_path / "incomplete-checkpoint-12").is_dir()
