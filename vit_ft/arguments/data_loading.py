"""The data's side of the training arguments: the DataLoader's workers (`dataloader_num_workers: auto`, a number
of them per core of this process), pinned memory and persistent workers resolved from the hardware before any
TrainingArguments is built (`resolve_data_loading`, part of `merge.merge_values`), their one log line, and the seed
of everything about the data (`data_seed`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..utils.hardware import auto_dataloader_workers, cores_per_process

if TYPE_CHECKING:
    from transformers import TrainingArguments

AUTO_WORKERS = "auto"  # dataloader_num_workers' value for "one worker per core of this process, less one"
NUM_WORKERS_HELP = (
    "DataLoader worker processes: a number, 0 to load in the main process, or 'auto': one per CPU core of this "
    "process's share (its cores / the processes on this machine), less one for the main process."
)


def parse_num_workers(text: str) -> int | str:
    """`dataloader_num_workers` as a flag or recipe value: 'auto' or a whole number (its range is checked later)."""
    text = str(text).strip()
    return AUTO_WORKERS if text.lower() == AUTO_WORKERS else int(text)


parse_num_workers.__name__ = "'auto' or integer"  # argparse names the type in its error: "invalid <name> value"
parse_num_workers.expects = "auto or a whole number"  # a recipe's bad value says what it expects (recipes.coerce)


def resolve_data_loading(values: dict[str, Any], given: set[str], cuda: bool | None = None) -> dict[str, Any]:
    """`values` with `dataloader_num_workers: auto` resolved to an int (`utils.hardware.auto_dataloader_workers`)
    and, unless set in `given`, pinned memory on where a GPU trains and persistent workers where it trains with
    workers (`cuda`: whether one is present, default torch's answer). Before any TrainingArguments is built, so
    the Trainer's arguments only ever hold the number."""
    values = dict(values)
    if values.get("dataloader_num_workers") == AUTO_WORKERS:
        values["dataloader_num_workers"] = auto_dataloader_workers()
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    gpu = cuda and not values.get("use_cpu", False)
    if "dataloader_persistent_workers" not in given:
        # workers kept between epochs (and evaluations): no start-up of N processes each time the GPU waits
        values["dataloader_persistent_workers"] = gpu and int(values.get("dataloader_num_workers") or 0) > 0
    if "dataloader_pin_memory" not in given:
        # pinned host memory only speeds up copies to a GPU; without one, torch warns about it every epoch
        values["dataloader_pin_memory"] = gpu
    return values


def describe_data_loading(args: TrainingArguments) -> str:
    """The DataLoader settings in one log line, with the cores they were chosen from."""
    workers = args.dataloader_num_workers
    prefetch = args.dataloader_prefetch_factor or 2  # torch's default with workers
    loading = (
        f"prefetch {prefetch} batch{'es' if prefetch != 1 else ''} a worker" if workers else "batches loaded in "
        "the main process"
    )
    return (
        f"Data loading: {workers} worker{'s' if workers != 1 else ''} per process ({cores_per_process()} CPU "
        f"cores per process here; dataloader_num_workers: {AUTO_WORKERS} gives {auto_dataloader_workers()}, one "
        f"core left for the main process), {loading}, pinned memory {'on' if args.dataloader_pin_memory else 'off'}"
        f", persistent workers {'on' if args.dataloader_persistent_workers else 'off'}."
    )


def data_seed(args: TrainingArguments) -> int:
    """The seed of everything about the data (hold-out, sampler, mixup): `data_seed`, else `seed`, as Trainer's
    own sampler takes it."""
    return args.data_seed if args.data_seed is not None else args.seed


__all__ = [
    "AUTO_WORKERS",
    "NUM_WORKERS_HELP",
    "data_seed",
    "describe_data_loading",
    "parse_num_workers",
    "resolve_data_loading",
]
