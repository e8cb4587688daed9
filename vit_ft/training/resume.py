"""What `--resume` may change. Each checkpoint records the settings its run trained with (`run_settings`: the
resolved values of the three argument dataclasses, the number of processes, the class names and the data's
fingerprints), in its `vit_ft_checkpoint.json`; a resumed run compares its own with them after the data is loaded
and before the model is built or any step runs (`check_resume`).

May change, applied and stated in one log line each (`resume: logging_steps 10 -> 5`), by this allow-list:
- `FREE`: what only says when to log, evaluate and save (the logging / eval / save strategy, steps and limits),
  how batches are loaded (dataloader workers, pinning, prefetch), the evaluation batch size, where results go and
  who hears of them (output_dir, report_to, run_name, the Hub push, log levels, progress bars), the model cache,
  how the output is saved (merge_lora) and the test split (evaluated once, after training);
  a streamed run (`streaming: true`) keeps its number of workers (`STREAM_FIXED`: each reads its own share);
- `GROW`: `max_steps` and `num_train_epochs`, to a larger value only (training goes on longer; a decaying
  learning-rate schedule stretches to the new end, as the Trainer builds it from this run's arguments).

Everything else the weights depend on is refused, in one line naming each field with its old -> new value:
learning rate, schedule, warmup, optimizer, weight decay, seed, image size, model, batch size, number of
processes, augmentation, LoRA, the classes, the training and validation data (their `datasets` fingerprints,
from the paths and files the data layer read; a moved or edited folder is other data), and any field not named
above (a field a later vit_ft adds is refused until it is placed here).

transformers' Trainer itself only warns when logging_steps, eval_steps, save_steps or the training batch size differ
from the checkpoint's trainer_state.json (`trainer_utils.compare_trainer_and_checkpoint_args`), and then keeps
the checkpoint's steps; `callbacks.StepsFromArguments` makes the new cadence apply. A checkpoint from a vit_ft
that recorded no settings is compared on what its trainer_state.json holds (those four), with a line saying that
the rest could not be compared.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import datasets
from transformers import TrainingArguments

from .checkpoints import CHECKPOINT_RECORD, SETTINGS_KEY

logger = logging.getLogger("vit_ft")

FREE = frozenset(
    {
        # when to log, evaluate and save
        "logging_strategy", "logging_steps", "logging_first_step", "logging_nan_inf_filter", "log_on_each_node",
        "eval_strategy", "eval_steps", "eval_delay", "eval_on_start", "save_strategy", "save_steps",
        "save_total_limit", "save_on_each_node", "save_only_model", "enable_jit_checkpoint",
        # how batches are loaded, and evaluation's batches
        "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
        "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "per_device_eval_batch_size",
        "eval_accumulation_steps", "eval_do_concat_batches", "eval_use_gather_object", "batch_eval_metrics",
        # where results go and who hears of them
        "output_dir", "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
        "trackio_static_space_id", "log_level", "log_level_replica", "disable_tqdm", "skip_memory_metrics",
        "include_num_input_tokens_seen", "push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo",
        "hub_always_push", "hub_revision", "do_train", "do_eval", "do_predict", "ddp_timeout",
        "cache_dir", "pretrain_if_missing", "merge_lora", "test_dir", "test_split", "bank_max_images",
        # a restatement: what it sets (the accumulation, per-device batch, world size) is compared itself
        "global_batch_size",
    }
)  # fmt: skip
GROW = ("max_steps", "num_train_epochs")
# free, except for a stream: its DataLoader workers each read their own share of the shards, so another number of
# them reads the resumed pass in another order (`data.streaming.TrainStream`)
STREAM_FIXED = frozenset({"dataloader_num_workers"})
# not recorded: a secret, a value that differs between the processes of one run, and how this run starts
_NOT_RECORDED = frozenset({"hub_token", "local_rank", "resume_from_checkpoint"})
_PATHS = (
    "model_name_or_path", "teacher_model_name_or_path", "train_dir", "validation_dir", "test_dir", "output_dir",
    "cache_dir", "exclude",
)  # fmt: skip


def _json_value(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples as lists, anything else JSON lacks as its text)."""
    return json.loads(json.dumps(value, default=str))


def _resolved(name: str, value: Any) -> Any:
    """A local folder as its real path (a symlink or a relative path names the same folder), else the value."""
    if name in _PATHS and isinstance(value, str) and value and Path(value).expanduser().exists():
        return str(Path(value).expanduser().resolve())
    return value


def resolved_arguments(model_args: Any, data_args: Any, training_args: TrainingArguments) -> dict[str, Any]:
    """The three argument dataclasses' values by field name (their recipe keys), as JSON holds them, and the
    number of processes (`world_size`: the global batch and each process's share depend on it)."""
    values = {
        **{f.name: getattr(model_args, f.name) for f in dataclasses.fields(model_args)},
        **{f.name: getattr(data_args, f.name) for f in dataclasses.fields(data_args)},
        **training_args.to_dict(),  # enums as their values, tokens hidden
        "world_size": training_args.world_size,
    }
    return {
        name: _json_value(_resolved(name, value)) for name, value in values.items() if name not in _NOT_RECORDED
    }


def run_settings(
    model_args: Any,
    data_args: Any,
    training_args: TrainingArguments,
    names: list[str],
    splits: datasets.DatasetDict,
) -> dict[str, Any]:
    """What a checkpoint records of its run: the resolved arguments, the class names, and the fingerprints of the
    train and validation splits as loaded (`datasets.Dataset._fingerprint`: a hash of where the files are and of
    every operation since, kept by `datasets`; nothing is read again to compute it)."""
    data = {name: getattr(splits[name], "_fingerprint", None) for name in ("train", "validation") if name in splits}
    if getattr(data_args, "exclude_applied", None):  # an edited exclude file is other data, even at one path
        data["exclude"] = data_args.exclude_applied["sha256"]
    return {
        "arguments": resolved_arguments(model_args, data_args, training_args),
        "classes": list(names),
        "data": data,
    }


def _shown(value: Any) -> str:
    """A value as the line shows it: text quoted, a long list cut short, the rest as JSON (null, true)."""
    if isinstance(value, list):
        text = ", ".join(_shown(item) for item in value[:8] if len(value) <= 8 or item in value[:4])
        return f"[{text}]" if len(value) <= 8 else f"[{text}, ... ({len(value)} in all)]"
    return repr(value) if isinstance(value, str) else json.dumps(value)


def _class_difference(old: list[str], new: list[str]) -> str:
    if sorted(old) == sorted(new):
        return f"classes differ in order: {_shown(old)} -> {_shown(new)}"
    gone, added = [n for n in old if n not in new], [n for n in new if n not in old]
    parts = [f"{len(old)} -> {len(new)}"]
    if gone:
        parts.append(f"not in the new data: {_shown(gone)}")
    if added:
        parts.append(f"new: {_shown(added)}")
    return f"classes differ ({', '.join(parts)})"


def _planned_end(state: dict[str, Any]) -> str:
    return f"the checkpoint is at step {state.get('global_step')} of {state.get('max_steps')}"


def _growth_problem(name: str, old: Any, new: Any, state: dict[str, Any]) -> str | None:
    """Why changing `max_steps` / `num_train_epochs` from `old` to `new` is refused, or None (a larger value)."""
    if name == "max_steps":
        old_steps = old if isinstance(old, int) and old > 0 else None  # -1: the epochs decide the end
        new_steps = new if isinstance(new, int) and new > 0 else None
        if new_steps is None:
            return f"max_steps {old} -> {new} (only a larger max_steps may change on resume)"
        floor = old_steps if old_steps is not None else state.get("max_steps") or 0
        if new_steps < floor or new_steps <= (state.get("global_step") or 0):
            return f"max_steps {old} -> {new} ({_planned_end(state)}; only a larger max_steps may change)"
        return None
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and new >= old:
        return None
    return f"{name} {old} -> {new} ({_planned_end(state)}; only a larger {name} may change)"


def _state_differences(
    training_args: TrainingArguments, state: dict[str, Any], applied: list[str], refused: list[str]
) -> None:
    """What the checkpoint's trainer_state.json records (the Trainer's own comparison): the logging / eval /
    save steps (applied) and the training batch size (refused)."""
    for name in ("logging_steps", "eval_steps", "save_steps"):
        new = getattr(training_args, name)
        if new is not None and state.get(name) is not None and new >= 1 and new != state[name]:
            applied.append(f"{name} {_shown(state[name])} -> {_shown(new)}")
    batch = state.get("train_batch_size")
    new_batch = training_args.per_device_train_batch_size * max(1, training_args.n_gpu)
    if batch is not None and batch != new_batch:
        refused.append(f"per_device_train_batch_size {batch // max(1, training_args.n_gpu)} -> "
                       f"{training_args.per_device_train_batch_size}")  # fmt: skip


def compare_settings(
    recorded: dict[str, Any], new: dict[str, Any], state: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """(applied, refused): `old -> new` of each field that differs between a checkpoint's `run_settings` and
    this run's, split by the module's allow-list; `state` is the checkpoint's trainer_state.json."""
    applied, refused = [], []
    old_args, new_args = recorded.get("arguments") or {}, new["arguments"]
    for name in [name for name in new_args if name in old_args]:  # a field one vit_ft lacks is not compared
        old, value = old_args[name], new_args[name]
        if old == value:
            continue
        line = f"{name} {_shown(old)} -> {_shown(value)}"
        if name in FREE and not (name in STREAM_FIXED and new_args.get("streaming")):
            applied.append(line)
        elif name in GROW and (problem := _growth_problem(name, old, value, state)) is not None:
            refused.append(problem)
        elif name in GROW:
            schedule = new_args.get("lr_scheduler_type")
            if schedule not in (None, "constant", "constant_with_warmup"):  # the scheduler's state keeps its step
                line += f" (the {schedule} learning-rate schedule now runs to the new last step)"
            applied.append(line)
        else:
            refused.append(line)
    if recorded.get("classes") is not None and recorded["classes"] != new["classes"]:
        refused.append(_class_difference(recorded["classes"], new["classes"]))
    for split, fingerprint in (recorded.get("data") or {}).items():
        if fingerprint != new["data"].get(split):
            refused.append(f"{split} data differs (fingerprint {fingerprint} -> {new['data'].get(split)})")
    return applied, refused


def check_resume(checkpoint: str | Path, training_args: TrainingArguments, settings: dict[str, Any]) -> None:
    """Compare this run's `settings` (`run_settings`) with those `checkpoint` recorded, before any step: log one
    `resume: <field> old -> new` line for each allowed change (the Trainer takes them from this run's arguments),
    raise ValueError naming every other difference in one line."""
    checkpoint = Path(checkpoint)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    record = json.loads((checkpoint / CHECKPOINT_RECORD).read_text())
    recorded = record.get(SETTINGS_KEY)
    applied: list[str] = []
    refused: list[str] = []
    if recorded is None:
        logger.warning(
            "resume: %s records no settings (an older vit_ft wrote it): the arguments, classes and data could not "
            "be compared with this run's; only trainer_state.json's steps and batch size are.",
            checkpoint.name,
        )
        _state_differences(training_args, state, applied, refused)
    else:
        applied, refused = compare_settings(recorded, settings, state)
    if refused:
        raise ValueError(
            f"--resume from {checkpoint}: this run differs from the checkpoint's in what the weights depend on: "
            f"{'; '.join(refused)}. Resume with the checkpoint's values, or start a new run (another "
            "--output_dir, or --overwrite_output_dir without --resume)"
        )
    for line in applied:
        logger.info("resume: %s", line)


__all__ = [
    "FREE",
    "GROW",
    "STREAM_FIXED",
    "check_resume",
    "compare_settings",
    "resolved_arguments",
    "run_settings",
]
