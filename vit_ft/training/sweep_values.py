"""The values a sweep runs (`--sweep ARGUMENT=VALUE,VALUE`): the flag read and its argument checked by name,
and each run's arguments parsed as the flag `--<argument> <value>` would be, into its own folder (a seed sweep's
runs each with its own pre-trained checkpoint where the recipe pre-trains one)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..arguments.command_line import SWEEP_FLAG, given_as_flag
from ..arguments.recipes import RecipeError, argument_fields, build_parser, build_plan, parse_args, suggest
from .seeds import SEED, pretraining_folder, seed_folder
from .sweep_results import RUN_PREFIX, SweepRun

# Arguments a sweep cannot vary: where the runs go, how they are resumed, how they are compared, what is pushed.
_FIXED = {
    "output_dir": "the sweep chooses each run's folder (OUTPUT/sweep-<argument>-<value>)",
    "resume_from_checkpoint": "a sweep resumes with --resume",
    "metric_for_best_model": "every run must be judged by the same metric",
    "greater_is_better": "every run must be judged by the same metric",
    "push_to_hub": "the sweep pushes its winner only",
    "hub_model_id": "the sweep pushes its winner only",
}


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`learning_rate=0.001,0.003` -> ("learning_rate", ["0.001", "0.003"]), the argument checked by name.

    The values stay text here: `sweep_runs` converts each one as its flag would be.
    """
    name, sep, values = text.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name:
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r} is not ARGUMENT=VALUE,VALUE; write e.g. {SWEEP_FLAG} learning_rate=0.001,0.003."
        )
    fields = argument_fields(build_parser())
    if name not in fields:
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r}: {name!r} is not an argument of the recipe (ModelArguments, DataArguments or "
            f"TrainingArguments){suggest(name, fields) or '; run with --help to list them.'}"
        )
    if name in _FIXED:
        raise RecipeError(f"{SWEEP_FLAG} cannot vary {name}: {_FIXED[name]}. Sweep another argument.")
    texts = [value.strip() for value in values.split(",")]
    if not any(texts):
        raise RecipeError(
            f"{SWEEP_FLAG} {text!r} gives no values; list them after '=', separated by commas ({name}=A,B)."
        )
    if not all(texts):
        raise RecipeError(f"{SWEEP_FLAG} {text!r} has an empty value; remove the extra comma.")
    return name, texts


def run_folder_name(name: str, text: str) -> str:
    """`sweep-<argument>-<value>` (`seed-<value>` for a seed sweep), with characters a folder name should not hold
    replaced by `_`."""
    value = re.sub(r"[^A-Za-z0-9._+-]", "_", text)
    return seed_folder("", value).name if name == SEED else f"{RUN_PREFIX}{name}-{value}"


def _pretrains_each_seed(argv: list[str], output_dir: str | Path) -> str | None:
    """The built-in pre-training every seed runs for its own checkpoint, or None: the recipe has one (not turned
    off by a flag) and the command line names no checkpoint."""
    if given_as_flag(argv, "model_name_or_path"):
        return None
    return parse_args([*argv, "--output_dir", str(output_dir)])[0].pretrain_if_missing


def sweep_runs(argv: list[str], name: str, texts: list[str], output_dir: str | Path) -> list[SweepRun]:
    """Parse the arguments of every run: `argv` plus `--<name>=<value>` and the run's folder under `output_dir`
    (and, in a seed sweep of a recipe that pre-trains its own checkpoint, the seed's own `pretraining_folder`).

    Each value goes through `parse_args`, so it is converted and validated exactly as the flag would be; the
    first bad value raises RecipeError naming it. Values that convert to the same thing are refused.
    """
    if given_as_flag(argv, name):
        raise RecipeError(
            f"{name} is given both as a flag and in {SWEEP_FLAG}; drop the flag --{name} (the sweep sets it)."
        )
    pretrains = name == SEED and _pretrains_each_seed(argv, output_dir)
    runs: list[SweepRun] = []
    seen: dict[Any, str] = {}
    for text in texts:
        folder = Path(output_dir) / run_folder_name(name, text)
        flags = [f"--{name}={text}", "--output_dir", str(folder)]
        if pretrains:  # the flag naming the seed's checkpoint, and the pre-training that builds it
            checkpoint = str(pretraining_folder(output_dir, text))
            flags += ["--model_name_or_path", checkpoint, "--pretrain_if_missing", pretrains]
        try:
            plan = build_plan([*argv, *flags])
        except ValueError as error:
            raise RecipeError(f"{SWEEP_FLAG} {name}={text}: {error}") from None
        run = SweepRun(text, folder, plan, tuple(flags))
        key = json.dumps(run.value(name), sort_keys=True, default=str)
        if key in seen or any(run.folder == folder for run in runs):
            raise RecipeError(
                f"{SWEEP_FLAG} gives {name}={text} and {name}={seen.get(key, text)}, the same run twice; "
                "list each value once."
            )
        seen[key] = text
        runs.append(run)
    return runs


__all__ = ["parse_sweep", "run_folder_name", "sweep_runs"]
