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
import logging
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="vit_ft model folder, LoRA adapter folder, or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Folder for the figures.")
    parser.add_argument("--images", nargs="*", default=[], help="Images for the attention-rollout overlays.")
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--recipe", help="Sample the attention-distance images from this recipe's data.")
    data.add_argument("--data_dir", help="Sample them from an image folder <folder>/<class name>/<image>.")
    parser.add_argument(
        "--num_images", type=int, default=32, help="Images the attention distances average over."
    )
    parser.add_argument("--image_size", type=int, help="Input resolution (a multiple of the patch size).")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seed", type=int, help="Seed of the data sample (default: the fine-tune's).")
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])  # fmt: skip
    logging.getLogger("vit_ft").setLevel(logging.INFO)
    from vit_ft.inspection import run_inspection

    return run_inspection(
        args.model,
        args.output_dir,
        images=args.images,
        recipe=args.recipe,
        data_dir=args.data_dir,
        num_images=args.num_images,
        image_size=args.image_size,
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
    )


if __name__ == "__main__":
    main()
