"""Tests for the fields of vit_ft.arguments.recipes: one field per dataclass field, a YAML value converts as the same flag does,
the parser returns only the flags given, and its errors are RecipeErrors. Recipe files are tested in
test_recipes.py."""

import dataclasses

import pytest
from transformers import TrainingArguments

from vit_ft.arguments.fields import DataArguments, ModelArguments
from vit_ft.arguments.recipes import (
    ARGUMENT_DATACLASSES,
    RecipeError,
    argument_fields,
    build_parser,
    coerce,
    only_explicit_flags,
    suggest,
)
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments


def _explicit_parser():
    parser = build_parser()
    only_explicit_flags(parser, argument_fields(parser))
    return parser


def test_every_dataclass_field_has_its_flag():
    classes = (ModelArguments, DataArguments, FineTuneTrainingArguments)
    assert classes == ARGUMENT_DATACLASSES and issubclass(FineTuneTrainingArguments, TrainingArguments)
    fields = argument_fields(build_parser())
    expected = {field.name for cls in classes for field in dataclasses.fields(cls) if field.init}
    assert set(fields) == expected
    for name, field in fields.items():
        assert field.action.dest == name and f"--{name}" in field.action.option_strings, name
        assert name in {owned.name for owned in dataclasses.fields(field.owner)}, name


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("learning_rate", "1e-3"),
        ("max_steps", "10"),
        ("image_size", "64"),
        ("eval_strategy", "steps"),
        ("lr_scheduler_type", "cosine"),
        ("horizontal_flip", "false"),
        ("test_split", "none"),
        ("max_train_samples", "null"),
        ("report_to", "none"),  # "none" is a value of report_to, not an unset
    ],
)
def test_a_yaml_string_converts_like_the_same_flag(name, text):
    field = argument_fields(build_parser())[name]
    from_flag = vars(_explicit_parser().parse_known_args([f"--{name}", text])[0])[name]
    assert coerce(field, text, "recipe.yaml") == from_flag


def test_only_explicit_flags_returns_just_the_flags_given():
    parser = _explicit_parser()
    assert vars(parser.parse_known_args([])[0]) == {}
    namespace, rest = parser.parse_known_args(["--seed", "3", "--recipe", "digits"])
    assert vars(namespace) == {"seed": 3, "recipe": "digits"} and rest == []


def test_parser_errors_are_recipe_errors_that_point_to_help():
    with pytest.raises(RecipeError, match=r"invalid int value: 'many'.*run with --help"):
        build_parser().parse_args(["--max_steps", "many"])


def test_coerce_names_the_field_and_what_it_expects():
    fields = argument_fields(build_parser())
    with pytest.raises(RecipeError, match=r"recipe.yaml: max_steps='many' is not valid; it expects int"):
        coerce(fields["max_steps"], "many", "recipe.yaml")
    with pytest.raises(RecipeError, match="image_column cannot be null"):
        coerce(fields["image_column"], None, "recipe.yaml")
    assert coerce(fields["report_to"], ["tensorboard", "wandb"], "recipe.yaml") == ["tensorboard", "wandb"]


def test_suggest_names_the_closest_candidate_or_nothing():
    assert suggest("learnig_rate", ["learning_rate", "seed"]) == "; did you mean 'learning_rate'?"
    assert suggest("zzz", ["learning_rate", "seed"]) == ""
