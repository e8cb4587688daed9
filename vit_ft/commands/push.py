"""Push a fine-tune output folder to the Hugging Face Hub: weights, config, processor, labels and model card.

vit-ft push OUTPUT_DIR --hub_model_id me/vit-dogs                      # plain ViT where the model is one
vit-ft push OUTPUT_DIR --hub_model_id me/vit-dogs --format vit_ft      # vit-ft's code (trust_remote_code)
vit-ft push OUTPUT_DIR --hub_model_id me/vit-dogs --local_dir staged   # look, don't push
vit-ft push OUTPUT_DIR --hub_model_id me/vit-dogs --evaluation REPORT   # + the card's robustness table
(also `python scripts/push_to_hub.py ...`)

The default (--format auto) pushes transformers' own ViTForImageClassification wherever the model is exactly
one (a plain ViT with CLS pooling): it loads with pipeline() and runs in the Hub's widget, no remote code. A
model transformers cannot express (mean pooling, ...) is pushed with vit-ft's code, and its card says why.
Log in first (`hf auth login`) or set HF_TOKEN. Checkpoints, runs and pickles are never uploaded.
"""

from __future__ import annotations

import argparse

from ..tools.export.formats import AUTO, FORMAT_CHOICES
from ..utils.cli import ToolArgumentParser, run_tool
from ..utils.logs import setup_logging
from .model_flags import check_finished


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolArgumentParser(__doc__)
    parser.add_argument("output_dir", help="a fine-tune output folder (or a LoRA adapter folder)")
    parser.add_argument("--hub_model_id", required=True, help="the repository, e.g. me/vit-dogs")
    parser.add_argument(
        "--format",
        choices=FORMAT_CHOICES,
        default=AUTO,
        help="auto (default): transformers' ViT where the model is exactly one, else vit_ft; transformers: a "
        "standard ViT (no remote code); vit_ft: vit-ft's code with auto_map (trust_remote_code=True)",
    )
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--token", default=None, help="a Hub write token (default: the logged-in one)")
    parser.add_argument("--revision", default=None, help="the branch to push to (default: main)")
    parser.add_argument("--commit_message", default="Upload fine-tuned ViT with vit-ft")
    parser.add_argument(
        "--local_dir", default=None, help="write the folder that would be pushed here; push nothing"
    )
    parser.add_argument("--evaluation", default=None, help="the --output_dir of a `vit-ft evaluate --shift` of this "
                        "model: the card shows its clean and shifted accuracy and relative error")  # fmt: skip
    return parser.parse_args(argv)


def push(argv: list[str] | None = None) -> str:
    """Stage (with --local_dir) or push the folder; returns the staged folder or the commit URL."""
    args = parse_args(argv)
    check_finished(args.output_dir, "push")  # an unfinished run: its lock holder or last checkpoint, one line
    setup_logging(timestamps=False)
    from ..tools.export.hub import push_output_dir, stage_for_hub  # after the flags: --help needs no torch

    if args.local_dir:
        staged = stage_for_hub(args.output_dir, args.local_dir, args.hub_model_id, args.format, args.evaluation)
        print(f"Staged {args.output_dir} for {args.hub_model_id} in {staged}")
        return str(staged)
    url = push_output_dir(
        args.output_dir,
        args.hub_model_id,
        format=args.format,
        token=args.token,
        private=True if args.private else None,
        commit_message=args.commit_message,
        revision=args.revision,
        evaluation=args.evaluation,
    )
    print(f"Pushed {args.output_dir}: {url}")
    return url


def main(argv: list[str] | None = None) -> None:
    """`vit-ft push ARGS` (and `scripts/push_to_hub.py`): exits 0, or 1 with one `error:` line."""
    run_tool(push, argv)


if __name__ == "__main__":
    main()
