"""The one check of the model and data a command is given (the tools' `--model` and `--dataset`, the demo's
model, the fine-tune's model_name_or_path and dataset_name: `check_sources`, unless `pretrain_if_missing` builds
a missing model), before the command loads anything: `vit-ft <command>` runs it before importing the command (so
that a mistyped folder fails in well under a second), and every command's own function runs it again
(scripts/*.py, tests).

- a local path that does not exist, or (with HF_HUB_OFFLINE=1) a Hub id of which the Hub cache holds nothing:
  one line naming it and the closest folder (`utils.hub_ids.check_reference`: the path rule, the did-you-mean,
  the cache, and a Hub id looked up once online, without huggingface_hub's retries);
- a fine-tune output folder with no model in it (the run is still going, or stopped before saving): one line
  naming the run that holds its lock, or its last complete checkpoint, and `--resume` / `--model <checkpoint>`.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..utils.hub_ids import TRAINED_MODEL, check_reference
from ..utils.lock import LOCK_FILE, lock_holder
from ..utils.logs import setup_logging
from ..utils.run_record import RUN_RECORD_FILE, read_run_record

MODEL_FLAGS = ("--model",)
# what makes a folder a model vit_ft can load (a model's weights, sharded or not, or a LoRA adapter)
MODEL_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_config.json",
    "adapter/adapter_config.json",
)
EXPECTED = TRAINED_MODEL
FINETUNE_EXPECTED = "a checkpoint folder or a Hub id (e.g. google/vit-base-patch16-224-in21k)"
TEACHER_EXPECTED = "a fine-tuned classifier's folder or Hub id (vit-ft finetune --recipe digits makes outputs/digits)"
DATASET_EXPECTED = "an image folder, a save_to_disk folder or a Hub dataset id"


class UnfinishedModelFolder(FileNotFoundError):
    """A fine-tune's output folder that holds no model yet."""


def model_flags(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The (flag, value) pairs of `--model X` / `--model=X` in `argv`."""
    found = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in MODEL_FLAGS:
            if eq:
                found.append((flag, value))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found.append((flag, argv[i + 1]))
    return found


def _is_run_folder(path: Path) -> bool:
    """A fine-tune's output folder: its lock, run record or checkpoints are there."""
    return (
        (path / LOCK_FILE).exists()
        or (path / RUN_RECORD_FILE).exists()
        or any(p.is_dir() for p in path.glob("checkpoint-*"))
    )


def unfinished_folder_message(path: str | os.PathLike, flag: str = "--model") -> str | None:
    """Why `path`, a fine-tune output folder without a model in it, cannot be loaded, and what to do; None when
    it is not one (a model folder, or some other folder transformers will report on)."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or any((folder / name).is_file() for name in MODEL_FILES):
        return None
    if not _is_run_folder(folder):
        return None
    holder = lock_holder(folder)
    from ..training.checkpoints import newest_complete_checkpoint  # transformers: only for such a folder

    last = newest_complete_checkpoint(folder)
    use_last = f"pass {flag} {last} (its last complete checkpoint)" if last else None
    if holder is not None:
        return (
            f"{flag} {path}: no model.safetensors yet: a fine-tune is still writing there ({holder}); wait for it "
            "to end" + (f", or {use_last}" if use_last else "") + "."
        )
    record = read_run_record(folder) or {}
    resume = f"vit-ft finetune --recipe {record.get('recipe') or '<its recipe>'} --output_dir {path} --resume"
    if last is not None:
        return (
            f"{flag} {path}: the fine-tune there did not finish (no model.safetensors); continue it with "
            f"{resume}, or {use_last}."
        )
    return (
        f"{flag} {path}: the fine-tune there did not finish (no model.safetensors, no complete checkpoint); run "
        "it again, or pass a finished model folder."
    )


def check_model(
    name: str | os.PathLike,
    flag: str = "--model",
    cache_dir: str | None = None,
    expected: str = EXPECTED,
    file_ok: bool = False,
) -> None:
    """One line (FileNotFoundError / NotADirectoryError / ConnectionError) when `name` is a missing local path
    (naming the closest folder), a Hub id offline mode has nothing of, an unfinished fine-tune output folder, or
    a Hub id that the Hub cannot be asked about; a file is refused unless `file_ok` (the fine-tune reads a JAX
    .npz; the tools read folders)."""
    check_reference(name, f"{flag} {name}", expected, cache_dir=cache_dir, folder=not file_ok)
    check_finished(name, flag)


def check_dataset(name: str | os.PathLike, flag: str = "--dataset", cache_dir: str | None = None) -> None:
    """`check_reference` of a dataset argument: one line when it is a missing folder, or a Hub dataset id offline
    mode has nothing of (or, online, that the Hub does not know or cannot be asked about)."""
    check_reference(name, f"{flag} {name}", DATASET_EXPECTED, repo_type="dataset", cache_dir=cache_dir)


def check_sources(model_args: Any, data_args: Any, training_args: Any) -> None:
    """The fine-tune's model, teacher and Hub dataset, checked as the tools' are (`check_model`, `check_dataset`);
    a model that `pretrain_if_missing` will build may be missing, and is only checked for an unfinished run."""
    name, cache_dir = model_args.model_name_or_path, model_args.cache_dir
    if model_args.pretrain_if_missing is None:
        check_model(name, "model_name_or_path", cache_dir, FINETUNE_EXPECTED, file_ok=True)
    else:
        check_finished(name, "model_name_or_path")
    teacher = getattr(training_args, "teacher_model_name_or_path", None)
    if teacher is not None:
        check_model(teacher, "teacher_model_name_or_path", cache_dir, TEACHER_EXPECTED)
    if data_args.dataset_name:
        check_dataset(data_args.dataset_name, "dataset_name", cache_dir)


def check_finished(path: str | os.PathLike, flag: str = "--model") -> None:
    """UnfinishedModelFolder when `path` is a fine-tune output folder without a model (see
    `unfinished_folder_message`); nothing for anything else."""
    message = unfinished_folder_message(path, flag)
    if message is not None:
        raise UnfinishedModelFolder(message)


def check_model_flags(argv: Sequence[str]) -> None:
    """`check_model` for each `--model` on the command line."""
    for flag, value in model_flags(argv):
        check_model(value, flag)


def run_model_tool(args: argparse.Namespace, tool: str) -> Any:
    """A tool command's run once its flags are parsed: `--model` checked (one line, before anything loads),
    logging set up, then `tool` ("module:function", as an entry point names it; imported only now, so that
    `--help` and a mistyped folder need no torch) called with the flags as its parameters."""
    check_model(args.model)
    setup_logging()
    module, _, function = tool.partition(":")
    return getattr(importlib.import_module(module), function)(**vars(args))


__all__ = [
    "MODEL_FLAGS",
    "UnfinishedModelFolder",
    "check_dataset",
    "check_finished",
    "check_model",
    "check_sources",
    "check_model_flags",
    "model_flags",
    "run_model_tool",
    "unfinished_folder_message",
]
