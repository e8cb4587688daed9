"""The fields a recipe may set: one argparse parser over the argument dataclasses, and per-field conversion.

`build_parser` is transformers' HfArgumentParser over `ModelArguments`, `DataArguments` and `TrainingArguments`
(as its subclass `FineTuneTrainingArguments`) plus `--recipe` / `--list-recipes`, raising `RecipeError` instead of exiting. `argument_fields` pairs each
dataclass field with the argparse action that converts its command-line string, so that `coerce` converts a
YAML value exactly as the flag would be; `only_explicit_flags` makes the parser return only the flags given.
`vit_ft.training.recipes` builds recipe loading and `parse_args` on these.
"""

import argparse
import dataclasses
import difflib
import types
import typing
from typing import Any

from transformers import HfArgumentParser

from vit_ft.training.arguments import DataArguments, ModelArguments
from vit_ft.training.training_arguments import FineTuneTrainingArguments

# FineTuneTrainingArguments is transformers' TrainingArguments plus the toolkit's keys (layer decay, EMA, ...)
ARGUMENT_DATACLASSES = (ModelArguments, DataArguments, FineTuneTrainingArguments)

# Optional fields where the string "none" already means something, so it must not become None.
_NONE_IS_A_VALUE = frozenset({"report_to"})
_NONE_STRINGS = frozenset({"none", "null"})


class RecipeError(ValueError):
    """A recipe or command line that cannot become valid arguments; the message says what to change."""


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
        names = [
            "null" if arg is type(None) else getattr(arg, "__name__", str(arg))
            for arg in _union_args(self.hint)
        ]
        return " or ".join(names)


def _union_args(hint: Any) -> tuple[Any, ...]:
    """The members of a Union / `X | Y` annotation, or the annotation alone."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


class RecipeParser(HfArgumentParser):
    """HfArgumentParser whose errors raise RecipeError (testable, same message) instead of exiting."""

    def error(self, message: str):
        raise RecipeError(f"{message} (run with --help to see every flag)")


def build_parser() -> RecipeParser:
    """The parser over every field of ARGUMENT_DATACLASSES, plus --recipe and --list-recipes."""
    parser = RecipeParser(
        ARGUMENT_DATACLASSES,
        allow_abbrev=False,  # `--learn 0.1` must not silently mean --learning_rate
        description="Fine-tune a ViT from a recipe; flags override the recipe's values.",
        epilog="The fine-tune command (vit-ft finetune, scripts/finetune.py) also takes: --resume (continue from "
        "the last complete checkpoint-* in output_dir), --overwrite_output_dir (replace a finished run there), "
        "--sweep ARG=V1,V2,... (one fine-tune per value into output_dir/sweep-ARG-V/, the best on validation "
        "copied to output_dir) and --debug (a traceback instead of the one-line error).",
    )
    parser.add_argument(
        "--recipe", help="Recipe name in recipes/ (see --list-recipes) or path to a .yaml file."
    )
    parser.add_argument(
        "--list-recipes", "--list_recipes", action="store_true", help="Print the recipes and exit."
    )
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


def suggest(name: str, candidates: typing.Iterable[str]) -> str:
    """'; did you mean <closest candidate>?' for an error message, or '' when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


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


__all__ = [
    "ARGUMENT_DATACLASSES",
    "ArgumentField",
    "RecipeError",
    "RecipeParser",
    "argument_fields",
    "build_parser",
    "coerce",
    "only_explicit_flags",
    "suggest",
]
