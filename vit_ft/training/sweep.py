"""A hyper-parameter sweep as in the ViT paper: one fine-tune per value, the winner chosen on the validation split.

    vit-ft finetune --recipe digits --sweep learning_rate=0.0003,0.003

The paper picks each fine-tune's learning rate from {0.001, 0.003, 0.01, 0.03} on a held-out part of the
training data. Here any argument of the recipe dataclasses can be swept. Each value runs a complete fine-tune
(`stages.run_finetune`) into `OUTPUT/sweep-<argument>-<value>/`; the run whose validation metric
(`metric_for_best_model`, read from its run record) is best is copied into OUTPUT, which then loads, evaluates
and pushes like any fine-tune; `sweep.json` and `sweep.md` list every run's validation and test numbers and the
choice (`sweep_results`). The test split is reported, never used to choose.

Every value is converted and checked by `recipes.parse_args` exactly as the flag `--<argument> <value>` would be,
and every run folder is checked, before the first run starts. `--resume` keeps the finished runs, resumes an
unfinished one from its last complete checkpoint and starts the rest. Under `accelerate launch` every process
takes part in every run; process 0 alone chooses, copies and writes, and the others wait for it.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ..utils.distributed import broadcast_object
from ..utils.lock import output_lock_in_process_zero
from ..utils.output_dir import check_output_dir as check_folder
from ..utils.run_record import is_finished, mark_unfinished
from .checkpoints import check_output_dir, newest_complete_checkpoint, run_inputs
from .recipes import (
    SWEEP_FLAG,
    FinetuneCommand,
    RecipeError,
    argument_fields,
    build_parser,
    given_as_flag,
    parse_args,
    suggest,
)
from .stages import run_finetune
from .sweep_results import (
    RUN_PREFIX,
    SWEEP_MD,
    SweepRun,
    copy_winner,
    is_sweep_folder,
    summarize,
    write_sweep_files,
)

logger = logging.getLogger("vit_ft")

# Arguments a sweep cannot vary: where the runs go, how they are resumed, how they are compared, what is pushed.
_FIXED = {
    "output_dir": "the sweep chooses each run's folder (OUTPUT/sweep-<argument>-<value>)",
    "resume_from_checkpoint": "a sweep resumes with --resume",
    "metric_for_best_model": "every run must be judged by the same metric",
    "greater_is_better": "every run must be judged by the same metric",
    "push_to_hub": "the sweep pushes its winner only",
    "hub_model_id": "the sweep pushes its winner only",
}


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
        run = SweepRun(text, folder, args)
        key = json.dumps(run.value(name), sort_keys=True, default=str)
        if key in seen or any(run.folder == folder for run in runs):
            raise RecipeError(
                f"{SWEEP_FLAG} gives {name}={text} and {name}={seen.get(key, text)}, the same run twice; "
                "list each value once."
            )
        seen[key] = text
        runs.append(run)
    return runs


def check_sweep_output_dir(
    training_args: TrainingArguments,
    resume: bool,
    overwrite_output_dir: bool,
    inputs: list[str] | None = None,
) -> None:
    """Refuse an OUTPUT that is a file, is or lies inside one of `inputs` (every run's starting checkpoint and
    image folders: the winner is copied into OUTPUT), or holds a finished run or sweep, unless told to overwrite
    (or resume a sweep)."""

    def refusal(output_dir: Path) -> str | None:
        if not is_sweep_folder(output_dir):
            return (
                "run, not a sweep, whose model the sweep's winner would replace; pass --overwrite_output_dir "
                "to replace it, or another --output_dir."
            )
        if not resume:
            return (
                "sweep, whose winner this sweep would replace; pass --overwrite_output_dir to redo it, "
                "--resume to keep its finished runs, or another --output_dir."
            )
        return None

    check_folder(
        training_args.output_dir,
        inputs=inputs or (),
        finished=None if overwrite_output_dir else refusal,
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


def _resumes(training_args: TrainingArguments) -> bool:
    """Whether the sweep resumes (`--resume`); a single checkpoint cannot resume several runs."""
    resume = training_args.resume_from_checkpoint
    if resume not in (None, "last"):
        raise RecipeError(
            f"resume_from_checkpoint={resume!r} names one checkpoint; a sweep resumes all its runs with --resume."
        )
    return resume == "last"


def _agreed_plan(
    runs: list[SweepRun], training_args: TrainingArguments, resume: bool, overwrite_output_dir: bool
) -> list[str]:
    """`plan_runs`, decided by process 0 for every process; a run to start must not replace a finished run."""
    plan = plan_runs(runs, resume) if training_args.process_index == 0 else None
    if training_args.world_size > 1:
        plan = broadcast_object(plan)  # every process must take the same decisions
    for run, action in zip(runs, plan, strict=True):
        if action == "start":  # a finished run without --resume is refused here, before any run starts
            check_output_dir(_with_resume(run.args, None)[2], overwrite_output_dir)
    return plan


def _finish(name: str, runs: list[SweepRun], training_args: TrainingArguments) -> dict[str, Any]:
    """Process 0 chooses, copies and writes; the others wait for its result (or its error) at the broadcast."""
    output_dir = Path(training_args.output_dir)
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
    return summary


def _run_all(name: str, runs: list[SweepRun], plan: list[str], command: FinetuneCommand) -> None:
    """Run (or resume) every run the plan does not keep, one after another."""
    for index, (run, action) in enumerate(zip(runs, plan, strict=True), start=1):
        where = f"sweep run {index}/{len(runs)}: {name}={run.text} in {run.folder}"
        if action == "done":
            logger.info("%s finished before; kept.", where)
            continue
        logger.info("%s%s.", where, " (resuming)" if action == "resume" else "")
        run_finetune(
            *_with_resume(run.args, "last" if action == "resume" else None),
            recipe=command.recipe,
            overwrite_output_dir=command.overwrite_output_dir,
        )


def run_sweep(command: FinetuneCommand) -> dict[str, Any]:
    """Run the sweep `command.sweep` (`ARG=V1,V2,...`) over the fine-tune the rest of `command` describes; returns
    sweep.json's content.

    `--resume` resumes the sweep, `--overwrite_output_dir` replaces a finished one. Everything is parsed and
    checked before the first run starts.
    """
    name, texts = parse_sweep(command.sweep)
    training_args = command.parse()[2]
    resume = _resumes(training_args)
    output_dir = Path(training_args.output_dir)
    runs = sweep_runs(list(command.flags), name, texts, output_dir)  # each run's resume is set from the plan
    inputs = sorted({folder for run in runs for folder in run_inputs(*run.args[:2])})
    check_sweep_output_dir(training_args, resume, command.overwrite_output_dir, inputs)
    index, world_size = training_args.process_index, training_args.world_size
    with output_lock_in_process_zero(output_dir, "vit-ft finetune --sweep", index, world_size):
        check_sweep_output_dir(training_args, resume, command.overwrite_output_dir, inputs)
        plan = _agreed_plan(runs, training_args, resume, command.overwrite_output_dir)
        if (
            training_args.process_index == 0
        ):  # until the new winner is copied, OUTPUT's model is not this sweep's
            mark_unfinished(output_dir)
        _run_all(name, runs, plan, command)
        summary = _finish(name, runs, training_args)
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
    "check_sweep_output_dir",
    "parse_sweep",
    "plan_runs",
    "run_folder_name",
    "run_sweep",
    "sweep_interrupted_message",
    "sweep_runs",
]
