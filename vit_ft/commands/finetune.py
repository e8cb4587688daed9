"""Fine-tune a ViT from a recipe.

vit-ft finetune --recipe digits                                   # one process, the offline default
vit-ft finetune --recipe digits --overwrite_output_dir            # replace a finished run in the output folder
vit-ft finetune --recipe digits --sweep learning_rate=0.0003,0.003  # one run per value, best on validation
vit-ft finetune --list-recipes
vit-ft finetune --num_processes 8 --recipe dogs                   # one process per GPU, started by accelerate
accelerate launch -m vit_ft.commands.finetune --recipe dogs       # the same, the launcher's own process
accelerate launch -m vit_ft.commands.finetune --recipe dogs --learning_rate 0.01 --image_size 448
accelerate launch -m vit_ft.commands.finetune --recipe dogs --resume  # continue an interrupted run

A mistake prints one line, `error: <what is wrong>. <what to do>`, and exits 1; `--debug` (or VIT_FT_DEBUG=1)
shows the traceback instead. Ctrl-C exits 130. SIGTERM or SIGUSR1 (preemption) saves a checkpoint at the next
step, prints where it is and exits 75 (EX_TEMPFAIL): run the same command with --resume to continue. With
`--num_processes N` (and `--launch_config FILE`) this process starts the N processes through accelerate's
launcher and exits with their status, their `error:` line the last one (`processes`); under `accelerate launch`
the launcher's own handling follows (docs/fine-tuning.md, "Many nodes").

The command's own switches are read here, by one argparse pass (`parse_command`), and nowhere else: `--recipe`
(its name goes into the run record), `--resume` (continue from the last complete checkpoint-*: it becomes
`--resume_from_checkpoint last`; which settings may differ from the checkpoint's is `training.resume`'s; a
finished run has nothing to resume: one line, exit 0, its folder unchanged), `--overwrite_output_dir` (replace a
finished run; transformers 5 dropped it from TrainingArguments), `--sweep ARG=V1,V2,...` (the sweep takes them
from the `FinetuneCommand` it is handed), `--list-recipes` and `--help`. What remains, with `--recipe`, are the
flags of the argument dataclasses, which `vit_ft.arguments.recipes.parse_args` merges with the recipe. `--debug`
is `cli.run_tool`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..utils.cli import DEBUG_FLAG, run_tool
from ..utils.logs import setup_logging
from .model_flags import check_sources
from .processes import LAUNCH_CONFIG_FLAG, NUM_PROCESSES_FLAG, launch, split_launch_flags

if TYPE_CHECKING:  # the rest is imported where it is used: `--help` imports neither torch nor transformers
    from transformers import TrainingArguments

    from ..arguments.command_line import FinetuneCommand

# the flags spelled as arguments.recipes spells them (a test checks they agree; importing it costs seconds)
SWEEP_FLAG = "--sweep"
PROCESS_PER_RUN_FLAG = "--process_per_run"
HELP_ALL_FLAG = "--help-all"
DESCRIPTION = (
    "Fine-tune a ViT from a recipe; every flag below is also a recipe key, and a flag overrides the recipe's "
    "value. The same command runs as python scripts/finetune.py or, one process per GPU, with --num_processes N "
    "(or under accelerate launch -m vit_ft.commands.finetune)."
)
RESUME_LAST = ("--resume_from_checkpoint", "last")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
# the command's own switches, for both helps: (flag, what it does)
SWITCHES = [
    ("--recipe NAME", "a recipe in recipes/ (--list-recipes lists them) or a .yaml file; flags override its values"),
    ("--list-recipes", "print the recipes and exit"),
    ("--print_plan", "print the run plan (data, inputs, batch, outputs, passes, every value and its source) and exit"),
    ("--resume", "continue from the last complete checkpoint-* in output_dir"),
    ("--overwrite_output_dir", "replace a finished run in output_dir"),
    (f"{SWEEP_FLAG} ARG=V1,V2,...", "one fine-tune per value into output_dir/sweep-ARG-V/, the best on validation "
     f"copied to output_dir ({SWEEP_FLAG} seed=0,1,2 summarises the seeds in seeds.md instead)"),
    (PROCESS_PER_RUN_FLAG, "each run of the sweep as its own command"),
    (f"{NUM_PROCESSES_FLAG} N", f"N processes (one per GPU) started through accelerate's launcher, its status and "
     f"error line ours; {LAUNCH_CONFIG_FLAG} FILE: its config (recipes/accelerate_configs/)"),
    (DEBUG_FLAG, "a traceback instead of the one-line error"),
    ("--help", "this help; --help-all: every flag with its default and help, the Trainer's included"),
]  # fmt: skip
EPILOG = "The fine-tune command (vit-ft finetune, scripts/finetune.py) also takes: " + "; ".join(
    f"{flag} ({what})" for flag, what in SWITCHES if not flag.startswith(("--recipe", "--list", "--help"))
)


class _Switch(argparse.Action):
    """An on/off switch: `--name` alone turns it on; `--name=BOOL` or `--name BOOL` sets it (true/false/1/0/yes/no)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=False, **kwargs)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if value is not None and value.lower() not in _BOOLEANS:
            from ..arguments.checks import RecipeError

            raise RecipeError(
                f"{option_string}={value.lower()!r} is not true or false; pass {option_string} alone to turn it on."
            )
        setattr(namespace, self.dest, True if value is None else _BOOLEANS[value.lower()])
        namespace.given.add(self.dest)


class _Sweep(argparse.Action):
    """`--sweep ARG=V1,V2` or `--sweep=ARG=V1,V2`, kept in order of appearance so that a second one is reported."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if value is None:
            from ..arguments.checks import RecipeError

            raise RecipeError(
                f"{SWEEP_FLAG} needs a value; write e.g. {SWEEP_FLAG} learning_rate=0.001,0.003."
            )
        namespace.sweep.append(value)
        namespace.given.add(self.dest)


def _add_list_recipes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--list-recipes", "--list_recipes", action="store_true", help="Print the recipes and exit."
    )


def _command_parser() -> argparse.ArgumentParser:
    from ..arguments.recipes import RecipeParser

    # no --help here: `print_help` prints the full help (every flag, these switches in its epilog)
    parser = RecipeParser((), add_help=False, allow_abbrev=False)
    parser.add_argument("--recipe")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--print_plan", "--print-plan", action="store_true")
    parser.add_argument("--overwrite_output_dir", action=_Switch)
    parser.add_argument(SWEEP_FLAG, action=_Sweep, nargs="?")
    parser.add_argument(PROCESS_PER_RUN_FLAG, action=_Switch)
    _add_list_recipes(parser)
    return parser


def print_short_help() -> None:
    """vit-ft's own flags, each with the first sentence of its help, and the command's switches (no torch, no
    transformers: `arguments.help`); then exit 0."""
    from ..arguments.help import short_help

    print(short_help("vit-ft finetune", "--recipe NAME [--flag value ...]", DESCRIPTION, SWITCHES))
    raise SystemExit(0)


def print_help() -> None:
    """Every flag of the argument dataclasses with its default, `--recipe`, `--list-recipes` and, as the epilog,
    the command's switches; then exit 0."""
    from ..arguments.recipes import build_parser

    parser = build_parser(epilog=EPILOG)
    _add_list_recipes(parser)
    parser.parse_args(["--help"])


def parse_command(argv: Sequence[str]) -> FinetuneCommand:
    """Read the command's own switches from `argv` (everything else is kept, in order, for `parse_args`).

    `--help` (vit-ft's own flags, short), `--help-all` (every flag) and `--list-recipes` print and exit 0. Raises RecipeError for a switch with a bad value or a second
    `--sweep`; the dataclass flags are checked later, by `FinetuneCommand.parse`.
    """
    argv = list(argv)
    if HELP_ALL_FLAG in argv:
        print_help()
    if "-h" in argv or "--help" in argv:
        print_short_help()
    from ..arguments.command_line import FinetuneCommand
    from ..arguments.recipes import RecipeError, recipe_name

    namespace = argparse.Namespace(sweep=[], given=set())
    namespace, rest = _command_parser().parse_known_args(argv, namespace)
    if namespace.list_recipes:
        print_recipes()
        raise SystemExit(0)
    if len(namespace.sweep) > 1:
        raise RecipeError(
            f"{SWEEP_FLAG} is given {len(namespace.sweep)} times ({', '.join(namespace.sweep)}); a sweep varies "
            f"one argument, so pass one {SWEEP_FLAG}."
        )
    if namespace.process_per_run and not namespace.sweep:
        raise RecipeError(
            f"{PROCESS_PER_RUN_FLAG} runs each run of a {SWEEP_FLAG} as its own command; add {SWEEP_FLAG} "
            f"ARG=V1,V2,... or drop {PROCESS_PER_RUN_FLAG}."
        )
    flags = list(rest)
    if namespace.recipe is not None:
        flags = ["--recipe", namespace.recipe, *flags]
    if namespace.resume:
        flags += RESUME_LAST  # continue from the last complete checkpoint-* in the output folder
        namespace.given.add("resume")
    return FinetuneCommand(
        flags=tuple(flags),
        recipe=recipe_name(namespace.recipe) if namespace.recipe is not None else None,
        sweep=namespace.sweep[0] if namespace.sweep else None,
        overwrite_output_dir=namespace.overwrite_output_dir,
        process_per_run=namespace.process_per_run,
        switches=frozenset(namespace.given),
        print_plan=namespace.print_plan,
    )


@dataclasses.dataclass(frozen=True)
class RecipeInfo:
    """What `--list-recipes` shows of a recipe, and where its file is."""

    name: str
    path: Path
    description: str  # the first comment line, without its launch command
    launch: str | None  # the command after "Launch:" on that line, if any
    dataset: str


def recipe_info(name_or_path: str) -> RecipeInfo:
    """Name, one-line description, launch command and dataset of a recipe, read from its first line and values."""
    from ..arguments.recipes import load_recipe, recipe_name, resolve_recipe

    path = resolve_recipe(name_or_path)
    first_line = path.read_text(encoding="utf-8").splitlines()[:1]
    header = first_line[0].lstrip("#").strip() if first_line and first_line[0].startswith("#") else ""
    description, _, launch = header.partition("Launch:")
    values = load_recipe(path)
    if values.get("dataset_name"):
        dataset = str(values["dataset_name"])
    elif values.get("builtin_dataset"):
        dataset = f"built-in {values['builtin_dataset']} -> {values.get('train_dir')}"
    else:
        dataset = f"folder {values.get('train_dir')}"
    return RecipeInfo(
        recipe_name(path), path, description.strip().rstrip("."), launch.strip() or None, dataset
    )


def print_recipes(file: TextIO | None = None) -> None:
    """Print every recipe with its dataset and one-line description (what `--list-recipes` shows)."""
    from ..arguments.recipes import RECIPES_ENV_VAR, list_recipes, recipes_dir

    file = file or sys.stdout
    infos = [recipe_info(name) for name in list_recipes()]
    if not infos:
        print(f"No recipes found in {recipes_dir()} (set {RECIPES_ENV_VAR} to another folder).", file=file)
        return
    name_width = max(len("RECIPE"), *(len(info.name) for info in infos))
    data_width = max(len("DATASET"), *(len(info.dataset) for info in infos))
    print(f"{'RECIPE':<{name_width}}  {'DATASET':<{data_width}}  DESCRIPTION", file=file)
    for info in infos:
        print(f"{info.name:<{name_width}}  {info.dataset:<{data_width}}  {info.description}", file=file)
    print(
        "\nLaunch one with: vit-ft finetune --recipe <RECIPE> [--flag value ...] (several processes or GPUs: "
        "vit-ft finetune --num_processes N --recipe <RECIPE> ..., or accelerate launch -m vit_ft.commands.finetune)",
        file=file,
    )


def setup_training_logging(training_args: TrainingArguments) -> None:
    """Our messages at INFO on the main process, WARNING elsewhere; the libraries at `--log_level`."""
    setup_logging(
        level=logging.INFO if training_args.should_log else logging.WARNING,
        library_level=training_args.get_process_log_level(),
        loggers=("vit_ft", "__main__"),
    )


def push_finished_run(training_args: TrainingArguments) -> None:
    """One complete push of the finished output folder, with our model card, by process 0."""
    from ..tools.export.hub import push_output_dir

    folder = Path(training_args.output_dir)
    try:
        url = push_output_dir(
            folder,
            training_args.hub_model_id or folder.name,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
        )
    except Exception as error:  # the Hub's own errors are not OSErrors; the run itself is saved
        raise OSError(
            f"the run finished and is saved in {folder}, but pushing it failed ({error}). "
            f"Push it later with: vit-ft push {folder} --hub_model_id {training_args.hub_model_id or folder.name}"
        ) from error
    print(f"Pushed {folder} to the Hub: {url}")


def print_plan(command: FinetuneCommand) -> None:
    """`--print_plan`: the run plan, built and checked as the run builds it, and its model, teacher and dataset
    checked as the run checks them (`check_sources`) but without the network: a missing local folder is one line;
    a Hub id the cache does not hold is printed as not checked. Nothing is loaded, downloaded or written."""
    from ..arguments.recipes import build_plan
    from ..utils.hub_ids import without_network

    plan = build_plan(list(command.flags))
    with without_network() as unchecked:
        check_sources(plan.model_args, plan.data_args, plan.training_args)
    print(plan.describe(unchecked))


def finetune(argv: list[str], on_interrupt: list[Callable[[], str]]) -> dict:
    """Parse, train (one run, or a --sweep of runs) and push; `on_interrupt` receives what writes the Ctrl-C line."""
    command = parse_command(argv)
    if command.print_plan:  # the plan alone: no data, no model, nothing written (and no training layer imported)
        print_plan(command)
        return {}
    from ..arguments.recipes import build_plan
    from ..training.checkpoints import finished_run_message, interrupted_message
    from ..training.preemption import PREEMPTED_EXIT, Preempted
    from ..training.stages import run_finetune
    from ..training.sweep import run_sweep, sweep_interrupted_message
    from ..utils.distributed import end_process_group

    plan = build_plan(list(command.flags))  # validated before any work
    model_args, data_args, training_args = plan.arguments
    check_sources(model_args, data_args, training_args)  # a missing or unfinished model, a dataset that is nowhere: one line
    setup_training_logging(training_args)
    finished = finished_run_message(training_args) if command.sweep is None else None
    if finished is not None:  # --resume of a finished run: nothing to do, nothing written, nothing pushed
        if training_args.process_index == 0:
            print(finished)
        end_process_group()
        return {}
    try:
        if command.sweep is not None:  # one fine-tune per value; the winner is copied into output_dir, pushed
            on_interrupt.append(lambda: sweep_interrupted_message(training_args.output_dir))
            metrics = run_sweep(command)
        else:
            on_interrupt.append(lambda: interrupted_message(training_args.output_dir))
            if data_args.wise_ft:  # the start model, the fine-tune, their interpolation (tools.wise)
                from ..tools.wise import wise_finetune

                metrics = wise_finetune(plan, partial(run_finetune, overwrite_output_dir=command.overwrite_output_dir),
                                        command.overwrite_output_dir)  # fmt: skip
            else:
                metrics = run_finetune(plan, overwrite_output_dir=command.overwrite_output_dir)
    except Preempted as stop:  # saved at a step boundary: say where, and exit for a requeue (not an error)
        sys.stdout.flush()
        print(f"error: {stop}", file=sys.stderr)
        end_process_group()
        sys.exit(PREEMPTED_EXIT)
    if training_args.push_to_hub and training_args.process_index == 0:
        push_finished_run(training_args)
    end_process_group()
    return metrics


def launch_processes(argv: list[str], debug: bool) -> None:
    """`--num_processes N [--launch_config FILE]`: the fine-tune on N processes (`processes.launch`); exits with
    their status."""
    number, config_file, rest = split_launch_flags(argv)
    status, line = launch(number, config_file, [*rest, DEBUG_FLAG] if debug else rest)
    if line is not None:
        print(line, file=sys.stderr)
    sys.exit(status)


def main(argv: list[str] | None = None) -> None:
    """`vit-ft finetune ARGS` (and `python -m vit_ft.commands.finetune`, `scripts/finetune.py`): exits 0, 1, 130
    (Ctrl-C) or 75 (preempted by SIGTERM / SIGUSR1, saved: continue with --resume); with `--num_processes N`,
    the status of the N processes it starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    launched = {item.partition("=")[0] for item in argv} & {NUM_PROCESSES_FLAG, LAUNCH_CONFIG_FLAG}
    if launched and not {"-h", "--help", HELP_ALL_FLAG} & set(argv):
        run_tool(launch_processes, argv, debug=DEBUG_FLAG in argv)
    on_interrupt: list[Callable[[], str]] = []

    def interrupted() -> str:
        from ..training.checkpoints import interrupted_message

        return on_interrupt[0]() if on_interrupt else interrupted_message("the output folder")

    run_tool(
        finetune,
        argv,
        interrupted=interrupted,
        on_interrupt=on_interrupt,
    )


__all__ = [
    "RecipeInfo",
    "finetune",
    "main",
    "parse_command",
    "print_plan",
    "print_recipes",
    "recipe_info",
]

if __name__ == "__main__":
    main()
