"""vit_ft.training.checkpoints: which checkpoint-* folders are complete, which one --resume continues from, and the
line printed on Ctrl-C (the end-to-end resume is in test_resume.py)."""

import json

import torch
from safetensors.torch import save_file

from vit_ft.training.checkpoints import (
    checkpoint_problem,
    interrupted_message,
    last_complete_checkpoint,
    newest_complete_checkpoint,
)


def test_truncated_weights_and_the_interrupt_message(tmp_path):
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
