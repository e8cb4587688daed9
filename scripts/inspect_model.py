#!/usr/bin/env python
"""Pictures of what a ViT learned (the ViT paper's Figure 7), plus attention rollout on given images.

python scripts/inspect_model.py --model outputs/digits --output_dir figures/digits
python scripts/inspect_model.py --model outputs/dogs --output_dir figures/dogs --images dog1.jpg dog2.jpg --num_images 64

Writes patch_embedding_pca.png (first 28 principal components of the patch filters), position_similarity.png
(a small map per patch position), attention_distance.png (mean attention distance per head against depth, on
a sample of the model's evaluation data, or --data_dir / --recipe / the --images), attention_rollout.png
(with --images) and inspection.json (the numbers behind the figures).
"""

import argparse

from vit_ft.utils.cli import add_data_arguments, add_inference_arguments, run_tool, setup_logging, tool_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument("--output_dir", required=True, help="Folder for the figures.")
    parser.add_argument("--images", nargs="*", default=[], help="Images for the attention-rollout overlays.")
    add_data_arguments(parser, "Sample the attention-distance images")
    parser.add_argument(
        "--num_images", type=int, default=32, help="Images the attention distances average over."
    )
    add_inference_arguments(parser, batch_size=16)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.num_images < 1:
        raise ValueError(
            f"--num_images {args.num_images} must be positive (the images the attention distances average over); "
            "pass e.g. --num_images 32."
        )
    setup_logging()
    from vit_ft.tools.inspection import run_inspection

    return run_inspection(**vars(args))  # the flags are its parameters


if __name__ == "__main__":
    run_tool(main)
