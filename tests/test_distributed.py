"""Several processes: a tiny recipe launched with two CPU processes (gloo) through accelerate."""

import json
import subprocess
import sys

from .conftest import REPO, write_tiny_recipe


def test_two_cpu_processes(tmp_path):
    recipe = write_tiny_recipe(tmp_path, num_train_epochs=3)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
        str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    out = tmp_path / "out"
    run = json.loads((out / "vit_ft_run.json").read_text())
    assert run["world_size"] == 2
    # only process 0 wrote the output, once
    assert run["written_by_process"] == 0 and log.count("INFO vit_ft: Results in") == 1
    state = json.loads((out / "trainer_state.json").read_text())
    # 96 images, batch 16 per process, 2 processes: 3 steps per epoch
    assert state["global_step"] == 3 * 3
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert all(loss == loss and loss < 10 for loss in losses)  # finite and sane
    assert 0.0 <= run["metrics"]["test_accuracy"] <= 1.0
