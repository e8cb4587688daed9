"""Several processes: how tests launch a recipe on two CPU processes (gloo) through accelerate, and a locked output
folder stopping both at once. The run itself, its global batch, teachers and exact resume are read from one
shared launch: tests/training/test_two_processes.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO, write_tiny_recipe


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


@pytest.mark.long  # a two-process launch of its own: CI's step (the suite's: test_two_processes.py)
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
