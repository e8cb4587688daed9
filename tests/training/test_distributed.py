"""Several processes: a tiny recipe launched with two CPU processes (gloo) through accelerate, and resumed from a
checkpoint in the middle of an epoch to the same result bit for bit."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO, write_tiny_recipe

# 96 images, batch 16 per process, 2 processes: 3 steps per epoch; checkpoints 2, 4, 6, 8 (2 and 4 mid-epoch).
# Random crops and dropout, both drawn in each process; the final model is the last one.
SETTINGS = {
    "num_train_epochs": 3,
    "save_strategy": "steps",
    "save_steps": 2,
    "save_total_limit": None,
    "load_best_model_at_end": False,
    "hidden_dropout_prob": 0.1,
    "crop_scale_min": 0.5,
}


def final_metrics(path: Path) -> dict[str, float]:
    return {
        k: v for k, v in json.loads(path.read_text()).items() if "runtime" not in k and "per_second" not in k
    }


def launch_two_processes(recipe: Path, cwd: Path, *args: str) -> str:
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
        str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true", *args,
    ]  # fmt: skip
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    return log


def test_two_cpu_processes_and_an_exact_resume(tmp_path):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    log = launch_two_processes(recipe, tmp_path)
    out = tmp_path / "out"
    run = json.loads((out / "vit_ft_run.json").read_text())
    assert run["world_size"] == 2
    # only process 0 wrote the output, once
    assert run["written_by_process"] == 0 and log.count("INFO vit_ft: Finished: ") == 1
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 * 3
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert all(loss == loss and loss < 10 for loss in losses)  # finite and sane
    assert 0.0 <= run["metrics"]["test_accuracy"] <= 1.0

    # resumed from checkpoint-4 alone (one step into the second epoch), with both processes' RNG files
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-4", resumed / "checkpoint-4")
    assert (resumed / "checkpoint-4" / "rng_state_1.pth").is_file()
    launch_two_processes(recipe, tmp_path, "--output_dir", str(resumed), "--resume")
    for name in ("eval_results.json", "test_results.json"):
        assert final_metrics(resumed / name) == final_metrics(out / name)
    history = json.loads((resumed / "trainer_state.json").read_text())["log_history"]
    assert [e["loss"] for e in history if "loss" in e] == losses
    assert (resumed / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_two_processes_into_a_locked_folder_stop_at_once(tmp_path):
    """Process 0 alone takes the output folder's lock; when another run holds it, every process stops with the
    holder named (none waits for a process 0 that has gone)."""
    from vit_ft.utils.lock import output_lock

    recipe = write_tiny_recipe(tmp_path)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
        str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true",
    ]  # fmt: skip
    with output_lock(tmp_path / "out", "the test"):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode != 0, result.stderr[-3000:]
    # each process refuses on its own; the launcher may stop the second as soon as the first exits, before it
    # prints, so at least one line comes back, and every line that does names the holder
    assert 1 <= len(errors) <= 2 and all(
        "is in use by another run" in line and "the test" in line for line in errors
    ), result.stderr[-3000:]
    # the launcher then reports its failed children with its own traceback; the processes print none
    assert "Traceback" not in result.stderr[: result.stderr.rindex("error: ")], result.stderr[-3000:]
    assert not (tmp_path / "out" / "checkpoint-1").exists()
