"""What a sweep leaves: its runs, the winner chosen on the validation split, the winner's files copied into the
sweep's folder, and sweep.json / sweep.md listing every run (`vit_ft.training.sweep` runs the sweep); for a sweep
over `seed`, no winner but the seeds' summary (`seeds`: seeds.json / seeds.md)."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ..utils.files import staged_file, write_text_atomically
from ..utils.run_record import (
    ADAPTER_DIR,
    RUN_RECORD_FILE,
    mark_unfinished,
    read_run_record,
    write_run_record,
)
from .seeds import SEED, SEEDS_MD, summarize_seeds, write_seed_files

logger = logging.getLogger("vit_ft")

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
RUN_PREFIX = "sweep-"
Seconds = list[float | None]  # each run's wall time, None for a run a resumed sweep kept


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One value of the sweep: its text as given, its folder, its run plan (`recipes.build_plan`), and the flags
    that make it this run (added to the sweep's own command line when the run is a command of its own)."""

    text: str
    folder: Path
    plan: Any  # arguments.plan.RunPlan
    flags: tuple[str, ...] = ()  # --<argument>=<value>, --output_dir <folder>, ...

    def value(self, name: str) -> Any:
        """The run's parsed value of the argument `name` (an enum as its value: SchedulerType.COSINE -> "cosine")."""
        for group in self.plan.arguments:
            if name in {field.name for field in dataclasses.fields(group)}:
                value = getattr(group, name)
                return value.value if isinstance(value, enum.Enum) else value
        raise KeyError(name)  # pragma: no cover - parse_sweep checked the name


# the numbers each sweep row shows besides the chosen metric (mAP: a multi-label sweep)
_TABLE_METRICS = ("eval_accuracy", "eval_mAP", "eval_loss", "test_accuracy", "test_mAP", "test_loss")


def selection_metric(training_args: TrainingArguments) -> tuple[str, bool]:
    """The validation metric that chooses the winner (`eval_<metric_for_best_model>`) and whether higher wins."""
    metric = training_args.metric_for_best_model or "accuracy"
    if not metric.startswith("eval_"):
        metric = f"eval_{metric}"
    greater = training_args.greater_is_better
    if greater is None:
        greater = not metric.endswith("loss")
    return metric, bool(greater)


def choose(
    scores: list[float | None], greater_is_better: bool, losses: list[float | None] | None = None
) -> int:
    """The index of the best score; a missing or NaN score never wins.

    A tie goes to the lower validation loss (`losses`; accuracy on a few hundred images ties often, and a run
    that learnt nothing should not win a tie by coming first), then to the earlier value.
    """

    def key(index: int) -> tuple[float, float]:
        score = scores[index] if greater_is_better else -scores[index]
        loss = losses[index] if losses is not None else None
        return score, -loss if loss is not None and not math.isnan(loss) else -math.inf

    best = None
    for index, score in enumerate(scores):
        if score is None or math.isnan(score):
            continue
        if best is None or key(index) > key(best):
            best = index
    if best is None:
        raise ValueError("no run of the sweep has a validation score; check the runs' vit_ft_run.json files.")
    return best


def _copy_atomic(source: Path, target: Path) -> None:
    """Copy a file under a temporary name and rename it, so that a death while copying leaves no half file."""
    with staged_file(target) as partial:
        shutil.copy2(source, partial)


def copy_winner(run_dir: Path, output_dir: Path, sweep_info: dict[str, Any]) -> None:
    """Copy the winning run's model files (top-level files and its adapter/) into `output_dir`.

    The run record goes last, with `sweep_info` added: it marks `output_dir` as a finished run (run_record).
    Checkpoints and TensorBoard logs stay in the run's folder.
    """
    mark_unfinished(output_dir)
    for path in sorted(run_dir.iterdir()):
        # hidden files (a lock a killed run left) are the run folder's own, never the model's
        if path.is_file() and path.name != RUN_RECORD_FILE and not path.name.startswith("."):
            _copy_atomic(path, output_dir / path.name)
    adapter = run_dir / ADAPTER_DIR
    if adapter.is_dir():
        (output_dir / ADAPTER_DIR).mkdir(exist_ok=True)
        for path in sorted(adapter.iterdir()):
            if path.is_file():
                _copy_atomic(path, output_dir / ADAPTER_DIR / path.name)
    write_run_record(output_dir, {**(read_run_record(run_dir) or {}), "sweep": sweep_info})


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def summarize(name: str, runs: list[SweepRun], training_args: TrainingArguments) -> dict[str, Any]:
    """Read every run's record, choose the winner on validation, and return what sweep.json holds."""
    metric, greater = selection_metric(training_args)
    rows = []
    for run in runs:
        record = read_run_record(run.folder) or {}
        metrics = record.get("metrics", {})
        if metric not in metrics:
            raise ValueError(
                f"{run.folder}/{RUN_RECORD_FILE} has no {metric} (it has {sorted(metrics)}); the sweep chooses on "
                "it: set metric_for_best_model to one of the recorded eval_* metrics."
            )
        rows.append(
            {
                "value": run.value(name),
                "text": run.text,
                "folder": run.folder.name,
                metric: _number(metrics, metric),
                **{key: _number(metrics, key) for key in _TABLE_METRICS if key in metrics and key != metric},
            }
        )
    best = choose([row[metric] for row in rows], greater, [row.get("eval_loss") for row in rows])
    for index, row in enumerate(rows):
        row["chosen"] = index == best
    return {
        "argument": name,
        "metric": metric,
        "greater_is_better": greater,
        "chosen": {"value": rows[best]["value"], "text": rows[best]["text"], "folder": rows[best]["folder"]},
        "runs": rows,
        "finished": True,
    }


def sweep_table(summary: dict[str, Any]) -> str:
    """The markdown table of sweep.md: one row per run, validation and test numbers, the chosen one marked."""
    metric = summary["metric"]
    columns = [metric] + [
        key for key in _TABLE_METRICS if key != metric and any(key in row for row in summary["runs"])
    ]
    lines = [
        f"| {summary['argument']} | " + " | ".join(columns) + " | chosen |",
        "| --- | " + " | ".join("---:" for _ in columns) + " | --- |",
    ]
    for row in summary["runs"]:
        cells = [f"{row[key]:.4f}" if row.get(key) is not None else "-" for key in columns]
        lines.append(f"| {row['text']} | " + " | ".join(cells) + f" | {'**yes**' if row['chosen'] else ''} |")
    return "\n".join(lines)


def write_sweep_files(output_dir: Path, summary: dict[str, Any]) -> None:
    """sweep.json (machine-readable) and sweep.md (the table, and how the winner was chosen), each written whole."""
    better = "higher" if summary["greater_is_better"] else "lower"
    text = (
        f"# Sweep over {summary['argument']}\n\n"
        f"One fine-tune per value, in `{RUN_PREFIX}{summary['argument']}-<value>/`. Chosen on the validation "
        f"split only: {summary['metric']} ({better} is better; a tie goes to the lower eval_loss, then to the earlier value). The test "
        f"numbers are reported, not used. The chosen run, {summary['argument']}={summary['chosen']['text']}, is "
        f"copied into this folder.\n\n{sweep_table(summary)}\n"
    )
    write_text_atomically(output_dir / SWEEP_MD, text)
    write_text_atomically(output_dir / SWEEP_JSON, json.dumps(summary, indent=2, default=str))


def write_results(
    name: str,
    runs: list[SweepRun],
    seconds: Seconds,
    training_args: TrainingArguments,
    command: list[str],
    process_per_run: bool,
) -> dict[str, Any]:
    """Leave the sweep's result in OUTPUT and return it: a seed sweep's summary (seeds.json, seeds.md; `command` is
    what each seed ran); otherwise the winner chosen on validation, copied in, and sweep.json / sweep.md."""
    output_dir = Path(training_args.output_dir)
    if name == SEED:
        folders = [run.folder for run in runs]
        summary = summarize_seeds([run.value(SEED) for run in runs], folders, seconds, command)
        write_seed_files(output_dir, summary, process_per_run)
        return summary
    summary = summarize(name, runs, training_args)
    chosen = output_dir / summary["chosen"]["folder"]
    copy_winner(chosen, output_dir, {k: summary[k] for k in ("argument", "metric", "chosen")})
    write_sweep_files(output_dir, summary)
    return summary


def log_results(name: str, summary: dict[str, Any], output_dir: Path) -> None:
    """The sweep's last line: the winner, or the seeds' mean, lowest and highest; where the table is."""
    if name == SEED:
        logger.info(
            "Seed sweep finished: %s mean %.4f, lowest %.4f, highest %.4f over %d seeds; table in %s.",
            summary["metric"], summary["mean"], summary["min"], summary["max"], len(summary["runs"]),
            output_dir / SEEDS_MD,
        )  # fmt: skip
    else:
        logger.info(
            "Sweep finished: %s=%s chosen on %s; table in %s.",
            name, summary["chosen"]["text"], summary["metric"], output_dir / SWEEP_MD,
        )  # fmt: skip


def is_sweep_folder(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a sweep's summary (sweep.json)."""
    return (Path(output_dir) / SWEEP_JSON).is_file()


__all__ = [
    "RUN_PREFIX",
    "SWEEP_JSON",
    "Seconds",
    "SWEEP_MD",
    "SweepRun",
    "choose",
    "copy_winner",
    "is_sweep_folder",
    "log_results",
    "selection_metric",
    "summarize",
    "sweep_table",
    "write_results",
    "write_sweep_files",
]
