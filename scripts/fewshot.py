#!/usr/bin/env python
"""Few-shot linear evaluation of a checkpoint's frozen features (the ViT paper's probe): `vit-ft fewshot`
(vit_ft/commands/fewshot.py), kept as a script path.

python scripts/fewshot.py --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot
python scripts/fewshot.py --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot-random --random_init
python scripts/fewshot.py --model google/vit-base-patch16-224-in21k --dataset uoft-cs/cifar10 --image_column img --output_dir reports/c10
"""

from vit_ft.commands.fewshot import main

if __name__ == "__main__":
    main()
