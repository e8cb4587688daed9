"""Tests for vit_ft.arguments.ranges, the table of ranges (RANGES): generated from the argument dataclasses' numeric
fields, so that a new int / float field without a range fails here, and each range refuses NaN, infinity and the
value just outside it with one line naming the field, whether the value comes from Python, a flag or a recipe."""

from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest
import torch

from vit_ft.arguments.checks import RecipeError
from vit_ft.arguments.fields import DataArguments, ModelArguments
from vit_ft.arguments.ranges import EXEMPT, RANGES, VALUE_RANGES
from vit_ft.arguments.recipes import ARGUMENT_DATACLASSES, parse_args
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments

NUMBERS = (int, float)


def numeric_fields() -> dict[str, tuple[type, type, typing.Any]]:
    """name -> (dataclass, int or float, default) for every init field typed int, float or an Optional of one, of
    every argument dataclass a recipe sets (TrainingArguments' fields through FineTuneTrainingArguments)."""
    found = {}
    for owner in ARGUMENT_DATACLASSES:
        hints = typing.get_type_hints(owner)
        for field in dataclasses.fields(owner):
            hint = hints[field.name]
            members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
            kinds = [member for member in members if member in NUMBERS]
            if field.init and kinds and all(m in (*NUMBERS, type(None)) for m in members):
                found[field.name] = (owner, float if float in kinds else int, field.default)
    return found


FIELDS = numeric_fields()


def outside(name: str) -> list[float | int]:
    """The values just outside the field's range: below its lower bound, and above its upper bound where finite
    (the bound itself where it is open; the next integer, or the next float, where it is closed)."""
    bounds = RANGES[name]
    values = []
    for bound, is_open, direction in (
        (bounds.low, bounds.interval[0] == "(", -1),
        (bounds.high, bounds.interval[-1] == ")", 1),
    ):
        if math.isinf(bound):
            continue
        if is_open:
            values.append(int(bound) if bounds.integer else bound)
        else:
            values.append(int(bound) + direction if bounds.integer else math.nextafter(bound, direction * math.inf))
    return values


def bad_values() -> list[tuple[str, float | int]]:
    cases = []
    for name, (_, kind, _) in sorted(FIELDS.items()):
        if name not in RANGES:
            continue
        cases += [(name, math.inf), (name, -math.inf)] + [(name, math.nan)] * (kind is float)
        cases += [(name, value) for value in outside(name)]
    return cases


def build(owner: type, name: str, value, tmp_path):
    """The dataclass with `name=value` and the least else it needs, as Python (or parse_dict) builds it."""
    if owner is ModelArguments:
        return ModelArguments(**{name: value})
    if owner is DataArguments:
        return DataArguments(train_dir="data/train", **{name: value})
    return FineTuneTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **{name: value})


def test_the_generator_sees_the_numeric_fields_of_every_dataclass():
    """The generation itself can fail: it finds fields of each dataclass, Optional ones and transformers' too."""
    owners = {owner for owner, _, _ in FIELDS.values()}
    assert owners == set(ARGUMENT_DATACLASSES)
    for name in ("image_size", "lora_r", "mixup_alpha", "max_eval_samples", "learning_rate", "eval_steps", "ema_decay"):
        assert name in FIELDS
    assert "pooling" not in FIELDS and "use_lora" not in FIELDS  # a string, a bool


def test_every_numeric_field_has_a_range_or_a_stated_exemption():
    missing = sorted(set(FIELDS) - set(RANGES) - set(EXEMPT))
    assert not missing, f"numeric fields without a range in vit_ft.arguments.ranges.RANGES: {missing}"
    assert not set(RANGES) & set(EXEMPT)
    assert all(reason.strip() for reason in EXEMPT.values())
    stale = sorted((set(RANGES) | set(EXEMPT)) - set(FIELDS))
    assert not stale, f"ranges of fields no dataclass has: {stale}"
    for name, bounds in RANGES.items():  # integers where the field is an int, and never for a float field
        assert bounds.integer == (FIELDS[name][1] is int), name


def test_the_numbers_inside_other_fields_have_their_range_in_the_same_module():
    names = {field.name for owner in ARGUMENT_DATACLASSES for field in dataclasses.fields(owner)}
    assert set(VALUE_RANGES) <= names - set(FIELDS)  # fields, and not plain numbers (those are in RANGES)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"class_weights": f"cat={text}"}, f"class_weights['cat']='{text}' must be a positive finite number")
        for text in ("nan", "inf", "-inf", "0")
    ]
    + [
        ({"decision_threshold": text}, f"decision_threshold='{text}' must be 'tune', 'tune_per_class' or a probability")
        for text in ("nan", "inf", "0", "1", str(math.nextafter(1.0, 2.0)))
    ],
)
def test_a_number_inside_a_field_outside_its_range_is_one_line_naming_the_field(values, said, tmp_path):
    name, text = next(iter(values.items()))
    number = float(text.split("=")[-1])
    assert not VALUE_RANGES[name].allows(number)
    with pytest.raises(ValueError) as error:
        FineTuneTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **values)
    assert str(error.value).startswith(said) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", sorted(RANGES))
def test_every_default_is_inside_its_range(name):
    default = FIELDS[name][2]
    assert default is None or RANGES[name].allows(default), f"{name}'s default {default!r} is outside its range"


@pytest.mark.parametrize(("name", "value"), bad_values(), ids=lambda v: repr(v) if isinstance(v, float) else v)
def test_a_value_outside_its_range_is_one_line_naming_the_field(name, value, tmp_path):
    owner = FIELDS[name][0]
    with pytest.raises(RecipeError) as error:
        build(owner, name, value, tmp_path)
    message = str(error.value)
    assert message.startswith(f"{name}={value!r} must be ") and "\n" not in message, message
    assert RANGES[name].describe() in message  # the range itself, and how to choose a value
    assert message.split(": ", 1)[1].strip(".")


# what transformers, torch or the data layer refuse of a value: our range refuses it too (and with the field's name)
REFERENCES = [
    # transformers' TrainingArguments.__post_init__
    ("warmup_steps", -1.0),
    ("torch_empty_cache_steps", 0),
    ("logging_steps", 0.0),
    # torch's AdamW: betas in [0, 1), eps >= 0, lr >= 0
    ("adam_beta1", 1.0),
    ("adam_beta2", -0.1),
    ("adam_epsilon", -1e-8),
    ("learning_rate", -1e-3),
]


@pytest.mark.parametrize(("name", "value"), REFERENCES)
def test_what_the_libraries_refuse_is_outside_our_ranges(name, value):
    assert not RANGES[name].allows(value)


@pytest.mark.parametrize("beta", [0.0, 0.5, math.nextafter(1.0, 0.0), 1.0, -0.01, math.nan, math.inf])
def test_adam_betas_agree_with_torch(beta):
    """torch.optim.AdamW is the reference for the betas' range: it accepts exactly what RANGES accepts."""
    parameter = [torch.nn.Parameter(torch.zeros(1))]
    try:
        torch.optim.AdamW(parameter, betas=(beta, beta))
        torch_accepts = True
    except ValueError:
        torch_accepts = False
    assert RANGES["adam_beta1"].allows(beta) == RANGES["adam_beta2"].allows(beta) == torch_accepts


def test_randaugment_bounds_are_the_augmentation_layers():
    from vit_ft.data.augmentation import MAX_MAGNITUDE, MAX_NUM_OPS

    assert RANGES["rand_augment_num_ops"].high == MAX_NUM_OPS and RANGES["rand_augment_magnitude"].high == MAX_MAGNITUDE


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--weight_decay", "nan"], "weight_decay=nan must be a finite number >= 0"),
        (["--learning_rate", "inf"], "learning_rate=inf must be positive"),
        (["--max_grad_norm=-inf"], "max_grad_norm=-inf must be a finite number >= 0"),
        (["--adam_beta2", "1"], r"adam_beta2=1.0 must be in [0, 1)"),
        (["--warmup_steps", "nan"], "warmup_steps=nan must be a finite number >= 0"),
        (["--eval_steps", "inf"], "eval_steps=inf must be positive"),
        (["--num_train_epochs", "nan"], "num_train_epochs=nan must be a finite number >= 0"),
        (["--seed", "-1"], "seed=-1 must be an integer in [0, 4294967295]"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size=0 must be a positive integer"),
        (["--dataloader_num_workers", "-2"], "dataloader_num_workers=-2 must be an integer >= 0"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps=0 must be a positive integer"),
        (["--label_smoothing_factor", "inf"], "label_smoothing_factor=inf must be in [0, 1)"),
        (["--mixup_alpha", "nan"], "mixup_alpha=nan must be a finite number >= 0"),
        (["--drop_path_rate", "nan"], "drop_path_rate=nan must be in [0, 1)"),
        (["--lora_r", "inf"], "--lora_r/--lora-r: invalid int value: 'inf'"),  # the parser's own word for an int flag
    ],
)
def test_a_flag_outside_its_range_is_one_line_from_parse_args(flags, said):
    with pytest.raises(RecipeError) as error:
        parse_args(["--recipe", "digits", *flags])
    assert said in str(error.value) and "\n" not in str(error.value)


def test_a_recipe_value_outside_its_range_is_one_line(tmp_path):
    """YAML's own NaN and infinity (.nan, .inf) and the words a user writes ("nan") are refused alike."""
    for value in (".nan", "-.inf", '"nan"', "1e400"):
        recipe = tmp_path / "bad.yaml"
        recipe.write_text(f"train_dir: data/train\nmodel_name_or_path: {tmp_path}\nweight_decay: {value}\n")
        with pytest.raises(RecipeError, match=r"^weight_decay=(nan|-inf|inf) must be a finite number >= 0") as error:
            parse_args(["--recipe", str(recipe)])
        assert "\n" not in str(error.value)
