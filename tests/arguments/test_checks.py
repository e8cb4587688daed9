"""Tests for vit_ft.arguments.checks (the checks across the built arguments, run once by parse_args) and
for the checks the dataclasses make of their own fields against the world when they are built: the image size
against a locally readable checkpoint config (the model layer's check, tested itself in tests/model/test_checks.py)
and mixed precision against the hardware. The checks as run by parse_args are tested in test_recipes.py."""

import json
import types

import pytest

from vit_ft.arguments.checks import RecipeError, check_push, check_schedule, check_world_size
from vit_ft.arguments.fields import ModelArguments
from vit_ft.arguments.plan import run_compute
from vit_ft.arguments.precision import check_precision
from vit_ft.model.checks import MAX_IMAGE_TOKENS_ENV_VAR
from vit_ft.utils import hardware


def test_image_size_is_checked_against_a_checkpoint_in_the_hf_cache(tmp_path):
    """A Hub id whose config.json is already in the cache (laid out as huggingface_hub does) is read offline."""
    commit = "0" * 40
    repo = tmp_path / "models--someone--tiny-vit"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(
        json.dumps({"model_type": "vit", "patch_size": 16})
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    kwargs = {"model_name_or_path": "someone/tiny-vit", "cache_dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"patch size 16 .*--image_size 96 or 112"):
        ModelArguments(image_size=100, **kwargs)
    assert ModelArguments(image_size=384, **kwargs).image_size == 384


def test_image_size_check_is_skipped_when_the_config_is_not_local(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # nothing to read: left to the model loader
    ModelArguments(model_name_or_path="nobody/not-a-cached-model", image_size=30, cache_dir=str(tmp_path))


def test_fp16_without_a_gpu_is_an_error_that_suggests_bf16():
    with pytest.raises(RecipeError, match=r"fp16 .*needs a CUDA GPU.*bf16"):
        check_precision(types.SimpleNamespace(fp16=True, bf16=False, use_cpu=False), device_type="cpu")
    with pytest.raises(RecipeError, match="use_cpu is set"):
        check_precision(types.SimpleNamespace(fp16=True, use_cpu=True), device_type="cuda")
    check_precision(types.SimpleNamespace(fp16=True, use_cpu=False), device_type="cuda")
    with pytest.raises(RecipeError, match=r"bf16 is set but no GPU.*--use_cpu true"):
        check_precision(types.SimpleNamespace(bf16=True, use_cpu=False), device_type="cpu")
    check_precision(types.SimpleNamespace(bf16=True, use_cpu=True), device_type="cpu")


@pytest.mark.parametrize("native", [True, False], ids=["native bf16", "no native bf16"])
def test_cpu_bf16_runs_on_every_cpu_and_the_run_states_its_kernels(monkeypatch, native):
    """bf16 with use_cpu passes the checks on a CPU without native bf16 too (emulated: the start-of-run line warns);
    the run's compute decision is hardware.compute_for's, for the device the flags pick."""
    monkeypatch.setattr(hardware, "_onednn_reports_bf16", lambda: native)
    args = types.SimpleNamespace(bf16=True, use_cpu=True)
    check_precision(args, device_type="cuda")
    compute = run_compute(args, device_type="cuda")  # use_cpu wins over the GPU
    assert (compute.device, compute.precision, compute.emulated_bf16) == ("cpu", "bf16", not native)
    assert compute == hardware.compute_for("cpu", "bf16")
    assert run_compute(types.SimpleNamespace(fp16=True), device_type="cuda").precision == "fp16"
    assert run_compute(types.SimpleNamespace(bf16_full_eval=True, use_cpu=True)).precision == "bf16"
    assert run_compute(types.SimpleNamespace(use_cpu=True)).precision == "float32"


def _training(**overrides):
    values = {"max_steps": -1, "num_train_epochs": 3.0, "learning_rate": 1e-3, "push_to_hub": False}
    return types.SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"num_train_epochs": 0.0}, "train nothing"),
        ({"max_steps": 0}, "train nothing"),
    ],
)
def test_runs_that_train_nothing_are_refused(overrides, pattern):
    with pytest.raises(RecipeError, match=pattern):
        check_schedule(_training(**overrides))


def test_max_steps_trains_without_epochs():
    check_schedule(_training(num_train_epochs=0.0, max_steps=5))


def test_image_tokens_have_a_stated_bound_that_the_environment_raises(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "patch_size": 16}))
    with pytest.raises(ValueError, match=f"above the bound of 4096.*{MAX_IMAGE_TOKENS_ENV_VAR}=65536"):
        ModelArguments(model_name_or_path=str(tmp_path), image_size=4096)
    monkeypatch.setenv(MAX_IMAGE_TOKENS_ENV_VAR, "65536")
    ModelArguments(model_name_or_path=str(tmp_path), image_size=4096)
    monkeypatch.delenv(MAX_IMAGE_TOKENS_ENV_VAR)
    ModelArguments(model_name_or_path=str(tmp_path), image_size=1024)


def test_launched_processes_that_trainer_does_not_join_are_refused():
    with pytest.raises(RecipeError, match="--use_cpu true.*cpu_2proc.yaml"):
        check_world_size(types.SimpleNamespace(world_size=1), {"WORLD_SIZE": "2"})
    check_world_size(types.SimpleNamespace(world_size=2), {"WORLD_SIZE": "2"})
    check_world_size(types.SimpleNamespace(world_size=1), {})


def test_push_to_hub_offline_is_refused_before_training(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RecipeError, match="offline"):
        check_push(_training(push_to_hub=True))
    check_push(_training())


# ----------------------------------------------------------------------------------------------------------------
# The fine-tuning toolkit's keys (issue 23): each bad value or combination is one RecipeError, before any data
# ----------------------------------------------------------------------------------------------------------------

TOOLKIT_MISTAKES = [
    (["--mixup_alpha", "-0.1"], r"mixup_alpha=-0\.1 must be a finite number >= 0"),
    (["--cutmix_alpha", "-1"], r"cutmix_alpha=-1\.0 must be a finite number >= 0"),
    (["--mixup_prob", "1.5"], r"mixup_prob=1\.5 must be in \[0, 1\]"),
    (["--auto_augment", "autoaugment"], r"auto_augment='autoaugment' is not supported; use one of randaugment"),
    (["--auto_augment", "randaugment", "--rand_augment_magnitude", "11"], r"rand_augment_magnitude=11 must be an integer in \[0, 10\]"),
    (["--random_erasing_mode", "noise"], r"random_erasing_mode='noise' is not supported"),
    (["--random_erasing_prob", "2"], r"random_erasing_prob=2\.0 must be in \[0, 1\]"),
    (["--drop_path_rate", "1.0"], r"drop_path_rate=1\.0 must be in \[0, 1\)"),
    (["--layer_decay", "0"], r"layer_decay=0\.0 must be in \(0, 1\]"),
    (["--layer_decay", "1.2"], r"layer_decay=1\.2 must be in \(0, 1\]"),
    (["--ema_decay", "1.0"], r"ema_decay=1\.0 must be in \(0, 1\)"),
    (["--ema_as_final_model", "true"], r"ema_as_final_model needs an EMA of the weights: set --ema_decay"),
    (["--metric_for_best_model", "ema_accuracy"], r"metric_for_best_model=ema_accuracy needs an EMA"),
    (["--ema_decay", "0.99", "--ema_as_final_model", "true", "--load_best_model_at_end", "true"],
     r"set --metric_for_best_model ema_accuracy"),
    (["--ema_decay", "0.99", "--metric_for_best_model", "ema_accuracy", "--load_best_model_at_end", "true"],
     r"set --ema_as_final_model true"),
    (["--early_stopping_patience", "0"], r"early_stopping_patience=0 must be a positive integer"),
    (["--early_stopping_patience", "3", "--eval_strategy", "no"], r"has no validation metric to watch"),
    (["--early_stopping_patience", "3"], r"needs --load_best_model_at_end true"),
    (["--early_stopping_threshold", "0.01"], r"early_stopping_patience is not"),
    (["--class_weights", "cat:2"], r"class_weights='cat:2' is neither 'balanced' nor a label->weight mapping"),
    (["--class_weights", "3=-1"], r"class_weights\['3'\]='-1' must be a positive finite number"),
    (["--class_weights", "balanced", "--balanced_sampler", "true"], r"keep one of them"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "pattern"), TOOLKIT_MISTAKES)
def test_toolkit_mistakes_are_one_error_before_any_data(flags, pattern):
    from vit_ft.arguments.recipes import parse_args

    with pytest.raises(RecipeError, match=pattern) as error:
        parse_args(["--recipe", "digits", *flags])
    assert "\n" not in str(error.value)


def test_toolkit_keys_parse_from_flags_and_yaml(tmp_path):
    from vit_ft.arguments.recipes import parse_args

    recipe = tmp_path / "r.yaml"
    recipe.write_text("builtin_dataset: digits\ntrain_dir: d/train\nclass_weights: {0: 2, 7: 0.5}\n")
    _, _, training_args = parse_args(["--recipe", str(recipe)])
    assert training_args.class_weights == {"0": 2.0, "7": 0.5}
    model_args, data_args, training_args = parse_args([
        "--recipe", "digits", "--class_weights", '{"3": 2}', "--layer_decay", "0.75", "--ema_decay", "0.999",
        "--ema_as_final_model", "true", "--metric_for_best_model", "ema_accuracy", "--load_best_model_at_end", "true",
        "--early_stopping_patience", "2", "--mixup_alpha", "0.8", "--auto_augment", "trivialaugment",
        "--drop_path_rate", "0.1",
    ])  # fmt: skip
    assert training_args.class_weights == {"3": 2.0} and training_args.layer_decay == 0.75
    assert data_args.mixes_batches and data_args.augmentation_spec().auto_augment == "trivialaugment"
    assert model_args.drop_path_rate == 0.1
    defaults = parse_args(["--recipe", "digits"])
    assert defaults[0].drop_path_rate is None and not defaults[1].mixes_batches
    assert defaults[1].augmentation_spec() is None and defaults[2].ema_decay is None
