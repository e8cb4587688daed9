"""The grid: every method x task x seed of a suite fine-tuned under the paper protocol, resumable task by task.

Each cell is an ordinary fine-tune: its flags (`protocols.cell_flags`, then the task's saved dataset, then the
user's flags) go through `build_plan` and `run_finetune`, in this process. In-process rather than one
subprocess per cell: every cell's plan is built and checked before the first trains (a bad flag is one line, not
a failure an hour in), and the fine-tune's own finished-run guard applies; a process per cell would add the
start-up (torch, transformers: seconds) to each of the 19 x methods cells and nothing the plan does not check.

Resume: a cell's result (`results/<task>/<method>-seed<N>.json`) is written atomically after its fine-tune
finishes, so one on disk is complete and its cell is never redone; a cell folder that holds no finished run
(a run killed midway) is the harness's own and starts again; a finished run without its result file (killed
in between) gives its recorded metrics back without training.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..arguments.recipes import build_plan
from ..training.stages import run_finetune
from ..utils.files import write_text_atomically
from ..utils.run_record import is_finished
from .data import prepare_task, with_pin
from .protocols import cell_flags, rates
from .suites import Suite, TaskSpec, suite
from .table import write_table

logger = logging.getLogger("vit_ft")
METHODS = ("linear", "full", "lora", "ssf", "vpt")  # the rows V-PETL Bench publishes, by default


def _select(chosen: Suite, names: list[str] | None, pins: dict[str, str]) -> list[TaskSpec]:
    known = {task.name: task for task in chosen.tasks}
    unknown = [name for name in [*(names or []), *pins] if name not in known]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a task of {chosen.name}; its tasks: {', '.join(known)}.")
    tasks = [known[name] for name in names] if names else list(chosen.tasks)
    return [with_pin(task, pins[task.name]) if task.name in pins else task for task in tasks]


def _result_path(folder: Path, task: str, method: str, seed: int) -> Path:
    return folder / "results" / task / f"{method}-seed{seed}.json"


def read_result(path: Path) -> dict[str, Any] | None:
    """A cell's result, or None where there is none (a partial write never has the final name)."""
    return json.loads(path.read_text()) if path.is_file() else None


def _cells(folder: Path, chosen: Suite, tasks: list[TaskSpec], methods: list[str], seeds: list[int],
           model: str, extra: list[str], max_test: int | None) -> list[dict[str, Any]]:  # fmt: skip
    """Each cell's task, method, seed, folders and built plan; the data of tasks with cells to run prepared."""
    cells = []
    for task in tasks:
        todo = [(m, s) for m in methods for s in seeds if read_result(_result_path(folder, task.name, m, s)) is None]
        data = prepare_task(task, chosen, folder, max_test) if todo else None
        for method, seed in todo:
            run_dir = folder / "runs" / task.name / f"{method}-seed{seed}"
            flags = [*cell_flags(chosen, task, method, seed), "--model_name_or_path", model, "--dataset_name",
                     str(data), "--train_split", "train", "--validation_split", "validation", "--test_split", "test",
                     "--image_column", "image", "--label_column", "label", "--output_dir", str(run_dir), *extra]  # fmt: skip
            cells.append({"task": task, "method": method, "seed": seed, "run_dir": run_dir, "flags": flags,
                          "plan": build_plan(flags)})  # fmt: skip
    return cells


def _run_cell(folder: Path, cell: dict[str, Any]) -> dict[str, Any]:
    task, run_dir = cell["task"], cell["run_dir"]
    if run_dir.exists() and not is_finished(run_dir):  # killed midway: the harness's own folder, started again
        shutil.rmtree(run_dir)
    start = time.monotonic()
    metrics = run_finetune(cell["plan"])
    learning_rate, weight_decay = rates(cell["method"], task.name)
    result = {"task": task.name, "group": task.group, "method": cell["method"], "seed": cell["seed"],
              "test_accuracy": metrics["test_accuracy"], "eval_accuracy": metrics.get("eval_accuracy"),
              "seconds": round(time.monotonic() - start, 1), "protocol": {"learning_rate": learning_rate,
              "weight_decay": weight_decay}, "flags": cell["flags"]}  # fmt: skip
    write_text_atomically(_result_path(folder, task.name, cell["method"], cell["seed"]), json.dumps(result, indent=2))
    gc.collect()
    return result


def run_bench(suite_name: str, model: str, output_dir: str | Path, methods: list[str] | None = None,
              tasks: list[str] | None = None, seeds: list[int] | None = None, extra_flags: list[str] | None = None,
              pins: dict[str, str] | None = None, sizes: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the grid of `suite_name` into `output_dir` (what is done is kept) and write its table; returns the
    summary. `sizes` (train_size, validation_size, max_test) shrink the draw (a smoke run)."""
    folder, sizes = Path(output_dir), dict(sizes or {})
    max_test = sizes.pop("max_test", None)
    chosen = replace(suite(suite_name), **sizes)
    methods, seeds, extra = list(methods or METHODS), list(seeds or [0]), list(extra_flags or [])
    selected = _select(chosen, tasks, pins or {})
    cells = _cells(folder, chosen, selected, methods, seeds, model, extra, max_test)
    logger.info("bench %s: %d cells to run (%d already done)", chosen.name, len(cells),
                len(selected) * len(methods) * len(seeds) - len(cells))  # fmt: skip
    for cell in cells:
        _run_cell(folder, cell)
    results = [r for t in selected for m in methods for s in seeds if (r := read_result(_result_path(folder, t.name, m, s)))]
    record = {"model": model, "seeds": seeds, "methods": methods, "extra_flags": extra}
    return write_table(folder, chosen, results, record)


__all__ = ["METHODS", "read_result", "run_bench"]
