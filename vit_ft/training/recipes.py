"""Recipes: flat YAML files of argument values, merged with command-line flags into the argument dataclasses.

A recipe's keys are exactly the field names of `ModelArguments`, `DataArguments` and
`transformers.TrainingArguments` (alignment-handbook style). Values are resolved in this order, later wins:

    dataclass defaults < TRAINING_DEFAULTS < the recipe's YAML < command-line flags

    vit-ft finetune --recipe dogs --learning_rate 0.01 --image_size 448

An unknown key, in the YAML or on the command line, is an error that names it and the closest valid key.
Everything that can be checked without a network is checked by `validate` before any model or data is loaded.

This module finds and reads recipes and merges them with the flags (`parse_args`). The parser over the
dataclasses and the per-field conversion live in `vit_ft.training.recipe_fields` (with `RecipeError`), the static
checks in `vit_ft.training.argument_checks`.
"""

import dataclasses
import difflib
import importlib.resources
import os
import sys
import types
from pathlib import Path
from typing import Any, TextIO

import torch
import yaml
from transformers import TrainingArguments

from vit_ft.training.argument_checks import check_image_size, check_image_tokens, check_precision, validate
from vit_ft.training.arguments import DataArguments, ModelArguments
from vit_ft.training.recipe_fields import (
    ArgumentField,
    RecipeError,
    argument_fields,
    build_parser,
    coerce,
    only_explicit_flags,
    suggest,
)
from vit_ft.training.training_arguments import FineTuneTrainingArguments

RECIPES_ENV_VAR = "VIT_FT_RECIPES_DIR"
# The repository's top-level recipes/, which the build installs as the data package vit_ft.recipes (pyproject.toml)
RECIPES_PACKAGE = "vit_ft.recipes"
_RECIPE_SUFFIXES = (".yaml", ".yml")

# TrainingArguments defaults that the recipes rely on (a recipe or a flag still overrides each of them).
TRAINING_DEFAULTS: dict[str, Any] = {
    # the image column must reach the collator although the model's forward() does not name it
    "remove_unused_columns": False,
    "eval_strategy": "epoch",
    "save_strategy": "epoch",  # load_best_model_at_end needs it equal to eval_strategy
    "load_best_model_at_end": True,
    "metric_for_best_model": "accuracy",
    "report_to": ["tensorboard"],
    # a peft-wrapped model hides `labels` from the forward() signature that Trainer inspects to find them
    "label_names": ["labels"],
    # every parameter takes part in every step; the DDP default (True) costs an extra graph traversal
    "ddp_find_unused_parameters": False,
    # pinned host memory only speeds up copies to a GPU; without one, torch warns about it every epoch
    "dataloader_pin_memory": torch.cuda.is_available(),
}
OUTPUT_ROOT = "outputs"


# ---------------------------------------------------------------------------------------------------------------
# Finding recipes
# ---------------------------------------------------------------------------------------------------------------


def recipes_dir() -> Path:
    """The recipes folder: $VIT_FT_RECIPES_DIR if set, else the built-in recipes installed with vit_ft.

    The built-in ones are the package `vit_ft.recipes` (the repository's `recipes/`, mapped by pyproject.toml), a
    folder on disk in an editable install and in an installed wheel alike.
    """
    override = os.environ.get(RECIPES_ENV_VAR)
    if override:
        return Path(override).expanduser()
    try:
        return Path(str(importlib.resources.files(RECIPES_PACKAGE)))
    except ModuleNotFoundError:  # an editable install made before recipes/ became vit_ft.recipes
        raise RecipeError(
            f"the built-in recipes ({RECIPES_PACKAGE}) are not installed; reinstall vit-ft (pip install -e . in the "
            f"repository) or set {RECIPES_ENV_VAR} to a recipes folder."
        ) from None


def list_recipes() -> list[str]:
    """Names of the recipes in `recipes_dir()`, sorted (a recipe's name is its file name without `.yaml`)."""
    directory = recipes_dir()
    if not directory.is_dir():
        return []
    return sorted(
        path.stem for path in directory.iterdir() if path.suffix in _RECIPE_SUFFIXES and path.is_file()
    )


def resolve_recipe(name_or_path: str | os.PathLike) -> Path:
    """Return the YAML file for a recipe name (`dogs`) or a path (`my/recipe.yaml`); unknown names list the choices."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in _RECIPE_SUFFIXES or "/" in text or os.sep in text:
        if path.is_file():
            return path
        raise RecipeError(
            f"Recipe file {text!r} does not exist; pass an existing .yaml path or a recipe name."
        )
    directory = recipes_dir()
    for suffix in _RECIPE_SUFFIXES:
        candidate = directory / f"{text}{suffix}"
        if candidate.is_file():
            return candidate
    names = list_recipes()
    close = difflib.get_close_matches(text, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    available = ", ".join(names) if names else f"none (no .yaml files in {directory})"
    raise RecipeError(f"Unknown recipe {text!r}.{hint} Available recipes: {available}.")


def recipe_name(path: str | os.PathLike) -> str:
    """A recipe's name: its file name without the extension (`recipes/dogs-lora.yaml` -> `dogs-lora`)."""
    return Path(path).stem


# ---------------------------------------------------------------------------------------------------------------
# Reading a recipe
# ---------------------------------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given more than once", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """Read a recipe: a flat YAML mapping of field names to values, type-checked and converted per field.

    Raises RecipeError for a file that is not a mapping, a key that is no field (naming the closest
    valid key), a nested value where a scalar is expected, or a value of the wrong type.
    """
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise RecipeError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        raise RecipeError(
            f"{path}: the recipe is empty; write `key: value` lines (see recipes/digits.yaml), or pass no --recipe."
        )
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: a recipe is a flat mapping of `key: value` lines, but the file holds a {type(data).__name__}."
        )
    fields = argument_fields(build_parser())
    values = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise RecipeError(f"{path}: key {key!r} is not a field name.")
        if key not in fields:
            raise RecipeError(
                f"{path}: unknown key {key!r} (not a field of ModelArguments, DataArguments or TrainingArguments)"
                f"{suggest(key, fields) or '; run with --help to list the valid keys.'}"
            )
        values[key] = coerce(fields[key], value, str(path))
    return values


@dataclasses.dataclass(frozen=True)
class RecipeInfo:
    """What `--list-recipes` shows of a recipe, and where its file is."""

    name: str
    path: Path
    description: str  # the first comment line, without its launch command
    launch: str | None  # the command after "Launch:" on that line, if any
    dataset: str


def recipe_info(name_or_path: str | os.PathLike) -> RecipeInfo:
    """Name, one-line description, launch command and dataset of a recipe, read from its first line and values."""
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
        "accelerate launch -m vit_ft.commands.finetune --recipe <RECIPE> ...)",
        file=file,
    )


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


_PAIRED = (("eval_strategy", "save_strategy"), ("eval_steps", "save_steps"))


def _merge(layers: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """Apply TRAINING_DEFAULTS, then each layer (the recipe, then the flags), keeping checkpoints on the eval schedule.

    load_best_model_at_end needs saving and evaluation on the same schedule, so when a layer sets only one side
    of a pair (eval_strategy/save_strategy, eval_steps/save_steps) and the other side was unset or equal, the other
    side follows. "no" and "best" do not propagate; with either schedule off, load_best_model_at_end defaults to off.
    """
    values: dict[str, Any] = dict(TRAINING_DEFAULTS, output_dir=str(Path(OUTPUT_ROOT) / (name or "vit-ft")))
    given: set[str] = set()
    for layer in layers:
        updated = {**values, **layer}
        for first, second in _PAIRED:
            for source, target in ((first, second), (second, first)):
                if source not in layer or target in layer or str(layer[source]) in ("no", "best"):
                    continue
                if target not in given or values.get(target) == values.get(source):
                    updated[target] = layer[source]
        values = updated
        given |= set(layer)
    if "load_best_model_at_end" not in given and "no" in (
        str(values["eval_strategy"]),
        str(values["save_strategy"]),
    ):
        values["load_best_model_at_end"] = False
    return values


def _unknown_flag_error(rest: list[str], fields: dict[str, ArgumentField]) -> RecipeError:
    """The error for the first argument the parser did not take, naming the closest valid flag."""
    token = rest[0]
    if not token.startswith("-"):
        return RecipeError(f"Unexpected argument {token!r}; options take the form --name value (see --help).")
    name = token.split("=", 1)[0].lstrip("-").replace("-", "_")
    valid = [*fields, "recipe", "list_recipes"]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else "; run with --help to see every flag."
    return RecipeError(
        f"Unknown flag {token.split('=', 1)[0]!r} (not a field of ModelArguments, DataArguments or TrainingArguments){hint}"
    )


# A recipe's data source: one of these given on the command line replaces all of them from the recipe.
_DATA_SOURCE_KEYS = (
    "dataset_name",
    "dataset_config",
    "train_dir",
    "validation_dir",
    "test_dir",
    "builtin_dataset",
)


def _without_recipe_data(recipe_values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The recipe's values minus its data source when the flags name another (--train_dir or --dataset_name).

    `--recipe digits --train_dir my/train` trains on my/train: the recipe's built-in dataset, its folders and
    its test folder no longer apply (flags given beside the new source, e.g. --test_dir, still do).
    """
    if flags.get("train_dir") is None and flags.get("dataset_name") is None:
        return recipe_values
    return {key: value for key, value in recipe_values.items() if key not in _DATA_SOURCE_KEYS}


def _construct(cls: type, values: dict[str, Any]) -> Any:
    """An instance of the dataclass `cls` from the values that are its init fields (bad values: RecipeError)."""
    names = {field.name for field in dataclasses.fields(cls) if field.init}
    try:
        return cls(**{key: value for key, value in values.items() if key in names})
    except RecipeError:
        raise
    except ValueError as error:
        raise RecipeError(str(error)) from error


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Parse `--recipe NAME_OR_PATH` plus flags into validated (ModelArguments, DataArguments, TrainingArguments).

    argv defaults to sys.argv[1:]. Flags override the recipe (`--recipe dogs --learning_rate 0.01`); an optional
    field takes `none` to unset a recipe value (`--max_train_samples none`). `--help` prints every flag and
    `--list-recipes` prints the recipes; both exit via SystemExit(0). Bad keys, values or combinations raise
    RecipeError (a ValueError) before anything is downloaded or loaded.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        build_parser().parse_args(["--help"])  # prints the help with every flag's default, then exits

    parser = build_parser()
    fields = argument_fields(parser)
    only_explicit_flags(parser, fields)
    namespace, rest = parser.parse_known_args(argv)
    if rest:
        raise _unknown_flag_error(rest, fields)
    flags = vars(namespace)
    if flags.pop("list_recipes", False):
        print_recipes()
        raise SystemExit(0)
    recipe = flags.pop("recipe", None)

    recipe_values = load_recipe(resolve_recipe(recipe)) if recipe else {}
    values = _merge(
        [_without_recipe_data(recipe_values, flags), flags], recipe_name(recipe) if recipe else None
    )

    # Construct in the order of the checks' cost and certainty: a wrong image size is reported before
    # anything about data or hardware, and precision before TrainingArguments' own, vaguer, device errors.
    model_args = _construct(ModelArguments, values)
    check_image_tokens(model_args)
    check_image_size(model_args)
    data_args = _construct(DataArguments, values)
    training_fields = {
        field.name: field.default for field in dataclasses.fields(FineTuneTrainingArguments) if field.init
    }
    check_precision(types.SimpleNamespace(**{**training_fields, **values}))
    training_args = _construct(FineTuneTrainingArguments, values)
    validate(model_args, data_args, training_args)
    return model_args, data_args, training_args


__all__ = [
    "RECIPES_ENV_VAR",
    "RECIPES_PACKAGE",
    "TRAINING_DEFAULTS",
    "RecipeError",
    "RecipeInfo",
    "list_recipes",
    "load_recipe",
    "parse_args",
    "print_recipes",
    "recipe_info",
    "recipe_name",
    "recipes_dir",
    "resolve_recipe",
]
