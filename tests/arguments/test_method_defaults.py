"""A peft method's defaults per family (`vit_ft.arguments.method_defaults`) as the run plan applies them: for each
family x method the plan's values are the table's row, with their source; a flag or a recipe key wins; a recipe of
another family gives way to the family's row; the peft configs read the same table. Plans only, no model built."""

from __future__ import annotations

import dataclasses

import pytest

from vit_ft.arguments.family_defaults import FAMILY_DEFAULTS, checkpoint_family
from vit_ft.arguments.fields import PEFT_METHODS, ModelArguments
from vit_ft.arguments.method_defaults import GENERIC, METHOD_DEFAULTS, method_defaults, method_values
from vit_ft.arguments.recipes import build_plan
from vit_ft.training.peft_methods import PEFT_METHOD_TABLE, TARGET_PRESETS

from .test_family_defaults import CHECKPOINTS, CPU, ROW, VIT_RECIPE, _folder, _recipe

DATA = ["--dataset_name", "a/b"]


def _plan_value(plan, key):
    return getattr(plan.model_args if hasattr(plan.model_args, key) else plan.training_args, key)


def test_every_method_has_a_generic_row_with_a_source_and_rows_name_known_families():
    assert set(METHOD_DEFAULTS) == set(PEFT_METHODS)
    for method, rows in METHOD_DEFAULTS.items():
        assert GENERIC in rows and set(rows) - {GENERIC} <= set(FAMILY_DEFAULTS), method
        assert all(row.source and row.learning_rate > 0 for row in rows.values())


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_the_plan_takes_each_methods_row_for_the_checkpoints_family(tmp_path, name):
    folder = _folder(tmp_path, name)
    family = checkpoint_family(folder)
    assert family == ROW.get(name, name)
    for method in PEFT_METHODS:
        plan = build_plan([*DATA, "--model_name_or_path", folder, "--method", method, *CPU])
        expected = method_values(method, family)
        for key, value in expected.items():
            assert _plan_value(plan, key) == value, (method, key)
            assert plan.sources[key] == "method defaults", (method, key)
        assert "[method defaults]" in plan.describe()  # --print_plan names where each value came from


def test_clip_takes_clip_loras_row_and_other_families_the_generic_one(tmp_path):
    clip = build_plan([*DATA, "--model_name_or_path", _folder(tmp_path, "clip"), "--method", "lora", *CPU])
    dinov2 = build_plan([*DATA, "--model_name_or_path", _folder(tmp_path, "dinov2"), "--method", "lora", *CPU])
    # CLIP-LoRA's run_utils.py defaults (r 2, alpha 1, dropout 0.25, lr 2e-4); peft's ViT example elsewhere
    assert (clip.model_args.lora_r, clip.model_args.lora_alpha, clip.training_args.learning_rate) == (2, 1, 2e-4)
    assert (dinov2.model_args.lora_r, dinov2.model_args.lora_alpha, dinov2.training_args.learning_rate) == (16, 16, 5e-3)


@pytest.mark.parametrize(
    ("method", "flags", "given"),
    [
        ("lora", ["--lora_r", "4", "--learning_rate", "0.1"], {"lora_r": 4, "learning_rate": 0.1}),
        ("dora", ["--lora_target_modules", "attention+mlp"], {"lora_target_modules": "attention+mlp"}),
        ("vera", ["--peft_r", "64"], {"peft_r": 64}),
        ("ia3", ["--peft_target_modules", "qkv"], {"peft_target_modules": "qkv"}),
    ],
)
def test_a_flag_overrides_the_row_and_the_rest_stays(tmp_path, method, flags, given):
    plan = build_plan([*DATA, "--model_name_or_path", _folder(tmp_path, "clip"), "--method", method, *flags, *CPU])
    for key, value in method_values(method, "clip").items():
        expected, source = (given[key], "flag") if key in given else (value, "method defaults")
        assert (_plan_value(plan, key), plan.sources[key]) == (expected, source), key


def test_a_recipe_key_wins_over_the_row(tmp_path):
    clip = _folder(tmp_path, "clip")
    text = f"model_name_or_path: {clip}\ndataset_name: a/b\nmethod: lora\nlora_r: 8\nlearning_rate: 0.001\n"
    plan = build_plan(["--recipe", _recipe(tmp_path, text), *CPU])
    assert (plan.model_args.lora_r, plan.sources["lora_r"]) == (8, "recipe")
    assert (plan.training_args.learning_rate, plan.sources["learning_rate"]) == (0.001, "recipe")
    assert (plan.model_args.lora_alpha, plan.sources["lora_alpha"]) == (1, "method defaults")  # unset: the row's


def test_full_fine_tuning_and_the_ladder_take_no_method_defaults(tmp_path):
    clip = _folder(tmp_path, "clip")
    for method in ("full", "auto", "linear"):
        plan = build_plan([*DATA, "--model_name_or_path", clip, "--method", method, *CPU])
        assert "method defaults" not in plan.sources.values(), method


@pytest.mark.parametrize(("name", "method"), [("clip", "lora"), ("dinov2", "lora"), ("mae", "vera")])
def test_a_recipe_of_another_family_takes_the_methods_rate_not_the_full_protocols(tmp_path, name, method):
    """The ViT recipe (SGD, lr 0.03) on another family's checkpoint: the family's protocol, but a peft method's
    learning rate is the method's row's (the protocols' rates are full fine-tuning's); a family with a row of its
    own for the method replaces the recipe's targets and rank too."""
    plan = build_plan(["--recipe", _recipe(tmp_path, VIT_RECIPE.format(model=_folder(tmp_path, "vit"))),
                       "--model_name_or_path", _folder(tmp_path, name), "--method", method, *CPU])  # fmt: skip
    family = ROW.get(name, name)
    row = method_defaults(method, family)
    assert plan.training_args.learning_rate == row.learning_rate != FAMILY_DEFAULTS[family].values["learning_rate"]
    assert plan.sources["learning_rate"] == "family defaults"
    assert plan.training_args.optim == FAMILY_DEFAULTS[family].values["optim"]  # the rest of the protocol
    rank_key = "lora_r" if method == "lora" else "peft_r"
    assert _plan_value(plan, rank_key) == row.rank
    own = family in METHOD_DEFAULTS[method]
    assert plan.sources[rank_key] == ("family defaults" if own else "method defaults")


def test_the_peft_configs_defaults_are_the_generic_rows():
    model_defaults = {field.name: field.default for field in dataclasses.fields(ModelArguments)}
    for method, row in PEFT_METHOD_TABLE.items():
        generic = method_defaults(method, None)
        targets = TARGET_PRESETS.get(generic.targets) or generic.targets.split(",")
        assert (list(row.targets), row.rank, row.learning_rate) == (targets, generic.rank, generic.learning_rate)
        if method == "lora":  # the dataclass's LoRA defaults are the generic row's: a plain run changes nothing
            assert (model_defaults["lora_r"], model_defaults["lora_alpha"]) == (generic.rank, generic.alpha)
            assert (model_defaults["lora_dropout"], model_defaults["lora_target_modules"]) == (
                generic.dropout,
                generic.targets,
            )
