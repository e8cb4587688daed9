"""Many nodes, on one host: two `accelerate launch` launchers with recipes/accelerate_configs/multi_node.yaml, machine
ranks 0 and 1 (one CPU process each, gloo, the rendezvous on 127.0.0.1), fine-tune with a DataLoader worker per
process; SIGTERM to both launchers' process groups (what Slurm sends every process of a job step before its time
limit, workers included) stops them at one step with the preemption checkpoint; both launched again with --resume,
the run ends bit for bit where the same recipe ends uninterrupted on one machine of 2 processes (the same world
size: the same sampler shards, RNG files and gradient averages, whatever the machines)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_ft.training.checkpoints import checkpoint_is_complete

from ..conftest import REPO, write_tiny_recipe
from .test_distributed import SETTINGS as DISTRIBUTED_SETTINGS
from .test_distributed import launch_two_processes
from .test_resume import assert_same_run, final_run
from .test_streaming_distributed import free_port

# 96 images, batch 16 per process, 2 processes: 3 steps an epoch, 12 steps, a checkpoint every 2 (random crops
# and dropout, drawn in each process); a persistent worker per process, which the signal reaches too
SETTINGS = {
    **DISTRIBUTED_SETTINGS,
    "num_train_epochs": 4,
    "dataloader_num_workers": 1,
    "dataloader_persistent_workers": True,
}


def launch_machines(recipe: Path, cwd: Path, name: str, *args: str) -> list[subprocess.Popen]:
    """Machine ranks 0 and 1 of a 2-machine job, each launcher in its own session (the signal goes to its group),
    its output in `cwd/name-machineN.log`."""
    port = str(free_port())
    launches = []
    for rank in (0, 1):
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO / "recipes" / "accelerate_configs" / "multi_node.yaml"),
            "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
            "--main_process_ip", "127.0.0.1", "--main_process_port", port,
            str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true", *args,
        ]  # fmt: skip
        with (cwd / f"{name}-machine{rank}.log").open("w") as log:
            launches.append(subprocess.Popen(
                command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            ))  # fmt: skip
    return launches


def wait_for(launches: list[subprocess.Popen], timeout: float) -> list[int]:
    """The launchers' exit statuses; one still running after `timeout` seconds fails the test (a rank hung)."""
    deadline = time.monotonic() + timeout
    try:
        return [launch.wait(timeout=max(1.0, deadline - time.monotonic())) for launch in launches]
    finally:
        for launch in launches:
            if launch.poll() is None:
                os.killpg(launch.pid, signal.SIGKILL)
                launch.wait()


@pytest.mark.slow
def test_two_machines_are_preempted_and_resume_to_the_one_machine_run(tmp_path):
    recipe = write_tiny_recipe(tmp_path, **SETTINGS)
    launch_two_processes(recipe, tmp_path, "--output_dir", str(tmp_path / "one_machine"))

    out = tmp_path / "out"
    launches = launch_machines(recipe, tmp_path, "preempted")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and all(launch.poll() is None for launch in launches):
        if checkpoint_is_complete(out / "checkpoint-2"):
            break
        time.sleep(0.05)
    assert all(launch.poll() is None for launch in launches), "a launcher ended before the signal could be sent"
    for launch in launches:
        os.killpg(launch.pid, signal.SIGTERM)
    wait_for(launches, timeout=120)
    logs = [(tmp_path / f"preempted-machine{rank}.log").read_text() for rank in (0, 1)]
    stops = {line for log in logs for line in log.splitlines() if line.startswith("error: stopped by SIGTERM")}
    # each machine's process printed the same line: the processes agreed on the step to stop at
    assert len(stops) == 1 and all("error: stopped by SIGTERM" in log for log in logs), logs[0][-3000:]
    assert not any("is killed by signal" in log for log in logs), logs[1][-3000:]
    checkpoint = Path(stops.pop().split("the run is saved in ")[1].split(". Run the same")[0])
    assert checkpoint.parent == out and checkpoint_is_complete(checkpoint)
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert int(checkpoint.name.split("-")[1]) < 12 and not (out / "all_results.json").exists()

    launches = launch_machines(recipe, tmp_path, "resumed", "--resume")
    statuses = wait_for(launches, timeout=300)
    assert statuses == [0, 0], (tmp_path / "resumed-machine1.log").read_text()[-4000:]
    assert json.loads((out / "vit_ft_run.json").read_text())["batch"]["world_size"] == 2
    assert "x 2 processes (world size)" in (tmp_path / "resumed-machine0.log").read_text()
    assert_same_run(final_run(out), final_run(tmp_path / "one_machine"))
