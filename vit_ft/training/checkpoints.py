"""The output folder of a fine-tune between runs: which checkpoint-* folders are complete, which one `--resume`
continues from, whether the folder may be written (a finished run is not replaced by accident, an input is never
an output), and what to print on Ctrl-C. Every process asks the same questions; process 0 alone moves a broken
checkpoint aside.

Each checkpoint gets a record, `vit_ft_checkpoint.json`, written by `CheckpointRecordCallback` right after the
Trainer wrote the checkpoint: the run's id, the step, each file's size and the SHA-256 of its first and last 64 KiB
(a cost per file, not per byte: a checkpoint of ViT-g with AdamW is tens of GB), and the settings the run trained
with (`resume.run_settings`, which `--resume` compares with its own). A checkpoint is complete only if its files
are exactly those one run wrote at that step (a file cut short, rewritten by another run, or a death before the
record, makes it incomplete; a safetensors file's header, which names every tensor's offsets, is in its first
bytes). A record of an older vit_ft (the SHA-256 of whole files) is still checked as written.

The model's state is one of: `model.safetensors` / `adapter_model.safetensors` (DDP, FSDP's FULL_STATE_DICT,
DeepSpeed ZeRO-1/2), FSDP's SHARDED_STATE_DICT folder `pytorch_model_fsdp_0/` (torch.distributed.checkpoint: one
file per process and a `.metadata` its coordinator writes last), or DeepSpeed's `global_step<N>/` folder.

A folder whose run finished has nothing to resume: `--resume` there changes nothing (`finished_run_message`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainingArguments

from ..model import code_files
from ..utils.distributed import broadcast_object
from ..utils.files import usual_modes, write_text_atomically
from ..utils.output_dir import OutputFiles, check_output_dir, record_outputs, written_by
from ..utils.run_record import is_finished

logger = logging.getLogger("vit_ft")

_WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")
FSDP_SHARDED_MODEL = "pytorch_model_fsdp_0"  # Trainer's folder for FSDP's SHARDED_STATE_DICT (process group 0)
CHECKPOINT_RECORD = "vit_ft_checkpoint.json"
SETTINGS_KEY = "run"  # the record's key for the run's settings (`resume.run_settings`)
# the RNG states of processes other than 0, which they write themselves while process 0 writes the record
_OTHER_PROCESSES_FILES = re.compile(r"rng_state_[1-9]\d*\.pth")


_ENDS = 64 * 1024  # bytes read at each end of a file for its record


def _digest(path: Path) -> str:
    """The SHA-256 of a whole file (the records of an older vit_ft)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:  # hashlib.file_digest is Python 3.11's; pyproject allows 3.10
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fingerprint(path: Path) -> list[int | str]:
    """[size, SHA-256 of the first and last 64 KiB]: the same cost for a file of any size."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(_ENDS))
        if size > _ENDS:
            handle.seek(max(_ENDS, size - _ENDS))
            digest.update(handle.read(_ENDS))
    return [size, digest.hexdigest()]


def _recorded_files(folder: Path) -> list[Path]:
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.name != CHECKPOINT_RECORD
        and not _OTHER_PROCESSES_FILES.fullmatch(path.name)
    )


def write_checkpoint_record(
    folder: str | os.PathLike, run_id: str, step: int, settings: dict[str, Any] | None = None
) -> Path:
    """Record that `folder`'s files are the ones run `run_id` wrote at `step` (`_fingerprint`: size and the
    SHA-256 of their ends), and the run's `settings` (`resume.run_settings`) when given, atomically."""
    folder = Path(folder)
    files = {path.relative_to(folder).as_posix(): _fingerprint(path) for path in _recorded_files(folder)}
    record: dict[str, Any] = {"run_id": run_id, "step": step, "files": files}
    if settings is not None:
        record[SETTINGS_KEY] = settings
    return write_text_atomically(folder / CHECKPOINT_RECORD, json.dumps(record, indent=1))


def _record_problem(path: Path, step: int) -> str | None:
    """Why `path`'s files are not all the ones one run wrote at `step`, or None."""
    try:
        record: dict[str, Any] = json.loads((path / CHECKPOINT_RECORD).read_text())
        # an older vit_ft recorded the SHA-256 of whole files
        check, files = (_digest, record["sha256"]) if "sha256" in record else (_fingerprint, record["files"])
        files = {name: list(value) if isinstance(value, list) else value for name, value in dict(files).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable {CHECKPOINT_RECORD} (the run died while saving, or an older vit_ft wrote it)"
    if record.get("step") != step:
        return f"its {CHECKPOINT_RECORD} is for step {record.get('step')}, not {step}"
    for name, recorded in files.items():
        if not (path / name).is_file() or check(path / name) != recorded:
            return f"its {name} is not the file run {record.get('run_id')} wrote (cut short or replaced)"
    extra = [p.name for p in _recorded_files(path) if p.relative_to(path).as_posix() not in files]
    if extra:
        return f"{', '.join(extra)} did not come with the checkpoint (another run wrote into it)"
    return None


class CheckpointRecordCallback(TrainerCallback):
    """Writes each checkpoint's `vit_ft_checkpoint.json` (process 0) as soon as the Trainer has saved it, with
    the run's `settings` (`resume.run_settings`)."""

    def __init__(self, run_id: str, settings: dict[str, Any] | None = None) -> None:
        self.run_id, self.settings = run_id, settings

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            usual_modes(folder)  # safetensors writes 0600; before the record, which vouches for the files
            write_checkpoint_record(folder, self.run_id, state.global_step, self.settings)


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from, or None when it can.

    Complete means: trainer_state.json (which Trainer writes last) parses and names the folder's step, the
    model's state is there (`_model_state_problem`), and `vit_ft_checkpoint.json` vouches for every file (all
    written by one run at that step, none changed since).
    """
    path = Path(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return "no readable trainer_state.json (the run died while saving it)"
    step = path.name.rsplit("-", 1)[-1]
    if not step.isdigit() or state.get("global_step") != int(step):
        return f"its trainer_state.json is for step {state.get('global_step')}, not {step}"
    return _model_state_problem(path, int(step)) or _record_problem(path, int(step))


def _model_state_problem(path: Path, step: int) -> str | None:
    """Why `path` holds no model state to resume from: a weights file whose safetensors header covers the whole
    file (a cut-short file fails that), FSDP's sharded folder with its `.metadata`, or DeepSpeed's
    `global_step<step>/` with its model states; None when it holds one."""
    weights = [path / name for name in _WEIGHT_FILES if (path / name).is_file()]
    if weights:
        from safetensors import safe_open

        try:
            with safe_open(str(weights[0]), framework="pt"):
                pass
        except Exception as error:  # safetensors raises its own error type for a truncated or corrupt file
            return f"its weights {weights[0].name} cannot be loaded ({error})"
        return None
    if (path / FSDP_SHARDED_MODEL / ".metadata").is_file():
        return None
    if any((path / f"global_step{step}").glob("*model_states.pt")):
        return None
    return (
        f"no model state (model.safetensors, FSDP's {FSDP_SHARDED_MODEL}/.metadata or DeepSpeed's "
        f"global_step{step}/)"
    )


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


def run_inputs(model_args: Any, data_args: Any, training_args: Any = None) -> list[str]:
    """What a fine-tune reads and must never write into: the starting checkpoint and the distillation teacher
    when they are local folders, and the image folders (train_dir, validation_dir, test_dir)."""
    folders = [model_args.model_name_or_path, getattr(training_args, "teacher_model_name_or_path", None)]
    folders += [getattr(data_args, name) for name in ("train_dir", "validation_dir", "test_dir")]
    return [str(folder) for folder in folders if folder and Path(folder).expanduser().is_dir()]


# What a fine-tune writes at the top of its output folder (Trainer's results and state, the saved model and its
# code, vit_ft's records and figures; LoRA's adapter is in adapter/): a user's file of one of these names in a
# folder that holds no run is refused unless --overwrite_output_dir, as the tools refuse theirs.
FINETUNE_FILES = OutputFiles(
    "finetune",
    ("README.md", "config.json", "model.safetensors", "preprocessor_config.json", "labels.json",
     *code_files(), "training_args.bin",
     "trainer_state.json", "all_results.json", "train_results.json", "eval_results.json", "test_results.json",
     "training_curves.png", "augmentations.png", "vit_ft_run.json", "sweep.json", "sweep.md", "seeds.json",
     "seeds.md", "feature_bank.safetensors",  # tasks.feature_bank.FEATURE_BANK_FILE (not imported: light)
     "report.md", "ladder.json"),  # method auto: the ladder's report (training.ladder.LADDER_FILES)
    "a fine-tune's model and records",
    overwrite_flag="--overwrite_output_dir",
)  # fmt: skip
_FINETUNE_FOLDERS = ("examples", "adapter", "ladder")  # folders it replaces whole


def _holds_a_run(folder: Path) -> bool:
    """Whether `folder`'s fine-tune files are a run's (its record, a checkpoint, or the fine-tune's claim in the
    folder's output record), not the user's."""
    return (
        (folder / "vit_ft_run.json").is_file()
        or any(folder.glob("checkpoint-*"))
        or any(folder.glob("incomplete-checkpoint-*"))
        or bool(written_by(folder, FINETUNE_FILES.command))
    )


def check_user_files(output_dir: str | os.PathLike, overwrite_output_dir: bool = False) -> None:
    """Refuse (FileExistsError) a folder that holds no run but files or folders of the names a fine-tune writes
    (a user's README.md, config.json, examples/, ...), unless `overwrite_output_dir`; the folder's other files
    are never touched."""
    folder = Path(output_dir).expanduser()
    if overwrite_output_dir or not folder.is_dir() or _holds_a_run(folder):
        return
    taken = [name for name in _FINETUNE_FOLDERS if (folder / name).exists()]
    if taken:
        raise FileExistsError(
            f"{folder} holds {', '.join(name + '/' for name in taken)}, where a fine-tune writes its own; pass "
            "--overwrite_output_dir to replace it (the folder's other files are kept), or another --output_dir."
        )
    FINETUNE_FILES.check(folder)


def claim_output_dir(output_dir: str | os.PathLike) -> None:
    """Record (process 0, once the checks passed) that the fine-tune's files in `output_dir` are a run's, so
    that running again, interrupted before any checkpoint, is not refused as the user's files."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    record_outputs(folder, FINETUNE_FILES.command, FINETUNE_FILES.names)


def check_run_output_dir(
    training_args: TrainingArguments,
    overwrite_output_dir: bool = False,
    inputs: list[str] | None = None,
    in_sweep: bool = False,
) -> None:
    """Refuse an output_dir that is a file, that is or lies inside one of `inputs` (`run_inputs`), or that holds
    a finished run unless told to overwrite (or to resume, which then does nothing: `finished_run_message`).
    `in_sweep`: the folder is one run of a sweep, which a resumed sweep keeps as it is."""
    if in_sweep:
        refusal = (
            "run of this sweep; pass --resume to keep it (a resumed sweep keeps its finished runs), "
            "--overwrite_output_dir to redo it, or another --output_dir."
        )
    else:
        refusal = (
            "run, whose model this run would replace; pass --overwrite_output_dir to replace it, or another "
            "--output_dir."
        )
    check_output_dir(
        training_args.output_dir,
        inputs=inputs or (),
        finished=None if overwrite_output_dir or resumes(training_args) else refusal,
    )
    check_user_files(training_args.output_dir, overwrite_output_dir)


def resumes(training_args: TrainingArguments) -> bool:
    """Whether the run is asked to resume (`--resume`, or resume_from_checkpoint naming a checkpoint)."""
    return training_args.resume_from_checkpoint not in (None, False, "false", "False")


def finished_run_message(training_args: TrainingArguments) -> str | None:
    """The one line for a resume into a folder whose run finished (`run_record.is_finished`), which then
    changes nothing there; None when the run does not resume or its folder holds no finished run."""
    if not resumes(training_args) or not is_finished(training_args.output_dir):
        return None
    return (
        f"{training_args.output_dir}: the run already finished, nothing to resume (its files are kept as they "
        "are). To train it again, pass --overwrite_output_dir without --resume, or another --output_dir."
    )


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
    if not resumes(training_args):
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
    "CHECKPOINT_RECORD",
    "CheckpointRecordCallback",
    "FINETUNE_FILES",
    "FSDP_SHARDED_MODEL",
    "SETTINGS_KEY",
    "check_run_output_dir",
    "check_user_files",
    "claim_output_dir",
    "checkpoint_is_complete",
    "checkpoint_problem",
    "finished_run_message",
    "interrupted_message",
    "last_complete_checkpoint",
    "newest_complete_checkpoint",
    "resolve_resume",
    "resumes",
    "run_inputs",
    "write_checkpoint_record",
]
