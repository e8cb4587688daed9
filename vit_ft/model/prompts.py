"""VPT (Jia et al. 2022, "Visual Prompt Tuning", arXiv 2203.12119): learned prompt tokens in the token sequence,
an option of the model's blocks (`vpt_tokens`, `vpt_deep` in the config), not a wrapper.

The prompts sit after the prefix tokens (class, distillation, registers) and before the patch tokens, without a
position, as DINOv2's registers do: the config counts them among `num_prefix_tokens`, so the pooling (the mean,
the class token), the patch grid, NaFlex's token mask, the rotary positions (the last tokens only) and every tool
that reads the token sequence (rollout, explanations, the feature bank's patch mean) leave them out without
knowing of them. Shallow: inserted before the first block (after CLIP's pre-norm: the first block's input,
not an embedding). Deep: inserted before the first, and each later
block's input prompts replaced by that block's own (the previous block's outputs at those places dropped).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import initialization as init

from .configuration_vit_ft import ViTFTConfig


class ViTFTPrompts(nn.Module):
    """`tokens`: `(layers, vpt_tokens, hidden)`, one set (shallow) or one per block (deep)."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.start = config.num_prefix_tokens - config.vpt_tokens  # after the class / distillation / registers
        self.deep, (patch_h, patch_w) = config.vpt_deep, config.patch_hw
        layers = config.num_hidden_layers if config.vpt_deep else 1
        self.tokens = nn.Parameter(torch.zeros(layers, config.vpt_tokens, config.hidden_size))
        # VPT's initialisation (its repository's `prompt_embeddings`): Xavier-uniform over the patch projection's
        # fan-in and the width, val = sqrt(6 / (3 * patch_h * patch_w + hidden))
        self.bound = math.sqrt(6.0 / (3 * patch_h * patch_w + config.hidden_size))

    def reset_parameters(self) -> None:
        init.uniform_(self.tokens, -self.bound, self.bound)

    def forward(self, hidden_states: torch.Tensor, index: int) -> torch.Tensor:
        """Before block `index`: `(batch, prefix + N, hidden)` -> `(batch, prefix + P + N, hidden)` at the first,
        the P prompts replaced by the block's own after it when deep, unchanged otherwise."""
        if index > 0 and not self.deep:
            return hidden_states
        prompts = self.tokens[index].to(hidden_states.dtype).expand(hidden_states.shape[0], -1, -1)  # (B, P, hidden)
        end = self.start if index == 0 else self.start + self.tokens.shape[1]
        return torch.cat([hidden_states[:, : self.start], prompts, hidden_states[:, end:]], dim=1)


def without_prompts(
    tokens: torch.Tensor, mask: torch.Tensor | None, config: ViTFTConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(batch, seq_len, hidden)` tokens and their `(batch, seq_len)` mask less the prompt tokens (for the
    attention pooling, which attends over every token it is given)."""
    if not config.vpt_tokens:
        return tokens, mask
    start, end = config.num_prefix_tokens - config.vpt_tokens, config.num_prefix_tokens
    keep = lambda x: None if x is None else torch.cat([x[:, :start], x[:, end:]], dim=1)  # noqa: E731
    return keep(tokens), keep(mask)


__all__ = ["ViTFTPrompts", "without_prompts"]
