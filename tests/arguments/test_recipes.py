"""Tests for vit_ft.arguments.recipes and vit_ft.arguments.fields: every recipe parses and validates, flags win over YAML, and
every error names what to fix (the checks run by parse_args included). Offline and fast: no model, no data,
no network."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

from vit_ft.arguments import recipes
from vit_ft.arguments.checks import validate
from vit_ft.arguments.fields import DataArguments, ModelArguments
from vit_ft.arguments.recipes import (
    TRAINING_DEFAULTS,
    RecipeError,
    list_recipes,
    load_recipe,
    parse_args,
    resolve_recipe,
)
from vit_ft.commands.finetune import parse_command, print_recipes, recipe_info
from vit_ft.utils.hardware import accelerator_type

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ALL_RECIPES = list_recipes()
BASE_RECIPES = ("dogs", "hymenoptera", "cifar10", "cifar100", "pets", "flowers102", "digits")
PAPER_RECIPES = ("dogs", "cifar10", "cifar100", "pets", "flowers102")
ON_CPU = accelerator_type() == "cpu"


def _cpu_flags(name: str) -> list[str]:
    """GPU recipes ask for bf16; on a CPU-only machine validate them through CPU bf16 autocast instead."""
    return ["--use_cpu", "true"] if ON_CPU and load_recipe(resolve_recipe(name)).get("bf16") else []


def _write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _plain(value):
    """Enum members (IntervalStrategy.STEPS, ...) compare by their string value."""
    return getattr(value, "value", value)


def _tiny_vit_config() -> ViTConfig:
    """A one-layer ViT config: patch size 4 at 32 pixels."""
    return ViTConfig(
        image_size=32,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    """A local checkpoint folder with only a config.json: patch size 4 at 32 pixels."""
    folder = tmp_path / "tiny-vit"
    _tiny_vit_config().save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Every recipe
# ----------------------------------------------------------------------------------------------------------------


def test_the_recipe_set_is_complete():
    assert REPO_RECIPES.is_dir()
    expected = {*BASE_RECIPES, *(f"{name}-lora" for name in BASE_RECIPES)}
    assert expected <= set(ALL_RECIPES), sorted(expected - set(ALL_RECIPES))


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_recipe_parses_validates_and_keeps_its_values(name):
    values = load_recipe(resolve_recipe(name))
    objects = parse_args(["--recipe", name, *_cpu_flags(name)])
    validate(*objects)
    owners = {field.name: obj for obj in objects for field in dataclasses.fields(obj)}
    for key, value in values.items():
        actual = _plain(getattr(owners[key], key))
        assert actual == value or str(actual) == str(value), (key, actual, value)
    model_args, data_args, training_args = objects
    assert training_args.output_dir == str(Path("outputs") / name)
    assert training_args.remove_unused_columns is False
    # the best checkpoint on validation accuracy unless the recipe keeps the final model (digits: see its comment)
    assert training_args.load_best_model_at_end is values.get("load_best_model_at_end", True)
    # multi-label recipes watch mAP (their data is multi-label: the fine-tune would switch accuracy to mAP)
    assert training_args.metric_for_best_model == ("mAP" if name.endswith("-multilabel") else "accuracy")
    assert (data_args.problem_type == "multi_label_classification") is name.endswith("-multilabel")
    assert model_args.use_lora is name.endswith("-lora")


@pytest.mark.parametrize("name", ALL_RECIPES)
def test_recipe_file_layout(name):
    text = resolve_recipe(name).read_text(encoding="utf-8")
    lines = text.splitlines()
    assert (
        lines[0].startswith("# ")
        and f"Launch: accelerate launch scripts/finetune.py --recipe {name}" in lines[0]
    )
    headers = [
        text.index(header) for header in ("# Model arguments", "# Data arguments", "# Training arguments")
    ]
    assert headers == sorted(headers)
    info = recipe_info(name)
    assert info.name == name and info.description and info.launch.endswith(f"--recipe {name}")


@pytest.mark.parametrize("name", [*PAPER_RECIPES, *(f"{n}-lora" for n in PAPER_RECIPES)])
def test_paper_recipes_follow_the_vit_protocol(name):
    values = load_recipe(resolve_recipe(name))
    assert values["image_size"] == 384
    assert values["weight_decay"] == 0.0 and values["max_grad_norm"] == 1.0
    assert values["lr_scheduler_type"] == "cosine" and 0 < values["warmup_steps"] < 1
    assert values["global_batch_size"] == 512 and "gradient_accumulation_steps" not in values  # derived
    if name.endswith("-lora"):
        assert values["optim"] == "adamw_torch_fused" and values["learning_rate"] == 5e-3
        assert (values["lora_r"], values["lora_alpha"], values["lora_dropout"]) == (16, 16, 0.1)
        assert values["lora_target_modules"] == "attention"
    else:
        assert values["optim"] == "sgd" and values["optim_args"] == "momentum=0.9"
        assert values["learning_rate"] in (0.001, 0.003, 0.01, 0.03)
    steps = {"cifar10": 10000, "cifar100": 10000, "pets": 500, "flowers102": 500}
    base = name.removesuffix("-lora")
    if base in steps:
        assert values["max_steps"] == steps[base]


def test_digits_is_an_offline_cpu_recipe():
    model_args, data_args, training_args = parse_args(["--recipe", "digits"])
    assert (
        model_args.pretrain_if_missing == "digits"
        and model_args.model_name_or_path == "outputs/digits-pretrained"
    )
    assert data_args.builtin_dataset == "digits" and data_args.dataset_name is None
    assert (data_args.train_dir, data_args.test_dir) == ("data/digits/train", "data/digits/test")
    assert model_args.image_size == 32 and data_args.horizontal_flip is False
    assert data_args.crop_scale_min == 1.0  # no zoom crops (recipes/README.md, "What shaped the recipe")
    assert not training_args.bf16 and not training_args.fp16


def test_sgd_momentum_reaches_the_optimizer(tmp_path):
    """`optim: sgd` alone would give momentum 0: the recipes' optim_args must end up in torch.optim.SGD."""
    *_, training_args = parse_args(
        [
            "--recipe",
            "dogs",
            "--use_cpu",
            "true",
            "--bf16",
            "false",
            "--report_to",
            "none",
            "--output_dir",
            str(tmp_path),
        ]
    )
    config = _tiny_vit_config()
    eval_dataset = [{"pixel_values": torch.zeros(3, 32, 32), "labels": 0}]
    trainer = Trainer(model=ViTForImageClassification(config), args=training_args, eval_dataset=eval_dataset)
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, torch.optim.SGD)
    assert all(group["momentum"] == 0.9 and group["weight_decay"] == 0.0 for group in optimizer.param_groups)
    assert all(group["lr"] == training_args.learning_rate for group in optimizer.param_groups)
    assert training_args.get_warmup_steps(training_args.max_steps) == round(0.05 * training_args.max_steps)


def test_readme_lists_every_recipe_with_its_command():
    readme = (REPO_RECIPES / "README.md").read_text(encoding="utf-8")
    for name in ALL_RECIPES:
        assert f"`accelerate launch scripts/finetune.py --recipe {name}`" in readme, name
    for number in ("98.95", "91.67", "99.38", "94.43"):
        assert number in readme
    assert "2010.11929" in readme and "no published number" in readme


# ----------------------------------------------------------------------------------------------------------------
# Merging: defaults < recipe < flags
# ----------------------------------------------------------------------------------------------------------------


def test_flags_override_the_recipe():
    model_args, data_args, training_args = parse_args(
        ["--recipe", "dogs", *_cpu_flags("dogs"), "--learning_rate", "0.02", "--image_size", "448",
         "--validation_split_percentage", "0.2", "--horizontal_flip", "false", "--test_split", "none"]
    )  # fmt: skip
    assert training_args.learning_rate == 0.02 and model_args.image_size == 448
    assert data_args.validation_split_percentage == 0.2 and data_args.horizontal_flip is False
    assert data_args.test_split is None  # `none` unsets the recipe's "test"
    assert training_args.max_steps == 1500  # untouched recipe values survive


@pytest.mark.parametrize(
    ("recipe", "flags", "method", "use_lora"),
    [
        ("digits-lora", ["--method", "auto"], "auto", False),  # the ladder on a LoRA recipe: it was an error
        ("digits-lora", ["--method", "full"], "full", False),
        ("digits-lora", ["--use_lora", "false"], "full", False),
        ("digits", ["--use_lora", "true"], "lora", True),
        ("digits-lora", [], "lora", True),
    ],
)
def test_a_method_flag_replaces_the_recipes_use_lora_and_the_reverse(recipe, flags, method, use_lora):
    model_args, _, _ = parse_args(["--recipe", recipe, *flags])
    assert (model_args.method, model_args.use_lora) == (method, use_lora)
    with pytest.raises(RecipeError, match="method='full' and use_lora=true disagree"):  # two flags still must agree
        parse_args(["--recipe", recipe, "--method", "full", "--use_lora", "true"])


@pytest.mark.parametrize(
    ("flags", "pretraining"),
    [
        ([], "digits"),  # the recipe's own checkpoint, pre-trained when missing
        (["--model_name_or_path", "outputs/digitz-pretrained"], None),  # a named one must exist
        (["--model_name_or_path", "outputs/mine", "--pretrain_if_missing", "digits"], "digits"),
    ],
)
def test_a_model_flag_drops_the_recipes_pretraining_unless_it_is_given_too(flags, pretraining):
    model_args, _, _ = parse_args(["--recipe", "digits", *flags])
    assert model_args.pretrain_if_missing == pretraining


def test_a_mistyped_model_flag_fails_in_one_line_and_pretrains_nothing(tmp_path):
    """It pre-trained a minute into the mistyped folder and fine-tuned from it, as the digits recipe's own
    missing checkpoint would be. (outputs/ is here, as after a first digits run: so the name is a path.)"""
    import subprocess
    import sys

    (tmp_path / "outputs" / "digits-pretrained").mkdir(parents=True)
    ran = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "scripts" / "finetune.py"), "--recipe",
                          "digits", "--model_name_or_path", "outputs/digitz-pretrained"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran.stderr[-3000:]
    assert "model_name_or_path outputs/digitz-pretrained: no such folder; did you mean outputs/digits-pretrained?" in (
        ran.stderr
    )
    # no pre-training, no data, no output folder
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "outputs", "outputs/digits-pretrained"]  # fmt: skip


def test_a_flag_equal_to_the_dataclass_default_still_overrides_the_recipe():
    *_, training_args = parse_args(["--recipe", "dogs", *_cpu_flags("dogs"), "--learning_rate", "5e-05"])
    assert training_args.learning_rate == 5e-05  # TrainingArguments' default, but given explicitly
    _, data_args, _ = parse_args(["--recipe", "digits", "--no_horizontal_flip", "--horizontal_flip"])
    assert data_args.horizontal_flip is True


def test_training_defaults_apply_without_a_recipe_value(tmp_path):
    recipe = _write(tmp_path, "dataset_name: uoft-cs/cifar10\n", name="bare.yaml")
    model_args, data_args, training_args = parse_args(["--recipe", str(recipe)])
    assert training_args.output_dir == str(Path("outputs") / "bare")
    assert training_args.remove_unused_columns is False
    assert _plain(training_args.eval_strategy) == "epoch" and _plain(training_args.save_strategy) == "epoch"
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "accuracy"
    assert training_args.greater_is_better
    assert training_args.report_to == ["tensorboard"] and training_args.label_names == ["labels"]
    assert model_args == ModelArguments() and data_args.dataset_name == "uoft-cs/cifar10"
    assert set(TRAINING_DEFAULTS) <= {field.name for field in dataclasses.fields(TrainingArguments)}


def test_saving_follows_the_evaluation_schedule_when_only_one_is_set(tmp_path):
    # digits sets eval_strategy and save_strategy both to "epoch": a flag for one side moves the other too (digits
    # keeps its final model; asking for the best one needs saving on the evaluation schedule)
    best = ["--load_best_model_at_end", "true"]
    *_, steps = parse_args(["--recipe", "digits", "--eval_strategy", "steps", "--eval_steps", "20", *best])
    assert _plain(steps.save_strategy) == "steps" and steps.save_steps == 20 and steps.load_best_model_at_end
    *_, dogs = parse_args(["--recipe", "dogs", *_cpu_flags("dogs"), "--save_steps", "50"])
    assert dogs.eval_steps == 50
    # "no" does not propagate: checkpoints are still saved, but there is no best model to load
    *_, off = parse_args(["--recipe", "dogs", *_cpu_flags("dogs"), "--eval_strategy", "no"])
    assert _plain(off.save_strategy) == "steps" and not off.load_best_model_at_end  # dogs saves every N steps
    # a recipe that sets only eval_strategy gets saving on the same schedule
    recipe = _write(tmp_path, "dataset_name: a/b\neval_strategy: steps\neval_steps: 7\n")
    *_, only_eval = parse_args(["--recipe", str(recipe)])
    assert _plain(only_eval.save_strategy) == "steps" and only_eval.save_steps == 7
    # both set differently on purpose: left alone, and TrainingArguments explains the conflict
    with pytest.raises(ValueError, match="save and eval strategy to match"):
        parse_args(["--recipe", "digits", "--eval_strategy", "steps", "--save_strategy", "epoch", *best])


# ----------------------------------------------------------------------------------------------------------------
# Errors that name the fix
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_yaml_key_names_the_key_and_the_closest_field(tmp_path):
    recipe = _write(tmp_path, "dataset_name: uoft-cs/cifar10\nlearning_rat: 0.01\n")
    with pytest.raises(RecipeError, match=r"unknown key 'learning_rat'.*did you mean 'learning_rate'"):
        load_recipe(recipe)
    with pytest.raises(RecipeError, match="learning_rat"):
        parse_args(["--recipe", str(recipe)])


def test_unknown_flag_names_the_flag_and_the_closest_field():
    with pytest.raises(RecipeError, match=r"Unknown flag '--learnig_rate'.*did you mean --learning_rate"):
        parse_args(["--recipe", "digits", "--learnig_rate", "0.1"])
    with pytest.raises(RecipeError, match=r"--image-siz.*did you mean --image_size"):
        parse_args(["--recipe", "digits", "--image-siz=64"])
    with pytest.raises(RecipeError, match="learning_rate"):  # no silent prefix matching
        parse_args(["--recipe", "digits", "--learning", "0.1"])


def test_unknown_recipe_lists_the_choices():
    with pytest.raises(RecipeError) as error:
        resolve_recipe("dgos")
    message = str(error.value)
    assert "Unknown recipe 'dgos'" in message and "Did you mean 'dogs'" in message
    assert all(name in message for name in ALL_RECIPES)
    with pytest.raises(RecipeError, match="Available recipes: .*cifar10"):
        parse_args(["--recipe", "imagenet"])
    with pytest.raises(RecipeError, match="does not exist"):
        resolve_recipe("missing/recipe.yaml")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("- a\n- b\n", "flat mapping"),
        ("learning_rate:\n  value: 0.1\n", "learning_rate expects .*not a nested mapping"),
        ("learning_rate: [0.1, 0.2]\n", "learning_rate expects a single value"),
        ("max_steps: many\n", r"max_steps='many' is not valid; it expects int"),
        ("eval_strategy: no\n", 'quote the value, e.g. eval_strategy: "no"'),
        ("image_column: null\n", "image_column cannot be null"),
        ("lr_scheduler_type: cosin\n", "did you mean 'cosine'"),
        ("seed: 1\nseed: 2\n", "more than once"),
        ("seed: [1\n", "not valid YAML"),
    ],
)
def test_bad_recipe_values_are_errors(tmp_path, text, pattern):
    with pytest.raises(RecipeError, match=pattern):
        load_recipe(_write(tmp_path, text))


def test_yaml_scalars_convert_like_flags(tmp_path):
    values = load_recipe(_write(tmp_path, "learning_rate: 1e-3\nmax_steps: 10\nreport_to: [tensorboard]\n"))
    # PyYAML reads 1e-3 as text; the recipe loader converts it like the command line does
    assert values == {"learning_rate": 0.001, "max_steps": 10, "report_to": ["tensorboard"]}
    unset = load_recipe(_write(tmp_path, "test_split: none\nmax_train_samples: null\nreport_to: none\n"))
    assert unset == {
        "test_split": None,
        "max_train_samples": None,
        "report_to": "none",
    }  # report_to's none is a value


def test_bad_image_size_against_a_local_checkpoint_fails_before_anything_else(tiny_checkpoint):
    argv = ["--recipe", "digits", "--model_name_or_path", str(tiny_checkpoint), "--image_size", "30"]
    # Also wrong: two data sources, fp16 on CPU. The image size must be the first complaint.
    with pytest.raises(
        RecipeError, match=r"image_size=30 is not a multiple of the patch size 4.*--image_size 28 or 32"
    ):
        parse_args([*argv, "--dataset_name", "uoft-cs/cifar10", "--fp16", "true"])
    model_args, *_ = parse_args([*argv[:-1], "64"])
    assert model_args.image_size == 64


@pytest.mark.skipif(not ON_CPU, reason="needs a machine without a GPU")
def test_fp16_on_this_cpu_fails_in_parse_args():
    with pytest.raises(RecipeError, match="fp16"):
        parse_args(["--recipe", "digits", "--fp16", "true"])
    with pytest.raises(RecipeError, match="bf16"):
        parse_args(["--recipe", "dogs"])  # a GPU recipe launched on CPU by mistake


def test_evaluation_needs_data_and_a_computed_metric():
    with pytest.raises(RecipeError, match=r"metric_for_best_model='acuracy'.*did you mean 'accuracy'"):
        parse_args(["--recipe", "digits", "--metric_for_best_model", "acuracy"])
    *_, training_args = parse_args(["--recipe", "digits", "--metric_for_best_model", "eval_f1"])
    assert training_args.metric_for_best_model == "eval_f1"
    with pytest.raises(RecipeError, match="no validation data"):
        parse_args(["--recipe", "digits", "--validation_split_percentage", "0"])
    with pytest.raises(RecipeError, match="no validation data"):
        parse_args(["--recipe", "cifar10", *_cpu_flags("cifar10"), "--validation_split_percentage", "0"])
    parse_args(["--recipe", "digits", "--validation_split_percentage", "0", "--eval_strategy", "no"])


# ----------------------------------------------------------------------------------------------------------------
# The dataclasses' own checks
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"pooling": "max"}, r"pooling='max' is not supported; use one of: cls, mean"),
        ({"image_size": 0}, "image_size=0 must be a positive integer: pixels"),
        ({"hidden_dropout_prob": 1.5}, r"hidden_dropout_prob=1.5 must be in \[0, 1\)"),
        ({"lora_dropout": -0.1}, "lora_dropout"),
        ({"lora_r": 0}, "lora_r=0"),
        ({"lora_target_modules": "query, val ue"}, "invalid module name"),
        ({"pretrain_if_missing": "imagenet"}, "use one of: digits"),
    ],
)
def test_model_arguments_reject(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ModelArguments(**kwargs)


def test_lora_target_modules_forms():
    assert ModelArguments(lora_target_modules="attention+mlp").lora_target_modules == "attention+mlp"
    assert ModelArguments(lora_target_modules="query, value").lora_target_modules == "query,value"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({}, "No training data"),
        ({"dataset_name": "a/b", "train_dir": "x"}, "choose one data source"),
        ({"train_dir": "x", "validation_split_percentage": 10}, r"validation_split_percentage=10 must be in \[0, 1\): a fraction"),
        ({"train_dir": "x", "crop_scale_min": 0}, r"crop_scale_min=0 must be in \(0, 1\]"),
        ({"train_dir": "x", "max_train_samples": 0}, "max_train_samples=0"),
        ({"builtin_dataset": "digits"}, "set train_dir"),
        ({"train_dir": "x", "builtin_dataset": "mnist"}, "use one of: digits"),
        ({"dataset_name": "a/b", "validation_dir": "v"}, "use validation_split/test_split"),
    ],
)
def test_data_arguments_reject(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        DataArguments(**kwargs)


def test_every_field_has_help():
    for cls in (ModelArguments, DataArguments):
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{cls.__name__}.{field.name}"


# ----------------------------------------------------------------------------------------------------------------
# Listing and locating recipes
# ----------------------------------------------------------------------------------------------------------------


def test_list_recipes_flag_prints_every_recipe_and_exits(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command(["--list-recipes"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in ALL_RECIPES:
        assert re.search(rf"^{re.escape(name)}\s", out, flags=re.MULTILINE), name
    assert "uoft-cs/cifar100" in out and "Donghyun99/Stanford-Dogs" in out


def test_help_lists_the_recipe_and_dataclass_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command(["--recipe", "dogs", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--recipe" in out and "--image_size" in out and "--learning_rate" in out
    flat = " ".join(out.split())  # the epilog is wrapped
    for switch in (
        "--resume",
        "--overwrite_output_dir",
        "--sweep ARG=V1,V2,...",
        "--debug",
    ):  # the script's own
        assert switch in flat, switch


def test_recipes_dir_follows_the_environment_variable(tmp_path, monkeypatch, capsys):
    _write(tmp_path, "# Mine: a test recipe. Launch: accelerate launch scripts/finetune.py --recipe mine\n"
           "train_dir: somewhere\n")  # fmt: skip
    monkeypatch.setenv(recipes.RECIPES_ENV_VAR, str(tmp_path))
    assert list_recipes() == ["mine"]
    assert resolve_recipe("mine") == tmp_path / "mine.yaml"
    print_recipes()
    assert "mine" in capsys.readouterr().out
    monkeypatch.setenv(recipes.RECIPES_ENV_VAR, str(tmp_path / "empty"))
    assert list_recipes() == []


def test_an_empty_recipe_file_is_one_error(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n")
    with pytest.raises(RecipeError, match="the recipe is empty"):
        parse_args(["--recipe", str(path)])


def test_a_data_source_on_the_command_line_replaces_the_recipes_builtin_data():
    _, data_args, _ = parse_args(
        ["--recipe", "digits", "--train_dir", "my/train", "--validation_dir", "my/val"]
    )
    assert (data_args.train_dir, data_args.validation_dir) == ("my/train", "my/val")
    assert data_args.builtin_dataset is None and data_args.test_dir is None
    _, data_args, _ = parse_args(["--recipe", "digits", "--dataset_name", "uoft-cs/cifar10"])
    assert data_args.dataset_name == "uoft-cs/cifar10" and data_args.train_dir is None


@pytest.mark.parametrize(
    "flags, pattern",
    [
        (["--num_train_epochs", "0"], "train nothing"),
        (["--learning_rate", "-0.1"], "must be positive"),
        (["--image_size", "0"], "image_size=0 must be a positive integer: pixels"),
    ],
)
def test_meaningless_runs_fail_in_parse_args(flags, pattern):
    with pytest.raises(RecipeError, match=pattern):
        parse_args(["--recipe", "digits", *flags])
