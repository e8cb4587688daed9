"""Run one fine-tune under several seeds, each in a fresh process, and report the accuracy's mean, lowest and
highest with each run's wall time (the numbers in recipes/README.md come from here).

vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/digits-seeds
vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/lr3e-4 --learning_rate 0.0003

Every other flag goes to the fine-tune (`vit-ft finetune`) unchanged; the loop sets --seed, --output_dir
(OUTPUT/seed-N) and, for a recipe that pre-trains its own checkpoint (digits), --model_name_or_path
(OUTPUT/pretrained-seed-N), so each seed's time includes its pre-training, as the README's first command does.
Writes OUTPUT/seeds.md (the table, also printed), seeds.json and each seed's log, OUTPUT/seed-N.log.
"""

from __future__ import annotations

from ..utils.cli import ToolArgumentParser, run_tool
from ..utils.logs import setup_logging


def seeds(argv: list[str]) -> dict:
    """Parse `--seeds` and `--output_dir`, run the fine-tune (the other flags) once per seed, print the table."""
    from ..training.seeds import parse_seeds, run_seeds, to_markdown

    parser = ToolArgumentParser(__doc__)
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds (default 0,1,2).")
    parser.add_argument("--output_dir", required=True, help="Where seed-N/, seed-N.log and seeds.md go.")
    args, finetune_argv = parser.parse_known_args(argv)
    setup_logging()
    summary = run_seeds(finetune_argv, parse_seeds(args.seeds), args.output_dir)
    print(to_markdown(summary), end="")
    print(f"Wrote seeds.md and seeds.json to {args.output_dir}")
    return summary


def main(argv: list[str] | None = None) -> None:
    """`vit-ft seeds ARGS` (and `python -m vit_ft.commands.seeds`, `scripts/seeds.py`): exits 0 or 1."""
    run_tool(seeds, argv)


if __name__ == "__main__":
    main()
