#!/usr/bin/env python
"""Fine-tune a ViT from a recipe.

accelerate launch scripts/finetune.py --recipe dogs
accelerate launch scripts/finetune.py --recipe dogs --learning_rate 0.01 --image_size 448
accelerate launch scripts/finetune.py --recipe dogs --resume      # continue an interrupted run
python scripts/finetune.py --recipe digits                        # one process, the offline default
python scripts/finetune.py --recipe digits --overwrite_output_dir # replace a finished run in the output folder
python scripts/finetune.py --recipe digits --sweep learning_rate=0.0003,0.003  # one run per value, best on validation
python scripts/finetune.py --list-recipes

A mistake prints one line, `error: <what is wrong>. <what to do>`, and exits 1; `--debug` (or VIT_FT_DEBUG=1)
shows the traceback instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vit_ft.tools.hub import push_output_dir
from vit_ft.training.recipes import parse_args, recipe_name, take_switch
from vit_ft.training.stages import end_process_group, interrupted_message, run_finetune
from vit_ft.training.sweep import run_sweep, sweep_interrupted_message, take_sweep
from vit_ft.utils.cli import run_tool


def recipe_from_argv(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--recipe" and i + 1 < len(argv):
            return recipe_name(argv[i + 1])
        if arg.startswith("--recipe="):
            return recipe_name(arg.split("=", 1)[1])
    return None


def finetune(argv: list[str], on_interrupt: list[Callable[[], str]]) -> dict:
    """Parse, train (one run, or a --sweep of runs) and push; `on_interrupt` receives what writes the Ctrl-C line."""
    overwrite, argv = take_switch(argv, "overwrite_output_dir")
    sweep, argv = take_sweep(argv)
    # --resume: continue from the last complete checkpoint-* in the output folder
    argv = [arg for a in argv for arg in (("--resume_from_checkpoint", "last") if a == "--resume" else (a,))]
    model_args, data_args, training_args = parse_args(argv)  # validates everything before any work
    if sweep is not None:  # one fine-tune per value; the winner is copied into output_dir, which is pushed
        on_interrupt.append(lambda: sweep_interrupted_message(training_args.output_dir))
        metrics = run_sweep(argv, sweep, recipe=recipe_from_argv(argv), overwrite_output_dir=overwrite)
    else:
        on_interrupt.append(lambda: interrupted_message(training_args.output_dir))
        metrics = run_finetune(
            model_args,
            data_args,
            training_args,
            recipe=recipe_from_argv(argv),
            overwrite_output_dir=overwrite,
        )
    if training_args.push_to_hub and training_args.process_index == 0:  # one complete push, by process 0
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
                f"Push it later with: python scripts/push_to_hub.py {folder}"
            ) from error
        print(f"Pushed {folder} to the Hub: {url}")
    end_process_group()
    return metrics


def main(argv: list[str] | None = None) -> None:
    on_interrupt: list[Callable[[], str]] = []
    run_tool(
        finetune,
        argv,
        interrupted=lambda: on_interrupt[0]() if on_interrupt else interrupted_message("the output folder"),
        on_interrupt=on_interrupt,
    )


if __name__ == "__main__":
    main()
