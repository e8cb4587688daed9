"""The VTAB-1k / FGVC benchmark of the fine-tuning methods: a grid of fine-tunes under V-PETL Bench's protocol.

vit-ft bench vtab1k --model google/vit-base-patch16-224-in21k --output_dir outputs/bench-vtab
vit-ft bench fgvc --model google/vit-base-patch16-224-in21k --methods lora,ssf,vpt --seeds 0,1,2 --output_dir outputs/bench-fgvc
vit-ft bench vtab1k ... --tasks cifar100,dtd --dataset dtd=OWNER/NAME@REV -- --bf16 true   # fine-tune flags after --

Each cell (method x task x seed) is an ordinary fine-tune into OUTPUT/runs/<task>/<method>-seed<N>; its result
goes to OUTPUT/results/, and OUTPUT/results.md / results.json hold the table (per task, per group, the mean)
beside the published rows, with versions, hardware and seeds. Run it again to go on: finished cells are kept.
The tasks, their Hub datasets and the protocol: vit_ft/bench/suites.py and protocols.py.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..utils.cli import ToolArgumentParser, run_tool

SUITE_NAMES = ("vtab1k", "fgvc")  # vit_ft.bench.suites.SUITES, named here without importing datasets


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers such as 0,1,2, got {text!r}.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds takes distinct comma-separated integers such as 0,1,2, got {text!r}.")
    return seeds


def _pin(text: str) -> tuple[str, str]:
    task, sep, source = text.partition("=")
    if not sep or not task or not source:
        raise argparse.ArgumentTypeError(f"--dataset {text!r}: give TASK=OWNER/NAME or TASK=OWNER/NAME@REVISION.")
    return task, source


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The command's flags, and the fine-tune flags after `--`."""
    argv = list(argv or [])
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = ToolArgumentParser(__doc__)
    parser.add_argument("suite", choices=SUITE_NAMES, help="The suite: vtab1k (19 tasks) or fgvc (5 sets).")
    parser.add_argument("--model", required=True, help="The pre-trained checkpoint: folder or Hub id.")
    parser.add_argument("--output_dir", required=True, help="The harness's folder (data, runs, results).")
    parser.add_argument("--methods", type=_names, help="Comma-separated --method values (default linear,full,lora,ssf,vpt).")
    parser.add_argument("--tasks", type=_names, help="Comma-separated task names (default: all of the suite).")
    parser.add_argument("--seeds", type=_seeds, default=[0], help="Comma-separated seeds (default 0).")
    parser.add_argument("--dataset", type=_pin, action="append", default=[], metavar="TASK=ID[@REV]",
                        help="A task's Hub dataset (and revision) instead of the table's; repeatable.")  # fmt: skip
    parser.add_argument("--train_size", type=int, help="Training images per task (VTAB-1k: 800); smaller for a smoke run.")
    parser.add_argument("--validation_size", type=int, help="Validation images per task (VTAB-1k: 200).")
    parser.add_argument("--max_test", type=int, help="A seeded subset of this many test images per task.")
    return parser.parse_args(argv), extra


def bench(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.bench.run.run_bench`; returns the table's summary."""
    args, extra = parse_args(argv)
    sizes = {k: getattr(args, k) for k in ("train_size", "validation_size", "max_test") if getattr(args, k) is not None}
    for key, value in sizes.items():
        if value < 1:
            raise ValueError(f"--{key} must be a positive number of images, got {value}.")
    from ..utils.logs import setup_logging

    setup_logging()
    from ..bench.run import run_bench

    return run_bench(args.suite, args.model, args.output_dir, methods=args.methods, tasks=args.tasks, seeds=args.seeds,
                     extra_flags=extra, pins=dict(args.dataset), sizes=sizes)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """`vit-ft bench SUITE ARGS`: exits 0, or 1 with one `error:` line."""
    run_tool(bench, argv)


if __name__ == "__main__":
    main()
