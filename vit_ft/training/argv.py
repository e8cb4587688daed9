"""The fine-tune's command line, read once: `parse_command(argv)` -> `FinetuneCommand`.

    vit-ft finetune --recipe digits --learning_rate 0.01 --resume --overwrite_output_dir --sweep seed=1,2

The command's own switches are read here, by one argparse pass (`parse_known_args`), and nowhere else:
`--recipe` (its name goes into the run record), `--resume` (continue from the last complete checkpoint-*: it
becomes `--resume_from_checkpoint last`), `--overwrite_output_dir` (replace a finished run; transformers 5 dropped
it from TrainingArguments), `--sweep ARG=V1,V2,...` and `--process_per_run` (each run of the sweep as its own
command: `vit-ft seeds` is a seed sweep with it). What remains, with `--recipe`, are the flags of the argument
dataclasses, which `recipes.parse_args` merges with the recipe. The fine-tune command, the sweep and the seeds
loop all read a command line through this module. `--debug` is `cli.run_tool`'s; `--help` and `--list-recipes`
are `parse_args`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from transformers import TrainingArguments

from .arguments import DataArguments, ModelArguments
from .recipe_fields import RecipeError, RecipeParser
from .recipes import parse_args, recipe_name

SWEEP_FLAG = "--sweep"
PROCESS_PER_RUN_FLAG = "--process_per_run"
RESUME_LAST = ("--resume_from_checkpoint", "last")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclasses.dataclass(frozen=True)
class FinetuneCommand:
    """A fine-tune's command line: the command's own switches, and the flags `parse_args` reads."""

    flags: tuple[str, ...]  # --recipe and the dataclass flags; --resume as --resume_from_checkpoint last
    recipe: str | None  # the recipe's name (`--recipe dogs` or `--recipe path/dogs.yaml` -> "dogs")
    sweep: str | None  # `ARG=V1,V2,...`, or None for one fine-tune
    process_per_run: bool  # each run of the sweep in its own process (`python -m vit_ft.commands.finetune`)
    overwrite_output_dir: bool
    switches: frozenset[str]  # the command's own switches given on the line, on or off

    def parse(self) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
        """The validated argument dataclasses (`recipes.parse_args` over `flags`)."""
        return parse_args(list(self.flags))

    def gives(self, name: str) -> bool:
        """Whether the command line sets `name`: one of the command's switches, or a dataclass flag."""
        return name in self.switches or given_as_flag(self.flags, name)


class _Switch(argparse.Action):
    """An on/off switch: `--name` alone turns it on; `--name=BOOL` or `--name BOOL` sets it (true/false/1/0/yes/no)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=False, **kwargs)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if value is not None and value.lower() not in _BOOLEANS:
            raise RecipeError(
                f"{option_string}={value.lower()!r} is not true or false; pass {option_string} alone to turn it on."
            )
        setattr(namespace, self.dest, True if value is None else _BOOLEANS[value.lower()])
        namespace.given.add(self.dest)


class _Sweep(argparse.Action):
    """`--sweep ARG=V1,V2` or `--sweep=ARG=V1,V2`, kept in order of appearance so that a second one is reported."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if value is None:
            raise RecipeError(
                f"{SWEEP_FLAG} needs a value; write e.g. {SWEEP_FLAG} learning_rate=0.001,0.003."
            )
        namespace.sweep.append(value)
        namespace.given.add(self.dest)


def _command_parser() -> argparse.ArgumentParser:
    # no --help here: `parse_args` prints the full help (every flag, these switches in its epilog)
    parser = RecipeParser((), add_help=False, allow_abbrev=False)
    parser.add_argument("--recipe")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--overwrite_output_dir", action=_Switch)
    parser.add_argument(SWEEP_FLAG, action=_Sweep, nargs="?")
    parser.add_argument(PROCESS_PER_RUN_FLAG, action=_Switch)
    return parser


def parse_command(argv: Sequence[str]) -> FinetuneCommand:
    """Read the command's own switches from `argv` (everything else is kept, in order, for `parse_args`).

    Raises RecipeError for a switch with a bad value or a second `--sweep`; the dataclass flags are checked
    later, by `FinetuneCommand.parse`.
    """
    namespace = argparse.Namespace(sweep=[], given=set())
    namespace, rest = _command_parser().parse_known_args(list(argv), namespace)
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
    )


def given_as_flag(argv: Sequence[str], name: str) -> bool:
    """Whether argv sets the argument `name` (`--name`, `--name=...`, or its `--no_name` form)."""
    flags = (f"--{name}", f"--no_{name}")
    return any(arg in flags or arg.startswith(tuple(f"{flag}=" for flag in flags)) for arg in argv)


__all__ = ["FinetuneCommand", "PROCESS_PER_RUN_FLAG", "SWEEP_FLAG", "given_as_flag", "parse_command"]
