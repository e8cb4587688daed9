"""Tests for vit_ft.training.argument_checks: the image size against a locally readable checkpoint config, and mixed
precision against the hardware. The checks as run by parse_args are tested in test_recipes.py."""

import dataclasses
import json
import types

import pytest

from vit_ft.training.argument_checks import (
    MAX_IMAGE_TOKENS_ENV_VAR,
    check_image_size,
    check_image_tokens,
    check_precision,
    check_push,
    check_schedule,
    check_world_size,
    read_checkpoint_config,
)
from vit_ft.training.arguments import ModelArguments
from vit_ft.training.recipe_fields import RecipeError


def test_read_checkpoint_config_reads_a_local_folder_and_gives_up_quietly(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"patch_size": 8}))
    assert read_checkpoint_config(str(tmp_path)) == {"patch_size": 8}
    (tmp_path / "config.json").write_text("{not json")
    assert read_checkpoint_config(str(tmp_path)) is None
    assert read_checkpoint_config(str(tmp_path / "empty-folder-that-is-not-there")) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert read_checkpoint_config("nobody/not-a-cached-model", cache_dir=str(tmp_path)) is None


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
    args = ModelArguments(model_name_or_path="someone/tiny-vit", image_size=100, cache_dir=str(tmp_path))
    with pytest.raises(RecipeError, match=r"patch size 16 .*--image_size 96 or 112"):
        check_image_size(args)
    check_image_size(dataclasses.replace(args, image_size=384))


def test_image_size_check_is_skipped_when_the_config_is_not_local(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_args = ModelArguments(
        model_name_or_path="nobody/not-a-cached-model", image_size=30, cache_dir=str(tmp_path)
    )
    check_image_size(model_args)  # nothing to read: left to the model loader


def test_fp16_without_a_gpu_is_an_error_that_suggests_bf16():
    with pytest.raises(RecipeError, match=r"fp16 .*needs a CUDA GPU.*bf16"):
        check_precision(types.SimpleNamespace(fp16=True, bf16=False, use_cpu=False), device_type="cpu")
    with pytest.raises(RecipeError, match="use_cpu is set"):
        check_precision(types.SimpleNamespace(fp16=True, use_cpu=True), device_type="cuda")
    check_precision(types.SimpleNamespace(fp16=True, use_cpu=False), device_type="cuda")
    with pytest.raises(RecipeError, match=r"bf16 is set but no GPU.*--use_cpu true"):
        check_precision(types.SimpleNamespace(bf16=True, use_cpu=False), device_type="cpu")
    check_precision(types.SimpleNamespace(bf16=True, use_cpu=True), device_type="cpu")


def _training(**overrides):
    values = {"max_steps": -1, "num_train_epochs": 3.0, "learning_rate": 1e-3, "push_to_hub": False}
    return types.SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"num_train_epochs": 0.0}, "train nothing"),
        ({"max_steps": 0}, "train nothing"),
        ({"learning_rate": 0.0}, "must be positive"),
        ({"learning_rate": -1e-3}, "must be positive"),
    ],
)
def test_runs_that_train_nothing_are_refused(overrides, pattern):
    with pytest.raises(RecipeError, match=pattern):
        check_schedule(_training(**overrides))


def test_max_steps_trains_without_epochs():
    check_schedule(_training(num_train_epochs=0.0, max_steps=5))


def test_image_tokens_have_a_stated_bound_that_the_environment_raises(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"patch_size": 16}))
    args = ModelArguments(model_name_or_path=str(tmp_path), image_size=4096)
    with pytest.raises(RecipeError, match=f"above the bound of 4096.*{MAX_IMAGE_TOKENS_ENV_VAR}=65536"):
        check_image_tokens(args)
    monkeypatch.setenv(MAX_IMAGE_TOKENS_ENV_VAR, "65536")
    check_image_tokens(args)
    check_image_tokens(ModelArguments(model_name_or_path=str(tmp_path), image_size=1024))


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
