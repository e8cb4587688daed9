"""Export a trained model for serving: ONNX (onnxruntime), optionally with a dynamic-int8 copy for CPUs.

vit-ft export --model outputs/digits --output_dir outputs/digits-onnx                  # model.onnx
vit-ft export --model outputs/digits --output_dir outputs/digits-onnx --quantize int8  # + model.int8.onnx
vit-ft export --model outputs/digits --output_dir outputs/digits-onnx --quantize int8 --evaluate test
vit-ft export --model outputs/digits --output_dir outputs/digits-onnx --report          # + deployment.md
(also `python scripts/export.py ...`; needs `pip install 'vit-ft[export]'`)

Writes model.onnx (input `pixel_values`, output `logits`; dynamic batch, and dynamic height and width where the
export reproduces PyTorch's position-embedding resampling, else the fine-tuned resolution: the last line says
which), preprocessor_config.json (the resize and normalisation the graph expects) and config.json (id2label).
Every graph is run with onnxruntime against PyTorch before the folder is written; --evaluate SPLIT then prints
the top-1 accuracy of PyTorch and of each graph on that split of the fine-tune's recorded data. --output_dir
lies outside the model's folder; --report [SPLIT] (default test; writes the int8 graph too) adds deployment.md
and deployment.json: per runtime (PyTorch eager and compiled, onnxruntime and OpenVINO fp32 and int8) the
accuracy on that split, agreement with PyTorch, latency at batch 1, images/s at batch 32 on this host, and
whether int8 is recommended (OpenVINO: pip install 'vit-ft[deploy]', else its rows say so). Only the
export's files there are written (--overwrite replaces an earlier export, or a file of the export's names), the
folder's other files are kept.
"""

from __future__ import annotations

import argparse

from ..tools.export.formats import REPORT_REPEATS, REPORT_WARMUP
from ..utils.cli import run_tool, tool_parser
from ..utils.logs import setup_logging
from .model_flags import check_model

FORMATS = ("onnx",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument(
        "--output_dir", required=True, help="Folder for the exported model (its other files are kept)."
    )
    parser.add_argument("--format", choices=FORMATS, default="onnx", help="onnx (the only format so far).")
    parser.add_argument("--quantize", choices=("int8",), default=None,
                        help="int8: also write model.int8.onnx, onnxruntime's dynamic int8 quantisation.")  # fmt: skip
    parser.add_argument(
        "--overwrite", action="store_true", help="Replace an earlier export (or files of its names) there."
    )
    parser.add_argument("--evaluate", metavar="SPLIT", default=None,
                        help="Then measure top-1 accuracy of PyTorch and of each graph on this split of the "
                        "fine-tune's recorded data (e.g. test).")  # fmt: skip
    parser.add_argument("--report", metavar="SPLIT", nargs="?", const="test", default=None,
                        help="Also write deployment.md/.json: every runtime's accuracy on SPLIT (default test), "
                        "agreement with PyTorch, latency and throughput here, the int8 recommendation; "
                        "implies --quantize int8.")  # fmt: skip
    parser.add_argument("--report_warmup", type=int, default=None, metavar="N",
                        help="--report: untimed calls per runtime before timing, the first compiles (default "
                        f"{REPORT_WARMUP}).")  # fmt: skip
    parser.add_argument("--report_repeats", type=int, default=None, metavar="N",
                        help="--report: timed calls per runtime and batch size, their median reported (default "
                        f"{REPORT_REPEATS}; fewer for a large model on a CPU).")  # fmt: skip
    args = parser.parse_args(argv)
    timing = {"--report_warmup": args.report_warmup, "--report_repeats": args.report_repeats}
    given = [flag for flag, value in timing.items() if value is not None]
    if given and not args.report:
        parser.error(f"{given[0]} sets how --report times the runtimes; add --report.")
    args.report_warmup = REPORT_WARMUP if args.report_warmup is None else args.report_warmup
    args.report_repeats = REPORT_REPEATS if args.report_repeats is None else args.report_repeats
    if args.report_warmup < 0 or args.report_repeats < 1:
        parser.error(f"--report_warmup {args.report_warmup}, --report_repeats {args.report_repeats}: use a "
                     "warm-up of 0 or more and at least 1 repeat.")  # fmt: skip
    return args


def export(argv: list[str] | None = None) -> str:
    """Parse the flags and run `vit_ft.tools.export.onnx.export_onnx`; returns its summary line."""
    args = parse_args(argv)
    check_model(args.model)  # a missing or unfinished folder: one line, before loading anything
    setup_logging(timestamps=False)
    from ..tools.export.onnx import check_export_dir, export_onnx, require_onnxruntime
    from ..tools.export.onnx_runtime import check_evaluation, compare_accuracy
    from ..tools.trained import load_trained

    require_onnxruntime()  # before the model loads: the one line names the install command
    check_export_dir(args.output_dir, args.model, args.overwrite)
    trained = load_trained(args.model, device="cpu", merge_lora=True)  # once: the export and --evaluate use it
    if args.evaluate:
        check_evaluation(trained)  # a multi-label model: refused before anything is written
    report = None
    if args.report:  # measured on the staged graphs, written beside them: moved into place together
        from ..tools.export.report import DeploymentReport

        check_evaluation(trained, "--report")
        report = DeploymentReport(args.report, warmup=args.report_warmup, repeats=args.report_repeats)
        report.check(trained)  # a split the fine-tune did not record: one line, before the export's minutes
    quantize = "int8" if args.report else args.quantize
    summary = export_onnx(trained, args.output_dir, quantize, args.overwrite, report=report).summary()
    if report is not None:
        summary += "\n" + report.summary()
    print(summary)
    if args.evaluate:
        line = accuracy_line(compare_accuracy(trained, args.output_dir, args.evaluate))
        print(line)
        summary += "\n" + line
    return summary


def accuracy_line(result: dict) -> str:
    """`compare_accuracy`'s result as one line: each runtime's accuracy, then each graph's agreement."""
    accuracy = ", ".join(f"{name} {value:.4f}" for name, value in result["accuracy"].items())
    agreement = ", ".join(f"{name} {value:.1%}" for name, value in result["agreement_with_pytorch"].items())
    return (
        f"Top-1 accuracy on {result['split']} ({result['num_images']} images): {accuracy}; top-1 equal to "
        f"PyTorch's: {agreement}."
    )


def main(argv: list[str] | None = None) -> None:
    """`vit-ft export ARGS` (and `scripts/export.py`): exits 0, or 1 with one `error:` line."""
    run_tool(export, argv)


if __name__ == "__main__":
    main()
