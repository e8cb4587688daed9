"""Recipes: flat YAML files of argument values, merged with command-line flags into the argument dataclasses.

A recipe's keys are exactly the field names of `ModelArguments`, `DataArguments` and
`transformers.TrainingArguments` (alignment-handbook style). Values are resolved in this order, later wins:

    dataclass defaults < TRAINING_DEFAULTS < the recipe's YAML < command-line flags

    accelerate launch scripts/finetune.py --recipe dogs --learning_rate 0.01 --image_size 448

An unknown key, in the YAML or on the command line, is an error that names it and the closest valid key.
Everything that can be checked without a network is checked by `validate` before any model or data is loaded.
"""

import argparse
import dataclasses
import difflib
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, TextIO

import torch
import yaml
from transformers import HfArgumentParser, TrainingArguments

from vit_ft.arguments import DataArguments, ModelArguments
from vit_ft.metrics import METRIC_NAMES

RECIPES_ENV_VAR = "VIT_FT_RECIPES_DIR"
_REPO_RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"

ARGUMENT_DATACLASSES = (ModelArguments, DataArguments, TrainingArguments)

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

# Optional fields where the string "none" already means something, so it must not become None.
_NONE_IS_A_VALUE = frozenset({"report_to"})
_NONE_STRINGS = frozenset({"none", "null"})


class RecipeError(ValueError):
    """A recipe or command line that cannot become valid arguments; the message says what to change."""


# ---------------------------------------------------------------------------------------------------------------
# Finding recipes
# ---------------------------------------------------------------------------------------------------------------


def recipes_dir() -> Path:
    """The recipes folder: $VIT_FT_RECIPES_DIR if set, else the repository's `recipes/`, else `./recipes`."""
    override = os.environ.get(RECIPES_ENV_VAR)
    if override:
        return Path(override).expanduser()
    if _REPO_RECIPES_DIR.is_dir():
        return _REPO_RECIPES_DIR
    return Path.cwd() / "recipes"  # an installed (non-editable) package does not carry the repo's recipes


def list_recipes() -> list[str]:
    """Names of the recipes in `recipes_dir()`, sorted (a recipe's name is its file name without `.yaml`)."""
    directory = recipes_dir()
    if not directory.is_dir():
        return []
    return sorted(
        path.stem for path in directory.iterdir() if path.suffix in (".yaml", ".yml") and path.is_file()
    )


def resolve_recipe(name_or_path: str | os.PathLike) -> Path:
    """Return the YAML file for a recipe name (`dogs`) or a path (`my/recipe.yaml`); unknown names list the choices."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in text or os.sep in text:
        if path.is_file():
            return path
        raise RecipeError(
            f"Recipe file {text!r} does not exist; pass an existing .yaml path or a recipe name."
        )
    directory = recipes_dir()
    for suffix in (".yaml", ".yml"):
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
# The fields a recipe may set, with the argparse action that converts their command-line strings
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    owner: type
    hint: Any  # the annotation, e.g. `int | None`
    action: argparse.Action

    def allows(self, kind: type) -> bool:
        return any(arg is kind or typing.get_origin(arg) is kind for arg in _union_args(self.hint))

    def describe(self) -> str:
        if self.action.choices:
            return "one of " + ", ".join(str(choice) for choice in self.action.choices)
        names = [
            "null" if arg is type(None) else getattr(arg, "__name__", str(arg))
            for arg in _union_args(self.hint)
        ]
        return " or ".join(names)


def _union_args(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


class _Parser(HfArgumentParser):
    """HfArgumentParser whose errors raise RecipeError (testable, same message) instead of exiting."""

    def error(self, message: str):
        raise RecipeError(f"{message} (run with --help to see every flag)")


def _build_parser() -> _Parser:
    parser = _Parser(
        ARGUMENT_DATACLASSES,
        allow_abbrev=False,  # `--learn 0.1` must not silently mean --learning_rate
        description="Fine-tune a ViT from a recipe; flags override the recipe's values.",
    )
    parser.add_argument(
        "--recipe", help="Recipe name in recipes/ (see --list-recipes) or path to a .yaml file."
    )
    parser.add_argument(
        "--list-recipes", "--list_recipes", action="store_true", help="Print the recipes and exit."
    )
    return parser


def _fields(parser: argparse.ArgumentParser) -> dict[str, _Field]:
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
                fields[field.name] = _Field(field.name, owner, hints[field.name], actions[field.name])
    return fields


def _none_aware(convert: typing.Callable[[str], Any]) -> typing.Callable[[str], Any]:
    """Wrap an argparse type so that `none`/`null` gives None, letting a flag unset a recipe value."""

    def parse(text: str) -> Any:
        return None if text.strip().lower() in _NONE_STRINGS else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _prepare_for_explicit_flags(parser: argparse.ArgumentParser, fields: dict[str, _Field]) -> None:
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


def _suggest(name: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _coerce(field: _Field, value: Any, where: str) -> Any:
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
        hint = _suggest(str(converted), [str(choice) for choice in field.action.choices])
        raise RecipeError(f"{where}: {field.name}={value!r} is not {field.describe()}{hint}")
    return converted


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
        return {}
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: a recipe is a flat mapping of `key: value` lines, but the file holds a {type(data).__name__}."
        )
    fields = _fields(_build_parser())
    values = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise RecipeError(f"{path}: key {key!r} is not a field name.")
        if key not in fields:
            raise RecipeError(
                f"{path}: unknown key {key!r} (not a field of ModelArguments, DataArguments or TrainingArguments)"
                f"{_suggest(key, fields) or '; run with --help to list the valid keys.'}"
            )
        values[key] = _coerce(fields[key], value, str(path))
    return values


@dataclasses.dataclass(frozen=True)
class RecipeInfo:
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
        "\nLaunch one with: accelerate launch scripts/finetune.py --recipe <RECIPE> [--flag value ...]",
        file=file,
    )


# ---------------------------------------------------------------------------------------------------------------
# Static validation: everything that needs no network and no model
# ---------------------------------------------------------------------------------------------------------------


def read_checkpoint_config(model_name_or_path: str, cache_dir: str | None = None) -> dict[str, Any] | None:
    """The checkpoint's config.json as a dict when it is readable locally (a folder or the HF cache), else None."""
    folder = Path(model_name_or_path).expanduser()
    if folder.is_dir():
        config_file = folder / "config.json"
    else:
        try:
            from transformers.utils import cached_file

            resolved = cached_file(
                model_name_or_path,
                "config.json",
                cache_dir=cache_dir,
                local_files_only=True,
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
            )
        except Exception:  # not cached, or not even a valid repo id: the model loader reports it later
            return None
        if resolved is None:
            return None
        config_file = Path(resolved)
    if not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _patch_size(config: dict[str, Any]) -> int | None:
    patch = config.get("patch_size", config.get("vision_config", {}).get("patch_size"))
    if isinstance(patch, (list, tuple)):
        if len(set(patch)) != 1:
            return None  # non-square patches: leave the check to the model loader
        patch = patch[0]
    return patch if isinstance(patch, int) and patch > 0 else None


def check_image_size(model_args: ModelArguments) -> None:
    """Fail early when image_size is not a positive multiple of the checkpoint's patch size (if its config is local)."""
    if model_args.image_size is None:
        return
    config = read_checkpoint_config(model_args.model_name_or_path, model_args.cache_dir)
    patch = _patch_size(config) if config else None
    if patch is None:
        return
    size = model_args.image_size
    if size % patch == 0:
        return
    lower, upper = (size // patch) * patch, (size // patch + 1) * patch
    options = f"{lower} or {upper}" if lower > 0 else str(upper)
    raise RecipeError(
        f"image_size={size} is not a multiple of the patch size {patch} of {model_args.model_name_or_path!r}: "
        f"the image must split into whole {patch}x{patch} patches. Use --image_size {options}."
    )


def _device_type() -> str:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.current_accelerator().type if accelerator.is_available() else "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_precision(training_args: Any, device_type: str | None = None) -> None:
    """Fail early on a mixed precision the hardware cannot run: fp16 without a GPU, bf16 on CPU without use_cpu.

    `training_args` is a TrainingArguments or anything with its fp16/bf16/use_cpu attributes; `device_type`
    ("cuda", "cpu", ...) defaults to the accelerator torch finds.
    """
    use_cpu = bool(getattr(training_args, "use_cpu", False))
    device = "cpu" if use_cpu else (device_type or _device_type())
    fp16 = bool(getattr(training_args, "fp16", False) or getattr(training_args, "fp16_full_eval", False))
    bf16 = bool(getattr(training_args, "bf16", False) or getattr(training_args, "bf16_full_eval", False))
    if fp16 and device == "cpu":
        where = "use_cpu is set" if use_cpu else "no GPU was found"
        raise RecipeError(
            f"fp16 mixed precision needs a CUDA GPU, but {where}. Use bf16 instead (--fp16 false --bf16 true, "
            "adding --use_cpu true on CPU) or drop fp16 (--fp16 false) to train in fp32."
        )
    if bf16 and device == "cpu" and not use_cpu:
        raise RecipeError(
            "bf16 is set but no GPU was found. Drop it (--bf16 false) to train in fp32 on CPU, or pass "
            "--use_cpu true to train with CPU bf16 autocast."
        )
    if bf16 and device == "cuda" and device_type is None:
        import torch

        if not torch.cuda.is_bf16_supported():
            raise RecipeError(
                "bf16 needs an Ampere or newer GPU; this one has none. Use --bf16 false --fp16 true."
            )


def check_evaluation(data_args: DataArguments, training_args: TrainingArguments) -> None:
    """Fail early when evaluation is on but has no data, or best-model selection watches a metric we never compute."""
    metric = training_args.metric_for_best_model
    if metric is not None:
        name = metric.removeprefix("eval_")
        if name not in (*METRIC_NAMES, "loss"):
            allowed = ", ".join((*METRIC_NAMES, "loss"))
            raise RecipeError(
                f"metric_for_best_model={metric!r} is not computed here; use one of {allowed}"
                f"{_suggest(name, (*METRIC_NAMES, 'loss')) or '.'}"
            )
    if str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy)) == "no":
        return
    if data_args.validation_split_percentage > 0:
        return
    if data_args.train_dir and not data_args.validation_dir:
        raise RecipeError(
            "Evaluation is on but there is no validation data: set validation_dir, or validation_split_percentage "
            "> 0 to hold out part of train_dir, or --eval_strategy no."
        )
    if data_args.dataset_name and not data_args.validation_split:
        raise RecipeError(
            "Evaluation is on but there is no validation data: set validation_split to the dataset's validation "
            "split, or validation_split_percentage > 0 to hold out part of train, or --eval_strategy no."
        )


def validate(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments) -> None:
    """All static checks, cheapest first-to-fail order: image size vs patch size, precision, evaluation setup.

    Needs no network: the checkpoint's patch size is read only from a local folder or the HF cache
    (otherwise that check is left to the model loader). Data folders are not required to exist yet:
    `vit_ft.data.load_image_datasets` checks them, naming the argument, when it loads them.
    """
    check_image_size(model_args)
    check_precision(training_args)
    check_evaluation(data_args, training_args)


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


def _unknown_flag_error(rest: list[str], fields: dict[str, _Field]) -> RecipeError:
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


def _construct(cls: type, values: dict[str, Any]) -> Any:
    names = {field.name for field in dataclasses.fields(cls) if field.init}
    return cls(**{key: value for key, value in values.items() if key in names})


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Parse `--recipe NAME_OR_PATH` plus flags into validated (ModelArguments, DataArguments, TrainingArguments).

    argv defaults to sys.argv[1:]. Flags override the recipe (`--recipe dogs --learning_rate 0.01`); an optional
    field takes `none` to unset a recipe value (`--max_train_samples none`). `--help` prints every flag and
    `--list-recipes` prints the recipes; both exit via SystemExit(0). Bad keys, values or combinations raise
    RecipeError (a ValueError) before anything is downloaded or loaded.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _build_parser().parse_args(["--help"])  # prints the help with every flag's default, then exits

    parser = _build_parser()
    fields = _fields(parser)
    _prepare_for_explicit_flags(parser, fields)
    namespace, rest = parser.parse_known_args(argv)
    if rest:
        raise _unknown_flag_error(rest, fields)
    flags = vars(namespace)
    if flags.pop("list_recipes", False):
        print_recipes()
        raise SystemExit(0)
    recipe = flags.pop("recipe", None)

    recipe_values = load_recipe(resolve_recipe(recipe)) if recipe else {}
    values = _merge([recipe_values, flags], recipe_name(recipe) if recipe else None)

    # Construct in the order of the checks' cost and certainty: a wrong image size is reported before
    # anything about data or hardware, and precision before TrainingArguments' own, vaguer, device errors.
    model_args = _construct(ModelArguments, values)
    check_image_size(model_args)
    data_args = _construct(DataArguments, values)
    training_fields = {
        field.name: field.default for field in dataclasses.fields(TrainingArguments) if field.init
    }
    check_precision(types.SimpleNamespace(**{**training_fields, **values}))
    training_args = _construct(TrainingArguments, values)
    validate(model_args, data_args, training_args)
    return model_args, data_args, training_args


__all__ = [
    "ARGUMENT_DATACLASSES",
    "RECIPES_ENV_VAR",
    "TRAINING_DEFAULTS",
    "RecipeError",
    "RecipeInfo",
    "check_evaluation",
    "check_image_size",
    "check_precision",
    "list_recipes",
    "load_recipe",
    "parse_args",
    "print_recipes",
    "read_checkpoint_config",
    "recipe_info",
    "recipe_name",
    "recipes_dir",
    "resolve_recipe",
    "validate",
]
