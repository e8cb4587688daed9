"""Named ViT sizes from one table (big_vision's `decode_variant` habit).

Base/Large/Huge: ViT paper (arXiv 2010.11929) Table 1; Tiny/Small: DeiT (arXiv 2012.12877) Table 1, the sizes timm
and "How to train your ViT" use.
"""

from __future__ import annotations

VIT_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3, "intermediate_size": 768},
    "small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
    "huge": {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "intermediate_size": 5120},
}  # fmt: skip

__all__ = ["VIT_SIZES"]
