"""Stochastic depth (`drop_path_rate`): DeiT's / timm's linear rule over depth, timm's per-sample drop and rescale
on both residual branches in training, the identity in eval, saved with the model, and a checkpoint's own rate
taken only when asked."""

from __future__ import annotations

import json

import pytest
import torch

from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel

from ..conftest import randomize, tiny_ft_config


def timm_drop_path(x: torch.Tensor, drop_prob: float) -> torch.Tensor:
    """timm.layers.drop.drop_path (training=True, scale_by_keep=True), as timm 1.0 writes it."""
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0:
        random_tensor.div_(keep_prob)
    return x * random_tensor


def test_rates_rise_linearly_with_depth_as_deit():
    model = ViTFTModel(tiny_ft_config(num_hidden_layers=5, drop_path_rate=0.2))
    expected = [x.item() for x in torch.linspace(0, 0.2, 5)]  # DeiT / timm: dpr
    assert [layer.drop_path_rate for layer in model.layers] == expected


def test_each_branch_is_dropped_per_sample_as_timm_in_training():
    layer = randomize(ViTFTModel(tiny_ft_config(num_hidden_layers=2, drop_path_rate=0.5))).layers[1].train()
    branch = torch.randn(64, 5, 32)
    torch.manual_seed(0)
    ours = layer.residual(branch, None)
    torch.manual_seed(0)
    torch.testing.assert_close(ours, timm_drop_path(branch, 0.5), rtol=0, atol=0)
    kept = ours.flatten(1).abs().sum(1) > 0
    assert 10 < kept.sum() < 54  # about half the samples dropped, the rest scaled by 1 / (1 - 0.5)
    torch.testing.assert_close(ours[kept], 2 * branch[kept])


def test_drop_path_is_the_identity_in_eval_and_active_in_training():
    pixels = torch.randn(4, 3, 16, 16)
    plain = randomize(ViTFTModel(tiny_ft_config()), seed=3)
    dropped = ViTFTModel(tiny_ft_config(drop_path_rate=0.9))
    dropped.load_state_dict(plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(dropped.eval()(pixels).last_hidden_state, plain(pixels).last_hidden_state)
        torch.manual_seed(0)
        assert not torch.allclose(dropped.train()(pixels).last_hidden_state, plain(pixels).last_hidden_state)


def test_rate_is_saved_with_the_model_and_checked(tmp_path):
    ViTFTForImageClassification(tiny_ft_config(drop_path_rate=0.1, num_labels=2)).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["drop_path_rate"] == 0.1
    last = ViTFTForImageClassification.from_pretrained(tmp_path).vit.layers[-1]
    assert last.drop_path_rate == pytest.approx(0.1)  # float32 linspace, as timm
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="drop_path_rate"):
            ViTFTConfig(drop_path_rate=bad)


def test_checkpoint_rate_only_when_asked(tmp_path):
    """A checkpoint's rate (here DINOv2's config) loads as 0 unless `drop_path_rate="checkpoint"`; a number wins."""
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4
    )
    Dinov2Model(Dinov2Config(**{**config.to_dict(), "drop_path_rate": 0.3})).save_pretrained(tmp_path)
    assert ViTFTModel.from_pretrained(tmp_path).config.drop_path_rate == 0.0
    assert ViTFTModel.from_pretrained(tmp_path, drop_path_rate="checkpoint").config.drop_path_rate == 0.3
    assert ViTFTModel.from_pretrained(tmp_path, drop_path_rate=0.05).config.drop_path_rate == 0.05
