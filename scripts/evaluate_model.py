#!/usr/bin/env python
"""Evaluate a fine-tuned model and write a report: `vit-ft evaluate`
(vit_ft/commands/evaluate.py), kept as a script path.

python scripts/evaluate_model.py --model outputs/digits --output_dir reports/digits    # the recorded test split
python scripts/evaluate_model.py --model outputs/digits --output_dir reports/digits-48 --image_size 48
python scripts/evaluate_model.py --model outputs/dogs-lora/adapter --output_dir reports/dogs --recipe dogs --split validation
python scripts/evaluate_model.py --model outputs/digits --output_dir reports/mine --data_dir my_digits/   # <class>/<image>
"""

from vit_ft.commands.evaluate import main

if __name__ == "__main__":
    main()
