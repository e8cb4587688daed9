"""Recipes: flat YAML files of argument values, read and converted like the flags, merged with them into the
argument dataclasses (`parse_args`); every unknown key is an error naming the closest valid one.

A recipe's keys are exactly the field names of `ModelArguments`, `DataArguments` and
`transformers.TrainingArguments` (alignment-handbook style), resolved in this order, later wins:

    dataclass defaults < TRAINING_DEFAULTS < method defaults < the recipe's YAML < family defaults < flags

The family defaults (`family_defaults.py`) apply only when --model_name_or_path names a checkpoint of another ViT
family than the one the recipe was written for: that family's optimisation keys replace the recipe's. The method
defaults (`method_defaults.py`: a peft method's targets, rank and learning rate for the checkpoint's family) fill
only the keys the recipe and the flags leave unset.

    vit-ft finetune --recipe dogs --learning_rate 0.01 --image_size 448

The parser is transformers' HfArgumentParser over the dataclasses (`build_parser`); `coerce` converts a YAML value
with the argparse action of its flag. `parse_args` builds the dataclasses (HfArgumentParser.parse_dict: each checks
its own fields) and runs the checks across them once (`checks.validate`), before any model or data is
loaded. The fine-tune command's own switches are read by `vit_ft.commands.finetune`.
"""

import argparse
import dataclasses
import difflib
import importlib.resources
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser, TrainingArguments

from vit_ft.arguments.checks import RecipeError, suggest, validate
from vit_ft.arguments.data_loading import NUM_WORKERS_HELP, parse_num_workers
from vit_ft.arguments.family_defaults import choose_family_defaults, choose_method_defaults
from vit_ft.arguments.fields import DataArguments, ModelArguments
from vit_ft.arguments.merge import TRAINING_DEFAULTS, merge_values
from vit_ft.arguments.plan import RunPlan, value_sources
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments

RECIPES_ENV_VAR = "VIT_FT_RECIPES_DIR"
# The repository's top-level recipes/, which the build installs as the data package vit_ft.recipes (pyproject.toml)
RECIPES_PACKAGE = "vit_ft.recipes"
_RECIPE_SUFFIXES = (".yaml", ".yml")
# FineTuneTrainingArguments is transformers' TrainingArguments plus the toolkit's keys (layer decay, EMA, ...)
ARGUMENT_DATACLASSES = (ModelArguments, DataArguments, FineTuneTrainingArguments)
_NONE_IS_A_VALUE = frozenset({"report_to"})  # optional fields whose string "none" is a value, not None
_NONE_STRINGS = frozenset({"none", "null"})

# ---- finding and reading recipes -----------------------------------------------------------------------------


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


# ---- fields: what a recipe or flag may set, converted as the command line converts it ------------------------


@dataclasses.dataclass(frozen=True)
class ArgumentField:
    """One field a recipe or flag may set: its dataclass, type annotation and the argparse action for it."""

    name: str
    owner: type
    hint: Any  # the annotation, e.g. `int | None`
    action: argparse.Action

    def allows(self, kind: type) -> bool:
        """Whether the annotation admits `kind` (NoneType, bool, list, dict, ...) as itself or as a generic."""
        return any(arg is kind or typing.get_origin(arg) is kind for arg in _union_args(self.hint))

    def describe(self) -> str:
        """What the field expects, for error messages: its choices, else its annotation's types."""
        if self.action.choices:
            return "one of " + ", ".join(str(choice) for choice in self.action.choices)
        if hasattr(self.action.type, "expects"):  # a flag whose values are more than its annotation says
            return self.action.type.expects
        names = [
            "null" if arg is type(None) else getattr(arg, "__name__", str(arg))
            for arg in _union_args(self.hint)
        ]
        return " or ".join(names)


def _union_args(hint: Any) -> tuple[Any, ...]:
    """The members of a Union / `X | Y` annotation, or the annotation alone."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


class RecipeParser(HfArgumentParser):
    """HfArgumentParser whose errors raise RecipeError (testable, same message) instead of exiting."""

    def error(self, message: str):
        raise RecipeError(f"{message} (run with --help to see every flag)")


def build_parser(epilog: str | None = None) -> RecipeParser:
    """The parser over every field of ARGUMENT_DATACLASSES, plus --recipe (the fine-tune command adds its own
    switches to the help, as `epilog`)."""
    parser = RecipeParser(
        ARGUMENT_DATACLASSES,
        allow_abbrev=False,  # `--learn 0.1` must not silently mean --learning_rate
        description="Fine-tune a ViT from a recipe; flags override the recipe's values.",
        epilog=epilog,
    )
    parser.add_argument(
        "--recipe", help="Recipe name in recipes/ (see --list-recipes) or path to a .yaml file."
    )
    for action in parser._actions:
        if action.dest == "dataloader_num_workers":  # TrainingArguments' int, which also takes `auto` here
            action.type, action.help = parse_num_workers, NUM_WORKERS_HELP
    return parser


def argument_fields(parser: argparse.ArgumentParser) -> dict[str, ArgumentField]:
    """Every init field of ARGUMENT_DATACLASSES by name, each with the parser's action for its `--<name>` flag."""
    actions = {}
    for action in parser._actions:
        main_option = f"--{action.dest}"
        if main_option in action.option_strings:  # skips the `--no_<name>` complements of boolean flags
            actions[action.dest] = action
    fields = {}
    for owner in ARGUMENT_DATACLASSES:
        hints = typing.get_type_hints(owner)
        for field in dataclasses.fields(owner):
            if field.init:
                fields[field.name] = ArgumentField(field.name, owner, hints[field.name], actions[field.name])
    return fields


def _none_aware(convert: typing.Callable[[str], Any]) -> typing.Callable[[str], Any]:
    """Wrap an argparse type so that `none`/`null` gives None, letting a flag unset a recipe value."""

    def parse(text: str) -> Any:
        return None if text.strip().lower() in _NONE_STRINGS else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def only_explicit_flags(parser: argparse.ArgumentParser, fields: dict[str, ArgumentField]) -> None:
    """Make parse_known_args return only the flags actually given, and accept `none` for optional fields."""
    for action in parser._actions:
        if action.dest == "help":
            continue
        action.default = argparse.SUPPRESS
        action.required = False
        field = fields.get(action.dest)
        if (
            field is not None
            and action.type is not None
            and field.allows(type(None))
            and not field.allows(bool)
            and field.name not in _NONE_IS_A_VALUE
        ):
            action.type = _none_aware(action.type)


def coerce(field: ArgumentField, value: Any, where: str) -> Any:
    """Check a YAML value against the field's type and convert it the way the command line would."""
    if value is None:
        if field.allows(type(None)):
            return None
        raise RecipeError(f"{where}: {field.name} cannot be null; it expects {field.describe()}.")
    if isinstance(value, dict):
        if field.allows(dict):
            return value
        raise RecipeError(
            f"{where}: {field.name} expects {field.describe()}, not a nested mapping; recipes are flat "
            f"(write `{field.name}: <value>`)."
        )
    if isinstance(value, list):
        if not field.allows(list):
            raise RecipeError(
                f"{where}: {field.name} expects a single value ({field.describe()}), not a list."
            )
        if any(isinstance(item, (dict, list)) for item in value):
            raise RecipeError(f"{where}: {field.name} expects a flat list of strings; got {value!r}.")
        return [str(item) for item in value]
    if isinstance(value, bool) and not field.allows(bool):
        raise RecipeError(
            f"{where}: {field.name}: YAML read an unquoted yes/no/on/off/true/false as the boolean {value}, but "
            f'{field.name} expects {field.describe()}; quote the value, e.g. {field.name}: "no".'
        )
    if (
        isinstance(value, str)
        and value.strip().lower() in _NONE_STRINGS
        and field.allows(type(None))
        and field.name not in _NONE_IS_A_VALUE
    ):
        return None  # `test_split: none` unsets like the flag `--test_split none` does
    converted = value
    if field.action.type is not None:
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        try:
            converted = field.action.type(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise RecipeError(
                f"{where}: {field.name}={value!r} is not valid; it expects {field.describe()}."
            ) from None
    if field.action.choices and converted is not None and converted not in field.action.choices:
        hint = suggest(str(converted), [str(choice) for choice in field.action.choices])
        raise RecipeError(f"{where}: {field.name}={value!r} is not {field.describe()}{hint}")
    return converted


# ---- recipe plus flags -> the argument dataclasses -----------------------------------------------------------


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


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Parse `--recipe NAME_OR_PATH` plus flags (argv defaults to sys.argv[1:]) into validated (ModelArguments,
    DataArguments, TrainingArguments): the run plan's arguments (`build_plan`)."""
    plan = build_plan(argv)
    return plan.model_args, plan.data_args, plan.training_args


def build_plan(argv: list[str] | None = None) -> RunPlan:
    """The run plan of `--recipe NAME_OR_PATH` plus flags (argv defaults to sys.argv[1:]). Flags override the
    recipe; an optional field takes `none` to unset a recipe value (`--max_train_samples none`). Bad keys, values
    or combinations raise RecipeError (a ValueError) before anything is downloaded or loaded."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    fields = argument_fields(parser)
    only_explicit_flags(parser, fields)
    namespace, rest = parser.parse_known_args(argv)
    if rest:
        raise _unknown_flag_error(rest, fields)
    flags = vars(namespace)
    recipe = flags.pop("recipe", None)
    recipe_values = load_recipe(resolve_recipe(recipe)) if recipe else {}
    name = recipe_name(recipe) if recipe else None
    # a checkpoint of another family than the recipe's: its protocol over the recipe's values, under the flags
    family_values, family_decision = choose_family_defaults(recipe_values, flags, name)
    # a peft method's defaults for the checkpoint's family: only the keys the recipe and the flags leave unset
    method_values = choose_method_defaults(recipe_values, flags, family_decision)
    values = merge_values({**method_values, **recipe_values, **family_values}, flags, name)
    try:  # HfArgumentParser.parse_dict: each dataclass takes its fields, in order, and checks them when built
        model_args, data_args, training_args = parser.parse_dict(values)
    except RecipeError:
        raise
    except ValueError as error:
        raise RecipeError(str(error)) from error
    validate(model_args, data_args, training_args)
    sources = value_sources(recipe_values, family_values, flags, values, method_values)
    return RunPlan(name, model_args, data_args, training_args, sources, values, family_decision).decided()


__all__ = [
    "ARGUMENT_DATACLASSES",
    "RECIPES_ENV_VAR",
    "RECIPES_PACKAGE",
    "TRAINING_DEFAULTS",
    "ArgumentField",
    "RecipeError",
    "RecipeParser",
    "argument_fields",
    "build_parser",
    "coerce",
    "list_recipes",
    "load_recipe",
    "only_explicit_flags",
    "build_plan",
    "parse_args",
    "recipe_name",
    "recipes_dir",
    "resolve_recipe",
    "suggest",
]
