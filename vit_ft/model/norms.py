"""The blocks' normalisation: LayerNorm (the ViT's) or RMSNorm (AIMv2's, `norm_type="rmsnorm"`), chosen once by
`make_norm`. A saved folder carries this file."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """`(..., hidden)` -> x / sqrt(mean(x^2) + eps) * weight, in float32 and back (transformers' `Aimv2RMSNorm`,
    T5's LayerNorm): no mean subtracted, no bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden_states.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def make_norm(config, width: int | None = None) -> nn.Module:
    """The norm `config.norm_type` names, over `width` features (`hidden_size` by default), at its eps."""
    width = width or config.hidden_size
    if config.norm_type == "rmsnorm":
        return RMSNorm(width, eps=config.layer_norm_eps)
    return nn.LayerNorm(width, eps=config.layer_norm_eps)


__all__ = ["RMSNorm", "make_norm"]
