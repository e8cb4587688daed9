"""Faults a fine-tune meets, each turned into one line that says what happened and how to go on: a full disk
while saving (a checkpoint or the final model), and pickled code in a checkpoint's `.pt` / `.pth` files.

The full disk is recognised however it arrives: an OSError with errno ENOSPC, or safetensors' own error
type wrapping the operating system's `No space left on device` (os error 28).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from transformers.trainer_pt_utils import safe_globals

from ..utils import files
from .checkpoints import newest_complete_checkpoint


def _newest_file(folder: Path) -> Path | None:
    """The file written last under `folder` (the one being written when the disk filled)."""
    files = [path for path in folder.rglob("*") if path.is_file() and not path.name.startswith(".")]
    return max(files, key=lambda path: path.stat().st_mtime_ns, default=None)


def disk_full_error(error: BaseException, output_dir: str | os.PathLike) -> OSError:
    """The one line for a disk that filled while the fine-tune wrote into `output_dir` (`files.disk_full_error`):
    which file, and the last complete checkpoint to resume from."""
    output_dir = Path(output_dir)
    name = getattr(error, "filename", None) or _newest_file(output_dir) or output_dir
    last = newest_complete_checkpoint(output_dir)
    if last:
        state = f"the last complete checkpoint {last} is intact"
        advice = "Free some space, then run the same command with --resume to continue"
    else:
        state, advice = "no checkpoint was complete yet", "Free some space, then run the same command again"
    return files.disk_full_error(name, state, advice)


def _unsafe_globals(path: Path) -> list[str]:
    """What `path` (a torch file) would need beyond tensors and the numpy arrays of RNG states, read without
    unpickling; a file that is not in torch's zip format (a bare pickle) is refused whole."""
    import torch

    if not zipfile.is_zipfile(path):
        return ["a bare pickle, not a file torch.save wrote"]
    with safe_globals():
        try:
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception as error:  # noqa: BLE001 - unreadable: refused, with torch's reason
            return [f"unreadable: {error}"]


def refuse_pickled_code(checkpoint: str | os.PathLike) -> None:
    """Refuse, naming the file, a checkpoint whose `.pt` / `.pth` files hold pickled objects other than tensors
    (what could run code when loaded); nothing is loaded to find out (ValueError)."""
    for path in sorted(Path(checkpoint).glob("*.pt*")):
        if path.suffix in (".pt", ".pth") and (unsafe := _unsafe_globals(path)):
            raise ValueError(
                f"{path} holds pickled objects that are not tensors ({', '.join(unsafe[:3])}), which could run "
                "code when loaded; vit_ft loads none. If you did not write it, delete that checkpoint folder "
                "(--resume then continues from the one before)."
            )


def check_base_checkpoint(model_name_or_path: str | os.PathLike) -> None:
    """Refuse, naming the file, a local starting checkpoint whose safetensors weights are cut short or corrupt,
    or whose pickled weights (`pytorch_model.bin`, `.pt`, `.pth`) hold objects other than tensors (ValueError).
    A Hub id, or a folder not written yet (the built-in pre-training), is left to the loader."""
    folder = Path(model_name_or_path).expanduser()
    if not folder.is_dir():
        return
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as error:  # noqa: BLE001 - safetensors raises its own type for a truncated file
            raise ValueError(
                f"{path} (--model_name_or_path) cannot be read ({' '.join(str(error).split())}): it is cut "
                "short or corrupt. Copy or download the checkpoint again."
            ) from None
    for path in sorted(folder.glob("*")):
        if path.suffix in (".bin", ".pt", ".pth") and (unsafe := _unsafe_globals(path)):
            raise ValueError(
                f"{path} (--model_name_or_path) holds pickled objects that are not tensors "
                f"({', '.join(unsafe[:3])}), which could run code when loaded; vit_ft loads none. Use a "
                "safetensors checkpoint (model.safetensors)."
            )


__all__ = ["check_base_checkpoint", "disk_full_error", "refuse_pickled_code"]
