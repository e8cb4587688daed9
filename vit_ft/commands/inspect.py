"""Pictures of what a ViT learned (the ViT paper's Figure 7), plus attention rollout on given images.

vit-ft inspect --model outputs/digits --output_dir figures/digits
vit-ft inspect --model outputs/dogs --output_dir figures/dogs --images dog1.jpg dog2.jpg --num_images 64
(also `python scripts/inspect_model.py ...`)

Writes patch_embedding_pca.png (first 28 principal components of the patch filters), position_similarity.png
(a small map per patch position), attention_distance.png (mean attention distance per head against depth, on
a sample of the model's evaluation data, or --data_dir / --recipe / the --images), attention_rollout.png
(with --images) and inspection.json (the numbers behind the figures). --output_dir may not be, nor lie
inside, the model's folder or a data folder it reads (refused before anything is written). Only these files
are replaced there, its other files are kept; a file of these names that an earlier inspect did not write
there is replaced only with --overwrite.

vit-ft inspect --model outputs/digits --output_dir figures/why --images a.png b.png --explain grad_rollout --target 3
With --explain METHOD (grad_rollout, gradcam, integrated_gradients, occlusion: for --target CLASS, a class name
or index, default each image's predicted class; or the class-agnostic rollout) it writes only explanation.png
(the map over each of the --images) and explanation.json (the maps and probabilities). integrated_gradients and
occlusion need captum (pip install 'vit-ft[explain]').
"""

from __future__ import annotations

import argparse
from typing import Any

from ..tools.arguments import add_data_arguments, add_inference_arguments
from ..utils.cli import run_tool, tool_parser
from .model_flags import run_model_tool


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument("--output_dir", required=True, help="Folder for the figures.")
    parser.add_argument(
        "--overwrite", action="store_true", help="Replace files of the figures' names not written by inspect."
    )
    parser.add_argument("--images", nargs="*", default=[],
                        help="Images (files, folders, patterns) for the attention-rollout overlays.")  # fmt: skip
    parser.add_argument("--explain", metavar="METHOD",
                        help="Draw a class-specific map of the --images instead of Figure 7: grad_rollout, gradcam, "
                        "integrated_gradients, occlusion, or rollout (class-agnostic).")  # fmt: skip
    parser.add_argument("--target", metavar="CLASS",
                        help="With --explain: the class to explain (name or index; default: the predicted one).")  # fmt: skip
    add_data_arguments(parser, "Sample the attention-distance images")
    parser.add_argument(
        "--num_images", type=int, default=32, help="Images the attention distances average over."
    )
    add_inference_arguments(parser, batch_size=16)
    args = parser.parse_args(argv)
    if args.num_images < 1:
        raise ValueError(
            f"--num_images {args.num_images} must be positive (the images the attention distances average over); "
            "pass e.g. --num_images 32."
        )
    if args.target is not None and args.explain is None:
        raise ValueError(
            f"--target {args.target} names the class of an explanation: pass --explain METHOD with it."
        )
    if args.explain is not None:
        from ..tools.explain.names import check_method_name  # no torch: only the names

        check_method_name(args.explain)
    return args


def inspect(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.tools.inspect.run.run_inspection` (with --explain,
    `vit_ft.tools.explain.run.run_explanation`); returns inspection.json's (explanation.json's) contents."""
    args = parse_args(argv)
    if args.explain is not None:
        return run_model_tool(args, "vit_ft.tools.explain.run:run_explanation")
    del args.explain, args.target
    return run_model_tool(args, "vit_ft.tools.inspect.run:run_inspection")  # the flags are its parameters


def main(argv: list[str] | None = None) -> None:
    """`vit-ft inspect ARGS` (and `scripts/inspect_model.py`): exits 0, or 1 with one `error:` line."""
    run_tool(inspect, argv)


if __name__ == "__main__":
    main()
