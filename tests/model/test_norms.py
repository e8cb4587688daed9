"""The blocks' norms (`vit_ft/model/norms.py`): RMSNorm against transformers' AIMv2 one, and the choice."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.aimv2.modeling_aimv2 import Aimv2RMSNorm

from vit_ft import ViTFTConfig
from vit_ft.model.norms import RMSNorm, make_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_aimv2(dtype):
    ours, reference = RMSNorm(16, eps=1e-5), Aimv2RMSNorm(16, eps=1e-5)
    weight = torch.randn(16, generator=torch.Generator().manual_seed(0))
    ours.weight.data.copy_(weight)
    reference.weight.data.copy_(weight)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    torch.testing.assert_close(ours(x), reference(x), atol=0, rtol=0)


def test_make_norm_follows_norm_type():
    assert isinstance(make_norm(ViTFTConfig(layer_norm_eps=1e-6)), nn.LayerNorm)
    norm = make_norm(ViTFTConfig(norm_type="rmsnorm", layer_norm_eps=1e-6), width=8)
    assert isinstance(norm, RMSNorm) and norm.weight.shape == (8,) and norm.eps == 1e-6
    with pytest.raises(ValueError, match="norm_type must be one of"):
        ViTFTConfig(norm_type="batchnorm")
