"""What a fine-tune must never do to a user's files, as scripts/finetune.py meets it: two runs into one folder
(the lock), an output folder that is an input, pickled code and cut-short files in checkpoints, a full disk.
Each refusal is one `error:` line, exit 1, no traceback, and the files involved stay byte for byte.

Two runs started together are two processes; every other case runs scripts/finetune.py in this process
(`tests.cli_runner.run_script`: the same script, arguments and working folder, without a fresh interpreter's
imports)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_ft.training.checkpoints import (
    checkpoint_is_complete,
    claim_output_dir,
    last_complete_checkpoint,
    write_checkpoint_record,
)
from vit_ft.utils.run_record import RUN_RECORD_FILE, is_finished

from ..cli_runner import Ran, run_script
from ..conftest import REPO, write_tiny_recipe
from .test_finetune_errors import assert_one_line_error


def run(args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str] | None = None) -> Ran:
    """`python scripts/finetune.py ARGS` in `cwd`, run in this process (capfd: the test's; None in a fixture)."""
    return run_script("scripts/finetune.py", args, capfd, cwd=cwd)


def digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` (symlinks followed) and its SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One tiny recipe's backbone and digits images, shared by the cases (read only)."""
    root = tmp_path_factory.mktemp("run_safety")
    write_tiny_recipe(root)
    return root


def case_recipe(tmp: Path, shared: Path, **overrides) -> Path:
    for name in ("backbone", "digits"):
        if not (tmp / name).exists():
            (tmp / name).symlink_to(shared / name)
    return write_tiny_recipe(tmp, **overrides)


@pytest.mark.long
def test_two_runs_started_together_into_one_folder_one_proceeds(tmp_path, shared):
    recipe = case_recipe(tmp_path, shared, num_train_epochs=3, save_strategy="epoch")
    command = [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", str(recipe)]
    processes = [
        subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(process, process.communicate(timeout=600)[1]) for process in processes]
    codes = sorted(process.returncode for process, _ in results)
    assert codes == [0, 1], [stderr[-2000:] for _, stderr in results]
    process, stderr = next((p, e) for p, e in results if p.returncode == 1)
    winner = next(p for p, _ in results if p.returncode == 0)
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert last.startswith("error: ") and "is in use by another run" in last, last
    assert f"pid {winner.pid} on " in last and "started 20" in last and "another --output_dir" in last
    out = tmp_path / "out"
    assert is_finished(out) and not (out / ".vit_ft.lock").exists()
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert checkpoints and all(checkpoint_is_complete(c) for c in checkpoints)
    run_ids = {json.loads((c / "vit_ft_checkpoint.json").read_text())["run_id"] for c in checkpoints}
    assert len(run_ids) == 1  # every checkpoint is the winner's


class Payload:
    """Pickled code: unpickling it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def cut_short(base: Path) -> None:
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-500])


def pickle_only(base: Path) -> None:
    (base / "model.safetensors").unlink()
    torch.save({"state": Payload(base.parent / "PAYLOAD_RAN")}, base / "pytorch_model.bin")


# id -> (arguments, where {tmp} is the case folder; the folder whose files must stay as they were; what to do
# to the starting checkpoint `base` first; the words of the error)
INSIDE = "is inside the input folder"
REFUSALS = {
    "output is the starting checkpoint": (["--output_dir", "{tmp}/base"], "base", None, INSIDE),
    "output inside the starting checkpoint": (["--output_dir", "{tmp}/base/run"], "base", None, INSIDE),
    "output is the train folder": (["--output_dir", "{tmp}/digits/train"], "digits", None, INSIDE),
    "output inside the test folder": (["--output_dir", "{tmp}/digits/test/out"], "digits", None, INSIDE),
    "sweep into the starting checkpoint": (
        ["--output_dir", "{tmp}/base", "--sweep", "learning_rate=0.001,0.003"],
        "base",
        None,
        INSIDE,
    ),
    "starting checkpoint cut short": (
        [],
        "base",
        cut_short,
        "model.safetensors (--model_name_or_path) cannot be read",
    ),
    "starting checkpoint pickle only": (
        [],
        "base",
        pickle_only,
        "pytorch_model.bin (--model_name_or_path) holds pickled objects that are not tensors (posix.system)",
    ),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory, shared) -> dict[str, tuple[Ran, Path, dict, dict]]:
    """Every refusal case run once: {id: (result, case folder, digests before, after)}."""
    root = tmp_path_factory.mktemp("refusals")
    jobs = {}
    for i, (case, (args, kept, damage, _)) in enumerate(REFUSALS.items()):
        tmp = root / f"case{i}"
        tmp.mkdir()
        shutil.copytree(shared / "backbone", tmp / "base")
        if damage is not None:
            damage(tmp / "base")
        recipe = case_recipe(tmp, shared, model_name_or_path=str(tmp / "base"))
        args = ["--recipe", str(recipe), *[arg.replace("{tmp}", str(tmp)) for arg in args]]
        jobs[case] = (args, tmp, digests(tmp / kept))
    return {
        case: (run(args, tmp), tmp, before, digests(tmp / REFUSALS[case][1]))
        for case, (args, tmp, before) in jobs.items()
    }


@pytest.mark.parametrize("case", list(REFUSALS))
def test_an_input_is_never_an_output_nor_a_broken_start_loaded(refusals, case):
    result, tmp, before, after = refusals[case]
    assert_one_line_error(result, REFUSALS[case][3])
    assert after == before  # byte for byte
    assert not (tmp / "PAYLOAD_RAN").exists() and not (tmp / "out" / "model.safetensors").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, shared) -> Path:
    """A finished tiny run with a checkpoint at each of its 4 epochs (every file recorded)."""
    tmp = tmp_path_factory.mktemp("finished")
    recipe = case_recipe(tmp, shared, num_train_epochs=4, save_strategy="epoch", max_train_samples=32)
    result = run(["--recipe", str(recipe)], cwd=tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "out"


def copy_run(finished_run: Path, tmp_path: Path, shared: Path) -> tuple[Path, Path, list[Path]]:
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    (out / RUN_RECORD_FILE).unlink()  # killed after its last checkpoint: a finished run has nothing to resume
    recipe = case_recipe(tmp_path, shared, num_train_epochs=4, save_strategy="epoch", max_train_samples=32)
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) >= 2
    return out, recipe, checkpoints


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
def test_resume_falls_back_from_cut_short_optimizer_or_scheduler_state(
    finished_run, tmp_path, shared, name, capfd
):
    out, recipe, checkpoints = copy_run(finished_run, tmp_path, shared)
    newest, good = checkpoints[-1], checkpoints[-2]
    (newest / name).write_bytes((newest / name).read_bytes()[:-100])
    result = run(["--recipe", str(recipe), "--resume"], tmp_path, capfd)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert f"{newest.name} cannot be resumed from: its {name} is not the file run" in log
    assert (out / f"incomplete-{newest.name}").is_dir() and checkpoint_is_complete(good)
    assert is_finished(out)


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth"])
def test_pickled_code_in_a_checkpoint_is_refused_and_named(finished_run, tmp_path, shared, name, capfd):
    """Even with the checkpoint's record rewritten to match (a deliberate tamper), nothing is unpickled."""
    out, recipe, checkpoints = copy_run(finished_run, tmp_path, shared)
    newest = checkpoints[-1]
    marker = tmp_path / "PAYLOAD_RAN"
    torch.save({"state": Payload(marker)}, newest / name)
    write_checkpoint_record(newest, "tampered", int(newest.name.split("-")[1]))
    before = digests(out)
    result = run(["--recipe", str(recipe), "--resume"], tmp_path, capfd)
    assert_one_line_error(result, f"{newest / name} holds pickled objects that are not tensors")
    assert "posix.system" in result.stderr and not marker.exists()
    assert digests(out) == before


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    return mounted.returncode == 0


def test_a_full_disk_while_checkpointing_is_one_line_and_resume_finishes(tmp_path, shared, capfd):
    """On a small tmpfs: room for one checkpoint, not two. Skipped where tmpfs cannot be mounted (not root)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "560k"):
        pytest.skip("mounting a small tmpfs needs root (mount -t tmpfs); this machine does not allow it")
    try:
        settings = {"num_train_epochs": 2, "save_strategy": "steps", "save_steps": 2, "max_train_samples": 32}
        recipe = case_recipe(tmp_path, shared, output_dir=str(disk / "out"), **settings)
        result = run(["--recipe", str(recipe)], tmp_path, capfd)
        assert_one_line_error(result, "no space left on the disk holding")
        last = result.stderr.strip().splitlines()[-1]
        assert f"the last complete checkpoint {disk / 'out' / 'checkpoint-2'} is intact" in last, last
        assert "run the same command with --resume" in last
        # free space: the same folder, elsewhere
        shutil.copytree(disk / "out", tmp_path / "out")
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    result = run(
        ["--recipe", str(recipe), "--output_dir", str(tmp_path / "out"), "--resume"], tmp_path, capfd
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert is_finished(tmp_path / "out") and last_complete_checkpoint(tmp_path / "out")


def test_a_users_files_of_the_fine_tunes_names_are_refused_and_their_neighbours_kept(tmp_path, shared, capfd):
    """A folder that holds no run but a README.md and config.json of the user's: refused in one line, nothing
    changed; with --overwrite_output_dir those are replaced and the user's other files kept; a run stopped
    before its first checkpoint (its augmentations.png written) starts again without being asked."""
    recipe = case_recipe(tmp_path, shared, max_steps=1, num_train_epochs=0)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes on this folder")
    (out / "config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    (out / "examples").mkdir()
    before = digests(out)
    refused = run(["--recipe", str(recipe), "--output_dir", str(out)], tmp_path, capfd)
    assert_one_line_error(refused, f"{out} holds examples/, where a fine-tune writes its own; pass --overwrite_output_dir")
    (out / "examples").rmdir()
    refused = run(["--recipe", str(recipe), "--output_dir", str(out)], tmp_path, capfd)
    assert_one_line_error(
        refused, f"{out} holds README.md, config.json, not written there by vit_ft finetune; pass "
        "--overwrite_output_dir to replace them (the folder's other files are kept)"
    )  # fmt: skip
    assert digests(out) == before and not (out / ".vit_ft_outputs.json").exists()

    notes = (out / "notes.txt").stat().st_mtime_ns
    replaced = run(["--recipe", str(recipe), "--output_dir", str(out), "--overwrite_output_dir"], tmp_path, capfd)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine" and (out / "notes.txt").stat().st_mtime_ns == notes
    assert is_finished(out) and "my notes" not in (out / "README.md").read_text()

    stopped = tmp_path / "stopped"  # as a run killed before its first checkpoint leaves its folder
    claim_output_dir(stopped)
    (stopped / "augmentations.png").write_bytes(b"")
    again = run(["--recipe", str(recipe), "--output_dir", str(stopped)], tmp_path, capfd)
    assert again.returncode == 0, again.stderr[-3000:]
    assert is_finished(stopped)
