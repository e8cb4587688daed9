"""Few-shot linear evaluation of a checkpoint's frozen features, as in the ViT paper: k images per class,
regularised least squares to {-1, 1}^K targets, test accuracy (mean ± std over seeds).

vit-ft fewshot --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot
vit-ft fewshot --model outputs/digits-pretrained --dataset data/digits --output_dir reports/fewshot-random --random_init
vit-ft fewshot --model google/vit-base-patch16-224-in21k --dataset uoft-cs/cifar10 --image_column img --output_dir reports/c10
(also `python scripts/fewshot.py ...`)

--model: a vit_ft folder, a transformers ViTModel / ViTForImageClassification folder or Hub id (a backbone
with no head is fine), or a LoRA adapter folder. --dataset: a folder with train/ and test/ image folders
(<split>/<class name>/<image>), a save_to_disk folder, or a Hub dataset id. Writes OUTPUT/fewshot.md (the
table, also printed), fewshot.json and fewshot.png; OUTPUT's other files are kept, and a file of these names
that an earlier fewshot did not write there is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from ..tools.arguments import add_inference_arguments
from ..utils.cli import run_tool, tool_parser
from ..utils.logs import setup_logging
from .model_flags import check_model

DEFAULT_SHOTS = "1,5,10,25"  # the ViT paper's few-shot settings (`vit_ft.tools.fewshot.DEFAULT_SHOTS`)


def parse_shots(text: str | Sequence[int]) -> tuple[int, ...]:
    """ "1,5,10,25" (or a sequence of ints) -> (1, 5, 10, 25), sorted and unique; anything else a ValueError."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(v) for v in text]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(
            f"--shots {text if isinstance(text, str) else ','.join(parts)} must be a comma list of positive "
            "numbers of images per class, e.g. --shots 1,5,10,25."
        )
    return tuple(sorted(set(values)))


def parse_l2(text: str | Sequence[float]) -> tuple[float, ...]:
    """ "0.1,1,10" (or a sequence of numbers) -> (0.1, 1.0, 10.0); anything but positive finite numbers is a
    ValueError."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(v) for v in text]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if not values or min(values) <= 0 or not all(math.isfinite(v) for v in values):
        raise ValueError(
            f"--l2 {','.join(parts)} must be a comma list of positive regularisation strengths, e.g. --l2 1024 "
            "(one value: no selection) or --l2 0.1,1,10,100."
        )
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument(
        "--dataset", required=True, help="Folder with train/ and test/, save_to_disk folder or Hub id."
    )
    parser.add_argument(
        "--output_dir", required=True, help="Folder for fewshot.md, fewshot.json and fewshot.png."
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="Replace files of those names not written by fewshot."
    )
    parser.add_argument("--shots", default=DEFAULT_SHOTS, help="Images per class, comma list.")
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


def fewshot(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags, run `vit_ft.tools.fewshot.run_fewshot`, print the table; returns fewshot.json's contents."""
    args = parse_args(argv)
    check_model(args.model)  # a missing or unfinished folder: one line, before loading anything
    shots = parse_shots(args.shots)
    l2 = {} if args.l2 is None else {"l2_grid": parse_l2(args.l2)}
    from ..reports.fewshot import results_table
    from ..tools.fewshot import FewShotOptions, FewShotSource, run_fewshot

    options = FewShotOptions(  # checks the settings before any model or data loads
        shots=shots, seeds=args.seeds, holdout_fraction=args.holdout_fraction,
        max_holdout_per_class=args.max_holdout_per_class, random_init=args.random_init, image_size=args.image_size,
        max_tokens=args.max_tokens, batch_size=args.batch_size, device=args.device, bf16=args.bf16,
        num_workers=args.num_workers, **l2,
    )  # fmt: skip
    source = FewShotSource(args.dataset, args.dataset_config, args.train_split, args.test_split,
                           args.image_column, args.label_column)  # fmt: skip
    setup_logging()
    record = run_fewshot(args.model, source, args.output_dir, options, overwrite=args.overwrite)
    print(results_table(record["results"]), end="")
    print(f"Wrote fewshot.md, fewshot.json and fewshot.png to {args.output_dir}")
    return record


def main(argv: list[str] | None = None) -> None:
    """`vit-ft fewshot ARGS` (and `scripts/fewshot.py`): exits 0, or 1 with one `error:` line."""
    run_tool(fewshot, argv)


if __name__ == "__main__":
    main()
