"""vit_ft.training.checkpoints: which checkpoint-* folders are complete, which one --resume continues from, and the
line printed on Ctrl-C (the end-to-end resume is in test_resume.py)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from vit_ft.training.checkpoints import (
    CHECKPOINT_RECORD,
    checkpoint_problem,
    interrupted_message,
    last_complete_checkpoint,
    newest_complete_checkpoint,
    write_checkpoint_record,
)


def make_checkpoint(folder, step, run_id="run-a"):
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    (folder / "optimizer.pt").write_bytes(b"optimizer state")
    write_checkpoint_record(folder, run_id, step)  # as CheckpointRecordCallback does after each save
    return folder


def test_truncated_weights_and_the_interrupt_message(tmp_path):
    assert "before any checkpoint was saved" in interrupted_message(tmp_path)
    for step in (6, 12):
        make_checkpoint(tmp_path / f"checkpoint-{step}", step)
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-12")
    weights = tmp_path / "checkpoint-12" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "cannot be loaded" in checkpoint_problem(tmp_path / "checkpoint-12")
    assert newest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")  # moves nothing
    assert (tmp_path / "checkpoint-12").is_dir()
    assert "checkpoint-6" in interrupted_message(tmp_path) and "--resume" in interrupted_message(tmp_path)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    assert (tmp_path / "incomplete-checkpoint-12").is_dir()


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda f: (f / "optimizer.pt").write_bytes(b"optimizer"),
            "its optimizer.pt is not the file run run-a wrote",
        ),
        (lambda f: (f / "optimizer.pt").unlink(), "its optimizer.pt is not the file run run-a wrote"),
        (lambda f: (f / "scheduler.pt").write_bytes(b"x"), "scheduler.pt did not come with the checkpoint"),
        (lambda f: (f / CHECKPOINT_RECORD).unlink(), f"no readable {CHECKPOINT_RECORD}"),
        (lambda f: write_checkpoint_record(f, "run-b", 7), f"its {CHECKPOINT_RECORD} is for step 7, not 6"),
    ],
    ids=["file cut short", "file missing", "file of another run", "no record", "record of another step"],
)
def test_a_checkpoint_is_complete_only_with_the_files_one_run_wrote(tmp_path, change, problem):
    folder = make_checkpoint(tmp_path / "checkpoint-6", 6)
    assert checkpoint_problem(folder) is None
    change(folder)
    assert problem in checkpoint_problem(folder)
    assert last_complete_checkpoint(tmp_path) is None
    assert (tmp_path / "incomplete-checkpoint-6").is_dir()


def test_other_processes_rng_states_are_not_required(tmp_path):
    """Under accelerate launch each process writes its own rng_state_N.pth, maybe after process 0's record."""
    folder = make_checkpoint(tmp_path / "checkpoint-6", 6)
    (folder / "rng_state_1.pth").write_bytes(b"process 1")
    assert checkpoint_problem(folder) is None
