"""Fine-tune a ViT from a recipe.

vit-ft finetune --recipe digits                                   # one process, the offline default
vit-ft finetune --recipe digits --overwrite_output_dir            # replace a finished run in the output folder
vit-ft finetune --recipe digits --sweep learning_rate=0.0003,0.003  # one run per value, best on validation
vit-ft finetune --list-recipes
accelerate launch -m vit_ft.commands.finetune --recipe dogs       # one process per GPU (or scripts/finetune.py)
accelerate launch -m vit_ft.commands.finetune --recipe dogs --learning_rate 0.01 --image_size 448
accelerate launch -m vit_ft.commands.finetune --recipe dogs --resume  # continue an interrupted run

A mistake prints one line, `error: <what is wrong>. <what to do>`, and exits 1; `--debug` (or VIT_FT_DEBUG=1)
shows the traceback instead. Ctrl-C exits 130. SIGTERM or SIGUSR1 (preemption) saves a checkpoint at the next
step, prints where it is and exits 75 (EX_TEMPFAIL): run the same command with --resume to continue.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from transformers import TrainingArguments

from ..tools.hub import push_output_dir
from ..training.argv import parse_command
from ..training.checkpoints import interrupted_message
from ..training.preemption import PREEMPTED_EXIT, Preempted
from ..training.stages import run_finetune
from ..training.sweep import run_sweep, sweep_interrupted_message
from ..utils.cli import run_tool
from ..utils.distributed import end_process_group
from ..utils.logs import setup_logging


def setup_training_logging(training_args: TrainingArguments) -> None:
    """Our messages at INFO on the main process, WARNING elsewhere; the libraries at `--log_level`."""
    setup_logging(
        level=logging.INFO if training_args.should_log else logging.WARNING,
        library_level=training_args.get_process_log_level(),
        loggers=("vit_ft", "__main__"),
    )


def push_finished_run(training_args: TrainingArguments) -> None:
    """One complete push of the finished output folder, with our model card, by process 0."""
    folder = Path(training_args.output_dir)
    try:
        url = push_output_dir(
            folder,
            training_args.hub_model_id or folder.name,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
        )
    except Exception as error:  # the Hub's own errors are not OSErrors; the run itself is saved
        raise OSError(
            f"the run finished and is saved in {folder}, but pushing it failed ({error}). "
            f"Push it later with: vit-ft push {folder} --hub_model_id {training_args.hub_model_id or folder.name}"
        ) from error
    print(f"Pushed {folder} to the Hub: {url}")


def finetune(argv: list[str], on_interrupt: list[Callable[[], str]]) -> dict:
    """Parse, train (one run, or a --sweep of runs) and push; `on_interrupt` receives what writes the Ctrl-C line."""
    command = parse_command(argv)
    model_args, data_args, training_args = command.parse()  # validates everything before any work
    setup_training_logging(training_args)
    try:
        if command.sweep is not None:  # one fine-tune per value; the winner is copied into output_dir, pushed
            on_interrupt.append(lambda: sweep_interrupted_message(training_args.output_dir))
            metrics = run_sweep(command)
        else:
            on_interrupt.append(lambda: interrupted_message(training_args.output_dir))
            metrics = run_finetune(
                model_args,
                data_args,
                training_args,
                recipe=command.recipe,
                overwrite_output_dir=command.overwrite_output_dir,
            )
    except Preempted as stop:  # saved at a step boundary: say where, and exit for a requeue (not an error)
        sys.stdout.flush()
        print(f"error: {stop}", file=sys.stderr)
        end_process_group()
        sys.exit(PREEMPTED_EXIT)
    if training_args.push_to_hub and training_args.process_index == 0:
        push_finished_run(training_args)
    end_process_group()
    return metrics


def main(argv: list[str] | None = None) -> None:
    """`vit-ft finetune ARGS` (and `python -m vit_ft.commands.finetune`, `scripts/finetune.py`): exits 0, 1, 130
    (Ctrl-C) or 75 (preempted by SIGTERM / SIGUSR1, saved: continue with --resume)."""
    on_interrupt: list[Callable[[], str]] = []
    run_tool(
        finetune,
        argv,
        interrupted=lambda: on_interrupt[0]() if on_interrupt else interrupted_message("the output folder"),
        on_interrupt=on_interrupt,
    )


if __name__ == "__main__":
    main()
