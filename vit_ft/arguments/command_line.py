"""The fine-tune's command line as the training layer (the sweep) takes it: the command's own switches read by
`vit_ft.commands.finetune.parse_command`, and the flags `recipes.parse_args` reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .recipes import parse_args

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from .fields import DataArguments, ModelArguments

SWEEP_FLAG = "--sweep"
PROCESS_PER_RUN_FLAG = "--process_per_run"


@dataclasses.dataclass(frozen=True)
class FinetuneCommand:
    """A fine-tune's command line as `vit_ft.commands.finetune.parse_command` read it: the values of the command's
    own switches, and the flags `parse_args` reads."""

    flags: tuple[str, ...]  # --recipe and the dataclass flags; --resume as --resume_from_checkpoint last
    recipe: str | None  # the recipe's name (`--recipe dogs` or `--recipe path/dogs.yaml` -> "dogs")
    sweep: str | None  # `ARG=V1,V2,...`, or None for one fine-tune
    process_per_run: bool  # each run of the sweep in its own process (`python -m vit_ft.commands.finetune`)
    overwrite_output_dir: bool
    switches: frozenset[str]  # the command's own switches given on the line, on or off
    print_plan: bool = False  # print the run plan and exit

    def parse(self) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
        """The validated argument dataclasses (`parse_args` over `flags`)."""
        return parse_args(list(self.flags))

    def gives(self, name: str) -> bool:
        """Whether the command line sets `name`: one of the command's switches, or a dataclass flag."""
        return name in self.switches or given_as_flag(self.flags, name)


def given_as_flag(argv: Sequence[str], name: str) -> bool:
    """Whether argv sets the argument `name` (`--name`, `--name=...`, or its `--no_name` form)."""
    flags = (f"--{name}", f"--no_{name}")
    return any(arg in flags or arg.startswith(tuple(f"{flag}=" for flag in flags)) for arg in argv)


__all__ = ["PROCESS_PER_RUN_FLAG", "SWEEP_FLAG", "FinetuneCommand", "given_as_flag"]
