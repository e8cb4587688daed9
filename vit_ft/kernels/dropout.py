"""LoRA's input dropout with a quarter of the random draws on CPU (`PackedBitsDropout`)."""

from __future__ import annotations

import torch
from torch import nn

from .switch import kernels_enabled


class PackedBitsDropout(nn.Dropout):
    """nn.Dropout whose CPU mask costs a quarter of the random draws: 16 random bits decide each element, four
    elements per 64-bit draw. torch's CPU dropout draws one random number per element (~4 ns each here), which
    made LoRA's input dropout about 7% of a ViT-B training step.

    Drops with probability round(p * 65536) / 65536 (within 1e-5 of p) and scales what it keeps by the exact
    inverse of the keep probability, so the expectation is unchanged. Draws from torch's global generator:
    seeded runs repeat. Other devices, and the kernels switched off, use nn.Dropout's own kernel.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        drop_count = round(self.p * 65536)  # of the 65536 values of 16 bits, these many drop
        if not self.training or x.device.type != "cpu" or not 0 < drop_count < 65536 or not kernels_enabled():
            return super().forward(x)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64)
        words.random_(torch.iinfo(torch.int64).min, None)  # all 64 bits random
        bits = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over [-32768, 32767]
        keep = bits >= drop_count - 32768
        return x * keep.to(x.dtype).mul_(65536 / (65536 - drop_count))


__all__ = ["PackedBitsDropout"]
