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

from vit_ft.recipes import parse_args, recipe_name
from vit_ft.training import run_finetune


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --resume: continue from the last checkpoint-* in the output folder
    argv = [arg for a in argv for arg in (("--resume_from_checkpoint", "last") if a == "--resume" else (a,))]
    model_args, data_args, training_args = parse_args(argv)  # validates everything before any work
    recipe = argv[argv.index("--recipe") + 1] if "--recipe" in argv else None
    return run_finetune(model_args, data_args, training_args, recipe=recipe_name(recipe) if recipe else None)


if __name__ == "__main__":
    main()
