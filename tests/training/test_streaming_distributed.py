"""Issue 33's "done when": a streamed webdataset and a streamed parquet dataset fine-tune on 2 processes (gloo,
`accelerate launch` with the 2-CPU-process config) x 2 DataLoader workers, end without a rank hanging (the
launches have a timeout), and a run resumed from the middle checkpoint ends bit for bit where the uninterrupted
2-process run ends (losses, gradient norms and weights).

The webdataset is 5 tar shards of unequal length (5 does not divide by 2 processes: each process keeps every
other example of every shard); the parquet dataset is 6 files of unequal length (3 whole files a process, split
unevenly over its 2 workers)."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO
from ..fake_hub import parquet_bytes
from .test_streaming_finetune import final_run, streamed_recipe, write_shards

PARQUET_SHARDS = (17, 9, 23, 5, 30, 12)  # unequal; 96 rows
SETTINGS = {"max_steps": 4, "save_steps": 2, "per_device_train_batch_size": 4, "logging_steps": 1}


def write_parquet_shards(tmp: Path) -> Path:
    """train-0000{0..5}.parquet and validation-00000.parquet (image structs, int labels) from the shards'
    digits images (written by `streamed_recipe`)."""
    def rows(folder: Path) -> list[dict]:
        files = sorted(folder.glob("*/*.png"))
        return [{"image": {"bytes": p.read_bytes(), "path": p.name}, "label": int(p.parent.name)} for p in files]

    train, validation = rows(tmp / "digits" / "train"), rows(tmp / "digits" / "test")
    return write_shards(tmp / "parquet", train, validation, PARQUET_SHARDS, "parquet", parquet_bytes)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_two_processes(runs: dict[str, tuple[Path, list[str]]], cwd: Path) -> dict[str, str]:
    """Each run (recipe, extra arguments) on 2 CPU processes, all at once (a parquet stream's reader sleeps 5 s
    each time it is closed, datasets' guard for arrow's threads: the launches overlap those waits)."""
    launches = {}
    for name, (recipe, args) in runs.items():
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
            "--main_process_port", str(free_port()),  # launches at once: each its own rendezvous port
            str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe), "--use_cpu", "true", *args,
        ]  # fmt: skip
        launches[name] = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    logs = {}
    try:
        for name, launch in launches.items():
            # a rank left waiting at the end would hang the launch: the timeout makes that a failure
            logs[name] = launch.communicate(timeout=300)[0]
            assert launch.returncode == 0, f"{name}: {logs[name][-4000:]}"
    finally:
        for launch in launches.values():
            if launch.poll() is None:
                launch.kill()
                launch.wait()
    return logs


KINDS = ("webdataset", "parquet")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Per kind, its folder: out/ (the uninterrupted run) and killed/ (resumed from out's checkpoint-2)."""
    folders = {kind: tmp_path_factory.mktemp(kind) for kind in KINDS}
    parquet = {"dataset_name": str(folders["parquet"] / "parquet"), "image_column": "image",
               "label_column": "label"}  # fmt: skip
    recipes = {kind: streamed_recipe(folders[kind], **SETTINGS, **(parquet if kind == "parquet" else {}))
               for kind in KINDS}  # fmt: skip
    write_parquet_shards(folders["parquet"])  # from the digits images the webdataset shards were written from
    logs = launch_two_processes({kind: (recipes[kind], []) for kind in KINDS}, folders["webdataset"])
    for kind in KINDS:
        (folders[kind] / "launch.log").write_text(logs[kind])
    for kind in KINDS:
        (folders[kind] / "killed").mkdir()
        shutil.copytree(folders[kind] / "out" / "checkpoint-2", folders[kind] / "killed" / "checkpoint-2")
    launch_two_processes(
        {kind: (recipes[kind], ["--output_dir", str(folders[kind] / "killed"), "--resume"]) for kind in KINDS},
        folders["webdataset"],
    )
    return folders


@pytest.mark.long  # two launches of two processes with two workers each, ~100 s: CI's own step
@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_two_workers_stream_and_resume_exactly(runs, kind):
    out, killed = runs[kind] / "out", runs[kind] / "killed"
    run = json.loads((out / "vit_ft_run.json").read_text())
    assert run["world_size"] == 2
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
    assert "Data loading: 2 workers per process" in (runs[kind] / "launch.log").read_text()  # none capped
    assert (killed / "checkpoint-2" / "rng_state_1.pth").is_file()  # both processes' RNG states resumed
    resumed, uninterrupted = final_run(killed), final_run(out)
    assert sorted(resumed["losses"]) == [1, 2, 3, 4]
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["weights"] == uninterrupted["weights"]
