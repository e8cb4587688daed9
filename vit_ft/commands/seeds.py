"""Run one fine-tune under several seeds, each in a fresh process, and report the accuracy's mean, lowest and
highest with each run's wall time (the numbers in recipes/README.md come from here).

vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/digits-seeds
vit-ft seeds --recipe digits --seeds 0,1,2 --output_dir outputs/lr3e-4 --learning_rate 0.0003

The same as `vit-ft finetune --sweep seed=0,1,2 --process_per_run --output_dir OUTPUT ...` (a seed sweep, run by
vit_ft.training.sweep). Every other flag goes to the fine-tune (`vit-ft finetune`) unchanged; the sweep sets
--seed, --output_dir (OUTPUT/seed-N) and, for a recipe that pre-trains its own checkpoint (digits),
--model_name_or_path (OUTPUT/pretrained-seed-N), so each seed's time includes its pre-training, as the README's
first command does. Writes OUTPUT/seeds.md (the table, also printed), seeds.json and each seed's log,
OUTPUT/seed-N.log; --resume keeps the seeds an interrupted loop finished.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..utils.cli import ToolArgumentParser, run_tool
from ..utils.logs import setup_logging

# Flags the sweep sets for every seed itself; passing one would make the runs collide or not vary.
OWNED_FLAGS = ("seed", "output_dir", "sweep", "process_per_run")


def seed_sweep_argv(argv: list[str], seeds: list[int], output_dir: str) -> list[str]:
    """The fine-tune command line of the seed sweep: `argv` (the fine-tune's flags, `--recipe` among them), the
    sweep over `seeds` with one process per run, and `output_dir`."""
    from ..arguments.command_line import PROCESS_PER_RUN_FLAG, SWEEP_FLAG, given_as_flag

    owned = [name for name in OWNED_FLAGS if given_as_flag(argv, name)]
    if owned:
        raise ValueError(
            f"--{owned[0]} is set by the seeds loop for each run; drop it (the runs go to --output_dir/seed-N)."
        )
    if not given_as_flag(argv, "recipe"):
        raise ValueError("--recipe is required: the recipe to repeat under each seed (e.g. --recipe digits).")
    sweep = f"seed={','.join(map(str, seeds))}"
    return [*argv, SWEEP_FLAG, sweep, PROCESS_PER_RUN_FLAG, "--output_dir", output_dir]


def seeds(argv: list[str], on_interrupt: list[Callable[[], str]]) -> dict:
    """Parse `--seeds` and `--output_dir`, run the fine-tune (the other flags) once per seed, print the table."""
    parser = ToolArgumentParser(__doc__)
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds (default 0,1,2).")
    parser.add_argument("--output_dir", required=True, help="Where seed-N/, seed-N.log and seeds.md go.")
    args, finetune_argv = parser.parse_known_args(argv)  # before the training imports: --help answers at once
    from ..training.seeds import SEEDS_MD, parse_seeds
    from ..training.sweep import run_sweep, sweep_interrupted_message
    from .finetune import parse_command

    command = parse_command(seed_sweep_argv(finetune_argv, parse_seeds(args.seeds), args.output_dir))
    setup_logging()
    on_interrupt.append(lambda: sweep_interrupted_message(args.output_dir))
    summary = run_sweep(command)
    print((Path(args.output_dir) / SEEDS_MD).read_text(), end="")
    print(f"Wrote seeds.md and seeds.json to {args.output_dir}")
    return summary


def main(argv: list[str] | None = None) -> None:
    """`vit-ft seeds ARGS` (and `python -m vit_ft.commands.seeds`, `scripts/seeds.py`): exits 0, 1 or 130."""
    on_interrupt: list[Callable[[], str]] = []
    run_tool(
        seeds,
        argv,
        interrupted=lambda: on_interrupt[0]() if on_interrupt else "interrupted.",
        on_interrupt=on_interrupt,
    )


if __name__ == "__main__":
    main()
