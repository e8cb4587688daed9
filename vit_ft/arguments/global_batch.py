"""The global batch: images per optimizer step over all processes. `global_batch_size` is the recipe's statement
of it; the accumulation is derived from it and the launch's world size before any TrainingArguments is built
(`resolve_global_batch`, part of `merge.merge_values`), and the batch Trainer will take is stated as the run
record's `batch` and one log line (`batch_record`, `describe_batch`). That the built arguments make it is
`checks.check_global_batch`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .checks import RecipeError
from .ranges import RANGES

if TYPE_CHECKING:
    from transformers import TrainingArguments


def launch_world_size(environ: dict[str, str] | None = None) -> int:
    """The processes of this launch, before any TrainingArguments exists: WORLD_SIZE (torchrun and `accelerate
    launch` set it), else the processes of an accelerate state already set up in this process, else 1."""
    environ = os.environ if environ is None else environ
    try:
        return max(1, int(environ["WORLD_SIZE"]))
    except (KeyError, ValueError):
        pass
    from accelerate.state import PartialState

    return PartialState().num_processes if PartialState._shared_state else 1


def _default_per_device_batch() -> int:
    """TrainingArguments' own default per-device batch (where neither recipe nor flag sets one)."""
    from transformers import TrainingArguments

    return TrainingArguments.__dataclass_fields__["per_device_train_batch_size"].default


def resolve_global_batch(values: dict[str, Any], given: set[str], world_size: int | None = None) -> dict[str, Any]:
    """`values` with `gradient_accumulation_steps` derived from `global_batch_size` (when set): global /
    (per_device_train_batch_size x world size), the world size the launch's (`launch_world_size`). Refused in one
    line when it does not divide, or when an accumulation in `given` (a flag or recipe key) disagrees; one that
    agrees is kept. Unset: `values` unchanged (the global batch is then per device x processes x accumulation)."""
    total = values.get("global_batch_size")
    if total is None or not RANGES["global_batch_size"].allows(total):
        return values  # unset, or a bad number the dataclass refuses by its range
    per_device = values.get("per_device_train_batch_size", _default_per_device_batch())
    if not RANGES["per_device_train_batch_size"].allows(per_device):
        return values
    world = launch_world_size() if world_size is None else world_size
    per_step = per_device * world
    if total % per_step:
        fits = [size for size in range(per_device, 0, -1) if total % (size * world) == 0]
        hint = f"--per_device_train_batch_size {fits[0]}" if fits else f"a number of processes that divides {total}"
        raise RecipeError(
            f"global_batch_size={total} is not a multiple of per_device_train_batch_size {per_device} x {world} "
            f"process{'es' if world != 1 else ''} = {per_step}; use {hint} (or a global_batch_size that is a multiple "
            f"of {per_step}), so that every optimizer step sees {total} images."
        )
    accumulation = total // per_step
    stated = values.get("gradient_accumulation_steps")
    if "gradient_accumulation_steps" in given and stated is not None and stated != accumulation:
        raise RecipeError(
            f"gradient_accumulation_steps={stated} disagrees with global_batch_size={total}: {per_device} per device "
            f"x {world} process{'es' if world != 1 else ''} needs {accumulation}; drop gradient_accumulation_steps "
            f"(it is derived), or set --global_batch_size {per_step * stated} (none: no global batch, the "
            "accumulation as given)."
        )
    return {**values, "gradient_accumulation_steps": accumulation}


def batch_record(args: TrainingArguments) -> dict[str, Any]:
    """World size, per-device batch, accumulation and the global batch they make as transformers counts it
    (`train_batch_size`: a process's batch, x its GPUs where one process drives several), the run record's `batch`;
    `global_batch_size` is the recipe's statement of it, None where the recipe stated none."""
    accumulation = args.gradient_accumulation_steps
    return {
        "world_size": args.world_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": accumulation,
        "global_batch": args.train_batch_size * args.world_size * accumulation,
        "global_batch_size": getattr(args, "global_batch_size", None),
    }


def describe_batch(args: TrainingArguments) -> str:
    """The batch in one log line: global = per device x processes x accumulation, and where it came from."""
    record = batch_record(args)
    source = (
        f"global_batch_size: {record['global_batch_size']}, the accumulation derived"
        if record["global_batch_size"] is not None
        else "no global_batch_size: it grows with the number of processes"
    )
    return (
        f"Batch: global {record['global_batch']} = {record['per_device_train_batch_size']} per device x "
        f"{record['world_size']} process{'es' if record['world_size'] != 1 else ''} (world size) x "
        f"{record['gradient_accumulation_steps']} accumulation step"
        f"{'s' if record['gradient_accumulation_steps'] != 1 else ''} ({source})."
    )


__all__ = ["batch_record", "describe_batch", "launch_world_size", "resolve_global_batch"]
