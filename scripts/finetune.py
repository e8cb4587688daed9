#!/usr/bin/env python
"""Fine-tune a ViT from a recipe.

accelerate launch scripts/finetune.py --recipe dogs
accelerate launch scripts/finetune.py --recipe dogs --learning_rate 0.01 --image_size 448
accelerate launch scripts/finetune.py --recipe dogs --resume      # continue an interrupted run
python scripts/finetune.py --recipe digits                        # one process, the offline default
python scripts/finetune.py --list-recipes
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit_ft.hub import push_output_dir
from vit_ft.recipes import RecipeError, parse_args, recipe_name
from vit_ft.training import run_finetune


def recipe_from_argv(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--recipe" and i + 1 < len(argv):
            return recipe_name(argv[i + 1])
        if arg.startswith("--recipe="):
            return recipe_name(arg.split("=", 1)[1])
    return None


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --resume: continue from the last complete checkpoint-* in the output folder
    argv = [arg for a in argv for arg in (("--resume_from_checkpoint", "last") if a == "--resume" else (a,))]
    try:
        model_args, data_args, training_args = parse_args(argv)  # validates everything before any work
    except RecipeError as error:
        sys.exit(f"error: {error}")
    metrics = run_finetune(model_args, data_args, training_args, recipe=recipe_from_argv(argv))
    if training_args.push_to_hub and training_args.process_index == 0:  # one complete push, by process 0
        output_dir = Path(training_args.output_dir)
        url = push_output_dir(
            output_dir,
            training_args.hub_model_id or output_dir.name,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
        )
        print(f"Pushed {output_dir} to the Hub: {url}")
    return metrics


if __name__ == "__main__":
    main()
