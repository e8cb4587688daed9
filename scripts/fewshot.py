#!/usr/bin/env python
"""Few-shot linear evaluation of a checkpoint's frozen features, as in the ViT paper: k images per class,
regularised least squares to {-1, 1}^K targets, test accuracy (mean ± std over seeds).

python scripts/fewshot.py --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot
python scripts/fewshot.py --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot-random --random_init
python scripts/fewshot.py --model google/vit-base-patch16-224-in21k --dataset uoft-cs/cifar10 --image_column img --output_dir reports/c10

--model: a vit_ft folder, a transformers ViTModel / ViTForImageClassification folder or Hub id (a backbone
with no head is fine), or a LoRA adapter folder. --dataset: a folder with train/ and test/ image folders
(<split>/<class name>/<image>), a save_to_disk folder, or a Hub dataset id. Writes OUTPUT/fewshot.md (the
table, also printed), fewshot.json and fewshot.png.
"""

from __future__ import annotations

import argparse

from vit_ft.utils.cli import add_inference_arguments, run_tool, setup_logging, tool_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from vit_ft.tools.fewshot import DEFAULT_SHOTS

    parser = tool_parser(__doc__)
    parser.add_argument(
        "--dataset", required=True, help="Folder with train/ and test/, save_to_disk folder or Hub id."
    )
    parser.add_argument(
        "--output_dir", required=True, help="Folder for fewshot.md, fewshot.json and fewshot.png."
    )
    parser.add_argument(
        "--shots", default=",".join(map(str, DEFAULT_SHOTS)), help="Images per class, comma list."
    )
    parser.add_argument(
        "--seeds", type=int, default=3, help="Random draws of the k-shot images (seeds 0..N-1)."
    )
    parser.add_argument(
        "--random_init", action="store_true", help="Same architecture, fresh weights (baseline)."
    )
    parser.add_argument(
        "--l2",
        help="l2 values to choose from on held-out train, comma list (one: fixed; default 2^-10..2^20).",
    )
    parser.add_argument(
        "--holdout_fraction", type=float, default=0.2, help="Part of each class held out to choose l2."
    )
    parser.add_argument(
        "--max_holdout_per_class", type=int, default=50, help="At most this many held out per class."
    )
    parser.add_argument("--dataset_config", help="Hub dataset configuration name.")
    parser.add_argument("--train_split", default="train", help="Hub dataset split to sample from.")
    parser.add_argument("--test_split", default="test", help="Hub dataset split to score on.")
    parser.add_argument("--image_column", default="image")
    parser.add_argument("--label_column", default="label")
    add_inference_arguments(parser, batch_size=64)
    parser.add_argument("--num_workers", type=int, default=0, help="Threads decoding images (0: none).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    setup_logging()
    from vit_ft.tools.fewshot import ShotResult, results_table, run_fewshot

    record = run_fewshot(**vars(args))  # the flags are its parameters
    rows = [
        ShotResult(r["shots"], r["accuracies"], r["l2"], r["holdout_accuracies"]) for r in record["results"]
    ]
    print(results_table(rows), end="")
    print(f"Wrote fewshot.md, fewshot.json and fewshot.png to {args.output_dir}")
    return record


if __name__ == "__main__":
    run_tool(main)
