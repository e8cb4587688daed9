"""Evaluate a fine-tuned model and write a report: metrics, per-class table, confusion matrix, mistakes.

vit-ft evaluate --model outputs/digits --output_dir reports/digits    # the recorded test split
vit-ft evaluate --model outputs/digits --output_dir reports/digits-48 --image_size 48
vit-ft evaluate --model outputs/dogs-lora/adapter --output_dir reports/dogs --recipe dogs --split validation
vit-ft evaluate --model outputs/digits --output_dir reports/mine --data_dir my_digits/   # <class>/<image>
vit-ft evaluate --model outputs/digits-multilabel --output_dir reports/ml --data_dir photos/  # + labels.csv
vit-ft evaluate --model outputs/digits --output_dir reports/digits-c --shift corruptions   # + accuracy under shift
vit-ft evaluate --model outputs/digits --output_dir reports/digits-s --shift me/shifted-digits@v1   # a Hub dataset
(also `python scripts/evaluate_model.py ...`)

Writes REPORT/report.md (open it), metrics.json, per_class.csv/.md, confusion_matrix.png/.csv/.npy,
mistakes.png/.csv, predictions.csv, explained_mistakes.png (the most confident mistakes with a map for the predicted
and the true class: --explain) and a copy of the fine-tune's training_curves.png. A multi-label model
(evaluated on multi-label data: a --data_dir with labels.csv or labels.jsonl beside its images) gets mAP, micro
and macro F1 and exact match at its decision threshold, per-label AP/precision/recall/F1 (per_class.csv),
pr_curves.png, and its most confident false positives and false negatives (mistakes.csv,
false_positives.png, false_negatives.png) instead of the confusion matrix. REPORT may not be, nor
lie inside, the model's folder or a data folder the evaluation reads (refused before anything is written).
Only the evaluation's own files in REPORT are replaced, its other files are kept; a file of the evaluation's
names that an earlier evaluation did not write there is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..tools.arguments import add_data_arguments, add_inference_arguments
from ..tools.explain.names import REPORT_METHOD
from ..utils.cli import run_tool, tool_parser
from .model_flags import run_model_tool


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument("--output_dir", required=True, help="Folder for the report and its figures.")
    parser.add_argument(
        "--overwrite", action="store_true", help="Replace files of the report's names not written by it."
    )
    add_data_arguments(parser, "Evaluate")
    parser.add_argument("--split", choices=("validation", "test"), help="Default: test if the data has one.")
    add_inference_arguments(parser, batch_size=64)
    parser.add_argument(
        "--max_samples", type=int, help="Evaluate a seeded random subset of this many images."
    )
    parser.add_argument("--max_mistakes", type=int, default=25,
                        help="Mistakes shown in mistakes.png (multi-label: false positives and negatives, each).")  # fmt: skip
    parser.add_argument("--top_k", type=int, default=5, help="k of the top-k accuracy.")
    parser.add_argument("--tta", choices=("flip", "crops"),
                        help="Test-time augmentation: average the probabilities over the image and its mirror (flip: "
                        "models trained with flips only) or over it and five crops (crops).")  # fmt: skip
    parser.add_argument("--num_workers", type=int, default=0, help="Threads decoding images (0: none).")
    parser.add_argument("--shift", metavar="corruptions|FOLDER|HUB_ID",
                        help="Accuracy under shift beside the clean one: 'corruptions' (ImageNet-C's noise, blur, "
                        "photometric and digital corruptions at 3 severities, seeded by --seed), a folder of class "
                        "folders (your own shifted images) or a Hub dataset id (its test split, else validation, "
                        "else train; ID@REVISION pins one); shift.csv/.md/.png and a report section.")  # fmt: skip
    parser.add_argument("--explain", metavar="METHOD", default=REPORT_METHOD,
                        help="The report's grid of the 8 most confident mistakes, each with this method's map for the "
                        "predicted and the true class (multi-label: the wrong label's): gradcam (default: about one "
                        "forward + backward per map), grad_rollout, integrated_gradients, occlusion; none: no grid.")  # fmt: skip
    parser.add_argument("--label_separator", default=";",
                        help="The character between an image's labels in a --data_dir's labels.csv (multi-label).")  # fmt: skip
    return parser.parse_args(argv)


def evaluate(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.tools.evaluate.run.run_evaluation`; returns metrics.json's contents."""
    return run_model_tool(parse_args(argv), "vit_ft.tools.evaluate.run:run_evaluation")  # the flags are its parameters


def main(argv: list[str] | None = None) -> None:
    """`vit-ft evaluate ARGS` (and `scripts/evaluate_model.py`): exits 0, or 1 with one `error:` line."""
    run_tool(evaluate, argv)


if __name__ == "__main__":
    main()
