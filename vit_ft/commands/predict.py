"""Predict the top-k labels of image files and folders; one CSV or JSONL row per file.

vit-ft predict --model outputs/digits photos/ extra.jpg --output preds.csv
vit-ft predict --model outputs/dogs-lora photos/ --output preds.jsonl --top_k 3 --batch_size 64
(also `python scripts/predict.py ...`)

Folders are searched recursively for image files. Columns: path, label, score (top-1), top_k_labels,
top_k_scores (JSON arrays in CSV, highest first), error (why a file could not be read; then no labels).
A multi-label model's rows list every label whose probability (sigmoid) is at or above its decision threshold
(the model's, tuned on its validation split): path, labels, scores (JSON arrays in CSV, highest first;
empty when no label reaches it), num_labels (0 then), threshold (one number, or {label: threshold}), error.
Also writes a grid of the first predicted images next to the output (preds.csv -> preds.png; --figure names
it). Neither file may replace an input, nor an existing file that predict did not write (a CSV without its
header row, a PNG without its mark, ...) unless you pass --overwrite; a file from an earlier predict run is
replaced. With --explain METHOD (grad_rollout, gradcam, integrated_gradients, occlusion, rollout: see vit-ft inspect
--explain) each image's map for its predicted class goes beside the output (preds.csv -> preds.maps.jsonl: image,
method, target, probability, map as rows of patches). The output appears only once complete: an existing file with its name is kept as it was when the
run fails or is interrupted (a full disk too), and no hidden .part file is left.
"""

from __future__ import annotations

import argparse
import signal
from typing import Any

from ..tools.arguments import add_inference_arguments
from ..utils.cli import optional_int, run_tool, tool_parser
from ..utils.limits import DEFAULT_MAX_PIXELS
from ..utils.logs import setup_logging
from .model_flags import check_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument("inputs", nargs="+", help="Image files and folders.")
    parser.add_argument(
        "--output", required=True, help="preds.csv or preds.jsonl (the suffix picks the format)."
    )
    parser.add_argument("--top_k", type=int, default=5,
                        help="Labels per image (single-label models; a multi-label model lists those above threshold).")  # fmt: skip
    add_inference_arguments(parser, batch_size=32)
    parser.add_argument("--num_workers", type=int, default=0, help="Threads decoding images (0: none).")
    parser.add_argument("--max_pixels", type=optional_int, default=DEFAULT_MAX_PIXELS,
                        help="Files with more pixels get an error row (decompression-bomb guard); 'none' disables.")  # fmt: skip
    parser.add_argument("--figure", default="auto",
                        help="PNG grid of the first predicted images (default 'auto': the --output name with .png, "
                        "preds.csv -> preds.png); 'none' writes none. Never an input file.")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace an existing --output or --figure file that predict did not write.")  # fmt: skip
    parser.add_argument("--tta", choices=("flip", "crops"),
                        help="Test-time augmentation: average the probabilities over the image and its mirror (flip: "
                        "models trained with flips only) or over it and five crops (crops).")  # fmt: skip
    parser.add_argument("--explain", metavar="METHOD",
                        help="Also write each image's map for its predicted class beside --output (preds.csv -> "
                        "preds.maps.jsonl): grad_rollout, gradcam, integrated_gradients, occlusion or rollout.")  # fmt: skip
    args = parser.parse_args(argv)
    if args.explain is not None:
        from ..tools.explain.names import check_method_name  # no torch: only the names

        check_method_name(args.explain)
    return args


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (kill, Slurm, Kubernetes) ends the run as Ctrl-C does: .part removed


def predict(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.tools.predict.run.run_prediction`; returns its summary."""
    args = parse_args(argv)
    check_model(args.model)  # a missing or unfinished folder: one line, before loading anything
    setup_logging()
    from ..tools.predict.run import run_prediction

    return run_prediction(
        args.model,
        args.inputs,
        args.output,
        top_k_labels=args.top_k,
        batch_size=args.batch_size,
        image_size=args.image_size,
        device=args.device,
        num_workers=args.num_workers,
        max_pixels=args.max_pixels,
        figure=None if args.figure.lower() == "none" else args.figure,
        max_tokens=args.max_tokens,
        bf16=args.bf16,
        overwrite=args.overwrite,
        tta=args.tta,
        explain=args.explain,
    )


def main(argv: list[str] | None = None) -> None:
    """`vit-ft predict ARGS` (and `scripts/predict.py`): exits 0, or 1 with one `error:` line."""
    signal.signal(signal.SIGTERM, _terminated)
    run_tool(predict, argv)


if __name__ == "__main__":
    main()
