"""The output folder of a fine-tune between runs: which checkpoint-* folders are complete, which one `--resume`
continues from, whether the folder may be written (a finished run is not replaced by accident), and what to
print on Ctrl-C. Every process asks the same questions; process 0 alone moves a broken checkpoint aside."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from transformers import TrainingArguments

from ..utils.distributed import broadcast_object
from ..utils.output_dir import check_output_dir as check_folder

logger = logging.getLogger("vit_ft")

_WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from, or None when it can.

    Complete means: trainer_state.json (which Trainer writes last) parses and names the folder's step, and
    the weights file is there and its safetensors header covers the whole file (a cut-short file fails that).
    """
    path = Path(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return "no readable trainer_state.json (the run died while saving it)"
    step = path.name.rsplit("-", 1)[-1]
    if not step.isdigit() or state.get("global_step") != int(step):
        return f"its trainer_state.json is for step {state.get('global_step')}, not {step}"
    weights = [path / name for name in _WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        return "no model.safetensors"
    from safetensors import safe_open

    try:
        with safe_open(str(weights[0]), framework="pt"):
            pass
    except Exception as error:  # safetensors raises its own error type for a truncated or corrupt file
        return f"its weights {weights[0].name} cannot be loaded ({error})"
    return None


def checkpoint_is_complete(path: str | Path) -> bool:
    """Whether `path` is a checkpoint Trainer can resume from (see `checkpoint_problem`)."""
    return checkpoint_problem(path) is None


def _checkpoints_newest_first(output_dir: Path) -> list[Path]:
    found = [p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]), reverse=True)


def newest_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint-* in `output_dir`, moving nothing (None when there is none)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    return next((str(p) for p in _checkpoints_newest_first(output_dir) if checkpoint_is_complete(p)), None)


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint-* in `output_dir`; incomplete ones (the process died while writing them,
    or their weights do not load) are moved aside to `incomplete-checkpoint-*`, so that Trainer never resumes
    from or rotates onto them, and the newest good one is used instead."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    for path in _checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        aside = path.with_name(f"incomplete-{path.name}")
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        logger.warning("%s cannot be resumed from: %s; moved to %s and skipped.", path, problem, aside.name)
    return None


def check_output_dir(training_args: TrainingArguments, overwrite_output_dir: bool = False) -> None:
    """Refuse an output_dir that is a file, or that holds a finished run, unless told to overwrite or resume."""
    resume = training_args.resume_from_checkpoint not in (None, False, "false", "False")
    refusal = (
        "run, whose model this run would replace; pass --overwrite_output_dir to replace it, --resume to "
        "continue it, or another --output_dir."
    )
    check_folder(training_args.output_dir, finished=None if overwrite_output_dir or resume else refusal)


def interrupted_message(output_dir: str | Path) -> str:
    """The one line to print on Ctrl-C: where the last complete checkpoint is, and how to go on (cli.run_tool
    closes the progress bars first)."""
    last = newest_complete_checkpoint(output_dir)
    if last is None:
        return f"interrupted before any checkpoint was saved in {output_dir}. Run the same command again to start over."
    return f"interrupted; the last complete checkpoint is {last}. Run the same command with --resume to continue."


def resolve_resume(training_args: TrainingArguments) -> str | None:
    """The checkpoint to resume from: an explicit path, or the last complete one in output_dir for `--resume`."""
    resume = training_args.resume_from_checkpoint
    if resume in (None, False, "false", "False"):
        return None
    if resume in (True, "true", "True", "last"):
        last = (
            last_complete_checkpoint(training_args.output_dir) if training_args.process_index == 0 else None
        )
        if training_args.world_size > 1:
            last = broadcast_object(last)
        if last is None:
            raise FileNotFoundError(
                f"--resume: no complete checkpoint-* folder in {training_args.output_dir}; start without --resume, "
                "or point --output_dir at the interrupted run."
            )
        return last
    if not checkpoint_is_complete(resume):
        raise FileNotFoundError(
            f"resume_from_checkpoint={resume!r} is not a complete Trainer checkpoint folder."
        )
    return resume


__all__ = [
    "check_output_dir",
    "checkpoint_is_complete",
    "checkpoint_problem",
    "interrupted_message",
    "last_complete_checkpoint",
    "newest_complete_checkpoint",
    "resolve_resume",
]
