#!/usr/bin/env python
"""Fine-tune a ViT from a recipe: `vit-ft finetune` (vit_ft/commands/finetune.py), kept as a script path for
`accelerate launch`.

accelerate launch scripts/finetune.py --recipe dogs
accelerate launch scripts/finetune.py --recipe dogs --learning_rate 0.01 --image_size 448
accelerate launch scripts/finetune.py --recipe dogs --resume      # continue an interrupted run
python scripts/finetune.py --recipe digits                        # one process, the offline default
python scripts/finetune.py --recipe digits --overwrite_output_dir # replace a finished run in the output folder
python scripts/finetune.py --recipe digits --sweep learning_rate=0.0003,0.003  # one run per value, best on validation
python scripts/finetune.py --list-recipes
"""

from vit_ft.commands.finetune import main

if __name__ == "__main__":
    main()
