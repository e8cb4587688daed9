"""Model files are readable like every other file the run writes: safetensors writes its files 0600 (transformers
5's save_pretrained and Trainer's checkpoints included), which another user or a container cannot read."""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

from vit_ft.utils.files import staged_folder, usual_modes

from .test_pretrain import image_folder, pretrained  # noqa: F401 - the fixtures


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _modes(folder):
    return {path.relative_to(folder).as_posix(): path.stat().st_mode & 0o777
            for path in folder.rglob("*") if path.is_file()}  # fmt: skip


def test_a_fine_tune_output_folder_is_all_of_one_mode(tiny_finetuned_dir):
    modes = _modes(tiny_finetuned_dir)
    assert "model.safetensors" in modes and any(name.startswith("checkpoint-") for name in modes)
    assert set(modes.values()) == {0o666 & ~_umask()}, {k: oct(v) for k, v in modes.items()}


def test_the_pretrained_checkpoint_is_readable(pretrained):  # noqa: F811
    assert (pretrained / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_staged_folders_and_usual_modes(tmp_path):
    with staged_folder(tmp_path / "export") as partial:
        save_file({"w": torch.zeros(2)}, str(partial / "model.safetensors"))
        assert (partial / "model.safetensors").stat().st_mode & 0o777 == 0o600  # what safetensors does
    assert (tmp_path / "export" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    (tmp_path / "kept.safetensors").write_bytes(b"")
    (tmp_path / "kept.safetensors").chmod(0o640)  # a mode someone chose is kept
    usual_modes(tmp_path)
    assert (tmp_path / "a.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (tmp_path / "kept.safetensors").stat().st_mode & 0o777 == 0o640
