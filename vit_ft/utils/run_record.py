"""The layout of a fine-tune's output folder and its run record, `vit_ft_run.json`, in one place.

The fine-tune writes the record (what it used: recipe, base model, resolution, data arguments, seeds,
metrics); evaluate, inspect, push and the demo read it back through `read_run_record`. The record is the
folder's completion marker: the fine-tune writes it last, with `"finished": true`, after the model, processor
and labels, and marks it `"finished": false` when a new run starts in the folder; `is_finished` checks it.

The record is always valid JSON (RFC 8259 has no NaN or Infinity, which Python's json would write): a number
that is not finite is written as null, with a warning naming where it was. The flags are checked finite before
any work, so one here comes from the run itself (a diverged run's NaN loss), whose record is still worth keeping.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from pathlib import Path
from typing import Any

from .files import write_text_atomically

RUN_RECORD_FILE = "vit_ft_run.json"
ADAPTER_DIR = "adapter"  # a LoRA fine-tune's adapter (with its trained head), beside the merged model
PROCESSOR_FILE = "preprocessor_config.json"
LABELS_FILE = "labels.json"
EXAMPLES_DIR = "examples"  # a few validation images, which the demo offers and push uploads
# the record's key for the temperature fitted on the validation split (vit_ft.training.calibration):
# {"temperature": T, "split": "validation", "images": n, "nll": [before, after], "ece": [before, after]}
CALIBRATION_KEY = "calibration"

logger = logging.getLogger("vit_ft")


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A peft adapter folder (adapter_config.json), not a complete model."""
    return (Path(path) / "adapter_config.json").is_file()


def run_folder(model: str | os.PathLike) -> Path | None:
    """The fine-tune's output folder for a local model path (the parent of an `adapter/` folder), else None."""
    path = Path(model)
    if not path.is_dir():
        return None
    if path.name == ADAPTER_DIR and is_adapter_folder(path) and (path.parent / RUN_RECORD_FILE).is_file():
        return path.parent
    return path


def read_run_record(model: str | os.PathLike) -> dict[str, Any] | None:
    """The run record a fine-tune wrote next to the model, or None (a Hub id, a converted checkpoint)."""
    folder = run_folder(model)
    if folder is None or not (folder / RUN_RECORD_FILE).is_file():
        return None
    return json.loads((folder / RUN_RECORD_FILE).read_text(encoding="utf-8"))


def recorded_seed(record: dict[str, Any] | None) -> int | None:
    """The seed the fine-tune drew its data with (TrainingArguments' data_seed, else seed), if recorded."""
    for key in ("data_seed", "seed"):
        if record and record.get(key) is not None:
            return int(record[key])
    return None


def recorded_temperature(record: dict[str, Any] | None) -> float:
    """The calibration temperature the fine-tune fitted (`CALIBRATION_KEY`), 1.0 (none) when not recorded."""
    calibration = (record or {}).get(CALIBRATION_KEY) or {}
    temperature = calibration.get("temperature") if isinstance(calibration, dict) else None
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        return 1.0
    return float(temperature)


def _finite(value: Any, where: str, replaced: list[str]) -> Any:
    """`value` with every number that is not finite (NaN, +-inf) replaced by None; their places in `replaced`."""
    if isinstance(value, dict):
        return {key: _finite(item, f"{where}.{key}" if where else str(key), replaced) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item, f"{where}[{i}]", replaced) for i, item in enumerate(value)]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        replaced.append(f"{where} ({value})")
        return None
    return value


def record_json(record: dict[str, Any]) -> str:
    """`record` as valid JSON: values JSON cannot hold as their text, numbers that are not finite as null (with
    a warning naming them)."""
    replaced: list[str] = []
    clean = _finite(record, "", replaced)
    if replaced:
        logger.warning(
            "The run record holds numbers that are not finite, written as null: %s.", ", ".join(replaced)
        )
    return json.dumps(clean, indent=2, default=str, allow_nan=False)


def write_run_record(output_dir: str | os.PathLike, record: dict[str, Any]) -> Path:
    """Write `record` as the folder's run record (`record_json`: values JSON cannot hold as strings, numbers
    that are not finite as null).

    Written atomically (`files.write_text_atomically`): a death while writing never leaves half a record.
    """
    return write_text_atomically(Path(output_dir) / RUN_RECORD_FILE, record_json(record))


def is_finished(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a fine-tune that finished: its run record exists and says `"finished": true`.

    Records written before the field existed count as finished (they were written after the model). A folder
    whose record says false, or has none (a run killed before its final save), did not finish: resume it with
    `scripts/finetune.py ... --resume`.
    """
    try:
        record = read_run_record(folder)
    except (OSError, ValueError):
        return False
    return bool(record is not None and record.get("finished", True))


def mark_unfinished(folder: str | os.PathLike) -> None:
    """Set an existing run record's `finished` to false (a new run is starting to overwrite the folder)."""
    try:
        record = read_run_record(folder)
    except (OSError, ValueError):
        return
    if record is not None and record.get("finished", True):
        write_run_record(folder, {**record, "finished": False})


__all__ = [
    "ADAPTER_DIR",
    "CALIBRATION_KEY",
    "LABELS_FILE",
    "PROCESSOR_FILE",
    "RUN_RECORD_FILE",
    "is_adapter_folder",
    "is_finished",
    "mark_unfinished",
    "read_run_record",
    "record_json",
    "recorded_seed",
    "recorded_temperature",
    "run_folder",
    "write_run_record",
]
