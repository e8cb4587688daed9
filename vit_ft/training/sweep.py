"""A hyper-parameter sweep as in the ViT paper: one fine-tune per value, the winner chosen on the validation split.

    python scripts/finetune.py --recipe digits --sweep learning_rate=0.0003,0.003

The paper picks each fine-tune's learning rate from {0.001, 0.003, 0.01, 0.03} on a held-out part of the
training data. Here any argument of the recipe dataclasses can be swept. Each value runs a complete fine-tune
(`training.run_finetune`) into `OUTPUT/sweep-<argument>-<value>/`; the run whose validation metric
(`metric_for_best_model`, read from its run record) is best is copied into OUTPUT, which then loads, evaluates
and pushes like any fine-tune; `sweep.json` and `sweep.md` list every run's validation and test numbers and the
choice. The test split is reported, never used to choose.

Every value is converted and checked by `recipes.parse_args` exactly as the flag `--<argument> <value>` would be,
and every run folder is checked, before the first run starts. `--resume` keeps the finished runs, resumes an
unfinished one from its last complete checkpoint and starts the rest. Under `accelerate launch` every process
takes part in every run; process 0 alone chooses, copies and writes, and the others wait for it.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ..utils.run_record import (
    ADAPTER_DIR,
    RUN_RECORD_FILE,
    is_finished,
    mark_unfinished,
    read_run_record,
    write_run_record,
    write_text_atomically,
)
from .recipe_fields import RecipeError, argument_fields, build_parser, suggest
from .recipes import given_as_flag, parse_args
from .stages import (
    broadcast_object,
    check_output_dir,
    newest_complete_checkpoint,
    run_finetune,
    setup_logging,
)

logger = logging.getLogger("vit_ft")

SWEEP_FLAG = "--sweep"
SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
RUN_PREFIX = "sweep-"

# Arguments a sweep cannot vary: where the runs go, how they are resumed, how they are compared, what is pushed.
_FIXED = {
    "output_dir": "the sweep chooses each run's folder (OUTPUT/sweep-<argument>-<value>)",
    "resume_from_checkpoint": "a sweep resumes with --resume",
    "metric_for_best_model": "every run must be judged by the same metric",
    "greater_is_better": "every run must be judged by the same metric",
    "push_to_hub": "the sweep pushes its winner only",
    "hub_model_id": "the sweep pushes its winner only",
}


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One value of the sweep: its text as given, its folder, and its parsed arguments."""

    text: str
    folder: Path
    args: tuple[Any, Any, TrainingArguments]  # (ModelArguments, DataArguments, TrainingArguments)


def take_sweep(argv: list[str]) -> tuple[str | None, list[str]]:
    """Remove `--sweep ARG=V1,V2` (or `--sweep=ARG=V1,V2`) from argv; return (its text or None, the rest)."""
    found, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == SWEEP_FLAG:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise RecipeError(
                    f"{SWEEP_FLAG} needs a value; write e.g. {SWEEP_FLAG} learning_rate=0.001,0.003."
                )
            found.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(f"{SWEEP_FLAG}="):
            found.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    if len(found) > 1:
        raise RecipeError(
            f"{SWEEP_FLAG} is given {len(found)} times ({', '.join(found)}); a sweep varies one argument, "
            "so pass one --sweep."
        )
    return (found[0] if found else None), rest


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`learning_rate=0.001,0.003` -> ("learning_rate", ["0.001", "0.003"]), the argument checked by name.

    The values stay text here: `sweep_runs` converts each one as its flag would be.
    """
    name, sep, values = text.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name:
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r} is not ARGUMENT=VALUE,VALUE; write e.g. {SWEEP_FLAG} learning_rate=0.001,0.003."
        )
    fields = argument_fields(build_parser())
    if name not in fields:
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r}: {name!r} is not an argument of the recipe (ModelArguments, DataArguments or "
            f"TrainingArguments){suggest(name, fields) or '; run with --help to list them.'}"
        )
    if name in _FIXED:
        raise RecipeError(f"{SWEEP_FLAG} cannot vary {name}: {_FIXED[name]}. Sweep another argument.")
    texts = [value.strip() for value in values.split(",")]
    if not any(texts):
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r} gives no values; list them after '=', separated by commas ({name}=A,B)."
        )
    if not all(texts):
        raise RecipeError(f"{SWEEP_FLAG} {text!r} has an empty value; remove the extra comma.")
    return name, texts


def run_folder_name(name: str, text: str) -> str:
    """`sweep-<argument>-<value>`, with characters a folder name should not hold replaced by `_`."""
    return f"{RUN_PREFIX}{name}-{re.sub(r'[^A-Za-z0-9._+-]', '_', text)}"


def sweep_runs(argv: list[str], name: str, texts: list[str], output_dir: str | Path) -> list[SweepRun]:
    """Parse the arguments of every run: `argv` plus `--<name>=<value>` and the run's folder under `output_dir`.

    Each value goes through `parse_args`, so it is converted and validated exactly as the flag would be; the
    first bad value raises RecipeError naming it. Values that convert to the same thing are refused.
    """
    if given_as_flag(argv, name):
        raise RecipeError(
            f"{name} is given both as a flag and in {SWEEP_FLAG}; drop the flag --{name} (the sweep sets it)."
        )
    runs: list[SweepRun] = []
    seen: dict[Any, str] = {}
    for text in texts:
        folder = Path(output_dir) / run_folder_name(name, text)
        extra = [f"--{name}={text}", "--output_dir", str(folder)]
        try:
            args = parse_args([*argv, *extra])
        except ValueError as error:
            raise RecipeError(f"{SWEEP_FLAG} {name}={text}: {error}") from None
        value = _value_of(args, name)
        key = json.dumps(value, sort_keys=True, default=str)
        if key in seen or any(run.folder == folder for run in runs):
            raise RecipeError(
                f"{SWEEP_FLAG} gives {name}={text} and {name}={seen.get(key, text)}, the same run twice; "
                "list each value once."
            )
        seen[key] = text
        runs.append(SweepRun(text, folder, args))
    return runs


def _value_of(args: tuple[Any, ...], name: str) -> Any:
    for group in args:
        if name in {field.name for field in dataclasses.fields(group)}:
            value = getattr(group, name)
            return value.value if isinstance(value, enum.Enum) else value  # SchedulerType.COSINE -> "cosine"
    raise KeyError(name)  # pragma: no cover - parse_sweep checked the name


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
    partial = target.with_name(f".{target.name}.partial")
    shutil.copy2(source, partial)
    os.replace(partial, target)


def copy_winner(run_dir: Path, output_dir: Path, sweep_info: dict[str, Any]) -> None:
    """Copy the winning run's model files (top-level files and its adapter/) into `output_dir`.

    The run record goes last, with `sweep_info` added: it marks `output_dir` as a finished run (run_record).
    Checkpoints and TensorBoard logs stay in the run's folder.
    """
    mark_unfinished(output_dir)
    for path in sorted(run_dir.iterdir()):
        if path.is_file() and path.name != RUN_RECORD_FILE:
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
                "value": _value_of(run.args, name),
                "text": run.text,
                "folder": run.folder.name,
                metric: _number(metrics, metric),
                **{
                    key: _number(metrics, key)
                    for key in ("eval_accuracy", "eval_loss", "test_accuracy", "test_loss")
                    if key in metrics and key != metric
                },
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
        key
        for key in ("eval_accuracy", "eval_loss", "test_accuracy", "test_loss")
        if key != metric and any(key in row for row in summary["runs"])
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


def is_sweep_folder(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a sweep's summary (sweep.json)."""
    return (Path(output_dir) / SWEEP_JSON).is_file()


def check_sweep_output_dir(
    training_args: TrainingArguments, resume: bool, overwrite_output_dir: bool
) -> None:
    """Refuse an OUTPUT that is a file, or holds a finished run or sweep, unless told to overwrite (or resume a sweep)."""
    output_dir = Path(training_args.output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise NotADirectoryError(
            f"output_dir={str(output_dir)!r} is a file, not a folder; pass another --output_dir."
        )
    if overwrite_output_dir or not is_finished(output_dir):
        return
    if not is_sweep_folder(output_dir):
        raise FileExistsError(
            f"{output_dir} holds a finished run, not a sweep, whose model the sweep's winner would replace; pass "
            "--overwrite_output_dir to replace it, or another --output_dir."
        )
    if not resume:
        raise FileExistsError(
            f"{output_dir} holds a finished sweep, whose winner this sweep would replace; pass "
            "--overwrite_output_dir to redo it, --resume to keep its finished runs, or another --output_dir."
        )


def plan_runs(runs: list[SweepRun], resume: bool) -> list[str]:
    """What to do with each run: "done" (finished, kept with --resume), "resume" (from its last complete
    checkpoint, with --resume) or "start"."""
    plan = []
    for run in runs:
        if resume and is_finished(run.folder):
            plan.append("done")
        elif resume and newest_complete_checkpoint(run.folder) is not None:
            plan.append("resume")
        else:
            plan.append("start")
    return plan


def _with_resume(args: tuple[Any, Any, TrainingArguments], checkpoint: str | None) -> tuple[Any, ...]:
    """The run's arguments resuming from `checkpoint` ("last" or None); a copy, as run_finetune copies them."""
    model_args, data_args, training_args = args
    training_args = copy.copy(training_args)  # not dataclasses.replace: that would run __post_init__ again
    training_args.resume_from_checkpoint = checkpoint
    return model_args, data_args, training_args


def run_sweep(
    argv: list[str],
    sweep: str,
    recipe: str | None = None,
    overwrite_output_dir: bool = False,
) -> dict[str, Any]:
    """Run the sweep `sweep` (`ARG=V1,V2,...`) over the fine-tune that `argv` describes; returns sweep.json's content.

    `argv` is the fine-tune's command line without `--sweep`; `--resume` in it (as `--resume_from_checkpoint
    last`) resumes the sweep. Everything is parsed and checked before the first run starts.
    """
    name, texts = parse_sweep(sweep)
    base_args = parse_args(argv)
    training_args = base_args[2]
    resume = training_args.resume_from_checkpoint
    if resume not in (None, "last"):
        raise RecipeError(
            f"resume_from_checkpoint={resume!r} names one checkpoint; a sweep resumes all its runs with --resume."
        )
    resume = resume == "last"
    output_dir = Path(training_args.output_dir)
    runs = sweep_runs(argv, name, texts, output_dir)  # each run's resume is set from the plan below
    check_sweep_output_dir(training_args, resume, overwrite_output_dir)
    plan = plan_runs(runs, resume) if training_args.process_index == 0 else None
    if training_args.world_size > 1:
        plan = broadcast_object(plan)  # every process must take the same decisions
    for run, action in zip(runs, plan, strict=True):
        if action == "start":  # a finished run without --resume is refused here, before any run starts
            check_output_dir(_with_resume(run.args, None)[2], overwrite_output_dir)

    setup_logging(training_args)
    if training_args.process_index == 0:
        mark_unfinished(
            output_dir
        )  # until the new winner is copied, OUTPUT's model is not this sweep's result
    for index, (run, action) in enumerate(zip(runs, plan, strict=True), start=1):
        where = f"sweep run {index}/{len(runs)}: {name}={run.text} in {run.folder}"
        if action == "done":
            logger.info("%s finished before; kept.", where)
            continue
        logger.info("%s%s.", where, " (resuming)" if action == "resume" else "")
        run_finetune(
            *_with_resume(run.args, "last" if action == "resume" else None),
            recipe=recipe,
            overwrite_output_dir=overwrite_output_dir,
        )

    # process 0 chooses, copies and writes; the others wait for its result (or its error) at the broadcast
    summary, error = None, None
    if training_args.process_index == 0:
        try:
            summary = summarize(name, runs, training_args)
            chosen = output_dir / summary["chosen"]["folder"]
            copy_winner(chosen, output_dir, {k: summary[k] for k in ("argument", "metric", "chosen")})
            write_sweep_files(output_dir, summary)
        except (OSError, ValueError) as caught:
            error = caught
    if training_args.world_size > 1:
        summary, message = broadcast_object((summary, None if error is None else str(error)))
        if message is not None and error is None:
            raise OSError(f"process 0 could not finish the sweep: {message}")
    if error is not None:
        raise error
    logger.info(
        "Sweep finished: %s=%s chosen on %s; table in %s.",
        name,
        summary["chosen"]["text"],
        summary["metric"],
        output_dir / SWEEP_MD,
    )
    return summary


def sweep_interrupted_message(output_dir: str | Path) -> str:
    """The one line to print on Ctrl-C during a sweep (cli.run_tool closes the progress bars first)."""
    return (
        f"interrupted; the sweep's finished runs are kept in {output_dir}. Run the same command with --resume to "
        "continue (the run in progress resumes from its last complete checkpoint)."
    )


__all__ = [
    "SWEEP_JSON",
    "SWEEP_MD",
    "choose",
    "parse_sweep",
    "run_folder_name",
    "run_sweep",
    "selection_metric",
    "sweep_interrupted_message",
    "sweep_runs",
    "take_sweep",
]
