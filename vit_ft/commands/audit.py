"""A data audit with a model's frozen features: training images with a wrong label (and the likely right one),
near-duplicates, copies of validation or test images (leaks) and outliers.

vit-ft audit --model outputs/digits-pretrained --dataset data/digits --output_dir reports/audit
vit-ft finetune --recipe digits --exclude reports/audit/relabel.csv     (then: train without them)
(also `python scripts/audit.py ...`)

--model: a vit_ft folder, a transformers ViT folder or Hub id (a backbone without a head is fine); best one
that never saw these labels. --dataset: a folder with train/ (and validation/, test/, searched for leaks) image
folders (<split>/<class name>/<image>, or multi-label: <split>/labels.csv beside the images), a save_to_disk
folder, or a Hub dataset id (single- or multi-label). Writes OUTPUT/findings.csv
(path, kind, score, given_label, suggested_label, other), relabel.csv (edit its action / label column, then pass
it as the fine-tune's --exclude), report.md with one image grid per kind, and audit.json; OUTPUT's other files
are kept, and a file of these names that an earlier audit did not write there is replaced only with --overwrite.
When the audit's self-check bounds its label issues' precision below 0.5 (or the model's features separate the
labels worse than the images' raw pixels, whose probe then finds the label issues) it prints one `warning:` line,
and with low precision relabel.csv proposes only the label issues scored where the self-check's flags were
mostly right. --oof finetune (only on request: minutes, not seconds) adds k-fold fine-tunes of --model as a
candidate beside the probes (each fold: --oof_steps steps of --oof_method full or lora on the other folds, the
family's fine-tuning protocol, --oof_flags last), chosen when its out-of-fold log-loss is lower; --folds 3 and
fewer steps make it cheaper.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..tools.arguments import add_inference_arguments
from ..utils.cli import run_tool, tool_parser
from ..utils.logs import setup_logging
from .model_flags import check_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument("--dataset", required=True, help="Folder with train/ (validation/, test/), save_to_disk folder or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Folder for findings.csv, relabel.csv, report.md.")
    parser.add_argument("--overwrite", action="store_true", help="Replace files of those names not written by audit.")
    parser.add_argument("--folds", type=int, default=5, help="k of the k-fold probes giving out-of-fold probabilities.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the folds.")
    parser.add_argument("--oof", choices=("probes", "finetune"), default="probes",
                        help="Out-of-fold probabilities from probes on frozen features and pixels (seconds), or also "
                        "from k-fold fine-tunes of the model (minutes; chosen when their log-loss is lower).")  # fmt: skip
    parser.add_argument("--oof_method", choices=("full", "lora"), help="With --oof finetune: each fold's method (full).")
    parser.add_argument("--oof_steps", type=int, help="With --oof finetune: optimizer steps per fold (200).")
    parser.add_argument("--oof_flags", help="With --oof finetune: more fine-tune flags, quoted, e.g. "
                        "--oof_flags='--recipe digits' (its protocol for the family's).")  # fmt: skip
    parser.add_argument("--oof_pick", choices=("loss", "finetune"), help="With --oof finetune: the source of lowest "
                        "out-of-fold log-loss (loss), or the fine-tunes whatever theirs (finetune: for a model that may "
                        "have been trained on these labels, whose probes fit the flips it learned).")  # fmt: skip
    parser.add_argument("--dataset_config", help="Hub dataset configuration name.")
    parser.add_argument("--train_split", default="train", help="Hub dataset split audited.")
    parser.add_argument("--validation_split", help="Hub dataset split searched for leaks.")
    parser.add_argument("--test_split", default="test", help="Hub dataset split searched for leaks.")
    parser.add_argument("--image_column", default="image")
    parser.add_argument("--label_column", default="label")
    add_inference_arguments(parser, batch_size=64)
    return parser.parse_args(argv)


def audit(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags, run `vit_ft.tools.audit.run_audit`, print the counts; returns audit.json's contents."""
    args = parse_args(argv)
    check_model(args.model)  # a missing or unfinished folder: one line, before loading anything
    from ..tools.audit import AuditOptions, AuditSource, run_audit

    options = AuditOptions(folds=args.folds, seed=args.seed, image_size=args.image_size, max_tokens=args.max_tokens,
                           batch_size=args.batch_size, device=args.device, bf16=args.bf16, oof=oof_finetune(args))  # fmt: skip
    source = AuditSource(args.dataset, args.dataset_config, args.train_split, args.validation_split,
                         args.test_split, args.image_column, args.label_column)  # fmt: skip
    setup_logging()
    record = run_audit(args.model, source, args.output_dir, options, overwrite=args.overwrite)
    counts = ", ".join(f"{count} {kind}" for kind, count in record["counts"].items())
    quality = record["quality"]
    warning = warning_line(quality, finetuned=options.oof is not None)
    if warning:  # one line, before anything else the command prints
        print(warning, file=sys.stderr)
    print(f"Label audit: out-of-fold accuracy {quality['accuracy']:.3f}, estimated noise rate "
          f"{quality['noise_rate']:.3f}, estimated precision {quality['precision']:.2f}.")  # fmt: skip
    print(f"Audit of {record['num_train_images']} training images: {counts}.")
    print(f"Wrote findings.csv, relabel.csv and report.md to {args.output_dir}; fine-tune without them with "
          f"--exclude {args.output_dir}/relabel.csv")  # fmt: skip
    return record


def oof_finetune(args: argparse.Namespace) -> Any:
    """`--oof finetune`'s settings (`tools.audit.finetune.OofFinetune`, with the fine-tune's own plan and stages
    handed in: tools do not import training), or None; an `--oof_*` flag without it is a ValueError."""
    given = [f"--{name}" for name in ("oof_method", "oof_steps", "oof_flags", "oof_pick") if getattr(args, name) is not None]
    if args.oof != "finetune":
        if given:
            raise ValueError(f"{', '.join(given)} only apply with --oof finetune; add it, or leave them out.")
        return None
    import shlex

    from ..arguments.recipes import build_plan
    from ..tools.audit.finetune import OOF_STEPS, FineTuner, OofFinetune
    from ..training.stages import run_finetune

    steps = OOF_STEPS if args.oof_steps is None else args.oof_steps
    flags = tuple(shlex.split(args.oof_flags or ""))
    return OofFinetune(FineTuner(build_plan, run_finetune), args.oof_method or "full", steps, flags, args.oof_pick or "loss")


def warning_line(quality: dict[str, Any], finetuned: bool = False) -> str:
    """The one `warning:` line of an audit whose label issues cannot be trusted as they are ("" when none): the
    self-check's precision below the floor, or the model's features weaker than raw pixels (the flags then come
    from a probe on the pixels); it names `--oof finetune` where the audit ran without (`finetuned`)."""
    reasons = []
    if quality.get("weaker_than_pixels"):
        reasons.append(f"the model's features separate these labels worse than raw pixels (out-of-fold log-loss "
                       f"{quality['features_log_loss']:.2f}, pixels' chosen instead): a backbone that knows this data "
                       "would audit it better")  # fmt: skip
    if quality["low_precision"]:
        reasons.append(f"the audit's estimated precision on label issues is {quality['precision']:.2f} (lower bound "
                       f"{quality['precision_low']:.2f}, below {quality['precision_floor']}; out-of-fold accuracy "
                       f"{quality['accuracy']:.2f}): most flagged labels are probably right; relabel.csv proposes "
                       f"{quality['proposed']} relabels")  # fmt: skip
    if reasons and not finetuned:
        reasons.append("--oof finetune adds k-fold fine-tunes of the model as a candidate")
    return f"warning: {'; '.join(reasons)}; see report.md." if reasons else ""


def main(argv: list[str] | None = None) -> None:
    """`vit-ft audit ARGS` (and `scripts/audit.py`): exits 0, or 1 with one `error:` line."""
    run_tool(audit, argv)


if __name__ == "__main__":
    main()
