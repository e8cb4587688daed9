"""2-D rotary positions (`vit_ft/model/rotary.py`) against transformers' DINOv3 functions, and as rotations."""

from __future__ import annotations

import pytest
import torch
from transformers import DINOv3ViTConfig
from transformers.models.dinov3_vit.modeling_dinov3_vit import (
    DINOv3ViTRopePositionEmbedding,
    apply_rotary_pos_emb,
)

from vit_ft.model.rotary import apply_rotary, rotary_cos_sin


@pytest.mark.parametrize(
    ("grid", "head_dim", "theta"), [((4, 4), 8, 100.0), ((3, 7), 16, 10000.0), ((1, 5), 4, 2.0)]
)
def test_cos_sin_and_turn_match_dinov3(grid, head_dim, theta):
    config = DINOv3ViTConfig(hidden_size=4 * head_dim, num_attention_heads=4, patch_size=2, rope_theta=theta)
    reference = DINOv3ViTRopePositionEmbedding(config).eval()
    pixels = torch.zeros(1, 3, 2 * grid[0], 2 * grid[1])
    cos, sin = rotary_cos_sin(grid, head_dim, theta, torch.float32, torch.device("cpu"))
    expected_cos, expected_sin = reference(pixels)
    torch.testing.assert_close(cos, expected_cos, atol=0, rtol=0)
    torch.testing.assert_close(sin, expected_sin, atol=0, rtol=0)
    generator = torch.Generator().manual_seed(0)
    query, key = (torch.randn(2, 4, 3 + grid[0] * grid[1], head_dim, generator=generator) for _ in range(2))
    expected = apply_rotary_pos_emb(query, key, cos, sin)
    for got, want in zip(apply_rotary(query, key, cos, sin), expected, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_turn_keeps_prefix_tokens_and_lengths():
    """A rotation: the prefix (class, registers) passes unchanged, every patch vector keeps its length."""
    cos, sin = rotary_cos_sin((3, 3), 8, 100.0, torch.float32, torch.device("cpu"))
    query = torch.randn(1, 2, 2 + 9, 8, generator=torch.Generator().manual_seed(1))
    turned, _ = apply_rotary(query, query, cos, sin)
    assert torch.equal(turned[:, :, :2], query[:, :, :2])
    torch.testing.assert_close(turned.norm(dim=-1), query.norm(dim=-1))
    assert not torch.allclose(turned[:, :, 2:], query[:, :, 2:])
