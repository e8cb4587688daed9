"""Which format a push shares a model in: transformers' own class where the model is exactly one, else vit_ft."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import ViTForImageClassification, ViTImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.tools.export.hub import stage_for_hub
from vit_ft.tools.export.hub_format import (
    check_same_logits,
    choose_format,
    remote_code_reasons,
    transformers_export_class,
)

from ..conftest import randomize, tiny_ft_config

LABELS = {"id2label": {0: "ant", 1: "bee", 2: "wasp"}, "label2id": {"ant": 0, "bee": 1, "wasp": 2}}


def test_transformers_class_is_the_model_layers_decision():
    """Plain ViT -> ViTForImageClassification, a family's options -> its own class; anything else says why."""
    plain = tiny_ft_config(**LABELS)
    assert (
        remote_code_reasons(plain) == [] and transformers_export_class(plain) == "ViTForImageClassification"
    )
    deit = tiny_ft_config(distillation_token=True, **LABELS)
    assert transformers_export_class(deit) == "DeiTForImageClassificationWithTeacher"
    (reason,) = remote_code_reasons(tiny_ft_config(pooling="mean", **LABELS))
    assert (
        "pooling='mean'" in reason
        and transformers_export_class(tiny_ft_config(pooling="map", **LABELS)) is None
    )


def test_choose_format_defaults_to_transformers_and_keeps_what_is_asked():
    plain, mean = tiny_ft_config(**LABELS), tiny_ft_config(pooling="mean", **LABELS)
    assert (
        choose_format(plain).name == "transformers"
        and choose_format(plain).model_class == "ViTForImageClassification"
    )
    assert choose_format(mean).name == "vit_ft" and "pooling='mean'" in choose_format(mean).reason
    asked = choose_format(plain, "vit_ft")
    assert asked.name == "vit_ft" and "asked for with `--format vit_ft`" in asked.reason
    with pytest.raises(ValueError, match="--format transformers cannot express this model .*pooling='mean'"):
        choose_format(mean, "transformers")
    with pytest.raises(ValueError, match="format='onnx' is not one of"):
        choose_format(plain, "onnx")


def write_folder(path, **config) -> ViTFTForImageClassification:
    model = randomize(ViTFTForImageClassification(tiny_ft_config(**LABELS, **config)), seed=3)
    model.save_pretrained(path)
    ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(path)
    return model


def test_default_staging_follows_the_model(tmp_path):
    """A plain ViT stages as transformers' class with the same logits; a mean-pooled one with our code, and its
    card says why. Asking for transformers' class for the mean-pooled one fails and stages nothing."""
    plain = write_folder(tmp_path / "plain")
    staged = stage_for_hub(tmp_path / "plain", tmp_path / "plain-staged", "me/plain")
    assert json.loads((staged / "config.json").read_text())["model_type"] == "vit"
    assert not list(staged.glob("*.py"))
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ViTForImageClassification.from_pretrained(staged).eval()(pixels).logits
        assert (got - plain(pixels).logits).abs().max().item() <= 1e-5

    write_folder(tmp_path / "mean", pooling="mean")
    staged = stage_for_hub(tmp_path / "mean", tmp_path / "mean-staged", "me/mean")
    assert json.loads((staged / "config.json").read_text())["model_type"] == "vit_ft"
    assert (staged / "modeling_vit_ft.py").is_file()
    card = (staged / "README.md").read_text()
    assert "- Format: vit_ft" in card and "no transformers class expresses this model: " in card
    assert "pooling='mean'" in card
    assert "trust_remote_code=True" in card
    with pytest.raises(ValueError, match="cannot express this model"):
        stage_for_hub(tmp_path / "mean", tmp_path / "refused", "me/mean", format="transformers")
    assert not (tmp_path / "refused").exists()


def test_an_export_with_other_logits_is_refused(tmp_path):
    model = randomize(ViTFTForImageClassification(tiny_ft_config(**LABELS)), seed=1)
    other = randomize(ViTFTForImageClassification(tiny_ft_config(**LABELS)), seed=2)
    check_same_logits(model, model, tmp_path)
    with pytest.raises(ValueError, match="share it with --format vit_ft"):
        check_same_logits(model, other, tmp_path)
