#!/usr/bin/env python
"""Predict the top-k labels of image files and folders: `vit-ft predict`
(vit_ft/commands/predict.py), kept as a script path.

python scripts/predict.py --model outputs/digits photos/ extra.jpg --output preds.csv
python scripts/predict.py --model outputs/dogs-lora photos/ --output preds.jsonl --top_k 3 --batch_size 64
"""

from vit_ft.commands.predict import main

if __name__ == "__main__":
    main()
