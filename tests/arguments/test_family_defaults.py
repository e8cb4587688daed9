"""Family-aware defaults (`vit_ft.arguments.family_defaults`) through `parse_args`: a recipe written for one family
run on another family's checkpoint takes that family's row for its optimisation keys, except flags; a recipe run
on its own family keeps its values; the decision is logged (`describe_family_defaults`) and bad input is one line.

Checkpoints are configs saved by transformers' own classes (a folder with config.json is all the family reading
needs); the recipe is written for the ViT (its model a local ViTConfig folder), or names its family."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import (
    Aimv2VisionConfig,
    CLIPConfig,
    CLIPVisionConfig,
    DeiTConfig,
    Dinov2Config,
    Dinov2WithRegistersConfig,
    DINOv3ViTConfig,
    MetaClip2Config,
    SiglipConfig,
    ViTConfig,
    ViTMAEConfig,
    ViTMSNConfig,
)

from vit_ft.arguments.checks import RecipeError
from vit_ft.arguments.family_defaults import (
    FAMILY_DEFAULTS,
    MODEL_TYPE_FAMILIES,
    OPTIMISATION_KEYS,
    describe_family_defaults,
)
from vit_ft.arguments.recipes import build_plan, parse_args
from vit_ft.model.families import FAMILY_MODEL_TYPES

SIZE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "image_size": 32, "patch_size": 8}  # fmt: skip
# family row -> a config of that family, as transformers writes it
CHECKPOINTS = {
    "vit": lambda: ViTConfig(**SIZE),
    "deit": lambda: DeiTConfig(**SIZE),
    "dinov2": lambda: Dinov2Config(**SIZE),
    "dinov2_registers": lambda: Dinov2WithRegistersConfig(**SIZE, num_register_tokens=2),
    "dinov3": lambda: DINOv3ViTConfig(**SIZE),
    "clip": lambda: CLIPConfig(vision_config=SIZE),
    "clip_vision": lambda: CLIPVisionConfig(**SIZE),
    "metaclip_2": lambda: MetaClip2Config(vision_config=SIZE),
    "siglip": lambda: SiglipConfig(vision_config=SIZE),
    "mae": lambda: ViTMAEConfig(**SIZE),
    "msn": lambda: ViTMSNConfig(**SIZE),
    "aimv2": lambda: Aimv2VisionConfig(**SIZE),
}
ROW = {"dinov2_registers": "dinov2", "clip_vision": "clip", "metaclip_2": "clip"}
# a recipe written for the ViT: the ViT paper's protocol (SGD), on a local ViT checkpoint
VIT_RECIPE = """\
model_name_or_path: {model}
pooling: cls
dataset_name: uoft-cs/cifar10
optim: sgd
optim_args: momentum=0.9
learning_rate: 0.03
weight_decay: 0.0
warmup_steps: 0.05
"""
CPU = ["--use_cpu", "true", "--bf16", "false"]


def _folder(tmp_path: Path, name: str) -> str:
    folder = tmp_path / name
    CHECKPOINTS[name]().save_pretrained(folder)
    return str(folder)


def _recipe(tmp_path: Path, text: str | None = None) -> str:
    path = tmp_path / "vit-recipe.yaml"
    path.write_text(text or VIT_RECIPE.format(model=_folder(tmp_path, "vit")), encoding="utf-8")
    return str(path)


def _value(objects, key):
    owner = next(obj for obj in objects if hasattr(obj, key))
    return getattr(owner, key)


def test_every_family_vit_ft_loads_has_a_row_with_every_key_and_a_source():
    assert set(FAMILY_MODEL_TYPES) <= set(MODEL_TYPE_FAMILIES)  # the loader's families, each with a row
    assert set(MODEL_TYPE_FAMILIES.values()) == set(FAMILY_DEFAULTS)
    for protocol in FAMILY_DEFAULTS.values():
        assert tuple(protocol.values) == OPTIMISATION_KEYS and "arXiv" in protocol.source


@pytest.mark.parametrize("name", [name for name in CHECKPOINTS if ROW.get(name, name) != "vit"])
def test_another_familys_checkpoint_takes_its_row(tmp_path, name):
    recipe = _recipe(tmp_path)
    plan = build_plan(["--recipe", recipe, "--model_name_or_path", _folder(tmp_path, name), *CPU])
    objects = plan.arguments
    row = FAMILY_DEFAULTS[ROW.get(name, name)].values
    for key, value in row.items():
        assert _value(objects, key) == value, key
    assert objects[2].learning_rate != 0.03  # the recipe's was replaced
    decision = plan.family_defaults
    assert (decision["checkpoint_family"], decision["recipe_family"]) == (ROW.get(name, name), "vit")
    assert {row["key"] for row in decision["taken"]} >= {"learning_rate", "optim", "optim_args"}


def test_the_recipes_own_family_keeps_its_values(tmp_path):
    recipe = _recipe(tmp_path)
    other_vit = tmp_path / "other-vit"
    ViTConfig(**{**SIZE, "num_hidden_layers": 2}).save_pretrained(other_vit)
    plan = build_plan(["--recipe", recipe, "--model_name_or_path", str(other_vit), *CPU])
    training_args = plan.training_args
    assert (training_args.learning_rate, training_args.optim_args) == (0.03, "momentum=0.9")
    assert plan.family_defaults["taken"] == []
    assert "written for this family" in describe_family_defaults(plan.family_defaults)[0]


def test_recipe_family_names_the_family_the_recipe_was_written_for(tmp_path):
    # a recipe whose own checkpoint is a ViT but whose values are DINOv2's: a DINOv2 checkpoint keeps them
    text = VIT_RECIPE.format(model=_folder(tmp_path, "vit")) + "recipe_family: dinov2\n"
    plan = build_plan(["--recipe", _recipe(tmp_path, text), "--model_name_or_path",
                       _folder(tmp_path, "dinov2"), *CPU])  # fmt: skip
    assert plan.training_args.learning_rate == 0.03 and plan.family_defaults["taken"] == []
    # and the flag form: the recipe's values are MAE's, so an MAE checkpoint keeps them
    objects = parse_args(["--recipe", _recipe(tmp_path), "--model_name_or_path", _folder(tmp_path, "mae"),
                          "--recipe_family", "mae", *CPU])  # fmt: skip
    assert objects[2].learning_rate == 0.03


def test_flags_win_and_keep_their_pair(tmp_path):
    recipe = _recipe(tmp_path)
    dinov2 = _folder(tmp_path, "dinov2")
    plan = build_plan(["--recipe", recipe, "--model_name_or_path", dinov2, "--learning_rate", "0.5",
                       "--optim", "sgd", *CPU])  # fmt: skip
    training_args = plan.training_args
    assert training_args.learning_rate == 0.5 and training_args.optim == "sgd"
    assert training_args.optim_args == "momentum=0.9"  # sgd's momentum stays with the sgd flag
    assert training_args.layer_decay == FAMILY_DEFAULTS["dinov2"].values["layer_decay"]  # the rest is taken
    decision = plan.family_defaults
    assert decision["kept_flags"] == ["learning_rate", "optim"]
    assert not {"learning_rate", "optim", "optim_args"} & {row["key"] for row in decision["taken"]}


def test_no_recipe_or_the_recipes_own_checkpoint_decides_nothing(tmp_path):
    dinov2 = _folder(tmp_path, "dinov2")
    assert build_plan(["--dataset_name", "a/b", "--model_name_or_path", dinov2, *CPU]).family_defaults is None
    recipe = _recipe(tmp_path)
    assert build_plan(["--recipe", recipe, *CPU]).family_defaults is None


def test_an_unknown_recipe_family_takes_nothing_and_says_how_to_name_it(tmp_path):
    # the recipe's own checkpoint is a Hub id that is not on this machine (the tests run offline)
    text = VIT_RECIPE.format(model="google/vit-base-patch16-224-in21k")
    plan = build_plan(["--recipe", _recipe(tmp_path, text), "--model_name_or_path",
                       _folder(tmp_path, "dinov2"), *CPU])  # fmt: skip
    assert plan.training_args.learning_rate == 0.03
    (line,) = describe_family_defaults(plan.family_defaults)
    assert "none taken" in line and "--recipe_family" in line


def test_the_log_lines_name_each_default_its_value_why_and_the_flag(tmp_path):
    plan = build_plan(["--recipe", _recipe(tmp_path), "--model_name_or_path", _folder(tmp_path, "mae"),
                       "--weight_decay", "0.2", *CPU])  # fmt: skip
    lines = describe_family_defaults(plan.family_defaults)
    assert "is MAE" in lines[0] and "written for ViT" in lines[0] and "FINETUNE.md" in lines[0]
    mae = FAMILY_DEFAULTS["mae"].values
    assert f"  learning_rate = {mae['learning_rate']} (MAE default; the recipe's 0.03); override with " \
           "--learning_rate" in lines  # fmt: skip
    assert "  pooling = mean (MAE default; the recipe's cls); override with --pooling" in lines
    assert "  fc_norm = True (MAE default; the recipe's unset); override with --fc_norm" in lines
    assert lines[-1] == "  kept from the command line: weight_decay"
    assert not any(line.startswith("  weight_decay") for line in lines)
    assert plan.model_args.fc_norm is True and plan.model_args.pooling == "mean"


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--recipe_family", "dino"], r"recipe_family='dino' is no family; use one of vit, deit, dinov2"),
        (["--recipe_family", "MAE"], "recipe_family='MAE' is no family"),
        (["--fc_norm", "true", "--pooling", "cls+mean"], "fc_norm=true normalises one pooled token"),
        (["--fc_norm", "maybe"], "fc_norm"),
    ],
)
def test_bad_input_is_one_line(tmp_path, argv, match):
    with pytest.raises((RecipeError, ValueError), match=match) as error:
        parse_args(["--recipe", _recipe(tmp_path), *argv, *CPU])
    assert "\n" not in str(error.value)


def test_a_shipped_recipe_names_its_family_so_another_checkpoint_takes_its_row_offline(tmp_path):
    """`--recipe pets --model_name_or_path <a DINOv2 checkpoint>` with the Hub offline (as in CI): the recipe's own
    checkpoint's config cannot be read, so before the recipes stated `recipe_family` nothing was taken."""
    plan = build_plan(["--recipe", "pets", "--model_name_or_path", _folder(tmp_path, "dinov2"), *CPU])
    decision = plan.family_defaults
    assert (decision["recipe_family"], decision["checkpoint_family"]) == ("vit", "dinov2")
    assert {row["key"] for row in decision["taken"]} >= {"learning_rate", "optim"}
    assert plan.training_args.learning_rate == FAMILY_DEFAULTS["dinov2"].values["learning_rate"]


# the model_type of each Hub checkpoint a shipped recipe names (its config.json on the Hub)
HUB_MODEL_TYPES = {
    "google/vit-base-patch16-224-in21k": "vit",
    "facebook/dinov2-base": "dinov2",
    "google/siglip-base-patch16-224": "siglip",
    "facebook/dinov3-vitb16-pretrain-lvd1689m": "dinov3_vit",
    "google/siglip2-base-patch16-naflex": "siglip2",
    "facebook/vit-mae-base": "vit_mae",
    "openai/clip-vit-base-patch16": "clip",
}


def test_every_shipped_recipe_on_a_hub_checkpoint_states_that_checkpoints_family():
    from vit_ft.arguments.recipes import list_recipes, load_recipe, resolve_recipe

    for name in list_recipes():
        recipe = load_recipe(resolve_recipe(name))
        checkpoint = recipe["model_name_or_path"]
        if checkpoint.startswith("outputs/"):  # the digits recipes' own pre-training: a local ViT config
            continue
        assert recipe.get("recipe_family") == MODEL_TYPE_FAMILIES[HUB_MODEL_TYPES[checkpoint]], name
