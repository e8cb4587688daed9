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

A sweep over `seed` chooses nothing: its runs go to `OUTPUT/seed-N/`, each with its log in `OUTPUT/seed-N.log`,
and OUTPUT gets the seeds' summary (mean, lowest, highest: `seeds`), no model. `--process_per_run` runs each
run as its own command (`python -m vit_ft.commands.finetune`, its output in `OUTPUT/<run folder>.log`), so that
its wall time includes the start-up; `vit-ft seeds` is a seed sweep with it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ..arguments.command_line import PROCESS_PER_RUN_FLAG, SWEEP_FLAG, FinetuneCommand
from ..arguments.recipes import RecipeError
from ..utils.distributed import broadcast_object
from ..utils.lock import output_lock_in_process_zero
from ..utils.output_dir import check_output_dir
from ..utils.run_record import is_finished, mark_unfinished
from .checkpoints import (
    check_run_output_dir,
    check_user_files,
    claim_output_dir,
    newest_complete_checkpoint,
    run_inputs,
)
from .seeds import SEED, SEEDS_JSON
from .stages import run_finetune
from .sweep_results import (
    SWEEP_JSON,
    Seconds,
    SweepRun,
    is_sweep_folder,
    log_results,
    write_results,
)
from .sweep_values import parse_sweep, sweep_runs

logger = logging.getLogger("vit_ft")

FINETUNE_MODULE = "vit_ft.commands.finetune"  # a run's own process: `python -m`, the installed package
_RUN_OWN = ("--output_dir", "--resume_from_checkpoint")  # each run's own: its folder; resume, from the plan

def check_sweep_output_dir(
    training_args: TrainingArguments,
    resume: bool,
    overwrite_output_dir: bool,
    inputs: list[str] | None = None,
    copies_winner: bool = True,
) -> None:
    """Refuse an OUTPUT that is a file, is or lies inside one of `inputs` (every run's starting checkpoint and
    image folders: the winner is copied into OUTPUT), or holds a finished run or sweep, unless told to overwrite
    (or resume a sweep). A seed sweep (not `copies_winner`) replaces no model in OUTPUT: its finished runs are
    refused one by one (`_agreed_plan`)."""

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

    check_output_dir(
        training_args.output_dir,
        inputs=inputs or (),
        finished=None if overwrite_output_dir or not copies_winner else refusal,
    )
    check_user_files(training_args.output_dir, overwrite_output_dir)  # the winner's files, the summary


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


def _with_resume(plan: Any, checkpoint: str | None) -> Any:
    """The run's plan resuming from `checkpoint` ("last" or None); its training arguments a copy."""
    training_args = copy.copy(plan.training_args)  # not dataclasses.replace: that would run __post_init__ again
    training_args.resume_from_checkpoint = checkpoint
    return plan.with_arguments(training_args=training_args)


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
            check_run_output_dir(_with_resume(run.plan, None).training_args, overwrite_output_dir, in_sweep=True)
    return plan


def _command_line(flags: tuple[str, ...], drop: tuple[str, ...]) -> list[str]:
    """`flags` without the flags named in `drop` (each with its value, in both spellings)."""
    kept, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in drop:
            skip = True
        elif not flag.startswith(tuple(f"{name}=" for name in drop)):
            kept.append(flag)
    return kept


def _log_path(name: str, run: SweepRun, command: FinetuneCommand) -> Path | None:
    """Where a run's output goes: OUTPUT/<run folder>.log for a run in its own process and for every seed."""
    if command.process_per_run or name == SEED:
        return run.folder.parent / f"{run.folder.name}.log"
    return None


@contextlib.contextmanager
def _logging_to(path: Path | None) -> Iterator[None]:
    """Copy the block's log records (ours, and transformers', whose logger does not propagate) into `path` too;
    nothing when `path` is None."""
    if path is None:
        yield
        return
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    for each in loggers:
        each.addHandler(handler)
    try:
        yield
    finally:
        for each in loggers:
            each.removeHandler(handler)
        handler.close()


def _run_as_process(name: str, run: SweepRun, action: str, command: FinetuneCommand, log: Path) -> None:
    """Run one run as its own fine-tune command, as a user would type it, its output in `log`."""
    line = [sys.executable, "-m", FINETUNE_MODULE, *_command_line(command.flags, _RUN_OWN)]
    line += [*run.flags, *(["--resume"] if action == "resume" else [])]
    line += ["--overwrite_output_dir"] if command.overwrite_output_dir else []
    line += ["--push_to_hub", "false"] if run.plan.training_args.push_to_hub else []  # the sweep pushes its winner only
    logger.info("%s=%s: %s (output in %s)", name, run.text, " ".join(line[1:]), log)
    with open(log, "w") as output:
        returncode = subprocess.run(line, stdout=output, stderr=subprocess.STDOUT).returncode
    if returncode != 0:
        lines = [text for text in log.read_text().splitlines() if text.strip()]
        label = f"seed {run.text}" if name == SEED else f"{name}={run.text}"
        raise ValueError(
            f"{label} failed (exit {returncode}): {lines[-1] if lines else '(no output)'} (full log: {log})"
        )


def _run_all(name: str, runs: list[SweepRun], plan: list[str], command: FinetuneCommand) -> Seconds:
    """Run (or resume) every run the plan does not keep, one after another, in this process or each in its own
    (`--process_per_run`); returns each run's wall time in seconds (None for a kept run)."""
    seconds: Seconds = []
    for index, (run, action) in enumerate(zip(runs, plan, strict=True), start=1):
        where = f"sweep run {index}/{len(runs)}: {name}={run.text} in {run.folder}"
        if action == "done":
            logger.info("%s finished before; kept.", where)
            seconds.append(None)
            continue
        logger.info("%s%s.", where, " (resuming)" if action == "resume" else "")
        log = _log_path(name, run, command)
        start = time.perf_counter()
        if command.process_per_run:
            _run_as_process(name, run, action, command, log)
        else:
            with _logging_to(log if run.plan.training_args.process_index == 0 else None):
                run_finetune(
                    _with_resume(run.plan, "last" if action == "resume" else None),
                    overwrite_output_dir=command.overwrite_output_dir,
                )
        seconds.append(time.perf_counter() - start)
        logger.info("%s: finished in %.0f s.", where, seconds[-1])
    return seconds


def _finish(
    name: str,
    runs: list[SweepRun],
    seconds: Seconds,
    command: FinetuneCommand,
    training_args: TrainingArguments,
) -> dict[str, Any]:
    """Process 0 summarises (and copies a winner); the others wait for its result (or its error) at the broadcast."""
    summary, error = None, None
    if training_args.process_index == 0:
        try:
            display = ["vit-ft", "finetune", *_command_line(command.flags, _RUN_OWN)]
            summary = write_results(name, runs, seconds, training_args, display, command.process_per_run)
        except (OSError, ValueError) as caught:
            error = caught
    if training_args.world_size > 1:
        summary, message = broadcast_object((summary, None if error is None else str(error)))
        if message is not None and error is None:
            raise OSError(f"process 0 could not finish the sweep: {message}")
    if error is not None:
        raise error
    return summary


def _check_sweep_kind(name: str, command: FinetuneCommand, training_args: TrainingArguments) -> None:
    """Refuse what a seed sweep or a run per process cannot do, before any run starts."""
    if name == SEED and training_args.push_to_hub:
        raise RecipeError(
            f"{SWEEP_FLAG} seed=... copies no model into {training_args.output_dir}, so there is nothing to push; "
            "drop --push_to_hub and push one seed's run later (vit-ft push OUTPUT/seed-N)."
        )
    if command.process_per_run and training_args.world_size > 1:
        raise RecipeError(
            f"{PROCESS_PER_RUN_FLAG} starts each run as a one-process command; run the sweep without "
            f"accelerate launch, or drop {PROCESS_PER_RUN_FLAG} to run every run on all processes."
        )


def _finished_summary(name: str, output_dir: Path) -> dict[str, Any] | None:
    """The summary of the finished sweep in `output_dir` (seeds.json for a seed sweep, else sweep.json beside
    the winner's finished model), or None when it has not finished."""
    summary = output_dir / (SEEDS_JSON if name == SEED else SWEEP_JSON)
    if not summary.is_file() or (name != SEED and not is_finished(output_dir)):
        return None
    try:
        return json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_sweep(command: FinetuneCommand) -> dict[str, Any]:
    """Run the sweep `command.sweep` (`ARG=V1,V2,...`) over the fine-tune the rest of `command` describes; returns
    sweep.json's content (seeds.json's for a seed sweep).

    `--resume` resumes the sweep, `--overwrite_output_dir` replaces a finished one, `--process_per_run` runs each
    run as its own command. Everything is parsed and checked before the first run starts.
    """
    name, texts = parse_sweep(command.sweep)
    training_args = command.parse()[2]
    resume = _resumes(training_args)
    _check_sweep_kind(name, command, training_args)
    output_dir = Path(training_args.output_dir)
    runs = sweep_runs(list(command.flags), name, texts, output_dir)  # each run's resume is set from the plan
    inputs = sorted({folder for run in runs for folder in run_inputs(*run.plan.arguments)})
    checks = (training_args, resume, command.overwrite_output_dir, inputs, name != SEED)
    check_sweep_output_dir(*checks)
    index, world_size = training_args.process_index, training_args.world_size
    with output_lock_in_process_zero(output_dir, "vit-ft finetune --sweep", index, world_size):
        check_sweep_output_dir(*checks)
        plan = _agreed_plan(runs, training_args, resume, command.overwrite_output_dir)
        finished = _finished_summary(name, output_dir) if all(action == "done" for action in plan) else None
        if finished is not None:  # --resume of a finished sweep: nothing to run, nothing rewritten
            logger.info(
                "%s: the sweep already finished, nothing to resume (its files are kept as they are). To run it "
                "again, pass --overwrite_output_dir without --resume, or another --output_dir.", output_dir,
            )  # fmt: skip
            return finished
        if index == 0:
            claim_output_dir(output_dir)
        if name != SEED and index == 0:  # until the new winner is copied, OUTPUT's model is not this sweep's
            mark_unfinished(output_dir)
        seconds = _run_all(name, runs, plan, command)
        summary = _finish(name, runs, seconds, command, training_args)
    log_results(name, summary, output_dir)
    return summary


def sweep_interrupted_message(output_dir: str | Path) -> str:
    """The one line to print on Ctrl-C during a sweep (cli.run_tool closes the progress bars first)."""
    return (
        f"interrupted; the sweep's finished runs are kept in {output_dir}. Run the same command with --resume to "
        "continue (the run in progress resumes from its last complete checkpoint)."
    )


__all__ = [
    "check_sweep_output_dir",
    "plan_runs",
    "run_sweep",
    "sweep_interrupted_message",
]
