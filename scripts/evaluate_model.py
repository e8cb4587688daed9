#!/usr/bin/env python
"""Evaluate a fine-tuned model and write a report: metrics, per-class table, confusion matrix, mistakes.

python scripts/evaluate_model.py --model outputs/digits --output_dir reports/digits    # the recorded test split
python scripts/evaluate_model.py --model outputs/digits --output_dir reports/digits-48 --image_size 48
python scripts/evaluate_model.py --model outputs/dogs-lora/adapter --output_dir reports/dogs --recipe dogs --split validation
python scripts/evaluate_model.py --model outputs/digits --output_dir reports/mine --data_dir my_digits/   # <class>/<image>

Writes REPORT/report.md (open it), metrics.json, per_class.csv/.md, confusion_matrix.png/.csv/.npy,
mistakes.png/.csv, predictions.csv and a copy of the fine-tune's training_curves.png.
"""

from __future__ import annotations

import argparse
import logging
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="vit_ft model folder, LoRA adapter folder, or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Folder for the report and its figures.")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--recipe", help="Evaluate on this recipe's data (name in recipes/ or a .yaml path).")
    data.add_argument(
        "--data_dir", help="Evaluate on an image folder laid out as <folder>/<class name>/<image>."
    )
    parser.add_argument("--split", choices=("validation", "test"), help="Default: test if the data has one.")
    parser.add_argument("--image_size", type=int, help="Test-time resolution (a multiple of the patch size).")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--max_samples", type=int, help="Evaluate a seeded random subset of this many images."
    )
    parser.add_argument("--max_mistakes", type=int, default=25, help="Mistakes shown in mistakes.png.")
    parser.add_argument("--top_k", type=int, default=5, help="k of the top-k accuracy.")
    parser.add_argument(
        "--seed", type=int, help="Data seed (default: the fine-tune's, read from the model folder)."
    )
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available).")
    parser.add_argument("--num_workers", type=int, default=0, help="Threads decoding images (0: none).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])  # fmt: skip
    logging.getLogger("vit_ft").setLevel(logging.INFO)
    from vit_ft.evaluation import run_evaluation

    return run_evaluation(
        args.model,
        args.output_dir,
        recipe=args.recipe,
        data_dir=args.data_dir,
        split=args.split,
        image_size=args.image_size,
        batch_size=args.batch_size,
        max_samples=args.max_samples,
        max_mistakes=args.max_mistakes,
        top_k=args.top_k,
        seed=args.seed,
        device=args.device,
        num_workers=args.num_workers,
    )


if __name__ == "__main__":
    main()
