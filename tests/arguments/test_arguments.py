"""Tests for vit_ft.arguments.fields: each bad value is a ValueError that names the field and the fix."""

import dataclasses

import pytest

from vit_ft.arguments.fields import (
    POOLING_CHOICES,
    DataArguments,
    ModelArguments,
    parse_lora_target_modules,
)
from vit_ft.model import configuration_vit_ft

DATA = {"train_dir": "data/train"}  # the least DataArguments needs
NO_DIR = {"train_dir": None}


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        ({"model_name_or_path": ""}, "model_name_or_path is empty", "set it to a Hub id"),
        ({"image_size": 0}, "image_size=0 must be a positive integer", "e.g. 224 or 384"),
        ({"image_size": -32}, "image_size=-32", "unset to keep the checkpoint's resolution"),
        ({"pooling": "max"}, "pooling='max'", "use one of: cls, mean"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob=1.0 must be in [0, 1)", "e.g. 0.1"),
        ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob=-0.1", "or 0 to disable"),
        ({"lora_dropout": 1.5}, "lora_dropout=1.5", "e.g. 0.1"),
        ({"lora_r": 0}, "lora_r=0 must be a positive integer", "the LoRA rank, e.g. 8 or 16"),
        ({"lora_alpha": 0}, "lora_alpha=0", "e.g. equal to lora_r"),
        ({"lora_target_modules": "query, val ue"}, "lora_target_modules='query, val ue'", "'query,value'"),
        ({"lora_target_modules": "query;value"}, "invalid module name(s) ['query;value']", "attention+mlp"),
        ({"pretrain_if_missing": "imagenet"}, "pretrain_if_missing='imagenet'", "digits, digits-small (or leave unset)"),
    ],
)
def test_model_arguments_name_the_field_and_the_fix(kwargs, field, fix):
    with pytest.raises(ValueError) as error:
        ModelArguments(**kwargs)
    assert field in str(error.value) and fix in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "field", "fix"),
    [
        (NO_DIR, "set dataset_name", "or train_dir"),
        ({"dataset_name": "a/b"}, "dataset_name='a/b' and train_dir='data/train'", "--train_dir none"),
        (
            {"builtin_dataset": "mnist"},
            "builtin_dataset='mnist'",
            "use one of: digits, digits-multilabel (or leave unset)",
        ),
        ({**NO_DIR, "builtin_dataset": "digits"}, "builtin_dataset='digits'", "set train_dir"),
        ({**NO_DIR, "dataset_name": "a/b", "test_dir": "t"}, "validation_dir/test_dir", "test_split"),
        ({"train_split": ""}, "train_split is empty", "usually 'train'"),
        ({"image_column": ""}, "image_column and label_column", "e.g. 'image' and 'label'"),
        ({"label_column": ""}, "image_column and label_column", "e.g. 'image' and 'label'"),
        ({"validation_split_percentage": 10}, "validation_split_percentage=10", "0.1 holds out 10% of train"),
        ({"validation_split_percentage": -0.1}, "validation_split_percentage=-0.1", "0 nothing"),
        ({"max_train_samples": 0}, "max_train_samples=0", "or unset for all of them"),
        ({"max_eval_samples": -1}, "max_eval_samples=-1", "or unset for all of them"),
        ({"crop_scale_min": 0.0}, "crop_scale_min=0.0 must be in (0, 1]", "1.0 for no zoom"),
        ({"crop_scale_min": 1.5}, "crop_scale_min=1.5", "0.08 Inception-style"),
    ],
)
def test_data_arguments_name_the_field_and_the_fix(kwargs, field, fix):
    with pytest.raises(ValueError) as error:
        DataArguments(**{**DATA, **kwargs})
    assert field in str(error.value) and fix in str(error.value)


def test_edge_values_are_accepted():
    model = ModelArguments(
        hidden_dropout_prob=0.0, lora_dropout=0, pooling="mean", lora_target_modules="qkv "
    )
    assert (model.pooling, model.lora_target_modules) == ("mean", "qkv")
    data = DataArguments(**DATA, validation_split_percentage=0, crop_scale_min=1.0, builtin_dataset="digits")
    assert data.max_eval_samples is None and data.validation_split_percentage == 0


def test_lora_targets_are_a_preset_or_a_list_of_names():
    assert parse_lora_target_modules("attention") == "attention"
    assert parse_lora_target_modules("attention+mlp") == "attention+mlp"
    assert parse_lora_target_modules("query, value") == ["query", "value"]
    assert parse_lora_target_modules("blocks.0.qkv") == ["blocks.0.qkv"]
    assert ModelArguments(lora_target_modules="query , value").lora_target_modules == "query,value"
    assert ModelArguments(lora_target_modules="attention+mlp").lora_target_modules == "attention+mlp"


def test_pooling_choices_come_from_the_config():
    assert POOLING_CHOICES is configuration_vit_ft.POOLING_CHOICES
    (pooling,) = [f for f in dataclasses.fields(ModelArguments) if f.name == "pooling"]
    assert ", ".join(POOLING_CHOICES) in pooling.metadata["help"]


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"mixup_alpha": float("nan")}, "mixup_alpha=nan must be a finite number >= 0: the Beta distribution's"),
        ({"cutmix_alpha": float("inf")}, "cutmix_alpha=inf must be a finite number >= 0: the Beta distribution's"),
    ],
)
def test_a_mixing_alpha_that_would_turn_mixing_off_silently_is_refused(kwargs, said):
    with pytest.raises(ValueError, match=said):
        DataArguments(**{**DATA, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"weight_decay": float("nan")}, "weight_decay=nan must be a finite number >= 0: e.g. 0.05"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 must be a finite number >= 0"),
        ({"label_smoothing_factor": 1.5}, r"label_smoothing_factor=1.5 must be in \[0, 1\)"),
        ({"label_smoothing_factor": float("nan")}, r"label_smoothing_factor=nan must be in \[0, 1\)"),
        ({"class_weights": "cat=inf"}, r"class_weights\['cat'\]='inf' must be a positive finite number"),
        ({"class_weights": "cat=nan"}, r"class_weights\['cat'\]='nan' must be a positive finite number"),
    ],
)
def test_values_that_would_poison_a_run_are_refused(kwargs, said, tmp_path):
    from vit_ft.arguments.training_arguments import FineTuneTrainingArguments

    with pytest.raises(ValueError, match=said):
        FineTuneTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    ok = FineTuneTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", weight_decay=0.05,
                                   label_smoothing_factor=0.1, class_weights="cat=2")  # fmt: skip
    assert ok.class_weights == {"cat": 2.0}
